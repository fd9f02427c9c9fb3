/*
 * trace.c - the span recorder behind trace.h and its Chrome trace-event JSON
 * (written with jansson).  Spans go into a growing array under one mutex;
 * tracks are a short array searched linearly (at most KEX_TRACE_MAX_TRACKS).
 */
#include "core/trace.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "core/alloc.h"

typedef struct span {
  char *name, *cat, *detail;
  uint32_t track;
  uint64_t start, end;
} span;

struct kex_trace {
  pthread_mutex_t lock;
  uint64_t zero;
  span *spans;
  size_t n, cap, dropped;
  char *tracks[KEX_TRACE_MAX_TRACKS];
  uint32_t ntracks;
};

uint64_t kex_trace_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

kex_trace *kex_trace_create(void) {
  kex_trace *t = kex_calloc(1, sizeof *t);
  if (!t) return NULL;
  pthread_mutex_init(&t->lock, NULL);
  t->zero = kex_trace_now_us();
  return t;
}

static void span_clear(span *s) {
  kex_free(s->name);
  kex_free(s->cat);
  kex_free(s->detail);
}

void kex_trace_free(kex_trace *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) span_clear(&t->spans[i]);
  kex_free(t->spans);
  for (uint32_t i = 0; i < t->ntracks; i++) kex_free(t->tracks[i]);
  pthread_mutex_destroy(&t->lock);
  kex_free(t);
}

static char *dup_or_null(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = kex_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Index of track `name`, added if new; -1 when the track table is full or out of memory (caller holds lock). */
static int track_index(kex_trace *t, const char *name) {
  for (uint32_t i = 0; i < t->ntracks; i++)
    if (!strcmp(t->tracks[i], name)) return (int)i;
  if (t->ntracks == KEX_TRACE_MAX_TRACKS) return -1;
  char *d = dup_or_null(name);
  if (!d) return -1;
  t->tracks[t->ntracks] = d;
  return (int)t->ntracks++;
}

void kex_trace_span(kex_trace *t, const char *track, const char *cat, const char *name, const char *detail,
                    uint64_t start_us, uint64_t end_us) {
  if (!t) return;
  span s = {dup_or_null(name ? name : "?"), dup_or_null(cat ? cat : "kex"), dup_or_null(detail), 0, start_us,
            end_us < start_us ? start_us : end_us};
  pthread_mutex_lock(&t->lock);
  int ti = track_index(t, track ? track : "kex");
  bool ok = s.name && s.cat && (!detail || s.detail) && ti >= 0 && t->n < KEX_TRACE_MAX_SPANS;
  if (ok && t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    span *g = kex_realloc(t->spans, cap * sizeof *g);
    if (g) {
      t->spans = g;
      t->cap = cap;
    } else {
      ok = false;
    }
  }
  if (ok) {
    s.track = (uint32_t)ti;
    t->spans[t->n++] = s;
  } else {
    t->dropped++;
  }
  pthread_mutex_unlock(&t->lock);
  if (!ok) span_clear(&s);
}

void kex_trace_counts(const kex_trace *t, size_t *stored, size_t *dropped) {
  *stored = *dropped = 0;
  if (!t) return;
  pthread_mutex_lock((pthread_mutex_t *)&t->lock);
  *stored = t->n;
  *dropped = t->dropped;
  pthread_mutex_unlock((pthread_mutex_t *)&t->lock);
}

static int by_start(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Event i (a complete span) relative to time zero; NULL when out of memory. */
static json_t *span_event(const kex_trace *t, const span *s) {
  uint64_t ts = s->start > t->zero ? s->start - t->zero : 0;
  json_t *e = json_pack("{s:s, s:s, s:s, s:i, s:i, s:I, s:I}", "name", s->name, "cat", s->cat, "ph", "X", "pid", 1, "tid",
                        (int)s->track + 1, "ts", (json_int_t)ts, "dur", (json_int_t)(s->end - s->start));
  if (e && s->detail && json_object_set_new(e, "args", json_pack("{s:s}", "detail", s->detail))) {
    json_decref(e);
    e = NULL;
  }
  return e;
}

char *kex_trace_json(kex_trace *t, const char *label) {
  if (!t) return NULL;
  char *out = NULL;
  pthread_mutex_lock(&t->lock);
  qsort(t->spans, t->n, sizeof *t->spans, by_start);
  json_t *events = json_array(), *root = NULL;
  if (!events) goto out;
  if (json_array_append_new(events, json_pack("{s:s, s:s, s:i, s:{s:s}}", "name", "process_name", "ph", "M", "pid", 1,
                                              "args", "name", "kexd")))
    goto out;
  for (uint32_t i = 0; i < t->ntracks; i++)
    if (json_array_append_new(events, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid",
                                                1, "tid", (int)i + 1, "args", "name", t->tracks[i])))
      goto out;
  for (size_t i = 0; i < t->n; i++)
    if (json_array_append_new(events, span_event(t, &t->spans[i]))) goto out;
  root = json_pack("{s:O, s:s, s:{s:s, s:I}}", "traceEvents", events, "displayTimeUnit", "ms", "otherData", "label",
                   label ? label : "", "dropped_spans", (json_int_t)t->dropped);
  if (root) out = json_dumps(root, JSON_COMPACT);
out:
  pthread_mutex_unlock(&t->lock);
  json_decref(root);
  json_decref(events);
  return out;
}

/*
 * test_trace.c - core/trace.c: spans from several threads become Chrome
 * trace-event JSON that parses, names its tracks, keeps each span's timing
 * and detail, sorts by start; a NULL trace costs nothing; the span limit
 * counts what it drops.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/trace.h"

static json_t *parse(kex_trace *t) {
  char *s = kex_trace_json(t, "sub 7");
  assert_non_null(s);
  json_t *j = json_loads(s, 0, NULL);
  free(s);
  assert_non_null(j);
  return j;
}

/* The event named `name` with phase "X"; NULL when absent. */
static json_t *find_span(json_t *events, const char *name) {
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) if (!strcmp(json_string_value(json_object_get(e, "ph")), "X") &&
                                        !strcmp(json_string_value(json_object_get(e, "name")), name)) return e;
  return NULL;
}

static void test_spans_to_json(void **state) {
  (void)state;
  kex_trace *t = kex_trace_create();
  assert_non_null(t);
  uint64_t z = kex_trace_now_us();
  kex_trace_span(t, "device opencl:0", "run", "r_4_4", "kernel 1 of 2", z + 50, z + 80);
  kex_trace_span(t, "daemon", "plan", "schedule", NULL, z + 10, z + 20);
  kex_trace_span(t, "daemon", "plan", "backwards", "\"quoted\"\n", z + 30, z + 25); /* end < start: zero length */
  json_t *j = parse(t);
  json_t *ev = json_object_get(j, "traceEvents");
  assert_true(json_is_array(ev));
  assert_string_equal(json_string_value(json_object_get(j, "displayTimeUnit")), "ms");
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "otherData"), "label")), "sub 7");
  /* metadata: the process and the two tracks, named in first-use order */
  int named = 0;
  size_t i;
  json_t *e;
  json_array_foreach(ev, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "ph")), "M") ||
        strcmp(json_string_value(json_object_get(e, "name")), "thread_name"))
      continue;
    const char *n = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
    json_int_t tid = json_integer_value(json_object_get(e, "tid"));
    assert_true((tid == 1 && !strcmp(n, "device opencl:0")) || (tid == 2 && !strcmp(n, "daemon")));
    named++;
  }
  assert_int_equal(named, 2);
  json_t *run = find_span(ev, "r_4_4"), *sch = find_span(ev, "schedule"), *bw = find_span(ev, "backwards");
  assert_non_null(run);
  assert_non_null(sch);
  assert_non_null(bw);
  assert_int_equal(json_integer_value(json_object_get(run, "dur")), 30);
  assert_int_equal(json_integer_value(json_object_get(sch, "dur")), 10);
  assert_int_equal(json_integer_value(json_object_get(bw, "dur")), 0);
  assert_int_equal(json_integer_value(json_object_get(run, "tid")), 1);
  assert_int_equal(json_integer_value(json_object_get(sch, "tid")), 2);
  assert_string_equal(json_string_value(json_object_get(json_object_get(run, "args"), "detail")), "kernel 1 of 2");
  assert_string_equal(json_string_value(json_object_get(json_object_get(bw, "args"), "detail")), "\"quoted\"\n");
  assert_null(json_object_get(sch, "args"));
  assert_true(json_integer_value(json_object_get(run, "ts")) - json_integer_value(json_object_get(sch, "ts")) == 40);
  /* sorted by start: schedule, backwards, r_4_4 */
  json_int_t last = -1;
  json_array_foreach(ev, i, e) if (!strcmp(json_string_value(json_object_get(e, "ph")), "X")) {
    json_int_t ts = json_integer_value(json_object_get(e, "ts"));
    assert_true(ts >= last);
    last = ts;
  }
  json_decref(j);
  kex_trace_free(t);
}

static void test_null_trace(void **state) {
  (void)state;
  kex_trace_span(NULL, "a", "b", "c", "d", 1, 2);
  assert_null(kex_trace_json(NULL, NULL));
  size_t s = 1, d = 1;
  kex_trace_counts(NULL, &s, &d);
  assert_int_equal(s, 0);
  assert_int_equal(d, 0);
  kex_trace_free(NULL);
}

typedef struct worker_arg {
  kex_trace *t;
  int id;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  char track[32];
  snprintf(track, sizeof track, "worker %d", a->id);
  for (int i = 0; i < 1000; i++) {
    uint64_t s = kex_trace_now_us();
    kex_trace_span(a->t, track, "compile", "k", NULL, s, s + 1);
  }
  return NULL;
}

/* 4 threads x 1000 spans all land; the limit stops at KEX_TRACE_MAX_SPANS and counts the rest */
static void test_threads_and_limit(void **state) {
  (void)state;
  kex_trace *t = kex_trace_create();
  pthread_t th[4];
  worker_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (worker_arg){t, i};
    assert_int_equal(pthread_create(&th[i], NULL, worker, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  size_t stored, dropped;
  kex_trace_counts(t, &stored, &dropped);
  assert_int_equal(stored, 4000);
  assert_int_equal(dropped, 0);
  for (size_t i = stored; i < KEX_TRACE_MAX_SPANS + 5; i++) kex_trace_span(t, "fill", "x", "y", NULL, 1, 2);
  kex_trace_counts(t, &stored, &dropped);
  assert_int_equal(stored, KEX_TRACE_MAX_SPANS);
  assert_int_equal(dropped, 5);
  /* the track limit, on a fresh trace: tracks past KEX_TRACE_MAX_TRACKS are dropped */
  kex_trace *u = kex_trace_create();
  for (int i = 0; i < KEX_TRACE_MAX_TRACKS + 3; i++) {
    char n[16];
    snprintf(n, sizeof n, "t%d", i);
    kex_trace_span(u, n, "x", "y", NULL, 1, 2);
  }
  kex_trace_counts(u, &stored, &dropped);
  assert_int_equal(stored, KEX_TRACE_MAX_TRACKS);
  assert_int_equal(dropped, 3);
  kex_trace_free(u);
  json_t *j = parse(t);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "otherData"), "dropped_spans")), 5);
  json_decref(j);
  kex_trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spans_to_json),
      cmocka_unit_test(test_null_trace),
      cmocka_unit_test(test_threads_and_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

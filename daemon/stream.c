/*
 * stream.c - the server-stream writer of stream.h: per-stream event
 * queues under the hub's one lock, a list of streams with events to
 * write (woken through the loop bridge, bridge.h), and the pump, the one
 * place that decides when a call writes, ends and is released.
 */
#include "daemon/stream.h"

#include <grpc/status.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "daemon/bridge.h"

struct kexd_streams {
  uv_loop_t *loop;
  pthread_t loop_thread;
  kexd_wake wake;            /* the loop bridge (bridge.h) */
  bool async_open;
  /* lock protects every stream's queue and dirty fields, the dirty list and closed */
  pthread_mutex_t lock;
  kexd_stream *dirty;
  bool closed;
};

static void on_hub_async(kexd_wake *w);

int kexd_streams_new(uv_loop_t *loop, kexd_streams **out) {
  kexd_streams *h = kex_calloc(1, sizeof *h);
  *out = NULL;
  if (!h) return KEX_ENOMEM;
  h->loop = loop;
  h->loop_thread = pthread_self();
  pthread_mutex_init(&h->lock, NULL);
  int rc = kexd_wake_init(loop, &h->wake, on_hub_async, h);
  if (rc < 0) {
    pthread_mutex_destroy(&h->lock);
    kex_free(h);
    return rc;
  }
  h->async_open = true;
  *out = h;
  return 0;
}

void kexd_streams_close(kexd_streams *h) {
  if (!h || !h->async_open) return;
  pthread_mutex_lock(&h->lock);
  h->closed = true;
  pthread_mutex_unlock(&h->lock);
  h->async_open = false;
  kexd_wake_close(&h->wake, NULL);
}

void kexd_streams_free(kexd_streams *h) {
  if (!h) return;
  pthread_mutex_destroy(&h->lock);
  kex_free(h);
}

/* The loop: pump each stream with queued events (one at a time off the list: pumping one may release another). */
static void on_hub_async(kexd_wake *w) {
  kexd_streams *h = w->data;
  for (;;) {
    kexd_stream *st;
    pthread_mutex_lock(&h->lock);
    if ((st = h->dirty)) {
      h->dirty = st->dirty_next;
      st->dirty = false;
      st->dirty_next = NULL;
    }
    pthread_mutex_unlock(&h->lock);
    if (!st) break;
    kexd_stream_pump(st);
  }
}

/* ---- one stream ---- */

static void stream_release(kexd_stream *st) {
  kexd_streams *h = st->hub;
  kexd_stream_ev *e;
  pthread_mutex_lock(&h->lock);
  if (st->dirty) { /* off the hub's list */
    kexd_stream **pp = &h->dirty;
    while (*pp != st) pp = &(*pp)->dirty_next;
    *pp = st->dirty_next;
    st->dirty = false;
  }
  e = st->head;
  st->head = st->tail = NULL;
  pthread_mutex_unlock(&h->lock);
  while (e) {
    kexd_stream_ev *n = e->next;
    kex_free(e);
    e = n;
  }
  kexd_call_set_hooks(st->call, NULL, NULL, NULL);
  kexd_call_unref(st->call);
  st->ops->release(st->owner); /* frees st */
}

/* Released when the call is over and nothing is in flight; true when it was. */
static bool maybe_release(kexd_stream *st) {
  if ((st->ended || st->dead) && !st->writing && !st->held && !st->refs && !st->pumping) {
    stream_release(st);
    return true;
  }
  return false;
}

static void mark_dead(kexd_stream *st) {
  if (st->dead) return;
  st->dead = true;
  if (st->ops->cancelled) st->ops->cancelled(st->owner);
}

static void on_cancel(kexd_call *c, void *ud) {
  kexd_stream *st = ud;
  (void)c;
  mark_dead(st);
  maybe_release(st);
}

static void on_stop(kexd_call *c, void *ud) {
  kexd_stream *st = ud;
  (void)c;
  if (!st->dead && !st->ended) st->ops->stopping(st->owner);
}

void kexd_stream_start(kexd_stream *st, kexd_streams *hub, kexd_call *c, const kexd_stream_ops *ops, void *owner) {
  *st = (kexd_stream){0};
  st->hub = hub;
  st->call = c;
  st->ops = ops;
  st->owner = owner;
  kexd_call_ref(c); /* the stream's own, dropped at release */
  kexd_call_set_hooks(c, on_cancel, ops->stopping ? on_stop : NULL, st);
}

void kexd_stream_hold(kexd_stream *st) {
  st->held++;
  st->acts++;
}

void kexd_stream_unhold(kexd_stream *st) {
  st->held--;
  kexd_stream_pump(st);
}

void kexd_stream_ref(kexd_stream *st) { st->refs++; }

void kexd_stream_unref(kexd_stream *st) {
  st->refs--;
  maybe_release(st);
}

void kexd_stream_push(kexd_stream *st, kexd_stream_ev *ev) {
  kexd_streams *h = st->hub;
  bool wake;
  ev->next = NULL;
  pthread_mutex_lock(&h->lock);
  if (st->tail) st->tail->next = ev;
  else st->head = ev;
  st->tail = ev;
  /* off the loop: list it and wake the loop (on the loop the owner pumps itself) */
  wake = !pthread_equal(pthread_self(), h->loop_thread) && !h->closed;
  if (wake && !st->dirty) {
    st->dirty = true;
    st->dirty_next = h->dirty;
    h->dirty = st;
  }
  pthread_mutex_unlock(&h->lock);
  if (wake) kexd_wake_send(&h->wake);
  else st->acts++; /* the loop's own push: a drained that pushed made progress */
}

/* The next queued event (NULL: none); *more: another one is queued behind it. */
static kexd_stream_ev *pop(kexd_stream *st, bool *more) {
  kexd_streams *h = st->hub;
  kexd_stream_ev *e;
  pthread_mutex_lock(&h->lock);
  if ((e = st->head) && !(st->head = e->next)) st->tail = NULL;
  *more = st->head != NULL;
  pthread_mutex_unlock(&h->lock);
  return e;
}

static void on_written(kexd_call *c, int ok, void *ud) {
  kexd_stream *st = ud;
  (void)c;
  st->writing = false;
  if (!ok && !st->dead) {
    mark_dead(st);
    kexd_call_failf(st->call, GRPC_STATUS_CANCELLED, "%s: the stream broke", st->ops->name);
    st->ended = true;
  }
  kexd_stream_pump(st);
}

int kexd_stream_write(kexd_stream *st, const ProtobufCMessage *msg) {
  int rc;
  if (st->writing || st->ended || st->dead) return KEX_EINVAL;
  st->acts++;
  if ((rc = kexd_call_write_more(st->call, msg, st->more, on_written, st)) == 0) st->writing = true;
  else if (kexd_call_cancelled(st->call)) mark_dead(st);
  return rc;
}

void kexd_stream_finish(kexd_stream *st, int status, const char *details, const ProtobufCMessage *msg) {
  if (st->ended) return;
  st->ended = true;
  st->acts++;
  kexd_call_finish(st->call, status, details, msg);
  maybe_release(st);
}

static void on_finished(kexd_call *c, int ok, void *ud) {
  kexd_stream *st = ud;
  (void)c;
  st->writing = false;
  st->delivered = ok;
  maybe_release(st);
}

void kexd_stream_finish_last(kexd_stream *st, const ProtobufCMessage *msg) {
  if (st->ended) return;
  st->ended = true;
  st->acts++;
  kexd_stream_ref(st); /* a done that ran at once must not release st under this function */
  st->writing = true;
  if (kexd_call_finish_notify(st->call, GRPC_STATUS_OK, NULL, msg, on_finished, st) != 0) st->writing = false;
  kexd_stream_unref(st);
}

bool kexd_stream_delivered(const kexd_stream *st) { return st->delivered; }

void kexd_stream_ended(kexd_stream *st) {
  if (st->ended) return;
  st->ended = true;
  st->acts++;
  maybe_release(st);
}

void kexd_stream_failf(kexd_stream *st, int status, const char *fmt, ...) {
  char msg[KEX_ERROR_MSG_MAX];
  KEX_VFORMAT(msg, fmt);
  kexd_stream_finish(st, status, msg, NULL);
}

bool kexd_stream_dead(const kexd_stream *st) { return st->dead; }

void kexd_stream_pump(kexd_stream *st) {
  if (st->pumping) { /* a callback of this pump pumped: the outer loop goes round again */
    st->repump = true;
    return;
  }
  st->pumping = true;
  do {
    st->repump = false;
    while (!st->writing && !st->dead && !st->ended) {
      bool more;
      kexd_stream_ev *e = pop(st, &more);
      if (e) {
        /* a write with a next one behind it (an event, or the owner's end) may wait in gRPC's buffer for it:
           the two go out in one TCP write, and the client wakes once for both */
        st->more = more || (st->ops->more && st->ops->more(st->owner));
        st->ops->event(st->owner, e);
        st->more = false;
        kex_free(e);
        continue;
      }
      if (st->held) break;
      uint32_t acts = st->acts;
      st->ops->drained(st->owner);
      if (st->acts == acts) break; /* it waits for the owner */
    }
  } while (st->repump);
  st->pumping = false;
  maybe_release(st);
}

/*
 * bridge.c - the one loop bridge (bridge.h): per loop, one uv_async
 * handle and a locked queue of the wakes sent since the loop last ran them.
 */
#include "daemon/bridge.h"

#include <pthread.h>

#include "core/alloc.h"
#include "core/errors.h"

typedef struct kexd_bridge {
  uv_loop_t *loop;
  uv_async_t async;
  struct kexd_bridge *next;  /* bridges (one per loop) */
  /* lock protects what follows, and every wake's bridge fields */
  pthread_mutex_t lock;
  kexd_wake *head, *tail;    /* woken, not yet run */
  unsigned open;             /* wakes open (not closed) */
  bool closing;              /* the async handle is being closed: no send reaches it */
} kexd_bridge;

/* bridges_lock protects bridges: the open bridge of each loop */
static pthread_mutex_t bridges_lock = PTHREAD_MUTEX_INITIALIZER;
static kexd_bridge *bridges;

static void bridge_closed(uv_handle_t *h) {
  kexd_bridge *b = h->data;
  pthread_mutex_destroy(&b->lock);
  kex_free(b);
}

/* Run every woken wake (or, closing, its closed callback); close the bridge after the last wake. */
static void on_bridge(uv_async_t *a) {
  kexd_bridge *b = a->data;
  for (;;) {
    pthread_mutex_lock(&b->lock);
    kexd_wake *w = b->head;
    if (w) {
      b->head = w->next;
      if (!b->head) b->tail = NULL;
      w->next = NULL;
      w->queued = false;
    }
    pthread_mutex_unlock(&b->lock);
    if (!w) break;
    if (!w->closing) {
      w->fn(w);
      continue;
    }
    kexd_wake_fn closed = w->closed;
    bool last;
    pthread_mutex_lock(&b->lock);
    last = --b->open == 0;
    if (last) b->closing = true;
    pthread_mutex_unlock(&b->lock);
    if (last) { /* no wake is open: the loop may end; a later kexd_wake_init makes a new bridge */
      pthread_mutex_lock(&bridges_lock);
      for (kexd_bridge **pp = &bridges; *pp; pp = &(*pp)->next)
        if (*pp == b) {
          *pp = b->next;
          break;
        }
      pthread_mutex_unlock(&bridges_lock);
    }
    if (closed) closed(w); /* may free w */
    if (last) {
      uv_close((uv_handle_t *)&b->async, bridge_closed);
      return;
    }
  }
}

int kexd_wake_init(uv_loop_t *loop, kexd_wake *w, kexd_wake_fn fn, void *data) {
  kexd_bridge *b;
  int rc = 0;
  *w = (kexd_wake){.fn = fn, .data = data};
  pthread_mutex_lock(&bridges_lock);
  for (b = bridges; b && b->loop != loop; b = b->next) {
  }
  if (!b) {
    if (!(b = kex_calloc(1, sizeof *b))) {
      rc = KEX_ENOMEM;
      goto out;
    }
    if (uv_async_init(loop, &b->async, on_bridge) < 0) {
      kex_free(b);
      rc = KEX_EINTERNAL;
      goto out;
    }
    b->async.data = b;
    b->loop = loop;
    pthread_mutex_init(&b->lock, NULL);
    b->next = bridges;
    bridges = b;
  }
  pthread_mutex_lock(&b->lock);
  b->open++;
  pthread_mutex_unlock(&b->lock);
  w->b = b;
out:
  pthread_mutex_unlock(&bridges_lock);
  return rc;
}

/* Queue w (caller holds b->lock) and wake the loop, unless it is queued already. */
static void enqueue(kexd_bridge *b, kexd_wake *w) {
  if (w->queued) return;
  w->queued = true;
  w->next = NULL;
  if (b->tail) b->tail->next = w;
  else b->head = w;
  b->tail = w;
  uv_async_send(&b->async); /* under the lock: the handle is closed only after the last wake, under it too */
}

void kexd_wake_send(kexd_wake *w) {
  kexd_bridge *b = w->b;
  pthread_mutex_lock(&b->lock);
  if (!w->closing && !b->closing) enqueue(b, w);
  pthread_mutex_unlock(&b->lock);
}

void kexd_wake_close(kexd_wake *w, kexd_wake_fn closed) {
  kexd_bridge *b = w->b;
  pthread_mutex_lock(&b->lock);
  if (!w->closing) {
    w->closing = true;
    w->closed = closed;
    enqueue(b, w); /* on_bridge calls closed (once: a queued wake is not queued again) */
  }
  pthread_mutex_unlock(&b->lock);
}

/*
 * bridge.h - the one loop bridge: how another thread (the gRPC poller, a
 * device runner, the metrics endpoint's HTTP thread, a stream writer)
 * wakes the loop thread.  Every kexd_wake of a loop goes through that
 * loop's one uv_async handle and one locked queue of woken kexd_wakes;
 * the loop runs each woken one's fn.  A user keeps its own messages in
 * its own locked queue and sends its wake after adding to it, as with
 * uv_async_send: sends coalesce (fn runs at least once after each send,
 * and drains what is queued).
 *
 * The loop's bridge is made at the first kexd_wake_init and closed when
 * its last wake is closed, so it keeps the loop alive exactly while some
 * wake is open (as each user's own uv_async did).
 */
#ifndef KEX_DAEMON_BRIDGE_H
#define KEX_DAEMON_BRIDGE_H

#include <stdbool.h>
#include <uv.h>

typedef struct kexd_wake kexd_wake;
typedef void (*kexd_wake_fn)(kexd_wake *w);

struct kexd_wake {
  kexd_wake_fn fn;           /* loop thread: woken */
  void *data;                /* the user's */
  /* the bridge's (under its lock) */
  struct kexd_bridge *b;
  kexd_wake *next;
  bool queued, closing;
  kexd_wake_fn closed;
};

/* Loop thread: open w on loop's bridge; fn runs on the loop after each send.  0 or a negative code. */
int kexd_wake_init(uv_loop_t *loop, kexd_wake *w, kexd_wake_fn fn, void *data);
/* Any thread: wake the loop to run w->fn.  A no-op once w is closing. */
void kexd_wake_send(kexd_wake *w);
/*
 * Loop thread: close w: fn runs no more; `closed` (may be NULL) runs on
 * the loop later, like uv_close's callback, and w may be freed from then.
 */
void kexd_wake_close(kexd_wake *w, kexd_wake_fn closed);

#endif

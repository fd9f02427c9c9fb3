/*
 * work.h - kexd's worker pool as the engine's executor (realize/engine.h):
 * every piece of pool work kexd runs (planning, compiles, searches, SQLite)
 * goes through kexd_work_submit, the one place that calls uv_queue_work.
 * The work runs on libuv's pool; its `after` on the loop thread.  Also
 * where kexd makes its engines, one per configured device.
 */
#ifndef KEX_DAEMON_WORK_H
#define KEX_DAEMON_WORK_H

#include <uv.h>

#include "realize/engine.h"

/* Run w->fn on the pool, then w->after on loop's thread.  0, or a negative code (after is never called). */
int kexd_work_submit(uv_loop_t *loop, kex_work *w);
/* The executor of loop (kexd_work_submit). */
kex_executor kexd_work_executor(uv_loop_t *loop);

struct kexd;
/*
 * Make d->conns (the per-worker connections to --cache) and one engine per
 * configured device (d->engines), their pool work on d->loop.  0 or
 * KEX_ENOMEM (kexd_engines_free frees what was made).
 */
int kexd_engines_start(struct kexd *d);
/* Each configured device's target (d->targets) from its engine (kex_engine_target), logged. */
void kexd_engines_targets(struct kexd *d);
/* Free the engines and close the connections (once the loop ran out: no pool work is left). */
void kexd_engines_free(struct kexd *d);

#endif

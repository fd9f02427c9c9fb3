/*
 * work.h - kexd's worker pool as the engine's executor (realize/engine.h):
 * every piece of pool work kexd's loop starts (planning, compiles,
 * searches, SQLite) goes through kexd_work_submit.  The work runs on the
 * process's pool (core/pool.h); its `after` on the loop thread.  Also
 * where kexd makes its engines, one per configured device.
 */
#ifndef KEX_DAEMON_WORK_H
#define KEX_DAEMON_WORK_H

#include <uv.h>

#include "realize/engine.h"

struct kexd;
typedef struct kexd_workq kexd_workq;

/*
 * Loop thread: run w->fn on the pool (w->background: in its background
 * lane, after every queued foreground job), then w->after(w, 0) on the
 * loop thread.  0, or KEX_EUNAVAILABLE (no engines yet, or the loop cannot
 * be woken; after is never called).
 */
int kexd_work_submit(struct kexd *d, kex_work *w);
/* The executor of d (kexd_work_submit). */
kex_executor kexd_work_executor(struct kexd *d);

/*
 * Make d->workq (the loop's pool work), d->conns (the per-worker
 * connections to --cache) and one engine per configured device
 * (d->engines), their pool work on d->loop.  0 or
 * KEX_ENOMEM (kexd_engines_free frees what was made).
 */
int kexd_engines_start(struct kexd *d);
/* Each configured device's target (d->targets) from its engine (kex_engine_target), logged. */
void kexd_engines_targets(struct kexd *d);
/* Free the engines, close the connections, free d->workq (once the loop ran out: no pool work is out). */
void kexd_engines_free(struct kexd *d);

#endif

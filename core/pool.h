/*
 * pool.h - the process's worker pool: every piece of off-thread work kex
 * runs (planning, compiles, SQLite, beam candidates, the cpu device's
 * launch helpers) runs on one pool of threads.  Jobs are intrusive: the
 * caller embeds a kex_pool_job in its own work item, fills the item,
 * submits it, and waits for that job (or learns it ended another way: a
 * job may signal its owner itself).  The worker reads the item's inputs
 * (immutable while the job is queued or running) and writes only the
 * item's result fields; once the job has finished the caller owns the
 * whole item again.  Submitting never allocates, so it cannot fail.
 *
 * Threads: submit, wait and cancel from any thread.  Jobs run in
 * submission order (FIFO; kex_pool_submit_front puts one at the head: a
 * short job someone is waiting on now), any number at once.  Two lanes:
 * a job submitted as background (kex_pool_submit_background: a beam
 * search's candidates, many at once) is taken by an idle worker only when
 * no foreground job is queued, so the work of other calls (planning,
 * SQLite lookups, compiles) never queues behind a search's hundreds; the
 * background lane is FIFO too.  A job that waits for another job of the
 * pool does not hold a worker idle: a worker waiting in kex_pool_wait runs
 * the awaited job itself when it is still queued, in either lane, so waits
 * nest without deadlock as long as no two jobs wait for each other, and a
 * search progresses on its own worker however much foreground work there
 * is (on a one-thread pool too).  A job must not touch devices
 * (devices/device.h: one thread owns a device) unless the device says
 * that call is thread-safe.  Each
 * job learns the index of the worker running it (0 .. size-1), so a caller
 * can keep per-worker state (a replica of a non-thread-safe context) in an
 * array indexed by it: a worker runs one job at a time, the nested job of
 * a waiting worker included (the waiting one does not run meanwhile).
 *
 * kex_pool_process() is the process's pool, started at first use; a
 * private pool (kex_pool_create) is for tests of the pool itself.
 */
#ifndef KEX_CORE_POOL_H
#define KEX_CORE_POOL_H

#include <stdbool.h>

#include "core/errors.h"

#define KEX_POOL_MAX_THREADS 1024
#define KEX_POOL_MIN_PROCESS_THREADS 4 /* the process pool's least default size: one long job must not hold it all */
#define KEX_POOL_MAX_STANDINS 64       /* stand-ins for blocked workers at once (kex_pool_block) */

typedef struct kex_pool kex_pool;
typedef struct kex_pool_job kex_pool_job;

typedef void (*kex_pool_fn)(kex_pool_job *job, int worker);

struct kex_pool_job {
  kex_pool_fn fn;
  kex_pool_job *next; /* queue link (the pool's) */
  int done;           /* the pool's; read it through kex_pool_wait */
  bool detached;      /* the pool's: kex_pool_detach's job, never touched once fn starts */
  bool background;    /* the pool's: queued in the background lane (kex_pool_submit_background) */
};

/*
 * Start a pool of `nthreads` workers (0: the CPUs this process may run on,
 * at most KEX_POOL_MAX_THREADS).  Errors: KEX_ENOMEM, KEX_EINTERNAL
 * (pthread_create failed; the threads started so far are joined).
 */
int kex_pool_create(int nthreads, kex_pool **out, kex_error *err);
int kex_pool_size(const kex_pool *p);
/* Worker indexes run 0 .. kex_pool_ids(p) - 1: the workers' and their stand-ins' (kex_pool_block). */
int kex_pool_ids(const kex_pool *p);
/* Queue job to run fn(job, worker) on some worker, after the jobs queued before it. */
void kex_pool_submit(kex_pool *p, kex_pool_job *job, kex_pool_fn fn);
/* Queue job ahead of every queued job. */
void kex_pool_submit_front(kex_pool *p, kex_pool_job *job, kex_pool_fn fn);
/*
 * Queue job in the background lane, after the background jobs queued
 * before it: a worker takes it only while no foreground job is queued (a
 * worker waiting for it in kex_pool_wait still runs it at once).
 */
void kex_pool_submit_background(kex_pool *p, kex_pool_job *job, kex_pool_fn fn);
/*
 * Queue job like kex_pool_submit (front: like kex_pool_submit_front),
 * detached: the pool does not touch job once fn has started, so fn may
 * hand the job's memory back to its owner (which may free it or submit it
 * again); it cannot be waited for (kex_pool_cancel still takes it off the
 * queue).
 */
void kex_pool_detach(kex_pool *p, kex_pool_job *job, kex_pool_fn fn, bool front);
/* Queue job detached (as kex_pool_detach) in the background lane (as kex_pool_submit_background). */
void kex_pool_detach_background(kex_pool *p, kex_pool_job *job, kex_pool_fn fn);
/* Block until job has finished (a worker of p runs it here when it is still queued). */
void kex_pool_wait(kex_pool *p, kex_pool_job *job);
/* Take job off its lane if it has not started: true (it never runs); false: it ran or is running. */
bool kex_pool_cancel(kex_pool *p, kex_pool_job *job);
/*
 * A worker of p is about to wait on something outside the pool for long
 * (another node's search): a stand-in thread with an index of its own
 * runs queued jobs until kex_pool_unblock, so the wait does not hold a
 * worker.  True when it counted (the caller is a worker of p and calls
 * kex_pool_unblock after the wait); false otherwise (nothing to undo).  At
 * most KEX_POOL_MAX_STANDINS at once; past that the wait holds its worker.
 */
bool kex_pool_block(kex_pool *p);
/* The wait is over: the stand-in leaves after its current job. */
void kex_pool_unblock(kex_pool *p);
/* Wait for the queued jobs (both lanes) to finish, stop and join the workers, free the pool.  NULL is a no-op. */
void kex_pool_destroy(kex_pool *p);

/*
 * The size the process pool starts with (0: max(KEX_POOL_MIN_PROCESS_THREADS,
 * the CPUs this process may run on)).  Only before its first use (kexd:
 * --workers); later calls change nothing and return false.
 */
bool kex_pool_process_size(int nthreads);
/*
 * The process's pool, started at the first call (on failure to start any
 * thread the process exits: nothing could run).  It lives until the
 * process exits.
 */
kex_pool *kex_pool_process(void);
/* The index of the calling thread in p (-1: not one of p's workers). */
int kex_pool_self(const kex_pool *p);

#endif

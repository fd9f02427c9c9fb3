/*
 * pool.h - a small pthread worker pool for CPU-only work (rendering and
 * compiling beam candidates).  Jobs are intrusive: the caller embeds a kex_pool_job in its
 * own work item, fills the item, submits it, and waits for that job.  The
 * worker reads the item's inputs (immutable while the job is queued or
 * running) and writes only the item's result fields; after kex_pool_wait
 * returns for a job the caller owns the whole item again.  Submitting never
 * allocates, so it cannot fail.
 *
 * Threads: create and destroy are called by the owner; submit and wait by
 * any thread, so one pool can serve several callers at once (kexd makes
 * one at start and every beam search it runs shares it; an in-process
 * tool lets each search make its own).  A job must not wait for another
 * job of the pool (every worker could be waiting).  Jobs run on the pool's
 * threads in submission order (FIFO), any number at once; a job must not
 * touch devices (devices/device.h: one thread owns a device) unless the
 * device says that call is thread-safe.  Each job learns the index of the
 * worker running it (0 .. size-1), so a caller can keep per-worker state (a
 * replica of a non-thread-safe context) in an array indexed by it: a worker
 * runs one job at a time.  Destroy only after every caller is done.
 */
#ifndef KEX_SEARCH_POOL_H
#define KEX_SEARCH_POOL_H

#include "core/errors.h"

#define KEX_POOL_MAX_THREADS 64

typedef struct kex_pool kex_pool;
typedef struct kex_pool_job kex_pool_job;

typedef void (*kex_pool_fn)(kex_pool_job *job, int worker);

struct kex_pool_job {
  kex_pool_fn fn;
  kex_pool_job *next; /* queue link (the pool's) */
  int done;           /* the pool's; read it through kex_pool_wait */
};

/*
 * Start a pool of `nthreads` workers (0: the online cores, at most
 * KEX_POOL_MAX_THREADS).  Errors: KEX_ENOMEM, KEX_EINTERNAL (pthread_create
 * failed; the threads started so far are joined).
 */
int kex_pool_create(int nthreads, kex_pool **out, kex_error *err);
int kex_pool_size(const kex_pool *p);
/* Queue job (job->fn set by the caller) to run fn(job, worker) on some worker. */
void kex_pool_submit(kex_pool *p, kex_pool_job *job, kex_pool_fn fn);
/* Block until job has finished. */
void kex_pool_wait(kex_pool *p, kex_pool_job *job);
/* Wait for the queued jobs to finish, stop and join the workers, free the pool.  NULL is a no-op. */
void kex_pool_destroy(kex_pool *p);

#endif

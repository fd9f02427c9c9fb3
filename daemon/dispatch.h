/*
 * dispatch.h - device runner threads and the weighted fair queue in front
 * of each device.
 *
 * One runner thread per device in use (started at the first work item for
 * that device, which it opens itself): the only thread that calls into that
 * device and its handles (devices/device.h).  The loop thread posts work
 * items; after kexd_dispatch_post the item belongs to the dispatcher until
 * its `done` callback runs on the loop thread, and the runner reads only
 * its request fields and writes only its result fields -- a message, never
 * shared state.
 *
 * Fairness: each job has a FIFO of items per device (a "flow").  The runner
 * always runs the head item of the flow with the smallest virtual time; a
 * flow's virtual time advances by each item's measured time divided by the
 * job's weight, so saturating jobs share the device in proportion to their
 * weights.  A flow that becomes active (nothing queued or running before)
 * starts at max(its virtual time, the smallest virtual time of the active
 * flows), so an idle job cannot bank credit.
 *
 * Items of one job on one device run in the order they were posted.
 * After kexd_dispatch_cancel_job only items of must_run kinds should be
 * posted for that job (their flow is removed once it is empty again); work
 * that outlives its job goes to flow 0, the daemon's own.
 */
#ifndef KEX_DAEMON_DISPATCH_H
#define KEX_DAEMON_DISPATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/errors.h"
#include "daemon/histogram.h"
#include "devices/device.h"

typedef struct kexd_dispatch kexd_dispatch;
typedef struct kexd_work kexd_work;

typedef enum kexd_work_kind {
  KEXD_WORK_UPLOAD,   /* alloc `size` bytes, copy src[0..src_size) in (none: a plain alloc); result: out_buf */
  KEXD_WORK_COPY_OUT, /* copy [offset, offset + size) of buf to dst */
  KEXD_WORK_FREE,     /* kex_buffer_free(buf); always runs, even when the job is cancelled */
  KEXD_WORK_RUN,      /* fn(dev, arg, &device_s, &err) */
} kexd_work_kind;

/*
 * A closure run on the device's runner thread with the open device.  It
 * sets *device_s to the device time it measured (seconds; leave it negative
 * and the runner uses the wall time of the call) and returns 0 or a
 * negative KEX_E* code with *err filled.  It must touch only dev and what
 * arg owns.
 */
typedef int (*kexd_work_fn)(kex_device *dev, void *arg, double *device_s, kex_error *err);

/* Runs on the loop thread when the item is finished (or cancelled: rc KEX_ECANCELLED). */
typedef void (*kexd_work_done)(kexd_work *w);

struct kexd_work {
  /* request: set before posting, read-only after */
  kexd_work_kind kind;
  uint64_t job;       /* the flow it is charged to (kexd_job.id; 0 is the daemon's own) */
  uint32_t weight;    /* the job's weight (>= 1) */
  bool must_run;      /* not dropped by kexd_dispatch_cancel_job / stop (FREE always is) */
  bool defer_done;    /* done may wait until the flow's next item has run, when the runner runs that one at
                         once (a chain of short items then wakes the loop once, not once per item) */
  kex_buffer *buf;    /* COPY_OUT, FREE */
  size_t offset, size;/* COPY_OUT: the range; UPLOAD: bytes to allocate */
  const void *src;    /* UPLOAD: src_size bytes to copy in (owned by the poster) */
  size_t src_size;
  void *dst;          /* COPY_OUT: size bytes (owned by the poster) */
  kexd_work_fn fn;    /* RUN */
  void *arg;
  kexd_work_done done;
  void *ud;           /* the poster's */
  /* result: written by the runner, read in done */
  int rc;
  kex_error err;
  kex_buffer *out_buf; /* UPLOAD: the new buffer, owned by the poster from done on */
  double device_s;     /* measured time of the item */
  bool woke;           /* the runner woke the loop right after it (false: its done waited for a later item's) */
  double posted_s;     /* when it was posted (its queue wait starts; metrics) */
  /* dispatcher links */
  kexd_work *next;
};

/* Per-job counters, summed over devices (GetStats). */
typedef struct kexd_flow_stats {
  uint32_t queued;     /* items waiting */
  uint32_t running;    /* items on a device now */
  uint64_t items_done; /* items that ran (cancelled ones excluded) */
  double device_s;     /* measured time of the items that ran */
} kexd_flow_stats;

#define KEXD_DISPATCH_NAME_MAX 64 /* bytes of a device name, NUL included */

/* A dispatcher for `ndevices` named devices (names copied; index = position).  0, KEX_ENOMEM. */
int kexd_dispatch_new(uv_loop_t *loop, const char (*names)[KEXD_DISPATCH_NAME_MAX], uint32_t ndevices,
                      kexd_dispatch **out);

/*
 * Set the kernel time limit (seconds, 0 = none; devices/device.h says what
 * it means on each device) of the devices the runners open from now on:
 * call it before the first post.  Every kernel a runner runs is under it --
 * Submit's and Tune's alike.
 */
void kexd_dispatch_set_kernel_time_limit(kexd_dispatch *d, double seconds);

/*
 * How a runner opens its device (on the runner's thread, at its first
 * item and again after a failed open): kexd's engines (realize/engine.h,
 * kex_engine_open_instance: --test-fault's wrapper included).  0 or a
 * negative code with *err.  Set before the first post; without one, every
 * item of a runner fails UNAVAILABLE.
 */
typedef int (*kexd_device_opener)(void *ud, uint32_t device_index, kex_device **out, kex_error *err);
void kexd_dispatch_set_opener(kexd_dispatch *d, kexd_device_opener open, void *ud);

/*
 * Queue w for device `device_index` (starting its runner when needed).
 * After 0 the item belongs to the dispatcher until w->done runs on the loop
 * thread.  Errors (done is then never called): KEX_EINVAL (bad index or
 * kind), KEX_EUNAVAILABLE (stopping), KEX_EINTERNAL (no thread).
 */
int kexd_dispatch_post(kexd_dispatch *d, uint32_t device_index, kexd_work *w);
/*
 * kexd_dispatch_post of works[0..n-1], one job's items in this order, all
 * queued at once under one lock and one wake of the runner (which then sees
 * the whole chain: a defer_done item's successor is already there).  All or
 * none: the same errors, KEX_EINVAL also for items of different jobs.
 * *idle (may be NULL): the runner had nothing else queued or running, so
 * the chain starts at once.
 */
int kexd_dispatch_post_chain(kexd_dispatch *d, uint32_t device_index, kexd_work *works, uint32_t n, bool *idle);

/*
 * The job is gone: its queued items that are not must_run finish with
 * KEX_ECANCELLED without running (their done still runs); its flows are
 * removed once empty.  An item already running finishes normally.
 */
void kexd_dispatch_cancel_job(kexd_dispatch *d, uint64_t job);

/*
 * What device device_index's runner has done since start (metrics): busy_s,
 * the wall seconds it spent running items; wait, each item's queue wait
 * (posted to picked) as a histogram.  Loop thread.  Zeroes for a device whose
 * runner never started.
 */
void kexd_dispatch_device_stats(kexd_dispatch *d, uint32_t device_index, double *busy_s, kexd_histogram *wait);

/* The job's counters now (briefly takes each runner's lock). */
void kexd_dispatch_job_stats(kexd_dispatch *d, uint64_t job, kexd_flow_stats *out);

/*
 * Stop: queued items that are not must_run are cancelled, the rest run, the
 * runners close their devices and exit, the loop handles close; then
 * on_stopped(ud) runs on the loop thread.  Idempotent.
 */
void kexd_dispatch_stop(kexd_dispatch *d, void (*on_stopped)(void *ud), void *ud);
/* Free a dispatcher after on_stopped ran (or one that never started a runner). */
void kexd_dispatch_free(kexd_dispatch *d);

/*
 * Routes: the bridge that lets a thread other than the loop (a beam
 * search on the worker pool) run device jobs through a job's flow and
 * block until each is back, so a search's device work (alloc, copy,
 * compile, load, launch, free) is fair-queued and charged like any other
 * item of its job and never overlaps another job's kernel.
 *
 * kexd_route_exec queues a request on the dispatcher's locked list and
 * wakes the loop (uv_async_send); the loop posts it as a must_run RUN item
 * on the route's flow (a free always runs, even after the job was
 * cancelled; a search stops itself between candidates through
 * kexd_route_cancelled), and the item's done wakes the waiting thread.  At
 * most one item of a route is queued at any time.  When the route's job is
 * gone (kexd_dispatch_set_job_check says so) the item runs on the daemon's
 * flow (0) and the route's cancel flag is set; when the dispatcher is
 * stopping the job fails at once with KEX_EUNAVAILABLE and the flag is set.
 */
typedef int (*kexd_route_job)(kex_device *dev, void *arg, kex_error *err);

typedef struct kexd_route {
  kexd_dispatch *disp;
  uint32_t device;           /* configured device index */
  uint64_t job;              /* the flow charged (0: the daemon's) */
  uint32_t weight;
  atomic_bool *cancel;       /* set by the loop (call cancelled, job gone) and by the dispatcher (above) */
  double kernel_deadline;    /* kexd_route_now() past which kexd_route_cancelled says stop (INFINITY: none) */
  bool timed_out;            /* the deadline stopped it (written by the routed thread) */
} kexd_route;

/* Whether job `job` is still open (loop thread); the dispatcher asks before posting a route's item. */
void kexd_dispatch_set_job_check(kexd_dispatch *d, bool (*job_open)(void *ud, uint64_t job), void *ud);
/*
 * Any thread but the loop: run job(dev, arg, err) on route->device's
 * runner, charged to route->job, and return its result (a kex_beam_exec_fn:
 * `route` is the kexd_route, `dev` is ignored).  Blocks.
 */
int kexd_route_exec(void *route, kex_device *dev, kexd_route_job job, void *arg, kex_error *err);
/* The route should stop: its cancel flag is set or its kernel deadline passed (then timed_out is set). */
bool kexd_route_cancelled(void *route);
/* The runner's open device, for its identity (only device jobs may use it, on the runner).  0 or a code. */
int kexd_route_device(kexd_route *route, kex_device **out, kex_error *err);
/* CLOCK_MONOTONIC in seconds (the clock of kernel_deadline). */
double kexd_route_now(void);

#endif

/*
 * dispatch.c - one runner thread per device, weighted fair queueing across
 * jobs (dispatch.h says what the callers see).
 *
 * A runner is created on the loop thread at the first item for its device.
 * Its thread opens the device (the opener, kexd's engine, runs there, never on the
 * loop), then repeatedly takes the head item of the flow with the smallest
 * virtual time, runs it with the lock released, charges the measured time to
 * the flow and hands the item back: onto the runner's done list, with
 * its wake (the loop bridge, bridge.h) sent, whose callback runs each item's
 * done.  A device that fails to open fails the item that needed it and is
 * tried again at the next item.
 *
 * Virtual time: flow.vtime advances by device_s / weight after each item.
 * When a flow becomes active (it had nothing queued or running), its vtime
 * becomes max(vtime, min vtime of the other active flows) -- or
 * max(vtime, runner.vclock), the vtime of the last flow picked, when no
 * other flow is active -- so idleness is never credit.  Ties go to the flow
 * served least recently.
 *
 * Waking the loop: after each item, except after an item marked defer_done
 * when the next item picked is the same flow's: its done is delivered with
 * that item's (the loop drains the whole done list at each wake).  The
 * poster marks only items whose successor it knows to be short, so a
 * submission of tiny kernels costs one loop wake instead of one per item,
 * and nothing waits behind another job's item.  Nor for long: once the
 * items since the last wake have run DISPATCH_DEFER_MAX_S, the next one to
 * end wakes the loop, so a chain slower than its poster expected still
 * reports (Submit holds a quick chain's progress events until it hears).
 *
 * Every device a runner opens gets the dispatcher's kernel time limit
 * (copied into the runner when it starts, so the thread reads its own).
 *
 * Stop: cancelled items and finished ones go back through the done list;
 * after the runner thread has drained its must_run items it unrefs the
 * device, says it exited, and the loop joins it (at once: it has returned)
 * and closes its wake.
 *
 * Routes (dispatch.h): a routed thread's request waits on the
 * dispatcher's route list (route_lock) until the route wake wakes
 * the loop, which posts it like any item; its done callback signals the
 * request's condition variable.  The request lives on the routed thread's
 * stack.  At stop the route handle closes with the runners' and later
 * requests fail at once.
 */
#include "daemon/dispatch.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "daemon/bridge.h"

#define DISPATCH_NAME_MAX KEXD_DISPATCH_NAME_MAX
#define DISPATCH_DEFER_MAX_S 0.002 /* deferred dones wait at most this long (then the next item's end wakes the loop) */

typedef struct flow {
  uint64_t job;
  uint32_t weight;
  double vtime;         /* seconds of device time / weight */
  uint64_t last_served; /* runner.picks at its last pick: tie-break */
  kexd_work *head, *tail;
  uint32_t queued, running;
  uint64_t items_done;
  double device_s;
  bool cancelled;       /* its job is gone: remove once empty */
  struct flow *next;
} flow;

typedef struct runner {
  kexd_dispatch *d;
  uint32_t index;
  char name[DISPATCH_NAME_MAX];
  pthread_t thread;
  bool thread_started, joined;
  kexd_wake done_wake;      /* the loop bridge (bridge.h): items handed back */
  bool async_open;
  /*
   * lock protects everything below it: the flows and their queues and
   * counters, vclock and picks, the done list, stopping and exited.  The
   * loop thread takes it to post, cancel, read stats and drain the done
   * list; the runner thread to pick and to hand an item back.  It is never
   * held while an item runs or while the device opens.
   */
  pthread_mutex_t lock;
  pthread_cond_t wake;  /* signalled (under lock) when an item is queued or stopping is set */
  flow *flows;
  double vclock;
  uint64_t picks;
  kexd_work *done_head, *done_tail;
  bool stopping, exited;
  double busy_s;          /* wall seconds spent running items (metrics) */
  double quiet_since;     /* runner thread: when the first item since the loop's last wake started */
  bool quiet;             /* runner thread: the last item's done is waiting (deferred) */
  kexd_histogram wait;    /* items' queue waits (metrics) */
  /* runner thread only (kernel_time_limit_s: written before the thread starts) */
  kex_device *dev;
  double kernel_time_limit_s;
} runner;

typedef struct route_req route_req;

struct kexd_dispatch {
  uv_loop_t *loop;
  /* routes: route_lock protects reqs and route_closed (any thread); the rest is the loop's */
  kexd_wake route_wake;     /* the loop bridge (bridge.h): route requests queued */
  bool route_open;
  pthread_mutex_t route_lock;
  route_req *reqs, *reqs_tail;
  bool route_closed;
  bool (*job_open)(void *ud, uint64_t job);
  void *job_open_ud;
  uint32_t nrunners;
  runner **runners;     /* [nrunners]; NULL until the device's first item */
  char (*names)[DISPATCH_NAME_MAX];
  bool stopping;
  double kernel_time_limit_s;
  kexd_device_opener opener; /* kexd_dispatch_set_opener */
  void *opener_ud;
  uint32_t open_handles;
  void (*on_stopped)(void *);
  void *stopped_ud;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

double kexd_route_now(void) { return now_s(); }

/* ---- under the runner's lock ---- */

static void done_push(runner *r, kexd_work *w) {
  w->next = NULL;
  if (r->done_tail) r->done_tail->next = w;
  else r->done_head = w;
  r->done_tail = w;
}

static flow *flow_find(runner *r, uint64_t job) {
  for (flow *f = r->flows; f; f = f->next)
    if (f->job == job) return f;
  return NULL;
}

static void flow_remove(runner *r, flow *f) {
  flow **pp = &r->flows;
  while (*pp != f) pp = &(*pp)->next;
  *pp = f->next;
  kex_free(f);
}

static bool flow_active(const flow *f) { return f->queued || f->running; }

/* f becomes active: start at max(its vtime, the smallest vtime of the other active flows / the clock). */
static void flow_activate(runner *r, flow *f) {
  bool any = false;
  double vmin = 0;
  for (flow *g = r->flows; g; g = g->next) {
    if (g == f || !flow_active(g)) continue;
    if (!any || g->vtime < vmin) vmin = g->vtime;
    any = true;
  }
  if (!any) vmin = r->vclock;
  if (f->vtime < vmin) f->vtime = vmin;
}

/* Move f's queued items that may be dropped to the done list as cancelled.  Returns how many. */
static uint32_t flow_cancel(runner *r, flow *f) {
  kexd_work **pp = &f->head, *w;
  uint32_t n = 0;
  f->tail = NULL;
  while ((w = *pp)) {
    if (w->must_run || w->kind == KEXD_WORK_FREE) {
      f->tail = w;
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    f->queued--;
    w->rc = kex_err_set(&w->err, KEX_ECANCELLED, "cancelled: the job was closed or the daemon is stopping");
    done_push(r, w);
    n++;
  }
  return n;
}

/* The flow with queued items and the smallest vtime (least recently served on a tie); NULL when none. */
static flow *flow_pick(runner *r) {
  flow *best = NULL;
  for (flow *f = r->flows; f; f = f->next) {
    if (!f->queued) continue;
    if (!best || f->vtime < best->vtime || (f->vtime == best->vtime && f->last_served < best->last_served)) best = f;
  }
  return best;
}

/* ---- the runner thread ---- */

/* A device that does not open makes its items UNAVAILABLE (it is configured, just not usable now). */
static int open_failed(const runner *r, kex_error *err, int rc, const kex_error *open_err) {
  return kex_err_set(err, KEX_EUNAVAILABLE, "device \"%s\" cannot be opened: %s", r->name,
                     open_err->msg[0] ? open_err->msg : kex_strerror(rc));
}

/* Run one item on the device (opening it first if needed); fills w's result fields. */
static void run_item(runner *r, kexd_work *w) {
  double t0 = now_s();
  kex_error oerr = {0};
  int rc;
  w->device_s = -1;
  w->rc = 0;
  if (!r->dev && w->kind != KEXD_WORK_FREE) {
    kexd_dispatch *d = r->d;
    rc = d->opener ? d->opener(d->opener_ud, r->index, &r->dev, &oerr) : KEX_EUNAVAILABLE;
    if (rc < 0) {
      r->dev = NULL;
      w->rc = open_failed(r, &w->err, rc, &oerr);
      w->device_s = 0;
      return;
    }
    kex_device_set_kernel_time_limit(r->dev, r->kernel_time_limit_s);
  }
  switch (w->kind) {
  case KEXD_WORK_UPLOAD:
    w->rc = kex_device_alloc(r->dev, w->size ? w->size : 1, &w->out_buf, &w->err);
    if (!w->rc && w->src_size && (w->rc = kex_buffer_copy_in(w->out_buf, 0, w->src, w->src_size, &w->err)) < 0) {
      kex_buffer_free(w->out_buf);
      w->out_buf = NULL;
    }
    break;
  case KEXD_WORK_COPY_OUT:
    w->rc = kex_buffer_copy_out(w->buf, w->offset, w->dst, w->size, &w->err);
    break;
  case KEXD_WORK_FREE:
    kex_buffer_free(w->buf);
    break;
  case KEXD_WORK_RUN:
    w->rc = w->fn(r->dev, w->arg, &w->device_s, &w->err);
    break;
  }
  if (w->device_s < 0) w->device_s = now_s() - t0;
}

static void *runner_main(void *arg) {
  runner *r = arg;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    flow *f = flow_pick(r);
    kexd_work *w;
    if (!f) {
      if (r->stopping) break;
      pthread_cond_wait(&r->wake, &r->lock);
      continue;
    }
    w = f->head;
    f->head = w->next;
    if (!f->head) f->tail = NULL;
    f->queued--;
    f->running++;
    f->last_served = ++r->picks;
    if (f->vtime > r->vclock) r->vclock = f->vtime;
    double t0 = now_s();
    if (!r->quiet) r->quiet_since = t0;
    kexd_histogram_observe(&r->wait, t0 - w->posted_s);
    pthread_mutex_unlock(&r->lock);
    run_item(r, w);
    double t1 = now_s();
    pthread_mutex_lock(&r->lock);
    r->busy_s += t1 - t0;
    f->running--;
    f->vtime += w->device_s / f->weight;
    f->device_s += w->device_s;
    f->items_done++;
    done_push(r, w);
    /* a deferred done rides with the next item's when that item is the flow's and runs now, unless the loop has
       not heard from the runner for DISPATCH_DEFER_MAX_S (a chain slower than its poster expected) */
    bool wake = !(w->defer_done && flow_pick(r) == f && t1 - r->quiet_since < DISPATCH_DEFER_MAX_S);
    r->quiet = !wake;
    w->woke = wake; /* still under the lock the loop takes the done list with */
    if (f->cancelled && !flow_active(f)) flow_remove(r, f);
    pthread_mutex_unlock(&r->lock);
    if (wake) kexd_wake_send(&r->done_wake);
    pthread_mutex_lock(&r->lock);
  }
  pthread_mutex_unlock(&r->lock);
  kex_device_unref(r->dev); /* the buffers were freed by FREE items; each kept its own reference anyway */
  r->dev = NULL;
  pthread_mutex_lock(&r->lock);
  r->exited = true;
  pthread_mutex_unlock(&r->lock);
  kexd_wake_send(&r->done_wake);
  return NULL;
}

/* ---- the loop thread ---- */

static void on_runner_closed(kexd_wake *h) {
  runner *r = h->data;
  kexd_dispatch *d = r->d;
  r->async_open = false;
  if (--d->open_handles == 0 && d->stopping && d->on_stopped) d->on_stopped(d->stopped_ud);
}

/* Run done for every item handed back; after the thread exited, join it and close the handle. */
static void on_runner_async(kexd_wake *a) {
  runner *r = a->data;
  kexd_work *w;
  bool exited;
  pthread_mutex_lock(&r->lock);
  w = r->done_head;
  r->done_head = r->done_tail = NULL;
  exited = r->exited;
  pthread_mutex_unlock(&r->lock);
  while (w) {
    kexd_work *next = w->next; /* done may free w */
    w->next = NULL;
    w->done(w);
    w = next;
  }
  if (exited && !r->joined) {
    pthread_join(r->thread, NULL);
    r->joined = true;
    kexd_wake_close(&r->done_wake, on_runner_closed);
  }
}

static void on_route_async(kexd_wake *h);

int kexd_dispatch_new(uv_loop_t *loop, const char (*names)[KEXD_DISPATCH_NAME_MAX], uint32_t ndevices,
                      kexd_dispatch **out) {
  kexd_dispatch *d;
  *out = NULL;
  if (!(d = kex_calloc(1, sizeof *d))) return KEX_ENOMEM;
  d->loop = loop;
  d->nrunners = ndevices;
  pthread_mutex_init(&d->route_lock, NULL);
  if (!(d->runners = kex_calloc(ndevices ? ndevices : 1, sizeof *d->runners)) ||
      !(d->names = kex_calloc(ndevices ? ndevices : 1, sizeof *d->names))) {
    kexd_dispatch_free(d);
    return KEX_ENOMEM;
  }
  for (uint32_t i = 0; i < ndevices; i++) snprintf(d->names[i], DISPATCH_NAME_MAX, "%s", names[i]);
  if (kexd_wake_init(loop, &d->route_wake, on_route_async, d) < 0) {
    kexd_dispatch_free(d);
    return KEX_EINTERNAL;
  }
  d->route_open = true;
  d->open_handles++;
  *out = d;
  return 0;
}

static void runner_free(runner *r) {
  if (!r) return;
  while (r->flows) flow_remove(r, r->flows);
  pthread_cond_destroy(&r->wake);
  pthread_mutex_destroy(&r->lock);
  kex_free(r);
}

/* The runner of device i, started now if it is not yet.  NULL when it cannot be. */
static runner *runner_get(kexd_dispatch *d, uint32_t i) {
  runner *r = d->runners[i];
  if (r) return r;
  if (!(r = kex_calloc(1, sizeof *r))) return NULL;
  r->d = d;
  r->index = i;
  r->kernel_time_limit_s = d->kernel_time_limit_s;
  memcpy(r->name, d->names[i], sizeof r->name);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->wake, NULL);
  if (kexd_wake_init(d->loop, &r->done_wake, on_runner_async, r) < 0) {
    runner_free(r);
    return NULL;
  }
  r->async_open = true;
  d->open_handles++;
  if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
    KEX_ERROR("dispatch: cannot start the runner thread of device \"%s\"", r->name);
    r->joined = true;
    d->runners[i] = r; /* freed with the dispatcher, after its handle closed */
    kexd_wake_close(&r->done_wake, on_runner_closed);
    return NULL;
  }
  r->thread_started = true;
  d->runners[i] = r;
  kex_log(KEX_LOG_DEBUG, NULL, 0, "dispatch: runner for device \"%s\" started", r->name);
  return r;
}

void kexd_dispatch_set_kernel_time_limit(kexd_dispatch *d, double seconds) {
  d->kernel_time_limit_s = seconds > 0 ? seconds : 0;
}

void kexd_dispatch_set_opener(kexd_dispatch *d, kexd_device_opener open, void *ud) {
  d->opener = open;
  d->opener_ud = ud;
}

int kexd_dispatch_post(kexd_dispatch *d, uint32_t device_index, kexd_work *w) {
  return kexd_dispatch_post_chain(d, device_index, w, 1, NULL);
}

int kexd_dispatch_post_chain(kexd_dispatch *d, uint32_t device_index, kexd_work *works, uint32_t n, bool *idle) {
  runner *r;
  flow *f;
  bool none = true;
  if (device_index >= d->nrunners || !n) return KEX_EINVAL;
  for (uint32_t i = 0; i < n; i++) {
    kexd_work *w = &works[i];
    if (!w->done || (w->kind == KEXD_WORK_RUN && !w->fn) ||
        ((w->kind == KEXD_WORK_COPY_OUT || w->kind == KEXD_WORK_FREE) && !w->buf) || w->job != works[0].job)
      return KEX_EINVAL;
  }
  if (d->stopping) return KEX_EUNAVAILABLE;
  if (d->runners[device_index] && !d->runners[device_index]->thread_started) return KEX_EINTERNAL;
  if (!(r = runner_get(d, device_index))) return KEX_EINTERNAL;
  double posted = now_s();
  for (uint32_t i = 0; i < n; i++) {
    kexd_work *w = &works[i];
    w->next = i + 1 < n ? &works[i + 1] : NULL;
    w->rc = 0;
    w->out_buf = NULL;
    w->device_s = 0;
    w->woke = false;
    w->posted_s = posted;
    w->err.code = 0;
    w->err.msg[0] = '\0';
  }
  pthread_mutex_lock(&r->lock);
  for (flow *g = r->flows; g && none; g = g->next) none = !flow_active(g);
  if (!(f = flow_find(r, works[0].job))) {
    if (!(f = kex_calloc(1, sizeof *f))) {
      pthread_mutex_unlock(&r->lock);
      return KEX_ENOMEM;
    }
    f->job = works[0].job;
    f->next = r->flows;
    r->flows = f;
  }
  f->weight = works[0].weight ? works[0].weight : 1; /* a cancelled flow stays cancelled: job ids are never reused */
  if (!flow_active(f)) flow_activate(r, f);
  if (f->tail) f->tail->next = &works[0];
  else f->head = &works[0];
  f->tail = &works[n - 1];
  f->queued += n;
  pthread_mutex_unlock(&r->lock);
  /* once for the chain, after the unlock: a runner woken under the lock would only sleep again on it (two more
     futex calls and a context switch per Submit).  r outlives every post, and the runner tests its queue under
     the lock before it waits, so a signal sent here is never lost. */
  pthread_cond_signal(&r->wake);
  if (idle) *idle = none;
  return 0;
}

void kexd_dispatch_device_stats(kexd_dispatch *d, uint32_t device_index, double *busy_s, kexd_histogram *wait) {
  runner *r = d && device_index < d->nrunners ? d->runners[device_index] : NULL;
  *busy_s = 0;
  memset(wait, 0, sizeof *wait);
  if (!r) return;
  pthread_mutex_lock(&r->lock);
  *busy_s = r->busy_s;
  *wait = r->wait;
  pthread_mutex_unlock(&r->lock);
}

void kexd_dispatch_cancel_job(kexd_dispatch *d, uint64_t job) {
  for (uint32_t i = 0; i < d->nrunners; i++) {
    runner *r = d->runners[i];
    flow *f;
    uint32_t n = 0;
    if (!r || !r->thread_started) continue;
    pthread_mutex_lock(&r->lock);
    if ((f = flow_find(r, job))) {
      n = flow_cancel(r, f);
      f->cancelled = true;
      if (!flow_active(f)) flow_remove(r, f);
    }
    pthread_mutex_unlock(&r->lock);
    if (n) kexd_wake_send(&r->done_wake);
  }
}

void kexd_dispatch_job_stats(kexd_dispatch *d, uint64_t job, kexd_flow_stats *out) {
  memset(out, 0, sizeof *out);
  for (uint32_t i = 0; i < d->nrunners; i++) {
    runner *r = d->runners[i];
    flow *f;
    if (!r || !r->thread_started) continue;
    pthread_mutex_lock(&r->lock);
    if ((f = flow_find(r, job))) {
      out->queued += f->queued;
      out->running += f->running;
      out->items_done += f->items_done;
      out->device_s += f->device_s;
    }
    pthread_mutex_unlock(&r->lock);
  }
}

static void on_route_closed(kexd_wake *h) {
  kexd_dispatch *d = h->data;
  d->route_open = false;
  if (--d->open_handles == 0 && d->stopping && d->on_stopped) d->on_stopped(d->stopped_ud);
}

void kexd_dispatch_stop(kexd_dispatch *d, void (*on_stopped)(void *), void *ud) {
  if (d->stopping) return;
  d->stopping = true;
  d->on_stopped = on_stopped;
  d->stopped_ud = ud;
  if (d->route_open) {
    on_route_async(&d->route_wake); /* the requests queued so far fail: the dispatcher is stopping */
    pthread_mutex_lock(&d->route_lock);
    d->route_closed = true;
    pthread_mutex_unlock(&d->route_lock);
    kexd_wake_close(&d->route_wake, on_route_closed);
  }
  for (uint32_t i = 0; i < d->nrunners; i++) {
    runner *r = d->runners[i];
    if (!r || !r->thread_started) continue;
    pthread_mutex_lock(&r->lock);
    for (flow *f = r->flows; f; f = f->next) flow_cancel(r, f);
    r->stopping = true;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    kexd_wake_send(&r->done_wake);
  }
  if (d->open_handles == 0 && on_stopped) on_stopped(ud);
}

void kexd_dispatch_free(kexd_dispatch *d) {
  if (!d) return;
  for (uint32_t i = 0; d->runners && i < d->nrunners; i++) runner_free(d->runners[i]);
  kex_free(d->runners);
  kex_free(d->names);
  pthread_mutex_destroy(&d->route_lock);
  kex_free(d);
}

/* ---- routes ---- */

struct route_req {
  kexd_route *route;
  kexd_route_job job;
  void *arg;
  kexd_work work;
  pthread_cond_t cv;
  bool done;
  route_req *next;
};

void kexd_dispatch_set_job_check(kexd_dispatch *d, bool (*job_open)(void *ud, uint64_t job), void *ud) {
  d->job_open = job_open;
  d->job_open_ud = ud;
}

/* On the runner: the routed job with the runner's open device. */
static int route_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  route_req *q = arg;
  *device_s = -1; /* the wall time of the call */
  return q->job(dev, q->arg, err);
}

/* On the loop (or the routed thread, when the dispatcher has closed): wake the routed thread (q lives on its stack). */
static void route_done(kexd_work *w) {
  route_req *q = w->ud;
  kexd_dispatch *d = q->route->disp;
  pthread_mutex_lock(&d->route_lock);
  q->done = true;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&d->route_lock);
}

/* On the loop: post the queued requests on their route's flow. */
static void on_route_async(kexd_wake *h) {
  kexd_dispatch *d = h->data;
  route_req *q;
  pthread_mutex_lock(&d->route_lock);
  q = d->reqs;
  d->reqs = d->reqs_tail = NULL;
  pthread_mutex_unlock(&d->route_lock);
  while (q) {
    route_req *next = q->next; /* q may be gone once its done ran */
    kexd_route *rt = q->route;
    kexd_work *w = &q->work;
    int rc;
    memset(w, 0, sizeof *w);
    w->kind = KEXD_WORK_RUN;
    w->job = rt->job;
    w->weight = rt->weight;
    if (rt->job && d->job_open && !d->job_open(d->job_open_ud, rt->job)) { /* the job is gone: the daemon's flow */
      atomic_store(rt->cancel, true);
      w->job = 0;
      w->weight = 1;
    }
    w->must_run = true; /* frees must run; a search stops itself between candidates */
    w->fn = route_run;
    w->arg = q;
    w->done = route_done;
    w->ud = q;
    if ((rc = kexd_dispatch_post(d, rt->device, w)) < 0) {
      w->rc = kex_err_set(&w->err, KEX_EUNAVAILABLE, "the device runner is not available: %s", kex_strerror(rc));
      atomic_store(rt->cancel, true);
      route_done(w);
    }
    q = next;
  }
}

int kexd_route_exec(void *vroute, kex_device *dev, kexd_route_job job, void *arg, kex_error *err) {
  kexd_route *rt = vroute;
  kexd_dispatch *d = rt->disp;
  route_req q;
  bool closed;
  (void)dev;
  memset(&q, 0, sizeof q);
  q.route = rt;
  q.job = job;
  q.arg = arg;
  pthread_cond_init(&q.cv, NULL);
  pthread_mutex_lock(&d->route_lock);
  if (!(closed = d->route_closed)) {
    if (d->reqs_tail) d->reqs_tail->next = &q;
    else d->reqs = &q;
    d->reqs_tail = &q;
  }
  pthread_mutex_unlock(&d->route_lock);
  if (closed) {
    pthread_cond_destroy(&q.cv);
    atomic_store(rt->cancel, true);
    return kex_err_set(err, KEX_EUNAVAILABLE, "the device runner is not available: the daemon is stopping");
  }
  kexd_wake_send(&d->route_wake);
  pthread_mutex_lock(&d->route_lock);
  while (!q.done) pthread_cond_wait(&q.cv, &d->route_lock);
  pthread_mutex_unlock(&d->route_lock);
  pthread_cond_destroy(&q.cv);
  if (q.work.rc < 0 && err) *err = q.work.err;
  return q.work.rc;
}

bool kexd_route_cancelled(void *vroute) {
  kexd_route *rt = vroute;
  if (atomic_load(rt->cancel)) return true;
  if (isfinite(rt->kernel_deadline) && now_s() > rt->kernel_deadline) {
    rt->timed_out = true;
    return true;
  }
  return false;
}

static int job_identify(kex_device *dev, void *arg, kex_error *err) {
  (void)err;
  *(kex_device **)arg = dev;
  return 0;
}

int kexd_route_device(kexd_route *route, kex_device **out, kex_error *err) {
  *out = NULL;
  return kexd_route_exec(route, NULL, job_identify, out, err);
}

/*
 * plan.c - Plan: replay and schedule a graph for a job without running it
 * (the plan builder's first half, realize/plan.h: kex_plan_schedule), on
 * the loop thread for small graphs (--plan-inline-nodes) and on the worker
 * pool for large ones; the reply lists the schedule items as `kex plan
 * --json` prints them.
 *
 * Each thread that plans keeps a warm replay state (sched/warm.h: the
 * interned views and ShapeTrackers of its earlier graphs, and the replay's
 * memory), at most --plan-warm-bytes of it between Plans: the state's
 * objects are immutable values keyed by their content, so the replies are
 * the same warm or cold, and a Plan is done with it (replay and schedule
 * freed) before plan_run returns, on the thread that owns it.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "daemon/rpc.h"
#include "daemon/work.h"
#include "realize/plan.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "sched/warm.h"

/* ---- each thread's warm replay state ---- */

static pthread_key_t warm_key; /* a thread's kex_sched_warm, freed when the thread exits */
static pthread_once_t warm_once = PTHREAD_ONCE_INIT;
static bool warm_key_ok;

static void warm_key_free(void *w) { kex_sched_warm_free(w); }
static void warm_key_make(void) { warm_key_ok = pthread_key_create(&warm_key, warm_key_free) == 0; }

/* This thread's warm state, made on first use; NULL when warm states are off (limit 0) or out of memory. */
static kex_sched_warm *thread_warm(uint64_t limit) {
  kex_sched_warm *w;
  if (!limit || pthread_once(&warm_once, warm_key_make) != 0 || !warm_key_ok) return NULL;
  if ((w = pthread_getspecific(warm_key))) return w;
  if ((w = kex_sched_warm_new()) && pthread_setspecific(warm_key, w) != 0) {
    kex_sched_warm_free(w);
    w = NULL;
  }
  return w;
}

/* ---- Plan ---- */

/* One Plan in progress; owns the graph, the plan (until plan_run is done with it) and the reply. */
typedef struct plan_work {
  kex_work req;
  kexd *d;
  kexd_call *call;
  char job[9];
  kex_graph *g;
  const char *device;    /* the configured device "default" means */
  kex_rplan rp;          /* the replay and the schedule (cleared at the end of plan_run) */
  kex_arena reply_arena; /* the reply's strings and arrays */
  Kex__V1__PlanReply reply;
  double schedule_cpu_us; /* the thread's CPU time in the span reply.schedule_us times (for the debug log) */
  int rc;
  kex_error err;
} plan_work;

static void plan_work_free(plan_work *w) {
  kex_plan_clear(&w->rp);
  kex_arena_destroy(&w->reply_arena);
  kex_graph_free(w->g);
  kex_free(w);
}

/* n ids as an arena array (n = 0 gives a non-NULL pointer); NULL on OOM. */
static uint32_t *arena_u32s(kex_arena *a, const uint32_t *ids, uint32_t n) {
  uint32_t *v = kex_arena_alloc(a, (n ? n : 1) * sizeof *v);
  if (v && n) memcpy(v, ids, n * sizeof *v);
  return v;
}

/*
 * Fill w->reply from the schedule: the `kex plan --json` items, built straight from the schedule
 * (kex_schedule_item_view / _ast; through jansson and back the reply was a quarter of kexd's CPU for a Plan).
 * 0 or KEX_ENOMEM.
 */
static int plan_reply_build(plan_work *w) {
  kex_arena *a = &w->reply_arena;
  const kex_schedule *sched = w->rp.s;
  Kex__V1__PlanReply *r = &w->reply;
  kex_strbuf b = {0};
  int rc = 0;
  kex__v1__plan_reply__init(r);
  r->kernels = sched->nkernels;
  r->intermediate_buffers = sched->nplanned_buffers;
  r->planned_buffers = sched->nplanned_after;
  r->bytes_before = sched->planned_bytes_before;
  r->bytes_after = sched->planned_bytes_after;
  r->n_items = sched->nitems;
  if (!(r->items = kex_arena_calloc(a, r->n_items ? r->n_items : 1, sizeof *r->items))) goto nomem;
  for (uint32_t i = 0; i < sched->nitems; i++) {
    kex_item_view v;
    Kex__V1__PlanItem *it = kex_arena_alloc(a, sizeof *it);
    if (!it) goto nomem;
    kex__v1__plan_item__init(it);
    kex_schedule_item_view(sched, i, &v);
    it->n_outputs = v.noutputs;
    it->n_inputs = v.ninputs;
    it->n_planned = v.nplanned;
    if (!(it->kind = kex_arena_strdup(a, v.kernel ? "kernel" : "loadop")) ||
        !(it->label = kex_arena_strdup(a, v.label)) || !(it->outputs = arena_u32s(a, v.outputs, v.noutputs)) ||
        !(it->inputs = arena_u32s(a, v.inputs, v.ninputs)) || !(it->planned = arena_u32s(a, v.planned, v.nplanned)))
      goto nomem;
    /* the AST lines, '\n'-ended in b, copied once into the arena and cut there */
    b.len = 0;
    if (kex_schedule_item_ast(sched, i, &b) || b.oom) goto nomem;
    it->n_ast = 0;
    for (size_t k = 0; k < b.len; k++) it->n_ast += b.p[k] == '\n';
    if (!(it->ast = kex_arena_alloc(a, (it->n_ast ? it->n_ast : 1) * sizeof *it->ast))) goto nomem;
    if (it->n_ast) {
      char *text = kex_arena_alloc(a, b.len);
      if (!text) goto nomem;
      memcpy(text, b.p, b.len);
      size_t line = 0, start = 0;
      for (size_t k = 0; k < b.len; k++)
        if (text[k] == '\n') {
          text[k] = '\0';
          it->ast[line++] = text + start;
          start = k + 1;
        }
    }
    r->items[i] = it;
  }
  goto out;
nomem:
  rc = KEX_ENOMEM;
out:
  kex_free(b.p);
  return rc;
}

/*
 * Replay, schedule and build the reply, then free the replay and the
 * schedule; safe on a worker thread (touches only w and this thread's warm
 * state, which it is done with on return).
 */
static void plan_run(plan_work *w) {
  uint64_t limit = w->d->cfg.plan_warm_bytes;
  kex_sched_warm *warm = thread_warm(limit);
  double t0, t1;
  struct timespec c0, c1;
  if (warm) kex_plan_use_warm(&w->rp, warm, (size_t)limit);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  t0 = kexd_now_us();
  w->rc = kex_plan_schedule(&w->rp, w->device, &w->err);
  t1 = kexd_now_us();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  w->schedule_cpu_us = (double)(c1.tv_sec - c0.tv_sec) * 1e6 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e3;
  if (!w->rc && (w->rc = plan_reply_build(w)) < 0) kex_err_set(&w->err, w->rc, "Plan: out of memory building the reply");
  w->reply.schedule_us = t1 - t0;
  kex_plan_clear(&w->rp);
  if (warm)
    kex_log(KEX_LOG_DEBUG, w->job, 0, "Plan: warm state %zu bytes after %" PRIu64 " replays, %" PRIu64 " resets",
            kex_sched_warm_bytes(warm), kex_sched_warm_replays(warm), kex_sched_warm_resets(warm));
}

/* Reply on the loop thread and free the work. */
static void plan_done(plan_work *w) {
  kexd *d = w->d;
  if (w->rc < 0) {
    d->plan_errors++;
    kex_log(KEX_LOG_INFO, w->job, 0, "Plan refused: %s", w->err.msg[0] ? w->err.msg : kex_strerror(w->rc));
    kexd_rpc_fail(w->call, w->rc, &w->err);
  } else {
    d->kernels_planned += w->reply.kernels;
    kex_log(KEX_LOG_DEBUG, w->job, 0, "Plan: %u nodes -> %u kernels in %.1f us (thread CPU %.1f us)", w->g->nnodes,
            w->reply.kernels, w->reply.schedule_us, w->schedule_cpu_us);
    kexd_call_finish(w->call, GRPC_STATUS_OK, NULL, &w->reply.base);
  }
  d->plans_in_flight--;
  kexd_call_unref(w->call);
  plan_work_free(w);
}

static void plan_work_cb(kex_work *req) { plan_run(req->data); }

static void plan_after_work_cb(kex_work *req, int status) {
  plan_work *w = req->data;
  if (status < 0 && !w->rc) w->rc = kex_err_set(&w->err, KEX_EINTERNAL, "Plan: the worker pool dropped the job");
  plan_done(w);
}

/* Which configured device a graph's "device" names; NULL when none. */
static const char *resolve_device(const kexd *d, const char *name) {
  if (!name || !*name || strcmp(name, "default") == 0) return d->cfg.devices[0];
  for (uint32_t i = 0; i < d->cfg.ndevices; i++)
    if (strcmp(d->cfg.devices[i], name) == 0) return d->cfg.devices[i];
  return NULL;
}

void kexd_rpc_plan(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__PlanRequest *m = rq->msg;
  kexd_job *job = rq->job;
  plan_work *w = NULL;
  const char *dev;
  int rc;
  d->plans++;
  job->plans++;
  if (!m->graph) {
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Plan: missing graph");
    return;
  }
  if (!(dev = resolve_device(d, m->graph->device))) {
    char names[KEXD_MAX_DEVICES * (KEXD_DEVICE_NAME_MAX + 2)] = "";
    for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
      if (i) strcat(names, ", ");
      strcat(names, d->cfg.devices[i]);
    }
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices (%s)",
                    m->graph->device, names);
    return;
  }
  if (!(w = kex_calloc(1, sizeof *w))) {
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Plan: out of memory");
    return;
  }
  w->d = d;
  w->call = c;
  kex_arena_init(&w->reply_arena, 0);
  memcpy(w->job, job->log_id, sizeof w->job);
  /* the device's target says which of tinygrad's rules apply (CLANG: buffer views); the graph comes next */
  kex_plan_init(&w->rp, NULL, &d->targets[kexd_rpc_device_index(d, dev)]);
  w->device = dev;
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                    &d->cfg.limits, job, &w->g, &w->err)) < 0) {
    d->plan_errors++;
    kex_log(KEX_LOG_INFO, w->job, 0, "Plan refused: %s", w->err.msg);
    kexd_rpc_fail(c, rc, &w->err);
    plan_work_free(w);
    return;
  }
  w->rp.g = w->g;
  kexd_call_ref(c); /* the plan's own reference: the call outlives a cancel until plan_done */
  d->plans_in_flight++;
  if (w->g->nnodes <= d->cfg.plan_inline_nodes) {
    plan_run(w);
    plan_done(w);
  } else {
    w->req = (kex_work){.fn = plan_work_cb, .after = plan_after_work_cb, .data = w};
    if ((rc = kexd_work_submit(d, &w->req)) < 0) {
      plan_run(w); /* the pool refused: do it here rather than fail */
      plan_done(w);
    }
  }
}

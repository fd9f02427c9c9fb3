/*
 * tune.c - Tune (beam-search every kernel of a graph, streaming progress)
 * and the beam hook Submit calls to lower a kernel with searched opts.
 *
 * Searches (search/beam.h) block for seconds, so they never run on the
 * loop thread: a Tune is one piece of pool work (daemon/work.h) that
 * replays, schedules and optimizes every kernel in turn; Submit's hook
 * runs inside Submit's own pool work.  Both are background work of the
 * process's one pool (core/pool.h: taken only while no other call's work
 * is queued), as are their candidates' renders and compiles, and both
 * hold one of the device's search slots for the whole call (searches.c,
 * taken or waited for before the handler runs).  They route every device job a search makes
 * through the caller's job flow on the device's runner (dispatch.h,
 * kexd_route: fair-queued, charged to the job).  A search stops itself
 * between candidates when its call is cancelled (client cancel, deadline,
 * drain after the grace period), its job is gone, or its per-kernel
 * timeout passed.
 *
 * A Tune's events (progress at most every TUNE_PROGRESS_INTERVAL_S, and a
 * finished event per kernel with its cache entry) are pushed from the
 * pool thread onto the call's kexd_stream (stream.h), which writes them in
 * order and then the final status.
 *
 * SQLite: a search uses the connection of the worker thread it runs on
 * (kex_cache_conns, search/cache.h's policy).  A cache that cannot be
 * opened follows realize/plan.h's policy: it fails a Tune (results must
 * be kept) and is a warning for Submit's hook, a lookup
 * (kex_cache_conns_lookup: it searches without, and tries again later).  With --fleet-cache a search's
 * cache miss asks the fleet first and its result is published (daemon/fleet.h, the beam hook).  Every kernel lowered here is remembered for GetCacheEntry
 * (kexd_cache_memo_put).
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/astkey.h"
#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "core/log.h"
#include "daemon/fleet.h"
#include "daemon/rpc.h"
#include "daemon/work.h"
#include "realize/engine.h"
#include "daemon/stream.h"
#include "devices/device.h"
#include "realize/plan.h"
#include "realize/run.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "search/beam.h"
#include "search/cache.h"

#define TUNE_PROGRESS_INTERVAL_S 0.1      /* at most ~10 progress events per second per call */

typedef struct kexd_tuner {
  atomic_uint_fast64_t beam_hits, beam_misses, searches, searches_cancelled; /* any thread */
  atomic_uint_fast64_t search_us; /* any thread: wall time of the searches that finished */
} kexd_tuner;

static const kex_target *device_target(const kexd *d, uint32_t device) { return &d->targets[device]; }

/* ---- lowering with searched opts (Tune and Submit share it) ---- */

/* Beam options from the request (checked by the method table's search column, the width chosen there). */
static void beam_opts_from(kex_beam_opts *bo, int width, const Kex__V1__BeamOptions *b) {
  kex_beam_opts_init(bo, width);
  if (b && b->max_upcast) bo->upcast_max = (int)b->max_upcast;
  if (b && b->max_local) bo->local_max = (int)b->max_local;
}

/*
 * Optimize schedule item `item` (a kernel) of s on ctx's device with
 * bo (exec, cancel and cache filled in here), then render it with the
 * chosen opts into *out (names from `names`, may be NULL) and remember the
 * source.  *res is the search's result.  0 or a negative code with *err.
 */
static int optimize_and_lower(kexd *d, kexd_route *ctx, kexd_tenant_use *use, kex_device *dev, kex_beam_opts *bo,
                              kex_cache *cache,
                              const kex_graph *g, const kex_schedule *s, uint32_t item, kex_name_counter *names,
                              kex_beam_result *res, kex_program_src *out, char *ostr, size_t olen, kex_error *err) {
  kexd_tuner *T = d->tuner;
  const kex_target *tg = device_target(d, ctx->device);
  kex_beam_target t = {g, s, item, tg};
  char ot[KEX_CACHE_OPTS_TEXT_MAX];
  int rc;
  bo->exec = kexd_route_exec;
  bo->exec_ctx = ctx;
  bo->cancelled = kexd_route_cancelled;
  bo->cancel_arg = ctx;
  bo->cache = cache;
  kexd_fleet_search fs;
  bo->remote = cache ? kexd_fleet_hook(d, &fs) : NULL; /* the fleet shares what the SQLite file holds */
  rc = kex_beam_optimize(&t, dev, bo, res, err);
  if (rc == 0) {
    if (res->from_cache) atomic_fetch_add(&T->beam_hits, 1);
    else {
      atomic_fetch_add(&T->beam_misses, 1), atomic_fetch_add(&T->searches, 1);
      atomic_fetch_add(&T->search_us, (uint_fast64_t)(res->search_s * 1e6));
      if (use) __atomic_fetch_add(&use->search_us, (uint64_t)(res->search_s * 1e6), __ATOMIC_RELAXED); /* its tenant pays */
    }
  } else if (rc == KEX_ECANCELLED) {
    atomic_fetch_add(&T->beam_misses, 1);
    atomic_fetch_add(&T->searches, 1);
    atomic_fetch_add(&T->searches_cancelled, 1);
    if (ctx->timed_out) rc = kex_err_set(err, KEX_EDEADLINE, "the search passed its per-kernel timeout");
  }
  if (rc) return rc;
  rc = kex_plan_lower_item(tg, s, item, res->opts, res->nopts, names, out, ostr, olen, err);
  if (rc == 0 && kex_cache_opts_format(res->opts, res->nopts, ot, sizeof ot) == 0)
    kexd_cache_memo_put(d, res->ast_hex, kex_device_get_identity(dev)->kind, ot, out->src);
  return rc;
}

/* ---- Submit's hook ---- */

int kexd_tune_lower_item(const kexd_beam_req *br, const kex_graph *g, const kex_schedule *s, uint32_t item,
                         kex_name_counter *names, kex_program_src *out, char *opts, size_t opts_len, kex_error *err) {
  kexd *d = br->d;
  kexd_route ctx = {d->disp, br->device, br->job, br->weight, br->cancelled, INFINITY, false};
  kex_beam_opts bo;
  kex_beam_result res;
  kex_cache *cache = kex_cache_conns_lookup(d->conns, "beam cache"); /* plan.h's policy for a lookup: without, warned */
  kex_device *dev = NULL;
  int rc;
  kex_beam_opts_init(&bo, br->width);
  if (br->upcast_max) bo.upcast_max = br->upcast_max;
  if (br->local_max) bo.local_max = br->local_max;
  bo.tenant = br->tenant;
  if (br->timeout_ms) ctx.kernel_deadline = kexd_route_now() + br->timeout_ms / 1e3;
  if ((rc = kexd_route_device(&ctx, &dev, err)) == 0)
    rc = optimize_and_lower(d, &ctx, br->use, dev, &bo, cache, g, s, item, names, &res, out, opts, opts_len, err);
  return rc;
}

/* ---- Tune ---- */

typedef struct tune_ev {
  kexd_stream_ev link; /* first: the stream frees the event */
  uint32_t i, n;
  bool finished;
  char kernel[KEX_PROGRAM_NAME_MAX];
  char phase[16];
  uint32_t round, round_candidates, compiled, timed;
  double best_us;
  /* finished */
  bool from_cache, hand_won;
  double search_s;
  kex_cache_entry entry;
} tune_ev;

typedef struct tune_call {
  kexd *d;
  kexd_call *call;
  kexd_stream st;            /* held while the pool work runs */
  uint64_t job;
  kexd_tenant_use *use;      /* the job's tenant's usage record (lives as long as kexd): search time charged */
  char log_id[9];
  uint32_t device;
  kex_graph *g;
  kex_beam_opts bo;          /* width and limits; the rest per kernel */
  uint32_t timeout_ms;
  atomic_bool cancel;
  kexd_route route;
  kex_work work;
  /* written by the pool thread, read after the work */
  uint32_t n;
  int rc;
  kex_error err;
  /* the current kernel's progress (pool thread) */
  uint32_t cur;
  char cur_name[KEX_PROGRAM_NAME_MAX];
  double last_progress;
} tune_call;

/* The stream is over (kexd_stream_ops.release). */
static void tune_release(void *owner) {
  tune_call *t = owner;
  kex_graph_free(t->g);
  kex_free(t);
}

static void on_tune_progress(const kex_beam_progress *p, void *arg) {
  tune_call *t = arg;
  double now = kexd_route_now();
  if (now - t->last_progress < TUNE_PROGRESS_INTERVAL_S) return;
  tune_ev *e = kex_calloc(1, sizeof *e);
  if (!e) return; /* progress is best effort */
  t->last_progress = now;
  e->i = t->cur;
  e->n = t->n;
  snprintf(e->kernel, sizeof e->kernel, "%s", t->cur_name);
  snprintf(e->phase, sizeof e->phase, "%s", p->phase);
  e->round = p->round;
  e->round_candidates = p->round_candidates;
  e->compiled = p->compiled;
  e->timed = p->timed;
  e->best_us = isfinite(p->best_us) ? p->best_us : 0;
  kexd_stream_push(&t->st, &e->link);
}

/* The hand-coded kernel's name (the TuneEvent's `kernel`). */
static void hand_name(const kex_schedule *s, uint32_t item, const kex_target *tg, char *out, size_t len) {
  kex_kernel *k = NULL;
  kex_error e = {0};
  out[0] = '\0';
  if (kex_kernel_from_item(s, &s->items[item], &tg->caps, &k, &e) == 0 &&
      kex_kernel_hand_coded_optimizations(k, &e) == 0)
    kex_kernel_name(k, out, len);
  kex_kernel_free(k);
}

/* Fill the finished event's entry: the row the cache holds now, else the search's result. */
static void finished_entry(kex_cache *cache, kex_device *dev, const kex_beam_opts *bo, const kex_beam_result *res,
                           tune_ev *e) {
  kex_cache_entry *ce = &e->entry;
  kex_cache_beam_key key;
  kex_unhex(res->ast_hex, ce->ast_key, KEX_AST_KEY_BYTES);
  snprintf(ce->ast_hex, sizeof ce->ast_hex, "%s", res->ast_hex);
  ce->device = *kex_device_get_identity(dev);
  kex_device_identity_render(&ce->device, ce->device_rendered, sizeof ce->device_rendered);
  kex_beam_cache_key(bo, ce->ast_key, &ce->device, ce->search_opts, sizeof ce->search_opts, &key); /* search/beam.h's */
  snprintf(ce->codegen_version, sizeof ce->codegen_version, "%s", key.codegen_version);
  if (!cache || kex_cache_beam_get(cache, &key, &ce->value, NULL) != 0) {
    memset(&ce->value, 0, sizeof ce->value);
    ce->value.nopts = res->nopts;
    memcpy(ce->value.opts, res->opts, sizeof(kex_opt) * res->nopts);
    ce->value.best_time_s = res->best_us * 1e-6;
    ce->value.hand_time_s = res->hand_us * 1e-6;
    ce->value.search_time_s = res->search_s;
    ce->value.candidates = res->timed;
    snprintf(ce->value.kernel_name, sizeof ce->value.kernel_name, "%s", res->name);
    ce->value.created_at = (int64_t)time(NULL);
  }
}

/* The pool: the engine's plan stage (replay, schedule: realize/plan.h), then every kernel optimized in turn. */
static void tune_work(kex_work *req) {
  tune_call *t = req->data;
  kexd *d = t->d;
  const kex_target *tg = device_target(d, t->device);
  kex_rplan plan;
  kex_schedule *s = NULL;
  kex_cache *cache = NULL;
  kex_device *dev = NULL;
  kex_name_counter names;
  int rc;
  kex_name_counter_init(&names);
  kex_plan_init(&plan, t->g, tg);
  if ((rc = kex_plan_schedule(&plan, NULL, &t->err)) < 0) goto out;
  s = plan.s;
  t->n = s->nkernels;
  if (d->cfg.cache_path && *d->cfg.cache_path && !(cache = kex_cache_conns_get(d->conns, &t->err))) {
    rc = t->err.code;
    goto out;
  }
  if ((rc = kexd_route_device(&t->route, &dev, &t->err)) < 0) goto out;
  for (uint32_t ii = 0; ii < s->nitems; ii++) {
    const kex_sched_item *it = &s->items[ii];
    kex_beam_opts bo = t->bo;
    kex_beam_result res;
    kex_program_src ps = {0};
    double t0 = kexd_route_now();
    if (it->kind != KEX_ITEM_KERNEL) continue;
    if (atomic_load(&t->cancel)) {
      rc = kex_err_set(&t->err, KEX_ECANCELLED, "cancelled");
      goto out;
    }
    t->cur++;
    hand_name(s, ii, tg, t->cur_name, sizeof t->cur_name);
    t->last_progress = -INFINITY;
    t->route.kernel_deadline = t->timeout_ms ? t0 + t->timeout_ms / 1e3 : INFINITY;
    t->route.timed_out = false;
    bo.progress = on_tune_progress;
    bo.progress_arg = t;
    rc = optimize_and_lower(d, &t->route, t->use, dev, &bo, cache, t->g, s, ii, &names, &res, &ps, NULL, 0, &t->err);
    kex_program_src_free(&ps);
    if (rc < 0) {
      char m[KEX_ERROR_MSG_MAX];
      snprintf(m, sizeof m, "%s", t->err.msg);
      kex_err_set(&t->err, rc, "kernel %u/%u (%s): %s", t->cur, t->n, t->cur_name, m);
      goto out;
    }
    tune_ev *e = kex_calloc(1, sizeof *e);
    if (!e) {
      rc = kex_err_set(&t->err, KEX_ENOMEM, "out of memory");
      goto out;
    }
    e->i = t->cur;
    e->n = t->n;
    e->finished = true;
    snprintf(e->kernel, sizeof e->kernel, "%s", t->cur_name);
    snprintf(e->phase, sizeof e->phase, "%s", res.from_cache ? "cache" : "done");
    e->round = res.rounds;
    e->compiled = res.compiled;
    e->timed = res.timed;
    e->best_us = res.best_us;
    e->from_cache = res.from_cache;
    e->hand_won = res.hand_won;
    e->search_s = kexd_route_now() - t0;
    finished_entry(cache, dev, &bo, &res, e);
    kexd_stream_push(&t->st, &e->link);
  }
out:
  t->rc = rc;
  kex_name_counter_free(&names);
  kex_plan_clear(&plan);
}

/* Write one queued event (kexd_stream_ops.event); a write that fails drops it (a cancelled call: the stream is dead). */
static void tune_write_event(void *owner, kexd_stream_ev *link) {
  tune_call *t = owner;
  tune_ev *e = (tune_ev *)link;
  Kex__V1__TuneEvent ev = KEX__V1__TUNE_EVENT__INIT;
  kexd_pb_entry *pe = NULL;
  ev.i = e->i;
  ev.n = e->n;
  ev.kernel = e->kernel;
  ev.finished = e->finished;
  ev.phase = e->phase;
  ev.round = e->round;
  ev.round_candidates = e->round_candidates;
  ev.compiled = e->compiled;
  ev.timed = e->timed;
  ev.best_us = e->best_us;
  if (e->finished && (pe = kex_malloc(sizeof *pe))) {
    kexd_cache_entry_to_pb(&e->entry, pe);
    ev.entry = &pe->m;
    ev.from_cache = e->from_cache;
    ev.hand_won = e->hand_won;
    ev.search_s = e->search_s;
  }
  kexd_stream_write(&t->st, &ev.base);
  kex_free(pe);
}

/* The work is back and every event written (kexd_stream_ops.drained): the status. */
static void tune_end(void *owner) {
  tune_call *t = owner;
  if (t->rc == 0) {
    kexd_stream_finish(&t->st, GRPC_STATUS_OK, NULL, NULL);
  } else if (t->rc == KEX_ECANCELLED && kexd_call_time_left(t->call) <= 0) {
    kexd_stream_failf(&t->st, GRPC_STATUS_DEADLINE_EXCEEDED, "Tune: the deadline passed");
  } else if (t->rc == KEX_ECANCELLED && !kexd_jobs_find_id(&t->d->jobs, t->job)) {
    kexd_stream_failf(&t->st, GRPC_STATUS_NOT_FOUND, "Tune: the job was closed during the search");
  } else {
    kex_log(KEX_LOG_INFO, t->log_id, 0, "Tune failed: %s", t->err.msg);
    kexd_stream_failf(&t->st, kex_err_grpc_status(t->rc), "Tune: %s", t->err.msg[0] ? t->err.msg : kex_strerror(t->rc));
  }
}

/* The client cancelled (or its deadline, or the drain), or a write broke: the search stops (kexd_stream_ops.cancelled). */
static void tune_cancelled(void *owner) {
  tune_call *t = owner;
  atomic_store(&t->cancel, true);
  kex_log(KEX_LOG_DEBUG, t->log_id, 0, "Tune: cancelled by the client (or its deadline, or the drain)");
}

static const kexd_stream_ops tune_ops = {"Tune", tune_write_event, tune_end, tune_cancelled, tune_release};

static void tune_after(kex_work *req, int status) {
  tune_call *t = req->data;
  if (status < 0 && !t->rc) t->rc = kex_err_set(&t->err, KEX_EINTERNAL, "the worker pool dropped the job");
  kexd_stream_unhold(&t->st);
}

void kexd_rpc_tune(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__TuneRequest *m = rq->msg;
  tune_call *t = NULL;
  kexd_job *job = rq->job;
  kex_error err = {0};
  int dev, rc;
  if (!m->graph) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Tune: missing graph");
    return;
  }
  if ((dev = kexd_rpc_device_index(d, m->graph->device)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices",
                    m->graph->device);
    return;
  }
  uint32_t width = rq->beam_width; /* the method table checked the search (may_tune, limits, the device's slot) */
  if (!(t = kex_calloc(1, sizeof *t))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Tune: out of memory");
    return;
  }
  beam_opts_from(&t->bo, (int)width, m->beam);
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                   &d->cfg.limits, job, &t->g, &err)) < 0) {
    kexd_call_failf(c, kex_err_grpc_status(rc), "%s", err.msg);
    kex_free(t);
    return;
  }
  t->d = d;
  t->call = c;
  t->job = job->id;
  t->bo.tenant = job->use->name; /* the usage record outlives the call */
  t->use = job->use;
  memcpy(t->log_id, job->log_id, sizeof t->log_id);
  t->device = (uint32_t)dev;
  t->timeout_ms = m->beam ? m->beam->timeout_ms : 0;
  atomic_init(&t->cancel, false);
  t->route = (kexd_route){d->disp, t->device, job->id, job->weight, &t->cancel, INFINITY, false};
  kexd_stream_start(&t->st, d->streams, c, &tune_ops, t);
  kex_log(KEX_LOG_DEBUG, t->log_id, 0, "Tune: beam %d on %s", t->bo.width, d->cfg.devices[dev]);
  t->work = (kex_work){.fn = tune_work, .after = tune_after, .data = t, .background = true}; /* others' work first */
  kexd_stream_hold(&t->st);
  if (kexd_work_submit(d, &t->work) < 0) {
    t->rc = kex_err_set(&t->err, KEX_EUNAVAILABLE, "the worker pool is not available");
    kexd_stream_unhold(&t->st);
  }
}

/* ---- setup ---- */

int kexd_tune_init(kexd *d) {
  if (!(d->tuner = kex_calloc(1, sizeof *d->tuner))) return KEX_ENOMEM;
  return 0;
}

void kexd_tune_free(kexd *d) {
  kex_free(d->tuner);
  d->tuner = NULL;
}

void kexd_tune_stats(const kexd *d, kexd_tune_counters *out) {
  const kexd_tuner *T = d->tuner;
  memset(out, 0, sizeof *out);
  if (!T) return;
  out->beam_hits = atomic_load(&T->beam_hits);
  out->beam_misses = atomic_load(&T->beam_misses);
  out->searches = atomic_load(&T->searches);
  out->searches_cancelled = atomic_load(&T->searches_cancelled);
  out->search_seconds = atomic_load(&T->search_us) / 1e6;
}

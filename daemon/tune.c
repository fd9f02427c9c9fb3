/*
 * tune.c - Tune (beam-search a graph's kernels), the beam-cache RPCs
 * (ListCache, GetCacheEntry, ExportCache, ImportCache, DeleteCache) and the
 * beam hook Submit calls to lower a kernel with searched opts.
 *
 * Searches (search/beam.h) block for seconds, so they never run on the
 * loop thread: a Tune is one uv_queue_work that replays, schedules and
 * optimizes every kernel in turn; Submit's hook runs inside Submit's own
 * pool work.  Every device job a search makes (alloc, copy, compile, load,
 * launch, free) is "routed": the search thread queues a request on this
 * module's locked list and wakes the loop (uv_async_send); the loop posts
 * it as a RUN item on the caller's job flow of the device's runner
 * (dispatch.c, fair queueing, charged to the job), and the item's done
 * callback wakes the search thread, which waited on the request's condition
 * variable.  So a search's device work never overlaps another job's kernel,
 * and at most one item of a search is queued at any time.  Route items are
 * must_run: a free always runs, even after the job was cancelled; a search
 * stops itself between candidates (kex_beam_opts.cancelled) when its call
 * is cancelled (client cancel, deadline, drain after the grace period), its
 * job is gone, or its per-kernel timeout passed.
 *
 * SQLite: a kex_cache handle is single-threaded.  Each search opens its own
 * (one per Tune call, one per Submit hook call); the cache RPCs share one
 * handle behind `cache_lock`, used on the worker pool only.
 *
 * GetCacheEntry's `source`: kexd cannot rebuild a kernel from ast_text
 * (there is no kex.ast.v1 parser), so it returns the source it rendered
 * itself: every kernel a Tune or a beam Submit lowered since kexd started
 * is remembered (AST key, device kind, opts text -> source; the last
 * KEXD_TUNE_SOURCES of them).  An entry that matches one of those gets its
 * source; any other (imported, made by another process, before a restart,
 * or with other opts) gets "".
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/log.h"
#include "daemon/rpc.h"
#include "devices/device.h"
#include "codegen/astkey.h"
#include "search/beam.h"
#include "search/cache.h"
#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "realize/run.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

#define TUNE_PROGRESS_INTERVAL_S 0.1      /* at most ~10 progress events per second per call */
#define TUNE_DEFAULT_WIDTH 2              /* Tune with beam_width 0 and no --beam */
#define CACHE_LIST_DEFAULT 100
#define CACHE_LIST_MAX 1000
#define CACHE_EXPORT_CHUNK (1u << 20)     /* bytes per ExportCacheChunk at most */
#define CACHE_IMPORT_ERRORS 16            /* messages in an ImportCacheReply */
#define PAGE_TOKEN_PREFIX "kexpg1."

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- module state ---- */

typedef struct route_req route_req;

typedef struct source_memo {
  char ast_hex[KEX_AST_KEY_HEX];
  char kind[KEX_DEVICE_FIELD_MAX];
  char *opts;   /* kex_malloc'd */
  char *source; /* kex_malloc'd */
} source_memo;

typedef struct tune_call tune_call;

typedef struct kexd_tuner {
  kexd *d;
  uv_async_t async;
  bool async_open;
  /* lock protects reqs and every tune_call's event queue (evs) and `queued` flag */
  pthread_mutex_t lock;
  route_req *reqs, *reqs_tail;
  /* cache_lock protects cache (the cache RPCs' shared handle, opened at first use; a failed open is tried again) */
  pthread_mutex_t cache_lock;
  kex_cache *cache;
  /* memo_lock protects memo (GetCacheEntry's sources) */
  pthread_mutex_t memo_lock;
  source_memo memo[KEXD_TUNE_SOURCES];
  uint32_t memo_next;
  /* loop thread only */
  tune_call *calls;                  /* active Tune calls */
  /* any thread */
  atomic_uint_fast64_t beam_hits, beam_misses, searches, searches_cancelled;
} kexd_tuner;

/* ---- routing device jobs to the runner ---- */

/* Who a search's device work is charged to, and when it should stop. */
typedef struct route_ctx {
  kexd *d;
  uint32_t device;
  uint64_t job;
  uint32_t weight;
  atomic_bool *cancel;       /* set by the loop (call cancelled, job gone) */
  double kernel_deadline;    /* now_s() past which the kernel's search stops (INFINITY: none) */
  bool timed_out;            /* the per-kernel timeout stopped it */
} route_ctx;

struct route_req {
  route_ctx *ctx;
  kex_beam_device_job job;
  void *arg;
  kexd_work work;
  pthread_cond_t cv;
  bool done;
  route_req *next;
};

/* On the runner: the search's job with the runner's open device. */
static int route_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  route_req *q = arg;
  *device_s = -1; /* the wall time of the call */
  return q->job(dev, q->arg, err);
}

/* On the loop: the item is back; wake the search thread (q lives on its stack). */
static void route_done(kexd_work *w) {
  route_req *q = w->ud;
  kexd_tuner *T = q->ctx->d->tuner;
  pthread_mutex_lock(&T->lock);
  q->done = true;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&T->lock);
}

static void tune_pump_all(kexd_tuner *T);

/* On the loop: post the queued requests on their job's flow; then write the calls' queued events. */
static void on_async(uv_async_t *h) {
  kexd_tuner *T = h->data;
  kexd *d = T->d;
  route_req *q;
  pthread_mutex_lock(&T->lock);
  q = T->reqs;
  T->reqs = T->reqs_tail = NULL;
  pthread_mutex_unlock(&T->lock);
  while (q) {
    route_req *next = q->next; /* q may be gone once its done ran */
    route_ctx *ctx = q->ctx;
    kexd_work *w = &q->work;
    int rc;
    memset(w, 0, sizeof *w);
    w->kind = KEXD_WORK_RUN;
    w->job = ctx->job;
    w->weight = ctx->weight;
    if (ctx->job && !kexd_jobs_find_id(&d->jobs, ctx->job)) { /* the job is gone: finish on the daemon's flow */
      atomic_store(ctx->cancel, true);
      w->job = 0;
      w->weight = 1;
    }
    w->must_run = true; /* frees must run; a search stops itself between candidates */
    w->fn = route_run;
    w->arg = q;
    w->done = route_done;
    w->ud = q;
    if ((rc = kexd_dispatch_post(d->disp, ctx->device, w)) < 0) {
      w->rc = kex_err_set(&w->err, KEX_EUNAVAILABLE, "the device runner is not available: %s", kex_strerror(rc));
      atomic_store(ctx->cancel, true);
      route_done(w);
    }
    q = next;
  }
  tune_pump_all(T);
}

/* kex_beam_exec_fn: run job on the device's runner, charged to the context's job; blocks. */
static int route_exec(void *vctx, kex_device *dev, kex_beam_device_job job, void *arg, kex_error *err) {
  route_ctx *ctx = vctx;
  kexd_tuner *T = ctx->d->tuner;
  route_req q;
  (void)dev;
  memset(&q, 0, sizeof q);
  q.ctx = ctx;
  q.job = job;
  q.arg = arg;
  pthread_cond_init(&q.cv, NULL);
  pthread_mutex_lock(&T->lock);
  if (T->reqs_tail) T->reqs_tail->next = &q;
  else T->reqs = &q;
  T->reqs_tail = &q;
  pthread_mutex_unlock(&T->lock);
  uv_async_send(&T->async);
  pthread_mutex_lock(&T->lock);
  while (!q.done) pthread_cond_wait(&q.cv, &T->lock);
  pthread_mutex_unlock(&T->lock);
  pthread_cond_destroy(&q.cv);
  if (q.work.rc < 0 && err) *err = q.work.err;
  return q.work.rc;
}

/* The search should stop: the call is cancelled, the job is gone, or the kernel's timeout passed. */
static bool route_cancelled(void *vctx) {
  route_ctx *ctx = vctx;
  if (atomic_load(ctx->cancel)) return true;
  if (isfinite(ctx->kernel_deadline) && now_s() > ctx->kernel_deadline) {
    ctx->timed_out = true;
    return true;
  }
  return false;
}

static int job_identify(kex_device *dev, void *arg, kex_error *err) {
  (void)err;
  *(kex_device **)arg = dev;
  return 0;
}

/* The runner's open device (its identity keys the cache; only device jobs touch it, on the runner). */
static int route_device(route_ctx *ctx, kex_device **out, kex_error *err) {
  *out = NULL;
  return route_exec(ctx, NULL, job_identify, out, err);
}

/* ---- lowering with searched opts (Tune and Submit share it) ---- */

static const kex_target *device_target(const kexd *d, uint32_t device) { return &d->targets[device]; }

/* Remember the source rendered for (AST key, kind, opts) for GetCacheEntry. */
static void memo_put(kexd_tuner *T, const char *ast_hex, const char *kind, const char *opts, const char *src) {
  char *o = kex_strdup(opts), *s = kex_strdup(src);
  if (!o || !s) {
    kex_free(o), kex_free(s);
    return;
  }
  pthread_mutex_lock(&T->memo_lock);
  source_memo *m = NULL;
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES && !m; i++)
    if (T->memo[i].source && !strcmp(T->memo[i].ast_hex, ast_hex) && !strcmp(T->memo[i].kind, kind) &&
        !strcmp(T->memo[i].opts, opts))
      m = &T->memo[i];
  if (!m) m = &T->memo[T->memo_next++ % KEXD_TUNE_SOURCES];
  kex_free(m->opts), kex_free(m->source);
  snprintf(m->ast_hex, sizeof m->ast_hex, "%s", ast_hex);
  snprintf(m->kind, sizeof m->kind, "%s", kind);
  m->opts = o;
  m->source = s;
  pthread_mutex_unlock(&T->memo_lock);
}

/* A copy of the remembered source, or NULL. */
static char *memo_get(kexd_tuner *T, const char *ast_hex, const char *kind, const char *opts) {
  char *r = NULL;
  pthread_mutex_lock(&T->memo_lock);
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES && !r; i++)
    if (T->memo[i].source && !strcasecmp(T->memo[i].ast_hex, ast_hex) && !strcmp(T->memo[i].kind, kind) &&
        !strcmp(T->memo[i].opts, opts))
      r = kex_strdup(T->memo[i].source);
  pthread_mutex_unlock(&T->memo_lock);
  return r;
}

/* Beam options from the request (width already chosen).  0, or KEX_EINVAL naming the field. */
static int beam_opts_from(kex_beam_opts *bo, int width, const Kex__V1__BeamOptions *b, kex_error *err) {
  kex_beam_opts_init(bo, width);
  if (width < 1 || width > KEX_BEAM_MAX_WIDTH)
    return kex_err_set(err, KEX_EINVAL, "beam.beam_width %d is not in 1..%d", width, KEX_BEAM_MAX_WIDTH);
  if (b && b->max_upcast) {
    if (b->max_upcast > KEXD_BEAM_MAX_LIMIT)
      return kex_err_set(err, KEX_EINVAL, "beam.max_upcast %u is more than %d", b->max_upcast, KEXD_BEAM_MAX_LIMIT);
    bo->upcast_max = (int)b->max_upcast;
  }
  if (b && b->max_local) {
    if (b->max_local > KEXD_BEAM_MAX_LIMIT)
      return kex_err_set(err, KEX_EINVAL, "beam.max_local %u is more than %d", b->max_local, KEXD_BEAM_MAX_LIMIT);
    bo->local_max = (int)b->max_local;
  }
  return 0;
}

/*
 * Optimize schedule item `item` (a kernel) of s on ctx's device with
 * bo (exec, cancel and cache filled in here), then render it with the
 * chosen opts into *out (names from `names`, may be NULL) and remember the
 * source.  *res is the search's result.  0 or a negative code with *err.
 */
static int optimize_and_lower(kexd *d, route_ctx *ctx, kex_device *dev, kex_beam_opts *bo, kex_cache *cache,
                              const kex_graph *g, const kex_schedule *s, uint32_t item, kex_name_counter *names,
                              kex_beam_result *res, kex_program_src *out, char *ostr, size_t olen, kex_error *err) {
  kexd_tuner *T = d->tuner;
  const kex_target *tg = device_target(d, ctx->device);
  kex_beam_target t = {g, s, item, tg};
  char ot[KEX_CACHE_OPTS_TEXT_MAX];
  int rc;
  bo->exec = route_exec;
  bo->exec_ctx = ctx;
  bo->cancelled = route_cancelled;
  bo->cancel_arg = ctx;
  bo->cache = cache;
  rc = kex_beam_optimize(&t, dev, bo, res, err);
  if (rc == 0) {
    if (res->from_cache) atomic_fetch_add(&T->beam_hits, 1);
    else atomic_fetch_add(&T->beam_misses, 1), atomic_fetch_add(&T->searches, 1);
  } else if (rc == KEX_ECANCELLED) {
    atomic_fetch_add(&T->beam_misses, 1);
    atomic_fetch_add(&T->searches, 1);
    atomic_fetch_add(&T->searches_cancelled, 1);
    if (ctx->timed_out) rc = kex_err_set(err, KEX_EDEADLINE, "the search passed its per-kernel timeout");
  }
  if (rc) return rc;
  rc = kex_target_lower_item(tg, s, &s->items[item], res->opts, res->nopts, names, out, ostr, olen, err);
  if (rc == 0 && kex_cache_opts_format(res->opts, res->nopts, ot, sizeof ot) == 0)
    memo_put(T, res->ast_hex, kex_device_get_identity(dev)->kind, ot, out->src);
  return rc;
}

/* ---- Submit's hook ---- */

int kexd_tune_lower_item(const kexd_beam_req *br, const kex_graph *g, const kex_schedule *s, uint32_t item,
                         kex_name_counter *names, kex_program_src *out, char *opts, size_t opts_len, kex_error *err) {
  kexd *d = br->d;
  route_ctx ctx = {d, br->device, br->job, br->weight, br->cancelled, INFINITY, false};
  kex_beam_opts bo;
  kex_beam_result res;
  kex_cache *cache = NULL;
  kex_device *dev = NULL;
  kex_error ce = {0};
  int rc;
  kex_beam_opts_init(&bo, br->width);
  if (br->upcast_max) bo.upcast_max = br->upcast_max;
  if (br->local_max) bo.local_max = br->local_max;
  if (br->timeout_ms) ctx.kernel_deadline = now_s() + br->timeout_ms / 1e3;
  if (d->cfg.cache_path && *d->cfg.cache_path && kex_cache_open(d->cfg.cache_path, &cache, &ce) < 0) {
    KEX_WARN("beam cache %s unavailable, searching without it: %s", d->cfg.cache_path, ce.msg);
    cache = NULL;
  }
  if ((rc = route_device(&ctx, &dev, err)) == 0)
    rc = optimize_and_lower(d, &ctx, dev, &bo, cache, g, s, item, names, &res, out, opts, opts_len, err);
  kex_cache_close(cache);
  return rc;
}

/* ---- Tune ---- */

typedef struct tune_ev {
  struct tune_ev *next;
  uint32_t i;
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

struct tune_call {
  kexd *d;
  kexd_call *call;
  tune_call *prev, *next;    /* T->calls (loop) */
  uint64_t job;
  char log_id[9];
  uint32_t device;
  kex_graph *g;
  kex_beam_opts bo;          /* width and limits; the rest per kernel */
  uint32_t timeout_ms;
  atomic_bool cancel;
  route_ctx ctx;
  uv_work_t work;
  bool in_pool, writing, dead, finished;
  /* written by the pool thread, read after the work (or under T->lock: n) */
  uint32_t n;
  int rc;
  kex_error err;
  /* the current kernel's progress (pool thread) */
  uint32_t cur;
  char cur_name[KEX_PROGRAM_NAME_MAX];
  double last_progress;
  /* T->lock: events the pool queued, not yet written */
  tune_ev *evs, *evs_tail;
};

static void tune_free(tune_call *t) {
  kexd_tuner *T = t->d->tuner;
  tune_ev *e = t->evs;
  while (e) {
    tune_ev *n = e->next;
    kex_free(e);
    e = n;
  }
  if (t->prev) t->prev->next = t->next;
  else if (T->calls == t) T->calls = t->next;
  if (t->next) t->next->prev = t->prev;
  kexd_call_set_hooks(t->call, NULL, NULL, NULL);
  kexd_call_unref(t->call);
  kex_graph_free(t->g);
  kex_free(t);
}

/* Queue an event (pool thread) and wake the loop. */
static void tune_push(tune_call *t, tune_ev *e) {
  kexd_tuner *T = t->d->tuner;
  pthread_mutex_lock(&T->lock);
  if (t->evs_tail) t->evs_tail->next = e;
  else t->evs = e;
  t->evs_tail = e;
  pthread_mutex_unlock(&T->lock);
  uv_async_send(&T->async);
}

static void on_tune_progress(const kex_beam_progress *p, void *arg) {
  tune_call *t = arg;
  double now = now_s();
  if (now - t->last_progress < TUNE_PROGRESS_INTERVAL_S) return;
  tune_ev *e = kex_calloc(1, sizeof *e);
  if (!e) return; /* progress is best effort */
  t->last_progress = now;
  e->i = t->cur;
  snprintf(e->kernel, sizeof e->kernel, "%s", t->cur_name);
  snprintf(e->phase, sizeof e->phase, "%s", p->phase);
  e->round = p->round;
  e->round_candidates = p->round_candidates;
  e->compiled = p->compiled;
  e->timed = p->timed;
  e->best_us = isfinite(p->best_us) ? p->best_us : 0;
  tune_push(t, e);
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
  char sopts[KEX_CACHE_SEARCH_OPTS_MAX] = "";
  kex_beam_search_opts_string(bo, sopts, sizeof sopts);
  kex_unhex(res->ast_hex, ce->ast_key, KEX_AST_KEY_BYTES);
  snprintf(ce->ast_hex, sizeof ce->ast_hex, "%s", res->ast_hex);
  ce->device = *kex_device_get_identity(dev);
  kex_device_identity_render(&ce->device, ce->device_rendered, sizeof ce->device_rendered);
  snprintf(ce->search_opts, sizeof ce->search_opts, "%s", sopts);
  snprintf(ce->codegen_version, sizeof ce->codegen_version, "%s", KEX_CODEGEN_VERSION);
  memcpy(key.ast_key, ce->ast_key, sizeof key.ast_key);
  key.device = &ce->device;
  key.search_opts = ce->search_opts;
  key.codegen_version = ce->codegen_version;
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

/* The pool: replay, schedule, then every kernel optimized in turn. */
static void tune_work(uv_work_t *req) {
  tune_call *t = req->data;
  kexd *d = t->d;
  kexd_tuner *T = d->tuner;
  const kex_target *tg = device_target(d, t->device);
  kex_arena arena;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_cache *cache = NULL;
  kex_device *dev = NULL;
  kex_name_counter names;
  kex_error ce = {0};
  int rc;
  kex_arena_init(&arena, 0);
  kex_name_counter_init(&names);
  kex_replay_opts ro = kex_target_replay_opts(tg);
  if ((rc = kex_replay_graph(t->g, &ro, &arena, &r, &t->err)) < 0 || (rc = kex_schedule_create(r, &s, &t->err)) < 0)
    goto out;
  pthread_mutex_lock(&T->lock);
  t->n = s->nkernels;
  pthread_mutex_unlock(&T->lock);
  if (d->cfg.cache_path && *d->cfg.cache_path && (rc = kex_cache_open(d->cfg.cache_path, &cache, &ce)) < 0) {
    rc = kex_err_set(&t->err, rc, "the beam cache %s cannot be opened: %s", d->cfg.cache_path, ce.msg);
    goto out;
  }
  if ((rc = route_device(&t->ctx, &dev, &t->err)) < 0) goto out;
  for (uint32_t ii = 0; ii < s->nitems; ii++) {
    const kex_sched_item *it = &s->items[ii];
    kex_beam_opts bo = t->bo;
    kex_beam_result res;
    kex_program_src ps = {0};
    double t0 = now_s();
    if (it->kind != KEX_ITEM_KERNEL) continue;
    if (atomic_load(&t->cancel)) {
      rc = kex_err_set(&t->err, KEX_ECANCELLED, "cancelled");
      goto out;
    }
    t->cur++;
    hand_name(s, ii, tg, t->cur_name, sizeof t->cur_name);
    t->last_progress = -INFINITY;
    t->ctx.kernel_deadline = t->timeout_ms ? t0 + t->timeout_ms / 1e3 : INFINITY;
    t->ctx.timed_out = false;
    bo.progress = on_tune_progress;
    bo.progress_arg = t;
    rc = optimize_and_lower(d, &t->ctx, dev, &bo, cache, t->g, s, ii, &names, &res, &ps, NULL, 0, &t->err);
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
    e->finished = true;
    snprintf(e->kernel, sizeof e->kernel, "%s", t->cur_name);
    snprintf(e->phase, sizeof e->phase, "%s", res.from_cache ? "cache" : "done");
    e->round = res.rounds;
    e->compiled = res.compiled;
    e->timed = res.timed;
    e->best_us = res.best_us;
    e->from_cache = res.from_cache;
    e->hand_won = res.hand_won;
    e->search_s = now_s() - t0;
    finished_entry(cache, dev, &bo, &res, e);
    tune_push(t, e);
  }
out:
  t->rc = rc;
  kex_cache_close(cache);
  kex_name_counter_free(&names);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_arena_destroy(&arena);
}

static void tune_pump(tune_call *t);

static void tune_written(kexd_call *c, int ok, void *ud) {
  tune_call *t = ud;
  (void)c;
  t->writing = false;
  if (!ok) {
    t->dead = true;
    atomic_store(&t->cancel, true);
  }
  tune_pump(t);
}

/* A cache entry as protobuf; strings point into `e` and the two arrays (valid while they are). */
typedef struct pb_entry {
  Kex__V1__CacheEntry m;
  Kex__V1__DeviceIdentity id;
  char opt_s[KEX_CACHE_MAX_OPTS][48];
  char *opt_p[KEX_CACHE_MAX_OPTS];
} pb_entry;

static void entry_to_pb(kex_cache_entry *e, pb_entry *p) {
  kex__v1__cache_entry__init(&p->m);
  kex__v1__device_identity__init(&p->id);
  p->m.key = e->ast_hex;
  p->m.device = e->device_rendered;
  p->m.kernel_name = e->value.kernel_name;
  for (uint32_t i = 0; i < e->value.nopts && i < KEX_CACHE_MAX_OPTS; i++) {
    kex_opt_short(e->value.opts[i], p->opt_s[i], sizeof p->opt_s[i]);
    p->opt_p[i] = p->opt_s[i];
  }
  p->m.n_opts = e->value.nopts;
  p->m.opts = p->opt_p;
  p->m.best_us = e->value.best_time_s * 1e6;
  p->m.baseline_us = e->value.hand_time_s * 1e6;
  p->m.search_ms = e->value.search_time_s * 1e3;
  p->m.created_unix = e->value.created_at;
  p->m.search_opts = e->search_opts;
  p->m.codegen = e->codegen_version;
  p->m.candidates = e->value.candidates > 0 ? (uint64_t)e->value.candidates : 0;
  p->id.kind = e->device.kind;
  p->id.vendor = e->device.vendor;
  p->id.name = e->device.name;
  p->id.driver_version = e->device.driver_version;
  p->id.compiler_version = e->device.compiler_version;
  p->m.identity = &p->id;
}

/* Write the next queued event; once the work is back and the queue is empty, end the call. */
static void tune_pump(tune_call *t) {
  kexd_tuner *T = t->d->tuner;
  while (!t->writing && !t->dead && !t->finished) {
    tune_ev *e;
    uint32_t n;
    pthread_mutex_lock(&T->lock);
    if ((e = t->evs) && !(t->evs = e->next)) t->evs_tail = NULL;
    n = t->n;
    pthread_mutex_unlock(&T->lock);
    if (e) {
      Kex__V1__TuneEvent ev = KEX__V1__TUNE_EVENT__INIT;
      pb_entry *pe = NULL;
      ev.i = e->i;
      ev.n = n;
      ev.kernel = e->kernel;
      ev.finished = e->finished;
      ev.phase = e->phase;
      ev.round = e->round;
      ev.round_candidates = e->round_candidates;
      ev.compiled = e->compiled;
      ev.timed = e->timed;
      ev.best_us = e->best_us;
      if (e->finished && (pe = kex_malloc(sizeof *pe))) {
        entry_to_pb(&e->entry, pe);
        ev.entry = &pe->m;
        ev.from_cache = e->from_cache;
        ev.hand_won = e->hand_won;
        ev.search_s = e->search_s;
      }
      int rc = kexd_call_write(t->call, &ev.base, tune_written, t);
      kex_free(pe);
      kex_free(e);
      if (rc == 0) t->writing = true;
      else if (kexd_call_cancelled(t->call)) t->dead = true;
      continue;
    }
    if (t->in_pool) break;
    t->finished = true;
    if (t->rc == 0) {
      kexd_call_finish(t->call, GRPC_STATUS_OK, NULL, NULL);
    } else if (t->rc == KEX_ECANCELLED && kexd_call_time_left(t->call) <= 0) {
      kexd_call_failf(t->call, GRPC_STATUS_DEADLINE_EXCEEDED, "Tune: the deadline passed");
    } else if (t->rc == KEX_ECANCELLED && !kexd_jobs_find_id(&t->d->jobs, t->job)) {
      kexd_call_failf(t->call, GRPC_STATUS_NOT_FOUND, "Tune: the job was closed during the search");
    } else {
      kex_log(KEX_LOG_INFO, t->log_id, 0, "Tune failed: %s", t->err.msg);
      kexd_call_failf(t->call, kex_err_grpc_status(t->rc), "Tune: %s", t->err.msg[0] ? t->err.msg : kex_strerror(t->rc));
    }
  }
  if ((t->finished || t->dead) && !t->writing && !t->in_pool) tune_free(t);
}

static void tune_pump_all(kexd_tuner *T) {
  tune_call *t = T->calls;
  while (t) {
    tune_call *next = t->next; /* t may be freed */
    tune_pump(t);
    t = next;
  }
}

static void tune_after(uv_work_t *req, int status) {
  tune_call *t = req->data;
  t->in_pool = false;
  if (status < 0 && !t->rc) t->rc = kex_err_set(&t->err, KEX_EINTERNAL, "the worker pool dropped the job");
  tune_pump(t);
}

static void tune_cancelled(kexd_call *c, void *ud) {
  tune_call *t = ud;
  (void)c;
  t->dead = true;
  atomic_store(&t->cancel, true);
  kex_log(KEX_LOG_DEBUG, t->log_id, 0, "Tune: cancelled by the client (or its deadline, or the drain)");
  if (!t->writing && !t->in_pool) tune_free(t);
}

/* Beam width: the request's, else --beam, else TUNE_DEFAULT_WIDTH (Tune) or 0 (Submit). */
static int pick_width(const kexd *d, const Kex__V1__BeamOptions *b, int fallback) {
  if (b && b->beam_width) return b->beam_width > INT32_MAX ? INT32_MAX : (int)b->beam_width;
  return d->cfg.beam ? (int)d->cfg.beam : fallback;
}

static void rpc_tune(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  kexd_tuner *T = d->tuner;
  Kex__V1__TuneRequest *m = (Kex__V1__TuneRequest *)kexd_rpc_decode(d, c, &kex__v1__tune_request__descriptor, req, len);
  tune_call *t = NULL;
  kexd_job *job;
  kex_error err = {0};
  int dev, rc;
  if (!m) return;
  if (!(job = kexd_rpc_need_job(d, c, m->job))) goto out;
  if (!m->graph) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Tune: missing graph");
    goto out;
  }
  if ((dev = kexd_rpc_device_index(d, m->graph->device)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices",
                    m->graph->device);
    goto out;
  }
  if (kexd_rpc_tune_begin(d, c, job, (uint32_t)dev, pick_width(d, m->beam, TUNE_DEFAULT_WIDTH)) < 0) goto out; /* request.c */
  if (!(t = kex_calloc(1, sizeof *t))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Tune: out of memory");
    goto out;
  }
  if ((rc = beam_opts_from(&t->bo, pick_width(d, m->beam, TUNE_DEFAULT_WIDTH), m->beam, &err)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Tune: %s", err.msg);
    kex_free(t);
    goto out;
  }
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                   &d->cfg.limits, job, &t->g, &err)) < 0) {
    kexd_call_failf(c, kex_err_grpc_status(rc), "%s", err.msg);
    kex_free(t);
    goto out;
  }
  t->d = d;
  t->call = c;
  t->job = job->id;
  memcpy(t->log_id, job->log_id, sizeof t->log_id);
  t->device = (uint32_t)dev;
  t->timeout_ms = m->beam ? m->beam->timeout_ms : 0;
  atomic_init(&t->cancel, false);
  t->ctx = (route_ctx){d, t->device, job->id, job->weight, &t->cancel, INFINITY, false};
  kexd_call_ref(c); /* the tune's own reference, dropped in tune_free */
  kexd_call_set_hooks(c, tune_cancelled, NULL, t);
  t->next = T->calls;
  if (T->calls) T->calls->prev = t;
  T->calls = t;
  kex_log(KEX_LOG_DEBUG, t->log_id, 0, "Tune: beam %d on %s", t->bo.width, d->cfg.devices[dev]);
  t->work.data = t;
  t->in_pool = true;
  if (uv_queue_work(d->loop, &t->work, tune_work, tune_after) < 0) {
    t->in_pool = false;
    t->rc = kex_err_set(&t->err, KEX_EUNAVAILABLE, "the worker pool is not available");
    tune_pump(t);
  }
out:
  kexd_rpc_free_msg(&m->base);
}

/* ---- the cache RPCs (SQLite on the pool, the shared handle under cache_lock) ---- */

typedef enum cache_op { OP_LIST, OP_GET, OP_EXPORT, OP_IMPORT, OP_DELETE } cache_op;

typedef struct cache_req {
  kexd *d;
  kexd_call *call;
  cache_op op;
  ProtobufCMessage *msg;     /* the decoded request (filters point into it) */
  kex_cache_filter filter;
  bool has_filter;
  uv_work_t work;
  bool in_pool, dead, reading, writing;
  int rc;
  kex_error err;
  /* list */
  uint64_t offset;
  uint32_t limit, count;
  kex_cache_entry *entries;  /* [limit + 1] */
  /* get */
  kex_cache_entry entry;
  char *source;
  /* export: the file, then chunks; import: the bytes received */
  char *buf;
  size_t buflen, bufcap, sent;
  uint64_t nentries;
  /* import */
  uint64_t job;
  kex_cache_import_report rep;
  /* delete */
  uint64_t deleted;
} cache_req;

static void creq_free(cache_req *q) {
  if (q->op == OP_IMPORT) q->d->imports_active--;
  kexd_call_set_hooks(q->call, NULL, NULL, NULL);
  kexd_call_unref(q->call);
  kexd_rpc_free_msg(q->msg);
  kex_free(q->entries);
  kex_free(q->entry.ast_text);
  kex_free(q->source);
  if (q->op == OP_EXPORT) free(q->buf); /* open_memstream's */
  else kex_free(q->buf);
  kex_free(q);
}

static void creq_cancelled(kexd_call *c, void *ud) {
  cache_req *q = ud;
  (void)c;
  q->dead = true;
  if (!q->in_pool && !q->reading && !q->writing) creq_free(q);
}

/* The shared handle (caller holds cache_lock); NULL with *err. */
static kex_cache *shared_cache(kexd *d, kex_error *err) {
  kexd_tuner *T = d->tuner;
  if (!T->cache && d->cfg.cache_path && *d->cfg.cache_path) {
    kex_error ce = {0};
    int rc = kex_cache_open(d->cfg.cache_path, &T->cache, &ce);
    if (rc < 0) {
      kex_err_set(err, rc, "the beam cache %s cannot be opened: %s", d->cfg.cache_path, ce.msg);
      T->cache = NULL;
    }
  }
  if (!T->cache && !err->code) kex_err_set(err, KEX_EUNAVAILABLE, "kexd has no cache file");
  return T->cache;
}

static int list_cb(const kex_cache_entry *e, void *arg) {
  cache_req *q = arg;
  q->entries[q->count] = *e;
  q->entries[q->count].ast_text = NULL;
  q->count++;
  return 0;
}

static void creq_work(uv_work_t *w) {
  cache_req *q = w->data;
  kexd *d = q->d;
  kexd_tuner *T = d->tuner;
  kex_cache *c;
  int rc = 0;
  pthread_mutex_lock(&T->cache_lock);
  if (!(c = shared_cache(d, &q->err))) {
    rc = q->err.code ? q->err.code : KEX_EUNAVAILABLE;
    goto out;
  }
  switch (q->op) {
  case OP_LIST: {
    uint32_t got = 0;
    q->count = 0;
    rc = kex_cache_list(c, q->has_filter ? &q->filter : NULL, q->offset, q->limit + 1, list_cb, q, &got, &q->err);
    break;
  }
  case OP_GET: {
    Kex__V1__GetCacheEntryRequest *m = (Kex__V1__GetCacheEntryRequest *)q->msg;
    rc = kex_cache_get_entry(c, m->key, m->device, &q->entry, &q->err);
    if (rc == 0) {
      char ot[KEX_CACHE_OPTS_TEXT_MAX];
      if (kex_cache_opts_format(q->entry.value.opts, q->entry.value.nopts, ot, sizeof ot) == 0)
        q->source = memo_get(T, q->entry.ast_hex, q->entry.device.kind, ot);
    }
    break;
  }
  case OP_EXPORT: {
    FILE *f = open_memstream(&q->buf, &q->buflen);
    if (!f) {
      rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot open a memory stream");
      break;
    }
    rc = kex_cache_export(c, f, q->has_filter ? &q->filter : NULL, &q->nentries, &q->err);
    if (fclose(f) != 0 && !rc) rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot finish the export in memory");
    break;
  }
  case OP_IMPORT: {
    FILE *f = q->buflen ? fmemopen(q->buf, q->buflen, "r") : fmemopen((void *)"", 1, "r");
    if (!f) {
      rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot open a memory stream");
      break;
    }
    rc = kex_cache_import(c, f, &q->rep, &q->err);
    fclose(f);
    break;
  }
  case OP_DELETE: rc = kex_cache_delete(c, q->has_filter ? &q->filter : NULL, &q->deleted, &q->err); break;
  }
out:
  pthread_mutex_unlock(&T->cache_lock);
  q->rc = rc;
}

static void export_next(cache_req *q);

static void export_written(kexd_call *c, int ok, void *ud) {
  cache_req *q = ud;
  (void)c;
  q->writing = false;
  if (q->dead) return creq_free(q);
  if (!ok) {
    kexd_call_failf(q->call, GRPC_STATUS_CANCELLED, "ExportCache: the stream broke");
    return creq_free(q);
  }
  export_next(q);
}

/* Write the next chunk of the export (the last one carries the entry count), then OK. */
static void export_next(cache_req *q) {
  size_t max = CACHE_EXPORT_CHUNK;
  int mm = q->d->cfg.max_message;
  if (mm > 8192 && (size_t)mm - 4096 < max) max = (size_t)mm - 4096;
  if (q->sent >= q->buflen && q->sent > 0) {
    kexd_call_finish(q->call, GRPC_STATUS_OK, NULL, NULL);
    return creq_free(q);
  }
  Kex__V1__ExportCacheChunk ch = KEX__V1__EXPORT_CACHE_CHUNK__INIT;
  size_t n = q->buflen - q->sent < max ? q->buflen - q->sent : max;
  ch.data.data = (uint8_t *)q->buf + q->sent;
  ch.data.len = n;
  if (q->sent + n >= q->buflen) ch.entries = q->nentries;
  q->sent += n ? n : 1; /* an empty export is one empty chunk */
  if (q->sent > q->buflen && q->buflen) q->sent = q->buflen;
  int rc = kexd_call_write(q->call, &ch.base, export_written, q);
  if (rc < 0) {
    kexd_call_failf(q->call, GRPC_STATUS_INTERNAL, "ExportCache: cannot send a chunk: %s", kex_strerror(rc));
    return creq_free(q);
  }
  q->writing = true;
}

/* The page token for offset under filter f: opaque to clients, checked on the way back. */
static uint32_t filter_tag(const Kex__V1__CacheFilter *f) {
  uint32_t h = 2166136261u;
  const char *parts[3] = {f ? f->device : "", f ? f->kernel_name : "", f ? f->key_prefix : ""};
  for (int i = 0; i < 3; i++) {
    for (const char *p = parts[i] ? parts[i] : ""; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ 0xff) * 16777619u;
  }
  int64_t age = f ? f->max_age_s : 0;
  for (int i = 0; i < 8; i++) h = (h ^ (uint8_t)(age >> (8 * i))) * 16777619u;
  return h;
}

static void creq_after(uv_work_t *w, int status) {
  cache_req *q = w->data;
  kexd *d = q->d;
  const char *method = strrchr(kexd_call_method(q->call), '/');
  method = method ? method + 1 : "cache";
  q->in_pool = false;
  if (status < 0 && !q->rc) q->rc = kex_err_set(&q->err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (q->dead) return creq_free(q);
  switch (q->op) {
  case OP_LIST: {
    if (q->rc < 0) break;
    Kex__V1__ListCacheReply r = KEX__V1__LIST_CACHE_REPLY__INIT;
    const Kex__V1__ListCacheRequest *m = (const Kex__V1__ListCacheRequest *)q->msg;
    uint32_t n = q->count > q->limit ? q->limit : q->count;
    pb_entry *pe = kex_calloc(n ? n : 1, sizeof *pe);
    Kex__V1__CacheEntry **pp = kex_calloc(n ? n : 1, sizeof *pp);
    char token[64] = "";
    if (!pe || !pp) {
      kex_free(pe), kex_free(pp);
      q->rc = kex_err_set(&q->err, KEX_ENOMEM, "out of memory");
      break;
    }
    for (uint32_t i = 0; i < n; i++) {
      entry_to_pb(&q->entries[i], &pe[i]);
      pp[i] = &pe[i].m;
    }
    if (q->count > q->limit)
      snprintf(token, sizeof token, PAGE_TOKEN_PREFIX "%" PRIu64 ".%08x", q->offset + q->limit, filter_tag(m->filter));
    r.n_entries = n;
    r.entries = pp;
    r.next_page_token = token;
    kexd_call_finish(q->call, GRPC_STATUS_OK, NULL, &r.base);
    kex_free(pe), kex_free(pp);
    return creq_free(q);
  }
  case OP_GET: {
    if (q->rc == KEX_ENOTFOUND) {
      const Kex__V1__GetCacheEntryRequest *m = (const Kex__V1__GetCacheEntryRequest *)q->msg;
      kexd_call_failf(q->call, GRPC_STATUS_NOT_FOUND, "GetCacheEntry: no entry for key %.64s%s%.200s", m->key,
                      *m->device ? " on device " : "", m->device);
      return creq_free(q);
    }
    if (q->rc < 0) break;
    pb_entry *pe = kex_malloc(sizeof *pe);
    if (!pe) {
      q->rc = kex_err_set(&q->err, KEX_ENOMEM, "out of memory");
      break;
    }
    entry_to_pb(&q->entry, pe);
    pe->m.ast_text = q->entry.ast_text ? q->entry.ast_text : "";
    pe->m.source = q->source ? q->source : "";
    kexd_call_finish(q->call, GRPC_STATUS_OK, NULL, &pe->m.base);
    kex_free(pe);
    return creq_free(q);
  }
  case OP_EXPORT:
    if (q->rc < 0) break;
    q->sent = 0;
    export_next(q);
    return;
  case OP_IMPORT: {
    if (q->rc < 0 && q->rc != KEX_EPARSE && q->rc != KEX_ELIMIT) break;
    if (q->rc < 0 && q->rep.imported == 0) { /* the header is wrong, or nothing was valid */
      kexd_call_failf(q->call, GRPC_STATUS_INVALID_ARGUMENT, "ImportCache: %s", q->err.msg[0] ? q->err.msg : kex_strerror(q->rc));
      return creq_free(q);
    }
    Kex__V1__ImportCacheReply r = KEX__V1__IMPORT_CACHE_REPLY__INIT;
    char *errs[CACHE_IMPORT_ERRORS];
    uint32_t ne = q->rep.nerrors < CACHE_IMPORT_ERRORS ? q->rep.nerrors : CACHE_IMPORT_ERRORS;
    if (ne > KEX_CACHE_IMPORT_ERRORS) ne = KEX_CACHE_IMPORT_ERRORS;
    for (uint32_t i = 0; i < ne; i++) errs[i] = q->rep.errors[i];
    r.imported = (uint32_t)q->rep.imported;
    r.rejected = (uint32_t)q->rep.rejected;
    r.n_errors = ne;
    r.errors = errs;
    kex_log(KEX_LOG_INFO, NULL, 0, "ImportCache: %" PRIu64 " imported, %" PRIu64 " rejected", q->rep.imported,
            q->rep.rejected);
    kexd_call_finish(q->call, GRPC_STATUS_OK, NULL, &r.base);
    return creq_free(q);
  }
  case OP_DELETE: {
    if (q->rc < 0) break;
    Kex__V1__DeleteCacheReply r = KEX__V1__DELETE_CACHE_REPLY__INIT;
    r.deleted = q->deleted > UINT32_MAX ? UINT32_MAX : (uint32_t)q->deleted;
    kexd_call_finish(q->call, GRPC_STATUS_OK, NULL, &r.base);
    return creq_free(q);
  }
  }
  (void)d;
  kexd_call_failf(q->call, kex_err_grpc_status(q->rc), "%s: %s", method, q->err.msg[0] ? q->err.msg : kex_strerror(q->rc));
  creq_free(q);
}

/* Queue q's SQLite work; on failure the call is ended and q freed. */
static void creq_start(cache_req *q) {
  q->work.data = q;
  q->in_pool = true;
  if (uv_queue_work(q->d->loop, &q->work, creq_work, creq_after) < 0) {
    q->in_pool = false;
    kexd_call_failf(q->call, GRPC_STATUS_UNAVAILABLE, "the worker pool is not available");
    creq_free(q);
  }
}

/* A request for call c (the call referenced, cancel hook set); NULL with the call ended. */
static cache_req *creq_new(kexd *d, kexd_call *c, cache_op op, ProtobufCMessage *m) {
  cache_req *q = kex_calloc(1, sizeof *q);
  if (!q) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    kexd_rpc_free_msg(m);
    return NULL;
  }
  q->d = d;
  q->call = c;
  q->op = op;
  q->msg = m;
  kexd_call_ref(c);
  kexd_call_set_hooks(c, creq_cancelled, NULL, q);
  return q;
}

/* The filter's fields (pointing into the request); INVALID_ARGUMENT for a bad one.  0 or -1 (call ended). */
static int take_filter(cache_req *q, const Kex__V1__CacheFilter *f) {
  if (!f) return 0;
  if (f->max_age_s < 0) {
    kexd_call_failf(q->call, GRPC_STATUS_INVALID_ARGUMENT, "filter.max_age_s is %" PRId64 ", negative", f->max_age_s);
    creq_free(q);
    return -1;
  }
  for (const char *p = f->key_prefix; p && *p; p++)
    if (!strchr("0123456789abcdefABCDEF", *p) || p - f->key_prefix >= 64) {
      kexd_call_failf(q->call, GRPC_STATUS_INVALID_ARGUMENT, "filter.key_prefix \"%.80s\" is not at most 64 hex digits",
                      f->key_prefix);
      creq_free(q);
      return -1;
    }
  q->has_filter = true;
  q->filter.device = f->device;
  q->filter.kernel_name = f->kernel_name;
  q->filter.key_prefix = f->key_prefix;
  q->filter.max_age_s = f->max_age_s;
  return 0;
}

static void rpc_list_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__ListCacheRequest *m =
      (Kex__V1__ListCacheRequest *)kexd_rpc_decode(d, c, &kex__v1__list_cache_request__descriptor, req, len);
  cache_req *q;
  if (!m) return;
  if (!kexd_rpc_need_job(d, c, m->job)) return kexd_rpc_free_msg(&m->base);
  if (m->limit > CACHE_LIST_MAX) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "ListCache: limit %u is more than %d (0 means %d)", m->limit,
                    CACHE_LIST_MAX, CACHE_LIST_DEFAULT);
    return kexd_rpc_free_msg(&m->base);
  }
  if (!(q = creq_new(d, c, OP_LIST, &m->base))) return;
  if (take_filter(q, m->filter) < 0) return;
  q->limit = m->limit ? m->limit : CACHE_LIST_DEFAULT;
  if (*m->page_token) {
    const char *p = m->page_token;
    char *end = NULL;
    unsigned long long off = 0;
    unsigned long tag = 0;
    bool ok = strncmp(p, PAGE_TOKEN_PREFIX, strlen(PAGE_TOKEN_PREFIX)) == 0;
    if (ok) {
      p += strlen(PAGE_TOKEN_PREFIX);
      off = strtoull(p, &end, 10);
      ok = end != p && *end == '.';
    }
    if (ok) {
      p = end + 1;
      tag = strtoul(p, &end, 16);
      ok = end != p && !*end && tag == filter_tag(m->filter) && off <= INT64_MAX;
    }
    if (!ok) {
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT,
                      "ListCache: page_token is not one ListCache returned for this filter");
      return creq_free(q);
    }
    q->offset = off;
  }
  if (!(q->entries = kex_calloc(q->limit + 1, sizeof *q->entries))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ListCache: out of memory");
    return creq_free(q);
  }
  creq_start(q);
}

static void rpc_get_cache_entry(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__GetCacheEntryRequest *m =
      (Kex__V1__GetCacheEntryRequest *)kexd_rpc_decode(d, c, &kex__v1__get_cache_entry_request__descriptor, req, len);
  cache_req *q;
  uint8_t key[KEX_AST_KEY_BYTES];
  if (!m) return;
  if (!kexd_rpc_need_job(d, c, m->job)) return kexd_rpc_free_msg(&m->base);
  if (strlen(m->key) != 2 * KEX_AST_KEY_BYTES || kex_unhex(m->key, key, sizeof key) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "GetCacheEntry: key \"%.80s\" is not 64 hex digits", m->key);
    return kexd_rpc_free_msg(&m->base);
  }
  if ((q = creq_new(d, c, OP_GET, &m->base))) creq_start(q);
}

static void rpc_export_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__ExportCacheRequest *m =
      (Kex__V1__ExportCacheRequest *)kexd_rpc_decode(d, c, &kex__v1__export_cache_request__descriptor, req, len);
  cache_req *q;
  if (!m) return;
  if (!kexd_rpc_need_job(d, c, m->job)) return kexd_rpc_free_msg(&m->base);
  if (!(q = creq_new(d, c, OP_EXPORT, &m->base))) return;
  if (take_filter(q, m->filter) < 0) return;
  creq_start(q);
}

static void rpc_delete_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__DeleteCacheRequest *m =
      (Kex__V1__DeleteCacheRequest *)kexd_rpc_decode(d, c, &kex__v1__delete_cache_request__descriptor, req, len);
  cache_req *q;
  if (!m) return;
  if (!kexd_rpc_need_job(d, c, m->job)) return kexd_rpc_free_msg(&m->base);
  if (!(q = creq_new(d, c, OP_DELETE, &m->base))) return;
  if (take_filter(q, m->filter) < 0) return;
  creq_start(q);
}

static void import_on_message(kexd_call *c, const uint8_t *msg, size_t len, int ok, void *ud) {
  cache_req *q = ud;
  kexd *d = q->d;
  Kex__V1__ImportCacheRequest *m = NULL;
  int rc;
  q->reading = false;
  if (q->dead) return creq_free(q);
  if (!ok) {
    kexd_call_failf(c, GRPC_STATUS_CANCELLED, "ImportCache: the stream broke");
    return creq_free(q);
  }
  if (!msg) { /* the end: import what came */
    if (!q->job) {
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "ImportCache: the stream ended without a message naming the job");
      return creq_free(q);
    }
    if (!kexd_jobs_find_id(&d->jobs, q->job)) {
      kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "ImportCache: the job was closed during the import");
      return creq_free(q);
    }
    return creq_start(q);
  }
  /* kexd_rpc_decode ends the call on failure, which releases only the handler's reference */
  if (!(m = (Kex__V1__ImportCacheRequest *)kexd_rpc_decode(d, c, &kex__v1__import_cache_request__descriptor, msg, len)))
    return creq_free(q);
  if (!q->job) {
    kexd_job *job = kexd_rpc_need_job(d, c, m->job);
    if (!job) {
      kexd_rpc_free_msg(&m->base);
      return creq_free(q);
    }
    q->job = job->id;
  } else if (*m->job) {
    kexd_job *job = kexd_jobs_find(&d->jobs, m->job);
    if (!job || job->id != q->job) {
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "ImportCache: the stream names two different jobs");
      kexd_rpc_free_msg(&m->base);
      return creq_free(q);
    }
  }
  if (m->data.len > d->cfg.import_max_bytes || q->buflen > d->cfg.import_max_bytes - m->data.len) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "ImportCache: the stream is over the limit of %" PRIu64 " bytes (--import-max-bytes); %zu so far",
                    d->cfg.import_max_bytes, q->buflen + m->data.len);
    kexd_rpc_free_msg(&m->base);
    return creq_free(q);
  }
  if (q->buflen + m->data.len > q->bufcap) {
    size_t cap = q->bufcap ? q->bufcap * 2 : 65536;
    while (cap < q->buflen + m->data.len) cap *= 2;
    char *nb = kex_realloc(q->buf, cap);
    if (!nb) {
      kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "ImportCache: out of memory for %zu bytes", cap);
      kexd_rpc_free_msg(&m->base);
      return creq_free(q);
    }
    q->buf = nb;
    q->bufcap = cap;
  }
  if (m->data.len) memcpy(q->buf + q->buflen, m->data.data, m->data.len);
  q->buflen += m->data.len;
  kexd_rpc_free_msg(&m->base);
  if ((rc = kexd_call_read(c, import_on_message, q)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INTERNAL, "ImportCache: cannot read the stream: %s", kex_strerror(rc));
    return creq_free(q);
  }
  q->reading = true;
}

static void rpc_import_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  cache_req *q;
  int rc;
  (void)req;
  (void)len;
  if (d->imports_active >= d->cfg.import_streams) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "ImportCache: %u import streams are open, the limit (--import-streams); try again later",
                    d->imports_active);
    return;
  }
  if (!(q = creq_new(d, c, OP_IMPORT, NULL))) return;
  d->imports_active++; /* creq_free gives it back */
  if ((rc = kexd_call_read(c, import_on_message, q)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INTERNAL, "ImportCache: cannot read the stream: %s", kex_strerror(rc));
    return creq_free(q);
  }
  q->reading = true;
}

/* ---- setup ---- */

int kexd_tune_init(kexd *d) {
  kexd_tuner *T = kex_calloc(1, sizeof *T);
  if (!T) return KEX_ENOMEM;
  T->d = d;
  pthread_mutex_init(&T->lock, NULL);
  pthread_mutex_init(&T->cache_lock, NULL);
  pthread_mutex_init(&T->memo_lock, NULL);
  if (uv_async_init(d->loop, &T->async, on_async) < 0) {
    pthread_mutex_destroy(&T->lock), pthread_mutex_destroy(&T->cache_lock), pthread_mutex_destroy(&T->memo_lock);
    kex_free(T);
    return KEX_EINTERNAL;
  }
  T->async.data = T;
  T->async_open = true;
  d->tuner = T;
  return 0;
}

void kexd_tune_close(kexd *d) {
  kexd_tuner *T = d->tuner;
  if (T && T->async_open) {
    T->async_open = false;
    uv_close((uv_handle_t *)&T->async, NULL);
  }
}

void kexd_tune_free(kexd *d) {
  kexd_tuner *T = d->tuner;
  if (!T) return;
  kex_cache_close(T->cache);
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES; i++) kex_free(T->memo[i].opts), kex_free(T->memo[i].source);
  pthread_mutex_destroy(&T->lock);
  pthread_mutex_destroy(&T->cache_lock);
  pthread_mutex_destroy(&T->memo_lock);
  kex_free(T);
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
}

void kexd_rpc_tune(kexd_call *c, const uint8_t *req, size_t len, void *ud) { rpc_tune(c, req, len, ud); }
void kexd_rpc_list_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) { rpc_list_cache(c, req, len, ud); }
void kexd_rpc_get_cache_entry(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  rpc_get_cache_entry(c, req, len, ud);
}
void kexd_rpc_export_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) { rpc_export_cache(c, req, len, ud); }
void kexd_rpc_import_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) { rpc_import_cache(c, req, len, ud); }
void kexd_rpc_delete_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) { rpc_delete_cache(c, req, len, ud); }

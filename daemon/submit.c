/*
 * submit.c - Submit: schedule, compile and run a graph for a job, streaming
 * its progress (DESIGN.md, "The path of one submission").
 *
 * One submission moves through these stages; every one ends back on the
 * loop thread, which owns the submission, the job, the caches and the
 * stream:
 *
 *   1. loop: decode, check the job and the handles, hash the graph's
 *      structure (nodes, ops, shapes, dtypes, args, constants, outputs;
 *      never the input bytes) and look the hash up in the structure cache.
 *   2. on a miss, a plan is built: replay + schedule on the loop for small
 *      graphs (--plan-inline-nodes), then on the worker pool (uv_queue_work)
 *      the rest of the replay/schedule for large ones, the per-buffer and
 *      per-item tables, and every kernel rendered with hand-coded opts
 *      (kex_run_lower_item) and hashed (SHA-256 of the source).  The plan is
 *      immutable from then on and shared (refcounted on the loop) by every
 *      later submission of the same structure.
 *   3. loop: programs the device has loaded already (the loop's index of
 *      the runner's table) are memory hits; the others go to the pool,
 *      which reads the SQLite cache (--cache; kex_cache_program_get with the
 *      device identity) or compiles on a compile-only instance of the device
 *      and stores the binary (kex_cache_program_put).
 *   4. the job's flow on the device runner (dispatch.c, so fair queueing
 *      applies): one SETUP item (load new programs into the runner's table,
 *      allocate the buffers, copy the inputs in), one item per kernel, COPY
 *      or VIEW, and one FINISH item (must_run: it always runs, so it is the
 *      one that frees what the submission allocated when anything failed or
 *      was cancelled; on success it turns the outputs into buffers and reads
 *      the inline bytes).
 *   5. loop: outputs become job buffers (kexd_job_add_buffer), the memory
 *      reservation is returned, and the done event ends the stream.
 *
 * Threads.  The worker pool gets the plan (immutable) and writes only its
 * own result fields of the submission; the runner's closures touch only the
 * device, the plan (read-only) and the submission's device-side fields
 * (bufs, progs, out_bufs, out_data, kernel_us, setup_ok, failed, ran: all
 * of one submission's items run on one runner, in order, so those fields
 * have one thread at a time).  `cancelled` is the one word both sides see:
 * the loop sets it at a client cancel, the closures read it and skip their
 * work.  Compile devices and the SQLite handle are shared by the pool's
 * threads, each behind a lock.  A device's loaded programs (the memory
 * cache) belong to its runner thread; the loop keeps an index of their
 * source hashes.
 *
 * Memory: a submission reserves (kexd_job_reserve) every byte it will
 * allocate before anything runs -- RESOURCE_EXHAUSTED over the job's limit
 * -- and returns the reservation at the end, when its outputs are held.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
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
#include "search/astkey.h"
#include "search/beam.h"
#include "search/cache.h"
#include "search/lower.h"
#include "search/run.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

#define SUB_HASH 32 /* bytes of a SHA-256 */
/*
 * A plan whose kernels all ran faster than this last time posts its items
 * with defer_done (dispatch.h): the runner wakes the loop once for the
 * chain instead of once per item.  Progress events of such a submission
 * arrive together, at most this late.
 */
#define SUB_DEFER_KERNEL_US 1000.0

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- a map from 32-byte hashes to pointers (open addressing) ---- */

typedef struct hashmap {
  uint32_t n, cap;        /* cap: 0 or a power of two */
  uint8_t (*keys)[SUB_HASH];
  void **vals;
  bool *used;
} hashmap;

static uint32_t hm_slot(const hashmap *m, const uint8_t *key) {
  uint64_t h;
  memcpy(&h, key, sizeof h);
  uint32_t i = (uint32_t)h & (m->cap - 1);
  while (m->used[i] && memcmp(m->keys[i], key, SUB_HASH) != 0) i = (i + 1) & (m->cap - 1);
  return i;
}

/* The value stored under key, or NULL. */
static void *hm_get(const hashmap *m, const uint8_t *key, bool *found) {
  *found = false;
  if (!m->cap) return NULL;
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) return NULL;
  *found = true;
  return m->vals[i];
}

/* Store (or replace) key -> val.  0 or KEX_ENOMEM. */
static int hm_put(hashmap *m, const uint8_t *key, void *val) {
  if (2 * (m->n + 1) > m->cap) {
    hashmap g = {0, m->cap ? 2 * m->cap : 64, NULL, NULL, NULL};
    g.keys = kex_calloc(g.cap, sizeof *g.keys);
    g.vals = kex_calloc(g.cap, sizeof *g.vals);
    g.used = kex_calloc(g.cap, sizeof *g.used);
    if (!g.keys || !g.vals || !g.used) {
      kex_free(g.keys), kex_free(g.vals), kex_free(g.used);
      return KEX_ENOMEM;
    }
    for (uint32_t i = 0; i < m->cap; i++)
      if (m->used[i]) {
        uint32_t j = hm_slot(&g, m->keys[i]);
        g.used[j] = true;
        memcpy(g.keys[j], m->keys[i], SUB_HASH);
        g.vals[j] = m->vals[i];
        g.n++;
      }
    kex_free(m->keys), kex_free(m->vals), kex_free(m->used);
    *m = g;
  }
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) {
    m->used[i] = true;
    memcpy(m->keys[i], key, SUB_HASH);
    m->n++;
  }
  m->vals[i] = val;
  return 0;
}

static void hm_free(hashmap *m, void (*free_val)(void *)) {
  for (uint32_t i = 0; free_val && i < m->cap; i++)
    if (m->used[i]) free_val(m->vals[i]);
  kex_free(m->keys), kex_free(m->vals), kex_free(m->used);
  memset(m, 0, sizeof *m);
}

/* ---- plans: what a graph structure schedules to (immutable once built) ---- */

typedef struct plan_prog {
  char name[KEX_PROGRAM_NAME_MAX];
  char *src;                 /* kex_malloc'd */
  uint8_t hash[SUB_HASH];    /* SHA-256 of src: the memory cache's key */
  size_t global[3], local[3];
  bool has_local;
  char opts[160];
} plan_prog;

typedef enum step_kind { STEP_KERNEL, STEP_COPY } step_kind;

typedef struct plan_step {
  step_kind kind;
  uint32_t kernel;           /* KERNEL: index among the kernels (and progs) */
  uint32_t nargs;
  uint32_t *args;            /* KERNEL: buffer ids, in the program's argument order */
  uint32_t dst, src;         /* COPY: buffer ids */
  size_t off, size;          /* COPY: bytes from src at off */
} plan_step;

typedef struct plan_input {
  uint32_t node, buf;
  size_t bytes;
} plan_input;

typedef enum out_kind {
  OUT_DIRECT, /* the buffer itself becomes the output */
  OUT_GATHER, /* a new buffer of the output's view of a base buffer */
  OUT_CONST,  /* folded to a constant: a new buffer filled with it */
  OUT_ALIAS,  /* the job's input buffer itself (e.g. an ASSIGN target): the same handle */
} out_kind;

typedef struct plan_output {
  out_kind kind;
  uint32_t buf;              /* DIRECT/GATHER/ALIAS: the base buffer id */
  const kex_st *st;          /* GATHER */
  size_t base_bytes;         /* GATHER: bytes of the base buffer */
  kex_const value;           /* CONST */
  kex_dtype dtype;
  uint8_t ndim;
  int64_t shape[KEX_MAX_DIMS];
  size_t nbytes;
} plan_output;

typedef struct plan {
  uint32_t refs;             /* loop thread */
  uint8_t key[SUB_HASH];
  uint64_t last_used;        /* structure cache LRU */
  uint32_t device;
  bool cpu;
  kex_graph *g;              /* the graph it was built from (the replay points into it) */
  kex_arena arena;
  kex_replay *r;
  kex_schedule *s;
  uint32_t nbufs;
  size_t *buf_bytes;
  kex_dtype *buf_dtype;
  bool *buf_alloc;           /* allocated by a submission (used by an item or held, not a handle) */
  int32_t *buf_handle;       /* graph node whose job buffer provides it, or -1 */
  uint32_t nkernels;         /* == nprogs: one program per kernel */
  plan_prog *progs;
  uint32_t nsteps;
  plan_step *steps;
  uint32_t ninputs;
  plan_input *inputs;
  uint32_t noutputs;
  plan_output *outputs;
  uint64_t alloc_bytes;      /* what one submission allocates: reserved against the job's limit */
  uint64_t dtypes;           /* bit d: some node has dtype d (checked against the device before compiling) */
  double build_us;
  /* loop thread, updated by each successful run: the slowest kernel's time of the last run (-1: never ran) */
  double last_max_kernel_us;
} plan;

static void plan_unref(plan *p) {
  if (!p || --p->refs) return;
  for (uint32_t i = 0; p->progs && i < p->nkernels; i++) kex_free(p->progs[i].src);
  for (uint32_t i = 0; p->steps && i < p->nsteps; i++) kex_free(p->steps[i].args);
  kex_free(p->progs), kex_free(p->steps), kex_free(p->inputs), kex_free(p->outputs);
  kex_free(p->buf_bytes), kex_free(p->buf_dtype), kex_free(p->buf_alloc), kex_free(p->buf_handle);
  kex_schedule_free(p->s);
  kex_replay_free(p->r);
  kex_graph_free(p->g);
  kex_arena_destroy(&p->arena);
  kex_free(p);
}

static size_t info_bytes(const kex_buffer_info *bi) { return (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype); }

/* Replay and schedule p->g (safe on any thread: touches only p). */
static int plan_schedule(plan *p, kex_error *err) {
  kex_replay_opts ro = kex_run_replay_opts(p->cpu);
  int rc = kex_replay_graph(p->g, &ro, &p->arena, &p->r, err);
  if (!rc) rc = kex_schedule_create(p->r, &p->s, err);
  return rc;
}

/*
 * The tables and the rendered kernels of a scheduled plan (worker pool):
 * hand-coded opts, or with `beam` (not NULL) each kernel's cached beam opts
 * else a search now (tune.c).  0, or a negative code with *err naming the
 * kernel or item.
 */
static int plan_build(plan *p, const kexd_beam_req *beam, kex_error *err) {
  const kex_replay *r = p->r;
  const kex_schedule *s = p->s;
  const kex_graph *g = p->g;
  kex_name_counter names;
  int rc = 0;
  uint32_t *phys = NULL;
  bool *claimed = NULL;
  kex_name_counter_init(&names);
  p->nbufs = r->nbuffers;
  uint32_t nb = p->nbufs ? p->nbufs : 1;
  p->buf_bytes = kex_calloc(nb, sizeof *p->buf_bytes);
  p->buf_dtype = kex_calloc(nb, sizeof *p->buf_dtype);
  p->buf_alloc = kex_calloc(nb, sizeof *p->buf_alloc);
  p->buf_handle = kex_malloc(nb * sizeof *p->buf_handle);
  phys = kex_malloc(nb * sizeof *phys);
  claimed = kex_calloc(nb, sizeof *claimed);
  p->progs = kex_calloc(s->nkernels ? s->nkernels : 1, sizeof *p->progs);
  p->steps = kex_calloc(s->nitems ? s->nitems : 1, sizeof *p->steps);
  p->inputs = kex_calloc(g->nnodes ? g->nnodes : 1, sizeof *p->inputs);
  p->outputs = kex_calloc(g->noutputs ? g->noutputs : 1, sizeof *p->outputs);
  if (!p->buf_bytes || !p->buf_dtype || !p->buf_alloc || !p->buf_handle || !phys || !claimed || !p->progs ||
      !p->steps || !p->inputs || !p->outputs)
    goto nomem;
  for (uint32_t ni = 0; ni < g->nnodes; ni++) p->dtypes |= 1ull << (g->nodes[ni].dtype & 63);
  /* buffer id -> the id the memory planner gave it (run.c's mapping) */
  for (uint32_t i = 0; i < r->nbuffers; i++) phys[i] = i, p->buf_handle[i] = -1;
  for (uint32_t i = 0; i < s->nitems; i++)
    for (uint32_t j = 0; j < s->items[i].nbufs; j++) phys[s->items[i].bufs[j]] = s->items[i].planned[j];
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    const kex_lb *lb = r->node_lb[ni];
    if (n->op != KEX_GOP_BUFFER || lb->base->op != KEX_OP_EMPTY) continue;
    uint32_t b = phys[lb->base->buffer];
    if (n->bufsrc == KEX_BUF_HANDLE) p->buf_handle[b] = (int32_t)ni;
  }
  for (uint32_t i = 0; i < r->nbuffers; i++) {
    uint32_t b = phys[i];
    bool used = r->buffers[i].held;
    for (uint32_t k = 0; k < s->nitems && !used; k++)
      for (uint32_t j = 0; j < s->items[k].nbufs && !used; j++) used = phys[s->items[k].bufs[j]] == b;
    if (!used || p->buf_alloc[b] || p->buf_handle[b] >= 0) continue;
    p->buf_alloc[b] = true;
    p->buf_bytes[b] = info_bytes(&r->buffers[b]);
    p->buf_dtype[b] = r->buffers[b].dtype;
    p->alloc_bytes += p->buf_bytes[b];
  }
  for (uint32_t i = 0; i < r->nbuffers; i++)
    if (p->buf_handle[i] >= 0) {
      p->buf_bytes[i] = info_bytes(&r->buffers[i]);
      p->buf_dtype[i] = r->buffers[i].dtype;
    }
  /* inputs with contents to copy in (inline data, fills) */
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    const kex_lb *lb = r->node_lb[ni];
    if (n->op != KEX_GOP_BUFFER || n->bufsrc == KEX_BUF_HANDLE || lb->base->op != KEX_OP_EMPTY) continue;
    uint32_t b = phys[lb->base->buffer];
    if (!p->buf_alloc[b]) continue;
    p->inputs[p->ninputs++] = (plan_input){ni, b, info_bytes(&r->buffers[lb->base->buffer])};
  }
  /* items */
  for (uint32_t ii = 0; ii < s->nitems; ii++) {
    const kex_sched_item *it = &s->items[ii];
    plan_step *st = &p->steps[p->nsteps];
    if (it->kind == KEX_ITEM_EMPTY) continue;
    if (it->kind == KEX_ITEM_COPY || it->kind == KEX_ITEM_VIEW) {
      const kex_buffer_info *di = &r->buffers[it->bufs[0]];
      if (it->nbufs < 2) continue;
      st->kind = STEP_COPY;
      st->dst = phys[it->bufs[0]];
      st->src = phys[it->bufs[1]];
      st->off = it->kind == KEX_ITEM_VIEW && di->view_of >= 0 ? (size_t)di->offset : 0;
      st->size = info_bytes(di);
      p->nsteps++;
      continue;
    }
    if (it->kind != KEX_ITEM_KERNEL) {
      rc = kex_err_set(err, KEX_EUNSUPPORTED, "schedule item %u: LoadOps.CUSTOM cannot run", ii);
      goto out;
    }
    plan_prog *pp = &p->progs[p->nkernels];
    kex_program_src ps = {0};
    rc = beam ? kexd_tune_lower_item(beam, p->g, s, ii, &names, &ps, pp->opts, sizeof pp->opts, err)
              : kex_run_lower_item(s, it, p->cpu, &names, &ps, pp->opts, sizeof pp->opts, err);
    if (rc < 0) {
      char m[KEX_ERROR_MSG_MAX];
      snprintf(m, sizeof m, "%s", err->msg);
      kex_err_set(err, rc, "kernel %u: %s", p->nkernels, m);
      goto out;
    }
    if (ps.nargs > KEX_DEVICE_MAX_BUFS) {
      rc = kex_err_set(err, KEX_ELIMIT, "kernel %u (%s): %u arguments, more than %d", p->nkernels, ps.name, ps.nargs,
                       KEX_DEVICE_MAX_BUFS);
      kex_program_src_free(&ps);
      goto out;
    }
    snprintf(pp->name, sizeof pp->name, "%s", ps.name);
    memcpy(pp->global, ps.global, sizeof pp->global);
    memcpy(pp->local, ps.local, sizeof pp->local);
    pp->has_local = ps.has_local;
    pp->src = ps.src;
    ps.src = NULL;
    p->nkernels++; /* from here plan_unref frees the source */
    kex_sha256_bytes(pp->src, strlen(pp->src), pp->hash);
    st->kind = STEP_KERNEL;
    st->kernel = p->nkernels - 1;
    st->nargs = ps.nargs;
    if (!(st->args = kex_malloc((ps.nargs ? ps.nargs : 1) * sizeof *st->args))) {
      kex_program_src_free(&ps);
      goto nomem;
    }
    for (uint32_t a = 0; a < ps.nargs; a++) st->args[a] = phys[it->bufs[ps.args[a].idx]];
    kex_program_src_free(&ps);
    p->nsteps++;
  }
  /* outputs */
  for (uint32_t j = 0; j < g->noutputs; j++) {
    const kex_lb *lb = r->node_lb[g->outputs[j]], *base = lb->base;
    plan_output *o = &p->outputs[p->noutputs++];
    o->dtype = lb->dtype;
    o->ndim = (uint8_t)kex_lb_ndim(lb);
    memcpy(o->shape, kex_lb_shape(lb), sizeof(int64_t) * o->ndim);
    o->nbytes = (size_t)kex_lb_size(lb) * (size_t)kex_dtype_size(lb->dtype);
    if (base->op == KEX_OP_CONST && !base->realized) {
      o->kind = OUT_CONST;
      o->value = kex_const_as(base->arg, lb->dtype);
      p->alloc_bytes += o->nbytes;
      continue;
    }
    o->buf = phys[base->buffer];
    o->base_bytes = info_bytes(&r->buffers[base->buffer]);
    bool identity = lb == base && o->base_bytes == o->nbytes;
    if (identity && p->buf_handle[o->buf] >= 0) o->kind = OUT_ALIAS;
    else if (identity && p->buf_alloc[o->buf] && !claimed[o->buf]) o->kind = OUT_DIRECT, claimed[o->buf] = true;
    else {
      o->kind = OUT_GATHER;
      o->st = lb->st;
      p->alloc_bytes += o->nbytes;
    }
  }
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory building the plan");
out:
  kex_free(phys);
  kex_free(claimed);
  kex_name_counter_free(&names);
  return rc;
}

/* ---- the daemon-wide Submit state ---- */

/* A compile-only instance of one configured device, shared by the pool's threads. */
typedef struct compiler {
  /* lock protects every field below: the device is opened and used by one pool thread at a time */
  pthread_mutex_t lock;
  kex_device *dev;
  bool tried;
  int open_rc;
  char open_msg[KEX_ERROR_MSG_MAX];
} compiler;

typedef struct kexd_submitter {
  uint32_t ndevices;
  compiler *compilers;       /* [ndevices] */
  /* cache_lock protects cache and cache_tried: the SQLite handle is used by one pool thread at a time */
  pthread_mutex_t cache_lock;
  kex_cache *cache;
  bool cache_tried;
  const char *cache_path;
  int fault_kind;
  unsigned long fault_n;
  /* loop thread only */
  hashmap *loaded;           /* [ndevices]: source hashes the runner has loaded (values unused) */
  plan **plans;              /* the structure cache, cfg.schedule_cache entries at most */
  uint32_t nplans;
  uint64_t clock;
  /* runner threads only: [ndevices] source hash -> kex_program*, each touched by its device's runner */
  hashmap *programs;
} kexd_submitter;

int kexd_submit_init(kexd *d) {
  kexd_submitter *S = kex_calloc(1, sizeof *S);
  if (!S) return KEX_ENOMEM;
  S->ndevices = d->cfg.ndevices;
  S->compilers = kex_calloc(S->ndevices, sizeof *S->compilers);
  S->loaded = kex_calloc(S->ndevices, sizeof *S->loaded);
  S->programs = kex_calloc(S->ndevices, sizeof *S->programs);
  S->plans = kex_calloc(d->cfg.schedule_cache ? d->cfg.schedule_cache : 1, sizeof *S->plans);
  if (!S->compilers || !S->loaded || !S->programs || !S->plans) {
    kex_free(S->compilers), kex_free(S->loaded), kex_free(S->programs), kex_free(S->plans), kex_free(S);
    return KEX_ENOMEM;
  }
  for (uint32_t i = 0; i < S->ndevices; i++) pthread_mutex_init(&S->compilers[i].lock, NULL);
  pthread_mutex_init(&S->cache_lock, NULL);
  S->cache_path = d->cfg.cache_path;
  S->fault_kind = d->cfg.test_fault_kind;
  S->fault_n = d->cfg.test_fault_n;
  d->submitter = S;
  return 0;
}

static void free_program(void *p) { kex_program_free(p); }

void kexd_submit_free(kexd *d) {
  kexd_submitter *S = d->submitter;
  if (!S) return;
  for (uint32_t i = 0; i < S->ndevices; i++) {
    hm_free(&S->programs[i], free_program); /* the runners have exited: this thread is the only one left */
    hm_free(&S->loaded[i], NULL);
    kex_device_unref(S->compilers[i].dev);
    pthread_mutex_destroy(&S->compilers[i].lock);
  }
  for (uint32_t i = 0; i < S->nplans; i++) plan_unref(S->plans[i]);
  kex_cache_close(S->cache);
  pthread_mutex_destroy(&S->cache_lock);
  kex_free(S->compilers), kex_free(S->loaded), kex_free(S->programs), kex_free(S->plans);
  kex_free(S);
  d->submitter = NULL;
}

static plan *plan_cache_find(kexd_submitter *S, const uint8_t *key) {
  for (uint32_t i = 0; i < S->nplans; i++)
    if (memcmp(S->plans[i]->key, key, SUB_HASH) == 0) {
      S->plans[i]->last_used = ++S->clock;
      return S->plans[i];
    }
  return NULL;
}

/* Keep p (one more reference) in the structure cache, evicting the least recently used entry when full. */
static void plan_cache_add(kexd *d, plan *p) {
  kexd_submitter *S = d->submitter;
  uint32_t cap = d->cfg.schedule_cache;
  if (!cap || plan_cache_find(S, p->key)) return;
  if (S->nplans == cap) {
    uint32_t lru = 0;
    for (uint32_t i = 1; i < S->nplans; i++)
      if (S->plans[i]->last_used < S->plans[lru]->last_used) lru = i;
    plan_unref(S->plans[lru]);
    S->plans[lru] = S->plans[--S->nplans];
  }
  p->refs++;
  p->last_used = ++S->clock;
  S->plans[S->nplans++] = p;
}

/* ---- the structure hash ---- */

static void h_u64(kex_sha256 *h, uint64_t v) { kex_sha256_update(h, &v, sizeof v); }
static void h_str(kex_sha256 *h, const char *s) {
  size_t n = s ? strlen(s) : 0;
  h_u64(h, n);
  if (n) kex_sha256_update(h, s, n);
}
static void h_i64s(kex_sha256 *h, const int64_t *v, size_t n) {
  h_u64(h, n);
  if (n) kex_sha256_update(h, v, n * sizeof *v);
}
static void h_scalar(kex_sha256 *h, const Kex__V1__Scalar *s) {
  if (!s) return h_u64(h, 0xffff);
  h_u64(h, s->kind_case);
  switch (s->kind_case) {
  case KEX__V1__SCALAR__KIND_INT_VALUE: h_u64(h, (uint64_t)s->int_value); break;
  case KEX__V1__SCALAR__KIND_FLOAT_VALUE: kex_sha256_update(h, &s->float_value, sizeof s->float_value); break;
  case KEX__V1__SCALAR__KIND_BOOL_VALUE: h_u64(h, s->bool_value); break;
  case KEX__V1__SCALAR__KIND_SPECIAL: h_str(h, s->special); break;
  default: break;
  }
}

/*
 * The structure key of a (validated) graph on device `device`: every field
 * but the input bytes (inline data and random seeds).  Which BUFFER nodes
 * name the same handle is part of it; the handles themselves are not.
 */
static void structure_key(const Kex__V1__Graph *pg, uint32_t device, const kexd_beam_req *beam, uint8_t out[SUB_HASH]) {
  kex_sha256 h;
  kex_sha256_init(&h);
  h_str(&h, "kex.submit.structure.v1");
  h_u64(&h, device);
  h_u64(&h, (uint64_t)beam->width); /* a hand-coded plan never serves a beam submission, nor one width another */
  h_u64(&h, (uint64_t)beam->upcast_max);
  h_u64(&h, (uint64_t)beam->local_max);
  h_str(&h, pg->device);
  h_u64(&h, pg->n_nodes);
  for (size_t i = 0; i < pg->n_nodes; i++) {
    const Kex__V1__Node *n = pg->nodes[i];
    h_str(&h, n->op);
    h_u64(&h, n->n_src);
    for (size_t k = 0; k < n->n_src; k++) h_u64(&h, n->src[k]);
    h_str(&h, n->dtype);
    h_i64s(&h, n->shape, n->n_shape);
    h_u64(&h, n->arg_case);
    if (n->arg_case == KEX__V1__NODE__ARG_PAIRS) {
      h_u64(&h, n->pairs->n_pairs);
      for (size_t k = 0; k < n->pairs->n_pairs; k++) h_u64(&h, (uint64_t)n->pairs->pairs[k]->first),
                                                     h_u64(&h, (uint64_t)n->pairs->pairs[k]->second);
    } else if (n->arg_case != KEX__V1__NODE__ARG__NOT_SET) {
      h_i64s(&h, n->new_shape->values, n->new_shape->n_values);
    }
    h_u64(&h, n->n_axis);
    for (size_t k = 0; k < n->n_axis; k++) h_u64(&h, (uint64_t)(int64_t)n->axis[k]);
    h_scalar(&h, n->value);
    h_u64(&h, n->contents_case);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_FILL_VALUE) h_scalar(&h, n->fill_value);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_FILL_ARANGE) h_u64(&h, n->fill_arange);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_BUFFER) { /* the first node naming the same handle */
      size_t first = i;
      for (size_t k = 0; k < i && first == i; k++)
        if (pg->nodes[k]->contents_case == KEX__V1__NODE__CONTENTS_BUFFER && strcmp(pg->nodes[k]->buffer, n->buffer) == 0)
          first = k;
      h_u64(&h, first);
    }
    h_str(&h, n->device);
  }
  h_u64(&h, pg->n_outputs);
  for (size_t i = 0; i < pg->n_outputs; i++) h_u64(&h, pg->outputs[i]);
  kex_sha256_final(&h, out);
}

/* ---- one submission ---- */

typedef enum ev_kind { EV_ACCEPTED, EV_SCHEDULED, EV_COMPILING, EV_RUNNING } ev_kind;

typedef struct sub_event {
  ev_kind kind;
  uint32_t i;
} sub_event;

typedef struct submission submission;

typedef struct step_arg {
  submission *s;
  uint32_t i;
} step_arg;

struct submission {
  kexd *d;
  kexd_call *call;
  uint64_t id;
  uint64_t job;
  uint32_t weight;
  char log_id[9];
  uint32_t device;
  double t0;
  uint64_t inline_max;
  bool free_outputs;         /* SubmitRequest.free_outputs: bytes only, no job buffers (but ALIAS outputs) */
  bool only_done;            /* SubmitRequest.only_done: no progress events */
  kex_graph *g;              /* this request's graph (its input bytes); owned unless it is p->g */
  plan *p;
  bool schedule_cached;
  uint64_t reserved;
  kexd_buffer **handles;     /* [p->nbufs]: the job buffers the graph names, referenced */
  /* events */
  sub_event *evs;
  uint32_t nev, evcap, evsent;
  bool writing, dead, final_ready, final_sent;
  int final_status;
  char final_msg[KEX_ERROR_MSG_MAX];
  Kex__V1__SubmitEvent *final_ev; /* the done event, when final_status is OK */
  /* the pool (P1: build, P2: compile) */
  uv_work_t work;
  bool in_pool;
  int pool_rc;
  kex_error pool_err;
  bool *need;                /* [nkernels]: not loaded on the device: read from SQLite or compile */
  unsigned char **bins;      /* [nkernels] */
  size_t *binlens;
  double *compile_us;
  uint8_t *from;             /* [nkernels]: 0 memory, 1 sqlite, 2 compiled */
  /* the runner (see the file comment) */
  atomic_bool cancelled;
  hashmap *rprogs;           /* the runner's program table of this device */
  kex_buffer **bufs;         /* [p->nbufs] */
  kex_program **progs;       /* [nkernels] */
  kex_buffer **out_bufs;     /* [noutputs] */
  uint8_t **out_data;        /* [noutputs]: inline bytes */
  double *kernel_us;         /* [nkernels] */
  bool setup_ok, failed;
  uint32_t ran;
  /* device items */
  kexd_work *works;          /* [nsteps + 2]: setup, the steps, finish */
  step_arg *stepargs;
  uint32_t items_out;
  int rc;
  kex_error err;
  char (*handle_str)[KEXD_HANDLE_LEN + 1]; /* [noutputs] */
  kexd_beam_req beam;        /* width 0: hand-coded opts */
};

static void sub_free(submission *s) {
  kexd *d = s->d;
  kexd_call_set_hooks(s->call, NULL, NULL, NULL);
  for (uint32_t b = 0; s->handles && b < s->p->nbufs; b++) kexd_buffer_unref(&d->jobs, s->handles[b]);
  for (uint32_t i = 0; s->bins && i < s->p->nkernels; i++) kex_free(s->bins[i]);
  for (uint32_t j = 0; s->out_data && j < s->p->noutputs; j++) kex_free(s->out_data[j]);
  if (s->final_ev) {
    Kex__V1__Done *done = s->final_ev->done;
    for (size_t j = 0; j < done->n_outputs; j++) kex_free(done->outputs[j]);
    for (size_t k = 0; k < done->n_kernels; k++) kex_free(done->kernels[k]);
    kex_free(done->outputs), kex_free(done->kernels), kex_free(done), kex_free(s->final_ev);
  }
  kex_free(s->handles), kex_free(s->evs), kex_free(s->need), kex_free(s->bins), kex_free(s->binlens);
  kex_free(s->compile_us), kex_free(s->from), kex_free(s->bufs), kex_free(s->progs), kex_free(s->out_bufs);
  kex_free(s->out_data), kex_free(s->kernel_us), kex_free(s->works), kex_free(s->stepargs), kex_free(s->handle_str);
  if (!s->p || s->g != s->p->g) kex_graph_free(s->g);
  plan_unref(s->p);
  kexd_call_unref(s->call);
  kex_free(s);
}

static void sub_maybe_free(submission *s) {
  if ((s->final_sent || s->dead) && !s->writing && !s->in_pool && s->items_out == 0 && s->final_ready) sub_free(s);
}

static void ev_push(submission *s, ev_kind kind, uint32_t i) {
  if (s->dead || s->only_done) return;
  if (s->nev == s->evcap) {
    uint32_t cap = s->evcap ? 2 * s->evcap : 8;
    sub_event *e = kex_realloc(s->evs, cap * sizeof *e);
    if (!e) return; /* progress events are best effort; done and errors are not queued here */
    s->evs = e;
    s->evcap = cap;
  }
  s->evs[s->nev++] = (sub_event){kind, i};
}

static void ev_pump(submission *s);

static void ev_written(kexd_call *c, int ok, void *ud) {
  submission *s = ud;
  (void)c;
  s->writing = false;
  if (!ok) s->dead = true;
  ev_pump(s);
}

/* Write the next queued event, or the final status once the queue is empty. */
static void ev_pump(submission *s) {
  while (!s->writing && !s->dead && !s->final_sent) {
    if (s->evsent < s->nev) {
      const sub_event *e = &s->evs[s->evsent++];
      Kex__V1__SubmitEvent ev = KEX__V1__SUBMIT_EVENT__INIT;
      Kex__V1__Accepted acc = KEX__V1__ACCEPTED__INIT;
      Kex__V1__Scheduled sch = KEX__V1__SCHEDULED__INIT;
      Kex__V1__Compiling cmp = KEX__V1__COMPILING__INIT;
      Kex__V1__Running run = KEX__V1__RUNNING__INIT;
      char **names = NULL;
      switch (e->kind) {
      case EV_ACCEPTED:
        acc.submission = s->id;
        acc.schedule_cached = s->schedule_cached;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_ACCEPTED;
        ev.accepted = &acc;
        break;
      case EV_SCHEDULED:
        if (s->p->nkernels && !(names = kex_calloc(s->p->nkernels, sizeof *names))) continue;
        for (uint32_t k = 0; k < s->p->nkernels; k++) names[k] = s->p->progs[k].name;
        sch.n_kernels = s->p->nkernels;
        sch.kernels = names;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED;
        ev.scheduled = &sch;
        break;
      case EV_COMPILING:
        cmp.i = e->i;
        cmp.n = s->p->nkernels;
        cmp.kernel = s->p->progs[e->i].name;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_COMPILING;
        ev.compiling = &cmp;
        break;
      case EV_RUNNING:
        run.i = e->i;
        run.n = s->p->nkernels;
        run.kernel = s->p->progs[e->i].name;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_RUNNING;
        ev.running = &run;
        break;
      }
      int rc = kexd_call_write(s->call, &ev.base, ev_written, s);
      kex_free(names);
      if (rc == 0) s->writing = true;
      else if (kexd_call_cancelled(s->call)) s->dead = true;
      continue;
    }
    if (!s->final_ready) break;
    s->final_sent = true;
    if (s->final_status == GRPC_STATUS_OK)
      kexd_call_finish(s->call, GRPC_STATUS_OK, NULL, &s->final_ev->base);
    else
      kexd_call_finish(s->call, s->final_status, s->final_msg, NULL);
  }
  sub_maybe_free(s);
}

/* Give the job back the bytes the submission reserved (when the job is still open). */
static void sub_unreserve(submission *s) {
  kexd_job *job = s->reserved ? kexd_jobs_find_id(&s->d->jobs, s->job) : NULL;
  if (job) kexd_job_unreserve(job, s->reserved);
  s->reserved = 0;
}

/* End the submission with an error status (counted), once the queued events are out. */
static void sub_fail(submission *s, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sub_fail(submission *s, int status, const char *fmt, ...) {
  va_list ap;
  sub_unreserve(s);
  va_start(ap, fmt);
  vsnprintf(s->final_msg, sizeof s->final_msg, fmt, ap);
  va_end(ap);
  s->final_status = status;
  s->final_ready = true;
  s->d->submissions_failed++;
  kex_log(KEX_LOG_INFO, s->log_id, 0, "Submit %" PRIu64 " failed: %s", s->id, s->final_msg);
  ev_pump(s);
}

/* A failure code as the call's status: the deadline and a gone job win over what the items said. */
static void sub_fail_rc(submission *s, int rc, const kex_error *err) {
  kexd *d = s->d;
  const char *msg = err && err->msg[0] ? err->msg : kex_strerror(rc);
  if (!kexd_jobs_find_id(&d->jobs, s->job))
    sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: the job was closed during the submission");
  else if (kexd_call_time_left(s->call) <= 0)
    sub_fail(s, GRPC_STATUS_DEADLINE_EXCEEDED, "Submit: the deadline passed (%s)", msg);
  else
    sub_fail(s, kex_err_grpc_status(rc), "Submit: %s", msg);
}

static void sub_cancelled(kexd_call *c, void *ud) {
  submission *s = ud;
  (void)c;
  s->dead = true;
  atomic_store(&s->cancelled, true);
  kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": cancelled by the client (or its deadline)", s->id);
  if (s->final_ready) sub_maybe_free(s);
}

/* ---- the runner's items ---- */

static int item_fail(submission *s, int rc, kex_error *err, const char *what) {
  char m[KEX_ERROR_MSG_MAX];
  snprintf(m, sizeof m, "%s", err->msg[0] ? err->msg : kex_strerror(rc));
  s->failed = true;
  return kex_err_set(err, rc, "%s: %s", what, m);
}

/* SETUP: load the new programs, allocate the buffers, copy the inputs in. */
static int setup_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  submission *s = arg;
  const plan *p = s->p;
  int rc = 0;
  (void)device_s;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  for (uint32_t i = 0; i < p->nkernels; i++) {
    bool found;
    kex_program *prog = hm_get(s->rprogs, p->progs[i].hash, &found);
    if (!found) {
      if (!s->bins[i]) return item_fail(s, KEX_EINTERNAL, err, "a program is neither loaded nor compiled");
      if ((rc = kex_device_load(dev, s->bins[i], s->binlens[i], p->progs[i].name, &prog, err)) < 0)
        return item_fail(s, rc, err, p->progs[i].name);
      if ((rc = hm_put(s->rprogs, p->progs[i].hash, prog)) < 0) {
        kex_program_free(prog);
        return item_fail(s, rc, err, "out of memory caching a program");
      }
    }
    s->progs[i] = prog;
  }
  for (uint32_t b = 0; b < p->nbufs; b++) {
    if (!p->buf_alloc[b]) continue;
    if ((rc = kex_device_alloc(dev, p->buf_bytes[b] ? p->buf_bytes[b] : 16, &s->bufs[b], err)) < 0)
      return item_fail(s, rc, err, "allocating a buffer");
  }
  for (uint32_t i = 0; i < p->ninputs; i++) {
    const plan_input *in = &p->inputs[i];
    void *host = kex_malloc(in->bytes ? in->bytes : 1);
    char what[64];
    if (!host) return item_fail(s, KEX_ENOMEM, err, "out of memory filling an input");
    snprintf(what, sizeof what, "node %u (BUFFER)", in->node);
    rc = kex_fill_buffer(&s->g->nodes[in->node], host, in->bytes, err);
    if (!rc && in->bytes) rc = kex_buffer_copy_in(s->bufs[in->buf], 0, host, in->bytes, err);
    kex_free(host);
    if (rc < 0) return item_fail(s, rc, err, what);
  }
  s->setup_ok = true;
  s->ran = 1;
  return 0;
}

/* One kernel launch or copy. */
static int step_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  step_arg *sa = arg;
  submission *s = sa->s;
  const plan_step *st = &s->p->steps[sa->i];
  int rc = 0;
  (void)dev;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  if (!s->setup_ok || s->failed) return kex_err_set(err, KEX_ECANCELLED, "an earlier item failed");
  if (st->kind == STEP_KERNEL) {
    const plan_prog *pp = &s->p->progs[st->kernel];
    kex_buffer *args[KEX_DEVICE_MAX_BUFS];
    kex_event *ev = NULL;
    double secs = 0;
    for (uint32_t a = 0; a < st->nargs; a++) args[a] = s->bufs[st->args[a]];
    rc = kex_program_launch(s->progs[st->kernel], pp->global, pp->has_local ? pp->local : NULL, args, (int)st->nargs,
                            NULL, 0, &ev, err);
    if (!rc) rc = kex_event_elapsed(ev, &secs, err);
    kex_event_free(ev);
    if (rc < 0) return item_fail(s, rc, err, pp->name);
    *device_s = secs;
    s->kernel_us[st->kernel] = secs * 1e6;
  } else if (st->size) {
    void *tmp = kex_malloc(st->size);
    if (!tmp) return item_fail(s, KEX_ENOMEM, err, "out of memory copying");
    rc = kex_buffer_copy_out(s->bufs[st->src], st->off, tmp, st->size, err);
    if (!rc) rc = kex_buffer_copy_in(s->bufs[st->dst], 0, tmp, st->size, err);
    kex_free(tmp);
    if (rc < 0) return item_fail(s, rc, err, "copy");
  }
  s->ran++;
  return 0;
}

/*
 * One output: its buffer (out_bufs[j], except ALIAS) and its inline bytes
 * (when small enough).  With free_outputs only the bytes: a DIRECT output's
 * buffer stays in bufs (finish frees it) and GATHER/CONST get no buffer.
 */
static int output_run(submission *s, kex_device *dev, uint32_t j, kex_error *err) {
  const plan_output *o = &s->p->outputs[j];
  bool inl = o->nbytes <= s->inline_max;
  uint8_t *host = NULL;
  int rc = 0;
  if (o->kind == OUT_DIRECT || o->kind == OUT_ALIAS) {
    kex_buffer *b = s->bufs[o->buf];
    if (o->kind == OUT_DIRECT && !s->free_outputs) {
      s->out_bufs[j] = b;
      s->bufs[o->buf] = NULL;
    }
    if (!inl) return 0;
    if (!(s->out_data[j] = kex_malloc(o->nbytes ? o->nbytes : 1))) return KEX_ENOMEM;
    return o->nbytes ? kex_buffer_copy_out(b, 0, s->out_data[j], o->nbytes, err) : 0;
  }
  if (!(host = kex_calloc(o->nbytes ? o->nbytes : 1, 1))) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  if (o->kind == OUT_CONST) {
    kex_fill_const(o->dtype, o->value, host, o->nbytes / (size_t)kex_dtype_size(o->dtype));
  } else {
    uint8_t *base = kex_malloc(o->base_bytes ? o->base_bytes : 1);
    if (!base) rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
    if (!rc && o->base_bytes) rc = kex_buffer_copy_out(s->bufs[o->buf], 0, base, o->base_bytes, err);
    if (!rc) kex_st_gather(o->st, base, (size_t)kex_dtype_size(o->dtype), host);
    kex_free(base);
  }
  if (!rc && !s->free_outputs) rc = kex_device_alloc(dev, o->nbytes ? o->nbytes : 16, &s->out_bufs[j], err);
  if (!rc && !s->free_outputs && o->nbytes) rc = kex_buffer_copy_in(s->out_bufs[j], 0, host, o->nbytes, err);
  if (!rc && inl) s->out_data[j] = host, host = NULL;
  kex_free(host);
  return rc;
}

/* FINISH (must_run): the outputs when everything ran, then free what is not an output. */
static int finish_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  submission *s = arg;
  const plan *p = s->p;
  int rc = 0;
  (void)device_s;
  bool ok = !atomic_load(&s->cancelled) && s->setup_ok && !s->failed && s->ran == 1 + p->nsteps;
  for (uint32_t j = 0; ok && j < p->noutputs; j++)
    if ((rc = output_run(s, dev, j, err)) < 0) {
      item_fail(s, rc, err, "reading the outputs");
      ok = false;
    }
  for (uint32_t b = 0; b < p->nbufs; b++) {
    if (p->buf_alloc[b]) kex_buffer_free(s->bufs[b]);
    s->bufs[b] = NULL;
  }
  if (!ok) {
    for (uint32_t j = 0; j < p->noutputs; j++) {
      kex_buffer_free(s->out_bufs[j]);
      s->out_bufs[j] = NULL;
    }
    return rc < 0 ? rc : kex_err_set(err, KEX_ECANCELLED, "the submission did not run to its end");
  }
  return 0;
}

/* ---- back on the loop ---- */

/* The done event (outputs registered as the job's buffers); 0 or a negative code with the call to fail. */
static int build_done(submission *s, kexd_job *job, kex_error *err) {
  kexd *d = s->d;
  const plan *p = s->p;
  Kex__V1__SubmitEvent *ev = kex_calloc(1, sizeof *ev);
  Kex__V1__Done *done = kex_calloc(1, sizeof *done);
  int rc = 0;
  if (!ev || !done) {
    kex_free(ev), kex_free(done);
    return kex_err_set(err, KEX_ENOMEM, "out of memory");
  }
  kex__v1__submit_event__init(ev);
  kex__v1__done__init(done);
  ev->event_case = KEX__V1__SUBMIT_EVENT__EVENT_DONE;
  ev->done = done;
  s->final_ev = ev;
  done->outputs = kex_calloc(p->noutputs ? p->noutputs : 1, sizeof *done->outputs);
  done->kernels = kex_calloc(p->nkernels ? p->nkernels : 1, sizeof *done->kernels);
  s->handle_str = kex_calloc(p->noutputs ? p->noutputs : 1, sizeof *s->handle_str);
  if (!done->outputs || !done->kernels || !s->handle_str) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  for (uint32_t j = 0; j < p->noutputs; j++) {
    const plan_output *o = &p->outputs[j];
    Kex__V1__Output *out = kex_malloc(sizeof *out);
    if (!out) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__output__init(out);
    done->outputs[done->n_outputs++] = out;
    if (o->kind == OUT_ALIAS) {
      const kexd_buffer *kb = s->handles[o->buf];
      memcpy(s->handle_str[j], kb->handle, sizeof s->handle_str[j]);
    } else if (s->free_outputs) {
      s->handle_str[j][0] = '\0'; /* bytes only: the runner freed (or never made) the buffer */
    } else {
      kexd_buffer *kb;
      if ((rc = kexd_job_add_buffer(&d->jobs, job, s->out_bufs[j], s->device, o->dtype, o->shape, o->ndim, o->nbytes,
                                    &kb)) < 0)
        return kex_err_set(err, rc, "cannot record output %u: %s", j, kex_strerror(rc));
      s->out_bufs[j] = NULL;
      memcpy(s->handle_str[j], kb->handle, sizeof s->handle_str[j]);
    }
    out->handle = s->handle_str[j];
    out->dtype = (char *)kex_dtypes[o->dtype].name;
    out->n_shape = o->ndim;
    out->shape = (int64_t *)o->shape;
    out->bytes = o->nbytes;
    if (s->out_data[j]) {
      out->has_data = true;
      out->data.data = s->out_data[j];
      out->data.len = o->nbytes;
    }
  }
  for (uint32_t k = 0; k < p->nkernels; k++) {
    Kex__V1__KernelTime *kt = kex_malloc(sizeof *kt);
    if (!kt) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__kernel_time__init(kt);
    kt->kernel = (char *)p->progs[k].name;
    kt->compile_us = s->compile_us ? s->compile_us[k] : 0;
    kt->run_us = s->kernel_us[k];
    done->kernels[done->n_kernels++] = kt;
    if (s->from) {
      if (s->from[k] == 0) done->programs_memory++;
      else if (s->from[k] == 1) done->programs_sqlite++;
      else done->programs_compiled++;
    } else {
      done->programs_memory++;
    }
  }
  done->schedule_cached = s->schedule_cached;
  done->schedule_us = s->schedule_cached ? 0 : p->build_us;
  done->total_us = now_us() - s->t0;
  return 0;
}

/* Every device item is back: register the outputs (or free them) and end the call. */
static void sub_complete(submission *s) {
  kexd *d = s->d;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, s->job);
  kex_error err = {0};
  int rc = s->rc;
  sub_unreserve(s);
  if (!rc && (s->dead || !job)) rc = kex_err_set(&s->err, KEX_ECANCELLED, "cancelled");
  if (!rc && (rc = build_done(s, job, &err)) < 0) s->err = err;
  for (uint32_t j = 0; j < s->p->noutputs; j++) /* what did not become a job buffer */
    if (s->out_bufs[j]) {
      kexd_jobs_free_device_buffer(&d->jobs, s->out_bufs[j], s->device, s->job, s->weight);
      s->out_bufs[j] = NULL;
    }
  if (!rc) {
    double slowest = 0;
    for (uint32_t k = 0; k < s->p->nkernels; k++)
      if (s->kernel_us[k] > slowest) slowest = s->kernel_us[k];
    s->p->last_max_kernel_us = slowest;
    d->submissions_done++;
    s->final_status = GRPC_STATUS_OK;
    s->final_ready = true;
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": %u kernels, %.0f us", s->id, s->p->nkernels,
            s->final_ev->done->total_us);
    ev_pump(s);
  } else {
    sub_fail_rc(s, rc, &s->err);
  }
}

static void item_done(kexd_work *w) {
  submission *s = w->ud;
  uint32_t idx = (uint32_t)(w - s->works);
  s->items_out--;
  if (w->rc < 0 && (!s->rc || (s->rc == KEX_ECANCELLED && w->rc != KEX_ECANCELLED))) {
    s->rc = w->rc;
    s->err = w->err;
  }
  if (w->rc == 0 && idx == 0) {
    kexd_submitter *S = s->d->submitter;
    for (uint32_t k = 0; k < s->p->nkernels; k++) hm_put(&S->loaded[s->device], s->p->progs[k].hash, NULL);
    if (s->p->nkernels) ev_push(s, EV_RUNNING, 0);
  } else if (w->rc == 0 && idx <= s->p->nsteps && s->p->steps[idx - 1].kind == STEP_KERNEL &&
             s->p->steps[idx - 1].kernel + 1 < s->p->nkernels) {
    ev_push(s, EV_RUNNING, s->p->steps[idx - 1].kernel + 1);
  }
  if (s->items_out == 0) sub_complete(s);
  else ev_pump(s);
}

/* Post setup, the steps and finish on the job's flow.  On failure the call is ended. */
static void sub_post(submission *s) {
  kexd *d = s->d;
  const plan *p = s->p;
  uint32_t n = p->nsteps + 2;
  if (s->dead) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (kexd_call_time_left(s->call) <= 0) return sub_fail(s, GRPC_STATUS_DEADLINE_EXCEEDED, "Submit: the deadline passed");
  s->works = kex_calloc(n, sizeof *s->works);
  s->stepargs = kex_calloc(n, sizeof *s->stepargs);
  if (!s->works || !s->stepargs) return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
  /* kernels that were quick last time: the setup and every step may wait for the next item to wake the loop */
  bool defer = p->last_max_kernel_us >= 0 && p->last_max_kernel_us < SUB_DEFER_KERNEL_US;
  for (uint32_t i = 0; i < n; i++) {
    kexd_work *w = &s->works[i];
    w->kind = KEXD_WORK_RUN;
    w->defer_done = defer && i < n - 1;
    w->job = s->job;
    w->weight = s->weight;
    w->done = item_done;
    w->ud = s;
    if (i == 0) w->fn = setup_run, w->arg = s;
    else if (i == n - 1) w->fn = finish_run, w->arg = s, w->must_run = true;
    else {
      s->stepargs[i] = (step_arg){s, i - 1};
      w->fn = step_run;
      w->arg = &s->stepargs[i];
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    int rc = kexd_dispatch_post(d->disp, s->device, &s->works[i]);
    if (rc < 0) {
      if (i == 0) return sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the device runner is not available: %s",
                                  kex_strerror(rc));
      /* only while stopping: what was posted skips its work; the memory goes with the process */
      atomic_store(&s->cancelled, true);
      if (!s->rc) s->rc = kex_err_set(&s->err, KEX_EUNAVAILABLE, "the device runner is not available");
      break;
    }
    s->items_out++;
  }
}

/* ---- the pool: compile (P2) ---- */

/* The compile device of configured device i, opened at first use (under its lock).  NULL with *err. */
static kex_device *compiler_device(kexd_submitter *S, compiler *cp, const char *name, kex_error *err) {
  if (!cp->tried) {
    kex_error oe = {0};
    kex_device *dev = NULL;
    cp->tried = true;
    cp->open_rc = kex_device_open(name, &dev, &oe);
    if (!cp->open_rc && S->fault_kind >= 0) { /* --test-fault: the compile device fails on purpose */
      kex_device *f = NULL;
      cp->open_rc = kex_fault_device_new(dev, (kex_fault_kind)S->fault_kind, S->fault_n, &f);
      kex_device_unref(dev);
      dev = f;
    }
    cp->dev = cp->open_rc ? NULL : dev;
    snprintf(cp->open_msg, sizeof cp->open_msg, "device \"%.40s\" cannot be opened: %.400s", name,
             oe.msg[0] ? oe.msg : kex_strerror(cp->open_rc));
  }
  if (!cp->dev) kex_err_set(err, cp->open_rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", cp->open_msg);
  return cp->dev;
}

/* The SQLite cache, opened at first use (caller holds cache_lock); NULL when it cannot be. */
static kex_cache *sqlite_cache(kexd_submitter *S) {
  if (!S->cache_tried) {
    kex_error ce = {0};
    S->cache_tried = true;
    if (S->cache_path && *S->cache_path && kex_cache_open(S->cache_path, &S->cache, &ce) < 0) {
      KEX_WARN("program cache %s unavailable, compiling without it: %s", S->cache_path, ce.msg);
      S->cache = NULL;
    }
  }
  return S->cache;
}

/* P2 on a pool thread: each needed program from SQLite, else compiled (and stored). */
static void compile_work(uv_work_t *req) {
  submission *s = req->data;
  kexd_submitter *S = s->d->submitter;
  compiler *cp = &S->compilers[s->device];
  const plan *p = s->p;
  kex_error *err = &s->pool_err;
  kex_device_identity id;
  int rc = 0;
  memset(&id, 0, sizeof id);
  pthread_mutex_lock(&cp->lock);
  kex_device *dev = compiler_device(S, cp, s->d->cfg.devices[s->device], err);
  if (!dev) rc = err->code;
  for (int dt = 0; !rc && dt < KEX_DT_COUNT; dt++) /* a dtype the device lacks (CASTs included): refused before any compile */
    if (p->dtypes >> dt & 1) rc = kex_device_check_dtype(dev, (kex_dtype)dt, err);
  if (!rc) id = *kex_device_get_identity(dev);
  pthread_mutex_unlock(&cp->lock);
  for (uint32_t k = 0; !rc && k < p->nkernels; k++) {
    const plan_prog *pp = &p->progs[k];
    size_t srclen = strlen(pp->src);
    kex_cache_program hit;
    double t0 = now_us();
    if (!s->need[k]) continue;
    if (atomic_load(&s->cancelled)) {
      rc = kex_err_set(err, KEX_ECANCELLED, "cancelled");
      break;
    }
    pthread_mutex_lock(&S->cache_lock);
    kex_cache *c = sqlite_cache(S);
    int grc = c ? kex_cache_program_get(c, pp->src, srclen, &id, &hit, NULL) : KEX_ENOTFOUND;
    pthread_mutex_unlock(&S->cache_lock);
    if (grc == 0) {
      s->bins[k] = hit.binary;
      s->binlens[k] = hit.binary_len;
      s->from[k] = 1;
      continue;
    }
    pthread_mutex_lock(&cp->lock);
    rc = kex_device_compile(cp->dev, pp->src, pp->name, &s->bins[k], &s->binlens[k], err);
    pthread_mutex_unlock(&cp->lock);
    if (rc < 0) {
      char m[KEX_ERROR_MSG_MAX];
      snprintf(m, sizeof m, "%s", err->msg);
      kex_err_set(err, rc, "compiling kernel %u (%s): %s", k, pp->name, m);
      break;
    }
    s->from[k] = 2;
    s->compile_us[k] = now_us() - t0;
    pthread_mutex_lock(&S->cache_lock);
    if (c) {
      kex_error pe = {0};
      if (kex_cache_program_put(c, pp->src, srclen, &id, pp->name, s->bins[k], s->binlens[k], &pe) < 0)
        KEX_WARN("program cache: cannot store %s: %s", pp->name, pe.msg);
    }
    pthread_mutex_unlock(&S->cache_lock);
  }
  s->pool_rc = rc;
}

static void compile_after(uv_work_t *req, int status) {
  submission *s = req->data;
  kexd *d = s->d;
  s->in_pool = false;
  if (status < 0 && !s->pool_rc) s->pool_rc = kex_err_set(&s->pool_err, KEX_EINTERNAL, "the worker pool dropped the job");
  for (uint32_t k = 0; k < s->p->nkernels; k++)
    if (s->from[k] == 1) d->prog_cache_sqlite_hits++;
    else if (s->from[k] == 2) d->prog_cache_misses++;
  if (s->dead) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (s->pool_rc < 0) return sub_fail_rc(s, s->pool_rc, &s->pool_err);
  sub_post(s);
}

/* The plan is known: reserve memory, resolve the handles, find the programs to compile, go on. */
static void sub_planned(submission *s) {
  kexd *d = s->d;
  kexd_submitter *S = d->submitter;
  const plan *p = s->p;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, s->job);
  kex_error err = {0};
  uint32_t nk = p->nkernels ? p->nkernels : 1, nb = p->nbufs ? p->nbufs : 1, no = p->noutputs ? p->noutputs : 1;
  bool any = false;
  if (s->dead) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (!job) return sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: the job was closed during the submission");
  ev_push(s, EV_SCHEDULED, 0);
  s->handles = kex_calloc(nb, sizeof *s->handles);
  s->bufs = kex_calloc(nb, sizeof *s->bufs);
  s->progs = kex_calloc(nk, sizeof *s->progs);
  s->out_bufs = kex_calloc(no, sizeof *s->out_bufs);
  s->out_data = kex_calloc(no, sizeof *s->out_data);
  s->kernel_us = kex_calloc(nk, sizeof *s->kernel_us);
  s->need = kex_calloc(nk, sizeof *s->need);
  s->bins = kex_calloc(nk, sizeof *s->bins);
  s->binlens = kex_calloc(nk, sizeof *s->binlens);
  s->compile_us = kex_calloc(nk, sizeof *s->compile_us);
  s->from = kex_calloc(nk, sizeof *s->from);
  if (!s->handles || !s->bufs || !s->progs || !s->out_bufs || !s->out_data || !s->kernel_us || !s->need || !s->bins ||
      !s->binlens || !s->compile_us || !s->from)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
  for (uint32_t b = 0; b < p->nbufs; b++) {
    if (p->buf_handle[b] < 0) continue;
    const kex_gnode *n = &s->g->nodes[p->buf_handle[b]];
    kexd_buffer *kb = kexd_job_find_buffer(job, n->handle);
    if (!kb) return sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: node %d: buffer \"%.40s\" was freed", p->buf_handle[b], n->handle);
    if (kb->device != s->device)
      return sub_fail(s, GRPC_STATUS_INVALID_ARGUMENT, "Submit: node %d: buffer %.8s is on device \"%s\", the graph runs on \"%s\"",
                      p->buf_handle[b], kb->handle, d->cfg.devices[kb->device], d->cfg.devices[s->device]);
    kexd_buffer_ref(kb);
    s->handles[b] = kb;
    s->bufs[b] = kb->dev_buf; /* the pointer only: the runner dereferences it */
  }
  if (kexd_job_reserve(job, p->alloc_bytes, &err) < 0)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: %s (the submission needs %" PRIu64 " bytes)", err.msg,
                    p->alloc_bytes);
  s->reserved = p->alloc_bytes;
  s->rprogs = &S->programs[s->device];
  for (uint32_t k = 0; k < p->nkernels; k++) {
    bool found;
    hm_get(&S->loaded[s->device], p->progs[k].hash, &found);
    s->need[k] = !found;
    if (found) d->prog_cache_memory_hits++;
    else ev_push(s, EV_COMPILING, k), any = true;
  }
  ev_pump(s);
  if (!any) return sub_post(s);
  s->work.data = s;
  s->in_pool = true;
  if (uv_queue_work(d->loop, &s->work, compile_work, compile_after) < 0) {
    s->in_pool = false;
    sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the worker pool is not available");
  }
}

/* ---- the pool: build (P1) ---- */

static void build_work(uv_work_t *req) {
  submission *s = req->data;
  plan *p = s->p;
  double t0 = now_us();
  s->pool_rc = 0;
  if (!p->s) s->pool_rc = plan_schedule(p, &s->pool_err);
  if (!s->pool_rc) s->pool_rc = plan_build(p, s->beam.width > 0 ? &s->beam : NULL, &s->pool_err);
  p->build_us += now_us() - t0;
}

static void build_after(uv_work_t *req, int status) {
  submission *s = req->data;
  s->in_pool = false;
  if (status < 0 && !s->pool_rc) s->pool_rc = kex_err_set(&s->pool_err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (s->pool_rc < 0) return sub_fail_rc(s, s->pool_rc, &s->pool_err);
  plan_cache_add(s->d, s->p);
  sub_planned(s);
}

/* ---- the handler ---- */

void kexd_rpc_submit(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  kexd_submitter *S = d->submitter;
  Kex__V1__SubmitRequest *m =
      (Kex__V1__SubmitRequest *)kexd_rpc_decode(d, c, &kex__v1__submit_request__descriptor, req, len);
  submission *s = NULL;
  kexd_job *job;
  uint8_t key[SUB_HASH];
  int dev, rc;
  double t0 = now_us();
  if (!m) return;
  if (!(job = kexd_rpc_need_job(d, c, m->job))) goto out;
  d->submissions++;
  if (!m->graph) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Submit: missing graph");
    goto out;
  }
  uint32_t width = m->beam && m->beam->beam_width ? m->beam->beam_width : d->cfg.beam; /* 0: hand-coded */
  if (width > KEX_BEAM_MAX_WIDTH || (width && m->beam && (m->beam->max_upcast > KEXD_BEAM_MAX_LIMIT ||
                                                          m->beam->max_local > KEXD_BEAM_MAX_LIMIT))) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Submit: beam.beam_width must be at most %d and max_upcast, "
                    "max_local at most %d", KEX_BEAM_MAX_WIDTH, KEXD_BEAM_MAX_LIMIT);
    goto out;
  }
  if ((dev = kexd_rpc_device_index(d, m->graph->device)) < 0) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices",
                    m->graph->device);
    goto out;
  }
  if (!(s = kex_calloc(1, sizeof *s))) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    goto out;
  }
  s->d = d;
  s->call = c;
  s->id = d->submissions;
  s->job = job->id;
  s->weight = job->weight;
  memcpy(s->log_id, job->log_id, sizeof s->log_id);
  s->device = (uint32_t)dev;
  s->t0 = t0;
  s->free_outputs = m->free_outputs;
  s->only_done = m->only_done;
  s->inline_max = m->return_bytes || m->free_outputs ? UINT64_MAX
                  : m->inline_output_max_bytes       ? m->inline_output_max_bytes
                                                     : d->cfg.inline_output_max;
  atomic_init(&s->cancelled, false);
  if (width)
    s->beam = (kexd_beam_req){d, s->device, job->id, job->weight, (int)width, m->beam ? (int)m->beam->max_upcast : 0,
                              m->beam ? (int)m->beam->max_local : 0, m->beam ? m->beam->timeout_ms : 0, &s->cancelled};
  kexd_call_ref(c); /* the submission's own reference, dropped in sub_free */
  kexd_call_set_hooks(c, sub_cancelled, NULL, s);
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                   &d->cfg.limits, job, &s->g, &s->err)) < 0) {
    sub_fail(s, kex_err_grpc_status(rc), "%s", s->err.msg);
    goto out;
  }
  structure_key(m->graph, s->device, &s->beam, key);
  plan *p = plan_cache_find(S, key);
  if (p) {
    d->sched_cache_hits++;
    s->schedule_cached = true;
    s->p = p;
    p->refs++;
    ev_push(s, EV_ACCEPTED, 0);
    sub_planned(s);
    goto out;
  }
  d->sched_cache_misses++;
  if (!(p = kex_calloc(1, sizeof *p))) {
    sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    goto out;
  }
  p->refs = 1;
  p->last_max_kernel_us = -1;
  memcpy(p->key, key, sizeof key);
  p->device = s->device;
  p->cpu = strncmp(d->cfg.devices[s->device], "cpu", 3) == 0;
  p->g = s->g;
  kex_arena_init(&p->arena, 0);
  s->p = p;
  ev_push(s, EV_ACCEPTED, 0);
  if (s->g->nnodes <= d->cfg.plan_inline_nodes) { /* small: replay and schedule here, render on the pool */
    double ts = now_us();
    if ((rc = plan_schedule(p, &s->err)) < 0) {
      sub_fail(s, kex_err_grpc_status(rc), "%s", s->err.msg);
      goto out;
    }
    p->build_us = now_us() - ts;
  }
  ev_pump(s);
  s->work.data = s;
  s->in_pool = true;
  if (uv_queue_work(d->loop, &s->work, build_work, build_after) < 0) {
    s->in_pool = false;
    sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the worker pool is not available");
  }
out:
  kexd_rpc_free_msg(&m->base);
}

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
 *   2. on a miss, a plan is built by the plan builder (realize/plan.h, the
 *      one `kex run` uses): replay + schedule on the loop for small graphs
 *      (--plan-inline-nodes), then on the worker pool (uv_queue_work) the
 *      rest of the replay/schedule for large ones, the per-buffer and
 *      per-item tables, and every kernel lowered with hand-coded opts (or,
 *      for a beam Submit, Tune's hook: cached opts, else a search) and
 *      hashed (SHA-256 of the source).  The plan is immutable from then on
 *      and shared (refcounted on the loop) by every later submission of the
 *      same structure.
 *   3. loop: programs the device has loaded already (the loop's index of
 *      them) are memory hits, pinned for the submission; for the others one
 *      pool job reads the SQLite cache (--cache; kex_cache_program_get with
 *      the device identity), and each kernel still missing is compiled, on
 *      its own pool job, in one of the device's compile slots (below) and
 *      its binary stored (kex_cache_program_put).
 *   4. the job's flow on the device runner (dispatch.c, so fair queueing
 *      applies): one SETUP item (load the new programs, allocate the
 *      buffers, copy the inputs in), one item per kernel, COPY or VIEW, and
 *      one FINISH item (must_run: it always runs, so it is the one that
 *      frees what the submission allocated when anything failed or was
 *      cancelled; on success it turns the outputs into buffers and reads
 *      the inline bytes).
 *   5. loop: outputs become job buffers (kexd_job_add_buffer), the memory
 *      reservation is returned, the programs are unpinned, and the done
 *      event is written; only once that write went out does the status end
 *      the stream.  A call that dies first (the write fails, or the client
 *      cancels or vanishes) takes its outputs with it: the job never learnt
 *      their handles, so they are freed at once, not at the lease's end.
 *
 * Threads.  The worker pool gets the plan (immutable) and writes only its
 * own result fields of the submission; the runner's closures touch only the
 * device, the plan (read-only) and the submission's device-side fields
 * (bufs, progs, out_bufs, out_data, kernel_us, setup_ok, failed, ran: all
 * of one submission's items run on one runner, in order, so those fields
 * have one thread at a time).  `cancelled` is the one word both sides see:
 * the loop sets it at a client cancel, the closures read it and skip their
 * work.  Each device's compile probe (identity, dtypes) and the SQLite
 * handle are shared by the pool's threads, each behind a lock; compiles run
 * in slots (below).
 *
 * Loaded programs (each a dlopen()ed .so or an OpenCL program: ~77 KB and
 * 5 mappings on cpu) are bounded per device by max_programs.  The loop owns
 * the index (source hash -> loaded_prog); the runner alone dereferences the
 * programs.  A submission pins the records it uses from its plan to its
 * last item; SETUP loads what it lacks and the loop adopts those into the
 * index when SETUP is back (a program another submission loaded meanwhile
 * stays the submission's own and is unloaded at its end).  Past the limit
 * the least recently used unpinned records leave the index and a must_run
 * item unloads each on the runner; a later use reads SQLite (or compiles)
 * and loads it again.  Pinned programs are never unloaded, so while
 * submissions run their programs may exceed the limit for a while.
 *
 * Compile slots: each device compiles at most compile_slots kernels at
 * once.  Submissions with kernels to compile wait in turn; a free slot goes
 * to the first waiting submission that holds no slot, else to the head,
 * one kernel at a time, and the submission goes to the back of the line.
 * So a submission uses several slots only while nobody else waits, and a
 * small graph behind a huge one waits for at most one of its compiles.
 * A device whose compile is thread-safe (cpu: each compile is its own cc)
 * compiles in all slots on one compile instance; otherwise (OpenCL) each
 * slot opens its own.
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
#include "codegen/astkey.h"
#include "search/beam.h"
#include "search/cache.h"
#include "codegen/lower.h"
#include "realize/plan.h"
#include "realize/run.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

#define SUB_HASH KEX_PLAN_HASH /* bytes of a SHA-256 */
/*
 * A plan whose kernels all ran faster than this last time posts its items
 * with defer_done (dispatch.h): the runner wakes the loop once for the
 * chain instead of once per item.  Progress events of such a submission
 * arrive together, at most this late.
 */
#define SUB_DEFER_KERNEL_US 1000.0
#define SUB_CACHE_RETRY_US 5e6 /* a failed open of the SQLite cache is tried again at the first use this much later */

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

/* Remove key (if present) and return its value; the later entries of its probe run shift back. */
static void *hm_del(hashmap *m, const uint8_t *key) {
  if (!m->cap) return NULL;
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) return NULL;
  void *val = m->vals[i];
  for (uint32_t j = (i + 1) & (m->cap - 1); m->used[j]; j = (j + 1) & (m->cap - 1)) {
    uint64_t h;
    memcpy(&h, m->keys[j], sizeof h);
    uint32_t home = (uint32_t)h & (m->cap - 1);
    /* j's entry may fill the hole at i when its home is not in (i, j] (cyclically) */
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      memcpy(m->keys[i], m->keys[j], SUB_HASH);
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->used[i] = false;
  m->n--;
  return val;
}

static void hm_free(hashmap *m, void (*free_val)(void *)) {
  for (uint32_t i = 0; free_val && i < m->cap; i++)
    if (m->used[i]) free_val(m->vals[i]);
  kex_free(m->keys), kex_free(m->vals), kex_free(m->used);
  memset(m, 0, sizeof *m);
}

/* ---- plans: what a graph structure schedules to (immutable once built) ---- */

/* The plan builder's plan (realize/plan.h) of one graph structure, shared by its submissions. */
typedef struct plan {
  uint32_t refs;             /* loop thread */
  uint8_t key[SUB_HASH];
  uint64_t last_used;        /* structure cache LRU */
  uint32_t device;
  kex_graph *g;              /* the graph it was built from (the replay points into it) */
  kex_rplan rp;
  double build_us;
  /* loop thread, updated by each successful run: the slowest kernel's time of the last run (-1: never ran) */
  double last_max_kernel_us;
} plan;

static void plan_unref(plan *p) {
  if (!p || --p->refs) return;
  kex_plan_clear(&p->rp);
  kex_graph_free(p->g);
  kex_free(p);
}

/* A beam Submit's kernels: lowered by Tune's hook (cached opts, else a search on the job's flow). */
static int beam_lower(void *arg, const kex_graph *g, const kex_schedule *s, uint32_t item, kex_name_counter *names,
                      kex_program_src *out, char *opts, size_t opts_len, kex_error *err) {
  return kexd_tune_lower_item(arg, g, s, item, names, out, opts, opts_len, err);
}

/* ---- the daemon-wide Submit state ---- */

typedef struct submission submission;
typedef struct kexd_submitter kexd_submitter;

/*
 * A program loaded on a device's runner (see the file comment).  The loop
 * owns the record; only the runner dereferences prog.  In the index while
 * loaded; out of it, a record is a submission's own program (a second copy
 * of one in the index), or one on its way out: `unload` frees the program
 * on the runner, and its done frees the record.
 */
typedef struct loaded_prog {
  uint8_t hash[SUB_HASH];
  uint32_t device;
  kexd_submitter *S;
  char name[KEX_PROGRAM_NAME_MAX];
  kex_program *prog;         /* NULL until a SETUP loaded it */
  uint32_t pins;             /* submissions using it now (index records only) */
  uint64_t last_used;        /* S->clock at its last use */
  kexd_work unload;          /* the must_run item that frees prog: unloading never allocates */
  struct loaded_prog *next;  /* S->orphans */
} loaded_prog;

/* One compile slot: at most one pool job at a time (loop thread, but dev: that job's thread). */
typedef struct compile_slot {
  uv_work_t work;
  struct compile_dev *cd;
  submission *s;             /* compiling s's kernel k now; NULL: free */
  uint32_t k;
  int rc;                    /* the compile's result, for the loop */
  kex_error err;
  /* the slot's own compile instance (devices whose compile is not thread-safe), opened at first use */
  kex_device *dev;
} compile_slot;

/* The compile side of one configured device. */
typedef struct compile_dev {
  uint32_t device;
  kexd_submitter *S;
  /*
   * lock protects the probe and its open state: the instance every pool job
   * of this device asks for its identity and dtypes (one at a time), and the
   * one all slots compile on when the device says compiles are thread-safe.
   */
  pthread_mutex_t lock;
  kex_device *probe;
  bool tried;
  int open_rc;
  char open_msg[KEX_ERROR_MSG_MAX];
  /* loop thread */
  uint32_t nslots, busy;
  compile_slot *slots;
  submission *wait_head, *wait_tail; /* submissions with kernels no slot took yet, in turn order */
} compile_dev;

struct kexd_submitter {
  kexd *d;
  uint32_t ndevices;
  compile_dev *compilers;    /* [ndevices] */
  /* cache_lock protects cache and cache_retry_us: the SQLite handle is used by one pool thread at a time */
  pthread_mutex_t cache_lock;
  kex_cache *cache;
  double cache_retry_us; /* a failed open is not tried again before now_us() reaches this (0: try now) */
  const char *cache_path;
  int fault_kind;
  unsigned long fault_n;
  uint32_t max_programs;
  /* loop thread only */
  hashmap *loaded;           /* [ndevices]: source hash -> loaded_prog, the programs each runner holds */
  loaded_prog *orphans;      /* unloads that could not be posted (stopping): freed with the submitter */
  uint64_t programs_unloaded;
  plan **plans;              /* the structure cache, cfg.schedule_cache entries at most */
  uint32_t nplans;
  uint64_t clock;
};

int kexd_submit_init(kexd *d) {
  kexd_submitter *S = kex_calloc(1, sizeof *S);
  uint32_t nslots = d->cfg.compile_slots;
  if (!S) return KEX_ENOMEM;
  S->d = d;
  S->ndevices = d->cfg.ndevices;
  S->compilers = kex_calloc(S->ndevices ? S->ndevices : 1, sizeof *S->compilers);
  S->loaded = kex_calloc(S->ndevices ? S->ndevices : 1, sizeof *S->loaded);
  S->plans = kex_calloc(d->cfg.schedule_cache ? d->cfg.schedule_cache : 1, sizeof *S->plans);
  if (!S->compilers || !S->loaded || !S->plans) goto nomem;
  for (uint32_t i = 0; i < S->ndevices; i++) {
    compile_dev *cd = &S->compilers[i];
    if (!(cd->slots = kex_calloc(nslots, sizeof *cd->slots))) goto nomem;
    cd->device = i;
    cd->S = S;
    cd->nslots = nslots;
    for (uint32_t j = 0; j < nslots; j++) cd->slots[j].cd = cd;
  }
  for (uint32_t i = 0; i < S->ndevices; i++) pthread_mutex_init(&S->compilers[i].lock, NULL);
  pthread_mutex_init(&S->cache_lock, NULL);
  S->cache_path = d->cfg.cache_path;
  S->fault_kind = d->cfg.test_fault_kind;
  S->fault_n = d->cfg.test_fault_n;
  S->max_programs = d->cfg.max_programs;
  if (d->disp) kexd_dispatch_set_kernel_time_limit(d->disp, d->cfg.kernel_time_limit_s);
  d->submitter = S;
  return 0;
nomem:
  for (uint32_t i = 0; S->compilers && i < S->ndevices; i++) kex_free(S->compilers[i].slots);
  kex_free(S->compilers), kex_free(S->loaded), kex_free(S->plans), kex_free(S);
  return KEX_ENOMEM;
}

/* A loaded_prog's program and record, on this thread (only once the runners have exited). */
static void free_loaded_now(void *v) {
  loaded_prog *lp = v;
  kex_program_free(lp->prog);
  kex_free(lp);
}

void kexd_submit_free(kexd *d) {
  kexd_submitter *S = d->submitter;
  if (!S) return;
  for (uint32_t i = 0; i < S->ndevices; i++) {
    compile_dev *cd = &S->compilers[i];
    hm_free(&S->loaded[i], free_loaded_now); /* the runners have exited: this thread is the only one left */
    for (uint32_t j = 0; j < cd->nslots; j++) kex_device_unref(cd->slots[j].dev);
    kex_device_unref(cd->probe);
    kex_free(cd->slots);
    pthread_mutex_destroy(&cd->lock);
  }
  while (S->orphans) {
    loaded_prog *lp = S->orphans;
    S->orphans = lp->next;
    free_loaded_now(lp);
  }
  for (uint32_t i = 0; i < S->nplans; i++) plan_unref(S->plans[i]);
  kex_cache_close(S->cache);
  pthread_mutex_destroy(&S->cache_lock);
  kex_free(S->compilers), kex_free(S->loaded), kex_free(S->plans);
  kex_free(S);
  d->submitter = NULL;
}

/* ---- the loaded programs' index (loop thread) ---- */

/* The runner frees the program (the unload item's closure). */
static int unload_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  (void)dev, (void)device_s, (void)err;
  kex_program_free(arg);
  return 0;
}

static void unload_done(kexd_work *w) {
  loaded_prog *lp = w->ud;
  kex_free(lp);
}

/* Free lp's program on its runner, then lp (lp is in no index).  A record that never loaded goes at once. */
static void loaded_unload(loaded_prog *lp) {
  kexd_submitter *S = lp->S;
  if (!lp->prog) {
    kex_free(lp);
    return;
  }
  memset(&lp->unload, 0, sizeof lp->unload);
  lp->unload.kind = KEXD_WORK_RUN;
  lp->unload.job = 0; /* the daemon's own flow */
  lp->unload.weight = 1;
  lp->unload.must_run = true;
  lp->unload.fn = unload_run;
  lp->unload.arg = lp->prog;
  lp->unload.done = unload_done;
  lp->unload.ud = lp;
  if (kexd_dispatch_post(S->d->disp, lp->device, &lp->unload) < 0) { /* stopping: freed after the runners exit */
    lp->next = S->orphans;
    S->orphans = lp;
  }
}

/*
 * Bring device's index down to max_programs: unload the least recently
 * used records no submission has pinned (while there are such).
 */
static void loaded_evict(kexd_submitter *S, uint32_t device) {
  hashmap *m = &S->loaded[device];
  while (m->n > S->max_programs) {
    loaded_prog *lru = NULL;
    for (uint32_t i = 0; i < m->cap; i++) {
      loaded_prog *lp = m->used[i] ? m->vals[i] : NULL;
      if (lp && !lp->pins && (!lru || lp->last_used < lru->last_used)) lru = lp;
    }
    if (!lru) break; /* every loaded program is in use: over the limit until they are released */
    hm_del(m, lru->hash);
    S->programs_unloaded++;
    kex_log(KEX_LOG_DEBUG, NULL, 0, "programs: device \"%s\": unloading %s: %u loaded (limit %u), %" PRIu64 " unloaded",
            S->d->cfg.devices[device], lru->name, m->n, S->max_programs, S->programs_unloaded);
    loaded_unload(lru);
  }
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
  kexd_buffer **handles;     /* [p->rp.nbufs]: the job buffers the graph names, referenced */
  /* events */
  sub_event *evs;
  uint32_t nev, evcap, evsent;
  bool writing, dead, final_ready, final_sent;
  bool done_delivered;       /* the done event's write completed: the client has the output handles */
  bool outputs_dropped;      /* the call died before that: the outputs were freed */
  int final_status;
  char final_msg[KEX_ERROR_MSG_MAX];
  Kex__V1__SubmitEvent *final_ev; /* the done event, when final_status is OK */
  /* the pool (P1: build, P2: SQLite lookup, P3: compiles in slots) */
  uv_work_t work;
  uint32_t in_pool;          /* pool jobs of this submission not yet back */
  int pool_rc;
  kex_error pool_err;
  kex_device_identity dev_id; /* the compile device's (P2), the SQLite key */
  bool *need;                /* [nkernels]: not loaded on the device: read from SQLite or compile */
  unsigned char **bins;      /* [nkernels] */
  size_t *binlens;
  double *compile_us;
  uint8_t *from;             /* [nkernels]: 0 memory, 1 sqlite, 2 compiled */
  uint32_t *misses;          /* [nkernels]: the kernels P2 did not find in SQLite, nmisses of them */
  uint32_t nmisses, next_miss; /* next_miss: the next one a slot takes */
  uint32_t compiling;        /* slots compiling for it now */
  bool waiting;              /* in its device's compile line (compile_dev.wait_head) */
  submission *wait_next;
  /* programs (see the file comment): per kernel, the record of its program */
  loaded_prog **lps;         /* [nkernels]: an index record (pinned) or the submission's own */
  bool *pinned;              /* [nkernels]: lps[k] is an index record this submission pinned */
  bool adopted;              /* SETUP's loads were offered to the index */
  /* the runner (see the file comment) */
  atomic_bool cancelled;
  kex_buffer **bufs;         /* [p->rp.nbufs] */
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

/*
 * The submission is done with its programs (every item is back, or none
 * was posted): unpin its index records, unload its own programs, and bring
 * the device's index back under the limit.  Idempotent.
 */
static void sub_release_programs(submission *s) {
  kexd_submitter *S = s->d->submitter;
  if (!s->lps) return;
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++) {
    loaded_prog *lp = s->lps[k];
    if (!lp) continue;
    s->lps[k] = NULL;
    if (s->pinned[k]) {
      lp->pins--;
      lp->last_used = ++S->clock;
    } else {
      loaded_unload(lp);
    }
  }
  loaded_evict(S, s->device);
}

/*
 * SETUP is back: offer the programs it loaded to the device's index (a
 * program that is there already stays the submission's own, unloaded at
 * its end), then bring the index back under the limit.
 */
static void sub_adopt_programs(submission *s) {
  kexd_submitter *S = s->d->submitter;
  hashmap *m = &S->loaded[s->device];
  uint32_t n = 0;
  if (s->adopted || !s->lps) return;
  s->adopted = true;
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++) {
    loaded_prog *lp = s->lps[k];
    bool found;
    if (!lp || s->pinned[k] || !s->progs[k]) continue;
    lp->prog = s->progs[k]; /* written by SETUP before its done was handed back */
    hm_get(m, lp->hash, &found);
    if (found || hm_put(m, lp->hash, lp) < 0) continue;
    s->pinned[k] = true;
    lp->pins = 1;
    lp->last_used = ++S->clock;
    n++;
  }
  if (n)
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "programs: device \"%s\": %u loaded (limit %u) after Submit %" PRIu64 " loaded %u",
            s->d->cfg.devices[s->device], m->n, S->max_programs, s->id, n);
  loaded_evict(S, s->device);
}

/*
 * The call died before the done event went out (or the event cannot be
 * sent): free the outputs the submission added to the job -- nobody learnt
 * their handles.  Idempotent; nothing once the event was delivered.
 */
static void sub_drop_outputs(submission *s) {
  kexd *d = s->d;
  kexd_job *job;
  uint32_t n = 0;
  if (s->outputs_dropped || !s->final_ev || s->done_delivered || !s->handle_str) return;
  s->outputs_dropped = true;
  if (!(job = kexd_jobs_find_id(&d->jobs, s->job))) return; /* closed: its buffers went with it */
  for (uint32_t j = 0; j < s->p->rp.noutputs; j++)
    if (s->p->rp.outputs[j].kind != KEX_PLAN_OUT_ALIAS && s->handle_str[j][0] &&
        kexd_job_free_buffer(&d->jobs, job, s->handle_str[j]) == 0)
      n++;
  if (n)
    kex_log(KEX_LOG_INFO, s->log_id, 0, "Submit %" PRIu64 ": the call ended before its done event went out: %u "
            "output buffers freed", s->id, n);
}

static void sub_free(submission *s) {
  kexd *d = s->d;
  kexd_call_set_hooks(s->call, NULL, NULL, NULL);
  sub_release_programs(s);
  for (uint32_t b = 0; s->handles && b < s->p->rp.nbufs; b++) kexd_buffer_unref(&d->jobs, s->handles[b]);
  for (uint32_t i = 0; s->bins && i < s->p->rp.nkernels; i++) kex_free(s->bins[i]);
  for (uint32_t j = 0; s->out_data && j < s->p->rp.noutputs; j++) kex_free(s->out_data[j]);
  if (s->final_ev) {
    Kex__V1__Done *done = s->final_ev->done;
    for (size_t j = 0; j < done->n_outputs; j++) kex_free(done->outputs[j]);
    for (size_t k = 0; k < done->n_kernels; k++) kex_free(done->kernels[k]);
    kex_free(done->outputs), kex_free(done->kernels), kex_free(done), kex_free(s->final_ev);
  }
  kex_free(s->handles), kex_free(s->evs), kex_free(s->need), kex_free(s->bins), kex_free(s->binlens);
  kex_free(s->compile_us), kex_free(s->from), kex_free(s->bufs), kex_free(s->progs), kex_free(s->out_bufs);
  kex_free(s->out_data), kex_free(s->kernel_us), kex_free(s->works), kex_free(s->stepargs), kex_free(s->handle_str);
  kex_free(s->misses), kex_free(s->lps), kex_free(s->pinned);
  if (!s->p || s->g != s->p->g) kex_graph_free(s->g);
  plan_unref(s->p);
  kexd_call_unref(s->call);
  kex_free(s);
}

static void sub_maybe_free(submission *s) {
  if (s->dead) sub_drop_outputs(s);
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

/* The done event's write: delivered (the status follows), or the call is dead (the outputs go). */
static void done_written(kexd_call *c, int ok, void *ud) {
  submission *s = ud;
  (void)c;
  s->writing = false;
  if (ok) s->done_delivered = true;
  else s->dead = true;
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
        if (s->p->rp.nkernels && !(names = kex_calloc(s->p->rp.nkernels, sizeof *names))) continue;
        for (uint32_t k = 0; k < s->p->rp.nkernels; k++) names[k] = s->p->rp.progs[k].name;
        sch.n_kernels = s->p->rp.nkernels;
        sch.kernels = names;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED;
        ev.scheduled = &sch;
        break;
      case EV_COMPILING:
        cmp.i = e->i;
        cmp.n = s->p->rp.nkernels;
        cmp.kernel = s->p->rp.progs[e->i].name;
        ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_COMPILING;
        ev.compiling = &cmp;
        break;
      case EV_RUNNING:
        run.i = e->i;
        run.n = s->p->rp.nkernels;
        run.kernel = s->p->rp.progs[e->i].name;
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
    if (s->final_status == GRPC_STATUS_OK && !s->done_delivered) { /* the done event first, the status after it */
      int rc = kexd_call_write(s->call, &s->final_ev->base, done_written, s);
      if (rc == 0) {
        s->writing = true;
      } else if (rc == KEX_ELIMIT) {
        size_t size = protobuf_c_message_get_packed_size(&s->final_ev->base);
        sub_drop_outputs(s);
        s->d->submissions_done--;
        s->d->submissions_failed++;
        s->final_status = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(s->final_msg, sizeof s->final_msg, "Submit: the done event is %zu bytes, more than the server's "
                 "limit of %d bytes (--max-message): ask for fewer inline bytes (inline_output_max_bytes)", size,
                 s->d->cfg.max_message);
      } else {
        s->dead = true; /* finished by a cancel, or gRPC refused the batch */
      }
      continue;
    }
    s->final_sent = true;
    if (s->final_status == GRPC_STATUS_OK) kexd_histogram_observe(&s->d->submit_seconds, (now_us() - s->t0) / 1e6);
    kexd_call_finish(s->call, s->final_status, s->final_status == GRPC_STATUS_OK ? NULL : s->final_msg, NULL);
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

static void wait_remove(compile_dev *cd, submission *s);
static void compile_end(submission *s);

static void sub_cancelled(kexd_call *c, void *ud) {
  submission *s = ud;
  (void)c;
  s->dead = true;
  atomic_store(&s->cancelled, true);
  kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": cancelled by the client (or its deadline)", s->id);
  if (s->waiting && !s->compiling) { /* waiting for a compile slot with none in flight: leave the line now */
    wait_remove(&s->d->submitter->compilers[s->device], s);
    return compile_end(s);
  }
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
  for (uint32_t i = 0; i < p->rp.nkernels; i++) {
    if (s->progs[i]) continue; /* loaded already: the loop pinned it for this submission */
    if (!s->bins[i]) return item_fail(s, KEX_EINTERNAL, err, "a program is neither loaded nor compiled");
    if ((rc = kex_device_load(dev, s->bins[i], s->binlens[i], p->rp.progs[i].name, &s->progs[i], err)) < 0)
      return item_fail(s, rc, err, p->rp.progs[i].name);
  }
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (!p->rp.buf_alloc[b]) continue;
    if ((rc = kex_device_alloc(dev, p->rp.buf_bytes[b] ? p->rp.buf_bytes[b] : 16, &s->bufs[b], err)) < 0)
      return item_fail(s, rc, err, "allocating a buffer");
  }
  for (uint32_t i = 0; i < p->rp.ninputs; i++) {
    const kex_plan_input *in = &p->rp.inputs[i];
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
  const kex_plan_step *st = &s->p->rp.steps[sa->i];
  int rc = 0;
  (void)dev;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  if (!s->setup_ok || s->failed) return kex_err_set(err, KEX_ECANCELLED, "an earlier item failed");
  if (st->kind == KEX_PLAN_STEP_KERNEL) {
    const kex_plan_prog *pp = &s->p->rp.progs[st->kernel];
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
  const kex_plan_output *o = &s->p->rp.outputs[j];
  bool inl = o->nbytes <= s->inline_max;
  uint8_t *host = NULL;
  int rc = 0;
  if (o->kind == KEX_PLAN_OUT_DIRECT || o->kind == KEX_PLAN_OUT_ALIAS) {
    kex_buffer *b = s->bufs[o->buf];
    if (o->kind == KEX_PLAN_OUT_DIRECT && !s->free_outputs) {
      s->out_bufs[j] = b;
      s->bufs[o->buf] = NULL;
    }
    if (!inl) return 0;
    if (!(s->out_data[j] = kex_malloc(o->nbytes ? o->nbytes : 1))) return KEX_ENOMEM;
    return o->nbytes ? kex_buffer_copy_out(b, 0, s->out_data[j], o->nbytes, err) : 0;
  }
  if (!(host = kex_calloc(o->nbytes ? o->nbytes : 1, 1))) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  if (o->kind == KEX_PLAN_OUT_CONST) {
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
  bool ok = !atomic_load(&s->cancelled) && s->setup_ok && !s->failed && s->ran == 1 + p->rp.nsteps;
  for (uint32_t j = 0; ok && j < p->rp.noutputs; j++)
    if ((rc = output_run(s, dev, j, err)) < 0) {
      item_fail(s, rc, err, "reading the outputs");
      ok = false;
    }
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (p->rp.buf_alloc[b]) kex_buffer_free(s->bufs[b]);
    s->bufs[b] = NULL;
  }
  if (!ok) {
    for (uint32_t j = 0; j < p->rp.noutputs; j++) {
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
  done->outputs = kex_calloc(p->rp.noutputs ? p->rp.noutputs : 1, sizeof *done->outputs);
  done->kernels = kex_calloc(p->rp.nkernels ? p->rp.nkernels : 1, sizeof *done->kernels);
  s->handle_str = kex_calloc(p->rp.noutputs ? p->rp.noutputs : 1, sizeof *s->handle_str);
  if (!done->outputs || !done->kernels || !s->handle_str) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  for (uint32_t j = 0; j < p->rp.noutputs; j++) {
    const kex_plan_output *o = &p->rp.outputs[j];
    Kex__V1__Output *out = kex_malloc(sizeof *out);
    if (!out) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__output__init(out);
    done->outputs[done->n_outputs++] = out;
    if (o->kind == KEX_PLAN_OUT_ALIAS) {
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
  for (uint32_t k = 0; k < p->rp.nkernels; k++) {
    Kex__V1__KernelTime *kt = kex_malloc(sizeof *kt);
    if (!kt) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__kernel_time__init(kt);
    kt->kernel = (char *)p->rp.progs[k].name;
    kt->compile_us = s->compile_us ? s->compile_us[k] : 0;
    kt->run_us = s->kernel_us[k];
    kt->opts = p->rp.progs[k].opts; /* the applied opts, as kex run prints them */
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
  sub_release_programs(s); /* no item of it is left on the runner */
  if (!rc && (s->dead || !job)) rc = kex_err_set(&s->err, KEX_ECANCELLED, "cancelled");
  if (!rc && (rc = build_done(s, job, &err)) < 0) s->err = err;
  for (uint32_t j = 0; j < s->p->rp.noutputs; j++) /* what did not become a job buffer */
    if (s->out_bufs[j]) {
      kexd_jobs_free_device_buffer(&d->jobs, s->out_bufs[j], s->device, s->job, s->weight);
      s->out_bufs[j] = NULL;
    }
  if (!rc) {
    double slowest = 0;
    for (uint32_t k = 0; k < s->p->rp.nkernels; k++)
      if (s->kernel_us[k] > slowest) slowest = s->kernel_us[k];
    s->p->last_max_kernel_us = slowest;
    d->submissions_done++;
    s->final_status = GRPC_STATUS_OK;
    s->final_ready = true;
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": %u kernels, %.0f us", s->id, s->p->rp.nkernels,
            s->final_ev->done->total_us);
    ev_pump(s);
  } else {
    sub_drop_outputs(s); /* the outputs build_done recorded before it failed */
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
  if (idx == 0) sub_adopt_programs(s); /* whatever SETUP loaded, even when it failed later */
  if (w->rc == 0 && idx >= 1 && idx <= s->p->rp.nsteps && s->p->rp.steps[idx - 1].kind == KEX_PLAN_STEP_KERNEL)
    s->d->kernel_seconds += w->device_s;
  if (w->rc == 0 && idx == 0) {
    if (s->p->rp.nkernels) ev_push(s, EV_RUNNING, 0);
  } else if (w->rc == 0 && idx <= s->p->rp.nsteps && s->p->rp.steps[idx - 1].kind == KEX_PLAN_STEP_KERNEL &&
             s->p->rp.steps[idx - 1].kernel + 1 < s->p->rp.nkernels) {
    ev_push(s, EV_RUNNING, s->p->rp.steps[idx - 1].kernel + 1);
  }
  if (s->items_out == 0) sub_complete(s);
  else ev_pump(s);
}

/* Post setup, the steps and finish on the job's flow.  On failure the call is ended. */
static void sub_post(submission *s) {
  kexd *d = s->d;
  const plan *p = s->p;
  uint32_t n = p->rp.nsteps + 2;
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

/* ---- the pool: SQLite (P2) and the compile slots (P3) ---- */

/*
 * Open a compile instance of configured device `name` (wrapped by
 * --test-fault's device when asked).  0, or a negative code with msg[cap]
 * saying why.
 */
static int open_compile_device(kexd_submitter *S, const char *name, kex_device **out, char *msg, size_t cap) {
  kex_error oe = {0};
  kex_device *dev = NULL;
  int rc = kex_device_open(name, &dev, &oe);
  if (!rc && S->fault_kind >= 0) { /* --test-fault: the compile device fails on purpose */
    kex_device *f = NULL;
    rc = kex_fault_device_new(dev, (kex_fault_kind)S->fault_kind, S->fault_n, &f);
    kex_device_unref(dev);
    dev = f;
  }
  *out = rc ? NULL : dev;
  if (rc)
    snprintf(msg, cap, "device \"%.40s\" cannot be opened: %.400s", name, oe.msg[0] ? oe.msg : kex_strerror(rc));
  return rc;
}

/* cd's probe, opened at first use (caller holds cd->lock).  NULL with *err. */
static kex_device *compile_probe(compile_dev *cd, kex_error *err) {
  if (!cd->tried) {
    cd->tried = true;
    cd->open_rc = open_compile_device(cd->S, cd->S->d->cfg.devices[cd->device], &cd->probe, cd->open_msg,
                                      sizeof cd->open_msg);
  }
  if (!cd->probe) kex_err_set(err, cd->open_rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", cd->open_msg);
  return cd->probe;
}

/*
 * The SQLite cache, opened at first use (caller holds cache_lock); NULL when
 * it cannot be opened now.  plan.h's cache policy for a lookup: warned, and
 * compiles go on without it; being a long-lived process, kexd tries the
 * open again at the first use SUB_CACHE_RETRY_US later: a busy or briefly
 * missing file must not cost the process its program cache for good.
 */
static kex_cache *sqlite_cache(kexd_submitter *S) {
  if (!S->cache && S->cache_path && *S->cache_path && now_us() >= S->cache_retry_us) {
    bool failed_before = S->cache_retry_us > 0;
    kex_plan_cache_open(S->cache_path, KEX_PLAN_CACHE_LOOKUP, "program cache", &S->cache, NULL);
    if (!S->cache) {
      S->cache_retry_us = now_us() + SUB_CACHE_RETRY_US;
      KEX_INFO("program cache %s: trying the open again in %.0f s", S->cache_path, SUB_CACHE_RETRY_US / 1e6);
    } else if (failed_before) {
      S->cache_retry_us = 0;
      KEX_INFO("program cache %s opened (an earlier open had failed)", S->cache_path);
    }
  }
  return S->cache;
}

/* P2 on a pool thread: the device's identity and dtypes, then each needed program from SQLite; the rest are misses. */
static void lookup_work(uv_work_t *req) {
  submission *s = req->data;
  kexd_submitter *S = s->d->submitter;
  compile_dev *cd = &S->compilers[s->device];
  const plan *p = s->p;
  kex_error *err = &s->pool_err;
  int rc = 0;
  pthread_mutex_lock(&cd->lock);
  kex_device *dev = compile_probe(cd, err);
  if (!dev) rc = err->code;
  for (int dt = 0; !rc && dt < KEX_DT_COUNT; dt++) /* a dtype the device lacks (CASTs included): refused before any compile */
    if (p->rp.dtypes >> dt & 1) rc = kex_device_check_dtype(dev, (kex_dtype)dt, err);
  if (!rc) s->dev_id = *kex_device_get_identity(dev);
  pthread_mutex_unlock(&cd->lock);
  for (uint32_t k = 0; !rc && k < p->rp.nkernels; k++) {
    const kex_plan_prog *pp = &p->rp.progs[k];
    kex_cache_program hit;
    if (!s->need[k]) continue;
    if (atomic_load(&s->cancelled)) {
      rc = kex_err_set(err, KEX_ECANCELLED, "cancelled");
      break;
    }
    pthread_mutex_lock(&S->cache_lock);
    kex_cache *c = sqlite_cache(S);
    int grc = c ? kex_cache_program_get(c, pp->src, strlen(pp->src), &s->dev_id, &hit, NULL) : KEX_ENOTFOUND;
    pthread_mutex_unlock(&S->cache_lock);
    if (grc == 0) {
      s->bins[k] = hit.binary;
      s->binlens[k] = hit.binary_len;
      s->from[k] = 1;
    } else {
      s->misses[s->nmisses++] = k;
    }
  }
  s->pool_rc = rc;
}

/* P3 on a pool thread: compile the slot's kernel, store its binary in SQLite. */
static void slot_work(uv_work_t *req) {
  compile_slot *sl = req->data;
  compile_dev *cd = sl->cd;
  kexd_submitter *S = cd->S;
  submission *s = sl->s;
  uint32_t k = sl->k;
  const kex_plan_prog *pp = &s->p->rp.progs[k];
  char m[KEX_ERROR_MSG_MAX];
  double t0 = now_us();
  kex_device *dev;
  int rc;
  if (atomic_load(&s->cancelled)) {
    sl->rc = kex_err_set(&sl->err, KEX_ECANCELLED, "cancelled");
    return;
  }
  pthread_mutex_lock(&cd->lock); /* P2 opened the probe before any compile of this device */
  dev = cd->probe && kex_device_get_info(cd->probe)->compile_thread_safe ? cd->probe : NULL;
  pthread_mutex_unlock(&cd->lock);
  if (!dev) { /* a device whose compiles must not overlap: the slot's own instance */
    if (!sl->dev && (rc = open_compile_device(S, S->d->cfg.devices[cd->device], &sl->dev, m, sizeof m)) < 0) {
      sl->rc = kex_err_set(&sl->err, rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", m);
      return;
    }
    dev = sl->dev;
  }
  if ((rc = kex_device_compile(dev, pp->src, pp->name, &s->bins[k], &s->binlens[k], &sl->err)) < 0) {
    snprintf(m, sizeof m, "%s", sl->err.msg);
    sl->rc = kex_err_set(&sl->err, rc, "compiling kernel %u (%s): %s", k, pp->name, m);
    return;
  }
  s->from[k] = 2;
  s->compile_us[k] = now_us() - t0;
  pthread_mutex_lock(&S->cache_lock);
  kex_cache *c = sqlite_cache(S);
  if (c) {
    kex_error pe = {0};
    if (kex_cache_program_put(c, pp->src, strlen(pp->src), &s->dev_id, pp->name, s->bins[k], s->binlens[k], &pe) < 0)
      KEX_WARN("program cache: cannot store %s: %s", pp->name, pe.msg);
  }
  pthread_mutex_unlock(&S->cache_lock);
}

static void slot_after(uv_work_t *req, int status);

static void wait_push(compile_dev *cd, submission *s) {
  s->wait_next = NULL;
  s->waiting = true;
  if (cd->wait_tail) cd->wait_tail->wait_next = s;
  else cd->wait_head = s;
  cd->wait_tail = s;
}

static void wait_remove(compile_dev *cd, submission *s) {
  submission **pp = &cd->wait_head, *prev = NULL;
  while (*pp && *pp != s) prev = *pp, pp = &(*pp)->wait_next;
  if (!*pp) return;
  *pp = s->wait_next;
  if (cd->wait_tail == s) cd->wait_tail = prev;
  s->wait_next = NULL;
  s->waiting = false;
}

/* Every compile of s is back and no other will start: go on to the device, or fail. */
static void compile_end(submission *s) {
  if (s->dead) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (s->pool_rc < 0) return sub_fail_rc(s, s->pool_rc, &s->pool_err);
  sub_post(s);
}

/*
 * Give cd's free slots to waiting submissions: the first that holds no
 * slot, else the head of the line; one kernel each, then it goes to the
 * back.  A submission that failed or was cancelled leaves the line and
 * ends once its compiles in flight are back.
 */
static void compile_pump(compile_dev *cd) {
  kexd *d = cd->S->d;
  while (cd->busy < cd->nslots && cd->wait_head) {
    submission *s = cd->wait_head;
    compile_slot *sl = NULL;
    for (submission *t = cd->wait_head; t; t = t->wait_next)
      if (!t->compiling) {
        s = t;
        break;
      }
    wait_remove(cd, s);
    if (s->dead || s->pool_rc < 0) {
      if (!s->compiling) compile_end(s);
      continue;
    }
    for (uint32_t i = 0; i < cd->nslots && !sl; i++)
      if (!cd->slots[i].s) sl = &cd->slots[i];
    if (!sl) break; /* cannot be: busy < nslots */
    sl->s = s;
    sl->k = s->misses[s->next_miss];
    sl->rc = 0;
    memset(&sl->err, 0, sizeof sl->err);
    sl->work.data = sl;
    if (uv_queue_work(d->loop, &sl->work, slot_work, slot_after) < 0) {
      sl->s = NULL;
      s->pool_rc = kex_err_set(&s->pool_err, KEX_EUNAVAILABLE, "the worker pool is not available");
      if (!s->compiling) compile_end(s);
      continue;
    }
    s->next_miss++;
    s->compiling++;
    s->in_pool++;
    cd->busy++;
    if (s->next_miss < s->nmisses) wait_push(cd, s);
  }
}

static void slot_after(uv_work_t *req, int status) {
  compile_slot *sl = req->data;
  compile_dev *cd = sl->cd;
  submission *s = sl->s;
  sl->s = NULL;
  cd->busy--;
  s->compiling--;
  s->in_pool--;
  if (status < 0 && !sl->rc) sl->rc = kex_err_set(&sl->err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (!sl->rc) cd->S->d->prog_cache_misses++;
  else if (!s->pool_rc || (s->pool_rc == KEX_ECANCELLED && sl->rc != KEX_ECANCELLED)) {
    s->pool_rc = sl->rc;
    s->pool_err = sl->err;
  }
  if (!s->compiling && (s->dead || s->pool_rc < 0 || s->next_miss == s->nmisses)) {
    if (s->waiting) wait_remove(cd, s);
    compile_end(s); /* may free s */
  }
  compile_pump(cd);
}

static void lookup_after(uv_work_t *req, int status) {
  submission *s = req->data;
  kexd *d = s->d;
  s->in_pool--;
  if (status < 0 && !s->pool_rc) s->pool_rc = kex_err_set(&s->pool_err, KEX_EINTERNAL, "the worker pool dropped the job");
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++)
    if (s->from[k] == 1) d->prog_cache_sqlite_hits++;
  if (s->dead || s->pool_rc < 0 || !s->nmisses) return compile_end(s);
  compile_dev *cd = &d->submitter->compilers[s->device];
  wait_push(cd, s);
  compile_pump(cd);
}

/* The plan is known: reserve memory, resolve the handles and the loaded programs, go on. */
static void sub_planned(submission *s) {
  kexd *d = s->d;
  kexd_submitter *S = d->submitter;
  const plan *p = s->p;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, s->job);
  kex_error err = {0};
  uint32_t nk = p->rp.nkernels ? p->rp.nkernels : 1, nb = p->rp.nbufs ? p->rp.nbufs : 1, no = p->rp.noutputs ? p->rp.noutputs : 1;
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
  s->misses = kex_calloc(nk, sizeof *s->misses);
  s->lps = kex_calloc(nk, sizeof *s->lps);
  s->pinned = kex_calloc(nk, sizeof *s->pinned);
  if (!s->handles || !s->bufs || !s->progs || !s->out_bufs || !s->out_data || !s->kernel_us || !s->need || !s->bins ||
      !s->binlens || !s->compile_us || !s->from || !s->misses || !s->lps || !s->pinned)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (p->rp.buf_handle[b] < 0) continue;
    const kex_gnode *n = &s->g->nodes[p->rp.buf_handle[b]];
    kexd_buffer *kb = kexd_job_find_buffer(job, n->handle);
    if (!kb) return sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: node %d: buffer \"%.40s\" was freed", p->rp.buf_handle[b], n->handle);
    if (kb->device != s->device)
      return sub_fail(s, GRPC_STATUS_INVALID_ARGUMENT, "Submit: node %d: buffer %.8s is on device \"%s\", the graph runs on \"%s\"",
                      p->rp.buf_handle[b], kb->handle, d->cfg.devices[kb->device], d->cfg.devices[s->device]);
    kexd_buffer_ref(kb);
    s->handles[b] = kb;
    s->bufs[b] = kb->dev_buf; /* the pointer only: the runner dereferences it */
  }
  if (kexd_job_reserve(job, p->rp.alloc_bytes, &err) < 0)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: %s (the submission needs %" PRIu64 " bytes)", err.msg,
                    p->rp.alloc_bytes);
  s->reserved = p->rp.alloc_bytes;
  for (uint32_t k = 0; k < p->rp.nkernels; k++) {
    bool found;
    loaded_prog *lp = hm_get(&S->loaded[s->device], p->rp.progs[k].hash, &found);
    if (found) { /* loaded: pinned until the submission's last item is back */
      lp->pins++;
      lp->last_used = ++S->clock;
      s->lps[k] = lp;
      s->pinned[k] = true;
      s->progs[k] = lp->prog; /* the pointer only: the runner dereferences it */
      d->prog_cache_memory_hits++;
      continue;
    }
    if (!(lp = kex_calloc(1, sizeof *lp))) return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    memcpy(lp->hash, p->rp.progs[k].hash, SUB_HASH);
    snprintf(lp->name, sizeof lp->name, "%s", p->rp.progs[k].name);
    lp->device = s->device;
    lp->S = S;
    s->lps[k] = lp;
    s->need[k] = true;
    ev_push(s, EV_COMPILING, k), any = true;
  }
  ev_pump(s);
  if (!any) return sub_post(s);
  s->work.data = s;
  s->in_pool++;
  if (uv_queue_work(d->loop, &s->work, lookup_work, lookup_after) < 0) {
    s->in_pool--;
    sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the worker pool is not available");
  }
}

/* ---- the pool: build (P1) ---- */

static void build_work(uv_work_t *req) {
  submission *s = req->data;
  plan *p = s->p;
  double t0 = now_us();
  s->pool_rc = 0;
  kex_plan_policy pol;
  kex_plan_policy_hand(&pol);
  if (s->beam.width > 0) {
    pol.kind = KEX_PLAN_HOOK;
    pol.lower = beam_lower;
    pol.lower_arg = &s->beam;
    pol.cancel = &s->cancelled;
  }
  s->pool_rc = kex_plan_lower(&p->rp, &pol, &s->pool_err); /* schedules first when the loop did not */
  p->build_us += now_us() - t0;
}

static void build_after(uv_work_t *req, int status) {
  submission *s = req->data;
  s->in_pool--;
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
  p->g = s->g;
  kex_plan_init(&p->rp, p->g, &d->targets[s->device]);
  s->p = p;
  ev_push(s, EV_ACCEPTED, 0);
  if (s->g->nnodes <= d->cfg.plan_inline_nodes) { /* small: replay and schedule here, render on the pool */
    double ts = now_us();
    if ((rc = kex_plan_schedule(&p->rp, NULL, &s->err)) < 0) {
      sub_fail(s, kex_err_grpc_status(rc), "%s", s->err.msg);
      goto out;
    }
    p->build_us = now_us() - ts;
  }
  ev_pump(s);
  s->work.data = s;
  s->in_pool++;
  if (uv_queue_work(d->loop, &s->work, build_work, build_after) < 0) {
    s->in_pool--;
    sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the worker pool is not available");
  }
out:
  kexd_rpc_free_msg(&m->base);
}

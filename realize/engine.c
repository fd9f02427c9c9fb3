/*
 * engine.c - the engine of one device (engine.h): the compile instances,
 * the program stage (SQLite, then compile and store) with its compile
 * slots and their line of waiting requests, and the per-worker cache
 * connections.  The device's compile instance (identity, dtypes) is shared
 * by the pool's threads behind a lock; SQLite is reached through the
 * connection of the thread a job runs on (kex_cache_conns).
 */
#include "realize/engine.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/log.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- per-worker cache connections ---- */

/* One worker thread's connection (listed so the owner can close them all). */
typedef struct conn {
  kex_cache *cache;
  struct conn *next;
} conn;

struct kex_cache_conns {
  uint64_t id;               /* unique in the process: a thread's cached connection names its owner by it */
  char *path;                /* "" when none */
  /* lock protects list: every worker thread's connection */
  pthread_mutex_t lock;
  conn *list;
};

int kex_cache_conns_create(const char *path, kex_cache_conns **out) {
  kex_cache_conns *cc = kex_calloc(1, sizeof *cc);
  *out = NULL;
  if (!cc || !(cc->path = kex_strdup(path ? path : ""))) {
    kex_free(cc);
    return KEX_ENOMEM;
  }
  static atomic_uint_fast64_t next_id = 1;
  cc->id = atomic_fetch_add(&next_id, 1);
  pthread_mutex_init(&cc->lock, NULL);
  *out = cc;
  return 0;
}

void kex_cache_conns_free(kex_cache_conns *cc) {
  if (!cc) return;
  while (cc->list) {
    conn *n = cc->list;
    cc->list = n->next;
    kex_cache_close(n->cache);
    kex_free(n);
  }
  pthread_mutex_destroy(&cc->lock);
  kex_free(cc->path);
  kex_free(cc);
}

const char *kex_cache_conns_path(const kex_cache_conns *cc) { return cc ? cc->path : ""; }

static _Thread_local conn *tl_conn;     /* this thread's connection ... */
static _Thread_local uint64_t tl_owner; /* ... of the connections with this id (an address may be reused) */

kex_cache *kex_cache_conns_get(kex_cache_conns *cc, kex_error *err) {
  kex_cache *c = NULL;
  kex_error ce = {0};
  conn *n;
  int rc;
  if (!cc || !*cc->path) {
    kex_err_set(err, KEX_EUNAVAILABLE, "kexd has no cache file");
    return NULL;
  }
  if (tl_conn && tl_owner == cc->id) return tl_conn->cache;
  if ((rc = kex_cache_open(cc->path, &c, &ce)) < 0) {
    kex_err_set(err, rc, "the beam cache %s cannot be opened: %s", cc->path, ce.msg);
    return NULL;
  }
  if (!(n = kex_calloc(1, sizeof *n))) {
    kex_cache_close(c);
    kex_err_set(err, KEX_ENOMEM, "out of memory");
    return NULL;
  }
  n->cache = c;
  pthread_mutex_lock(&cc->lock);
  n->next = cc->list;
  cc->list = n;
  pthread_mutex_unlock(&cc->lock);
  tl_conn = n;
  tl_owner = cc->id;
  return c;
}

/* When this thread may try again to open the cache of the connections with id tl_retry_owner (after an open failed). */
static _Thread_local double tl_retry_us;
static _Thread_local uint64_t tl_retry_owner;

kex_cache *kex_cache_conns_lookup(kex_cache_conns *cc, const char *what) {
  kex_error err = {0};
  kex_cache *c;
  bool failed_before = cc && tl_retry_owner == cc->id;
  if (!cc || !*cc->path || (failed_before && now_us() < tl_retry_us)) return NULL;
  if (!(c = kex_cache_conns_get(cc, &err))) {
    tl_retry_owner = cc->id;
    tl_retry_us = now_us() + KEX_CACHE_RETRY_S * 1e6;
    KEX_WARN("%s unavailable, going on without it: %s (this thread tries again in %.0f s)", what, err.msg,
             KEX_CACHE_RETRY_S);
  } else if (failed_before) {
    tl_retry_owner = 0;
    KEX_INFO("%s %s opened (an earlier open had failed)", what, cc->path);
  }
  return c;
}

/* ---- the engine ---- */

#define KEX_ENGINE_PAYER_MAX 64     /* bytes of a payer's name, NUL included (longer names are cut) */
#define KEX_ENGINE_FAILED_MAX 256   /* sources remembered as failing (the oldest forgotten first) */

/* What one payer of compiles has been charged (owner thread). */
typedef struct kex_payer {
  char name[KEX_ENGINE_PAYER_MAX];
  double charged;     /* compile seconds / weight since it was made (its virtual time) */
  uint32_t compiling; /* its compiles in flight */
  uint32_t waiting;   /* its requests in line */
  struct kex_payer *next;
} kex_payer;

/* A source that failed to compile: its hash and what the compiler said. */
typedef struct failed_src {
  uint64_t hash;
  int code;
  char msg[KEX_ERROR_MSG_MAX];
} failed_src;

/* One compile slot: at most one pool job at a time (owner thread, but dev: that job's thread). */
typedef struct slot {
  kex_work work;
  kex_engine *e;
  kex_prog_req *r;           /* compiling r's kernel k now; NULL: free */
  uint32_t k;
  int rc;                    /* the compile's result, for the owner */
  double us;                 /* the compile's wall time (charged to the payer) */
  kex_error err;
  /* the slot's own compile instance (devices whose compile is not thread-safe), opened at first use */
  kex_device *dev;
} slot;

struct kex_engine {
  char *device;
  int fault_kind;
  unsigned long fault_n;
  kex_cache_conns *conns;
  kex_executor exec;
  /*
   * lock protects the probe and its open state: the instance every pool job
   * asks for its identity and dtypes (one at a time), and the one all slots
   * compile on when the device says compiles are thread-safe.
   */
  pthread_mutex_t lock;
  kex_device *probe;
  bool tried;
  int open_rc;
  char open_msg[KEX_ERROR_MSG_MAX];
  /* compile_timeout_s and the sources that failed (under lock) */
  double compile_timeout_s;
  failed_src *failed;
  uint32_t nfailed, failed_next;
  /* owner thread */
  uint32_t nslots, busy; /* the fair slots; compiles in flight (up to 2 x nslots: the extra ones) */
  slot *slots;           /* [2 x nslots] */
  kex_payer *payers;     /* payers in line or compiling */
  kex_prog_req *wait_head, *wait_tail; /* requests with kernels no slot took yet, in turn order */
  kex_engine_stats stats;
};

int kex_engine_create(const kex_engine_config *cfg, kex_engine **out) {
  kex_engine *e = kex_calloc(1, sizeof *e);
  uint32_t n = cfg->compile_slots ? cfg->compile_slots : 1;
  *out = NULL;
  if (!e) return KEX_ENOMEM;
  e->device = kex_strdup(cfg->device ? cfg->device : "default");
  e->slots = kex_calloc(2 * (size_t)n, sizeof *e->slots);
  e->failed = kex_calloc(KEX_ENGINE_FAILED_MAX, sizeof *e->failed);
  if (!e->device || !e->slots || !e->failed) {
    kex_free(e->device), kex_free(e->slots), kex_free(e->failed), kex_free(e);
    return KEX_ENOMEM;
  }
  e->nslots = n;
  for (uint32_t j = 0; j < 2 * n; j++) e->slots[j].e = e;
  e->compile_timeout_s = cfg->compile_timeout_s > 0 ? cfg->compile_timeout_s : 0;
  e->fault_kind = cfg->fault_kind;
  e->fault_n = cfg->fault_n;
  e->conns = cfg->conns;
  e->exec = cfg->exec;
  if (cfg->instance) {
    if (e->compile_timeout_s > 0) kex_device_set_compile_time_limit(cfg->instance, e->compile_timeout_s);
    kex_device_ref(cfg->instance);
    e->probe = cfg->instance;
    e->tried = true;
  }
  pthread_mutex_init(&e->lock, NULL);
  *out = e;
  return 0;
}

void kex_engine_free(kex_engine *e) {
  if (!e) return;
  for (uint32_t j = 0; j < 2 * e->nslots; j++) kex_device_unref(e->slots[j].dev);
  kex_device_unref(e->probe);
  pthread_mutex_destroy(&e->lock);
  while (e->payers) {
    kex_payer *p = e->payers;
    e->payers = p->next;
    kex_free(p);
  }
  kex_free(e->failed);
  kex_free(e->slots);
  kex_free(e->device);
  kex_free(e);
}

kex_engine_stats kex_engine_get_stats(const kex_engine *e) { return e->stats; }

/* A new instance of the device, wrapped by the fault device when `faults` and the engine has one. */
static int open_raw(kex_engine *e, bool faults, kex_device **out, kex_error *err) {
  kex_device *dev = NULL;
  int rc = kex_device_open(e->device, &dev, err);
  if (!rc && faults && e->fault_kind >= 0) { /* tests: the device fails on purpose */
    kex_device *f = NULL;
    rc = kex_fault_device_new(dev, (kex_fault_kind)e->fault_kind, e->fault_n, &f);
    kex_device_unref(dev);
    dev = f;
  }
  *out = rc ? NULL : dev;
  return rc;
}

int kex_engine_open_instance(kex_engine *e, kex_device **out, kex_error *err) { return open_raw(e, true, out, err); }

void kex_engine_target(kex_engine *e, kex_target *out) {
  kex_device *dev = NULL;
  kex_error err = {0};
  if (open_raw(e, false, &dev, &err) == 0) {
    kex_target_for_device(kex_device_get_info(dev), out);
    kex_device_unref(dev);
  } else {
    kex_target_for_name(e->device, out);
  }
}

/*
 * Open a compile instance of the engine's device (wrapped by the fault
 * device when asked).  0, or a negative code with msg[cap] saying why.
 */
static int open_compile_device(kex_engine *e, kex_device **out, char *msg, size_t cap) {
  kex_error oe = {0};
  int rc = open_raw(e, true, out, &oe);
  if (!rc && e->compile_timeout_s > 0 && !kex_device_set_compile_time_limit(*out, e->compile_timeout_s))
    KEX_DEBUG("device %s cannot stop a compile: the compile timeout does not apply to it", e->device);
  if (rc)
    snprintf(msg, cap, "device \"%.40s\" cannot be opened: %.400s", e->device, oe.msg[0] ? oe.msg : kex_strerror(rc));
  return rc;
}

/* The probe, opened at first use (caller holds e->lock).  NULL with *err. */
static kex_device *probe(kex_engine *e, kex_error *err) {
  if (!e->tried) {
    e->tried = true;
    e->open_rc = open_compile_device(e, &e->probe, e->open_msg, sizeof e->open_msg);
  }
  if (!e->probe) kex_err_set(err, e->open_rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", e->open_msg);
  return e->probe;
}

int kex_engine_identity(kex_engine *e, uint64_t dtypes, kex_device_identity *id, kex_error *err) {
  int rc = 0;
  pthread_mutex_lock(&e->lock);
  kex_device *dev = probe(e, err);
  if (!dev) rc = err->code;
  for (int dt = 0; !rc && dt < KEX_DT_COUNT; dt++) /* a dtype the device lacks (CASTs included): refused before any compile */
    if (dtypes >> dt & 1) rc = kex_device_check_dtype(dev, (kex_dtype)dt, err);
  if (!rc) *id = *kex_device_get_identity(dev);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

static void span(kex_prog_req *r, const char *track, const char *name, const char *detail, uint64_t t0) {
  if (r->trace) kex_trace_span(r->trace, track, "compile", name, detail, t0, kex_trace_now_us());
}

/* On a pool thread (or the caller's): the identity and dtypes, then each needed program from SQLite; the rest are misses. */
static void lookup(kex_prog_req *r) {
  kex_engine *e = r->e;
  const kex_rplan *p = r->rp;
  kex_error *err = &r->err;
  uint64_t t0 = r->trace ? kex_trace_now_us() : 0;
  int rc = kex_engine_identity(e, p->dtypes, &r->id, err);
  for (uint32_t k = 0; !rc && k < p->nkernels; k++) {
    const kex_plan_prog *pp = &p->progs[k];
    kex_cache_program hit;
    if (!r->need[k]) continue;
    if (r->cancelled && atomic_load(r->cancelled)) {
      rc = kex_err_set(err, KEX_ECANCELLED, "cancelled");
      break;
    }
    kex_cache *c = kex_cache_conns_lookup(e->conns, "program cache");
    int grc = c ? kex_cache_program_get(c, pp->src, strlen(pp->src), &r->id, &hit, NULL) : KEX_ENOTFOUND;
    if (grc == 0) {
      r->bins[k] = hit.binary;
      r->binlens[k] = hit.binary_len;
      r->from[k] = KEX_PROG_SQLITE;
    } else {
      r->misses[r->nmisses++] = k;
    }
  }
  span(r, "worker", "program cache: SQLite lookup", NULL, t0);
  r->rc = rc;
}

/* Whether the source of hash h failed before (takes e->lock): its error again, or 0. */
static int failed_before(kex_engine *e, uint64_t h, kex_error *err) {
  int rc = 0;
  pthread_mutex_lock(&e->lock);
  for (uint32_t i = 0; i < e->nfailed && !rc; i++)
    if (e->failed[i].hash == h)
      rc = kex_err_set(err, e->failed[i].code, "failed before, not compiled again: %s", e->failed[i].msg);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* Remember (under e->lock) that the source of hash h failed with code and msg; the oldest memory goes first. */
static void remember_failed(kex_engine *e, uint64_t h, int code, const char *msg) {
  pthread_mutex_lock(&e->lock);
  failed_src *f = &e->failed[e->failed_next];
  e->failed_next = (e->failed_next + 1) % KEX_ENGINE_FAILED_MAX;
  if (e->nfailed < KEX_ENGINE_FAILED_MAX) e->nfailed++;
  f->hash = h;
  f->code = code;
  snprintf(f->msg, sizeof f->msg, "%s", msg);
  pthread_mutex_unlock(&e->lock);
}

/*
 * How plan p launches kernel k (its first step's buffers and the local size), for the device's compile to
 * prepare that launch (kex_device_compile_for_launch), stopped when *cancel is set (the request is gone);
 * sizes[KEX_DEVICE_MAX_BUFS] holds the buffers' bytes.
 */
static kex_prewarm_item launch_of(const kex_rplan *p, uint32_t k, const atomic_bool *cancel, size_t *sizes) {
  const kex_plan_prog *pp = &p->progs[k];
  kex_prewarm_item it = {.source = pp->src, .name = pp->name, .local = pp->has_local ? pp->local : NULL,
                         .global = pp->global, .cancel = cancel};
  for (uint32_t s = 0; s < p->nsteps; s++) {
    const kex_plan_step *st = &p->steps[s];
    if (st->kind != KEX_PLAN_STEP_KERNEL || st->kernel != k) continue;
    if (st->nargs > KEX_DEVICE_MAX_BUFS) break; /* refused at the launch anyway: compiled without one */
    for (uint32_t a = 0; a < st->nargs; a++) sizes[a] = st->args[a] < p->nbufs ? p->buf_bytes[st->args[a]] : 0;
    it.nbufs = st->nargs;
    it.buf_sizes = sizes;
    return it;
  }
  it.local = NULL; /* no step launches it: nothing to prepare */
  return it;
}

/*
 * Compile r's kernel k on the slot's instance (sl NULL: the owner's own
 * call, on the probe) and store its binary in SQLite.  0 or a negative code with *err naming the kernel.
 */
static int compile_one(kex_engine *e, slot *sl, kex_prog_req *r, uint32_t k, kex_device **own, kex_error *err) {
  const kex_plan_prog *pp = &r->rp->progs[k];
  char m[KEX_ERROR_MSG_MAX];
  double t0 = now_us();
  kex_device *dev;
  int rc;
  if (r->cancelled && atomic_load(r->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  pthread_mutex_lock(&e->lock); /* the lookup opened the probe before any compile */
  dev = e->probe && (!sl || kex_device_get_info(e->probe)->compile_thread_safe) ? e->probe : NULL;
  pthread_mutex_unlock(&e->lock);
  if (!dev) { /* a device whose compiles must not overlap: the slot's own instance */
    if (!*own && (rc = open_compile_device(e, own, m, sizeof m)) < 0)
      return kex_err_set(err, rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", m);
    dev = *own;
  }
  uint64_t tc = r->trace ? kex_trace_now_us() : 0;
  uint64_t h = kex_hash_bytes(pp->src, strlen(pp->src), 0);
  if ((rc = failed_before(e, h, err)) == 0) {
    size_t sizes[KEX_DEVICE_MAX_BUFS];
    kex_prewarm_item launch = launch_of(r->rp, k, r->cancelled, sizes);
    rc = kex_device_compile_for_launch(dev, &launch, &r->bins[k], &r->binlens[k], err);
    r->compile_us[k] = now_us() - t0; /* charged to the payer whether it built or not (a timeout costs its limit) */
    if (rc == KEX_ECOMPILE || rc == KEX_EDEADLINE) remember_failed(e, h, rc, err->msg);
  }
  if (r->trace) {
    char track[48];
    snprintf(track, sizeof track, "compile slot %u", sl ? (unsigned)(sl - e->slots) : 0u);
    span(r, track, pp->name, rc < 0 ? "failed" : NULL, tc);
  }
  if (rc < 0) {
    snprintf(m, sizeof m, "%s", err->msg);
    return kex_err_set(err, rc, "compiling kernel %u (%s): %s", k, pp->name, m);
  }
  r->from[k] = KEX_PROG_COMPILED;
  kex_cache *c = kex_cache_conns_lookup(e->conns, "program cache");
  if (c) {
    kex_error pe = {0};
    if (kex_cache_program_put(c, pp->src, strlen(pp->src), &r->id, pp->name, r->bins[k], r->binlens[k], &pe) < 0)
      KEX_WARN("program cache: cannot store %s: %s", pp->name, pe.msg);
  }
  return 0;
}

static void slot_work(kex_work *w) {
  slot *sl = w->data;
  double t0 = now_us();
  sl->rc = compile_one(sl->e, sl, sl->r, sl->k, &sl->dev, &sl->err);
  sl->us = now_us() - t0;
}

static void slot_after(kex_work *w, int status);

/* The account of payer `name` (made level with the least charged active payer when new).  NULL: out of memory. */
static kex_payer *payer_get(kex_engine *e, const char *name) {
  double least = -1;
  for (kex_payer *p = e->payers; p; p = p->next) {
    if (strncmp(p->name, name, sizeof p->name - 1) == 0) return p;
    if (least < 0 || p->charged < least) least = p->charged;
  }
  kex_payer *p = kex_calloc(1, sizeof *p);
  if (!p) return NULL;
  snprintf(p->name, sizeof p->name, "%s", name);
  p->charged = least > 0 ? least : 0; /* no credit for the time it was away */
  p->next = e->payers;
  e->payers = p;
  return p;
}

/* A payer with nothing in line and nothing compiling is forgotten (it comes back level, payer_get). */
static void payer_idle(kex_engine *e, kex_payer *p) {
  if (p->compiling || p->waiting) return;
  for (kex_payer **pp = &e->payers; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      kex_free(p);
      return;
    }
}

static void wait_push(kex_engine *e, kex_prog_req *r) {
  r->wait_next = NULL;
  r->waiting = true;
  r->acct->waiting++;
  if (e->wait_tail) e->wait_tail->wait_next = r;
  else e->wait_head = r;
  e->wait_tail = r;
}

static void wait_remove(kex_engine *e, kex_prog_req *r) {
  kex_prog_req **pp = &e->wait_head, *prev = NULL;
  while (*pp && *pp != r) prev = *pp, pp = &(*pp)->wait_next;
  if (!*pp) return;
  *pp = r->wait_next;
  if (e->wait_tail == r) e->wait_tail = prev;
  r->wait_next = NULL;
  r->waiting = false;
  r->acct->waiting--;
}

/* r's program stage is over: done, and its payer forgotten when idle. */
static void req_finish(kex_engine *e, kex_prog_req *r) {
  kex_payer *p = r->acct;
  r->done(r);
  if (p) payer_idle(e, p);
}

/*
 * The request a free slot goes to: the least charged payer's (a payer
 * with a compile in flight only while a fair slot is free), within it the
 * first in line that holds no slot, else its first; NULL: none may start.
 */
static kex_prog_req *pick(kex_engine *e) {
  bool fair_free = e->busy < e->nslots;
  kex_prog_req *best = NULL;
  for (kex_prog_req *t = e->wait_head; t; t = t->wait_next) {
    if (!fair_free && t->acct->compiling) continue;
    if (!best || t->acct->charged < best->acct->charged ||
        (t->acct == best->acct && best->compiling && !t->compiling))
      best = t;
  }
  return best;
}

/*
 * Give the free slots to waiting requests (pick: fair between payers, one
 * kernel each, then the request goes to the back).  A request that failed
 * or whose owner is gone leaves the line and is done once its compiles in
 * flight are back.
 */
static void pump(kex_engine *e) {
  for (kex_prog_req *t = e->wait_head, *next; t; t = next) {
    next = t->wait_next;
    if (t->dead(t) || t->rc < 0) {
      wait_remove(e, t);
      if (!t->compiling) req_finish(e, t);
    }
  }
  while (e->busy < 2 * e->nslots && e->wait_head) {
    kex_prog_req *r = pick(e);
    slot *sl = NULL;
    if (!r) break;
    wait_remove(e, r);
    for (uint32_t i = 0; i < 2 * e->nslots && !sl; i++)
      if (!e->slots[i].r) sl = &e->slots[i];
    if (!sl) break; /* cannot be: busy < 2 x nslots */
    sl->r = r;
    sl->k = r->misses[r->next_miss];
    sl->rc = 0;
    sl->us = 0;
    memset(&sl->err, 0, sizeof sl->err);
    sl->work.fn = slot_work;
    sl->work.after = slot_after;
    sl->work.data = sl;
    /* the compile's state first: an executor may run slot_after before submit returns */
    r->next_miss++;
    r->compiling++;
    r->acct->compiling++;
    r->hold(r); /* the compile's, given back by slot_after */
    e->busy++;
    bool more = r->next_miss < r->nmisses;
    if (more) wait_push(e, r);
    if (e->exec.submit(e->exec.ctx, &sl->work) < 0) {
      sl->r = NULL;
      e->busy--;
      r->compiling--;
      r->acct->compiling--;
      r->next_miss--;
      if (more) wait_remove(e, r);
      r->rc = kex_err_set(&r->err, KEX_EUNAVAILABLE, "the worker pool is not available");
      if (!r->compiling) req_finish(e, r);
      r->release(r); /* may free r */
    }
  }
}

static void slot_after(kex_work *w, int status) {
  slot *sl = w->data;
  kex_engine *e = sl->e;
  kex_prog_req *r = sl->r;
  sl->r = NULL;
  e->busy--;
  r->compiling--;
  r->acct->compiling--;
  r->acct->charged += sl->us / 1e6 / (r->weight ? r->weight : 1);
  if (status < 0 && !sl->rc) sl->rc = kex_err_set(&sl->err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (!sl->rc) e->stats.compiled++;
  else if (!r->rc || (r->rc == KEX_ECANCELLED && sl->rc != KEX_ECANCELLED)) {
    r->rc = sl->rc;
    r->err = sl->err;
  }
  if (!r->compiling && (r->dead(r) || r->rc < 0 || r->next_miss == r->nmisses)) {
    if (r->waiting) wait_remove(e, r);
    req_finish(e, r);
  }
  pump(e);
  r->release(r); /* the compile's: may free r */
}

static void lookup_work(kex_work *w) { lookup(w->data); }

static void lookup_after(kex_work *w, int status) {
  kex_prog_req *r = w->data;
  kex_engine *e = r->e;
  if (status < 0 && !r->rc) r->rc = kex_err_set(&r->err, KEX_EINTERNAL, "the worker pool dropped the job");
  for (uint32_t k = 0; k < r->rp->nkernels; k++)
    if (r->from[k] == KEX_PROG_SQLITE) e->stats.sqlite_hits++;
  if (!r->rc && r->nmisses && r->admit) r->rc = r->admit(r, &r->err);
  if (!r->rc && r->nmisses && !(r->acct = payer_get(e, r->payer ? r->payer : "")))
    r->rc = kex_err_set(&r->err, KEX_ENOMEM, "out of memory");
  if (r->dead(r) || r->rc < 0 || !r->nmisses) {
    req_finish(e, r);
  } else {
    wait_push(e, r);
    pump(e);
  }
  r->release(r); /* the lookup's: may free r */
}

static int req_start(kex_engine *e, kex_prog_req *r) {
  r->e = e;
  r->acct = NULL;
  r->rc = 0;
  r->nmisses = r->next_miss = r->compiling = 0;
  if (!(r->misses = kex_calloc(r->rp->nkernels ? r->rp->nkernels : 1, sizeof *r->misses)))
    return r->rc = kex_err_set(&r->err, KEX_ENOMEM, "out of memory");
  return 0;
}

void kex_engine_programs(kex_engine *e, kex_prog_req *r) {
  if (req_start(e, r) < 0) return r->done(r);
  r->work.fn = lookup_work;
  r->work.after = lookup_after;
  r->work.data = r;
  r->hold(r);
  if (!e->exec.submit || e->exec.submit(e->exec.ctx, &r->work) < 0) {
    r->rc = kex_err_set(&r->err, KEX_EUNAVAILABLE, "the worker pool is not available");
    r->done(r);
    r->release(r);
  }
}

bool kex_engine_programs_cancel(kex_prog_req *r) {
  if (!r->e || !r->waiting || r->compiling) return false;
  wait_remove(r->e, r);
  payer_idle(r->e, r->acct);
  return true;
}

int kex_engine_programs_now(kex_engine *e, kex_prog_req *r) {
  kex_device *own = NULL; /* the probe did not open: compile_one opens one (and fails the same way) */
  if (req_start(e, r) < 0) return r->rc;
  lookup(r);
  for (uint32_t k = 0; k < r->rp->nkernels; k++)
    if (r->from[k] == KEX_PROG_SQLITE) e->stats.sqlite_hits++;
  if (!r->rc && r->nmisses && r->admit) r->rc = r->admit(r, &r->err);
  for (uint32_t i = 0; !r->rc && i < r->nmisses; i++) {
    if ((r->rc = compile_one(e, NULL, r, r->misses[i], &own, &r->err)) == 0) e->stats.compiled++;
  }
  kex_device_unref(own);
  return r->rc;
}

void kex_prog_req_clear(kex_prog_req *r) {
  kex_free(r->misses);
  r->misses = NULL;
}

/*
 * engine.h - the engine of one device: plan -> programs -> run steps -> tune.
 *
 * A kex_engine is made once per device by whoever runs kernels (kexd: one
 * per configured device; `kex run`: one for the device it opened) and owns
 * what every caller of that device shares:
 *
 *   - the device's compile instance (its identity and dtypes, opened at
 *     first use, behind a lock), and one instance per compile slot for a
 *     device whose compiles must not overlap (OpenCL);
 *   - the program stage: a program is loaded (the caller's memory index:
 *     kexd's runner holds loaded programs), else read from the SQLite
 *     program cache by (source, device identity), else compiled and stored
 *     there -- in that order, for every caller;
 *   - the compile slots: `compile_slots` compiles at once, shared fairly
 *     between payers (kex_engine_programs), plus one more for each payer
 *     that has none while every slot is taken (at most `compile_slots`
 *     more), so no payer's first compile waits for another's;
 *   - the compile limit: a compile is stopped past `compile_timeout_s`
 *     (where the device can stop one), and a source that failed to compile
 *     (or timed out) fails again at once, not compiled again;
 *   - the per-worker cache connections (kex_cache_conns, shared by the
 *     engines of one process: one SQLite connection per worker thread).
 *
 * The caller gives the engine two things: the pool its work runs on, as a
 * kex_executor (kexd: libuv's worker pool, results back on the loop thread;
 * in-process tools run the stage directly, kex_engine_programs_now), and
 * the thread that owns the engine's line of waiting requests (the thread
 * that calls kex_engine_programs and receives every `after`).
 *
 * The plan stage is realize/plan.h, the run-steps stage realize/run.h
 * (kex_run_steps: a batch of a plan's steps back to back on the device).
 */
#ifndef KEX_REALIZE_ENGINE_H
#define KEX_REALIZE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/errors.h"
#include "core/trace.h"
#include "devices/device.h"
#include "realize/plan.h"
#include "search/cache.h"

/* ---- the executor: how the caller runs pool work ---- */

typedef struct kex_work kex_work;
/* On a pool thread: the work itself. */
typedef void (*kex_work_fn)(kex_work *w);
/* On the owner's thread once fn returned (status < 0: the pool dropped the work, fn may not have run). */
typedef void (*kex_work_after_fn)(kex_work *w, int status);

#define KEX_WORK_PRIV 192 /* bytes an executor may keep in a work item (kexd: a uv_work_t) */

struct kex_work {
  kex_work_fn fn;
  kex_work_after_fn after;
  void *data;
  bool background; /* a search's work: run after the work queued that is not (kexd: the pool's background lane) */
  union {
    unsigned char bytes[KEX_WORK_PRIV];
    void *align;
    double align_d;
  } priv; /* the executor's */
};

typedef struct kex_executor {
  /* Run w->fn on the pool, then w->after on the owner's thread.  0, or a negative code (after is never called). */
  int (*submit)(void *ctx, kex_work *w);
  void *ctx;
} kex_executor;

/* ---- per-worker cache connections ---- */

#define KEX_CACHE_RETRY_S 5.0 /* a thread whose open failed tries again this long after */

typedef struct kex_cache_conns kex_cache_conns;

/* Connections to the cache file `path` (NULL or "": none).  0 or KEX_ENOMEM. */
int kex_cache_conns_create(const char *path, kex_cache_conns **out);
/* Close every connection (when no thread uses them any more) and free cc.  NULL is a no-op. */
void kex_cache_conns_free(kex_cache_conns *cc);
/* The file ("" when none). */
const char *kex_cache_conns_path(const kex_cache_conns *cc);
/*
 * This thread's connection to the cache file (search/cache.h's policy: one
 * per thread, never shared), opened at its first use and kept until
 * kex_cache_conns_free.  NULL with *err: KEX_EUNAVAILABLE "no cache file",
 * or the open's error ("the beam cache PATH cannot be opened: ...", tried
 * again at the next call).
 */
kex_cache *kex_cache_conns_get(kex_cache_conns *cc, kex_error *err);
/*
 * kex_cache_conns_get for a lookup (plan.h's cache policy): NULL when there
 * is no cache file, or when it cannot be opened -- warned, `what` naming the
 * user ("program cache"), and the caller goes on without; this thread tries
 * the open again at its first use KEX_CACHE_RETRY_S later.
 */
kex_cache *kex_cache_conns_lookup(kex_cache_conns *cc, const char *what);

/* ---- the engine ---- */

typedef struct kex_engine kex_engine;

typedef struct kex_engine_config {
  const char *device;        /* kex_device_open's name (copied) */
  kex_device *instance;      /* an open instance to use as the compile instance (referenced; NULL: open `device`) */
  int fault_kind;            /* -1, or a kex_fault_kind the compile instance fails (tests) ... */
  unsigned long fault_n;     /* ... at its n-th call */
  uint32_t compile_slots;    /* compiles at once (0: 1) */
  kex_cache_conns *conns;    /* the program cache (not owned; NULL: none) */
  kex_executor exec;         /* kex_engine_programs' pool work (submit NULL: kex_engine_programs_now only) */
  double compile_timeout_s;  /* one kernel's compile is stopped (its compiler killed) past this; 0: none */
} kex_engine_config;

/* Make the engine of cfg->device (nothing is opened yet).  0 or KEX_ENOMEM. */
int kex_engine_create(const kex_engine_config *cfg, kex_engine **out);
/* Free e and its device instances (no request may be in flight).  NULL is a no-op. */
void kex_engine_free(kex_engine *e);

/*
 * Any thread: a new instance of the engine's device (the one place kexd
 * opens its devices: the compile instances here, each device runner's, the
 * target's), wrapped by the fault device when the engine was configured
 * with one.  0 or a negative code, *err with kex_device_open's message.
 */
int kex_engine_open_instance(kex_engine *e, kex_device **out, kex_error *err);
/*
 * The device's target (codegen/target.h): its rules and the capabilities
 * an instance reports (opened for it and released), or the static target
 * of its name when it cannot be opened now (a Submit reports the error).
 * Without the fault device: the rules are the real device's.
 */
void kex_engine_target(kex_engine *e, kex_target *out);

/*
 * Any thread: the compile instance's identity into *id, after checking that
 * the device has every dtype of mask `dtypes` (bit d: kex_dtype d).  0, or
 * KEX_EUNAVAILABLE (the device cannot be opened), or the dtype check's
 * error, with *err.
 */
int kex_engine_identity(kex_engine *e, uint64_t dtypes, kex_device_identity *id, kex_error *err);

/* Programs read from SQLite and compiled by this engine since it was made (owner thread). */
typedef struct kex_engine_stats {
  uint64_t sqlite_hits, compiled;
} kex_engine_stats;
kex_engine_stats kex_engine_get_stats(const kex_engine *e);

/* ---- the program stage ---- */

typedef enum kex_prog_from { KEX_PROG_LOADED, KEX_PROG_SQLITE, KEX_PROG_COMPILED } kex_prog_from;

/*
 * One caller's programs of one plan.  The caller fills the first block and
 * the result arrays ([rp->nkernels] each, zeroed), keeps the request alive
 * from kex_engine_programs until `done`, and reads the results then.
 */
typedef struct kex_prog_req kex_prog_req;
struct kex_prog_req {
  /* the caller's */
  const kex_rplan *rp;
  const bool *need;          /* [nkernels]: not loaded: read from SQLite or compile */
  atomic_bool *cancelled;    /* any thread may set it: the work stops between kernels */
  const char *payer;         /* who the compiles are charged to (kexd: the tenant, or the job); NULL: "" */
  uint32_t weight;           /* the payer's share of the compile slots (0: 1) */
  kex_trace *trace;          /* the spans of the lookup and the compiles; NULL: none */
  void *owner;
  bool (*dead)(kex_prog_req *r);    /* the owner's call is gone: no more compiles start */
  void (*hold)(kex_prog_req *r);    /* one more piece of work is out (the owner stays alive) ... */
  void (*release)(kex_prog_req *r); /* ... and is back; may free the owner (called last) */
  void (*done)(kex_prog_req *r);    /* every lookup and compile is back: rc, err and the arrays say how */
  /* the gate on compiling (NULL: none): on the owner thread, once the lookup left r->nmisses > 0 kernels to
     compile and before any starts; 0 lets them all compile, a negative code (with *err) fails r uncompiled */
  int (*admit)(kex_prog_req *r, kex_error *err);
  /* results */
  unsigned char **bins;      /* [nkernels] kex_malloc'd binaries (the caller frees) */
  size_t *binlens;
  double *compile_us;        /* [nkernels] wall microseconds of each compile that ran (failed ones too), else 0 */
  uint8_t *from;             /* [nkernels] kex_prog_from */
  kex_device_identity id;    /* the device's (the SQLite key) */
  int rc;
  kex_error err;
  /* the engine's */
  kex_engine *e;
  struct kex_payer *acct;    /* the payer's account while r is in line or compiling */
  uint32_t *misses, nmisses, next_miss, compiling;
  bool waiting;
  kex_prog_req *wait_next;
  kex_work work;
};

/*
 * Owner thread: start r's program stage on the executor: one pool job
 * reads the SQLite cache for every needed kernel, then, when r->admit lets
 * them, each one still missing is compiled in one of the engine's slots
 * and stored.  Slots are
 * shared by weighted fair queueing between payers (r->payer, r->weight),
 * charged by measured compile seconds: a free slot goes to the waiting
 * request whose payer has been charged least per unit of weight (a payer
 * that comes back after being idle starts level with the least charged
 * one in line, not with credit), preferring within a payer a request that
 * holds no slot, one kernel at a time, and the request goes to the back.
 * While every slot is taken, a payer with no compile in flight gets an
 * extra slot (at most compile_slots of them), so a small first compile
 * never waits behind another payer's long ones.  r->done is called exactly once (on the owner's thread),
 * also when this fails; r->misses is allocated here and freed with
 * kex_prog_req_clear.
 */
void kex_engine_programs(kex_engine *e, kex_prog_req *r);
/*
 * Owner thread: r is cancelled (r->cancelled set).  When it waits for a
 * slot with no compile in flight it leaves the line now and true is
 * returned: `done` will not be called, the caller ends it.  Else false:
 * `done` comes when its work is back.
 */
bool kex_engine_programs_cancel(kex_prog_req *r);
/*
 * The same stage, directly on this thread, which owns the compile instance
 * (in-process tools: every compile on it, one at a time): 0 or r->rc; no
 * callback is used.
 */
int kex_engine_programs_now(kex_engine *e, kex_prog_req *r);
/* Free what the engine allocated in r (not the caller's arrays). */
void kex_prog_req_clear(kex_prog_req *r);

#endif

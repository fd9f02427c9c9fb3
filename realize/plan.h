/*
 * plan.h - the plan builder: the one path from a graph to what runs it.
 *
 * graph + target + an opts policy -> replay (the target's rules) ->
 * schedule -> the buffer tables (which planned buffers a run allocates,
 * which a job's handle provides, which inputs are filled, how each output
 * is read) -> one step per COPY/VIEW/kernel item -> every kernel lowered
 * with the opts the policy chooses (and compiled, when a device is given).
 * `kex run`, `kex plan`, `kex tune`, `kex cache show`, the benchmarks and
 * kexd's Submit and Tune all build here; kex_plan_run (realize/run.h) runs
 * a plan in-process, kexd's Submit runs the same plan through its device
 * runner (daemon/submit.c).  kex_plan_lower_item is the one "lower a kernel
 * with its opts" step outside beam search.
 *
 * The cache policy (one for every caller).  A beam cache file that cannot
 * be opened:
 *   - when the cache only serves a lookup (Submit's program and beam caches,
 *     `kex run --beam`): warn once, naming the file and why, and go on
 *     without a cache (a search's result is then not stored).  A
 *     long-lived process (kexd) tries the open again later rather than
 *     going without for good;
 *   - when the caller asked for results to be kept (Tune, `kex tune`) or
 *     the cache itself is the subject (`kex cache ...`): refuse, with an
 *     error naming the file.
 * kex_plan_cache_open applies it; KEX_PLAN_CACHE_NONE ("" as the path,
 * `--no-cache`) means no cache without a warning.
 *
 * Threads: a plan is built on one thread and is read-only afterwards, so
 * any number of threads may read it (kexd shares one plan between the
 * submissions of the same structure).
 */
#ifndef KEX_REALIZE_PLAN_H
#define KEX_REALIZE_PLAN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen/lower.h"
#include "codegen/target.h"
#include "core/arena.h"
#include "core/errors.h"
#include "devices/device.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "sched/warm.h"
#include "search/beam.h"
#include "search/cache.h"

#define KEX_PLAN_HASH 32      /* bytes of a program's SHA-256 */
#define KEX_PLAN_OPTS_MAX 512 /* bytes of a kernel's applied-opts text, NUL included */

/* ---- the cache policy (see the file comment) ---- */

typedef enum kex_plan_cache_use {
  KEX_PLAN_CACHE_LOOKUP, /* a lookup only: an unopenable file is a warning, the caller goes on without */
  KEX_PLAN_CACHE_KEEP,   /* results must be kept (or the cache is the subject): an unopenable file is an error */
} kex_plan_cache_use;

/*
 * Open the cache file `path` for `use`: NULL is the default file
 * (kex_beam_default_cache_path), "" no cache (*out = NULL, 0, no warning).
 * LOOKUP: 0 always, *out NULL when the file cannot be opened (warned once
 * per call, `what` naming the user: "beam cache", "program cache").  KEEP:
 * 0, or the open's negative code with *err naming the file.
 */
int kex_plan_cache_open(const char *path, kex_plan_cache_use use, const char *what, kex_cache **out, kex_error *err);

/* ---- the opts policy ---- */

typedef enum kex_plan_opts_kind {
  KEX_PLAN_HAND, /* tinygrad's hand-coded opts */
  KEX_PLAN_BEAM, /* each kernel's cached beam opts, else a search now on search_dev (stored in beam.cache) */
  KEX_PLAN_HOOK, /* the caller lowers each kernel (kexd: a search routed through a job's fair queue) */
} kex_plan_opts_kind;

/*
 * A HOOK policy's lowering of schedule item `item` (a kernel) of s, made
 * from g: fills *out and opts[opts_len] as kex_plan_lower_item does, which
 * it must use for the lowering itself.  0 or a negative code with *err.
 */
typedef int (*kex_plan_lower_fn)(void *arg, const kex_graph *g, const kex_schedule *s, uint32_t item,
                                 kex_name_counter *names, kex_program_src *out, char *opts, size_t opts_len,
                                 kex_error *err);

typedef struct kex_plan_policy {
  kex_plan_opts_kind kind;
  /* BEAM: width, limits and progress (kex_beam_opts_init); beam.cache per the cache policy (NULL: none).
     beam.cancelled, when NULL, is wired to `cancel`. */
  kex_beam_opts beam;
  kex_device *search_dev;    /* BEAM: the device candidates are timed on */
  /* HOOK */
  kex_plan_lower_fn lower;
  void *lower_arg;
  /* any kind: set by another thread, the build stops before its next kernel (and a search between candidates) */
  atomic_bool *cancel;
  /* any kind: each kernel's lowering (and search) becomes a span of this trace (core/trace.h); NULL: none */
  struct kex_trace *trace;
} kex_plan_policy;

/* A HAND policy. */
void kex_plan_policy_hand(kex_plan_policy *p);
/* A BEAM policy of width `width` (kex_beam_opts_init) searching on dev with cache (NULL: none). */
void kex_plan_policy_beam(kex_plan_policy *p, int width, kex_device *dev, kex_cache *cache);

/* ---- the plan ---- */

typedef struct kex_plan_prog {
  char name[KEX_PROGRAM_NAME_MAX];
  char *src;                     /* kex_malloc'd */
  uint8_t hash[KEX_PLAN_HASH];   /* SHA-256 of src (kexd's loaded-program key) */
  size_t global[3], local[3];
  bool has_local;
  char opts[KEX_PLAN_OPTS_MAX];  /* the applied opts, short form: "UPCAST(0,4) LOCAL(0,32)" */
  unsigned char *bin;            /* compiled (kex_plan_compile), else NULL */
  size_t binlen;
} kex_plan_prog;

typedef enum kex_plan_step_kind { KEX_PLAN_STEP_KERNEL, KEX_PLAN_STEP_COPY } kex_plan_step_kind;

typedef struct kex_plan_step {
  kex_plan_step_kind kind;
  uint32_t kernel;               /* KERNEL: index among the kernels (and progs) */
  uint32_t nargs;
  uint32_t *args;                /* KERNEL: buffer ids, in the program's argument order */
  uint32_t dst, src;             /* COPY: buffer ids */
  size_t off, size;              /* COPY: bytes from src at off */
} kex_plan_step;

/* A BUFFER node whose contents (inline data, a fill) are copied into buffer `buf` before the steps. */
typedef struct kex_plan_input {
  uint32_t node, buf;
  size_t bytes;
} kex_plan_input;

typedef enum kex_plan_out_kind {
  KEX_PLAN_OUT_DIRECT, /* the buffer itself becomes the output */
  KEX_PLAN_OUT_GATHER, /* a new buffer of the output's view of a base buffer */
  KEX_PLAN_OUT_CONST,  /* folded to a constant: a new buffer filled with it */
  KEX_PLAN_OUT_ALIAS,  /* a job's input buffer itself (e.g. an ASSIGN target): the same handle */
} kex_plan_out_kind;

typedef struct kex_plan_output {
  kex_plan_out_kind kind;
  uint32_t buf;                  /* DIRECT/GATHER/ALIAS: the base buffer id */
  const kex_st *st;              /* GATHER */
  size_t base_bytes;             /* GATHER: bytes of the base buffer */
  kex_const value;               /* CONST */
  kex_dtype dtype;
  uint8_t ndim;
  int64_t shape[KEX_MAX_DIMS];
  size_t nbytes;
} kex_plan_output;

/* A plan ("rplan": libkex has a kex_plan of its own, the Plan RPC's reply). */
typedef struct kex_rplan {
  const kex_graph *g;            /* not owned; the replay points into it */
  kex_target target;
  kex_arena arena;
  kex_replay *r;                 /* kex_plan_schedule */
  kex_schedule *s;
  kex_sched_warm *warm;          /* kex_plan_use_warm: the replay's state, else NULL (a cold replay in arena) */
  size_t warm_limit;
  bool warm_begun;               /* the replay lives in warm until kex_plan_clear */
  /* kex_plan_lower */
  uint32_t nbufs;                /* buffer ids: the replay's */
  size_t *buf_bytes;
  kex_dtype *buf_dtype;
  bool *buf_alloc;               /* a run allocates it (used by an item or held, not a handle) */
  int32_t *buf_handle;           /* graph node whose job buffer provides it, or -1 */
  uint32_t nkernels;             /* == the programs: one per kernel */
  kex_plan_prog *progs;
  uint32_t nsteps;
  kex_plan_step *steps;
  uint32_t ninputs;
  kex_plan_input *inputs;
  uint32_t noutputs;
  kex_plan_output *outputs;
  uint64_t alloc_bytes;          /* what one run allocates */
  uint64_t dtypes;               /* bit d: some node has dtype d */
} kex_rplan;

/* Start a plan of graph g (which must outlive it) for target t. */
void kex_plan_init(kex_rplan *p, const kex_graph *g, const kex_target *t);
/*
 * Replay in warm (a thread's warm state, sched/warm.h) instead of afresh:
 * call before kex_plan_schedule.  The replay, the schedule and every
 * object they point to then live in warm until kex_plan_clear, which ends
 * the replay there (emptying warm when it holds more than limit bytes);
 * so clear the plan before warm's next plan, on warm's thread.  When warm
 * is in use already, the replay is a cold one.  Same results either way.
 */
void kex_plan_use_warm(kex_rplan *p, kex_sched_warm *warm, size_t limit);
/*
 * Replay (the target's rules; device_name: what the graph's "default"
 * device means, NULL for the target's) and schedule.  0 or a negative code
 * with *err.  Safe on any thread (touches only p).
 */
int kex_plan_schedule(kex_rplan *p, const char *device_name, kex_error *err);
/*
 * The tables and every kernel lowered with the policy's opts (schedules
 * first when kex_plan_schedule did not run).  0, or a negative code with
 * *err naming the kernel or the item.
 */
int kex_plan_lower(kex_rplan *p, const kex_plan_policy *pol, kex_error *err);
/* Compile every program on dev (progs[k].bin).  0 or a negative code with *err naming the kernel. */
int kex_plan_compile(kex_rplan *p, kex_device *dev, kex_error *err);
/* Everything above in one call, into a new plan (*out; kex_plan_destroy).  dev NULL: lowered, not compiled. */
int kex_plan_build(const kex_graph *g, const kex_target *t, const kex_plan_policy *pol, kex_device *dev,
                   kex_rplan **out, kex_error *err);
/* Free what p holds (p itself too: kex_plan_destroy, for kex_plan_build's). */
void kex_plan_clear(kex_rplan *p);
void kex_plan_destroy(kex_rplan *p);

/*
 * The schedule item (a kernel) of p (scheduled) whose AST key
 * (codegen/astkey.h) is ast_hex, into *item.  0, or KEX_ENOTFOUND (no such
 * kernel), or the key's error, with *err.
 */
int kex_plan_find_kernel(const kex_rplan *p, const char *ast_hex, uint32_t *item, kex_error *err);

/*
 * Choose the opts of schedule item `item` (a kernel) of s, made from g for
 * target t, by a BEAM policy: the cached result, else a search now.  *res
 * is the search's result.  0 or a negative code with *err (KEX_ECANCELLED).
 */
int kex_plan_choose_opts(const kex_plan_policy *pol, const kex_graph *g, const kex_schedule *s, uint32_t item,
                         const kex_target *t, kex_beam_result *res, kex_error *err);

/*
 * Lower schedule item `item` (a kernel) of s for target t with
 * opts[0, nopts) applied in order, or the hand-coded opts when opts is
 * NULL: the one "lower a kernel with its opts" step of the pipeline (beam
 * search has its own, for candidates).  names may be NULL; the applied
 * opts' text into optstr (may be NULL).  0 or a negative code with *err.
 */
int kex_plan_lower_item(const kex_target *t, const kex_schedule *s, uint32_t item, const kex_opt *opts,
                        uint32_t nopts, kex_name_counter *names, kex_program_src *out, char *optstr,
                        size_t optstr_len, kex_error *err);

#endif

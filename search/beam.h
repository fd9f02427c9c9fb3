/*
 * beam.h - tinygrad 0.9.0's BEAM search (engine/search.py, spec 12) for one
 * kernel of a schedule, with the port's fixes for speed and repeatability,
 * and the beam-result cache (search/cache.h) in front of it.
 *
 * What is tinygrad's, exactly: the 141 actions in order, the real_axis
 * duplicate rule (an action whose amt is the whole real dim is skipped when
 * Opt(op, REAL axis, 0) is also an action), the limits (upcast product <=
 * upcast_max, local product <= local_max, uop count < uops_max), the beam of
 * width N, candidates in (beam entry, action) order, dedup on the compiled
 * binary, timing on a reduced grid (halve the last global dim > 16 until
 * prod(global) <= max_global_size; time x factor) with an early stop at 3x
 * the best time, and a last comparison against the hand-coded opts at full
 * size that keeps the faster.
 *
 * What differs, and why:
 *   - candidates are rendered (lowered) in parallel on a worker pool
 *     (core/pool.h: the caller's, opts->pool, which other searches may
 *     share, else the process's), in its background lane: a queued
 *     foreground job (another call's planning, lookups, compiles) is
 *     taken first, and the searching thread runs a candidate it waits for
 *     itself when no worker took it yet; each worker lowers in its own
 *     replica of the graph's replay (shape contexts are single-threaded;
 *     the search keeps one per worker index), so a work item is only the
 *     item index and the opts list;
 *   - candidates are deduplicated by rendered source before compiling
 *     (saves the compile) and by binary after (tinygrad's seen_libs) where
 *     the device hands out the binary for free (cpu); PoCL makes it by
 *     generating a whole extra work-group function, which cost more than
 *     the compile itself, so OpenCL candidates are built without it
 *     (kex_device_build) and deduplicated by source only;
 *   - the kernel's buffers are allocated once per search and filled with
 *     deterministic random data (tinygrad times never-written buffers:
 *     zero pages on CPU devices rank kernels wrongly, spec 12);
 *   - where the device's compile is thread-safe (cpu: one cc process per
 *     compile) a round's new candidates are compiled on the pool, all at
 *     once, before any of them is timed (compiles never share the cores
 *     with a timed run); elsewhere (OpenCL: PoCL serializes builds within
 *     a process) the round's candidates go to kex_device_build_batch, also
 *     before any timing: a few programs of many kernels each (one
 *     clBuildProgram per group instead of one per candidate), which PoCL's
 *     helper processes pre-build in parallel into its kernel cache when
 *     the cache is on; a candidate that fails to build fails alone;
 *   - screening: each candidate is the median of `timing_runs` runs after
 *     a warm-up, cut short for slow kernels: a warm-up already past the
 *     early stop (3x the best) is the candidate's only run, a warm-up of
 *     2 ms or more counts as a run, and after 3 runs the timing stops once
 *     the runs add up to 0.25 s (before this, timing was 90% of a 1024²
 *     matmul search: 285 of 315 s); search timings also shrink the grid
 *     below tinygrad's 65536 groups (halving the same dims, never below 64
 *     groups) until one run takes about 5 ms.  Screening only chooses which
 *     candidates a round decides between; it never decides;
 *   - decisions (kex's own method, not tinygrad's: tinygrad keeps the
 *     fastest single timing, so two fresh searches pick different kernels
 *     whenever candidates are within the machine's noise).  A search is
 *     repeatable when its decisions are functions of what does not vary
 *     from run to run:
 *       * the set: every timed candidate of the round when they are cheap
 *         to time (µs-scale kernels, whose screening is least reliable),
 *         else the 2N+1 fastest by screening, every candidate screened
 *         within 2x of the N-th fastest (screening must not drop what a
 *         paired decision would keep: a load burst can slow all of one
 *         candidate's few screening runs), then the next ones while the
 *         decision's minimum rounds stay within 0.1 s; the current best
 *         joins it;
 *       * paired, interleaved timing: one run of each member per paired
 *         round (forward, then backward), on the same buffers after a
 *         warm-up, so that load changes hit every member alike; member 0
 *         runs twice per round (a twin), and the median |ratio - 1| of the
 *         twin's pairs is the measured noise (the spread, recorded).  The
 *         rounds grow (9 or retime_runs, doubling, at most 2048) until
 *         every pair is decided and the runs span 0.1 s (or the whole
 *         budget, when less: load comes in bursts), at most until the runs
 *         add up to the decision's budget: what the round's screening runs
 *         took (the last round's, for the final comparison), at least
 *         0.1 s, at most 0.5 s (1 s for the final comparison).  More noise
 *         buys more samples, never a wider band; ms-scale kernels, whose
 *         screening is reliable, stop at their minimum rounds;
 *       * a pair is compared by the median of its per-round ratios: one is
 *         faster only when the median lies beyond 1 +- theta, else they
 *         tie; the sign test's interval for it (99%, Bonferroni over the
 *         decision's pairs) only says when more rounds would change
 *         nothing (the decision stops growing once every interval is
 *         wholly inside or outside the band).  An unsettled pair is judged
 *         by its median, not called a tie: under load (PoCL's twin spread
 *         0.3-0.7) nearly every pair was unsettled, and the tie rule alone
 *         picked kernels 1.5-1.8x slower than the round's fastest.  theta is
 *         tie_tolerance (25%) for decisions whose fastest run is up to
 *         100 µs, 5% from 2 ms on, log-linear between: a function of the
 *         run's length (which moves little between searches), because the
 *         drift pairing cannot see is (µs runs in the caches: 10-40%;
 *         ms runs: a few per cent; a flat 25% stopped ms-scale searches
 *         at the first round that gained less).  It does not follow the
 *         noise a decision measures: that measurement itself varied 10x
 *         between two searches of one kernel (0.005 .. 0.08), and a
 *         threshold derived from it (16 x noise, 8% .. 50%) flipped picks
 *         (a 34% faster sum kernel was a tie in one search, a win in the
 *         other); 25% covers the drift pairing cannot see (the same pair's
 *         median ratio moved 8% between two searches, more for µs-scale
 *         memory-bound kernels) while a kernel 34% faster stays separated;
 *       * dominance instead of "the fastest": a member is dominated when
 *         any other member is faster than it (as above); the tie group is
 *         the members nobody dominates, so which of two near-equal leaders
 *         happened to measure fastest changes nothing;
 *       * the tie rule, in which no timing enters: more uops first, then
 *         fewer opts, then the smaller opts text.  More uops (more work
 *         upcast and unrolled per thread) is the fast end of a tie group in
 *         the measurements;
 *       * pruning: N times, the tie rule's first of the round's members
 *         not taken and not dominated by another (the current best counts
 *         as a dominator, never as a pick) joins the next beam.  The round
 *         makes progress when the current best is dominated; when it is
 *         not, the search keeps what it has (a tie never moves the beam:
 *         moving on ties, as beamrep2 did, walked the beam tie after tie
 *         to the most upcast kernels, each step up to the threshold
 *         slower), the search ends and the first pick is the runner-up;
 *       * the final comparison, at full size, paired: hand-coded, the
 *         beam's best and the runner-up, in that order of preference, no
 *         timing in the order (hysteresis): hand-coded unless another of
 *         the three is faster than it beyond the threshold, then the
 *         beam's best unless it is beaten too, then the runner-up.  So a
 *         searched kernel replaces hand-coded only when it measured faster
 *         beyond the threshold (with the beam's best first, a "tie" up to
 *         25% slower than hand-coded was kept, and re-timed it failed
 *         test_beam's not-slower check under ASan).  The result
 *         (and the cache row: decision_samples, decision_spread,
 *         decision_tie) records the final comparison's paired rounds, its
 *         measured noise and whether more than one kernel was in its tie
 *         group.
 *     What remains: a pair whose median ratio sits at the threshold
 *     (within the drift between two searches) can fall on either side;
 *     for µs-scale kernels on a shared machine that drift is 10-40%
 *     (bench/results/beam-repeatable.md), so a progress decision near the
 *     edge ends one search a round earlier than the other;
 *   - a candidate that fails to lower or compile is skipped and counted
 *     (tinygrad 0.9.0 aborts the whole search on a CompileError);
 *   - compile time is measured; a compile longer than compile_timeout_s is
 *     counted and its candidate skipped (a compile cannot be interrupted
 *     from outside the driver);
 *   - at most `max_candidates` candidates are compiled per round (after
 *     source dedup), shared equally between the beam entries, each entry's
 *     share taken in action order; 0 means no cap (tinygrad).
 *
 * Threads: the search runs on the calling thread; device work (alloc, copy,
 * compile, load, launch, free) goes through opts->exec, which must run the
 * job on the thread that owns the device and return its result (the daemon
 * routes it to its device runner; NULL runs it directly).  The pool threads
 * never touch the device.
 *
 * Errors: 0 or a negative KEX_E* code with *err naming what failed.  A
 * failing candidate is never an error; a failing hand-coded kernel, buffer
 * allocation or cache I/O error is.  A cache entry that fails to decode, or
 * whose opts do not apply, exceed the search limits, fail to lower or do not
 * fit the device, is deleted from the cache (counted, logged with its key),
 * reported in res->cache_note, and the kernel searched as on a miss.
 */
#ifndef KEX_SEARCH_BEAM_H
#define KEX_SEARCH_BEAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "devices/device.h"
#include "sched/graph.h"
#include "sched/schedule.h"
#include "search/cache.h"
#include "core/pool.h"
#include "codegen/kernel.h"
#include "codegen/target.h"

/* Bumped whenever kernel.c/heuristic.c/lower.c/uops.c/render.c change the code an opts list produces. */
#define KEX_CODEGEN_VERSION "kex.codegen.v3" /* v2: the C dialect walks a reduction kernel's tiles column-block-major; v3: and writes a tile's stores in address order */
#define KEX_BEAM_NACTIONS 141
#define KEX_BEAM_MAX_WIDTH 64
#define KEX_BEAM_MAX_RUNS 1000

/* The action list, tinygrad's order (index i is action id i+1). */
const kex_opt *kex_beam_actions(void);

/* A piece of device work: run it on the thread that owns dev. */
typedef int (*kex_beam_device_job)(kex_device *dev, void *arg, kex_error *err);
/* Run job(dev, arg, err) on the device's thread and return its result. */
typedef int (*kex_beam_exec_fn)(void *ctx, kex_device *dev, kex_beam_device_job job, void *arg, kex_error *err);

typedef struct kex_beam_progress {
  const char *phase;   /* "hand", "search", "compare", "done", "cache" */
  uint32_t round;      /* 1-based */
  uint32_t round_candidates, compiled, timed;
  double best_us;      /* best (reduced-grid, extrapolated) time so far; INFINITY before any */
} kex_beam_progress;
typedef void (*kex_beam_progress_fn)(const kex_beam_progress *p, void *arg);

struct kex_beam_opts;
/*
 * A shared cache behind opts->cache (kexd's fleet cache, daemon/fleet.h).
 * Both calls run on the search's thread, with the search's opts (its cache
 * handle and cancel flag).  fetch is called on a local miss: 0 when it
 * stored a validated entry for key into o->cache (the search then looks the
 * cache up again and checks the entry like any other), anything else when
 * the search should run (the remote may now hold a claim on key that done
 * releases).  done is called once after every fetch that did not return 0,
 * when the search ended: stored is true when its result is in o->cache
 * under key (to be shared).  Neither may fail the search.
 */
typedef struct kex_beam_remote {
  int (*fetch)(void *arg, const struct kex_beam_opts *o, const kex_cache_beam_key *key);
  /* after a fetch that returned 0: whether the entry it stored was usable (else it was dropped and the search runs,
     then `done` as for a miss) */
  void (*checked)(void *arg, const struct kex_beam_opts *o, const kex_cache_beam_key *key, bool usable);
  void (*done)(void *arg, const struct kex_beam_opts *o, const kex_cache_beam_key *key, bool stored);
  void *arg;
} kex_beam_remote;

typedef struct kex_beam_opts {
  int width;                 /* beam width N (>= 1) */
  int upcast_max, local_max, uops_max;
  double min_progress_us;
  double tie_tolerance;      /* the tie threshold of µs-scale runs, relative, 0.25: a kernel is faster than another only
                                beyond it (longer runs: down to 5%, search/beam.c decision_theta) */
  int timing_runs;           /* per candidate, median, after one warm-up */
  int retime_runs;           /* paired rounds a decision runs at least (9 when less) */
  int max_candidates;        /* compiled per round; 0 = no cap */
  int max_rounds;            /* 0 = until no progress */
  double compile_timeout_s;
  int64_t max_global_size;   /* reduced-grid timing limit */
  kex_pool *pool;            /* the render/compile workers, shared with other searches; NULL: the process's pool */
  kex_beam_exec_fn exec;     /* NULL = run device jobs directly */
  void *exec_ctx;
  kex_beam_progress_fn progress;
  void *progress_arg;
  kex_cache *cache;          /* NULL = no cache */
  const char *tenant;        /* stored with a new result (the cache's tenant column: kexd's caller); NULL = none */
  const kex_beam_remote *remote; /* asked on a cache miss, told when the search ends; NULL = none (needs cache) */
  /* Checked between candidates (and before the buffers and the final comparison): true stops the
     search, which frees what it holds and returns KEX_ECANCELLED.  NULL = never.  Any thread. */
  bool (*cancelled)(void *arg);
  void *cancel_arg;
} kex_beam_opts;

/* Defaults: width, 256, 1024, 3000, 0.01 us, 25%, 5 runs, 9 paired rounds at least, 96 per round, 10 s, 65536. */
void kex_beam_opts_init(kex_beam_opts *o, int width);
/* The cache's search options string ("beam=2;upcast_max=256;local_max=1024;uops_max=3000;cap=96"). */
int kex_beam_search_opts_string(const kex_beam_opts *o, char *buf, size_t len);
/*
 * The beam cache key of a kernel (the one place it is made): its AST key
 * ast_key[KEX_AST_KEY_BYTES], device identity id, o's search options
 * string (written into sopts[len], which the key points to, like id) and
 * the codegen version.  0, or the options string's error.
 */
int kex_beam_cache_key(const kex_beam_opts *o, const uint8_t *ast_key, const kex_device_identity *id, char *sopts,
                       size_t len, kex_cache_beam_key *key);
/* The default cache file: $KEX_CACHE, else $XDG_CACHE_HOME/kex/cache.db, else ~/.cache/kex/cache.db.  KEX_ELIMIT/KEX_ENOTFOUND. */
int kex_beam_default_cache_path(char *buf, size_t len, kex_error *err);

typedef struct kex_beam_result {
  char name[KEX_CACHE_KERNEL_NAME_MAX]; /* kernel name with the chosen opts */
  char ast_hex[KEX_AST_KEY_HEX];
  uint32_t nopts;
  kex_opt opts[KEX_CACHE_MAX_OPTS];     /* the chosen opts (applied to a fresh kernel) */
  double best_us, hand_us;              /* full-size times (medians of the paired comparison runs) of the chosen and the hand-coded kernel */
  double search_s;                      /* wall time of this call */
  double beam_us;                       /* the beam's best, reduced-grid extrapolated */
  double factor;                        /* the reduced-grid factor the beam's best was timed with */
  bool from_cache, hand_won;
  bool runner_up_won;                   /* the last round's first pick (tied with the best) won the final comparison */
  uint32_t rounds, compiled, timed;
  uint32_t lower_failed, compile_failed, compile_timeouts, dup_source, dup_binary, over_uops, capped;
  double compile_s;                     /* total compile time */
  double time_s, lower_wait_s;          /* total timing-run time, time waiting for lowered candidates */
  double first_launch_s;                /* of time_s: the screening warm-ups (PoCL generates machine code there) */
  double decide_s;                      /* of time_s: the paired decisions (the final comparison's included) */
  double tie_used;                      /* the largest tie threshold the decisions used (tie_tolerance for µs-scale runs) */
  uint32_t decision_samples;            /* paired rounds of the final (full-size) comparison */
  double decision_spread;               /* its measured noise: median |ratio - 1| of the beam kernel's runs against its twin's */
  bool decision_tie;                    /* the final comparison's tie group had more than one kernel: the preference order chose */
  bool serial_timing;                   /* a short kernel on a device with serial timing: every run was timed that way */
  uint32_t rerolls;                     /* decisions run again because they ran disturbed (beam.c: run_decision) */
  uint32_t disturbed;                   /* decisions that still ran disturbed after KEX_BEAM_REROLLS tries */
  char cache_note[KEX_ERROR_MSG_MAX];   /* a cache entry that was dropped as unusable, else "" */
} kex_beam_result;

/* The kernel to optimize: schedule item `item` of s, which was made from graph g with target's replay rules. */
typedef struct kex_beam_target {
  const kex_graph *graph;
  const kex_schedule *schedule;
  uint32_t item;
  const kex_target *target; /* the device as codegen sees it (codegen/target.h) */
} kex_beam_target;

/*
 * Choose opts for the target on dev: the cached result when opts->cache
 * has a valid one for (AST key, device identity, search options, codegen
 * version), else a search whose result is then stored.  *res is filled.
 */
int kex_beam_optimize(const kex_beam_target *t, kex_device *dev, const kex_beam_opts *opts, kex_beam_result *res,
                      kex_error *err);


#endif

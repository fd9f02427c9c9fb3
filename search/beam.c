/*
 * beam.c - BEAM search over one kernel (beam.h explains what is tinygrad's
 * and what is not).  One search:
 *
 *   cache lookup (the cached opts checked against the kernel, the limits
 *   and the device; an unusable entry is dropped and counts as a miss) ->
 *   (miss) the kernel's buffers,
 *   filled with random data -> the hand-coded kernel compiled and timed ->
 *   the pool (the caller's, or the process's) + per-worker replicas ->
 *   rounds: actions of every beam entry (apply_opt on copies, limits) ->
 *   lowered on the pool -> in order: uop limit, source dedup, compile (timed),
 *   binary dedup, load, reduced-grid screening -> the round decided by
 *   paired timing and the tie rule -> progress or stop -> beam best (and
 *   runner-up) vs hand-coded at full size, paired -> cache put.
 *
 * The calling thread owns the kernel's main shape context (the schedule's);
 * workers own their replicas.  Every device call goes through dev_exec.
 */
#include "search/beam.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/hash.h"
#include "core/log.h"
#include "codegen/astkey.h"
#include "codegen/lower.h"
#include "core/pool.h"
#include "sched/lazy.h"

/* ---- actions ---- */

static kex_opt actions[KEX_BEAM_NACTIONS];

static void init_actions(void) {
  static const int up[] = {0, 2, 3, 4, 5, 7}, unr[] = {0, 4, 7}, loc[] = {2, 3, 4, 8, 13, 16, 29},
                   gt[] = {13, 16, 28, 29, 32, 49, 64, 256}, gr[] = {0, 4, 8, 16};
  int n = 0;
  for (int a = 0; a < 6; a++)
    for (int x = 0; x < 6; x++) actions[n++] = kex_opt_make(KEX_OPT_UPCAST, x, up[a]);
  for (int a = 0; a < 3; a++)
    for (int x = 0; x < 5; x++) actions[n++] = kex_opt_make(KEX_OPT_UNROLL, x, unr[a]);
  for (int a = 0; a < 7; a++)
    for (int x = 0; x < 5; x++) actions[n++] = kex_opt_make(KEX_OPT_LOCAL, x, loc[a]);
  for (int a = 0; a < 8; a++)
    for (int x = 0; x < 3; x++) actions[n++] = kex_opt_make(KEX_OPT_GROUPTOP, x, gt[a]);
  for (int a = 0; a < 4; a++)
    for (int x = 0; x < 3; x++) actions[n++] = kex_opt_make(KEX_OPT_GROUP, x, gr[a]);
  for (int x = 0; x < 7; x++) actions[n++] = kex_opt_make(KEX_OPT_PADTO, x, 32);
  actions[n++] = kex_opt_make(KEX_OPT_LOCAL, 0, 32);
  actions[n++] = kex_opt_make(KEX_OPT_UPCASTMID, 1, 4);
  actions[n++] = kex_opt_make(KEX_OPT_TC, 0, 0);
  for (int x = 0; x < 9; x++) actions[n++] = kex_opt_make(KEX_OPT_TC, x, 2);
}

const kex_opt *kex_beam_actions(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_actions);
  return actions;
}

static bool action_exists(kex_optop op, int axis, int amt) {
  const kex_opt *a = kex_beam_actions();
  for (int i = 0; i < KEX_BEAM_NACTIONS; i++)
    if (a[i].op == op && a[i].axis == axis && a[i].amt == amt) return true;
  return false;
}

static int real_axis(const kex_kernel *k, kex_opt o) {
  if (o.axis == KEX_OPT_NONE) return -1;
  if (o.op == KEX_OPT_UNROLL) return kex_kernel_first_reduce(k) + o.axis;
  if (o.op == KEX_OPT_GROUP || o.op == KEX_OPT_GROUPTOP)
    return kex_kernel_first_reduce(k) + k->group_for_reduces + o.axis;
  return o.axis;
}

/* ---- options ---- */

void kex_beam_opts_init(kex_beam_opts *o, int width) {
  memset(o, 0, sizeof *o);
  o->width = width;
  o->upcast_max = 256;
  o->local_max = 1024;
  o->uops_max = 3000;
  o->min_progress_us = 0.01;
  o->tie_tolerance = 0.25;
  o->timing_runs = 5;
  o->retime_runs = 9;
  o->max_candidates = 96;
  o->compile_timeout_s = 10.0;
  o->max_global_size = 65536;
}

int kex_beam_search_opts_string(const kex_beam_opts *o, char *buf, size_t len) {
  int n = snprintf(buf, len, "beam=%d;upcast_max=%d;local_max=%d;uops_max=%d;cap=%d;rounds=%d", o->width,
                   o->upcast_max, o->local_max, o->uops_max, o->max_candidates, o->max_rounds);
  return n < 0 || (size_t)n >= len ? KEX_ELIMIT : 0;
}

int kex_beam_cache_key(const kex_beam_opts *o, const uint8_t *ast_key, const kex_device_identity *id, char *sopts,
                       size_t len, kex_cache_beam_key *key) {
  int rc = kex_beam_search_opts_string(o, sopts, len);
  memset(key, 0, sizeof *key);
  memcpy(key->ast_key, ast_key, sizeof key->ast_key);
  key->device = id;
  key->search_opts = sopts;
  key->codegen_version = KEX_CODEGEN_VERSION;
  return rc;
}

int kex_beam_default_cache_path(char *buf, size_t len, kex_error *err) {
  const char *env = getenv("KEX_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  int n;
  if (env && *env)
    n = snprintf(buf, len, "%s", env);
  else if (xdg && *xdg)
    n = snprintf(buf, len, "%s/kex/cache.db", xdg);
  else if (home && *home)
    n = snprintf(buf, len, "%s/.cache/kex/cache.db", home);
  else
    return kex_err_set(err, KEX_ENOTFOUND, "no cache path: KEX_CACHE, XDG_CACHE_HOME and HOME are unset");
  if (n < 0 || (size_t)n >= len) return kex_err_set(err, KEX_ELIMIT, "cache path longer than %zu bytes", len - 1);
  return 0;
}


/* ---- device jobs ---- */

static int exec_direct(void *ctx, kex_device *dev, kex_beam_device_job job, void *arg, kex_error *err) {
  (void)ctx;
  return job(dev, arg, err);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct search_bufs {
  uint32_t n;
  size_t bytes[KEX_DEVICE_MAX_BUFS];
  kex_dtype dtype[KEX_DEVICE_MAX_BUFS];
  kex_buffer *buf[KEX_DEVICE_MAX_BUFS];
} search_bufs;

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Deterministic random contents: floats in [0, 1), ints in [0, 100), bools 0/1. */
static void fill_random(kex_dtype dt, void *out, size_t bytes, uint64_t seed) {
  size_t item = (size_t)kex_dtype_size(dt), n = item ? bytes / item : 0;
  unsigned char *p = out;
  for (size_t i = 0; i < n; i++, p += item) {
    uint64_t r = splitmix(&seed);
    double u = (double)(r >> 11) / 9007199254740992.0;
    switch (dt) {
    case KEX_DT_FLOAT32: { float f = (float)u; memcpy(p, &f, 4); break; }
    case KEX_DT_FLOAT64: memcpy(p, &u, 8); break;
    case KEX_DT_FLOAT16: { _Float16 h = (_Float16)u; memcpy(p, &h, 2); break; }
    case KEX_DT_BFLOAT16: { float f = (float)u; uint32_t b; memcpy(&b, &f, 4); uint16_t h = (uint16_t)(b >> 16); memcpy(p, &h, 2); break; }
    case KEX_DT_BOOL: *p = (unsigned char)(r & 1); break;
    default: {
      uint64_t v = r % 100;
      memcpy(p, &v, item < 8 ? item : 8); /* little-endian: the low bytes */
      break;
    }
    }
  }
}

static int job_alloc(kex_device *dev, void *arg, kex_error *err) {
  search_bufs *b = arg;
  for (uint32_t i = 0; i < b->n; i++) {
    int rc = kex_device_alloc(dev, b->bytes[i], &b->buf[i], err);
    if (rc) return rc;
    void *host = kex_malloc(b->bytes[i]);
    if (!host) return kex_err_set(err, KEX_ENOMEM, "out of memory filling search buffer %u", i);
    fill_random(b->dtype[i], host, b->bytes[i], 0x6b6578ull + i);
    rc = kex_buffer_copy_in(b->buf[i], 0, host, b->bytes[i], err);
    kex_free(host);
    if (rc) return rc;
  }
  return 0;
}

static int job_free_bufs(kex_device *dev, void *arg, kex_error *err) {
  (void)dev;
  (void)err;
  search_bufs *b = arg;
  for (uint32_t i = 0; i < b->n; i++) kex_buffer_free(b->buf[i]);
  return 0;
}

/* Compile + load in one step (kex_device_build: no binary where it costs extra, e.g. PoCL). */
typedef struct compile_job {
  const kex_program_src *ps;
  bool want_bin;
  kex_program *prog;
  unsigned char *bin; /* the binary when it came for free (and want_bin), else NULL */
  size_t binsz;
  double seconds;
} compile_job;

static int job_compile(kex_device *dev, void *arg, kex_error *err) {
  compile_job *c = arg;
  double t0 = now_s();
  int rc = kex_device_build(dev, c->ps->src, c->ps->name, &c->prog, c->want_bin ? &c->bin : NULL, &c->binsz, err);
  c->seconds = now_s() - t0;
  return rc;
}

typedef struct load_job {
  const unsigned char *bin;
  size_t binsz;
  const char *name;
  kex_program *prog;
} load_job;

static int job_load(kex_device *dev, void *arg, kex_error *err) {
  load_job *l = arg;
  return kex_device_load(dev, l->bin, l->binsz, l->name, &l->prog, err);
}

static int job_free_prog(kex_device *dev, void *arg, kex_error *err) {
  (void)dev;
  (void)err;
  kex_program_free(arg);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct time_job {
  kex_program *prog;
  kex_device *serial; /* the device, when runs are timed serially (kex_device_set_serial_timing); else NULL */
  size_t global[3];
  const size_t *local;
  kex_buffer *args[KEX_DEVICE_MAX_BUFS];
  int nargs;
  int runs;
  double factor;
  double early_stop_us; /* INFINITY: none */
  double shrink_to_s;   /* > 0: shrink the grid after the warm-up until a run takes about this long (search timing) */
  double us;            /* median x factor */
  double warmup_s;      /* wall time of the warm-up launch (job_time) */
} time_job;

/*
 * One warm-up launch, then up to `runs` timed launches; median x
 * factor.  What keeps slow candidates cheap (a 1024² matmul candidate runs
 * 50-500 ms at full size, and tinygrad's 3 runs cost the same):
 *   - a warm-up already past early_stop ends the timing with the warm-up's
 *     time (the candidate cannot lead; tinygrad stops at its first run too);
 *   - a warm-up of KEX_BEAM_LONG_RUN_S or more counts as a sample (caches
 *     are a small part of such a run);
 *   - after KEX_BEAM_MIN_RUNS samples, stop once the samples add up to
 *     KEX_BEAM_TIME_BUDGET_S;
 *   - a timed run past early_stop ends it (tinygrad's rule).
 */
#define KEX_BEAM_LONG_RUN_S 0.002
#define KEX_BEAM_MIN_RUNS 3
#define KEX_BEAM_TIME_BUDGET_S 0.25
#define KEX_BEAM_COMPARE_BUDGET_S 1.0
#define KEX_BEAM_MIN_GROUPS 64 /* a grid shrunk for timing keeps at least this many work-groups (cpu: items) */

/*
 * With shrink_to_s > 0: halve the grid the way fill_time_job does (the last
 * dim > 16 first; factor x old/new) while a run of about `secs` would last longer
 * than shrink_to_s and at least KEX_BEAM_MIN_GROUPS remain.  Returns whether
 * the grid changed.
 */
static bool shrink_grid(time_job *t, double secs) {
  bool changed = false;
  if (t->shrink_to_s <= 0) return false;
  while (secs > t->shrink_to_s) {
    int64_t prod = (int64_t)t->global[0] * (int64_t)t->global[1] * (int64_t)t->global[2];
    if (prod / 2 < KEX_BEAM_MIN_GROUPS) break;
    int j = 2;
    while (j >= 0 && t->global[j] <= 16) j--;
    if (j < 0) break;
    size_t before = t->global[j];
    t->global[j] /= 2;
    t->factor *= (double)before / (double)t->global[j]; /* exact for odd sizes (tinygrad's x2 is not) */
    secs *= (double)t->global[j] / (double)before;
    changed = true;
  }
  return changed;
}

/* One launch of t's program on t's grid; its device time in *secs. */
static int launch_once(const time_job *t, double *secs, kex_error *err) {
  kex_event *ev = NULL;
  *secs = 0;
  if (t->serial) kex_device_set_serial_timing(t->serial, true); /* on and off around the launch: the device is shared */
  int rc = kex_program_launch(t->prog, t->global, t->local, t->args, t->nargs, NULL, 0, &ev, err);
  if (!rc) rc = kex_event_elapsed(ev, secs, err);
  if (t->serial) kex_device_set_serial_timing(t->serial, false);
  kex_event_free(ev);
  return rc;
}

/* One launch of a time_job (arg); its seconds in t->us. */
static int job_launch_once(kex_device *dev, void *arg, kex_error *err) {
  (void)dev;
  time_job *t = arg;
  return launch_once(t, &t->us, err);
}

/* *(bool *)arg: whether dev has serial timing (left off). */
static int job_serial_supported(kex_device *dev, void *arg, kex_error *err) {
  (void)err;
  *(bool *)arg = kex_device_set_serial_timing(dev, false);
  return 0;
}

static int job_time(kex_device *dev, void *arg, kex_error *err) {
  (void)dev;
  time_job *t = arg;
  double samples[KEX_BEAM_MAX_RUNS + 1], total = 0;
  int n = 0, rc = 0;
  for (int i = -1; i < t->runs && !rc; i++) {
    double secs = 0, w0 = now_s();
    if ((rc = launch_once(t, &secs, err))) continue;
    if (i < 0) t->warmup_s = now_s() - w0; /* PoCL: the kernel's machine code is generated here */
    double us = secs * 1e6 * t->factor;
    if (i < 0) {
      if (us > t->early_stop_us) continue; /* one timed run must confirm it (a preempted warm-up is common) */
      if (shrink_grid(t, secs)) continue; /* the timed runs use the smaller grid */
      if (secs < KEX_BEAM_LONG_RUN_S) continue;
    }
    samples[n++] = us;
    total += secs;
    if (us > t->early_stop_us) break;
    if (n >= KEX_BEAM_MIN_RUNS && total >= KEX_BEAM_TIME_BUDGET_S) break;
  }
  if (rc) return rc;
  qsort(samples, (size_t)n, sizeof *samples, cmp_double);
  t->us = samples[n / 2];
  return 0;
}

/*
 * Search timings (reduced grid) shrink the grid further until one run
 * takes about this long: tinygrad's 65536-group limit leaves a 1024²
 * matmul at full size, 50-500 ms a run.
 */
#define KEX_BEAM_RUN_TARGET_S 0.005

/* ---- paired, interleaved timing: the decisions ---- */

/*
 * A decision times its members interleaved, one run each per paired round
 * (forward, then backward, so no member always follows the same one), on
 * the search's buffers after one warm-up launch each; member n-1 is a twin
 * of member 0 (the same program again): the spread of their per-round
 * ratios is the measured noise.  Rounds grow from the minimum, doubling,
 * until every pair is decided, KEX_BEAM_PAIR_MAX rounds were run, or the
 * runs add up to the decision's budget.  The minimum is KEX_BEAM_PAIR_MIN
 * rounds, or as many as the budget allows at what the first
 * KEX_BEAM_PAIR_FLOOR cost, never fewer than those; and when every
 * member's warm-up run is long (KEX_BEAM_LONG_RUN_S), the warm-up pass is
 * the first round.  So µs-scale decisions are unchanged and a decision
 * between 150 ms runs (cpu matmul 1024², whose grid cannot shrink below
 * KEX_BEAM_MIN_GROUPS rows) no longer spends 15x its budget.
 */
#define KEX_BEAM_PAIR_MAX 2048     /* paired rounds of one decision */
#define KEX_BEAM_SET_MAX 24        /* members of one decision, the twin and the current best included */
#define KEX_BEAM_PAIR_MIN 9        /* paired rounds at least (the sign test needs 6 for any interval at 95%) ... */
#define KEX_BEAM_PAIR_FLOOR 1      /* ... or what the budget allows, this many at least (long runs: the warm-up pass) */
#define KEX_BEAM_ROUND_BUDGET_S 0.5 /* a decision stops growing once its runs add up to this at most */
#define KEX_BEAM_BUDGET_SCALE 1.0  /* ... or to this x the round's screening time, when more than the floor below */
#define KEX_BEAM_SET_COST_S 0.1    /* beyond the 2N+1 fastest, candidates join a decision while its minimum rounds cost this */
#define KEX_BEAM_ALPHA 0.01        /* the medians' intervals cover at least 1 - KEX_BEAM_ALPHA */
#define KEX_BEAM_DECIDE_MIN_S 0.1  /* a decision's budget at least; its runs span this much (or the whole budget) before
                                      it may stop early */

typedef struct paired {
  int n;                      /* members, the twin (last) included */
  time_job t[KEX_BEAM_SET_MAX];
  int rounds, target;         /* rounds done; job_paired runs up to target */
  double spent_s;             /* device time of the timed runs */
  double us[KEX_BEAM_SET_MAX][KEX_BEAM_PAIR_MAX]; /* x factor */
  double scratch[KEX_BEAM_PAIR_MAX];
  double alpha;               /* one pair's share of KEX_BEAM_ALPHA (run_paired) */
  int rank_n, rank_a;         /* sign_rank(rank_n, alpha), kept */
  double slow[KEX_BEAM_SET_MAX]; /* log of the factor a member ran slower than its remembered time, when the
                                    decision stayed disturbed (run_decision); 0 else.  Taken out of its times. */
} paired;

static int job_paired(kex_device *dev, void *arg, kex_error *err) {
  (void)dev;
  paired *p = arg;
  double secs;
  int rc = 0;
  if (p->rounds == 0) { /* warm-up; when every run is long, the first round (forward, as round 0 runs) */
    double warm_s = 0;
    bool long_runs = true;
    for (int i = 0; i < p->n && !rc; i++) {
      rc = launch_once(&p->t[i], &secs, err);
      p->us[i][0] = secs * 1e6 * p->t[i].factor;
      warm_s += secs;
      long_runs = long_runs && secs >= KEX_BEAM_LONG_RUN_S;
    }
    if (!rc && long_runs) {
      p->rounds = 1;
      p->spent_s += warm_s;
    }
  }
  for (int r = p->rounds; r < p->target && !rc; r++) {
    for (int j = 0; j < p->n && !rc; j++) {
      int i = r & 1 ? p->n - 1 - j : j;
      if ((rc = launch_once(&p->t[i], &secs, err))) break;
      p->us[i][r] = secs * 1e6 * p->t[i].factor;
      p->spent_s += secs;
    }
    if (!rc) p->rounds = r + 1;
  }
  return rc;
}

/*
 * The sign test's rank: the largest a with P(Bin(n, 1/2) < a) <= alpha / 2; 0 when there is none.  The
 * binomial terms are summed from logs (2^-n underflows a double past n = 1074).
 */
static int sign_rank(int n, double alpha) {
  double lpmf = -n * log(2.0), cdf = 0; /* log P(X = k), from k = 0 */
  int a = 0;
  for (int k = 0; k < n; k++) {
    cdf += exp(lpmf);
    if (cdf > alpha / 2) break;
    a = k + 1;
    lpmf += log((double)(n - k) / (double)(k + 1));
  }
  return a;
}

/*
 * Per-round log(us_i / us_j) over p's rounds: the median and the sign
 * test's interval for it (lo = -inf, hi = inf when the rounds are too few
 * for one).
 */
static void pair_log_ratio(paired *p, int i, int j, double *med, double *lo, double *hi) {
  int n = p->rounds;
  if (p->rank_n != n) p->rank_a = sign_rank(n, p->alpha), p->rank_n = n;
  int a = p->rank_a;
  double *l = p->scratch;
  for (int k = 0; k < n; k++) l[k] = log(p->us[i][k] / p->us[j][k]) - p->slow[i] + p->slow[j];
  qsort(l, (size_t)n, sizeof *l, cmp_double);
  *med = n ? (n & 1 ? l[n / 2] : 0.5 * (l[n / 2 - 1] + l[n / 2])) : 0;
  *lo = a ? l[a - 1] : -INFINITY;
  *hi = a ? l[n - a] : INFINITY;
}

/*
 * Member i against member j: -1 when i is faster by more than theta (the
 * median of the per-round ratios beyond 1 - theta), 1 when slower, 0 a
 * tie.  *decided (may be NULL): the interval lies wholly outside or wholly
 * inside 1 +- theta (more rounds would not change the answer; run_paired
 * adds rounds until every pair is, within its budget).  The median, not
 * the interval, decides: a pair the budget left unsettled is judged by
 * its best estimate (beamrep2 called every unsettled pair a tie, so under
 * load -- PoCL's twin spread reached 0.67 -- nearly every decision was a
 * tie and the tie rule alone picked, 1.5-1.8x slower than the fastest
 * members of the round), and the answer does not depend on how many
 * rounds the budget allowed, only on where the median sits against the
 * band.
 */
static int pair_cmp(paired *p, int i, int j, double theta, bool *decided) {
  double med, lo, hi, band = log1p(theta);
  pair_log_ratio(p, i, j, &med, &lo, &hi);
  if (decided) *decided = hi < -band || lo > band || (lo >= -band && hi <= band);
  return med < -band ? -1 : med > band ? 1 : 0;
}

static double pair_median(paired *p, int i, int ref);
static double pair_spread(paired *p);

/* Median over p's rounds of us[i][k] (ref < 0) or of us[i][k] / us[ref][k]; p->slow taken out. */
static double pair_median(paired *p, int i, int ref) {
  int n = p->rounds;
  for (int k = 0; k < n; k++) p->scratch[k] = ref < 0 ? p->us[i][k] : p->us[i][k] / p->us[ref][k];
  qsort(p->scratch, (size_t)n, sizeof *p->scratch, cmp_double);
  return n ? p->scratch[n / 2] * exp(-p->slow[i] + (ref < 0 ? 0 : p->slow[ref])) : INFINITY;
}

/*
 * The measured noise: the median of |us_0 / us_twin - 1| over the rounds
 * (member 0 and its twin are one program, so this is what pairing alone
 * leaves of run-to-run variation).
 */
static double pair_spread(paired *p) {
  int n = p->rounds, t = p->n - 1;
  for (int k = 0; k < n; k++) p->scratch[k] = fabs(expm1(log(p->us[0][k] / p->us[t][k])));
  qsort(p->scratch, (size_t)n, sizeof *p->scratch, cmp_double);
  return n ? p->scratch[n / 2] : INFINITY;
}

/* ---- per-worker replicas: each lowers in its own replay of the graph ---- */

typedef struct replica {
  bool ready;
  int rc;
  kex_arena arena;
  kex_replay *replay;
  kex_schedule *schedule;
  kex_kernel *base;
} replica;

typedef struct search_ctx {
  const kex_beam_target *target;
  const kex_renderer_caps *caps;
  int dialect;
  kex_device *dev; /* for compile jobs on the pool (only when its compile is thread-safe) */
  replica *replicas;
} search_ctx;

static void replica_free(replica *r) {
  if (!r->ready) return;
  kex_kernel_free(r->base);
  kex_schedule_free(r->schedule);
  kex_replay_free(r->replay);
  kex_arena_destroy(&r->arena);
  r->ready = false;
}

static int replica_init(replica *r, const search_ctx *sc, kex_error *err) {
  kex_arena_init(&r->arena, 0);
  r->ready = true;
  kex_replay_opts ro = kex_target_replay_opts(sc->target->target);
  int rc = kex_replay_graph(sc->target->graph, &ro, &r->arena, &r->replay, err);
  if (!rc) rc = kex_schedule_create(r->replay, &r->schedule, err);
  if (!rc && sc->target->item >= r->schedule->nitems)
    rc = kex_err_set(err, KEX_EINTERNAL, "replica schedule has %u items", r->schedule->nitems);
  if (!rc) rc = kex_kernel_from_item(r->schedule, &r->schedule->items[sc->target->item], sc->caps, &r->base, err);
  return rc;
}

typedef struct candidate {
  kex_pool_job job;
  /* inputs (immutable while queued) */
  const search_ctx *sc;
  uint32_t nopts;
  kex_opt opts[KEX_CACHE_MAX_OPTS];
  uint8_t seq[KEX_CACHE_MAX_OPTS]; /* action ids (1-based); 0 for opts that did not come from an action */
  int parent;
  /* results (the worker's until waited for) */
  int rc;
  char msg[KEX_ERROR_MSG_MAX];
  kex_program_src ps;
  /* a compile on the pool (devices with compile_thread_safe): inputs ps; results below */
  kex_pool_job cjob;
  int crc;
  unsigned char *bin;
  size_t binsz;
  double csecs;
  /* the main thread's */
  kex_program *prog;
  double us, factor;
  bool timed;
} candidate;

/* Compile c->ps to a binary on a pool worker (the device's compile is thread-safe). */
static void compile_candidate(kex_pool_job *job, int worker) {
  candidate *c = (candidate *)((char *)job - offsetof(candidate, cjob));
  kex_error err = {0};
  struct timespec a, b;
  (void)worker;
  clock_gettime(CLOCK_MONOTONIC, &a);
  c->crc = kex_device_compile(c->sc->dev, c->ps.src, c->ps.name, &c->bin, &c->binsz, &err);
  clock_gettime(CLOCK_MONOTONIC, &b);
  c->csecs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  if (c->crc) snprintf(c->msg, sizeof c->msg, "%s", err.msg);
}

static void lower_candidate(kex_pool_job *job, int worker) {
  candidate *c = (candidate *)job;
  replica *r = &c->sc->replicas[worker];
  kex_error err = {0};
  kex_kernel *k = NULL;
  c->rc = 0;
  if (!r->ready) r->rc = replica_init(r, c->sc, &err);
  if (r->rc) {
    c->rc = r->rc;
    snprintf(c->msg, sizeof c->msg, "replica: %.400s", err.msg);
    return;
  }
  k = kex_kernel_copy(r->base);
  if (!k) {
    c->rc = KEX_ENOMEM;
    snprintf(c->msg, sizeof c->msg, "out of memory");
    return;
  }
  c->rc = kex_kernel_apply_opts(k, c->opts, c->nopts, &err);
  if (!c->rc) c->rc = kex_lower_kernel(k, c->sc->caps, c->sc->dialect, NULL, &c->ps, &err);
  if (c->rc) snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  kex_kernel_free(k);
}

/* ---- small sets of digests ---- */

typedef struct digest_set {
  uint32_t n, cap;
  uint8_t (*d)[32];
} digest_set;

/* 1 if present, 0 if added, KEX_ENOMEM. */
static int digest_add(digest_set *s, const void *data, size_t len) {
  uint8_t h[32];
  if (kex_sha256_bytes(data, len, h)) return KEX_ENOMEM;
  for (uint32_t i = 0; i < s->n; i++)
    if (!memcmp(s->d[i], h, 32)) return 1;
  if (s->n == s->cap) {
    uint32_t cap = s->cap ? 2 * s->cap : 64;
    void *p = kex_realloc(s->d, (size_t)cap * 32);
    if (!p) return KEX_ENOMEM;
    s->d = p;
    s->cap = cap;
  }
  memcpy(s->d[s->n++], h, 32);
  return 0;
}

/* ---- ranking ---- */

/*
 * The fixed tie rule, which no timing enters: the kernel with more uops,
 * then fewer opts, then the smaller opts text (kex_cache_opts_format,
 * strcmp) comes first.  <0: a first.  More uops (more work upcast and
 * unrolled per thread) first, because that end of a tie group is its fast
 * end in the search's measurements: with "fewer uops first" the rule's
 * favourite was usually the group's slowest member, the one whose
 * membership (within the threshold of the fastest or just beyond it) is
 * least certain, and two searches picked differently whenever it fell
 * on either side.
 */
static int tie_order(uint32_t auops, const kex_opt *ao, uint32_t an, uint32_t buops, const kex_opt *bo, uint32_t bn) {
  char at[KEX_CACHE_OPTS_TEXT_MAX], bt[KEX_CACHE_OPTS_TEXT_MAX];
  if (auops != buops) return auops > buops ? -1 : 1;
  if (an != bn) return an < bn ? -1 : 1;
  if (kex_cache_opts_format(ao, an, at, sizeof at) || kex_cache_opts_format(bo, bn, bt, sizeof bt)) return 0;
  return strcmp(at, bt);
}

static int cand_order(const candidate *a, const candidate *b) {
  return tie_order(a->ps.nuops, a->opts, a->nopts, b->ps.nuops, b->opts, b->nopts);
}

/*
 * Pick up to k leaders from the timed candidates by their screening times
 * alone (the fallback when a paired decision cannot run): repeatedly the
 * fastest remaining time t, and among the remaining within t x (1 + tol)
 * the first in the tie rule.  out[] gets their indices; returns how many.
 */
static int pick_leaders(candidate **c, int n, int k, double tol, int *out) {
  bool *taken = kex_calloc((size_t)(n ? n : 1), 1);
  int m = 0;
  if (!taken) return 0;
  while (m < k) {
    double tmin = INFINITY;
    for (int i = 0; i < n; i++)
      if (c[i] && !taken[i] && c[i]->timed && c[i]->us < tmin) tmin = c[i]->us;
    if (!isfinite(tmin)) break;
    int pick = -1;
    for (int i = 0; i < n; i++)
      if (c[i] && !taken[i] && c[i]->timed && c[i]->us <= tmin * (1 + tol) && (pick < 0 || cand_order(c[i], c[pick]) < 0))
        pick = i;
    taken[pick] = true;
    out[m++] = pick;
  }
  kex_free(taken);
  return m;
}

/* ---- the search ---- */

typedef struct search {
  const kex_beam_opts *o;
  kex_device *dev;
  kex_beam_exec_fn exec;
  search_bufs bufs;
  const kex_sched_item *item;
  kex_beam_result *res;
  kex_beam_progress prog;
  double screen_s; /* the last round's screening time (round_set.screen_s): the final comparison's budget */
  bool serial;     /* time every run serially (choose_timing) */
} search;

static bool stop_requested(const search *s) { return s->o->cancelled && s->o->cancelled(s->o->cancel_arg); }

static void report(search *s, const char *phase) {
  if (!s->o->progress) return;
  s->prog.phase = phase;
  s->prog.compiled = s->res->compiled;
  s->prog.timed = s->res->timed;
  s->o->progress(&s->prog, s->o->progress_arg);
}

static void fill_time_job(search *s, const kex_program_src *ps, kex_program *prog, bool reduce, time_job *t) {
  memset(t, 0, sizeof *t);
  t->prog = prog;
  t->serial = s->serial ? s->dev : NULL;
  memcpy(t->global, ps->global, sizeof t->global);
  t->local = ps->has_local ? ps->local : NULL;
  t->nargs = (int)ps->nargs;
  for (uint32_t a = 0; a < ps->nargs; a++) t->args[a] = s->bufs.buf[ps->args[a].idx];
  t->factor = 1;
  t->early_stop_us = INFINITY;
  if (!reduce) return;
  t->shrink_to_s = KEX_BEAM_RUN_TARGET_S;
  for (;;) {
    int64_t prod = (int64_t)t->global[0] * (int64_t)t->global[1] * (int64_t)t->global[2];
    if (prod <= s->o->max_global_size) break;
    int j = 2;
    while (j >= 0 && t->global[j] <= 16) j--;
    if (j < 0) break;
    t->global[j] /= 2;
    t->factor *= 2;
  }
}

/*
 * Compile and load ps (no dedup); *prog on success; compile seconds in
 * *secs.  With bin, *bin gets the binary when the device made it for free
 * (else NULL; the caller frees it).
 */
static int compile_load(search *s, const kex_program_src *ps, kex_program **prog, unsigned char **bin, size_t *binsz,
                        double *secs, kex_error *err) {
  compile_job cj = {ps, bin != NULL, NULL, NULL, 0, 0};
  int rc = s->exec(s->o->exec_ctx, s->dev, job_compile, &cj, err);
  *secs = cj.seconds;
  s->res->compile_s += cj.seconds;
  if (!rc) *prog = cj.prog;
  if (bin && !rc) {
    *bin = cj.bin;
    *binsz = cj.binsz;
  } else {
    kex_free(cj.bin);
  }
  return rc;
}

static void free_prog(search *s, kex_program **p) {
  if (!*p) return;
  s->exec(s->o->exec_ctx, s->dev, job_free_prog, *p, NULL);
  *p = NULL;
}

static void free_candidate(search *s, candidate *c) {
  if (!c) return;
  kex_free(c->bin);
  free_prog(s, &c->prog);
  kex_program_src_free(&c->ps);
  kex_free(c);
}

/* kex_device_build_batch of the round's candidates to compile, on the device's thread. */
typedef struct batch_job {
  search *s;
  candidate **cands;
  const int *todo;
  int ntodo;
} batch_job;

static int job_build_batch(kex_device *dev, void *arg, kex_error *err) {
  batch_job *b = arg;
  kex_build_item *items = kex_calloc((size_t)b->ntodo, sizeof *items);
  size_t *sizes = kex_calloc((size_t)b->ntodo * KEX_DEVICE_MAX_BUFS, sizeof *sizes);
  int rc = 0;
  if (!items || !sizes) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
    goto out;
  }
  for (int j = 0; j < b->ntodo; j++) {
    const kex_program_src *ps = &b->cands[b->todo[j]]->ps;
    size_t *sz = sizes + (size_t)j * KEX_DEVICE_MAX_BUFS;
    uint32_t nb = ps->nargs < KEX_DEVICE_MAX_BUFS ? ps->nargs : KEX_DEVICE_MAX_BUFS;
    for (uint32_t a = 0; a < nb; a++) sz[a] = b->s->bufs.bytes[ps->args[a].idx];
    items[j] = (kex_build_item){.source = ps->src, .name = ps->name, .local = ps->has_local ? ps->local : NULL,
                                .nbufs = nb, .buf_sizes = sz, .global = ps->global};
  }
  double t0 = now_s();
  rc = kex_device_build_batch(dev, items, b->ntodo, err);
  double share = (now_s() - t0) / b->ntodo;
  if (rc < 0) goto out;
  rc = 0;
  for (int j = 0; j < b->ntodo; j++) {
    candidate *c = b->cands[b->todo[j]];
    c->prog = items[j].prog;
    c->crc = items[j].rc;
    c->csecs = share;
    if (c->crc) snprintf(c->msg, sizeof c->msg, "%s", items[j].err.msg);
  }
out:
  kex_free(items);
  kex_free(sizes);
  return rc;
}

/*
 * How this search times its runs, decided once from hand-coded at full
 * size: on a device that has serial timing (cpu), when hand-coded's time
 * is under KEX_BEAM_SERIAL_MAX_S, every run of the search is timed
 * serially.  device.h says how and why: on this 2-vCPU VM a pooled
 * microsecond kernel's time against another's moved 0.6x-1.0x from one
 * second to the next, one thread's kept its ratio within a per cent, and
 * two searches picked by which regime they met.  Longer kernels keep the
 * pool's wall time: their runs span the regimes, and a serial run would
 * cost threads x as much.
 *
 * The time that decides is the least of KEX_BEAM_SERIAL_PROBES serially
 * timed runs (the pool's ideal time), not of pooled runs: a pooled run of
 * a 10 us kernel took 200-1500 us whenever the pool's workers were slow to
 * wake, for every probe of a search, and such a search (4 of 116 in
 * bench/results/beam-repeatable.md) timed everything pooled while the next
 * one timed serially -- a flip of its own.  A pooled warm-up of KEX_BEAM_SERIAL_LONG_S or more
 * (far past any wake-up) needs no serial probe; two probes of 4x the
 * limit end the probing.  A kernel near the limit may still be timed one
 * way in one search and the other way in the next.
 */
#define KEX_BEAM_SERIAL_MAX_S 200e-6
#define KEX_BEAM_SERIAL_PROBES 5
#define KEX_BEAM_SERIAL_LONG_S 20e-3
static int choose_timing(search *s, const kex_program_src *ps, kex_program *prog, kex_error *err) {
  bool has = false;
  double least = INFINITY, pooled = INFINITY;
  int rc = s->exec(s->o->exec_ctx, s->dev, job_serial_supported, &has, err);
  if (!rc && has) {
    time_job t;
    fill_time_job(s, ps, prog, false, &t); /* s->serial is still false: the warm-up runs pooled */
    rc = s->exec(s->o->exec_ctx, s->dev, job_launch_once, &t, err);
    pooled = t.us;
    t.serial = s->dev;
    for (int i = 0; i < KEX_BEAM_SERIAL_PROBES && !rc && pooled < KEX_BEAM_SERIAL_LONG_S; i++) {
      rc = s->exec(s->o->exec_ctx, s->dev, job_launch_once, &t, err);
      least = fmin(least, t.us);
      if (i >= 1 && least >= 4 * KEX_BEAM_SERIAL_MAX_S) break;
    }
  }
  if (rc) return rc;
  s->serial = has && least < KEX_BEAM_SERIAL_MAX_S;
  s->res->serial_timing = s->serial;
  if (has)
    KEX_DEBUG("beam: hand-coded %.2f us serially (a pooled warm-up %.2f us): %s timing", least * 1e6, pooled * 1e6,
              s->serial ? "serial" : "pooled");
  return 0;
}

/*
 * The search's limits on kernel k (opts applied): the product of the
 * upcast dims (colors m, y) at most o->upcast_max and of the local dims
 * (c, g, w) at most o->local_max.  0, or KEX_ELIMIT with *err naming the
 * product and the limit.
 */
static int check_opt_limits(const kex_kernel *k, const kex_beam_opts *o, kex_error *err) {
  char colors[KEX_MAX_DIMS + 1];
  int64_t up = 1, lcl = 1;
  const int64_t *full = kex_kernel_full_shape(k);
  kex_kernel_colors(k, colors, sizeof colors);
  for (int d = 0; colors[d]; d++) {
    if (colors[d] == 'm' || colors[d] == 'y') up *= full[d];
    else if (colors[d] == 'c' || colors[d] == 'g' || colors[d] == 'w') lcl *= full[d];
  }
  if (up > o->upcast_max)
    return kex_err_set(err, KEX_ELIMIT, "upcast product %lld over upcast_max %d", (long long)up, o->upcast_max);
  if (lcl > o->local_max)
    return kex_err_set(err, KEX_ELIMIT, "local product %lld over local_max %d", (long long)lcl, o->local_max);
  return 0;
}

/* Expand beam entry b's actions into cands (appending); the kernel kb has b's opts applied. */
static int expand(search *s, const search_ctx *sc, const candidate *b, int bi, const kex_kernel *kb, candidate ***cands,
                  int *n, int *cap) {
  const kex_opt *acts = kex_beam_actions();
  int shape_len = kex_kernel_shape_len(kb);
  const int64_t *full = kex_kernel_full_shape(kb);
  if (b->nopts >= KEX_CACHE_MAX_OPTS) return 0;
  for (int i = 0; i < KEX_BEAM_NACTIONS; i++) {
    kex_opt a = acts[i];
    if (a.op != KEX_OPT_TC) {
      int ax = real_axis(kb, a);
      if (ax >= shape_len || (full[ax] == a.amt && action_exists(a.op, ax, 0))) continue;
    }
    kex_kernel *k2 = kex_kernel_copy(kb);
    if (!k2) return KEX_ENOMEM;
    kex_error e = {0};
    if (kex_kernel_apply_opt(k2, a, true, &e)) {
      kex_kernel_free(k2);
      continue;
    }
    int lim = check_opt_limits(k2, s->o, NULL);
    kex_kernel_free(k2);
    if (lim) continue;
    if (*n == *cap) {
      int nc = *cap ? 2 * *cap : 128;
      void *p = kex_realloc(*cands, sizeof **cands * (size_t)nc);
      if (!p) return KEX_ENOMEM;
      *cands = p;
      *cap = nc;
    }
    candidate *c = kex_calloc(1, sizeof *c);
    if (!c) return KEX_ENOMEM;
    c->sc = sc;
    c->nopts = b->nopts + 1;
    memcpy(c->opts, b->opts, sizeof(kex_opt) * b->nopts);
    memcpy(c->seq, b->seq, b->nopts);
    c->opts[b->nopts] = a;
    c->seq[b->nopts] = (uint8_t)(i + 1);
    c->parent = bi;
    c->us = INFINITY;
    (*cands)[(*n)++] = c;
  }
  return 0;
}

/* One round's candidates (the array is reused from round to round) and what passes 1-3 made of them. */
typedef struct round_set {
  candidate **cands;
  int n, cap;
  int *todo;      /* pass 1's picks (indices into cands), in candidate order */
  int ntodo;
  enum { PREBUILT_NONE, PREBUILT_BINARY, PREBUILT_PROGRAM } prebuilt; /* pass 2 compiled them on the pool (binaries)
                                                                         or built them as a batch (programs) */
  double best;    /* the round's fastest time so far */
  double screen_s; /* wall time of the round's screening runs: what its decision may spend (next_beam) */
} round_set;

/* The round's candidates: every beam entry's actions, beam order then action order. */
static int expand_beam(search *s, search_ctx *sc, const kex_kernel *k0, candidate **beam, int nbeam, round_set *r,
                       kex_error *err) {
  int rc = 0;
  for (int bi = 0; bi < nbeam && !rc; bi++) {
    kex_kernel *kb = kex_kernel_copy(k0);
    if (!kb) rc = KEX_ENOMEM;
    if (!rc && kex_kernel_apply_opts(kb, beam[bi]->opts, beam[bi]->nopts, err)) rc = KEX_EINTERNAL;
    if (!rc) rc = expand(s, sc, beam[bi], bi, kb, &r->cands, &r->n, &r->cap);
    kex_kernel_free(kb);
  }
  if (rc)
    return kex_err_set(err, rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EINTERNAL, "expanding the beam: %s",
                       rc == KEX_ENOMEM ? "out of memory" : err->msg);
  return 0;
}

/*
 * Pass 1, in candidate order (every lowering submitted to the pool is
 * waited for, even after an error): lowered, within the uop limit and the
 * per-entry cap, new source -> r->todo.
 */
static int pick_to_compile(search *s, kex_pool *pool, int nbeam, round_set *r, digest_set *seen_src, kex_error *err) {
  const kex_beam_opts *o = s->o;
  kex_beam_result *res = s->res;
  int per_entry = o->max_candidates > 0 ? (o->max_candidates + nbeam - 1) / nbeam : 0;
  int used[KEX_BEAM_MAX_WIDTH] = {0};
  int rc = 0;
  r->ntodo = 0;
  if (!(r->todo = kex_malloc(sizeof *r->todo * (size_t)(r->n ? r->n : 1))))
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
  for (int i = 0; i < r->n; i++) {
    candidate *c = r->cands[i];
    double tw = now_s();
    kex_pool_wait(pool, &c->job);
    res->lower_wait_s += now_s() - tw;
    if (rc) continue; /* drain */
    if (c->rc) {
      res->lower_failed++;
      KEX_DEBUG("beam: candidate %d does not lower: %s", i, c->msg);
      continue;
    }
    if ((int)c->ps.nuops >= o->uops_max) {
      res->over_uops++;
      continue;
    }
    if (per_entry && used[c->parent] >= per_entry) {
      res->capped++;
      continue;
    }
    /* dedup by rendered source before compiling */
    int d = digest_add(seen_src, c->ps.src, strlen(c->ps.src));
    if (d < 0) { rc = kex_err_set(err, KEX_ENOMEM, "out of memory"); continue; }
    if (d == 1) { res->dup_source++; continue; }
    used[c->parent]++;
    r->todo[r->ntodo++] = i;
  }
  return rc;
}

/*
 * Pass 2, before any timing starts: where the device compiles on any
 * thread (cpu: one cc process each), all of r->todo at once on the pool,
 * so that compiles never share the cores with a timed run (each candidate
 * keeps its own binary, for the binary dedup); elsewhere (OpenCL) the
 * whole batch goes to kex_device_build_batch on the device's thread: many
 * kernels per compiler call, and on PoCL with its kernel cache on, helper
 * processes pre-build the groups (and generate each kernel's code) on every
 * core first.
 */
static void prebuild(search *s, const search_ctx *sc, kex_pool *pool, round_set *r) {
  kex_beam_result *res = s->res;
  double tc = now_s();
  r->prebuilt = PREBUILT_NONE;
  if (r->ntodo < 2 || !sc->dev) return;
  if (kex_device_get_info(sc->dev)->compile_thread_safe) {
    r->prebuilt = PREBUILT_BINARY;
    for (int j = 0; j < r->ntodo; j++) kex_pool_submit_background(pool, &r->cands[r->todo[j]]->cjob, compile_candidate);
    for (int j = 0; j < r->ntodo; j++) kex_pool_wait(pool, &r->cands[r->todo[j]]->cjob);
  } else {
    batch_job bj = {s, r->cands, r->todo, r->ntodo};
    kex_error be = {0};
    if (s->exec(s->o->exec_ctx, s->dev, job_build_batch, &bj, &be) == 0) r->prebuilt = PREBUILT_PROGRAM;
    else KEX_WARN("beam: a batch build of %d candidates failed (%.200s); built one by one", r->ntodo, be.msg);
  }
  res->compile_s += now_s() - tc;
}

/* Candidate c compiled (unless pass 2 did) and loaded: 0, or a code with *ce (the candidate is skipped). */
static int build_candidate(search *s, const round_set *r, candidate *c, unsigned char **bin, size_t *binsz,
                           double *secs, kex_error *ce) {
  int crc;
  if (r->prebuilt == PREBUILT_NONE) return compile_load(s, &c->ps, &c->prog, bin, binsz, secs, ce);
  crc = c->crc;
  *secs = c->csecs;
  if (crc) {
    snprintf(ce->msg, sizeof ce->msg, "%s", c->msg);
  } else if (r->prebuilt == PREBUILT_BINARY) {
    load_job lj = {c->bin, c->binsz, c->ps.name, NULL};
    crc = s->exec(s->o->exec_ctx, s->dev, job_load, &lj, ce);
    c->prog = lj.prog;
  }
  *bin = c->bin;
  *binsz = c->binsz;
  c->bin = NULL;
  return crc;
}

/* Pass 3, in order: compile (unless pass 2 did) and load, binary dedup, time on the reduced grid. */
static int time_round(search *s, const candidate *best, round_set *r, digest_set *seen_bin, kex_error *err) {
  const kex_beam_opts *o = s->o;
  kex_beam_result *res = s->res;
  for (int j = 0; j < r->ntodo; j++) {
    candidate *c = r->cands[r->todo[j]];
    if (stop_requested(s)) return kex_err_set(err, KEX_ECANCELLED, "beam search cancelled");
    unsigned char *bin = NULL;
    size_t binsz = 0;
    double secs = 0;
    kex_error ce = {0};
    int crc = build_candidate(s, r, c, &bin, &binsz, &secs, &ce);
    res->compiled++;
    if (crc) {
      res->compile_failed++;
      KEX_WARN("beam: %s does not compile: %.200s", c->ps.name, ce.msg);
      kex_free(bin);
      continue;
    }
    if (secs > o->compile_timeout_s) {
      res->compile_timeouts++;
      kex_free(bin);
      free_prog(s, &c->prog);
      continue;
    }
    int d = bin ? digest_add(seen_bin, bin, binsz) : 0; /* no binary (OpenCL): the source dedup stands alone */
    kex_free(bin);
    if (d < 0) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    if (d == 1) {
      res->dup_binary++;
      free_prog(s, &c->prog);
      continue;
    }
    time_job tj;
    fill_time_job(s, &c->ps, c->prog, true, &tj);
    tj.runs = o->timing_runs;
    double ref = fmin(best->us, r->best);
    tj.early_stop_us = isfinite(ref) ? 3 * ref : INFINITY;
    if (isfinite(ref)) shrink_grid(&tj, ref * 1e-6 / tj.factor); /* the warm-up too: about as long as the best's run */
    kex_error te = {0};
    double tt = now_s();
    int trc = s->exec(o->exec_ctx, s->dev, job_time, &tj, &te);
    r->screen_s += now_s() - tt;
    res->time_s += now_s() - tt;
    res->first_launch_s += tj.warmup_s;
    if (trc) {
      KEX_WARN("beam: %s does not run: %.200s", c->ps.name, te.msg);
      free_prog(s, &c->prog);
      continue;
    }
    c->us = tj.us;
    c->factor = tj.factor;
    c->timed = true;
    res->timed++;
    if (c->us < r->best) r->best = c->us;
    s->prog.best_us = fmin(s->prog.best_us, c->us);
    report(s, "search");
  }
  return 0;
}

/* Take c out of the round's candidates (it lives on in the beam or as the runner-up). */
static void take_candidate(round_set *r, const candidate *c) {
  for (int i = 0; i < r->n; i++)
    if (r->cands[i] == c) r->cands[i] = NULL;
}

/*
 * Run decision p (members and twin set up) on the device: KEX_BEAM_PAIR_MIN
 * (or retime_runs, when more) rounds, then doubling while a pair among
 * members [0, ndecide) is undecided at the tie threshold (its interval
 * straddles an edge of the band), under KEX_BEAM_PAIR_MAX rounds and until
 * the runs add up to budget_s.  The threshold theta (decision_theta) does
 * not move with the noise a decision measures (beam.h says why); the noise
 * shows in the intervals, and more noise buys more rounds, not a wider
 * band.
 */
static int run_paired(search *s, paired *p, int ndecide, double theta, double budget_s, kex_error *err) {
  const kex_beam_opts *o = s->o;
  bool asked = o->retime_runs > KEX_BEAM_PAIR_MIN; /* the caller's minimum is not cut by the budget */
  int min = asked ? (o->retime_runs < KEX_BEAM_PAIR_MAX ? o->retime_runs : KEX_BEAM_PAIR_MAX) : KEX_BEAM_PAIR_MIN;
  p->target = asked ? min : KEX_BEAM_PAIR_FLOOR;
  /* every pair's interval at KEX_BEAM_ALPHA / pairs (Bonferroni): with 16 members a decision makes 120
     comparisons, and at 1% each a chance streak separated some pair in most rounds (under a busy core the same
     kernel measured 10 us and 4 ms; 9 rounds all one way made a member "dominated") */
  p->alpha = KEX_BEAM_ALPHA / (ndecide > 1 ? ndecide * (ndecide - 1) / 2 : 1);
  p->rank_n = -1;
  for (;;) {
    if (stop_requested(s)) return kex_err_set(err, KEX_ECANCELLED, "beam search cancelled");
    double tt = now_s();
    int rc = s->exec(o->exec_ctx, s->dev, job_paired, p, err);
    s->res->time_s += now_s() - tt;
    s->res->decide_s += now_s() - tt;
    if (rc) return rc;
    if (p->rounds < min) {
      /* the minimum: KEX_BEAM_PAIR_MIN rounds, or the budget's worth of rounds as the first ones cost, at least
         KEX_BEAM_PAIR_FLOOR (a decision between 150 ms runs took 9 rounds, 7.8 s, against a 0.5 s budget) */
      double per = p->spent_s / p->rounds;
      int want = asked || !(per > 0) ? min : (int)fmin((double)min, fmax(KEX_BEAM_PAIR_FLOOR, floor(budget_s / per)));
      if (p->rounds < want) {
        p->target = want;
        continue;
      }
    }
    bool all = true;
    for (int i = 0; i < ndecide && all; i++)
      for (int j = i + 1; j < ndecide && all; j++) pair_cmp(p, i, j, theta, &all);
    if ((all && p->spent_s >= fmin(KEX_BEAM_DECIDE_MIN_S, budget_s)) || p->rounds >= KEX_BEAM_PAIR_MAX ||
        p->spent_s >= budget_s)
      return 0;
    p->target = 2 * p->rounds < KEX_BEAM_PAIR_MAX ? 2 * p->rounds : KEX_BEAM_PAIR_MAX;
  }
}

/*
 * Disturbed decisions.  The machine has states that come with time, not
 * with where a kernel lies in memory (bench/results/beam-repeatable.md;
 * build/bench_beam_state): muladd64K's hand-coded kernel runs
 * serially in 6.5 µs in some stretches and 11-13 µs in others, the same
 * code on the same buffers, and UPCAST(0,4)+UPCAST(0,4) beats it beyond
 * the threshold only in the slow ones.  A state lasts from 10 ms to about
 * a second, long enough to hold a whole decision, and changes most readily
 * after the thread sleeps.  So with serial timing every decision member's
 * undisturbed time -- the least median time any decision measured for it
 * (medians of one state repeat to about 1%) -- is remembered process-wide
 * (by its device, source and grid), and a decision in which some member's
 * median was more than KEX_BEAM_DISTURBED over its remembered time is run
 * again, at most KEX_BEAM_REROLLS times (the last run stands), once a few
 * runs of that member after a pause of KEX_BEAM_REROLL_PAUSE_S show it
 * back at its remembered time (pausing up to KEX_BEAM_WAIT_MAX_S before
 * each rerun).  A program's first decision has nothing to go by; a search of a kernel timed before (the
 * second search of a kernel in one process, or one that meets a program
 * of an earlier round) compares in the machine's fast state.
 *
 * When the last run is still disturbed (the slow state outlasted the
 * waits: it can last seconds), each member that
 * ran more than KEX_BEAM_DISTURBED over its remembered time is judged at
 * that time: its paired ratios and median are divided by the factor
 * (paired.slow).  The slow state does not slow every program alike --
 * muladd64K's UPCAST(0,4) ran 8.2 or 13-14 us, UPCAST(0,4)+UPCAST(0,4)
 * 8.0-8.5 us in both -- so a decision taken in it reorders kernels that
 * tie in the fast state, and a search that met it at its final comparison
 * chose differently from one that did not.  The states are far apart
 * (1.6-1.7x) against the 1.2x line that tells them, so which members are
 * corrected does not sit at an edge the way a tie band's pairs do.
 */
#define KEX_BEAM_DISTURBED 0.20
#define KEX_BEAM_REROLLS 3
#define KEX_BEAM_REROLL_PAUSE_S 0.010 /* then a probe of KEX_BEAM_PROBE_RUNS runs of the disturbed member */
#define KEX_BEAM_PROBE_RUNS 9
#define KEX_BEAM_WAIT_MAX_S 0.5       /* pauses before one rerun, at most */
#define KEX_BEAM_MEMO_SLOTS 4096 /* emptied when three quarters full: a cache, never a correctness matter */

typedef struct memo_slot {
  uint64_t key; /* 0: empty */
  double us;
} memo_slot;

static memo_slot memo[KEX_BEAM_MEMO_SLOTS];
static int memo_used;
static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t memo_key(const search *s, const kex_program_src *ps, const time_job *t) {
  uint64_t h = kex_hash_bytes(ps->src, strlen(ps->src), kex_device_uid(s->dev)); /* cpu with 1 or N threads differ */
  for (int d = 0; d < 3; d++) h = kex_hash_u64(h, t->global[d]);
  return h ? h : 1;
}

/* The remembered time of key (0: none); with us > 0, remember min(that, us) first. */
static double memo_min(uint64_t key, double us) {
  pthread_mutex_lock(&memo_mu);
  uint32_t at = (uint32_t)(key % KEX_BEAM_MEMO_SLOTS);
  while (memo[at].key && memo[at].key != key) at = (at + 1) % KEX_BEAM_MEMO_SLOTS;
  double got = memo[at].key ? memo[at].us : 0;
  if (us > 0 && (!got || us < got)) {
    if (!memo[at].key && ++memo_used > KEX_BEAM_MEMO_SLOTS * 3 / 4) {
      memset(memo, 0, sizeof memo);
      memo_used = 1;
      at = (uint32_t)(key % KEX_BEAM_MEMO_SLOTS);
    }
    memo[at] = (memo_slot){key, us};
  }
  pthread_mutex_unlock(&memo_mu);
  return got;
}

/*
 * run_paired, then (serial timing) again after a pause while some member
 * ran disturbed against the memo, at most KEX_BEAM_REROLLS times.  keys[i]:
 * member i's memo key (the twin is member 0 again).
 */
static int run_decision(search *s, paired *p, int ndecide, double theta, double budget_s, const uint64_t *keys,
                        kex_error *err) {
  for (int attempt = 0;; attempt++) {
    int rc = run_paired(s, p, ndecide, theta, budget_s, err);
    if (rc || !s->serial || p->rounds < KEX_BEAM_PAIR_MIN) return rc;
    int slow = -1;
    double slow_by = 0, by[KEX_BEAM_SET_MAX];
    for (int i = 0; i < ndecide; i++) {
      double med = pair_median(p, i, -1), ref = memo_min(keys[i], med);
      by[i] = ref > 0 && med > ref * (1 + KEX_BEAM_DISTURBED) ? med / ref : 1;
      if (by[i] > 1 && by[i] > slow_by) slow = i, slow_by = by[i];
    }
    if (slow < 0 || attempt == KEX_BEAM_REROLLS) {
      if (slow >= 0) { /* still disturbed: each slowed member is judged at its remembered time (see above) */
        s->res->disturbed++;
        for (int i = 0; i < ndecide; i++) p->slow[i] = log(by[i]);
        for (int i = ndecide; i < p->n; i++) p->slow[i] = p->slow[0]; /* the twin */
      }
      return 0;
    }
    /* pause until that member runs as remembered again (a few runs after each pause), KEX_BEAM_WAIT_MAX_S at most */
    double ref = memo_min(keys[slow], 0), waited = 0, probe_us = INFINITY;
    int pauses = 0;
    while (waited < KEX_BEAM_WAIT_MAX_S) {
      double t0 = now_s();
      nanosleep(&(struct timespec){0, (long)(KEX_BEAM_REROLL_PAUSE_S * 1e9)}, NULL);
      time_job probe = p->t[slow];
      probe.runs = KEX_BEAM_PROBE_RUNS;
      probe.shrink_to_s = 0;
      probe.early_stop_us = INFINITY;
      rc = s->exec(s->o->exec_ctx, s->dev, job_time, &probe, err);
      waited += now_s() - t0;
      pauses++;
      if (rc) return rc;
      probe_us = probe.us;
      if (probe_us <= ref * (1 + KEX_BEAM_DISTURBED)) break;
    }
    KEX_DEBUG("beam: round %u: decision disturbed (member %d ran %.2fx its remembered time); again after %d pause(s), "
              "%.3f s (%.2fx)", s->prog.round, slow, slow_by, pauses, waited, probe_us / ref);
    s->res->rerolls++;
    p->rounds = 0;
    p->spent_s = 0;
  }
}

/*
 * A decision's threshold, from the length of one timed run of its fastest
 * member (run_s, screening): o->tie_tolerance for runs up to
 * KEX_BEAM_TIE_SHORT_S, KEX_BEAM_TIE_FLOOR (when smaller) from
 * KEX_BEAM_TIE_LONG_S on, log-linear between.  The band covers the drift
 * between two searches that pairing cannot see, and that drift is a matter
 * of the run's length: µs runs that live in the caches moved 10-40%
 * between two searches of one kernel (buffer placement, co-runners'
 * cache and memory traffic, the cpu launch mode), runs of milliseconds a
 * few per cent; a flat 25% stopped searches of ms-scale kernels at the
 * first round that gained less (opencl matmul512: 8.2 ms, as slow as
 * hand-coded, where 4.8 ms was found before).  The run's length, unlike
 * the measured noise, moves little between searches, and the threshold
 * follows it continuously.
 */
#define KEX_BEAM_TIE_FLOOR 0.05
#define KEX_BEAM_TIE_SHORT_S 100e-6
#define KEX_BEAM_TIE_LONG_S 2e-3
static double decision_theta(const kex_beam_opts *o, double run_s) {
  double hi = o->tie_tolerance, lo = fmin(KEX_BEAM_TIE_FLOOR, hi);
  if (!(run_s > KEX_BEAM_TIE_SHORT_S)) return hi; /* also NaN: no run to go by */
  if (run_s >= KEX_BEAM_TIE_LONG_S) return lo;
  return hi + (lo - hi) * log(run_s / KEX_BEAM_TIE_SHORT_S) / log(KEX_BEAM_TIE_LONG_S / KEX_BEAM_TIE_SHORT_S);
}

/*
 * A decision's budget: its runs may add up to what the round's screening
 * cost (KEX_BEAM_BUDGET_SCALE x screen_s), at least KEX_BEAM_DECIDE_MIN_S
 * and at most max_s.  It scales with the kernels' cost instead of a fixed
 * 0.5 s per round: ms-scale kernels stop at their minimum rounds, µs-scale
 * ones get the floor.
 */
static double decide_budget(double screen_s, double max_s) {
  return fmin(max_s, fmax(KEX_BEAM_DECIDE_MIN_S, KEX_BEAM_BUDGET_SCALE * screen_s));
}

/*
 * Member i of p (among the first n, skipping those with gone[]) is
 * dominated when some other such member is faster than it beyond the
 * threshold (pair_cmp: by the median ratio).  The non-dominated members are the
 * round's tie group; which member happens to measure fastest does not
 * change it (a member just beyond the threshold of one leader but within
 * that of a near-equal other is out when any member beats it).
 */
static bool dominated(paired *p, int i, int n, const bool *gone, double theta) {
  for (int j = 0; j < n; j++)
    if (j != i && !(gone && gone[j]) && pair_cmp(p, j, i, theta, NULL) < 0) return true;
  return false;
}

static int cmp_screen(const void *a, const void *b) {
  const candidate *x = *(candidate *const *)a, *y = *(candidate *const *)b;
  if (x->us != y->us) return x->us < y->us ? -1 : 1;
  return cand_order(x, y);
}

/*
 * The round's decision.  Screening (the median of a few runs per
 * candidate) only chooses the set, and never leaves out a candidate a
 * paired decision could keep: every timed candidate (up to the set's
 * room, in screening order) when the leader's run x the candidates x the
 * minimum rounds costs at most KEX_BEAM_SET_COST_S -- µs-scale kernels,
 * whose screening runs are the least trustworthy -- else the 2N+1
 * fastest, every candidate screened within KEX_BEAM_SCREEN_SLACK x the
 * N-th fastest (a load burst over all of a candidate's screening runs
 * must not cost it its place), then the next ones in screening order
 * while the set's minimum rounds cost at most KEX_BEAM_SET_COST_S.  The
 * set and the current best are timed paired (run_paired) at the fixed
 * threshold theta (decision_theta).  Then every decision is a function of
 * which pairs are separated, not of which member measured fastest:
 *   - progress: the current best is dominated (some member is faster
 *     than it beyond theta, by the median ratio);
 *   - the next beam, N times: among the round's members not yet taken
 *     and not dominated by another such member (the tie group), the first
 *     in the tie rule;
 *   - no progress: the search ends, and the tie rule's first of the
 *     round's members that the best does not dominate becomes *runner
 *     (the final comparison decides between the two).
 * A decision that cannot run falls back to the screening times with the
 * tie rule at tie_tolerance.
 */
#define KEX_BEAM_SCREEN_SLACK 2.0
static bool next_beam(search *s, candidate **beam, int *nbeam, round_set *r, candidate **runner) {
  const kex_beam_opts *o = s->o;
  kex_beam_result *res = s->res;
  int width = o->width, nset = 0, order[KEX_BEAM_MAX_WIDTH], nord = 0;
  candidate *set[KEX_BEAM_SET_MAX], *lc[KEX_BEAM_SET_MAX];
  candidate **sorted = kex_malloc(sizeof *sorted * (size_t)(r->n ? r->n : 1));
  paired *p = kex_calloc(1, sizeof *p);
  int m = 0, best_at = -1;
  double theta = o->tie_tolerance, cost = 0, run_s = INFINITY;
  bool ok = sorted && p, best_beaten = false, have_runner = false;
  for (int i = 0; i < r->n && ok; i++)
    if (r->cands[i]->timed && r->cands[i]->prog) sorted[m++] = r->cands[i];
  if (ok) qsort(sorted, (size_t)m, sizeof *sorted, cmp_screen);
  bool has_best = beam[0]->prog && isfinite(beam[0]->us);
  int room = KEX_BEAM_SET_MAX - 1 - (has_best ? 1 : 0);
  /* judged by the leader's run: one spike in a candidate's screening must not keep it out */
  bool all = m && sorted[0]->us * 1e-6 / sorted[0]->factor * KEX_BEAM_PAIR_MIN * m <= KEX_BEAM_SET_COST_S;
  double near = m ? KEX_BEAM_SCREEN_SLACK * sorted[(m < width ? m : width) - 1]->us : 0;
  for (int i = 0; ok && i < m && nset < room; i++) {
    double run_s = sorted[i]->us * 1e-6 / sorted[i]->factor * KEX_BEAM_PAIR_MIN;
    if (!all && nset >= 2 * width + 1 && sorted[i]->us > near && cost + run_s > KEX_BEAM_SET_COST_S) break;
    set[nset++] = sorted[i];
    cost += run_s;
  }
  if (ok && nset < m && sorted[nset]->us <= near)
    KEX_WARN("beam: round %u: %d candidates screened within %.1fx of the %d-th fastest; the decision's room (%d) "
             "left out the slowest of them", s->prog.round, m - nset, KEX_BEAM_SCREEN_SLACK, width, room);
  if (ok && nset > 0) {
    int nm = 0;
    for (int i = 0; i < nset; i++) lc[nm++] = set[i];
    if (has_best) lc[best_at = nm++] = beam[0];
    lc[nm] = lc[0]; /* the twin */
    for (int i = 0; i < nm; i++) run_s = fmin(run_s, lc[i]->us * 1e-6 / lc[i]->factor);
    theta = decision_theta(o, run_s);
    p->n = nm + 1;
    for (int i = 0; i < p->n; i++) {
      fill_time_job(s, &lc[i]->ps, lc[i]->prog, true, &p->t[i]);
      shrink_grid(&p->t[i], lc[i]->us * 1e-6 / p->t[i].factor);
    }
    kex_error pe = {0};
    uint64_t keys[KEX_BEAM_SET_MAX];
    for (int i = 0; i < nm; i++) keys[i] = memo_key(s, &lc[i]->ps, &p->t[i]);
    if (run_decision(s, p, nm, theta, decide_budget(r->screen_s, KEX_BEAM_ROUND_BUDGET_S), keys, &pe)) {
      KEX_WARN("beam: round %u: paired timing failed (%s); deciding by screening times", s->prog.round, pe.msg);
      ok = false;
    }
  }
  if (ok && nset > 0) {
    int nm = p->n - 1;
    bool gone[KEX_BEAM_SET_MAX] = {0};
    for (int i = 0; i < nm; i++) lc[i]->us = pair_median(p, i, -1);
    if (has_best) best_beaten = dominated(p, best_at, nm, NULL, theta);
    while (nord < width) { /* picks come from the round's members; the best only dominates */
      bool nd[KEX_BEAM_SET_MAX];
      int pick = -1;
      for (int i = 0; i < nset; i++) nd[i] = !gone[i] && !dominated(p, i, nm, gone, theta);
      for (int i = 0; i < nset; i++)
        if (nd[i] && (pick < 0 || cand_order(lc[i], lc[pick]) < 0)) pick = i;
      if (pick < 0) break;
      gone[pick] = true;
      order[nord++] = pick;
    }
    /* not beaten: the search keeps what it has (a tie never moves the beam) and the first pick, which ties with the
       best, is the runner-up */
    have_runner = has_best && !best_beaten && nord > 0;
    KEX_DEBUG("beam: round %u: %d in the decision, %d paired rounds (%.3f s of runs), noise %.3f, threshold %.3f, "
              "best %s", s->prog.round, nset, p->rounds, p->spent_s, pair_spread(p), theta,
              !has_best ? "none" : best_beaten ? "beaten" : "kept");
    if (kex_log_get_level() <= KEX_LOG_DEBUG)
      for (int i = 0; i < nm; i++) {
        char ot[KEX_CACHE_OPTS_TEXT_MAX];
        int k = 0;
        while (k < nord && order[k] != i) k++;
        kex_cache_opts_format(lc[i]->opts, lc[i]->nopts, ot, sizeof ot);
        KEX_DEBUG("beam:   %s%-3s %8.2f us  uops %4u  [%s]%s", i == best_at ? "best" : "", k < nord ? "pick" : "",
                  lc[i]->us, lc[i]->ps.nuops, ot, dominated(p, i, nm, NULL, theta) ? "  dominated" : "");
      }
  } else if (nset > 0 || m > 0) {
    nord = pick_leaders(r->cands, r->n, width, o->tie_tolerance, order);
    for (int j = 0; j < nord; j++) lc[j] = r->cands[order[j]], order[j] = j;
    if (has_best && nord) {
      double d = beam[0]->us - lc[0]->us;
      best_beaten = d > o->tie_tolerance * beam[0]->us;
      have_runner = !best_beaten && d >= -o->tie_tolerance * beam[0]->us;
    }
  }
  kex_free(sorted);
  kex_free(p);
  if (theta > res->tie_used) res->tie_used = theta;
  double bestt = nord ? lc[order[0]]->us : INFINITY;
  bool progress = nord > 0 && bestt >= o->min_progress_us && (!has_best || best_beaten);
  s->screen_s = r->screen_s;
  if (progress) {
    for (int j = 0; j < *nbeam; j++) free_candidate(s, beam[j]);
    for (int j = 0; j < nord; j++) {
      beam[j] = lc[order[j]];
      take_candidate(r, beam[j]);
    }
    *nbeam = nord;
    s->prog.best_us = beam[0]->us;
  } else if (have_runner) {
    *runner = lc[order[0]];
    take_candidate(r, *runner);
  }
  return progress;
}

/*
 * The rounds.  *best_out gets the beam's best; *runner_out (or NULL) the
 * fastest candidate of the last round when that round ended the search
 * without counting as progress (faster than the best, but within the tie
 * tolerance): the full-size comparison decides between the two.
 */
static int run_search(search *s, search_ctx *sc, const kex_kernel *k0, kex_pool *pool, candidate **best_out,
                      candidate **runner_out, kex_error *err) {
  const kex_beam_opts *o = s->o;
  kex_beam_result *res = s->res;
  int rc = 0;
  candidate *beam[2 * KEX_BEAM_MAX_WIDTH + 1] = {0};
  int nbeam = 1;
  round_set r = {0};
  digest_set seen_src = {0}, seen_bin = {0};
  candidate *runner = NULL;
  beam[0] = kex_calloc(1, sizeof *beam[0]);
  if (!beam[0]) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  beam[0]->sc = sc;
  beam[0]->us = INFINITY;
  for (uint32_t round = 1;; round++) {
    s->prog.round = round;
    res->rounds = round;
    if ((rc = expand_beam(s, sc, k0, beam, nbeam, &r, err))) break;
    s->prog.round_candidates = (uint32_t)r.n;
    for (int i = 0; i < r.n; i++) kex_pool_submit_background(pool, &r.cands[i]->job, lower_candidate);
    r.best = INFINITY;
    r.screen_s = 0;
    rc = pick_to_compile(s, pool, nbeam, &r, &seen_src, err);
    if (!rc) prebuild(s, sc, pool, &r);
    if (!rc) rc = time_round(s, beam[0], &r, &seen_bin, err);
    kex_free(r.todo);
    r.todo = NULL;
    if (rc) break;
    bool progress = next_beam(s, beam, &nbeam, &r, &runner);
    for (int i = 0; i < r.n; i++) free_candidate(s, r.cands[i]);
    r.n = 0;
    report(s, "search");
    if (!progress || (o->max_rounds > 0 && (int)round >= o->max_rounds)) break;
  }
  for (int i = 0; i < r.n; i++) free_candidate(s, r.cands[i]);
  kex_free(r.cands);
  kex_free(seen_src.d);
  kex_free(seen_bin.d);
  for (int j = 1; j < nbeam; j++) free_candidate(s, beam[j]);
  if (rc) {
    free_candidate(s, beam[0]);
    free_candidate(s, runner);
    return rc;
  }
  *best_out = beam[0];
  *runner_out = runner;
  return 0;
}

/*
 * Check opts from the cache before anything uses them: they came from a
 * file other processes write and from imports, so they are data, not
 * decisions.  They must apply to a fresh copy of the kernel in order (the
 * Kernel's opt preconditions), keep within the search's limits (upcast and
 * local products, uop count: what a candidate must meet), lower, and fit
 * the device (a work-group no larger than it takes).  0 with the kernel's
 * name in name[len]; KEX_ENOMEM; any other code, with *err naming the
 * failure, means the entry is unusable.
 */
static int check_cached_opts(const kex_beam_opts *o, const kex_kernel *k0, const kex_renderer_caps *caps, int dialect,
                             kex_device *dev, const kex_cache_beam_value *v, char *name, size_t len, kex_error *err) {
  kex_program_src ps = {0};
  const kex_device_info *info = kex_device_get_info(dev);
  kex_kernel *k = kex_kernel_copy(k0);
  int rc = 0;
  if (!k) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  if ((rc = kex_kernel_apply_opts(k, v->opts, v->nopts, err)) || (rc = check_opt_limits(k, o, err)) ||
      (rc = kex_lower_kernel(k, caps, dialect, NULL, &ps, err)))
    goto out;
  if ((int64_t)ps.nuops >= o->uops_max) {
    rc = kex_err_set(err, KEX_ELIMIT, "%u uops, not under uops_max %d", ps.nuops, o->uops_max);
    goto out;
  }
  if (ps.has_local) {
    size_t group = ps.local[0] * ps.local[1] * ps.local[2];
    if (!info || !info->has_local) {
      rc = kex_err_set(err, KEX_ELIMIT, "the kernel has a local size and the device has no work-groups");
      goto out;
    }
    if (info->max_work_group_size && group > info->max_work_group_size) {
      rc = kex_err_set(err, KEX_ELIMIT, "work-group of %zu over the device's %zu", group, info->max_work_group_size);
      goto out;
    }
    for (int d = 0; d < 3; d++)
      if (info->max_work_item_sizes[d] && ps.local[d] > info->max_work_item_sizes[d]) {
        rc = kex_err_set(err, KEX_ELIMIT, "local size %zu in dim %d over the device's %zu", ps.local[d], d,
                         info->max_work_item_sizes[d]);
        goto out;
      }
  }
  kex_kernel_name(k, name, len);
out:
  kex_program_src_free(&ps);
  kex_kernel_free(k);
  return rc;
}

/*
 * The cached result for key, checked (check_cached_opts): 0 with res
 * filled (from_cache).  An entry that does not decode, or whose opts are
 * unusable here, is deleted from the cache (counted in the handle's stats),
 * logged with its key, noted in res->cache_note and answered KEX_ENOTFOUND:
 * the caller goes on exactly as on a miss.  Other cache errors are errors.
 */
static int lookup_cache(const kex_beam_opts *o, const kex_cache_beam_key *key, const kex_kernel *k0,
                        const kex_renderer_caps *caps, int dialect, kex_device *dev, kex_beam_result *res,
                        kex_error *err) {
  kex_cache_beam_value v;
  kex_error ce = {0};
  char hex[KEX_AST_KEY_HEX];
  kex_hex(key->ast_key, KEX_AST_KEY_BYTES, hex);
  int rc = kex_cache_beam_get(o->cache, key, &v, &ce);
  if (rc == KEX_ENOTFOUND) return KEX_ENOTFOUND;
  if (rc == KEX_ECORRUPT) {
    snprintf(res->cache_note, sizeof res->cache_note, "corrupt cache entry %s dropped: %.400s", hex, ce.msg);
    KEX_WARN("beam cache: %s", res->cache_note);
    return KEX_ENOTFOUND;
  }
  if (rc) return kex_err_set(err, rc, "beam cache lookup: %s", ce.msg);
  rc = check_cached_opts(o, k0, caps, dialect, dev, &v, res->name, sizeof res->name, &ce);
  if (rc == KEX_ENOMEM) return kex_err_set(err, rc, "checking cached opts: %s", ce.msg);
  if (rc) {
    char opts[KEX_CACHE_OPTS_TEXT_MAX] = "";
    kex_error de = {0};
    kex_cache_opts_format(v.opts, v.nopts, opts, sizeof opts);
    res->name[0] = '\0';
    snprintf(res->cache_note, sizeof res->cache_note, "cache entry %s dropped: opts \"%.80s\" unusable: %.280s", hex,
             opts, ce.msg);
    KEX_WARN("beam cache: %s", res->cache_note);
    if (kex_cache_beam_drop(o->cache, key, &v, ce.msg, &de)) KEX_WARN("beam cache: could not drop %s: %s", hex, de.msg);
    return KEX_ENOTFOUND;
  }
  res->nopts = v.nopts;
  memcpy(res->opts, v.opts, sizeof(kex_opt) * v.nopts);
  res->best_us = v.best_time_s * 1e6;
  res->hand_us = v.hand_time_s * 1e6;
  res->decision_samples = (uint32_t)(v.decision_samples < UINT32_MAX ? v.decision_samples : UINT32_MAX);
  res->decision_spread = v.decision_spread;
  res->decision_tie = v.decision_tie;
  res->from_cache = true;
  return 0;
}

/* The kernel's buffers on the device, filled with random data (s->bufs.n set once they are to be freed). */
static int alloc_bufs(search *s, const kex_beam_target *t, kex_error *err) {
  const kex_sched_item *it = s->item;
  if (it->nbufs > KEX_DEVICE_MAX_BUFS)
    return kex_err_set(err, KEX_ELIMIT, "kernel has %u buffers (limit %d)", it->nbufs, KEX_DEVICE_MAX_BUFS);
  s->bufs.n = it->nbufs;
  for (uint32_t j = 0; j < it->nbufs; j++) {
    const kex_buffer_info *bi = &t->schedule->replay->buffers[it->bufs[j]];
    size_t bytes = (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype);
    s->bufs.bytes[j] = bytes ? bytes : 16;
    s->bufs.dtype[j] = bi->dtype;
  }
  if (stop_requested(s)) return kex_err_set(err, KEX_ECANCELLED, "beam search cancelled");
  return s->exec(s->o->exec_ctx, s->dev, job_alloc, &s->bufs, err);
}

/* The final comparison's kernels (runner: may be absent) and its outcome at full size. */
typedef struct compare_set {
  const kex_program_src *hand_ps, *beam_ps, *runner_ps;
  kex_program *hand, *beam, *runner;
  double us[3];                       /* medians of the paired runs: beam, hand, runner */
  int vs[3][3];                       /* pair_cmp(i, j) at the threshold */
  int rounds;                         /* paired rounds */
  double spread, theta;               /* measured noise; the threshold (decision_theta, set by the caller) */
} compare_set;

/*
 * The beam's best, hand-coded and the runner-up, full size, paired
 * (run_paired, members beam, hand, runner, the beam's twin) within
 * KEX_BEAM_COMPARE_BUDGET_S once the minimum rounds are done.
 */
static int compare_full_size(search *s, compare_set *c, kex_error *err) {
  paired *p = kex_calloc(1, sizeof *p);
  if (!p) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  const kex_program_src *ps[3] = {c->beam_ps, c->hand_ps, c->runner_ps};
  kex_program *pr[3] = {c->beam, c->hand, c->runner};
  int nm = c->runner ? 3 : 2;
  for (int i = 0; i < nm; i++) fill_time_job(s, ps[i], pr[i], false, &p->t[i]);
  p->t[nm] = p->t[0];
  p->n = nm + 1;
  uint64_t keys[3];
  for (int i = 0; i < nm; i++) keys[i] = memo_key(s, ps[i], &p->t[i]);
  int rc = run_decision(s, p, nm, c->theta, decide_budget(s->screen_s, KEX_BEAM_COMPARE_BUDGET_S), keys, err);
  if (!rc) {
    for (int i = 0; i < nm; i++) {
      c->us[i] = pair_median(p, i, -1);
      for (int j = 0; j < nm; j++) c->vs[i][j] = i == j ? 0 : pair_cmp(p, i, j, c->theta, NULL);
    }
    c->rounds = p->rounds;
    c->spread = pair_spread(p);
    KEX_DEBUG("beam: final: beam %.2f us, hand %.2f us (%d), runner %.2f us (%d vs beam, %d vs hand); %d rounds, "
              "threshold %.3f", c->us[0], c->us[1], c->vs[0][1], c->runner ? c->us[2] : 0, c->vs[2][0], c->vs[2][1],
              p->rounds, c->theta);
  }
  kex_free(p);
  return rc;
}

/* Store the result under key (with the kernel's AST text). */
static int store_result(const kex_beam_opts *o, const kex_cache_beam_key *key, const kex_sched_item *it,
                        const kex_beam_result *res, kex_error *err) {
  kex_cache_beam_value v = {0};
  kex_error ce = {0};
  char *ast_text = NULL;
  int rc;
  v.nopts = res->nopts;
  memcpy(v.opts, res->opts, sizeof(kex_opt) * res->nopts);
  v.best_time_s = res->best_us * 1e-6;
  v.hand_time_s = res->hand_us * 1e-6;
  v.search_time_s = res->search_s;
  v.candidates = res->timed;
  v.decision_samples = res->decision_samples;
  v.decision_spread = res->decision_spread;
  v.decision_tie = res->decision_tie;
  snprintf(v.kernel_name, sizeof v.kernel_name, "%s", res->name);
  if (o->tenant) snprintf(v.tenant, sizeof v.tenant, "%s", o->tenant);
  if (kex_ast_text(it->ast, it->nout, &ast_text, NULL, &ce)) ast_text = NULL;
  if ((rc = kex_cache_beam_put(o->cache, key, &v, ast_text, &ce))) kex_err_set(err, rc, "beam cache put: %s", ce.msg);
  kex_free(ast_text);
  return rc;
}

int kex_beam_optimize(const kex_beam_target *t, kex_device *dev, const kex_beam_opts *opts, kex_beam_result *res,
                      kex_error *err) {
  double t0 = now_s();
  memset(res, 0, sizeof *res);
  if (opts->width < 1 || opts->width > KEX_BEAM_MAX_WIDTH)
    return kex_err_set(err, KEX_EINVAL, "beam width %d not in 1..%d", opts->width, KEX_BEAM_MAX_WIDTH);
  if (opts->timing_runs < 1 || opts->timing_runs > KEX_BEAM_MAX_RUNS || opts->retime_runs < 1 ||
      opts->retime_runs > KEX_BEAM_MAX_RUNS)
    return kex_err_set(err, KEX_EINVAL, "timing runs must be in 1..%d", KEX_BEAM_MAX_RUNS);
  if (t->item >= t->schedule->nitems || t->schedule->items[t->item].kind != KEX_ITEM_KERNEL)
    return kex_err_set(err, KEX_EINVAL, "schedule item %u is not a kernel", t->item);
  const kex_sched_item *it = &t->schedule->items[t->item];
  const kex_renderer_caps *caps = &t->target->caps;
  search s = {opts, dev, opts->exec ? opts->exec : exec_direct, {0}, it, res, {0}};
  s.prog.best_us = INFINITY;
  search_ctx sc = {t, caps, t->target->dialect, dev, NULL};
  kex_kernel *k0 = NULL, *kh = NULL, *kw = NULL, *kr = NULL;
  kex_pool *pool = opts->pool ? opts->pool : kex_pool_process();
  kex_program_src hand_ps = {0}, best_ps = {0};
  kex_program *hand_prog = NULL;
  candidate *best = NULL, *runner = NULL;
  kex_ast_digest dig;
  char sopts[KEX_CACHE_SEARCH_OPTS_MAX];
  const kex_cache_beam_key *remote_key = NULL; /* the remote was asked and must hear how the search ended */
  int rc = kex_kernel_from_item(t->schedule, it, caps, &k0, err);
  if (rc) goto out;
  if ((rc = kex_ast_key(it->ast, it->nout, &dig, err))) goto out;
  memcpy(res->ast_hex, dig.hex, sizeof res->ast_hex);
  kex_cache_beam_key key;
  if ((rc = kex_beam_cache_key(opts, dig.bytes, kex_device_get_identity(dev), sopts, sizeof sopts, &key))) {
    kex_err_set(err, rc, "search options string too long");
    goto out;
  }
  if (opts->cache) {
    rc = lookup_cache(opts, &key, k0, caps, sc.dialect, dev, res, err);
    if (rc == KEX_ENOTFOUND && opts->remote) {
      if (opts->remote->fetch(opts->remote->arg, opts, &key) == 0) { /* stored in opts->cache: checked like any entry */
        rc = lookup_cache(opts, &key, k0, caps, sc.dialect, dev, res, err);
        if (opts->remote->checked) opts->remote->checked(opts->remote->arg, opts, &key, rc == 0);
        if (rc == KEX_ENOTFOUND) remote_key = &key; /* unusable: the search's result replaces it */
      } else {
        remote_key = &key;
      }
    }
    if (rc == 0) {
      res->search_s = now_s() - t0;
      report(&s, "cache");
      goto out;
    }
    if (rc != KEX_ENOTFOUND) goto out;
    rc = 0;
  }

  if ((rc = alloc_bufs(&s, t, err))) goto out;

  /* hand-coded, at full size */
  kh = kex_kernel_copy(k0);
  if (!kh) goto nomem;
  if ((rc = kex_kernel_hand_coded_optimizations(kh, err))) goto out;
  if ((rc = kex_lower_kernel(kh, caps, sc.dialect, NULL, &hand_ps, err))) goto out;
  double secs;
  if ((rc = compile_load(&s, &hand_ps, &hand_prog, NULL, NULL, &secs, err))) goto out;
  res->compiled++;
  if ((rc = choose_timing(&s, &hand_ps, hand_prog, err))) goto out;
  report(&s, "hand");

  /* the search */
  sc.replicas = kex_calloc((size_t)kex_pool_ids(pool), sizeof *sc.replicas);
  if (!sc.replicas) goto nomem;
  if ((rc = run_search(&s, &sc, k0, pool, &best, &runner, err))) goto out;
  res->beam_us = best->us;
  res->factor = best->factor;

  /* the beam's best against hand-coded, full size, alternating */
  kw = kex_kernel_copy(k0);
  if (!kw) goto nomem;
  if ((rc = kex_kernel_apply_opts(kw, best->opts, best->nopts, err))) goto out;
  kex_program *bp = best->prog;
  if (!bp) { /* the search kept the unoptimized kernel */
    if ((rc = kex_lower_kernel(kw, caps, sc.dialect, NULL, &best_ps, err))) goto out;
    if ((rc = compile_load(&s, &best_ps, &best->prog, NULL, NULL, &secs, err))) goto out;
    res->compiled++;
    bp = best->prog;
  }
  const kex_program_src *bps = best->prog && best->ps.src ? &best->ps : &best_ps;
  if (runner) {
    kr = kex_kernel_copy(k0);
    if (!kr) goto nomem;
    if ((rc = kex_kernel_apply_opts(kr, runner->opts, runner->nopts, err))) goto out;
  }
  if (stop_requested(&s)) {
    rc = kex_err_set(err, KEX_ECANCELLED, "beam search cancelled");
    goto out;
  }
  report(&s, "compare");
  compare_set cmp = {&hand_ps, bps, runner ? &runner->ps : NULL, hand_prog, bp, runner ? runner->prog : NULL};
  cmp.theta = decision_theta(opts, best->us * 1e-6); /* a full-size run of the beam's best (extrapolated) */
  if ((rc = compare_full_size(&s, &cmp, err))) goto out;
  /* the final pick, by a fixed order of preference (hysteresis, no timing in the order): hand-coded unless another
     kernel is faster than it beyond the threshold, then the beam's best unless that one is beaten too, then the
     runner-up.  The tie group (the kernels nobody beats) is recorded */
  const kex_kernel *fk[3] = {kw, kh, kr};
  static const int prefer[3] = {1, 0, 2};
  int nf = runner ? 3 : 2, pick = -1, ntie = 0;
  for (int k = 0; k < nf; k++) {
    int i = prefer[k];
    bool beaten = false;
    for (int j = 0; j < nf; j++) beaten |= cmp.vs[j][i] < 0;
    if (beaten) continue;
    ntie++;
    if (pick < 0) pick = i;
  }
  if (pick < 0) pick = 1; /* every kernel beaten by another: a cycle no consistent timing makes; keep hand-coded */
  /* the order goes by median ratios (pair_cmp); the median times can still disagree at the edge: a pick whose median
     time is beyond the band of hand-coded's keeps hand-coded, so by the reported times the result is never more
     than the threshold slower than hand-coded */
  if (pick != 1 && cmp.us[pick] > cmp.us[1] * (1 + cmp.theta)) pick = 1;
  res->hand_us = cmp.us[1];
  res->hand_won = pick == 1;
  res->runner_up_won = pick == 2;
  if (pick == 2) {
    res->beam_us = runner->us;
    res->factor = runner->factor;
  }
  res->decision_tie = ntie > 1;
  res->decision_samples = (uint32_t)cmp.rounds;
  res->decision_spread = cmp.spread;
  if (cmp.theta > res->tie_used) res->tie_used = cmp.theta;
  const kex_kernel *chosen = fk[pick];
  res->best_us = cmp.us[pick];
  res->nopts = chosen->napplied;
  if (chosen->napplied) memcpy(res->opts, chosen->applied_opts, sizeof(kex_opt) * chosen->napplied); /* NULL when none */
  kex_kernel_name(chosen, res->name, sizeof res->name);
  res->search_s = now_s() - t0;
  s.prog.best_us = res->best_us;
  report(&s, "done");

  if (opts->cache) rc = store_result(opts, &key, it, res, err);
  if (remote_key) opts->remote->done(opts->remote->arg, opts, remote_key, rc == 0);
  remote_key = NULL;
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory in the beam search");
out:;
  if (remote_key) opts->remote->done(opts->remote->arg, opts, remote_key, false); /* failed or cancelled */
  int nworkers = kex_pool_ids(pool); /* the pool has finished every job of this search */
  if (sc.replicas)
    for (int i = 0; i < nworkers; i++) replica_free(&sc.replicas[i]);
  kex_free(sc.replicas);
  free_candidate(&s, best);
  free_candidate(&s, runner);
  if (hand_prog) s.exec(opts->exec_ctx, dev, job_free_prog, hand_prog, NULL);
  if (s.bufs.n) s.exec(opts->exec_ctx, dev, job_free_bufs, &s.bufs, NULL);
  kex_program_src_free(&hand_ps);
  kex_program_src_free(&best_ps);
  kex_kernel_free(kw);
  kex_kernel_free(kr);
  kex_kernel_free(kh);
  kex_kernel_free(k0);
  return rc;
}

/*
 * kex_tune.c - `kex tune`: BEAM-search every kernel of a graph and store the
 * results in the beam cache, in-process (search/beam.h) or on a kexd
 * (`kex --server ADDR tune`, libkex's kex_client_tune; the server's cache).
 *
 * kex tune [--device opencl|cpu|NAME] [--beam N] [--json] [--cache PATH | --no-cache]
 *          [--max-candidates N] [--max-rounds N] FILE.json
 * kex --server ADDR tune [--device NAME] [--beam N] [--json] [--timeout S] [--job T] FILE.json
 *
 * A kernel with a valid cached result is not searched again (from_cache).
 * Progress goes to stderr: on a terminal a bar redrawn in place (percent
 * done, ETA, kernel i/n, round, candidates compiled and timed, best us so
 * far), plain lines otherwise; the best shown never goes up (the final
 * full-size timing of a kernel can be slower than the reduced-grid best its
 * search saw; the kernel's result line has the final time).  Kernels are
 * numbered from 1 in both, as `kex run` numbers them.
 * Both modes print the results with the same code: one line per kernel, or
 * with --json {"kernels": [{"name", "ast_key", "opts", "us", "hand_us",
 * "search_s", "from_cache", "hand_won", "rounds", "compiled", "timed",
 * "beam_factor"}]} (beam_factor is null from a server: Tune does not carry it).
 * Exit codes as kex.c: 0 ok, 2 bad input (with --server: INVALID_ARGUMENT or
 * NOT_FOUND, printed with the server's message), 1 other errors.
 */
#if defined(KEX_HAVE_RUN) || defined(KEX_HAVE_LIBKEX)
#include <getopt.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "client/kex_cli.h"
#include "core/alloc.h"

#define TUNE_MAX_WIDTH 64 /* KEX_BEAM_MAX_WIDTH of search/beam.h */

/* ---- what both modes print ---- */

#define TUNE_BAR_WIDTH 24     /* cells of the progress bar */
#define TUNE_LINE_DEFAULT 100 /* columns when the terminal does not say */

/*
 * Progress of a whole tune.  On a terminal it is one line redrawn in place:
 * a bar with the percent done and an ETA, then kernel i/n, phase, round,
 * candidates and the best time so far; elsewhere plain lines, one per phase
 * and round.  Kernels are numbered from 1, as `kex run` numbers them.
 */
typedef struct tune_progress {
  bool tty;
  uint32_t kernel, nkernels, last_round;
  char last_phase[16]; /* "" = nothing printed yet for this kernel */
  double best;         /* the lowest best shown for this kernel (INFINITY = none): what is shown never goes up */
  double t0;           /* kex_cli_now_s() when the tune started */
  bool drawn;          /* the bar is on the terminal's last line */
} tune_progress;

static void progress_init(tune_progress *tp, uint32_t nkernels) {
  memset(tp, 0, sizeof *tp);
  tp->tty = isatty(2) != 0;
  tp->nkernels = nkernels;
  tp->best = INFINITY;
  tp->t0 = kex_cli_now_s();
}

/* Kernel `kernel` (1-based) of n starts: its best starts over. */
static void progress_kernel(tune_progress *tp, uint32_t kernel, uint32_t n) {
  if (kernel == tp->kernel && n == tp->nkernels) return;
  tp->kernel = kernel;
  tp->nkernels = n;
  tp->last_phase[0] = 0;
  tp->best = INFINITY;
}

/*
 * How far one kernel is, from its phase: the hand-coded timing is quick,
 * the search takes most of it (each round closer to the end, as rounds
 * stop when nothing improves), the full-size comparison is the rest.
 */
static double phase_done(const char *phase, uint32_t round) {
  if (!strcmp(phase, "done") || !strcmp(phase, "cache")) return 1;
  if (!strcmp(phase, "compare")) return 0.9;
  if (!strcmp(phase, "search")) return 0.1 + 0.75 * (1 - 1.0 / (1 + round));
  return 0.05;
}

/* Erase the bar (before a line goes to the terminal). */
static void progress_clear(tune_progress *tp) {
  if (!tp->drawn) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  tp->drawn = false;
}

/* "1:05", "1:02:03", "-:--" */
static void eta_text(double s, char *out, size_t cap) {
  if (!isfinite(s) || s < 0 || s > 360000) {
    snprintf(out, cap, "-:--");
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

/* One progress report of kernel tp->kernel; best_us not finite or <= 0 = none yet. */
static void progress_show(tune_progress *tp, const char *phase, uint32_t round, uint32_t round_candidates,
                          uint32_t compiled, uint32_t timed, double best_us) {
  char best[32];
  if (!phase) phase = "";
  if (isfinite(best_us) && best_us > 0 && best_us < tp->best) tp->best = best_us;
  if (isfinite(tp->best))
    snprintf(best, sizeof best, "%.2f us", tp->best);
  else
    snprintf(best, sizeof best, "-");
  if (tp->tty) {
    uint32_t n = tp->nkernels ? tp->nkernels : 1, k = tp->kernel ? tp->kernel : 1;
    double frac = ((double)(k - 1) + phase_done(phase, round)) / n, elapsed = kex_cli_now_s() - tp->t0;
    if (frac > 1) frac = 1;
    char eta[32], bar[TUNE_BAR_WIDTH + 1], line[512];
    eta_text(frac > 0.005 && elapsed > 0.5 ? elapsed * (1 - frac) / frac : NAN, eta, sizeof eta);
    int fill = (int)(frac * TUNE_BAR_WIDTH);
    for (int i = 0; i < TUNE_BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[TUNE_BAR_WIDTH] = 0;
    int len = snprintf(line, sizeof line, "[%s] %3d%%  ETA %s  kernel %u/%u %-7s round %u  best %s  (candidates %u, "
                       "compiled %u, timed %u)", bar, (int)(frac * 100), eta, tp->kernel, tp->nkernels, phase, round,
                       best, round_candidates, compiled, timed);
    struct winsize ws;
    int cols = ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : TUNE_LINE_DEFAULT;
    if (len > cols - 1) len = cols - 1; /* a wrapped line could not be redrawn in place */
    fprintf(stderr, "\r\033[K%.*s", len < 0 ? 0 : len, line);
    fflush(stderr);
    tp->drawn = true;
    return;
  }
  if (tp->last_phase[0] && !strcmp(tp->last_phase, phase) && tp->last_round == round) return;
  snprintf(tp->last_phase, sizeof tp->last_phase, "%s", phase[0] ? phase : "?");
  tp->last_round = round;
  fprintf(stderr, "kernel %u/%u %s round %u: candidates %u compiled %u timed %u best %s\n", tp->kernel, tp->nkernels,
          phase, round, round_candidates, compiled, timed, best);
}

/* The end of a tune: on a terminal, the bar's last state stays as a summary line. */
static void progress_end(tune_progress *tp, bool ok) {
  if (!tp->tty) return;
  progress_clear(tp);
  if (ok) fprintf(stderr, "[%.*s] 100%%  %u kernel%s tuned in %.1f s\n", TUNE_BAR_WIDTH,
                  "##################################################", tp->nkernels, tp->nkernels == 1 ? "" : "s",
                  kex_cli_now_s() - tp->t0);
}

/* The result of one kernel, as both modes report it. */
typedef struct tune_row {
  uint32_t kernel;
  const char *name, *ast_key, *opts;
  double us, hand_us, search_s;
  double factor; /* NAN = not known (a server's result) */
  bool from_cache, hand_won;
  uint32_t rounds, compiled, timed;
} tune_row;

/* Print a kernel's line, or append its JSON object to arr when arr is not NULL. */
static void tune_emit(const tune_row *r, json_t *arr) {
  if (arr) {
    json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:f, s:f, s:f, s:b, s:b, s:i, s:i, s:i, s:o}", "name",
                                         r->name, "ast_key", r->ast_key, "opts", r->opts, "us", r->us, "hand_us",
                                         r->hand_us, "search_s", r->search_s, "from_cache", r->from_cache, "hand_won",
                                         r->hand_won, "rounds", (json_int_t)r->rounds, "compiled",
                                         (json_int_t)r->compiled, "timed", (json_int_t)r->timed, "beam_factor",
                                         isnan(r->factor) ? json_null() : json_real(r->factor)));
    return;
  }
  printf("kernel %u: %-28s %-44s %10.2f us  (hand-coded %.2f us%s)  %s %.2f s, compiled %u, timed %u\n", r->kernel,
         r->name, r->opts[0] ? r->opts : "(no opts)", r->us, r->hand_us, r->hand_won ? ", kept" : "",
         r->from_cache ? "cached," : "search", r->search_s, r->compiled, r->timed);
  fflush(stdout); /* before the progress bar is drawn again on the same terminal */
}

/* Print {"kernels": arr} on stdout. */
static void tune_emit_json(json_t *arr) {
  json_t *doc = json_pack("{s:O}", "kernels", arr);
  json_dumpf(doc, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(doc);
}
#endif

/* ---- in-process ---- */

#ifdef KEX_HAVE_RUN
#include "realize/plan.h"

_Static_assert(TUNE_MAX_WIDTH == KEX_BEAM_MAX_WIDTH, "TUNE_MAX_WIDTH follows KEX_BEAM_MAX_WIDTH");

int kex_cmd_tune(int argc, char **argv);

static void on_progress(const kex_beam_progress *p, void *arg) {
  progress_show(arg, p->phase, p->round, p->round_candidates, p->compiled, p->timed, p->best_us);
}

static void tune_usage(FILE *f) {
  fputs("usage: kex tune [--device opencl|cpu|NAME] [--beam N] [--json] [--cache PATH | --no-cache]\n"
        "                [--max-candidates N] [--max-rounds N] FILE.json\n",
        f);
}

int kex_cmd_tune(int argc, char **argv) {
  const char *device = "opencl", *cache_path = NULL;
  bool as_json = false, no_cache = false;
  long long beam = 2, max_cand = -1, max_rounds = 0;
  int c;
  const kex_cli_opt opts[] = {{"device", 'd', KEX_CLI_STR, &device},
                              {"beam", 'b', KEX_CLI_INT, &beam, 1, KEX_BEAM_MAX_WIDTH},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"cache", 'c', KEX_CLI_STR, &cache_path},
                              {"no-cache", 'n', KEX_CLI_FLAG, &no_cache},
                              {"max-candidates", 'm', KEX_CLI_INT, &max_cand, -1, INT_MAX},
                              {"max-rounds", 'r', KEX_CLI_INT, &max_rounds, 0, INT_MAX},
                              {0}};
  const char *path = NULL;
  if ((c = kex_cli_args("tune", opts, "graph file", &path, argc, argv, tune_usage)) >= 0) return c;
  kex_error err = {0};
  kex_graph *g = NULL;
  kex_device *dev = NULL;
  kex_cache *cache = NULL;
  kex_rplan p;
  kex_target target = {0};
  json_t *out = json_array();
  int ret = 0, rc;
  kex_plan_init(&p, NULL, &target);
  if (kex_cli_graph_load("tune", path, &g)) {
    ret = 2;
    goto out;
  }
  if ((rc = kex_device_open(device, &dev, &err))) {
    fprintf(stderr, "kex tune: device '%s': %s\n", device, err.msg);
    ret = rc == KEX_EINVAL ? 2 : 1;
    goto out;
  }
  kex_target_for_device(kex_device_get_info(dev), &target);
  kex_plan_init(&p, g, &target); /* the plan builder's schedule; each kernel's opts by its BEAM policy */
  if ((rc = kex_plan_schedule(&p, NULL, &err))) {
    fprintf(stderr, "kex tune: %s: %s\n", path, err.msg);
    ret = rc == KEX_EASSIGN ? 2 : 1;
    goto out;
  }
  /* plan.h's cache policy: a tune keeps its results, so a cache that cannot be opened is an error */
  if ((rc = kex_plan_cache_open(no_cache ? "" : cache_path, KEX_PLAN_CACHE_KEEP, "beam cache", &cache, &err))) {
    fprintf(stderr, "kex tune: %s\n", err.msg);
    ret = 1;
    goto out;
  }
  const kex_schedule *s = p.s;
  tune_progress tp;
  progress_init(&tp, s->nkernels);
  for (uint32_t i = 0; i < s->nitems; i++) {
    if (s->items[i].kind != KEX_ITEM_KERNEL) continue;
    progress_kernel(&tp, tp.kernel + 1, s->nkernels);
    kex_plan_policy pol;
    kex_plan_policy_beam(&pol, beam, dev, cache);
    if (max_cand >= 0) pol.beam.max_candidates = max_cand;
    pol.beam.max_rounds = max_rounds;
    pol.beam.progress = on_progress;
    pol.beam.progress_arg = &tp;
    kex_beam_result br;
    if ((rc = kex_plan_choose_opts(&pol, g, s, i, &target, &br, &err))) {
      progress_end(&tp, false);
      fprintf(stderr, "kex tune: kernel %u: %s\n", tp.kernel, err.msg);
      ret = 1;
      goto out;
    }
    progress_clear(&tp);
    if (br.cache_note[0]) fprintf(stderr, "kex tune: kernel %u: %s\n", tp.kernel, br.cache_note);
    char ot[KEX_CACHE_OPTS_TEXT_MAX];
    kex_cache_opts_format(br.opts, br.nopts, ot, sizeof ot);
    tune_row row = {tp.kernel,     br.name,       br.ast_hex,  ot,        br.best_us, br.hand_us,
                    br.search_s,   br.factor,     br.from_cache, br.hand_won, br.rounds, br.compiled,
                    br.timed};
    tune_emit(&row, as_json ? out : NULL);
  }
  progress_end(&tp, true);
  if (as_json) tune_emit_json(out);
out:
  json_decref(out);
  kex_cache_close(cache);
  kex_plan_clear(&p);
  kex_device_unref(dev);
  kex_graph_free(g);
  return ret;
}
#endif

/* ---- against a server ---- */

#ifdef KEX_HAVE_LIBKEX
typedef struct remote_tune {
  tune_progress tp;
  json_t *arr; /* --json: the results so far; else NULL (lines are printed as kernels finish) */
} remote_tune;

static void on_tune_event(const kex_tune_event *ev, void *ud) {
  remote_tune *rt = ud;
  progress_kernel(&rt->tp, ev->i, ev->n);
  if (!ev->finished) {
    progress_show(&rt->tp, ev->phase, ev->round, ev->round_candidates, ev->compiled, ev->timed, ev->best_us);
    return;
  }
  /* the in-process search reports its "done" phase (or "cache") before the result */
  const kex_remote_cache_entry *e = ev->entry;
  progress_show(&rt->tp, ev->phase && *ev->phase ? ev->phase : ev->from_cache ? "cache" : "done", ev->round,
                ev->round_candidates, ev->compiled, ev->timed, e ? e->best_us : ev->best_us);
  tune_row row = {ev->i,     e ? e->kernel_name : ev->kernel, e ? e->key : "", e ? e->opts : "", e ? e->best_us : 0,
                  e ? e->hand_us : 0, ev->search_s, NAN, ev->from_cache, ev->hand_won, ev->round, ev->compiled,
                  ev->timed};
  progress_clear(&rt->tp);
  tune_emit(&row, rt->arr);
}

static void remote_tune_usage(FILE *f) {
  fputs("usage: kex --server ADDR tune [--device NAME] [--beam N] [--json] [--timeout S] [--job T] FILE.json\n", f);
}

int kex_remote_cmd_tune(kex_cli_remote *r, int argc, char **argv) {
  const char *device = NULL, *job = NULL;
  bool as_json = false;
  long long beam = 2;
  int c, ret = 0;
  double timeout = 0;
  char *text = NULL;
  kex_tune_result *res = NULL;
  kex_status st;
  const kex_cli_opt opts[] = {{"device", 'd', KEX_CLI_STR, &device},
                              {"beam", 'b', KEX_CLI_INT, &beam, 1, TUNE_MAX_WIDTH},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"timeout", 't', KEX_CLI_NUM, &timeout, 0, 1e9},
                              {"job", 0, KEX_CLI_STR, &job},
                              {"cache", 'c', KEX_CLI_LOCAL_ARG, NULL, 0, 0, "the server uses its own cache and limits"},
                              {"no-cache", 'n', KEX_CLI_LOCAL, NULL, 0, 0, "the server uses its own cache and limits"},
                              {"max-candidates", 'm', KEX_CLI_LOCAL_ARG, NULL, 0, 0, "the server uses its own cache and limits"},
                              {"max-rounds", 'r', KEX_CLI_LOCAL_ARG, NULL, 0, 0, "the server uses its own cache and limits"},
                              {0}};
  const char *path = NULL;
  if ((c = kex_cli_args("tune", opts, "graph file", &path, argc, argv, remote_tune_usage)) >= 0) return c;
  if (!(text = kex_cli_read_graph("tune", path))) return 2;
  if ((ret = kex_cli_remote_open(r, "tune", job, true))) goto out;
  remote_tune rt = {.arr = as_json ? json_array() : NULL};
  progress_init(&rt.tp, 0);
  kex_tune_opts o = {.beam_width = (uint32_t)beam, .device = device, .timeout_s = timeout};
  if (kex_client_tune(r->client, r->job, text, &o, on_tune_event, &rt, &res, &st)) {
    progress_end(&rt.tp, false);
    ret = kex_cli_fail("tune", &st);
  } else {
    progress_end(&rt.tp, true);
    if (as_json) tune_emit_json(rt.arr);
  }
  json_decref(rt.arr);
out:
  kex_tune_result_free(res);
  kex_cli_remote_done(r);
  kex_free(text);
  return ret;
}
#endif

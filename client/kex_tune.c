/*
 * kex_tune.c - `kex tune`: BEAM-search every kernel of a graph in-process
 * (search/beam.h) and store the results in the beam cache.
 *
 * kex tune [--device opencl|cpu|NAME] [--beam N] [--json] [--cache PATH | --no-cache]
 *          [--max-candidates N] [--max-rounds N] FILE.json
 *
 * A kernel with a valid cached result is not searched again (from_cache).
 * Progress goes to stderr: a redrawn line on a terminal (kernel i/n, round,
 * candidates compiled and timed, best us so far), plain lines otherwise.
 * Exit codes as kex.c: 0 ok, 2 bad input, 1 other errors.
 */
#ifdef KEX_HAVE_RUN
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "search/beam.h"
#include "search/cache.h"
#include "search/run.h"

int kex_cmd_tune(int argc, char **argv);

typedef struct tune_progress {
  bool tty;
  uint32_t kernel, nkernels, last_round;
  const char *last_phase;
} tune_progress;

static void on_progress(const kex_beam_progress *p, void *arg) {
  tune_progress *tp = arg;
  char best[32];
  if (isfinite(p->best_us))
    snprintf(best, sizeof best, "%.2f us", p->best_us);
  else
    snprintf(best, sizeof best, "-");
  if (tp->tty) {
    fprintf(stderr, "\r\033[Kkernel %u/%u  %-7s round %u  candidates %u  compiled %u  timed %u  best %s",
            tp->kernel, tp->nkernels, p->phase, p->round, p->round_candidates, p->compiled, p->timed, best);
    if (!strcmp(p->phase, "done") || !strcmp(p->phase, "cache")) fputc('\n', stderr);
    fflush(stderr);
    return;
  }
  if (tp->last_phase && !strcmp(tp->last_phase, p->phase) && tp->last_round == p->round) return;
  tp->last_phase = p->phase;
  tp->last_round = p->round;
  fprintf(stderr, "kernel %u/%u %s round %u: candidates %u compiled %u timed %u best %s\n", tp->kernel, tp->nkernels,
          p->phase, p->round, p->round_candidates, p->compiled, p->timed, best);
}

static void tune_usage(FILE *f) {
  fputs("usage: kex tune [--device opencl|cpu|NAME] [--beam N] [--json] [--cache PATH | --no-cache]\n"
        "                [--max-candidates N] [--max-rounds N] FILE.json\n",
        f);
}

int kex_cmd_tune(int argc, char **argv) {
  static const struct option lopts[] = {{"device", required_argument, NULL, 'd'}, {"beam", required_argument, NULL, 'b'},
                                        {"json", no_argument, NULL, 'j'},        {"cache", required_argument, NULL, 'c'},
                                        {"no-cache", no_argument, NULL, 'n'},    {"max-candidates", required_argument, NULL, 'm'},
                                        {"max-rounds", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'},
                                        {0}};
  const char *device = "opencl", *cache_path = NULL;
  bool as_json = false, no_cache = false;
  int beam = 2, max_cand = -1, max_rounds = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "d:b:jc:nm:r:h", lopts, NULL)) != -1) {
    switch (c) {
    case 'd': device = optarg; break;
    case 'b': beam = atoi(optarg); break;
    case 'j': as_json = true; break;
    case 'c': cache_path = optarg; break;
    case 'n': no_cache = true; break;
    case 'm': max_cand = atoi(optarg); break;
    case 'r': max_rounds = atoi(optarg); break;
    case 'h': tune_usage(stdout); return 0;
    default: tune_usage(stderr); return 2;
    }
  }
  if (beam < 1 || beam > KEX_BEAM_MAX_WIDTH || max_rounds < 0 || optind != argc - 1) {
    fprintf(stderr, "kex tune: need one graph file and --beam in 1..%d\n", KEX_BEAM_MAX_WIDTH);
    tune_usage(stderr);
    return 2;
  }
  const char *path = argv[optind];
  kex_limits limits = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  kex_device *dev = NULL;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_cache *cache = NULL;
  kex_arena arena;
  kex_arena_init(&arena, 0);
  json_t *out = json_array();
  int ret = 0, rc;
  if ((rc = kex_graph_from_json_file(path, &limits, &g, &err))) {
    fprintf(stderr, "kex tune: %s: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = 2;
    goto out;
  }
  if ((rc = kex_device_open(device, &dev, &err))) {
    fprintf(stderr, "kex tune: device '%s': %s\n", device, err.msg);
    ret = rc == KEX_EINVAL ? 2 : 1;
    goto out;
  }
  const char *kind = kex_device_get_identity(dev)->kind;
  bool cpu = strcmp(kind, "cpu") == 0 || strstr(kind, "+cpu") != NULL;
  kex_replay_opts ro = kex_run_replay_opts(cpu);
  if ((rc = kex_replay_graph(g, &ro, &arena, &r, &err)) || (rc = kex_schedule_create(r, &s, &err))) {
    fprintf(stderr, "kex tune: %s: %s\n", path, err.msg);
    ret = rc == KEX_EASSIGN ? 2 : 1;
    goto out;
  }
  if (!no_cache) {
    char cp[4096];
    if (cache_path)
      snprintf(cp, sizeof cp, "%s", cache_path);
    else if ((rc = kex_beam_default_cache_path(cp, sizeof cp, &err))) {
      fprintf(stderr, "kex tune: %s\n", err.msg);
      ret = 1;
      goto out;
    }
    if ((rc = kex_cache_open(cp, &cache, &err))) {
      fprintf(stderr, "kex tune: cache %s: %s\n", cp, err.msg);
      ret = 1;
      goto out;
    }
  }
  tune_progress tp = {isatty(2) != 0, 0, s->nkernels, 0, NULL};
  for (uint32_t i = 0; i < s->nitems; i++) {
    if (s->items[i].kind != KEX_ITEM_KERNEL) continue;
    tp.kernel++;
    tp.last_phase = NULL;
    kex_beam_opts bo;
    kex_beam_opts_init(&bo, beam);
    if (max_cand >= 0) bo.max_candidates = max_cand;
    bo.max_rounds = max_rounds;
    bo.cache = cache;
    bo.progress = on_progress;
    bo.progress_arg = &tp;
    kex_beam_target t = {g, s, i, cpu};
    kex_beam_result br;
    if ((rc = kex_beam_optimize(&t, dev, &bo, &br, &err))) {
      fprintf(stderr, "kex tune: kernel %u: %s\n", tp.kernel, err.msg);
      ret = 1;
      goto out;
    }
    if (br.cache_note[0]) fprintf(stderr, "kex tune: kernel %u: %s\n", tp.kernel, br.cache_note);
    char ot[KEX_CACHE_OPTS_TEXT_MAX];
    kex_cache_opts_format(br.opts, br.nopts, ot, sizeof ot);
    if (as_json) {
      json_array_append_new(out, json_pack("{s:s, s:s, s:s, s:f, s:f, s:f, s:b, s:b, s:i, s:i, s:i, s:f}", "name", br.name,
                                           "ast_key", br.ast_hex, "opts", ot, "us", br.best_us, "hand_us", br.hand_us,
                                           "search_s", br.search_s, "from_cache", br.from_cache, "hand_won", br.hand_won,
                                           "rounds", (json_int_t)br.rounds, "compiled", (json_int_t)br.compiled,
                                           "timed", (json_int_t)br.timed, "beam_factor", br.factor));
    } else {
      printf("kernel %u: %-28s %-44s %10.2f us  (hand-coded %.2f us%s)  %s %.2f s, compiled %u, timed %u\n", tp.kernel,
             br.name, ot[0] ? ot : "(no opts)", br.best_us, br.hand_us, br.hand_won ? ", kept" : "",
             br.from_cache ? "cached," : "search", br.search_s, br.compiled, br.timed);
    }
  }
  if (as_json) {
    json_t *doc = json_pack("{s:O}", "kernels", out);
    json_dumpf(doc, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(doc);
  }
out:
  json_decref(out);
  kex_cache_close(cache);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_arena_destroy(&arena);
  kex_device_unref(dev);
  kex_graph_free(g);
  return ret;
}
#endif

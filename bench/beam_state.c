/*
 * bench/beam_state.c - is a short cpu kernel's time a property of where it
 * lies in memory, or of when it runs?  (issue 15 item 4: why two beam
 * searches of one kernel pick differently.)
 *
 * Builds one kernel of test_beam's graphs (sum64K: the first kernel of a
 * 64K sum; muladd64K: a*b+c on 64K floats) on the cpu device with the opts
 * given, loads its binary 4 times (each load dlopens a copy at an address
 * of its own) and allocates 4 sets of its buffers (same contents), then
 * times blocks of serial runs (kex_device_set_serial_timing, as the beam
 * times short cpu kernels): in each block every load on buffer set 0 and
 * every buffer set with load 0, interleaved run by run, `--runs` times
 * each.  One line per block: the median µs of each load, then of each set.
 *
 * If placement decided the time, the columns of one line would differ and
 * keep their order from line to line.  What this machine showed
 * (bench/results/beam-repeatable.md, "Eighth step"): the columns of a
 * line agree to about 1%, and whole lines move together between levels
 * (muladd64K UPCAST(0,4): 6.7, 8.7 or 12.5 µs), more often after the
 * thread slept (--sleep-ms before each block).
 *
 * The last column is a clock probe: a dependent multiply-add chain timed
 * beside the runs, which follows the core's clock and nothing else (in
 * bench/results/beam-repeatable.md it stayed at 6.7-6.9 µs while
 * UPCAST(0,4) moved between 10 and 14 µs: the states are not the clock).
 *
 * --vs OPTS2 (with --device cpu or opencl): the pair's ratio instead, A
 * (--opts) and B (--vs) run back to back on each of 4 buffer sets in turn,
 * one line per block: the median tA/tB on each set, then A's and B's
 * medians.  On PoCL, sum64K's GROUP(0,4) against GROUP(0,8) (a pair the
 * beam's 25% band cut differently in two searches): the sets agree within
 * a line, and the lines move between 1.21 and 1.42 -- placement again is
 * not it, and the pair's own ratio straddles the band with time.
 *
 * usage: bench_beam_state [--graph sum64K|muladd64K] [--opts "UPCAST(0,4) UPCAST(0,4)"] [--blocks N]
 *                         [--runs N] [--sleep-ms N] [--device cpu|opencl --vs OPTS2]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "codegen/target.h"
#include "core/arena.h"
#include "devices/device.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "search/cache.h"

#define PLACES 4
#define MAX_RUNS 1000

static const char *graph_text(const char *name) {
  if (!strcmp(name, "sum64K"))
    return "{\"format\":\"kex.graph.v1\",\"device\":\"default\",\"nodes\":["
           "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[65536],\"fill\":{\"random\":1}},"
           "{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]},{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[]}],\"outputs\":[2]}";
  if (!strcmp(name, "muladd64K"))
    return "{\"format\":\"kex.graph.v1\",\"device\":\"default\",\"nodes\":["
           "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[65536],\"fill\":{\"random\":1}},"
           "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[65536],\"fill\":{\"random\":2}},"
           "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[65536],\"fill\":{\"random\":3}},"
           "{\"op\":\"MUL\",\"src\":[0,1]},{\"op\":\"ADD\",\"src\":[3,2]}],\"outputs\":[4]}";
  return NULL;
}

static int die(const char *what, const kex_error *err) {
  fprintf(stderr, "bench_beam_state: %s: %s\n", what, err ? err->msg : "");
  return 1;
}

/* One run of prog on bufs (serially timed when serial); its µs.  A failed run ends the program (a median with it in
   would mislead). */
static double run_one(kex_device *dev, kex_program *prog, const kex_program_src *ps, kex_buffer *const *bufs,
                      bool serial) {
  kex_buffer *args[KEX_DEVICE_MAX_BUFS];
  kex_event *ev = NULL;
  kex_error err = {0};
  double s = 0;
  for (uint32_t a = 0; a < ps->nargs; a++) args[a] = bufs[ps->args[a].idx];
  if (serial) kex_device_set_serial_timing(dev, true);
  int rc = kex_program_launch(prog, ps->global, ps->has_local ? ps->local : NULL, args, (int)ps->nargs, NULL, 0, &ev,
                              &err);
  if (!rc) rc = kex_event_elapsed(ev, &s, &err);
  if (serial) kex_device_set_serial_timing(dev, false);
  kex_event_free(ev);
  if (rc) exit(die("run", &err));
  return s * 1e6;
}

/* PLACES sets of the item's buffers on dev, the same contents in each; nonzero (reported) when one fails. */
static int alloc_sets(kex_device *dev, const kex_sched_item *it, const kex_replay *r,
                      kex_buffer *bufs[PLACES][KEX_DEVICE_MAX_BUFS]) {
  kex_error err = {0};
  for (int p = 0; p < PLACES; p++)
    for (uint32_t j = 0; j < it->nbufs; j++) {
      const kex_buffer_info *bi = &r->buffers[it->bufs[j]];
      size_t bytes = (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype), n = bytes / 4;
      float *host = malloc(bytes ? bytes : 16);
      if (!host) return die("out of memory", NULL);
      for (size_t e = 0; e < n; e++) host[e] = (float)(e % 97) * 0.01f;
      int rc = kex_device_alloc(dev, bytes ? bytes : 16, &bufs[p][j], &err) ||
               kex_buffer_copy_in(bufs[p][j], 0, host, bytes, &err);
      free(host);
      if (rc) return die("buffers", &err);
    }
  return 0;
}

/* A dependent multiply-add chain: its time follows the core's clock only (no memory traffic). */
static volatile uint64_t probe_sink;
static double probe_once(void) {
  struct timespec a, b;
  uint64_t x = probe_sink | 1;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < 5000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  clock_gettime(CLOCK_MONOTONIC, &b);
  probe_sink = x;
  return (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) * 1e-3;
}

/*
 * --vs: programs A (--opts) and B (--vs) on PLACES buffer sets, A then B on
 * one set, sets in turn, `runs` times per block.  One line per block: the
 * median of tA / tB on each set, then A's and B's medians over all.  If
 * where the buffers lie moved the pair's ratio, the columns would differ
 * and keep their order from line to line.
 */
static int pair_mode(const char *devname, const char *gname, const char *a_text, const char *b_text,
                     const kex_schedule *s, const kex_sched_item *it, const kex_replay *r, const kex_target *tg,
                     kex_program_src *pa, int blocks, int runs, int sleep_ms) {
  kex_error err = {0};
  kex_opt opts[KEX_CACHE_MAX_OPTS];
  uint32_t nopts = 0;
  kex_kernel *k = NULL;
  kex_program_src pb = {0};
  if (kex_cache_opts_parse(b_text, opts, KEX_CACHE_MAX_OPTS, &nopts, &err)) return die("--vs", &err);
  if (kex_kernel_from_item(s, it, &tg->caps, &k, &err) || kex_kernel_apply_opts(k, opts, nopts, &err))
    return die("--vs opts", &err);
  if (kex_lower_kernel(k, &tg->caps, tg->dialect, NULL, &pb, &err)) return die("lower --vs", &err);
  kex_device *dev = NULL;
  kex_program *pr[2] = {0};
  if (kex_device_open(devname, &dev, &err)) return die("device", &err);
  if (kex_device_build(dev, pa->src, pa->name, &pr[0], NULL, NULL, &err) ||
      kex_device_build(dev, pb.src, pb.name, &pr[1], NULL, NULL, &err))
    return die("build", &err);
  bool serial = !strcmp(devname, "cpu");
  kex_buffer *bufs[PLACES][KEX_DEVICE_MAX_BUFS] = {{0}};
  if (alloc_sets(dev, it, r, bufs)) return 1;
  printf("%s on %s: [%s] %s vs [%s] %s, median tA/tB per buffer set 0-%d | median A, B us\n", gname, devname, a_text,
         pa->name, b_text, pb.name, PLACES - 1);
  static double ratio[PLACES][MAX_RUNS], ta[PLACES * MAX_RUNS], tb[PLACES * MAX_RUNS];
  for (int b = 0; b < blocks; b++) {
    if (sleep_ms > 0) nanosleep(&(struct timespec){sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L}, NULL);
    for (int p = 0; p < PLACES; p++)
      for (int m = 0; m < 2; m++) run_one(dev, pr[m], m ? &pb : pa, bufs[p], serial);
    int na = 0;
    for (int i = 0; i < runs; i++)
      for (int p = 0; p < PLACES; p++) {
        bool flip = (i + p) & 1; /* A first, then B first, in turn */
        double x = run_one(dev, pr[flip], flip ? &pb : pa, bufs[p], serial);
        double y = run_one(dev, pr[!flip], !flip ? &pb : pa, bufs[p], serial);
        double tA = flip ? y : x, tB = flip ? x : y;
        ratio[p][i] = tA / tB;
        ta[na] = tA, tb[na++] = tB;
      }
    for (int p = 0; p < PLACES; p++) {
      qsort(ratio[p], (size_t)runs, sizeof ratio[p][0], cmp_double);
      printf(" %6.3f", ratio[p][runs / 2]);
    }
    qsort(ta, (size_t)na, sizeof ta[0], cmp_double);
    qsort(tb, (size_t)na, sizeof tb[0], cmp_double);
    printf(" | %7.2f %7.2f\n", ta[na / 2], tb[na / 2]);
  }
  for (int p = 0; p < PLACES; p++)
    for (uint32_t j = 0; j < it->nbufs; j++) kex_buffer_free(bufs[p][j]);
  kex_program_free(pr[0]);
  kex_program_free(pr[1]);
  kex_program_src_free(&pb);
  kex_kernel_free(k);
  kex_device_unref(dev);
  return 0;
}

int main(int argc, char **argv) {
  const char *gname = "muladd64K", *opts_text = "UPCAST(0,4)", *vs_text = NULL, *devname = "cpu";
  int blocks = 20, runs = 100, sleep_ms = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--graph") && i + 1 < argc) gname = argv[++i];
    else if (!strcmp(argv[i], "--opts") && i + 1 < argc) opts_text = argv[++i];
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) sleep_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--vs") && i + 1 < argc) vs_text = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) devname = argv[++i];
    else {
      fprintf(stderr, "usage: bench_beam_state [--graph sum64K|muladd64K] [--opts OPTS] [--blocks N] [--runs N] "
                      "[--sleep-ms N] [--device cpu|opencl --vs OPTS2]\n");
      return 2;
    }
  }
  if (runs < 1 || runs > MAX_RUNS || blocks < 1) return die("--runs must be 1..1000 and --blocks at least 1", NULL);
  const char *text = graph_text(gname);
  if (!text) return die("unknown graph (sum64K or muladd64K)", NULL);

  kex_error err = {0};
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_graph *g = NULL;
  kex_arena arena;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_target tg;
  kex_arena_init(&arena, 0);
  if (kex_graph_from_json(text, strlen(text), &lim, &g, &err)) return die("graph", &err);
  if (kex_target_for_name(devname, &tg)) return die("no such target", NULL);
  kex_replay_opts ro = kex_target_replay_opts(&tg);
  if (kex_replay_graph(g, &ro, &arena, &r, &err) || kex_schedule_create(r, &s, &err)) return die("schedule", &err);
  const kex_sched_item *it = NULL;
  for (uint32_t i = 0; i < s->nitems && !it; i++)
    if (s->items[i].kind == KEX_ITEM_KERNEL) it = &s->items[i];
  if (!it) return die("no kernel", NULL);

  kex_opt opts[KEX_CACHE_MAX_OPTS];
  uint32_t nopts = 0;
  kex_kernel *k = NULL;
  kex_program_src ps = {0};
  if (kex_cache_opts_parse(opts_text, opts, KEX_CACHE_MAX_OPTS, &nopts, &err)) return die("--opts", &err);
  if (kex_kernel_from_item(s, it, &tg.caps, &k, &err) || kex_kernel_apply_opts(k, opts, nopts, &err))
    return die("opts", &err);
  if (kex_lower_kernel(k, &tg.caps, tg.dialect, NULL, &ps, &err)) return die("lower", &err);

  if (vs_text) return pair_mode(devname, gname, opts_text, vs_text, s, it, r, &tg, &ps, blocks, runs, sleep_ms);
  kex_device *dev = NULL;
  kex_program *prog[PLACES] = {0};
  unsigned char *bin = NULL;
  size_t binsz = 0;
  if (kex_device_open("cpu", &dev, &err)) return die("cpu device", &err);
  if (kex_device_build(dev, ps.src, ps.name, &prog[0], &bin, &binsz, &err)) return die("build", &err);
  if (!bin) return die("the cpu device gave no binary", NULL);
  for (int p = 1; p < PLACES; p++)
    if (kex_device_load(dev, bin, binsz, ps.name, &prog[p], &err)) return die("load", &err);
  kex_buffer *bufs[PLACES][KEX_DEVICE_MAX_BUFS] = {{0}};
  if (alloc_sets(dev, it, r, bufs)) return 1;

  printf("%s [%s] %s, serial runs, median us per block: loads 0-3 (buffer set 0) | buffer sets 0-3 (load 0) | "
         "clock probe\n", gname, opts_text, ps.name);
  static double t[2 * PLACES + 1][MAX_RUNS];
  for (int b = 0; b < blocks; b++) {
    if (sleep_ms > 0) nanosleep(&(struct timespec){sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L}, NULL);
    for (int c = 0; c < 2 * PLACES; c++) run_one(dev, prog[c < PLACES ? c : 0], &ps, bufs[c < PLACES ? 0 : c - PLACES], true);
    for (int i = 0; i < runs; i++) {
      for (int c = 0; c < 2 * PLACES; c++)
        t[c][i] = run_one(dev, prog[c < PLACES ? c : 0], &ps, bufs[c < PLACES ? 0 : c - PLACES], true);
      t[2 * PLACES][i] = probe_once();
    }
    for (int c = 0; c <= 2 * PLACES; c++) {
      qsort(t[c], (size_t)runs, sizeof t[c][0], cmp_double);
      printf("%s%6.2f", c == PLACES || c == 2 * PLACES ? " |" : " ", t[c][runs / 2]);
    }
    printf("\n");
  }
  for (int p = 0; p < PLACES; p++) {
    for (uint32_t j = 0; j < it->nbufs; j++) kex_buffer_free(bufs[p][j]);
    kex_program_free(prog[p]);
  }
  free(bin);
  kex_program_src_free(&ps);
  kex_kernel_free(k);
  kex_device_unref(dev);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_arena_destroy(&arena);
  kex_graph_free(g);
  return 0;
}

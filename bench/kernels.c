/*
 * bench/kernels.c - kernel speed with hand-coded opts, against a baseline
 * measured in the same run.
 *
 * For each graph of ../shared/bench-graphs/ (512² and 1024² float32 matmul,
 * sum of 4M floats, a*b+c on 4M floats, softmax over (4096, 1024)) on the
 * opencl device and on the cpu device (all cores, and 1 thread), the
 * graph's kernels run through kex_run_graph with `--repeat` timed runs each
 * (median after a warm-up); the graph time is the sum of its kernels.
 * Baselines: OpenBLAS cblas_sgemm (median of the same number of runs, all
 * cores; for the cpu_1thread rows OpenBLAS on one thread, so that row is a
 * per-core comparison, which two threads waiting for each other on a busy
 * machine do not disturb) for the matmuls, and memcpy of the graph's input
 * bytes (a memory-bandwidth floor) for the others.  The matmul outputs are checked
 * against OpenBLAS; "openblas_core" in the file names the kernels OpenBLAS
 * ran (its choice for this CPU, or OPENBLAS_CORETYPE's: this machine's
 * environment sets Haswell, AVX2, on an AVX-512 CPU where OpenBLAS would
 * pick Cooperlake).  Writes bench/results/kernels.json and prints a table
 * with tinygrad 0.9.0's BEAM=0 times on PoCL here (spec 16.4) beside ours.
 *
 * usage: bench_kernels [--out FILE] [--graphs DIR] [--repeat N] [--only SUBSTR] [--device NAME]
 *                      [--beam N]
 * (--only: graphs whose file name contains SUBSTR; --device: only opencl,
 * cpu or cpu_1thread; both for quick checks, the results file wants all;
 * --beam N: each kernel's opts from a BEAM search of width N, with no cache
 * file, so every run searches afresh; the rows then say "beam": N)
 */
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "core/alloc.h"
#include "realize/run.h"

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return t[n / 2];
}

/* The graph's BUFFER inputs as host arrays (the same bytes kex_run_graph uploads). */
static size_t input_bytes(const kex_graph *g, float **first, float **second) {
  size_t total = 0;
  int k = 0;
  for (uint32_t i = 0; i < g->nnodes; i++) {
    const kex_gnode *n = &g->nodes[i];
    if (n->op != KEX_GOP_BUFFER) continue;
    size_t elems = 1;
    for (int d = 0; d < n->ndim; d++) elems *= (size_t)n->shape[d];
    size_t bytes = elems * (size_t)kex_dtype_size(n->dtype);
    total += bytes;
    float **dst = k == 0 ? first : k == 1 ? second : NULL;
    if (dst) {
      *dst = kex_malloc(bytes);
      kex_fill_buffer(n, *dst, bytes, NULL);
    }
    k++;
  }
  return total;
}

static double sgemm_us(const float *a, const float *b, float *c, int n, int reps) {
  double *t = calloc((size_t)reps, sizeof *t);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
  for (int i = 0; i < reps; i++) {
    double t0 = now_us();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    t[i] = now_us() - t0;
  }
  double m = median(t, reps);
  free(t);
  return m;
}

static double memcpy_us(size_t bytes, int reps) {
  char *src = malloc(bytes), *dst = malloc(bytes);
  memset(src, 1, bytes);
  memset(dst, 2, bytes);
  double *t = calloc((size_t)reps, sizeof *t);
  for (int i = -1; i < reps; i++) {
    double t0 = now_us();
    memcpy(dst, src, bytes);
    if (i >= 0) t[i] = now_us() - t0;
  }
  double m = median(t, reps);
  free(t);
  free(src);
  free(dst);
  return m;
}

typedef struct devrun {
  const char *label;
  double us;
  char kernels[1024];
  int ok;
} devrun;

/* Run g on dev; sum of kernel medians; check a matmul output against ref (NULL: no check). */
static int run_on(kex_device *dev, const kex_graph *g, int reps, int beam, const float *ref, size_t nref,
                  devrun *out) {
  kex_run_opts ro = {.repeat = reps, .beam = beam, .cache_path = ""};
  kex_run_result res;
  kex_error err = {0};
  out->us = 0;
  out->kernels[0] = 0;
  out->ok = 0;
  if (kex_run_graph(g, dev, &ro, &res, &err)) {
    fprintf(stderr, "%s: %s\n", out->label, err.msg);
    return -1;
  }
  size_t off = 0;
  for (uint32_t i = 0; i < res.nkernels; i++) {
    out->us += res.kernels[i].us;
    off += (size_t)snprintf(out->kernels + off, sizeof out->kernels - off, "%s%s [%s] %.1fus", i ? "; " : "",
                            res.kernels[i].name, res.kernels[i].opts, res.kernels[i].us);
    if (off >= sizeof out->kernels) off = sizeof out->kernels - 1;
  }
  out->ok = 1;
  if (ref) {
    const float *got = res.outputs[0].data;
    double maxerr = 0;
    for (size_t i = 0; i < nref; i++) maxerr = fmax(maxerr, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1.0));
    if (maxerr > 1e-3) {
      fprintf(stderr, "%s: output differs from OpenBLAS (max rel err %g)\n", out->label, maxerr);
      out->ok = 0;
    }
  }
  kex_run_result_free(&res);
  return 0;
}

int main(int argc, char **argv) {
  const char *outpath = "bench/results/kernels.json";
  const char *dir = getenv("KEX_BENCH_GRAPHS_DIR") ? getenv("KEX_BENCH_GRAPHS_DIR") : "../shared/bench-graphs";
  int reps = 10, beam = 0;
  const char *only = NULL, *only_dev = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) outpath = argv[++i];
    else if (strcmp(argv[i], "--graphs") == 0 && i + 1 < argc) dir = argv[++i];
    else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) only_dev = argv[++i];
    else if (strcmp(argv[i], "--beam") == 0 && i + 1 < argc) beam = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_kernels [--out FILE] [--graphs DIR] [--repeat N] [--only SUBSTR] [--device NAME] "
                      "[--beam N]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  kex_error err;
  kex_device *cl = NULL, *cpu = NULL, *cpu1 = NULL;
  if (kex_device_open("opencl", &cl, &err)) fprintf(stderr, "opencl: %s (skipped)\n", err.msg);
  if (kex_device_open("cpu", &cpu, &err)) fprintf(stderr, "cpu: %s\n", err.msg);
  setenv("KEX_CPU_THREADS", "1", 1);
  if (kex_device_open("cpu", &cpu1, &err)) fprintf(stderr, "cpu (1 thread): %s\n", err.msg);
  unsetenv("KEX_CPU_THREADS");
  struct {
    const char *file;
    int matmul_n;
    double tinygrad_us; /* BEAM=0 on PoCL, 2 vCPUs (spec 16.4) */
  } graphs[] = {{"matmul512.json", 512, 3680}, {"matmul1024.json", 1024, 110600}, {"sum4M.json", 0, 430},
                {"muladd4M.json", 0, 1180}, {"softmax4096x1024.json", 0, -1}};
  json_t *arr = json_array();
  char load_start[64], load_end[64];
  loadavg(load_start, sizeof load_start);
  printf("%-18s %-12s %11s %11s %9s %12s %9s %9s\n", "graph", "device", "kex_us", "baseline_us", "x_base", "tinygrad_us",
         "x_tg", "ok");
  for (size_t gi = 0; gi < sizeof graphs / sizeof *graphs; gi++) {
    char path[1024];
    if (only && !strstr(graphs[gi].file, only)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, graphs[gi].file);
    kex_limits lim = KEX_LIMITS_DEFAULT;
    kex_graph *g = NULL;
    if (kex_graph_from_json_file(path, &lim, &g, &err)) {
      fprintf(stderr, "%s: %s\n", path, err.msg);
      continue;
    }
    float *a = NULL, *b = NULL, *ref = NULL;
    size_t in_bytes = input_bytes(g, &a, &b);
    double base_us, base1_us = 0;
    const char *base_name;
    int n = graphs[gi].matmul_n;
    if (n) {
      ref = kex_malloc(sizeof *ref * (size_t)n * (size_t)n);
      base_us = sgemm_us(a, b, ref, n, reps);
      base_name = "openblas_sgemm";
      if (!only_dev || strcmp(only_dev, "cpu_1thread") == 0) {
        int threads = openblas_get_num_threads();
        openblas_set_num_threads(1);
        base1_us = sgemm_us(a, b, ref, n, reps);
        openblas_set_num_threads(threads);
      }
    } else {
      base_us = memcpy_us(in_bytes, reps);
      base_name = "memcpy_inputs";
    }
    devrun runs[3] = {{"opencl", 0, "", 0}, {"cpu", 0, "", 0}, {"cpu_1thread", 0, "", 0}};
    kex_device *devs[3] = {cl, cpu, cpu1};
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(strlen(graphs[gi].file) - 5), graphs[gi].file);
    for (int d = 0; d < 3; d++) {
      if (only_dev && strcmp(only_dev, runs[d].label) != 0) continue;
      if (!devs[d] || run_on(devs[d], g, reps, beam, ref, n ? (size_t)n * (size_t)n : 0, &runs[d])) continue;
      double tg = beam ? -1 : graphs[gi].tinygrad_us; /* tinygrad's times are BEAM=0 */
      double bus = d == 2 && base1_us > 0 ? base1_us : base_us; /* the 1-thread row against 1-thread OpenBLAS */
      const char *bname = d == 2 && base1_us > 0 ? "openblas_sgemm_1thread" : base_name;
      printf("%-18s %-12s %11.1f %11.1f %9.2f %12s %9s %9s\n", name, runs[d].label, runs[d].us, bus,
             runs[d].us / bus, d == 0 && tg > 0 ? "" : "-", "", runs[d].ok ? "yes" : "NO");
      if (d == 0 && tg > 0) printf("%-18s %-12s %11s %11s %9s %12.1f %8.2fx\n", "", "", "", "", "", tg, tg / runs[d].us);
      json_t *o = json_pack("{s:s, s:s, s:f, s:s, s:f, s:f, s:s, s:b}", "graph", name, "device", runs[d].label,
                            "kex_us", runs[d].us, "baseline", bname, "baseline_us", bus, "ratio_to_baseline",
                            runs[d].us / bus, "kernels", runs[d].kernels, "output_checked", runs[d].ok);
      if (beam > 0) json_object_set_new(o, "beam", json_integer(beam));
      if (d == 0 && tg > 0) {
        json_object_set_new(o, "tinygrad_beam0_pocl_us", json_real(tg));
        json_object_set_new(o, "speedup_vs_tinygrad", json_real(tg / runs[d].us));
      }
      json_array_append_new(arr, o);
    }
    if (runs[1].ok && runs[2].ok) {
      printf("%-18s %-12s cpu all cores vs 1 thread: %.2fx\n", name, "", runs[2].us / runs[1].us);
      json_array_append_new(arr, json_pack("{s:s, s:s, s:f}", "graph", name, "device", "cpu_thread_scaling",
                                           "speedup_all_cores_vs_1", runs[2].us / runs[1].us));
    }
    kex_free(a);
    kex_free(b);
    kex_free(ref);
    kex_graph_free(g);
  }
  loadavg(load_end, sizeof load_end);
  char notes[512];
  char optsnote[64] = "hand-coded opts (BEAM=0)";
  if (beam > 0) snprintf(optsnote, sizeof optsnote, "opts from a BEAM=%d search (no cache)", beam);
  snprintf(notes, sizeof notes,
           "%s; kex_us = sum of the graph's kernels, each the median of `repeat` device-timed "
           "runs after a warm-up; baselines measured in the same run; shared 2-vCPU VM, load average (1/5/15 min) %s "
           "at the start, %s at the end",
           optsnote, load_start, load_end);
  const char *core = openblas_get_corename();
  json_t *doc = json_pack("{s:s, s:i, s:s, s:s, s:o}", "benchmark", "kernels", "repeat", reps, "notes", notes,
                          "openblas_core", core ? core : "?", "results", arr);
  if (json_dump_file(doc, outpath, JSON_INDENT(2))) fprintf(stderr, "cannot write %s\n", outpath);
  else printf("wrote %s\n", outpath);
  json_decref(doc);
  kex_device_unref(cl);
  kex_device_unref(cpu);
  kex_device_unref(cpu1);
  return 0;
}

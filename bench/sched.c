/*
 * bench/sched.c - replay + schedule time and memory per node.
 *
 * Graphs: elementwise chains of 100, 1,000 and 100,000 ADD nodes (each adds
 * a second input to the running value, so every node is a LazyBuffer base),
 * and the largest graphs of ../shared/cases/.  For each: the median over
 * repeated runs of replay+schedule (JSON parsing excluded, as `kex plan
 * --json` reports schedule_us), µs per base node, and arena bytes per graph
 * node.  The baseline is tinygrad 0.9.0's create_schedule on this machine as
 * the spec measured it (4-18 µs per base node; 1,000-op chain 7.6 ms); the
 * ratio column is tinygrad's µs/base divided by ours.  Writes
 * bench/results/sched.json and prints a table.
 *
 * usage: bench_sched [--out FILE] [--cases DIR]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

static kex_graph *chain(int n) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  /* the 100,000-op chain is past the default depth limits on purpose (it measures the scheduler's scaling):
     inputs are depth 1, the last ADD n + 1; its one kernel is LOAD, n ADDs and the STORE */
  lim.max_depth = (uint32_t)n + 1;
  lim.max_kernel_depth = (uint32_t)n + 2;
  lim.max_kernel_ops = (uint32_t)n + 1;
  kex_error err;
  kex_graph *g = kex_graph_new(NULL);
  int64_t shape[1] = {1024};
  kex_gnode in = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape};
  int a = kex_graph_add(g, &in, &lim, &err);
  int b = kex_graph_add(g, &in, &lim, &err);
  int cur = a;
  for (int i = 0; i < n; i++) {
    kex_gnode add = {.op = KEX_GOP_ADD, .nsrc = 2, .src = {(uint32_t)cur, (uint32_t)b}};
    cur = kex_graph_add(g, &add, &lim, &err);
    if (cur < 0) {
      fprintf(stderr, "chain: %s\n", err.msg);
      exit(1);
    }
  }
  kex_graph_add_output(g, (uint32_t)cur, &lim, &err);
  return g;
}

typedef struct result {
  char name[128];
  uint32_t nodes, bases, kernels;
  double us, us_per_base;           /* cold: a fresh ShapeTracker context per run */
  double warm_us, warm_us_per_base; /* warm: one long-lived ShapeTracker context, as tinygrad's View caches */
  double cold_sched_us, warm_sched_us; /* the create_schedule part alone (replay excluded) */
  double bytes_per_node;
} result;

/* Median of `reps` runs of replay+schedule; shape = NULL for cold runs. */
static int time_runs(const char *name, kex_graph *g, kex_shape_ctx *shape, int reps, result *res, double *median,
                     double *sched_median) {
  double *t = calloc((size_t)reps, sizeof *t), *ts = calloc((size_t)reps, sizeof *ts);
  kex_replay_opts ro = {false, "opencl", shape};
  kex_error err;
  kex_arena arena; /* one per-submission arena, reset between runs as the daemon recycles them */
  kex_arena_init(&arena, 0);
  for (int i = 0; i < reps; i++) {
    kex_arena_reset(&arena);
    kex_replay *r = NULL;
    kex_schedule *s = NULL;
    double t0 = now_us();
    int rc = kex_replay_graph(g, &ro, &arena, &r, &err);
    double t1 = now_us();
    if (!rc) rc = kex_schedule_create(r, &s, &err);
    t[i] = now_us() - t0;
    ts[i] = now_us() - t1;
    if (rc) {
      fprintf(stderr, "%s: %s\n", name, err.msg);
      free(t);
      free(ts);
      kex_arena_destroy(&arena);
      return rc;
    }
    res->bases = r->nbuffers; /* every base LazyBuffer owns one buffer id */
    res->kernels = s->nkernels;
    if (!shape) res->bytes_per_node = (double)arena.total / g->nnodes;
    kex_schedule_free(s);
    kex_replay_free(r);
  }
  kex_arena_destroy(&arena);
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
  *median = t[reps / 2];
  *sched_median = ts[reps / 2];
  free(t);
  free(ts);
  return 0;
}

static int measure(const char *name, kex_graph *g, result *res) {
  int reps = g->nnodes > 20000 ? 7 : g->nnodes > 1000 ? 31 : 201;
  memset(res, 0, sizeof *res);
  snprintf(res->name, sizeof res->name, "%s", name);
  res->nodes = g->nnodes;
  if (time_runs(name, g, NULL, reps, res, &res->us, &res->cold_sched_us)) return -1;
  kex_arena shape_arena;
  kex_arena_init(&shape_arena, 0);
  kex_shape_ctx *shape = kex_shape_ctx_new(&shape_arena);
  int rc = shape ? time_runs(name, g, shape, reps, res, &res->warm_us, &res->warm_sched_us) : -1;
  kex_shape_ctx_free(shape);
  kex_arena_destroy(&shape_arena);
  res->us_per_base = res->us / (res->bases ? res->bases : 1);
  res->warm_us_per_base = res->warm_us / (res->bases ? res->bases : 1);
  return rc;
}

int main(int argc, char **argv) {
  const char *out = "bench/results/sched.json";
  const char *cases = getenv("KEX_CASES_DIR") ? getenv("KEX_CASES_DIR") : "../shared/cases";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
    else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc) cases = argv[++i];
    else {
      fprintf(stderr, "usage: bench_sched [--out FILE] [--cases DIR]\n");
      return 2;
    }
  }
  result res[16];
  int nres = 0;
  int chains[] = {100, 1000, 100000};
  for (int i = 0; i < 3; i++) {
    kex_graph *g = chain(chains[i]);
    char name[64];
    snprintf(name, sizeof name, "chain_%d", chains[i]);
    if (measure(name, g, &res[nres]) == 0) nres++;
    kex_graph_free(g);
  }
  /* the largest cases by node count */
  char index[600];
  snprintf(index, sizeof index, "%s/INDEX.json", cases);
  json_t *names = json_load_file(index, 0, NULL);
  const char *best[4] = {0};
  size_t bestn[4] = {0};
  size_t i;
  json_t *v;
  json_array_foreach(names, i, v) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s.json", cases, json_string_value(v));
    json_t *c = json_load_file(path, 0, NULL);
    size_t nn = json_array_size(json_object_get(json_object_get(c, "graph"), "nodes"));
    json_decref(c);
    for (int k = 0; k < 4; k++)
      if (nn > bestn[k]) {
        for (int m = 3; m > k; m--) {
          best[m] = best[m - 1];
          bestn[m] = bestn[m - 1];
        }
        best[k] = json_string_value(v);
        bestn[k] = nn;
        break;
      }
  }
  for (int k = 0; k < 4 && best[k]; k++) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s.json", cases, best[k]);
    kex_limits lim = KEX_LIMITS_DEFAULT;
    kex_error err;
    kex_graph *g = NULL;
    if (kex_graph_from_json_file(path, &lim, &g, &err)) {
      fprintf(stderr, "%s: %s\n", path, err.msg);
      continue;
    }
    if (measure(best[k], g, &res[nres]) == 0) nres++;
    kex_graph_free(g);
  }
  const double tg_low = 4.0, tg_chain = 7600.0 / 1000.0; /* tinygrad µs per base node (spec 16.4) */
  json_t *arr = json_array();
  printf("%-32s %7s %7s %7s %9s %8s %9s %8s %9s %9s %10s %9s %9s %9s\n", "graph", "nodes", "bases", "kernels", "cold_us",
         "us/base", "warm_us", "us/base", "sched_us", "us/base", "bytes/node", "x tg cold", "x tg warm", "x tg sch");
  for (int k = 0; k < nres; k++) {
    result *r = &res[k];
    /* tinygrad's create_schedule: 100-op chain 0.86 ms, 1,000-op chain 7.6 ms (spec 16.4); longer chains at the
       1,000-chain rate; other graphs at the low end of its 4-18 us per base */
    double tg = strcmp(r->name, "chain_100") == 0 ? 860.0 / r->bases
                : strncmp(r->name, "chain_", 6) == 0 ? tg_chain
                                                     : tg_low;
    double ratio = tg / (r->us_per_base > 0 ? r->us_per_base : 1e-9);
    double wratio = tg / (r->warm_us_per_base > 0 ? r->warm_us_per_base : 1e-9);
    double sched_pb = r->warm_sched_us / (r->bases ? r->bases : 1);
    double sratio = tg / (sched_pb > 0 ? sched_pb : 1e-9);
    printf("%-32s %7u %7u %7u %9.1f %8.4f %9.1f %8.4f %9.1f %8.4f %10.1f %8.0fx %8.0fx %8.0fx\n", r->name, r->nodes,
           r->bases, r->kernels, r->us, r->us_per_base, r->warm_us, r->warm_us_per_base, r->warm_sched_us, sched_pb,
           r->bytes_per_node, ratio, wratio, sratio);
    json_array_append_new(arr, json_pack("{s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "graph",
                                         r->name, "nodes", (json_int_t)r->nodes, "bases", (json_int_t)r->bases,
                                         "kernels", (json_int_t)r->kernels, "cold_us", r->us, "cold_us_per_base",
                                         r->us_per_base, "warm_us", r->warm_us, "warm_us_per_base", r->warm_us_per_base,
                                         "bytes_per_node", r->bytes_per_node, "tinygrad_us_per_base", tg,
                                         "speedup_vs_tinygrad_cold", ratio, "speedup_vs_tinygrad_warm", wratio));
    json_object_set_new(json_array_get(arr, json_array_size(arr) - 1), "schedule_only_warm_us",
                        json_real(r->warm_sched_us));
    json_object_set_new(json_array_get(arr, json_array_size(arr) - 1), "speedup_vs_tinygrad_schedule_only",
                        json_real(sratio));
  }
  json_t *doc = json_pack("{s:s, s:s, s:o}", "benchmark", "sched", "baseline",
                          "tinygrad 0.9.0 create_schedule on this machine (spec 16.4): 100-op chain 0.86 ms, 1,000-op "
                          "chain 7.6 ms (7.6 us/base, also used for 100,000); other graphs 4-18 us/base (the lower "
                          "bound 4 is used, so their ratios are the least speedup). Compare tinygrad's create_schedule "
                          "with schedule_only_warm_us: tinygrad builds its LazyBuffers before create_schedule.",
                          "results", arr);
  if (json_dump_file(doc, out, JSON_INDENT(2)) != 0) fprintf(stderr, "cannot write %s\n", out);
  else printf("wrote %s\n", out);
  json_decref(doc);
  json_decref(names);
  return 0;
}

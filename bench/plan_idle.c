/*
 * bench/plan_idle.c - what kexd's Plan span costs hot, after an idle gap,
 * and after other memory traffic: the same replay + schedule, in-process.
 *
 * kexd's Plan times kex_plan_schedule on a thread's warm state
 * (daemon/plan.c: plan_run).  Between two Plans its loop thread handles the
 * RPC and then sleeps in epoll_wait until the next one, so each Plan starts
 * on a core whose caches the RPC, the client and the host's other guests
 * have used meanwhile.  This loop runs the same calls (kex_plan_init,
 * kex_plan_use_warm with kexd's default limit, kex_plan_schedule,
 * kex_plan_clear), and before each timed call one of:
 *   - nothing (hot: back to back, as a microbenchmark would);
 *   - an idle gap of N µs (usleep: the thread sleeps as kexd's loop does);
 *   - touching K KiB of other memory (one write per cache line).
 * The conditions take turns, rep after rep.  It prints the minimum and
 * median of each, so the distance between the
 * hot figure and kexd's schedule_us (bench/plan.py) can be read as
 * instructions (hot) against cache state (the rest).
 *
 * usage: bench_plan_idle [--reps N] [--idle-us A,B,..] [--touch-kb A,B,..] GRAPH.json...
 *   a graph file is a kex graph, or a case file (a ../shared/cases file) whose "graph" is one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "codegen/target.h"
#include "realize/plan.h"
#include "sched/warm.h"

#define WARM_LIMIT (8u << 20) /* kexd's default plan-warm-bytes (KEXD_DEFAULT_PLAN_WARM_BYTES) */
#define MAX_CONDS 16

typedef struct cond {
  const char *kind; /* "hot", "idle", "touch" */
  long amount;      /* µs idle, or KiB touched */
} cond;

static int parse_list(const char *s, const char *kind, cond *c, int *n) {
  char *copy = strdup(s), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end || v <= 0 || *n >= MAX_CONDS) {
      free(copy);
      return -1;
    }
    c[(*n)++] = (cond){kind, v};
  }
  free(copy);
  return 0;
}

/* A graph file or a case file (kex_graph_from_json_file takes either), with the default limits. */
static kex_graph *load_graph(const char *path) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_graph *out = NULL;
  kex_error err = {0};
  if (kex_graph_from_json_file(path, &lim, &out, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return NULL;
  }
  return out;
}

/* One plan on warm, timed: µs, or a negative value on an error (printed). */
static double plan_once(const kex_graph *g, const kex_target *t, kex_sched_warm *warm) {
  kex_rplan p;
  kex_error err = {0};
  kex_plan_init(&p, g, t);
  kex_plan_use_warm(&p, warm, WARM_LIMIT);
  double t0 = now_us();
  int rc = kex_plan_schedule(&p, NULL, &err);
  double us = now_us() - t0;
  kex_plan_clear(&p);
  if (rc) {
    fprintf(stderr, "plan: %s\n", err.msg);
    return -1;
  }
  return us;
}

int main(int argc, char **argv) {
  int reps = 400, nconds = 1, first = argc;
  cond conds[MAX_CONDS] = {{"hot", 0}}; /* the first is always hot: the others are read against it */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--idle-us") == 0 && i + 1 < argc) {
      if (parse_list(argv[++i], "idle", conds, &nconds)) goto usage;
    } else if (strcmp(argv[i], "--touch-kb") == 0 && i + 1 < argc) {
      if (parse_list(argv[++i], "touch", conds, &nconds)) goto usage;
    } else if (argv[i][0] == '-') goto usage;
    else {
      first = i;
      break;
    }
  }
  if (first >= argc || reps < 1) goto usage;
  if (nconds == 1) { /* the defaults: an RPC's worth of idle, a long gap, one and four L2s of traffic */
    conds[nconds++] = (cond){"idle", 100};
    conds[nconds++] = (cond){"idle", 1000};
    conds[nconds++] = (cond){"touch", 1024};
    conds[nconds++] = (cond){"touch", 4096};
  }
  long touch_max = 0;
  for (int c = 0; c < nconds; c++)
    if (!strcmp(conds[c].kind, "touch") && conds[c].amount > touch_max) touch_max = conds[c].amount;
  volatile char *junk = touch_max ? calloc((size_t)touch_max, 1024) : NULL;
  double *v = calloc((size_t)reps * MAX_CONDS, sizeof *v);
  kex_target t;
  if (!v || (touch_max && !junk) || kex_target_for_name("opencl", &t)) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  char load[64];
  loadavg(load, sizeof load);
  printf("opencl target rules, kexd's warm state (limit %u MiB), %d reps per condition, load %s\n", WARM_LIMIT >> 20,
         reps, load);
  printf("%-32s %-12s %9s %9s %9s\n", "graph", "before each", "min us", "median us", "x hot");
  for (int a = first; a < argc; a++) {
    kex_graph *g = load_graph(argv[a]);
    if (!g) return 1;
    const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
    kex_sched_warm *warm = kex_sched_warm_new();
    if (!warm) return 1;
    for (int i = 0; i < 50; i++)
      if (plan_once(g, &t, warm) < 0) return 1;
    /* the conditions in turn, rep after rep: a drift of the machine during the run weighs on all of them alike */
    for (int i = 0; i < reps; i++)
      for (int c = 0; c < nconds; c++) {
        if (!strcmp(conds[c].kind, "idle")) usleep((useconds_t)conds[c].amount);
        else if (!strcmp(conds[c].kind, "touch"))
          for (long k = 0; k < conds[c].amount * 1024; k += 64) junk[k]++;
        if ((v[(size_t)c * (size_t)reps + (size_t)i] = plan_once(g, &t, warm)) < 0) return 1;
      }
    double hot = 0;
    for (int c = 0; c < nconds; c++) {
      double *vc = v + (size_t)c * (size_t)reps;
      qsort(vc, (size_t)reps, sizeof *vc, cmp_double);
      double med = vc[reps / 2];
      if (c == 0) hot = med;
      char what[32];
      if (c == 0) snprintf(what, sizeof what, "nothing");
      else snprintf(what, sizeof what, "%s %ld%s", conds[c].kind, conds[c].amount,
                    !strcmp(conds[c].kind, "idle") ? "us" : "K");
      printf("%-32.32s %-12s %9.2f %9.2f %8.2fx\n", name, what, vc[0], med, med / hot);
    }
    kex_sched_warm_free(warm);
    kex_graph_free(g);
  }
  free(v);
  free((void *)junk);
  return 0;
usage:
  fprintf(stderr, "usage: bench_plan_idle [--reps N] [--idle-us A,B,..] [--touch-kb A,B,..] GRAPH.json...\n");
  return 2;
}

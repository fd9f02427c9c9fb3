/*
 * kex.c - the kex command line.
 *
 * `kex plan [--device opencl|cpu] [--json] FILE.json` replays a graph and
 * schedules it in-process (no daemon): it prints every schedule item (kind,
 * output and input buffers, AST) and ends with `kernels: N`; --json prints
 * {"kernels": N, "schedule_us": T, "items": [...]} where T is the time to
 * replay and schedule, excluding JSON parsing.  Exit codes: 0 ok, 2 bad input
 * (usage, unreadable or invalid graph), 1 anything else.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/arena.h"
#include "core/errors.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

static void usage(FILE *f) {
  fputs("usage: kex <command> [options]\n"
        "\n"
        "commands:\n"
        "  plan [--device opencl|cpu] [--json] FILE.json\n"
        "      replay and schedule a graph in-process; print every schedule item\n"
        "      (kind, output/input buffers, AST with ShapeTrackers) and `kernels: N`.\n"
        "      --device  whose rules apply: opencl (tinygrad's GPU device, default)\n"
        "                or cpu (tinygrad's CLANG device: consecutive CONTIGUOUS\n"
        "                and BITCAST become buffer views, no kernel)\n"
        "      --json    print {\"kernels\": N, \"schedule_us\": T, \"items\": [...]}\n"
        "  help        this text\n"
        "\n"
        "exit codes: 0 success, 2 bad input (usage, invalid graph), 1 other errors\n",
        f);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int exit_code(int rc) {
  return (rc == KEX_EINVAL || rc == KEX_EPARSE || rc == KEX_ELIMIT || rc == KEX_EASSIGN || rc == KEX_ENOTFOUND) ? 2 : 1;
}

static int cmd_plan(int argc, char **argv) {
  static const struct option opts[] = {
      {"device", required_argument, NULL, 'd'}, {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
  const char *device = "opencl";
  bool as_json = false;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "d:jh", opts, NULL)) != -1) {
    switch (c) {
    case 'd': device = optarg; break;
    case 'j': as_json = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (strcmp(device, "opencl") != 0 && strcmp(device, "cpu") != 0) {
    fprintf(stderr, "kex plan: unknown device '%s' (opencl or cpu)\n", device);
    return 2;
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kex plan: expected one graph file\n");
    usage(stderr);
    return 2;
  }
  const char *path = argv[optind];
  kex_limits limits = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_arena arena;
  kex_arena_init(&arena, 0);
  int rc = kex_graph_from_json_file(path, &limits, &g, &err);
  int ret = 0;
  if (rc) {
    fprintf(stderr, "kex plan: %s: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = exit_code(rc);
    goto out;
  }
  kex_replay_opts ro = {strcmp(device, "cpu") == 0, device};
  double t0 = now_us();
  rc = kex_replay_graph(g, &ro, &arena, &r, &err);
  if (!rc) rc = kex_schedule_create(r, &s, &err);
  double t1 = now_us();
  if (rc) {
    fprintf(stderr, "kex plan: %s: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = exit_code(rc);
    goto out;
  }
  if (as_json) {
    json_t *items = kex_schedule_to_json(s);
    json_t *o = items ? json_pack("{s:i, s:f, s:o, s:{s:i, s:i, s:I, s:I}}", "kernels", (json_int_t)s->nkernels,
                                  "schedule_us", t1 - t0, "items", items, "memory", "intermediate_buffers",
                                  (json_int_t)s->nplanned_buffers, "planned_buffers", (json_int_t)s->nplanned_after,
                                  "bytes_before", (json_int_t)s->planned_bytes_before, "bytes_after",
                                  (json_int_t)s->planned_bytes_after)
                      : NULL;
    if (!o || json_dumpf(o, stdout, JSON_COMPACT) < 0) {
      fprintf(stderr, "kex plan: out of memory writing JSON\n");
      ret = 1;
    }
    fputc('\n', stdout);
    json_decref(o);
  } else if (kex_schedule_print(s, stdout)) {
    fprintf(stderr, "kex plan: out of memory printing the schedule\n");
    ret = 1;
  }
out:
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_graph_free(g);
  kex_arena_destroy(&arena);
  return ret;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 1, argv + 1);
  fprintf(stderr, "kex: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}

/*
 * test_cases.c - every graph in ../shared/cases/ is a test: replayed and
 * scheduled on the opencl and cpu rules, it must give tinygrad's kernel
 * count on both, and on cpu the sequence of schedule items tinygrad made
 * (kernels with their output counts, and the non-kernel items, in order).
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

typedef struct case_def {
  char name[128];
  char path[512];
} case_def;

static const char *cases_dir(void) {
  const char *d = getenv("KEX_CASES_DIR");
  return d ? d : "../shared/cases";
}

/* Schedule `graph` with the given rules; returns the schedule's labels joined by ',' and the kernel count. */
static void plan(json_t *graph, bool cpu, int *kernels, char *labels, size_t len) {
  char *text = json_dumps(graph, JSON_COMPACT);
  assert_non_null(text);
  kex_limits limits = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  int rc = kex_graph_from_json(text, strlen(text), &limits, &g, &err);
  free(text);
  if (rc) fail_msg("load: %s", err.msg);
  kex_arena arena;
  kex_arena_init(&arena, 0);
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_replay_opts ro = {cpu, cpu ? "cpu" : "opencl"};
  rc = kex_replay_graph(g, &ro, &arena, &r, &err);
  if (!rc) rc = kex_schedule_create(r, &s, &err);
  if (rc) fail_msg("schedule (%s): %s", cpu ? "cpu" : "opencl", err.msg);
  *kernels = (int)s->nkernels;
  size_t off = 0;
  labels[0] = 0;
  for (uint32_t i = 0; i < s->nitems && off + 32 < len; i++) {
    if (i) labels[off++] = ',';
    off += (size_t)kex_item_label(&s->items[i], labels + off, len - off);
  }
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_graph_free(g);
  kex_arena_destroy(&arena);
}

static void test_case(void **state) {
  const case_def *c = *state;
  json_error_t jerr;
  json_t *root = json_load_file(c->path, 0, &jerr);
  if (!root) fail_msg("%s: %s", c->path, jerr.text);
  json_t *graph = json_object_get(root, "graph");
  json_t *kernels = json_object_get(root, "kernels");
  json_t *items = json_object_get(root, "items");
  assert_non_null(graph);
  assert_non_null(kernels);
  char want[8192] = "", got[8192];
  size_t off = 0;
  size_t i;
  json_t *v;
  json_array_foreach(items, i, v) {
    off += (size_t)snprintf(want + off, sizeof want - off, "%s%s", i ? "," : "", json_string_value(v));
  }
  int n_cl = -1, n_cpu = -1;
  plan(graph, false, &n_cl, got, sizeof got);
  int want_cl = (int)json_integer_value(json_object_get(kernels, "opencl"));
  if (n_cl != want_cl) fail_msg("%s: opencl kernels %d, tinygrad %d", c->name, n_cl, want_cl);
  plan(graph, true, &n_cpu, got, sizeof got);
  int want_cpu = (int)json_integer_value(json_object_get(kernels, "cpu"));
  if (n_cpu != want_cpu) fail_msg("%s: cpu kernels %d, tinygrad %d", c->name, n_cpu, want_cpu);
  if (strcmp(got, want) != 0) fail_msg("%s: cpu items\n  got:  %s\n  want: %s", c->name, got, want);
  json_decref(root);
}

int main(void) {
  char index[512];
  snprintf(index, sizeof index, "%s/INDEX.json", cases_dir());
  json_error_t jerr;
  json_t *names = json_load_file(index, 0, &jerr);
  if (!names) {
    fprintf(stderr, "cannot read %s: %s\n", index, jerr.text);
    return 1;
  }
  size_t n = json_array_size(names);
  case_def *defs = calloc(n, sizeof *defs);
  struct CMUnitTest *tests = calloc(n, sizeof *tests);
  for (size_t i = 0; i < n; i++) {
    const char *name = json_string_value(json_array_get(names, i));
    snprintf(defs[i].name, sizeof defs[i].name, "%s", name);
    snprintf(defs[i].path, sizeof defs[i].path, "%s/%s.json", cases_dir(), name);
    tests[i] = (struct CMUnitTest){defs[i].name, test_case, NULL, NULL, &defs[i]};
  }
  int rc = _cmocka_run_group_tests("cases", tests, n, NULL, NULL);
  free(tests);
  free(defs);
  json_decref(names);
  return rc;
}

/*
 * test_target.c - the target (codegen/target.c): which of tinygrad's rules a
 * device name or kind means, the caps an open device gives, that a target
 * with a small work-group or little local memory makes hand-coded opts and
 * beam's actions avoid what exceeds it, and that PoCL's reported target
 * renders every case of ../shared/cases exactly as the static GPU target
 * (tinygrad's kernels) does.
 */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "codegen/target.h"
#include "core/arena.h"
#include "devices/device.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

typedef struct planned {
  kex_graph *g;
  kex_arena arena;
  kex_replay *r;
  kex_schedule *s;
} planned;

static int plan_json(planned *p, const char *json, size_t len, const kex_target *t, kex_error *err) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  memset(p, 0, sizeof *p);
  kex_arena_init(&p->arena, 0);
  kex_replay_opts ro = kex_target_replay_opts(t);
  int rc = kex_graph_from_json(json, len, &lim, &p->g, err);
  if (!rc) rc = kex_replay_graph(p->g, &ro, &p->arena, &p->r, err);
  if (!rc) rc = kex_schedule_create(p->r, &p->s, err);
  return rc;
}

static void plan_done(planned *p) {
  kex_schedule_free(p->s);
  kex_replay_free(p->r);
  kex_graph_free(p->g);
  kex_arena_destroy(&p->arena);
}

static int first_kernel(const kex_schedule *s) {
  for (uint32_t i = 0; i < s->nitems; i++)
    if (s->items[i].kind == KEX_ITEM_KERNEL) return (int)i;
  return -1;
}

static void test_names(void **state) {
  (void)state;
  kex_target t;
  const char *clang[] = {"cpu", "cpu:1", "fault+cpu"}, *gpu[] = {"opencl", "opencl:pthread", "fault+opencl", "default", ""};
  for (size_t i = 0; i < sizeof clang / sizeof *clang; i++) {
    assert_int_equal(kex_target_for_name(clang[i], &t), 0);
    assert_true(t.clang_rules);
    assert_int_equal(t.dialect, KEX_DIALECT_CPU);
    assert_string_equal(t.rules, "cpu");
    assert_false(t.caps.has_local);
    assert_true(kex_target_replay_opts(&t).buffer_view);
  }
  for (size_t i = 0; i < sizeof gpu / sizeof *gpu; i++) {
    assert_int_equal(kex_target_for_name(gpu[i], &t), 0);
    assert_false(t.clang_rules);
    assert_int_equal(t.dialect, KEX_DIALECT_OPENCL);
    assert_true(t.caps.has_local && t.caps.supports_float4);
    assert_int_equal(t.caps.shared_max, 32768);
    assert_false(kex_target_replay_opts(&t).buffer_view);
  }
  assert_int_equal(kex_target_for_name("cuda", &t), KEX_EINVAL);
  assert_int_equal(kex_target_for_name("cpux", &t), KEX_EINVAL);
}

/* A device that reports little: its caps, capped at tinygrad's. */
static void test_from_info(void **state) {
  (void)state;
  kex_device_info info;
  kex_target t;
  memset(&info, 0, sizeof info);
  snprintf(info.identity.kind, sizeof info.identity.kind, "opencl");
  info.has_local = info.has_shared = true;
  info.supports_float4 = false;
  info.shared_max = 1024;
  info.max_work_group_size = 32;
  info.supports_fp16 = true;
  kex_target_for_device(&info, &t);
  assert_false(t.clang_rules);
  assert_int_equal(t.caps.shared_max, 1024);
  assert_int_equal(t.caps.max_local_size, 32);
  assert_false(t.caps.supports_float4);
  assert_true(t.fp16);
  info.shared_max = 1 << 20; /* more than tinygrad assumes: kept at 32768 so kernels stay tinygrad's */
  info.max_work_group_size = 4096;
  info.supports_float4 = true;
  kex_target_for_device(&info, &t);
  assert_int_equal(t.caps.shared_max, 32768);
  assert_int_equal(t.caps.max_local_size, 4096);
  snprintf(info.identity.kind, sizeof info.identity.kind, "fault+cpu");
  kex_target_for_device(&info, &t);
  assert_true(t.clang_rules);
  assert_false(t.caps.has_local);
}

static const char *MATMUL =
    "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[64,64],\"fill\":{\"random\":1}},"
    "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[64,64],\"fill\":{\"random\":2}},"
    "{\"op\":\"RESHAPE\",\"src\":[0],\"arg\":[64,1,64]},{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[1,64,64]},"
    "{\"op\":\"PERMUTE\",\"src\":[3],\"arg\":[0,2,1]},{\"op\":\"EXPAND\",\"src\":[2],\"arg\":[64,64,64]},"
    "{\"op\":\"EXPAND\",\"src\":[4],\"arg\":[64,64,64]},{\"op\":\"MUL\",\"src\":[5,6]},"
    "{\"op\":\"REDUCE_SUM\",\"src\":[7],\"axis\":[2]}],\"outputs\":[8]}";

static const char *SUM = "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4,4096],\"fill\":{\"random\":3}},"
                         "{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}],\"outputs\":[1]}";

static size_t threads(const kex_program_src *ps) {
  return ps->has_local ? ps->local[0] * ps->local[1] * ps->local[2] : 1;
}

/* Hand-coded opts on a small work-group and little local memory: the kernel fits; on the full GPU target it would not. */
static void test_small_target_hand_coded(void **state) {
  (void)state;
  kex_target big, small;
  kex_error err = {0};
  kex_target_for_name("opencl", &big);
  small = big;
  small.caps.max_local_size = 16;
  small.caps.shared_max = 256;
  const char *graphs[] = {MATMUL, SUM};
  for (int gi = 0; gi < 2; gi++) {
    planned p;
    assert_int_equal(plan_json(&p, graphs[gi], strlen(graphs[gi]), &big, &err), 0);
    int it = first_kernel(p.s);
    assert_true(it >= 0);
    kex_program_src a = {0}, b = {0};
    char oa[256], ob[256];
    assert_int_equal(kex_target_lower_item(&big, p.s, &p.s->items[it], NULL, 0, NULL, &a, oa, sizeof oa, &err), 0);
    assert_int_equal(kex_target_lower_item(&small, p.s, &p.s->items[it], NULL, 0, NULL, &b, ob, sizeof ob, &err), 0);
    assert_true(threads(&a) > 16); /* the test means something: the full target uses more */
    assert_true(threads(&b) <= 16);
    assert_string_not_equal(oa, ob);
    kex_program_src_free(&a);
    kex_program_src_free(&b);
    /* beam's actions go through the same check: LOCAL/GROUP past the work-group are refused */
    kex_kernel *k = NULL;
    assert_int_equal(kex_kernel_from_item(p.s, &p.s->items[it], &small.caps, &k, &err), 0);
    int rc = gi == 0 ? kex_kernel_apply_opt(k, (kex_opt){KEX_OPT_LOCAL, 0, 32}, true, &err)
                     : kex_kernel_apply_opt(k, (kex_opt){KEX_OPT_GROUPTOP, 0, 32}, true, &err);
    assert_int_equal(rc, KEX_EOPT);
    assert_non_null(strstr(err.msg, gi == 0 ? "work-group" : "exceeds"));
    assert_int_equal(kex_kernel_apply_opt(k, (kex_opt){gi == 0 ? KEX_OPT_LOCAL : KEX_OPT_GROUPTOP, 0, 16}, true, &err),
                     0);
    kex_kernel_free(k);
    plan_done(&p);
  }
}

/* PoCL's own target renders every case's kernels exactly as the static GPU target (tinygrad's) does. */
static void test_pocl_renders_as_before(void **state) {
  (void)state;
  kex_device *dev = NULL;
  kex_error err = {0};
  if (kex_device_open("opencl", &dev, &err) < 0) {
    fprintf(stderr, "[ SKIP ] no OpenCL device: %s\n", err.msg);
    return;
  }
  kex_target pocl, gpu;
  kex_target_for_device(kex_device_get_info(dev), &pocl);
  kex_target_for_name("opencl", &gpu);
  const char *dir = getenv("KEX_CASES_DIR");
  DIR *dd = opendir(dir ? dir : "../shared/cases");
  assert_non_null(dd);
  struct dirent *de;
  int cases = 0, kernels = 0;
  while ((de = readdir(dd))) {
    size_t l = strlen(de->d_name);
    if (l < 6 || strcmp(de->d_name + l - 5, ".json") || !strcmp(de->d_name, "INDEX.json")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "../shared/cases", de->d_name);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *graph = root ? json_object_get(root, "graph") : NULL;
    if (!graph) {
      json_decref(root);
      continue;
    }
    char *text = json_dumps(graph, JSON_COMPACT);
    planned p;
    if (plan_json(&p, text, strlen(text), &gpu, &err) == 0) {
      cases++;
      kex_name_counter na, nb;
      kex_name_counter_init(&na);
      kex_name_counter_init(&nb);
      for (uint32_t i = 0; i < p.s->nitems; i++) {
        if (p.s->items[i].kind != KEX_ITEM_KERNEL) continue;
        kex_program_src a = {0}, b = {0};
        int ra = kex_target_lower_item(&gpu, p.s, &p.s->items[i], NULL, 0, &na, &a, NULL, 0, &err);
        int rb = kex_target_lower_item(&pocl, p.s, &p.s->items[i], NULL, 0, &nb, &b, NULL, 0, &err);
        assert_int_equal(ra, rb);
        if (!ra) {
          if (strcmp(a.src, b.src)) fail_msg("%s: kernel %s renders differently on PoCL's target", de->d_name, a.name);
          kernels++;
        }
        kex_program_src_free(&a);
        kex_program_src_free(&b);
      }
      kex_name_counter_free(&na);
      kex_name_counter_free(&nb);
    }
    plan_done(&p);
    free(text);
    json_decref(root);
  }
  closedir(dd);
  kex_device_unref(dev);
  assert_true(cases >= 80 && kernels > 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_from_info),
      cmocka_unit_test(test_small_target_hand_coded),
      cmocka_unit_test(test_pocl_renders_as_before),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

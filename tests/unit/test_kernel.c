/*
 * test_kernel.c - the Kernel (codegen/kernel.c) and hand_coded_optimizations
 * (codegen/heuristic.c) against tinygrad 0.9.0's observed results (spec 7.2,
 * PoCL): the opts each benchmark kernel gets and its name; every OptOp's
 * preconditions on both sides (a refused opt is KEX_EOPT with the failed
 * check in the message, and the kernel is left exactly as it was); the
 * CLANG renderer refusing locals; the normal form; colours; copies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "codegen/kernel.h"
#include "planned.h"

/* Every graph here plans under the GPU rules; a failure fails the test. */
static void plan_ok(planned *p, kex_graph *g) {
  if (plan_graph(p, g, false)) fail_msg("plan: %s", p->err.msg);
}

static void plan_json(planned *p, const char *json) {
  if (plan_text(p, json, false)) fail_msg("plan: %s", p->err.msg);
}

static void plan_bench(planned *p, const char *name) {
  const char *dir = getenv("KEX_BENCH_GRAPHS_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.json", dir ? dir : "../shared/bench-graphs", name);
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  if (kex_graph_from_json_file(path, &lim, &g, &err)) fail_msg("graph %s: %s", path, err.msg);
  plan_ok(p, g);
}

static kex_kernel *make_kernel(const planned *p, int n, const kex_renderer_caps *caps) {
  kex_kernel *k = NULL;
  kex_error err = {0};
  int rc = kex_kernel_from_item(p->s, nth_kernel(p, n), caps, &k, &err);
  if (rc) fail_msg("kernel: %s", err.msg);
  return k;
}

static void expect_name(const kex_kernel *k, const char *name) {
  char buf[256];
  kex_kernel_name(k, buf, sizeof buf);
  if (strcmp(buf, name)) fail_msg("name %s, expected %s", buf, name);
}

static void expect_opts(const kex_kernel *k, const char *opts) {
  char buf[512];
  kex_kernel_opts_string(k, buf, sizeof buf);
  if (strcmp(buf, opts)) fail_msg("opts \"%s\", expected \"%s\"", buf, opts);
}

static void expect_colors(const kex_kernel *k, const char *colors) {
  char buf[64];
  assert_int_equal(kex_kernel_colors(k, buf, sizeof buf), 0);
  if (strcmp(buf, colors)) fail_msg("colors %s, expected %s", buf, colors);
}

/* Hand-coded opts of the n-th kernel of p: opts string and name. */
static void expect_hand_coded(const planned *p, int n, const char *opts, const char *name) {
  kex_kernel *k = make_kernel(p, n, &kex_renderer_opencl);
  kex_error err = {0};
  int rc = kex_kernel_hand_coded_optimizations(k, &err);
  if (rc) fail_msg("hand_coded: %s", err.msg);
  char got_opts[512], got_name[256];
  kex_kernel_opts_string(k, got_opts, sizeof got_opts);
  kex_kernel_name(k, got_name, sizeof got_name);
  kex_kernel_free(k);
  if (strcmp(got_opts, opts) || (name && strcmp(got_name, name)))
    fail_msg("got \"%s\" %s, tinygrad gives \"%s\" %s", got_opts, got_name, opts, name ? name : "");
}

/* ---- observed results (spec 7.2, PoCL) ---- */

static void test_matmul512_bench(void **state) {
  (void)state;
  planned p;
  plan_bench(&p, "matmul512");
  assert_int_equal(p.s->nkernels, 1);
  expect_hand_coded(&p, 0, "UPCAST(1,4) UPCAST(0,4) UNROLL(0,4) LOCAL(0,8) LOCAL(1,16)", "r_16_8_8_16_128_4_4_4");
  planned_free(&p);
}

static void test_matmul512_json(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(512, 512));
  assert_int_equal(p.s->nkernels, 1);
  expect_hand_coded(&p, 0, "UPCAST(1,4) UPCAST(0,4) UNROLL(0,4) LOCAL(0,8) LOCAL(1,16)", "r_16_8_8_16_128_4_4_4");
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r_512_512_512");
  expect_colors(k, "bbr");
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_colors(k, "bbccryym");
  kex_kernel_free(k);
  planned_free(&p);
}

/* 4M sum splits into (256,16384)->256 then 256->1: GROUPTOP(0,16), then GROUPTOP(0,256). */
static void test_sum4M(void **state) {
  (void)state;
  planned p;
  plan_bench(&p, "sum4M");
  assert_int_equal(p.s->nkernels, 2);
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r_256_16384");
  kex_kernel_free(k);
  k = make_kernel(&p, 1, &kex_renderer_opencl);
  expect_name(k, "r_256");
  kex_kernel_free(k);
  expect_hand_coded(&p, 0, "GROUPTOP(0,16)", "r_256_16_1024");
  expect_hand_coded(&p, 1, "GROUPTOP(0,256)", "r_256");
  planned_free(&p);
}

static void test_muladd4M(void **state) {
  (void)state;
  planned p;
  plan_bench(&p, "muladd4M");
  expect_hand_coded(&p, 0, "UPCAST(0,4) LOCAL(0,32)", "E_32768_32_4");
  planned_free(&p);
}

static void test_matvec(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[512,512]") "," BUFF("[512]") ",{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[1,512]}"
                  ",{\"op\":\"EXPAND\",\"src\":[2],\"arg\":[512,512]},{\"op\":\"MUL\",\"src\":[0,3]}"
                  ",{\"op\":\"REDUCE_SUM\",\"src\":[4],\"axis\":[1]},{\"op\":\"RESHAPE\",\"src\":[5],\"arg\":[512]}",
                  "6"));
  expect_hand_coded(&p, 0, "GROUP(0,8) LOCAL(0,4) UPCAST(0,4)", "r_32_4_8_64_4");
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_colors(k, "bcgry");
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_sum_4096x16(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[4096,16]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}"
                                    ",{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[4096]}",
                  "2"));
  expect_hand_coded(&p, 0, "UNROLL(0,0) LOCAL(0,32)", "r_128_32_16");
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_colors(k, "bcm");
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_sum_64x64(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[64,64]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}"
                                  ",{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[64]}",
                  "2"));
  expect_hand_coded(&p, 0, "GROUPTOP(0,16)", "r_64_16_4");
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_colors(k, "bgr");
  kex_kernel_free(k);
  planned_free(&p);
}

/* Tensor.cat of two (3,4096) along 0 (pad + add), times 2. */
static void test_cat_mul(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[3,4096]") "," BUFF("[3,4096]") ",{\"op\":\"PAD\",\"src\":[0],\"arg\":[[0,3],[0,0]]}"
                  ",{\"op\":\"PAD\",\"src\":[1],\"arg\":[[3,0],[0,0]]},{\"op\":\"ADD\",\"src\":[2,3]},"
                  CONSTF("2", "[6,4096]") ",{\"op\":\"MUL\",\"src\":[4,5]}",
                  "6"));
  assert_int_equal(p.s->nkernels, 1);
  expect_hand_coded(&p, 0, "UPCAST(0,0) LOCAL(0,32)", "E_128_32_6");
  planned_free(&p);
}

static void test_broadcast_add(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[64,64,1]") "," BUFF("[1,64,64]") ",{\"op\":\"EXPAND\",\"src\":[0],\"arg\":[64,64,64]}"
                  ",{\"op\":\"EXPAND\",\"src\":[1],\"arg\":[64,64,64]},{\"op\":\"ADD\",\"src\":[2,3]}",
                  "4"));
  expect_hand_coded(&p, 0, "UPCAST(2,4) UPCAST(0,4) LOCAL(0,8) LOCAL(2,16)", "E_2_64_8_16_4_4");
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_colors(k, "bbccyy");
  kex_kernel_free(k);
  planned_free(&p);
}

/* CLANG: no locals and no groups, so only upcasts/unrolls. */
static void test_cpu_hand_coded(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(512, 512));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_cpu);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_opts(k, "UPCAST(1,4) UPCAST(0,4) UNROLL(0,4)");
  expect_name(k, "r_128_128_128_4_4_4");
  kex_kernel_free(k);
  planned_free(&p);
  plan_json(&p, G(BUFF("[64,64]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}"
                                  ",{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[64]}",
                  "2"));
  k = make_kernel(&p, 0, &kex_renderer_cpu);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_opts(k, "UNROLL(0,4)");
  kex_kernel_free(k);
  planned_free(&p);
}

/* ---- normal form ---- */

static void test_normal_form(void **state) {
  (void)state;
  planned p;
  /* reduce axis 1 of (4,8,6) moves last; 4 and 6 do not merge (strides 48 and 1) */
  plan_json(&p, G(BUFF("[4,8,6]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}", "1"));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r_4_6_8");
  assert_int_equal(kex_kernel_first_reduce(k), 2);
  assert_int_equal(kex_kernel_shape_len(k), 3);
  const int64_t *o = kex_kernel_output_shape(k);
  assert_true(o[0] == 4 && o[1] == 6 && o[2] == 1);
  expect_colors(k, "bbr");
  assert_int_equal(k->nbufs, 2);
  assert_int_equal(k->full_buf_index, 1);
  kex_kernel_free(k);
  planned_free(&p);
  /* reduce over the last axis: the output dims merge, the reduce dim stays apart */
  plan_json(&p, G(BUFF("[4,8,6]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[2]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r_32_6");
  assert_int_equal(kex_kernel_first_reduce(k), 1);
  kex_kernel_free(k);
  planned_free(&p);
  /* size-1 dims are dropped */
  plan_json(&p, G(BUFF("[4,1,8]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[2]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r_4_8");
  kex_kernel_free(k);
  planned_free(&p);
  /* contiguous elementwise merges to one dim; a permuted input does not */
  plan_json(&p, G(BUFF("[4,8,6]") "," BUFF("[4,8,6]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "E_192");
  assert_int_equal(k->nbufs, 3);
  assert_null(k->reduceop);
  kex_kernel_free(k);
  planned_free(&p);
  plan_json(&p, G(BUFF("[4,8,6]") "," BUFF("[6,8,4]") ",{\"op\":\"PERMUTE\",\"src\":[1],\"arg\":[2,1,0]}"
                  ",{\"op\":\"ADD\",\"src\":[0,2]}",
                  "3"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "E_4_8_6");
  kex_kernel_free(k);
  planned_free(&p);
  /* a copy kernel (only BufferOps) is named C */
  plan_json(&p, G(BUFF("[6,8]") ",{\"op\":\"PERMUTE\",\"src\":[0],\"arg\":[1,0]},{\"op\":\"CONTIGUOUS\",\"src\":[1]}",
                  "2"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "C_8_6");
  kex_kernel_free(k);
  planned_free(&p);
  /* the same LOAD used twice is one buffer */
  plan_json(&p, G(BUFF("[16]") ",{\"op\":\"MUL\",\"src\":[0,0]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(k->nbufs, 2);
  kex_kernel_free(k);
  planned_free(&p);
}

/* ---- preconditions: valid accepted, invalid refused with kernel unchanged ---- */

typedef struct snapshot {
  uint32_t nbufs;
  const kex_st *sts[16];
  int upcasted, local_dims, group, dont_use_locals;
  uint32_t napplied;
} snapshot;

static snapshot snap(const kex_kernel *k) {
  snapshot s = {0};
  s.nbufs = k->nbufs;
  for (uint32_t i = 0; i < k->nbufs && i < 16; i++) s.sts[i] = k->sts[i];
  s.upcasted = k->upcasted;
  s.local_dims = k->local_dims;
  s.group = k->group_for_reduces;
  s.dont_use_locals = k->dont_use_locals;
  s.napplied = k->napplied;
  return s;
}

static void expect_refused(kex_kernel *k, kex_opt o, const char *msg) {
  snapshot before = snap(k);
  kex_error err = {0};
  int rc = kex_kernel_apply_opt(k, o, true, &err);
  char buf[64];
  kex_opt_short(o, buf, sizeof buf);
  if (rc != KEX_EOPT) fail_msg("%s: rc %d, expected KEX_EOPT (%s)", buf, rc, msg);
  if (!strstr(err.msg, msg)) fail_msg("%s: message \"%s\", expected \"%s\"", buf, err.msg, msg);
  snapshot after = snap(k);
  assert_memory_equal(&before, &after, sizeof before);
}

static void expect_accepted(kex_kernel *k, kex_opt o) {
  kex_error err = {0};
  int rc = kex_kernel_apply_opt(k, o, true, &err);
  char buf[64];
  kex_opt_short(o, buf, sizeof buf);
  if (rc) fail_msg("%s refused: %s", buf, err.msg);
}

#define OPT(op, a, m) kex_opt_make(KEX_OPT_##op, a, m)

static void test_upcast_unroll_checks(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(64, 64)); /* full (64,64,64), first_reduce 2 */
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(UPCAST, 2, 4), "upcast is for non-reduce");
  expect_refused(k, OPT(UPCAST, 0, 16), "don't upcast more than 8");
  expect_refused(k, OPT(UPCAST, 0, 3), "no longer valid shift");
  expect_refused(k, OPT(UPCAST, 0, 1), "amt 1");
  expect_refused(k, OPT(UPCAST, 3, 4), "invalid axis");
  expect_refused(k, OPT(UPCAST, -2, 4), "invalid axis");
  expect_refused(k, OPT(UPCAST, 0, KEX_OPT_NONE), "needs an amt");
  expect_refused(k, OPT(UPCAST, 0, 0), "don't upcast more than 8"); /* amt 0 = whole dim 64 */
  expect_accepted(k, OPT(UPCAST, 0, 8));
  expect_name(k, "r_8_64_64_8");
  expect_colors(k, "bbry");
  assert_int_equal(k->upcasted, 1);
  expect_refused(k, OPT(UNROLL, 0, 64), "don't unroll more than 32");
  expect_refused(k, OPT(UNROLL, 1, 4), "can't upcasted already upcasted");
  expect_refused(k, OPT(UNROLL, 2, 4), "invalid axis");
  expect_accepted(k, OPT(UNROLL, 0, 4));
  expect_name(k, "r_8_64_16_8_4");
  expect_colors(k, "bbrym");
  expect_accepted(k, OPT(UNROLL, 0, 0)); /* whole remaining reduce dim (16) */
  expect_name(k, "r_8_64_8_4_16");
  assert_int_equal(kex_kernel_first_reduce(k), 2);
  assert_int_equal(k->upcasted, 3);
  expect_colors(k, "bbymm");
  expect_opts(k, "UPCAST(0,8) UNROLL(0,4) UNROLL(0,0)");
  /* no reduce dim left: real axis first_reduce+0 is an upcast dim */
  expect_refused(k, OPT(UNROLL, 0, 2), "can't upcasted already upcasted");
  expect_refused(k, OPT(TC, 0, 0), "tensor core opts must be first");
  expect_refused(k, OPT(UPCASTMID, 0, 4), "invalid upcast mid reduce");
  kex_kernel_free(k);
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(TC, 0, 0), "must have tensor cores");
  expect_refused(k, OPT(TC, KEX_OPT_NONE, 0), "tensor core opts must have an axis and amt");
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_local_checks(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(64, 64));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(LOCAL, 2, 4), "local is for globals");
  expect_accepted(k, OPT(LOCAL, 1, 16));
  expect_name(k, "r_64_4_16_64");
  expect_colors(k, "bbcr");
  expect_refused(k, OPT(LOCAL, 2, 4), "local is for globals"); /* axis 2 is the local now */
  expect_accepted(k, OPT(LOCAL, 0, 0));                        /* whole dim: the global disappears */
  expect_name(k, "r_4_16_64_64");
  assert_int_equal(k->local_dims, 2);
  expect_colors(k, "bccr");
  kex_kernel_free(k);
  /* CLANG has no locals */
  k = make_kernel(&p, 0, &kex_renderer_cpu);
  expect_refused(k, OPT(LOCAL, 0, 4), "target does not support local");
  expect_refused(k, OPT(GROUP, 0, 4), "target does not support local or shared mem");
  expect_refused(k, OPT(GROUPTOP, 0, 4), "target does not support local or shared mem");
  expect_refused(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE), "NOLOCALS is meaningless");
  expect_accepted(k, OPT(UPCAST, 0, 4));
  expect_accepted(k, OPT(UNROLL, 0, 4));
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_group_checks(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(512, 512));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_accepted(k, OPT(LOCAL, 0, 16));
  expect_accepted(k, OPT(LOCAL, 1, 16));
  /* 64 * 4 bytes * 256 local threads = 65536 > 32768 */
  expect_refused(k, OPT(GROUP, 0, 64), "exceeds maximum shared memory size: needs 65536, max 32768");
  expect_accepted(k, OPT(GROUP, 0, 32)); /* 32768: exactly at the limit */
  expect_colors(k, "bbccgr");
  expect_name(k, "r_32_32_16_16_32_16");
  /* with a group, later opts also pay for shared memory: UPCAST(0,2) would need 65536 */
  expect_refused(k, OPT(UPCAST, 0, 2), "exceeds maximum shared memory size");
  expect_refused(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE), "can't have no locals with locals");
  /* every opt after a group pays amt * 4 * 16*16*32 bytes: UNROLL(1,4) needs 131072 */
  expect_refused(k, OPT(UNROLL, 1, 4), "exceeds maximum shared memory size: needs 131072");
  expect_accepted(k, OPT(PADTO, 0, 64)); /* PADTO skips the estimate; 32 -> 64 */
  expect_name(k, "r_64_32_16_16_32_16");
  kex_kernel_free(k);
  planned_free(&p);
  /* GROUPTOP splits the top, GROUP the bottom */
  plan_json(&p, G(BUFF("[64,64]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  kex_kernel *c = kex_kernel_copy(k);
  assert_non_null(c);
  expect_accepted(k, OPT(GROUPTOP, 0, 16));
  expect_accepted(c, OPT(GROUP, 0, 16));
  expect_name(k, "r_64_16_4");
  expect_name(c, "r_64_16_4");
  assert_ptr_not_equal(k->sts[1], c->sts[1]); /* different strides */
  expect_refused(k, OPT(GROUP, 1, 2), "invalid axis");
  expect_accepted(k, OPT(UNROLL, 1, 4)); /* fully unroll the remaining reduce dim */
  expect_refused(k, OPT(GROUP, 0, 2), "must be reduce axis to group");
  kex_kernel_free(c);
  kex_kernel_free(k);
  /* fully unrolling a group dim takes it out of the group */
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_accepted(k, OPT(GROUP, 0, 16));
  assert_int_equal(k->group_for_reduces, 1);
  expect_accepted(k, OPT(UNROLL, 0, 16));
  assert_int_equal(k->group_for_reduces, 0);
  expect_name(k, "r_64_4_16");
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_nolocals_checks(void **state) {
  (void)state;
  planned p;
  plan_json(&p, MATMUL(64, 64));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_accepted(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE));
  assert_true(k->dont_use_locals);
  expect_colors(k, "BBr");
  expect_refused(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE), "NOLOCALS is meaningless");
  expect_refused(k, OPT(LOCAL, 0, 4), "not using locals");
  expect_refused(k, OPT(GROUP, 0, 4), "not using locals");
  expect_refused(k, OPT(GROUPTOP, 0, 4), "not using locals");
  expect_accepted(k, OPT(UPCAST, 0, 4));
  char buf[128];
  kex_opt_repr(k->applied_opts[0], buf, sizeof buf);
  assert_string_equal(buf, "Opt(op=OptOps.NOLOCALS, axis=None, amt=None)");
  kex_opt_repr(k->applied_opts[1], buf, sizeof buf);
  assert_string_equal(buf, "Opt(op=OptOps.UPCAST, axis=0, amt=4)");
  expect_opts(k, "NOLOCALS UPCAST(0,4)");
  kex_kernel_free(k);
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_accepted(k, OPT(LOCAL, 0, 4));
  expect_refused(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE), "can't have no locals with locals");
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_padto_checks(void **state) {
  (void)state;
  planned p;
  /* elementwise (60,) + (60,) */
  plan_json(&p, G(BUFF("[60]") "," BUFF("[60]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(PADTO, 0, 0), "nothing was padded");
  expect_refused(k, OPT(PADTO, 0, 1), "amt 1");
  expect_refused(k, OPT(PADTO, 0, 256), "pad adds more than quadruple the work");
  expect_accepted(k, OPT(PADTO, 0, 32)); /* 60 -> 64, 60 > 32//4 */
  expect_name(k, "E_64");
  const kex_view *v = kex_st_last(k->sts[1]);
  assert_non_null(v->mask);
  assert_int_equal(v->mask[1], 60);
  expect_refused(k, OPT(PADTO, 0, 32), "nothing was padded");
  expect_accepted(k, OPT(UPCAST, 0, 4));
  expect_refused(k, OPT(PADTO, 1, 8), "cannot pad upcasted");
  kex_kernel_free(k);
  planned_free(&p);
  /* a reduce axis pads only under SUM of pad-safe ops */
  plan_json(&p, G(BUFF("[60,60]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_accepted(k, OPT(PADTO, 1, 64));
  expect_name(k, "r_60_64");
  kex_kernel_free(k);
  planned_free(&p);
  plan_json(&p, G(BUFF("[60,60]") ",{\"op\":\"EXP2\",\"src\":[0]},{\"op\":\"REDUCE_SUM\",\"src\":[1],\"axis\":[1]}",
                  "2"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(PADTO, 1, 64), "cannot pad");
  expect_accepted(k, OPT(PADTO, 0, 64)); /* an output axis is fine */
  kex_kernel_free(k);
  planned_free(&p);
  plan_json(&p, G(BUFF("[60,60]") ",{\"op\":\"REDUCE_MAX\",\"src\":[0],\"axis\":[1]}", "1"));
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_refused(k, OPT(PADTO, 1, 64), "cannot pad");
  kex_kernel_free(k);
  planned_free(&p);
}

/* shift_to's layout and the dims limit: an opt that would exceed KEX_MAX_DIMS is refused. */
static void test_shift_to_and_limit(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[65536]") "," BUFF("[65536]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_shift_to(k, 0, 4, true, -1, NULL), 0);
  expect_name(k, "E_16384_4");
  kex_kernel_free(k);
  k = make_kernel(&p, 0, &kex_renderer_opencl);
  int applied = 0;
  while (kex_kernel_shape_len(k) < KEX_MAX_DIMS) {
    expect_accepted(k, OPT(UPCAST, 0, 2));
    applied++;
  }
  assert_int_equal(applied, KEX_MAX_DIMS - 1);
  expect_refused(k, OPT(UPCAST, 0, 2), "KEX_MAX_DIMS");
  kex_kernel_free(k);
  planned_free(&p);
}

/* A kernel whose dims are all 1 has shape_len 0: no opt applies, nothing crashes. */
static void test_scalar_kernel(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[1]") "," BUFF("[1]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"));
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  assert_int_equal(kex_kernel_shape_len(k), 0);
  expect_name(k, "E_");
  assert_int_equal(kex_kernel_hand_coded_optimizations(k, NULL), 0);
  expect_opts(k, "");
  expect_refused(k, OPT(UPCAST, 0, 0), "invalid axis");
  expect_refused(k, OPT(LOCAL, 0, 2), "invalid axis");
  expect_accepted(k, OPT(NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE));
  expect_colors(k, "");
  kex_kernel_free(k);
  planned_free(&p);
}

/* Opt text forms. */
static void test_opt_text(void **state) {
  (void)state;
  char buf[128];
  kex_opt_repr(OPT(UPCAST, 1, 4), buf, sizeof buf);
  assert_string_equal(buf, "Opt(op=OptOps.UPCAST, axis=1, amt=4)");
  kex_opt_short(OPT(GROUPTOP, 0, 256), buf, sizeof buf);
  assert_string_equal(buf, "GROUPTOP(0,256)");
  kex_opt_short(OPT(UNROLL, 0, 0), buf, sizeof buf);
  assert_string_equal(buf, "UNROLL(0,0)");
  assert_string_equal(kex_optop_name(KEX_OPT_PADTO), "PADTO");
}

/* A multi-output kernel is named r2_... and keeps output bufs first. */
static void test_multioutput_name(void **state) {
  (void)state;
  planned p;
  plan_json(&p, G(BUFF("[16]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}," CONSTF("2", "[1]")
                  ",{\"op\":\"ADD\",\"src\":[1,2]}," CONSTF("4", "[1]") ",{\"op\":\"ADD\",\"src\":[1,4]}",
                  "3,5"));
  assert_int_equal(p.s->nkernels, 1);
  kex_kernel *k = make_kernel(&p, 0, &kex_renderer_opencl);
  expect_name(k, "r2_16");
  assert_int_equal(k->bufs[0].op, KEX_OP_STORE);
  assert_int_equal(k->bufs[1].op, KEX_OP_STORE);
  assert_int_equal(k->nbufs, 5); /* 2 outputs, the input, 2 consts */
  assert_int_equal(k->full_buf_index, 2);
  kex_kernel_free(k);
  planned_free(&p);
}

/* Out of memory at every allocation of construction + hand-coded opts: KEX_ENOMEM, no crash, no leak. */
static void oom_sweep(const char *json, const kex_renderer_caps *caps) {
  planned p;
  plan_json(&p, json);
  char want_opts[512];
  kex_kernel *k0 = make_kernel(&p, 0, caps);
  assert_int_equal(kex_kernel_hand_coded_optimizations(k0, NULL), 0);
  kex_kernel_opts_string(k0, want_opts, sizeof want_opts);
  kex_kernel_free(k0);
  int failures = 0;
  for (unsigned long n = 1; n < 100000; n++) {
    kex_kernel *k = NULL;
    kex_error err = {0};
    kex_alloc_fail_at(n, 1);
    int rc = kex_kernel_from_item(p.s, nth_kernel(&p, 0), caps, &k, &err);
    if (!rc) rc = kex_kernel_hand_coded_optimizations(k, &err);
    kex_alloc_fail_at(0, 0);
    if (rc == 0) {
      expect_opts(k, want_opts);
      kex_kernel_free(k);
      break;
    }
    if (rc != KEX_ENOMEM) fail_msg("n=%lu: rc %d (%s)", n, rc, err.msg);
    kex_kernel_free(k);
    failures++;
  }
  assert_true(failures > 3);
  planned_free(&p);
}

static void test_oom_everywhere(void **state) {
  (void)state;
  oom_sweep(MATMUL(64, 64), &kex_renderer_opencl);
  oom_sweep(G(BUFF("[64,64]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}", "1"), &kex_renderer_opencl);
  oom_sweep(G(BUFF("[3,4096]") "," BUFF("[3,4096]") ",{\"op\":\"PAD\",\"src\":[0],\"arg\":[[0,3],[0,0]]}"
              ",{\"op\":\"PAD\",\"src\":[1],\"arg\":[[3,0],[0,0]]},{\"op\":\"ADD\",\"src\":[2,3]},"
              CONSTF("2", "[6,4096]") ",{\"op\":\"MUL\",\"src\":[4,5]}", "6"),
            &kex_renderer_opencl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul512_bench), cmocka_unit_test(test_matmul512_json),
      cmocka_unit_test(test_sum4M),           cmocka_unit_test(test_muladd4M),
      cmocka_unit_test(test_matvec),          cmocka_unit_test(test_sum_4096x16),
      cmocka_unit_test(test_sum_64x64),       cmocka_unit_test(test_cat_mul),
      cmocka_unit_test(test_broadcast_add),   cmocka_unit_test(test_cpu_hand_coded),
      cmocka_unit_test(test_normal_form),     cmocka_unit_test(test_upcast_unroll_checks),
      cmocka_unit_test(test_local_checks),    cmocka_unit_test(test_group_checks),
      cmocka_unit_test(test_nolocals_checks), cmocka_unit_test(test_padto_checks),
      cmocka_unit_test(test_shift_to_and_limit), cmocka_unit_test(test_opt_text),
      cmocka_unit_test(test_multioutput_name), cmocka_unit_test(test_oom_everywhere),
      cmocka_unit_test(test_scalar_kernel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

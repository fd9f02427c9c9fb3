/*
 * test_schedule.c - the scheduler's rules on graphs whose answers the spec
 * works out (spec section 15), the assign rules, the memory planner, the
 * text form, out-of-memory at every allocation, the kernel limits
 * (max_kernel_depth, max_kernel_ops) on both sides, refusals of overflowing
 * view arithmetic, and a 100,000-node chain (with limits widened for it)
 * scheduled on a small thread stack (no deep recursion anywhere), and the
 * warm replay state (sched/warm.h): same schedules warm or cold, its
 * objects reused across graphs, and its byte limit on both sides.
 */
#include <pthread.h>
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
#include "sched/warm.h"
#include "planned.h"

#define EMPTYF(shape) "{\"op\":\"EMPTY\",\"dtype\":\"float32\",\"shape\":" shape "}"

static void expect_kernels(const char *json, int opencl, int cpu) {
  planned p;
  plan_text(&p, json, false);
  if (p.rc) fail_msg("opencl: %s", p.err.msg);
  assert_int_equal(p.s->nkernels, opencl);
  planned_free(&p);
  plan_text(&p, json, true);
  if (p.rc) fail_msg("cpu: %s", p.err.msg);
  assert_int_equal(p.s->nkernels, cpu);
  planned_free(&p);
}

/* The same expression built twice is one LazyBuffer (lazycache) -> one kernel. */
static void test_lazycache(void **state) {
  (void)state;
  expect_kernels(G(EMPTYF("[8]") "," EMPTYF("[8]") ",{\"op\":\"ADD\",\"src\":[0,1]},{\"op\":\"ADD\",\"src\":[0,1]}",
                   "2,3"),
                 1, 1);
  /* but two different expressions are two kernels */
  expect_kernels(G(EMPTYF("[8]") "," EMPTYF("[8]") ",{\"op\":\"ADD\",\"src\":[0,1]},{\"op\":\"MUL\",\"src\":[0,1]}",
                   "2,3"),
                 2, 2);
}

/* Sum of 4M floats splits into 256 partial sums, then the final sum (spec 5, `r`). */
static void test_split_reduce(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(EMPTYF("[4194304]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}", "1"), false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 2);
  const kex_sched_item *k1 = &p.s->items[1];
  assert_int_equal(k1->kind, KEX_ITEM_KERNEL);
  const kex_st *st = k1->ast[0]->st;
  assert_int_equal(kex_st_ndim(st), 2);
  assert_int_equal(kex_st_shape(st)[0], 1);
  assert_int_equal(kex_st_shape(st)[1], 256);
  planned_free(&p);
  /* below the threshold (ratio 32767 < 32768) there is no split */
  expect_kernels(G(EMPTYF("[32767]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}", "1"), 1, 1);
  expect_kernels(G(EMPTYF("[32768]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}", "1"), 2, 2);
}

/* softmax over (4,12,64,64): max, sum and the divide are 3 kernels (spec 15). */
static void test_softmax(void **state) {
  (void)state;
  expect_kernels(G(EMPTYF("[4,12,64,64]") ",{\"op\":\"REDUCE_MAX\",\"src\":[0],\"axis\":[3]}"
                                          ",{\"op\":\"EXPAND\",\"src\":[1],\"arg\":[4,12,64,64]}"
                                          ",{\"op\":\"SUB\",\"src\":[0,2]}," CONSTF("1.4426950408889634", "[4,12,64,64]")
                                          ",{\"op\":\"MUL\",\"src\":[3,4]},{\"op\":\"EXP2\",\"src\":[5]}"
                                          ",{\"op\":\"REDUCE_SUM\",\"src\":[6],\"axis\":[3]}"
                                          ",{\"op\":\"EXPAND\",\"src\":[7],\"arg\":[4,12,64,64]}"
                                          ",{\"op\":\"DIV\",\"src\":[6,8]}",
                   "9"),
                 3, 3);
}

/* out0 = a.sum()+2, out1 = a.sum()+4, out2 = out0*out1: one kernel, three stores (MULTIOUTPUT). */
static void test_multioutput(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(EMPTYF("[16]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}," CONSTF("2", "[1]")
                  ",{\"op\":\"ADD\",\"src\":[1,2]}," CONSTF("4", "[1]") ",{\"op\":\"ADD\",\"src\":[1,4]}"
                  ",{\"op\":\"MUL\",\"src\":[3,5]}",
                  "3,5,6"),
            false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 1);
  const kex_sched_item *k = &p.s->items[p.s->nitems - 1];
  assert_int_equal(k->nout, 3);
  planned_free(&p);
}

/* r = a.sum(0)+6; r.sum(0)*4; r.sum(1)*2 -> 3 kernels, the first stores ADD(SUM(a), 6) (the chase). */
static void test_chase(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(EMPTYF("[4,4,4]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}," CONSTF("6", "[1,4,4]")
                  ",{\"op\":\"ADD\",\"src\":[1,2]},{\"op\":\"REDUCE_SUM\",\"src\":[3],\"axis\":[1]}," CONSTF("4", "[1,1,4]")
                  ",{\"op\":\"MUL\",\"src\":[4,5]},{\"op\":\"REDUCE_SUM\",\"src\":[3],\"axis\":[2]}," CONSTF("2", "[1,4,1]")
                  ",{\"op\":\"MUL\",\"src\":[7,8]}",
                  "6,9"),
            false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 3);
  const kex_sched_item *k = NULL;
  for (uint32_t i = 0; i < p.s->nitems && !k; i++)
    if (p.s->items[i].kind == KEX_ITEM_KERNEL) k = &p.s->items[i];
  assert_non_null(k);
  assert_int_equal(k->ast[0]->src[0]->op, KEX_OP_ADD);
  planned_free(&p);
}

/* a.log2().pad(..).sum() realizes the log2 first (unsafe pad); (a+b).pad(..).sum() fuses. */
static void test_pad_safety(void **state) {
  (void)state;
  expect_kernels(G(EMPTYF("[4]") ",{\"op\":\"LOG2\",\"src\":[0]},{\"op\":\"PAD\",\"src\":[1],\"arg\":[[1,1]]}"
                                 ",{\"op\":\"REDUCE_SUM\",\"src\":[2],\"axis\":[0]}",
                   "3"),
                 2, 2);
  expect_kernels(G(EMPTYF("[4]") "," EMPTYF("[4]") ",{\"op\":\"ADD\",\"src\":[0,1]}"
                                                   ",{\"op\":\"PAD\",\"src\":[2],\"arg\":[[1,1]]}"
                                                   ",{\"op\":\"REDUCE_SUM\",\"src\":[3],\"axis\":[0]}",
                   "4"),
                 1, 1);
}

/* x[2:5].contiguous(): a buffer view on cpu (no kernel), a copy kernel on opencl. */
static void test_buffer_view_rule(void **state) {
  (void)state;
  planned p;
  const char *g = G(EMPTYF("[8]") ",{\"op\":\"SHRINK\",\"src\":[0],\"arg\":[[2,5]]}"
                                  ",{\"op\":\"STRIDE\",\"src\":[1],\"arg\":[1]},{\"op\":\"CONTIGUOUS\",\"src\":[2]}",
                    "3");
  plan_text(&p, g, true);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 0);
  assert_int_equal(p.s->items[p.s->nitems - 1].kind, KEX_ITEM_VIEW);
  planned_free(&p);
  plan_text(&p, g, false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 1);
  planned_free(&p);
}

/* Reading the assign target through a permuted view is refused, naming the ASSIGN node. */
static void test_assign_must_be_contiguous(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(BUFF("[4,4]") ",{\"op\":\"PERMUTE\",\"src\":[0],\"arg\":[1,0]}," CONSTF("1", "[4,4]")
                  ",{\"op\":\"ADD\",\"src\":[1,2]},{\"op\":\"ASSIGN\",\"src\":[3,0]}",
                  "4"),
            false);
  assert_int_equal(p.rc, KEX_EASSIGN);
  assert_non_null(strstr(p.err.msg, "must be contiguous for assign"));
  assert_non_null(strstr(p.err.msg, "node 4"));
  planned_free(&p);
  /* the same through .contiguous() is fine: 2 kernels */
  plan_text(&p, G(BUFF("[4,4]") ",{\"op\":\"PERMUTE\",\"src\":[0],\"arg\":[1,0]}," CONSTF("1", "[4,4]")
                  ",{\"op\":\"ADD\",\"src\":[1,2]},{\"op\":\"CONTIGUOUS\",\"src\":[3]},{\"op\":\"ASSIGN\",\"src\":[4,0]}",
                  "5"),
            false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 2);
  planned_free(&p);
}

/* A kernel that reads an assign target runs before the assign, whatever the output order. */
static void test_assign_ordering(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(BUFF("[16]") "," CONSTF("2", "[16]") ",{\"op\":\"MUL\",\"src\":[0,1]},{\"op\":\"ASSIGN\",\"src\":[2,0]},"
                  CONSTF("1", "[16]") ",{\"op\":\"ADD\",\"src\":[0,4]}",
                  "3,5"),
            false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 2);
  int reader = -1, assign = -1;
  for (uint32_t i = 0; i < p.s->nitems; i++) {
    const kex_sched_item *it = &p.s->items[i];
    if (it->kind != KEX_ITEM_KERNEL) continue;
    if (it->outs[0]->op == KEX_OP_ASSIGN) assign = (int)i;
    else reader = (int)i;
  }
  assert_true(reader >= 0 && assign >= 0);
  assert_true(reader < assign);
  planned_free(&p);
}

/* Three same-sized forced intermediates in a row share buffers after planning. */
static void test_memory_planner(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(EMPTYF("[64]") "," CONSTF("1", "[64]") ",{\"op\":\"ADD\",\"src\":[0,1]},{\"op\":\"CONTIGUOUS\",\"src\":[2]}"
                  ",{\"op\":\"ADD\",\"src\":[3,1]},{\"op\":\"CONTIGUOUS\",\"src\":[4]}"
                  ",{\"op\":\"ADD\",\"src\":[5,1]},{\"op\":\"CONTIGUOUS\",\"src\":[6]}"
                  ",{\"op\":\"ADD\",\"src\":[7,1]}",
                  "8"),
            false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 4);
  assert_int_equal(p.s->nplanned_buffers, 3);
  assert_true(p.s->nplanned_after <= 2);
  /* the planned buffers of consecutive kernels never alias an input with the output */
  for (uint32_t i = 0; i < p.s->nitems; i++) {
    const kex_sched_item *it = &p.s->items[i];
    for (uint32_t j = 1; j < it->nbufs; j++) assert_int_not_equal(it->planned[0], it->planned[j]);
  }
  planned_free(&p);
}

/* x ** Tensor(0) style folding: MUL by const 0 gives no kernel; size-0 gives no kernel. */
static void test_const_folding(void **state) {
  (void)state;
  expect_kernels(G(EMPTYF("[8]") "," CONSTF("0", "[8]") ",{\"op\":\"MUL\",\"src\":[0,1]}", "2"), 0, 0);
  expect_kernels(G(EMPTYF("[8]") "," CONSTF("0", "[8]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"), 0, 0);
  expect_kernels(G(EMPTYF("[8]") "," CONSTF("1", "[8]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"), 1, 1);
  expect_kernels(G(CONSTF("3", "[8]") "," CONSTF("4", "[8]") ",{\"op\":\"ADD\",\"src\":[0,1]}", "2"), 0, 0);
}

/* The text form is stable: two runs print identical text that ends with the kernel count. */
static void test_print_stable(void **state) {
  (void)state;
  const char *g = G(EMPTYF("[4,4]") ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]},{\"op\":\"RESHAPE\",\"src\":[1],"
                                    "\"arg\":[4]}",
                    "2");
  char *text[2];
  for (int i = 0; i < 2; i++) {
    planned p;
    plan_text(&p, g, false);
    assert_int_equal(p.rc, 0);
    size_t len;
    FILE *f = open_memstream(&text[i], &len);
    assert_int_equal(kex_schedule_print(p.s, f), 0);
    fclose(f);
    planned_free(&p);
  }
  assert_string_equal(text[0], text[1]);
  assert_non_null(strstr(text[0], "item 0: LoadOps.EMPTY"));
  assert_non_null(strstr(text[0], "item 1: kernel:1out"));
  assert_non_null(strstr(text[0], "ReduceOps.SUM(%0) dtypes.float axis=(1,)"));
  assert_non_null(strstr(text[0], "View(shape=(4, 4), strides=(4, 1), offset=0, mask=None, contiguous=True)"));
  assert_non_null(strstr(text[0], "kernels: 1\n"));
  free(text[0]);
  free(text[1]);
}

/* Out of memory at every allocation of replay+schedule is KEX_ENOMEM, never a crash or a leak. */
static void test_oom_everywhere(void **state) {
  (void)state;
  const char *json = G(EMPTYF("[4,4]") "," EMPTYF("[4,4]") ",{\"op\":\"ADD\",\"src\":[0,1]}"
                                       ",{\"op\":\"REDUCE_SUM\",\"src\":[2],\"axis\":[1]}"
                                       ",{\"op\":\"EXPAND\",\"src\":[3],\"arg\":[4,4]},{\"op\":\"DIV\",\"src\":[2,4]}",
                       "5");
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err;
  int failures = 0;
  for (unsigned long n = 1; n < 100000; n++) {
    kex_graph *g = NULL;
    assert_int_equal(kex_graph_from_json(json, strlen(json), &lim, &g, &err), 0);
    planned p;
    kex_alloc_fail_at(n, 1);
    plan_graph(&p, g, false);
    kex_alloc_fail_at(0, 0);
    int rc = p.rc;
    planned_free(&p);
    if (rc == 0) break;
    assert_int_equal(rc, KEX_ENOMEM);
    failures++;
  }
  assert_true(failures > 5);
}


/* COPY: to another device is a COPY item; a copy back collapses to the source; a shrunk view is made contiguous first. */
static void test_copy_rules(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G(EMPTYF("[16]") ",{\"op\":\"COPY\",\"src\":[0],\"device\":\"cpu\"}", "1"), false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nitems, 2);
  assert_int_equal(p.s->items[1].kind, KEX_ITEM_COPY);
  assert_int_equal(p.s->nkernels, 0);
  planned_free(&p);
  /* double COPY = one COPY: there and back is the original buffer, nothing to run but its EMPTY */
  plan_text(&p, G(EMPTYF("[16]") ",{\"op\":\"COPY\",\"src\":[0],\"device\":\"cpu\"}"
                  ",{\"op\":\"COPY\",\"src\":[1],\"device\":\"opencl\"}", "2"), false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nitems, 1);
  assert_int_equal(p.s->items[0].kind, KEX_ITEM_EMPTY);
  planned_free(&p);
  /* a shrink before a copy: CONTIGUOUS kernel, then the COPY */
  plan_text(&p, G(EMPTYF("[16]") ",{\"op\":\"SHRINK\",\"src\":[0],\"arg\":[[2,10]]}"
                  ",{\"op\":\"COPY\",\"src\":[1],\"device\":\"cpu\"}", "2"), false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nkernels, 1);
  assert_int_equal(p.s->items[p.s->nitems - 1].kind, KEX_ITEM_COPY);
  planned_free(&p);
  /* a const is never copied: it becomes a const on the other device */
  plan_text(&p, G(CONSTF("3", "[16]") ",{\"op\":\"COPY\",\"src\":[0],\"device\":\"cpu\"}", "1"), false);
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.s->nitems, 0);
  planned_free(&p);
}

/* ---- kernel limits ---- */

/* The kernel item of a schedule with exactly one. */
static const kex_sched_item *only_kernel(const planned *p) {
  const kex_sched_item *k = NULL;
  assert_int_equal(p->s->nkernels, 1);
  for (uint32_t i = 0; i < p->s->nitems; i++)
    if (p->s->items[i].kind == KEX_ITEM_KERNEL) k = &p->s->items[i];
  assert_non_null(k);
  return k;
}

/*
 * EMPTY a, EMPTY b, then `len` MULs cur = cur * b, with CONTIGUOUS after every
 * `split` of them (0 = never); the last node is the output.  Its kernel's AST
 * is LOAD, up to `split` MULs and the STORE.
 */
static kex_graph *mul_chain(const kex_limits *lim, int len, int split) {
  kex_error err;
  kex_graph *g = kex_graph_new(NULL);
  assert_non_null(g);
  int64_t shape[1] = {16};
  kex_gnode in = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape};
  int cur = kex_graph_add(g, &in, lim, &err), b = kex_graph_add(g, &in, lim, &err);
  for (int i = 0; i < len; i++) {
    kex_gnode mul = {.op = KEX_GOP_MUL, .nsrc = 2, .src = {(uint32_t)cur, (uint32_t)b}};
    cur = kex_graph_add(g, &mul, lim, &err);
    if (split && (i + 1) % split == 0 && i + 1 < len) {
      kex_gnode c = {.op = KEX_GOP_CONTIGUOUS, .nsrc = 1, .src = {(uint32_t)cur}};
      cur = kex_graph_add(g, &c, lim, &err);
    }
    if (cur < 0) fail_msg("%s", err.msg);
  }
  assert_int_equal(kex_graph_add_output(g, (uint32_t)cur, lim, &err), 0);
  return g;
}

/* Plan g under both devices' rules; expect rc and (on failure) every needle in the message. */
static void expect_plan(const kex_limits *lim, int len, int split, int rc, const char *needle, const char *needle2) {
  for (int cpu = 0; cpu < 2; cpu++) {
    planned p;
    plan_graph(&p, mul_chain(lim, len, split), cpu);
    if (p.rc != rc || (needle && !strstr(p.err.msg, needle)) || (needle2 && !strstr(p.err.msg, needle2)))
      fail_msg("len %d split %d %s: got %d \"%s\", want %d with \"%s\"", len, split, cpu ? "cpu" : "opencl", p.rc,
               p.err.msg, rc, needle ? needle : "", needle2 ? needle2 : "");
    planned_free(&p);
  }
}

/*
 * max_kernel_depth: a kernel's AST (STORE .. LOAD) of exactly the limit is
 * scheduled, one level more is refused naming the output node, the depth and
 * the limit; a CONTIGUOUS splits it into kernels that fit.  The default is an
 * abuse guard past what the default max_depth and max_kernel_ops allow, so
 * those are raised to reach it.
 */
static void test_kernel_depth_limit(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_depth = KEX_LIMIT_KERNEL_DEPTH + 8;
  lim.max_kernel_ops = KEX_LIMIT_KERNEL_DEPTH + 8;
  /* the default: 9,998 MULs + LOAD + STORE = 10,000 levels */
  assert_int_equal(KEX_LIMIT_KERNEL_DEPTH, 10000);
  planned p;
  plan_graph(&p, mul_chain(&lim, KEX_LIMIT_KERNEL_DEPTH - 2, 0), false);
  if (p.rc) fail_msg("%s", p.err.msg);
  assert_int_equal(only_kernel(&p)->ast[0]->depth, KEX_LIMIT_KERNEL_DEPTH);
  assert_int_equal(only_kernel(&p)->ast[0]->src[0]->depth, KEX_LIMIT_KERNEL_DEPTH - 1);
  planned_free(&p);
  char out[64], want[128];
  snprintf(out, sizeof out, "node %d: the kernel storing it", KEX_LIMIT_KERNEL_DEPTH);
  snprintf(want, sizeof want, "AST %d levels deep (reached at node %d, MUL), more than the limit of %d (max_kernel_depth)",
           KEX_LIMIT_KERNEL_DEPTH + 1, KEX_LIMIT_KERNEL_DEPTH, KEX_LIMIT_KERNEL_DEPTH);
  expect_plan(&lim, KEX_LIMIT_KERNEL_DEPTH - 1, 0, KEX_ELIMIT, out, want);
  /* ... and fits once split by CONTIGUOUS */
  expect_plan(&lim, KEX_LIMIT_KERNEL_DEPTH - 1, 5000, 0, NULL, NULL);

  /* all defaults: a 1,000-op chain (nested whole, clang refused it past 256 brackets) is one kernel, and so is
     the longest chain max_depth allows, 4,095 MULs: 4,096 operations with the STORE, max_kernel_ops exactly */
  lim = KEX_LIMITS_DEFAULT;
  expect_plan(&lim, 1000, 0, 0, NULL, NULL);
  plan_graph(&p, mul_chain(&lim, KEX_LIMIT_DEPTH - 1, 0), true);
  if (p.rc) fail_msg("%s", p.err.msg);
  assert_int_equal(only_kernel(&p)->ast[0]->depth, KEX_LIMIT_DEPTH + 1);
  planned_free(&p);
  assert_int_equal(KEX_LIMIT_KERNEL_OPS, KEX_LIMIT_DEPTH);

  /* a configured limit: 8 MULs = 10 levels */
  lim.max_kernel_depth = 10;
  expect_plan(&lim, 8, 0, 0, NULL, NULL);
  expect_plan(&lim, 9, 0, KEX_ELIMIT, "node 10: the kernel storing it has an AST 11 levels deep",
              "more than the limit of 10 (max_kernel_depth)");
  expect_plan(&lim, 40, 8, 0, NULL, NULL); /* 5 kernels of 8 */
  planned q;
  plan_graph(&q, mul_chain(&lim, 40, 8), false);
  assert_int_equal(q.rc, 0);
  assert_int_equal(q.s->nkernels, 5);
  planned_free(&q);
}

/*
 * A wide kernel: 64 chains y_j = (a + c_j) * a * ... (62 MULs), summed
 * pairwise, = 64 * 63 + 63 ops + the STORE = 4096 operations, 71 levels deep.
 * `extra` NEGs on top add one op each.
 */
static kex_graph *wide_kernel(const kex_limits *lim, int extra) {
  kex_error err;
  kex_graph *g = kex_graph_new(NULL);
  assert_non_null(g);
  int64_t shape[1] = {4};
  kex_gnode in = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape};
  int a = kex_graph_add(g, &in, lim, &err), ys[64];
  for (int j = 0; j < 64; j++) {
    kex_gnode c = {.op = KEX_GOP_CONST, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape,
                   .value = kex_const_float(j + 2)};
    int cj = kex_graph_add(g, &c, lim, &err);
    kex_gnode add = {.op = KEX_GOP_ADD, .nsrc = 2, .src = {(uint32_t)a, (uint32_t)cj}};
    int y = kex_graph_add(g, &add, lim, &err);
    for (int k = 0; k < 62; k++) {
      kex_gnode mul = {.op = KEX_GOP_MUL, .nsrc = 2, .src = {(uint32_t)y, (uint32_t)a}};
      y = kex_graph_add(g, &mul, lim, &err);
    }
    ys[j] = y;
  }
  for (int n = 64; n > 1; n /= 2)
    for (int j = 0; j < n / 2; j++) {
      kex_gnode add = {.op = KEX_GOP_ADD, .nsrc = 2, .src = {(uint32_t)ys[2 * j], (uint32_t)ys[2 * j + 1]}};
      ys[j] = kex_graph_add(g, &add, lim, &err);
    }
  int cur = ys[0];
  for (int i = 0; i < extra; i++) {
    kex_gnode neg = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {(uint32_t)cur}};
    cur = kex_graph_add(g, &neg, lim, &err);
  }
  if (cur < 0) fail_msg("%s", err.msg);
  assert_int_equal(kex_graph_add_output(g, (uint32_t)cur, lim, &err), 0);
  return g;
}

/* max_kernel_ops: exactly the default fits, one more op is refused naming the output, the count and the limit. */
static void test_kernel_ops_limit(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  assert_int_equal(KEX_LIMIT_KERNEL_OPS, 4096); /* wide_kernel is sized for it */
  for (int cpu = 0; cpu < 2; cpu++) {
    planned p;
    plan_graph(&p, wide_kernel(&lim, 0), cpu);
    if (p.rc) fail_msg("%s", p.err.msg);
    const kex_sched_item *k = only_kernel(&p);
    assert_int_equal(k->ast[0]->depth, 71);
    planned_free(&p);
    plan_graph(&p, wide_kernel(&lim, 1), cpu);
    assert_int_equal(p.rc, KEX_ELIMIT);
    if (!strstr(p.err.msg, "the kernel storing it reaches 4097 operations") ||
        !strstr(p.err.msg, "more than the limit of 4096 (max_kernel_ops)"))
      fail_msg("%s", p.err.msg);
    planned_free(&p);
  }
  /* a configured limit on a chain: 9 MULs + STORE = 10 ops */
  lim.max_kernel_ops = 10;
  expect_plan(&lim, 9, 0, 0, NULL, NULL);
  expect_plan(&lim, 10, 0, KEX_ELIMIT, "node 11: the kernel storing it reaches 11 operations",
              "more than the limit of 10 (max_kernel_ops)");
  expect_plan(&lim, 30, 9, 0, NULL, NULL);
}

/*
 * REDUCE_SUM of an int64 CONST folds to value * count as Python would, then
 * as_const keeps the low 64 bits: (2**62 + 1) * 4 = 2**64 + 4 -> 4, computed
 * without signed overflow (the UBSan build aborted here).
 */
static void test_const_reduce_wraps(void **state) {
  (void)state;
  planned p;
  plan_text(&p, G("{\"op\":\"CONST\",\"dtype\":\"int64\",\"shape\":[4],\"value\":4611686018427387905}"
                  ",{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[0]}", "1"), false);
  assert_int_equal(p.rc, 0);
  const kex_lb *lb = p.r->node_lb[1]->base;
  assert_int_equal(lb->op, KEX_OP_CONST);
  assert_int_equal(lb->arg.kind, KEX_CONST_INT);
  assert_true(lb->arg.i == 4);
  assert_int_equal(p.s->nkernels, 0);
  planned_free(&p);
}

/*
 * View arithmetic that overflows is refused, naming the node, even when a
 * graph skips validation (here a STRIDE arg forged after loading): the
 * replay reports KEX_ELIMIT, never UB or "out of memory".
 */
static void test_replay_refuses_overflow(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err;
  const char *json = G(EMPTYF("[4]") ",{\"op\":\"STRIDE\",\"src\":[0],\"arg\":[2]}", "1");
  kex_graph *g = NULL;
  assert_int_equal(kex_graph_from_json(json, strlen(json), &lim, &g, &err), 0);
  ((int64_t *)g->nodes[1].arg)[0] = INT64_MIN; /* what validation refuses */
  planned p;
  plan_graph(&p, g, false);
  assert_int_equal(p.rc, KEX_ELIMIT);
  if (!strstr(p.err.msg, "node 1 (STRIDE)") || !strstr(p.err.msg, "-9223372036854775808"))
    fail_msg("%s", p.err.msg);
  planned_free(&p);
}

#define CHAIN_N 100000

static void *chain_thread(void *arg) {
  planned *p = arg;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  /* far past the defaults on purpose: inputs are depth 1, the last ADD CHAIN_N + 1; its kernel's AST is
     LOAD, CHAIN_N ADDs and the STORE */
  lim.max_depth = CHAIN_N + 1;
  lim.max_kernel_depth = CHAIN_N + 2;
  lim.max_kernel_ops = CHAIN_N + 1;
  kex_error err;
  kex_graph *g = kex_graph_new(NULL);
  int64_t shape[1] = {256};
  kex_gnode in = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape};
  int a = kex_graph_add(g, &in, &lim, &err), b = kex_graph_add(g, &in, &lim, &err), cur = a;
  for (int i = 0; i < CHAIN_N; i++) {
    kex_gnode add = {.op = KEX_GOP_ADD, .nsrc = 2, .src = {(uint32_t)cur, (uint32_t)b}};
    cur = kex_graph_add(g, &add, &lim, &err);
  }
  kex_graph_add_output(g, (uint32_t)cur, &lim, &err);
  plan_graph(p, g, false);
  return NULL;
}

/* A 100,000-node elementwise chain is one kernel, scheduled on a 256 KiB stack. */
static void test_chain_100k(void **state) {
  (void)state;
  planned p;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t t;
  assert_int_equal(pthread_create(&t, &attr, chain_thread, &p), 0);
  pthread_join(t, NULL);
  pthread_attr_destroy(&attr);
  if (p.rc) fail_msg("%s", p.err.msg);
  assert_int_equal(p.s->nkernels, 1);
  assert_int_equal(p.s->nitems, 3); /* EMPTY, EMPTY, the kernel */
  /* the kernel reads both inputs */
  assert_int_equal(p.s->items[2].nin, 2);
  planned_free(&p);
}

/* The schedule's text (kex_schedule_print); the caller frees it. */
static char *schedule_text(const kex_schedule *s) {
  char *text = NULL;
  size_t len;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  assert_int_equal(kex_schedule_print(s, f), 0);
  fclose(f);
  return text;
}

/* Replay and schedule g in w (opencl rules) and print it; *last_st: the last node's ShapeTracker.  Ends with limit. */
static unsigned long warm_allocs; /* heap allocations of warm_plan's replay and schedule */
static char *warm_plan(kex_sched_warm *w, const kex_graph *g, size_t limit, const kex_st **last_st, bool *reset) {
  kex_replay_opts ro = kex_replay_opts_for(false), again = ro;
  kex_arena *a = kex_sched_warm_begin(w, g->nnodes, &ro);
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_error err = {0};
  assert_non_null(a);
  assert_non_null(ro.shape);
  assert_null(kex_sched_warm_begin(w, g->nnodes, &again)); /* in use: the caller replays cold */
  unsigned long allocs = kex_alloc_count();
  assert_int_equal(kex_replay_graph(g, &ro, a, &r, &err), 0);
  assert_int_equal(kex_schedule_create(r, &s, &err), 0);
  warm_allocs = kex_alloc_count() - allocs;
  char *text = schedule_text(s);
  *last_st = r->node_lb[g->nnodes - 1]->st;
  kex_schedule_free(s);
  kex_replay_free(r);
  *reset = kex_sched_warm_end(w, limit);
  return text;
}

static void test_warm_state(void **state) {
  (void)state;
  const char *jsons[] = {
      G(EMPTYF("[4,8]") ",{\"op\":\"REDUCE_MAX\",\"src\":[0],\"axis\":[1]},{\"op\":\"EXPAND\",\"src\":[1],"
                        "\"arg\":[4,8]},{\"op\":\"SUB\",\"src\":[0,2]},{\"op\":\"EXP2\",\"src\":[3]},"
                        "{\"op\":\"REDUCE_SUM\",\"src\":[4],\"axis\":[1]},{\"op\":\"EXPAND\",\"src\":[5],"
                        "\"arg\":[4,8]},{\"op\":\"DIV\",\"src\":[4,6]},{\"op\":\"PERMUTE\",\"src\":[7],"
                        "\"arg\":[1,0]},{\"op\":\"RESHAPE\",\"src\":[8],\"arg\":[32]}",
        "9"),
      G(EMPTYF("[4,8]") "," EMPTYF("[8,4]") ",{\"op\":\"PERMUTE\",\"src\":[1],\"arg\":[1,0]},"
                        "{\"op\":\"ADD\",\"src\":[0,2]},{\"op\":\"PAD\",\"src\":[3],\"arg\":[[1,1],[0,0]]},"
                        "{\"op\":\"SHRINK\",\"src\":[4],\"arg\":[[0,4],[2,6]]},{\"op\":\"RESHAPE\",\"src\":[5],"
                        "\"arg\":[16]}",
        "6"),
  };
  enum { N = sizeof jsons / sizeof *jsons };
  kex_graph *g[N];
  char *cold[N];
  for (int i = 0; i < N; i++) {
    planned p;
    plan_text(&p, jsons[i], false);
    if (p.rc) fail_msg("graph %d: %s", i, p.err.msg);
    cold[i] = schedule_text(p.s);
    g[i] = p.g;
    p.g = NULL;
    planned_free(&p);
  }
  kex_sched_warm *w = kex_sched_warm_new();
  assert_non_null(w);
  assert_int_equal(kex_sched_warm_bytes(w), 0);
  /* under the limit: three rounds over both graphs, each schedule as the cold one, the interned objects kept */
  const kex_st *first[N] = {NULL}, *st;
  bool reset;
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < N; i++) {
      char *text = warm_plan(w, g[i], 64u << 20, &st, &reset);
      assert_string_equal(text, cold[i]);
      assert_false(reset);
      if (round == 0) first[i] = st;
      else assert_ptr_equal(st, first[i]); /* the same interned ShapeTracker, an earlier graph's */
      /* once the state has seen a graph this size, a warm replay + schedule takes nothing from the heap: the
         buffer table too is the state's (a malloc there cost kexd's Plan 30-50 us of malloc_consolidate when
         the request's decode had just freed thousands of small chunks) */
      if (round > 0) assert_int_equal(warm_allocs, 0);
      free(text);
    }
  assert_int_equal(kex_sched_warm_replays(w), 3 * N);
  assert_int_equal(kex_sched_warm_resets(w), 0);
  /* the limit, both sides: the same graph again leaves the state the size it was */
  size_t held = kex_sched_warm_bytes(w);
  assert_true(held > 0);
  char *text = warm_plan(w, g[0], held, &st, &reset);
  assert_false(reset); /* held bytes: at the limit, kept */
  assert_int_equal(kex_sched_warm_bytes(w), held);
  free(text);
  text = warm_plan(w, g[0], held - 1, &st, &reset);
  assert_true(reset); /* one byte over: emptied */
  assert_int_equal(kex_sched_warm_bytes(w), 0);
  assert_int_equal(kex_sched_warm_resets(w), 1);
  free(text);
  /* after a reset it starts afresh: same schedule, new objects */
  text = warm_plan(w, g[0], 64u << 20, &st, &reset);
  assert_string_equal(text, cold[0]);
  assert_false(reset);
  free(text);
  kex_sched_warm_free(w);
  for (int i = 0; i < N; i++) {
    kex_graph_free(g[i]);
    free(cold[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lazycache),      cmocka_unit_test(test_split_reduce),
      cmocka_unit_test(test_softmax),        cmocka_unit_test(test_multioutput),
      cmocka_unit_test(test_chase),          cmocka_unit_test(test_pad_safety),
      cmocka_unit_test(test_buffer_view_rule), cmocka_unit_test(test_assign_must_be_contiguous),
      cmocka_unit_test(test_assign_ordering), cmocka_unit_test(test_memory_planner),
      cmocka_unit_test(test_const_folding),  cmocka_unit_test(test_print_stable),
      cmocka_unit_test(test_oom_everywhere), cmocka_unit_test(test_chain_100k),
      cmocka_unit_test(test_copy_rules),     cmocka_unit_test(test_kernel_depth_limit),
      cmocka_unit_test(test_kernel_ops_limit), cmocka_unit_test(test_const_reduce_wraps),
      cmocka_unit_test(test_replay_refuses_overflow), cmocka_unit_test(test_warm_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

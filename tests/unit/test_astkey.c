/*
 * test_astkey.c - the canonical AST key (codegen/astkey.c): SHA-256 against
 * the FIPS 180-4 vectors; equal ASTs from separate replays (separate arenas
 * and ShapeTracker contexts) key equal; one changed shape, stride, const bit,
 * dtype, MemBuffer idx or second output keys differently; shared and
 * unshared equal sub-DAGs key equal; a 100,000-node chain keys on a thread
 * with a 256 KiB stack; bad input is KEX_EINVAL naming what was wrong.
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
#include "codegen/astkey.h"
#include "planned.h"

/* ---- SHA-256 ---- */

static void expect_sha(const void *data, size_t len, const char *hex) {
  uint8_t d[32];
  char got[65];
  kex_sha256_bytes(data, len, d);
  kex_hex(d, 32, got);
  assert_string_equal(got, hex);
}

static void test_sha256_vectors(void **state) {
  (void)state;
  expect_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  expect_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  expect_sha(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                     "mnopqrstnopqrstu";
  expect_sha(m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  /* one million 'a', fed in uneven pieces: the streaming path equals the vector */
  char *a = kex_malloc(1000000);
  assert_non_null(a);
  memset(a, 'a', 1000000);
  kex_sha256 s;
  assert_int_equal(kex_sha256_init(&s), 0);
  for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 7 % 131 + 1)
    kex_sha256_update(&s, a + off, off + step > 1000000 ? 1000000 - off : step);
  uint8_t d[32];
  char hex[65];
  kex_sha256_final(&s, d);
  kex_hex(d, 32, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  kex_free(a);
  /* hex round trip and rejects */
  uint8_t back[32];
  assert_int_equal(kex_unhex(hex, back, 32), 0);
  assert_memory_equal(back, d, 32);
  hex[5] = 'g';
  assert_int_equal(kex_unhex(hex, back, 32), KEX_EPARSE);
  assert_int_equal(kex_unhex("abcd", back, 1), KEX_EPARSE); /* too long */
}

/* ---- ASTs from replayed graphs ---- */

/* Every graph here plans under the GPU rules; a failure fails the test. */
static void plan_json(planned *p, const char *json) {
  if (plan_text(p, json, false)) fail_msg("plan: %s", p->err.msg);
}

static kex_ast_digest item_key(const kex_sched_item *it) {
  kex_ast_digest k;
  kex_error err = {0};
  if (kex_ast_key(it->ast, it->nout, &k, &err)) fail_msg("key: %s", err.msg);
  return k;
}

static void test_two_replays_same_key(void **state) {
  (void)state;
  planned a, b, c;
  plan_json(&a, MATMUL(64, 32));
  plan_json(&b, MATMUL(64, 32));
  plan_json(&c, MATMUL(64, 64));
  const kex_sched_item *ia = nth_kernel(&a, 0), *ib = nth_kernel(&b, 0), *ic = nth_kernel(&c, 0);
  assert_ptr_not_equal(ia->ast[0], ib->ast[0]); /* different arenas: pointers cannot be what is keyed */
  kex_ast_digest ka = item_key(ia), kb = item_key(ib), kc = item_key(ic);
  assert_string_equal(ka.hex, kb.hex);
  assert_memory_equal(ka.bytes, kb.bytes, 32);
  assert_string_not_equal(ka.hex, kc.hex);

  char *text = NULL;
  size_t len = 0;
  kex_error err = {0};
  assert_int_equal(kex_ast_text(ia->ast, ia->nout, &text, &len, &err), 0);
  assert_int_equal(strlen(text), len);
  assert_int_equal(strncmp(text, "kex.ast.v1\noutputs 1\n", 21), 0);
  assert_non_null(strstr(text, "ReduceOps.SUM float32 axis=(2,) src=%"));
  assert_non_null(strstr(text, "BufferOps.LOAD float32 idx=1 st=ShapeTracker(views=(View(shape=(64, 64, 32)"));
  assert_non_null(strstr(text, "\nout %"));
  /* the key is the SHA-256 of exactly this text */
  uint8_t d[32];
  kex_sha256_bytes(text, len, d);
  assert_memory_equal(d, ka.bytes, 32);
  kex_free(text);
  planned_free(&a);
  planned_free(&b);
  planned_free(&c);
}

/* ---- hand-built ASTs ---- */

typedef struct builder {
  kex_arena arena;
  kex_shape_ctx *ctx;
} builder;

static void builder_init(builder *b) {
  kex_arena_init(&b->arena, 0);
  b->ctx = kex_shape_ctx_new(&b->arena);
  assert_non_null(b->ctx);
}

static void builder_done(builder *b) {
  kex_shape_ctx_free(b->ctx);
  kex_arena_destroy(&b->arena);
}

static kex_lop *node(builder *b, kex_op op, kex_dtype dt, int nsrc, const kex_lop *s0, const kex_lop *s1) {
  kex_lop *n = kex_arena_calloc(&b->arena, 1, sizeof *n);
  assert_non_null(n);
  n->op = op, n->dtype = dt, n->nsrc = (uint8_t)nsrc, n->src[0] = s0, n->src[1] = s1;
  return n;
}

static const kex_st *st_view(builder *b, int64_t d0, int64_t d1, int64_t s0, int64_t s1) {
  int64_t shape[2] = {d0, d1}, strides[2] = {s0, s1};
  const kex_view *v = kex_view_create(b->ctx, 2, shape, strides, 0, NULL);
  assert_non_null(v);
  const kex_st *st = kex_st_from_views(b->ctx, 1, &v);
  assert_non_null(st);
  return st;
}

static kex_lop *load(builder *b, int idx, kex_dtype dt, const kex_st *st) {
  kex_lop *n = node(b, KEX_OP_LOAD, dt, 0, NULL, NULL);
  n->idx = idx, n->st = st;
  return n;
}

static kex_lop *cnst(builder *b, kex_const v, const kex_st *st) {
  kex_lop *n = node(b, KEX_OP_BCONST, KEX_DT_FLOAT32, 0, NULL, NULL);
  n->val = v, n->st = st;
  return n;
}

static kex_lop *store(builder *b, int idx, const kex_st *st, const kex_lop *src) {
  kex_lop *n = node(b, KEX_OP_STORE, src->dtype, 1, src, NULL);
  n->idx = idx, n->st = st;
  return n;
}

/* What one variant of the base kernel changes. */
typedef struct variant {
  int64_t d1;          /* second dim (shape) */
  int64_t s0;          /* stride of dim 0 of input 1 */
  double c;            /* the constant */
  kex_dtype in_dtype;  /* dtype of input 2 (casted to float) */
  int idx2;            /* MemBuffer idx of input 2 */
  int second_op;       /* op of the second output */
  bool share;          /* reuse one node for the shared subexpression */
} variant;

static const variant base_variant = {8, 8, 0.0, KEX_DT_INT32, 2, KEX_OP_MUL, true};

/* out0 = (in1 + float(in2)) * c ; out1 = (in1 + float(in2)) <second_op> in1 */
static kex_ast_digest variant_key(const variant *v, char **text_out) {
  builder b;
  builder_init(&b);
  const kex_st *st = st_view(&b, 4, v->d1, v->d1, 1);
  const kex_st *st1 = st_view(&b, 4, v->d1, v->s0, 1);
  kex_lop *in1 = load(&b, 1, KEX_DT_FLOAT32, st1);
  kex_lop *in2 = load(&b, v->idx2, v->in_dtype, st);
  kex_lop *cast = node(&b, KEX_OP_CAST, KEX_DT_FLOAT32, 1, in2, NULL);
  cast->cast_to = KEX_DT_FLOAT32;
  kex_lop *sum = node(&b, KEX_OP_ADD, KEX_DT_FLOAT32, 2, in1, cast);
  kex_lop *sum2 = sum;
  if (!v->share) { /* a structurally equal copy at other addresses */
    kex_lop *in1b = load(&b, 1, KEX_DT_FLOAT32, st1);
    kex_lop *in2b = load(&b, v->idx2, v->in_dtype, st);
    kex_lop *castb = node(&b, KEX_OP_CAST, KEX_DT_FLOAT32, 1, in2b, NULL);
    castb->cast_to = KEX_DT_FLOAT32;
    sum2 = node(&b, KEX_OP_ADD, KEX_DT_FLOAT32, 2, in1b, castb);
  }
  kex_lop *mul = node(&b, KEX_OP_MUL, KEX_DT_FLOAT32, 2, sum, cnst(&b, kex_const_float(v->c), st));
  kex_lop *second = node(&b, (kex_op)v->second_op, KEX_DT_FLOAT32, 2, sum2, in1);
  const kex_lop *ast[2] = {store(&b, 0, st, mul), store(&b, 3, st, second)};
  kex_ast_digest k;
  kex_error err = {0};
  if (kex_ast_key(ast, 2, &k, &err)) fail_msg("key: %s", err.msg);
  if (text_out) {
    size_t len;
    assert_int_equal(kex_ast_text(ast, 2, text_out, &len, &err), 0);
  }
  builder_done(&b);
  return k;
}

static void expect_differs(const variant *v, const char *what) {
  kex_ast_digest a = variant_key(&base_variant, NULL), b = variant_key(v, NULL);
  if (!strcmp(a.hex, b.hex)) fail_msg("changing %s did not change the key", what);
}

static void test_one_change_changes_key(void **state) {
  (void)state;
  kex_ast_digest a = variant_key(&base_variant, NULL), again = variant_key(&base_variant, NULL);
  assert_string_equal(a.hex, again.hex);
  variant v;
  v = base_variant, v.d1 = 9, v.s0 = 9;
  expect_differs(&v, "one shape");
  v = base_variant, v.s0 = 16;
  expect_differs(&v, "one stride");
  v = base_variant, v.c = -0.0;
  expect_differs(&v, "the sign bit of a 0.0 const");
  v = base_variant, v.in_dtype = KEX_DT_INT64;
  expect_differs(&v, "one dtype");
  v = base_variant, v.idx2 = 4;
  expect_differs(&v, "one MemBuffer idx");
  v = base_variant, v.second_op = KEX_OP_SUB;
  expect_differs(&v, "the second output");
}

static void test_sharing_does_not_matter(void **state) {
  (void)state;
  variant v = base_variant;
  char *t1 = NULL, *t2 = NULL;
  kex_ast_digest shared = variant_key(&v, &t1);
  v.share = false;
  kex_ast_digest unshared = variant_key(&v, &t2);
  assert_string_equal(t1, t2);
  assert_string_equal(shared.hex, unshared.hex);
  /* the shared ADD is printed once and referenced by number from both users */
  assert_non_null(strstr(t1, "%3 BinaryOps.ADD float32 src=%0,%2\n"));
  assert_non_null(strstr(t1, "val=f:0x0000000000000000 st="));
  assert_non_null(strstr(t1, "\nout %6\nout %8\n"));
  kex_free(t1);
  kex_free(t2);
  /* the exact float bits travel: -0.0 is 0x8000... */
  v = base_variant, v.c = -0.0;
  variant_key(&v, &t1);
  assert_non_null(strstr(t1, "val=f:0x8000000000000000 st="));
  kex_free(t1);
}

/* ---- deep chains without recursion ---- */

#define CHAIN 100000

static void *chain_thread(void *arg) {
  kex_ast_digest *out = arg;
  builder b;
  kex_arena_init(&b.arena, 0);
  b.ctx = kex_shape_ctx_new(&b.arena);
  int64_t shape[1] = {16};
  const kex_st *st = kex_st_from_shape(b.ctx, 1, shape);
  kex_lop *n = kex_arena_calloc(&b.arena, 1, sizeof *n);
  n->op = KEX_OP_LOAD, n->dtype = KEX_DT_FLOAT32, n->idx = 1, n->st = st;
  for (int i = 0; i < CHAIN; i++) {
    kex_lop *m = kex_arena_calloc(&b.arena, 1, sizeof *m);
    m->op = i % 2 ? KEX_OP_NEG : KEX_OP_SQRT, m->dtype = KEX_DT_FLOAT32, m->nsrc = 1, m->src[0] = n;
    n = m;
  }
  kex_lop *s = kex_arena_calloc(&b.arena, 1, sizeof *s);
  s->op = KEX_OP_STORE, s->dtype = KEX_DT_FLOAT32, s->idx = 0, s->st = st, s->nsrc = 1, s->src[0] = n;
  const kex_lop *ast[1] = {s};
  kex_error err = {0};
  int rc = kex_ast_key(ast, 1, out, &err);
  kex_shape_ctx_free(b.ctx);
  kex_arena_destroy(&b.arena);
  return rc ? (void *)1 : NULL;
}

static void test_deep_chain_small_stack(void **state) {
  (void)state;
  pthread_attr_t attr;
  pthread_t th;
  kex_ast_digest k1, k2;
  void *ret = (void *)1;
  assert_int_equal(pthread_attr_init(&attr), 0);
  assert_int_equal(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
  assert_int_equal(pthread_create(&th, &attr, chain_thread, &k1), 0);
  assert_int_equal(pthread_join(th, &ret), 0);
  assert_null(ret);
  assert_int_equal(pthread_create(&th, &attr, chain_thread, &k2), 0);
  assert_int_equal(pthread_join(th, &ret), 0);
  assert_null(ret);
  pthread_attr_destroy(&attr);
  assert_string_equal(k1.hex, k2.hex);
}

/* ---- bad input ---- */

static void test_bad_input(void **state) {
  (void)state;
  builder b;
  builder_init(&b);
  int64_t shape[1] = {4};
  const kex_st *st = kex_st_from_shape(b.ctx, 1, shape);
  kex_error err = {0};
  kex_ast_digest k;
  char *text = (char *)1;
  assert_int_equal(kex_ast_key(NULL, 0, &k, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "at least one output"));
  kex_lop *s = store(&b, 0, st, load(&b, 1, KEX_DT_FLOAT32, st));
  s->src[0] = NULL;
  const kex_lop *ast[1] = {s};
  assert_int_equal(kex_ast_text(ast, 1, &text, NULL, &err), KEX_EINVAL);
  assert_null(text);
  assert_non_null(strstr(err.msg, "is NULL"));
  kex_lop *l = load(&b, 1, KEX_DT_FLOAT32, NULL); /* a LOAD without a ShapeTracker */
  s->src[0] = l;
  assert_int_equal(kex_ast_key(ast, 1, &k, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "has no ShapeTracker"));
  l->st = st;
  l->dtype = (kex_dtype)99;
  assert_int_equal(kex_ast_key(ast, 1, &k, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "dtype 99"));
  l->dtype = KEX_DT_FLOAT32;
  assert_int_equal(kex_ast_key(ast, 1, &k, &err), 0);
  /* out of memory at every allocation is KEX_ENOMEM, never a crash or a leak */
  for (unsigned long n = 1; n < 16; n++) {
    kex_alloc_fail_at(n, 0);
    int rc = kex_ast_text(ast, 1, &text, NULL, &err);
    kex_alloc_fail_at(0, 0);
    if (rc == 0) {
      kex_free(text);
      break;
    }
    assert_int_equal(rc, KEX_ENOMEM);
    assert_null(text);
  }
  builder_done(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_vectors),      cmocka_unit_test(test_two_replays_same_key),
      cmocka_unit_test(test_one_change_changes_key), cmocka_unit_test(test_sharing_does_not_matter),
      cmocka_unit_test(test_deep_chain_small_stack), cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

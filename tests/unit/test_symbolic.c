/*
 * test_symbolic.c - unit tests for sched/symbolic.c, tinygrad 0.9.0's
 * symbolic algebra (spec section 3).
 *
 * Every expected render and bound below was worked out by hand from the
 * rules of shape/symbolic.py (Node.sum grouping, the per-class //, %, *
 * methods, create_lt_node) and render(ctx="DEBUG"), with Python's floor
 * division; none comes from running the code under test.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "sched/symbolic.h"

typedef struct fixture {
  kex_arena arena;
  kex_sym_ctx ctx;
} fixture;

static int setup(void **state) {
  fixture *f = kex_calloc(1, sizeof *f);
  if (!f) return -1;
  kex_arena_init(&f->arena, 0);
  kex_sym_ctx_init(&f->ctx, &f->arena);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  kex_alloc_fail_at(0, 0);
  kex_arena_destroy(&f->arena);
  kex_free(f);
  return 0;
}

#define CTX (&((fixture *)*state)->ctx)
#define R(node) kex_sym_render(CTX, (node))

static void test_leaves(void **state) {
  const kex_sym *n = kex_sym_num(CTX, -3);
  assert_string_equal(R(n), "-3");
  assert_true(kex_sym_is_num(n));
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  assert_int_equal(a->kind, KEX_SYM_VAR);
  assert_string_equal(R(a), "a[0-7]");
  /* Variable with lo == hi is a NumNode */
  const kex_sym *c = kex_sym_var(CTX, "c", 4, 4);
  assert_int_equal(c->kind, KEX_SYM_NUM);
  assert_string_equal(R(c), "4");
  assert_false(kex_sym_truthy(kex_sym_num(CTX, 0)));
  assert_true(kex_sym_truthy(a));
}

static void test_sum_grouping(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  /* (a + 3) + a*2 -> flat [a, 3, a*2] -> a grouped with k=1+2 */
  const kex_sym *s = kex_sym_add(CTX, kex_sym_add_int(CTX, a, 3), kex_sym_mul_int(CTX, a, 2));
  assert_int_equal(s->kind, KEX_SYM_SUM);
  assert_string_equal(R(s), "((a[0-7]*3)+3)");
  assert_int_equal(s->min, 3);
  assert_int_equal(s->max, 24);
  /* a - a folds to 0 */
  const kex_sym *z = kex_sym_sub(CTX, a, a);
  assert_int_equal(z->kind, KEX_SYM_NUM);
  assert_int_equal(z->min, 0);
  /* zero terms are dropped, a single survivor is returned itself */
  const kex_sym *v[3] = {kex_sym_num(CTX, 0), a, kex_sym_num(CTX, 0)};
  assert_ptr_equal(kex_sym_sum(CTX, v, 3), a);
  /* terms render sorted as strings */
  const kex_sym *b = kex_sym_var(CTX, "b", 0, 3);
  assert_string_equal(R(kex_sym_add(CTX, b, a)), "(a[0-7]+b[0-3])");
  assert_true(kex_sym_eq(CTX, kex_sym_add(CTX, a, b), kex_sym_add(CTX, b, a)));
  assert_false(kex_sym_eq(CTX, a, kex_sym_var(CTX, "a", 0, 6)));
  assert_string_equal(R(kex_sym_add_int(CTX, a, -1)), "(-1+a[0-7])");
}

static void test_mul(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  assert_string_equal(R(kex_sym_mul_int(CTX, kex_sym_add_int(CTX, a, 3), 2)), "((a[0-7]*2)+6)");
  assert_string_equal(R(kex_sym_mul_int(CTX, kex_sym_mul_int(CTX, a, 2), 3)), "(a[0-7]*6)");
  assert_ptr_equal(kex_sym_mul_int(CTX, a, 1), a);
  assert_int_equal(kex_sym_mul_int(CTX, a, 0)->max, 0);
  const kex_sym *n = kex_sym_neg(CTX, a);
  assert_string_equal(R(n), "(a[0-7]*-1)");
  assert_int_equal(n->min, -7);
  assert_int_equal(n->max, 0);
}

static void test_div(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  assert_string_equal(R(kex_sym_div_int(CTX, kex_sym_mul_int(CTX, a, 4), 2)), "(a[0-7]*2)");
  const kex_sym *d = kex_sym_div_int(CTX, kex_sym_mul_int(CTX, a, 2), 4);
  assert_string_equal(R(d), "(a[0-7]//2)");
  assert_int_equal(d->max, 3);
  /* (a*4 + 3)//4: the 3 leaves a rest of 3//4 = 0 */
  assert_string_equal(R(kex_sym_div_int(CTX, kex_sym_add_int(CTX, kex_sym_mul_int(CTX, a, 4), 3), 4)), "a[0-7]");
  /* negative minimum: (a - 2)//2 = a//2 + (-2//2) */
  const kex_sym *neg = kex_sym_div_int(CTX, kex_sym_add_int(CTX, a, -2), 2);
  assert_string_equal(R(neg), "((a[0-7]//2)+-1)");
  assert_int_equal(neg->min, -1);
  assert_int_equal(neg->max, 2);
  /* two divs are one div */
  const kex_sym *w = kex_sym_var(CTX, "w", 0, 15);
  assert_string_equal(R(kex_sym_div_int(CTX, kex_sym_div_int(CTX, w, 2), 3)), "(w[0-15]//6)");
  /* gcd and divisor factoring: (a*6 + b*4)//8 */
  const kex_sym *x = kex_sym_var(CTX, "x", 0, 3), *y = kex_sym_var(CTX, "y", 0, 3);
  const kex_sym *s = kex_sym_add(CTX, kex_sym_mul_int(CTX, x, 6), kex_sym_mul_int(CTX, y, 4));
  const kex_sym *q = kex_sym_div_int(CTX, s, 8);
  assert_string_equal(R(q), "((((x[0-3]*3)//2)+y[0-3])//2)");
  assert_int_equal(q->min, 0);
  assert_int_equal(q->max, 3);
}

static void test_mod(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7), *b = kex_sym_var(CTX, "b", 0, 3);
  assert_string_equal(R(kex_sym_mod_int(CTX, kex_sym_add(CTX, kex_sym_mul_int(CTX, a, 4), b), 4)), "b[0-3]");
  const kex_sym *m = kex_sym_mod_int(CTX, a, 4);
  assert_string_equal(R(m), "(a[0-7]%4)");
  assert_int_equal(m->min, 0);
  assert_int_equal(m->max, 3);
  assert_ptr_equal(kex_sym_mod_int(CTX, a, 8), a);
  assert_string_equal(R(kex_sym_mod_int(CTX, kex_sym_add_int(CTX, a, 8), 8)), "a[0-7]");
  /* negative constant is reduced first: (a - 3) % 4 = (a + 1) % 4 */
  assert_string_equal(R(kex_sym_mod_int(CTX, kex_sym_add_int(CTX, a, -3), 4)), "((1+a[0-7])%4)");
  /* mod of mod with a dividing modulus */
  const kex_sym *w = kex_sym_var(CTX, "w", 0, 15);
  assert_string_equal(R(kex_sym_mod_int(CTX, kex_sym_mod_int(CTX, w, 8), 4)), "(w[0-15]%4)");
  /* same quotient for min and max: subtract */
  const kex_sym *u = kex_sym_var(CTX, "u", 5, 6);
  const kex_sym *um = kex_sym_mod_int(CTX, u, 4);
  assert_string_equal(R(um), "(-4+u[5-6])");
  assert_int_equal(um->min, 1);
  /* ModNode bounds: [2,5] % 4 wraps, so [0, 3] */
  const kex_sym *t = kex_sym_mod_int(CTX, kex_sym_var(CTX, "t", 2, 5), 4);
  assert_int_equal(t->kind, KEX_SYM_MOD);
  assert_int_equal(t->min, 0);
  assert_int_equal(t->max, 3);
  assert_int_equal(kex_sym_mod_int(CTX, a, 1)->max, 0);
}

static void test_lt(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  const kex_sym *t = kex_sym_lt_int(CTX, a, 8);
  assert_true(kex_sym_is_num(t));
  assert_int_equal(t->min, 1);
  assert_int_equal(kex_sym_lt_int(CTX, a, 0)->max, 0);
  const kex_sym *l = kex_sym_lt_int(CTX, a, 3);
  assert_string_equal(R(l), "(a[0-7]<3)");
  assert_int_equal(l->min, 0);
  assert_int_equal(l->max, 1);
  assert_string_equal(R(kex_sym_ge_int(CTX, a, 3)), "((a[0-7]*-1)<-2)");
  assert_string_equal(R(kex_sym_le_int(CTX, a, 3)), "(a[0-7]<4)");
  assert_string_equal(R(kex_sym_gt_int(CTX, a, 3)), "((a[0-7]*-1)<-3)");
}

static void test_create_lt(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7), *b = kex_sym_var(CTX, "b", 0, 3), *c = kex_sym_var(CTX, "c", 0, 4);
  const kex_sym *a4 = kex_sym_mul_int(CTX, a, 4);
  /* gcd rule: a*4 + b < 8 with b in [0, 4) -> a < 2 */
  assert_string_equal(R(kex_sym_create_lt(CTX, kex_sym_add(CTX, a4, b), 8)), "(a[0-7]<2)");
  /* constants move to the right first */
  assert_string_equal(R(kex_sym_create_lt(CTX, kex_sym_add_int(CTX, kex_sym_add(CTX, a4, b), 4), 12)), "(a[0-7]<2)");
  /* the others reach the gcd: no rewrite */
  assert_string_equal(R(kex_sym_create_lt(CTX, kex_sym_add(CTX, a4, c), 8)), "(((a[0-7]*4)+c[0-4])<8)");
  /* MulNode rule: a*3 < 7 -> a < ceil(7/3) */
  assert_string_equal(R(kex_sym_create_lt(CTX, kex_sym_mul_int(CTX, a, 3), 7)), "(a[0-7]<3)");
  assert_string_equal(R(kex_sym_create_lt(CTX, kex_sym_mul_int(CTX, a, -2), -3)), "((a[0-7]*-1)<-1)");
  /* create_ge(a, 3) = create_lt(-a, -2); k == -1 is kept */
  assert_string_equal(R(kex_sym_create_ge(CTX, a, 3)), "((a[0-7]*-1)<-2)");
  /* create_ge(a, 0) is always true */
  const kex_sym *g0 = kex_sym_create_ge(CTX, a, 0);
  assert_true(kex_sym_is_num(g0));
  assert_int_equal(g0->min, 1);
}

static void test_ands(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  const kex_sym *ge = kex_sym_create_ge(CTX, a, 3), *lt = kex_sym_create_lt(CTX, a, 6);
  assert_int_equal(kex_sym_ands(CTX, NULL, 0)->min, 1);
  const kex_sym *one[1] = {lt};
  assert_ptr_equal(kex_sym_ands(CTX, one, 1), lt);
  const kex_sym *with_zero[2] = {lt, kex_sym_num(CTX, 0)};
  const kex_sym *z = kex_sym_ands(CTX, with_zero, 2);
  assert_true(kex_sym_is_num(z));
  assert_int_equal(z->max, 0);
  const kex_sym *three[3] = {lt, kex_sym_num(CTX, 1), ge};
  const kex_sym *and = kex_sym_ands(CTX, three, 3);
  assert_int_equal(and->kind, KEX_SYM_AND);
  assert_int_equal(and->n, 2);
  assert_string_equal(R(and), "(((a[0-7]*-1)<-2) and (a[0-7]<6))");
  assert_true(kex_sym_has_var(and, "a"));
  assert_false(kex_sym_has_var(and, "b"));
}

static void test_oom_returns_null(void **state) {
  const kex_sym *a = kex_sym_var(CTX, "a", 0, 7);
  kex_arena fresh;
  kex_arena_init(&fresh, 0);
  kex_sym_ctx c2;
  kex_sym_ctx_init(&c2, &fresh);
  kex_alloc_fail_at(1, 1);
  assert_null(kex_sym_var(&c2, "b", 0, 3));
  assert_null(kex_sym_add_int(&c2, a, 1));
  assert_null(kex_sym_mul_int(&c2, NULL, 3));
  kex_alloc_fail_at(0, 0);
  assert_non_null(kex_sym_add_int(&c2, a, 1));
  kex_arena_destroy(&fresh);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_leaves), T(test_sum_grouping), T(test_mul), T(test_div), T(test_mod), T(test_lt), T(test_create_lt),
      T(test_ands), T(test_oom_returns_null),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

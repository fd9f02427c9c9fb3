/*
 * test_view.c - unit tests for sched/view.c and sched/shapetracker.c,
 * tinygrad 0.9.0's View and ShapeTracker (spec section 4).
 *
 * Each expected view was derived by hand from the rules of shape/view.py
 * and shape/shapetracker.py as written in the spec (View.create steps,
 * __unsafe_resize, _merge_dims, _reshape_mask, View.__add__ with un1d and
 * the mask projection), and many are cross-checked by reaching the same
 * view along two different paths, which interning makes a pointer compare.
 * Reprs are compared against tinygrad's exact text.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/errors.h"
#include "sched/shapetracker.h"

typedef struct fixture {
  kex_arena arena;
  kex_shape_ctx *ctx;
  char buf[1024];
} fixture;

static int setup(void **state) {
  fixture *f = kex_calloc(1, sizeof *f);
  if (!f) return -1;
  kex_arena_init(&f->arena, 0);
  f->ctx = kex_shape_ctx_new(&f->arena);
  if (!f->ctx) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  kex_alloc_fail_at(0, 0);
  kex_shape_ctx_free(f->ctx);
  kex_arena_destroy(&f->arena);
  kex_free(f);
  return 0;
}

#define F ((fixture *)*state)
#define CTX (F->ctx)
#define SH(...) ((const int64_t[]){__VA_ARGS__})

static const char *vrepr(void **state, const kex_view *v) {
  assert_non_null(v);
  int n = kex_view_repr(v, F->buf, sizeof F->buf);
  assert_true(n > 0 && (size_t)n < sizeof F->buf);
  return F->buf;
}

static const char *strepr(void **state, const kex_st *st) {
  assert_non_null(st);
  int n = kex_st_repr(st, F->buf, sizeof F->buf);
  assert_true(n > 0 && (size_t)n < sizeof F->buf);
  return F->buf;
}

static const kex_view *contig(void **state, int n, const int64_t *shape) {
  const kex_view *v = kex_view_create(CTX, n, shape, NULL, 0, NULL);
  assert_non_null(v);
  return v;
}

/* ---- View.create ---- */

static void test_create_canonical(void **state) {
  const kex_view *v = contig(state, 3, SH(4, 1, 3));
  assert_string_equal(vrepr(state, v), "View(shape=(4, 1, 3), strides=(3, 0, 1), offset=0, mask=None, contiguous=True)");
  /* stride of a size-1 dim is canonicalised to 0: same interned view */
  assert_ptr_equal(kex_view_create(CTX, 3, SH(4, 1, 3), SH(3, 7, 1), 0, NULL), v);
  /* a full mask is dropped */
  assert_ptr_equal(kex_view_create(CTX, 3, SH(4, 1, 3), NULL, 0, SH(0, 4, 0, 1, 0, 3)), v);
  assert_string_equal(vrepr(state, contig(state, 1, SH(16))),
                      "View(shape=(16,), strides=(1,), offset=0, mask=None, contiguous=True)");
  assert_string_equal(vrepr(state, contig(state, 0, NULL)),
                      "View(shape=(), strides=(), offset=0, mask=None, contiguous=True)");
  /* an offset or a non row-major stride is not contiguous */
  assert_false(kex_view_create(CTX, 1, SH(16), NULL, 2, NULL)->contiguous);
  assert_false(kex_view_create(CTX, 2, SH(4, 3), SH(1, 4), 0, NULL)->contiguous);
}

static void test_create_mask_elim(void **state) {
  /* dim 0 masked to one index: stride moves into the offset */
  const kex_view *v = kex_view_create(CTX, 2, SH(4, 3), SH(3, 1), 0, SH(1, 2, 0, 3));
  assert_string_equal(vrepr(state, v),
                      "View(shape=(4, 3), strides=(0, 1), offset=3, mask=((1, 2), (0, 3)), contiguous=False)");
  /* an empty dim makes the whole view empty */
  const kex_view *e = kex_view_create(CTX, 2, SH(4, 3), SH(3, 1), 5, SH(2, 2, 0, 3));
  assert_string_equal(vrepr(state, e),
                      "View(shape=(4, 3), strides=(0, 0), offset=0, mask=((0, 0), (0, 0)), contiguous=False)");
}

/* ---- movement ops ---- */

static void test_pad_shrink(void **state) {
  const kex_view *v = contig(state, 2, SH(2, 3));
  const kex_view *p = kex_view_pad(CTX, v, SH(1, 1, 0, 2));
  assert_string_equal(vrepr(state, p),
                      "View(shape=(4, 5), strides=(3, 1), offset=-3, mask=((1, 3), (0, 3)), contiguous=False)");
  assert_ptr_equal(kex_view_pad(CTX, v, SH(0, 0, 0, 0)), v);
  /* shrinking back to the valid region restores the contiguous view */
  assert_ptr_equal(kex_view_shrink(CTX, p, SH(1, 3, 0, 3)), v);
  /* shrink that keeps part of the padding: mask shifted into the window */
  const kex_view *s = kex_view_shrink(CTX, p, SH(0, 2, 1, 4));
  assert_string_equal(vrepr(state, s),
                      "View(shape=(2, 3), strides=(0, 1), offset=1, mask=((1, 2), (0, 2)), contiguous=False)");
}

static void test_expand_permute(void **state) {
  const kex_view *e = kex_view_expand(CTX, contig(state, 2, SH(1, 3)), SH(4, 3));
  assert_string_equal(vrepr(state, e), "View(shape=(4, 3), strides=(0, 1), offset=0, mask=None, contiguous=False)");
  /* masked expand: a (0,1) mask on the expanded dim becomes (0, new) */
  const kex_view *pm = kex_view_pad(CTX, contig(state, 2, SH(1, 3)), SH(0, 0, 1, 0));
  assert_string_equal(vrepr(state, pm),
                      "View(shape=(1, 4), strides=(0, 1), offset=-1, mask=((0, 1), (1, 4)), contiguous=False)");
  assert_string_equal(vrepr(state, kex_view_expand(CTX, pm, SH(5, 4))),
                      "View(shape=(5, 4), strides=(0, 1), offset=-1, mask=((0, 5), (1, 4)), contiguous=False)");
  const kex_view *p = kex_view_permute(CTX, contig(state, 3, SH(2, 3, 4)), (const int[]){2, 0, 1});
  assert_string_equal(vrepr(state, p), "View(shape=(4, 2, 3), strides=(1, 12, 4), offset=0, mask=None, contiguous=False)");
}

static void test_stride(void **state) {
  const kex_view *f = kex_view_stride(CTX, contig(state, 2, SH(4, 3)), SH(-1, 1));
  assert_string_equal(vrepr(state, f), "View(shape=(4, 3), strides=(-3, 1), offset=9, mask=None, contiguous=False)");
  const kex_view *padded = kex_view_pad(CTX, contig(state, 1, SH(4)), SH(1, 1));
  assert_string_equal(vrepr(state, padded),
                      "View(shape=(6,), strides=(1,), offset=-1, mask=((1, 5),), contiguous=False)");
  assert_string_equal(vrepr(state, kex_view_stride(CTX, padded, SH(-1))),
                      "View(shape=(6,), strides=(-1,), offset=4, mask=((1, 5),), contiguous=False)");
  assert_string_equal(vrepr(state, kex_view_stride(CTX, padded, SH(2))),
                      "View(shape=(3,), strides=(2,), offset=-1, mask=((1, 3),), contiguous=False)");
  /* flipping twice is the identity */
  assert_ptr_equal(kex_view_stride(CTX, f, SH(-1, 1)), contig(state, 2, SH(4, 3)));
}

/* ---- reshape ---- */

static void test_reshape_unmasked(void **state) {
  const kex_view *out = NULL;
  assert_int_equal(kex_view_reshape(CTX, contig(state, 3, SH(2, 3, 4)), 2, SH(6, 4), &out), 0);
  assert_ptr_equal(out, contig(state, 2, SH(6, 4)));
  const kex_view *t = kex_view_permute(CTX, contig(state, 2, SH(4, 6)), (const int[]){1, 0});
  /* split the merged (6, stride 1) dim */
  assert_int_equal(kex_view_reshape(CTX, t, 3, SH(2, 3, 4), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 3, 4), strides=(3, 1, 6), offset=0, mask=None, contiguous=False)");
  /* merging a transposed pair cannot be one view */
  out = NULL;
  assert_int_equal(kex_view_reshape(CTX, t, 1, SH(24), &out), 1);
  assert_null(out);
  /* broadcast dims split with stride 0 */
  const kex_view *e = kex_view_expand(CTX, contig(state, 2, SH(1, 4)), SH(6, 4));
  assert_int_equal(kex_view_reshape(CTX, e, 3, SH(2, 3, 4), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 3, 4), strides=(0, 0, 1), offset=0, mask=None, contiguous=False)");
}

static void test_reshape_masked(void **state) {
  const kex_view *out = NULL;
  const kex_view *p = kex_view_pad(CTX, contig(state, 2, SH(2, 3)), SH(1, 1, 0, 0));
  assert_string_equal(vrepr(state, p),
                      "View(shape=(4, 3), strides=(3, 1), offset=-3, mask=((1, 3), (0, 3)), contiguous=False)");
  /* _reshape_mask merges the (0,3) inner mask with the (1,3) outer one */
  assert_int_equal(kex_view_reshape(CTX, p, 1, SH(12), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(12,), strides=(1,), offset=-3, mask=((3, 9),), contiguous=False)");
  /* and splits it back */
  const kex_view *back = NULL;
  assert_int_equal(kex_view_reshape(CTX, out, 2, SH(4, 3), &back), 0);
  assert_ptr_equal(back, p);
  /* a mask that a split cuts across is not reshapeable: (1,5) over 6 -> (2,3) */
  const kex_view *p1 = kex_view_pad(CTX, contig(state, 1, SH(4)), SH(1, 1));
  assert_int_equal(kex_view_reshape(CTX, p1, 2, SH(2, 3), &out), 1);
  /* the split fits the mask edges but not the old dim (6 % 4): None */
  const kex_view *row = kex_view_create(CTX, 2, SH(2, 6), NULL, 0, SH(1, 2, 0, 4));
  assert_string_equal(vrepr(state, row),
                      "View(shape=(2, 6), strides=(0, 1), offset=6, mask=((1, 2), (0, 4)), contiguous=False)");
  assert_int_equal(kex_view_reshape(CTX, row, 2, SH(3, 4), &out), 1);
  /* an empty mask stays empty */
  const kex_view *e = kex_view_create(CTX, 2, SH(2, 3), NULL, 0, SH(0, 0, 0, 3));
  assert_int_equal(kex_view_reshape(CTX, e, 1, SH(6), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(6,), strides=(0,), offset=0, mask=((0, 0),), contiguous=False)");
  /* reshape to () of a view with an empty mask dim is None */
  const kex_view *e1 = kex_view_create(CTX, 1, SH(1), NULL, 0, SH(0, 0));
  assert_int_equal(kex_view_reshape(CTX, e1, 0, NULL, &out), 1);
}

static void test_minify(void **state) {
  const kex_view *v = kex_view_create(CTX, 3, SH(2, 3, 4), SH(24, 8, 2), 0, NULL);
  /* _merge_dims: 24 == 3*8 and 8 == 4*2, one dim of 24 with stride 2 */
  assert_string_equal(vrepr(state, kex_view_minify(CTX, v)),
                      "View(shape=(24,), strides=(2,), offset=0, mask=None, contiguous=False)");
  const kex_view *t = kex_view_permute(CTX, contig(state, 2, SH(4, 6)), (const int[]){1, 0});
  assert_ptr_equal(kex_view_minify(CTX, t), t);
}

/* ---- View.__add__ ---- */

static void test_add_trivial(void **state) {
  const kex_view *out = NULL;
  const kex_view *t = kex_view_permute(CTX, contig(state, 2, SH(4, 6)), (const int[]){1, 0});
  const kex_view *c = contig(state, 2, SH(6, 4));
  assert_int_equal(kex_view_add(CTX, contig(state, 1, SH(24)), t, &out), 0);
  assert_ptr_equal(out, t);
  assert_int_equal(kex_view_add(CTX, t, c, &out), 0);
  assert_ptr_equal(out, t);
  /* contiguous vm1 of the same size: vm2 reshaped */
  assert_int_equal(kex_view_add(CTX, t, contig(state, 3, SH(2, 3, 4)), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 3, 4), strides=(3, 1, 6), offset=0, mask=None, contiguous=False)");
}

static void test_add_projection(void **state) {
  const kex_view *out = NULL;
  const kex_view *t = kex_view_permute(CTX, contig(state, 2, SH(4, 6)), (const int[]){1, 0});
  const kex_view *vm1 = kex_view_shrink(CTX, contig(state, 2, SH(6, 4)), SH(1, 3, 0, 4));
  assert_string_equal(vrepr(state, vm1), "View(shape=(2, 4), strides=(4, 1), offset=4, mask=None, contiguous=False)");
  assert_int_equal(kex_view_add(CTX, t, vm1, &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 4), strides=(1, 6), offset=1, mask=None, contiguous=False)");
  /* masked vm1: shrink to the mask, merge, pad back */
  const kex_view *pm = kex_view_pad(CTX, contig(state, 2, SH(4, 4)), SH(1, 1, 0, 0));
  assert_int_equal(kex_view_add(CTX, t, pm, &out), 0);
  assert_string_equal(vrepr(state, out),
                      "View(shape=(6, 4), strides=(1, 6), offset=-1, mask=((1, 5), (0, 4)), contiguous=False)");
  /* strided vm1 needs vm2 merged to (24,), which the transpose cannot do: None */
  const kex_view *s2 = kex_view_stride(CTX, contig(state, 1, SH(24)), SH(2));
  assert_int_equal(kex_view_add(CTX, t, s2, &out), 1);
  /* idx0 in [0,4] is not provably below 4: vm2 must merge to (24,), None */
  assert_int_equal(kex_view_add(CTX, t, contig(state, 1, SH(5)), &out), 1);
  /* memoised: asking again gives the same answers */
  assert_int_equal(kex_view_add(CTX, t, s2, &out), 1);
  assert_int_equal(kex_view_add(CTX, t, vm1, &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 4), strides=(1, 6), offset=1, mask=None, contiguous=False)");
}

static void test_add_masked_vm2(void **state) {
  const kex_view *out = NULL;
  const kex_view *padded = kex_view_pad(CTX, contig(state, 1, SH(4)), SH(1, 1));
  /* reading only the valid window of a padded view gives back the contiguous one */
  const kex_view *inner = kex_view_shrink(CTX, contig(state, 1, SH(6)), SH(1, 5));
  assert_int_equal(kex_view_add(CTX, padded, inner, &out), 0);
  assert_ptr_equal(out, contig(state, 1, SH(4)));
  /* a flip over a padded view: vm2's mask is projected onto vm1 as (1,5) */
  const kex_view *flip = kex_view_stride(CTX, contig(state, 1, SH(6)), SH(-1));
  assert_int_equal(kex_view_add(CTX, padded, flip, &out), 0);
  assert_ptr_equal(out, kex_view_stride(CTX, padded, SH(-1)));
  assert_string_equal(vrepr(state, out), "View(shape=(6,), strides=(-1,), offset=4, mask=((1, 5),), contiguous=False)");
  /* every other element of a padded view: mask bound ceil(1/2) = 1 on vm1 */
  const kex_view *every2 = kex_view_stride(CTX, contig(state, 1, SH(6)), SH(2));
  assert_int_equal(kex_view_add(CTX, padded, every2, &out), 0);
  assert_ptr_equal(out, kex_view_stride(CTX, padded, SH(2)));
  assert_string_equal(vrepr(state, out), "View(shape=(3,), strides=(2,), offset=-1, mask=((1, 3),), contiguous=False)");
  /* t.max == e violates vm2's mask: vm1 gets masked to (0,4) */
  const kex_view *tail = kex_view_shrink(CTX, contig(state, 1, SH(6)), SH(1, 6));
  assert_int_equal(kex_view_add(CTX, padded, tail, &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(5,), strides=(1,), offset=0, mask=((0, 4),), contiguous=False)");
  /* an empty vm1 mask short-circuits to the all-invalid view */
  const kex_view *empty = kex_view_create(CTX, 1, SH(6), NULL, 1, SH(3, 3));
  assert_int_equal(kex_view_add(CTX, padded, empty, &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(6,), strides=(0,), offset=0, mask=((0, 0),), contiguous=False)");
}

static void test_invert(void **state) {
  const kex_view *out = NULL;
  const kex_view *t = kex_view_permute(CTX, contig(state, 2, SH(2, 3)), (const int[]){1, 0});
  assert_int_equal(kex_view_invert(CTX, t, 2, SH(2, 3), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 3), strides=(1, 2), offset=0, mask=None, contiguous=False)");
  assert_int_equal(kex_view_invert(CTX, t, 1, SH(7), &out), 1);
  /* a flip inverts to a flip */
  const kex_view *f = kex_view_stride(CTX, contig(state, 1, SH(5)), SH(-1));
  assert_int_equal(kex_view_invert(CTX, f, 1, SH(5), &out), 0);
  assert_ptr_equal(out, f);
}

/* ---- ShapeTracker ---- */

static void test_st_basics(void **state) {
  const kex_st *st = kex_st_from_shape(CTX, 1, SH(16));
  assert_string_equal(strepr(state, st),
                      "ShapeTracker(views=(View(shape=(16,), strides=(1,), offset=0, mask=None, contiguous=True),))");
  assert_ptr_equal(kex_st_from_shape(CTX, 1, SH(16)), st);
  assert_true(kex_st_contiguous(st));
  assert_int_equal(kex_st_size(st), 16);
  /* contiguous reshape stays one view */
  const kex_st *r = kex_st_reshape(CTX, st, 2, SH(4, 4));
  assert_int_equal(r->nviews, 1);
  assert_ptr_equal(r, kex_st_from_shape(CTX, 2, SH(4, 4)));
  /* shrink: consecutive but not contiguous */
  const kex_st *s = kex_st_shrink(CTX, st, SH(1, 3));
  assert_false(kex_st_contiguous(s));
  assert_true(kex_st_consecutive(s));
  assert_false(kex_st_consecutive(kex_st_stride(CTX, st, SH(2))));
  /* a reshape that cannot merge appends a view */
  const kex_st *t = kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(4, 6)), (const int[]){1, 0});
  const kex_st *t2 = kex_st_reshape(CTX, t, 1, SH(24));
  assert_int_equal(t2->nviews, 2);
  assert_string_equal(strepr(state, t2),
                      "ShapeTracker(views=(View(shape=(6, 4), strides=(1, 6), offset=0, mask=None, contiguous=False), "
                      "View(shape=(24,), strides=(1,), offset=0, mask=None, contiguous=True)))");
  /* repr reports the needed length even when truncated */
  char small[8];
  assert_int_equal(kex_st_repr(t2, small, sizeof small), (int)strlen(F->buf));
  assert_int_equal(strlen(small), 7);
  /* every cut is a NUL-terminated prefix of the whole, as snprintf's (the reprs append without printf) */
  size_t full = strlen(F->buf);
  char cut[256];
  assert_true(full < sizeof cut);
  for (size_t len = 1; len <= full + 1; len++) {
    memset(cut, 'x', sizeof cut);
    assert_int_equal(kex_st_repr(t2, cut, len), (int)full);
    assert_int_equal(strlen(cut), len - 1);
    assert_memory_equal(cut, F->buf, len - 1);
    assert_int_equal(cut[len], 'x'); /* nothing written past len */
  }
  assert_int_equal(kex_st_repr(t2, NULL, 0), (int)full);
}

static void test_st_add_simplify(void **state) {
  const kex_st *a = kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(2, 3)), (const int[]){1, 0});
  /* st + contiguous of the same shape is st */
  assert_ptr_equal(kex_st_add(CTX, a, kex_st_from_shape(CTX, 2, SH(3, 2))), a);
  /* two views that merge: padded then flipped */
  const kex_view *padded = kex_view_pad(CTX, contig(state, 1, SH(4)), SH(1, 1));
  const kex_view *flip = kex_view_stride(CTX, contig(state, 1, SH(6)), SH(-1));
  const kex_view *vs[2] = {padded, flip};
  const kex_st *two = kex_st_from_views(CTX, 2, vs);
  const kex_st *s = kex_st_simplify(CTX, two);
  assert_int_equal(s->nviews, 1);
  assert_ptr_equal(s->views[0], kex_view_stride(CTX, padded, SH(-1)));
  assert_ptr_equal(kex_st_simplify(CTX, two), s);
  /* the same through st + st */
  const kex_st *pst = kex_st_from_views(CTX, 1, &padded), *fst = kex_st_from_views(CTX, 1, &flip);
  assert_ptr_equal(kex_st_add(CTX, pst, fst), s);
  /* views that cannot merge stay two */
  const kex_st *t = kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(4, 6)), (const int[]){1, 0});
  const kex_st *s2 = kex_st_stride(CTX, kex_st_from_shape(CTX, 1, SH(24)), SH(2));
  const kex_st *ts = kex_st_add(CTX, kex_st_reshape(CTX, t, 1, SH(24)), s2);
  assert_int_equal(ts->nviews, 2);
  assert_ptr_equal(ts->views[1], s2->views[0]);
}

static void test_st_invert(void **state) {
  const kex_st *a = kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(2, 3)), (const int[]){1, 0});
  const kex_st *inv = NULL;
  assert_int_equal(kex_st_invert(CTX, a, 2, SH(2, 3), &inv), 0);
  assert_string_equal(strepr(state, inv),
                      "ShapeTracker(views=(View(shape=(2, 3), strides=(1, 2), offset=0, mask=None, contiguous=False),))");
  assert_int_equal(kex_st_invert(CTX, a, 1, SH(5), &inv), 1);
}

static void test_st_expr_and_strides(void **state) {
  kex_sym_ctx *sc = kex_shape_sym(CTX);
  const kex_sym *idx, *valid;
  int64_t st[KEX_MAX_DIMS];
  bool known[KEX_MAX_DIMS];
  /* two views: the index is rebuilt from the flat index with // and % */
  const kex_st *t = kex_st_reshape(CTX, kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(4, 6)), (const int[]){1, 0}), 1,
                                   SH(24));
  assert_int_equal(kex_st_expr_idxs(CTX, t, NULL, &idx, &valid), 0);
  assert_string_equal(kex_sym_render(sc, idx), "(((idx0[0-23]%4)*6)+(idx0[0-23]//4))");
  assert_int_equal(valid->min, 1);
  assert_int_equal(kex_st_real_strides(CTX, t, false, st, known), 0);
  assert_false(known[0]);
  assert_int_equal(kex_st_real_size(CTX, t), 24);
  /* padded: stride known only when ignoring validity */
  const kex_st *p = kex_st_pad(CTX, kex_st_from_shape(CTX, 1, SH(4)), SH(1, 1));
  assert_int_equal(kex_st_expr_idxs(CTX, p, NULL, &idx, &valid), 0);
  assert_string_equal(kex_sym_render(sc, idx), "(-1+idx0[0-5])");
  assert_string_equal(kex_sym_render(sc, valid), "(((idx0[0-5]*-1)<0) and (idx0[0-5]<5))");
  assert_int_equal(kex_st_real_strides(CTX, p, false, st, known), 0);
  assert_false(known[0]);
  assert_int_equal(kex_st_real_strides(CTX, p, true, st, known), 0);
  assert_true(known[0]);
  assert_int_equal(st[0], 1);
  assert_int_equal(kex_st_unit_stride_axes(CTX, p), 0);
  assert_int_equal(kex_st_real_size(CTX, p), 5);
  /* unmasked single view: strides as stored, unit axes from them */
  const kex_st *q = kex_st_permute(CTX, kex_st_from_shape(CTX, 2, SH(3, 5)), (const int[]){1, 0});
  assert_int_equal(kex_st_unit_stride_axes(CTX, q), 1);
  /* expanded axis of a masked view reads as stride 0 */
  const kex_st *em = kex_st_pad(CTX, kex_st_expand(CTX, kex_st_from_shape(CTX, 2, SH(1, 3)), SH(4, 3)), SH(0, 0, 1, 0));
  assert_int_equal(kex_st_real_strides(CTX, em, false, st, known), 0);
  assert_true(known[0]);
  assert_int_equal(st[0], 0);
  assert_false(known[1]);
  /* axis_is_masked: only the padded axis appears in valid */
  assert_int_equal(kex_st_axis_is_masked(CTX, em, 0), 0);
  assert_int_equal(kex_st_axis_is_masked(CTX, em, 1), 1);
  /* a size-0 shape has real size 0 */
  assert_int_equal(kex_st_real_size(CTX, kex_st_from_shape(CTX, 2, SH(0, 3))), 0);
}

/* ---- int64 overflow and tinygrad's asserts: refused with a reason, never UB ---- */

#define I64MAX INT64_MAX
#define I64MIN INT64_MIN
#define P62 ((int64_t)1 << 62)
#define P32 ((int64_t)1 << 32)

/* The last failure on CTX was `code` and its message holds `needle`; the record is then clear. */
static void expect_error(void **state, int code, const char *needle) {
  const char *msg = NULL;
  int rc = kex_shape_error(CTX, &msg);
  if (rc != code || (code && (!msg || !strstr(msg, needle))))
    fail_msg("got %d \"%s\", want %d with \"%s\"", rc, msg ? msg : "", code, needle ? needle : "");
  assert_int_equal(kex_shape_error(CTX, NULL), 0);
}

/* prod(shape) and strides_for_shape: 0 in a shape makes the size 0 whatever the other dims. */
static void test_overflow_create(void **state) {
  const kex_view *v = kex_view_create(CTX, 3, SH(P32, P32, 0), NULL, 0, NULL);
  assert_non_null(v);
  assert_int_equal(kex_view_size(v), 0);
  assert_string_equal(vrepr(state, v),
                      "View(shape=(4294967296, 4294967296, 0), strides=(0, 0, 1), offset=0, mask=None, contiguous=True)");
  v = kex_view_create(CTX, 3, SH(0, P62 - 1, 2), NULL, 0, NULL); /* strides (2**63-2, 2, 1): the largest that fits */
  assert_non_null(v);
  assert_true(v->strides[0] == I64MAX - 1);
  expect_error(state, 0, NULL);
  /* tinygrad's strides would be (2**124, 2**62, 1) */
  assert_null(kex_view_create(CTX, 3, SH(0, P62, P62), NULL, 0, NULL));
  expect_error(state, KEX_ELIMIT, "(0, 4611686018427387904, 4611686018427387904): a shape, stride, offset or mask overflows int64");
  assert_null(kex_view_create(CTX, 3, SH(0, P62, 2), NULL, 0, NULL)); /* stride 2**63 */
  expect_error(state, KEX_ELIMIT, "overflows int64");
  /* a non-zero size past int64 */
  assert_null(kex_view_create(CTX, 2, SH(P32, P32), NULL, 0, NULL));
  expect_error(state, KEX_ELIMIT, "View.size");
  assert_non_null(kex_view_create(CTX, 2, SH(P32, P32 / 2 - 1), NULL, 0, NULL)); /* 2**63 - 2**32 */
  /* a negative dim is tinygrad's assert */
  assert_null(kex_view_create(CTX, 2, SH(4, -1), NULL, 0, NULL));
  expect_error(state, KEX_EINVAL, "negative dim");
  /* offset + stride * mask begin past int64 while eliminating a 1-wide mask */
  assert_null(kex_view_create(CTX, 2, SH(4, 4), SH(I64MAX / 2, 1), 0, SH(3, 4, 0, 4)));
  expect_error(state, KEX_ELIMIT, "View.create (mask)");
  v = kex_view_create(CTX, 2, SH(4, 4), SH(I64MAX / 3, 1), 0, SH(2, 3, 0, 4));
  assert_non_null(v);
  assert_true(v->offset == I64MAX / 3 * 2);
}

/* RESHAPE [0] -> [0, 2**62, 2**62], and the sizes tinygrad asserts on. */
static void test_overflow_reshape(void **state) {
  const kex_view *out = NULL;
  assert_int_equal(kex_view_reshape(CTX, contig(state, 1, SH(0)), 3, SH(0, P62, P62), &out), KEX_ELIMIT);
  expect_error(state, KEX_ELIMIT, "overflows int64");
  assert_int_equal(kex_view_reshape(CTX, contig(state, 1, SH(0)), 3, SH(0, 4, 4), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(0, 4, 4), strides=(16, 4, 1), offset=0, mask=None, contiguous=True)");
  /* size changes: 0-size to non-zero, and 12 to 16 */
  assert_int_equal(kex_view_reshape(CTX, contig(state, 1, SH(0)), 2, SH(4, 4), &out), KEX_EINVAL);
  expect_error(state, KEX_EINVAL, "cannot reshape (0,) to (4, 4)");
  assert_int_equal(kex_view_reshape(CTX, contig(state, 2, SH(3, 4)), 2, SH(4, 4), &out), KEX_EINVAL);
  expect_error(state, KEX_EINVAL, "size mismatch");
  const kex_view *masked = kex_view_pad(CTX, contig(state, 1, SH(4)), SH(2, 2));
  assert_int_equal(kex_view_reshape(CTX, masked, 2, SH(3, 3), &out), KEX_EINVAL);
  expect_error(state, KEX_EINVAL, "size mismatch");
  assert_int_equal(kex_view_reshape(CTX, masked, 2, SH(4, 2), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(4, 2), strides=(2, 1), offset=-2, mask=((1, 3), (0, 2)), contiguous=False)");
  /* a strided view whose merged stride * new dim passes int64 */
  const kex_view *wide = kex_view_create(CTX, 2, SH(2, 4), SH(I64MAX / 2, 2), 0, NULL);
  assert_non_null(wide);
  assert_int_equal(kex_view_reshape(CTX, wide, 3, SH(2, 2, 2), &out), 0);
  assert_string_equal(vrepr(state, out), "View(shape=(2, 2, 2), strides=(4611686018427387903, 4, 2), offset=0, mask=None, "
                                         "contiguous=False)");
  expect_error(state, 0, NULL);
}

/* STRIDE by INT64_MIN and other huge multipliers. */
static void test_overflow_stride(void **state) {
  const kex_view *v = contig(state, 1, SH(4));
  assert_null(kex_view_stride(CTX, v, SH(I64MIN)));
  expect_error(state, KEX_ELIMIT, "stride -9223372036854775808 of dim 0 (shape (4,)) is out of the int64 range");
  assert_null(kex_view_stride(CTX, v, SH(0)));
  expect_error(state, KEX_EINVAL, "is 0");
  /* |mul| >= the dim: one element, the stride is canonicalised to 0 without forming stride * mul */
  assert_string_equal(vrepr(state, kex_view_stride(CTX, v, SH(I64MAX))),
                      "View(shape=(1,), strides=(0,), offset=0, mask=None, contiguous=True)");
  assert_string_equal(vrepr(state, kex_view_stride(CTX, v, SH(-I64MAX))),
                      "View(shape=(1,), strides=(0,), offset=3, mask=None, contiguous=False)");
  assert_string_equal(vrepr(state, kex_view_stride(CTX, contig(state, 2, SH(3, 5)), SH(P62, 2))),
                      "View(shape=(1, 3), strides=(0, 2), offset=0, mask=None, contiguous=False)");
  /* the same through a mask */
  const kex_view *padded = kex_view_pad(CTX, v, SH(1, 1));
  assert_string_equal(vrepr(state, kex_view_stride(CTX, padded, SH(I64MAX))),
                      "View(shape=(1,), strides=(0,), offset=0, mask=((0, 0),), contiguous=False)");
  /* stride * mul past int64 on a dim that stays > 1 */
  const kex_view *big = kex_view_create(CTX, 1, SH(8), SH(I64MAX / 2), 0, NULL);
  assert_non_null(big);
  assert_non_null(kex_view_stride(CTX, big, SH(2)));
  assert_null(kex_view_stride(CTX, big, SH(3)));
  expect_error(state, KEX_ELIMIT, "View.stride on a view of shape (8,)");
  /* the ShapeTracker passes the refusal through */
  assert_null(kex_st_stride(CTX, kex_st_from_shape(CTX, 1, SH(4)), SH(I64MIN)));
  expect_error(state, KEX_ELIMIT, "out of the int64 range");
}

/* PAD near INT64_MAX, negative pads, shrinks out of range, permutations. */
static void test_overflow_pad_shrink(void **state) {
  const kex_view *v = contig(state, 1, SH(4));
  assert_null(kex_view_pad(CTX, v, SH(0, I64MAX)));
  expect_error(state, KEX_ELIMIT, "View.pad");
  assert_null(kex_view_pad(CTX, v, SH(I64MAX - 3, 0)));
  expect_error(state, KEX_ELIMIT, "View.pad");
  assert_non_null(kex_view_pad(CTX, v, SH(I64MAX - 4, 0))); /* shape 2**63-1 exactly */
  assert_null(kex_view_pad(CTX, v, SH(-1, 0)));
  expect_error(state, KEX_EINVAL, "negative");
  /* offset - stride * pad past int64 */
  const kex_view *big = kex_view_create(CTX, 1, SH(2), SH(I64MAX / 2), 0, NULL);
  assert_non_null(kex_view_pad(CTX, big, SH(2, 0)));
  assert_null(kex_view_pad(CTX, big, SH(3, 0)));
  expect_error(state, KEX_ELIMIT, "View.pad");
  /* shrink */
  assert_non_null(kex_view_shrink(CTX, v, SH(0, 4)));
  assert_null(kex_view_shrink(CTX, v, SH(0, 5)));
  expect_error(state, KEX_EINVAL, "out of range");
  assert_null(kex_view_shrink(CTX, v, SH(3, 2)));
  expect_error(state, KEX_EINVAL, "out of range");
  assert_null(kex_view_shrink(CTX, v, SH(I64MIN, 4)));
  expect_error(state, KEX_EINVAL, "out of range");
  /* permute */
  const kex_view *m = contig(state, 2, SH(2, 3));
  assert_null(kex_view_permute(CTX, m, (const int[]){1, 1}));
  expect_error(state, KEX_EINVAL, "not a permutation");
  assert_null(kex_view_permute(CTX, m, (const int[]){0, 2}));
  expect_error(state, KEX_EINVAL, "not a permutation");
  assert_non_null(kex_view_permute(CTX, m, (const int[]){1, 0}));
  expect_error(state, 0, NULL);
}

/* View.__add__ and invert with products past int64 answer an error, not a wrapped view. */
static void test_overflow_add_invert(void **state) {
  const kex_view *out = NULL;
  /* vm1 steps one in both dims of vm2 (shape (2, 2**31)): merged stride = vm2's two strides summed */
  const kex_view *vm1 = kex_view_create(CTX, 1, SH(2), SH(((int64_t)1 << 31) + 1), 0, NULL);
  const kex_view *vm2 = kex_view_create(CTX, 2, SH(2, (int64_t)1 << 31), SH(I64MAX - 1, 1), 0, NULL);
  assert_int_equal(kex_view_add(CTX, vm2, vm1, &out), 0);
  assert_true(out->strides[0] == I64MAX);
  vm2 = kex_view_create(CTX, 2, SH(2, (int64_t)1 << 31), SH(I64MAX, 1), 0, NULL);
  assert_int_equal(kex_view_add(CTX, vm2, vm1, &out), KEX_ELIMIT);
  expect_error(state, KEX_ELIMIT, "View.__add__ on a view of shape (2, 2147483648)");
  /* a stride that would overflow but is never used (tinygrad's None: the merge fails first) is no error */
  vm1 = kex_view_create(CTX, 1, SH(2), SH((int64_t)1 << 33), 0, NULL);
  assert_int_equal(kex_view_add(CTX, vm2, vm1, &out), 1);
  expect_error(state, 0, NULL);
  /* invert: prod(out_shape) with a 0 is 0, not an overflow */
  const kex_view *inv;
  assert_int_equal(kex_view_invert(CTX, contig(state, 1, SH(4)), 3, SH(P62, P62, 0), &inv), 1);
  expect_error(state, 0, NULL);
  assert_int_equal(kex_view_invert(CTX, contig(state, 1, SH(4)), 2, SH(P62, P62), &inv), KEX_ELIMIT);
  expect_error(state, KEX_ELIMIT, "View.invert");
}

static void test_oom(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 64); /* tiny blocks: most allocations reach kex_malloc */
  kex_shape_ctx *c = kex_shape_ctx_new(&a);
  assert_non_null(c);
  kex_alloc_fail_at(1, 1);
  assert_null(kex_view_create(c, 1, SH(4), NULL, 0, NULL));
  assert_null(kex_st_from_shape(c, 1, SH(4)));
  kex_alloc_fail_at(0, 0);
  const kex_st *st = kex_st_from_shape(c, 1, SH(4));
  assert_non_null(st);
  const kex_view *out;
  kex_alloc_fail_at(1, 1);
  assert_int_equal(kex_view_reshape(c, st->views[0], 2, SH(2, 2), &out), KEX_ENOMEM);
  assert_null(kex_st_pad(c, st, SH(1, 1)));
  kex_alloc_fail_at(0, 0);
  assert_int_equal(kex_shape_error(c, NULL), 0); /* out of memory is not a refusal */
  assert_int_equal(kex_view_reshape(c, st->views[0], 2, SH(2, 2), &out), 0);
  assert_int_equal(out->ndim, 2);
  kex_shape_ctx_free(c);
  kex_arena_destroy(&a);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_create_canonical), T(test_create_mask_elim), T(test_pad_shrink), T(test_expand_permute), T(test_stride),
      T(test_reshape_unmasked), T(test_reshape_masked), T(test_minify), T(test_add_trivial), T(test_add_projection),
      T(test_add_masked_vm2), T(test_invert), T(test_st_basics), T(test_st_add_simplify), T(test_st_invert),
      T(test_st_expr_and_strides), T(test_overflow_create), T(test_overflow_reshape), T(test_overflow_stride),
      T(test_overflow_pad_shrink), T(test_overflow_add_invert), T(test_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

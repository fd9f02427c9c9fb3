/*
 * shapetracker.h - View and ShapeTracker exactly as tinygrad 0.9.0
 * (spec section 4: shape/view.py, shape/shapetracker.py).
 *
 * A View maps an index space (shape) to flat addresses (offset + sum idx*stride),
 * valid where idx lies inside the per-dim mask [b, e).  A ShapeTracker is a
 * list of views: views[0] indexes the buffer, views[n-1] is the visible shape.
 *
 * Interning: views and ShapeTrackers are hash-consed inside a kex_shape_ctx,
 * so two equal values made from the same context are the same pointer.
 * Compare them with `==`; use them as hash keys by pointer or by ->hash.
 * Binary operations (st + st, simplify, view + view, reshape) are memoised.
 *
 * Ownership: everything returned lives in the context's arena and dies with
 * kex_shape_ctx_free / the arena.  Functions returning pointers return NULL
 * on failure, int-returning ones a negative code: out of memory (KEX_ENOMEM),
 * or, with kex_shape_error telling why, KEX_ELIMIT when a shape, stride,
 * offset or mask tinygrad would compute does not fit int64, or KEX_EINVAL
 * for an argument tinygrad asserts on (negative dim, reshape that changes
 * the size, shrink out of range, negative pad, zero stride, not a
 * permutation).  The graph loader refuses such client input before any of
 * this runs; these checks are the second line.
 */
#ifndef KEX_SCHED_SHAPETRACKER_H
#define KEX_SCHED_SHAPETRACKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/limits.h"
#include "sched/symbolic.h"

typedef struct kex_view {
  uint64_t hash;
  uint8_t ndim;
  bool contiguous;
  const int64_t *shape;   /* ndim entries */
  const int64_t *strides; /* ndim entries */
  int64_t offset;
  const int64_t *mask;    /* NULL, or 2*ndim entries: mask[2i] = b_i, mask[2i+1] = e_i */
  int64_t size;           /* prod(shape) */
  const struct kex_st *shape_st; /* cache: from_shape(shape) in the context that made this view (NULL until asked) */
} kex_view;

/* Small-array equality (dims are few: an inline loop beats a memcmp call). */
static inline bool kex_i64_eq(const int64_t *a, const int64_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return false;
  return true;
}

typedef struct kex_st kex_st;
/* One movement op memoised on the ShapeTracker it applies to (see sched/shapetracker.c's move memo). */
typedef struct kex_st_move {
  uint32_t op, n;
  const int64_t *args; /* n entries, in the context's arena */
  const struct kex_st *res;
} kex_st_move;

#define KEX_ST_MOVES 4

struct kex_st {
  uint64_t hash;
  uint32_t nviews;
  uint32_t moved_next; /* cache: the moved[] slot the next memoised op replaces */
  const kex_view *const *views;
  const kex_view *last; /* views[nviews - 1], the one most reads want: read here, the views array's line is not */
  /* caches (the one mutable part of an interned ShapeTracker, like a view's shape_st), of results in the context
     that made it, answered without the memo table's hash and probe: the last movement ops applied to it, its
     simplify() (NULL until asked) and its last `self + add_b` */
  kex_st_move moved[KEX_ST_MOVES];
  const struct kex_st *simplified;
  const struct kex_st *add_b, *add_res;
};

typedef struct kex_shape_ctx kex_shape_ctx;

/* A context whose objects are allocated from `arena` (not owned). NULL on OOM. */
kex_shape_ctx *kex_shape_ctx_new(kex_arena *arena);
/* Frees the context's hash tables (the arena keeps the objects until it is destroyed). */
void kex_shape_ctx_free(kex_shape_ctx *ctx);
/* Size a new context's tables for the replay of a graph of nnodes nodes (they still grow past it). */
void kex_shape_ctx_reserve(kex_shape_ctx *ctx, uint32_t nnodes);
/* Bytes of the context's hash tables (its objects are in the arena). */
size_t kex_shape_ctx_bytes(const kex_shape_ctx *ctx);
/* Symbolic context sharing the same arena. */
kex_sym_ctx *kex_shape_sym(kex_shape_ctx *ctx);
/*
 * Why a call on ctx failed: KEX_ELIMIT or KEX_EINVAL with *msg (when msg is
 * non-NULL) pointing at a message in ctx, valid until the next failure; 0
 * when nothing was recorded (the failure was out of memory).  Clears the
 * record, so call it once per failure, and once before a new walk on a
 * long-lived context.
 */
int kex_shape_error(kex_shape_ctx *ctx, const char **msg);

/* ---- View ---- */

/* View.create: canonicalises strides, drops a full mask, computes contiguous, step 4 of the spec. */
const kex_view *kex_view_create(kex_shape_ctx *ctx, int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t offset, const int64_t *mask);
static inline int64_t kex_view_size(const kex_view *v) { return v->size; }
const kex_view *kex_view_pad(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg);    /* arg: 2*ndim (before, after) */
const kex_view *kex_view_shrink(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg); /* arg: 2*ndim (begin, end) */
const kex_view *kex_view_expand(kex_shape_ctx *ctx, const kex_view *v, const int64_t *new_shape);
const kex_view *kex_view_permute(kex_shape_ctx *ctx, const kex_view *v, const int *order);
const kex_view *kex_view_stride(kex_shape_ctx *ctx, const kex_view *v, const int64_t *mul);
/* View.reshape: 0 with *out set, 1 when the reshape cannot be one view (None), or a negative code. */
int kex_view_reshape(kex_shape_ctx *ctx, const kex_view *v, int ndim, const int64_t *new_shape, const kex_view **out);
/* vm2 + vm1 (vm2 inner/earlier): 0 with *out, 1 for None, or a negative code. */
int kex_view_add(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out);
/* View.invert(out_shape): 0 with *out, 1 for None, or a negative code. */
int kex_view_invert(kex_shape_ctx *ctx, const kex_view *v, int ndim, const int64_t *out_shape, const kex_view **out);
/* View.minify(): reshape to the _merge_dims sizes when possible, else v itself. */
const kex_view *kex_view_minify(kex_shape_ctx *ctx, const kex_view *v);

/* ---- ShapeTracker ---- */

const kex_st *kex_st_from_shape(kex_shape_ctx *ctx, int ndim, const int64_t *shape);
/* from_shape(shape of st): the contiguous ShapeTracker of st's visible shape, cached on the view. */
const kex_st *kex__st_from_shape_of(kex_shape_ctx *ctx, const kex_st *st); /* its path when the view has none yet */
static inline const kex_st *kex_st_from_shape_of(kex_shape_ctx *ctx, const kex_st *st) {
  const struct kex_st *c = st->last->shape_st;
  return c ? c : kex__st_from_shape_of(ctx, st);
}
const kex_st *kex_st_from_views(kex_shape_ctx *ctx, uint32_t nviews, const kex_view *const *views);
static inline const kex_view *kex_st_last(const kex_st *st) { return st->last; }
static inline int kex_st_ndim(const kex_st *st) { return kex_st_last(st)->ndim; }
static inline const int64_t *kex_st_shape(const kex_st *st) { return kex_st_last(st)->shape; }
static inline int64_t kex_st_size(const kex_st *st) { return kex_view_size(kex_st_last(st)); } /* prod(shape) */
/* 1 view and contiguous */
static inline bool kex_st_contiguous(const kex_st *st) { return st->nviews == 1 && st->views[0]->contiguous; }
bool kex_st_consecutive(const kex_st *st);            /* 1 view, no mask, row-major strides (any offset) */
/* The element of the base buffer that logical index idx (st's shape) reads, or -1 where the view masks it out. */
int64_t kex_st_address(const kex_st *st, const int64_t *idx);
/*
 * Gather the elements that `st` shows of a row-major base buffer `base`
 * (elements of `itemsize` bytes) into `out` (prod(st shape) elements,
 * row-major); masked-out elements are zero.
 */
void kex_st_gather(const kex_st *st, const void *base, size_t itemsize, void *out);

const kex_st *kex_st_reshape(kex_shape_ctx *ctx, const kex_st *st, int ndim, const int64_t *new_shape);
const kex_st *kex_st_pad(kex_shape_ctx *ctx, const kex_st *st, const int64_t *arg);
const kex_st *kex_st_shrink(kex_shape_ctx *ctx, const kex_st *st, const int64_t *arg);
const kex_st *kex_st_expand(kex_shape_ctx *ctx, const kex_st *st, const int64_t *new_shape);
const kex_st *kex_st_permute(kex_shape_ctx *ctx, const kex_st *st, const int *order);
const kex_st *kex_st_stride(kex_shape_ctx *ctx, const kex_st *st, const int64_t *mul);

/* st1 + st2 (ShapeTracker.__add__): append st2's views one at a time, simplifying after each. */
const kex_st *kex__st_add(kex_shape_ctx *ctx, const kex_st *a, const kex_st *b); /* kex_st_add's whole path */
static inline const kex_st *kex_st_add(kex_shape_ctx *ctx, const kex_st *a, const kex_st *b) {
  return a && b && a->add_b == b ? a->add_res : kex__st_add(ctx, a, b); /* its last add: the cache field's answer */
}
const kex_st *kex__st_simplify(kex_shape_ctx *ctx, const kex_st *st); /* kex_st_simplify's whole path */
static inline const kex_st *kex_st_simplify(kex_shape_ctx *ctx, const kex_st *st) {
  if (!st || st->nviews < 2) return st; /* one view: nothing to merge */
  return st->simplified ? st->simplified : kex__st_simplify(ctx, st);
}
/* ShapeTracker.invert(out_shape): 0 with *out, 1 for None, or a negative code. */
int kex_st_invert(kex_shape_ctx *ctx, const kex_st *st, int ndim, const int64_t *out_shape, const kex_st **out);

/*
 * expr_idxs(idxs): index and valid expressions for per-dim index nodes
 * idxs[0..ndim-1] (ndim of the visible shape).  NULL idxs = Variables
 * idx0..idx{n-1} over [0, shape_i - 1].  0 or a negative code.
 */
int kex_st_expr_idxs(kex_shape_ctx *ctx, const kex_st *st, const kex_sym *const *idxs, const kex_sym **idx,
                     const kex_sym **valid);
/*
 * real_strides(ignore_valid): strides[i] set when known[i] is true (None in
 * tinygrad when false).  0 or KEX_ENOMEM.
 */
int kex_st_real_strides(kex_shape_ctx *ctx, const kex_st *st, bool ignore_valid, int64_t *strides, bool *known);
/* unit_stride_axes(): bitmask of axes with real stride 1.  <0 on OOM. */
int64_t kex_st_unit_stride_axes(kex_shape_ctx *ctx, const kex_st *st);
/* axis_is_masked(axis): 1, 0, or KEX_ENOMEM. */
int kex_st_axis_is_masked(kex_shape_ctx *ctx, const kex_st *st, int axis);
/* real_size(): max valid index + 1 (0 when never valid).  <0 on OOM. */
int64_t kex_st_real_size(kex_shape_ctx *ctx, const kex_st *st);

/*
 * Stable text, tinygrad's repr:
 * "ShapeTracker(views=(View(shape=(16,), strides=(1,), offset=0, mask=None, contiguous=True),))".
 * Returns the length that the full text needs (like snprintf).
 */
int kex_view_repr(const kex_view *v, char *buf, size_t len);
int kex_st_repr(const kex_st *st, char *buf, size_t len);

#endif

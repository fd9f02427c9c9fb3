/*
 * shapetracker.c - tinygrad 0.9.0's ShapeTracker (shape/shapetracker.py).
 *
 * A ShapeTracker is an interned tuple of interned views.  Movement ops
 * replace the last view (reshape may append one, MERGE_VIEW=1); `st + st`
 * and simplify() fold adjacent views with View.__add__ and are memoised per
 * context, and so is every movement op on a ShapeTracker (and
 * from_shape): a function of the interned ShapeTracker and the op's
 * integers, so a repeat (within a graph, or a later graph on a long-lived
 * context) is one probe instead of a view's canonicalisation and interning.
 * The symbolic analyses (expr_idxs, real_strides, axis_is_masked,
 * real_size) build kex_sym expressions exactly as tinygrad does; the ones
 * over the default index variables are memoised per ShapeTracker.  On the
 * host, kex_st_address evaluates one with integers (where a logical index
 * lands in the base buffer) and kex_st_gather copies a view out of a buffer.
 *
 * Everything returned is owned by the context's arena.  Pointer-returning
 * functions return NULL on failure and int-returning ones a negative code:
 * out of memory, or what view.c refused (kex_shape_error says why).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/hash.h"
#include "core/strbuf.h"
#include "sched/shape_internal.h"

/* Memoised expr_idxs() over the default variables idx0..idx{n-1}. */
typedef struct st_expr {
  const kex_sym *idx, *valid;
  const kex_sym *vars[KEX_MAX_DIMS];
} st_expr;

/* Memoised real_strides(). */
typedef struct st_strides {
  int64_t strides[KEX_MAX_DIMS];
  bool known[KEX_MAX_DIMS];
} st_strides;

/* ---- interning ---- */

static uint64_t st_hash(uint32_t n, const kex_view *const *views) {
  uint64_t h = kex_hash_u64(0x2545f4914f6cdd1dull, n);
  for (uint32_t i = 0; i < n; i++) h = kex_hash_mix(h, views[i]->hash);
  return h;
}

/* A ShapeTracker not yet interned: its views. */
typedef struct st_probe {
  uint32_t n;
  const kex_view *const *views;
} st_probe;

static bool st_eq(const void *entry, const void *probe) {
  const kex_st *s = *(const kex_st *const *)entry;
  const st_probe *p = probe;
  return s->nviews == p->n && memcmp(s->views, p->views, p->n * sizeof *p->views) == 0;
}

const kex_dict_type kex__st_type = {sizeof(const kex_st *), st_eq, 64};

/* The interned ShapeTracker of views[0..n-1] (n >= 1).  NULL on OOM. */
const kex_st *kex_st_from_views(kex_shape_ctx *ctx, uint32_t n, const kex_view *const *views) {
  for (uint32_t i = 0; i < n; i++)
    if (!views[i]) return NULL;
  uint64_t h = st_hash(n, views);
  st_probe p = {n, views};
  bool found;
  const kex_st **slot = kex_dict_insert_with(&ctx->sts, h, &p, &found, &kex__st_type);
  if (!slot) return NULL;
  if (found) return *slot;
  kex_st *s = kex_arena_alloc(ctx->arena, sizeof *s + n * sizeof *views);
  if (!s) {
    kex_dict_cancel(&ctx->sts, slot);
    return NULL;
  }
  const kex_view **vs = (const kex_view **)(s + 1);
  memcpy(vs, views, n * sizeof *views);
  s->hash = h;
  s->nviews = n;
  s->views = vs;
  s->last = vs[n - 1];
  s->moved_next = 0;
  memset(s->moved, 0, sizeof s->moved);
  s->simplified = s->add_b = s->add_res = NULL;
  *slot = s;
  return s;
}

/* ---- the movement-op memo ---- */

enum { MOVE_FROM_SHAPE = 1, MOVE_RESHAPE, MOVE_PAD, MOVE_SHRINK, MOVE_EXPAND, MOVE_PERMUTE, MOVE_STRIDE };

/* One memoised movement op: (op, st, args[0..n)) -> res.  args live in the context's arena (a probe's: the caller's). */
typedef struct move_ent {
  const kex_st *st, *res;
  uint32_t op, n;
  const int64_t *args;
} move_ent;

static bool move_eq(const void *entry, const void *probe) {
  const move_ent *e = entry, *k = probe;
  return e->op == k->op && e->st == k->st && e->n == k->n && kex_i64_eq(e->args, k->args, (int)k->n);
}

const kex_dict_type kex__move_type = {sizeof(move_ent), move_eq, 64};

static uint64_t move_hash(const move_ent *k) {
  uint64_t h = kex_hash_u64(kex_hash_u64((uint64_t)(uintptr_t)k->st, k->op), k->n);
  for (uint32_t i = 0; i < k->n; i++) h = kex_hash_u64(h, (uint64_t)k->args[i]);
  return h;
}

/* Remember e (whose args are the context's) in its ShapeTracker's own slots. */
static void move_remember(const move_ent *e) {
  kex_st *st = (kex_st *)e->st; /* the cache fields are the one mutable part of a ShapeTracker */
  st->moved[st->moved_next] = (kex_st_move){e->op, e->n, e->args, e->res};
  st->moved_next = (st->moved_next + 1) % KEX_ST_MOVES;
}

/*
 * The memoised result of k, or NULL (and *h, k's hash): first the slots of
 * k's ShapeTracker (a graph moves most ShapeTrackers a few ways at most, and a
 * warm context meets the same ones again), then the table.  Inlined into
 * each movement op (a call per op showed).
 */
static inline __attribute__((always_inline)) const kex_st *move_get(const kex_shape_ctx *ctx, const move_ent *k,
                                                                    uint64_t *h) {
  *h = 0; /* set below when the table is probed (a slot's answer is never NULL, so callers do not read it then) */
  if (k->st)
    for (int i = 0; i < KEX_ST_MOVES; i++) {
      const kex_st_move *m = &k->st->moved[i];
      /* an empty slot has op 0, no movement op's */
      if (m->op == k->op && m->n == k->n && kex_i64_eq(m->args, k->args, (int)k->n)) return m->res;
    }
  *h = move_hash(k);
  const move_ent *e = kex_dict_find_with(&ctx->moves, *h, k, &kex__move_type);
  if (!e) return NULL;
  if (e->st) move_remember(e);
  return e->res;
}

/* Remember res (a success) for k, hash h: best effort, the memo is only a cache.  Returns res. */
static const kex_st *move_put(kex_shape_ctx *ctx, move_ent k, uint64_t h, const kex_st *res) {
  bool found;
  if (!res) return NULL;
  int64_t *args = kex_arena_memdup(ctx->arena, k.args, k.n * sizeof *k.args);
  if (!args && k.n) return res;
  move_ent *e = kex_dict_insert(&ctx->moves, h, &k, &found);
  if (!e) return res;
  k.args = args;
  k.res = res;
  *e = k;
  if (k.st) move_remember(e);
  return res;
}

const kex_st *kex__st_from_shape_of(kex_shape_ctx *ctx, const kex_st *st) {
  kex_view *last = (kex_view *)kex_st_last(st); /* the cache field is the one mutable part of a view */
  if (!last->shape_st) last->shape_st = kex_st_from_shape(ctx, last->ndim, last->shape);
  return last->shape_st;
}

const kex_st *kex_st_from_shape(kex_shape_ctx *ctx, int ndim, const int64_t *shape) {
  if (ndim == 0 && ctx->scalar) return ctx->scalar;
  move_ent k = {.op = MOVE_FROM_SHAPE, .n = (uint32_t)ndim, .args = shape};
  uint64_t h;
  const kex_st *r = move_get(ctx, &k, &h);
  if (r) return r;
  const kex_view *v = kex_view_create(ctx, ndim, shape, NULL, 0, NULL);
  if (!v) return NULL;
  r = move_put(ctx, k, h, kex_st_from_views(ctx, 1, &v));
  if (ndim == 0) ctx->scalar = r;
  return r;
}

/* st with its last view replaced by v (NULL v = OOM passes through). */
static const kex_st *replace_last(kex_shape_ctx *ctx, const kex_st *st, const kex_view *v) {
  if (!v) return NULL;
  if (v == kex_st_last(st)) return st;
  const kex_view *vs[st->nviews];
  memcpy(vs, st->views, st->nviews * sizeof *vs);
  vs[st->nviews - 1] = v;
  return kex_st_from_views(ctx, st->nviews, vs);
}

/* st with v appended. */
static const kex_st *append_view(kex_shape_ctx *ctx, const kex_st *st, const kex_view *v) {
  if (!v) return NULL;
  const kex_view *vs[st->nviews + 1];
  memcpy(vs, st->views, st->nviews * sizeof *vs);
  vs[st->nviews] = v;
  return kex_st_from_views(ctx, st->nviews + 1, vs);
}

/* ---- properties ---- */

bool kex_st_consecutive(const kex_st *st) {
  if (st->nviews != 1 || st->views[0]->mask) return false;
  const kex_view *v = st->views[0];
  int64_t sfs[KEX_MAX_DIMS];
  return kex__strides_for_shape(v->ndim, v->shape, sfs) && kex_i64_eq(sfs, v->strides, v->ndim);
}

/* ---- movement ops ---- */

const kex_st *kex_st_reshape(kex_shape_ctx *ctx, const kex_st *st, int ndim, const int64_t *new_shape) {
  move_ent k = {.st = st, .op = MOVE_RESHAPE, .n = (uint32_t)ndim, .args = new_shape};
  uint64_t h;
  const kex_st *r = move_get(ctx, &k, &h);
  const kex_view *nv = NULL;
  if (r) return r;
  int rc = kex_view_reshape(ctx, kex_st_last(st), ndim, new_shape, &nv);
  if (rc < 0) return NULL;
  if (rc == 0) return move_put(ctx, k, h, replace_last(ctx, st, nv));
  return move_put(ctx, k, h, append_view(ctx, st, kex_view_create(ctx, ndim, new_shape, NULL, 0, NULL)));
}

/* A movement op that replaces the last view: memoised on (op, st, args[0..n)). */
#define MOVE_LAST(OP, N, ARGS, VIEW_CALL)                                      \
  do {                                                                         \
    move_ent k = {.st = st, .op = (OP), .n = (uint32_t)(N), .args = (ARGS)}; \
    uint64_t h;                                                                \
    const kex_st *r = move_get(ctx, &k, &h);                                   \
    if (r) return r;                                                           \
    return move_put(ctx, k, h, replace_last(ctx, st, VIEW_CALL));              \
  } while (0)

const kex_st *kex_st_pad(kex_shape_ctx *ctx, const kex_st *st, const int64_t *arg) {
  MOVE_LAST(MOVE_PAD, 2 * kex_st_ndim(st), arg, kex_view_pad(ctx, kex_st_last(st), arg));
}

const kex_st *kex_st_shrink(kex_shape_ctx *ctx, const kex_st *st, const int64_t *arg) {
  MOVE_LAST(MOVE_SHRINK, 2 * kex_st_ndim(st), arg, kex_view_shrink(ctx, kex_st_last(st), arg));
}

const kex_st *kex_st_expand(kex_shape_ctx *ctx, const kex_st *st, const int64_t *new_shape) {
  MOVE_LAST(MOVE_EXPAND, kex_st_ndim(st), new_shape, kex_view_expand(ctx, kex_st_last(st), new_shape));
}

const kex_st *kex_st_permute(kex_shape_ctx *ctx, const kex_st *st, const int *order) {
  int64_t o[KEX_MAX_DIMS];
  int n = kex_st_ndim(st);
  for (int i = 0; i < n; i++) o[i] = order[i];
  MOVE_LAST(MOVE_PERMUTE, n, o, kex_view_permute(ctx, kex_st_last(st), order));
}

const kex_st *kex_st_stride(kex_shape_ctx *ctx, const kex_st *st, const int64_t *mul) {
  MOVE_LAST(MOVE_STRIDE, kex_st_ndim(st), mul, kex_view_stride(ctx, kex_st_last(st), mul));
}

/* ---- simplify and add ---- */

/*
 * simplify(): while the last two views merge (views[-2] + views[-1] is not
 * None), replace them by the merged view.  Memoised.  NULL on OOM.
 */
const kex_st *kex__st_simplify(kex_shape_ctx *ctx, const kex_st *st) {
  if (!st) return NULL;
  if (st->nviews < 2) return st;
  if (st->simplified) return st->simplified;
  const kex_view *vs[st->nviews];
  memcpy(vs, st->views, st->nviews * sizeof *vs);
  uint32_t n = st->nviews;
  while (n >= 2) {
    const kex_view *m;
    int rc = kex_view_add(ctx, vs[n - 2], vs[n - 1], &m);
    if (rc < 0) return NULL;
    if (rc == 1) break;
    vs[n - 2] = m;
    n--;
  }
  const kex_st *ret = n == st->nviews ? st : kex_st_from_views(ctx, n, vs);
  if (ret) ((kex_st *)st)->simplified = ret; /* the cache field is the one mutable part of a ShapeTracker */
  return ret;
}

/*
 * a + b: append b's views one at a time, simplifying after each.
 * `st + contiguous st of the same shape` is answered without memo traffic
 * beyond simplify's.  Memoised.  NULL on OOM.
 */
const kex_st *kex__st_add(kex_shape_ctx *ctx, const kex_st *a, const kex_st *b) {
  if (!a || !b) return NULL;
  const void *val;
  const kex_st *ret = a;
  const kex_view *la = kex_st_last(a), *v = b->views[0];
  if (b->nviews == 1 && v->contiguous && la->ndim == v->ndim && kex_i64_eq(la->shape, v->shape, v->ndim)) {
    ret = kex_st_simplify(ctx, a);
  } else if (kex__memo_get(&ctx->memo, KEX__MEMO_ST_ADD, a, b, &val)) {
    ret = val;
  } else {
    for (uint32_t i = 0; i < b->nviews && ret; i++) ret = kex_st_simplify(ctx, append_view(ctx, ret, b->views[i]));
    if (ret) (void)kex__memo_put(&ctx->memo, KEX__MEMO_ST_ADD, a, b, ret);
  }
  if (ret) ((kex_st *)a)->add_b = b, ((kex_st *)a)->add_res = ret; /* the cache fields: see kex_st */
  return ret;
}

/*
 * invert(out_shape): each view inverted against the shape of the view
 * before it (last view against out_shape), in reverse order, then reshaped
 * to out_shape.  0 with *out, 1 for None, or a negative code.
 */
int kex_st_invert(kex_shape_ctx *ctx, const kex_st *st, int ndim, const int64_t *out_shape, const kex_st **out) {
  uint32_t n = st->nviews;
  const kex_view *inv[n];
  for (uint32_t i = 0; i < n; i++) {
    const kex_view *v = st->views[n - 1 - i];
    int rc;
    if (i + 1 < n) {
      const kex_view *prev = st->views[n - 2 - i];
      rc = kex_view_invert(ctx, v, prev->ndim, prev->shape, &inv[i]);
    } else rc = kex_view_invert(ctx, v, ndim, out_shape, &inv[i]);
    if (rc) return rc;
  }
  const kex_st *r = kex_st_from_views(ctx, n, inv);
  if (r) r = kex_st_reshape(ctx, r, ndim, out_shape);
  if (!r) return kex__shape_fail_code(ctx);
  *out = r;
  return 0;
}

/* ---- index expressions ---- */

/* _expr_view(view, idxs, valid): 0 or KEX_ENOMEM. */
static int expr_view(kex_sym_ctx *sc, const kex_view *v, const kex_sym *const *idxs, const kex_sym *valid,
                     const kex_sym **idx_out, const kex_sym **valid_out) {
  const kex_sym *iexpr[KEX_MAX_DIMS + 1], *vexpr[2 * KEX_MAX_DIMS + 1];
  uint32_t ni = 0, nv = 0;
  iexpr[ni++] = kex_sym_num(sc, v->offset);
  if (valid) vexpr[nv++] = valid;
  for (int i = 0; i < v->ndim; i++) {
    if (v->shape[i] != 1 && v->strides[i] != 0) iexpr[ni++] = kex_sym_mul_int(sc, idxs[i], v->strides[i]);
    if (v->mask) {
      vexpr[nv++] = kex_sym_create_ge(sc, idxs[i], v->mask[2 * i]);
      vexpr[nv++] = kex_sym_create_lt(sc, idxs[i], v->mask[2 * i + 1]);
    }
  }
  *idx_out = kex_sym_sum(sc, iexpr, ni);
  *valid_out = kex_sym_ands(sc, vexpr, nv);
  return *idx_out && *valid_out ? 0 : KEX_ENOMEM;
}

/* The default index variables idx{i} in [0, shape_i - 1]. */
static int default_vars(kex_sym_ctx *sc, const kex_st *st, const kex_sym **vars) {
  const kex_view *last = kex_st_last(st);
  for (int i = 0; i < last->ndim; i++) {
    char name[16];
    snprintf(name, sizeof name, "idx%d", i);
    vars[i] = kex_sym_var(sc, name, 0, last->shape[i] - 1);
    if (!vars[i]) return KEX_ENOMEM;
  }
  return 0;
}

static int expr_idxs_raw(kex_shape_ctx *ctx, const kex_st *st, const kex_sym *const *idxs, const kex_sym **idx_out,
                         const kex_sym **valid_out) {
  kex_sym_ctx *sc = &ctx->sym;
  const kex_sym *idx, *valid;
  int rc = expr_view(sc, kex_st_last(st), idxs, NULL, &idx, &valid);
  if (rc) return rc;
  for (int i = (int)st->nviews - 2; i >= 0; i--) {
    if (valid->max == 0) {
      idx = kex_sym_num(sc, -1);
      if (!idx) return KEX_ENOMEM;
      break;
    }
    const kex_view *v = kex_view_minify(ctx, st->views[i]);
    if (!v) return kex__shape_fail_code(ctx);
    const kex_sym *nidx[KEX_MAX_DIMS];
    int64_t acc = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
      if (v->shape[d] <= 0) return KEX_EINVAL; /* tinygrad: ZeroDivisionError */
      nidx[d] = kex_sym_mod_int(sc, kex_sym_div_int(sc, idx, acc), v->shape[d]);
      if (!nidx[d]) return KEX_ENOMEM;
      if (d > 0 && __builtin_mul_overflow(acc, v->shape[d], &acc)) /* the last product is never a divisor */
        return kex__shape_fail(ctx, KEX_ELIMIT, "ShapeTracker.expr_idxs: the size of a view overflows int64");
    }
    rc = expr_view(sc, v, nidx, valid, &idx, &valid);
    if (rc) return rc;
  }
  *idx_out = idx;
  *valid_out = valid;
  return 0;
}

/* expr_idxs() over the default variables, memoised per st. */
static const st_expr *default_expr(kex_shape_ctx *ctx, const kex_st *st) {
  const void *val;
  if (kex__memo_get(&ctx->memo, KEX__MEMO_ST_EXPR, st, NULL, &val)) return val;
  st_expr *e = kex_arena_calloc(ctx->arena, 1, sizeof *e);
  if (!e || default_vars(&ctx->sym, st, e->vars)) return NULL;
  if (expr_idxs_raw(ctx, st, e->vars, &e->idx, &e->valid)) return NULL;
  (void)kex__memo_put(&ctx->memo, KEX__MEMO_ST_EXPR, st, NULL, e);
  return e;
}

int kex_st_expr_idxs(kex_shape_ctx *ctx, const kex_st *st, const kex_sym *const *idxs, const kex_sym **idx,
                     const kex_sym **valid) {
  if (idxs) return expr_idxs_raw(ctx, st, idxs, idx, valid);
  const st_expr *e = default_expr(ctx, st);
  if (!e) return kex__shape_fail_code(ctx);
  *idx = e->idx;
  *valid = e->valid;
  return 0;
}

/* Bitmask of the idx{i} variables occurring in s (names are ours: "idx<i>"). */
static uint32_t var_mask(const kex_sym *s) {
  switch (s->kind) {
  case KEX_SYM_NUM: return 0;
  case KEX_SYM_VAR: {
    if (strncmp(s->name, "idx", 3) != 0) return 0;
    long i = strtol(s->name + 3, NULL, 10);
    return i >= 0 && i < KEX_MAX_DIMS ? 1u << i : 0;
  }
  case KEX_SYM_SUM:
  case KEX_SYM_AND: {
    uint32_t m = 0;
    for (uint32_t i = 0; i < s->n; i++) m |= var_mask(s->nodes[i]);
    return m;
  }
  default: return var_mask(s->a) | (s->bn ? var_mask(s->bn) : 0);
  }
}

/*
 * real_strides(ignore_valid): each term var*k of the index gives stride k;
 * vars inside other terms, or (unless ignore_valid) in the valid, are None;
 * absent vars are 0.  0 or KEX_ENOMEM.
 */
int kex_st_real_strides(kex_shape_ctx *ctx, const kex_st *st, bool ignore_valid, int64_t *strides, bool *known) {
  const kex_view *last = kex_st_last(st);
  int n = last->ndim;
  if (st->nviews == 1 && !last->mask) {
    for (int i = 0; i < n; i++) {
      strides[i] = last->strides[i];
      known[i] = true;
    }
    return 0;
  }
  const void *val;
  const void *key = ignore_valid ? (const void *)&kex__memo_none : NULL;
  if (kex__memo_get(&ctx->memo, KEX__MEMO_ST_STRIDES, st, key, &val)) {
    const st_strides *r = val;
    memcpy(strides, r->strides, n * sizeof *strides);
    memcpy(known, r->known, n * sizeof *known);
    return 0;
  }
  const st_expr *e = default_expr(ctx, st);
  st_strides *r = kex_arena_calloc(ctx->arena, 1, sizeof *r);
  if (!e || !r) return kex__shape_fail_code(ctx);
  const kex_sym *idx = e->idx;
  const kex_sym *const *terms = idx->kind == KEX_SYM_SUM ? idx->nodes : &idx;
  uint32_t nt = idx->kind == KEX_SYM_SUM ? idx->n : 1;
  uint32_t bad = 0;
  for (uint32_t t = 0; t < nt; t++) {
    const kex_sym *a = terms[t];
    int64_t k = 1;
    if (a->kind == KEX_SYM_MUL) {
      k = a->b;
      a = a->a;
    }
    int found = -1;
    for (int i = 0; i < n && found < 0; i++)
      if (kex_sym_eq(&ctx->sym, e->vars[i], a)) found = i;
    if (found >= 0) {
      r->strides[found] = k;
      r->known[found] = true;
    } else bad |= var_mask(a);
  }
  uint32_t idx_vars = var_mask(idx), valid_vars = var_mask(e->valid);
  for (int i = 0; i < n; i++) {
    if (e->vars[i]->kind != KEX_SYM_VAR) { /* shape-1 dims are NumNode(0): in no var set */
      r->strides[i] = 0;
      r->known[i] = true;
      continue;
    }
    uint32_t bit = 1u << i;
    if ((bad & bit) || ((valid_vars & bit) && !ignore_valid)) r->known[i] = false;
    else if (!(idx_vars & bit)) {
      r->strides[i] = 0;
      r->known[i] = true;
    }
  }
  (void)kex__memo_put(&ctx->memo, KEX__MEMO_ST_STRIDES, st, key, r);
  memcpy(strides, r->strides, n * sizeof *strides);
  memcpy(known, r->known, n * sizeof *known);
  return 0;
}

int64_t kex_st_unit_stride_axes(kex_shape_ctx *ctx, const kex_st *st) {
  int64_t strides[KEX_MAX_DIMS];
  bool known[KEX_MAX_DIMS];
  int rc = kex_st_real_strides(ctx, st, false, strides, known);
  if (rc) return rc;
  int64_t m = 0;
  for (int i = 0; i < kex_st_ndim(st); i++)
    if (known[i] && strides[i] == 1) m |= (int64_t)1 << i;
  return m;
}

int kex_st_axis_is_masked(kex_shape_ctx *ctx, const kex_st *st, int axis) {
  const st_expr *e = default_expr(ctx, st);
  if (!e) return kex__shape_fail_code(ctx);
  char name[16];
  snprintf(name, sizeof name, "idx%d", axis);
  return kex_sym_has_var(e->valid, name) ? 1 : 0;
}

int64_t kex_st_real_size(kex_shape_ctx *ctx, const kex_st *st) {
  const kex_view *last = kex_st_last(st);
  for (int i = 0; i < last->ndim; i++)
    if (last->shape[i] == 0) return 0;
  const st_expr *e = default_expr(ctx, st);
  if (!e) return kex__shape_fail_code(ctx);
  return e->idx->max + 1;
}

/* ---- repr ---- */

int kex_st_repr(const kex_st *st, char *buf, size_t len) {
  size_t pos = 0;
#define PUT(s_) kex_cut_put(buf, len, &pos, (s_), strlen(s_))
  if (len) buf[0] = 0;
  PUT("ShapeTracker(views=(");
  for (uint32_t i = 0; i < st->nviews; i++) {
    if (i) PUT(", ");
    int k = kex_view_repr(st->views[i], pos < len ? buf + pos : NULL, pos < len ? len - pos : 0);
    pos += (size_t)k;
  }
  PUT(st->nviews == 1 ? ",))" : "))");
#undef PUT
  return (int)pos;
}

/* ---- evaluating a ShapeTracker on the host ---- */

int64_t kex_st_address(const kex_st *st, const int64_t *idx_in) {
  int64_t idx[KEX_MAX_DIMS];
  int nd = kex_st_ndim(st);
  memcpy(idx, idx_in, sizeof *idx * (size_t)nd);
  for (int vi = (int)st->nviews - 1; vi >= 0; vi--) {
    const kex_view *v = st->views[vi];
    int64_t addr = v->offset;
    for (int d = 0; d < v->ndim; d++) {
      if (v->mask && (idx[d] < v->mask[2 * d] || idx[d] >= v->mask[2 * d + 1])) return -1;
      addr += idx[d] * v->strides[d];
    }
    if (vi == 0) return addr;
    const kex_view *prev = st->views[vi - 1];
    for (int d = prev->ndim - 1; d >= 0; d--) {
      int64_t s = prev->shape[d];
      idx[d] = s ? addr % s : 0;
      addr = s ? addr / s : 0;
    }
  }
  return -1;
}

void kex_st_gather(const kex_st *st, const void *base, size_t itemsize, void *out) {
  int nd = kex_st_ndim(st);
  const int64_t *shape = kex_st_shape(st);
  int64_t total = kex_st_size(st);
  int64_t idx[KEX_MAX_DIMS] = {0};
  for (int64_t e = 0; e < total; e++) {
    int64_t a = kex_st_address(st, idx);
    unsigned char *dst = (unsigned char *)out + (size_t)e * itemsize;
    if (a < 0) memset(dst, 0, itemsize);
    else memcpy(dst, (const unsigned char *)base + (size_t)a * itemsize, itemsize);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

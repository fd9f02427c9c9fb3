/*
 * view.c - tinygrad 0.9.0's View (shape/view.py) and the shape context.
 *
 * A view is built in a stack buffer (view_buf), canonicalised exactly as
 * View.create does, and then interned: equal views made in one context are
 * one pointer, so view equality is `==` and memo keys are pointer pairs.
 * View.__add__ and View.reshape are memoised per context, as tinygrad
 * caches them with functools.cache.
 *
 * View.__add__'s "provably in [0, merged_size)" test runs on the symbolic
 * bounds of a linear form sum(idx_d1 * c_d1) + const whose terms are grouped
 * per variable exactly as Node.sum groups them; for that form the bounds of
 * the SumNode are const + sum(min/max of c_d1 * [0, shape_d1 - 1]), so the
 * interval arithmetic here equals tinygrad's decision without building nodes.
 *
 * Every sum and product of shapes, strides, offsets and masks is checked:
 * Python's ints do not overflow, so a value tinygrad would compute that does
 * not fit int64 (or an argument tinygrad would assert on) is refused rather
 * than wrapped.  The graph loader refuses such input first; this is the
 * second line.  Every function returning a view returns NULL on failure:
 * out of memory, or with the context's error (kex_shape_error) set to
 * KEX_ELIMIT (int64 overflow) or KEX_EINVAL (an argument tinygrad asserts
 * on).  The int-returning ones give 0 (result in *out), 1 (tinygrad's None),
 * KEX_ENOMEM, KEX_ELIMIT or KEX_EINVAL.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/hash.h"
#include "core/strbuf.h"
#include "sched/shape_internal.h"

/* Deepest chain of View.__add__ self-calls followed before answering None. */
#define VIEW_ADD_MAX_DEPTH 64

const char kex__memo_none = 0;

typedef struct view_buf {
  int ndim;
  bool has_mask;
  int64_t offset;
  int64_t shape[KEX_MAX_DIMS];
  int64_t strides[KEX_MAX_DIMS];
  int64_t mask[2 * KEX_MAX_DIMS];
} view_buf;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- checked int64 arithmetic: on overflow (or a zero divisor) *ovf is set and 0 returned ---- */

#define CHECKED(name, builtin)                     \
  static int64_t name(bool *ovf, int64_t a, int64_t b) { \
    int64_t r;                                             \
    if (builtin(a, b, &r)) {                               \
      *ovf = true;                                         \
      return 0;                                            \
    }                                                      \
    return r;                                              \
  }
CHECKED(ck_add, __builtin_add_overflow)
CHECKED(ck_sub, __builtin_sub_overflow)
CHECKED(ck_mul, __builtin_mul_overflow)
#undef CHECKED

/* Python's a // b (floor division). */
static int64_t py_div(bool *ovf, int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) {
    *ovf = true;
    return 0;
  }
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

/* Python's -(-a // b) (ceiling division). */
static int64_t ceil_div(bool *ovf, int64_t a, int64_t b) { return ck_sub(ovf, 0, py_div(ovf, ck_sub(ovf, 0, a), b)); }

/* a + 1 < b, without forming a + 1. */
static bool plus1_lt(int64_t a, int64_t b) { return b != INT64_MIN && a < b - 1; }

/*
 * prod(shape) as Python computes it: 0 when any dim is 0 (however large the
 * others), else the product, with *ovf set when that overflows.
 */
static int64_t shape_size(bool *ovf, int n, const int64_t *shape) {
  int64_t p = 1;
  for (int i = 0; i < n; i++)
    if (shape[i] == 0) return 0;
  for (int i = 0; i < n; i++) p = ck_mul(ovf, p, shape[i]);
  return p;
}

/* ---- the context's error ---- */

int kex__shape_fail(kex_shape_ctx *ctx, int code, const char *fmt, ...) {
  if (!ctx->rc) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    ctx->rc = code;
  }
  return code;
}

/* An int64 overflow in `what` (an operation on a view of the given shape). Returns KEX_ELIMIT. */
static int overflow(kex_shape_ctx *ctx, const char *what, int n, const int64_t *shape) {
  char sb[128];
  return kex__shape_fail(ctx, KEX_ELIMIT, "%s on a view of shape %s: a shape, stride, offset or mask overflows int64",
                         what, kex_tuple_repr(sb, sizeof sb, n, shape));
}

int kex_shape_error(kex_shape_ctx *ctx, const char **msg) {
  int rc = ctx->rc;
  if (msg) *msg = rc ? ctx->msg : NULL;
  ctx->rc = 0;
  return rc;
}

/* ---- tables ---- */

static uint64_t memo_hash(uint32_t op, const void *a, const void *b) {
  return kex_hash_mix(kex_hash_u64((uint64_t)(uintptr_t)a, op), (uint64_t)(uintptr_t)b);
}

static bool memo_eq(const void *entry, const void *probe) {
  const kex__memo_ent *e = entry, *k = probe;
  return e->op == k->op && e->a == k->a && e->b == k->b;
}

static const kex_dict_type memo_type = {sizeof(kex__memo_ent), memo_eq, 64};

bool kex__memo_get(const kex_dict *m, uint32_t op, const void *a, const void *b, const void **val) {
  kex__memo_ent k = {.a = a, .b = b, .op = op};
  const kex__memo_ent *e = kex_dict_find_with(m, memo_hash(op, a, b), &k, &memo_type);
  if (e) *val = e->val;
  return e != NULL;
}

int kex__memo_put(kex_dict *m, uint32_t op, const void *a, const void *b, const void *val) {
  kex__memo_ent k = {.a = a, .b = b, .op = op, .val = val};
  bool found;
  kex__memo_ent *e = kex_dict_insert_with(m, memo_hash(op, a, b), &k, &found, &memo_type);
  if (!e) return KEX_ENOMEM;
  *e = k;
  return 0;
}

static bool view_eq(const void *entry, const void *probe);
static const kex_dict_type view_type = {sizeof(const kex_view *), view_eq, 64};

/* ---- context ---- */

kex_shape_ctx *kex_shape_ctx_new(kex_arena *arena) {
  kex_shape_ctx *ctx = kex_calloc(1, sizeof *ctx);
  if (!ctx) return NULL;
  ctx->arena = arena;
  ctx->views = kex_dict_make(&view_type);
  ctx->sts = kex_dict_make(&kex__st_type);
  ctx->memo = kex_dict_make(&memo_type);
  ctx->moves = kex_dict_make(&kex__move_type);
  kex_sym_ctx_init(&ctx->sym, arena);
  return ctx;
}

void kex_shape_ctx_reserve(kex_shape_ctx *ctx, uint32_t nnodes) {
  /* a graph's replay interns about one view and one ShapeTracker per two nodes and memoises one result per four */
  (void)kex_dict_reserve(&ctx->views, nnodes / 2);
  (void)kex_dict_reserve(&ctx->sts, nnodes / 2);
  (void)kex_dict_reserve(&ctx->memo, nnodes / 4);
  (void)kex_dict_reserve(&ctx->moves, nnodes / 2);
}

void kex_shape_ctx_free(kex_shape_ctx *ctx) {
  if (!ctx) return;
  kex_dict_free(&ctx->views);
  kex_dict_free(&ctx->sts);
  kex_dict_free(&ctx->memo);
  kex_dict_free(&ctx->moves);
  kex_free(ctx);
}

size_t kex_shape_ctx_bytes(const kex_shape_ctx *ctx) {
  return sizeof *ctx + kex_dict_bytes(&ctx->views) + kex_dict_bytes(&ctx->sts) + kex_dict_bytes(&ctx->memo) +
         kex_dict_bytes(&ctx->moves);
}

kex_sym_ctx *kex_shape_sym(kex_shape_ctx *ctx) { return &ctx->sym; }

/* ---- helpers ---- */

bool kex__strides_for_shape(int ndim, const int64_t *shape, int64_t *out) {
  int64_t acc = 1;
  bool ovf = false;
  for (int i = ndim - 1; i >= 0; i--) {
    out[i] = shape[i] == 1 ? 0 : acc;
    if (i > 0) acc = ck_mul(&ovf, acc, shape[i]); /* prod(shape) itself is no stride */
  }
  return !ovf;
}

static bool shape_eq(int n1, const int64_t *s1, int n2, const int64_t *s2) {
  return n1 == n2 && kex_i64_eq(s1, s2, n1);
}

static uint64_t view_buf_hash(const view_buf *b) {
  uint64_t h = kex_hash_u64(0x5851f42d4c957f2dull, (uint64_t)b->ndim);
  for (int i = 0; i < b->ndim; i++) h = kex_hash_mix(kex_hash_u64(h, (uint64_t)b->shape[i]), (uint64_t)b->strides[i]);
  h = kex_hash_u64(h, (uint64_t)b->offset);
  if (b->has_mask)
    for (int i = 0; i < 2 * b->ndim; i++) h = kex_hash_u64(h, (uint64_t)b->mask[i] + 0x3c6ef372u);
  else h = kex_hash_u64(h, 0xa54ff53a5f1d36f1ull);
  return h;
}

static bool view_buf_eq(const view_buf *b, const kex_view *v) {
  if (b->ndim != v->ndim || b->offset != v->offset || b->has_mask != (v->mask != NULL)) return false;
  int n = b->ndim;
  if (!kex_i64_eq(b->shape, v->shape, n) || !kex_i64_eq(b->strides, v->strides, n)) return false;
  return !b->has_mask || kex_i64_eq(b->mask, v->mask, 2 * n);
}

static bool view_eq(const void *entry, const void *probe) { return view_buf_eq(probe, *(const kex_view *const *)entry); }

/* Intern an already canonical buffer.  NULL on OOM, or (error set) when prod(shape) overflows. */
static const kex_view *intern_view(kex_shape_ctx *ctx, const view_buf *b, bool contiguous) {
  bool ovf = false;
  int64_t size = shape_size(&ovf, b->ndim, b->shape);
  if (ovf) {
    overflow(ctx, "View.size", b->ndim, b->shape);
    return NULL;
  }
  uint64_t h = view_buf_hash(b);
  bool found;
  const kex_view **slot = kex_dict_insert_with(&ctx->views, h, b, &found, &view_type);
  if (!slot) return NULL;
  if (found) return *slot;
  size_t n = (size_t)b->ndim;
  size_t words = 2 * n + (b->has_mask ? 2 * n : 0);
  kex_view *v = kex_arena_alloc(ctx->arena, sizeof *v + words * sizeof(int64_t));
  if (!v) {
    kex_dict_cancel(&ctx->views, slot);
    return NULL;
  }
  int64_t *data = (int64_t *)(v + 1);
  memcpy(data, b->shape, n * sizeof *data);
  memcpy(data + n, b->strides, n * sizeof *data);
  if (b->has_mask) memcpy(data + 2 * n, b->mask, 2 * n * sizeof *data);
  v->hash = h;
  v->ndim = (uint8_t)n;
  v->contiguous = contiguous;
  v->shape = data;
  v->strides = data + n;
  v->offset = b->offset;
  v->mask = b->has_mask ? data + 2 * n : NULL;
  v->shape_st = NULL;
  v->size = size;
  *slot = v;
  return v;
}

/*
 * View.create on a buffer: b->strides holds the requested strides when
 * have_strides, else is ignored.  The buffer is modified.  NULL on OOM or
 * (error set) a negative dim or an overflow.
 */
static const kex_view *create_buf(kex_shape_ctx *ctx, view_buf *b, bool have_strides) {
  int n = b->ndim;
  int64_t sfs[KEX_MAX_DIMS];
  bool ovf = false;
  for (int i = 0; i < n; i++)
    if (b->shape[i] < 0) {
      char sb[128];
      kex__shape_fail(ctx, KEX_EINVAL, "View.create: shape %s has a negative dim",
                      kex_tuple_repr(sb, sizeof sb, n, b->shape));
      return NULL;
    }
  if (!kex__strides_for_shape(n, b->shape, sfs)) {
    overflow(ctx, "View.create (strides_for_shape)", n, b->shape);
    return NULL;
  }
  if (have_strides && n > 0) {
    for (int i = 0; i < n; i++)
      if (b->shape[i] == 1) b->strides[i] = 0;
  } else memcpy(b->strides, sfs, (size_t)n * sizeof *sfs);
  if (b->has_mask) {
    bool full = true;
    for (int i = 0; i < n; i++)
      if (b->mask[2 * i] != 0 || b->mask[2 * i + 1] != b->shape[i]) full = false;
    if (full) b->has_mask = false;
  }
  bool contiguous = b->offset == 0 && !b->has_mask && kex_i64_eq(b->strides, sfs, n);
  if (b->has_mask && n > 0) {
    bool any_elim = false, any_empty = false;
    for (int i = 0; i < n; i++) {
      if (!plus1_lt(b->mask[2 * i], b->mask[2 * i + 1])) any_elim = true;
      if (!(b->mask[2 * i] < b->mask[2 * i + 1])) any_empty = true;
    }
    if (any_elim) {
      if (any_empty) {
        b->offset = 0;
        for (int i = 0; i < n; i++) b->strides[i] = b->mask[2 * i] = b->mask[2 * i + 1] = 0;
      }
      for (int i = 0; i < n; i++) {
        if (!plus1_lt(b->mask[2 * i], b->mask[2 * i + 1])) {
          b->offset = ck_add(&ovf, b->offset, ck_mul(&ovf, b->strides[i], b->mask[2 * i]));
          b->strides[i] = 0;
        }
      }
    }
  }
  if (ovf) {
    overflow(ctx, "View.create (mask)", n, b->shape);
    return NULL;
  }
  return intern_view(ctx, b, contiguous);
}

const kex_view *kex_view_create(kex_shape_ctx *ctx, int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t offset, const int64_t *mask) {
  view_buf b;
  if (ndim < 0 || ndim > KEX_MAX_DIMS) {
    kex__shape_fail(ctx, KEX_EINVAL, "View.create: %d dims (0..%d)", ndim, KEX_MAX_DIMS);
    return NULL;
  }
  b.ndim = ndim;
  b.offset = offset;
  b.has_mask = mask != NULL;
  if (ndim) memcpy(b.shape, shape, (size_t)ndim * sizeof *shape);
  if (strides && ndim) memcpy(b.strides, strides, (size_t)ndim * sizeof *strides);
  if (mask && ndim) memcpy(b.mask, mask, 2 * (size_t)ndim * sizeof *mask);
  return create_buf(ctx, &b, strides != NULL);
}

/* ---- movement ops ---- */

/* __unsafe_resize(arg, mask): arg and mask are 2*ndim pairs, mask may be NULL. */
static const kex_view *unsafe_resize(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg, const int64_t *mask,
                                     const char *what) {
  view_buf b;
  int n = v->ndim;
  bool ovf = false;
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = mask != NULL;
  for (int i = 0; i < n; i++) b.offset = ck_add(&ovf, b.offset, ck_mul(&ovf, v->strides[i], arg[2 * i]));
  if (mask) memcpy(b.mask, mask, 2 * (size_t)n * sizeof *mask);
  if (v->mask && n > 0) {
    for (int i = 0; i < n; i++) {
      int64_t mx = v->mask[2 * i], my = v->mask[2 * i + 1], ax = arg[2 * i], ay = arg[2 * i + 1];
      int64_t len = ck_sub(&ovf, ay, ax);
      int64_t nb = max64(0, min64(ck_sub(&ovf, mx, ax), len)), ne = max64(0, min64(ck_sub(&ovf, my, ax), len));
      if (mask) {
        b.mask[2 * i] = max64(nb, mask[2 * i]);
        b.mask[2 * i + 1] = min64(ne, mask[2 * i + 1]);
      } else {
        b.mask[2 * i] = nb;
        b.mask[2 * i + 1] = ne;
      }
    }
    b.has_mask = true;
  }
  for (int i = 0; i < n; i++) b.shape[i] = ck_sub(&ovf, arg[2 * i + 1], arg[2 * i]);
  if (n) memcpy(b.strides, v->strides, (size_t)n * sizeof(int64_t));
  if (ovf) {
    overflow(ctx, what, n, v->shape);
    return NULL;
  }
  return create_buf(ctx, &b, true);
}

/* The pairs of a pad or shrink as text, for messages. */
static const char *pairs_str(char *buf, size_t len, int n, const int64_t *arg) {
  size_t off = 0;
  for (int i = 0; i < n && off < len; i++) {
    int k = snprintf(buf + off, len - off, "%s(%lld, %lld)", i ? ", " : "", (long long)arg[2 * i],
                     (long long)arg[2 * i + 1]);
    if (k < 0) break;
    off += (size_t)k;
  }
  if (!n && len) buf[0] = 0;
  return buf;
}

const kex_view *kex_view_pad(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg) {
  int n = v->ndim;
  bool any = false, ovf = false;
  char ab[256];
  for (int i = 0; i < 2 * n; i++) {
    if (arg[i] < 0) {
      kex__shape_fail(ctx, KEX_EINVAL, "View.pad: pad %s has a negative amount", pairs_str(ab, sizeof ab, n, arg));
      return NULL;
    }
    if (arg[i]) any = true;
  }
  if (!any) return v;
  int64_t zv[2 * KEX_MAX_DIMS], mask[2 * KEX_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    zv[2 * i] = -arg[2 * i]; /* arg >= 0: no overflow */
    zv[2 * i + 1] = ck_add(&ovf, v->shape[i], arg[2 * i + 1]);
    mask[2 * i] = arg[2 * i];
    mask[2 * i + 1] = ck_add(&ovf, v->shape[i], arg[2 * i]);
  }
  if (ovf) {
    overflow(ctx, "View.pad", n, v->shape);
    return NULL;
  }
  return unsafe_resize(ctx, v, zv, mask, "View.pad");
}

const kex_view *kex_view_shrink(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg) {
  char ab[256], sb[128];
  for (int i = 0; i < v->ndim; i++)
    if (arg[2 * i] < 0 || arg[2 * i] > arg[2 * i + 1] || arg[2 * i + 1] > v->shape[i]) {
      kex__shape_fail(ctx, KEX_EINVAL, "View.shrink: %s is out of range for shape %s",
                      pairs_str(ab, sizeof ab, v->ndim, arg), kex_tuple_repr(sb, sizeof sb, v->ndim, v->shape));
      return NULL;
    }
  return unsafe_resize(ctx, v, arg, NULL, "View.shrink");
}

const kex_view *kex_view_expand(kex_shape_ctx *ctx, const kex_view *v, const int64_t *new_shape) {
  int n = v->ndim;
  for (int i = 0; i < n; i++)
    if (v->shape[i] == 0) return kex_view_create(ctx, n, new_shape, NULL, 0, NULL);
  view_buf b;
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = v->mask != NULL && n > 0;
  if (n) {
    memcpy(b.shape, new_shape, (size_t)n * sizeof *new_shape);
    memcpy(b.strides, v->strides, (size_t)n * sizeof *new_shape);
  }
  if (b.has_mask) {
    for (int i = 0; i < n; i++) {
      int64_t mb = v->mask[2 * i], me = v->mask[2 * i + 1];
      if (v->shape[i] != new_shape[i]) {
        bool unit = mb == 0 && me == 1;
        mb = 0;
        me = unit ? new_shape[i] : 0;
      }
      b.mask[2 * i] = mb;
      b.mask[2 * i + 1] = me;
    }
  }
  return create_buf(ctx, &b, true);
}

const kex_view *kex_view_permute(kex_shape_ctx *ctx, const kex_view *v, const int *order) {
  view_buf b;
  int n = v->ndim;
  uint32_t seen = 0;
  for (int i = 0; i < n; i++) {
    if (order[i] < 0 || order[i] >= n || (seen >> order[i] & 1)) {
      kex__shape_fail(ctx, KEX_EINVAL, "View.permute: the order is not a permutation of 0..%d", n - 1);
      return NULL;
    }
    seen |= 1u << order[i];
  }
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = v->mask != NULL;
  for (int i = 0; i < n; i++) {
    b.shape[i] = v->shape[order[i]];
    b.strides[i] = v->strides[order[i]];
    if (v->mask) {
      b.mask[2 * i] = v->mask[2 * order[i]];
      b.mask[2 * i + 1] = v->mask[2 * order[i] + 1];
    }
  }
  return create_buf(ctx, &b, true);
}

/*
 * View.stride(mul).  A stride of INT64_MIN has no int64 magnitude and is
 * refused (KEX_ELIMIT); a dim that ends up of size 1 gets stride 0 without
 * forming stride * mul, exactly as View.create would canonicalise it.
 */
const kex_view *kex_view_stride(kex_shape_ctx *ctx, const kex_view *v, const int64_t *mul) {
  view_buf b;
  int n = v->ndim;
  bool ovf = false;
  char sb[128];
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = v->mask != NULL;
  for (int i = 0; i < n; i++) {
    int64_t m = mul[i];
    if (m == 0 || m == INT64_MIN) {
      kex__shape_fail(ctx, m ? KEX_ELIMIT : KEX_EINVAL, "View.stride: stride %lld of dim %d (shape %s) is %s",
                      (long long)m, i, kex_tuple_repr(sb, sizeof sb, n, v->shape), m ? "out of the int64 range" : "0");
      return NULL;
    }
    int64_t am = m < 0 ? -m : m, s = v->shape[i];
    b.shape[i] = ceil_div(&ovf, s, am);
    b.strides[i] = b.shape[i] == 1 ? 0 : ck_mul(&ovf, v->strides[i], m);
    if (m < 0) b.offset = ck_add(&ovf, b.offset, ck_mul(&ovf, ck_sub(&ovf, s, 1), v->strides[i]));
    if (v->mask) {
      int64_t mx = v->mask[2 * i], my = v->mask[2 * i + 1];
      b.mask[2 * i] = ceil_div(&ovf, m > 0 ? mx : ck_sub(&ovf, s, my), am);
      b.mask[2 * i + 1] = ceil_div(&ovf, m > 0 ? my : ck_sub(&ovf, s, mx), am);
    }
  }
  if (ovf) {
    overflow(ctx, "View.stride", n, v->shape);
    return NULL;
  }
  return create_buf(ctx, &b, true);
}

/* ---- reshape ---- */

typedef struct merged_dim {
  int64_t size, stride, real;
} merged_dim;

/* _merge_dims(shape, strides, mask); returns the number of merged dims (*ovf set on overflow). */
static int merge_dims(bool *ovf, const kex_view *v, merged_dim *ret) {
  int n = v->ndim, m = 0;
  if (n == 0) return 0;
  const int64_t *sh = v->shape, *st = v->strides, *mk = v->mask;
  ret[0] = (merged_dim){sh[0], st[0], st[0] ? sh[0] : 0};
  m = 1;
  bool merging = st[0] == 0 && (mk ? ck_sub(ovf, mk[1], mk[0]) == 1 : sh[0] == 1);
  for (int i = 1; i < n; i++) {
    if (sh[i] == 1) continue;
    int64_t prod;
    bool fits = !__builtin_mul_overflow(sh[i], st[i], &prod); /* a product past int64 equals no stride */
    if (merging || (fits && ret[m - 1].stride == prod)) {
      merged_dim *r = &ret[m - 1];
      int64_t real = st[i] ? (merging ? sh[i] : ck_mul(ovf, r->real, sh[i])) : 0;
      *r = (merged_dim){ck_mul(ovf, r->size, sh[i]), st[i], real};
    } else ret[m++] = (merged_dim){sh[i], st[i], st[i] ? sh[i] : 0};
    merging = st[i] == 0 && (mk ? ck_sub(ovf, mk[2 * i + 1], mk[2 * i]) == 1 : sh[i] == 1);
  }
  return m;
}

/*
 * _reshape_mask(view, new_shape) for a masked view: fills out (2*nn) and
 * returns true, or returns false for extra=True (cannot reshape the mask).
 * On overflow *ovf is set (and the result is meaningless).
 */
static bool reshape_mask(bool *ovf, const kex_view *v, int nn, const int64_t *ns, int64_t *out) {
  int ro = v->ndim - 1, rn = nn - 1, rm = v->ndim - 1; /* reversed iterators: next index */
#define NEXT_SHAPE() (ro >= 0 ? v->shape[ro--] : 1)
#define NEXT_NEW() (rn >= 0 ? ns[rn--] : 1)
#define NEXT_MASK(l_, r_)        \
  do {                           \
    if (rm >= 0) {               \
      (l_) = v->mask[2 * rm];    \
      (r_) = v->mask[2 * rm + 1]; \
      rm--;                      \
    } else {                     \
      (l_) = 0;                  \
      (r_) = 1;                  \
    }                            \
  } while (0)
  int64_t nm[2 * KEX_MAX_DIMS];
  int cnt = 0;
  int64_t curr_stride = 1, old_dim = NEXT_SHAPE(), new_dim = NEXT_NEW(), ml, mr;
  NEXT_MASK(ml, mr);
  if (ck_sub(ovf, mr, ml) < 1) goto empty;
  while (cnt < nn && !*ovf) {
    int64_t l = ml, r = mr, next_stride = ck_mul(ovf, new_dim, curr_stride);
    if (next_stride <= 0) { /* a 0 dim: View.reshape refused the size change before this */
      *ovf = true;
      break;
    }
    if (old_dim >= next_stride) {
      if (old_dim == next_stride) {
        nm[2 * cnt] = py_div(ovf, l, curr_stride);
        nm[2 * cnt + 1] = ck_add(ovf, py_div(ovf, ck_sub(ovf, r, 1), curr_stride), 1);
        cnt++;
        curr_stride = 1;
        old_dim = NEXT_SHAPE();
        new_dim = NEXT_NEW();
        NEXT_MASK(ml, mr);
        if (ck_sub(ovf, mr, ml) < 1) goto empty;
      } else {
        int64_t lq = py_div(ovf, l, next_stride), rq = py_div(ovf, r, next_stride);
        int64_t lm = ck_sub(ovf, l, ck_mul(ovf, lq, next_stride)), rmod = ck_sub(ovf, r, ck_mul(ovf, rq, next_stride));
        int64_t r1 = ck_sub(ovf, r, 1), r1q = py_div(ovf, r1, next_stride);
        if (((lm != 0 || rmod != 0) && lq != r1q) || old_dim % next_stride != 0) return false;
        int64_t r1m = ck_sub(ovf, r1, ck_mul(ovf, r1q, next_stride));
        nm[2 * cnt] = py_div(ovf, lm, curr_stride);
        nm[2 * cnt + 1] = ck_add(ovf, py_div(ovf, r1m, curr_stride), 1);
        cnt++;
        curr_stride = next_stride;
        new_dim = NEXT_NEW();
      }
    } else {
      int64_t nl, nr;
      NEXT_MASK(nl, nr);
      if (!(l == 0 && r == old_dim) && ck_sub(ovf, nr, nl) != 1) return false;
      ml = ck_add(ovf, ck_mul(ovf, nl, old_dim), l);
      mr = ck_add(ovf, ck_mul(ovf, ck_sub(ovf, nr, 1), old_dim), r);
      old_dim = ck_mul(ovf, old_dim, NEXT_SHAPE());
    }
  }
  while (rm >= 0) {
    if (!(v->mask[2 * rm] == 0 && v->mask[2 * rm + 1] == 1)) goto empty;
    rm--;
  }
  for (int i = 0; i < nn; i++) {
    out[2 * i] = nm[2 * (nn - 1 - i)];
    out[2 * i + 1] = nm[2 * (nn - 1 - i) + 1];
  }
  return true;
empty:
  for (int i = 0; i < 2 * nn; i++) out[i] = 0;
  return true;
#undef NEXT_SHAPE
#undef NEXT_NEW
#undef NEXT_MASK
}

/* The body of View.reshape past the trivial cases: 0, 1 (None), KEX_ENOMEM or KEX_ELIMIT. */
static int reshape_slow(kex_shape_ctx *ctx, const kex_view *v, int nn, const int64_t *ns, const kex_view **out) {
  merged_dim md[KEX_MAX_DIMS];
  bool ovf = false;
  int m = merge_dims(&ovf, v, md);
  int64_t strides[KEX_MAX_DIMS];
  int ns_cnt = 0, rn = nn - 1;
  for (int k = m - 1; k >= 0 && !ovf; k--) {
    int64_t merged = md[k].size, new_stride = md[k].stride, real = md[k].real, acc = 1;
    while (acc <= merged && acc != merged && !ovf) {
      if (rn < 0) break;
      int64_t new_dim = ns[rn--];
      if (!new_dim) break;
      strides[ns_cnt++] = new_stride;
      if (new_dim != 1) {
        acc = ck_mul(&ovf, acc, new_dim);
        new_stride = ck_mul(&ovf, new_stride, acc < real ? new_dim : 0);
      }
    }
    if (!ovf && acc != merged) return 1;
  }
  if (ovf) return overflow(ctx, "View.reshape", v->ndim, v->shape);
  while (ns_cnt < nn) strides[ns_cnt++] = 0;
  view_buf b;
  b.ndim = nn;
  b.has_mask = v->mask != NULL;
  if (nn) memcpy(b.shape, ns, (size_t)nn * sizeof *ns);
  if (v->mask) {
    bool ok = reshape_mask(&ovf, v, nn, ns, b.mask);
    if (ovf) return overflow(ctx, "View.reshape (mask)", v->ndim, v->shape);
    if (!ok) return 1;
  }
  for (int i = 0; i < nn; i++) {
    int64_t ext = b.has_mask ? ck_sub(&ovf, b.mask[2 * i + 1], b.mask[2 * i]) : ns[i];
    int64_t s = strides[nn - 1 - i];
    b.strides[i] = ext == 1 ? 0 : s;
  }
  int64_t extra = 0;
  if (v->mask)
    for (int i = 0; i < v->ndim; i++) extra = ck_add(&ovf, extra, ck_mul(&ovf, v->mask[2 * i], v->strides[i]));
  if (b.has_mask)
    for (int i = 0; i < nn; i++) extra = ck_sub(&ovf, extra, ck_mul(&ovf, b.mask[2 * i], b.strides[i]));
  b.offset = ck_add(&ovf, v->offset, extra);
  if (ovf) return overflow(ctx, "View.reshape", v->ndim, v->shape);
  *out = create_buf(ctx, &b, true);
  return *out ? 0 : kex__shape_fail_code(ctx);
}

/*
 * View.reshape, with the checks tinygrad asserts on: no negative dim, a
 * 0-size view only to a 0-size shape, and the same number of elements
 * (KEX_EINVAL, error set).
 */
int kex_view_reshape(kex_shape_ctx *ctx, const kex_view *v, int ndim, const int64_t *new_shape, const kex_view **out) {
  if (shape_eq(v->ndim, v->shape, ndim, new_shape)) {
    *out = v;
    return 0;
  }
  const kex_view *key = kex_view_create(ctx, ndim, new_shape, NULL, 0, NULL);
  if (!key) return kex__shape_fail_code(ctx);
  for (int i = 0; i < v->ndim; i++) {
    if (v->shape[i] == 0) {
      if (kex_view_size(key) != 0) goto mismatch;
      *out = key;
      return 0;
    }
  }
  if (kex_view_size(key) != kex_view_size(v)) goto mismatch;
  if (ndim == 0 && v->mask) {
    for (int i = 0; i < v->ndim; i++)
      if (v->mask[2 * i] == v->mask[2 * i + 1]) return 1;
  }
  if (v->contiguous) {
    *out = key;
    return 0;
  }
  const void *val;
  if (kex__memo_get(&ctx->memo, KEX__MEMO_VIEW_RESHAPE, v, key, &val)) {
    if (val == KEX__MEMO_NONE) return 1;
    *out = val;
    return 0;
  }
  const kex_view *r = NULL;
  int rc = reshape_slow(ctx, v, ndim, new_shape, &r);
  if (rc < 0) return rc;
  (void)kex__memo_put(&ctx->memo, KEX__MEMO_VIEW_RESHAPE, v, key, rc ? KEX__MEMO_NONE : (const void *)r);
  if (rc == 0) *out = r;
  return rc;
mismatch: {
  char sa[128], sb[128];
  return kex__shape_fail(ctx, KEX_EINVAL, "View.reshape: size mismatch, cannot reshape %s to %s",
                         kex_tuple_repr(sa, sizeof sa, v->ndim, v->shape), kex_tuple_repr(sb, sizeof sb, ndim, new_shape));
}
}

/* ---- View.__add__ ---- */

/* un1d(shape, offs): row-major digits (size-1 dims get 0).  *ovf set on overflow. */
static void un1d(bool *ovf, int n, const int64_t *shape, int64_t offs, int64_t *out) {
  int64_t st[KEX_MAX_DIMS];
  if (!kex__strides_for_shape(n, shape, st)) *ovf = true;
  for (int i = 0; i < n; i++) {
    int64_t here = st[i] ? py_div(ovf, offs, st[i]) : 0;
    out[i] = here;
    offs = ck_sub(ovf, offs, ck_mul(ovf, here, st[i]));
  }
}

static int view_add_depth(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out,
                          int depth);

/* Bounds of sum(idx_d1 * coeff[d1]) + cst with idx_d1 in [0, shape1[d1]-1]. */
static void linear_bounds(bool *ovf, int n1, const int64_t *shape1, const int64_t *coeff, int64_t cst, int64_t *lo,
                          int64_t *hi) {
  *lo = *hi = cst;
  for (int d = 0; d < n1; d++) {
    if (shape1[d] <= 1 || coeff[d] == 0) continue;
    int64_t x = ck_mul(ovf, coeff[d], shape1[d] - 1);
    if (x > 0) *hi = ck_add(ovf, *hi, x);
    else *lo = ck_add(ovf, *lo, x);
  }
}

/* View.__add__ past the trivial and memoised cases. */
static int view_add_slow(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out,
                         int depth) {
  int n1 = vm1->ndim, n2 = vm2->ndim, rc;
  bool ovf = false;
  if (vm1->contiguous && kex_view_size(vm1) == kex_view_size(vm2)) {
    rc = kex_view_reshape(ctx, vm2, n1, vm1->shape, out);
    if (rc <= 0) return rc;
  }
  if (vm1->mask) {
    for (int i = 0; i < n1; i++) {
      if (vm1->mask[2 * i] >= vm1->mask[2 * i + 1]) {
        int64_t z[KEX_MAX_DIMS] = {0}, zm[2 * KEX_MAX_DIMS] = {0};
        *out = kex_view_create(ctx, n1, vm1->shape, z, 0, zm);
        return *out ? 0 : kex__shape_fail_code(ctx);
      }
    }
    const kex_view *shrunk = kex_view_shrink(ctx, vm1, vm1->mask), *merged;
    if (!shrunk) return kex__shape_fail_code(ctx);
    rc = view_add_depth(ctx, vm2, shrunk, &merged, depth + 1);
    if (rc) return rc;
    int64_t arg[2 * KEX_MAX_DIMS];
    for (int i = 0; i < n1; i++) {
      arg[2 * i] = vm1->mask[2 * i];
      arg[2 * i + 1] = ck_sub(&ovf, vm1->shape[i], vm1->mask[2 * i + 1]);
    }
    if (ovf) return overflow(ctx, "View.__add__", n1, vm1->shape);
    *out = kex_view_pad(ctx, merged, arg);
    return *out ? 0 : kex__shape_fail_code(ctx);
  }

  /* project vm1's offset and strides onto vm2 (the strides only matter if the merge succeeds: sovf) */
  bool sovf = false;
  int64_t origin[KEX_MAX_DIMS], step[KEX_MAX_DIMS], strides[KEX_MAX_DIMS] = {0};
  int term_d1[KEX_MAX_DIMS][KEX_MAX_DIMS];
  int64_t term_s1[KEX_MAX_DIMS][KEX_MAX_DIMS];
  int nterms[KEX_MAX_DIMS] = {0};
  un1d(&ovf, n2, vm2->shape, vm1->offset, origin);
  for (int d1 = 0; d1 < n1; d1++) {
    if (vm1->strides[d1] == 0) continue;
    un1d(&ovf, n2, vm2->shape, ck_add(&ovf, vm1->offset, vm1->strides[d1]), step);
    for (int d2 = 0; d2 < n2; d2++) {
      int64_t s1 = ck_sub(&ovf, step[d2], origin[d2]);
      if (s1 == 0) continue;
      term_d1[d2][nterms[d2]] = d1;
      term_s1[d2][nterms[d2]] = s1;
      nterms[d2]++;
      strides[d1] = ck_add(&sovf, strides[d1], ck_mul(&sovf, s1, vm2->strides[d2]));
    }
  }
  if (ovf) return overflow(ctx, "View.__add__", n2, vm2->shape);

  /* merge dimensions of vm2 where needed */
  int64_t coeff[KEX_MAX_DIMS] = {0}, cst = 0, msize = 1, lo, hi;
  int64_t ext_size[KEX_MAX_DIMS], ext_lo[KEX_MAX_DIMS], ext_hi[KEX_MAX_DIMS];
  int next = 0;
  for (int d2 = n2 - 1; d2 >= 0; d2--) {
    for (int t = 0; t < nterms[d2]; t++)
      coeff[term_d1[d2][t]] = ck_add(&ovf, coeff[term_d1[d2][t]], ck_mul(&ovf, term_s1[d2][t], msize));
    cst = ck_add(&ovf, cst, ck_mul(&ovf, origin[d2], msize));
    msize = ck_mul(&ovf, msize, vm2->shape[d2]);
    linear_bounds(&ovf, n1, vm1->shape, coeff, cst, &lo, &hi);
    if (hi < msize && lo >= 0) {
      ext_size[next] = msize;
      ext_lo[next] = lo;
      ext_hi[next] = hi;
      next++;
      msize = 1;
      cst = 0;
      memset(coeff, 0, sizeof coeff);
    }
  }
  linear_bounds(&ovf, n1, vm1->shape, coeff, cst, &lo, &hi);
  if (ovf) return overflow(ctx, "View.__add__", n2, vm2->shape);
  if (lo != 0 || hi != 0) return 1;
  int64_t shp[KEX_MAX_DIMS];
  for (int i = 0; i < next; i++) shp[i] = ext_size[next - 1 - i];
  if (!shape_eq(next, shp, n2, vm2->shape)) {
    const kex_view *r;
    rc = kex_view_reshape(ctx, vm2, next, shp, &r);
    if (rc) return rc;
    return view_add_depth(ctx, r, vm1, out, depth + 1);
  }

  if (vm2->mask) {
    /* project vm2's mask onto vm1's dims */
    int64_t newm[2 * KEX_MAX_DIMS];
    bool bad = false;
    for (int d1 = 0; d1 < n1; d1++) {
      newm[2 * d1] = 0;
      newm[2 * d1 + 1] = vm1->shape[d1];
    }
    for (int d2 = 0; d2 < n2; d2++) {
      int64_t b = vm2->mask[2 * d2], e = vm2->mask[2 * d2 + 1], o = origin[d2];
      int64_t tmin = ext_lo[next - 1 - d2], tmax = ext_hi[next - 1 - d2];
      if (!(tmin < b || tmax >= e)) continue;
      if (nterms[d2] != 1) {
        if (nterms[d2] == 0 && n1 > 0) newm[1] = 0;
        else bad = true;
        continue;
      }
      int d1 = term_d1[d2][0];
      int64_t s1 = term_s1[d2][0];
      int64_t bo = ck_sub(&ovf, b, o), eo1 = ck_sub(&ovf, ck_sub(&ovf, e, o), 1);
      newm[2 * d1] = max64(newm[2 * d1], ceil_div(&ovf, s1 > 0 ? bo : eo1, s1));
      newm[2 * d1 + 1] = min64(newm[2 * d1 + 1], ck_add(&ovf, py_div(&ovf, s1 < 0 ? bo : eo1, s1), 1));
    }
    if (ovf) return overflow(ctx, "View.__add__ (mask)", n2, vm2->shape);
    for (int d1 = 0; d1 < n1; d1++) {
      if (newm[2 * d1] != 0 || newm[2 * d1 + 1] != vm1->shape[d1]) {
        const kex_view *mv = kex_view_create(ctx, n1, vm1->shape, vm1->strides, vm1->offset, newm);
        if (!mv) return kex__shape_fail_code(ctx);
        return view_add_depth(ctx, vm2, mv, out, depth + 1);
      }
    }
    if (bad) return 1;
  }
  int64_t off = vm2->offset;
  for (int d2 = 0; d2 < n2; d2++) off = ck_add(&ovf, off, ck_mul(&ovf, origin[d2], vm2->strides[d2]));
  if (ovf || sovf) return overflow(ctx, "View.__add__", n2, vm2->shape);
  *out = kex_view_create(ctx, n1, vm1->shape, strides, off, NULL);
  return *out ? 0 : kex__shape_fail_code(ctx);
}

static int view_add_depth(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out,
                          int depth) {
  if (vm2->contiguous) {
    *out = vm1;
    return 0;
  }
  if (vm1->contiguous && shape_eq(vm1->ndim, vm1->shape, vm2->ndim, vm2->shape)) {
    *out = vm2;
    return 0;
  }
  const void *val;
  if (kex__memo_get(&ctx->memo, KEX__MEMO_VIEW_ADD, vm2, vm1, &val)) {
    if (val == KEX__MEMO_NONE) return 1;
    *out = val;
    return 0;
  }
  if (depth > VIEW_ADD_MAX_DEPTH) return 1;
  const kex_view *r = NULL;
  int rc = view_add_slow(ctx, vm2, vm1, &r, depth);
  if (rc < 0) return rc;
  (void)kex__memo_put(&ctx->memo, KEX__MEMO_VIEW_ADD, vm2, vm1, rc ? KEX__MEMO_NONE : (const void *)r);
  if (rc == 0) *out = r;
  return rc;
}

int kex_view_add(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out) {
  return view_add_depth(ctx, vm2, vm1, out, 0);
}

/* ---- invert, minify ---- */

int kex_view_invert(kex_shape_ctx *ctx, const kex_view *v, int ndim, const int64_t *out_shape, const kex_view **out) {
  int n = v->ndim;
  bool ovf = false;
  const kex_view *r = kex_view_create(ctx, n, v->shape, NULL, 0, NULL);
  if (r && v->mask) r = kex_view_shrink(ctx, r, v->mask);
  if (!r) return kex__shape_fail_code(ctx);
  int64_t mul[KEX_MAX_DIMS], key[KEX_MAX_DIMS];
  int order[KEX_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    mul[i] = v->strides[i] < 0 ? -1 : 1;
    key[i] = v->strides[i] > 0 ? -v->strides[i] : v->strides[i];
    order[i] = i;
  }
  for (int i = 1; i < n; i++) { /* stable insertion sort = Python's sorted */
    int x = order[i], j = i - 1;
    while (j >= 0 && key[order[j]] > key[x]) {
      order[j + 1] = order[j];
      j--;
    }
    order[j + 1] = x;
  }
  r = kex_view_stride(ctx, r, mul);
  if (r) r = kex_view_permute(ctx, r, order);
  if (!r) return kex__shape_fail_code(ctx);
  int64_t p = shape_size(&ovf, ndim, out_shape);
  if (ovf) return overflow(ctx, "View.invert", ndim, out_shape);
  if (kex_view_size(r) != p) return 1;
  *out = r;
  return 0;
}

const kex_view *kex_view_minify(kex_shape_ctx *ctx, const kex_view *v) {
  merged_dim md[KEX_MAX_DIMS];
  bool ovf = false;
  int m = merge_dims(&ovf, v, md);
  if (ovf) {
    overflow(ctx, "View.minify", v->ndim, v->shape);
    return NULL;
  }
  int64_t sizes[KEX_MAX_DIMS];
  for (int i = 0; i < m; i++) sizes[i] = md[i].size;
  const kex_view *nv = NULL;
  int rc = kex_view_reshape(ctx, v, m, sizes, &nv);
  if (rc < 0) return NULL;
  return rc == 0 ? nv : v;
}

/* ---- repr ---- */

typedef struct sbuf {
  char *buf;
  size_t len, pos;
} sbuf;

static void sb_put(sbuf *s, const char *t, size_t n) { kex_cut_put(s->buf, s->len, &s->pos, t, n); }
#define SB_LIT(s, lit) sb_put((s), (lit), sizeof(lit) - 1)

static void sb_i64(sbuf *s, long long v) {
  char t[KEX_I64_TEXT_MAX];
  sb_put(s, t, (size_t)kex_i64_text(v, t));
}

static void sb_tuple(sbuf *s, int n, const int64_t *v, int step) {
  SB_LIT(s, "(");
  for (int i = 0; i < n; i++) {
    if (i) SB_LIT(s, ", ");
    sb_i64(s, (long long)v[i * step]);
  }
  if (n == 1) SB_LIT(s, ",)");
  else SB_LIT(s, ")");
}

/* tinygrad's View repr; appended piece by piece, not through printf (a Plan reply renders one per AST node) */
static void view_repr_sb(sbuf *s, const kex_view *v) {
  SB_LIT(s, "View(shape=");
  sb_tuple(s, v->ndim, v->shape, 1);
  SB_LIT(s, ", strides=");
  sb_tuple(s, v->ndim, v->strides, 1);
  SB_LIT(s, ", offset=");
  sb_i64(s, (long long)v->offset);
  SB_LIT(s, ", mask=");
  if (!v->mask) SB_LIT(s, "None");
  else {
    SB_LIT(s, "(");
    for (int i = 0; i < v->ndim; i++) {
      if (i) SB_LIT(s, ", ");
      SB_LIT(s, "(");
      sb_i64(s, (long long)v->mask[2 * i]);
      SB_LIT(s, ", ");
      sb_i64(s, (long long)v->mask[2 * i + 1]);
      SB_LIT(s, ")");
    }
    if (v->ndim == 1) SB_LIT(s, ",)");
    else SB_LIT(s, ")");
  }
  if (v->contiguous) SB_LIT(s, ", contiguous=True)");
  else SB_LIT(s, ", contiguous=False)");
}

int kex_view_repr(const kex_view *v, char *buf, size_t len) {
  sbuf s = {buf, len, 0};
  if (len) buf[0] = 0;
  view_repr_sb(&s, v);
  return (int)s.pos;
}

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
 * Every function returning a view returns NULL only when out of memory; the
 * int-returning ones give 0 (result in *out), 1 (tinygrad's None) or
 * KEX_ENOMEM.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/hash.h"
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

static int64_t py_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

static int64_t ceil_div(int64_t a, int64_t b) { return -py_div(-a, b); }

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- tables ---- */

int kex__ptab_reserve(kex__ptab *t) {
  if ((t->count + 1) * 10 < t->cap * 7) return 0;
  size_t ncap = t->cap ? t->cap * 2 : 256;
  const void **ns = kex_calloc(ncap, sizeof *ns);
  if (!ns) return KEX_ENOMEM;
  for (size_t i = 0; i < t->cap; i++) {
    const void *e = t->slots[i];
    if (!e) continue;
    size_t j = (size_t)(*(const uint64_t *)e) & (ncap - 1);
    while (ns[j]) j = (j + 1) & (ncap - 1);
    ns[j] = e;
  }
  kex_free(t->slots);
  t->slots = ns;
  t->cap = ncap;
  return 0;
}

static uint64_t memo_hash(uint32_t op, const void *a, const void *b) {
  return kex_hash_mix(kex_hash_u64((uint64_t)(uintptr_t)a, op), (uint64_t)(uintptr_t)b);
}

bool kex__memo_get(const kex__memo *m, uint32_t op, const void *a, const void *b, const void **val) {
  if (!m->cap) return false;
  size_t mask = m->cap - 1;
  for (size_t i = (size_t)memo_hash(op, a, b) & mask;; i = (i + 1) & mask) {
    const kex__memo_ent *e = &m->slots[i];
    if (!e->op) return false;
    if (e->op == op && e->a == a && e->b == b) {
      *val = e->val;
      return true;
    }
  }
}

int kex__memo_put(kex__memo *m, uint32_t op, const void *a, const void *b, const void *val) {
  if ((m->count + 1) * 10 >= m->cap * 7) {
    size_t ncap = m->cap ? m->cap * 2 : 256;
    kex__memo_ent *ns = kex_calloc(ncap, sizeof *ns);
    if (!ns) return KEX_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
      kex__memo_ent *e = &m->slots[i];
      if (!e->op) continue;
      size_t j = (size_t)memo_hash(e->op, e->a, e->b) & (ncap - 1);
      while (ns[j].op) j = (j + 1) & (ncap - 1);
      ns[j] = *e;
    }
    kex_free(m->slots);
    m->slots = ns;
    m->cap = ncap;
  }
  size_t mask = m->cap - 1;
  for (size_t i = (size_t)memo_hash(op, a, b) & mask;; i = (i + 1) & mask) {
    kex__memo_ent *e = &m->slots[i];
    if (!e->op) {
      e->op = op;
      e->a = a;
      e->b = b;
      e->val = val;
      m->count++;
      return 0;
    }
    if (e->op == op && e->a == a && e->b == b) {
      e->val = val;
      return 0;
    }
  }
}

/* ---- context ---- */

kex_shape_ctx *kex_shape_ctx_new(kex_arena *arena) {
  kex_shape_ctx *ctx = kex_calloc(1, sizeof *ctx);
  if (!ctx) return NULL;
  ctx->arena = arena;
  kex_sym_ctx_init(&ctx->sym, arena);
  return ctx;
}

void kex_shape_ctx_free(kex_shape_ctx *ctx) {
  if (!ctx) return;
  kex_free(ctx->views.slots);
  kex_free(ctx->sts.slots);
  kex_free(ctx->memo.slots);
  kex_free(ctx);
}

kex_sym_ctx *kex_shape_sym(kex_shape_ctx *ctx) { return &ctx->sym; }

/* ---- helpers ---- */

void kex__strides_for_shape(int ndim, const int64_t *shape, int64_t *out) {
  int64_t acc = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    out[i] = shape[i] == 1 ? 0 : acc;
    acc *= shape[i];
  }
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

/* Intern an already canonical buffer.  NULL on OOM. */
static const kex_view *intern_view(kex_shape_ctx *ctx, const view_buf *b, bool contiguous) {
  if (kex__ptab_reserve(&ctx->views)) return NULL;
  uint64_t h = view_buf_hash(b);
  kex__ptab *t = &ctx->views;
  size_t mask = t->cap - 1, i;
  for (i = (size_t)h & mask; t->slots[i]; i = (i + 1) & mask) {
    const kex_view *v = t->slots[i];
    if (v->hash == h && view_buf_eq(b, v)) return v;
  }
  size_t n = (size_t)b->ndim;
  size_t words = 2 * n + (b->has_mask ? 2 * n : 0);
  kex_view *v = kex_arena_alloc(ctx->arena, sizeof *v + words * sizeof(int64_t));
  if (!v) return NULL;
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
  v->size = 1;
  for (size_t k = 0; k < n; k++) v->size *= b->shape[k];
  t->slots[i] = v;
  t->count++;
  return v;
}

/*
 * View.create on a buffer: b->strides holds the requested strides when
 * have_strides, else is ignored.  The buffer is modified.  NULL on OOM.
 */
static const kex_view *create_buf(kex_shape_ctx *ctx, view_buf *b, bool have_strides) {
  int n = b->ndim;
  int64_t sfs[KEX_MAX_DIMS];
  kex__strides_for_shape(n, b->shape, sfs);
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
      if (!(b->mask[2 * i] + 1 < b->mask[2 * i + 1])) any_elim = true;
      if (!(b->mask[2 * i] < b->mask[2 * i + 1])) any_empty = true;
    }
    if (any_elim) {
      if (any_empty) {
        b->offset = 0;
        for (int i = 0; i < n; i++) b->strides[i] = b->mask[2 * i] = b->mask[2 * i + 1] = 0;
      }
      for (int i = 0; i < n; i++) {
        if (!(b->mask[2 * i] + 1 < b->mask[2 * i + 1])) {
          b->offset += b->strides[i] * b->mask[2 * i];
          b->strides[i] = 0;
        }
      }
    }
  }
  return intern_view(ctx, b, contiguous);
}

const kex_view *kex_view_create(kex_shape_ctx *ctx, int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t offset, const int64_t *mask) {
  view_buf b;
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
static const kex_view *unsafe_resize(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg, const int64_t *mask) {
  view_buf b;
  int n = v->ndim;
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = mask != NULL;
  for (int i = 0; i < n; i++) b.offset += v->strides[i] * arg[2 * i];
  if (mask) memcpy(b.mask, mask, 2 * (size_t)n * sizeof *mask);
  if (v->mask && n > 0) {
    for (int i = 0; i < n; i++) {
      int64_t mx = v->mask[2 * i], my = v->mask[2 * i + 1], ax = arg[2 * i], ay = arg[2 * i + 1];
      int64_t nb = max64(0, min64(mx - ax, ay - ax)), ne = max64(0, min64(my - ax, ay - ax));
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
  for (int i = 0; i < n; i++) b.shape[i] = arg[2 * i + 1] - arg[2 * i];
  if (n) memcpy(b.strides, v->strides, (size_t)n * sizeof(int64_t));
  return create_buf(ctx, &b, true);
}

const kex_view *kex_view_pad(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg) {
  int n = v->ndim;
  bool any = false;
  for (int i = 0; i < 2 * n; i++)
    if (arg[i]) any = true;
  if (!any) return v;
  int64_t zv[2 * KEX_MAX_DIMS], mask[2 * KEX_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    zv[2 * i] = -arg[2 * i];
    zv[2 * i + 1] = v->shape[i] + arg[2 * i + 1];
    mask[2 * i] = arg[2 * i];
    mask[2 * i + 1] = v->shape[i] + arg[2 * i];
  }
  return unsafe_resize(ctx, v, zv, mask);
}

const kex_view *kex_view_shrink(kex_shape_ctx *ctx, const kex_view *v, const int64_t *arg) {
  return unsafe_resize(ctx, v, arg, NULL);
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

const kex_view *kex_view_stride(kex_shape_ctx *ctx, const kex_view *v, const int64_t *mul) {
  view_buf b;
  int n = v->ndim;
  b.ndim = n;
  b.offset = v->offset;
  b.has_mask = v->mask != NULL;
  for (int i = 0; i < n; i++) {
    int64_t m = mul[i], am = m < 0 ? -m : m, s = v->shape[i];
    b.strides[i] = v->strides[i] * m;
    b.shape[i] = py_div(s + am - 1, am);
    if (m < 0) b.offset += (s - 1) * v->strides[i];
    if (v->mask) {
      int64_t mx = v->mask[2 * i], my = v->mask[2 * i + 1];
      b.mask[2 * i] = py_div((m > 0 ? mx : s - my) + am - 1, am);
      b.mask[2 * i + 1] = py_div((m > 0 ? my : s - mx) + am - 1, am);
    }
  }
  return create_buf(ctx, &b, true);
}

/* ---- reshape ---- */

typedef struct merged_dim {
  int64_t size, stride, real;
} merged_dim;

/* _merge_dims(shape, strides, mask); returns the number of merged dims. */
static int merge_dims(const kex_view *v, merged_dim *ret) {
  int n = v->ndim, m = 0;
  if (n == 0) return 0;
  const int64_t *sh = v->shape, *st = v->strides, *mk = v->mask;
  ret[0] = (merged_dim){sh[0], st[0], st[0] ? sh[0] : 0};
  m = 1;
  bool merging = st[0] == 0 && (mk ? mk[1] - mk[0] == 1 : sh[0] == 1);
  for (int i = 1; i < n; i++) {
    if (sh[i] == 1) continue;
    if (merging || ret[m - 1].stride == sh[i] * st[i]) {
      merged_dim *r = &ret[m - 1];
      int64_t real = st[i] ? (merging ? sh[i] : r->real * sh[i]) : 0;
      *r = (merged_dim){r->size * sh[i], st[i], real};
    } else ret[m++] = (merged_dim){sh[i], st[i], st[i] ? sh[i] : 0};
    merging = st[i] == 0 && (mk ? mk[2 * i + 1] - mk[2 * i] == 1 : sh[i] == 1);
  }
  return m;
}

/*
 * _reshape_mask(view, new_shape) for a masked view: fills out (2*nn) and
 * returns true, or returns false for extra=True (cannot reshape the mask).
 */
static bool reshape_mask(const kex_view *v, int nn, const int64_t *ns, int64_t *out) {
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
  if (mr - ml < 1) goto empty;
  while (cnt < nn) {
    int64_t l = ml, r = mr, next_stride = new_dim * curr_stride;
    if (old_dim >= next_stride) {
      if (old_dim == next_stride) {
        nm[2 * cnt] = py_div(l, curr_stride);
        nm[2 * cnt + 1] = py_div(r - 1, curr_stride) + 1;
        cnt++;
        curr_stride = 1;
        old_dim = NEXT_SHAPE();
        new_dim = NEXT_NEW();
        NEXT_MASK(ml, mr);
        if (mr - ml < 1) goto empty;
      } else {
        int64_t lm = l - py_div(l, next_stride) * next_stride, rmod = r - py_div(r, next_stride) * next_stride;
        if (((lm != 0 || rmod != 0) && py_div(l, next_stride) != py_div(r - 1, next_stride)) ||
            old_dim % next_stride != 0)
          return false;
        int64_t r1 = r - 1, r1m = r1 - py_div(r1, next_stride) * next_stride;
        nm[2 * cnt] = py_div(lm, curr_stride);
        nm[2 * cnt + 1] = py_div(r1m, curr_stride) + 1;
        cnt++;
        curr_stride = next_stride;
        new_dim = NEXT_NEW();
      }
    } else {
      int64_t nl, nr;
      NEXT_MASK(nl, nr);
      if (!(l == 0 && r == old_dim) && nr - nl != 1) return false;
      ml = nl * old_dim + l;
      mr = (nr - 1) * old_dim + r;
      old_dim = old_dim * NEXT_SHAPE();
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

/* The body of View.reshape past the trivial cases: 0, 1 (None) or KEX_ENOMEM. */
static int reshape_slow(kex_shape_ctx *ctx, const kex_view *v, int nn, const int64_t *ns, const kex_view **out) {
  merged_dim md[KEX_MAX_DIMS];
  int m = merge_dims(v, md);
  int64_t strides[KEX_MAX_DIMS];
  int ns_cnt = 0, rn = nn - 1;
  for (int k = m - 1; k >= 0; k--) {
    int64_t merged = md[k].size, new_stride = md[k].stride, real = md[k].real, acc = 1;
    while (acc <= merged && acc != merged) {
      if (rn < 0) break;
      int64_t new_dim = ns[rn--];
      if (!new_dim) break;
      strides[ns_cnt++] = new_stride;
      if (new_dim != 1) {
        acc *= new_dim;
        new_stride *= acc < real ? new_dim : 0;
      }
    }
    if (acc != merged) return 1;
  }
  while (ns_cnt < nn) strides[ns_cnt++] = 0;
  view_buf b;
  b.ndim = nn;
  b.has_mask = v->mask != NULL;
  if (nn) memcpy(b.shape, ns, (size_t)nn * sizeof *ns);
  if (v->mask && !reshape_mask(v, nn, ns, b.mask)) return 1;
  for (int i = 0; i < nn; i++) {
    int64_t ext = b.has_mask ? b.mask[2 * i + 1] - b.mask[2 * i] : ns[i];
    int64_t s = strides[nn - 1 - i];
    b.strides[i] = ext == 1 ? 0 : s;
  }
  int64_t extra = 0;
  if (v->mask)
    for (int i = 0; i < v->ndim; i++) extra += v->mask[2 * i] * v->strides[i];
  if (b.has_mask)
    for (int i = 0; i < nn; i++) extra -= b.mask[2 * i] * b.strides[i];
  b.offset = v->offset + extra;
  *out = create_buf(ctx, &b, true);
  return *out ? 0 : KEX_ENOMEM;
}

int kex_view_reshape(kex_shape_ctx *ctx, const kex_view *v, int ndim, const int64_t *new_shape, const kex_view **out) {
  if (shape_eq(v->ndim, v->shape, ndim, new_shape)) {
    *out = v;
    return 0;
  }
  const kex_view *key = kex_view_create(ctx, ndim, new_shape, NULL, 0, NULL);
  if (!key) return KEX_ENOMEM;
  for (int i = 0; i < v->ndim; i++) {
    if (v->shape[i] == 0) {
      *out = key;
      return 0;
    }
  }
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
}

/* ---- View.__add__ ---- */

/* un1d(shape, offs): row-major digits (size-1 dims get 0). */
static void un1d(int n, const int64_t *shape, int64_t offs, int64_t *out) {
  int64_t st[KEX_MAX_DIMS];
  kex__strides_for_shape(n, shape, st);
  for (int i = 0; i < n; i++) {
    int64_t here = st[i] ? py_div(offs, st[i]) : 0;
    out[i] = here;
    offs -= here * st[i];
  }
}

static int view_add_depth(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out,
                          int depth);

/* Bounds of sum(idx_d1 * coeff[d1]) + cst with idx_d1 in [0, shape1[d1]-1]. */
static void linear_bounds(int n1, const int64_t *shape1, const int64_t *coeff, int64_t cst, int64_t *lo, int64_t *hi) {
  *lo = *hi = cst;
  for (int d = 0; d < n1; d++) {
    if (shape1[d] <= 1 || coeff[d] == 0) continue;
    int64_t x = coeff[d] * (shape1[d] - 1);
    if (x > 0) *hi += x;
    else *lo += x;
  }
}

/* View.__add__ past the trivial and memoised cases. */
static int view_add_slow(kex_shape_ctx *ctx, const kex_view *vm2, const kex_view *vm1, const kex_view **out,
                         int depth) {
  int n1 = vm1->ndim, n2 = vm2->ndim, rc;
  if (vm1->contiguous && kex_view_size(vm1) == kex_view_size(vm2)) {
    rc = kex_view_reshape(ctx, vm2, n1, vm1->shape, out);
    if (rc <= 0) return rc;
  }
  if (vm1->mask) {
    for (int i = 0; i < n1; i++) {
      if (vm1->mask[2 * i] >= vm1->mask[2 * i + 1]) {
        int64_t z[KEX_MAX_DIMS] = {0}, zm[2 * KEX_MAX_DIMS] = {0};
        *out = kex_view_create(ctx, n1, vm1->shape, z, 0, zm);
        return *out ? 0 : KEX_ENOMEM;
      }
    }
    const kex_view *shrunk = kex_view_shrink(ctx, vm1, vm1->mask), *merged;
    if (!shrunk) return KEX_ENOMEM;
    rc = view_add_depth(ctx, vm2, shrunk, &merged, depth + 1);
    if (rc) return rc;
    int64_t arg[2 * KEX_MAX_DIMS];
    for (int i = 0; i < n1; i++) {
      arg[2 * i] = vm1->mask[2 * i];
      arg[2 * i + 1] = vm1->shape[i] - vm1->mask[2 * i + 1];
    }
    *out = kex_view_pad(ctx, merged, arg);
    return *out ? 0 : KEX_ENOMEM;
  }

  /* project vm1's offset and strides onto vm2 */
  int64_t origin[KEX_MAX_DIMS], step[KEX_MAX_DIMS], strides[KEX_MAX_DIMS] = {0};
  int term_d1[KEX_MAX_DIMS][KEX_MAX_DIMS];
  int64_t term_s1[KEX_MAX_DIMS][KEX_MAX_DIMS];
  int nterms[KEX_MAX_DIMS] = {0};
  un1d(n2, vm2->shape, vm1->offset, origin);
  for (int d1 = 0; d1 < n1; d1++) {
    if (vm1->strides[d1] == 0) continue;
    un1d(n2, vm2->shape, vm1->offset + vm1->strides[d1], step);
    for (int d2 = 0; d2 < n2; d2++) {
      int64_t s1 = step[d2] - origin[d2];
      if (s1 == 0) continue;
      term_d1[d2][nterms[d2]] = d1;
      term_s1[d2][nterms[d2]] = s1;
      nterms[d2]++;
      strides[d1] += s1 * vm2->strides[d2];
    }
  }

  /* merge dimensions of vm2 where needed */
  int64_t coeff[KEX_MAX_DIMS] = {0}, cst = 0, msize = 1, lo, hi;
  int64_t ext_size[KEX_MAX_DIMS], ext_lo[KEX_MAX_DIMS], ext_hi[KEX_MAX_DIMS];
  int next = 0;
  for (int d2 = n2 - 1; d2 >= 0; d2--) {
    for (int t = 0; t < nterms[d2]; t++) coeff[term_d1[d2][t]] += term_s1[d2][t] * msize;
    cst += origin[d2] * msize;
    msize *= vm2->shape[d2];
    linear_bounds(n1, vm1->shape, coeff, cst, &lo, &hi);
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
  linear_bounds(n1, vm1->shape, coeff, cst, &lo, &hi);
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
      newm[2 * d1] = max64(newm[2 * d1], ceil_div(s1 > 0 ? b - o : e - o - 1, s1));
      newm[2 * d1 + 1] = min64(newm[2 * d1 + 1], py_div(s1 < 0 ? b - o : e - o - 1, s1) + 1);
    }
    for (int d1 = 0; d1 < n1; d1++) {
      if (newm[2 * d1] != 0 || newm[2 * d1 + 1] != vm1->shape[d1]) {
        const kex_view *mv = kex_view_create(ctx, n1, vm1->shape, vm1->strides, vm1->offset, newm);
        if (!mv) return KEX_ENOMEM;
        return view_add_depth(ctx, vm2, mv, out, depth + 1);
      }
    }
    if (bad) return 1;
  }
  int64_t off = vm2->offset;
  for (int d2 = 0; d2 < n2; d2++) off += origin[d2] * vm2->strides[d2];
  *out = kex_view_create(ctx, n1, vm1->shape, strides, off, NULL);
  return *out ? 0 : KEX_ENOMEM;
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
  const kex_view *r = kex_view_create(ctx, n, v->shape, NULL, 0, NULL);
  if (r && v->mask) r = kex_view_shrink(ctx, r, v->mask);
  if (!r) return KEX_ENOMEM;
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
  if (!r) return KEX_ENOMEM;
  int64_t p = 1;
  for (int i = 0; i < ndim; i++) p *= out_shape[i];
  if (kex_view_size(r) != p) return 1;
  *out = r;
  return 0;
}

const kex_view *kex_view_minify(kex_shape_ctx *ctx, const kex_view *v) {
  merged_dim md[KEX_MAX_DIMS];
  int m = merge_dims(v, md);
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

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = s->pos < s->len ? s->len - s->pos : 0;
  int k = vsnprintf(room ? s->buf + s->pos : NULL, room, fmt, ap);
  va_end(ap);
  if (k > 0) s->pos += (size_t)k;
}

static void sb_tuple(sbuf *s, int n, const int64_t *v, int step) {
  sb_printf(s, "(");
  for (int i = 0; i < n; i++) sb_printf(s, i ? ", %lld" : "%lld", (long long)v[i * step]);
  sb_printf(s, n == 1 ? ",)" : ")");
}

static void view_repr_sb(sbuf *s, const kex_view *v) {
  sb_printf(s, "View(shape=");
  sb_tuple(s, v->ndim, v->shape, 1);
  sb_printf(s, ", strides=");
  sb_tuple(s, v->ndim, v->strides, 1);
  sb_printf(s, ", offset=%lld, mask=", (long long)v->offset);
  if (!v->mask) sb_printf(s, "None");
  else {
    sb_printf(s, "(");
    for (int i = 0; i < v->ndim; i++)
      sb_printf(s, "%s(%lld, %lld)", i ? ", " : "", (long long)v->mask[2 * i], (long long)v->mask[2 * i + 1]);
    sb_printf(s, v->ndim == 1 ? ",)" : ")");
  }
  sb_printf(s, ", contiguous=%s)", v->contiguous ? "True" : "False");
}

int kex_view_repr(const kex_view *v, char *buf, size_t len) {
  sbuf s = {buf, len, 0};
  if (len) buf[0] = 0;
  view_repr_sb(&s, v);
  return (int)s.pos;
}

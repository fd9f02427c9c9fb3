/*
 * lazy.c - replaying a client graph as tinygrad 0.9.0 LazyBuffer calls.
 *
 * Each graph node is one LazyBuffer method call (lazy.py): elementwise `e`
 * with its constant folds, `cast` with CAST_BEFORE_VIEW, `r` with the split
 * reduce, the movement methods through `_view`, `contiguous` with
 * contiguous_child, `assign` and `copy_to_device`.  Every node goes through
 * create_lazybuffer, so the lazycache returns an existing node for an
 * identical call (same device, ShapeTracker, dtype, op, arg and source
 * identities for a base; same ShapeTracker and base for a view).  All nodes
 * of a replay stay alive for its whole life (the client holds the graph), so
 * the weak references tinygrad uses are simply always live here.
 */
#include "sched/lazy.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dict.h"
#include "core/hash.h"

/* ---- the lazycache: a core/dict of kex_lb pointers, probed with an lb_key ---- */

struct kex_lazycache {
  kex_dict lbs;
  kex_dict consts; /* of const_memo: lb_const_of's results */
};

typedef struct lb_key {
  kex_lb *base;      /* non-NULL: a view key (st, base) */
  const char *device;
  const kex_st *st;
  kex_dtype dtype;
  kex_op op;
  kex_const arg;
  uint32_t axis_mask;
  uint8_t nsrc;
  kex_lb *const *srcs;
} lb_key;

static uint64_t const_hash(kex_const c) {
  switch (c.kind) {
  case KEX_CONST_INT: return (uint64_t)c.i;
  case KEX_CONST_BOOL: return c.b;
  default: {
    double f = c.f == 0.0 ? 0.0 : c.f; /* 0.0 == -0.0 in Python, same hash */
    /* 1.0 == 1: an integral f (in int64's range, where the conversion is exact; NaN fails the range test) */
    if (fabs(f) < 9e18 && (double)(int64_t)f == f) return (uint64_t)(int64_t)f;
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
  }
  }
}

/* Python equality of two const args (1 == 1.0 == True, nan != nan). */
static bool const_eq(kex_const a, kex_const b) {
  if (a.kind == KEX_CONST_FLOAT || b.kind == KEX_CONST_FLOAT) return kex_const_as_double(a) == kex_const_as_double(b);
  int64_t x = a.kind == KEX_CONST_INT ? a.i : a.b, y = b.kind == KEX_CONST_INT ? b.i : b.b;
  return x == y;
}

/* A view key's hash: its ShapeTracker and base. */
static inline uint64_t view_key_hash(const kex_st *st, const kex_lb *base) {
  return kex_hash_u64((uintptr_t)st, (uintptr_t)base);
}

static inline __attribute__((always_inline)) uint64_t key_hash(const lb_key *k) {
  if (k->base) return view_key_hash(k->st, k->base);
  uint64_t h = kex_hash_u64((uintptr_t)k->device, (uintptr_t)k->st);
  uint64_t tag = (uint64_t)k->dtype << 8 | k->op; /* with axis_mask above them: one word */
  h = k->op == KEX_OP_CONST ? kex_hash_u64(kex_hash_u64(h, tag), const_hash(k->arg))
                            : kex_hash_u64(h, tag | (uint64_t)k->axis_mask << 32);
  for (int i = 0; i < k->nsrc; i++) h = kex_hash_u64(h, (uintptr_t)k->srcs[i]);
  return h;
}

static bool key_matches(const lb_key *k, const kex_lb *lb) {
  if (k->base) return !kex_lb_is_base(lb) && lb->st == k->st && lb->base == k->base;
  if (!kex_lb_is_base(lb) || lb->device != k->device || lb->st != k->st || lb->dtype != k->dtype || lb->op != k->op ||
      lb->nsrc != k->nsrc || lb->axis_mask != k->axis_mask)
    return false;
  if (k->op == KEX_OP_CONST && !const_eq(lb->arg, k->arg)) return false;
  for (int i = 0; i < k->nsrc; i++)
    if (lb->srcs[i] != k->srcs[i]) return false;
  return true;
}

static bool lb_entry_matches(const void *entry, const void *probe) {
  return key_matches(probe, *(kex_lb *const *)entry);
}

static const kex_dict_type lazycache_type = {sizeof(kex_lb *), lb_entry_matches, 64};

/*
 * The const memo: LazyBuffer.const(val, shape) (lb_const_of) is a 0-d
 * CONST loadop, a reshape to all-1 dims and an expand, each a lazycache hit
 * once made, so its result is a function of (dtype, device, as_const(val),
 * shape) under the lazycache's equality (const_eq: NaN never equal).  The
 * memo answers repeats with one probe instead of three view operations and
 * three lazycache probes; results are the same objects.
 */
typedef struct const_memo {
  kex_lb *lb; /* dtype, device and shape are its own */
  kex_const arg;
} const_memo;

typedef struct const_probe {
  kex_dtype dtype;
  const char *device;
  kex_const arg;
  int ndim;
  const int64_t *shape;
} const_probe;

static uint64_t const_probe_hash(const const_probe *k) {
  uint64_t h = kex_hash_u64((uintptr_t)k->device, ((uint64_t)k->dtype << 8) | (uint64_t)k->ndim);
  h = kex_hash_u64(h, const_hash(k->arg));
  for (int i = 0; i < k->ndim; i++) h = kex_hash_u64(h, (uint64_t)k->shape[i]);
  return h;
}

static bool const_memo_matches(const void *entry, const void *probe) {
  const const_memo *e = entry;
  const const_probe *k = probe;
  return e->lb->dtype == k->dtype && e->lb->device == k->device && kex_lb_ndim(e->lb) == k->ndim &&
         kex_i64_eq(kex_lb_shape(e->lb), k->shape, k->ndim) && const_eq(e->arg, k->arg);
}

static const kex_dict_type const_memo_type = {sizeof(const_memo), const_memo_matches, 16};

/* ---- replay state ---- */

typedef struct replay_ctx {
  kex_replay *r;
  kex_error *err;
  int node;   /* graph node being replayed, for messages */
  int rc;     /* first failure (sticky): methods return NULL after it */
} replay_ctx;

/*
 * A view or allocation just failed: record (once) KEX_ENOMEM, or what the
 * ShapeTracker code refused (KEX_ELIMIT for int64 overflow, KEX_EINVAL),
 * naming the node.  Returns NULL for `return fail_view(c);`.
 */
static kex_lb *fail_view(replay_ctx *c) {
  const char *why = NULL;
  int code = kex_shape_error(c->r->shape, &why);
  if (!c->rc) {
    if (code)
      c->rc = kex_err_set(c->err, code, "node %d (%s): %s", c->node, kex_gop_name(c->r->graph->nodes[c->node].op), why);
    else c->rc = kex_err_set(c->err, KEX_ENOMEM, "node %d: out of memory", c->node);
  }
  return NULL;
}

/* *out = n elements of dt in bytes; false (KEX_ELIMIT recorded) when that overflows int64. */
static bool bytes_of(replay_ctx *c, int64_t n, kex_dtype dt, int64_t *out) {
  if (!__builtin_mul_overflow(n, (int64_t)kex_dtype_size(dt), out)) return true;
  if (!c->rc)
    c->rc = kex_err_set(c->err, KEX_ELIMIT, "node %d: %lld elements of %s overflow int64 bytes", c->node, (long long)n,
                        kex_dtypes[dt].name);
  return false;
}

static inline int add_buffer(kex_replay *r, const char *device, int64_t size, kex_dtype dt, int32_t view_of,
                             int64_t offset) {
  /* on the heap: a large graph's copies, as the table doubles, would stay in the arena as long as the plan */
  if (kex_grow(&r->buffers, r->nbuffers, &r->capbuffers, sizeof *r->buffers, 64)) return KEX_ENOMEM;
  r->buffers[r->nbuffers] = (kex_buffer_info){device, size, dt, view_of, offset, -1, false};
  return (int)r->nbuffers++;
}

static bool same_shape(const kex_st *a, const kex_st *b) {
  int n = kex_st_ndim(a);
  return n == kex_st_ndim(b) && kex_i64_eq(kex_st_shape(a), kex_st_shape(b), n);
}

static inline bool st_has_mask(const kex_st *st) {
  for (uint32_t i = 0; i < st->nviews; i++)
    if (st->views[i]->mask) return true;
  return false;
}

static inline bool is_unrealized_const(const kex_lb *lb) { return !lb->base->realized && lb->base->op == KEX_OP_CONST; }
static inline bool is_unrealized_unmasked_const(const kex_lb *lb) {
  return is_unrealized_const(lb) && !st_has_mask(lb->st);
}

/*
 * A new LazyBuffer of r (arena memory): the fields every one has and the
 * scheduler's (zero); the base fields are the caller's (lb_set_base).  NULL
 * on OOM.  Inlined into its two callers (a call per LazyBuffer showed).
 */
static inline __attribute__((always_inline)) kex_lb *lb_alloc(kex_replay *r, const char *device, const kex_st *st,
                                                               kex_dtype dtype) {
  kex_lb *lb = kex_arena_alloc(r->arena, sizeof *lb);
  if (!lb) return NULL;
  lb->id = r->nlbs++;
  lb->dtype = dtype;
  lb->st = st;
  lb->device = device;
  lb->graph_node = -1;
  /* the scheduler's scratch cleared as one stretch, the base fields set by the caller one by one: the compiler
     makes vector stores of these, where it clears a whole kex_lb with a `rep stos` (slow to start for 192 bytes) */
  memset(&lb->flags, 0, sizeof *lb - offsetof(kex_lb, flags));
  lb->group_slot = -1;
  return lb;
}

/* Set the base fields of a new lb (lb_alloc's): a base of op over srcs[0, nsrc), with no buffer yet. */
static inline void lb_set_base(kex_lb *lb, kex_lb *base, kex_op op, kex_const arg, uint32_t axis_mask, int nsrc,
                               kex_lb *const *srcs) {
  lb->base = base;
  lb->op = op;
  lb->axis_mask = axis_mask;
  lb->nsrc = (uint8_t)nsrc;
  lb->realized = lb->forced_realize = false;
  lb->buffer = 0;
  for (int i = 0; i < 3; i++) lb->srcs[i] = i < nsrc ? srcs[i] : NULL;
  lb->arg = arg;
  lb->assign_st = NULL;
  lb->contiguous_child = NULL;
  lb->contiguous_child_st = NULL;
}

/*
 * create_lazybuffer: size-0 -> CONST 0; CONST args through as_const with the
 * cache forced on; the lazycache lookup; then LazyBuffer.__init__ (buffer
 * creation: ASSIGN shares its target's, VIEW is a sub-buffer).
 */
static kex_lb *create_lb(replay_ctx *c, const char *device, const kex_st *st, kex_dtype dtype, kex_op op, kex_const arg,
                         uint32_t axis_mask, int nsrc, kex_lb *const *srcs, bool enable_cache) {
  if (c->rc) return NULL;
  kex_replay *r = c->r;
  if (kex_st_size(st) == 0) {
    op = KEX_OP_CONST;
    arg = kex_const_int(0);
    nsrc = 0;
    axis_mask = 0;
  }
  if (op == KEX_OP_CONST) {
    arg = kex_const_as(arg, dtype);
    enable_cache = true;
  }
  lb_key k = {NULL, device, st, dtype, op, arg, axis_mask, (uint8_t)nsrc, srcs};
  kex_lb **slot = NULL; /* the lazycache's new entry, filled at the end (one probe finds or makes it) */
  if (enable_cache) {
    bool found;
    if (!(slot = kex_dict_insert_with(&r->cache->lbs, key_hash(&k), &k, &found, &lazycache_type))) return fail_view(c);
    if (found) return *slot;
  }
  kex_lb *lb = lb_alloc(r, device, st, dtype);
  if (!lb) goto fail;
  lb_set_base(lb, lb, op, arg, axis_mask, nsrc, srcs);
  int b;
  if (op == KEX_OP_ASSIGN) {
    b = (int)srcs[1]->base->buffer;
  } else if (op == KEX_OP_VIEW) {
    const kex_lb *s = srcs[0];
    int64_t off;
    if (!bytes_of(c, s->st->views[0]->offset, s->dtype, &off)) {
      if (slot) kex_dict_cancel(&r->cache->lbs, slot);
      return NULL;
    }
    b = add_buffer(r, device, kex_st_size(st), dtype, (int32_t)s->base->buffer, off);
  } else {
    b = add_buffer(r, device, kex_st_size(st), dtype, -1, 0);
  }
  if (b < 0) goto fail;
  lb->buffer = (uint32_t)b;
  if (slot) *slot = lb;
  return lb;
fail:
  if (slot) kex_dict_cancel(&r->cache->lbs, slot);
  return fail_view(c);
}

/*
 * create_lb for a view (base non-NULL) of a non-empty st: the lazycache's
 * (st, base) key alone, without the base key's fields and rules.
 */
static kex_lb *create_view(replay_ctx *c, const char *device, const kex_st *st, kex_dtype dtype, kex_lb *base) {
  kex_replay *r = c->r;
  lb_key k; /* a view key: key_matches reads base and st only */
  k.base = base;
  k.st = st;
  bool found;
  kex_lb **slot = kex_dict_insert_with(&r->cache->lbs, view_key_hash(st, base), &k, &found, &lazycache_type);
  if (!slot) return fail_view(c);
  if (found) return *slot;
  kex_lb *lb = lb_alloc(r, device, st, dtype);
  if (!lb) {
    kex_dict_cancel(&r->cache->lbs, slot);
    return fail_view(c);
  }
  lb_set_base(lb, base, 0, (kex_const){0}, 0, 0, NULL); /* a view: the base fields empty */
  *slot = lb;
  return lb;
}

static kex_lb *loadop(replay_ctx *c, kex_op op, int ndim, const int64_t *shape, kex_dtype dtype, const char *device,
                      kex_const arg, int nsrc, kex_lb *const *srcs) {
  if (c->rc) return NULL;
  const kex_st *st = kex_st_from_shape(c->r->shape, ndim, shape);
  if (!st) return fail_view(c);
  return create_lb(c, device, st, dtype, op, arg, 0, nsrc, srcs, false);
}

static kex_lb *lb_const_of(replay_ctx *c, kex_dtype dtype, const char *device, kex_const val, int ndim,
                           const int64_t *shape);

/* LazyBuffer._view */
static kex_lb *lb_view(replay_ctx *c, kex_lb *lb, const kex_st *new_st) {
  if (c->rc) return NULL;
  if (!new_st) return fail_view(c);
  const kex_view *last = kex_st_last(new_st);
  bool empty_mask = false;
  if (last->mask)
    for (int i = 0; i < last->ndim; i++)
      if (last->mask[2 * i + 1] - last->mask[2 * i] == 0) empty_mask = true;
  if (kex_st_size(lb->st) == 0 || empty_mask)
    return lb_const_of(c, lb->dtype, lb->device, kex_const_int(0), kex_st_ndim(new_st), kex_st_shape(new_st));
  if (kex_st_contiguous(new_st) && same_shape(lb->base->st, new_st)) return lb->base;
  if (kex_st_size(new_st) == 0) /* create_lazybuffer's size-0 rule: a CONST 0 base, not a view */
    return create_lb(c, lb->device, new_st, lb->dtype, KEX_OP_CONST, kex_const_int(0), 0, 0, NULL, true);
  return create_view(c, lb->device, new_st, lb->dtype, lb->base);
}

static kex_lb *lb_reshape(replay_ctx *c, kex_lb *lb, int ndim, const int64_t *shape) {
  if (c->rc) return NULL;
  return lb_view(c, lb, kex_st_reshape(c->r->shape, lb->st, ndim, shape));
}

static kex_lb *lb_expand(replay_ctx *c, kex_lb *lb, const int64_t *shape) {
  if (c->rc) return NULL;
  return lb_view(c, lb, kex_st_expand(c->r->shape, lb->st, shape));
}

/* LazyBuffer.loadop(CONST, (), ...).reshape((1,)*n).expand(shape), through the const memo */
static kex_lb *lb_const_of(replay_ctx *c, kex_dtype dtype, const char *device, kex_const val, int ndim,
                           const int64_t *shape) {
  if (c->rc) return NULL;
  const_probe k = {dtype, device, kex_const_as(val, dtype), ndim, shape};
  uint64_t h = const_probe_hash(&k);
  const const_memo *hit = kex_dict_find_with(&c->r->cache->consts, h, &k, &const_memo_type);
  if (hit) return hit->lb;
  kex_lb *s = loadop(c, KEX_OP_CONST, 0, NULL, dtype, device, val, 0, NULL);
  if (!s) return NULL;
  int64_t ones[KEX_MAX_DIMS];
  for (int i = 0; i < ndim; i++) ones[i] = 1;
  s = lb_reshape(c, s, ndim, ones);
  if (!s) return NULL;
  s = lb_expand(c, s, shape);
  if (!s) return NULL;
  bool found;
  const_memo *e = kex_dict_insert(&c->r->cache->consts, h, &k, &found);
  if (!e) return fail_view(c);
  *e = (const_memo){s, k.arg};
  return s;
}

static kex_lb *lb_const(replay_ctx *c, kex_lb *like, kex_const val) {
  return lb_const_of(c, like->dtype, like->device, val, kex_lb_ndim(like), kex_lb_shape(like));
}

static bool can_view(replay_ctx *c, const kex_lb *lb) {
  return kex_st_consecutive(lb->st) && !is_unrealized_const(lb) && c->r->opts.buffer_view &&
         lb->device == c->r->default_device;
}

static kex_lb *lb_e(replay_ctx *c, kex_op op, int n, kex_lb *const *in);

/* LazyBuffer.cast(dtype, bitcast) */
static kex_lb *lb_cast(replay_ctx *c, kex_lb *lb, kex_dtype dtype, bool bitcast) {
  if (c->rc) return NULL;
  if (lb->dtype == dtype) return lb;
  if (!bitcast && is_unrealized_unmasked_const(lb))
    return create_lb(c, lb->device, lb->st, dtype, KEX_OP_CONST, kex_const_as(lb->base->arg, dtype), 0, 0, NULL,
                     true);
  if (kex_dtype_size(dtype) <= kex_dtype_size(lb->dtype) && lb != lb->base) {
    kex_lb *b = lb_cast(c, lb->base, dtype, bitcast);
    if (!b) return NULL;
    return lb_view(c, b, lb->st);
  }
  kex_op cop = bitcast ? (can_view(c, lb) ? KEX_OP_VIEW : KEX_OP_BITCAST) : KEX_OP_CAST;
  const kex_st *st = kex_st_from_shape_of(c->r->shape, lb->st);
  if (!st) return fail_view(c);
  kex_lb *srcs[1] = {lb};
  return create_lb(c, lb->device, st, dtype, cop, kex_const_int(0), 0, 1, srcs, true);
}

static bool arg_is(const kex_lb *lb, double v) { return kex_const_as_double(lb->base->arg) == v; }

/* LazyBuffer.e: contiguous_child reuse, the folds, then a new base. */
static kex_lb *lb_e(replay_ctx *c, kex_op op, int n, kex_lb *const *in) {
  if (c->rc) return NULL;
  kex_lb *srcs[3];
  for (int i = 0; i < n; i++) {
    kex_lb *s = in[i];
    if (s == s->base && s->contiguous_child) {
      srcs[i] = lb_view(c, s->contiguous_child, s->contiguous_child_st);
      if (!srcs[i]) return NULL;
    } else {
      srcs[i] = s;
    }
  }
  for (int i = op == KEX_OP_WHERE ? 2 : 1; i < n; i++)
    if (srcs[i]->dtype != srcs[op == KEX_OP_WHERE ? 1 : 0]->dtype) {
      c->rc = kex_err_set(c->err, KEX_EINVAL, "node %d (%s): all dtypes must match", c->node, kex_op_short(op));
      return NULL;
    }
  if (op == KEX_OP_WHERE && srcs[0]->dtype != KEX_DT_BOOL) {
    c->rc = kex_err_set(c->err, KEX_EINVAL, "node %d (WHERE): the condition must be bool", c->node);
    return NULL;
  }
  if (op == KEX_OP_NEG && srcs[0]->dtype == KEX_DT_BOOL) {
    c->rc = kex_err_set(c->err, KEX_EINVAL, "node %d (NEG): NEG does not accept dtype bool", c->node);
    return NULL;
  }
  kex_dtype out = (op == KEX_OP_CMPLT || op == KEX_OP_CMPEQ) ? KEX_DT_BOOL : srcs[n - 1]->dtype;

  /* const folding (python_alu ops only) */
  bool alu = KEX_OP_IS_ALU(op) && op != KEX_OP_CAST && op != KEX_OP_BITCAST && op != KEX_OP_MULACC;
  if (alu) {
    bool all_const = true;
    for (int i = 0; i < n; i++) all_const = all_const && is_unrealized_unmasked_const(srcs[i]);
    if (all_const) {
      kex_const v[3];
      for (int i = 0; i < n; i++) v[i] = srcs[i]->base->arg;
      kex_lb *self = lb_cast(c, in[0], out, false);
      if (!self) return NULL;
      return lb_const(c, self, kex_exec_alu(op, out, v, n));
    }
  }
  kex_lb *x = in[0];
  if (op == KEX_OP_NEG && x->base->op == KEX_OP_NEG && !x->base->realized) return x->base->srcs[0];
  if (KEX_OP_IS_BINARY(op)) {
    kex_lb *y = in[1];
    if (op == KEX_OP_ADD) {
      if (is_unrealized_unmasked_const(y) && arg_is(y, 0)) return x;
      if (is_unrealized_unmasked_const(x) && arg_is(x, 0)) return y;
    }
    if (op == KEX_OP_SUB && is_unrealized_unmasked_const(y) && arg_is(y, 0)) return x;
    if (op == KEX_OP_MUL) {
      for (int side = 0; side < 2; side++) {
        kex_lb *k = side ? y : x, *o = side ? x : y;
        if (!is_unrealized_unmasked_const(k)) continue;
        if (arg_is(k, 1)) return o;
        if (arg_is(k, 0)) return lb_const(c, o, kex_const_int(0));
        if (arg_is(k, -1)) return lb_e(c, KEX_OP_NEG, 1, &o);
      }
    }
    if (op == KEX_OP_DIV && kex_dtype_is_float(x->dtype) && is_unrealized_unmasked_const(y) && !arg_is(y, 0)) {
      kex_lb *m[2] = {x, lb_const(c, x, kex_const_float(1.0 / kex_const_as_double(y->base->arg)))};
      if (!m[1]) return NULL;
      return lb_e(c, KEX_OP_MUL, 2, m);
    }
  }
  const kex_st *st = kex_st_from_shape_of(c->r->shape, x->st);
  if (!st) return fail_view(c);
  return create_lb(c, x->device, st, out, op, kex_const_int(0), 0, n, srcs, true);
}

/* LazyBuffer._reduce_op: drop size-1 axes; none left -> self. */
static kex_lb *lb_reduce_op(replay_ctx *c, kex_lb *lb, kex_op op, uint32_t axis_mask) {
  if (c->rc) return NULL;
  int nd = kex_lb_ndim(lb);
  const int64_t *sh = kex_lb_shape(lb);
  int64_t ns[KEX_MAX_DIMS];
  uint32_t mask = 0;
  for (int i = 0; i < nd; i++) {
    if ((axis_mask >> i & 1) && sh[i] != 1) mask |= 1u << i;
    ns[i] = (mask >> i & 1) ? 1 : sh[i];
  }
  if (!mask) return lb;
  const kex_st *st = kex_st_from_shape(c->r->shape, nd, ns);
  if (!st) return fail_view(c);
  kex_lb *srcs[1] = {lb};
  return create_lb(c, lb->device, st, lb->dtype, op, kex_const_int(0), mask, 1, srcs, true);
}

#define REDUCEOP_SPLIT_THRESHOLD 32768
#define REDUCEOP_SPLIT_SIZE 22

/* LazyBuffer.r: size-0 and const folds, then the split reduce (spec section 5). */
static kex_lb *lb_r(replay_ctx *c, kex_lb *lb, kex_op op, int naxis, const int32_t *axis) {
  if (c->rc) return NULL;
  int nd = kex_lb_ndim(lb);
  const int64_t *sh = kex_lb_shape(lb);
  uint32_t mask = 0;
  for (int i = 0; i < naxis; i++) mask |= 1u << axis[i];
  int64_t ns[KEX_MAX_DIMS], new_prod = 1, reduced = 1;
  bool zero_in_new = false, zero_in_shape = false;
  bool ovf = false;
  for (int i = 0; i < nd; i++) {
    ns[i] = (mask >> i & 1) ? 1 : sh[i];
    ovf |= __builtin_mul_overflow(new_prod, ns[i], &new_prod);
    if (mask >> i & 1) ovf |= __builtin_mul_overflow(reduced, sh[i], &reduced);
    zero_in_new |= ns[i] == 0;
    zero_in_shape |= sh[i] == 0;
  }
  if (ovf) { /* the graph loader bounds every shape's non-zero product; this is the second line */
    c->rc = kex_err_set(c->err, KEX_ELIMIT, "node %d (%s): the reduced shape's size overflows int64", c->node,
                        kex_gop_name(c->r->graph->nodes[c->node].op));
    return NULL;
  }
  if (kex_lb_size(lb) == 0 && !zero_in_new)
    return lb_const_of(c, lb->dtype, lb->device, op == KEX_OP_SUM ? kex_const_float(0.0) : kex_const_float(-INFINITY),
                       nd, ns);
  if (is_unrealized_unmasked_const(lb)) {
    kex_const v = lb->base->arg;
    if (op == KEX_OP_SUM) {
      /* Python's exact product, then as_const: for int dtypes only its low bits survive, so wrap */
      if (v.kind == KEX_CONST_FLOAT) v = kex_const_float(v.f * (double)reduced);
      else v = kex_const_int((int64_t)((uint64_t)(v.kind == KEX_CONST_INT ? v.i : v.b) * (uint64_t)reduced));
    } else if (v.kind == KEX_CONST_BOOL) {
      v = kex_const_int(v.b); /* True * 1 == 1 */
    }
    return lb_const_of(c, lb->dtype, lb->device, v, nd, ns);
  }
  if (zero_in_shape || kex_lb_size(lb) / new_prod < REDUCEOP_SPLIT_THRESHOLD) return lb_reduce_op(c, lb, op, mask);
  int64_t rs[KEX_MAX_DIMS];
  bool known[KEX_MAX_DIMS];
  if (kex_st_real_strides(c->r->shape, lb->st, true, rs, known) < 0) return fail_view(c);
  int dim = -1;
  int64_t divisor = 0;
  int64_t top = ((int64_t)1 << REDUCEOP_SPLIT_SIZE) / new_prod;
  if (top > 256) top = 256;
  for (int a = 0; a < naxis && dim < 0; a++) {
    int i = axis[a];
    for (int64_t x = top; x >= 8; x--)
      if (sh[i] % x == 0 && (!known[i] || rs[i] != 0)) {
        dim = i;
        divisor = x;
        break;
      }
  }
  if (dim < 0) return lb_reduce_op(c, lb, op, mask);
  int64_t split[KEX_MAX_DIMS + 1];
  int sn = 0;
  for (int i = 0; i < nd; i++) {
    if (i == dim) {
      split[sn++] = divisor;
      split[sn++] = sh[i] / divisor;
    } else {
      split[sn++] = sh[i];
    }
  }
  int perm[KEX_MAX_DIMS + 1], pn = 0;
  for (int i = 0; i < sn; i++)
    if (i != dim) perm[pn++] = i;
  perm[pn++] = dim;
  kex_lb *s = lb_reshape(c, lb, sn, split);
  if (!s) return NULL;
  s = lb_view(c, s, kex_st_permute(c->r->shape, s->st, perm));
  s = lb_reduce_op(c, s, op, mask);
  s = lb_reduce_op(c, s, op, 1u << nd);
  if (!s) return NULL;
  return lb_reshape(c, s, nd, ns);
}

/* LazyBuffer.contiguous */
static kex_lb *lb_contiguous(replay_ctx *c, kex_lb *lb) {
  if (c->rc) return NULL;
  if (!kex_st_contiguous(lb->st) || kex_lb_size(lb) != kex_lb_size(lb->base) || is_unrealized_const(lb)) {
    kex_lb *ret = lb_e(c, can_view(c, lb) ? KEX_OP_VIEW : KEX_OP_CONTIGUOUS, 1, &lb);
    if (!ret) return NULL;
    const kex_st *inv;
    int rc = kex_st_invert(c->r->shape, lb->st, kex_lb_ndim(lb->base), kex_lb_shape(lb->base), &inv);
    if (rc < 0) return fail_view(c);
    if (rc == 0) {
      lb->base->contiguous_child = ret;
      lb->base->contiguous_child_st = inv;
    }
    return ret;
  }
  lb->base->forced_realize = true;
  return lb;
}

/* LazyBuffer.copy_to_device */
static kex_lb *lb_copy_to(replay_ctx *c, kex_lb *lb, const char *device) {
  if (c->rc) return NULL;
  if (lb->device == device) return lb;
  if (kex_st_contiguous(lb->st) && kex_lb_size(lb) == kex_lb_size(lb->base) && !lb->base->realized &&
      lb->base->op == KEX_OP_COPY) {
    kex_lb *s = lb_copy_to(c, lb->base->srcs[0], device);
    if (!s) return NULL;
    return lb_reshape(c, s, kex_lb_ndim(lb), kex_lb_shape(lb));
  }
  if (is_unrealized_const(lb)) {
    kex_lb *k = loadop(c, KEX_OP_CONST, 0, NULL, lb->dtype, device, lb->base->arg, 0, NULL);
    if (!k) return NULL;
    return lb_view(c, k, lb->st);
  }
  if (kex_lb_size(lb) < kex_lb_size(lb->base)) {
    kex_lb *s = lb_contiguous(c, lb);
    if (!s) return NULL;
    const kex_st *st = kex_st_from_shape_of(c->r->shape, s->st);
    if (!st) return fail_view(c);
    kex_lb *cp = create_lb(c, device, st, s->dtype, KEX_OP_COPY, kex_const_int(0), 0, 1, &s, false);
    int64_t nbytes; /* COPY's arg: only its int64 bound matters here */
    if (cp && !bytes_of(c, kex_lb_size(s), s->dtype, &nbytes)) return NULL;
    return cp;
  }
  kex_lb *b = lb->base;
  const kex_st *st = kex_st_from_shape_of(c->r->shape, b->st);
  if (!st) return fail_view(c);
  kex_lb *cp = create_lb(c, device, st, b->dtype, KEX_OP_COPY, kex_const_int(0), 0, 1, &b, false);
  if (!cp) return NULL;
  int64_t nbytes;
  if (!bytes_of(c, kex_lb_size(b), b->dtype, &nbytes)) return NULL;
  return lb_view(c, cp, lb->st);
}

/* LazyBuffer.assign: target.assign(value) */
static kex_lb *lb_assign(replay_ctx *c, kex_lb *target, kex_lb *value) {
  if (c->rc) return NULL;
  if (!target->base->realized) {
    c->rc = kex_err_set(c->err, KEX_EINVAL, "node %d (ASSIGN): the target's base is not a held (realized) buffer",
                        c->node);
    return NULL;
  }
  kex_lb *srcs[2] = {value, target->base};
  kex_lb *a = loadop(c, KEX_OP_ASSIGN, kex_lb_ndim(target), kex_lb_shape(target), target->dtype, target->device,
                     kex_const_int(0), 2, srcs);
  if (a && !kex_st_contiguous(target->st)) a->assign_st = target->st;
  return a;
}

static const char *intern_device(kex_replay *r, uint32_t node, const char *name) {
  if (!name || strcmp(name, "default") == 0 || strcmp(name, r->opts.device_name) == 0) return r->default_device;
  /* other device names: one interned copy each, found by a scan of earlier nodes' devices */
  for (uint32_t i = 0; i < node; i++) {
    const kex_lb *lb = r->node_lb[i];
    if (lb && strcmp(lb->device, name) == 0) return lb->device;
  }
  return kex_arena_strdup(r->arena, name);
}


/* Replay one graph node. */
static kex_lb *replay_node(replay_ctx *c, const kex_gnode *n) {
  kex_replay *r = c->r;
  kex_lb *s[3] = {0};
  switch (n->nsrc) { /* unrolled: most nodes have one or two */
  case 3: s[2] = r->node_lb[n->src[2]]; /* fall through */
  case 2: s[1] = r->node_lb[n->src[1]]; /* fall through */
  case 1: s[0] = r->node_lb[n->src[0]]; /* fall through */
  default: break;
  }
  switch (n->op) {
  case KEX_GOP_BUFFER: case KEX_GOP_EMPTY: {
    const char *dev = intern_device(r, (uint32_t)c->node, n->device);
    if (!dev) return fail_view(c);
    kex_lb *lb = loadop(c, KEX_OP_EMPTY, n->ndim, n->shape, n->dtype, dev, kex_const_int(0), 0, NULL);
    if (lb && n->op == KEX_GOP_BUFFER && lb->op == KEX_OP_EMPTY) lb->realized = true;
    return lb;
  }
  case KEX_GOP_CONST: {
    const char *dev = intern_device(r, (uint32_t)c->node, n->device);
    if (!dev) return fail_view(c);
    return lb_const_of(c, n->dtype, dev, n->value, n->ndim, n->shape);
  }
  case KEX_GOP_EXP2: return lb_e(c, KEX_OP_EXP2, 1, s);
  case KEX_GOP_LOG2: return lb_e(c, KEX_OP_LOG2, 1, s);
  case KEX_GOP_SIN: return lb_e(c, KEX_OP_SIN, 1, s);
  case KEX_GOP_SQRT: return lb_e(c, KEX_OP_SQRT, 1, s);
  case KEX_GOP_NEG: return lb_e(c, KEX_OP_NEG, 1, s);
  case KEX_GOP_CAST: return lb_cast(c, s[0], n->dtype, false);
  case KEX_GOP_BITCAST: return lb_cast(c, s[0], n->dtype, true);
  case KEX_GOP_ADD: return lb_e(c, KEX_OP_ADD, 2, s);
  case KEX_GOP_SUB: return lb_e(c, KEX_OP_SUB, 2, s);
  case KEX_GOP_MUL: return lb_e(c, KEX_OP_MUL, 2, s);
  case KEX_GOP_DIV: return lb_e(c, KEX_OP_DIV, 2, s);
  case KEX_GOP_MAX: return lb_e(c, KEX_OP_MAX, 2, s);
  case KEX_GOP_MOD: return lb_e(c, KEX_OP_MOD, 2, s);
  case KEX_GOP_CMPLT: return lb_e(c, KEX_OP_CMPLT, 2, s);
  case KEX_GOP_CMPEQ: return lb_e(c, KEX_OP_CMPEQ, 2, s);
  case KEX_GOP_XOR: return lb_e(c, KEX_OP_XOR, 2, s);
  case KEX_GOP_WHERE: return lb_e(c, KEX_OP_WHERE, 3, s);
  case KEX_GOP_MULACC: return lb_e(c, KEX_OP_MULACC, 3, s);
  case KEX_GOP_REDUCE_SUM: return lb_r(c, s[0], KEX_OP_SUM, (int)n->naxis, n->axis);
  case KEX_GOP_REDUCE_MAX: return lb_r(c, s[0], KEX_OP_RMAX, (int)n->naxis, n->axis);
  case KEX_GOP_RESHAPE: return lb_view(c, s[0], kex_st_reshape(r->shape, s[0]->st, (int)n->narg, n->arg));
  case KEX_GOP_EXPAND: return lb_view(c, s[0], kex_st_expand(r->shape, s[0]->st, n->arg));
  case KEX_GOP_PERMUTE: {
    int order[KEX_MAX_DIMS];
    for (uint32_t i = 0; i < n->narg; i++) order[i] = (int)n->arg[i];
    return lb_view(c, s[0], kex_st_permute(r->shape, s[0]->st, order));
  }
  case KEX_GOP_PAD: return lb_view(c, s[0], kex_st_pad(r->shape, s[0]->st, n->arg));
  case KEX_GOP_SHRINK: return lb_view(c, s[0], kex_st_shrink(r->shape, s[0]->st, n->arg));
  case KEX_GOP_STRIDE: return lb_view(c, s[0], kex_st_stride(r->shape, s[0]->st, n->arg));
  case KEX_GOP_CONTIGUOUS: return lb_contiguous(c, s[0]);
  case KEX_GOP_ASSIGN: return lb_assign(c, s[1], s[0]);
  case KEX_GOP_COPY: {
    const char *dev = intern_device(r, (uint32_t)c->node, n->device);
    if (!dev) return fail_view(c);
    return lb_copy_to(c, s[0], dev);
  }
  default: break;
  }
  c->rc = kex_err_set(c->err, KEX_EINVAL, "node %d: unknown op", c->node);
  return NULL;
}

int kex_replay_graph(const kex_graph *g, const kex_replay_opts *opts, kex_arena *arena, kex_replay **out,
                     kex_error *err) {
  int rc = 0;
  *out = NULL;
  kex_replay *r = kex_arena_calloc(arena, 1, sizeof *r);
  if (!r) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  r->arena = arena;
  r->graph = g;
  r->opts = *opts;
  if (!r->opts.device_name) r->opts.device_name = "opencl";
  r->own_shape = !opts->shape;
  r->shape = opts->shape ? opts->shape : kex_shape_ctx_new(arena);
  if (r->own_shape && r->shape) kex_shape_ctx_reserve(r->shape, g->nnodes);
  r->cache = kex_arena_calloc(arena, 1, sizeof *r->cache);
  if (r->cache) {
    kex_replay_tables *t = opts->tables;
    r->cache->lbs = t ? kex_replay_tables_take(&t->lbs, &lazycache_type) : kex_dict_make(&lazycache_type);
    r->cache->consts = t ? kex_replay_tables_take(&t->consts, &const_memo_type) : kex_dict_make(&const_memo_type);
    /* sized to the graph (about one entry per node), so a replay does not rehash as it goes */
    (void)kex_dict_reserve(&r->cache->lbs, g->nnodes);
    if (t && t->buffers) { /* the last replay's table, with its capacity */
      r->buffers = t->buffers;
      r->capbuffers = t->capbuffers;
      t->buffers = NULL;
      t->capbuffers = 0;
    }
  }
  /* not zeroed: node i's entry is set before any later node reads it */
  r->node_lb = kex_arena_alloc(arena, sizeof *r->node_lb * (g->nnodes ? g->nnodes : 1));
  r->default_device = kex_arena_strdup(arena, r->opts.device_name);
  if (!r->shape || !r->cache || !r->node_lb || !r->default_device) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
    goto out;
  }
  (void)kex_shape_error(r->shape, NULL); /* a long-lived context may hold an earlier graph's refusal */
  replay_ctx c = {r, err, 0, 0};
  for (uint32_t i = 0; i < g->nnodes; i++) {
    c.node = (int)i;
    kex_lb *lb = replay_node(&c, &g->nodes[i]);
    if (!lb) {
      rc = c.rc ? c.rc : kex_err_set(err, KEX_EINTERNAL, "node %u: replay failed", i);
      goto out;
    }
    kex_lb *b = lb->base;
    if (lb->graph_node < 0) lb->graph_node = (int32_t)i;
    if (b->graph_node < 0) b->graph_node = (int32_t)i;
    r->node_lb[i] = lb;
    /* the buffer's graph node: the first node (in order) whose base owns it; buffers the client holds (inputs,
       outputs, assign targets) are never planned away */
    kex_buffer_info *bi = &r->buffers[b->buffer];
    if (bi->graph_node < 0) bi->graph_node = b->graph_node;
    if (g->nodes[i].op == KEX_GOP_BUFFER || g->nodes[i].op == KEX_GOP_EMPTY) bi->held = true;
  }
  for (uint32_t i = 0; i < g->noutputs; i++) r->buffers[r->node_lb[g->outputs[i]]->base->buffer].held = true;
out:
  if (rc) {
    kex_replay_free(r);
    r = NULL;
  }
  *out = r;
  return rc;
}

void kex_replay_free(kex_replay *r) {
  if (!r) return;
  if (r->cache && r->opts.tables) {
    /* a lazycache far larger than this graph filled (grown by an earlier, bigger graph) is freed, not emptied:
       emptying costs its whole capacity, and the next graph's reserve makes one of its own size */
    kex_dict *lbs = &r->cache->lbs;
    if (lbs->cap > 4 * ((uint64_t)lbs->len + 64)) kex_dict_free(lbs);
    kex_replay_tables_give(&r->opts.tables->lbs, &r->cache->lbs);
    kex_replay_tables_give(&r->opts.tables->consts, &r->cache->consts);
  } else if (r->cache) {
    kex_dict_free(&r->cache->lbs);
    kex_dict_free(&r->cache->consts);
  }
  if (r->own_shape) kex_shape_ctx_free(r->shape);
  if (r->opts.tables && !r->opts.tables->buffers) { /* kept for the next replay (kex_sched_warm counts it) */
    r->opts.tables->buffers = r->buffers;
    r->opts.tables->capbuffers = r->capbuffers;
  } else {
    kex_free(r->buffers);
  }
  r->buffers = NULL;
}

kex_replay_opts kex_replay_opts_for(bool clang_rules) {
  return (kex_replay_opts){clang_rules, clang_rules ? "cpu" : "opencl", NULL, NULL};
}

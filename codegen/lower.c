/*
 * lower.c - the Linearizer (tinygrad 0.9.0 codegen/linearizer.py, spec 8):
 * a Kernel with its opts applied becomes a UOp graph.
 *
 * Index variables are symbolic nodes (sched/symbolic.h): gidx/lidx for the
 * global and local dims (grouped to at most 3 when the target has locals),
 * ridx for reduce loops, tidx for the late group-reduce loop and _uidx for
 * upcast dims.  Upcast dims are expanded: every load/store is emitted once
 * per combination of the _uidx values (first upcast dim fastest), which is
 * tinygrad's expand_node/iter_idxs done by building the index expression for
 * each combination directly.  Loads are cached by their rendered index and
 * valid (load_cache), loads and stores of float/half buffers are grouped into
 * float2/float4 when the renderer supports it and the index is provably
 * aligned.  The AST is walked with an explicit stack (it can be very deep).
 *
 * Everything lives in one uop graph and one arena, both freed before
 * kex_lower_kernel returns.
 */
#include "codegen/lower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dict.h"
#include "core/hash.h"
#include "core/ptrmap.h"
#include "codegen/render.h"
#include "codegen/uops.h"

int kex_lower_debug = 0;

#define MAXD KEX_MAX_DIMS
#define MAX_LOOPS 64

/* ---- name counter ---- */

void kex_name_counter_init(kex_name_counter *c) { memset(c, 0, sizeof *c); }

void kex_name_counter_free(kex_name_counter *c) {
  for (uint32_t i = 0; i < c->n; i++) kex_free(c->names[i]);
  kex_free(c->names);
  kex_free(c->counts);
  memset(c, 0, sizeof *c);
}

/* kernel_cnt[name] += 1; returns the new count (>= 1) or KEX_ENOMEM. */
static int name_count(kex_name_counter *c, const char *name) {
  for (uint32_t i = 0; i < c->n; i++)
    if (!strcmp(c->names[i], name)) return (int)++c->counts[i];
  if (c->n == c->cap) {
    uint32_t ncap = c->cap ? c->cap * 2 : 16;
    char **nn = kex_realloc(c->names, ncap * sizeof *nn);
    if (!nn) return KEX_ENOMEM;
    c->names = nn;
    uint32_t *nc = kex_realloc(c->counts, ncap * sizeof *nc);
    if (!nc) return KEX_ENOMEM;
    c->counts = nc;
    c->cap = ncap;
  }
  char *s = kex_strdup(name);
  if (!s) return KEX_ENOMEM;
  c->names[c->n] = s;
  c->counts[c->n++] = 1;
  return 1;
}

void kex_program_src_free(kex_program_src *p) {
  if (!p) return;
  kex_free(p->src);
  kex_free(p->args);
  memset(p, 0, sizeof *p);
}

/* ---- lowering state ---- */

typedef struct ulist {
  uint32_t n;
  const kex_uop **v;
} ulist;

/* The load cache: a loaded (or accumulator) uop by its text key. */
typedef struct cache_slot {
  const char *key; /* in the lowering's arena */
  const kex_uop *u;
} cache_slot;

typedef struct lower {
  const kex_kernel *k;
  const kex_renderer_caps *caps;
  int dialect;
  kex_shape_ctx *shape;
  kex_sym_ctx *sym;
  kex_uop_graph g;
  kex_arena arena;
  bool oom;
  int shape_len, upcasted, group, local_dims, first_reduce, global_dims;
  uint32_t nbufs; /* kernel bufs, plus the temp buffer when grouping */
  int temp;       /* index of the local temp buffer, -1 when none */
  kex_dtype temp_dtype;
  const kex_st **sts;
  const kex_uop **buf_uops;
  ulist *loaded; /* per buffer */
  uint32_t nloops;
  const char *loop_names[MAX_LOOPS];
  const kex_uop *loop_uops[MAX_LOOPS];
  kex_dict cache; /* of cache_slot */
  uint32_t nstores, capstores;
  const kex_uop **stores;
} lower;

static const kex_sym *var(lower *L, const char *prefix, int i, int64_t size) {
  char nm[32];
  snprintf(nm, sizeof nm, "%s%d", prefix, i);
  return kex_sym_var(L->sym, nm, 0, size - 1);
}

static const int64_t *full_shape(const lower *L) { return kex_st_shape(L->sts[L->k->full_buf_index]); }
static const int64_t *out_shape(const lower *L) { return kex_st_shape(L->sts[0]); }

static kex_dtype buf_dtype(const lower *L, int i) { return i == L->temp ? L->temp_dtype : L->k->bufs[i].dtype; }
static bool buf_is_const(const lower *L, int i) { return i != L->temp && L->k->bufs[i].op == KEX_OP_BCONST; }

static bool is_uidx(const kex_sym *s) { return s->kind == KEX_SYM_VAR && !strncmp(s->name, "_uidx", 5); }

static int set_loop(lower *L, const char *name, const kex_uop *u) {
  if (!u) return KEX_ENOMEM;
  for (uint32_t i = 0; i < L->nloops; i++)
    if (!strcmp(L->loop_names[i], name)) {
      L->loop_uops[i] = u;
      return 0;
    }
  if (L->nloops == MAX_LOOPS) return KEX_ELIMIT;
  L->loop_names[L->nloops] = kex_arena_strdup(&L->arena, name);
  if (!L->loop_names[L->nloops]) return KEX_ENOMEM;
  L->loop_uops[L->nloops++] = u;
  return 0;
}

/* ---- symbolic node -> uops (render_ops) ---- */

static const kex_uop *render_sym(lower *L, const kex_sym *s) {
  if (!s) return NULL;
  kex_uop_graph *g = &L->g;
  kex_udtype i32 = kex_ud(KEX_DT_INT32), b = kex_ud(KEX_DT_BOOL);
  switch (s->kind) {
  case KEX_SYM_NUM: return kex_uop_const_int(g, s->min);
  case KEX_SYM_VAR:
    for (uint32_t i = 0; i < L->nloops; i++)
      if (!strcmp(L->loop_names[i], s->name)) return L->loop_uops[i];
    return NULL;
  case KEX_SYM_MUL: return kex_uop_alu_dt(g, KEX_OP_MUL, i32, render_sym(L, s->a), kex_uop_const_int(g, s->b), NULL);
  case KEX_SYM_DIV: return kex_uop_alu_dt(g, KEX_OP_DIV, i32, render_sym(L, s->a), kex_uop_const_int(g, s->b), NULL);
  case KEX_SYM_MOD: return kex_uop_alu_dt(g, KEX_OP_MOD, i32, render_sym(L, s->a), kex_uop_const_int(g, s->b), NULL);
  case KEX_SYM_LT:
    return kex_uop_alu_dt(g, KEX_OP_CMPLT, b, render_sym(L, s->a),
                          s->bn ? render_sym(L, s->bn) : kex_uop_const_int(g, s->b), NULL);
  case KEX_SYM_SUM:
  case KEX_SYM_AND: {
    const kex_uop *acc = render_sym(L, s->nodes[0]);
    for (uint32_t i = 1; i < s->n; i++)
      acc = kex_uop_alu_dt(g, s->kind == KEX_SYM_SUM ? KEX_OP_ADD : KEX_OP_MUL, s->kind == KEX_SYM_SUM ? i32 : b, acc,
                           render_sym(L, s->nodes[i]), NULL);
    return acc;
  }
  }
  return NULL;
}

/* ---- load cache ---- */

static bool cache_slot_eq(const void *entry, const void *probe) { return !strcmp(((const cache_slot *)entry)->key, probe); }

static const kex_dict_type cache_type = {sizeof(cache_slot), cache_slot_eq, 256};

/* The cached uop's slot for key (an arena string that the cache keeps), made NULL when new; NULL on OOM. */
static const kex_uop **cache_slot_for(lower *L, const char *key) {
  bool found;
  cache_slot *e = kex_dict_insert(&L->cache, kex_hash_bytes(key, strlen(key), 0), key, &found);
  if (!e) return NULL;
  if (!found) *e = (cache_slot){key, NULL};
  return &e->u;
}

static void cache_clear(lower *L) { kex_dict_clear(&L->cache); }

/* ---- kernel helpers on the lowering's own sts/upcasted ---- */

/* upcasted_axis(i): (size, reduce flag) per upcast axis. */
static void upcasted_axis(const lower *L, int i, int64_t *size, bool *reduce) {
  const int64_t *s = kex_st_shape(L->sts[i]), *o = out_shape(L), *f = full_shape(L);
  for (int a = 0; a < L->upcasted; a++) {
    int x = L->shape_len - L->upcasted + a;
    size[a] = s[x];
    reduce[a] = o[x] != f[x];
  }
}

/* acc_offsets(i), in the order of the upcast combinations (first upcast axis fastest). */
static int64_t *acc_offsets(lower *L, int i, uint32_t *n) {
  int64_t size[MAXD], stride[MAXD];
  bool red[MAXD];
  upcasted_axis(L, i, size, red);
  uint32_t total = 1;
  int64_t st = 1;
  for (int a = 0; a < L->upcasted; a++) { /* strides_for_shape over the reversed axes: the first axis has stride 1 */
    int64_t s = red[a] ? 1 : size[a];
    stride[a] = (s == 1 || red[a]) ? 0 : st;
    st *= s;
    total *= (uint32_t)size[a];
  }
  int64_t *off = kex_arena_alloc(&L->arena, (size_t)total * sizeof *off);
  if (!off) return NULL;
  for (uint32_t c = 0; c < total; c++) {
    uint32_t r = c;
    int64_t o = 0;
    for (int a = 0; a < L->upcasted; a++) {
      o += (int64_t)(r % size[a]) * stride[a];
      r /= (uint32_t)size[a];
    }
    off[c] = o;
  }
  *n = total;
  return off;
}

/* get_float4_upcast_dim(i): bitmask of upcast axes of sts[i] with unit stride and size > 1. */
static int64_t float4_dims(lower *L, int i) {
  kex_dtype dt = buf_dtype(L, i);
  if (!L->caps->supports_float4 || (dt != KEX_DT_FLOAT32 && dt != KEX_DT_FLOAT16)) return 0;
  int64_t unit = kex_st_unit_stride_axes(L->shape, L->sts[i]);
  if (unit < 0) return unit;
  const int64_t *s = kex_st_shape(L->sts[i]);
  int64_t m = 0;
  for (int x = L->shape_len - L->upcasted; x < L->shape_len; x++)
    if (((unit >> x) & 1) && s[x] > 1) m |= 1ll << x;
  return m;
}

/* expand_idxs: per position, how many values its _uidx variable takes (1 when not expanded or repeated). */
static uint32_t expand_counts(const kex_sym *const *idxs, int n, uint32_t *cnt) {
  uint32_t total = 1;
  for (int j = 0; j < n; j++) {
    cnt[j] = 1;
    if (!is_uidx(idxs[j])) continue;
    bool dup = false;
    for (int p = 0; p < j; p++) dup = dup || (is_uidx(idxs[p]) && !strcmp(idxs[p]->name, idxs[j]->name));
    if (!dup) cnt[j] = (uint32_t)(idxs[j]->max + 1);
    total *= cnt[j];
  }
  return total;
}

/* The idxs of combination c: expanded positions replaced by their values. */
static void combo_idxs(lower *L, const kex_sym *const *idxs, int n, const uint32_t *cnt, uint32_t c,
                       const kex_sym **out, uint32_t *rep) {
  for (int j = 0; j < n; j++) {
    rep[j] = c % cnt[j];
    c /= cnt[j];
    out[j] = cnt[j] > 1 ? kex_sym_num(L->sym, rep[j]) : idxs[j];
  }
}

static int float4_amt(lower *L, int i, const kex_sym *const *idxs, int *dim) {
  int64_t m = float4_dims(L, i);
  if (m < 0) return KEX_ENOMEM;
  *dim = -1;
  if (!m || (m & (m - 1))) return 1;
  int d = __builtin_ctzll((uint64_t)m);
  if (!is_uidx(idxs[d])) return 1;
  int amt = (int)(idxs[d]->max + 1);
  if (amt != 2 && amt != 4) return 1;
  *dim = d;
  return amt;
}

/* Is idx provably a multiple of amt (idx == idx//amt*amt)? */
static bool aligned(lower *L, const kex_sym *idx, int amt) {
  const kex_sym *r = kex_sym_mul_int(L->sym, kex_sym_div_int(L->sym, idx, amt), amt);
  if (!r) {
    L->oom = true;
    return false;
  }
  return kex_sym_eq(L->sym, idx, r);
}

static kex_const reduce_init(const kex_lop *r) {
  kex_dtype dt = r->dtype;
  if (r->op == KEX_OP_SUM) return kex_dtype_is_float(dt) ? kex_const_float(0.0) : kex_const_int(0);
  if (kex_dtype_is_int(dt))
    return kex_dtype_is_unsigned(dt) ? kex_const_int(0) : kex_const_int(-(int64_t)((1ull << (kex_dtype_size(dt) * 8 - 1)) - 1) - 1);
  return kex_dtype_is_float(dt) ? kex_const_float(-__builtin_inf()) : kex_const_bool(false);
}

static const char *dt_key(kex_udtype d, char *buf, size_t len) {
  snprintf(buf, len, "%s%d", kex_dtypes[d.dt].name, d.vec);
  return buf;
}

/*
 * global_load(i, idxs, acc, barrier, loop_ctx): one uop per upcast
 * combination.  acc != NULL makes accumulators (DEFINE_ACC over loop_ctx).
 */
static int global_load(lower *L, int i, const kex_sym *const *idxs, int n, const kex_lop *acc, const kex_uop *barrier,
                       const kex_uop *const *loop_ctx, uint32_t nloop_ctx, ulist *out) {
  kex_uop_graph *g = &L->g;
  kex_dtype base = acc ? acc->dtype : buf_dtype(L, i);
  bool isconst = buf_is_const(L, i) && !acc;
  kex_const cval = isconst ? L->k->bufs[i].val : kex_const_int(0);
  uint32_t cnt[MAXD], rep[MAXD];
  const kex_sym *cur[MAXD];
  uint32_t total = expand_counts(idxs, n, cnt);
  int dim = -1, amt = float4_amt(L, i, idxs, &dim);
  if (amt < 0) return amt;
  if (dim >= 0) { /* do not use float4 if the index is not aligned */
    const kex_sym *t[MAXD];
    memcpy(t, idxs, (size_t)n * sizeof *t);
    t[dim] = kex_sym_num(L->sym, 0);
    const kex_sym *gi = NULL, *gv = NULL;
    if (kex_st_expr_idxs(L->shape, L->sts[i], t, &gi, &gv)) return KEX_ENOMEM;
    if (!aligned(L, gi, amt)) dim = -1, amt = 1;
    if (L->oom) return KEX_ENOMEM;
  }
  if (dim < 0) amt = 1;
  kex_udtype localtype = kex_ud_vec(base, amt);
  out->n = total;
  out->v = kex_arena_alloc(&L->arena, (size_t)total * sizeof *out->v);
  if (!out->v) return KEX_ENOMEM;
  uint32_t acc_count = 0;
  for (uint32_t c = 0; c < total; c++) {
    combo_idxs(L, idxs, n, cnt, c, cur, rep);
    if (dim >= 0) cur[dim] = kex_sym_num(L->sym, 0);
    const kex_sym *idx = NULL, *valid = NULL;
    if (kex_st_expr_idxs(L->shape, L->sts[i], cur, &idx, &valid)) return KEX_ENOMEM;
    bool this_isconst = isconst;
    kex_const this_const = cval;
    if (valid->max == 0) {
      this_isconst = true;
      this_const = kex_const_int(0);
      idx = kex_sym_num(L->sym, 0);
      valid = kex_sym_num(L->sym, 1);
    }
    const char *ir = kex_sym_render(L->sym, idx), *vr = kex_sym_render(L->sym, valid);
    if (!ir || !vr) return KEX_ENOMEM;
    char tb[32], cb[64], *key;
    if (this_isconst && !acc) kex_const_repr(this_const, cb, sizeof cb);
    else if (i == L->temp) snprintf(cb, sizeof cb, "temp");
    else snprintf(cb, sizeof cb, "%d", L->k->bufs[i].idx);
    size_t kl = strlen(ir) + strlen(vr) + 128;
    key = kex_arena_alloc(&L->arena, kl);
    if (!key) return KEX_ENOMEM;
    snprintf(key, kl, "%d%s%s%s%s|%s", acc != NULL, dt_key(localtype, tb, sizeof tb), this_isconst && !acc ? "CONST" : "",
             cb, ir, vr);
    const kex_uop **slot = cache_slot_for(L, key);
    if (!slot) return KEX_ENOMEM;
    if (!*slot) {
      const kex_uop *u;
      if (acc) {
        kex_uop_arg a = {0};
        a.c = kex_const_as(reduce_init(acc), base);
        a.i[0] = i == L->temp ? -1 : i;
        a.i[1] = acc_count++;
        u = kex_uop_add(g, KEX_UOP_DEFINE_ACC, localtype, loop_ctx, nloop_ctx, &a);
      } else if (this_isconst) {
        u = kex_uop_const(g, localtype, this_const);
        if (valid->min == 0 && valid->max == 1)
          u = kex_uop_alu_dt(g, KEX_OP_WHERE, localtype, render_sym(L, valid), u,
                             kex_uop_const(g, localtype, kex_const_int(0)));
      } else {
        const kex_uop *vin[5] = {L->buf_uops[i], render_sym(L, idx)};
        uint32_t nv = 2;
        if (valid->min == 0) {
          vin[nv++] = render_sym(L, valid);
          vin[nv++] = kex_uop_const(g, localtype, kex_const_int(0));
        }
        if (barrier) vin[nv++] = barrier;
        u = kex_uop_add(g, KEX_UOP_LOAD, localtype, vin, nv, NULL);
      }
      if (!u) return KEX_ENOMEM;
      *slot = u;
    }
    const kex_uop *r = *slot;
    if (dim >= 0) {
      kex_uop_arg a = {0};
      a.i[0] = rep[dim];
      r = kex_uop_add(g, KEX_UOP_GEP, kex_ud(base), &r, 1, &a);
      if (!r) return KEX_ENOMEM;
    }
    out->v[c] = r;
  }
  return 0;
}

static int add_store(lower *L, const kex_uop *s) {
  if (!s) return KEX_ENOMEM;
  if (kex_grow(&L->stores, L->nstores, &L->capstores, sizeof *L->stores, 64)) return KEX_ENOMEM;
  L->stores[L->nstores++] = s;
  return 0;
}

/* global_store(i, idxs, vals): STOREs (grouped to float2/float4 when aligned); *last = the last one. */
static int global_store(lower *L, int i, const kex_sym *const *idxs, int n, const ulist *vals, ulist *made) {
  kex_uop_graph *g = &L->g;
  uint32_t cnt[MAXD], rep[MAXD];
  const kex_sym *cur[MAXD];
  uint32_t total = expand_counts(idxs, n, cnt);
  if (total != vals->n) return KEX_EINTERNAL;
  int dim = -1, amt = float4_amt(L, i, idxs, &dim);
  if (amt < 0) return amt;
  if (dim >= 0) { /* every group must be aligned (tinygrad asserts it; here it falls back to scalar stores) */
    for (uint32_t c = 0; c < total && dim >= 0; c++) {
      combo_idxs(L, idxs, n, cnt, c, cur, rep);
      if (rep[dim]) continue;
      const kex_sym *gi = NULL, *gv = NULL;
      if (kex_st_expr_idxs(L->shape, L->sts[i], cur, &gi, &gv)) return KEX_ENOMEM;
      if (!aligned(L, gi, amt)) dim = -1;
      if (L->oom) return KEX_ENOMEM;
    }
  }
  if (made) {
    made->n = 0;
    made->v = kex_arena_alloc(&L->arena, (size_t)total * sizeof *made->v);
    if (!made->v) return KEX_ENOMEM;
  }
  uint32_t stride = 1;
  if (dim >= 0)
    for (int j = 0; j < dim; j++) stride *= cnt[j];
  for (uint32_t c = 0; c < total; c++) {
    combo_idxs(L, idxs, n, cnt, c, cur, rep);
    const kex_uop *val = vals->v[c];
    if (dim >= 0) {
      if (rep[dim]) continue;
      const kex_uop *grp[4];
      for (int e = 0; e < amt; e++) grp[e] = vals->v[c + (uint32_t)e * stride];
      val = kex_uop_add(g, KEX_UOP_CAST, kex_ud_vec(buf_dtype(L, i), amt), grp, (uint32_t)amt, NULL);
    }
    const kex_sym *idx = NULL, *valid = NULL;
    if (kex_st_expr_idxs(L->shape, L->sts[i], cur, &idx, &valid)) return KEX_ENOMEM;
    const kex_uop *vin[4] = {L->buf_uops[i], render_sym(L, idx), val, NULL};
    uint32_t nv = 3;
    if (valid->min != 1) vin[nv++] = render_sym(L, valid);
    const kex_uop *s = kex_uop_add(g, KEX_UOP_STORE, kex_ud_none(), vin, nv, NULL);
    if (!s) return KEX_ENOMEM;
    if (made) made->v[made->n++] = s;
    int rc = add_store(L, s);
    if (rc) return rc;
  }
  return 0;
}

/* render_loop(vars, depth): RANGE per variable that is not a number; returns them in ctx. */
static int render_loop(lower *L, const kex_sym *const *xx, int n, int depth, const kex_uop **ctx, uint32_t *nctx) {
  *nctx = 0;
  for (int i = 0; i < n; i++) {
    const kex_sym *x = xx[i];
    if (x->kind == KEX_SYM_NUM) continue;
    const kex_uop *vin[2] = {kex_uop_const_int(&L->g, x->min), kex_uop_const_int(&L->g, x->max + 1)};
    kex_uop_arg a = {0};
    a.i[0] = depth;
    a.i[1] = i;
    const kex_uop *r = kex_uop_add(&L->g, KEX_UOP_RANGE, kex_ud(KEX_DT_INT32), vin, 2, &a);
    int rc = set_loop(L, x->name, r);
    if (rc) return rc;
    ctx[(*nctx)++] = r;
  }
  return 0;
}

/* ---- ast_parse ---- */

/* ast_parse's memo: a node's values, keyed by the node's address. */
typedef struct memo_slot {
  const kex_lop *l;
  ulist v;
} memo_slot;

static bool memo_slot_eq(const void *entry, const void *probe) { return ((const memo_slot *)entry)->l == probe; }

static const kex_dict_type memo_type = {sizeof(memo_slot), memo_slot_eq, 256};

static uint64_t lop_ptr_hash(const kex_lop *l) { return kex_hash_u64(0, (uint64_t)(uintptr_t)l); }

static memo_slot *memo_find(const kex_dict *memo, const kex_lop *l) { return kex_dict_find(memo, lop_ptr_hash(l), l); }

static int buf_index(const lower *L, const kex_lop *l) {
  const kex_kernel *k = L->k;
  for (uint32_t j = k->nout; j < k->nbufs; j++) {
    const kex_kernel_buf *b = &k->bufs[j];
    bool cb = b->op == KEX_OP_BCONST, cl = l->op == KEX_OP_BCONST;
    if (cb != cl || b->dtype != l->dtype || b->st != l->st) continue;
    if (cb ? kex_const_eq(b->val, l->val) : b->idx == l->idx) return (int)j;
  }
  return -1;
}

/*
 * ast_parse(x, accs, offs, do_reduce): the uops of x for every upcast
 * combination.  With do_reduce, a reduce node folds its values into
 * accs->v (at offs) and ends each changed accumulator with a PHI.
 */
static int ast_parse(lower *L, const kex_lop *root, ulist *accs, const int64_t *offs, uint32_t noffs, bool do_reduce,
                     ulist *result) {
  int rc = 0;
  kex_dict memo = kex_dict_make(&memo_type);
  typedef struct { const kex_lop *l; int next; } frame;
  uint32_t scap = 64, sp = 0;
  frame *st = kex_malloc(scap * sizeof *st);
  if (!st) goto oom;
  st[sp++] = (frame){root, 0};
  while (sp) {
    frame *f = &st[sp - 1];
    const kex_lop *x = f->l;
    if (memo_find(&memo, x)) {
      sp--;
      continue;
    }
    ulist res = {0};
    bool leaf = KEX_OP_IS_BUFFER(x->op) || (KEX_OP_IS_REDUCE(x->op) && !do_reduce);
    if (!leaf && f->next < x->nsrc) {
      const kex_lop *c = x->src[f->next++];
      if (!memo_find(&memo, c)) {
        if (sp == scap) {
          scap *= 2;
          frame *ns = kex_realloc(st, scap * sizeof *ns);
          if (!ns) goto oom;
          st = ns;
        }
        st[sp++] = (frame){c, 0};
      }
      continue;
    }
    if (KEX_OP_IS_BUFFER(x->op)) {
      int bi = buf_index(L, x);
      if (bi < 0 || !L->loaded[bi].v) {
        rc = KEX_EINTERNAL;
        goto out;
      }
      res = L->loaded[bi];
    } else if (KEX_OP_IS_REDUCE(x->op) && !do_reduce) {
      res = *accs;
    } else {
      const ulist *vals[3];
      for (int s = 0; s < x->nsrc; s++) {
        const memo_slot *cs = memo_find(&memo, x->src[s]);
        if (!cs) {
          rc = KEX_EINTERNAL;
          goto out;
        }
        vals[s] = &cs->v;
        if (s && vals[s]->n != vals[0]->n) {
          rc = KEX_EINTERNAL;
          goto out;
        }
      }
      uint32_t n = vals[0]->n;
      res.n = n;
      res.v = kex_arena_alloc(&L->arena, (size_t)(n ? n : 1) * sizeof *res.v);
      if (!res.v) goto oom;
      if (x->op == KEX_OP_CAST || x->op == KEX_OP_BITCAST) {
        for (uint32_t j = 0; j < n; j++)
          res.v[j] = kex_uop_1(&L->g, x->op == KEX_OP_BITCAST ? KEX_UOP_BITCAST : KEX_UOP_CAST, kex_ud(x->cast_to),
                               vals[0]->v[j]);
      } else if (KEX_OP_IS_REDUCE(x->op)) {
        if (n != noffs) {
          rc = KEX_EINTERNAL;
          goto out;
        }
        const kex_uop **input = kex_arena_alloc(&L->arena, (size_t)accs->n * sizeof *input);
        if (!input) goto oom;
        memcpy(input, accs->v, accs->n * sizeof *input);
        kex_op op = x->op == KEX_OP_SUM ? KEX_OP_ADD : KEX_OP_MAX;
        for (uint32_t j = 0; j < n; j++) {
          int64_t off = offs[j];
          if (off < 0 || (uint64_t)off >= accs->n) {
            rc = KEX_EINTERNAL;
            goto out;
          }
          accs->v[off] = kex_uop_alu_dt(&L->g, op, accs->v[off]->dtype, vals[0]->v[j], accs->v[off], NULL);
          res.v[j] = accs->v[off];
        }
        for (uint32_t o = 0; o < accs->n; o++)
          if (input[o] != accs->v[o]) {
            const kex_uop *pv[2] = {input[o], accs->v[o]};
            accs->v[o] = kex_uop_add(&L->g, KEX_UOP_PHI, input[o]->dtype, pv, 2, NULL);
          }
      } else {
        for (uint32_t j = 0; j < n; j++) {
          const kex_uop *a = vals[0]->v[j], *b = x->nsrc > 1 ? vals[1]->v[j] : NULL, *c = x->nsrc > 2 ? vals[2]->v[j] : NULL;
          res.v[j] = kex_uop_alu(&L->g, x->op, a, b, c);
        }
      }
      for (uint32_t j = 0; j < n; j++)
        if (!res.v[j]) goto oom;
    }
    bool found;
    memo_slot *ms = kex_dict_insert(&memo, lop_ptr_hash(x), x, &found);
    if (!ms) goto oom;
    *ms = (memo_slot){x, res};
    sp--;
  }
  *result = memo_find(&memo, root)->v;
  goto out;
oom:
  rc = KEX_ENOMEM;
out:
  kex_dict_free(&memo);
  kex_free(st);
  return rc;
}

/* ---- get_grouped_dims ---- */

static int grouped_dims(lower *L, const char *prefix, int start, const int64_t *dims, int n, int maxdim,
                        const kex_sym **idxs, const kex_sym **loop, int *nloop) {
  const kex_sym *v[MAXD];
  int nv = 0;
  *nloop = 0;
  if (maxdim && n > maxdim) {
    int lead = n - (maxdim - 1);
    int64_t p = 1;
    for (int i = 0; i < lead; i++) p *= dims[i];
    v[nv++] = var(L, prefix, start, p);
    for (int i = lead; i < n; i++, nv++) v[nv] = var(L, prefix, start + nv, dims[i]);
    const kex_sym *dd = v[0];
    for (int i = 0; i < lead; i++) {
      idxs[i] = kex_sym_mod_int(L->sym, dd, dims[i]);
      dd = kex_sym_div_int(L->sym, dd, dims[i]);
    }
    for (int i = lead; i < n; i++) idxs[i] = v[1 + i - lead];
  } else {
    for (int i = 0; i < n; i++) idxs[i] = v[nv++] = var(L, prefix, start + i, dims[i]);
  }
  for (int i = 0; i < nv; i++) {
    if (!v[i]) return KEX_ENOMEM;
    if (v[i]->kind != KEX_SYM_NUM) loop[(*nloop)++] = v[i];
  }
  for (int i = 0; i < n; i++)
    if (!idxs[i]) return KEX_ENOMEM;
  return 0;
}

static int permute_last(lower *L, int j) {
  int order[MAXD], p = 0;
  for (int i = 0; i < L->shape_len; i++)
    if (i != j) order[p++] = i;
  order[p++] = j;
  for (uint32_t i = 0; i < L->nbufs; i++)
    if (!(L->sts[i] = kex_st_permute(L->shape, L->sts[i], order))) return KEX_ENOMEM;
  return 0;
}

/* ---- linearize ---- */

/*
 * The index variables of one lowering (tinygrad's linearize locals): global
 * and local index expressions, the upcast indexes, and what the reduce
 * leaves for the late AST (the fake reduce zeros, the local indexes after a
 * grouped reduce).
 */
typedef struct lin_idx {
  const kex_sym *zero;
  const kex_sym *gidx[MAXD], *lidx[MAXD], *up[MAXD];
  int nlocal; /* local dims plus the group dims */
  bool has_local;
  const kex_sym *fake_reduce[MAXD], *lidx_after[MAXD];
  int nfake_reduce, nlidx_after;
} lin_idx;

/* DEFINE_GLOBAL for every buffer, and the DEFINE_LOCAL temp of a grouped reduce with its ShapeTracker. */
static int define_buffers(lower *L) {
  const kex_kernel *k = L->k;
  for (uint32_t i = 0; i < k->nbufs; i++) {
    if (k->bufs[i].op == KEX_OP_BCONST) continue;
    kex_uop_arg a = {0};
    a.i[0] = k->bufs[i].idx;
    for (uint32_t o = 0; o < k->nout; o++) a.i[1] |= k->bufs[o].idx == k->bufs[i].idx;
    if (!(L->buf_uops[i] = kex_uop_add(&L->g, KEX_UOP_DEFINE_GLOBAL, kex_ud_ptr(k->bufs[i].dtype), NULL, 0, &a)))
      return KEX_ENOMEM;
  }
  if (L->temp < 0) return 0;
  int sl = L->shape_len, gd = L->global_dims, ld = L->local_dims, fr = L->first_reduce;
  const int64_t *full = full_shape(L);
  int64_t ts[MAXD], usz[MAXD];
  bool ured[MAXD];
  int p = 0;
  for (int i = 0; i < gd; i++) ts[p++] = 1;
  for (int i = gd; i < gd + ld + L->group; i++) ts[p++] = full[i];
  for (int i = 0; i < sl - L->upcasted - L->group - fr; i++) ts[p++] = 1;
  upcasted_axis(L, 0, usz, ured);
  for (int i = 0; i < L->upcasted; i++) ts[p++] = usz[i];
  if (!(L->sts[L->temp] = kex_st_from_shape(L->shape, p, ts))) return KEX_ENOMEM;
  kex_uop_arg a = {0};
  a.name = "temp";
  a.i[0] = kex_st_size(L->sts[L->temp]);
  if (!(L->buf_uops[L->temp] = kex_uop_add(&L->g, KEX_UOP_DEFINE_LOCAL, kex_ud_ptr(L->temp_dtype), NULL, 0, &a)))
    return KEX_ENOMEM;
  return 0;
}

/* The kernel's function name into out->name: its base name, numbered when names has seen it before. */
static int name_kernel(lower *L, kex_name_counter *names, kex_program_src *out, kex_error *err) {
  char base[KEX_PROGRAM_NAME_MAX];
  if (kex_kernel_name(L->k, base, sizeof base) >= (int)sizeof base - 8)
    return kex_err_set(err, KEX_ELIMIT, "lower: kernel name too long");
  snprintf(out->name, sizeof out->name, "%s", base);
  if (names) {
    int cnt = name_count(names, base);
    if (cnt < 0) return cnt;
    if (cnt > 1) {
      size_t bl = strlen(base);
      snprintf(out->name + bl, sizeof out->name - bl, "n%d", (cnt - 1) % 1000000);
    }
  }
  return 0;
}

/* The global, local and upcast indexes, and how they run: SPECIAL uops and launch sizes (OpenCL) or loops. */
static int define_indexes(lower *L, lin_idx *x, kex_program_src *out) {
  const kex_kernel *k = L->k;
  int rc, sl = L->shape_len, gd = L->global_dims, ld = L->local_dims;
  const int64_t *full = full_shape(L);
  x->has_local = L->caps->has_local && L->dialect == KEX_DIALECT_OPENCL;
  const kex_sym *lg[MAXD], *ll[MAXD];
  int nlg, nll;
  x->nlocal = ld + L->group;
  if ((rc = grouped_dims(L, "gidx", 0, full, gd, x->has_local ? 3 : 0, x->gidx, lg, &nlg))) return rc;
  if ((rc = grouped_dims(L, "lidx", gd, full + gd, x->nlocal, x->has_local ? 3 : 0, x->lidx, ll, &nll))) return rc;
  const int64_t *os = out_shape(L);
  for (int i = 0; i < L->upcasted; i++)
    if (!(x->up[i] = var(L, "_uidx", i, os[sl - L->upcasted + i]))) return KEX_ENOMEM;
  for (int d = 0; d < 3; d++) out->global[d] = out->local[d] = 1;
  out->has_local = false;
  if (L->dialect == KEX_DIALECT_OPENCL && (k->dont_use_locals || x->has_local)) {
    if (nlg > 3 || nll > 3) return KEX_EINTERNAL;
    for (int i = 0; i < nlg; i++) {
      out->global[nlg - 1 - i] = (size_t)(lg[i]->max + 1);
      char nm[32];
      snprintf(nm, sizeof nm, "%s", lg[i]->name);
      if (k->dont_use_locals) snprintf(nm, sizeof nm, "idx%s", lg[i]->name + 4);
      kex_uop_arg a = {0};
      a.i[0] = nlg - 1 - i;
      a.i[1] = lg[i]->max + 1;
      a.name = nm;
      if ((rc = set_loop(L, lg[i]->name, kex_uop_add(&L->g, KEX_UOP_SPECIAL, kex_ud(KEX_DT_INT32), NULL, 0, &a)))) return rc;
    }
    if (!k->dont_use_locals) {
      out->has_local = true;
      for (int i = 0; i < nll; i++) {
        out->local[i] = (size_t)(ll[i]->max + 1);
        kex_uop_arg a = {0};
        a.i[0] = i;
        a.i[1] = ll[i]->max + 1;
        a.name = ll[i]->name;
        if ((rc = set_loop(L, ll[i]->name, kex_uop_add(&L->g, KEX_UOP_SPECIAL, kex_ud(KEX_DT_INT32), NULL, 0, &a)))) return rc;
      }
    }
  } else {
    const kex_sym *xx[2 * MAXD];
    const kex_uop *ctx[2 * MAXD];
    uint32_t nctx;
    memcpy(xx, lg, (size_t)nlg * sizeof *xx);
    memcpy(xx + nlg, ll, (size_t)nll * sizeof *xx);
    if ((rc = render_loop(L, xx, nlg + nll, 1, ctx, &nctx))) return rc;
    if (L->dialect == KEX_DIALECT_CPU && nlg) out->global[0] = (size_t)(lg[0]->max + 1);
  }
  x->nlidx_after = x->nlocal;
  memcpy(x->lidx_after, x->lidx, (size_t)x->nlocal * sizeof *x->lidx_after);
  return 0;
}

/* Set early[b] for every kernel buffer b that a LOAD/CONST under the reduce reads (a walk of its sub-AST). */
static int mark_early_buffers(lower *L, bool *early) {
  kex_ptrmap seen = {0};
  const kex_lop **stk = NULL;
  uint32_t sp = 0, scap = 0;
  int rc = 0;
  const kex_lop *root = L->k->reduceop;
  for (const kex_lop *x = root; x; x = sp ? stk[--sp] : NULL) {
    if (kex_ptrmap_find(&seen, x, NULL)) continue;
    if (kex_ptrmap_put(&seen, x, NULL, NULL)) goto oom;
    if (KEX_OP_IS_BUFFER(x->op)) {
      int bi = buf_index(L, x);
      if (bi >= 0) early[bi] = true;
      continue;
    }
    if (sp + (uint32_t)x->nsrc > scap) {
      scap = scap ? scap * 2 : 64;
      const kex_lop **ns = kex_realloc(stk, scap * sizeof *ns);
      if (!ns) goto oom;
      stk = ns;
    }
    for (int s = x->nsrc - 1; s >= 0; s--) stk[sp++] = x->src[s];
  }
  goto out;
oom:
  rc = KEX_ENOMEM;
out:
  kex_free(stk);
  kex_ptrmap_free(&seen);
  return rc;
}

/*
 * A grouped reduce's second half: store the partial accumulators to the
 * local temp, barrier, and reduce the temp over the group dims in late
 * loops (upcasting the axes tinygrad upcasts in the middle of the reduce).
 */
static int lower_group_reduce(lower *L, lin_idx *x, ulist *accs, int nr) {
  const kex_kernel *k = L->k;
  kex_uop_graph *g = &L->g;
  int rc, p, sl = L->shape_len, gd = L->global_dims, ld = L->local_dims, fr = L->first_reduce;
  const int64_t *full = full_shape(L), *os;
  const kex_sym *fake_global[MAXD], *sx[MAXD], *ix[MAXD];
  for (int i = 0; i < gd; i++) fake_global[i] = x->zero;
  p = 0;
  for (int i = 0; i < gd; i++) sx[p++] = x->zero;
  for (int i = 0; i < x->nlocal; i++) sx[p++] = x->lidx[i];
  for (int i = 0; i < nr; i++) sx[p++] = x->fake_reduce[i];
  for (int i = 0; i < L->upcasted; i++) sx[p++] = x->up[i];
  ulist st_made;
  if ((rc = global_store(L, L->temp, sx, p, accs, &st_made))) return rc;
  const kex_uop *barrier = kex_uop_add(g, KEX_UOP_BARRIER, kex_ud_none(), st_made.v, st_made.n, NULL);
  if (x->has_local) {
    const kex_sym *fk[MAXD];
    int tn = kex_st_ndim(L->sts[L->temp]);
    for (int i = 0; i < tn; i++) fk[i] = x->zero;
    for (int i = ld; i < x->nlocal; i++) fk[gd + i] = x->lidx[i];
    const kex_sym *ti = NULL, *tv = NULL;
    if (kex_st_expr_idxs(L->shape, L->sts[L->temp], fk, &ti, &tv)) return KEX_ENOMEM;
    const kex_uop *iv[2] = {render_sym(L, kex_sym_create_lt(L->sym, ti, 1)), barrier};
    barrier = kex_uop_add(g, KEX_UOP_IF, kex_ud_none(), iv, 2, NULL);
  }
  if (!barrier) return KEX_ENOMEM;
  /* late reduce loops over the group dims */
  uint64_t mid = kex_kernel_upcast_in_mid_reduce_axes(k);
  const kex_sym *end_local[MAXD];
  int nend = fr + L->group;
  for (int i = 0; i < nend; i++) {
    int64_t hi = (i >= fr && !((mid >> i) & 1)) ? full[i] : 1;
    if (!(end_local[i] = var(L, "tidx", i, hi))) return KEX_ENOMEM;
  }
  int nl2 = 0;
  const kex_sym *late_local[MAXD];
  for (int i = 0; i < ld; i++) late_local[nl2++] = x->lidx[i];
  for (int i = gd + ld; i < nend; i++) late_local[nl2++] = end_local[i];
  for (int j = 0; j < sl; j++) {
    if (!((mid >> j) & 1)) continue;
    if ((rc = permute_last(L, j))) return rc;
    L->upcasted++;
    L->group--;
    nl2--;
    nend--;
    os = out_shape(L);
    for (int i = 0; i < L->upcasted; i++)
      if (!(x->up[i] = var(L, "_uidx", i, os[sl - L->upcasted + i]))) return KEX_ENOMEM;
  }
  const kex_uop *late_ctx[MAXD];
  uint32_t nlate_ctx;
  if ((rc = render_loop(L, end_local, nend, 3, late_ctx, &nlate_ctx))) return rc;
  p = 0;
  for (int i = 0; i < gd; i++) ix[p++] = fake_global[i];
  for (int i = 0; i < nl2; i++) ix[p++] = late_local[i];
  for (int i = 0; i < nr; i++) ix[p++] = x->fake_reduce[i];
  for (int i = 0; i < L->upcasted; i++) ix[p++] = x->up[i];
  if ((rc = global_load(L, 0, ix, p, k->reduceop, NULL, late_ctx, nlate_ctx, accs))) return rc;
  if ((rc = global_load(L, L->temp, ix, p, NULL, barrier, NULL, 0, &L->loaded[L->temp]))) return rc;
  uint32_t noffs;
  int64_t *offs = acc_offsets(L, L->temp, &noffs);
  if (!offs) return KEX_ENOMEM;
  /* LazyOp(reduceop.op, (LOAD temp,)): fold the temp values into the late accumulators */
  const ulist *vals = &L->loaded[L->temp];
  if (vals->n != noffs) return KEX_EINTERNAL;
  const kex_uop **input = kex_arena_alloc(&L->arena, (size_t)accs->n * sizeof *input);
  if (!input) return KEX_ENOMEM;
  memcpy(input, accs->v, accs->n * sizeof *input);
  kex_op rop = k->reduceop->op == KEX_OP_SUM ? KEX_OP_ADD : KEX_OP_MAX;
  for (uint32_t j = 0; j < noffs; j++) {
    if (offs[j] < 0 || (uint64_t)offs[j] >= accs->n) return KEX_EINTERNAL;
    const kex_uop *a = accs->v[offs[j]];
    if (!a) return KEX_ENOMEM;
    accs->v[offs[j]] = kex_uop_alu_dt(g, rop, a->dtype, vals->v[j], a, NULL);
  }
  for (uint32_t o = 0; o < accs->n; o++)
    if (input[o] != accs->v[o]) {
      const kex_uop *pv[2] = {input[o], accs->v[o]};
      accs->v[o] = kex_uop_add(g, KEX_UOP_PHI, input[o] ? input[o]->dtype : kex_ud_none(), pv, 2, NULL);
    }
  cache_clear(L);
  x->nlidx_after = 0;
  for (int i = 0; i < ld; i++) x->lidx_after[x->nlidx_after++] = x->lidx[i];
  for (int i = 0; i < L->group; i++) x->lidx_after[x->nlidx_after++] = x->zero;
  return 0;
}

/*
 * The reduce: its loops, the accumulators (loaded with the reduce's
 * identity), the early buffers under it and the reduce AST folded into the
 * accumulators; then a grouped reduce's second half.
 */
static int lower_reduce(lower *L, lin_idx *x, ulist *accs) {
  const kex_kernel *k = L->k;
  int rc, sl = L->shape_len, gd = L->global_dims, fr = L->first_reduce;
  const int64_t *full = full_shape(L);
  const kex_sym *fup[MAXD], *ridx[MAXD], *ix[MAXD];
  for (int i = 0; i < L->upcasted; i++)
    if (!(fup[i] = var(L, "_uidx", i, full[sl - L->upcasted + i]))) return KEX_ENOMEM;
  int nr = 0;
  for (int i = fr + L->group; i < sl - L->upcasted; i++, nr++) {
    if (!(ridx[nr] = var(L, "ridx", i, full[i]))) return KEX_ENOMEM;
    x->fake_reduce[nr] = x->zero;
  }
  x->nfake_reduce = nr;
  const kex_uop *loop_ctx[MAXD];
  uint32_t nloop_ctx;
  if ((rc = render_loop(L, ridx, nr, 2, loop_ctx, &nloop_ctx))) return rc;
  int p = 0;
  for (int i = 0; i < gd; i++) ix[p++] = x->gidx[i];
  for (int i = 0; i < x->nlocal; i++) ix[p++] = x->lidx[i];
  for (int i = 0; i < nr; i++) ix[p++] = x->fake_reduce[i];
  for (int i = 0; i < L->upcasted; i++) ix[p++] = x->up[i];
  int out_buf = L->group ? L->temp : 0;
  if ((rc = global_load(L, out_buf, ix, p, k->reduceop, NULL, loop_ctx, nloop_ctx, accs))) return rc;
  /* early buffers: every LOAD/CONST under the reduce */
  p = 0;
  for (int i = 0; i < gd; i++) ix[p++] = x->gidx[i];
  for (int i = 0; i < x->nlocal; i++) ix[p++] = x->lidx[i];
  for (int i = 0; i < nr; i++) ix[p++] = ridx[i];
  for (int i = 0; i < L->upcasted; i++) ix[p++] = fup[i];
  bool *early = kex_calloc(L->nbufs, sizeof *early);
  if (!early) return KEX_ENOMEM;
  rc = mark_early_buffers(L, early);
  for (uint32_t i = 0; !rc && i < k->nbufs; i++)
    if (early[i]) rc = global_load(L, (int)i, ix, p, NULL, NULL, NULL, 0, &L->loaded[i]);
  kex_free(early);
  if (rc) return rc;
  uint32_t noffs;
  int64_t *offs = acc_offsets(L, k->full_buf_index, &noffs);
  if (!offs) return KEX_ENOMEM;
  ulist dummy;
  if ((rc = ast_parse(L, k->reduceop, accs, offs, noffs, true, &dummy))) return rc;
  cache_clear(L);
  return L->group ? lower_group_reduce(L, x, accs, nr) : 0;
}

/* Load the late buffers, and each output's AST stored through its STORE. */
static int lower_late(lower *L, const lin_idx *x, ulist *accs) {
  const kex_kernel *k = L->k;
  const kex_sym *ix[MAXD];
  int rc, p = 0;
  for (int i = 0; i < L->global_dims; i++) ix[p++] = x->gidx[i];
  for (int i = 0; i < x->nlidx_after; i++) ix[p++] = x->lidx_after[i];
  for (int i = 0; i < x->nfake_reduce; i++) ix[p++] = x->fake_reduce[i];
  for (int i = 0; i < L->upcasted; i++) ix[p++] = x->up[i];
  if (p != L->shape_len) return KEX_EINTERNAL;
  for (uint32_t i = k->nout; i < k->nbufs; i++)
    if (!L->loaded[i].v && (rc = global_load(L, (int)i, ix, p, NULL, NULL, NULL, 0, &L->loaded[i]))) return rc;
  for (uint32_t o = 0; o < k->nout; o++) {
    ulist val;
    if ((rc = ast_parse(L, k->ast[o]->src[0], accs, NULL, 0, false, &val))) return rc;
    if ((rc = global_store(L, (int)o, ix, p, &val, NULL))) return rc;
  }
  return 0;
}

/* tinygrad's Linearizer.linearize: the kernel's uops, in order, named and sized into out. */
static int linearize(lower *L, kex_name_counter *names, kex_program_src *out, kex_error *err) {
  lin_idx x = {.zero = kex_sym_num(L->sym, 0)};
  ulist accs = {0};
  int rc;
  if (!x.zero) return KEX_ENOMEM;
  if ((rc = define_buffers(L)) || (rc = name_kernel(L, names, out, err)) || (rc = define_indexes(L, &x, out)))
    return rc;
  if (L->k->reduceop && (rc = lower_reduce(L, &x, &accs))) return rc;
  if ((rc = lower_late(L, &x, &accs))) return rc;
  if (L->g.oom) return KEX_ENOMEM;
  return kex_uop_linearize(&L->g, L->stores, L->nstores, err);
}

int kex_lower_kernel(const kex_kernel *k, const kex_renderer_caps *caps, int dialect, kex_name_counter *names,
                     kex_program_src *out, kex_error *err) {
  lower L;
  memset(&L, 0, sizeof L);
  memset(out, 0, sizeof *out);
  int rc = 0;
  L.k = k;
  L.caps = caps ? caps : k->opts;
  L.dialect = dialect;
  L.shape = k->shape;
  L.sym = kex_shape_sym(k->shape);
  kex_uop_graph_init(&L.g);
  kex_arena_init(&L.arena, 0);
  L.cache = kex_dict_make(&cache_type);
  L.shape_len = kex_kernel_shape_len(k);
  L.upcasted = k->upcasted;
  L.group = k->group_for_reduces;
  L.local_dims = k->local_dims;
  L.first_reduce = kex_kernel_first_reduce(k);
  L.global_dims = L.first_reduce - L.local_dims;
  L.temp = -1;
  if (dialect != KEX_DIALECT_OPENCL && dialect != KEX_DIALECT_CPU) {
    rc = kex_err_set(err, KEX_EINVAL, "lower: unknown dialect %d", dialect);
    goto out;
  }
  if (dialect == KEX_DIALECT_CPU && (L.local_dims || L.group || k->dont_use_locals)) {
    rc = kex_err_set(err, KEX_EUNSUPPORTED, "lower: the cpu dialect has no local dims (kernel has %d local, %d group)",
                     L.local_dims, L.group);
    goto out;
  }
  L.nbufs = k->nbufs + (L.group ? 1 : 0);
  if (L.group) {
    L.temp = (int)k->nbufs;
    L.temp_dtype = k->reduceop ? k->reduceop->dtype : KEX_DT_FLOAT32;
  }
  L.sts = kex_calloc(L.nbufs, sizeof *L.sts);
  L.buf_uops = kex_calloc(L.nbufs, sizeof *L.buf_uops);
  L.loaded = kex_calloc(L.nbufs, sizeof *L.loaded);
  if (!L.sts || !L.buf_uops || !L.loaded) {
    rc = KEX_ENOMEM;
    goto out;
  }
  for (uint32_t i = 0; i < k->nbufs; i++) L.sts[i] = k->sts[i];
  if (L.group) L.sts[L.temp] = k->sts[0];
  if ((rc = linearize(&L, names, out, err))) goto out;
  if (kex_lower_debug) kex_uop_print(&L.g, stderr);
  if ((rc = kex_render_cstyle(dialect, out->name, &L.g, &out->src, err))) goto out;
  /* arguments: the DEFINE_GLOBALs in program order */
  for (uint32_t i = 0; i < L.g.nlinear; i++) out->nargs += L.g.linear[i]->uop == KEX_UOP_DEFINE_GLOBAL;
  out->args = kex_calloc(out->nargs ? out->nargs : 1, sizeof *out->args);
  if (!out->args) {
    rc = KEX_ENOMEM;
    goto out;
  }
  out->nargs = 0;
  for (uint32_t i = 0; i < L.g.nlinear; i++) {
    const kex_uop *u = L.g.linear[i];
    if (u->uop != KEX_UOP_DEFINE_GLOBAL) continue;
    kex_program_arg *a = &out->args[out->nargs++];
    a->idx = (int32_t)u->arg.i[0];
    a->is_output = u->arg.i[1] != 0;
    a->dtype = u->dtype.dt;
    for (uint32_t j = 0; j < k->nbufs; j++)
      if (k->bufs[j].op != KEX_OP_BCONST && k->bufs[j].idx == a->idx) {
        int64_t rs = kex_st_real_size(k->shape, k->bufs[j].st);
        if (rs < 0) {
          rc = KEX_ENOMEM;
          goto out;
        }
        if (rs > a->size) a->size = rs;
      }
  }
  int64_t flops, mem;
  kex_uop_flops_mem(&L.g, &flops, &mem);
  int64_t run = 1;
  if (dialect == KEX_DIALECT_OPENCL)
    for (int d = 0; d < 3; d++) run *= (int64_t)out->global[d] * (out->has_local ? (int64_t)out->local[d] : 1);
  out->op_estimate = flops * run;
  out->mem_estimate = mem * run;
  out->nuops = L.g.nlinear;
out:
  if (rc == KEX_ENOMEM) kex_err_set(err, KEX_ENOMEM, "lower: out of memory");
  else if (rc == KEX_EINTERNAL && err && !err->msg[0]) kex_err_set(err, KEX_EINTERNAL, "lower: internal error lowering %s", out->name);
  else if (rc == KEX_ELIMIT && err && !err->msg[0]) kex_err_set(err, KEX_ELIMIT, "lower: too many loops");
  if (rc) kex_program_src_free(out);
  kex_free(L.sts);
  kex_free(L.buf_uops);
  kex_free(L.loaded);
  kex_dict_free(&L.cache);
  kex_free(L.stores);
  kex_uop_graph_free(&L.g);
  kex_arena_destroy(&L.arena);
  return rc;
}

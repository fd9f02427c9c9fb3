/*
 * kernel.c - tinygrad 0.9.0's Kernel (codegen/kernel.py, spec section 7).
 *
 * The pass takes the STOREs of one scheduled kernel and builds the kernel's
 * view of it: the buffer list (outputs, then LOAD/CONST args deduplicated in
 * preorder), one ShapeTracker per buffer, the single reduce, and the normal
 * form (reduce dims last, size-1 dims dropped, mergeable neighbours merged).
 * Opts then reshape and permute every ShapeTracker together (shift_to) and
 * move the boundaries between the global / local / group / reduce / upcast
 * regions.  apply_opt checks every precondition tinygrad checks, in the same
 * order and with the same messages, and restores the kernel when one fails.
 *
 * AST walks use explicit stacks (kernel ASTs can be long chains).
 */
#include "codegen/kernel.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/ptrmap.h"

const kex_renderer_caps kex_renderer_opencl = {"GPU", true, true, true, false, 32768, 0};
const kex_renderer_caps kex_renderer_cpu = {"CLANG", false, true, false, false, 32768, 0};

static const char *const optop_names[KEX_OPT_COUNT] = {
#define XX(name) #name,
    KEX_OPTOP_MAP(XX)
#undef XX
};

const char *kex_optop_name(kex_optop op) { return (unsigned)op < KEX_OPT_COUNT ? optop_names[op] : "?"; }

static int fmt_opt_field(char *buf, size_t len, int32_t v) {
  return v == KEX_OPT_NONE ? snprintf(buf, len, "None") : snprintf(buf, len, "%d", (int)v);
}

int kex_opt_repr(kex_opt o, char *buf, size_t len) {
  char a[16], m[16];
  fmt_opt_field(a, sizeof a, o.axis);
  fmt_opt_field(m, sizeof m, o.amt);
  return snprintf(buf, len, "Opt(op=OptOps.%s, axis=%s, amt=%s)", kex_optop_name(o.op), a, m);
}

int kex_opt_short(kex_opt o, char *buf, size_t len) {
  if (o.op == KEX_OPT_NOLOCALS) return snprintf(buf, len, "NOLOCALS");
  char a[16], m[16];
  fmt_opt_field(a, sizeof a, o.axis);
  fmt_opt_field(m, sizeof m, o.amt);
  return snprintf(buf, len, "%s(%s,%s)", kex_optop_name(o.op), a, m);
}

/* ---- small helpers ---- */

static int64_t prod_range(const int64_t *v, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= v[i];
  return p;
}

/* A growable stack of node pointers (explicit-stack AST walks). */
typedef struct lop_stack {
  uint32_t len, cap;
  const kex_lop **v;
} lop_stack;

static int stack_push(lop_stack *s, const kex_lop *l) {
  if (kex_grow(&s->v, s->len, &s->cap, sizeof *s->v, 64)) return KEX_ENOMEM;
  s->v[s->len++] = l;
  return 0;
}

/* Insert l into the visited set; returns 1 if it was new, 0 if already there, KEX_ENOMEM. */
static int set_add(kex_ptrmap *s, const kex_lop *l) {
  if (kex_ptrmap_find(s, l, NULL)) return 0;
  return kex_ptrmap_put(s, l, NULL, NULL) ? KEX_ENOMEM : 1;
}

/*
 * Preorder of the distinct nodes under roots[0..nroots-1] (LazyOp.lazyops,
 * flattened over the roots and deduplicated) into *out (heap, caller frees).
 */
static int preorder(const kex_lop *const *roots, uint32_t nroots, lop_stack *out) {
  lop_stack st = {0};
  kex_ptrmap seen = {0};
  int rc = 0;
  for (uint32_t r = 0; r < nroots && !rc; r++) {
    if ((rc = stack_push(&st, roots[r]))) break;
    while (st.len) {
      const kex_lop *l = st.v[--st.len];
      int isnew = set_add(&seen, l);
      if (isnew < 0) {
        rc = isnew;
        break;
      }
      if (!isnew) continue;
      if ((rc = stack_push(out, l))) break;
      for (int i = l->nsrc - 1; i >= 0; i--)
        if ((rc = stack_push(&st, l->src[i]))) break;
      if (rc) break;
    }
  }
  kex_free(st.v);
  kex_ptrmap_free(&seen);
  return rc;
}

/* LazyOp value equality (dataclass ==), walked with an explicit stack. 1, 0 or KEX_ENOMEM. */
static int lop_same(const kex_lop *a, const kex_lop *b) {
  lop_stack st = {0};
  int rc = 1;
  if (stack_push(&st, a) || stack_push(&st, b)) {
    rc = KEX_ENOMEM;
    goto out;
  }
  while (st.len) {
    const kex_lop *y = st.v[--st.len], *x = st.v[--st.len];
    if (x == y) continue;
    if (x->op != y->op || x->dtype != y->dtype || x->nsrc != y->nsrc || x->idx != y->idx || x->st != y->st ||
        x->cast_to != y->cast_to || x->axis_mask != y->axis_mask ||
        (x->op == KEX_OP_BCONST && !kex_const_eq(x->val, y->val))) {
      rc = 0;
      goto out;
    }
    for (int i = 0; i < x->nsrc; i++)
      if (stack_push(&st, x->src[i]) || stack_push(&st, y->src[i])) {
        rc = KEX_ENOMEM;
        goto out;
      }
  }
out:
  kex_free(st.v);
  return rc;
}

/* MemBuffer / ConstBuffer equality (LOAD and STORE args are both MemBuffers). */
static bool buf_eq(const kex_kernel_buf *a, const kex_kernel_buf *b) {
  bool ca = a->op == KEX_OP_BCONST, cb = b->op == KEX_OP_BCONST;
  if (ca != cb || a->dtype != b->dtype || a->st != b->st) return false;
  return ca ? kex_const_eq(a->val, b->val) : a->idx == b->idx;
}

static kex_kernel_buf buf_of(const kex_lop *l) {
  kex_kernel_buf b = {l->op, l->op == KEX_OP_BCONST ? -1 : l->idx, l->dtype, l->st, l->val, l};
  return b;
}

/* ---- derived values ---- */

int kex_kernel_first_reduce(const kex_kernel *k) {
  int n = kex_kernel_shape_len(k) - k->upcasted;
  const int64_t *o = kex_kernel_output_shape(k), *f = kex_kernel_full_shape(k);
  for (int i = 0; i < n; i++)
    if (o[i] != f[i]) return i;
  return n;
}

uint64_t kex_kernel_upcast_in_mid_reduce_axes(const kex_kernel *k) {
  int fr = kex_kernel_first_reduce(k);
  const int64_t *o = kex_kernel_output_shape(k), *f = kex_kernel_full_shape(k);
  uint64_t m = 0;
  for (int j = fr; j < fr + k->group_for_reduces; j++)
    if (f[j] == o[j]) m |= 1ull << j;
  return m;
}

int kex_kernel_colors(const kex_kernel *k, char *buf, size_t len) {
  int n = kex_kernel_shape_len(k), fr = kex_kernel_first_reduce(k), gd = fr - k->local_dims;
  int fu = n - k->upcasted;
  uint64_t mid = kex_kernel_upcast_in_mid_reduce_axes(k);
  const int64_t *o = kex_kernel_output_shape(k), *f = kex_kernel_full_shape(k);
  if (len < (size_t)n + 1) return KEX_EINVAL;
  int p = 0;
  for (int i = 0; i < gd; i++) buf[p++] = k->dont_use_locals ? 'B' : 'b';
  for (int i = 0; i < k->local_dims; i++) buf[p++] = 'c';
  for (int i = fr; i < fr + k->group_for_reduces; i++) buf[p++] = (mid >> i) & 1 ? 'w' : 'g';
  for (int i = fr + k->group_for_reduces; i < fu; i++) buf[p++] = 'r';
  for (int i = fu; i < n; i++) buf[p++] = f[i] != o[i] ? 'm' : 'y';
  buf[p] = 0;
  return p == n ? 0 : KEX_EINTERNAL;
}

int kex_kernel_name(const kex_kernel *k, char *buf, size_t len) {
  char tmp[16 + KEX_MAX_DIMS * 21];
  int p = snprintf(tmp, sizeof tmp, "%s", k->reduceop ? "r" : (k->only_buffer_ops ? "C" : "E"));
  if (k->nout > 1) p += snprintf(tmp + p, sizeof tmp - p, "%u", k->nout);
  p += snprintf(tmp + p, sizeof tmp - p, "_");
  const int64_t *f = kex_kernel_full_shape(k);
  for (int i = 0; i < kex_kernel_shape_len(k); i++)
    p += snprintf(tmp + p, sizeof tmp - p, "%s%lld", i ? "_" : "", (long long)f[i]);
  return snprintf(buf, len, "%s", tmp);
}

int64_t kex_kernel_float4_axis(const kex_kernel *k, int i) {
  int64_t unit = kex_st_unit_stride_axes(k->shape, k->sts[i]);
  if (unit < 0) return unit;
  int n = kex_kernel_shape_len(k), fu = n - k->upcasted;
  const int64_t *s = kex_st_shape(k->sts[i]);
  int64_t m = 0;
  for (int x = fu; x < n; x++)
    if (((unit >> x) & 1) && s[x] % 4 == 0) m |= 1ll << (x - fu);
  return m;
}

int kex_kernel_opts_string(const kex_kernel *k, char *buf, size_t len) {
  size_t p = 0;
  int total = 0;
  if (len) buf[0] = 0;
  for (uint32_t i = 0; i < k->napplied; i++) {
    char one[64];
    kex_opt_short(k->applied_opts[i], one, sizeof one);
    int w = snprintf(p < len ? buf + p : NULL, p < len ? len - p : 0, "%s%s", i ? " " : "", one);
    total += w;
    p += (size_t)w;
  }
  return total;
}

/* ---- reshape / permute of every ShapeTracker ---- */

static int reshape_all(kex_kernel *k, const int *ndims, int64_t (*shapes)[KEX_MAX_DIMS]) {
  for (uint32_t i = 0; i < k->nbufs; i++) {
    const kex_st *st = kex_st_reshape(k->shape, k->sts[i], ndims[i], shapes[i]);
    if (!st) return KEX_ENOMEM;
    k->sts[i] = st;
  }
  return 0;
}

static int permute_all(kex_kernel *k, const int *order) {
  for (uint32_t i = 0; i < k->nbufs; i++) {
    const kex_st *st = kex_st_permute(k->shape, k->sts[i], order);
    if (!st) return KEX_ENOMEM;
    k->sts[i] = st;
  }
  return 0;
}

/* Per-buffer shape scratch, heap (nbufs can be large). */
typedef struct shape_scratch {
  int *ndims;
  int64_t (*shapes)[KEX_MAX_DIMS];
} shape_scratch;

static int scratch_new(shape_scratch *s, uint32_t n) {
  s->ndims = kex_calloc(n ? n : 1, sizeof *s->ndims);
  s->shapes = kex_calloc(n ? n : 1, sizeof *s->shapes);
  if (!s->ndims || !s->shapes) {
    kex_free(s->ndims);
    kex_free(s->shapes);
    s->ndims = NULL;
    s->shapes = NULL;
    return KEX_ENOMEM;
  }
  return 0;
}

static void scratch_free(shape_scratch *s) {
  kex_free(s->ndims);
  kex_free(s->shapes);
}

int kex_kernel_upcast(kex_kernel *k, kex_error *err) {
  int n = kex_kernel_shape_len(k);
  if (n == 0 || kex_kernel_full_shape(k)[n - 1] == 1)
    return kex_err_set(err, KEX_EOPT, "can't upcast a dimension with size 1");
  k->upcasted++;
  return 0;
}

int kex_kernel_shift_to(kex_kernel *k, int axis, int64_t amount, bool top, int insert_before, kex_error *err) {
  int n = kex_kernel_shape_len(k);
  if (n + 1 > KEX_MAX_DIMS)
    return kex_err_set(err, KEX_EOPT, "shift_to: kernel would have %d dims, more than KEX_MAX_DIMS (%d)", n + 1,
                       KEX_MAX_DIMS);
  if (insert_before < 0) insert_before = n;
  int move_axis = top ? axis : axis + 1;
  if (move_axis < insert_before) insert_before++;
  shape_scratch sc;
  if (scratch_new(&sc, k->nbufs)) return kex_err_set(err, KEX_ENOMEM, "shift_to: out of memory");
  for (uint32_t i = 0; i < k->nbufs; i++) {
    const int64_t *x = kex_st_shape(k->sts[i]);
    int p = 0;
    for (int d = 0; d < axis; d++) sc.shapes[i][p++] = x[d];
    if (x[axis] > 1) {
      sc.shapes[i][p++] = top ? amount : x[axis] / amount;
      sc.shapes[i][p++] = top ? x[axis] / amount : amount;
    } else {
      sc.shapes[i][p++] = 1;
      sc.shapes[i][p++] = 1;
    }
    for (int d = axis + 1; d < n; d++) sc.shapes[i][p++] = x[d];
    sc.ndims[i] = p;
  }
  int order[KEX_MAX_DIMS], p = 0;
  for (int i = 0; i < insert_before; i++)
    if (i != move_axis) order[p++] = i;
  order[p++] = move_axis;
  for (int i = insert_before; i < n + 1; i++)
    if (i != move_axis) order[p++] = i;
  int rc = reshape_all(k, sc.ndims, sc.shapes);
  if (!rc) rc = permute_all(k, order);
  scratch_free(&sc);
  return rc ? kex_err_set(err, rc, "shift_to: out of memory") : 0;
}

int kex_kernel_simplify_ones(kex_kernel *k) {
  int n = kex_kernel_shape_len(k);
  if (n == 0) return 0;
  const int64_t *f = kex_kernel_full_shape(k);
  bool ones[KEX_MAX_DIMS];
  int any = 0;
  for (int i = 0; i < n; i++) any |= (ones[i] = f[i] == 1);
  if (!any) return 0;
  int fr = kex_kernel_first_reduce(k), fu = n - k->upcasted;
  int dl = 0, du = 0;
  for (int i = fr - k->local_dims; i < fr; i++) dl += ones[i];
  for (int i = fu; i < n; i++) du += ones[i];
  k->local_dims -= dl;
  k->upcasted -= du;
  shape_scratch sc;
  if (scratch_new(&sc, k->nbufs)) return KEX_ENOMEM;
  for (uint32_t b = 0; b < k->nbufs; b++) {
    const int64_t *x = kex_st_shape(k->sts[b]);
    int p = 0;
    for (int i = 0; i < n; i++)
      if (!ones[i]) sc.shapes[b][p++] = x[i];
    sc.ndims[b] = p;
  }
  int rc = reshape_all(k, sc.ndims, sc.shapes);
  scratch_free(&sc);
  return rc ? rc : 1;
}

int kex_kernel_simplify_merge_adjacent(kex_kernel *k) {
  int n = kex_kernel_shape_len(k);
  if (n == 0) return 0;
  int fr = kex_kernel_first_reduce(k);
  uint32_t nb = k->nbufs;
  int rc = 0;
  int64_t(*strides)[KEX_MAX_DIMS] = kex_calloc(nb, sizeof *strides);
  bool(*known)[KEX_MAX_DIMS] = kex_calloc(nb, sizeof *known);
  shape_scratch sc = {0};
  int64_t(*rstride)[KEX_MAX_DIMS] = kex_calloc(nb, sizeof *rstride);
  bool(*rknown)[KEX_MAX_DIMS] = kex_calloc(nb, sizeof *rknown);
  if (!strides || !known || !rstride || !rknown || scratch_new(&sc, nb)) {
    rc = KEX_ENOMEM;
    goto out;
  }
  for (uint32_t b = 0; b < nb; b++)
    if ((rc = kex_st_real_strides(k->shape, k->sts[b], false, strides[b], known[b]))) goto out;
  for (uint32_t b = 0; b < nb; b++) {
    sc.shapes[b][0] = kex_st_shape(k->sts[b])[0];
    rstride[b][0] = strides[b][0];
    rknown[b][0] = known[b][0];
    sc.ndims[b] = 1;
  }
  for (int i = 1; i < n; i++) {
    bool mergeable = i != fr;
    for (uint32_t b = 0; b < nb && mergeable; b++) {
      int64_t si = kex_st_shape(k->sts[b])[i], sti = strides[b][i];
      int last = sc.ndims[b] - 1;
      bool lk = rknown[b][last];
      int64_t lst = rstride[b][last];
      bool ok = known[b][i] && ((sti != 0 && lk && lst == si * sti) || (sti == 0 && lk && lst == 0));
      if (!ok) mergeable = false;
    }
    for (uint32_t b = 0; b < nb; b++) {
      int64_t si = kex_st_shape(k->sts[b])[i];
      if (mergeable) {
        int last = sc.ndims[b] - 1;
        sc.shapes[b][last] *= si;
        rstride[b][last] = strides[b][i];
        rknown[b][last] = known[b][i];
      } else {
        int p = sc.ndims[b]++;
        sc.shapes[b][p] = si;
        rstride[b][p] = strides[b][i];
        rknown[b][p] = known[b][i];
      }
    }
  }
  rc = reshape_all(k, sc.ndims, sc.shapes);
out:
  kex_free(strides);
  kex_free(known);
  kex_free(rstride);
  kex_free(rknown);
  scratch_free(&sc);
  return rc;
}

/* ---- construction ---- */

void kex_kernel_free(kex_kernel *k) {
  if (!k) return;
  if (k->bufs_owned) kex_free(k->bufs);
  kex_free(k->sts);
  kex_free(k->applied_opts);
  kex_free(k);
}

int kex_kernel_create(kex_shape_ctx *shape, const kex_renderer_caps *opts, const kex_lop *const *ast, uint32_t nout,
                      kex_kernel **out, kex_error *err) {
  int rc = 0;
  lop_stack order = {0}, early = {0};
  kex_kernel *k = NULL;
  *out = NULL;
  if (nout == 0) return kex_err_set(err, KEX_EINVAL, "kernel: no STORE in the AST");
  for (uint32_t i = 0; i < nout; i++)
    if (!ast[i] || ast[i]->op != KEX_OP_STORE)
      return kex_err_set(err, KEX_EINVAL, "kernel: ast[%u] is not a STORE", i);
  if ((rc = preorder(ast, nout, &order))) goto oom;
  k = kex_calloc(1, sizeof *k);
  if (!k) goto oom;
  k->shape = shape;
  k->opts = opts;
  k->nout = nout;
  k->ast = ast;
  k->bufs_owned = true;
  uint32_t nleaves = 0;
  k->only_buffer_ops = true;
  for (uint32_t i = 0; i < order.len; i++) {
    kex_op op = order.v[i]->op;
    if (op == KEX_OP_LOAD || op == KEX_OP_BCONST) nleaves++;
    if (!KEX_OP_IS_BUFFER(op)) k->only_buffer_ops = false;
  }
  k->bufs = kex_calloc(nout + nleaves, sizeof *k->bufs);
  if (!k->bufs) goto oom;
  for (uint32_t i = 0; i < nout; i++) k->bufs[k->nbufs++] = buf_of(ast[i]);
  /* dedup of LOAD/CONST args (among the leaves only, like dedup(...) after outbufs) */
  for (uint32_t i = 0; i < order.len; i++) {
    const kex_lop *l = order.v[i];
    if (l->op != KEX_OP_LOAD && l->op != KEX_OP_BCONST) continue;
    kex_kernel_buf b = buf_of(l);
    bool dup = false;
    for (uint32_t j = nout; j < k->nbufs && !dup; j++) dup = buf_eq(&k->bufs[j], &b);
    if (!dup) k->bufs[k->nbufs++] = b;
  }
  /* the single reduce */
  for (uint32_t i = 0; i < order.len; i++) {
    const kex_lop *l = order.v[i];
    if (!KEX_OP_IS_REDUCE(l->op)) continue;
    if (!k->reduceop) {
      k->reduceop = l;
      continue;
    }
    int same = lop_same(k->reduceop, l);
    if (same < 0) goto oom;
    if (!same) {
      rc = kex_err_set(err, KEX_EINVAL, "kernel: more than one reduceop in the AST");
      goto fail;
    }
  }
  k->full_buf_index = 0;
  if (k->reduceop) {
    if ((rc = preorder(&k->reduceop, 1, &early))) goto oom;
    for (uint32_t i = 0; i < early.len; i++) {
      if (!KEX_OP_IS_BUFFER(early.v[i]->op)) continue;
      kex_kernel_buf b = buf_of(early.v[i]);
      for (uint32_t j = 0; j < k->nbufs; j++)
        if (buf_eq(&k->bufs[j], &b)) {
          k->full_buf_index = (int)j;
          break;
        }
      break;
    }
  }
  k->sts = kex_calloc(k->nbufs, sizeof *k->sts);
  if (!k->sts) goto oom;
  for (uint32_t i = 0; i < k->nbufs; i++) k->sts[i] = k->bufs[i].st;
  /* the AST contract: one ndim, each dim equal to full_shape or 1 */
  int n = kex_st_ndim(k->sts[k->full_buf_index]);
  const int64_t *f = kex_st_shape(k->sts[k->full_buf_index]);
  for (uint32_t i = 0; i < k->nbufs; i++) {
    if (kex_st_ndim(k->sts[i]) != n) {
      rc = kex_err_set(err, KEX_EINVAL, "kernel: buffer %u has %d dims, the full shape has %d", i,
                       kex_st_ndim(k->sts[i]), n);
      goto fail;
    }
    for (int d = 0; d < n; d++)
      if (kex_st_shape(k->sts[i])[d] != f[d] && kex_st_shape(k->sts[i])[d] != 1) {
        rc = kex_err_set(err, KEX_EINVAL, "kernel: buffer %u dim %d is %lld, the full shape's is %lld", i, d,
                         (long long)kex_st_shape(k->sts[i])[d], (long long)f[d]);
        goto fail;
      }
  }
  /* move all reduce axes to the end (stable) */
  {
    int perm[KEX_MAX_DIMS], p = 0;
    const int64_t *o = kex_st_shape(k->sts[0]);
    for (int d = 0; d < n; d++)
      if (f[d] == o[d]) perm[p++] = d;
    for (int d = 0; d < n; d++)
      if (f[d] != o[d]) perm[p++] = d;
    if ((rc = permute_all(k, perm))) goto oom;
  }
  if ((rc = kex_kernel_simplify_ones(k)) < 0) goto oom;
  if ((rc = kex_kernel_simplify_merge_adjacent(k))) goto oom;
  rc = 0;
  *out = k;
  k = NULL;
  goto done;
oom:
  rc = kex_err_set(err, KEX_ENOMEM, "kernel: out of memory");
fail:
  kex_kernel_free(k);
done:
  kex_free(order.v);
  kex_free(early.v);
  return rc;
}

int kex_kernel_from_item(const kex_schedule *s, const kex_sched_item *it, const kex_renderer_caps *opts,
                         kex_kernel **out, kex_error *err) {
  if (it->kind != KEX_ITEM_KERNEL) return kex_err_set(err, KEX_EINVAL, "kernel: schedule item is not a kernel");
  return kex_kernel_create(s->replay->shape, opts, it->ast, it->nout, out, err);
}

kex_kernel *kex_kernel_copy(const kex_kernel *k) {
  kex_kernel *c = kex_malloc(sizeof *c);
  if (!c) return NULL;
  *c = *k;
  c->bufs_owned = false;
  c->sts = NULL;
  c->applied_opts = NULL;
  c->capapplied = 0;
  c->bufs = kex_malloc((k->nbufs ? k->nbufs : 1) * sizeof *c->bufs);
  if (!c->bufs) goto oom;
  memcpy(c->bufs, k->bufs, k->nbufs * sizeof *c->bufs);
  c->bufs_owned = true;
  c->sts = kex_malloc(k->nbufs * sizeof *c->sts);
  if (!c->sts) goto oom;
  memcpy(c->sts, k->sts, k->nbufs * sizeof *c->sts);
  if (k->napplied) {
    c->applied_opts = kex_malloc(k->napplied * sizeof *c->applied_opts);
    if (!c->applied_opts) goto oom;
    memcpy(c->applied_opts, k->applied_opts, k->napplied * sizeof *c->applied_opts);
    c->capapplied = k->napplied;
  }
  return c;
oom:
  kex_kernel_free(c);
  return NULL;
}

/* ---- apply_opt ---- */

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      rc = kex_err_set(err, KEX_EOPT, __VA_ARGS__);      \
      goto fail;                                         \
    }                                                    \
  } while (0)

/* no UNSAFE_PAD_OPS under the reduce (r.src lazyops). 1 safe, 0 unsafe, KEX_ENOMEM. */
static int reduce_pad_safe(const kex_lop *r) {
  lop_stack order = {0};
  int rc = preorder(r->src, r->nsrc, &order);
  if (rc) return rc;
  int safe = 1;
  for (uint32_t i = 0; i < order.len; i++)
    if (KEX_OP_IS_UNSAFE_PAD(order.v[i]->op)) safe = 0;
  kex_free(order.v);
  return safe;
}

static int apply_opt_inner(kex_kernel *k, kex_opt opt, bool append_opt, kex_error *err) {
  int rc = 0;
  kex_optop op = opt.op;
  CHECK((unsigned)op < KEX_OPT_COUNT, "unknown opt op %d", (int)op);
  CHECK(!k->dont_use_locals ||
            (op != KEX_OPT_LOCAL && op != KEX_OPT_GROUP && op != KEX_OPT_GROUPTOP && op != KEX_OPT_UPCASTMID),
        "not using locals");
  if (op == KEX_OPT_TC) {
    CHECK(k->napplied == 0, "tensor core opts must be first");
    CHECK(opt.axis != KEX_OPT_NONE && opt.amt != KEX_OPT_NONE, "tensor core opts must have an axis and amt");
    CHECK(k->opts->has_tensor_cores, "must have tensor cores or TC=2");
    CHECK(false, "no tensor core available");
  }
  int fr = kex_kernel_first_reduce(k);
  int axis;
  if (opt.axis == KEX_OPT_NONE) {
    axis = -1;
    CHECK(op == KEX_OPT_NOLOCALS, "invalid axis: %s needs an axis", kex_optop_name(op));
  } else {
    CHECK(opt.axis >= 0, "invalid axis: %d is negative", (int)opt.axis);
    axis = opt.axis;
    if (op == KEX_OPT_UNROLL) axis += fr;
    else if (op == KEX_OPT_GROUP || op == KEX_OPT_GROUPTOP) axis += fr + k->group_for_reduces;
  }
  int n = kex_kernel_shape_len(k);
  CHECK(axis < n, "invalid axis");
  const int64_t *full = kex_kernel_full_shape(k);
  int64_t amt;
  if (opt.amt != KEX_OPT_NONE) {
    CHECK(opt.amt >= 0, "invalid amt: %d is negative", (int)opt.amt);
    CHECK(axis >= 0, "invalid axis");
    amt = opt.amt ? opt.amt : full[axis];
    CHECK(amt != 1, "shift/padto of amt 1 or Node is meaningless");
    if (op != KEX_OPT_PADTO) CHECK(full[axis] % amt == 0, "no longer valid shift");
  } else {
    amt = -1;
    CHECK(op == KEX_OPT_NOLOCALS, "invalid amt: %s needs an amt", kex_optop_name(op));
  }
  if (k->reduceop && (op == KEX_OPT_GROUP || op == KEX_OPT_GROUPTOP ||
                      (k->group_for_reduces && op != KEX_OPT_NOLOCALS && op != KEX_OPT_PADTO))) {
    int64_t acc_sz = kex_dtype_size(k->reduceop->dtype), upcast_sz = 1;
    const int64_t *o = kex_kernel_output_shape(k);
    for (int i = n - k->upcasted; i < n; i++)
      if (full[i] == o[i]) upcast_sz *= full[i];
    int64_t local_sz = prod_range(full, fr - k->local_dims, fr + k->group_for_reduces);
    int64_t smem = amt * acc_sz * upcast_sz * local_sz;
    CHECK(smem <= k->opts->shared_max, "exceeds maximum shared memory size: needs %lld, max %lld", (long long)smem,
          (long long)k->opts->shared_max);
  }
  if ((op == KEX_OPT_LOCAL || op == KEX_OPT_GROUP || op == KEX_OPT_GROUPTOP) && k->opts->max_local_size > 0) {
    int64_t threads = prod_range(full, fr - k->local_dims, fr + k->group_for_reduces) * amt;
    CHECK(threads <= k->opts->max_local_size, "exceeds the target's work-group size: %lld threads, max %lld",
          (long long)threads, (long long)k->opts->max_local_size);
  }
  switch (op) {
  case KEX_OPT_LOCAL:
    CHECK(k->opts->has_local, "target does not support local");
    CHECK(axis < fr - k->local_dims, "local is for globals");
    if ((rc = kex_kernel_shift_to(k, axis, amt, false, fr, err))) goto fail;
    k->local_dims++;
    break;
  case KEX_OPT_GROUP:
  case KEX_OPT_GROUPTOP:
    CHECK(k->opts->has_local && k->opts->has_shared, "target does not support local or shared mem");
    CHECK(axis >= fr + k->group_for_reduces && axis < n - k->upcasted, "must be reduce axis to group");
    if ((rc = kex_kernel_shift_to(k, axis, amt, op == KEX_OPT_GROUPTOP, fr + k->group_for_reduces, err))) goto fail;
    k->group_for_reduces++;
    break;
  case KEX_OPT_UNROLL:
    CHECK(axis < n - k->upcasted, "can't upcasted already upcasted");
    CHECK(amt <= 32, "don't unroll more than 32");
    if (full[axis] == amt && axis == fr) k->local_dims++;
    if (full[axis] == amt && axis < fr + k->group_for_reduces) k->group_for_reduces--;
    if ((rc = kex_kernel_shift_to(k, axis, amt, false, -1, err))) goto fail;
    if ((rc = kex_kernel_upcast(k, err))) goto fail;
    break;
  case KEX_OPT_UPCAST:
    CHECK(axis < fr, "upcast is for non-reduce");
    CHECK(amt <= 8, "don't upcast more than 8");
    if ((rc = kex_kernel_shift_to(k, axis, amt, false, -1, err))) goto fail;
    if ((rc = kex_kernel_upcast(k, err))) goto fail;
    break;
  case KEX_OPT_UPCASTMID:
    CHECK(false, "invalid upcast mid reduce");
    break;
  case KEX_OPT_NOLOCALS:
    CHECK(k->opts->has_local && !k->dont_use_locals,
          "NOLOCALS is meaningless if target does not support local or already not using locals");
    CHECK(k->local_dims == 0 && k->group_for_reduces == 0, "can't have no locals with locals");
    k->dont_use_locals = true;
    break;
  case KEX_OPT_PADTO: {
    CHECK(axis < n - k->upcasted, "cannot pad upcasted");
    if (fr <= axis) {
      int safe = k->reduceop && k->reduceop->op == KEX_OP_SUM ? reduce_pad_safe(k->reduceop) : 0;
      if (safe < 0) {
        rc = kex_err_set(err, safe, "padto: out of memory");
        goto fail;
      }
      CHECK(safe, "cannot pad");
    }
    bool padded = false;
    for (uint32_t i = 0; i < k->nbufs; i++) {
      int64_t s = kex_st_shape(k->sts[i])[axis];
      if (s == 1) continue;
      CHECK(s > amt / 4, "pad adds more than quadruple the work self.sts[i].shape[axis]=%lld > amt//4=%lld",
            (long long)s, (long long)(amt / 4));
      int64_t ru = (s + amt - 1) / amt * amt - s;
      if (ru) {
        int64_t arg[2 * KEX_MAX_DIMS] = {0};
        arg[2 * axis + 1] = ru;
        const kex_st *st = kex_st_pad(k->shape, k->sts[i], arg);
        if (!st) {
          rc = kex_err_set(err, KEX_ENOMEM, "padto: out of memory");
          goto fail;
        }
        k->sts[i] = st;
        padded = true;
      }
    }
    CHECK(padded, "nothing was padded");
    break;
  }
  default:
    CHECK(false, "unknown opt op %d", (int)op);
  }
  if (append_opt) {
    if (k->napplied == k->capapplied) {
      uint32_t ncap = k->capapplied ? k->capapplied * 2 : 8;
      kex_opt *no = kex_realloc(k->applied_opts, ncap * sizeof *no);
      if (!no) {
        rc = kex_err_set(err, KEX_ENOMEM, "apply_opt: out of memory");
        goto fail;
      }
      k->applied_opts = no;
      k->capapplied = ncap;
    }
    k->applied_opts[k->napplied++] = opt;
  }
  if ((rc = kex_kernel_simplify_ones(k)) < 0) {
    rc = kex_err_set(err, rc, "apply_opt: out of memory");
    goto fail;
  }
  return 0;
fail:
  return rc;
}

int kex_kernel_apply_opt(kex_kernel *k, kex_opt opt, bool append_opt, kex_error *err) {
  const kex_st *small[32];
  const kex_st **saved = k->nbufs <= 32 ? small : kex_malloc(k->nbufs * sizeof *saved);
  if (!saved) return kex_err_set(err, KEX_ENOMEM, "apply_opt: out of memory");
  memcpy(saved, k->sts, k->nbufs * sizeof *saved);
  int up = k->upcasted, ld = k->local_dims, gr = k->group_for_reduces;
  bool dl = k->dont_use_locals;
  uint32_t na = k->napplied;
  int rc = apply_opt_inner(k, opt, append_opt, err);
  if (rc) {
    memcpy(k->sts, saved, k->nbufs * sizeof *saved);
    k->upcasted = up;
    k->local_dims = ld;
    k->group_for_reduces = gr;
    k->dont_use_locals = dl;
    k->napplied = na;
  }
  if (saved != small) kex_free(saved);
  return rc;
}

int kex_kernel_apply_opts(kex_kernel *k, const kex_opt *opts, uint32_t n, kex_error *err) {
  for (uint32_t i = 0; i < n; i++) {
    int rc = kex_kernel_apply_opt(k, opts[i], true, err);
    if (rc) {
      char o[64], msg[KEX_ERROR_MSG_MAX];
      kex_opt_short(opts[i], o, sizeof o);
      snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
      return kex_err_set(err, rc, "opt %u %s does not apply: %s", i, o, msg);
    }
  }
  return 0;
}

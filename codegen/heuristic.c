/*
 * heuristic.c - tinygrad 0.9.0's Kernel.hand_coded_optimizations (spec 7.2),
 * the opts a kernel gets with BEAM=0.
 *
 * The steps, in tinygrad's order: matvec (GROUP/LOCAL/UPCAST with MV=1,
 * MV_BLOCKSIZE=4, MV_THREADS_PER_ROW=8, MV_ROWS_PER_THREAD=4); GROUPTOP for
 * small outputs; stop if grouping; upcast small masked axes; upcast expanded
 * axes while the output is >= 1024; unroll the last reduce dim; one final
 * upcast; then up to three LOCAL dims of at most 128 threads.  Image-only
 * branches (required_optimizations, UPCASTMID, float4 images) never apply to
 * our dtypes and are left out.  Environment knobs are at their defaults.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "codegen/kernel.h"

enum { MV_BLOCKSIZE = 4, MV_THREADS_PER_ROW = 8, MV_ROWS_PER_THREAD = 4 };

/* Index in k->bufs of the arg of a LOAD/CONST node (Kernel.bufs.index). */
static int buf_index(const kex_kernel *k, const kex_lop *l) {
  for (uint32_t j = 0; j < k->nbufs; j++) {
    const kex_kernel_buf *b = &k->bufs[j];
    bool cb = b->op == KEX_OP_BCONST, cl = l->op == KEX_OP_BCONST;
    if (cb != cl || b->dtype != l->dtype || b->st != l->st) continue;
    if (cl ? kex_const_eq(b->val, l->val) : b->idx == l->idx) return (int)j;
  }
  return -1;
}

static int64_t prod_range(const int64_t *v, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= v[i];
  return p;
}

static int apply(kex_kernel *k, kex_optop op, int axis, int amt, kex_error *err) {
  return kex_kernel_apply_opt(k, kex_opt_make(op, axis, amt), true, err);
}

/* any(s > 1 and stride == 0) over real strides (unknown strides never count). */
static bool has_expanded_axis(const kex_st *st, const int64_t *strides, const bool *known) {
  for (int i = 0; i < kex_st_ndim(st); i++)
    if (kex_st_shape(st)[i] > 1 && known[i] && strides[i] == 0) return true;
  return false;
}

/* 1 when the matvec opts were applied, 0 when matvec does not apply, <0 error. */
static int try_matvec(kex_kernel *k, kex_error *err) {
  const kex_lop *r = k->reduceop;
  if (!k->opts->has_local || !r || r->op != KEX_OP_SUM || kex_kernel_shape_len(k) < 2 || !k->opts->has_shared) return 0;
  if (k->opts->max_local_size > 0 && MV_THREADS_PER_ROW * MV_BLOCKSIZE > k->opts->max_local_size) return 0; /* won't fit */
  const kex_lop *mul = r->src[0];
  if (mul->op != KEX_OP_MUL || mul->src[0]->op != KEX_OP_LOAD || mul->src[1]->op != KEX_OP_LOAD) return 0;
  int b0 = buf_index(k, mul->src[0]), b1 = buf_index(k, mul->src[1]);
  if (b0 < 0 || b1 < 0) return kex_err_set(err, KEX_EINTERNAL, "matvec: LOAD not among the kernel's bufs");
  const kex_st *st0 = k->sts[b0], *st1 = k->sts[b1];
  int64_t s0[KEX_MAX_DIMS], s1[KEX_MAX_DIMS];
  bool k0[KEX_MAX_DIMS], k1[KEX_MAX_DIMS];
  int rc;
  if ((rc = kex_st_real_strides(k->shape, st0, false, s0, k0)) || (rc = kex_st_real_strides(k->shape, st1, false, s1, k1)))
    return kex_err_set(err, rc, "matvec: out of memory");
  int fr = kex_kernel_first_reduce(k);
  if (fr >= kex_kernel_shape_len(k)) return 0;
  if (!(k0[fr] && s0[fr] == 1) || (has_expanded_axis(st0, s0, k0) && has_expanded_axis(st1, s1, k1))) return 0;
  const int64_t *full = kex_kernel_full_shape(k);
  int gd = kex_kernel_global_dims(k);
  for (int g = 0; g < gd; g++) {
    if (full[fr] % MV_THREADS_PER_ROW == 0 && full[g] % (MV_BLOCKSIZE * MV_ROWS_PER_THREAD) == 0) {
      if ((rc = apply(k, KEX_OPT_GROUP, 0, MV_THREADS_PER_ROW, err))) return rc;
      if ((rc = apply(k, KEX_OPT_LOCAL, g, MV_BLOCKSIZE, err))) return rc;
      if ((rc = apply(k, KEX_OPT_UPCAST, g, MV_ROWS_PER_THREAD, err))) return rc;
      return 1;
    }
  }
  return 0;
}

/* GROUPTOP for small outputs; a KEX_EOPT from the smem limit is swallowed as tinygrad does. */
static int try_group(kex_kernel *k, kex_error *err) {
  if (!k->opts->has_local || !k->opts->has_shared) return 0;
  int64_t f4 = kex_kernel_float4_axis(k, 0);
  if (f4 < 0) return kex_err_set(err, (int)f4, "hand_coded: out of memory");
  int fr = kex_kernel_first_reduce(k), n = kex_kernel_shape_len(k);
  int64_t osz = prod_range(kex_kernel_output_shape(k), 0, fr);
  if (f4 || fr > 2 || fr + 1 > n || osz > 2048) return 0;
  static const int big[] = {256, 16}, small[] = {16};
  const int *szs = osz <= 32 ? big : small;
  int nsz = osz <= 32 ? 2 : 1;
  for (int i = 0; i < nsz; i++) {
    int sz = szs[i];
    bool all = true;
    for (uint32_t b = 0; b < k->nbufs && all; b++) {
      int64_t s = kex_st_shape(k->sts[b])[fr];
      all = s % sz == 0 || s == 1;
    }
    if (!all) continue;
    kex_error e2 = {0};
    int rc = apply(k, KEX_OPT_GROUPTOP, 0, sz, &e2);
    if (rc == 0) break;
    if (rc != KEX_EOPT) {
      if (err) *err = e2;
      return rc;
    }
  }
  return 0;
}

/* Masked small axes (stack/cat/pad): chosen in order, upcast in reverse. */
static int upcast_masked_axes(kex_kernel *k, kex_error *err) {
  int rc;
  int fr = kex_kernel_first_reduce(k), n = kex_kernel_shape_len(k);
  const int64_t *full = kex_kernel_full_shape(k);
  int to_upcast[KEX_MAX_DIMS], nto = 0;
  int64_t chosen = 1, upsz = prod_range(full, n - k->upcasted, n);
  for (int axis = 0; axis < fr; axis++) {
    if (full[axis] > 7) continue;
    bool masked = false;
    for (uint32_t b = 0; b < k->nbufs && !masked; b++) {
      int m = kex_st_axis_is_masked(k->shape, k->sts[b], axis);
      if (m < 0) return kex_err_set(err, m, "hand_coded: out of memory");
      masked = m == 1;
    }
    if (masked && upsz * chosen * full[axis] <= 7 * 7) {
      to_upcast[nto++] = axis;
      chosen *= full[axis];
    }
  }
  for (int i = nto - 1; i >= 0; i--)
    if ((rc = apply(k, KEX_OPT_UPCAST, to_upcast[i], 0, err))) return rc;
  return 0;
}

/* Expanded axes: upcast the lexicographic min of (non-zero-stride count, stride sum, axis, amt) while the output has 1,024 or more elements. */
static int upcast_expanded_axes(kex_kernel *k, kex_error *err) {
  int rc;
  uint64_t upcasted_axis = 0;
  bool *zero_up = kex_calloc(k->nbufs ? k->nbufs : 1, sizeof *zero_up);
  if (!zero_up) return kex_err_set(err, KEX_ENOMEM, "hand_coded: out of memory");
  for (;;) {
    int fr = kex_kernel_first_reduce(k), n = kex_kernel_shape_len(k);
    if (prod_range(kex_kernel_output_shape(k), 0, fr) < 1024) break;
    /* per buffer: does an upcast axis already have real stride 0? */
    for (uint32_t b = 0; b < k->nbufs; b++) {
      int64_t s[KEX_MAX_DIMS];
      bool kn[KEX_MAX_DIMS];
      if ((rc = kex_st_real_strides(k->shape, k->sts[b], false, s, kn))) {
        kex_free(zero_up);
        return kex_err_set(err, rc, "hand_coded: out of memory");
      }
      zero_up[b] = false;
      for (int x = n - k->upcasted; x < n; x++)
        if (kn[x] && s[x] == 0) zero_up[b] = true;
    }
    const int64_t *full = kex_kernel_full_shape(k);
    bool have = false;
    int64_t best[4] = {0};
    static const int amts[] = {3, 4};
    for (int axis = 0; axis < fr; axis++) {
      for (int a = 0; a < 2; a++) {
        int amt = amts[a];
        if ((upcasted_axis >> axis) & 1 || full[axis] % amt != 0) continue;
        bool ok = false;
        for (uint32_t b = 0; b < k->nbufs && !ok; b++)
          ok = kex_st_last(k->sts[b])->strides[axis] == 0 && !zero_up[b];
        if (!ok) continue;
        int64_t cnt = 0, sum = 0;
        for (uint32_t b = 0; b < k->nbufs; b++) {
          int64_t st = kex_st_last(k->sts[b])->strides[axis];
          cnt += st > 0;
          sum += st;
        }
        int64_t c[4] = {cnt, sum, axis, amt};
        bool less = !have;
        for (int i = 0; i < 4 && !less; i++) {
          if (c[i] < best[i]) less = true;
          else if (c[i] > best[i]) break;
        }
        if (less) memcpy(best, c, sizeof best), have = true;
      }
    }
    if (!have) break;
    if ((rc = apply(k, KEX_OPT_UPCAST, (int)best[2], (int)best[3], err))) {
      kex_free(zero_up);
      return rc;
    }
    upcasted_axis |= 1ull << best[2];
  }
  kex_free(zero_up);
  return 0;
}

/* Unroll the reduce: its last axis fully when small (twice when tiny), else by 4. */
static int unroll_reduce(kex_kernel *k, kex_error *err) {
  int rc;
  int fr = kex_kernel_first_reduce(k), n = kex_kernel_shape_len(k), fu = n - k->upcasted;
  const int64_t *full = kex_kernel_full_shape(k);
  int64_t noffsets = prod_range(kex_st_shape(k->sts[k->full_buf_index]), fu, n);
  bool reduce_up = false;
  for (int x = fu; x < n; x++)
    if (kex_kernel_output_shape(k)[x] != full[x]) reduce_up = true;
  if (fr < fu && (noffsets <= 4 || !reduce_up) && (k->upcasted == 0 || prod_range(full, fu, n) < 64)) {
    int64_t s = full[fu - 1];
    if (s <= 32) {
      if ((rc = apply(k, KEX_OPT_UNROLL, fu - 1 - fr, 0, err))) return rc;
      fr = kex_kernel_first_reduce(k);
      n = kex_kernel_shape_len(k);
      fu = n - k->upcasted;
      full = kex_kernel_full_shape(k);
      if (fr < fu && s <= 3 && full[fu - 1] <= 3)
        if ((rc = apply(k, KEX_OPT_UNROLL, fu - 1 - fr, 0, err))) return rc;
    } else if (full[fu - 1] % 4 == 0) {
      if ((rc = apply(k, KEX_OPT_UNROLL, fu - 1 - fr, 4, err))) return rc;
    }
  }
  return 0;
}

/* If nothing is upcast and it's easy to, upcast the last dim by 4. */
static int upcast_last_dim(kex_kernel *k, kex_error *err) {
  int rc;
  int n = kex_kernel_shape_len(k), fu = n - k->upcasted;
  if (k->upcasted == 0 && fu > 0 && kex_kernel_full_shape(k)[fu - 1] % 4 == 0)
    if ((rc = apply(k, KEX_OPT_UPCAST, fu - 1, 4, err))) return rc;
  return 0;
}

/* Locals: expanded axes first, then higher axes; at most 3 dims, 128 threads (fewer when the target's work-group is smaller). */
static int add_locals(kex_kernel *k, kex_error *err) {
  int rc;
  if (!k->opts->has_local) return 0;
  const int64_t max_threads =
      k->opts->max_local_size > 0 && k->opts->max_local_size < 128 ? k->opts->max_local_size : 128;
  int fr = kex_kernel_first_reduce(k);
  const int64_t *full = kex_kernel_full_shape(k);
  int order[KEX_MAX_DIMS], no = 0;
  /* sorted by (-expanded, -axis): expanded axes high to low, then the rest high to low */
  bool expanded[KEX_MAX_DIMS];
  for (int axis = 0; axis < fr; axis++) {
    expanded[axis] = false;
    for (uint32_t b = 0; b < k->nbufs && !expanded[axis]; b++)
      expanded[axis] = kex_st_last(k->sts[b])->strides[axis] == 0;
  }
  for (int pass = 1; pass >= 0; pass--)
    for (int axis = fr - 1; axis >= 0; axis--)
      if (expanded[axis] == (pass == 1)) order[no++] = axis;
  int to_axis[KEX_MAX_DIMS], to_sz[KEX_MAX_DIMS], nto = 0;
  int64_t local_size = 1;
  for (int i = 0; i < no; i++) {
    int axis = order[i];
    static const int cands[] = {32, 16, 8, 4, 3, 2};
    for (int c = axis == 0 ? 0 : 1; c < 6; c++) {
      if (full[axis] % cands[c] == 0 && local_size * cands[c] <= max_threads) {
        to_axis[nto] = axis;
        to_sz[nto++] = cands[c];
        local_size *= cands[c];
        break;
      }
    }
  }
  if (nto > 3) nto = 3;
  /* sorted(to_local[:3]): by axis (axes are distinct) */
  for (int i = 1; i < nto; i++)
    for (int j = i; j > 0 && to_axis[j - 1] > to_axis[j]; j--) {
      int t = to_axis[j];
      to_axis[j] = to_axis[j - 1];
      to_axis[j - 1] = t;
      t = to_sz[j];
      to_sz[j] = to_sz[j - 1];
      to_sz[j - 1] = t;
    }
  int deleted = 0;
  for (int i = 0; i < nto; i++) {
    int axis = to_axis[i] - deleted;
    bool will_delete = to_sz[i] == kex_kernel_full_shape(k)[axis];
    if ((rc = apply(k, KEX_OPT_LOCAL, axis, to_sz[i], err))) return rc;
    if (will_delete) deleted++;
  }
  return 0;
}

int kex_kernel_hand_coded_optimizations(kex_kernel *k, kex_error *err) {
  int rc = try_matvec(k, err);
  if (rc) return rc < 0 ? rc : 0;
  if ((rc = try_group(k, err))) return rc;
  if (k->group_for_reduces) return 0;
  if ((rc = upcast_masked_axes(k, err)) || (rc = upcast_expanded_axes(k, err)) || (rc = unroll_reduce(k, err)) ||
      (rc = upcast_last_dim(k, err)))
    return rc;
  return add_locals(k, err);
}

/*
 * kernel.h - tinygrad 0.9.0's Kernel (codegen/kernel.py, spec section 7):
 * the shape bookkeeping of one kernel AST and the OptOps that reshape it,
 * plus hand_coded_optimizations (spec 7.2, codegen/heuristic.c).
 *
 * A kex_kernel is built from the STOREs of a KEX_ITEM_KERNEL schedule item.
 * It lists the kernel's buffers (outputs, then the deduplicated LOAD/CONST
 * leaves in preorder), one ShapeTracker per buffer, and the state that the
 * optimizations change: how many trailing dims are upcast, how many local
 * and group-reduce dims there are, and the list of applied opts.
 *
 * Axis layout (colours, as kernel.py's colors(); one letter per axis):
 *   b  global (blue; 'B' when NOLOCALS was applied: BLUE)
 *   c  local (cyan)
 *   g  group-reduce (green)          w  group dim that is an output dim (white)
 *   r  reduce loop (red)
 *   m  upcast reduce dim (magenta)   y  upcast output dim (yellow)
 *
 * Ownership: the kernel borrows the AST and the kex_shape_ctx (both live in
 * the schedule's replay); the ShapeTrackers it makes are interned in that
 * context's arena.  The kernel's own tables are heap memory released by
 * kex_kernel_free.  Errors are negative KEX_E* codes; an invalid opt is
 * KEX_EOPT, with the failed check in err->msg, and leaves the kernel as it was.
 */
#ifndef KEX_SEARCH_KERNEL_H
#define KEX_SEARCH_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "sched/schedule.h"
#include "sched/shapetracker.h"

/* What the target can do (tinygrad's Renderer fields that the Kernel reads). */
typedef struct kex_renderer_caps {
  const char *device;       /* "GPU" or "CLANG" */
  bool has_local;
  bool has_shared;
  bool supports_float4;
  bool has_tensor_cores;
  int64_t shared_max;       /* bytes of local memory a group reduce may use */
  int64_t max_local_size;   /* threads of one work-group (LOCAL and GROUP dims together); 0: no limit known */
} kex_renderer_caps;

extern const kex_renderer_caps kex_renderer_opencl; /* GPU: locals, shared, float4, 32768 */
extern const kex_renderer_caps kex_renderer_cpu;    /* CLANG: no locals, no float4 */

/* OptOps, in tinygrad's enum order (Opt ordering compares these values). */
#define KEX_OPTOP_MAP(XX) \
  XX(TC) XX(UPCAST) XX(UPCASTMID) XX(UNROLL) XX(LOCAL) XX(GROUP) XX(GROUPTOP) XX(NOLOCALS) XX(PADTO)

typedef enum kex_optop {
#define XX(name) KEX_OPT_##name,
  KEX_OPTOP_MAP(XX)
#undef XX
  KEX_OPT_COUNT
} kex_optop;

#define KEX_OPT_NONE (-1) /* axis or amt that is None */

typedef struct kex_opt {
  kex_optop op;
  int32_t axis; /* KEX_OPT_NONE for NOLOCALS */
  int32_t amt;  /* 0 = the whole dim; KEX_OPT_NONE = None */
} kex_opt;

static inline kex_opt kex_opt_make(kex_optop op, int32_t axis, int32_t amt) { return (kex_opt){op, axis, amt}; }
const char *kex_optop_name(kex_optop op); /* "UPCAST" */
/* "Opt(op=OptOps.UPCAST, axis=1, amt=4)"; returns the length the full text needs. */
int kex_opt_repr(kex_opt o, char *buf, size_t len);
/* "UPCAST(1,4)"; NOLOCALS prints "NOLOCALS". */
int kex_opt_short(kex_opt o, char *buf, size_t len);

/* One entry of Kernel.bufs: a STORE/LOAD MemBuffer or a CONST ConstBuffer. */
typedef struct kex_kernel_buf {
  kex_op op;          /* KEX_OP_STORE, KEX_OP_LOAD or KEX_OP_BCONST */
  int32_t idx;        /* MemBuffer.idx (-1 for CONST) */
  kex_dtype dtype;
  const kex_st *st;   /* the AST's ShapeTracker (not the kernel's permuted one) */
  kex_const val;      /* CONST */
  const kex_lop *lop; /* the first node that carried this arg */
} kex_kernel_buf;

typedef struct kex_kernel {
  kex_shape_ctx *shape;
  const kex_renderer_caps *opts;
  uint32_t nout;
  const kex_lop *const *ast;   /* nout STOREs (borrowed) */
  uint32_t nbufs;
  kex_kernel_buf *bufs;        /* nbufs entries, each kernel (and copy) owns its table */
  bool bufs_owned;
  const kex_st **sts;          /* nbufs, the kernel's current ShapeTrackers */
  const kex_lop *reduceop;     /* NULL when the kernel has no reduce */
  int full_buf_index;
  bool only_buffer_ops;        /* every node is a BufferOp (name prefix 'C') */
  /* optimization state */
  int upcasted, local_dims, group_for_reduces;
  bool dont_use_locals;
  uint32_t napplied, capapplied;
  kex_opt *applied_opts;
} kex_kernel;

/*
 * Kernel(*ast, opts): bufs, sts, reduceop, full_buf_index; permute reduce dims
 * last; simplify_ones; simplify_merge_adjacent.  `ast` holds nout STOREs and
 * must outlive the kernel, as must `shape` (the replay's context).  On success
 * *out is a new kernel (kex_kernel_free).  Errors: KEX_ENOMEM; KEX_EINVAL when
 * the AST is not a kernel AST (no STORE, more than one distinct reduce, outputs
 * of different shapes).
 */
int kex_kernel_create(kex_shape_ctx *shape, const kex_renderer_caps *opts, const kex_lop *const *ast, uint32_t nout,
                      kex_kernel **out, kex_error *err);
/* Kernel for a schedule item (kind must be KEX_ITEM_KERNEL, else KEX_EINVAL). */
int kex_kernel_from_item(const kex_schedule *s, const kex_sched_item *it, const kex_renderer_caps *opts,
                         kex_kernel **out, kex_error *err);
/* Kernel.copy(): same AST and bufs, own sts and opt state.  NULL on OOM. */
kex_kernel *kex_kernel_copy(const kex_kernel *k);
void kex_kernel_free(kex_kernel *k);

/* ---- derived values ---- */
static inline int kex_kernel_shape_len(const kex_kernel *k) { return kex_st_ndim(k->sts[0]); }
static inline const int64_t *kex_kernel_full_shape(const kex_kernel *k) { return kex_st_shape(k->sts[k->full_buf_index]); }
static inline const int64_t *kex_kernel_output_shape(const kex_kernel *k) { return kex_st_shape(k->sts[0]); }
int kex_kernel_first_reduce(const kex_kernel *k);
static inline int kex_kernel_global_dims(const kex_kernel *k) { return kex_kernel_first_reduce(k) - k->local_dims; }
/* upcast_in_mid_reduce_axes: bitmask of axes j in [first_reduce, first_reduce+group) with full == output. */
uint64_t kex_kernel_upcast_in_mid_reduce_axes(const kex_kernel *k);
/* colors() as letters (see the file comment), NUL-terminated; buf needs shape_len+1 bytes. */
int kex_kernel_colors(const kex_kernel *k, char *buf, size_t len);
/* "r_16_8_8_16_128_4_4_4" (no n1 suffix); returns the length the full text needs. */
int kex_kernel_name(const kex_kernel *k, char *buf, size_t len);
/* float4_axis(i): bitmask of upcast-relative positions of unit-stride upcast axes of sts[i] with size % 4 == 0; <0 on OOM. */
int64_t kex_kernel_float4_axis(const kex_kernel *k, int i);
/* "UPCAST(1,4) LOCAL(0,8)" for the applied opts. */
int kex_kernel_opts_string(const kex_kernel *k, char *buf, size_t len);

/* ---- mutations (tinygrad's names; they assume valid arguments) ---- */
/* shift_to(axis, amount, top, insert_before); insert_before < 0 means the end.  0 or KEX_ENOMEM / KEX_EOPT (dims limit). */
int kex_kernel_shift_to(kex_kernel *k, int axis, int64_t amount, bool top, int insert_before, kex_error *err);
/* upcast(): KEX_EOPT when the last full dim is 1. */
int kex_kernel_upcast(kex_kernel *k, kex_error *err);
/* simplify_ones(): returns 1 when some dim was dropped, 0 when none, KEX_ENOMEM. */
int kex_kernel_simplify_ones(kex_kernel *k);
int kex_kernel_simplify_merge_adjacent(kex_kernel *k);

/*
 * apply_opt(opt, append_opt): every check of spec 7 in tinygrad's order.  On
 * KEX_EOPT (message: the failed check) or KEX_ENOMEM the kernel is unchanged.
 */
int kex_kernel_apply_opt(kex_kernel *k, kex_opt opt, bool append_opt, kex_error *err);
/*
 * Apply opts[0, n) in order (each appended to the kernel's opts).  0, or the
 * first failure's code with *err naming the opt's index and text ("opt 1
 * UNROLL(0,4) does not apply: ..."); the opts before it stay applied.
 */
int kex_kernel_apply_opts(kex_kernel *k, const kex_opt *opts, uint32_t n, kex_error *err);

/*
 * hand_coded_optimizations() (codegen/heuristic.c): applies tinygrad's BEAM=0
 * opts to k.  0, KEX_ENOMEM, or KEX_EOPT if one of its unguarded opts fails
 * (tinygrad raises there too); on error k may hold the opts applied so far.
 */
int kex_kernel_hand_coded_optimizations(kex_kernel *k, kex_error *err);

#endif

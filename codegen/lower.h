/*
 * lower.h - tinygrad 0.9.0's Linearizer (codegen/linearizer.py, spec 8):
 * one optimized Kernel -> UOps -> C-style source (codegen/render.c) for the
 * OpenCL or the cpu device, with the launch dimensions and the buffer order
 * in the conventions of devices/device.h.
 *
 * Ownership: kex_lower_kernel reads the kernel (and interns ShapeTrackers and
 * symbolic nodes in the kernel's shape context, which must outlive the call);
 * every uop lives in an arena freed before it returns.  The program it fills
 * owns its source and argument table (kex_program_src_free).
 */
#ifndef KEX_SEARCH_LOWER_H
#define KEX_SEARCH_LOWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "codegen/kernel.h"

#define KEX_PROGRAM_NAME_MAX 160 /* bytes of a kernel name, NUL included */

typedef enum kex_dialect {
  KEX_DIALECT_OPENCL, /* OpenCL C, tinygrad's GPU renderer */
  KEX_DIALECT_CPU,    /* C for devices/cpu.c: void name(void **bufs, const int *ints, int gidx_start, int gidx_end) */
} kex_dialect;

/*
 * Linearizer.kernel_cnt: how many kernels of each base name were lowered, so
 * a repeated name gets the suffix n1, n2, ...  One per caller (a job, a
 * test); tinygrad keeps one per process.
 */
typedef struct kex_name_counter {
  uint32_t n, cap;
  char **names;
  uint32_t *counts;
} kex_name_counter;

void kex_name_counter_init(kex_name_counter *c);
void kex_name_counter_free(kex_name_counter *c);

/* One kernel argument (a DEFINE_GLOBAL, in the order the kernel takes them). */
typedef struct kex_program_arg {
  int32_t idx;      /* MemBuffer.idx: index into the schedule item's buffers */
  bool is_output;
  kex_dtype dtype;
  int64_t size;     /* elements the kernel can touch (real_size of its ShapeTracker) */
} kex_program_arg;

typedef struct kex_program_src {
  char name[KEX_PROGRAM_NAME_MAX];
  char *src;              /* kex_malloc'd, NUL-terminated */
  size_t global[3];       /* device.h: OpenCL work-groups (or work size without local), cpu: {outer, 1, 1} */
  size_t local[3];
  bool has_local;         /* pass local to the launch (else NULL) */
  uint32_t nargs;
  kex_program_arg *args;  /* kex_malloc'd */
  int nints;              /* int scalar args (always 0: no symbolic shapes) */
  int64_t op_estimate, mem_estimate;
  uint32_t nuops;         /* length of the linear uop program */
} kex_program_src;

/*
 * Lower kernel k (its opts already applied) for `dialect` with renderer caps
 * `caps` (NULL: the caps the kernel was made with).  The kernel is not
 * changed.  `names` (may be NULL: no suffixes) counts base names for the
 * n1/n2 suffix.  On success *out is filled (free with kex_program_src_free);
 * on error *out is zeroed and the code is KEX_ENOMEM, KEX_EUNSUPPORTED (a
 * feature the dialect lacks, e.g. locals on cpu) or KEX_EINTERNAL.
 */
int kex_lower_kernel(const kex_kernel *k, const kex_renderer_caps *caps, int dialect, kex_name_counter *names,
                     kex_program_src *out, kex_error *err);
void kex_program_src_free(kex_program_src *p);

/* Debugging: when nonzero, kex_lower_kernel prints the linear uops to stderr. */
extern int kex_lower_debug;

#endif

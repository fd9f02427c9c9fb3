/*
 * run.h - the executor: run a plan (realize/plan.h) on one device,
 * in-process, and `kex run` (kex_run_graph: build the plan, run it).  kexd
 * builds the same plan and runs it through its device runner.
 *
 * BUFFER inputs get their bytes here: inline data as given; fill specs are
 * generated deterministically (kex_fill_buffer): {"random": seed} draws from
 * splitmix64(seed) — floats uniform in [0, 1) like tinygrad's Tensor.rand,
 * signed ints uniform in [-100, 100), unsigned in [0, 100), bool fair coin;
 * {"arange": true} is 0, 1, 2, ... in the dtype; {"value": x} repeats x.
 */
#ifndef KEX_REALIZE_RUN_H
#define KEX_REALIZE_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/errors.h"
#include "realize/plan.h"
#include "devices/device.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/shapetracker.h"

/* Fill `out` (prod(shape) * itemsize bytes) for BUFFER node n as its fill spec or data says. */
int kex_fill_buffer(const kex_gnode *n, void *out, size_t nbytes, kex_error *err);

/* Fill n elements of dtype dt at out with the constant c (converted as dtypes.as_const). */
void kex_fill_const(kex_dtype dt, kex_const c, void *out, size_t n);

/* Write a .npy file (version 1.0) of dtype/shape with `data`.  bfloat16 is written as float32. */
int kex_write_npy(const char *path, kex_dtype dt, int ndim, const int64_t *shape, const void *data, kex_error *err);

typedef struct kex_run_kernel {
  char name[KEX_PROGRAM_NAME_MAX];
  char opts[KEX_PLAN_OPTS_MAX]; /* applied opts, short form: "UPCAST(0,4) LOCAL(0,32)" */
  double us;            /* one run, or the median of `repeat` timed runs after a warm-up */
  char *source;         /* rendered source (kex_malloc'd) */
} kex_run_kernel;

typedef struct kex_run_output {
  kex_dtype dtype;
  int ndim;
  int64_t shape[KEX_MAX_DIMS];
  size_t nbytes;
  void *data;           /* kex_malloc'd, row-major little-endian */
} kex_run_output;

typedef struct kex_run_result {
  uint32_t nkernels;
  kex_run_kernel *kernels;
  uint32_t noutputs;
  kex_run_output *outputs;
  double schedule_us;
} kex_run_result;

typedef struct kex_run_opts {
  int repeat;           /* >= 1: timed runs per kernel (median), after one warm-up when > 1 */
  bool keep_source;     /* fill kex_run_kernel.source */
  int beam;             /* > 0: opts from a BEAM search of this width (cached), else hand-coded */
  const char *cache_path; /* beam cache file; NULL: the default file; "": no cache (plan.h's cache policy: a lookup) */
  int beam_max_candidates; /* 0: the search's default cap per round */
} kex_run_opts;


/*
 * Run plan p (lowered; compiled or not) on dev: allocate its buffers, fill
 * its inputs, run its steps, read its outputs.  *res as kex_run_graph's
 * (kernels in plan order, outputs in graph order).  A plan whose graph
 * names job buffer handles cannot run here (KEX_ENOTFOUND).
 */
int kex_plan_run(const kex_rplan *p, kex_device *dev, const kex_run_opts *opts, kex_run_result *res, kex_error *err);

/*
 * Run graph g on dev: kex_plan_build (hand-coded opts, or beam with the
 * cache file opened for a lookup) then kex_plan_run.  On success *res holds the kernels (in schedule order)
 * and the outputs (graph order); release with kex_run_result_free.  Errors
 * name the kernel that failed (compile log, device error) or the node.
 */
int kex_run_graph(const kex_graph *g, kex_device *dev, const kex_run_opts *opts, kex_run_result *res, kex_error *err);
void kex_run_result_free(kex_run_result *res);

#endif

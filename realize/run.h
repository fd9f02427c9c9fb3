/*
 * run.h - the run-steps stage of the engine (kex_run_steps: a batch of a
 * plan's steps back to back on its device), and `kex run` in-process
 * (kex_run_graph: the plan, the engine's program stage, the steps).  kexd
 * runs the same stages, the steps on its device runner's items.
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
#include "realize/engine.h"
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
  bool program_cache;   /* programs from (and into) the cache file too (plan.h's cache policy: a lookup) */
} kex_run_opts;

#define KEX_RUN_BATCH_EVENTS 256 /* kernels kex_run_steps launches before it waits for them */

/*
 * The run-steps stage: run steps [first, first + n) of plan p back to back
 * on dev, on the caller's thread (the device's owner).  bufs[p->nbufs]: the
 * plan's buffers; progs[p->nkernels]: its programs, loaded on dev.  With
 * repeat <= 1 the kernels are launched one after another without waiting
 * (the device's queue keeps their order) and waited for together, at a
 * COPY step (which goes through the host) and at the end: the launch
 * latency is paid once per batch, not per kernel.  Each kernel's time (its
 * profiling event; with repeat > 1 the median of `repeat` launches after a
 * warm-up, each alone) goes to kernel_us[kernel] and the sum of the
 * kernels' device seconds to *device_s (may be NULL).  0, or a negative
 * code with *err (the device's message) and *failed the index of the step
 * that failed: the caller names it.
 */
int kex_run_steps(const kex_rplan *p, uint32_t first, uint32_t n, kex_buffer *const *bufs, kex_program *const *progs,
                  int repeat, double *kernel_us, double *device_s, uint32_t *failed, kex_error *err);


/*
 * Run graph g on dev: the plan (hand-coded opts, or beam with the cache
 * file opened for a lookup), the engine's program stage on dev (SQLite
 * first with opts->program_cache, else every kernel compiled), the
 * buffers, inputs, steps and outputs.  A graph that names job buffer
 * handles cannot run here (KEX_ENOTFOUND).  On success *res holds the kernels (in schedule order)
 * and the outputs (graph order); release with kex_run_result_free.  Errors
 * name the kernel that failed (compile log, device error) or the node.
 */
int kex_run_graph(const kex_graph *g, kex_device *dev, const kex_run_opts *opts, kex_run_result *res, kex_error *err);
void kex_run_result_free(kex_run_result *res);

#endif

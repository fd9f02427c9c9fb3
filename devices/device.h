/*
 * device.h - the one interface every compute device implements.
 *
 * A device is a table of functions (devices/device_impl.h) behind opaque,
 * refcounted handles: identity, memory (alloc/free, copy in/out),
 * compile(source, name) -> binary bytes, load(binary, name) -> program,
 * build(source, name) -> program (no binary; for programs only this
 * process runs), build_batch(sources) -> programs (several per compiler
 * call where the device can), prewarm(batch of sources) (optional: PoCL pre-builds in
 * helper processes), launch(program, global, local, buffers, int scalars)
 * -> event, wait, elapsed.  Three implementations exist:
 *
 *   opencl.c  OpenCL 1.2 through the ICD loader (PoCL on CPU machines,
 *             vendor drivers on GPU servers);
 *   cpu.c     C source -> the system compiler -> a shared object ->
 *             dlopen, run on a thread pool;
 *   fault.c   wraps any device and fails its N-th call of one kind.
 *
 * Errors: every fallible call returns 0 or a negative KEX_E* code and fills
 * *err (which may be NULL) with a message naming what failed: the kernel
 * name, the OpenCL error name (CL_OUT_OF_RESOURCES, ...), the build log.
 * KEX_ECOMPILE is a compile failure (the log is in the message), KEX_ENOMEM
 * an allocation failure on the host or the device, KEX_EDEVICE any other
 * failure the device reported, KEX_EINVAL a call that broke a rule stated
 * here, KEX_EUNSUPPORTED a dtype or feature the device lacks, KEX_ENOTFOUND
 * no device (or no kernel of that name).
 *
 * Threads: a device, and every handle made from it, is used by one thread
 * at a time (the thread that owns it; clSetKernelArg is not thread-safe).
 * Only kex_device_ref/unref may be called from any thread.
 *
 * Launch conventions (the renderers target these):
 *
 *   OpenCL  tinygrad's: `global` counts WORK-GROUPS when `local` is given;
 *           the NDRange global work size is global[i] * local[i].  With
 *           local == NULL, global is the work size and the driver picks
 *           the work-group size.  Kernel arguments are the buffers in order
 *           (`__global T *`), then the int scalars (`int`, 4 bytes).
 *
 *   cpu     every kernel has the signature
 *
 *             void name(void **bufs, const int *ints, int gidx_start, int gidx_end);
 *
 *           bufs[i] is the host pointer of buffer i (64-byte aligned),
 *           ints[j] the j-th int scalar.  The outer global dimension
 *           global[0] is split into contiguous ranges
 *           [gidx_start, gidx_end) that a thread pool sized to the cores
 *           the process may use (KEX_CPU_THREADS=N at open time overrides
 *           the count) claims a few at a time; the kernel loops over its range of the outer index (and
 *           over every inner dimension itself).  global[1] and global[2]
 *           must be 1, local must be NULL (has_local is false).  Ranges are
 *           disjoint and cover [0, global[0]) exactly; a range is never
 *           empty.  The launch runs to completion before it returns; its
 *           event carries the wall time.  The source is compiled with
 *           `cc -O2 -shared -fPIC -march=<its ISA level> -x c - -lm`
 *           (devices/cpu.c: the flags are in its compiler_version).
 */
#ifndef KEX_DEVICES_DEVICE_H
#define KEX_DEVICES_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/errors.h"

#define KEX_DEVICE_FIELD_MAX 256        /* bytes of each identity field, NUL included */
#define KEX_DEVICE_IDENTITY_STR_MAX 2600 /* bytes of a rendered identity, NUL included */
#define KEX_DEVICE_KERNEL_NAME_MAX 128  /* bytes of a kernel name, NUL excluded */
#define KEX_DEVICE_MAX_BUFS 128         /* buffers per launch */
#define KEX_DEVICE_MAX_INTS 64          /* int scalars per launch */
#define KEX_DEVICE_SOURCE_MAX (16u << 20) /* bytes of one kernel source */
#define KEX_DEVICE_BINARY_MAX (256u << 20) /* bytes of one compiled binary */

typedef struct kex_device kex_device;
typedef struct kex_buffer kex_buffer;
typedef struct kex_program kex_program;
typedef struct kex_event kex_event;

/*
 * What a compiled binary depends on.  Every field is a NUL-terminated,
 * non-empty string (at most KEX_DEVICE_FIELD_MAX - 1 bytes, longer values
 * are cut): kind ("opencl", "cpu", "fault+cpu"), vendor, device name,
 * driver version, compiler version (for OpenCL the OpenCL C version and
 * the platform version, which names the compiler; for cpu the first line
 * of `cc --version` and the flags).
 */
typedef struct kex_device_identity {
  char kind[KEX_DEVICE_FIELD_MAX];
  char vendor[KEX_DEVICE_FIELD_MAX];
  char name[KEX_DEVICE_FIELD_MAX];
  char driver_version[KEX_DEVICE_FIELD_MAX];
  char compiler_version[KEX_DEVICE_FIELD_MAX];
} kex_device_identity;

/*
 * What the device can do.  The flags mean what tinygrad's Renderer fields
 * mean: has_local (work-groups with local ids), has_shared (__local
 * memory), supports_float4, shared_max (bytes of __local memory the device
 * reports; tinygrad's renderers use 32768 when choosing opts).
 */
typedef struct kex_device_info {
  kex_device_identity identity;
  uint64_t global_mem;          /* bytes */
  uint64_t max_alloc;           /* bytes of the largest single buffer */
  bool has_local;
  bool has_shared;
  bool supports_float4;
  bool supports_fp16;
  bool supports_fp64;
  uint64_t shared_max;          /* bytes; 0 when !has_shared */
  size_t max_work_group_size;   /* 0 when !has_local */
  size_t max_work_item_sizes[3];
  int compute_units;
  /* kex_device_compile may run on any thread, several at once and beside the owner's calls (cpu: each
     compile is its own cc process).  False for OpenCL: PoCL 3.1 serializes builds process-wide (two
     threads building in two contexts took turns on one futex, ~200 ms each), so threads gain nothing. */
  bool compile_thread_safe;
} kex_device_info;

/* One entry of kex_device_list. */
typedef struct kex_device_desc {
  char open_name[KEX_DEVICE_FIELD_MAX + 8]; /* e.g. "opencl:<device name>", "cpu" */
  char kind[KEX_DEVICE_FIELD_MAX];          /* "opencl" or "cpu" */
  char name[KEX_DEVICE_FIELD_MAX];          /* device name */
  char platform[KEX_DEVICE_FIELD_MAX];      /* OpenCL platform name; "" for cpu */
  bool is_gpu;
} kex_device_desc;

/*
 * The entry of descs[0, n) (kex_device_list) that the name opens, as
 * kex_device_open picks it: "opencl" the first GPU else the first OpenCL
 * device, "opencl:<sub>" a name containing sub, "cpu" the C backend,
 * "default" the first GPU, OpenCL device, cpu; an exact open_name matches
 * itself.  NULL when none.
 */
const kex_device_desc *kex_device_desc_match(const kex_device_desc *descs, size_t n, const char *name);

/*
 * Open a device by name:
 *   "opencl"             the first OpenCL GPU, else the first OpenCL device;
 *   "opencl:<substring>" the first OpenCL device whose name contains the
 *                        substring (case-insensitive);
 *   "cpu"                the C backend;
 *   "default"            the first OpenCL GPU, else the first OpenCL device,
 *                        else cpu.
 * On success *out holds one reference (drop it with kex_device_unref).
 * Errors: KEX_ENOTFOUND (no such device, no OpenCL platform), KEX_EINVAL
 * (unknown name), KEX_ENOMEM, KEX_EDEVICE (the driver failed).
 */
int kex_device_open(const char *name, kex_device **out, kex_error *err);

/*
 * Every device that kex_device_open could open: the OpenCL devices of every
 * platform in order, then "cpu".  *out is one kex_malloc'd array of *count
 * entries, owned by the caller (kex_free).  A machine without OpenCL lists
 * only cpu; that is not an error.  Errors: KEX_ENOMEM.
 */
int kex_device_list(kex_device_desc **out, size_t *count, kex_error *err);

void kex_device_ref(kex_device *dev);
/* Drop one reference; the last one releases the device.  NULL is a no-op. */
void kex_device_unref(kex_device *dev);

/* The device's capabilities; valid while the device is referenced. */
const kex_device_info *kex_device_get_info(const kex_device *dev);
const kex_device_identity *kex_device_get_identity(const kex_device *dev);
/*
 * A number no other device handle of this process has had (1, 2, ...):
 * what a process-wide table keyed by device uses, since a freed handle's
 * address may come back for another device (cpu with other thread counts).
 */
uint64_t kex_device_uid(const kex_device *dev);

/*
 * Render an identity as one stable string ("kind=...;vendor=...;name=...;
 * driver=...;compiler=...", with '\\', ';' and '=' inside values escaped by
 * a backslash) into out[cap].  The same identity always renders the same
 * bytes, and different identities render differently: it is a cache key.
 * Returns the length, or KEX_ELIMIT when cap is too small (out then holds
 * a truncated, NUL-terminated prefix when cap > 0).
 */
int kex_device_identity_render(const kex_device_identity *id, char *out, size_t cap);

/*
 * KEX_EUNSUPPORTED when kernels of dtype dt cannot run on dev, e.g.
 * "float16 is not supported on <device>: the device lacks cl_khr_fp16";
 * 0 when they can.
 */
int kex_device_check_dtype(const kex_device *dev, kex_dtype dt, kex_error *err);

/*
 * Buffers.  alloc gives `size` (> 0, <= max_alloc) bytes of device memory,
 * contents undefined; the buffer keeps a reference to the device until
 * kex_buffer_free (NULL is a no-op).  copy_in/copy_out move `size` bytes
 * between host memory and [offset, offset + size) of the buffer and
 * complete before they return; a range outside the buffer is KEX_EINVAL.
 */
int kex_device_alloc(kex_device *dev, size_t size, kex_buffer **out, kex_error *err);
void kex_buffer_free(kex_buffer *buf);
size_t kex_buffer_size(const kex_buffer *buf);
int kex_buffer_copy_in(kex_buffer *buf, size_t offset, const void *src, size_t size, kex_error *err);
int kex_buffer_copy_out(kex_buffer *buf, size_t offset, void *dst, size_t size, kex_error *err);

/*
 * Compile the source of kernel `name` to the device's binary form
 * (OpenCL: clGetProgramInfo(CL_PROGRAM_BINARIES); cpu: the .so bytes).
 * *bin is kex_malloc'd and owned by the caller.  Errors: KEX_ECOMPILE with
 * the build log in the message, KEX_EINVAL (empty or oversized source, bad
 * name), KEX_ENOMEM.
 */
int kex_device_compile(kex_device *dev, const char *source, const char *name, unsigned char **bin,
                       size_t *bin_size, kex_error *err);

/*
 * Make a runnable program of kernel `name` from a binary that
 * kex_device_compile produced on a device of the same identity (now or in
 * an earlier process).  The program keeps a reference to the device until
 * kex_program_free (NULL is a no-op).  Errors: KEX_ECOMPILE (the driver
 * rejected the binary), KEX_ENOTFOUND (no kernel of that name), KEX_ENOMEM.
 */
int kex_device_load(kex_device *dev, const unsigned char *bin, size_t bin_size, const char *name,
                    kex_program **out, kex_error *err);
void kex_program_free(kex_program *prog);
const char *kex_program_name(const kex_program *prog);

/*
 * Compile and load in one step, for a program that only this process runs
 * (beam-search candidates).  Where producing the binary costs extra work
 * the device skips it: PoCL generates and links a whole work-group function
 * for CL_PROGRAM_BINARIES (measured 250-400 ms per kernel, more than the
 * build itself), which a program used only here never needs.  When the
 * binary came for free (cpu: the .so bytes) and bin is not NULL, *bin and
 * *bin_size get it (kex_malloc'd, the caller's); otherwise *bin is NULL.
 * Errors: those of kex_device_compile and kex_device_load.
 */
int kex_device_build(kex_device *dev, const char *source, const char *name, kex_program **out,
                     unsigned char **bin, size_t *bin_size, kex_error *err);

/*
 * Build many programs at once, for programs only this process runs (beam-search candidates): each item's
 * source (kernel `name`) becomes item->prog, as kex_device_build would make it (no binary), or item->rc < 0
 * with item->err naming the kernel and what failed (KEX_ECOMPILE with its own build log, KEX_EINVAL for a bad
 * source or name, ...).  Where the device can, sources share a compiler invocation: opencl.c builds groups of
 * up to KEX_DEVICE_BATCH_MAX kernels as one program (renamed apart; one clBuildProgram instead of one each),
 * and a group that fails to build is split in halves until each failing source is built alone, so a bad source
 * fails only its own item.  Where the device can also pre-build (PoCL with its kernel cache on), the groups go
 * to its helper processes first, as kex_device_prewarm does for single sources: they build each group and
 * launch each kernel once on one work-group of item->local (when not NULL; buffers of item->buf_sizes), and
 * the device's own build and first launches then hit PoCL's cache.  Elsewhere each item is kex_device_build.
 * Programs of one group are freed independently (each holds the group's program).  Returns the number of
 * items built (0..n); a negative code only when the call itself fails (KEX_EINVAL: n < 0), and then no item
 * was touched.
 */
#define KEX_DEVICE_BATCH_MAX 32
typedef struct kex_build_item {
  const char *source, *name;  /* in */
  const size_t *local;        /* in, optional: the local size it will be launched with (pre-build hint) */
  uint32_t nbufs;             /* in, optional: its buffers' count and bytes (pre-build hint) */
  const size_t *buf_sizes;
  const size_t *global;       /* in, optional: its global size in work-groups (pre-build hint; NULL: small) */
  kex_program *prog;          /* out: NULL when rc < 0 */
  int rc;                     /* out: 0 or a KEX_E* code */
  kex_error err;              /* out: the message when rc < 0 */
} kex_build_item;
int kex_device_build_batch(kex_device *dev, kex_build_item *items, int n, kex_error *err);

/*
 * Make the later kex_device_build of these sources cheaper, where the
 * device can: PoCL (opencl.c) builds them, and generates the code of their
 * local size, in helper processes running in parallel, whose results land
 * in PoCL's kernel cache.  Blocks until the batch is done; *warmed counts
 * the sources that were built.  Nothing about the items' programs changes:
 * a source that fails here is simply built (and its error reported) by
 * kex_device_build.  Errors: KEX_EUNSUPPORTED (the device has no such
 * step: call kex_device_build directly).
 */
typedef struct kex_prewarm_item {
  const char *source, *name;
  const size_t *local;     /* the local size it will be launched with, or NULL */
  uint32_t nbufs;          /* kernel arguments, all buffers */
  const size_t *buf_sizes; /* bytes of each */
  const size_t *global;    /* its global size in work-groups, or NULL (PoCL's code differs for wide grids) */
  /* kex_device_compile_for_launch: a compile still running when *cancel becomes true is stopped (PoCL: its
     helper is killed; cpu: the compiler's process group) and fails KEX_ECANCELLED; NULL: never */
  const atomic_bool *cancel;
} kex_prewarm_item;
int kex_device_prewarm(kex_device *dev, const kex_prewarm_item *items, int n, int *warmed, kex_error *err);

/*
 * kex_device_compile of item's source and name, told how the kernel will
 * be launched (its local size and buffer sizes; local NULL: unknown).
 * PoCL (opencl.c) compiles in a helper process of the instance, which also
 * launches the kernel once on one work-group of that local size, so the
 * machine code PoCL generates at a first launch is in its kernel cache
 * (and in the binary) before any load: the first launch after the load
 * costs no code generation.  Other devices ignore the launch.  Errors:
 * those of kex_device_compile.
 */
int kex_device_compile_for_launch(kex_device *dev, const kex_prewarm_item *item, unsigned char **bin,
                                  size_t *bin_size, kex_error *err);

/*
 * Launch prog over global[3] (work-groups, see the conventions above) with
 * local[3] (or NULL) on bufs[0..nbufs) and ints[0..nints).  Every buffer
 * must come from the program's device.  On success *out is an event owned
 * by the caller (kex_event_free; freeing an unfinished event does not
 * cancel the kernel).  Errors: KEX_EINVAL (bad sizes or handles, more than
 * KEX_DEVICE_MAX_BUFS/INTS), KEX_ENOMEM, KEX_EDEVICE (with the OpenCL error
 * name and the kernel name).
 */
int kex_program_launch(kex_program *prog, const size_t global[3], const size_t local[3],
                       kex_buffer *const *bufs, int nbufs, const int32_t *ints, int nints,
                       kex_event **out, kex_error *err);

/*
 * Block until the kernel of ev finished.  Errors: KEX_EDEVICE, KEX_EDEADLINE
 * (it ran longer than the kernel time limit in force at its launch).
 */
int kex_event_wait(kex_event *ev, kex_error *err);
/*
 * Kernel time of ev in seconds (OpenCL: CL_PROFILING_COMMAND_END - START;
 * cpu: wall time of the launch), waiting for it first.  Errors: KEX_EDEVICE,
 * KEX_EDEADLINE (as kex_event_wait; *seconds is still set).
 */
int kex_event_elapsed(kex_event *ev, double *seconds, kex_error *err);
void kex_event_free(kex_event *ev);

/*
 * Kernel time limit: from now on, a kernel launched on dev that runs longer
 * than `seconds` fails with KEX_EDEADLINE and a message naming the kernel
 * and the limit; 0 (the default) is no limit.  Owner thread only.  What
 * "fails" can mean depends on the device -- this is the watchdog, honestly:
 *
 *   cpu     the launch stops the kernel: between the ranges of the outer
 *           dimension it hands to its threads (about 16 per thread) it
 *           checks the clock, and past the limit no thread starts another
 *           range; kex_program_launch returns KEX_EDEADLINE saying how many
 *           ranges ran.  The output buffers then hold partial results.  A
 *           range that started runs to its end, so a kernel stops at most
 *           one range late -- and a kernel with global[0] == 1 (e.g. a
 *           reduction to a single value) is one range: it cannot be
 *           stopped, it fails when it ends (as on OpenCL).
 *   opencl  a kernel on the device cannot be stopped from the host (OpenCL
 *           has no way to kill one).  The limit is checked when it has
 *           ended: kex_event_wait / kex_event_elapsed return KEX_EDEADLINE
 *           when its profiled time exceeds the limit.  Until it ends, the
 *           queue -- and the thread waiting on it -- stays held; only the
 *           driver's own watchdog, where it has one (GPU drivers reset a
 *           hung GPU; PoCL's CPU device has none), ends it sooner.  Callers
 *           bound the damage above the device: kexd fails the submission
 *           and starts none of its later kernels.
 *
 * Any device: the check at the end applies too (a cpu kernel whose last
 * range ended past the limit also fails, with complete results).
 */
void kex_device_set_kernel_time_limit(kex_device *dev, double seconds);
double kex_device_kernel_time_limit(const kex_device *dev);

/*
 * Compile time limit (seconds, 0: none), set before the instance's first
 * compile: a kex_device_compile still running past it is stopped and
 * fails with KEX_EDEADLINE naming the kernel and the limit.  cpu: the
 * compiler's whole process group is killed; PoCL: the instance's compile
 * helper process is killed (a new one serves the next compile).  Returns
 * false when the device cannot stop a compile (OpenCL platforms other than
 * PoCL, or KEX_CL_NO_HELPERS set: the build runs inside the driver, in
 * this process) and the limit does not apply.
 */
bool kex_device_set_compile_time_limit(kex_device *dev, double seconds);

/*
 * Serial timing, for measuring short kernels (the beam search's): while on,
 * a launch runs its ranges one after another on the launching thread, split
 * exactly as the pool would split them, and its event's elapsed time is the
 * pool's ideal time for those ranges: max(their sum / the pool's threads,
 * the longest one).  The kernel's results are the same; the kernel time
 * limit holds against the real time.  Why: a pooled launch of a
 * microsecond kernel on a shared machine has regimes -- which core holds
 * which range's data, whether a worker was awake, what runs beside it --
 * that moved one kernel's time against another's by 0.6x to 1.0x from one
 * second to the next, while one thread's times kept their ratio within a
 * few per cent (bench/results/beam-repeatable.md).  Owner thread only.
 * Returns whether the device has the mode (cpu: yes; opencl: no, and its
 * launches are unchanged).
 */
bool kex_device_set_serial_timing(kex_device *dev, bool on);

/*
 * Fault injection (fault.c): a device that passes every call through to
 * `inner` (taking a reference on it) but fails the n-th call (n >= 1,
 * counted from creation) of one kind with KEX_EDEVICE and a message naming
 * the kind and the call number: "fault device: injected failure of compile
 * call #2".  Copy counts copy_in and copy_out together.  Handles made by the
 * fault device must be used with it (and are released through it).
 * Errors: KEX_EINVAL (n == 0, bad kind), KEX_ENOMEM.
 */
typedef enum kex_fault_kind {
  KEX_FAULT_ALLOC,
  KEX_FAULT_COMPILE,
  KEX_FAULT_LAUNCH,
  KEX_FAULT_COPY,
  KEX_FAULT_KIND_COUNT
} kex_fault_kind;

const char *kex_fault_kind_name(kex_fault_kind kind);
int kex_fault_device_new(kex_device *inner, kex_fault_kind kind, unsigned long n, kex_device **out);
/*
 * A slow stretch: launches from + 1 .. from + count (counted from the
 * fault device's creation, as kex_fault_device_calls counts them) report
 * their elapsed time x factor, as a machine in a slow state would (at most
 * 64 such events alive at once; the runs themselves are unchanged).
 * count 0 ends it.  KEX_EINVAL: not a fault device, or factor <= 0.
 */
int kex_fault_device_set_slow(kex_device *dev, unsigned long from, unsigned long count, double factor);
/* Calls of kind so far (0 for a device that is not a fault device). */
unsigned long kex_fault_device_calls(kex_device *dev, kex_fault_kind kind);

#endif

/*
 * opencl.c - the OpenCL device, through the ICD loader (OpenCL 1.2 API).
 *
 * One device = one cl_context and one in-order command queue with
 * CL_QUEUE_PROFILING_ENABLE, so kernel time is the event's
 * CL_PROFILING_COMMAND_END - START, as tinygrad's CLProgram measures it.
 * compile() builds from source (the build log goes into the error) and
 * returns clGetProgramInfo(CL_PROGRAM_BINARIES), which a later cache can
 * store; load() rebuilds from such a binary with clCreateProgramWithBinary.
 * Because PoCL builds are slow (tens to hundreds of ms), the cl_program of
 * the last compile is kept in a one-entry memo, and a load of exactly those
 * bytes right after takes it over instead of building again.
 *
 * Launches follow tinygrad: global counts work-groups when local is given,
 * so the NDRange global work size is global[i] * local[i]; buffers are the
 * first kernel arguments, then the int scalars.
 *
 * Found on PoCL 3.1 (notes/stack.md section 4): no cl_khr_fp16; machine code
 * is generated lazily at the first enqueue of each local size; local memory
 * is ordinary RAM (LOCAL_MEM_TYPE = CL_GLOBAL).
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "devices/device_impl.h"

#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

#define KEX_CL_MAX_PLATFORMS 16
#define KEX_CL_MAX_DEVICES 64

typedef struct kex_cl_device {
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
  char name[KEX_DEVICE_FIELD_MAX];
  int index;         /* in kex_cl_enumerate's order: how a build helper finds the same device */
  int compute_units;
  int prewarm_ok;    /* PoCL with its kernel cache on: helpers can pre-build (kex_cl_prewarm) */
  int helpers_tried, nhelpers;
  int helper_fd[4];
  pid_t helper_pid[4];
  /* Compiles in helper processes (PoCL; kex_cl_compile_apart): whether, and the time limit */
  bool apart;
  double compile_limit_s;
  /* The cl_program of the last compile and a copy of its binary (or NULL). */
  cl_program memo_program;
  unsigned char *memo_bin;
  size_t memo_size;
} kex_cl_device;

typedef struct kex_cl_program {
  cl_program program;
  cl_kernel kernel;
} kex_cl_program;

/* ---- error names ---- */

#define KEX_CL_ERROR_MAP(XX)                                                                                   \
  XX(CL_SUCCESS) XX(CL_DEVICE_NOT_FOUND) XX(CL_DEVICE_NOT_AVAILABLE) XX(CL_COMPILER_NOT_AVAILABLE)             \
  XX(CL_MEM_OBJECT_ALLOCATION_FAILURE) XX(CL_OUT_OF_RESOURCES) XX(CL_OUT_OF_HOST_MEMORY)                       \
  XX(CL_PROFILING_INFO_NOT_AVAILABLE) XX(CL_MEM_COPY_OVERLAP) XX(CL_IMAGE_FORMAT_MISMATCH)                     \
  XX(CL_IMAGE_FORMAT_NOT_SUPPORTED) XX(CL_BUILD_PROGRAM_FAILURE) XX(CL_MAP_FAILURE)                            \
  XX(CL_MISALIGNED_SUB_BUFFER_OFFSET) XX(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)                         \
  XX(CL_COMPILE_PROGRAM_FAILURE) XX(CL_LINKER_NOT_AVAILABLE) XX(CL_LINK_PROGRAM_FAILURE)                       \
  XX(CL_DEVICE_PARTITION_FAILED) XX(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) XX(CL_INVALID_VALUE)                     \
  XX(CL_INVALID_DEVICE_TYPE) XX(CL_INVALID_PLATFORM) XX(CL_INVALID_DEVICE) XX(CL_INVALID_CONTEXT)              \
  XX(CL_INVALID_QUEUE_PROPERTIES) XX(CL_INVALID_COMMAND_QUEUE) XX(CL_INVALID_HOST_PTR)                         \
  XX(CL_INVALID_MEM_OBJECT) XX(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) XX(CL_INVALID_IMAGE_SIZE)                   \
  XX(CL_INVALID_SAMPLER) XX(CL_INVALID_BINARY) XX(CL_INVALID_BUILD_OPTIONS) XX(CL_INVALID_PROGRAM)             \
  XX(CL_INVALID_PROGRAM_EXECUTABLE) XX(CL_INVALID_KERNEL_NAME) XX(CL_INVALID_KERNEL_DEFINITION)                \
  XX(CL_INVALID_KERNEL) XX(CL_INVALID_ARG_INDEX) XX(CL_INVALID_ARG_VALUE) XX(CL_INVALID_ARG_SIZE)              \
  XX(CL_INVALID_KERNEL_ARGS) XX(CL_INVALID_WORK_DIMENSION) XX(CL_INVALID_WORK_GROUP_SIZE)                      \
  XX(CL_INVALID_WORK_ITEM_SIZE) XX(CL_INVALID_GLOBAL_OFFSET) XX(CL_INVALID_EVENT_WAIT_LIST)                    \
  XX(CL_INVALID_EVENT) XX(CL_INVALID_OPERATION) XX(CL_INVALID_GL_OBJECT) XX(CL_INVALID_BUFFER_SIZE)            \
  XX(CL_INVALID_MIP_LEVEL) XX(CL_INVALID_GLOBAL_WORK_SIZE) XX(CL_INVALID_PROPERTY)                             \
  XX(CL_INVALID_IMAGE_DESCRIPTOR) XX(CL_INVALID_COMPILER_OPTIONS) XX(CL_INVALID_LINKER_OPTIONS)                \
  XX(CL_INVALID_DEVICE_PARTITION_COUNT) XX(CL_PLATFORM_NOT_FOUND_KHR)

/* "CL_OUT_OF_RESOURCES" for -5; "CL_ERROR(<n>)" (static buffer) for unknown codes. */
static const char *kex_cl_errname(cl_int e) {
  static _Thread_local char unknown[32];
  switch (e) {
#define XX(name) \
  case name:     \
    return #name;
    KEX_CL_ERROR_MAP(XX)
#undef XX
  }
  snprintf(unknown, sizeof unknown, "CL_ERROR(%d)", (int)e);
  return unknown;
}

/* The kex code for an OpenCL failure: allocation failures are KEX_ENOMEM, the rest KEX_EDEVICE. */
static int kex_cl_code(cl_int e) {
  if (e == CL_OUT_OF_HOST_MEMORY || e == CL_MEM_OBJECT_ALLOCATION_FAILURE) return KEX_ENOMEM;
  return KEX_EDEVICE;
}

/* ---- enumeration ---- */

/*
 * PoCL's pthread device leaves its worker threads unpinned unless
 * POCL_AFFINITY=1.  Unpinned, a worker woken for a launch lands on the
 * waking thread's core (wake-affine) and on this 2-core VM often stayed
 * there: in about half of the processes every kernel ran at one core's
 * speed (sum of 4M floats 0.82-0.86 ms instead of 0.42-0.46 ms; measured
 * with POCL_AFFINITY unset and =1).  So kex sets POCL_AFFINITY=1 before
 * PoCL initializes, unless the environment already says otherwise (set
 * POCL_AFFINITY=0 to keep PoCL's default).  This runs once, before the
 * first clGetPlatformIDs of the process.  setenv is not safe against a
 * getenv running at the same time on another thread; a program that cannot
 * rule that out sets POCL_AFFINITY itself before it starts threads.
 */
static pthread_once_t kex_cl_env_once = PTHREAD_ONCE_INIT;

/*
 * PoCL generates a kernel's machine code at its first launch of each local
 * size and links it into a shared object by running the system linker
 * (clang's driver looks for `ld` in COMPILER_PATH first).  GNU ld (bfd)
 * was about 40% of that first launch for a beam candidate (perf: ld's
 * page faults and memmove), gold about 40% less in all (first launches of
 * 24 matmul candidates: 270 -> 170 ms each, interleaved; the kernel's code
 * is the same object either way).  So where gold is installed and
 * COMPILER_PATH is unset, kex points COMPILER_PATH at a private folder
 * (mkdtemp, removed at exit) whose `ld` is gold; KEX_CL_LINKER=default
 * keeps the system's.  Build helpers inherit it.  The cpu device's cc then
 * links with gold too (gcc searches COMPILER_PATH as well): the same code.
 */
#define KEX_CL_GOLD "/usr/bin/ld.gold"
static char kex_cl_ld_dir[64];

static void kex_cl_ld_remove(void) {
  char ld[sizeof kex_cl_ld_dir + 4];
  snprintf(ld, sizeof ld, "%s/ld", kex_cl_ld_dir);
  unlink(ld);
  rmdir(kex_cl_ld_dir);
}

static void kex_cl_linker_init(void) {
  const char *want = getenv("KEX_CL_LINKER"), *tmp = getenv("TMPDIR");
  char ld[sizeof kex_cl_ld_dir + 4];
  if (getenv("COMPILER_PATH") || (want && strcmp(want, "default") == 0) || access(KEX_CL_GOLD, X_OK) != 0) return;
  snprintf(kex_cl_ld_dir, sizeof kex_cl_ld_dir, "%s/kex-ld-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  if (!mkdtemp(kex_cl_ld_dir)) return;
  snprintf(ld, sizeof ld, "%s/ld", kex_cl_ld_dir);
  if (symlink(KEX_CL_GOLD, ld) != 0 || atexit(kex_cl_ld_remove) != 0 || setenv("COMPILER_PATH", kex_cl_ld_dir, 0) != 0) {
    kex_cl_ld_remove();
    return;
  }
  KEX_DEBUG("opencl: PoCL links kernels with %s (COMPILER_PATH=%s)", KEX_CL_GOLD, kex_cl_ld_dir);
}

static void kex_cl_env_init(void) {
  if (setenv("POCL_AFFINITY", "1", 0) != 0) KEX_WARN("opencl: cannot set POCL_AFFINITY=1");
  kex_cl_linker_init(); /* a build helper inherits its parent's COMPILER_PATH */
}

typedef struct kex_cl_found {
  cl_platform_id platform;
  cl_device_id device;
  int is_gpu;
} kex_cl_found;

/*
 * Every OpenCL device of every platform, in order, into found[KEX_CL_MAX_DEVICES].
 * No ICD / no platform gives *n = 0 and returns 0.  Errors: KEX_EDEVICE.
 */
static int kex_cl_enumerate(kex_cl_found *found, int *n, kex_error *err) {
  cl_platform_id platforms[KEX_CL_MAX_PLATFORMS];
  cl_uint np = 0;
  cl_int e;

  *n = 0;
  pthread_once(&kex_cl_env_once, kex_cl_env_init);
  e = clGetPlatformIDs(KEX_CL_MAX_PLATFORMS, platforms, &np);
  if (e == CL_PLATFORM_NOT_FOUND_KHR || (e == CL_SUCCESS && np == 0)) return 0;
  if (e != CL_SUCCESS) return kex_err_set(err, KEX_EDEVICE, "opencl: clGetPlatformIDs failed: %s", kex_cl_errname(e));
  if (np > KEX_CL_MAX_PLATFORMS) np = KEX_CL_MAX_PLATFORMS;
  for (cl_uint p = 0; p < np; p++) {
    cl_device_id devices[KEX_CL_MAX_DEVICES];
    cl_uint nd = 0;
    e = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, KEX_CL_MAX_DEVICES, devices, &nd);
    if (e == CL_DEVICE_NOT_FOUND) continue;
    if (e != CL_SUCCESS) {
      KEX_WARN("opencl: clGetDeviceIDs on platform %u failed: %s", p, kex_cl_errname(e));
      continue;
    }
    if (nd > KEX_CL_MAX_DEVICES) nd = KEX_CL_MAX_DEVICES;
    for (cl_uint d = 0; d < nd && *n < KEX_CL_MAX_DEVICES; d++) {
      cl_device_type type = 0;
      clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      found[*n].platform = platforms[p];
      found[*n].device = devices[d];
      found[*n].is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
      (*n)++;
    }
  }
  return 0;
}

/* clGetDeviceInfo on d, or clGetPlatformInfo on p when d is NULL. */
static cl_int kex_cl_info(cl_device_id d, cl_platform_id p, cl_uint what, size_t size, void *value, size_t *need) {
  return d ? clGetDeviceInfo(d, what, size, value, need) : clGetPlatformInfo(p, what, size, value, need);
}

/*
 * The string property `what` of d (of p when d is NULL), kex_malloc'd and
 * NUL-terminated.  NULL when the query fails or is empty (*nomem 0) or when
 * out of memory (*nomem 1).
 */
static char *kex_cl_info_str(cl_device_id d, cl_platform_id p, cl_uint what, int *nomem) {
  size_t need = 0;
  char *s;
  *nomem = 0;
  if (kex_cl_info(d, p, what, 0, NULL, &need) != CL_SUCCESS || need == 0) return NULL;
  s = kex_malloc(need + 1);
  if (!s) {
    *nomem = 1;
    return NULL;
  }
  if (kex_cl_info(d, p, what, need, s, NULL) != CL_SUCCESS) {
    kex_free(s);
    return NULL;
  }
  s[need] = 0;
  return s;
}

/* A string property into out[KEX_DEVICE_FIELD_MAX] (cut if longer; "" on failure). */
static void kex_cl_str_into(cl_device_id d, cl_platform_id p, cl_uint what, char *out) {
  int nomem;
  char *s = kex_cl_info_str(d, p, what, &nomem);
  snprintf(out, KEX_DEVICE_FIELD_MAX, "%s", s ? s : "");
  kex_free(s);
}

static void kex_cl_device_str(cl_device_id d, cl_device_info what, char *out) {
  kex_cl_str_into(d, NULL, what, out);
}

static void kex_cl_platform_str(cl_platform_id p, cl_platform_info what, char *out) {
  kex_cl_str_into(NULL, p, what, out);
}

/*
 * Whether the space-separated extension list of d contains ext.  Returns 1,
 * 0, or KEX_ENOMEM.
 */
static int kex_cl_has_extension(cl_device_id d, const char *ext) {
  size_t n = strlen(ext);
  int nomem, found = 0;
  char *list = kex_cl_info_str(d, NULL, CL_DEVICE_EXTENSIONS, &nomem);
  if (!list) return nomem ? KEX_ENOMEM : 0;
  for (char *p = list; (p = strstr(p, ext)) != NULL; p += n) {
    if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) {
      found = 1;
      break;
    }
  }
  kex_free(list);
  return found;
}

int kex_cl_list(kex_device_desc **list, size_t *count, size_t *cap, kex_error *err) {
  kex_cl_found found[KEX_CL_MAX_DEVICES];
  int n = 0, rc;

  rc = kex_cl_enumerate(found, &n, err);
  if (rc < 0) return rc;
  if (n == 0) return 0;
  if (*count + (size_t)n > *cap) {
    kex_device_desc *grown = kex_realloc(*list, (*count + (size_t)n) * sizeof **list);
    if (!grown) return kex_err_set(err, KEX_ENOMEM, "out of memory listing OpenCL devices");
    *list = grown;
    *cap = *count + (size_t)n;
  }
  for (int i = 0; i < n; i++) {
    kex_device_desc *d = &(*list)[(*count)++];
    memset(d, 0, sizeof *d);
    snprintf(d->kind, sizeof d->kind, "opencl");
    kex_cl_device_str(found[i].device, CL_DEVICE_NAME, d->name);
    kex_cl_platform_str(found[i].platform, CL_PLATFORM_NAME, d->platform);
    memcpy(d->open_name, "opencl:", 7);
    memcpy(d->open_name + 7, d->name, sizeof d->name);
    d->is_gpu = found[i].is_gpu;
  }
  return 0;
}

/* ---- the device table ---- */

static void kex_cl_memo_clear(kex_cl_device *cl) {
  if (cl->memo_program) clReleaseProgram(cl->memo_program);
  kex_free(cl->memo_bin);
  cl->memo_program = NULL;
  cl->memo_bin = NULL;
  cl->memo_size = 0;
}

static void kex_cl_helpers_stop(kex_cl_device *cl);

static void kex_cl_destroy(void *impl) {
  kex_cl_device *cl = impl;
  kex_cl_helpers_stop(cl);
  kex_cl_memo_clear(cl);
  if (cl->queue) {
    clFinish(cl->queue);
    clReleaseCommandQueue(cl->queue);
  }
  if (cl->context) clReleaseContext(cl->context);
  kex_free(cl);
}

static int kex_cl_alloc(void *impl, size_t size, void **out, kex_error *err) {
  kex_cl_device *cl = impl;
  cl_int e = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, size, NULL, &e);
  if (!mem || e != CL_SUCCESS)
    return kex_err_set(err, kex_cl_code(e), "opencl %s: clCreateBuffer of %zu bytes failed: %s", cl->name, size,
                       kex_cl_errname(e));
  *out = mem;
  return 0;
}

static void kex_cl_free(void *impl, void *buf) {
  (void)impl;
  clReleaseMemObject((cl_mem)buf);
}

/* The result of a blocking copy of size bytes made by call: 0, or the error. */
static int kex_cl_copied(const kex_cl_device *cl, cl_int e, const char *call, size_t size, kex_error *err) {
  if (e != CL_SUCCESS)
    return kex_err_set(err, kex_cl_code(e), "opencl %s: %s of %zu bytes failed: %s", cl->name, call, size,
                       kex_cl_errname(e));
  return 0;
}

static int kex_cl_copy_in(void *impl, void *buf, size_t offset, const void *src, size_t size, kex_error *err) {
  kex_cl_device *cl = impl;
  return kex_cl_copied(cl, clEnqueueWriteBuffer(cl->queue, (cl_mem)buf, CL_TRUE, offset, size, src, 0, NULL, NULL),
                       "clEnqueueWriteBuffer", size, err);
}

static int kex_cl_copy_out(void *impl, void *buf, size_t offset, void *dst, size_t size, kex_error *err) {
  kex_cl_device *cl = impl;
  return kex_cl_copied(cl, clEnqueueReadBuffer(cl->queue, (cl_mem)buf, CL_TRUE, offset, size, dst, 0, NULL, NULL),
                       "clEnqueueReadBuffer", size, err);
}

/*
 * Fill err with KEX_ECOMPILE, the failing step, the CL error and the build
 * log of program (the full log also goes to the debug log).
 */
static int kex_cl_build_error(kex_cl_device *cl, cl_program program, const char *name, const char *step, cl_int e,
                              kex_error *err) {
  size_t need = 0;
  char *log = NULL;
  int rc;
  if (clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &need) == CL_SUCCESS && need > 0) {
    log = kex_malloc(need + 1);
    if (log && clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, need, log, NULL) == CL_SUCCESS)
      log[need] = 0;
    else if (log)
      log[0] = 0;
  }
  rc = kex_err_set(err, KEX_ECOMPILE, "opencl %s: %s of kernel %s failed: %s; build log: %s", cl->name, step, name,
                   kex_cl_errname(e), log && log[0] ? log : "(empty)");
  KEX_DEBUG("opencl %s: build log of kernel %s:\n%s", cl->name, name, log ? log : "");
  kex_free(log);
  return rc;
}

static int kex_cl_compile_apart(kex_cl_device *cl, const char *source, const char *name,
                                const kex_prewarm_item *launch, unsigned char **bin, size_t *bin_size,
                                kex_error *err);

static int kex_cl_compile(void *impl, const char *source, const char *name, const kex_prewarm_item *launch,
                          unsigned char **bin, size_t *bin_size, kex_error *err) {
  kex_cl_device *cl = impl;
  cl_program program = NULL;
  unsigned char *bytes = NULL, *memo_copy = NULL;
  size_t size = 0;
  cl_int e = CL_SUCCESS;
  int rc;

  if (cl->apart && (rc = kex_cl_compile_apart(cl, source, name, launch, bin, bin_size, err)) != 1) return rc;

  program = clCreateProgramWithSource(cl->context, 1, &source, NULL, &e);
  if (!program || e != CL_SUCCESS) {
    rc = kex_err_set(err, kex_cl_code(e), "opencl %s: clCreateProgramWithSource of kernel %s failed: %s", cl->name,
                     name, kex_cl_errname(e));
    goto out;
  }
  e = clBuildProgram(program, 1, &cl->device, NULL, NULL, NULL);
  if (e != CL_SUCCESS) {
    rc = kex_cl_build_error(cl, program, name, "clBuildProgram", e, err);
    goto out;
  }
  e = clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
  if (e != CL_SUCCESS || size == 0) {
    rc = kex_err_set(err, KEX_ECOMPILE, "opencl %s: kernel %s has no binary (CL_PROGRAM_BINARY_SIZES: %s)", cl->name,
                     name, kex_cl_errname(e));
    goto out;
  }
  bytes = kex_malloc(size);
  memo_copy = kex_malloc(size);
  if (!bytes || !memo_copy) {
    rc = kex_err_set(err, KEX_ENOMEM, "opencl %s: out of memory for the %zu-byte binary of kernel %s", cl->name, size,
                     name);
    goto out;
  }
  e = clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bytes, &bytes, NULL);
  if (e != CL_SUCCESS) {
    rc = kex_err_set(err, KEX_ECOMPILE, "opencl %s: CL_PROGRAM_BINARIES of kernel %s failed: %s", cl->name, name,
                     kex_cl_errname(e));
    goto out;
  }
  memcpy(memo_copy, bytes, size);
  kex_cl_memo_clear(cl);
  cl->memo_program = program;
  cl->memo_bin = memo_copy;
  cl->memo_size = size;
  program = NULL;
  memo_copy = NULL;
  *bin = bytes;
  *bin_size = size;
  bytes = NULL;
  rc = 0;
out:
  kex_free(memo_copy);
  kex_free(bytes);
  if (program) clReleaseProgram(program);
  return rc;
}

/*
 * What load and build end with: build `program` (when build_what names the
 * step for messages; NULL when it is built already), create kernel `name`
 * from it and hand both to *out as a kex_cl_program.  Takes `program`: it
 * is released on error.  0, or the kex error (verb says "loading" or
 * "building" in the out-of-memory message).
 */
static int kex_cl_finish(kex_cl_device *cl, cl_program program, const char *build_what, const char *name,
                         const char *verb, void **out, kex_error *err) {
  kex_cl_program *prog = NULL;
  cl_int e = CL_SUCCESS;
  int rc = 0;
  if (build_what && (e = clBuildProgram(program, 1, &cl->device, NULL, NULL, NULL)) != CL_SUCCESS) {
    rc = kex_cl_build_error(cl, program, name, build_what, e, err);
    goto out;
  }
  if (!(prog = kex_calloc(1, sizeof *prog))) {
    rc = kex_err_set(err, KEX_ENOMEM, "opencl %s: out of memory %s kernel %s", cl->name, verb, name);
    goto out;
  }
  prog->kernel = clCreateKernel(program, name, &e);
  if (!prog->kernel || e != CL_SUCCESS) {
    rc = kex_err_set(err, e == CL_INVALID_KERNEL_NAME ? KEX_ENOTFOUND : kex_cl_code(e),
                     "opencl %s: clCreateKernel(%s) failed: %s", cl->name, name, kex_cl_errname(e));
    goto out;
  }
  prog->program = program;
  program = NULL;
  *out = prog;
  prog = NULL;
out:
  if (program) clReleaseProgram(program);
  kex_free(prog);
  return rc;
}

static int kex_cl_load(void *impl, const unsigned char *bin, size_t bin_size, const char *name, void **out,
                       kex_error *err) {
  kex_cl_device *cl = impl;
  cl_int e = CL_SUCCESS, status = CL_SUCCESS;
  if (cl->memo_program && cl->memo_size == bin_size && memcmp(cl->memo_bin, bin, bin_size) == 0) {
    cl_program program = cl->memo_program; /* take over the program the last compile built */
    cl->memo_program = NULL;
    kex_cl_memo_clear(cl);
    return kex_cl_finish(cl, program, NULL, name, "loading", out, err);
  }
  cl_program program = clCreateProgramWithBinary(cl->context, 1, &cl->device, &bin_size, &bin, &status, &e);
  if (!program || e != CL_SUCCESS || status != CL_SUCCESS) {
    if (program) clReleaseProgram(program);
    return kex_err_set(err, e == CL_OUT_OF_HOST_MEMORY ? KEX_ENOMEM : KEX_ECOMPILE,
                       "opencl %s: clCreateProgramWithBinary of kernel %s failed: %s (binary status %s)", cl->name,
                       name, kex_cl_errname(e), kex_cl_errname(status));
  }
  return kex_cl_finish(cl, program, "clBuildProgram from binary", name, "loading", out, err);
}

/* Build from source and create the kernel, without CL_PROGRAM_BINARIES (device.h: kex_device_build). */
static int kex_cl_build(void *impl, const char *source, const char *name, void **out, kex_error *err) {
  kex_cl_device *cl = impl;
  cl_int e = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(cl->context, 1, &source, NULL, &e);
  if (!program || e != CL_SUCCESS) {
    if (program) clReleaseProgram(program);
    return kex_err_set(err, kex_cl_code(e), "opencl %s: clCreateProgramWithSource of kernel %s failed: %s", cl->name,
                       name, kex_cl_errname(e));
  }
  return kex_cl_finish(cl, program, "clBuildProgram", name, "building", out, err);
}

static void kex_cl_program_free(void *impl, void *p) {
  kex_cl_program *prog = p;
  (void)impl;
  clReleaseKernel(prog->kernel);
  clReleaseProgram(prog->program);
  kex_free(prog);
}

static int kex_cl_launch(void *impl, void *p, const char *name, const size_t global[3], const size_t local[3],
                         void *const *bufs, int nbufs, const int32_t *ints, int nints, void **out, kex_error *err) {
  kex_cl_device *cl = impl;
  kex_cl_program *prog = p;
  size_t gws[3];
  cl_event ev = NULL;
  cl_int e;

  for (int i = 0; i < nbufs; i++) {
    cl_mem mem = bufs[i];
    e = clSetKernelArg(prog->kernel, (cl_uint)i, sizeof mem, &mem);
    if (e != CL_SUCCESS)
      return kex_err_set(err, KEX_EINVAL, "opencl %s: kernel %s: clSetKernelArg(%d, buffer) failed: %s", cl->name,
                         name, i, kex_cl_errname(e));
  }
  for (int i = 0; i < nints; i++) {
    cl_int v = ints[i];
    e = clSetKernelArg(prog->kernel, (cl_uint)(nbufs + i), sizeof v, &v);
    if (e != CL_SUCCESS)
      return kex_err_set(err, KEX_EINVAL, "opencl %s: kernel %s: clSetKernelArg(%d, int) failed: %s", cl->name,
                         name, nbufs + i, kex_cl_errname(e));
  }
  for (int i = 0; i < 3; i++) gws[i] = local ? global[i] * local[i] : global[i];
  e = clEnqueueNDRangeKernel(cl->queue, prog->kernel, 3, NULL, gws, local, 0, NULL, &ev);
  if (e != CL_SUCCESS) {
    if (local)
      return kex_err_set(err, kex_cl_code(e),
                         "opencl %s: launching kernel %s (global %zux%zux%zu groups, local %zux%zux%zu) failed: %s",
                         cl->name, name, global[0], global[1], global[2], local[0], local[1], local[2],
                         kex_cl_errname(e));
    return kex_err_set(err, kex_cl_code(e), "opencl %s: launching kernel %s (global %zux%zux%zu) failed: %s",
                       cl->name, name, global[0], global[1], global[2], kex_cl_errname(e));
  }
  clFlush(cl->queue);
  *out = ev;
  return 0;
}

static int kex_cl_wait(void *impl, void *event, kex_error *err) {
  kex_cl_device *cl = impl;
  cl_event ev = event;
  cl_int status = CL_COMPLETE;
  cl_int e = clWaitForEvents(1, &ev);
  if (e == CL_SUCCESS) e = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (e != CL_SUCCESS || status < 0)
    return kex_err_set(err, KEX_EDEVICE, "opencl %s: waiting for a kernel failed: %s", cl->name,
                       kex_cl_errname(e != CL_SUCCESS ? e : status));
  return 0;
}

static int kex_cl_elapsed(void *impl, void *event, double *seconds, kex_error *err) {
  kex_cl_device *cl = impl;
  cl_event ev = event;
  cl_ulong start = 0, end = 0;
  cl_int e;
  int rc = kex_cl_wait(impl, event, err);
  if (rc < 0) return rc;
  e = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
  if (e == CL_SUCCESS) e = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
  if (e != CL_SUCCESS)
    return kex_err_set(err, KEX_EDEVICE, "opencl %s: clGetEventProfilingInfo failed: %s", cl->name,
                       kex_cl_errname(e));
  *seconds = end > start ? (double)(end - start) * 1e-9 : 0.0;
  return 0;
}

static void kex_cl_event_free(void *impl, void *event) {
  (void)impl;
  clReleaseEvent((cl_event)event);
}

/* ---- pre-building in helper processes (kex_device_prewarm) ---- */

/*
 * PoCL 3.1 builds one program at a time per process (a global lock: two
 * threads building in two contexts took turns on one futex), and a
 * candidate's cost is its build (~100 ms) plus the machine code PoCL
 * generates at the first launch of each local size (~100 ms).  Both land
 * in PoCL's on-disk kernel cache (POCL_CACHE_DIR, keyed by source, options
 * and device), where another process finds them: a cached build takes
 * ~20 ms and a cached first launch ~0.3 ms.  So kex_device_prewarm hands a
 * batch of sources to helper processes, one per compute unit, that build
 * each and launch it once on one work-group of its local size, and the
 * device's own build and first launch afterwards hit the cache.
 *
 * A helper is this same executable (/proc/self/exe) started with
 * KEX_CL_WARM=<fd>:<device index> in its environment: a constructor in this
 * file sees it before main, serves requests on the socket <fd> and exits
 * when the socket closes.  A request is one program of one or more kernels
 * (kex_device_build_batch sends groups, kex_device_prewarm single sources):
 * u32 source length, u32 kernel count, u32 flags; per kernel u32 name
 * length, u32 local[3] (local[0] = 0: not launched), u32 buffer count,
 * u32 groups[3] (the launch's work-groups, kex_cl_warm_grid), u64
 * sizes[count], the name; then the source (int arguments after the
 * buffers get 1).  The reply is an i32 status (0 or the CL error of the build).
 * Any failure (no helper, a helper that dies, a build error) only means
 * the device builds that source itself, as it would without helpers.
 * A compile (kex_cl_compile_apart) sets flag KEX_CL_WARM_BINARY and gets
 * more: after status 0 a u64 size and the program's CL_PROGRAM_BINARIES,
 * read after the launches so it holds their code; after a failure a u32
 * length and the build log.
 */
#define KEX_CL_WARM_ENV "KEX_CL_WARM"
#define KEX_CL_MAX_HELPERS 4
#define KEX_CL_HELPER_TIMEOUT_MS 60000 /* one build and one work-group launch per kernel: seconds at worst */

#define KEX_CL_WARM_BINARY 1u                 /* flags: reply with the binary, or the build log */
#define KEX_CL_LOG_MAX (64u << 10)            /* bytes of a build log a helper sends */
#define KEX_CL_WARM_BYTES_MAX ((size_t)1 << 30) /* a compile's launch allocates at most this: else not launched */

typedef struct kex_cl_warm_req {
  uint32_t src_len, nkernels, flags;
} kex_cl_warm_req;

typedef struct kex_cl_warm_kernel {
  uint32_t name_len, local[3], nbufs, groups[3];
} kex_cl_warm_kernel;

/*
 * PoCL generates a kernel's code per local size and per grid class: a grid
 * whose widest dimension (local x groups work-items) is under USHRT_MAX
 * gets code of its own ("smallgrid", the device's
 * grid_width_specialization_limit).  So a launch made to warm the cache is
 * of the real launch's class: one work-group when the real grid is small,
 * else just enough work-groups in each wide dimension to be as wide.
 */
#define KEX_CL_SMALLGRID 65535u

/* The work-groups of a warming launch of local size `local` for a real launch of `global` work-groups (NULL: one). */
static void kex_cl_warm_grid(const size_t local[3], const size_t *global, uint32_t groups[3]) {
  for (int d = 0; d < 3; d++) {
    groups[d] = 1;
    if (!global || local[d] == 0 || global[d] <= 1 || local[d] * global[d] < KEX_CL_SMALLGRID) continue;
    size_t need = (KEX_CL_SMALLGRID + local[d] - 1) / local[d];
    groups[d] = (uint32_t)(need < global[d] ? need : global[d]);
  }
}

static int kex_cl_io(int fd, void *buf, size_t n, int writing) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0); /* a dead peer is EPIPE, not SIGPIPE */
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* The helper's buffers: argument i keeps its own buffer, grown when too small. */
typedef struct kex_cl_warm_bufs {
  cl_mem buf[KEX_DEVICE_MAX_BUFS];
  size_t size[KEX_DEVICE_MAX_BUFS];
} kex_cl_warm_bufs;

/* In the helper: launch kernel `name` of prog once on one work-group of local (buffers of want[]). */
static cl_int kex_cl_warm_launch(cl_context ctx, cl_command_queue q, cl_program prog, const char *name,
                                 const kex_cl_warm_kernel *kh, const uint64_t *want, kex_cl_warm_bufs *b) {
  cl_int status = CL_SUCCESS, e = CL_SUCCESS;
  cl_kernel k = clCreateKernel(prog, name, &status);
  if (!k) return status;
  for (uint32_t i = 0; i < kh->nbufs && status == CL_SUCCESS; i++) {
    if (b->size[i] < want[i] || !b->buf[i]) {
      if (b->buf[i]) clReleaseMemObject(b->buf[i]);
      b->buf[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, want[i] ? want[i] : 16, NULL, &e);
      b->size[i] = b->buf[i] ? want[i] : 0;
      if (!b->buf[i]) status = e;
    }
    if (status == CL_SUCCESS) status = clSetKernelArg(k, i, sizeof(cl_mem), &b->buf[i]);
  }
  cl_uint nargs = 0; /* int scalars after the buffers: any value does for code generation (1: no division by 0) */
  if (status == CL_SUCCESS) status = clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL);
  for (cl_uint i = kh->nbufs; i < nargs && status == CL_SUCCESS; i++) {
    cl_int one = 1;
    status = clSetKernelArg(k, i, sizeof one, &one);
  }
  size_t local[3] = {kh->local[0], kh->local[1], kh->local[2]}, global[3];
  for (int d = 0; d < 3; d++) global[d] = local[d] * (kh->groups[d] ? kh->groups[d] : 1);
  if (status == CL_SUCCESS) status = clEnqueueNDRangeKernel(q, k, 3, NULL, global, local, 0, NULL, NULL);
  if (status == CL_SUCCESS) status = clFinish(q);
  clReleaseKernel(k);
  return status;
}

/* In the helper: the reply to a compile (KEX_CL_WARM_BINARY, see above).  0, or -1 when the parent is gone. */
static int kex_cl_helper_reply(int fd, cl_program prog, cl_device_id dev, int32_t status) {
  size_t size = 0, len = 0;
  unsigned char *bin = NULL;
  char *log = NULL;
  int rc;
  if (status == CL_SUCCESS) {
    cl_int e = clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
    if (e == CL_SUCCESS && size > 0 && size <= KEX_DEVICE_BINARY_MAX && (bin = malloc(size)))
      e = clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL);
    else if (e == CL_SUCCESS)
      e = size ? CL_OUT_OF_HOST_MEMORY : CL_INVALID_BINARY;
    status = e;
  } else if (prog && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) == CL_SUCCESS && len > 0 &&
             (log = malloc(len + 1)) && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, len, log, NULL) == CL_SUCCESS) {
    len = strnlen(log, len);
  } else {
    len = 0;
  }
  uint64_t size64 = size;
  uint32_t len32 = len > KEX_CL_LOG_MAX ? KEX_CL_LOG_MAX : (uint32_t)len;
  rc = kex_cl_io(fd, &status, sizeof status, 1);
  if (!rc && status == CL_SUCCESS) rc = kex_cl_io(fd, &size64, sizeof size64, 1) || kex_cl_io(fd, bin, size, 1) ? -1 : 0;
  else if (!rc) rc = kex_cl_io(fd, &len32, sizeof len32, 1) || (len32 && kex_cl_io(fd, log, len32, 1)) ? -1 : 0;
  free(bin);
  free(log);
  return rc;
}

/*
 * In the helper, before the first request: PoCL's first build and first launch in a process cost about a second
 * more than later ones (its kernel library and compiler start), so a helper pays that at its start, not in the
 * first compile it serves (a spare helper is then ready for real).
 */
static void kex_cl_helper_warm_up(cl_context ctx, cl_command_queue q, cl_device_id dev, kex_cl_warm_bufs *b) {
  const char *src = "__kernel void kex_warm_up(__global float *o) { o[get_global_id(0)] = 1.0f; }";
  cl_int e = CL_SUCCESS;
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &e);
  kex_cl_warm_kernel kh = {0, {1, 1, 1}, 1, {1, 1, 1}};
  uint64_t want[1] = {sizeof(float)};
  if (prog && clBuildProgram(prog, 1, &dev, NULL, NULL, NULL) == CL_SUCCESS)
    kex_cl_warm_launch(ctx, q, prog, "kex_warm_up", &kh, want, b);
  if (prog) clReleaseProgram(prog);
}

/* The helper: serve requests on fd for device number `index` of kex_cl_enumerate. */
static void kex_cl_helper_serve(int fd, int index) {
  kex_cl_found found[KEX_CL_MAX_DEVICES];
  int n = 0;
  cl_int e = CL_SUCCESS;
  cl_context ctx = NULL;
  cl_command_queue q = NULL;
  static kex_cl_warm_bufs bufs;
  static uint64_t want[KEX_DEVICE_BATCH_MAX][KEX_DEVICE_MAX_BUFS];
  static kex_cl_warm_kernel kh[KEX_DEVICE_BATCH_MAX];
  static char names[KEX_DEVICE_BATCH_MAX][2 * KEX_DEVICE_KERNEL_NAME_MAX + 1];

  if (kex_cl_enumerate(found, &n, NULL) < 0 || index < 0 || index >= n) return;
  ctx = clCreateContext(NULL, 1, &found[index].device, NULL, NULL, &e);
  if (ctx) q = clCreateCommandQueue(ctx, found[index].device, 0, &e);
  if (!q) return;
  kex_cl_helper_warm_up(ctx, q, found[index].device, &bufs);
  for (;;) {
    kex_cl_warm_req h;
    char *src = NULL;
    int32_t status = CL_SUCCESS;
    int bad = 0;
    if (kex_cl_io(fd, &h, sizeof h, 0) < 0) break;
    if (h.src_len > KEX_DEVICE_SOURCE_MAX || h.nkernels < 1 || h.nkernels > KEX_DEVICE_BATCH_MAX) break;
    for (uint32_t j = 0; j < h.nkernels && !bad; j++) {
      bad = kex_cl_io(fd, &kh[j], sizeof kh[j], 0) < 0 || kh[j].nbufs > KEX_DEVICE_MAX_BUFS ||
            kh[j].name_len > 2 * KEX_DEVICE_KERNEL_NAME_MAX ||
            kex_cl_io(fd, want[j], sizeof *want[j] * kh[j].nbufs, 0) < 0 ||
            kex_cl_io(fd, names[j], kh[j].name_len, 0) < 0;
      if (!bad) names[j][kh[j].name_len] = 0;
    }
    if (bad || !(src = malloc(h.src_len + 1)) || kex_cl_io(fd, src, h.src_len, 0) < 0) {
      free(src);
      break;
    }
    src[h.src_len] = 0;
    const char *s = src;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &s, NULL, &e);
    status = e;
    if (prog) status = clBuildProgram(prog, 1, &found[index].device, NULL, NULL, NULL);
    for (uint32_t j = 0; j < h.nkernels && status == CL_SUCCESS; j++) /* PoCL generates (and caches) each one's code */
      if (kh[j].local[0] > 0) kex_cl_warm_launch(ctx, q, prog, names[j], &kh[j], want[j], &bufs);
    free(src);
    int sent = h.flags & KEX_CL_WARM_BINARY ? kex_cl_helper_reply(fd, prog, found[index].device, status)
                                            : kex_cl_io(fd, &status, sizeof status, 1);
    if (prog) clReleaseProgram(prog);
    if (sent < 0) break;
  }
}

/* Before main: become a helper when started as one (see above); never returns then. */
__attribute__((constructor)) static void kex_cl_helper_check(void) {
  const char *v = getenv(KEX_CL_WARM_ENV);
  int fd = -1, index = -1;
  if (!v || sscanf(v, "%d:%d", &fd, &index) != 2 || fd < 0) return;
  unsetenv(KEX_CL_WARM_ENV);
  kex_cl_helper_serve(fd, index);
  _exit(0);
}

static void kex_cl_helpers_stop(kex_cl_device *cl) {
  for (int i = 0; i < cl->nhelpers; i++) {
    close(cl->helper_fd[i]);
    while (waitpid(cl->helper_pid[i], NULL, 0) < 0 && errno == EINTR) {}
  }
  cl->nhelpers = 0;
}

/* Start one helper (argv[0] names it in ps) for cl's device: *fd is its socket.  0, or an errno. */
static int kex_cl_spawn(const kex_cl_device *cl, char *argv0, int *fd, pid_t *pid) {
  extern char **environ;
  size_t nenv = 0;
  while (environ[nenv]) nenv++;
  char **envp = malloc(sizeof *envp * (nenv + 2));
  char var[64];
  int sv[2], e;
  posix_spawn_file_actions_t fa;
  char *argv[] = {argv0, NULL};
  if (!envp) return ENOMEM;
  memcpy(envp, environ, sizeof *envp * nenv);
  envp[nenv] = var;
  envp[nenv + 1] = NULL;
  snprintf(var, sizeof var, "%s=3:%d", KEX_CL_WARM_ENV, cl->index);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    e = errno;
    free(envp);
    return e;
  }
  e = posix_spawn_file_actions_init(&fa);
  if (!e) e = posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
  if (!e) e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0); /* a helper reads only its socket */
  if (!e) e = posix_spawn_file_actions_addclosefrom_np(&fa, 4);
  if (!e) e = posix_spawn(pid, "/proc/self/exe", &fa, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  close(sv[1]);
  free(envp);
  if (e) close(sv[0]);
  else *fd = sv[0];
  return e;
}

/* Start min(compute units, KEX_CL_MAX_HELPERS) helpers (fewer when spawning fails; 0 disables prewarm). */
static void kex_cl_helpers_start(kex_cl_device *cl) {
  int want = cl->compute_units < 1 ? 1 : cl->compute_units > KEX_CL_MAX_HELPERS ? KEX_CL_MAX_HELPERS : cl->compute_units;
  for (int i = 0; i < want; i++) {
    int e = kex_cl_spawn(cl, "kex-cl-warm", &cl->helper_fd[cl->nhelpers], &cl->helper_pid[cl->nhelpers]);
    if (e) {
      KEX_DEBUG("opencl: starting build helper %d failed: %s", i, strerror(e));
      break;
    }
    cl->nhelpers++;
  }
  KEX_DEBUG("opencl %s: %d build helpers", cl->name, cl->nhelpers);
}

/* One program for a helper: its source, and per kernel its name, local size and buffer sizes. */
typedef struct kex_cl_warm_group {
  const char *source;
  int n;
  const char *const *names;
  const size_t *const *locals;   /* NULL entries: not launched */
  const uint32_t *nbufs;
  const size_t *const *buf_sizes;
  const size_t *const *globals;  /* NULL, or NULL entries: one work-group */
} kex_cl_warm_group;

/* Send group g to the helper on fd (flags: KEX_CL_WARM_BINARY or 0). Returns 0 or -1 (the helper is gone). */
static int kex_cl_warm_send(int fd, const kex_cl_warm_group *g, uint32_t flags) {
  kex_cl_warm_req h = {(uint32_t)strlen(g->source), (uint32_t)g->n, flags};
  uint64_t sizes[KEX_DEVICE_MAX_BUFS];
  if (kex_cl_io(fd, &h, sizeof h, 1) < 0) return -1;
  for (int j = 0; j < g->n; j++) {
    kex_cl_warm_kernel kh = {(uint32_t)strlen(g->names[j]), {0, 0, 0}, g->nbufs[j], {1, 1, 1}};
    if (g->locals[j]) {
      for (int d = 0; d < 3; d++) kh.local[d] = (uint32_t)g->locals[j][d];
      kex_cl_warm_grid(g->locals[j], g->globals ? g->globals[j] : NULL, kh.groups);
    }
    for (uint32_t b = 0; b < kh.nbufs; b++) sizes[b] = g->buf_sizes[j][b];
    if (kex_cl_io(fd, &kh, sizeof kh, 1) < 0 || kex_cl_io(fd, sizes, sizeof *sizes * kh.nbufs, 1) < 0 ||
        kex_cl_io(fd, (void *)g->names[j], kh.name_len, 1) < 0)
      return -1;
  }
  return kex_cl_io(fd, (void *)g->source, h.src_len, 1);
}

/*
 * Hand groups[0, n) to the helpers, as many at once as there are helpers, and wait for all of them; returns
 * how many built.  A helper that dies or hangs is stopped using; its groups are left to the device.
 */
static int kex_cl_warm_groups(kex_cl_device *cl, const kex_cl_warm_group *groups, int n) {
  int busy[KEX_CL_MAX_HELPERS], next = 0, pending = 0, ok = 0;
  if (!cl->prewarm_ok) return 0;
  if (!cl->helpers_tried) {
    cl->helpers_tried = 1;
    kex_cl_helpers_start(cl);
  }
  if (cl->nhelpers == 0) return 0;
  for (int h = 0; h < cl->nhelpers; h++) busy[h] = 0;
  for (;;) {
    for (int h = 0; h < cl->nhelpers && next < n; h++) {
      if (busy[h]) continue; /* working (1) or gone (2) */
      if (kex_cl_warm_send(cl->helper_fd[h], &groups[next], 0) < 0) {
        next++; /* the helper is gone: that group is built by the device itself */
        continue;
      }
      busy[h] = 1;
      pending++;
      next++;
    }
    if (pending == 0) break;
    struct pollfd pfd[KEX_CL_MAX_HELPERS];
    int map[KEX_CL_MAX_HELPERS], np = 0;
    for (int h = 0; h < cl->nhelpers; h++)
      if (busy[h] == 1) {
        pfd[np].fd = cl->helper_fd[h];
        pfd[np].events = POLLIN;
        map[np++] = h;
      }
    int pr = poll(pfd, (nfds_t)np, KEX_CL_HELPER_TIMEOUT_MS);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) { /* a build that hangs: stop those helpers, the device builds the rest itself */
      for (int j = 0; j < np; j++) {
        KEX_WARN("opencl %s: build helper %d gave no answer in %d ms; stopped", cl->name, map[j],
                 KEX_CL_HELPER_TIMEOUT_MS);
        kill(cl->helper_pid[map[j]], SIGKILL);
        busy[map[j]] = 2;
        pending--;
      }
      if (pr < 0) break;
      continue;
    }
    for (int j = 0; j < np; j++) {
      if (!pfd[j].revents) continue;
      int32_t status = -1;
      int h = map[j];
      busy[h] = 0;
      pending--;
      if (kex_cl_io(cl->helper_fd[h], &status, sizeof status, 0) < 0) {
        /* a dead helper: stop using it (its socket stays open until the device goes) */
        KEX_DEBUG("opencl %s: build helper %d is gone", cl->name, h);
        busy[h] = 2;
        continue;
      }
      if (status == CL_SUCCESS) ok++;
    }
    int alive = 0;
    for (int h = 0; h < cl->nhelpers; h++) alive += busy[h] != 2;
    if (!alive) break;
  }
  return ok;
}

/* ---- compiles in helper processes (kex_device_compile on PoCL) ---- */

/*
 * PoCL builds under one process-wide lock, and a build cannot be stopped:
 * a compile that takes minutes (a kernel of 1,000 sin terms) would hold
 * every other build in kexd behind it, and --compile-timeout could not end
 * it.  So on PoCL every compile runs in a helper process (the helper
 * above, named kex-cl-compile): it builds, launches the kernel once on one
 * work-group of its local size when the caller said how it will be
 * launched (kex_device_compile_for_launch: PoCL generates the machine code
 * there, into its kernel cache and the binary, instead of at kexd's first
 * launch), and sends back CL_PROGRAM_BINARIES or the build log.  kexd's
 * compile slots each compile on an instance of their own, so compiles run
 * side by side on every core.
 *
 * The helpers are the process's: a compile takes an idle one of its device
 * and gives it back after, and one spare is kept started ahead, so a
 * compile that arrives while every helper is busy does not wait for a new
 * one to start PoCL (about a second).  A compile still running after
 * KEX_CL_LONG_S gets nice KEX_CL_LONG_NICE, so the CPU goes to short
 * compiles first (as a feedback queue would); afterwards its helper goes
 * back to nice 0 where the process may raise priority again (root, or
 * RLIMIT_NICE), else it stays idle at nice 10 and is taken only when no
 * other helper is idle (ending it instead would cost the next compile
 * PoCL's start: a test run of many compiles took 77 s so, 59 s without
 * ending them).  Past the compile
 * time limit the helper is killed (KEX_EDEADLINE).  A helper killed by a
 * signal while compiling is a failed compile (KEX_ECOMPILE: the compiler
 * crashed on that source, which in this process would have taken kexd
 * with it).  When no helper can be started, or one exits without
 * answering, the instance compiles in this process as before.
 */
#define KEX_CL_IDLE_MAX 8    /* idle compile helpers the process keeps (the spare included) */
#define KEX_CL_LONG_S 1.0    /* a compile running this long is a long one ... */
#define KEX_CL_LONG_NICE 10  /* ... and gets this nice value */

typedef struct kex_cl_child {
  int fd, index;
  pid_t pid;
  bool niced; /* at KEX_CL_LONG_NICE still */
} kex_cl_child;

static pthread_mutex_t kex_cl_idle_lock = PTHREAD_MUTEX_INITIALIZER;
static kex_cl_child kex_cl_idle[KEX_CL_IDLE_MAX];
static int kex_cl_nidle;

static double kex_cl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* End helper c (killed first when kill_it); its wait status into *ws when not NULL. */
static void kex_cl_child_end(kex_cl_child *c, bool kill_it, int *ws) {
  int status = 0;
  if (c->fd < 0) return;
  if (kill_it) kill(c->pid, SIGKILL);
  close(c->fd); /* an idle helper exits when its socket closes */
  c->fd = -1;
  while (waitpid(c->pid, &status, 0) < 0 && errno == EINTR) {}
  if (ws) *ws = status;
}

/* Start a compile helper for cl's device into *c.  0 or an errno. */
static int kex_cl_child_start(const kex_cl_device *cl, kex_cl_child *c) {
  c->index = cl->index;
  c->niced = false;
  int e = kex_cl_spawn(cl, "kex-cl-compile", &c->fd, &c->pid);
  if (e) c->fd = -1;
  return e;
}

/* Every thread of process pid to nice value n (setpriority changes one thread on Linux).  Whether all took it. */
static bool kex_cl_renice(pid_t pid, int n) {
  char path[64];
  bool ok = true;
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  struct dirent *de;
  if (!d) return setpriority(PRIO_PROCESS, (id_t)pid, n) == 0;
  while ((de = readdir(d)))
    if (de->d_name[0] >= '0' && de->d_name[0] <= '9')
      ok = setpriority(PRIO_PROCESS, (id_t)atoi(de->d_name), n) == 0 && ok;
  closedir(d);
  return ok;
}

/* An idle helper of cl's device into *c (a new one when none is idle), and a spare started when none is left. */
static int kex_cl_child_take(const kex_cl_device *cl, kex_cl_child *c) {
  kex_cl_child spare = {-1, -1, 0, false};
  int pick = -1, normal = 0; /* the last idle one of the device at nice 0, else the last at nice 10 */
  pthread_mutex_lock(&kex_cl_idle_lock);
  for (int i = 0; i < kex_cl_nidle; i++) {
    if (kex_cl_idle[i].index != cl->index) continue;
    normal += !kex_cl_idle[i].niced;
    if (pick < 0 || !kex_cl_idle[i].niced || kex_cl_idle[pick].niced) pick = i;
  }
  bool found = pick >= 0, left = normal - (found && !kex_cl_idle[pick].niced) > 0;
  if (found) {
    *c = kex_cl_idle[pick];
    kex_cl_idle[pick] = kex_cl_idle[--kex_cl_nidle];
  }
  if (!left && kex_cl_nidle < KEX_CL_IDLE_MAX && kex_cl_child_start(cl, &spare) == 0)
    kex_cl_idle[kex_cl_nidle++] = spare; /* it starts PoCL while this compile runs */
  pthread_mutex_unlock(&kex_cl_idle_lock);
  return found ? 0 : kex_cl_child_start(cl, c);
}

/* Give helper c back to the idle ones, at nice 0 where it may be; when there are enough, one at nice 10 ends. */
static void kex_cl_child_give(kex_cl_child *c) {
  kex_cl_child out = {-1, -1, 0, false};
  if (c->niced && kex_cl_renice(c->pid, 0)) c->niced = false;
  pthread_mutex_lock(&kex_cl_idle_lock);
  if (kex_cl_nidle < KEX_CL_IDLE_MAX) {
    kex_cl_idle[kex_cl_nidle++] = *c;
  } else {
    out = *c;
    for (int i = 0; i < kex_cl_nidle && !c->niced; i++)
      if (kex_cl_idle[i].niced) { /* keep the one at nice 0 */
        out = kex_cl_idle[i];
        kex_cl_idle[i] = *c;
        break;
      }
  }
  pthread_mutex_unlock(&kex_cl_idle_lock);
  kex_cl_child_end(&out, false, NULL);
}

/* Read n bytes of the helper's reply into *out (kex_malloc'd, NUL-terminated).  0 or -1. */
static int kex_cl_read_alloc(int fd, size_t n, unsigned char **out) {
  *out = kex_malloc(n + 1);
  if (!*out || kex_cl_io(fd, *out, n, 0) < 0) {
    kex_free(*out);
    *out = NULL;
    return -1;
  }
  (*out)[n] = 0;
  return 0;
}

/* Send group g to a helper (another one when the first taken is gone).  0 with *c, or -1 (none could start). */
static int kex_cl_child_send(kex_cl_device *cl, const kex_cl_warm_group *g, kex_cl_child *c) {
  for (int tries = 0; tries <= KEX_CL_IDLE_MAX; tries++) { /* each idle one may have died */
    int e = kex_cl_child_take(cl, c);
    if (e) {
      KEX_WARN("opencl %s: cannot start a compile helper (%s): compiling in this process", cl->name, strerror(e));
      return -1;
    }
    if (kex_cl_warm_send(c->fd, g, KEX_CL_WARM_BINARY) == 0) return 0;
    kex_cl_child_end(c, true, NULL); /* it died while idle */
  }
  return -1;
}

#define KEX_CL_CANCEL_POLL_S 0.1 /* how often a compile that can be cancelled looks at its flag */

/* Wait for helper c's answer until the compile time limit, renicing it once it is a long compile, and while
   *cancel (when not NULL) stays false.  1 ready, 0 timed out, -2 cancelled, -1 poll failed; *long_one says
   whether it was reniced. */
static int kex_cl_child_wait(const kex_cl_device *cl, kex_cl_child *c, double t0, const atomic_bool *cancel,
                             bool *long_one) {
  double limit = cl->compile_limit_s;
  for (;;) {
    if (cancel && atomic_load(cancel)) return -2;
    double now = kex_cl_now(), until = limit > 0 ? t0 + limit : -1;
    if (!*long_one && (until < 0 || until > t0 + KEX_CL_LONG_S)) until = t0 + KEX_CL_LONG_S;
    if (cancel && (until < 0 || until > now + KEX_CL_CANCEL_POLL_S)) until = now + KEX_CL_CANCEL_POLL_S;
    int ms = until < 0 ? -1 : until <= now ? 0 : (until - now) > 1e6 ? 1000000000 : (int)((until - now) * 1e3) + 1;
    struct pollfd pfd = {c->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms);
    if (pr > 0) return 1;
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return -1;
    if (limit > 0 && kex_cl_now() >= t0 + limit) return 0;
    if (!*long_one && kex_cl_now() >= t0 + KEX_CL_LONG_S) {
      *long_one = true;
      kex_cl_renice(c->pid, KEX_CL_LONG_NICE);
      c->niced = true;
    }
  }
}

/* Compile in a helper: 0 or the kex error, or 1 when there is none (compile here). */
static int kex_cl_compile_apart(kex_cl_device *cl, const char *source, const char *name,
                                const kex_prewarm_item *launch, unsigned char **bin, size_t *bin_size,
                                kex_error *err) {
  const size_t *local = NULL, *sizes = launch ? launch->buf_sizes : NULL, *global = launch ? launch->global : NULL;
  uint32_t nbufs = launch ? launch->nbufs : 0;
  size_t total = 0;
  for (uint32_t i = 0; i < nbufs; i++) total += sizes[i] > KEX_CL_WARM_BYTES_MAX ? KEX_CL_WARM_BYTES_MAX + 1 : sizes[i];
  if (launch && launch->local && total <= KEX_CL_WARM_BYTES_MAX) local = launch->local;
  kex_cl_warm_group g = {source, 1, &name, &local, &nbufs, &sizes, &global};
  kex_cl_child c;
  int32_t status = 0;
  bool long_one = false;
  double t0 = kex_cl_now();
  if (kex_cl_child_send(cl, &g, &c) < 0) return 1;
  int ready = kex_cl_child_wait(cl, &c, t0, launch ? launch->cancel : NULL, &long_one);
  if (ready == -2) {
    kex_cl_child_end(&c, true, NULL);
    return kex_err_set(err, KEX_ECANCELLED, "opencl %s: compiling kernel %s was stopped: cancelled", cl->name, name);
  }
  if (ready == 0) {
    kex_cl_child_end(&c, true, NULL);
    return kex_err_set(err, KEX_EDEADLINE,
                       "opencl %s: compiling kernel %s was stopped after %.3g s (the compile time limit)", cl->name,
                       name, cl->compile_limit_s);
  }
  if (ready < 0 || kex_cl_io(c.fd, &status, sizeof status, 0) < 0) {
    int ws = 0;
    kex_cl_child_end(&c, false, &ws);
    if (WIFSIGNALED(ws))
      return kex_err_set(err, KEX_ECOMPILE, "opencl %s: the compiler process died compiling kernel %s (signal %d: %s)",
                         cl->name, name, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    KEX_WARN("opencl %s: a compile helper exited (status %d) without an answer: compiling in this process", cl->name,
             WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    cl->apart = false;
    return 1;
  }
  uint64_t size = 0;
  uint32_t len = 0;
  unsigned char *bytes = NULL;
  int rc = 0;
  bool broken = false;
  if (status == CL_SUCCESS) {
    if (kex_cl_io(c.fd, &size, sizeof size, 0) < 0 || size == 0 || size > KEX_DEVICE_BINARY_MAX ||
        kex_cl_read_alloc(c.fd, (size_t)size, &bytes) < 0) {
      broken = true;
      rc = kex_err_set(err, KEX_ECOMPILE, "opencl %s: the compile helper sent no usable binary of kernel %s",
                       cl->name, name);
    } else {
      *bin = bytes;
      *bin_size = (size_t)size;
    }
  } else {
    if (kex_cl_io(c.fd, &len, sizeof len, 0) < 0 || len > KEX_CL_LOG_MAX || kex_cl_read_alloc(c.fd, len, &bytes) < 0) {
      broken = true;
      bytes = NULL;
    }
    rc = kex_err_set(err, status == CL_OUT_OF_HOST_MEMORY ? KEX_ENOMEM : KEX_ECOMPILE,
                     "opencl %s: clBuildProgram of kernel %s failed: %s; build log: %s", cl->name, name,
                     kex_cl_errname(status), bytes && bytes[0] ? (char *)bytes : "(empty)");
    KEX_DEBUG("opencl %s: build log of kernel %s:\n%s", cl->name, name, bytes ? (char *)bytes : "");
    kex_free(bytes);
  }
  if (broken) kex_cl_child_end(&c, true, NULL);
  else kex_cl_child_give(&c);
  return rc;
}

static bool kex_cl_set_compile_time_limit(void *impl, double seconds) {
  kex_cl_device *cl = impl;
  cl->compile_limit_s = seconds;
  return cl->apart;
}

static int kex_cl_prewarm(void *impl, const kex_prewarm_item *items, int n, int *warmed, kex_error *err) {
  kex_cl_device *cl = impl;
  kex_cl_warm_group *g = kex_calloc((size_t)n, sizeof *g);
  (void)err;
  *warmed = 0;
  if (!g) return 0; /* nothing pre-built: the device builds them itself */
  for (int i = 0; i < n; i++)
    g[i] = (kex_cl_warm_group){items[i].source, 1,           &items[i].name,      &items[i].local,
                               &items[i].nbufs,  &items[i].buf_sizes, &items[i].global};
  int m = 0;
  for (int i = 0; i < n; i++) /* too many buffers: built by the device itself */
    if (items[i].nbufs <= KEX_DEVICE_MAX_BUFS) g[m++] = g[i];
  *warmed = kex_cl_warm_groups(cl, g, m);
  kex_free(g);
  return 0;
}

/* ---- batches: many kernels per clBuildProgram (kex_device_build_batch) ---- */

/*
 * A PoCL build has a large fixed cost (the front end and the kernel library's link: 100-160 ms for one
 * candidate kernel, 6-15 ms per kernel in a program of 24), so a batch builds groups of kernels as one program.
 * Kernels are renamed apart (kexb<i>_<name>; their code is unchanged).  The machine code of each kernel is still
 * generated at its first launch (per local size), one kernel at a time.
 */
#define KEX_CL_BATCH_PREFIX "kexb"

/* The group program's name of kernel i of a group ("kexb<i>_<name>") into out[len]. */
static void kex_cl_batch_name(int i, const char *name, char *out, size_t len) {
  snprintf(out, len, KEX_CL_BATCH_PREFIX "%d_%s", i, name);
}

/*
 * The source of group items[0, n): each item's source with its definition `__kernel void <name>(` renamed to
 * kex_cl_batch_name.  NULL when out of memory or when a source has no such definition (then the group cannot
 * be built as one program).
 */
static char *kex_cl_batch_source(const kex_build_item *items, int n) {
  size_t total = 1;
  for (int i = 0; i < n; i++) total += strlen(items[i].source) + 2 * KEX_DEVICE_KERNEL_NAME_MAX + 32;
  char *out = kex_malloc(total), *w = out;
  if (!out) return NULL;
  for (int i = 0; i < n; i++) {
    char def[KEX_DEVICE_KERNEL_NAME_MAX + 32], nn[2 * KEX_DEVICE_KERNEL_NAME_MAX + 16];
    snprintf(def, sizeof def, "__kernel void %s(", items[i].name);
    const char *at = strstr(items[i].source, def);
    if (!at) {
      kex_free(out);
      return NULL;
    }
    kex_cl_batch_name(i, items[i].name, nn, sizeof nn);
    size_t pre = (size_t)(at - items[i].source);
    memcpy(w, items[i].source, pre);
    w += pre;
    w += sprintf(w, "__kernel void %s(", nn);
    const char *rest = at + strlen(def);
    size_t rl = strlen(rest);
    memcpy(w, rest, rl);
    w += rl;
    *w++ = '\n';
  }
  *w = 0;
  return out;
}

/*
 * Build items[0, n) (one group) into progs: as one program when the group builds, else split in halves until
 * each failing source stands alone (kex_cl_build: its own error and build log).
 */
static void kex_cl_batch_build(kex_cl_device *cl, kex_build_item *items, int n, void **progs, const char *source) {
  cl_int e = CL_SUCCESS;
  cl_program program = NULL;
  char *own = NULL;
  if (n == 1) {
    items[0].rc = kex_cl_build(cl, items[0].source, items[0].name, &progs[0], &items[0].err);
    return;
  }
  if (!source) source = own = kex_cl_batch_source(items, n);
  if (source) program = clCreateProgramWithSource(cl->context, 1, &source, NULL, &e);
  if (program && clBuildProgram(program, 1, &cl->device, NULL, NULL, NULL) != CL_SUCCESS) {
    clReleaseProgram(program);
    program = NULL;
  }
  kex_free(own);
  if (!program) {
    KEX_DEBUG("opencl %s: a batch of %d kernels did not build as one program; halves", cl->name, n);
    kex_cl_batch_build(cl, items, n / 2, progs, NULL);
    kex_cl_batch_build(cl, items + n / 2, n - n / 2, progs + n / 2, NULL);
    return;
  }
  for (int i = 0; i < n; i++) {
    char nn[2 * KEX_DEVICE_KERNEL_NAME_MAX + 16];
    kex_cl_program *prog = kex_calloc(1, sizeof *prog);
    kex_cl_batch_name(i, items[i].name, nn, sizeof nn);
    if (!prog) {
      items[i].rc = kex_err_set(&items[i].err, KEX_ENOMEM, "opencl %s: out of memory building kernel %s", cl->name,
                                items[i].name);
      continue;
    }
    prog->kernel = clCreateKernel(program, nn, &e);
    if (!prog->kernel || e != CL_SUCCESS) {
      items[i].rc = kex_err_set(&items[i].err, kex_cl_code(e), "opencl %s: clCreateKernel(%s) of a batch failed: %s",
                                cl->name, items[i].name, kex_cl_errname(e));
      kex_free(prog);
      continue;
    }
    clRetainProgram(program);
    prog->program = program;
    progs[i] = prog;
  }
  clReleaseProgram(program);
}

/*
 * kex_device_build_batch: groups of at most KEX_DEVICE_BATCH_MAX kernels, at least one per helper when helpers
 * can pre-build (so every core generates code), pre-built by the helpers first, then each group built here.
 */
static int kex_cl_build_batch(void *impl, kex_build_item *items, int n, void **progs, kex_error *err) {
  kex_cl_device *cl = impl;
  int nh = cl->prewarm_ok ? cl->compute_units : 1;
  (void)err;
  if (nh < 1) nh = 1;
  if (nh > KEX_CL_MAX_HELPERS) nh = KEX_CL_MAX_HELPERS;
  /* a multiple of the helpers' count, so that each gets the same share */
  int ngroups = nh * ((n + nh * KEX_DEVICE_BATCH_MAX - 1) / (nh * KEX_DEVICE_BATCH_MAX));
  if (ngroups > n) ngroups = n;
  char **sources = kex_calloc((size_t)ngroups, sizeof *sources);
  kex_cl_warm_group *g = kex_calloc((size_t)ngroups, sizeof *g);
  const char **names = kex_calloc((size_t)n, sizeof *names);
  char (*nn)[2 * KEX_DEVICE_KERNEL_NAME_MAX + 16] = kex_calloc((size_t)n, sizeof *nn);
  const size_t **locals = kex_calloc((size_t)n, sizeof *locals), **sizes = kex_calloc((size_t)n, sizeof *sizes);
  const size_t **globals = kex_calloc((size_t)n, sizeof *globals);
  uint32_t *nbufs = kex_calloc((size_t)n, sizeof *nbufs);
  int ng = 0;
  if (sources && g && names && nn && locals && sizes && globals && nbufs && cl->prewarm_ok) {
    for (int k = 0; k < ngroups; k++) {
      int lo = (int)((long long)n * k / ngroups), hi = (int)((long long)n * (k + 1) / ngroups);
      if (!(sources[k] = kex_cl_batch_source(items + lo, hi - lo))) continue;
      int ok = 1;
      for (int i = lo; i < hi; i++) {
        kex_cl_batch_name(i - lo, items[i].name, nn[i], sizeof nn[i]);
        names[i] = nn[i];
        locals[i] = items[i].local;
        nbufs[i] = items[i].nbufs;
        sizes[i] = items[i].buf_sizes;
        globals[i] = items[i].global;
        ok = ok && items[i].nbufs <= KEX_DEVICE_MAX_BUFS && (items[i].nbufs == 0 || items[i].buf_sizes);
      }
      if (ok)
        g[ng++] = (kex_cl_warm_group){sources[k], hi - lo, names + lo, locals + lo, nbufs + lo, sizes + lo, globals + lo};
    }
    int warmed = kex_cl_warm_groups(cl, g, ng);
    KEX_DEBUG("opencl %s: batch of %d kernels in %d groups, %d pre-built by helpers", cl->name, n, ngroups, warmed);
  }
  for (int k = 0; k < ngroups; k++) {
    int lo = (int)((long long)n * k / ngroups), hi = (int)((long long)n * (k + 1) / ngroups);
    kex_cl_batch_build(cl, items + lo, hi - lo, progs + lo, sources ? sources[k] : NULL);
  }
  for (int k = 0; sources && k < ngroups; k++) kex_free(sources[k]);
  kex_free(sources);
  kex_free(g);
  kex_free(names);
  kex_free(nn);
  kex_free(locals);
  kex_free(sizes);
  kex_free(globals);
  kex_free(nbufs);
  return 0;
}

static const kex_device_ops kex_cl_ops = {
    KEX_DEVICE_OPS_COMMON(kex_cl),
    .build = kex_cl_build,
    .prewarm = kex_cl_prewarm,
    .build_batch = kex_cl_build_batch,
    .set_compile_time_limit = kex_cl_set_compile_time_limit,
};

/* Query everything kex_device_info holds. Errors: KEX_ENOMEM. */
static int kex_cl_query(const kex_cl_found *f, kex_device_info *info) {
  kex_device_identity *id = &info->identity;
  char tmp[3 * KEX_DEVICE_FIELD_MAX], cver[KEX_DEVICE_FIELD_MAX], pver[KEX_DEVICE_FIELD_MAX];
  cl_ulong global = 0, max_alloc = 0, local_size = 0;
  cl_device_local_mem_type local_type = CL_NONE;
  cl_device_fp_config dfp = 0;
  cl_uint units = 0;
  size_t wg = 0, items[3] = {0, 0, 0};
  int fp16, fp64;

  memset(info, 0, sizeof *info);
  kex_device_set_field(id->kind, "opencl");
  kex_cl_device_str(f->device, CL_DEVICE_VENDOR, tmp);
  kex_device_set_field(id->vendor, tmp);
  kex_cl_device_str(f->device, CL_DEVICE_NAME, tmp);
  kex_device_set_field(id->name, tmp);
  kex_cl_device_str(f->device, CL_DRIVER_VERSION, tmp);
  kex_device_set_field(id->driver_version, tmp);
  kex_cl_device_str(f->device, CL_DEVICE_OPENCL_C_VERSION, cver);
  kex_cl_platform_str(f->platform, CL_PLATFORM_VERSION, pver);
  snprintf(tmp, sizeof tmp, "%s / %s", cver, pver);
  kex_device_set_field(id->compiler_version, tmp);

  clGetDeviceInfo(f->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_size, &local_size, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_LOCAL_MEM_TYPE, sizeof local_type, &local_type, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof items, items, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
  clGetDeviceInfo(f->device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof dfp, &dfp, NULL);
  fp16 = kex_cl_has_extension(f->device, "cl_khr_fp16");
  fp64 = kex_cl_has_extension(f->device, "cl_khr_fp64");
  if (fp16 < 0 || fp64 < 0) return KEX_ENOMEM;

  info->global_mem = global;
  info->max_alloc = max_alloc;
  info->has_local = true;
  info->has_shared = local_type != CL_NONE && local_size > 0;
  info->supports_float4 = true;
  info->supports_fp16 = fp16 == 1;
  info->supports_fp64 = fp64 == 1 || dfp != 0;
  info->shared_max = info->has_shared ? local_size : 0;
  info->max_work_group_size = wg;
  memcpy(info->max_work_item_sizes, items, sizeof items);
  info->compute_units = (int)units;
  return 0;
}

int kex_cl_open(const char *match, kex_device **out, kex_error *err) {
  kex_cl_found found[KEX_CL_MAX_DEVICES];
  kex_device_info info;
  kex_cl_device *cl = NULL;
  const kex_cl_found *pick = NULL;
  cl_int e = CL_SUCCESS;
  int n = 0, rc;

  rc = kex_cl_enumerate(found, &n, err);
  if (rc < 0) goto out;
  if (n == 0) {
    rc = kex_err_set(err, KEX_ENOTFOUND, "opencl: no OpenCL platform or device is present");
    goto out;
  }
  for (int i = 0; i < n && !pick; i++) {
    char name[KEX_DEVICE_FIELD_MAX];
    if (!match) {
      if (found[i].is_gpu) pick = &found[i];
      continue;
    }
    kex_cl_device_str(found[i].device, CL_DEVICE_NAME, name);
    if (strcasestr(name, match)) pick = &found[i];
  }
  if (!pick && !match) pick = &found[0];
  if (!pick) {
    rc = kex_err_set(err, KEX_ENOTFOUND, "opencl: no device name contains \"%s\" (%d devices present)", match, n);
    goto out;
  }
  rc = kex_cl_query(pick, &info);
  if (rc < 0) {
    rc = kex_err_set(err, rc, "opencl: out of memory querying the device");
    goto out;
  }
  cl = kex_calloc(1, sizeof *cl);
  if (!cl) {
    rc = kex_err_set(err, KEX_ENOMEM, "opencl: out of memory opening %s", info.identity.name);
    goto out;
  }
  cl->device = pick->device;
  cl->index = (int)(pick - found);
  cl->compute_units = info.compute_units;
  {
    char platform[KEX_DEVICE_FIELD_MAX];
    const char *cache = getenv("POCL_KERNEL_CACHE");
    kex_cl_platform_str(pick->platform, CL_PLATFORM_NAME, platform);
    bool pocl = strstr(platform, "Portable Computing Language") != NULL, helpers = getenv("KEX_CL_NO_HELPERS") == NULL;
    cl->prewarm_ok = pocl && !(cache && strcmp(cache, "0") == 0) && helpers;
    cl->apart = pocl && helpers;
  }
  snprintf(cl->name, sizeof cl->name, "%s", info.identity.name);
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)pick->platform, 0};
  cl->context = clCreateContext(props, 1, &pick->device, NULL, NULL, &e);
  if (!cl->context || e != CL_SUCCESS) {
    rc = kex_err_set(err, kex_cl_code(e), "opencl %s: clCreateContext failed: %s", cl->name, kex_cl_errname(e));
    goto out;
  }
  cl->queue = clCreateCommandQueue(cl->context, pick->device, CL_QUEUE_PROFILING_ENABLE, &e);
  if (!cl->queue || e != CL_SUCCESS) {
    rc = kex_err_set(err, kex_cl_code(e), "opencl %s: clCreateCommandQueue failed: %s", cl->name, kex_cl_errname(e));
    goto out;
  }
  KEX_DEBUG("opencl: opened %s (%s), fp16 %d, local mem %llu", cl->name, info.identity.compiler_version,
            info.supports_fp16, (unsigned long long)info.shared_max);
  rc = kex_device_wrap(&kex_cl_ops, cl, &info, "the device lacks cl_khr_fp16", out, err);
  cl = NULL; /* owned by the device now, or destroyed by kex_device_wrap */
out:
  if (cl) kex_cl_destroy(cl);
  return rc;
}

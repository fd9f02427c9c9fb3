/*
 * device_impl.h - what a device implementation provides (devices/ only).
 *
 * device.c owns the public handles (kex_device, kex_buffer, kex_program,
 * kex_event): it checks arguments, keeps the refcounts and forwards to a
 * kex_device_ops table whose functions see only the implementation's own
 * opaque pointers ("impl").  An implementation therefore never validates
 * what device.c already checked (sizes > 0, ranges inside buffers, name
 * lengths, argument counts, global[i] >= 1), and fault.c can wrap any
 * device by forwarding impl pointers to the inner table.
 *
 * Each function returns 0 or a negative KEX_E* code and fills err; on error
 * it leaves no handle behind (*out untouched or NULL).
 */
#ifndef KEX_DEVICES_DEVICE_IMPL_H
#define KEX_DEVICES_DEVICE_IMPL_H

#include <stdatomic.h>

#include "devices/device.h"

typedef struct kex_device_ops {
  /* Release the device (called once, on the last unref). */
  void (*destroy)(void *dev);
  int (*alloc)(void *dev, size_t size, void **buf, kex_error *err);
  void (*free)(void *dev, void *buf);
  int (*copy_in)(void *dev, void *buf, size_t offset, const void *src, size_t size, kex_error *err);
  int (*copy_out)(void *dev, void *buf, size_t offset, void *dst, size_t size, kex_error *err);
  /* launch: how the kernel will be launched (kex_device_compile_for_launch), or NULL */
  int (*compile)(void *dev, const char *source, const char *name, const kex_prewarm_item *launch, unsigned char **bin,
                 size_t *bin_size, kex_error *err);
  int (*load)(void *dev, const unsigned char *bin, size_t bin_size, const char *name, void **prog,
              kex_error *err);
  /* Optional (NULL: compile + load): source -> runnable program, no binary. */
  int (*build)(void *dev, const char *source, const char *name, void **prog, kex_error *err);
  /* Optional (NULL: kex_device_build per item): kex_device_build_batch; device.c has checked every item's source
     and name and cleared its results; the op sets each item's rc and err, and progs[i] on success. */
  int (*build_batch)(void *dev, kex_build_item *items, int n, void **progs, kex_error *err);
  /* Optional (NULL: KEX_EUNSUPPORTED): kex_device_prewarm. */
  int (*prewarm)(void *dev, const kex_prewarm_item *items, int n, int *warmed, kex_error *err);
  void (*program_free)(void *dev, void *prog);
  int (*launch)(void *dev, void *prog, const char *name, const size_t global[3], const size_t local[3],
                void *const *bufs, int nbufs, const int32_t *ints, int nints, void **event, kex_error *err);
  int (*wait)(void *dev, void *event, kex_error *err);
  int (*elapsed)(void *dev, void *event, double *seconds, kex_error *err);
  void (*event_free)(void *dev, void *event);
  /* Optional (NULL: the limit is only checked when a kernel ends, in device.c): stop kernels that run
     longer than `seconds` (0: no limit) -- kex_device_set_kernel_time_limit. */
  void (*set_kernel_time_limit)(void *dev, double seconds);
  /* Optional (NULL: no such mode, kex_device_set_serial_timing returns false). */
  bool (*set_serial_timing)(void *dev, bool on);
  /* Optional (NULL: compiles cannot be stopped): stop a compile past `seconds` (0: no limit); false when this
     instance cannot stop one after all. */
  bool (*set_compile_time_limit)(void *dev, double seconds);
} kex_device_ops;

/*
 * The ops every backend implements, each named <prefix>_<op>: a backend's
 * table is { KEX_DEVICE_OPS_COMMON(kex_cpu), <its optional ops> }.
 */
#define KEX_DEVICE_OPS_COMMON(prefix)                                                                     \
  .destroy = prefix##_destroy, .alloc = prefix##_alloc, .free = prefix##_free, .copy_in = prefix##_copy_in, \
  .copy_out = prefix##_copy_out, .compile = prefix##_compile, .load = prefix##_load,                      \
  .program_free = prefix##_program_free, .launch = prefix##_launch, .wait = prefix##_wait,                \
  .elapsed = prefix##_elapsed, .event_free = prefix##_event_free

struct kex_device {
  const kex_device_ops *ops;
  void *impl;
  atomic_int refs;
  kex_device_info info;
  char fp16_reason[96]; /* why float16 is refused, e.g. "the device lacks cl_khr_fp16" */
  double kernel_time_limit_s; /* 0: none (kex_device_set_kernel_time_limit; the owner thread's) */
  uint64_t uid;               /* kex_device_uid */
};

/*
 * Wrap impl in a new kex_device with one reference.  On success the device
 * owns impl (ops->destroy releases it); on error (KEX_ENOMEM) ops->destroy
 * has already been called on impl.
 */
int kex_device_wrap(const kex_device_ops *ops, void *impl, const kex_device_info *info,
                    const char *fp16_reason, kex_device **out, kex_error *err);

/* Copy src into a KEX_DEVICE_FIELD_MAX field, cut if longer; "" becomes "unknown". */
void kex_device_set_field(char *field, const char *src);

/* Opening by name, per implementation (opencl.c, cpu.c). */
int kex_cl_open(const char *match, kex_device **out, kex_error *err);
/* Append the OpenCL devices to list[*count..cap); missing OpenCL is not an error. */
int kex_cl_list(kex_device_desc **list, size_t *count, size_t *cap, kex_error *err);
int kex_cpu_open(kex_device **out, kex_error *err);

#endif

/*
 * fault.c - a device that fails the N-th call of one kind.
 *
 * It wraps any device (holding a reference on it) and forwards every call
 * to the inner device's table with the inner implementation's pointers, so
 * buffers, programs and events are the inner device's own.  Calls of the
 * chosen kind (alloc, compile, launch, copy = copy_in + copy_out) are
 * counted from creation; the n-th one returns KEX_EDEVICE with a message
 * naming the kind and the call number, without reaching the inner device.
 * This is how tests prove that device faults become errors, not crashes
 * or leaks, in every layer above.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/alloc.h"
#include "devices/device_impl.h"

#define KEX_FAULT_SLOW_MAX 64 /* events of slowed launches held at once (a launch past it is not slowed) */

typedef struct kex_fault_device {
  kex_device *inner;
  kex_fault_kind kind;
  unsigned long fail_at;
  atomic_ulong calls[KEX_FAULT_KIND_COUNT]; /* atomic: compiles may run on several threads (below) */
  /* kex_fault_device_set_slow: launches slow_from + 1 .. slow_from + slow_count report their time x slow_factor */
  pthread_mutex_t mu;
  unsigned long slow_from, slow_count;
  double slow_factor;
  void *slowed[KEX_FAULT_SLOW_MAX]; /* their events, until freed */
} kex_fault_device;

static const char *const kex_fault_names[KEX_FAULT_KIND_COUNT] = {"alloc", "compile", "launch", "copy"};

const char *kex_fault_kind_name(kex_fault_kind kind) {
  return (int)kind >= 0 && kind < KEX_FAULT_KIND_COUNT ? kex_fault_names[kind] : "unknown";
}

/* Count one call of kind (its number in *nth, may be NULL); KEX_EDEVICE (with err filled) when it is the one to fail. */
static int kex_fault_hit(kex_fault_device *f, kex_fault_kind kind, unsigned long *nth, kex_error *err) {
  unsigned long n = atomic_fetch_add(&f->calls[kind], 1) + 1;
  if (nth) *nth = n;
  if (kind == f->kind && n == f->fail_at)
    return kex_err_set(err, KEX_EDEVICE, "fault device: injected failure of %s call #%lu", kex_fault_names[kind], n);
  return 0;
}

#define INNER(f) ((f)->inner->impl)
#define OPS(f) ((f)->inner->ops)

static void kex_fault_destroy(void *impl) {
  kex_fault_device *f = impl;
  pthread_mutex_destroy(&f->mu);
  kex_device_unref(f->inner);
  kex_free(f);
}

static int kex_fault_alloc(void *impl, size_t size, void **buf, kex_error *err) {
  kex_fault_device *f = impl;
  int rc = kex_fault_hit(f, KEX_FAULT_ALLOC, NULL, err);
  return rc < 0 ? rc : OPS(f)->alloc(INNER(f), size, buf, err);
}

static void kex_fault_free(void *impl, void *buf) {
  kex_fault_device *f = impl;
  OPS(f)->free(INNER(f), buf);
}

static int kex_fault_copy_in(void *impl, void *buf, size_t offset, const void *src, size_t size, kex_error *err) {
  kex_fault_device *f = impl;
  int rc = kex_fault_hit(f, KEX_FAULT_COPY, NULL, err);
  return rc < 0 ? rc : OPS(f)->copy_in(INNER(f), buf, offset, src, size, err);
}

static int kex_fault_copy_out(void *impl, void *buf, size_t offset, void *dst, size_t size, kex_error *err) {
  kex_fault_device *f = impl;
  int rc = kex_fault_hit(f, KEX_FAULT_COPY, NULL, err);
  return rc < 0 ? rc : OPS(f)->copy_out(INNER(f), buf, offset, dst, size, err);
}

static int kex_fault_compile(void *impl, const char *source, const char *name, const kex_prewarm_item *launch,
                             unsigned char **bin, size_t *bin_size, kex_error *err) {
  kex_fault_device *f = impl;
  int rc = kex_fault_hit(f, KEX_FAULT_COMPILE, NULL, err);
  return rc < 0 ? rc : OPS(f)->compile(INNER(f), source, name, launch, bin, bin_size, err);
}

static int kex_fault_load(void *impl, const unsigned char *bin, size_t bin_size, const char *name, void **prog,
                          kex_error *err) {
  kex_fault_device *f = impl;
  return OPS(f)->load(INNER(f), bin, bin_size, name, prog, err);
}

static void kex_fault_program_free(void *impl, void *prog) {
  kex_fault_device *f = impl;
  OPS(f)->program_free(INNER(f), prog);
}

static int kex_fault_launch(void *impl, void *prog, const char *name, const size_t global[3], const size_t local[3],
                            void *const *bufs, int nbufs, const int32_t *ints, int nints, void **event,
                            kex_error *err) {
  kex_fault_device *f = impl;
  unsigned long n;
  int rc = kex_fault_hit(f, KEX_FAULT_LAUNCH, &n, err);
  if (rc < 0 || (rc = OPS(f)->launch(INNER(f), prog, name, global, local, bufs, nbufs, ints, nints, event, err)) < 0)
    return rc;
  pthread_mutex_lock(&f->mu);
  if (*event && n > f->slow_from && n - f->slow_from <= f->slow_count)
    for (int i = 0; i < KEX_FAULT_SLOW_MAX; i++)
      if (!f->slowed[i]) {
        f->slowed[i] = *event;
        break;
      }
  pthread_mutex_unlock(&f->mu);
  return rc;
}

/* The slot of a slowed event, or -1 (f->mu held). */
static int kex_fault_slowed(kex_fault_device *f, void *event) {
  for (int i = 0; event && i < KEX_FAULT_SLOW_MAX; i++)
    if (f->slowed[i] == event) return i;
  return -1;
}

static int kex_fault_wait(void *impl, void *event, kex_error *err) {
  kex_fault_device *f = impl;
  return OPS(f)->wait(INNER(f), event, err);
}

static int kex_fault_elapsed(void *impl, void *event, double *seconds, kex_error *err) {
  kex_fault_device *f = impl;
  int rc = OPS(f)->elapsed(INNER(f), event, seconds, err);
  pthread_mutex_lock(&f->mu);
  if (rc == 0 && kex_fault_slowed(f, event) >= 0) *seconds *= f->slow_factor;
  pthread_mutex_unlock(&f->mu);
  return rc;
}

static void kex_fault_event_free(void *impl, void *event) {
  kex_fault_device *f = impl;
  pthread_mutex_lock(&f->mu);
  int i = kex_fault_slowed(f, event);
  if (i >= 0) f->slowed[i] = NULL;
  pthread_mutex_unlock(&f->mu);
  OPS(f)->event_free(INNER(f), event);
}

static void kex_fault_set_kernel_time_limit(void *impl, double seconds) {
  kex_fault_device *f = impl;
  kex_device_set_kernel_time_limit(f->inner, seconds); /* the inner device stops its own kernels, where it can */
}

static bool kex_fault_set_compile_time_limit(void *impl, double seconds) {
  kex_fault_device *f = impl;
  return kex_device_set_compile_time_limit(f->inner, seconds);
}

static bool kex_fault_set_serial_timing(void *impl, bool on) {
  kex_fault_device *f = impl;
  return kex_device_set_serial_timing(f->inner, on);
}

static const kex_device_ops kex_fault_ops = {
    KEX_DEVICE_OPS_COMMON(kex_fault),
    .set_kernel_time_limit = kex_fault_set_kernel_time_limit,
    .set_serial_timing = kex_fault_set_serial_timing,
    .set_compile_time_limit = kex_fault_set_compile_time_limit,
};

int kex_fault_device_new(kex_device *inner, kex_fault_kind kind, unsigned long n, kex_device **out) {
  kex_fault_device *f;
  kex_device_info info;
  char kind_name[KEX_DEVICE_FIELD_MAX];

  *out = NULL;
  if (!inner || (int)kind < 0 || kind >= KEX_FAULT_KIND_COUNT || n == 0) return KEX_EINVAL;
  f = kex_calloc(1, sizeof *f);
  if (!f) return KEX_ENOMEM;
  if (pthread_mutex_init(&f->mu, NULL) != 0) {
    kex_free(f);
    return KEX_ENOMEM;
  }
  f->inner = inner;
  f->kind = kind;
  f->fail_at = n;
  kex_device_ref(inner);
  for (int k = 0; k < KEX_FAULT_KIND_COUNT; k++) atomic_init(&f->calls[k], 0);
  info = inner->info; /* compile_thread_safe as the inner device's: the counters are atomic */
  snprintf(kind_name, sizeof kind_name, "fault+%.200s", inner->info.identity.kind);
  kex_device_set_field(info.identity.kind, kind_name);
  /* on error kex_device_wrap has destroyed f, dropping the inner reference */
  return kex_device_wrap(&kex_fault_ops, f, &info, inner->fp16_reason, out, NULL);
}

int kex_fault_device_set_slow(kex_device *dev, unsigned long from, unsigned long count, double factor) {
  if (!dev || dev->ops != &kex_fault_ops || !(factor > 0)) return KEX_EINVAL;
  kex_fault_device *f = dev->impl;
  pthread_mutex_lock(&f->mu);
  f->slow_from = from;
  f->slow_count = count;
  f->slow_factor = factor;
  pthread_mutex_unlock(&f->mu);
  return 0;
}

unsigned long kex_fault_device_calls(kex_device *dev, kex_fault_kind kind) {
  if (!dev || dev->ops != &kex_fault_ops || (int)kind < 0 || kind >= KEX_FAULT_KIND_COUNT) return 0;
  return atomic_load(&((kex_fault_device *)dev->impl)->calls[kind]);
}

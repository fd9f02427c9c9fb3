/*
 * device.c - the public device handles over the per-device function tables.
 *
 * Everything a caller touches goes through here: opening by name, listing,
 * the identity string, the dtype check, and the handles (buffers, programs,
 * events), each of which keeps a reference to its device so that a device
 * is released only after the last handle made from it.  Arguments are
 * checked once here, so that opencl.c, cpu.c and fault.c see only valid
 * calls (device_impl.h says which rules that covers).
 */
#include "devices/device_impl.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"

struct kex_buffer {
  kex_device *dev;
  void *impl;
  size_t size;
};

struct kex_program {
  kex_device *dev;
  void *impl;
  char name[KEX_DEVICE_KERNEL_NAME_MAX + 1];
};

struct kex_event {
  kex_device *dev;
  void *impl;
  double time_limit_s; /* the device's kernel time limit at the launch (0: none) */
  char name[KEX_DEVICE_KERNEL_NAME_MAX + 1];
};

void kex_device_set_field(char *field, const char *src) {
  if (!src || !*src) src = "unknown";
  snprintf(field, KEX_DEVICE_FIELD_MAX, "%s", src);
}

int kex_device_wrap(const kex_device_ops *ops, void *impl, const kex_device_info *info,
                    const char *fp16_reason, kex_device **out, kex_error *err) {
  kex_device *dev = kex_calloc(1, sizeof *dev);
  if (!dev) {
    ops->destroy(impl);
    return kex_err_set(err, KEX_ENOMEM, "out of memory allocating the %s device", info->identity.kind);
  }
  static atomic_ullong uids;
  dev->ops = ops;
  dev->impl = impl;
  dev->uid = atomic_fetch_add(&uids, 1) + 1;
  atomic_init(&dev->refs, 1);
  dev->info = *info;
  snprintf(dev->fp16_reason, sizeof dev->fp16_reason, "%s", fp16_reason ? fp16_reason : "");
  *out = dev;
  return 0;
}

void kex_device_ref(kex_device *dev) {
  if (dev) atomic_fetch_add(&dev->refs, 1);
}

void kex_device_unref(kex_device *dev) {
  if (!dev) return;
  if (atomic_fetch_sub(&dev->refs, 1) != 1) return;
  dev->ops->destroy(dev->impl);
  kex_free(dev);
}

void kex_device_set_kernel_time_limit(kex_device *dev, double seconds) {
  dev->kernel_time_limit_s = seconds > 0 ? seconds : 0;
  if (dev->ops->set_kernel_time_limit) dev->ops->set_kernel_time_limit(dev->impl, dev->kernel_time_limit_s);
}

double kex_device_kernel_time_limit(const kex_device *dev) { return dev->kernel_time_limit_s; }

bool kex_device_set_compile_time_limit(kex_device *dev, double seconds) {
  if (!dev->ops->set_compile_time_limit) return false;
  return dev->ops->set_compile_time_limit(dev->impl, seconds > 0 ? seconds : 0);
}

bool kex_device_set_serial_timing(kex_device *dev, bool on) {
  return dev->ops->set_serial_timing ? dev->ops->set_serial_timing(dev->impl, on) : false;
}

const kex_device_info *kex_device_get_info(const kex_device *dev) { return &dev->info; }
const kex_device_identity *kex_device_get_identity(const kex_device *dev) { return &dev->info.identity; }

uint64_t kex_device_uid(const kex_device *dev) { return dev->uid; }

/* ---- opening and listing ---- */

int kex_device_open(const char *name, kex_device **out, kex_error *err) {
  int rc;
  *out = NULL;
  if (!name) return kex_err_set(err, KEX_EINVAL, "device name is NULL");
  if (strcmp(name, "cpu") == 0) return kex_cpu_open(out, err);
  if (strcmp(name, "opencl") == 0) return kex_cl_open(NULL, out, err);
  if (strncmp(name, "opencl:", 7) == 0) {
    if (!name[7]) return kex_err_set(err, KEX_EINVAL, "device name \"opencl:\" has an empty device-name substring");
    return kex_cl_open(name + 7, out, err);
  }
  if (strcmp(name, "default") == 0) {
    rc = kex_cl_open(NULL, out, err);
    if (rc != KEX_ENOTFOUND) return rc;
    return kex_cpu_open(out, err);
  }
  return kex_err_set(err, KEX_EINVAL,
                     "unknown device \"%s\" (expected opencl, opencl:<name substring>, cpu or default)", name);
}

int kex_device_list(kex_device_desc **out, size_t *count, kex_error *err) {
  kex_device_desc *list = NULL;
  size_t n = 0, cap = 0;
  int rc;

  *out = NULL;
  *count = 0;
  rc = kex_cl_list(&list, &n, &cap, err);
  if (rc < 0) goto out;
  if (n == cap) {
    kex_device_desc *grown = kex_realloc(list, (cap + 1) * sizeof *list);
    if (!grown) {
      rc = kex_err_set(err, KEX_ENOMEM, "out of memory listing devices");
      goto out;
    }
    list = grown;
    cap++;
  }
  memset(&list[n], 0, sizeof list[n]);
  snprintf(list[n].open_name, sizeof list[n].open_name, "cpu");
  snprintf(list[n].kind, sizeof list[n].kind, "cpu");
  snprintf(list[n].name, sizeof list[n].name, "C backend (cc)");
  n++;
  *out = list;
  *count = n;
  list = NULL;
  rc = 0;
out:
  kex_free(list);
  return rc;
}

/* ---- identity and capabilities ---- */

/* Append value to out[*len..cap) with '\\', ';' and '=' escaped; returns 0 or -1 when full. */
static int render_escaped(char *out, size_t cap, size_t *len, const char *value) {
  for (const char *p = value; *p; p++) {
    int esc = *p == '\\' || *p == ';' || *p == '=';
    if (*len + (size_t)esc + 1 >= cap) {
      out[*len] = 0;
      return -1;
    }
    if (esc) out[(*len)++] = '\\';
    out[(*len)++] = *p;
  }
  out[*len] = 0;
  return 0;
}

int kex_device_identity_render(const kex_device_identity *id, char *out, size_t cap) {
  const char *keys[] = {"kind=", ";vendor=", ";name=", ";driver=", ";compiler="};
  const char *values[] = {id->kind, id->vendor, id->name, id->driver_version, id->compiler_version};
  size_t len = 0;

  if (cap == 0) return KEX_ELIMIT;
  out[0] = 0;
  for (int i = 0; i < 5; i++) {
    size_t k = strlen(keys[i]);
    if (len + k >= cap) return KEX_ELIMIT;
    memcpy(out + len, keys[i], k + 1);
    len += k;
    if (render_escaped(out, cap, &len, values[i]) < 0) return KEX_ELIMIT;
  }
  return (int)len;
}

int kex_device_check_dtype(const kex_device *dev, kex_dtype dt, kex_error *err) {
  const char *name = dev->info.identity.name;
  if ((int)dt < 0 || dt >= KEX_DT_COUNT) return kex_err_set(err, KEX_EINVAL, "dtype %d is out of range", (int)dt);
  if (dt == KEX_DT_FLOAT16 && !dev->info.supports_fp16)
    return kex_err_set(err, KEX_EUNSUPPORTED, "float16 is not supported on %s: %s", name, dev->fp16_reason);
  if (dt == KEX_DT_FLOAT64 && !dev->info.supports_fp64)
    return kex_err_set(err, KEX_EUNSUPPORTED, "float64 is not supported on %s: the device lacks cl_khr_fp64", name);
  if (dt == KEX_DT_BFLOAT16)
    return kex_err_set(err, KEX_EUNSUPPORTED, "bfloat16 is not supported on %s: no kex renderer emits it", name);
  return 0;
}

/* ---- buffers ---- */

int kex_device_alloc(kex_device *dev, size_t size, kex_buffer **out, kex_error *err) {
  kex_buffer *buf = NULL;
  int rc;

  *out = NULL;
  if (size == 0) return kex_err_set(err, KEX_EINVAL, "%s: buffer size is 0", dev->info.identity.kind);
  if (size > dev->info.max_alloc)
    return kex_err_set(err, KEX_ELIMIT, "%s: buffer of %zu bytes exceeds the device's max_alloc of %llu bytes",
                       dev->info.identity.kind, size, (unsigned long long)dev->info.max_alloc);
  buf = kex_calloc(1, sizeof *buf);
  if (!buf) return kex_err_set(err, KEX_ENOMEM, "out of memory allocating a buffer handle");
  rc = dev->ops->alloc(dev->impl, size, &buf->impl, err);
  if (rc < 0) {
    kex_free(buf);
    return rc;
  }
  buf->dev = dev;
  buf->size = size;
  kex_device_ref(dev);
  *out = buf;
  return 0;
}

void kex_buffer_free(kex_buffer *buf) {
  if (!buf) return;
  buf->dev->ops->free(buf->dev->impl, buf->impl);
  kex_device_unref(buf->dev);
  kex_free(buf);
}

size_t kex_buffer_size(const kex_buffer *buf) { return buf->size; }

static int check_range(const kex_buffer *buf, size_t offset, size_t size, const char *what, kex_error *err) {
  if (size == 0 || offset > buf->size || size > buf->size - offset)
    return kex_err_set(err, KEX_EINVAL, "%s: range [%zu, %zu + %zu) is empty or outside the buffer of %zu bytes", what,
                       offset, offset, size, buf->size);
  return 0;
}

int kex_buffer_copy_in(kex_buffer *buf, size_t offset, const void *src, size_t size, kex_error *err) {
  int rc = check_range(buf, offset, size, "copy_in", err);
  if (rc < 0) return rc;
  return buf->dev->ops->copy_in(buf->dev->impl, buf->impl, offset, src, size, err);
}

int kex_buffer_copy_out(kex_buffer *buf, size_t offset, void *dst, size_t size, kex_error *err) {
  int rc = check_range(buf, offset, size, "copy_out", err);
  if (rc < 0) return rc;
  return buf->dev->ops->copy_out(buf->dev->impl, buf->impl, offset, dst, size, err);
}

/* ---- programs ---- */

/* 0 when name is a C identifier of at most KEX_DEVICE_KERNEL_NAME_MAX bytes. */
static int check_kernel_name(const char *name, kex_error *err) {
  size_t n;
  if (!name || !*name) return kex_err_set(err, KEX_EINVAL, "kernel name is empty");
  n = strlen(name);
  if (n > KEX_DEVICE_KERNEL_NAME_MAX)
    return kex_err_set(err, KEX_EINVAL, "kernel name of %zu bytes exceeds %d", n, KEX_DEVICE_KERNEL_NAME_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    int ok = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return kex_err_set(err, KEX_EINVAL, "kernel name \"%s\" is not a C identifier", name);
  }
  return 0;
}

/* A kernel's name and source are fit to compile: 0, or KEX_EINVAL / KEX_ELIMIT. */
static int check_source(const char *source, const char *name, kex_error *err) {
  int rc = check_kernel_name(name, err);
  if (rc < 0) return rc;
  if (!source || !*source) return kex_err_set(err, KEX_EINVAL, "kernel %s: source is empty", name);
  size_t n = strlen(source);
  if (n > KEX_DEVICE_SOURCE_MAX)
    return kex_err_set(err, KEX_ELIMIT, "kernel %s: source of %zu bytes exceeds %u", name, n, KEX_DEVICE_SOURCE_MAX);
  return 0;
}

/* Wrap a backend's program: *out owns impl and a reference to dev.  0, or KEX_ENOMEM (impl is freed). */
static int wrap_program(kex_device *dev, const char *name, void *impl, kex_program **out, kex_error *err) {
  kex_program *prog = kex_calloc(1, sizeof *prog);
  if (!prog) {
    dev->ops->program_free(dev->impl, impl);
    return kex_err_set(err, KEX_ENOMEM, "kernel %s: out of memory allocating a program", name);
  }
  prog->impl = impl;
  prog->dev = dev;
  snprintf(prog->name, sizeof prog->name, "%s", name);
  kex_device_ref(dev);
  *out = prog;
  return 0;
}

int kex_device_compile(kex_device *dev, const char *source, const char *name, unsigned char **bin,
                       size_t *bin_size, kex_error *err) {
  int rc;

  *bin = NULL;
  *bin_size = 0;
  if ((rc = check_source(source, name, err))) return rc;
  return dev->ops->compile(dev->impl, source, name, NULL, bin, bin_size, err);
}

int kex_device_compile_for_launch(kex_device *dev, const kex_prewarm_item *item, unsigned char **bin,
                                  size_t *bin_size, kex_error *err) {
  int rc;

  *bin = NULL;
  *bin_size = 0;
  if ((rc = check_source(item->source, item->name, err))) return rc;
  bool usable = item->nbufs <= KEX_DEVICE_MAX_BUFS && (item->nbufs == 0 || item->buf_sizes);
  return dev->ops->compile(dev->impl, item->source, item->name, usable ? item : NULL, bin, bin_size, err);
}

int kex_device_load(kex_device *dev, const unsigned char *bin, size_t bin_size, const char *name,
                    kex_program **out, kex_error *err) {
  void *impl = NULL;
  int rc;

  *out = NULL;
  rc = check_kernel_name(name, err);
  if (rc < 0) return rc;
  if (!bin || bin_size == 0) return kex_err_set(err, KEX_EINVAL, "kernel %s: binary is empty", name);
  if (bin_size > KEX_DEVICE_BINARY_MAX)
    return kex_err_set(err, KEX_ELIMIT, "kernel %s: binary of %zu bytes exceeds %u", name, bin_size,
                       KEX_DEVICE_BINARY_MAX);
  rc = dev->ops->load(dev->impl, bin, bin_size, name, &impl, err);
  return rc < 0 ? rc : wrap_program(dev, name, impl, out, err);
}

int kex_device_build(kex_device *dev, const char *source, const char *name, kex_program **out,
                     unsigned char **bin, size_t *bin_size, kex_error *err) {
  void *impl = NULL;
  unsigned char *bytes = NULL;
  size_t n = 0;
  int rc;

  *out = NULL;
  if (bin) {
    *bin = NULL;
    *bin_size = 0;
  }
  if (!dev->ops->build) {
    rc = kex_device_compile(dev, source, name, &bytes, &n, err);
    if (rc == 0) rc = kex_device_load(dev, bytes, n, name, out, err);
    if (rc == 0 && bin) {
      *bin = bytes;
      *bin_size = n;
      bytes = NULL;
    }
    kex_free(bytes);
    return rc;
  }
  if ((rc = check_source(source, name, err))) return rc;
  rc = dev->ops->build(dev->impl, source, name, &impl, err);
  return rc < 0 ? rc : wrap_program(dev, name, impl, out, err);
}

int kex_device_build_batch(kex_device *dev, kex_build_item *items, int n, kex_error *err) {
  void **impls = NULL;
  int built = 0, m = 0, *idx = NULL, rc = 0;
  if (n < 0) return kex_err_set(err, KEX_EINVAL, "build batch of %d items", n);
  if (n == 0) return 0;
  for (int i = 0; i < n; i++) {
    items[i].prog = NULL;
    items[i].rc = 0;
    items[i].err.msg[0] = 0;
  }
  if (!dev->ops->build_batch) {
    for (int i = 0; i < n; i++) {
      items[i].rc = kex_device_build(dev, items[i].source, items[i].name, &items[i].prog, NULL, NULL, &items[i].err);
      built += items[i].rc == 0;
    }
    return built;
  }
  /* the checked items go to the device together; the others fail here, each with its own message */
  impls = kex_calloc((size_t)n, sizeof *impls);
  idx = kex_calloc((size_t)n, sizeof *idx);
  kex_build_item *ok = kex_calloc((size_t)n, sizeof *ok);
  if (!impls || !idx || !ok) {
    for (int i = 0; i < n; i++) items[i].rc = kex_err_set(&items[i].err, KEX_ENOMEM, "kernel %s: out of memory "
                                                          "building a batch of %d", items[i].name ? items[i].name : "?", n);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if ((items[i].rc = check_source(items[i].source, items[i].name, &items[i].err))) continue;
    ok[m] = items[i];
    idx[m++] = i;
  }
  if (m > 0) rc = dev->ops->build_batch(dev->impl, ok, m, impls, err);
  for (int j = 0; j < m; j++) {
    kex_build_item *it = &items[idx[j]];
    it->rc = rc < 0 ? rc : ok[j].rc;
    if (rc < 0) kex_err_set(&it->err, rc, "kernel %s: the batch build failed: %.300s", it->name,
                            err ? err->msg : "(no message)");
    else it->err = ok[j].err;
    if (it->rc == 0) it->rc = wrap_program(dev, it->name, impls[j], &it->prog, &it->err);
    else if (impls[j]) dev->ops->program_free(dev->impl, impls[j]);
    built += it->rc == 0;
  }
out:
  kex_free(ok);
  kex_free(idx);
  kex_free(impls);
  return built;
}

int kex_device_prewarm(kex_device *dev, const kex_prewarm_item *items, int n, int *warmed, kex_error *err) {
  *warmed = 0;
  if (!dev->ops->prewarm) return kex_err_set(err, KEX_EUNSUPPORTED, "the device has no prewarm step");
  if (n <= 0) return 0;
  return dev->ops->prewarm(dev->impl, items, n, warmed, err);
}

void kex_program_free(kex_program *prog) {
  if (!prog) return;
  prog->dev->ops->program_free(prog->dev->impl, prog->impl);
  kex_device_unref(prog->dev);
  kex_free(prog);
}

const char *kex_program_name(const kex_program *prog) { return prog->name; }

int kex_program_launch(kex_program *prog, const size_t global[3], const size_t local[3],
                       kex_buffer *const *bufs, int nbufs, const int32_t *ints, int nints,
                       kex_event **out, kex_error *err) {
  kex_device *dev = prog->dev;
  void *impls[KEX_DEVICE_MAX_BUFS];
  kex_event *ev = NULL;
  int rc;

  *out = NULL;
  if (nbufs < 0 || nbufs > KEX_DEVICE_MAX_BUFS)
    return kex_err_set(err, KEX_EINVAL, "kernel %s: %d buffers (0..%d allowed)", prog->name, nbufs,
                       KEX_DEVICE_MAX_BUFS);
  if (nints < 0 || nints > KEX_DEVICE_MAX_INTS || (nints > 0 && !ints))
    return kex_err_set(err, KEX_EINVAL, "kernel %s: %d int scalars (0..%d allowed)", prog->name, nints,
                       KEX_DEVICE_MAX_INTS);
  for (int i = 0; i < 3; i++) {
    if (global[i] == 0 || global[i] > INT32_MAX)
      return kex_err_set(err, KEX_EINVAL, "kernel %s: global[%d] = %zu is outside 1..%d", prog->name, i, global[i],
                         INT32_MAX);
    if (local && (local[i] == 0 || local[i] > INT32_MAX || global[i] * local[i] > INT32_MAX))
      return kex_err_set(err, KEX_EINVAL, "kernel %s: local[%d] = %zu (global %zu) is outside 1..%d work items",
                         prog->name, i, local[i], global[i], INT32_MAX);
  }
  for (int i = 0; i < nbufs; i++) {
    if (!bufs[i] || bufs[i]->dev != dev)
      return kex_err_set(err, KEX_EINVAL, "kernel %s: buffer %d is NULL or belongs to another device", prog->name, i);
    impls[i] = bufs[i]->impl;
  }
  ev = kex_calloc(1, sizeof *ev);
  if (!ev) return kex_err_set(err, KEX_ENOMEM, "kernel %s: out of memory allocating an event", prog->name);
  rc = dev->ops->launch(dev->impl, prog->impl, prog->name, global, local, impls, nbufs, ints, nints, &ev->impl, err);
  if (rc < 0) {
    kex_free(ev);
    return rc;
  }
  ev->dev = dev;
  ev->time_limit_s = dev->kernel_time_limit_s;
  snprintf(ev->name, sizeof ev->name, "%s", prog->name);
  kex_device_ref(dev);
  *out = ev;
  return 0;
}

/* The end-of-kernel check of the time limit (device.h): KEX_EDEADLINE when the kernel of ev ran too long. */
static int check_time_limit(const kex_event *ev, double seconds, kex_error *err) {
  if (ev->time_limit_s > 0 && seconds > ev->time_limit_s)
    return kex_err_set(err, KEX_EDEADLINE, "%s: kernel %s ran %.3f s, over the kernel time limit of %g s",
                       ev->dev->info.identity.kind, ev->name, seconds, ev->time_limit_s);
  return 0;
}

int kex_event_wait(kex_event *ev, kex_error *err) {
  double seconds = 0;
  int rc = ev->dev->ops->wait(ev->dev->impl, ev->impl, err);
  if (rc < 0 || ev->time_limit_s <= 0) return rc;
  if ((rc = ev->dev->ops->elapsed(ev->dev->impl, ev->impl, &seconds, err)) < 0) return rc;
  return check_time_limit(ev, seconds, err);
}

int kex_event_elapsed(kex_event *ev, double *seconds, kex_error *err) {
  *seconds = 0;
  int rc = ev->dev->ops->elapsed(ev->dev->impl, ev->impl, seconds, err);
  return rc < 0 ? rc : check_time_limit(ev, *seconds, err);
}

void kex_event_free(kex_event *ev) {
  if (!ev) return;
  ev->dev->ops->event_free(ev->dev->impl, ev->impl);
  kex_device_unref(ev->dev);
  kex_free(ev);
}

/*
 * The discovered device a configured name opens, as kex_device_open picks it:
 * "opencl" the first GPU else the first OpenCL device, "opencl:<sub>" a name
 * containing sub, "cpu" the C backend, "default" the first GPU, OpenCL device, cpu.
 */
const kex_device_desc *kex_device_desc_match(const kex_device_desc *descs, size_t n, const char *name) {
  const kex_device_desc *first_cl = NULL, *gpu = NULL, *cpu = NULL;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(descs[i].kind, "opencl") == 0) {
      if (!first_cl) first_cl = &descs[i];
      if (!gpu && descs[i].is_gpu) gpu = &descs[i];
    } else if (strcmp(descs[i].kind, "cpu") == 0 && !cpu) {
      cpu = &descs[i];
    }
  }
  if (strcmp(name, "opencl") == 0) return gpu ? gpu : first_cl;
  if (strcmp(name, "cpu") == 0) return cpu;
  if (strcmp(name, "default") == 0) return gpu ? gpu : first_cl ? first_cl : cpu;
  for (size_t i = 0; i < n; i++)
    if (strcmp(descs[i].open_name, name) == 0) return &descs[i];
  if (strncmp(name, "opencl:", 7) == 0)
    for (size_t i = 0; i < n; i++)
      if (strcmp(descs[i].kind, "opencl") == 0 && strcasestr(descs[i].name, name + 7)) return &descs[i];
  return NULL;
}

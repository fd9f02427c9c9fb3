/*
 * run_io.c - the host-side pieces of running a graph: generating BUFFER
 * contents from fill specs and writing .npy files (reading a view of a
 * buffer on the host is sched/shapetracker.h's kex_st_gather).  No device
 * is involved here.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/npy.h"
#include "realize/run.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Store value v (as double, or as int when is_int) into element i of dtype dt. */
static void store_elem(void *out, size_t i, kex_dtype dt, double v, int64_t iv, bool is_int) {
  unsigned char *p = (unsigned char *)out + i * (size_t)kex_dtype_size(dt);
  if (!is_int) iv = (int64_t)v;
  switch (dt) {
  case KEX_DT_BOOL: *(uint8_t *)p = is_int ? iv != 0 : v != 0; break;
  case KEX_DT_INT8: *(int8_t *)p = (int8_t)iv; break;
  case KEX_DT_UINT8: *(uint8_t *)p = (uint8_t)iv; break;
  case KEX_DT_INT16: { int16_t x = (int16_t)iv; memcpy(p, &x, 2); break; }
  case KEX_DT_UINT16: { uint16_t x = (uint16_t)iv; memcpy(p, &x, 2); break; }
  case KEX_DT_INT32: { int32_t x = (int32_t)iv; memcpy(p, &x, 4); break; }
  case KEX_DT_UINT32: { uint32_t x = (uint32_t)iv; memcpy(p, &x, 4); break; }
  case KEX_DT_INT64: memcpy(p, &iv, 8); break;
  case KEX_DT_UINT64: { uint64_t x = (uint64_t)iv; memcpy(p, &x, 8); break; }
  case KEX_DT_FLOAT16: { _Float16 x = (_Float16)(is_int ? (double)iv : v); memcpy(p, &x, 2); break; }
  case KEX_DT_BFLOAT16: { uint16_t x = f32_to_bf16((float)(is_int ? (double)iv : v)); memcpy(p, &x, 2); break; }
  case KEX_DT_FLOAT32: { float x = (float)(is_int ? (double)iv : v); memcpy(p, &x, 4); break; }
  case KEX_DT_FLOAT64: { double x = is_int ? (double)iv : v; memcpy(p, &x, 8); break; }
  default: break;
  }
}

void kex_fill_const(kex_dtype dt, kex_const c, void *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (c.kind == KEX_CONST_FLOAT) store_elem(out, i, dt, c.f, 0, false);
    else store_elem(out, i, dt, 0, c.kind == KEX_CONST_INT ? c.i : c.b, true);
  }
}

int kex_fill_buffer(const kex_gnode *n, void *out, size_t nbytes, kex_error *err) {
  size_t elems = (size_t)kex_dtype_size(n->dtype) ? nbytes / (size_t)kex_dtype_size(n->dtype) : 0;
  switch (n->bufsrc) {
  case KEX_BUF_DATA:
    if (n->data_len != nbytes)
      return kex_err_set(err, KEX_EINVAL, "inline data is %zu bytes, the buffer %zu", n->data_len, nbytes);
    if (nbytes) memcpy(out, n->data, nbytes);
    return 0;
  case KEX_BUF_FILL_RANDOM: {
    uint64_t state = n->seed;
    for (size_t i = 0; i < elems; i++) {
      uint64_t r = splitmix64(&state);
      if (kex_dtype_is_float(n->dtype)) store_elem(out, i, n->dtype, (double)(r >> 11) * 0x1.0p-53, 0, false);
      else if (n->dtype == KEX_DT_BOOL) store_elem(out, i, n->dtype, 0, (int64_t)(r >> 63), true);
      else if (kex_dtype_is_unsigned(n->dtype)) store_elem(out, i, n->dtype, 0, (int64_t)(r % 100), true);
      else store_elem(out, i, n->dtype, 0, (int64_t)(r % 200) - 100, true);
    }
    return 0;
  }
  case KEX_BUF_FILL_ARANGE:
    for (size_t i = 0; i < elems; i++) store_elem(out, i, n->dtype, 0, (int64_t)i, true);
    return 0;
  case KEX_BUF_FILL_VALUE: kex_fill_const(n->dtype, n->fill, out, elems); return 0;
  case KEX_BUF_HANDLE:
    return kex_err_set(err, KEX_ENOTFOUND, "buffer handle '%s' is unknown here (handles live in a kexd job)",
                       n->handle ? n->handle : "");
  }
  return kex_err_set(err, KEX_EINVAL, "unknown buffer source");
}

int kex_write_npy(const char *path, kex_dtype dt, int ndim, const int64_t *shape, const void *data, kex_error *err) {
  return kex_npy_write(path, dt, ndim, shape, data, err); /* core/npy.c: the one .npy writer */
}

/*
 * npy.c - the .npy header codec and writer.
 *
 * A version-1.0 file is the magic "\x93NUMPY", the version bytes 1 0, a
 * little-endian uint16 header length, and a Python dict literal
 * ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }) padded with
 * spaces and a newline so that the data starts on a 64-byte boundary.
 * Versions 2.0 and 3.0 differ only in a uint32 header length.
 */
#include "core/npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const npy_descrs[KEX_DT_COUNT] = {
    [KEX_DT_BOOL] = "|b1",    [KEX_DT_INT8] = "|i1",   [KEX_DT_UINT8] = "|u1",  [KEX_DT_INT16] = "<i2",
    [KEX_DT_UINT16] = "<u2",  [KEX_DT_INT32] = "<i4",  [KEX_DT_UINT32] = "<u4", [KEX_DT_INT64] = "<i8",
    [KEX_DT_UINT64] = "<u8",  [KEX_DT_FLOAT16] = "<f2", [KEX_DT_BFLOAT16] = "<f4", [KEX_DT_FLOAT32] = "<f4",
    [KEX_DT_FLOAT64] = "<f8",
};

const char *kex_npy_descr(kex_dtype dt) { return dt < KEX_DT_COUNT ? npy_descrs[dt] : "<f8"; }

int kex_npy_read_header(FILE *f, const char *path, int max_dims, kex_dtype *dt, int *ndim, int64_t *shape,
                        kex_error *err) {
  unsigned char pre[12];
  char hdr[KEX_NPY_HEADER_MAX + 1];
  size_t hlen;
  const char *p;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
    return kex_err_set(err, KEX_EPARSE, "%s: not a .npy file (no \\x93NUMPY magic)", path);
  if (pre[6] == 1) {
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else {
    if (fread(pre + 10, 1, 2, f) != 2) return kex_err_set(err, KEX_EPARSE, "%s: truncated .npy header", path);
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  }
  if (hlen > KEX_NPY_HEADER_MAX)
    return kex_err_set(err, KEX_EPARSE, "%s: .npy header of %zu bytes is too long", path, hlen);
  if (fread(hdr, 1, hlen, f) != hlen) return kex_err_set(err, KEX_EPARSE, "%s: truncated .npy header", path);
  hdr[hlen] = 0;
  if (strstr(hdr, "'fortran_order': True"))
    return kex_err_set(err, KEX_EPARSE, "%s: Fortran-order arrays are not supported (save with C order)", path);
  if (!(p = strstr(hdr, "'descr':")) || !(p = strchr(p + 8, '\'')))
    return kex_err_set(err, KEX_EPARSE, "%s: .npy header has no descr", path);
  p++;
  char order = *p;
  if (order == '>' && !(p[2] == '1' && p[3] == '\''))
    return kex_err_set(err, KEX_EPARSE, "%s: big-endian arrays are not supported", path);
  if (order == '<' || order == '|' || order == '=' || order == '>') p++;
  int found = -1;
  for (int d = 0; d < KEX_DT_COUNT && found < 0; d++)
    if (d != KEX_DT_BFLOAT16 && strncmp(p, npy_descrs[d] + 1, 2) == 0 && p[2] == '\'') found = d;
  if (found < 0) {
    const char *e = strchr(p, '\'');
    return kex_err_set(err, KEX_EPARSE, "%s: numpy dtype '%.*s' has no kex dtype", path, e ? (int)(e - p) : 8, p);
  }
  *dt = (kex_dtype)found;
  if (!(p = strstr(hdr, "'shape':")) || !(p = strchr(p, '(')))
    return kex_err_set(err, KEX_EPARSE, "%s: .npy header has no shape", path);
  p++;
  *ndim = 0;
  for (;;) {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0) return kex_err_set(err, KEX_EPARSE, "%s: bad .npy shape", path);
    if (*ndim == max_dims) return kex_err_set(err, KEX_EPARSE, "%s: more than %d dims", path, max_dims);
    shape[(*ndim)++] = v;
    p = end;
  }
  return 0;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int kex_npy_write(const char *path, kex_dtype dt, int ndim, const int64_t *shape, const void *data, kex_error *err) {
  char header[512];
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", kex_npy_descr(dt));
  int64_t elems = 1;
  for (int i = 0; i < ndim; i++) {
    n += snprintf(header + n, sizeof header - (size_t)n, "%lld%s", (long long)shape[i], ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    elems *= shape[i];
  }
  n += snprintf(header + n, sizeof header - (size_t)n, "), }");
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f) return kex_err_set(err, KEX_EIO, "cannot write %s: %s", path, strerror(errno));
  uint16_t hlen = (uint16_t)(n + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  unsigned char hl[2] = {(unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
  fwrite(hl, 1, 2, f);
  fwrite(header, 1, (size_t)n, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  if (dt == KEX_DT_BFLOAT16) {
    for (int64_t i = 0; i < elems; i++) {
      uint16_t h;
      memcpy(&h, (const unsigned char *)data + 2 * i, 2);
      float x = bf16_to_f32(h);
      fwrite(&x, 4, 1, f);
    }
  } else if (elems) {
    fwrite(data, (size_t)kex_dtype_size(dt), (size_t)elems, f);
  }
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return kex_err_set(err, KEX_EIO, "cannot write %s", path);
  return 0;
}

/*
 * dtype.c - dtype table, promotion lattice and scalar constant semantics.
 */
#include "core/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tg_names[KEX_DT_COUNT] = {"bool", "char", "uchar", "short", "ushort", "int", "uint",
                                                     "long", "ulong", "half", "bfloat16", "float", "double"};

const kex_dtype_info kex_dtypes[KEX_DT_COUNT] = {
#define XX(e, name, size, c, cl, clang, fmt, kind) {name, size, c, cl, clang, fmt, kind},
    KEX_DTYPE_MAP(XX)
#undef XX
};

const char *kex_dtype_tgname(kex_dtype d) { return tg_names[d]; }

int kex_dtype_from_name(const char *name) {
  for (int i = 0; i < KEX_DT_COUNT; i++)
    if (strcmp(kex_dtypes[i].name, name) == 0) return i;
  return -1;
}

/* Direct parents in promo_lattice (spec section 1). */
static unsigned lattice_up(kex_dtype d) {
#define B(x) (1u << KEX_DT_##x)
  switch (d) {
  case KEX_DT_BOOL: return B(INT8) | B(UINT8);
  case KEX_DT_INT8: return B(INT16);
  case KEX_DT_INT16: return B(INT32);
  case KEX_DT_INT32: return B(INT64);
  case KEX_DT_INT64: return B(FLOAT16) | B(BFLOAT16);
  case KEX_DT_UINT8: return B(INT16) | B(UINT16);
  case KEX_DT_UINT16: return B(INT32) | B(UINT32);
  case KEX_DT_UINT32: return B(INT64) | B(UINT64);
  case KEX_DT_UINT64: return B(FLOAT16) | B(BFLOAT16);
  case KEX_DT_FLOAT16: return B(FLOAT32);
  case KEX_DT_BFLOAT16: return B(FLOAT32);
  case KEX_DT_FLOAT32: return B(FLOAT64);
  default: return 0;
  }
#undef B
}

static unsigned closure(kex_dtype d) {
  unsigned set = 1u << d, frontier = set;
  while (frontier) {
    unsigned next = 0;
    for (int i = 0; i < KEX_DT_COUNT; i++)
      if (frontier & (1u << i)) next |= lattice_up((kex_dtype)i);
    next &= ~set;
    set |= next;
    frontier = next;
  }
  return set;
}

kex_dtype kex_dtype_lub(kex_dtype a, kex_dtype b) {
  unsigned both = closure(a) & closure(b);
  for (int i = 0; i < KEX_DT_COUNT; i++)
    if (both & (1u << i)) return (kex_dtype)i;
  return KEX_DT_FLOAT64;
}

kex_dtype kex_dtype_least_upper_float(kex_dtype d) {
  return kex_dtype_is_float(d) ? d : kex_dtype_lub(d, KEX_DT_FLOAT32);
}

kex_dtype kex_dtype_sum_acc(kex_dtype d) {
  if (kex_dtype_is_unsigned(d)) return kex_dtype_lub(d, KEX_DT_UINT32);
  if (kex_dtype_is_int(d) || d == KEX_DT_BOOL) return kex_dtype_lub(d, KEX_DT_INT32);
  return kex_dtype_lub(d, KEX_DT_FLOAT32);
}

double kex_const_as_double(kex_const c) {
  switch (c.kind) {
  case KEX_CONST_INT: return (double)c.i;
  case KEX_CONST_BOOL: return c.b ? 1.0 : 0.0;
  default: return c.f;
  }
}

kex_const kex_const_as(kex_const c, kex_dtype dt) {
  if (kex_dtype_is_int(dt)) {
    if (c.kind == KEX_CONST_INT) return c;
    if (c.kind == KEX_CONST_BOOL) return kex_const_int(c.b);
    if (!isfinite(c.f)) return kex_const_int(0); /* Python raises; the graph validator refuses these */
    return kex_const_int((int64_t)c.f);           /* int() truncates toward zero */
  }
  if (kex_dtype_is_float(dt)) return kex_const_float(kex_const_as_double(c));
  if (c.kind == KEX_CONST_BOOL) return c;
  return kex_const_bool(c.kind == KEX_CONST_INT ? c.i != 0 : c.f != 0.0);
}

static float half_round(double v) {
  _Float16 h = (_Float16)v;
  return (float)h;
}

static float bf16_round(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f; /* nan */
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

kex_const kex_const_truncate(kex_const c, kex_dtype dt) {
  c = kex_const_as(c, dt);
  switch (dt) {
  case KEX_DT_BOOL: return c;
  case KEX_DT_INT8: return kex_const_int((int8_t)c.i);
  case KEX_DT_UINT8: return kex_const_int((uint8_t)c.i);
  case KEX_DT_INT16: return kex_const_int((int16_t)c.i);
  case KEX_DT_UINT16: return kex_const_int((uint16_t)c.i);
  case KEX_DT_INT32: return kex_const_int((int32_t)c.i);
  case KEX_DT_UINT32: return kex_const_int((uint32_t)c.i);
  case KEX_DT_INT64: return c;
  case KEX_DT_UINT64: return c; /* kept as the 64-bit pattern */
  case KEX_DT_FLOAT16: return kex_const_float(half_round(c.f));
  case KEX_DT_BFLOAT16: return kex_const_float(bf16_round(c.f));
  case KEX_DT_FLOAT32: return kex_const_float((float)c.f);
  default: return c;
  }
}

bool kex_const_eq(kex_const a, kex_const b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
  case KEX_CONST_INT: return a.i == b.i;
  case KEX_CONST_BOOL: return a.b == b.b;
  default: return a.f == b.f || (isnan(a.f) && isnan(b.f)) ? (signbit(a.f) == signbit(b.f) || isnan(a.f)) : false;
  }
}

int kex_const_repr(kex_const c, char *buf, size_t len) {
  switch (c.kind) {
  case KEX_CONST_INT: return snprintf(buf, len, "%lld", (long long)c.i);
  case KEX_CONST_BOOL: return snprintf(buf, len, "%s", c.b ? "True" : "False");
  default:
    if (isnan(c.f)) return snprintf(buf, len, "nan");
    if (isinf(c.f)) return snprintf(buf, len, c.f > 0 ? "inf" : "-inf");
    if (c.f == floor(c.f) && fabs(c.f) < 1e16) return snprintf(buf, len, "%.1f", c.f);
    /* Python's repr: the fewest digits that read back as the same double,
       in exponent form outside [1e-4, 1e16) */
    bool sci = fabs(c.f) >= 1e16 || fabs(c.f) < 1e-4;
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(tmp, sizeof tmp, sci ? "%.*e" : "%.*g", sci ? prec - 1 : prec, c.f);
      if (strtod(tmp, NULL) == c.f) break;
    }
    return snprintf(buf, len, "%s", tmp);
  }
}

double kex_dtype_element(kex_dtype dt, const void *base, size_t i) {
  if ((unsigned)dt >= KEX_DT_COUNT) return NAN;
  const unsigned char *p = (const unsigned char *)base + i * (size_t)kex_dtype_size(dt);
  switch (dt) {
  case KEX_DT_BOOL: return *p != 0;
  case KEX_DT_INT8: return *(const int8_t *)p;
  case KEX_DT_UINT8: return *p;
  case KEX_DT_INT16: { int16_t x; memcpy(&x, p, 2); return x; }
  case KEX_DT_UINT16: { uint16_t x; memcpy(&x, p, 2); return x; }
  case KEX_DT_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
  case KEX_DT_UINT32: { uint32_t x; memcpy(&x, p, 4); return x; }
  case KEX_DT_INT64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
  case KEX_DT_UINT64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
  case KEX_DT_FLOAT16: { _Float16 x; memcpy(&x, p, 2); return x; }
  case KEX_DT_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
  case KEX_DT_FLOAT32: { float x; memcpy(&x, p, 4); return x; }
  case KEX_DT_FLOAT64: { double x; memcpy(&x, p, 8); return x; }
  default: return NAN;
  }
}

const char *kex_tuple_repr(char *buf, size_t len, int n, const int64_t *v) {
  size_t off = 0;
  int k = snprintf(buf, len, "(");
  off = k > 0 ? (size_t)k : 0;
  for (int i = 0; i < n && off < len; i++) {
    k = snprintf(buf + off, len - off, i ? ", %lld" : "%lld", (long long)v[i]);
    if (k < 0) break;
    off += (size_t)k;
  }
  if (off < len) snprintf(buf + off, len - off, n == 1 ? ",)" : ")");
  return buf;
}

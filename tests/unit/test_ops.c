/*
 * test_ops.c - every op x dtype on both devices (opencl: PoCL here; cpu),
 * against a reference computed here in C with tinygrad 0.9.0's semantics.
 *
 * Each test builds a small graph as JSON (inline BUFFER data holding edge
 * values: 0, -1, 1, the type's min and max, for floats -0, denormals,
 * +-inf and NaN), runs it through kex_run_graph and compares every element:
 *   - ints: C semantics of the rendered code: wraparound, division and
 *     modulo truncating toward zero (python_alu's MOD/DIV for ints), signed or
 *     unsigned compares; divisors are never 0 and INT_MIN / -1 is avoided
 *     for 32/64-bit types (undefined in C and a trap on x86, in tinygrad too);
 *   - floats: IEEE results rounded to the dtype (the reference computes in
 *     double and rounds, which is exact for + - * / sqrt); exp2/log2/sin
 *     within a few ulp, with their domains (log2(0) = -inf, log2(<0),
 *     sqrt(<0) = NaN, exp2 overflow = inf); float MOD is fmod (the renderer's);
 *   - MAX renders as OpenCL `max(a,b)` and C `((a>b)?a:b)` (tinygrad's
 *     cstyle renderer does the same).  On C, a NaN first operand gives the
 *     second and a NaN second operand gives NaN; the reduce's ALU is
 *     (value, acc), so REDUCE_MAX on cpu skips NaNs.  OpenCL 1.2 leaves max()
 *     of NaN undefined: on opencl elementwise MAX is compared only where
 *     neither input is NaN, and REDUCE_MAX rows holding NaN only for being
 *     either NaN or the max of the other values;
 *   - bool: ADD is or, MUL and, MAX or (as the C the renderer writes); NEG of
 *     bool is refused, as tinygrad's LazyBuffer.e asserts;
 *   - CAST: C conversions (float -> int inputs are in the target's range,
 *     where C defines the result; int -> int wraps; x -> bool is x != 0,
 *     NaN included); BITCAST: the same bytes.
 * float16 runs on cpu; on opencl (no cl_khr_fp16) the device refuses it with
 * kex_device_check_dtype's message, which kex_run_graph must also return.
 * float64 runs where the device reports supports_fp64.
 * Then movement ops (RESHAPE EXPAND PERMUTE PAD SHRINK STRIDE, negative
 * strides), pads feeding reductions, and ASSIGN in place, against a dense
 * reference that applies the same ops to plain arrays.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "realize/run.h"
#include "sample.h"

#define NVAL 16 /* elements of every elementwise test */

static kex_device *devs[2];
static char dev_skip[2][600];

/* ---- values ---- */

/* One element: ints keep their bits in i (sign- or zero-extended), floats their value in f. */
typedef struct val {
  int64_t i;
  double f;
} val;

static bool is_f(kex_dtype dt) { return kex_dtype_is_float(dt); }
static bool is_u(kex_dtype dt) { return kex_dtype_is_unsigned(dt); }
static bool is_b(kex_dtype dt) { return dt == KEX_DT_BOOL; }

/* Round a double to dt's precision (float32, float16, float64). */
static double fround(kex_dtype dt, double x) {
  if (dt == KEX_DT_FLOAT32) return (float)x;
  if (dt == KEX_DT_FLOAT16) return (_Float16)x;
  return x;
}

/* Truncate the int bits to dt's width and extend back (C's wraparound). */
static int64_t iwrap(kex_dtype dt, int64_t x) {
  switch (dt) {
  case KEX_DT_BOOL: return x != 0;
  case KEX_DT_INT8: return (int8_t)x;
  case KEX_DT_UINT8: return (uint8_t)x;
  case KEX_DT_INT16: return (int16_t)x;
  case KEX_DT_UINT16: return (uint16_t)x;
  case KEX_DT_INT32: return (int32_t)x;
  case KEX_DT_UINT32: return (uint32_t)x;
  default: return x;
  }
}

static val load(kex_dtype dt, const void *p, size_t idx) {
  const unsigned char *b = (const unsigned char *)p + idx * (size_t)kex_dtype_size(dt);
  val v = {0, 0};
  if (dt == KEX_DT_FLOAT32) {
    float x;
    memcpy(&x, b, 4);
    v.f = x;
  } else if (dt == KEX_DT_FLOAT16) {
    _Float16 x;
    memcpy(&x, b, 2);
    v.f = x;
  } else if (dt == KEX_DT_FLOAT64) {
    memcpy(&v.f, b, 8);
  } else {
    uint64_t u = 0;
    memcpy(&u, b, (size_t)kex_dtype_size(dt)); /* little-endian */
    v.i = iwrap(dt, (int64_t)u);
  }
  return v;
}

static void store(kex_dtype dt, void *p, size_t idx, val v) {
  unsigned char *b = (unsigned char *)p + idx * (size_t)kex_dtype_size(dt);
  if (dt == KEX_DT_FLOAT32) {
    float x = (float)v.f;
    memcpy(b, &x, 4);
  } else if (dt == KEX_DT_FLOAT16) {
    _Float16 x = (_Float16)v.f;
    memcpy(b, &x, 2);
  } else if (dt == KEX_DT_FLOAT64) {
    memcpy(b, &v.f, 8);
  } else {
    uint64_t u = (uint64_t)iwrap(dt, v.i);
    memcpy(b, &u, (size_t)kex_dtype_size(dt));
  }
}

static int64_t imin(kex_dtype dt) { return is_u(dt) || is_b(dt) ? 0 : -(int64_t)(((uint64_t)1 << (8 * kex_dtype_size(dt) - 1)) - 1) - 1; }
static int64_t imax(kex_dtype dt) {
  if (is_b(dt)) return 1;
  int bits = 8 * kex_dtype_size(dt);
  if (is_u(dt)) return bits == 64 ? -1 : (int64_t)(((uint64_t)1 << bits) - 1);
  return (int64_t)(((uint64_t)1 << (bits - 1)) - 1);
}
static double fmaxof(kex_dtype dt) { return dt == KEX_DT_FLOAT32 ? FLT_MAX : dt == KEX_DT_FLOAT16 ? 65504.0 : DBL_MAX; }
static double fminnorm(kex_dtype dt) { return dt == KEX_DT_FLOAT32 ? FLT_MIN : dt == KEX_DT_FLOAT16 ? 0x1p-14 : DBL_MIN; }
static double fdenorm(kex_dtype dt) { return dt == KEX_DT_FLOAT32 ? 0x1p-149 : dt == KEX_DT_FLOAT16 ? 0x1p-24 : 0x1p-1074; }

/* The edge values of dt: set 0 is `a`, set 1 `b` (another order and mix), set 2 a divisor set (no 0). */
static void edge_values(kex_dtype dt, int set, val out[NVAL]) {
  if (is_b(dt)) {
    for (int i = 0; i < NVAL; i++) out[i].i = set == 0 ? (i & 1) : set == 1 ? ((i >> 1) & 1) : 1;
    return;
  }
  if (is_f(dt)) {
    double m = fmaxof(dt);
    double a[NVAL] = {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.14159265358979, 1e-3, m, -m, fminnorm(dt), fdenorm(dt),
                      INFINITY, -INFINITY, NAN, 100.0};
    for (int i = 0; i < NVAL; i++) {
      int j = set == 0 ? i : (i * 5 + 3) % NVAL;
      out[i].f = fround(dt, a[j]);
      out[i].i = 0;
    }
    return;
  }
  int64_t lo = imin(dt), hi = imax(dt);
  int64_t s[NVAL] = {0, -1, 1, lo, hi, lo + 1, hi - 1, 2, -2, 7, -7, 3, 100, -100, 5, 13};
  int64_t u[NVAL] = {0, 1, hi, hi - 1, 2, 3, 7, 100, 200, (int64_t)((uint64_t)hi / 2), (int64_t)((uint64_t)hi / 2 + 1),
                     5, 13, 64, 9, 11};
  for (int i = 0; i < NVAL; i++) {
    int j = set == 0 ? i : (i * 5 + 3) % NVAL;
    out[i].i = iwrap(dt, is_u(dt) ? u[j] : s[j]);
    out[i].f = 0;
  }
  if (set == 2) {
    val a[NVAL];
    edge_values(dt, 0, a);
    for (int i = 0; i < NVAL; i++) {
      if (out[i].i == 0) out[i].i = 3;
      if (!is_u(dt) && out[i].i == -1 && a[i].i == lo) out[i].i = 2;
    }
  }
}

/* ---- graph JSON ---- */

typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_add(sbuf *s, const char *f, ...) {
  va_list ap, aq;
  va_start(ap, f);
  va_copy(aq, ap);
  int k = vsnprintf(NULL, 0, f, ap);
  va_end(ap);
  if (s->n + (size_t)k + 1 > s->cap) {
    s->cap = (s->n + (size_t)k + 1) * 2;
    s->p = realloc(s->p, s->cap);
    assert_non_null(s->p);
  }
  vsnprintf(s->p + s->n, (size_t)k + 1, f, aq);
  va_end(aq);
  s->n += (size_t)k;
}

static void sb_b64(sbuf *s, const unsigned char *d, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
    sb_add(s, "%c%c%c%c", tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
           i + 2 < n ? tab[v & 63] : '=');
  }
}

/* A BUFFER node of dt with inline data (n values), shape as a JSON list text. */
static void sb_buffer(sbuf *s, kex_dtype dt, const val *v, size_t n, const char *shape) {
  unsigned char *bytes = calloc(n, (size_t)kex_dtype_size(dt));
  for (size_t i = 0; i < n; i++) store(dt, bytes, i, v[i]);
  sb_add(s, "{\"op\":\"BUFFER\",\"dtype\":\"%s\",\"shape\":%s,\"data\":\"", kex_dtypes[dt].name, shape);
  sb_b64(s, bytes, n * (size_t)kex_dtype_size(dt));
  sb_add(s, "\"}");
  free(bytes);
}

/*
 * Run graph text on device d.  Returns 1 with *res filled, or 0 when the
 * device refuses one of `dts` (float16 without cl_khr_fp16, float64 without
 * fp64): then kex_device_check_dtype's message is asserted, and kex_run_graph
 * must fail with that same message.
 */
static int run_json(int d, const char *json, const kex_dtype *dts, int ndts, kex_run_result *res, const char *refusal) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0}, derr = {0};
  kex_graph *g = NULL;
  if (kex_graph_from_json(json, strlen(json), &lim, &g, &err)) fail_msg("graph: %s\n%s", err.msg, json);
  int refused = 0;
  for (int i = 0; i < ndts && !refused; i++) {
    int rc = kex_device_check_dtype(devs[d], dts[i], &derr);
    if (!rc) continue;
    refused = 1;
    const kex_device_info *info = kex_device_get_info(devs[d]);
    assert_int_equal(rc, KEX_EUNSUPPORTED);
    if (dts[i] == KEX_DT_FLOAT16) {
      assert_false(info->supports_fp16);
      char want[300];
      snprintf(want, sizeof want, "float16 is not supported on %s: ", info->identity.name);
      assert_memory_equal(derr.msg, want, strlen(want));
    } else {
      assert_int_equal(dts[i], KEX_DT_FLOAT64);
      assert_false(info->supports_fp64);
      assert_non_null(strstr(derr.msg, "float64 is not supported on"));
    }
  }
  kex_run_opts ro = {1, false};
  int rc = kex_run_graph(g, devs[d], &ro, res, &err);
  kex_graph_free(g);
  if (refusal) {
    if (!rc) kex_run_result_free(res);
    assert_int_equal(rc, KEX_EINVAL);
    if (!strstr(err.msg, refusal)) fail_msg("run error \"%s\" lacks \"%s\"", err.msg, refusal);
    return 0;
  }
  if (refused) {
    if (!rc) kex_run_result_free(res);
    assert_int_not_equal(rc, 0);
    if (!strstr(err.msg, derr.msg)) fail_msg("run error \"%s\" lacks \"%s\"", err.msg, derr.msg);
    printf("refused as expected: %s\n", derr.msg);
    return 0;
  }
  if (rc) fail_msg("%s: %s\n%s", d ? "cpu" : "opencl", err.msg, json);
  return 1;
}

/* Compare got with want (dt): ints and exact floats bit-for-bit up to NaN payloads; else within tolerance. */
static bool same(kex_dtype dt, val got, val want, double rtol, double atol) {
  if (!is_f(dt)) return got.i == want.i;
  if (isnan(want.f) || isnan(got.f)) return isnan(want.f) && isnan(got.f);
  if (isinf(want.f) || isinf(got.f)) return got.f == want.f;
  if (rtol == 0 && atol == 0) return got.f == want.f && signbit(got.f) == signbit(want.f);
  return fabs(got.f - want.f) <= atol + rtol * fabs(want.f);
}

static void fmt_val(kex_dtype dt, val v, char *out, size_t n) {
  if (is_f(dt)) snprintf(out, n, "%.9g", v.f);
  else if (dt == KEX_DT_UINT64) snprintf(out, n, "%llu", (unsigned long long)v.i);
  else snprintf(out, n, "%lld", (long long)v.i);
}

/* Check output o of res against want[n] (skip[i] true: not compared). */
static void check_output(const kex_run_result *res, uint32_t o, kex_dtype dt, const val *want, size_t n, const bool *skip,
                         double rtol, double atol, const char *what) {
  assert_true(o < res->noutputs);
  assert_int_equal(res->outputs[o].dtype, dt);
  assert_int_equal(res->outputs[o].nbytes, n * (size_t)kex_dtype_size(dt));
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (skip && skip[i]) continue;
    val g = load(dt, res->outputs[o].data, i);
    if (same(dt, g, want[i], rtol, atol)) continue;
    char gs[64], ws[64];
    fmt_val(dt, g, gs, sizeof gs);
    fmt_val(dt, want[i], ws, sizeof ws);
    if (bad++ < 6) printf("  %s [%zu]: got %s, want %s\n", what, i, gs, ws);
  }
  if (bad) fail_msg("%s: %d of %zu elements differ", what, bad, n);
}

/* ---- elementwise ops ---- */

typedef enum { K_UNARY, K_BINARY, K_WHERE, K_CAST, K_BITCAST, K_REDUCE } op_kind;

typedef struct op_case {
  char name[96];
  op_kind kind;
  const char *op; /* graph op name */
  kex_dtype dt;   /* input dtype */
  kex_dtype to;   /* CAST/BITCAST target */
  int dev;
} op_case;

/* Reference of unary op on x (dt). */
static val ref_unary(const char *op, kex_dtype dt, val x) {
  val r = {0, 0};
  if (strcmp(op, "NEG") == 0) {
    if (is_b(dt)) r.i = !x.i;
    else if (is_f(dt)) r.f = -x.f;
    else r.i = iwrap(dt, (int64_t)(0 - (uint64_t)x.i));
    return r;
  }
  double v = x.f;
  if (strcmp(op, "EXP2") == 0) r.f = exp2(v);
  else if (strcmp(op, "LOG2") == 0) r.f = v > 0 ? log2(v) : v == 0 ? -INFINITY : NAN;
  else if (strcmp(op, "SIN") == 0) r.f = sin(v);
  else if (strcmp(op, "SQRT") == 0) r.f = v < 0 ? NAN : sqrt(v);
  r.f = fround(dt, r.f);
  return r;
}

/* Reference of binary op on (a, b) of dt; *nocheck set where the device result is undefined. */
static val ref_binary(const char *op, kex_dtype dt, val a, val b, int dev, bool *nocheck) {
  val r = {0, 0};
  bool f = is_f(dt), u = is_u(dt);
  uint64_t ua = (uint64_t)a.i, ub = (uint64_t)b.i;
  if (strcmp(op, "CMPLT") == 0) r.i = f ? a.f < b.f : u ? (dt == KEX_DT_UINT64 ? ua < ub : a.i < b.i) : a.i < b.i;
  else if (strcmp(op, "CMPEQ") == 0) r.i = f ? a.f == b.f : a.i == b.i;
  else if (strcmp(op, "MAX") == 0) {
    if (is_b(dt)) r.i = a.i || b.i;
    else if (f) {
      r.f = a.f > b.f ? a.f : b.f; /* C: ((a>b)?a:b) */
      if (dev == 0 && (isnan(a.f) || isnan(b.f))) *nocheck = true;
      if (dev == 0 && a.f == 0 && b.f == 0) *nocheck = signbit(a.f) != signbit(b.f); /* max(-0,0): either zero */
    } else {
      bool gt = dt == KEX_DT_UINT64 ? ua > ub : a.i > b.i;
      r.i = gt ? a.i : b.i;
    }
  } else if (f) {
    if (strcmp(op, "ADD") == 0) r.f = a.f + b.f;
    else if (strcmp(op, "SUB") == 0) r.f = a.f - b.f;
    else if (strcmp(op, "MUL") == 0) r.f = a.f * b.f;
    else if (strcmp(op, "DIV") == 0) r.f = a.f / b.f;
    else if (strcmp(op, "MOD") == 0) r.f = fmod(a.f, b.f);
    r.f = fround(dt, r.f);
  } else {
    uint64_t x = 0;
    if (strcmp(op, "ADD") == 0) x = is_b(dt) ? (ua || ub) : ua + ub;
    else if (strcmp(op, "SUB") == 0) x = ua - ub;
    else if (strcmp(op, "MUL") == 0) x = is_b(dt) ? (ua && ub) : ua * ub;
    else if (strcmp(op, "XOR") == 0) x = ua ^ ub;
    else if (strcmp(op, "DIV") == 0) x = u ? (dt == KEX_DT_UINT64 ? ua / ub : (uint64_t)(a.i / b.i)) : (uint64_t)(a.i / b.i);
    else if (strcmp(op, "MOD") == 0) x = u ? (dt == KEX_DT_UINT64 ? ua % ub : (uint64_t)(a.i % b.i)) : (uint64_t)(a.i % b.i);
    r.i = iwrap(dt, (int64_t)x);
  }
  return r;
}

/* Reference of CAST x (from) -> to: C conversion. */
static val ref_cast(kex_dtype from, kex_dtype to, val x) {
  val r = {0, 0};
  if (is_b(to)) r.i = is_f(from) ? x.f != 0 : x.i != 0; /* NaN != 0 */
  else if (is_f(to)) {
    if (is_f(from)) r.f = x.f;
    else if (from == KEX_DT_UINT64) r.f = (double)(uint64_t)x.i;
    else r.f = (double)x.i;
    /* int64 -> float32 in one rounding, like C (double rounding could differ) */
    if (!is_f(from) && to == KEX_DT_FLOAT32) r.f = from == KEX_DT_UINT64 ? (float)(uint64_t)x.i : (float)x.i;
    else if (!is_f(from) && to == KEX_DT_FLOAT16) r.f = from == KEX_DT_UINT64 ? (_Float16)(uint64_t)x.i : (_Float16)x.i;
    else r.f = fround(to, r.f);
  } else if (is_f(from)) {
    r.i = is_u(to) ? (int64_t)(uint64_t)x.f : (int64_t)x.f; /* inputs are in range */
    r.i = iwrap(to, r.i);
  } else {
    r.i = iwrap(to, x.i);
  }
  return r;
}

/* The next representable value of dt below positive x. */
static double fnextdown(kex_dtype dt, double x) {
  if (dt == KEX_DT_FLOAT32) return nextafterf((float)x, 0.0f);
  if (dt == KEX_DT_FLOAT64) return nextafter(x, 0.0);
  _Float16 h = (_Float16)x;
  uint16_t bits;
  memcpy(&bits, &h, 2);
  bits--;
  memcpy(&h, &bits, 2);
  return h;
}

/* Float inputs for CAST from float `from` to int `to`: in range (C leaves the rest undefined). */
static void cast_float_inputs(kex_dtype from, kex_dtype to, val out[NVAL]) {
  double hi = is_u(to) && kex_dtype_size(to) == 8 ? 0x1p64 : (double)imax(to) + 1.0; /* exclusive */
  double lo = is_u(to) ? -1.0 : (double)imin(to) - 1.0;                               /* exclusive */
  double top = fround(from, hi);
  while (top >= hi) top = fnextdown(from, top);
  if (from == KEX_DT_FLOAT16 && top > 65504) top = 65504;
  double bot = is_u(to) ? -0.0 : fround(from, (double)imin(to));
  if (from == KEX_DT_FLOAT16 && bot < -65504) bot = -65504;
  double a[NVAL] = {0.0, 0.5, 1.0, 1.99, 77.9, -0.0, top, bot, -0.5, -0.99, 3.0, 12.75, -1.0, -1.5, -77.9, 100.25};
  for (int i = 0; i < NVAL; i++) {
    double v = fround(from, a[i]);
    if (!(v > lo && v < hi)) v = fround(from, 2.0);
    out[i].f = v;
    out[i].i = 0;
  }
}

static void test_op(void **state) {
  const op_case *c = *state;
  int d = c->dev;
  if (!devs[d]) {
    printf("skipped: %s\n", dev_skip[d]);
    skip();
  }
  val a[NVAL], b[NVAL], cond[NVAL], want[NVAL];
  bool skipv[NVAL] = {0};
  kex_dtype out_dt = c->dt;
  kex_dtype dts[3] = {c->dt, c->to, KEX_DT_BOOL};
  double rtol = 0, atol = 0;
  sbuf s = {0};
  sb_add(&s, "{\"format\":\"kex.graph.v1\",\"nodes\":[");
  switch (c->kind) {
  case K_UNARY:
    edge_values(c->dt, 0, a);
    sb_buffer(&s, c->dt, a, NVAL, "[16]");
    sb_add(&s, ",{\"op\":\"%s\",\"src\":[0]}", c->op);
    for (int i = 0; i < NVAL; i++) want[i] = ref_unary(c->op, c->dt, a[i]);
    if (strcmp(c->op, "NEG") != 0) {
      rtol = c->dt == KEX_DT_FLOAT16 ? 2e-3 : c->dt == KEX_DT_FLOAT32 ? 1e-6 : 1e-13;
      if (strcmp(c->op, "SQRT") == 0) rtol = c->dt == KEX_DT_FLOAT16 ? 1e-3 : c->dt == KEX_DT_FLOAT32 ? 4e-7 : 1e-15;
      if (strcmp(c->op, "SIN") == 0) atol = rtol;
    }
    break;
  case K_BINARY: {
    bool divide = strcmp(c->op, "DIV") == 0 || strcmp(c->op, "MOD") == 0;
    edge_values(c->dt, 0, a);
    edge_values(c->dt, divide && !is_f(c->dt) ? 2 : 1, b);
    sb_buffer(&s, c->dt, a, NVAL, "[16]");
    sb_add(&s, ",");
    sb_buffer(&s, c->dt, b, NVAL, "[16]");
    sb_add(&s, ",{\"op\":\"%s\",\"src\":[0,1]}", c->op);
    for (int i = 0; i < NVAL; i++) want[i] = ref_binary(c->op, c->dt, a[i], b[i], d, &skipv[i]);
    if (strcmp(c->op, "CMPLT") == 0 || strcmp(c->op, "CMPEQ") == 0) out_dt = KEX_DT_BOOL;
    if (is_f(c->dt) && strcmp(c->op, "DIV") == 0 && d == 0) rtol = c->dt == KEX_DT_FLOAT32 ? 3e-7 : 0; /* 2.5 ulp */
    break;
  }
  case K_WHERE:
    edge_values(KEX_DT_BOOL, 0, cond);
    for (int i = 0; i < NVAL; i++) cond[i].i = (i * 7 + 1) % 3 != 0;
    edge_values(c->dt, 0, a);
    edge_values(c->dt, 1, b);
    sb_buffer(&s, KEX_DT_BOOL, cond, NVAL, "[16]");
    sb_add(&s, ",");
    sb_buffer(&s, c->dt, a, NVAL, "[16]");
    sb_add(&s, ",");
    sb_buffer(&s, c->dt, b, NVAL, "[16]");
    sb_add(&s, ",{\"op\":\"WHERE\",\"src\":[0,1,2]}");
    for (int i = 0; i < NVAL; i++) want[i] = cond[i].i ? a[i] : b[i];
    break;
  case K_CAST:
  case K_BITCAST:
    if (c->kind == K_CAST && is_f(c->dt) && kex_dtype_is_int(c->to)) cast_float_inputs(c->dt, c->to, a);
    else edge_values(c->dt, 0, a);
    sb_buffer(&s, c->dt, a, NVAL, "[16]");
    sb_add(&s, ",{\"op\":\"%s\",\"src\":[0],\"dtype\":\"%s\"}", c->op, kex_dtypes[c->to].name);
    out_dt = c->to;
    for (int i = 0; i < NVAL; i++) {
      if (c->kind == K_CAST) {
        want[i] = ref_cast(c->dt, c->to, a[i]);
      } else {
        unsigned char bytes[8];
        store(c->dt, bytes, 0, a[i]);
        want[i] = load(c->to, bytes, 0);
      }
    }
    if (c->kind == K_BITCAST && is_f(c->to)) rtol = 0; /* exact; NaN payloads are not compared */
    break;
  case K_REDUCE: {
    /* [4,8] reduced over axis 1: row 0 ordinary values, rows 1-3 the edge values (inf, NaN, extremes) */
    val x[32];
    edge_values(c->dt, 0, x);
    edge_values(c->dt, 1, x + 16);
    if (is_f(c->dt)) {
      double ordinary[8] = {0.5, -1.25, 3.0, 2.0, -0.75, 10.0, 0.125, -4.0};
      for (int i = 0; i < 8; i++) x[i].f = fround(c->dt, ordinary[i] * (c->dt == KEX_DT_FLOAT16 ? 1 : 1.1));
    }
    bool max = strcmp(c->op, "REDUCE_MAX") == 0;
    sb_buffer(&s, c->dt, x, 32, "[4,8]");
    sb_add(&s, ",{\"op\":\"%s\",\"src\":[0],\"axis\":[1]}", c->op);
    for (int r = 0; r < 4; r++) {
      val acc = {0, 0};
      if (max) {
        acc.f = -INFINITY;
        acc.i = imin(c->dt);
      }
      bool nan = false;
      double mag = 0;
      for (int k = 0; k < 8; k++) {
        val v = x[r * 8 + k];
        if (is_f(c->dt)) {
          nan |= isnan(v.f);
          mag += fabs(v.f);
          if (max) acc.f = v.f > acc.f ? v.f : acc.f; /* ((val>acc)?val:acc): NaN skipped */
          else acc.f += v.f;
        } else if (max) {
          bool gt = c->dt == KEX_DT_UINT64 ? (uint64_t)v.i > (uint64_t)acc.i : v.i > acc.i;
          if (is_b(c->dt)) gt = v.i && !acc.i;
          acc.i = gt ? v.i : acc.i;
        } else {
          acc.i = iwrap(c->dt, (int64_t)((uint64_t)acc.i + (uint64_t)v.i));
        }
      }
      if (is_f(c->dt) && !max) {
        /* a sum in some order: only exact for rows without overflow; compare within the sum of magnitudes */
        acc.f = fround(c->dt, acc.f);
        if (isfinite(mag) && mag > 0) atol = fmax(atol, mag * (c->dt == KEX_DT_FLOAT16 ? 2e-3 : 1e-6));
        if (!isfinite(mag) && !nan && !isinf(acc.f)) skipv[r] = true; /* max+(-max) etc.: order-dependent */
      }
      if (max && nan && d == 0) skipv[r] = true; /* checked below: NaN or the max of the rest */
      want[r] = acc;
    }
    sb_add(&s, "],\"outputs\":[1]}");
    kex_run_result res;
    if (run_json(d, s.p, dts, 1, &res, NULL)) {
      check_output(&res, 0, c->dt, want, 4, skipv, 0, atol, c->name);
      for (int r = 0; r < 4; r++)
        if (skipv[r] && max) {
          val g = load(c->dt, res.outputs[0].data, (size_t)r);
          if (!isnan(g.f) && !same(c->dt, g, want[r], 0, 0)) fail_msg("%s row %d: got %g, want NaN or %g", c->name, r, g.f, want[r].f);
        }
      kex_run_result_free(&res);
    }
    free(s.p);
    return;
  }
  }
  sb_add(&s, "],\"outputs\":[%d]}", c->kind == K_WHERE ? 3 : c->kind == K_BINARY ? 2 : 1);
  kex_run_result res;
  /* tinygrad's LazyBuffer.e asserts "UnaryOps.NEG does not accept dtype bool" (logical_not is a compare) */
  const char *refusal = c->kind == K_UNARY && is_b(c->dt) ? "node 1 (NEG): NEG does not accept dtype bool" : NULL;
  if (run_json(d, s.p, dts, c->kind == K_WHERE ? 3 : 2, &res, refusal)) {
    check_output(&res, 0, out_dt, want, NVAL, skipv, rtol, atol, c->name);
    kex_run_result_free(&res);
  }
  free(s.p);
}

/* ---- movement ops, masks, assign: a dense reference ---- */

#define MAXD 6
#define MAXE 4096

typedef struct dense {
  int nd;
  int64_t shape[MAXD];
  double v[MAXE];
} dense;

static int64_t numel(const dense *a) {
  int64_t n = 1;
  for (int i = 0; i < a->nd; i++) n *= a->shape[i];
  return n;
}

/* Multi-index of flat index f in shape (row-major). */
static void unflat(const int64_t *shape, int nd, int64_t f, int64_t *idx) {
  for (int i = nd - 1; i >= 0; i--) {
    idx[i] = f % shape[i];
    f /= shape[i];
  }
}

static int64_t flat(const int64_t *shape, int nd, const int64_t *idx) {
  int64_t f = 0;
  for (int i = 0; i < nd; i++) f = f * shape[i] + idx[i];
  return f;
}

/* One movement/reduce step: op name and its int args (pairs flattened for PAD/SHRINK). */
typedef struct mstep {
  const char *op;
  int n;
  int64_t a[12];
} mstep;

/* Apply step to x into y (dense, row-major). */
static void apply_step(const mstep *st, const dense *x, dense *y) {
  int64_t oi[MAXD], ii[MAXD];
  if (strcmp(st->op, "RESHAPE") == 0) {
    *y = *x;
    y->nd = st->n;
    memcpy(y->shape, st->a, sizeof(int64_t) * (size_t)st->n);
    assert_int_equal(numel(y), numel(x));
    return;
  }
  y->nd = x->nd;
  for (int i = 0; i < x->nd; i++) {
    if (strcmp(st->op, "EXPAND") == 0) y->shape[i] = st->a[i];
    else if (strcmp(st->op, "PERMUTE") == 0) y->shape[i] = x->shape[st->a[i]];
    else if (strcmp(st->op, "PAD") == 0) y->shape[i] = x->shape[i] + st->a[2 * i] + st->a[2 * i + 1];
    else if (strcmp(st->op, "SHRINK") == 0) y->shape[i] = st->a[2 * i + 1] - st->a[2 * i];
    else if (strcmp(st->op, "STRIDE") == 0) y->shape[i] = (x->shape[i] + llabs(st->a[i]) - 1) / llabs(st->a[i]);
    else y->shape[i] = st->a[0] >> i & 1 ? 1 : x->shape[i]; /* REDUCE_*: a[0] is an axis bit mask */
  }
  int64_t n = numel(y);
  assert_true(n <= MAXE);
  bool red = strncmp(st->op, "REDUCE_", 7) == 0, rmax = red && strcmp(st->op, "REDUCE_MAX") == 0;
  if (red) {
    for (int64_t f = 0; f < n; f++) y->v[f] = rmax ? -INFINITY : 0;
    for (int64_t f = 0; f < numel(x); f++) {
      unflat(x->shape, x->nd, f, ii);
      for (int i = 0; i < x->nd; i++) oi[i] = st->a[0] >> i & 1 ? 0 : ii[i];
      double *o = &y->v[flat(y->shape, y->nd, oi)];
      *o = rmax ? fmax(*o, x->v[f]) : *o + x->v[f];
    }
    return;
  }
  for (int64_t f = 0; f < n; f++) {
    unflat(y->shape, y->nd, f, oi);
    bool zero = false;
    for (int i = 0; i < x->nd; i++) {
      if (strcmp(st->op, "EXPAND") == 0) ii[i] = x->shape[i] == 1 ? 0 : oi[i];
      else if (strcmp(st->op, "PERMUTE") == 0) ii[st->a[i]] = oi[i];
      else if (strcmp(st->op, "PAD") == 0) {
        ii[i] = oi[i] - st->a[2 * i];
        zero |= ii[i] < 0 || ii[i] >= x->shape[i];
      } else if (strcmp(st->op, "SHRINK") == 0) ii[i] = oi[i] + st->a[2 * i];
      else ii[i] = st->a[i] > 0 ? oi[i] * st->a[i] : x->shape[i] - 1 + oi[i] * st->a[i];
    }
    y->v[f] = zero ? 0 : x->v[flat(x->shape, x->nd, ii)];
  }
}

static void sb_step(sbuf *s, const mstep *st, int src, int nd) {
  sb_add(&s[0], ",{\"op\":\"%s\",\"src\":[%d],", st->op, src);
  if (strncmp(st->op, "REDUCE_", 7) == 0) {
    sb_add(s, "\"axis\":[");
    int k = 0;
    for (int i = 0; i < nd; i++)
      if (st->a[0] >> i & 1) sb_add(s, "%s%d", k++ ? "," : "", i);
    sb_add(s, "]}");
    return;
  }
  sb_add(s, "\"arg\":[");
  bool pairs = strcmp(st->op, "PAD") == 0 || strcmp(st->op, "SHRINK") == 0;
  for (int i = 0; i < st->n; i += pairs ? 2 : 1) {
    if (pairs) sb_add(s, "%s[%lld,%lld]", i ? "," : "", (long long)st->a[i], (long long)st->a[i + 1]);
    else sb_add(s, "%s%lld", i ? "," : "", (long long)st->a[i]);
  }
  sb_add(s, "]}");
}

typedef struct move_case {
  const char *name;
  int nsteps;
  mstep steps[5];
  int then; /* 0: output the view itself; 1: output NEG(view) (a kernel reads it) */
} move_case;

/* Input: shape (2,3,4) = 24 elements, values i - 10 (negatives for MAX after a pad). */
static const move_case move_cases[] = {
  {"reshape", 1, {{"RESHAPE", 2, {6, 4}}}, 1},
  {"reshape_view", 1, {{"RESHAPE", 3, {4, 3, 2}}}, 0},
  {"permute", 1, {{"PERMUTE", 3, {2, 0, 1}}}, 1},
  {"permute_view", 1, {{"PERMUTE", 3, {1, 2, 0}}}, 0},
  {"expand", 2, {{"RESHAPE", 4, {2, 1, 3, 4}}, {"EXPAND", 4, {2, 5, 3, 4}}}, 1},
  {"pad", 1, {{"PAD", 6, {1, 0, 0, 2, 1, 1}}}, 1},
  {"pad_view", 1, {{"PAD", 6, {0, 1, 1, 0, 0, 3}}}, 0},
  {"shrink", 1, {{"SHRINK", 6, {0, 1, 1, 3, 1, 4}}}, 1},
  {"stride_pos", 1, {{"STRIDE", 3, {1, 2, 3}}}, 1},
  {"stride_neg", 1, {{"STRIDE", 3, {1, -1, -2}}}, 1},
  {"stride_all_neg", 1, {{"STRIDE", 3, {-1, -1, -1}}}, 0},
  {"permute_pad_shrink_stride", 4,
   {{"PERMUTE", 3, {2, 1, 0}}, {"PAD", 6, {1, 1, 0, 0, 2, 0}}, {"SHRINK", 6, {1, 6, 0, 3, 1, 4}}, {"STRIDE", 3, {-2, 1, -1}}},
   1},
  {"permute_reshape", 2, {{"PERMUTE", 3, {1, 0, 2}}, {"RESHAPE", 2, {3, 8}}}, 1},
  {"shrink_stride_reshape_expand", 4,
   {{"SHRINK", 6, {0, 2, 0, 3, 0, 2}}, {"STRIDE", 3, {1, -1, 1}}, {"RESHAPE", 4, {2, 3, 2, 1}}, {"EXPAND", 4, {2, 3, 2, 3}}},
   1},
  {"pad_sum", 2, {{"PAD", 6, {0, 0, 1, 1, 2, 0}}, {"REDUCE_SUM", 1, {2}}}, 0},
  {"pad_max", 2, {{"PAD", 6, {0, 1, 0, 0, 1, 1}}, {"REDUCE_MAX", 1, {4}}}, 0},
  {"pad_max_all", 2, {{"PAD", 6, {1, 0, 0, 0, 0, 2}}, {"REDUCE_MAX", 1, {7}}}, 1},
  {"shrink_pad_sum_all", 3, {{"SHRINK", 6, {0, 2, 1, 3, 0, 4}}, {"PAD", 6, {1, 1, 0, 1, 2, 2}}, {"REDUCE_SUM", 1, {7}}}, 0},
  {"expand_sum", 3, {{"RESHAPE", 4, {2, 3, 1, 4}}, {"EXPAND", 4, {2, 3, 5, 4}}, {"REDUCE_SUM", 1, {5}}}, 0},
  {"stride_neg_pad_max", 3, {{"STRIDE", 3, {-1, 1, -3}}, {"PAD", 6, {0, 0, 2, 2, 0, 1}}, {"REDUCE_MAX", 1, {2}}}, 0},
};

typedef struct move_test {
  char name[96];
  const move_case *mc;
  kex_dtype dt;
  int dev;
} move_test;

static void test_move(void **state) {
  const move_test *t = *state;
  int d = t->dev;
  if (!devs[d]) {
    printf("skipped: %s\n", dev_skip[d]);
    skip();
  }
  static dense x, y;
  x.nd = 3;
  x.shape[0] = 2, x.shape[1] = 3, x.shape[2] = 4;
  val in[24];
  for (int i = 0; i < 24; i++) {
    x.v[i] = i - 10 - (t->dt == KEX_DT_FLOAT32 ? 0.5 : 0);
    in[i].i = (int64_t)x.v[i];
    in[i].f = x.v[i];
  }
  sbuf s = {0};
  sb_add(&s, "{\"format\":\"kex.graph.v1\",\"nodes\":[");
  sb_buffer(&s, t->dt, in, 24, "[2,3,4]");
  for (int k = 0; k < t->mc->nsteps; k++) {
    sb_step(&s, &t->mc->steps[k], k, x.nd);
    apply_step(&t->mc->steps[k], &x, &y);
    x = y;
  }
  int last = t->mc->nsteps;
  if (t->mc->then) {
    sb_add(&s, ",{\"op\":\"NEG\",\"src\":[%d]}", last++);
    for (int64_t i = 0; i < numel(&x); i++) x.v[i] = -x.v[i];
  }
  sb_add(&s, "],\"outputs\":[%d]}", last);
  kex_run_result res;
  kex_dtype dts[1] = {t->dt};
  assert_int_equal(run_json(d, s.p, dts, 1, &res, NULL), 1);
  assert_int_equal(res.outputs[0].ndim, x.nd);
  for (int i = 0; i < x.nd; i++) assert_int_equal(res.outputs[0].shape[i], x.shape[i]);
  val *want = calloc((size_t)numel(&x), sizeof *want);
  for (int64_t i = 0; i < numel(&x); i++) want[i].f = x.v[i], want[i].i = (int64_t)x.v[i];
  check_output(&res, 0, t->dt, want, (size_t)numel(&x), NULL, 0, 0, t->name);
  free(want);
  kex_run_result_free(&res);
  free(s.p);
}

/* ---- ASSIGN ---- */

typedef struct assign_case {
  const char *name;
  kex_dtype dt;
  int kind; /* 0: t += b; 1: t += pad(shrink(t)) (a masked view of the target); 2: a RESHAPE view of t += c */
} assign_case;

static const assign_case assign_cases[] = {
  {"assign_add_float32", KEX_DT_FLOAT32, 0}, {"assign_add_int32", KEX_DT_INT32, 0}, {"assign_add_uint8", KEX_DT_UINT8, 0},
  {"assign_masked_view", KEX_DT_FLOAT32, 1}, {"assign_reshaped_target", KEX_DT_FLOAT32, 2},
};

typedef struct assign_test {
  char name[96];
  const assign_case *ac;
  int dev;
} assign_test;

static void test_assign(void **state) {
  const assign_test *t = *state;
  int d = t->dev;
  kex_dtype dt = t->ac->dt;
  if (!devs[d]) {
    printf("skipped: %s\n", dev_skip[d]);
    skip();
  }
  val tv[16], bv[16], want[16];
  for (int i = 0; i < 16; i++) {
    tv[i].f = i * 1.5 - 4, tv[i].i = iwrap(dt, i * 17 - 40);
    bv[i].f = 0.25 * (i % 5), bv[i].i = iwrap(dt, i * 29 + 3);
  }
  if (dt == KEX_DT_FLOAT32)
    for (int i = 0; i < 16; i++) tv[i].i = bv[i].i = 0;
  sbuf s = {0};
  sb_add(&s, "{\"format\":\"kex.graph.v1\",\"nodes\":[");
  sb_buffer(&s, dt, tv, 16, "[4,4]");
  sb_add(&s, ",");
  sb_buffer(&s, dt, bv, 16, "[4,4]");
  int out;
  switch (t->ac->kind) {
  case 0:
    sb_add(&s, ",{\"op\":\"ADD\",\"src\":[0,1]},{\"op\":\"ASSIGN\",\"src\":[2,0]}");
    for (int i = 0; i < 16; i++) want[i] = ref_binary("ADD", dt, tv[i], bv[i], d, &(bool){0});
    out = 3;
    break;
  case 1:
    /* value = t + pad(shrink(t, cols 0..1), right 2): t*2 in columns 0-1, t elsewhere */
    sb_add(&s, ",{\"op\":\"SHRINK\",\"src\":[0],\"arg\":[[0,4],[0,2]]},{\"op\":\"PAD\",\"src\":[2],\"arg\":[[0,0],[0,2]]}"
               ",{\"op\":\"ADD\",\"src\":[0,3]},{\"op\":\"ASSIGN\",\"src\":[4,0]}");
    for (int i = 0; i < 16; i++) want[i].f = (i % 4 < 2 ? 2 : 1) * tv[i].f;
    out = 5;
    break;
  default:
    /* the target is a RESHAPE of the held buffer; the value reads it through the same view, plus b reversed */
    sb_add(&s, ",{\"op\":\"RESHAPE\",\"src\":[0],\"arg\":[16]},{\"op\":\"RESHAPE\",\"src\":[1],\"arg\":[16]}"
               ",{\"op\":\"STRIDE\",\"src\":[3],\"arg\":[-1]},{\"op\":\"ADD\",\"src\":[2,4]},{\"op\":\"ASSIGN\",\"src\":[5,2]}");
    for (int i = 0; i < 16; i++) want[i].f = (float)(tv[i].f + bv[15 - i].f);
    out = 6;
    break;
  }
  sb_add(&s, "],\"outputs\":[%d]}", out);
  kex_run_result res;
  kex_dtype dts[1] = {dt};
  assert_int_equal(run_json(d, s.p, dts, 1, &res, NULL), 1);
  check_output(&res, 0, dt, want, 16, NULL, 0, 0, t->name);
  kex_run_result_free(&res);
  free(s.p);
}

/* ---- the table of tests ---- */

static const kex_dtype all_dts[] = {KEX_DT_BOOL,   KEX_DT_INT8,   KEX_DT_UINT8,   KEX_DT_INT16,
                                    KEX_DT_UINT16, KEX_DT_INT32,  KEX_DT_UINT32,  KEX_DT_INT64,
                                    KEX_DT_UINT64, KEX_DT_FLOAT16, KEX_DT_FLOAT32, KEX_DT_FLOAT64};
#define NDTS (sizeof all_dts / sizeof *all_dts)

/* Which dtypes an op takes (tinygrad: math on floats; SUB/DIV/MOD not on bool; XOR not on floats). */
static bool op_allows(const char *op, kex_dtype dt) {
  if (!strcmp(op, "EXP2") || !strcmp(op, "LOG2") || !strcmp(op, "SIN") || !strcmp(op, "SQRT")) return is_f(dt);
  if (!strcmp(op, "SUB") || !strcmp(op, "DIV") || !strcmp(op, "MOD") || !strcmp(op, "REDUCE_SUM")) return !is_b(dt);
  if (!strcmp(op, "XOR")) return !is_f(dt);
  return true;
}

int main(void) {
  kex_test_device_open("opencl", &devs[0], dev_skip[0], sizeof dev_skip[0]);
  kex_test_device_open("cpu", &devs[1], dev_skip[1], sizeof dev_skip[1]);
  static const char *unary[] = {"EXP2", "LOG2", "SIN", "SQRT", "NEG"};
  static const char *binary[] = {"ADD", "SUB", "MUL", "DIV", "MAX", "MOD", "CMPLT", "CMPEQ", "XOR"};
  static const char *reduce[] = {"REDUCE_SUM", "REDUCE_MAX"};
  size_t cap = 2 * (NDTS * (5 + 9 + 1 + 2) + NDTS * NDTS * 2) + 2 * 2 * (sizeof move_cases / sizeof *move_cases) + 16;
  op_case *oc = calloc(cap, sizeof *oc);
  move_test *mt = calloc(cap, sizeof *mt);
  assign_test *at = calloc(16, sizeof *at);
  struct CMUnitTest *tests = calloc(cap, sizeof *tests);
  size_t nt = 0, no = 0, nm = 0, na = 0;
  for (int d = 0; d < 2; d++) {
    const char *dn = d ? "cpu" : "opencl";
    for (size_t i = 0; i < NDTS; i++) {
      kex_dtype dt = all_dts[i];
      const char *tn = kex_dtypes[dt].name;
      struct { op_kind k; const char *const *ops; size_t n; } groups[] = {
        {K_UNARY, unary, 5}, {K_BINARY, binary, 9}, {K_REDUCE, reduce, 2}};
      for (size_t g = 0; g < 3; g++)
        for (size_t o = 0; o < groups[g].n; o++) {
          if (!op_allows(groups[g].ops[o], dt)) continue;
          op_case *c = &oc[no++];
          *c = (op_case){"", groups[g].k, groups[g].ops[o], dt, dt, d};
          snprintf(c->name, sizeof c->name, "%s_%s_%s", groups[g].ops[o], tn, dn);
        }
      op_case *w = &oc[no++];
      *w = (op_case){"", K_WHERE, "WHERE", dt, dt, d};
      snprintf(w->name, sizeof w->name, "WHERE_%s_%s", tn, dn);
      for (size_t j = 0; j < NDTS; j++) {
        kex_dtype to = all_dts[j];
        if (to == dt) continue;
        op_case *c = &oc[no++];
        *c = (op_case){"", K_CAST, "CAST", dt, to, d};
        snprintf(c->name, sizeof c->name, "CAST_%s_to_%s_%s", tn, kex_dtypes[to].name, dn);
        if (kex_dtype_size(to) == kex_dtype_size(dt) && !is_b(dt) && !is_b(to)) {
          c = &oc[no++];
          *c = (op_case){"", K_BITCAST, "BITCAST", dt, to, d};
          snprintf(c->name, sizeof c->name, "BITCAST_%s_to_%s_%s", tn, kex_dtypes[to].name, dn);
        }
      }
    }
    for (size_t m = 0; m < sizeof move_cases / sizeof *move_cases; m++)
      for (int k = 0; k < 2; k++) {
        move_test *t = &mt[nm++];
        t->mc = &move_cases[m];
        t->dt = k ? KEX_DT_INT32 : KEX_DT_FLOAT32;
        t->dev = d;
        snprintf(t->name, sizeof t->name, "move_%s_%s_%s", move_cases[m].name, kex_dtypes[t->dt].name, dn);
      }
    for (size_t a = 0; a < sizeof assign_cases / sizeof *assign_cases; a++) {
      assign_test *t = &at[na++];
      t->ac = &assign_cases[a];
      t->dev = d;
      snprintf(t->name, sizeof t->name, "%s_%s", assign_cases[a].name, dn);
    }
  }
  for (size_t i = 0; i < no; i++)
    if (kex_test_sampled(i)) tests[nt++] = (struct CMUnitTest){oc[i].name, test_op, NULL, NULL, &oc[i]};
  for (size_t i = 0; i < nm; i++)
    if (kex_test_sampled(i)) tests[nt++] = (struct CMUnitTest){mt[i].name, test_move, NULL, NULL, &mt[i]};
  for (size_t i = 0; i < na; i++) tests[nt++] = (struct CMUnitTest){at[i].name, test_assign, NULL, NULL, &at[i]};
  assert_true(nt <= cap);
  int fails = _cmocka_run_group_tests("ops", tests, nt, NULL, NULL);
  free(tests);
  free(oc);
  free(mt);
  free(at);
  kex_device_unref(devs[0]);
  kex_device_unref(devs[1]);
  return fails;
}

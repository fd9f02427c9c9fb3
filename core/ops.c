/*
 * ops.c - op names and constant evaluation (python_alu).
 */
#include "core/ops.h"

#include <math.h>
#include <stdlib.h>

static const char *const op_names[KEX_OP_COUNT] = {
#define XX(e, fam, name) #fam "." #name,
    KEX_OP_MAP(XX)
#undef XX
};
static const char *const op_short[KEX_OP_COUNT] = {
#define XX(e, fam, name) #name,
    KEX_OP_MAP(XX)
#undef XX
};

const char *kex_op_name(kex_op op) { return op < KEX_OP_COUNT ? op_names[op] : "?"; }
const char *kex_op_short(kex_op op) { return op < KEX_OP_COUNT ? op_short[op] : "?"; }

static bool truthy(kex_const c) {
  switch (c.kind) {
  case KEX_CONST_INT: return c.i != 0;
  case KEX_CONST_BOOL: return c.b;
  default: return c.f != 0.0;
  }
}

/* Python arithmetic promotes bool < int < float. */
static kex_const_kind join_kind(kex_const a, kex_const b) {
  if (a.kind == KEX_CONST_FLOAT || b.kind == KEX_CONST_FLOAT) return KEX_CONST_FLOAT;
  if (a.kind == KEX_CONST_INT || b.kind == KEX_CONST_INT) return KEX_CONST_INT;
  return KEX_CONST_BOOL;
}

static int64_t as_i(kex_const c) { return c.kind == KEX_CONST_INT ? c.i : c.kind == KEX_CONST_BOOL ? c.b : (int64_t)c.f; }
static double as_f(kex_const c) { return kex_const_as_double(c); }

kex_const kex_exec_alu(kex_op op, kex_dtype dt, const kex_const *s, int n) {
  kex_const r = kex_const_int(0);
  (void)n;
  switch (op) {
  case KEX_OP_LOG2: {
    double x = as_f(s[0]);
    r = kex_const_float(x > 0 ? log2(x) : x == 0 ? -INFINITY : NAN);
    break;
  }
  case KEX_OP_EXP2: r = kex_const_float(exp2(as_f(s[0]))); break;
  case KEX_OP_SQRT: {
    double x = as_f(s[0]);
    r = kex_const_float(x >= 0 ? sqrt(x) : NAN);
    break;
  }
  case KEX_OP_SIN: r = kex_const_float(sin(as_f(s[0]))); break;
  case KEX_OP_NEG:
    if (dt == KEX_DT_BOOL) r = kex_const_bool(!truthy(s[0]));
    else if (s[0].kind == KEX_CONST_FLOAT) r = kex_const_float(-s[0].f);
    else r = kex_const_int((int64_t)(0 - (uint64_t)as_i(s[0]))); /* wraps: -INT64_MIN is INT64_MIN, no UB */
    break;
  case KEX_OP_CAST: r = s[0]; break;
  case KEX_OP_ADD: case KEX_OP_SUB: case KEX_OP_MUL: case KEX_OP_MAX: {
    kex_const_kind k = join_kind(s[0], s[1]);
    if (k == KEX_CONST_FLOAT) {
      double a = as_f(s[0]), b = as_f(s[1]);
      /* MAX is Python's max(a, b): a unless b > a, so max(nan, 1) = nan but max(1, nan) = 1 */
      r = kex_const_float(op == KEX_OP_ADD ? a + b : op == KEX_OP_SUB ? a - b : op == KEX_OP_MUL ? a * b : (b > a ? b : a));
    } else {
      int64_t a = as_i(s[0]), b = as_i(s[1]);
      int64_t v = op == KEX_OP_ADD ? (int64_t)((uint64_t)a + (uint64_t)b)
                  : op == KEX_OP_SUB ? (int64_t)((uint64_t)a - (uint64_t)b)
                  : op == KEX_OP_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
                                     : (a >= b ? a : b);
      r = k == KEX_CONST_BOOL && op == KEX_OP_MAX ? kex_const_bool(v != 0) : kex_const_int(v);
    }
    break;
  }
  case KEX_OP_XOR: {
    int64_t v = as_i(s[0]) ^ as_i(s[1]);
    r = join_kind(s[0], s[1]) == KEX_CONST_BOOL ? kex_const_bool(v != 0) : kex_const_int(v);
    break;
  }
  case KEX_OP_CMPLT:
    r = kex_const_bool(join_kind(s[0], s[1]) == KEX_CONST_FLOAT ? as_f(s[0]) < as_f(s[1]) : as_i(s[0]) < as_i(s[1]));
    break;
  case KEX_OP_CMPEQ:
    r = kex_const_bool(join_kind(s[0], s[1]) == KEX_CONST_FLOAT ? as_f(s[0]) == as_f(s[1]) : as_i(s[0]) == as_i(s[1]));
    break;
  case KEX_OP_MOD: {
    int64_t x = as_i(s[0]), y = as_i(s[1]);
    /* |x| and |y| as unsigned: |INT64_MIN| = 2^63 fits, and the remainder is < 2^63 */
    uint64_t ax = x < 0 ? 0 - (uint64_t)x : (uint64_t)x, ay = y < 0 ? 0 - (uint64_t)y : (uint64_t)y;
    uint64_t m = ay ? ax % ay : 0;
    r = kex_const_int(as_f(s[0]) < 0 ? (int64_t)(0 - m) : (int64_t)m);
    break;
  }
  case KEX_OP_DIV:
    if (kex_dtype_is_int(dt)) {
      int64_t y = as_i(s[1]);
      double q = y ? as_f(s[0]) / (double)y : 0; /* out of int64's range (or NaN): wrap as the cast would on the device, no UB */
      r = kex_const_int(q >= -9223372036854775808.0 && q < 9223372036854775808.0 ? (int64_t)q : INT64_MIN);
    } else {
      double y = as_f(s[1]);
      r = kex_const_float(y != 0 ? as_f(s[0]) / y : as_f(s[0]) * INFINITY);
    }
    break;
  case KEX_OP_WHERE: r = truthy(s[0]) ? s[1] : s[2]; break;
  case KEX_OP_MULACC: {
    kex_const t[2] = {s[0], s[1]};
    kex_const m = kex_exec_alu(KEX_OP_MUL, dt, t, 2);
    kex_const u[2] = {m, s[2]};
    r = kex_exec_alu(KEX_OP_ADD, dt, u, 2);
    break;
  }
  default: break;
  }
  return kex_const_truncate(r, dt);
}

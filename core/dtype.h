/*
 * dtype.h - tinygrad 0.9.0's scalar dtypes (spec section 1).
 *
 * The enum order is the priority order, so `a < b` compares like tinygrad's
 * ordered DType dataclass for scalars.  kex_const is a Python-like scalar
 * (int, float or bool) as LazyBuffer CONST args hold them.
 */
#ifndef KEX_CORE_DTYPE_H
#define KEX_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* XX(enum, graph name, itemsize, C name, OpenCL name, CLANG name, fmt, kind) kind: b=bool i=int u=uint f=float */
#define KEX_DTYPE_MAP(XX)                                                      \
  XX(BOOL, "bool", 1, "bool", "bool", "_Bool", '?', 'b')                       \
  XX(INT8, "int8", 1, "char", "char", "char", 'b', 'i')                        \
  XX(UINT8, "uint8", 1, "unsigned char", "uchar", "unsigned char", 'B', 'u')   \
  XX(INT16, "int16", 2, "short", "short", "short", 'h', 'i')                   \
  XX(UINT16, "uint16", 2, "unsigned short", "ushort", "unsigned short", 'H', 'u') \
  XX(INT32, "int32", 4, "int", "int", "int", 'i', 'i')                         \
  XX(UINT32, "uint32", 4, "unsigned int", "uint", "unsigned int", 'I', 'u')    \
  XX(INT64, "int64", 8, "long", "long", "long", 'l', 'i')                      \
  XX(UINT64, "uint64", 8, "unsigned long", "ulong", "unsigned long", 'L', 'u') \
  XX(FLOAT16, "float16", 2, "half", "half", "__fp16", 'e', 'f')                \
  XX(BFLOAT16, "bfloat16", 2, "__bf16", "__bf16", "__bf16", 0, 'f')            \
  XX(FLOAT32, "float32", 4, "float", "float", "float", 'f', 'f')               \
  XX(FLOAT64, "float64", 8, "double", "double", "double", 'd', 'f')

typedef enum kex_dtype {
#define XX(e, name, size, c, cl, clang, fmt, kind) KEX_DT_##e,
  KEX_DTYPE_MAP(XX)
#undef XX
  KEX_DT_COUNT
} kex_dtype;

typedef struct kex_dtype_info {
  const char *name;       /* graph-format name: "float32" */
  int itemsize;
  const char *c_name, *cl_name, *clang_name;
  char fmt;
  char kind; /* 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float */
} kex_dtype_info;

extern const kex_dtype_info kex_dtypes[KEX_DT_COUNT];

static inline int kex_dtype_size(kex_dtype d) { return kex_dtypes[d].itemsize; }
static inline bool kex_dtype_is_float(kex_dtype d) { return kex_dtypes[d].kind == 'f'; }
static inline bool kex_dtype_is_int(kex_dtype d) { return kex_dtypes[d].kind == 'i' || kex_dtypes[d].kind == 'u'; }
static inline bool kex_dtype_is_unsigned(kex_dtype d) { return kex_dtypes[d].kind == 'u'; }

/* Element i of a little-endian array of dtype d, as a double (NaN for a dtype out of range). */
double kex_dtype_element(kex_dtype d, const void *base, size_t i);

/* tinygrad repr name (dtypes.<name>): "float", "half", "int", ... */
const char *kex_dtype_tgname(kex_dtype d);
/* Graph-format name -> dtype; -1 when unknown. */
int kex_dtype_from_name(const char *name);

/* least_upper_dtype over the promotion lattice. */
kex_dtype kex_dtype_lub(kex_dtype a, kex_dtype b);
kex_dtype kex_dtype_least_upper_float(kex_dtype d);
kex_dtype kex_dtype_sum_acc(kex_dtype d);

/* A Python-like scalar. */
typedef enum { KEX_CONST_INT, KEX_CONST_FLOAT, KEX_CONST_BOOL } kex_const_kind;
typedef struct kex_const {
  kex_const_kind kind;
  union {
    int64_t i;
    double f;
    bool b;
  };
} kex_const;

static inline kex_const kex_const_int(int64_t v) { return (kex_const){.kind = KEX_CONST_INT, .i = v}; }
static inline kex_const kex_const_float(double v) { return (kex_const){.kind = KEX_CONST_FLOAT, .f = v}; }
static inline kex_const kex_const_bool(bool v) { return (kex_const){.kind = KEX_CONST_BOOL, .b = v}; }

double kex_const_as_double(kex_const c);
/* dtypes.as_const: int(v) for int dtypes, float(v) for floats, bool(v) else. */
kex_const kex_const_as(kex_const c, kex_dtype dt);
/* Truncate a value to what a dtype can hold, like tinygrad's ctypes truncation. */
kex_const kex_const_truncate(kex_const c, kex_dtype dt);
bool kex_const_eq(kex_const a, kex_const b);
/* Python tuple repr of n int64 values into buf, cut at len: "()", "(4,)", "(4, 4)".  Returns buf. */
const char *kex_tuple_repr(char *buf, size_t len, int n, const int64_t *v);
/* Python repr: 1, 1.0, inf, -inf, nan, True, False. */
int kex_const_repr(kex_const c, char *buf, size_t len);

#endif

/*
 * ops.h - tinygrad 0.9.0's op enums (spec section 2), in declaration order.
 *
 * One flat enum keeps the families contiguous so the KEX_OP_IS_* range tests
 * work; kex_op_name gives tinygrad's repr ("BinaryOps.ADD").  kex_exec_alu is
 * python_alu + dtype truncation, used by lazy const folding and the uop folder.
 */
#ifndef KEX_CORE_OPS_H
#define KEX_CORE_OPS_H

#include <stdbool.h>

#include "core/dtype.h"

/* XX(enum, family, name) */
#define KEX_OP_MAP(XX)          \
  XX(EXP2, UnaryOps, EXP2)      \
  XX(LOG2, UnaryOps, LOG2)      \
  XX(CAST, UnaryOps, CAST)      \
  XX(BITCAST, UnaryOps, BITCAST) \
  XX(SIN, UnaryOps, SIN)        \
  XX(SQRT, UnaryOps, SQRT)      \
  XX(NEG, UnaryOps, NEG)        \
  XX(ADD, BinaryOps, ADD)       \
  XX(SUB, BinaryOps, SUB)       \
  XX(MUL, BinaryOps, MUL)       \
  XX(DIV, BinaryOps, DIV)       \
  XX(MAX, BinaryOps, MAX)       \
  XX(MOD, BinaryOps, MOD)       \
  XX(CMPLT, BinaryOps, CMPLT)   \
  XX(CMPEQ, BinaryOps, CMPEQ)   \
  XX(XOR, BinaryOps, XOR)       \
  XX(WHERE, TernaryOps, WHERE)  \
  XX(MULACC, TernaryOps, MULACC) \
  XX(SUM, ReduceOps, SUM)       \
  XX(RMAX, ReduceOps, MAX)      \
  XX(LOAD, BufferOps, LOAD)     \
  XX(BCONST, BufferOps, CONST)  \
  XX(STORE, BufferOps, STORE)   \
  XX(EMPTY, LoadOps, EMPTY)     \
  XX(CONST, LoadOps, CONST)     \
  XX(COPY, LoadOps, COPY)       \
  XX(CONTIGUOUS, LoadOps, CONTIGUOUS) \
  XX(CUSTOM, LoadOps, CUSTOM)   \
  XX(ASSIGN, LoadOps, ASSIGN)   \
  XX(VIEW, LoadOps, VIEW)

typedef enum kex_op {
#define XX(e, fam, name) KEX_OP_##e,
  KEX_OP_MAP(XX)
#undef XX
  KEX_OP_COUNT
} kex_op;

#define KEX_OP_IS_UNARY(o) ((o) >= KEX_OP_EXP2 && (o) <= KEX_OP_NEG)
#define KEX_OP_IS_BINARY(o) ((o) >= KEX_OP_ADD && (o) <= KEX_OP_XOR)
#define KEX_OP_IS_TERNARY(o) ((o) == KEX_OP_WHERE || (o) == KEX_OP_MULACC)
#define KEX_OP_IS_ALU(o) ((o) <= KEX_OP_MULACC)
#define KEX_OP_IS_REDUCE(o) ((o) == KEX_OP_SUM || (o) == KEX_OP_RMAX)
#define KEX_OP_IS_BUFFER(o) ((o) >= KEX_OP_LOAD && (o) <= KEX_OP_STORE)
#define KEX_OP_IS_LOAD(o) ((o) >= KEX_OP_EMPTY && (o) <= KEX_OP_VIEW)
/* UNSAFE_PAD_OPS: ops that do not map 0 to 0. */
#define KEX_OP_IS_UNSAFE_PAD(o) \
  ((o) == KEX_OP_DIV || (o) == KEX_OP_CMPLT || (o) == KEX_OP_CMPEQ || (o) == KEX_OP_LOG2 || (o) == KEX_OP_EXP2)

/* "BinaryOps.ADD" */
const char *kex_op_name(kex_op op);
/* "ADD" (the member name only) */
const char *kex_op_short(kex_op op);

/*
 * python_alu on constants, the result truncated to out_dtype (spec section 2).
 * n = number of operands (1..3).  Returns the folded value.
 */
kex_const kex_exec_alu(kex_op op, kex_dtype out_dtype, const kex_const *src, int n);

#endif

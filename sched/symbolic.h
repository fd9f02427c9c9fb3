/*
 * symbolic.h - tinygrad 0.9.0's symbolic integer algebra (spec section 3).
 *
 * Nodes are immutable, allocated from the context's arena, and canonical as
 * tinygrad makes them: every constructor applies the same rewrite rules
 * (sum flattening and grouping, mul/div/mod/lt folds, create_lt_node) so the
 * resulting expression and its [min, max] bounds equal tinygrad's.  Two nodes
 * are equal iff their canonical renders (tinygrad's render(ctx="DEBUG")) are
 * equal; kex_sym_eq compares that way.
 *
 * Ownership: every node belongs to its kex_sym_ctx's arena and lives as long
 * as it.  Every constructor returns NULL when out of memory and accepts NULL
 * operands (returning NULL), so a chain of calls needs one check at the end.
 */
#ifndef KEX_SCHED_SYMBOLIC_H
#define KEX_SCHED_SYMBOLIC_H

#include <stdbool.h>
#include <stdint.h>

#include "core/arena.h"

typedef enum kex_sym_kind {
  KEX_SYM_NUM,
  KEX_SYM_VAR,
  KEX_SYM_MUL, /* a * b (int b) */
  KEX_SYM_DIV, /* a // b (int b > 0) */
  KEX_SYM_MOD, /* a % b (int b > 0) */
  KEX_SYM_LT,  /* a < b (int b, or node bn when bn != NULL) */
  KEX_SYM_SUM, /* nodes[0] + ... */
  KEX_SYM_AND, /* nodes[0] and ... */
} kex_sym_kind;

typedef struct kex_sym kex_sym;
struct kex_sym {
  kex_sym_kind kind;
  int64_t min, max;        /* bounds; NUM: min == max == value */
  const char *name;        /* VAR */
  const kex_sym *a;        /* MUL DIV MOD LT */
  int64_t b;               /* MUL DIV MOD LT (int operand) */
  const kex_sym *bn;       /* LT with a node right-hand side, else NULL */
  uint32_t n;              /* SUM AND */
  const kex_sym *const *nodes;
  const char *render;      /* canonical render, filled lazily by kex_sym_render */
};

typedef struct kex_sym_ctx {
  kex_arena *arena;
} kex_sym_ctx;

void kex_sym_ctx_init(kex_sym_ctx *ctx, kex_arena *arena);

const kex_sym *kex_sym_num(kex_sym_ctx *ctx, int64_t b);
/* Variable(name, lo, hi); lo == hi gives a NUM node. name is copied. */
const kex_sym *kex_sym_var(kex_sym_ctx *ctx, const char *name, int64_t lo, int64_t hi);

const kex_sym *kex_sym_add(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b);   /* Node.sum([a, b]) */
const kex_sym *kex_sym_add_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
const kex_sym *kex_sym_sub(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b);
const kex_sym *kex_sym_mul_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
const kex_sym *kex_sym_div_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);     /* floor division, b != 0 */
const kex_sym *kex_sym_mod_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);     /* b > 0 */
const kex_sym *kex_sym_neg(kex_sym_ctx *ctx, const kex_sym *a);
/* Operators: a < b, a >= b, a <= b, a > b with int right-hand sides (Node.__lt__ etc.). */
const kex_sym *kex_sym_lt_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
const kex_sym *kex_sym_ge_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
const kex_sym *kex_sym_le_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
const kex_sym *kex_sym_gt_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b);
/* create_lt_node / create_ge_node (used for mask validity). */
const kex_sym *kex_sym_create_lt(kex_sym_ctx *ctx, const kex_sym *lhs, int64_t b);
const kex_sym *kex_sym_create_ge(kex_sym_ctx *ctx, const kex_sym *lhs, int64_t b);
/* Node.sum(nodes) / Node.ands(nodes). */
const kex_sym *kex_sym_sum(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n);
const kex_sym *kex_sym_ands(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n);

static inline bool kex_sym_is_num(const kex_sym *s) { return s->min == s->max; }
/* bool(node): false iff min == max == 0. */
static inline bool kex_sym_truthy(const kex_sym *s) { return !(s->min == 0 && s->max == 0); }

/* Canonical render (tinygrad render(ctx="DEBUG")); arena-owned, cached. NULL on OOM. */
const char *kex_sym_render(kex_sym_ctx *ctx, const kex_sym *s);
/* Equality by canonical render. */
bool kex_sym_eq(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b);
/* Does variable `name` occur anywhere in s? */
bool kex_sym_has_var(const kex_sym *s, const char *name);

#endif

/*
 * symbolic.c - tinygrad 0.9.0's symbolic integer algebra (shape/symbolic.py).
 *
 * Every public constructor is one of tinygrad's operators and applies the
 * same rewrite rules in the same order, dispatching on the node kind exactly
 * where Python dispatches on the class (MulNode.__floordiv__,
 * SumNode.__mod__, ...), and calling the generic Node method where Python
 * calls Node.__floordiv__/Node.__mod__ explicitly.  Integer arithmetic uses
 * Python's floor division and modulo.  Nodes are arena-owned and immutable
 * except for the lazily cached render string.
 *
 * Recursion: constructors recurse along the (small, bounded) expression
 * structure only; every rewrite strictly simplifies its argument, as in
 * tinygrad.
 */
#include "sched/symbolic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#define SUM_STACK 32

/* Python's a // b (floor). b != 0. */
static int64_t py_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

/* Python's a % b (sign of b). b != 0. */
static int64_t py_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

/* math.gcd: non-negative gcd of |a| and |b|. */
static int64_t py_gcd(int64_t a, int64_t b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

void kex_sym_ctx_init(kex_sym_ctx *ctx, kex_arena *arena) { ctx->arena = arena; }

static kex_sym *node_new(kex_sym_ctx *ctx, kex_sym_kind kind) {
  kex_sym *s = kex_arena_calloc(ctx->arena, 1, sizeof *s);
  if (s) s->kind = kind;
  return s;
}

const kex_sym *kex_sym_num(kex_sym_ctx *ctx, int64_t b) {
  kex_sym *s = node_new(ctx, KEX_SYM_NUM);
  if (s) s->min = s->max = b;
  return s;
}

const kex_sym *kex_sym_var(kex_sym_ctx *ctx, const char *name, int64_t lo, int64_t hi) {
  if (!name) return NULL;
  if (lo == hi) return kex_sym_num(ctx, lo);
  kex_sym *s = node_new(ctx, KEX_SYM_VAR);
  if (!s) return NULL;
  s->name = kex_arena_strdup(ctx->arena, name);
  if (!s->name) return NULL;
  s->min = lo;
  s->max = hi;
  return s;
}

/* create_node: a node whose bounds collapse is the NumNode of its min. */
static const kex_sym *create_node(kex_sym_ctx *ctx, kex_sym *s) {
  if (!s) return NULL;
  if (s->min == s->max) return kex_sym_num(ctx, s->min);
  return s;
}

/*
 * Raw `a <op> b` (b a number) for MUL, DIV, MOD and LT, with the bounds of
 * tinygrad's MulNode/DivNode/ModNode/LtNode.get_bounds (no folding); NULL on
 * OOM.
 */
static kex_sym *raw_binary(kex_sym_ctx *ctx, kex_sym_kind kind, const kex_sym *a, int64_t b) {
  kex_sym *s = node_new(ctx, kind);
  if (!s) return NULL;
  s->a = a;
  s->b = b;
  switch (kind) {
  case KEX_SYM_MUL:
    s->min = (b >= 0 ? a->min : a->max) * b;
    s->max = (b >= 0 ? a->max : a->min) * b;
    break;
  case KEX_SYM_DIV:
    s->min = py_div(a->min, b);
    s->max = py_div(a->max, b);
    break;
  case KEX_SYM_MOD:
    if (a->max - a->min >= b || (a->min != a->max && py_mod(a->min, b) >= py_mod(a->max, b))) {
      s->min = 0;
      s->max = b - 1;
    } else {
      s->min = py_mod(a->min, b);
      s->max = py_mod(a->max, b);
    }
    break;
  default: /* KEX_SYM_LT */
    if (a->max < b) s->min = s->max = 1;
    else if (a->min >= b) s->min = s->max = 0;
    else {
      s->min = 0;
      s->max = 1;
    }
    break;
  }
  return s;
}

/* Node array copy into the arena; NULL on OOM. */
static const kex_sym *const *dup_nodes(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n) {
  return kex_arena_memdup(ctx->arena, nodes, (size_t)n * sizeof *nodes);
}

/* A node over a copy of nodes[n] (SUM, AND), bounds still to set; NULL on OOM. */
static kex_sym *list_node(kex_sym_ctx *ctx, kex_sym_kind kind, const kex_sym *const *nodes, uint32_t n) {
  kex_sym *s = node_new(ctx, kind);
  if (!s) return NULL;
  s->nodes = dup_nodes(ctx, nodes, n);
  if (!s->nodes) return NULL;
  s->n = n;
  return s;
}

static kex_sym *raw_sum(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n) {
  kex_sym *s = list_node(ctx, KEX_SYM_SUM, nodes, n);
  if (!s) return NULL;
  for (uint32_t i = 0; i < n; i++) {
    s->min += nodes[i]->min;
    s->max += nodes[i]->max;
  }
  return s;
}

static kex_sym *raw_and(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n) {
  kex_sym *s = list_node(ctx, KEX_SYM_AND, nodes, n);
  if (!s) return NULL;
  s->min = nodes[0]->min;
  s->max = nodes[0]->max;
  for (uint32_t i = 1; i < n; i++) {
    if (nodes[i]->min < s->min) s->min = nodes[i]->min;
    if (nodes[i]->max > s->max) s->max = nodes[i]->max;
  }
  return s;
}

/* ---- render and equality ---- */

static int cmp_str(const void *x, const void *y) { return strcmp(*(const char *const *)x, *(const char *const *)y); }

/*
 * Canonical render (render(ctx="DEBUG")), cached in the node.  Recurses
 * along the expression.  NULL on OOM.
 */
const char *kex_sym_render(kex_sym_ctx *ctx, const kex_sym *s) {
  if (!s) return NULL;
  if (s->render) return s->render;
  char *out = NULL;
  char small[96];
  switch (s->kind) {
  case KEX_SYM_NUM:
    snprintf(small, sizeof small, "%lld", (long long)s->min);
    out = kex_arena_strdup(ctx->arena, small);
    break;
  case KEX_SYM_VAR: {
    size_t len = strlen(s->name) + 48;
    out = kex_arena_alloc(ctx->arena, len);
    if (out) snprintf(out, len, "%s[%lld-%lld]", s->name, (long long)s->min, (long long)s->max);
    break;
  }
  case KEX_SYM_MUL:
  case KEX_SYM_DIV:
  case KEX_SYM_MOD:
  case KEX_SYM_LT: {
    const char *a = kex_sym_render(ctx, s->a);
    const char *b = s->bn ? kex_sym_render(ctx, s->bn) : NULL;
    if (!a || (s->bn && !b)) return NULL;
    const char *op = s->kind == KEX_SYM_MUL ? "*" : s->kind == KEX_SYM_DIV ? "//" : s->kind == KEX_SYM_MOD ? "%" : "<";
    if (!b) {
      snprintf(small, sizeof small, "%lld", (long long)s->b);
      b = small;
    }
    size_t len = strlen(a) + strlen(b) + 6;
    out = kex_arena_alloc(ctx->arena, len);
    if (out) snprintf(out, len, "(%s%s%s)", a, op, b);
    break;
  }
  case KEX_SYM_SUM:
  case KEX_SYM_AND: {
    const char *sep = s->kind == KEX_SYM_SUM ? "+" : " and ";
    const char **parts = kex_malloc((s->n ? s->n : 1) * sizeof *parts);
    if (!parts) return NULL;
    size_t len = 3;
    for (uint32_t i = 0; i < s->n; i++) {
      parts[i] = kex_sym_render(ctx, s->nodes[i]);
      if (!parts[i]) {
        kex_free(parts);
        return NULL;
      }
      len += strlen(parts[i]) + strlen(sep);
    }
    qsort(parts, s->n, sizeof *parts, cmp_str);
    out = kex_arena_alloc(ctx->arena, len);
    if (out) {
      char *p = out;
      *p++ = '(';
      for (uint32_t i = 0; i < s->n; i++) {
        if (i) p = stpcpy(p, sep);
        p = stpcpy(p, parts[i]);
      }
      *p++ = ')';
      *p = 0;
    }
    kex_free(parts);
    break;
  }
  }
  ((kex_sym *)s)->render = out;
  return out;
}

/*
 * Node equality as tinygrad's __eq__ (render keys).  Different kinds never
 * render alike, and equal renders imply equal bounds, so those are checked
 * first.  An OOM while rendering compares unequal.
 */
bool kex_sym_eq(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b) {
  if (a == b) return true;
  if (!a || !b || a->kind != b->kind || a->min != b->min || a->max != b->max) return false;
  if (a->kind == KEX_SYM_NUM) return true;
  if (a->kind == KEX_SYM_VAR) return strcmp(a->name, b->name) == 0;
  const char *ra = kex_sym_render(ctx, a), *rb = kex_sym_render(ctx, b);
  return ra && rb && strcmp(ra, rb) == 0;
}

bool kex_sym_has_var(const kex_sym *s, const char *name) {
  if (!s) return false;
  switch (s->kind) {
  case KEX_SYM_NUM: return false;
  case KEX_SYM_VAR: return strcmp(s->name, name) == 0;
  case KEX_SYM_SUM:
  case KEX_SYM_AND:
    for (uint32_t i = 0; i < s->n; i++)
      if (kex_sym_has_var(s->nodes[i], name)) return true;
    return false;
  default: return kex_sym_has_var(s->a, name) || (s->bn && kex_sym_has_var(s->bn, name));
  }
}

/* ---- Node.sum ---- */

typedef struct sum_group {
  const kex_sym *a;
  int64_t k;
} sum_group;

/*
 * Node.sum(nodes): drop zeros, flatten, fold numbers, group MulNodes by
 * their operand in first-appearance order.  NULL on OOM.
 */
const kex_sym *kex_sym_sum(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (!nodes[i]) return NULL;
  uint32_t live = 0, last = 0, flat = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (nodes[i]->max || nodes[i]->min) {
      live++;
      last = i;
      flat += nodes[i]->kind == KEX_SYM_SUM ? nodes[i]->n : 1;
    }
  }
  if (live == 0) return kex_sym_num(ctx, 0);
  if (live == 1) return nodes[last];

  sum_group stack_groups[SUM_STACK];
  const kex_sym *stack_terms[SUM_STACK + 1];
  sum_group *groups = stack_groups;
  const kex_sym **terms = stack_terms;
  const kex_sym *ret = NULL;
  if (flat > SUM_STACK) {
    groups = kex_malloc(flat * sizeof *groups);
    terms = kex_malloc((flat + 1) * sizeof *terms);
    if (!groups || !terms) goto out;
  }
  uint32_t ng = 0;
  int64_t num = 0;
  for (uint32_t i = 0; i < n; i++) {
    const kex_sym *x = nodes[i];
    if (!(x->max || x->min)) continue;
    uint32_t cnt = x->kind == KEX_SYM_SUM ? x->n : 1;
    for (uint32_t j = 0; j < cnt; j++) {
      const kex_sym *t = x->kind == KEX_SYM_SUM ? x->nodes[j] : x;
      /* SumNodes are always flat (every one is built here), so one level suffices */
      const kex_sym *key;
      int64_t k;
      if (t->kind == KEX_SYM_NUM) {
        num += t->min;
        continue;
      } else if (t->kind == KEX_SYM_MUL) {
        key = t->a;
        k = t->b;
      } else {
        key = t;
        k = 1;
      }
      uint32_t g = 0;
      while (g < ng && !kex_sym_eq(ctx, groups[g].a, key)) g++;
      if (g == ng) {
        groups[ng].a = key;
        groups[ng].k = 0;
        ng++;
      }
      groups[g].k += k;
    }
  }
  uint32_t nt = 0;
  for (uint32_t g = 0; g < ng; g++) {
    if (groups[g].k == 0) continue;
    const kex_sym *t =
        groups[g].k == 1 ? groups[g].a : raw_binary(ctx, KEX_SYM_MUL, groups[g].a, groups[g].k);
    if (!t) goto out;
    terms[nt++] = t;
  }
  if (num) {
    if (!(terms[nt++] = kex_sym_num(ctx, num))) goto out;
  }
  if (nt > 1) ret = create_node(ctx, raw_sum(ctx, terms, nt));
  else if (nt == 1) ret = terms[0];
  else ret = kex_sym_num(ctx, 0);
out:
  if (groups != stack_groups) kex_free(groups);
  if (terms != stack_terms) kex_free(terms);
  return ret;
}

const kex_sym *kex_sym_add(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b) {
  const kex_sym *v[2] = {a, b};
  return kex_sym_sum(ctx, v, 2);
}

const kex_sym *kex_sym_add_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  if (!a) return NULL;
  return kex_sym_add(ctx, a, kex_sym_num(ctx, b));
}

/* ---- mul ---- */

/* x * b with the class dispatch of NumNode/MulNode/SumNode.__mul__. */
const kex_sym *kex_sym_mul_int(kex_sym_ctx *ctx, const kex_sym *x, int64_t b) {
  if (!x) return NULL;
  switch (x->kind) {
  case KEX_SYM_NUM: return kex_sym_num(ctx, x->min * b);
  case KEX_SYM_MUL: return kex_sym_mul_int(ctx, x->a, x->b * b);
  case KEX_SYM_SUM: {
    const kex_sym *stack[SUM_STACK];
    const kex_sym **v = x->n > SUM_STACK ? kex_malloc(x->n * sizeof *v) : stack;
    const kex_sym *ret = NULL;
    if (!v) return NULL;
    for (uint32_t i = 0; i < x->n; i++)
      if (!(v[i] = kex_sym_mul_int(ctx, x->nodes[i], b))) goto out;
    ret = kex_sym_sum(ctx, v, x->n);
  out:
    if (v != stack) kex_free(v);
    return ret;
  }
  default:
    if (b == 0) return kex_sym_num(ctx, 0);
    if (b == 1) return x;
    return create_node(ctx, raw_binary(ctx, KEX_SYM_MUL, x, b));
  }
}

const kex_sym *kex_sym_neg(kex_sym_ctx *ctx, const kex_sym *a) { return kex_sym_mul_int(ctx, a, -1); }

const kex_sym *kex_sym_sub(kex_sym_ctx *ctx, const kex_sym *a, const kex_sym *b) {
  if (!a || !b) return NULL;
  return kex_sym_add(ctx, a, kex_sym_neg(ctx, b));
}

/* ---- floordiv ---- */

static const kex_sym *floordiv(kex_sym_ctx *ctx, const kex_sym *x, int64_t b, bool factoring);
static const kex_sym *mod(kex_sym_ctx *ctx, const kex_sym *x, int64_t b);

/* Node.__floordiv__(x, b, factoring_allowed), the generic method. */
static const kex_sym *node_floordiv(kex_sym_ctx *ctx, const kex_sym *x, int64_t b, bool factoring) {
  if (!x) return NULL;
  if (b < 0) return floordiv(ctx, kex_sym_mul_int(ctx, x, -1), -b, factoring);
  if (b == 1) return x;
  if (x->min < 0) {
    int64_t off = py_div(x->min, b);
    const kex_sym *shifted = floordiv(ctx, kex_sym_add_int(ctx, x, -off * b), b, false);
    return kex_sym_add_int(ctx, shifted, off);
  }
  return create_node(ctx, raw_binary(ctx, KEX_SYM_DIV, x, b));
}

/* SumNode.__floordiv__ with an int divisor. */
static const kex_sym *sum_floordiv(kex_sym_ctx *ctx, const kex_sym *x, int64_t b, bool factoring) {
  if (b == 1) return x;
  if (!factoring) return node_floordiv(ctx, x, b, factoring);
  const kex_sym *stack_fully[SUM_STACK], *stack_rest[SUM_STACK];
  const kex_sym **fully = stack_fully, **rest = stack_rest;
  const kex_sym *ret = NULL;
  if (x->n > SUM_STACK) {
    fully = kex_malloc(2 * x->n * sizeof *fully);
    rest = kex_malloc(x->n * sizeof *rest);
    if (!fully || !rest) goto out;
  }
  uint32_t nf = 0, nr = 0;
  int64_t g = b, divisor = 1;
  for (uint32_t i = 0; i < x->n; i++) {
    const kex_sym *t = x->nodes[i];
    if (t->kind == KEX_SYM_NUM || t->kind == KEX_SYM_MUL) {
      int64_t tb = t->kind == KEX_SYM_NUM ? t->min : t->b;
      if (py_mod(tb, b) == 0) {
        if (!(fully[nf++] = floordiv(ctx, t, b, true))) goto out;
      } else {
        if (t->kind == KEX_SYM_NUM && py_div(tb, b) != 0) {
          int64_t d = py_div(tb, b);
          if (!(fully[nf++] = kex_sym_num(ctx, d))) goto out;
          tb = tb - b * d;
          if (!(t = kex_sym_num(ctx, tb))) goto out;
        }
        rest[nr++] = t;
        g = py_gcd(g, tb);
        if (t->kind == KEX_SYM_MUL && divisor == 1 && py_mod(b, tb) == 0) divisor = tb;
      }
    } else {
      rest[nr++] = t;
      g = 1;
    }
  }
  const kex_sym *sf = kex_sym_sum(ctx, fully, nf);
  const kex_sym *sr = kex_sym_sum(ctx, rest, nr);
  if (g > 1) ret = kex_sym_add(ctx, sf, floordiv(ctx, floordiv(ctx, sr, g, true), py_div(b, g), true));
  else if (divisor > 1)
    ret = kex_sym_add(ctx, sf, floordiv(ctx, floordiv(ctx, sr, divisor, true), py_div(b, divisor), true));
  else ret = kex_sym_add(ctx, sf, node_floordiv(ctx, sr, b, true));
out:
  if (fully != stack_fully) kex_free(fully);
  if (rest != stack_rest) kex_free(rest);
  return ret;
}

/* x // b dispatched on x's class (MulNode, DivNode, ModNode, SumNode, else Node). */
static const kex_sym *floordiv(kex_sym_ctx *ctx, const kex_sym *x, int64_t b, bool factoring) {
  if (!x) return NULL;
  switch (x->kind) {
  case KEX_SYM_MUL:
    if (py_mod(x->b, b) == 0) return kex_sym_mul_int(ctx, x->a, py_div(x->b, b));
    if (py_mod(b, x->b) == 0 && x->b > 0) return floordiv(ctx, x->a, py_div(b, x->b), true);
    return node_floordiv(ctx, x, b, factoring);
  case KEX_SYM_DIV: return floordiv(ctx, x->a, x->b * b, true);
  case KEX_SYM_MOD:
    if (py_mod(x->b, b) == 0) return mod(ctx, floordiv(ctx, x->a, b, true), py_div(x->b, b));
    return node_floordiv(ctx, x, b, factoring);
  case KEX_SYM_SUM: return sum_floordiv(ctx, x, b, factoring);
  default: return node_floordiv(ctx, x, b, factoring);
  }
}

const kex_sym *kex_sym_div_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  if (b == 0) return NULL;
  return floordiv(ctx, a, b, true);
}

/* ---- mod ---- */

/* Node.__mod__(x, b), the generic method (b > 0). */
static const kex_sym *node_mod(kex_sym_ctx *ctx, const kex_sym *x, int64_t b) {
  if (!x) return NULL;
  if (b == 1) return kex_sym_num(ctx, 0);
  if (x->min >= 0 && x->max < b) return x;
  if (py_div(x->min, b) == py_div(x->max, b)) return kex_sym_add_int(ctx, x, -(b * py_div(x->min, b)));
  if (x->min < 0) return mod(ctx, kex_sym_add_int(ctx, x, -(py_div(x->min, b) * b)), b);
  return create_node(ctx, raw_binary(ctx, KEX_SYM_MOD, x, b));
}

/* x % b dispatched on x's class. */
static const kex_sym *mod(kex_sym_ctx *ctx, const kex_sym *x, int64_t b) {
  if (!x) return NULL;
  switch (x->kind) {
  case KEX_SYM_MUL: return node_mod(ctx, kex_sym_mul_int(ctx, x->a, py_mod(x->b, b)), b);
  case KEX_SYM_MOD:
    if (py_mod(x->b, b) == 0) return mod(ctx, x->a, b);
    return node_mod(ctx, x, b);
  case KEX_SYM_SUM: {
    const kex_sym *stack[SUM_STACK];
    const kex_sym **v = x->n > SUM_STACK ? kex_malloc(x->n * sizeof *v) : stack;
    const kex_sym *ret = NULL;
    if (!v) return NULL;
    for (uint32_t i = 0; i < x->n; i++) {
      const kex_sym *t = x->nodes[i];
      v[i] = (t->kind == KEX_SYM_NUM || t->kind == KEX_SYM_MUL) ? mod(ctx, t, b) : t;
      if (!v[i]) goto out;
    }
    ret = node_mod(ctx, kex_sym_sum(ctx, v, x->n), b);
  out:
    if (v != stack) kex_free(v);
    return ret;
  }
  default: return node_mod(ctx, x, b);
  }
}

const kex_sym *kex_sym_mod_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  if (b <= 0) return NULL;
  return mod(ctx, a, b);
}

/* ---- comparisons ---- */

const kex_sym *kex_sym_lt_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  if (!a) return NULL;
  return create_node(ctx, raw_binary(ctx, KEX_SYM_LT, a, b));
}

const kex_sym *kex_sym_ge_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  return kex_sym_lt_int(ctx, kex_sym_neg(ctx, a), -b + 1);
}

const kex_sym *kex_sym_le_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) { return kex_sym_lt_int(ctx, a, b + 1); }

const kex_sym *kex_sym_gt_int(kex_sym_ctx *ctx, const kex_sym *a, int64_t b) {
  return kex_sym_lt_int(ctx, kex_sym_neg(ctx, a), -b);
}

/*
 * create_lt_node(lhs, b): moves constants of a sum to the right, divides
 * the sum by the gcd of its large positive multipliers when the remaining
 * terms fit below it, and turns (a*k) < b into a*sign(k) < ceil(b/|k|).
 */
const kex_sym *kex_sym_create_lt(kex_sym_ctx *ctx, const kex_sym *lhs, int64_t b) {
  if (!lhs) return NULL;
  if (lhs->kind == KEX_SYM_SUM) {
    const kex_sym *stack[SUM_STACK * 2];
    uint32_t cap = lhs->n;
    const kex_sym **buf = cap * 2 > SUM_STACK * 2 ? kex_malloc(cap * 2 * sizeof *buf) : stack;
    const kex_sym *ret = NULL;
    if (!buf) return NULL;
    const kex_sym **muls = buf, **others = buf + cap;
    uint32_t nm = 0, no = 0;
    for (uint32_t i = 0; i < lhs->n; i++) {
      const kex_sym *t = lhs->nodes[i];
      if (t->kind == KEX_SYM_NUM) b -= t->min;
      else others[no++] = t;
    }
    const kex_sym *nl = kex_sym_sum(ctx, others, no);
    if (!nl) goto out;
    const kex_sym *const *ns = nl->kind == KEX_SYM_SUM ? nl->nodes : &nl;
    uint32_t nn = nl->kind == KEX_SYM_SUM ? nl->n : 1;
    no = 0;
    for (uint32_t i = 0; i < nn; i++) {
      const kex_sym *t = ns[i];
      if (t->kind == KEX_SYM_MUL && t->b > 0 && t->max >= b) muls[nm++] = t;
      else others[no++] = t;
    }
    if (nm) {
      int64_t g = b;
      for (uint32_t i = 0; i < nm; i++) g = py_gcd(g, muls[i]->b);
      const kex_sym *all_others = kex_sym_sum(ctx, others, no);
      if (!all_others) goto out;
      if (all_others->min >= 0 && all_others->max < g) {
        for (uint32_t i = 0; i < nm; i++)
          if (!(muls[i] = floordiv(ctx, muls[i], g, true))) goto out;
        nl = kex_sym_sum(ctx, muls, nm);
        if (!nl) goto out;
        b = py_div(b, g);
      }
    }
    ret = nl->kind == KEX_SYM_SUM ? create_node(ctx, raw_binary(ctx, KEX_SYM_LT, nl, b))
                                  : kex_sym_create_lt(ctx, nl, b);
  out:
    if (buf != stack) kex_free(buf);
    return ret;
  }
  if (lhs->kind == KEX_SYM_MUL) {
    if (lhs->b == -1) return create_node(ctx, raw_binary(ctx, KEX_SYM_LT, lhs, b));
    int64_t sgn = lhs->b > 0 ? 1 : -1, k = lhs->b > 0 ? lhs->b : -lhs->b;
    const kex_sym *a = kex_sym_mul_int(ctx, lhs->a, sgn);
    if (!a) return NULL;
    return create_node(ctx, raw_binary(ctx, KEX_SYM_LT, a, py_div(b + k - 1, k)));
  }
  return create_node(ctx, raw_binary(ctx, KEX_SYM_LT, lhs, b));
}

const kex_sym *kex_sym_create_ge(kex_sym_ctx *ctx, const kex_sym *lhs, int64_t b) {
  return kex_sym_create_lt(ctx, kex_sym_neg(ctx, lhs), -b + 1);
}

/* Node.ands(nodes). */
const kex_sym *kex_sym_ands(kex_sym_ctx *ctx, const kex_sym *const *nodes, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (!nodes[i]) return NULL;
  if (n == 0) return kex_sym_num(ctx, 1);
  if (n == 1) return nodes[0];
  for (uint32_t i = 0; i < n; i++)
    if (!kex_sym_truthy(nodes[i])) return kex_sym_num(ctx, 0);
  const kex_sym *stack[SUM_STACK];
  const kex_sym **v = n > SUM_STACK ? kex_malloc(n * sizeof *v) : stack;
  const kex_sym *ret = NULL;
  if (!v) return NULL;
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (nodes[i]->min != nodes[i]->max) v[m++] = nodes[i];
  if (m > 1) ret = create_node(ctx, raw_and(ctx, v, m));
  else if (m == 1) ret = v[0];
  else ret = kex_sym_num(ctx, 1);
  if (v != stack) kex_free(v);
  return ret;
}

/*
 * render.c - uops_to_cstyle (tinygrad 0.9.0 renderer/cstyle.py, spec 10)
 * with two dialects: OpenCL C (tinygrad's OpenCLRenderer) and C for the
 * cpu device (tinygrad's ClangRenderer, adapted to devices/device.h: the
 * buffers come in `void **bufs` and the outermost global loop runs over
 * [gidx_start, gidx_end), the range this thread of the pool owns; in a
 * reduction kernel the second global loop is opened around that one, see
 * swap_loops).
 *
 * The walk is linear over g->linear; r[u] is the expression of each uop.
 * ALUs and CASTs with one user are inlined into it (MAX never is), as in
 * tinygrad, except that an expression longer than INLINE_MAX bytes, or whose
 * brackets nest deeper than NEST_MAX, is given its own variable: a long
 * elementwise chain would otherwise become one quadratic-size expression,
 * nested as deep as the kernel's AST, which clang (PoCL's compiler) refuses
 * past 256 brackets.  So no statement nests brackets more than a few levels
 * past NEST_MAX, whatever the AST's depth, while the kernels of
 * ../shared/cases (at most 10 deep) render exactly as tinygrad renders them.
 */
#include "codegen/render.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/strbuf.h"
#include "codegen/lower.h"

#define INLINE_MAX 4000
#define NEST_MAX 64 /* brackets; clang's -fbracket-depth default is 256 */

typedef struct rctx {
  int dialect;
  const kex_uop_graph *g;
  kex_arena arena;
  const char **r;     /* by uop id */
  uint32_t *children; /* by uop id */
  const kex_uop **user; /* by uop id: its last user in g->linear */
  kex_strbuf body;
  int depth;
  int cnt_alu, cnt_val, cnt_acc, cnt_ridx, cnt_cast, cnt_precast;
  bool uses_half, oom;
  /* the C dialect's loop interchange (swap_loops): the second global loop, opened around the first */
  const kex_uop *swap_outer, *swap_inner;
  /* the C dialect's run of consecutive plain stores, written in address order by flush_stores */
  struct pending_store {
    const kex_uop *buf;
    const char *base; /* the index's non-constant part ("" when the index is a constant) */
    int64_t off;      /* its constant part */
    const char *line; /* the statement */
    uint32_t seq;     /* position in the run: the tie-break, and the order kept when two offsets are equal */
  } *pend;
  uint32_t npend, cap_pend;
  int pend_depth;
} rctx;

static char *fmt(rctx *c, const char *f, ...) __attribute__((format(printf, 2, 3)));
static char *fmt(rctx *c, const char *f, ...) {
  va_list ap, ap2;
  va_start(ap, f);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, f, ap);
  va_end(ap);
  char *s = n >= 0 ? kex_arena_alloc(&c->arena, (size_t)n + 1) : NULL;
  if (s) vsnprintf(s, (size_t)n + 1, f, ap2);
  else c->oom = true;
  va_end(ap2);
  return s ? s : "";
}

static void flush_stores(rctx *c);

static void kk(rctx *c, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void kk(rctx *c, const char *f, ...) {
  if (c->npend) flush_stores(c); /* any other statement ends a run of stores, before it */
  for (int i = 0; i < c->depth; i++) kex_strbuf_printf(&c->body, "  ");
  va_list ap;
  va_start(ap, f);
  kex_strbuf_vprintf(&c->body, f, ap);
  va_end(ap);
  kex_strbuf_printf(&c->body, "\n");
}

static const char *scalar_name(int dialect, kex_dtype dt) {
  if (dialect == KEX_DIALECT_OPENCL) return kex_dtypes[dt].cl_name;
  if (dt == KEX_DT_FLOAT16) return "_Float16";
  return kex_dtypes[dt].clang_name;
}

static const char *type_name(rctx *c, kex_udtype d) {
  if (d.dt == KEX_DT_FLOAT16) c->uses_half = true;
  const char *s = scalar_name(c->dialect, d.dt);
  return d.vec > 1 ? fmt(c, "%s%d", s, d.vec) : s;
}

/* strip_parens: "(a+b)" -> "a+b" when the outer parens match. */
static const char *strip_parens(rctx *c, const char *s) {
  size_t n = strlen(s);
  if (n < 2 || s[0] != '(' || s[n - 1] != ')') return s;
  const char *o = strchr(s + 1, '('), *cl = strchr(s + 1, ')');
  long io = o ? (long)(o - s - 1) : -1, ic = cl ? (long)(cl - s - 1) : -1;
  if (!(io < ic)) return s;
  return fmt(c, "%.*s", (int)(n - 2), s + 1);
}

/* Python repr of a float, shortest round-trip ("2.0", "1e-05", "0.1"). */
static void float_repr(double x, char *buf, size_t len) {
  char tmp[64];
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
    if (strtod(tmp, NULL) == x) break;
  }
  if (p > 17) p = 17;
  int e = (int)floor(log10(fabs(x)));
  snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
  e = atoi(strchr(tmp, 'e') + 1);
  if (x == 0) {
    snprintf(buf, len, "%s", signbit(x) ? "-0.0" : "0.0");
    return;
  }
  if (e < -4 || e >= 16) {
    /* mantissa digits without trailing zeros, exponent with at least 2 digits */
    char m[40];
    snprintf(m, sizeof m, "%.*e", p - 1, x);
    char *ep = strchr(m, 'e');
    *ep = 0;
    snprintf(buf, len, "%se%c%02d", m, e < 0 ? '-' : '+', abs(e));
  } else {
    int dec = p - 1 - e;
    if (dec < 0) dec = 0;
    snprintf(buf, len, "%.*f", dec, x);
    if (!strchr(buf, '.')) strncat(buf, ".0", len - strlen(buf) - 1);
  }
}

/* render_const(x, dtype) without the negative-value parens. */
static const char *render_const(rctx *c, kex_const v, kex_udtype d) {
  kex_const x = kex_const_as(v, d.dt);
  char val[96];
  bool plain = d.vec == 1 && (d.dt == KEX_DT_FLOAT32 || d.dt == KEX_DT_INT32 || d.dt == KEX_DT_BOOL);
  if (kex_dtype_is_float(d.dt) && isnan(x.f)) {
    snprintf(val, sizeof val, "NAN");
  } else if (kex_dtype_is_float(d.dt) && isinf(x.f)) {
    snprintf(val, sizeof val, "%sINFINITY", x.f < 0 ? "-" : "");
  } else if (d.dt == KEX_DT_FLOAT64) {
    float_repr(x.f, val, sizeof val);
    plain = true;
  } else if (d.dt == KEX_DT_BOOL) {
    snprintf(val, sizeof val, "%d", x.b ? 1 : 0);
  } else if (d.dt == KEX_DT_FLOAT32 && d.vec == 1) {
    float_repr(x.f, val, sizeof val);
    strncat(val, "f", sizeof val - strlen(val) - 1);
  } else if (kex_dtype_is_float(d.dt)) {
    float_repr(x.f, val, sizeof val);
  } else if (d.dt == KEX_DT_INT32 && x.i == INT32_MIN) {
    snprintf(val, sizeof val, "(-2147483647-1)");
  } else if (d.dt == KEX_DT_INT64 && x.i == INT64_MIN) {
    snprintf(val, sizeof val, "(-9223372036854775807ll-1)");
  } else if (d.dt == KEX_DT_UINT64) {
    snprintf(val, sizeof val, "%lluull", (unsigned long long)x.i);
  } else if (d.dt == KEX_DT_INT64) {
    snprintf(val, sizeof val, "%lldll", (long long)x.i);
  } else if (kex_dtype_is_unsigned(d.dt)) {
    snprintf(val, sizeof val, "%lluu", (unsigned long long)(uint64_t)x.i);
  } else {
    snprintf(val, sizeof val, "%lld", (long long)x.i);
  }
  if (plain) return fmt(c, "%s", val);
  const char *t = type_name(c, d);
  if (d.vec > 1) {
    kex_strbuf b = {0};
    kex_strbuf_printf(&b, "(%s)(", t);
    for (int i = 0; i < d.vec; i++) kex_strbuf_printf(&b, "%s%s", i ? "," : "", val);
    kex_strbuf_printf(&b, ")");
    const char *s = b.oom ? NULL : fmt(c, "%s", b.p);
    if (!s) c->oom = true;
    kex_free(b.p);
    return s ? s : "";
  }
  return fmt(c, "(%s)(%s)", t, val);
}

static bool const_negative(kex_const v) {
  switch (v.kind) {
  case KEX_CONST_INT: return v.i < 0;
  case KEX_CONST_FLOAT: return v.f < 0;
  default: return false;
  }
}

/* A unary math function: OpenCL builtins are overloaded; C picks the float/double name. */
static const char *render_math(rctx *c, const char *fn, const char *x, kex_udtype d) {
  if (c->dialect == KEX_DIALECT_OPENCL) return fmt(c, "%s(%s)", fn, x);
  if (d.dt == KEX_DT_FLOAT64) return fmt(c, "%s(%s)", fn, x);
  if (d.dt == KEX_DT_FLOAT32) return fmt(c, "%sf(%s)", fn, x);
  return fmt(c, "((%s)%sf((float)(%s)))", type_name(c, d), fn, x);
}

static const char *code_for_op(rctx *c, kex_op op, const char **o, kex_udtype d, const kex_uop *u) {
  bool ocl = c->dialect == KEX_DIALECT_OPENCL;
  switch (op) {
  case KEX_OP_NEG: return d.dt == KEX_DT_BOOL ? fmt(c, "(!%s)", o[0]) : fmt(c, "(-%s)", o[0]);
  case KEX_OP_SQRT: return render_math(c, "sqrt", o[0], d);
  case KEX_OP_EXP2: return render_math(c, "exp2", o[0], d);
  case KEX_OP_LOG2: return render_math(c, "log2", o[0], d);
  case KEX_OP_SIN: return render_math(c, "sin", o[0], d);
  case KEX_OP_ADD: return fmt(c, "(%s+%s)", o[0], o[1]);
  case KEX_OP_SUB: return fmt(c, "(%s-%s)", o[0], o[1]);
  case KEX_OP_MUL: return fmt(c, "(%s*%s)", o[0], o[1]);
  case KEX_OP_DIV: return fmt(c, "(%s/%s)", o[0], o[1]);
  case KEX_OP_MAX:
    if (d.dt == KEX_DT_BOOL) return fmt(c, "(%s||%s)", o[0], o[1]);
    if (ocl) return fmt(c, "max(%s,%s)", o[0], o[1]);
    return fmt(c, "((%s>%s)?%s:%s)", o[0], o[1], o[0], o[1]);
  case KEX_OP_MOD:
    if (kex_dtype_is_float(d.dt)) {
      /* a half MOD goes through fmodf: each operand is converted, not the comma expression "(float)(a,b)" */
      if (!ocl && d.dt == KEX_DT_FLOAT16)
        return fmt(c, "((%s)fmodf((float)(%s),(float)(%s)))", type_name(c, d), o[0], o[1]);
      return render_math(c, "fmod", fmt(c, "%s,%s", o[0], o[1]), d);
    }
    return fmt(c, "(%s%%%s)", o[0], o[1]);
  case KEX_OP_CMPLT: return fmt(c, "(%s<%s)", o[0], o[1]);
  case KEX_OP_CMPEQ: return fmt(c, "(%s==%s)", o[0], o[1]);
  case KEX_OP_XOR: return fmt(c, "(%s^%s)", o[0], o[1]);
  case KEX_OP_WHERE: return fmt(c, "(%s?%s:%s)", o[0], o[1], o[2]);
  case KEX_OP_MULACC: return fmt(c, "((%s*%s)+%s)", o[0], o[1], o[2]);
  default: break;
  }
  (void)u;
  c->oom = true;
  return "";
}

static const char *render_cast(rctx *c, const char **xs, uint32_t n, kex_udtype d) {
  const char *t = type_name(c, d);
  if (n == 1) return fmt(c, "(%s)(%s)", t, xs[0]);
  kex_strbuf b = {0};
  kex_strbuf_printf(&b, "(%s)(", t);
  for (uint32_t i = 0; i < n; i++) kex_strbuf_printf(&b, "%s%s", i ? "," : "", xs[i]);
  kex_strbuf_printf(&b, ")");
  const char *s = b.oom ? NULL : fmt(c, "%s", b.p);
  kex_free(b.p);
  if (!s) c->oom = true;
  return s ? s : "";
}

static const char *ptr_prefix(rctx *c, const kex_uop *buf) {
  if (c->dialect != KEX_DIALECT_OPENCL) return "";
  return buf->uop == KEX_UOP_DEFINE_LOCAL ? "__local " : "__global ";
}

static const char *render_load(rctx *c, kex_udtype out, const kex_uop *buf, const char *idx) {
  const char *bn = c->r[buf->id];
  if (out.vec > 1) {
    const char *v = fmt(c, "*((%s%s*)(%s+%s))", ptr_prefix(c, buf), type_name(c, out), bn, idx);
    return render_cast(c, &v, 1, out);
  }
  return fmt(c, "%s[%s]", bn, idx);
}

/* The op of ALU uop u, or -1 when u is not an ALU. */
static int alu_op(const kex_uop *u) { return u->uop == KEX_UOP_ALU ? (int)u->arg.op : -1; }

/* The only user of u when it has exactly one, else NULL. */
static const kex_uop *sole_user(const rctx *c, const kex_uop *u) {
  return c->children[u->id] == 1 ? c->user[u->id] : NULL;
}

/* True when u is a float ADD, SUB or MULACC: what clang contracts a float MUL operand into (an FMA). */
static bool contracts(const kex_uop *u) {
  int op = u ? alu_op(u) : -1;
  return (op == KEX_OP_ADD || op == KEX_OP_SUB || op == KEX_OP_MULACC) && kex_dtype_is_float(u->dtype.dt);
}

/*
 * True when u may stay inlined past NEST_MAX and INLINE_MAX: a float MUL
 * whose only user is an ADD/SUB/MULACC (directly or through a NEG, which
 * clang may fold into the FMA too), or such a NEG.  OpenCL C contracts
 * a*b+c into an FMA only within one expression (FP_CONTRACT ON), so giving
 * the MUL its own variable would round the product separately and change
 * the kernel's numbers; the user, one or two operators up, takes the
 * variable instead.
 */
static bool keeps_fma(const rctx *c, const kex_uop *u) {
  const kex_uop *v = sole_user(c, u);
  if (!v || !kex_dtype_is_float(u->dtype.dt)) return false;
  if (alu_op(u) == KEX_OP_MUL) return contracts(v) || (alu_op(v) == KEX_OP_NEG && contracts(sole_user(c, v)));
  return alu_op(u) == KEX_OP_NEG && alu_op(u->vin[0]) == KEX_OP_MUL && contracts(v);
}

/* How deep brackets ((), [] and {}) nest in s: what clang's -fbracket-depth counts. */
static uint32_t bracket_depth(const char *s) {
  uint32_t d = 0, m = 0;
  for (; *s; s++) {
    if (*s == '(' || *s == '[' || *s == '{') {
      if (++d > m) m = d;
    } else if ((*s == ')' || *s == ']' || *s == '}') && d) {
      d--;
    }
  }
  return m;
}

/*
 * u's value val, inlined where it is used when may_inline allows it, it is
 * used at most once, and it is short (INLINE_MAX) and its brackets nest at
 * most NEST_MAX deep (keeps_fma's MUL and NEG stay inlined past both, by
 * at most two operators: their user takes the variable); otherwise a
 * variable <prefix>N (N from *counter) of u's dtype defined here.  Returns
 * what stands for u.
 */
static const char *inline_or_var(rctx *c, const kex_uop *u, const char *val, bool may_inline, const char *prefix,
                                 int *counter) {
  if (may_inline && c->children[u->id] <= 1 &&
      ((strlen(val) <= INLINE_MAX && bracket_depth(val) <= NEST_MAX) || keeps_fma(c, u)))
    return val;
  const char *nm = fmt(c, "%s%d", prefix, (*counter)++);
  kk(c, "%s %s = %s;", type_name(c, u->dtype), nm, val);
  return nm;
}

/* What stands for a CONST uop: its value, in parens when negative. */
static const char *const_expr(rctx *c, const kex_uop *u) {
  const char *v = render_const(c, u->arg.c, u->dtype);
  return const_negative(kex_const_as(u->arg.c, u->dtype.dt)) ? fmt(c, "(%s)", v) : v;
}

static int cmp_pending(const void *a, const void *b) {
  const struct pending_store *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * Write the pending run of stores, sorted by address when their offsets
 * are distinct (else in program order).  The run is the stores of an
 * upcast tile: one buffer, one base index, a constant offset each, with no
 * other statement between them, so no store's value or address depends on
 * another's and distinct addresses make their order free.  The order is
 * not free for gcc: its SLP vectorizer seeds from stores to consecutive
 * addresses, and a tile whose upcasts were applied columns, rows, columns
 * (UPCAST(1,4) UPCAST(0,4) UPCAST(1,4)) stored each row in pieces of 4, so
 * that matmul ran 3.6x slower than the same tile applied columns first
 * (221 against 59 ms on one core, bench/results/cpu-kernels.md).
 */
static void flush_stores(rctx *c) {
  uint32_t n = c->npend;
  int depth = c->depth;
  c->npend = 0; /* before kk below, which would flush again */
  qsort(c->pend, n, sizeof *c->pend, cmp_pending);
  bool distinct = true;
  for (uint32_t i = 1; i < n; i++) distinct = distinct && c->pend[i].off != c->pend[i - 1].off;
  if (!distinct) /* back to program order */
    for (uint32_t i = 0; i < n; i++)
      while (c->pend[i].seq != i) {
        struct pending_store t = c->pend[c->pend[i].seq];
        c->pend[c->pend[i].seq] = c->pend[i];
        c->pend[i] = t;
      }
  c->depth = c->pend_depth;
  for (uint32_t i = 0; i < n; i++) kk(c, "%s", c->pend[i].line);
  c->depth = depth;
}

/*
 * A plain scalar store of the C dialect joins the pending run (flush_stores)
 * instead of being written at once: true when it did.  Its index must be a
 * base plus a constant (or either alone), and the run's buffer, base and
 * depth its own; a store that differs ends the run before it.
 */
static bool queue_store(rctx *c, const kex_uop *buf, const kex_uop *idx, const char *line) {
  const char *base = "";
  int64_t off = 0;
  if (idx->uop == KEX_UOP_CONST) {
    off = kex_const_as(idx->arg.c, KEX_DT_INT64).i;
  } else if (idx->uop == KEX_UOP_ALU && idx->arg.op == KEX_OP_ADD && idx->nvin == 2 &&
             idx->vin[1]->uop == KEX_UOP_CONST) {
    base = c->r[idx->vin[0]->id];
    off = kex_const_as(idx->vin[1]->arg.c, KEX_DT_INT64).i;
  } else {
    base = c->r[idx->id];
  }
  if (c->npend && (c->pend[0].buf != buf || strcmp(c->pend[0].base, base) != 0 || c->pend_depth != c->depth))
    flush_stores(c);
  if (c->npend == c->cap_pend) {
    uint32_t cap = c->cap_pend ? 2 * c->cap_pend : 64;
    struct pending_store *p = kex_arena_alloc(&c->arena, cap * sizeof *p);
    if (!p) {
      c->oom = true;
      return false;
    }
    if (c->npend) memcpy(p, c->pend, c->npend * sizeof *p);
    c->pend = p;
    c->cap_pend = cap;
  }
  c->pend_depth = c->depth;
  c->pend[c->npend] = (struct pending_store){buf, base, off, line, c->npend};
  c->npend++;
  return true;
}

/*
 * The C dialect's traversal of the output tiles: in a reduction kernel
 * whose first global loop (the pool's range) holds the second one and
 * nothing else but index arithmetic, the second is opened around the
 * first, so a thread walks its range of the first dimension for each value
 * of the second.  Global iterations are independent (each writes its own
 * outputs, from a whole reduction of its own), so the order changes no
 * number; what it changes is reuse: consecutive tiles of a matmul share a
 * column strip of B, which then stays in L2 across the range instead of
 * being read again from L3 for every row block (bench/results/cpu-kernels.md).
 * Kernels without a reduction loop keep the row-major walk (they stream).
 * Sets c->swap_outer / c->swap_inner, or leaves them NULL.
 */
static void swap_loops(rctx *c) {
  const kex_uop *const *lin = (const kex_uop *const *)c->g->linear;
  uint32_t n = c->g->nlinear, ia = n, ib, ea = n, eb = n;
  bool reduce = false;
  if (c->dialect != KEX_DIALECT_CPU) return;
  for (uint32_t i = 0; i < n; i++) {
    kex_uop_kind k = lin[i]->uop;
    if (k == KEX_UOP_IF || k == KEX_UOP_BARRIER) return;
    if (k == KEX_UOP_RANGE && ia == n) ia = i;
  }
  if (ia == n || lin[ia]->arg.i[0] != 1 || lin[ia]->arg.i[1] != 0) return;
  for (ib = ia + 1; ib < n; ib++) {
    kex_uop_kind k = lin[ib]->uop;
    if (k != KEX_UOP_ALU && k != KEX_UOP_CONST && k != KEX_UOP_CAST) break;
  }
  if (ib == n || lin[ib]->uop != KEX_UOP_RANGE || lin[ib]->arg.i[0] != 1) return;
  if (lin[ib]->vin[0]->uop != KEX_UOP_CONST || lin[ib]->vin[1]->uop != KEX_UOP_CONST) return;
  for (uint32_t i = ib + 1; i < n; i++) {
    const kex_uop *u = lin[i];
    if (u->uop == KEX_UOP_RANGE && u->arg.i[0] != 1 && eb == n) reduce = true;
    if (u->uop == KEX_UOP_ENDRANGE && u->vin[0] == lin[ib]) eb = i;
    if (u->uop == KEX_UOP_ENDRANGE && u->vin[0] == lin[ia]) ea = i;
  }
  if (!reduce || eb == n || ea != eb + 1) return;
  c->swap_outer = lin[ia];
  c->swap_inner = lin[ib];
  for (int i = 0; i < 2; i++) c->r[lin[ib]->vin[i]->id] = const_expr(c, lin[ib]->vin[i]);
}

static int emit(rctx *c, const kex_uop *u, kex_error *err) {
  const char **r = c->r;
  const kex_uop *const *vin = u->vin;
  switch (u->uop) {
  case KEX_UOP_IF:
    kk(c, "if (%s) {", r[vin[0]->id]);
    c->depth++;
    break;
  case KEX_UOP_BARRIER:
    if (c->dialect != KEX_DIALECT_OPENCL) return kex_err_set(err, KEX_EUNSUPPORTED, "render: BARRIER on cpu");
    kk(c, "barrier(CLK_LOCAL_MEM_FENCE);");
    break;
  case KEX_UOP_ENDRANGE:
    if (u->vin[0] == c->swap_inner) break; /* closed with the first global loop */
    if (c->swap_inner && u->vin[0] == c->swap_outer) {
      c->depth--;
      kk(c, "}");
    }
    c->depth--;
    kk(c, "}");
    break;
  case KEX_UOP_ENDIF:
    c->depth--;
    kk(c, "}");
    break;
  case KEX_UOP_STORE: {
    const kex_uop *buf = vin[0], *val = vin[2];
    if (u->nvin > 3) {
      kk(c, "if (%s) {", r[vin[3]->id]);
      c->depth++;
    }
    const char *idx = strip_parens(c, r[vin[1]->id]);
    if (val->dtype.vec > 1)
      kk(c, "*((%s%s*)(%s+%s)) = %s;", ptr_prefix(c, buf), type_name(c, val->dtype), r[buf->id], idx, r[val->id]);
    else if (c->dialect != KEX_DIALECT_CPU || u->nvin > 3 ||
             !queue_store(c, buf, vin[1], fmt(c, "%s[%s] = %s;", r[buf->id], idx, r[val->id])))
      kk(c, "%s[%s] = %s;", r[buf->id], idx, r[val->id]);
    if (u->nvin > 3) {
      c->depth--;
      kk(c, "}");
    }
    break;
  }
  case KEX_UOP_RANGE: {
    if (u == c->swap_inner) break; /* opened with the first global loop, around it */
    const char *nm = fmt(c, "ridx%d", c->cnt_ridx++);
    r[u->id] = nm;
    if (c->dialect == KEX_DIALECT_CPU && u->arg.i[0] == 1 && u->arg.i[1] == 0) {
      if (c->depth != 1)
        return kex_err_set(err, KEX_EINTERNAL, "render: the outer global loop is not the outermost statement");
      if (c->swap_inner) {
        const kex_uop *in = c->swap_inner;
        const char *n2 = fmt(c, "ridx%d", c->cnt_ridx++);
        r[in->id] = n2;
        kk(c, "for (int %s = %s; %s < %s; %s++) {", n2, r[in->vin[0]->id], n2, r[in->vin[1]->id], n2);
        c->depth++;
      }
      kk(c, "for (int %s = gidx_start; %s < gidx_end; %s++) {", nm, nm, nm);
    } else {
      kk(c, "for (int %s = %s; %s < %s; %s++) {", nm, r[vin[0]->id], nm, r[vin[1]->id], nm);
    }
    c->depth++;
    break;
  }
  case KEX_UOP_ALU: {
    const char *o[3];
    for (uint32_t i = 0; i < u->nvin; i++) {
      const kex_uop *v = vin[i];
      bool same = (u->arg.op == KEX_OP_ADD || u->arg.op == KEX_OP_MUL || u->arg.op == KEX_OP_XOR) &&
                  v->uop == KEX_UOP_ALU && v->arg.op == u->arg.op;
      o[i] = same ? strip_parens(c, r[v->id]) : r[v->id];
    }
    const char *val = code_for_op(c, u->arg.op, o, u->dtype, u);
    r[u->id] = inline_or_var(c, u, val, u->arg.op != KEX_OP_MAX, "alu", &c->cnt_alu);
    break;
  }
  case KEX_UOP_SPECIAL: {
    if (c->dialect != KEX_DIALECT_OPENCL) return kex_err_set(err, KEX_EUNSUPPORTED, "render: SPECIAL on cpu");
    const char *nm = u->arg.name;
    const char *fn = nm[0] == 'g' ? "get_group_id" : nm[0] == 'l' ? "get_local_id" : "get_global_id";
    kk(c, "int %s = %s(%lld); /* %lld */", nm, fn, (long long)u->arg.i[0], (long long)u->arg.i[1]);
    r[u->id] = nm;
    break;
  }
  case KEX_UOP_LOAD: {
    const char *val = render_load(c, u->dtype, vin[0], strip_parens(c, r[vin[1]->id]));
    if (u->nvin > 3 && vin[2]->uop != KEX_UOP_BARRIER && vin[2]->uop != KEX_UOP_IF)
      val = fmt(c, "(%s?%s:%s)", r[vin[2]->id], val, r[vin[3]->id]);
    r[u->id] = inline_or_var(c, u, val, false, "val", &c->cnt_val);
    break;
  }
  case KEX_UOP_PHI:
    kk(c, "%s = %s;", r[vin[0]->id], r[vin[1]->id]);
    r[u->id] = r[vin[0]->id];
    break;
  case KEX_UOP_CAST:
  case KEX_UOP_BITCAST: {
    const char *val;
    if (u->uop == KEX_UOP_BITCAST) {
      const char *pc = fmt(c, "precast%d", c->cnt_precast++);
      kk(c, "%s %s = %s;", type_name(c, vin[0]->dtype), pc, r[vin[0]->id]);
      if (c->dialect == KEX_DIALECT_OPENCL) {
        val = fmt(c, "as_%s(%s)", type_name(c, u->dtype), pc);
      } else {
        const char *t = type_name(c, u->dtype);
        val = fmt(c, "({ %s _b; __builtin_memcpy(&_b, &%s, sizeof(_b)); _b; })", t, pc);
      }
    } else {
      const char *xs[16];
      if (u->nvin > 16) return kex_err_set(err, KEX_EUNSUPPORTED, "render: CAST of %u values", u->nvin);
      for (uint32_t i = 0; i < u->nvin; i++) xs[i] = r[vin[i]->id];
      val = render_cast(c, xs, u->nvin, u->dtype);
    }
    r[u->id] = inline_or_var(c, u, val, true, "cast", &c->cnt_cast);
    break;
  }
  case KEX_UOP_DEFINE_LOCAL:
    if (c->dialect != KEX_DIALECT_OPENCL) return kex_err_set(err, KEX_EUNSUPPORTED, "render: DEFINE_LOCAL on cpu");
    kk(c, "__attribute__ ((aligned (16))) __local %s %s[%lld];", type_name(c, kex_ud(u->dtype.dt)), u->arg.name,
       (long long)u->arg.i[0]);
    r[u->id] = u->arg.name;
    break;
  case KEX_UOP_DEFINE_GLOBAL:
    r[u->id] = fmt(c, "data%lld", (long long)u->arg.i[0]);
    break;
  case KEX_UOP_DEFINE_ACC: {
    const char *nm = fmt(c, "acc%d", c->cnt_acc++);
    kk(c, "%s %s = %s;", type_name(c, u->dtype), nm, render_const(c, u->arg.c, u->dtype));
    r[u->id] = nm;
    break;
  }
  case KEX_UOP_CONST:
    r[u->id] = const_expr(c, u);
    break;
  case KEX_UOP_GEP: {
    static const char xyzw[] = "xyzw";
    if (vin[0]->dtype.vec > 4)
      r[u->id] = fmt(c, "%s[%lld]", r[vin[0]->id], (long long)u->arg.i[0]);
    else
      r[u->id] = fmt(c, "%s.%c", r[vin[0]->id], xyzw[u->arg.i[0] & 3]);
    break;
  }
  default:
    return kex_err_set(err, KEX_EINTERNAL, "render: cannot render %s", kex_uop_name(u->uop));
  }
  return 0;
}

int kex_render_cstyle(int dialect, const char *name, const kex_uop_graph *g, char **src, kex_error *err) {
  rctx c;
  memset(&c, 0, sizeof c);
  c.dialect = dialect;
  c.g = g;
  c.depth = 1;
  kex_arena_init(&c.arena, 0);
  int rc = 0;
  kex_strbuf out = {0};
  *src = NULL;
  c.r = kex_calloc(g->n ? g->n : 1, sizeof *c.r);
  c.children = kex_calloc(g->n ? g->n : 1, sizeof *c.children);
  c.user = kex_calloc(g->n ? g->n : 1, sizeof *c.user);
  if (!c.r || !c.children || !c.user) goto oom;
  for (uint32_t i = 0; i < g->nlinear; i++) {
    for (uint32_t j = 0; j < g->linear[i]->nvin; j++) {
      c.children[g->linear[i]->vin[j]->id]++;
      c.user[g->linear[i]->vin[j]->id] = g->linear[i];
    }
    if (g->linear[i]->dtype.vec && g->linear[i]->dtype.dt == KEX_DT_FLOAT16) c.uses_half = true;
  }
  swap_loops(&c);
  if (c.oom) goto oom;
  for (uint32_t i = 0; i < g->nlinear && !rc; i++) {
    if (g->linear[i]->uop == KEX_UOP_UNMUL) {
      rc = kex_err_set(err, KEX_EINTERNAL, "render: UNMUL left after folding");
      break;
    }
    rc = emit(&c, g->linear[i], err);
    if (c.oom || c.body.oom) goto oom;
  }
  if (c.npend) flush_stores(&c);
  if (c.oom || c.body.oom) goto oom;
  if (rc) goto out;
  /* header */
  if (dialect == KEX_DIALECT_OPENCL) {
    if (c.uses_half) kex_strbuf_printf(&out, "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n");
    kex_strbuf_printf(&out, "__kernel void %s(", name);
    int np = 0;
    for (uint32_t i = 0; i < g->nlinear; i++) {
      const kex_uop *u = g->linear[i];
      if (u->uop != KEX_UOP_DEFINE_GLOBAL) continue;
      kex_strbuf_printf(&out, "%s%s__global %s* data%lld", np++ ? ", " : "", u->arg.i[1] ? "" : "const ",
             scalar_name(dialect, u->dtype.dt), (long long)u->arg.i[0]);
      if (u->dtype.dt == KEX_DT_FLOAT16) c.uses_half = true;
    }
    kex_strbuf_printf(&out, ") {\n");
  } else {
    /* no target pragma: the cpu device compiles for its CPU's ISA level (FMA included where it has one, as
       tinygrad's CLANG does with -march=native), so the source does not depend on the machine rendering it */
    kex_strbuf_printf(&out, "#include <math.h>\n");
    kex_strbuf_printf(&out, "void %s(void **bufs, const int *ints, int gidx_start, int gidx_end) {\n", name);
    int np = 0;
    for (uint32_t i = 0; i < g->nlinear; i++) {
      const kex_uop *u = g->linear[i];
      if (u->uop != KEX_UOP_DEFINE_GLOBAL) continue;
      const char *t = scalar_name(dialect, u->dtype.dt), *cq = u->arg.i[1] ? "" : "const ";
      kex_strbuf_printf(&out, "  %s%s* restrict data%lld = (%s%s*)bufs[%d];\n", cq, t, (long long)u->arg.i[0], cq, t, np++);
    }
    kex_strbuf_printf(&out, "  (void)ints; (void)gidx_start; (void)gidx_end;\n");
  }
  kex_strbuf_printf(&out, "%s}\n", c.body.p ? c.body.p : "");
  if (out.oom) goto oom;
  *src = out.p;
  out.p = NULL;
  goto out;
oom:
  rc = kex_err_set(err, KEX_ENOMEM, "render: out of memory");
out:
  kex_free(out.p);
  kex_free(c.body.p);
  kex_free(c.r);
  kex_free(c.children);
  kex_free(c.user);
  kex_arena_destroy(&c.arena);
  return rc;
}

/*
 * uops.c - the UOp graph: hash-consing, tinygrad 0.9.0's constant_folder
 * (spec 9 step 1), graph_rewrite to a fixpoint and the linearize toposort
 * (spec 9 step 2).  Every walk uses an explicit stack.
 */
#include "codegen/uops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"

static const char *uop_names[] = {
#define XX(n) #n,
    KEX_UOP_MAP(XX)
#undef XX
};

const char *kex_uop_name(kex_uop_kind k) { return (unsigned)k < KEX_UOP_COUNT ? uop_names[k] : "?"; }

static const kex_dict_type uop_table_type; /* below, with the hash-consing */

void kex_uop_graph_init(kex_uop_graph *g) {
  memset(g, 0, sizeof *g);
  kex_arena_init(&g->arena, 0);
  g->table = kex_dict_make(&uop_table_type);
}

void kex_uop_graph_free(kex_uop_graph *g) {
  kex_arena_destroy(&g->arena);
  kex_free(g->nodes);
  kex_dict_free(&g->table);
  kex_free(g->linear);
  memset(g, 0, sizeof *g);
}

/* ---- hash-consing ---- */

static uint64_t const_bits(kex_const c) {
  switch (c.kind) {
  case KEX_CONST_INT: return (uint64_t)c.i;
  case KEX_CONST_BOOL: return c.b;
  default: {
    uint64_t b;
    memcpy(&b, &c.f, sizeof b);
    return b;
  }
  }
}

static bool const_same(kex_const a, kex_const b) { return a.kind == b.kind && const_bits(a) == const_bits(b); }

static uint64_t uop_hash(kex_uop_kind uop, kex_udtype dt, const kex_uop *const *vin, uint32_t nvin,
                         const kex_uop_arg *a) {
  uint64_t h = kex_hash_u64(uop, ((uint64_t)dt.dt << 16) | ((uint64_t)dt.vec << 8) | dt.ptr);
  for (uint32_t i = 0; i < nvin; i++) h = kex_hash_u64(h, vin[i]->id);
  h = kex_hash_u64(h, a->op);
  h = kex_hash_u64(h, const_bits(a->c) ^ ((uint64_t)a->c.kind << 60));
  h = kex_hash_u64(h, (uint64_t)a->i[0]);
  h = kex_hash_u64(h, (uint64_t)a->i[1]);
  if (a->name) h = kex_hash_u64(h, kex_hash_bytes(a->name, strlen(a->name), 0));
  return h;
}

static bool uop_same(const kex_uop *u, kex_uop_kind uop, kex_udtype dt, const kex_uop *const *vin, uint32_t nvin,
                     const kex_uop_arg *a) {
  if (u->uop != uop || !kex_ud_eq(u->dtype, dt) || u->nvin != nvin) return false;
  for (uint32_t i = 0; i < nvin; i++)
    if (u->vin[i] != vin[i]) return false;
  const kex_uop_arg *b = &u->arg;
  if (a->op != b->op || !const_same(a->c, b->c) || a->i[0] != b->i[0] || a->i[1] != b->i[1]) return false;
  if (!a->name != !b->name) return false;
  return !a->name || !strcmp(a->name, b->name);
}

/* A uop not yet made: what kex_uop_add was asked for. */
typedef struct uop_probe {
  kex_uop_kind uop;
  kex_udtype dtype;
  const kex_uop *const *vin;
  uint32_t nvin;
  const kex_uop_arg *arg;
} uop_probe;

static bool uop_entry_same(const void *entry, const void *probe) {
  const uop_probe *p = probe;
  return uop_same(*(const kex_uop *const *)entry, p->uop, p->dtype, p->vin, p->nvin, p->arg);
}

static const kex_dict_type uop_table_type = {sizeof(const kex_uop *), uop_entry_same, 1024};

const kex_uop *kex_uop_add(kex_uop_graph *g, kex_uop_kind uop, kex_udtype dtype, const kex_uop *const *vin,
                           uint32_t nvin, const kex_uop_arg *arg) {
  static const kex_uop_arg none = {0};
  if (g->oom) return NULL;
  for (uint32_t i = 0; i < nvin; i++)
    if (!vin[i]) return NULL;
  if (!arg) arg = &none;
  kex_uop_arg a = *arg;
  uint64_t h = uop_hash(uop, dtype, vin, nvin, &a);
  uop_probe p = {uop, dtype, vin, nvin, &a};
  bool found;
  const kex_uop **slot = kex_dict_insert(&g->table, h, &p, &found);
  if (!slot) goto oom;
  if (found) return *slot;
  if (kex_grow(&g->nodes, g->n, &g->cap, sizeof *g->nodes, 1024)) goto oom;
  kex_uop *u = kex_arena_alloc(&g->arena, sizeof *u);
  const kex_uop **v = nvin ? kex_arena_alloc(&g->arena, nvin * sizeof *v) : NULL;
  if (!u || (nvin && !v)) goto oom;
  if (nvin) memcpy(v, vin, nvin * sizeof *v);
  if (a.name && !(a.name = kex_arena_strdup(&g->arena, a.name))) goto oom;
  *u = (kex_uop){uop, dtype, nvin, v, a, g->n, h};
  g->nodes[g->n++] = u;
  *slot = u;
  return u;
oom:
  if (slot && !found) kex_dict_cancel(&g->table, slot);
  g->oom = true;
  return NULL;
}

const kex_uop *kex_uop_const(kex_uop_graph *g, kex_udtype dtype, kex_const c) {
  kex_uop_arg a = {0};
  a.c = kex_const_as(c, dtype.dt);
  return kex_uop_add(g, KEX_UOP_CONST, dtype, NULL, 0, &a);
}

const kex_uop *kex_uop_const_int(kex_uop_graph *g, int64_t v) {
  return kex_uop_const(g, kex_ud(KEX_DT_INT32), kex_const_int(v));
}

const kex_uop *kex_uop_alu_dt(kex_uop_graph *g, kex_op op, kex_udtype dt, const kex_uop *a, const kex_uop *b,
                              const kex_uop *c) {
  const kex_uop *v[3] = {a, b, c};
  uint32_t n = c ? 3 : b ? 2 : 1;
  kex_uop_arg arg = {0};
  arg.op = op;
  return kex_uop_add(g, KEX_UOP_ALU, dt, v, n, &arg);
}

const kex_uop *kex_uop_alu(kex_uop_graph *g, kex_op op, const kex_uop *a, const kex_uop *b, const kex_uop *c) {
  const kex_uop *last = c ? c : b ? b : a;
  if (!a || !last) return NULL;
  kex_udtype dt = (op == KEX_OP_CMPLT || op == KEX_OP_CMPEQ) ? kex_ud(KEX_DT_BOOL) : last->dtype;
  return kex_uop_alu_dt(g, op, dt, a, b, c);
}

const kex_uop *kex_uop_1(kex_uop_graph *g, kex_uop_kind uop, kex_udtype dt, const kex_uop *a) {
  return kex_uop_add(g, uop, dt, &a, 1, NULL);
}

/* ---- constant_folder ---- */

static bool is_const(const kex_uop *u) { return u->uop == KEX_UOP_CONST; }
static bool is_alu(const kex_uop *u, kex_op op) { return u->uop == KEX_UOP_ALU && u->arg.op == op; }
/* UPat.const(v): a CONST whose value == v (Python ==: 0 == 0.0 == False). */
static bool const_is(const kex_uop *u, double v) {
  return is_const(u) && kex_const_as_double(u->arg.c) == v;
}
static bool const_eqv(const kex_uop *a, const kex_uop *b) {
  return kex_const_as_double(a->arg.c) == kex_const_as_double(b->arg.c);
}

/*
 * Does a uop that `match`es occur among u's ancestors (and u itself when
 * with_self)?  Explicit stack; 1, 0, or -1 on OOM.
 */
static int reaches(const kex_uop_graph *g, const kex_uop *u, bool with_self, bool (*match)(const kex_uop *x, const void *arg),
                   const void *arg) {
  uint8_t *seen = kex_calloc(g->n, 1);
  const kex_uop **st = kex_malloc((size_t)(g->n + 1) * sizeof *st);
  int found = 0;
  if (!seen || !st) {
    found = -1;
    goto out;
  }
  uint32_t sp = 0;
  if (with_self) {
    st[sp++] = u;
    seen[u->id] = 1;
  } else {
    for (uint32_t i = 0; i < u->nvin; i++)
      if (!seen[u->vin[i]->id]) {
        seen[u->vin[i]->id] = 1;
        st[sp++] = u->vin[i];
      }
  }
  while (sp && !found) {
    const kex_uop *x = st[--sp];
    if (match(x, arg)) {
      found = 1;
      break;
    }
    for (uint32_t i = 0; i < x->nvin; i++)
      if (!seen[x->vin[i]->id]) {
        seen[x->vin[i]->id] = 1;
        st[sp++] = x->vin[i];
      }
  }
out:
  kex_free(seen);
  kex_free(st);
  return found;
}

static bool is_target(const kex_uop *x, const void *target) { return x == target; }
static bool is_unmul(const kex_uop *x, const void *unused) { return (void)unused, x->uop == KEX_UOP_UNMUL; }

/* Does `target` occur among the parents (strict ancestors) of u?  -1 on OOM. */
static int depends_on(const kex_uop_graph *g, const kex_uop *u, const kex_uop *target) {
  return reaches(g, u, false, is_target, target);
}

static const kex_uop *neg(kex_uop_graph *g, const kex_uop *x) { return kex_uop_alu(g, KEX_OP_NEG, x, NULL, NULL); }
static const kex_uop *alu2(kex_uop_graph *g, kex_op op, const kex_uop *a, const kex_uop *b) {
  return kex_uop_alu(g, op, a, b, NULL);
}
static const kex_uop *cst(kex_uop_graph *g, kex_udtype dt, kex_const c) { return kex_uop_const(g, dt, c); }
static const kex_uop *cast_to(kex_uop_graph *g, const kex_uop *x, kex_udtype dt) {
  return kex_uop_1(g, KEX_UOP_CAST, dt, x);
}

/* loop_collapse (arange folding). */
static const kex_uop *loop_collapse(kex_uop_graph *g, const kex_uop *ls, const kex_uop *le, const kex_uop *compval,
                                    const kex_uop *idx, const kex_uop *mval, const kex_uop *multconst) {
  if (!is_const(ls) || kex_const_as_double(mval->arg.c) >= 0 || kex_const_as_double(ls->arg.c) != 0) return NULL;
  const kex_uop *range = alu2(g, KEX_OP_SUB, le, ls);
  const kex_uop *d = alu2(g, KEX_OP_DIV, alu2(g, KEX_OP_SUB, alu2(g, KEX_OP_SUB, idx, compval), mval), mval);
  const kex_uop *mx = alu2(g, KEX_OP_MAX, alu2(g, KEX_OP_ADD, d, range), ls);
  const kex_uop *mn = neg(g, alu2(g, KEX_OP_MAX, neg(g, le), neg(g, mx)));
  const kex_uop *v[2] = {alu2(g, KEX_OP_MUL, cast_to(g, mn, multconst->dtype), multconst), alu2(g, KEX_OP_SUB, le, ls)};
  return kex_uop_add(g, KEX_UOP_UNMUL, multconst->dtype, v, 2, NULL);
}

static const kex_uop *fold_where(kex_uop_graph *g, const kex_uop *u) {
  const kex_uop *c = u->vin[0], *a = u->vin[1], *b = u->vin[2];
  /* WHERE(CMPLT(ADD[idx, MUL[CONST mval, RANGE(ls, le)]], CONST compval), CONST multconst, CONST 0) */
  if (!g->no_loop_collapse && is_alu(c, KEX_OP_CMPLT) && is_const(c->vin[1]) && is_const(a) && const_is(b, 0) && is_alu(c->vin[0], KEX_OP_ADD)) {
    const kex_uop *add = c->vin[0];
    for (int p = 0; p < 2; p++) {
      const kex_uop *idx = add->vin[p], *mul = add->vin[1 - p];
      if (!is_alu(mul, KEX_OP_MUL)) continue;
      for (int q = 0; q < 2; q++) {
        const kex_uop *mval = mul->vin[q], *rng = mul->vin[1 - q];
        if (!is_const(mval) || rng->uop != KEX_UOP_RANGE) continue;
        const kex_uop *r = loop_collapse(g, rng->vin[0], rng->vin[1], c->vin[1], idx, mval, a);
        if (r) return r;
      }
    }
  }
  if (a == b) return a;
  if (is_const(c)) return kex_const_as_double(c->arg.c) != 0 ? a : b;
  return NULL;
}

static const kex_uop *fold_alu(kex_uop_graph *g, const kex_uop *u) {
  kex_op op = u->arg.op;
  const kex_uop *x = u->vin[0], *y = u->nvin > 1 ? u->vin[1] : NULL;
  if (op == KEX_OP_WHERE) {
    const kex_uop *r = fold_where(g, u);
    if (r) return r;
  }
  if (op == KEX_OP_MUL)
    for (int p = 0; p < 2; p++) { /* c1 * UNMUL[c2, v] -> v */
      const kex_uop *c1 = u->vin[p], *un = u->vin[1 - p];
      if (!is_const(c1) || un->uop != KEX_UOP_UNMUL) continue;
      for (int q = 0; q < 2; q++)
        if (is_const(un->vin[q]) && const_eqv(un->vin[q], c1)) return un->vin[1 - q];
    }
  if (op == KEX_OP_MAX)
    for (int p = 0; p < 2; p++) {
      const kex_uop *c = u->vin[p], *s = u->vin[1 - p];
      if (is_const(c) && s->uop == KEX_UOP_SPECIAL && (double)(s->arg.i[1] - 1) <= kex_const_as_double(c->arg.c))
        return c;
      if (is_const(s) && s->dtype.dt == KEX_DT_INT32 && s->dtype.vec == 1 && const_is(s, -2147483648.0)) return c;
    }
  if (op == KEX_OP_NEG && is_alu(x, KEX_OP_NEG)) return x->vin[0];
  if (op == KEX_OP_ADD)
    for (int p = 0; p < 2; p++)
      if (is_alu(u->vin[1 - p], KEX_OP_NEG)) return alu2(g, KEX_OP_SUB, u->vin[p], u->vin[1 - p]->vin[0]);
  if (op == KEX_OP_MUL)
    for (int p = 0; p < 2; p++)
      if (const_is(u->vin[p], -1)) return neg(g, u->vin[1 - p]);
  if (op == KEX_OP_CMPLT) {
    if (x->dtype.dt == KEX_DT_BOOL && is_const(y) && !kex_const_as_double(y->arg.c))
      return cst(g, kex_ud(KEX_DT_BOOL), kex_const_bool(false));
    if (is_const(x) && x->arg.c.kind == KEX_CONST_BOOL && x->arg.c.b && y->dtype.dt == KEX_DT_BOOL)
      return cst(g, kex_ud(KEX_DT_BOOL), kex_const_bool(false));
  }
  /* all-CONST ALU -> CONST */
  bool allc = true;
  for (uint32_t i = 0; i < u->nvin; i++) allc = allc && is_const(u->vin[i]);
  if (allc) {
    kex_const src[3];
    for (uint32_t i = 0; i < u->nvin; i++) src[i] = u->vin[i]->arg.c;
    if ((op == KEX_OP_DIV || op == KEX_OP_MOD) && kex_dtype_is_int(u->dtype.dt) && kex_const_as_double(src[1]) == 0)
      return NULL; /* leave an int division by zero to the device */
    return cst(g, u->dtype, kex_exec_alu(op, u->dtype.dt, src, (int)u->nvin));
  }
  if (op == KEX_OP_ADD)
    for (int p = 0; p < 2; p++)
      if (const_is(u->vin[p], 0)) return u->vin[1 - p];
  if (op == KEX_OP_SUB && const_is(y, 0)) return x;
  if (op == KEX_OP_MUL)
    for (int p = 0; p < 2; p++)
      if (const_is(u->vin[p], 1)) return u->vin[1 - p];
  if (op == KEX_OP_DIV && const_is(y, 1)) return x;
  if (op == KEX_OP_DIV && const_is(y, -1)) return neg(g, x);
  if (op == KEX_OP_MUL)
    for (int p = 0; p < 2; p++) {
      const kex_uop *c = u->vin[p], *v = u->vin[1 - p];
      if (const_is(c, 0)) return (is_const(v) && v->arg.c.kind == KEX_CONST_FLOAT && isnan(v->arg.c.f)) ? v : c;
    }
  if (op == KEX_OP_SUB && x == y) return cst(g, x->dtype, kex_const_int(0));
  if (op == KEX_OP_ADD)
    for (int p = 0; p < 2; p++) { /* (x+c1)+c2, (x-c1)+c2 */
      const kex_uop *in = u->vin[p], *c2 = u->vin[1 - p];
      if (!is_const(c2)) continue;
      if (is_alu(in, KEX_OP_ADD))
        for (int q = 0; q < 2; q++)
          if (is_const(in->vin[q])) {
            const kex_uop *xx = in->vin[1 - q];
            kex_const s[2] = {in->vin[q]->arg.c, c2->arg.c};
            return alu2(g, KEX_OP_ADD, xx, cst(g, xx->dtype, kex_exec_alu(KEX_OP_ADD, xx->dtype.dt, s, 2)));
          }
      if (is_alu(in, KEX_OP_SUB) && is_const(in->vin[1])) {
        const kex_uop *xx = in->vin[0];
        kex_const s[2] = {c2->arg.c, in->vin[1]->arg.c};
        return alu2(g, KEX_OP_ADD, xx, cst(g, xx->dtype, kex_exec_alu(KEX_OP_SUB, xx->dtype.dt, s, 2)));
      }
    }
  if (op == KEX_OP_CMPLT && is_alu(x, KEX_OP_NEG) && is_const(y) && y->dtype.dt == KEX_DT_INT32) {
    kex_const nc = kex_const_int(-y->arg.c.i);
    return kex_uop_alu(g, KEX_OP_CMPLT, cst(g, y->dtype, nc), x->vin[0], NULL);
  }
  return NULL;
}

/* sum_collapse: PHI(acc, ADD[v1, v2]) with v1 independent of the loop -> PHI(acc, v2) + v1*(end-start). */
static const kex_uop *sum_collapse(kex_uop_graph *g, const kex_uop *phi_input, const kex_uop *loop, const kex_uop *add) {
  for (int p = 0; p < 2; p++) {
    const kex_uop *v1 = add->vin[p], *v2 = add->vin[1 - p];
    if (v1 == loop) continue;
    int dep = depends_on(g, v1, loop);
    if (dep < 0) {
      g->oom = true;
      return NULL;
    }
    if (dep) continue;
    const kex_uop *n = cast_to(g, alu2(g, KEX_OP_SUB, loop->vin[1], loop->vin[0]), v1->dtype);
    const kex_uop *ret = alu2(g, KEX_OP_MUL, v1, n);
    const kex_uop *pv[2] = {phi_input, v2};
    return alu2(g, KEX_OP_ADD, kex_uop_add(g, KEX_UOP_PHI, phi_input->dtype, pv, 2, NULL), ret);
  }
  return NULL;
}

static const kex_uop *fold_phi(kex_uop_graph *g, const kex_uop *u) {
  const kex_uop *acc = u->vin[0], *x = u->vin[1];
  if (is_alu(x, KEX_OP_ADD) && x->nvin == 2) {
    const kex_uop *da = acc->uop == KEX_UOP_GEP ? acc->vin[0] : acc;
    if (da->uop == KEX_UOP_DEFINE_ACC && da->nvin == 1 && da->vin[0]->uop == KEX_UOP_RANGE) {
      const kex_uop *r = sum_collapse(g, acc, da->vin[0], x);
      if (r) return r;
    }
  }
  if (acc->uop == KEX_UOP_DEFINE_ACC && x == acc) return cst(g, acc->dtype, acc->arg.c);
  if (acc->uop == KEX_UOP_DEFINE_ACC && acc->nvin == 0) return x;
  if (is_const(acc)) return x;
  return NULL;
}

static const kex_uop *fold_cast(kex_uop_graph *g, const kex_uop *u) {
  const kex_uop *x = u->vin[0];
  if (u->nvin == 1 && x->uop == KEX_UOP_UNMUL) {
    const kex_uop *v[2] = {cast_to(g, x->vin[0], u->dtype), x->vin[1]};
    return kex_uop_add(g, KEX_UOP_UNMUL, u->dtype, v, 2, NULL);
  }
  bool same_const = is_const(x);
  for (uint32_t i = 1; i < u->nvin && same_const; i++) same_const = u->vin[i] == x;
  if (same_const) return cst(g, u->dtype, x->arg.c);
  if (u->nvin == 4 || u->nvin == 2) { /* CAST(PHI(GEP(val, i), v_i) ...) -> PHI(val, CAST(v_i ...)) */
    const kex_uop *val = NULL, *vs[4];
    bool ok = true;
    for (uint32_t i = 0; i < u->nvin && ok; i++) {
      const kex_uop *p = u->vin[i];
      ok = p->uop == KEX_UOP_PHI && p->vin[0]->uop == KEX_UOP_GEP && p->vin[0]->arg.i[0] == (int64_t)i &&
           (!val || p->vin[0]->vin[0] == val);
      if (ok) {
        val = p->vin[0]->vin[0];
        vs[i] = p->vin[1];
      }
    }
    if (ok) {
      const kex_uop *c = kex_uop_add(g, KEX_UOP_CAST, val->dtype, vs, u->nvin, NULL);
      const kex_uop *pv[2] = {val, c};
      return kex_uop_add(g, KEX_UOP_PHI, u->dtype, pv, 2, NULL);
    }
  }
  if (u->nvin == 1 && kex_ud_eq(u->dtype, x->dtype)) return x;
  return NULL;
}

static const kex_uop *fold_store(kex_uop_graph *g, const kex_uop *u) {
  if (u->nvin != 3) return NULL;
  const kex_uop *buf = u->vin[0], *idx = u->vin[1], *v = u->vin[2];
  if (v->uop == KEX_UOP_LOAD && v->nvin == 2 && v->vin[0] == buf && v->vin[1] == idx)
    return kex_uop_add(g, KEX_UOP_NOOP, kex_ud_none(), NULL, 0, NULL);
  if (is_alu(v, KEX_OP_WHERE)) {
    const kex_uop *ld = v->vin[2];
    if (ld->uop == KEX_UOP_LOAD && ld->nvin == 2 && ld->vin[0] == buf && ld->vin[1] == idx) {
      const kex_uop *sv[4] = {buf, idx, v->vin[1], v->vin[0]};
      return kex_uop_add(g, KEX_UOP_STORE, kex_ud_none(), sv, 4, NULL);
    }
  }
  if (v->uop == KEX_UOP_CAST && (v->nvin == 4 || v->nvin == 2)) {
    const kex_uop *val = NULL;
    bool ok = true;
    for (uint32_t i = 0; i < v->nvin && ok; i++) {
      const kex_uop *e = v->vin[i];
      ok = e->uop == KEX_UOP_GEP && e->arg.i[0] == (int64_t)i && (!val || e->vin[0] == val);
      if (ok) val = e->vin[0];
    }
    if (ok) {
      const kex_uop *sv[3] = {buf, idx, val};
      return kex_uop_add(g, KEX_UOP_STORE, kex_ud_none(), sv, 3, NULL);
    }
  }
  return NULL;
}

static const kex_uop *fold(kex_uop_graph *g, const kex_uop *u) {
  switch (u->uop) {
  case KEX_UOP_ALU: return fold_alu(g, u);
  case KEX_UOP_PHI: return fold_phi(g, u);
  case KEX_UOP_CAST: return fold_cast(g, u);
  case KEX_UOP_STORE: return fold_store(g, u);
  case KEX_UOP_DEFINE_ACC: return u->nvin == 0 ? cst(g, u->dtype, u->arg.c) : NULL;
  case KEX_UOP_GEP: return is_const(u->vin[0]) ? cst(g, u->dtype, u->vin[0]->arg.c) : NULL;
  case KEX_UOP_UNMUL: return const_is(u->vin[0], 0) ? u->vin[0] : NULL;
  default: return NULL;
  }
}

/*
 * One bottom-up pass over the graph under sink: every node is rebuilt from
 * its rewritten sources (hash-consed) and then rewritten locally until no
 * rule applies.  *changed counts the rule applications.
 */
static const kex_uop *rewrite_pass(kex_uop_graph *g, const kex_uop *sink, int *changed) {
  uint32_t n0 = g->n;
  const kex_uop **map = kex_calloc(n0, sizeof *map);
  typedef struct { const kex_uop *u; uint32_t next; } frame;
  frame *st = kex_malloc((size_t)(n0 + 1) * sizeof *st);
  const kex_uop **vin = NULL;
  uint32_t vcap = 0;
  const kex_uop *res = NULL;
  if (!map || !st) goto oom;
  uint32_t sp = 0;
  st[sp++] = (frame){sink, 0};
  while (sp) {
    frame *f = &st[sp - 1];
    const kex_uop *u = f->u;
    if (map[u->id]) {
      sp--;
      continue;
    }
    if (f->next < u->nvin) {
      const kex_uop *c = u->vin[f->next++];
      if (!map[c->id]) st[sp++] = (frame){c, 0};
      continue;
    }
    if (u->nvin > vcap) {
      vcap = u->nvin * 2;
      const kex_uop **nv = kex_realloc(vin, vcap * sizeof *nv);
      if (!nv) goto oom;
      vin = nv;
    }
    for (uint32_t i = 0; i < u->nvin; i++) vin[i] = map[u->vin[i]->id];
    const kex_uop *nu = kex_uop_add(g, u->uop, u->dtype, vin, u->nvin, &u->arg);
    for (int k = 0; nu && k < 100; k++) {
      const kex_uop *r = fold(g, nu);
      if (!r) break;
      nu = r;
      (*changed)++;
    }
    if (!nu) goto oom;
    map[u->id] = nu;
    sp--;
  }
  res = map[sink->id];
  goto out;
oom:
  g->oom = true;
out:
  kex_free(map);
  kex_free(st);
  kex_free(vin);
  return res;
}

/* ---- linearize ---- */

typedef struct heap_item {
  int64_t prio;
  int kind;
  int64_t key;
  uint32_t id;
  const kex_uop *u;
} heap_item;

static bool item_lt(const heap_item *a, const heap_item *b) {
  if (a->prio != b->prio) return a->prio < b->prio;
  if (a->kind != b->kind) return a->kind < b->kind;
  if (a->key != b->key) return a->key < b->key;
  return a->id < b->id;
}

static void heap_push(heap_item *h, uint32_t *n, heap_item it) {
  uint32_t i = (*n)++;
  h[i] = it;
  while (i) {
    uint32_t p = (i - 1) / 2;
    if (!item_lt(&h[i], &h[p])) break;
    heap_item t = h[i];
    h[i] = h[p];
    h[p] = t;
    i = p;
  }
}

static heap_item heap_pop(heap_item *h, uint32_t *n) {
  heap_item top = h[0];
  h[0] = h[--(*n)];
  uint32_t i = 0;
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < *n && item_lt(&h[l], &h[m])) m = l;
    if (r < *n && item_lt(&h[r], &h[m])) m = r;
    if (m == i) break;
    heap_item t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
  return top;
}

static int64_t tie_key(const kex_uop *u) {
  switch (u->uop) {
  case KEX_UOP_RANGE: return u->arg.i[0] * 1000 + u->arg.i[1];
  case KEX_UOP_DEFINE_GLOBAL: case KEX_UOP_SPECIAL: return u->arg.i[0];
  case KEX_UOP_ALU: return 0;
  default: return 0;
  }
}

#define MAX_SCOPES 64

/* Is an UNMUL reachable from sink?  1, 0, or -1 on OOM. */
static int has_unmul(const kex_uop_graph *g, const kex_uop *sink) { return reaches(g, sink, true, is_unmul, NULL); }

/*
 * graph_rewrite to a fixed point from the SINK of `sinks` (again without
 * loop collapse when an UNMUL survives), then drop the NOOP stores.  *out is
 * the final SINK.  0, KEX_EINTERNAL (no fixed point in 100 passes) or
 * KEX_ENOMEM.
 */
static int rewrite_graph(kex_uop_graph *g, const kex_uop *const *sinks, uint32_t nsinks, const kex_uop **out,
                         kex_error *err) {
  const kex_uop *sink0 = kex_uop_add(g, KEX_UOP_SINK, kex_ud_none(), sinks, nsinks, NULL), *sink = sink0;
rewrite:
  for (int pass = 0; sink; pass++) {
    if (pass >= 100) return kex_err_set(err, KEX_EINTERNAL, "uops: graph_rewrite did not converge in 100 passes");
    int changed = 0;
    sink = rewrite_pass(g, sink, &changed);
    if (!changed) break;
  }
  if (!sink) goto oom;
  if (!g->no_loop_collapse) { /* an UNMUL that survived means an arange fold without its sum: undo them all */
    int has = has_unmul(g, sink);
    if (has < 0) goto oom;
    if (has) {
      g->no_loop_collapse = true;
      sink = sink0;
      goto rewrite;
    }
  }
  /* drop NOOP stores */
  const kex_uop **keep = kex_malloc((sink->nvin + 1) * sizeof *keep);
  if (!keep) goto oom;
  uint32_t nk = 0;
  for (uint32_t i = 0; i < sink->nvin; i++)
    if (sink->vin[i]->uop != KEX_UOP_NOOP) keep[nk++] = sink->vin[i];
  sink = kex_uop_add(g, KEX_UOP_SINK, kex_ud_none(), keep, nk, NULL);
  kex_free(keep);
  if (!sink) goto oom;
  *out = sink;
  return 0;
oom:
  return kex_err_set(err, KEX_ENOMEM, "uops: out of memory");
}

/*
 * The scope children of each loop (recursive children, not past a PHI, the
 * SINK excluded): scope[c] gets loop l's bit, prio[c] its priority, and
 * remaining[l] counts them.  seen and stack are scratch of g->n entries
 * (stack n + 1); coff/cadj the children adjacency.
 */
static void scope_children(const kex_uop_graph *g, const kex_uop *const *loops, uint32_t nloops, const uint32_t *coff,
                           const uint32_t *cadj, uint8_t *seen, uint32_t *stack, uint64_t *scope, int64_t *prio,
                           uint32_t *remaining) {
  uint32_t n = g->n, sp;
  for (uint32_t l = 0; l < nloops; l++) {
    memset(seen, 0, n);
    remaining[l] = 0;
    sp = 0;
    stack[sp++] = loops[l]->id;
    while (sp) {
      uint32_t x = stack[--sp];
      const kex_uop *xu = g->nodes[x];
      if (x != loops[l]->id && xu->uop == KEX_UOP_PHI) continue;
      for (uint32_t e = coff[x]; e < coff[x + 1]; e++) {
        uint32_t c = cadj[e];
        if (seen[c] || g->nodes[c]->uop == KEX_UOP_SINK) continue;
        seen[c] = 1;
        scope[c] |= 1ull << l;
        prio[c] -= loops[l]->arg.i[0] * 1000 + loops[l]->arg.i[1];
        remaining[l]++;
        stack[sp++] = c;
      }
    }
  }
}

int kex_uop_linearize(kex_uop_graph *g, const kex_uop *const *sinks, uint32_t nsinks, kex_error *err) {
  int rc = 0;
  uint32_t *indeg = NULL, *coff = NULL, *cadj = NULL, *order = NULL, *stack = NULL;
  uint64_t *scope = NULL;
  int64_t *prio = NULL;
  uint8_t *seen = NULL;
  heap_item *heap = NULL;
  const kex_uop *loops[MAX_SCOPES];
  uint32_t nloops = 0, remaining[MAX_SCOPES];
  const kex_uop *ifs[MAX_SCOPES];
  uint32_t nifs = 0;

  const kex_uop *sink = NULL;
  if ((rc = rewrite_graph(g, sinks, nsinks, &sink, err))) return rc;
  uint32_t n = g->n;
  seen = kex_calloc(n, 1);
  order = kex_malloc((size_t)n * sizeof *order);
  stack = kex_malloc((size_t)(n + 1) * sizeof *stack);
  indeg = kex_calloc(n, sizeof *indeg);
  coff = kex_calloc((size_t)n + 1, sizeof *coff);
  if (!seen || !order || !stack || !indeg || !coff) goto oom;
  /* reachable nodes (preorder) */
  uint32_t nreach = 0, sp = 0;
  stack[sp++] = sink->id;
  seen[sink->id] = 1;
  while (sp) {
    const kex_uop *u = g->nodes[stack[--sp]];
    order[nreach++] = u->id;
    if (u->uop == KEX_UOP_RANGE) {
      if (nloops == MAX_SCOPES) {
        rc = kex_err_set(err, KEX_ELIMIT, "uops: more than %d loops", MAX_SCOPES);
        goto out;
      }
      loops[nloops++] = u;
    }
    if (u->uop == KEX_UOP_IF && nifs < MAX_SCOPES) ifs[nifs++] = u;
    for (uint32_t i = 0; i < u->nvin; i++) {
      const kex_uop *c = u->vin[i];
      indeg[u->id]++;
      coff[c->id]++;
      if (!seen[c->id]) {
        seen[c->id] = 1;
        stack[sp++] = c->id;
      }
    }
  }
  /* children adjacency (CSR) */
  uint32_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t c = coff[i];
    coff[i] = total;
    total += c;
  }
  coff[n] = total;
  cadj = kex_malloc((size_t)(total + 1) * sizeof *cadj);
  uint32_t *fill = kex_calloc(n, sizeof *fill);
  if (!cadj || !fill) {
    kex_free(fill);
    goto oom;
  }
  for (uint32_t k = 0; k < nreach; k++) {
    const kex_uop *u = g->nodes[order[k]];
    for (uint32_t i = 0; i < u->nvin; i++) {
      uint32_t c = u->vin[i]->id;
      cadj[coff[c] + fill[c]++] = u->id;
    }
  }
  kex_free(fill);
  /* scope children of each loop: recursive children, not past PHI, SINK excluded */
  scope = kex_calloc(n, sizeof *scope);
  prio = kex_calloc(n, sizeof *prio);
  if (!scope || !prio) goto oom;
  scope_children(g, loops, nloops, coff, cadj, seen, stack, scope, prio, remaining);
  heap = kex_malloc((size_t)(nreach + 1) * sizeof *heap);
  g->linear = kex_malloc((size_t)(nreach + nloops + nifs + 1) * sizeof *g->linear);
  if (!heap || !g->linear) goto oom;
  uint32_t nheap = 0, nl = 0;
  for (uint32_t k = 0; k < nreach; k++) {
    const kex_uop *u = g->nodes[order[k]];
    if (!indeg[u->id]) heap_push(heap, &nheap, (heap_item){prio[u->id], u->uop, tie_key(u), u->id, u});
  }
  while (nheap) {
    heap_item it = heap_pop(heap, &nheap);
    const kex_uop *x = it.u;
    if (x->uop == KEX_UOP_DEFINE_ACC && x->nvin) {
      uint32_t pos = nl;
      for (uint32_t i = 0; i < nl; i++)
        for (uint32_t j = 0; j < x->nvin; j++)
          if (g->linear[i] == x->vin[j] && i < pos) pos = i;
      memmove(&g->linear[pos + 1], &g->linear[pos], (nl - pos) * sizeof *g->linear);
      g->linear[pos] = x;
      nl++;
    } else {
      g->linear[nl++] = x;
    }
    /* loops whose last scope child this was end here, innermost (latest opened) first */
    uint64_t ending = 0;
    for (uint32_t l = 0; l < nloops; l++)
      if ((scope[x->id] >> l) & 1 && --remaining[l] == 0) ending |= 1ull << l;
    while (ending) {
      int best = -1;
      uint32_t bestpos = 0;
      for (uint32_t l = 0; l < nloops; l++) {
        if (!((ending >> l) & 1)) continue;
        uint32_t pos = 0;
        for (uint32_t i = 0; i < nl; i++)
          if (g->linear[i] == loops[l]) pos = i;
        if (best < 0 || pos > bestpos) best = (int)l, bestpos = pos;
      }
      ending &= ~(1ull << best);
      const kex_uop *e = kex_uop_1(g, KEX_UOP_ENDRANGE, kex_ud_none(), loops[best]);
      if (!e) goto oom;
      g->linear[nl++] = e;
    }
    for (uint32_t e = coff[x->id]; e < coff[x->id + 1]; e++) {
      const kex_uop *c = g->nodes[cadj[e]];
      if (--indeg[c->id] == 0) heap_push(heap, &nheap, (heap_item){prio[c->id], c->uop, tie_key(c), c->id, c});
    }
  }
  if (nl == 0 || g->linear[nl - 1]->uop != KEX_UOP_SINK) {
    rc = kex_err_set(err, KEX_EINTERNAL, "uops: toposort did not end with SINK");
    goto out;
  }
  nl--;
  for (uint32_t i = 0; i < nifs; i++) {
    const kex_uop *e = kex_uop_1(g, KEX_UOP_ENDIF, kex_ud_none(), ifs[nifs - 1 - i]);
    if (!e) goto oom;
    g->linear[nl++] = e;
  }
  g->nlinear = nl;
  goto out;
oom:
  rc = kex_err_set(err, KEX_ENOMEM, "uops: out of memory");
out:
  kex_free(seen);
  kex_free(order);
  kex_free(stack);
  kex_free(indeg);
  kex_free(coff);
  kex_free(cadj);
  kex_free(scope);
  kex_free(prio);
  kex_free(heap);
  return rc;
}

/* uop_alu_resolve of a loop bound: CONST, SPECIAL (size-1), ADD/MUL of those. */
static int64_t resolve(const kex_uop *u) {
  if (u->uop == KEX_UOP_CONST) return (int64_t)kex_const_as_double(u->arg.c);
  if (u->uop == KEX_UOP_SPECIAL) return u->arg.i[1] - 1;
  if (is_alu(u, KEX_OP_MUL)) return resolve(u->vin[0]) * resolve(u->vin[1]);
  if (is_alu(u, KEX_OP_ADD)) return resolve(u->vin[0]) + resolve(u->vin[1]);
  return 1;
}

void kex_uop_flops_mem(const kex_uop_graph *g, int64_t *flops, int64_t *mem) {
  int64_t f = 0, m = 0, mults = 1, stackv[MAX_SCOPES + 1];
  int sp = 0;
  for (uint32_t i = 0; i < g->nlinear; i++) {
    const kex_uop *u = g->linear[i];
    if (u->uop == KEX_UOP_RANGE) {
      if (sp < MAX_SCOPES) stackv[sp++] = mults;
      mults *= resolve(u->vin[1]);
    } else if (u->uop == KEX_UOP_ENDRANGE) {
      if (sp) mults = stackv[--sp];
    } else if (u->uop == KEX_UOP_ALU) {
      f += mults * (u->arg.op == KEX_OP_MULACC ? 2 : 1);
    } else if (u->uop == KEX_UOP_LOAD) {
      m += (int64_t)kex_dtype_size(u->dtype.dt) * u->dtype.vec * mults;
    } else if (u->uop == KEX_UOP_STORE) {
      m += (int64_t)kex_dtype_size(u->vin[2]->dtype.dt) * u->vin[2]->dtype.vec * mults;
    }
  }
  *flops = f;
  *mem = m;
}

void kex_uop_print(const kex_uop_graph *g, void *file) {
  FILE *f = file;
  for (uint32_t i = 0; i < g->nlinear; i++) {
    const kex_uop *u = g->linear[i];
    fprintf(f, "%4u %-14s %-8s%s%u [", i, kex_uop_name(u->uop), u->dtype.vec ? kex_dtypes[u->dtype.dt].name : "",
            u->dtype.ptr ? "*" : "", u->dtype.vec);
    for (uint32_t j = 0; j < u->nvin; j++) fprintf(f, "%s%u", j ? ", " : "", u->vin[j]->id);
    fprintf(f, "] #%u", u->id);
    if (u->uop == KEX_UOP_ALU) fprintf(f, " %s", kex_op_short(u->arg.op));
    if (u->uop == KEX_UOP_CONST || u->uop == KEX_UOP_DEFINE_ACC) {
      char b[64];
      kex_const_repr(u->arg.c, b, sizeof b);
      fprintf(f, " %s", b);
    }
    if (u->arg.name) fprintf(f, " %s", u->arg.name);
    fprintf(f, " (%lld, %lld)\n", (long long)u->arg.i[0], (long long)u->arg.i[1]);
  }
}

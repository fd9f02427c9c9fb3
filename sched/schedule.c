/*
 * schedule.c - tinygrad 0.9.0's create_schedule_with_vars (spec section 6).
 *
 * The passes, in tinygrad's order: _recurse_lb finds what must realize
 * (LoadOps, forced realizes, realize-before-expand, simple pads), pad safety,
 * group_reduce fuses each reduce with its elementwise consumers or forces it
 * (with the single-child chase and the store-before-upcast rule), outputs are
 * grouped by reduce (MULTIOUTPUT), each group becomes an AST
 * (_recursive_lazyop), and a Kahn BFS orders the items, with readers of an
 * assign target ordered before the assign.  memplan.c then maps intermediate
 * buffers onto reusable ones.
 *
 * Every walk uses an explicit stack and visit marks (epochs in the LazyBuffer
 * scratch fields), so a 100,000-node chain needs no deep recursion, and the
 * walks tinygrad does without a visited set stay linear.  Each kernel's AST
 * is bounded by the graph's limits (max_kernel_depth levels, max_kernel_ops
 * operations), checked as it is built, so an oversized kernel is refused
 * before it is built whole or reaches a compiler.
 */
#include "sched/schedule.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/ptrmap.h"

enum {
  F_ALLBUFS = 1u << 0,
  F_REALIZES = 1u << 1,
  F_SIMPLE_PAD = 1u << 2,
  F_ASSIGN_TARGET = 1u << 3,
};

/* ---- small growable arrays of pointers (in the scratch arena, like every temporary of kex_schedule_create) ---- */

typedef struct ptrvec {
  uint32_t len, cap;
  void **v;
  kex_arena *a;
} ptrvec;

static int pv_push(ptrvec *p, void *x) {
  if (kex_arena_grow(p->a, &p->v, p->len, &p->cap, sizeof *p->v, 16)) return KEX_ENOMEM;
  p->v[p->len++] = x;
  return 0;
}

/* ---- hash-consed LazyOps ---- */

struct kex_sched_tables {
  kex_dict lops; /* of const kex_lop *, probed with a template kex_lop */
  kex_replay_tables *keep; /* the replay's tables to reuse: lops goes back there, else NULL */
};

static uint64_t lop_hash(const kex_lop *l) {
  uint64_t h = kex_hash_u64(l->op, l->dtype);
  for (int i = 0; i < l->nsrc; i++) h = kex_hash_u64(h, (uintptr_t)l->src[i]);
  h = kex_hash_u64(h, (uint64_t)(uint32_t)l->idx);
  h = kex_hash_u64(h, (uintptr_t)l->st);
  h = kex_hash_u64(h, l->cast_to | (uint64_t)l->axis_mask << 8);
  if (l->op == KEX_OP_BCONST) {
    uint64_t bits;
    memcpy(&bits, &l->val.f, 8);
    h = kex_hash_u64(h, bits ^ l->val.kind);
  }
  return h;
}

static bool lop_eq(const kex_lop *a, const kex_lop *b) {
  if (a->op != b->op || a->dtype != b->dtype || a->nsrc != b->nsrc || a->idx != b->idx || a->st != b->st ||
      a->cast_to != b->cast_to || a->axis_mask != b->axis_mask)
    return false;
  for (int i = 0; i < a->nsrc; i++)
    if (a->src[i] != b->src[i]) return false;
  if (a->op == KEX_OP_BCONST) return a->val.kind == b->val.kind && memcmp(&a->val.f, &b->val.f, 8) == 0;
  return true;
}

static bool lop_entry_eq(const void *entry, const void *probe) { return lop_eq(*(const kex_lop *const *)entry, probe); }

static const kex_dict_type lop_table_type = {sizeof(const kex_lop *), lop_entry_eq, 64};

/* Return the interned copy of *tmpl (allocating it in the arena when new). NULL on OOM. */
static const kex_lop *lop_intern(struct kex_sched_tables *t, kex_arena *arena, kex_lop *tmpl) {
  tmpl->hash = lop_hash(tmpl);
  bool found;
  const kex_lop **slot = kex_dict_insert(&t->lops, tmpl->hash, tmpl, &found);
  if (!slot) return NULL;
  if (found) return *slot;
  kex_lop *l = kex_arena_memdup(arena, tmpl, sizeof *tmpl);
  if (!l) {
    kex_dict_cancel(&t->lops, slot);
    return NULL;
  }
  *slot = l;
  return l;
}

/*
 * A new inner AST node.  Inner nodes are not interned: the (buf, st) memo of
 * _recursive_lazyop already makes each distinct sub-AST one node; only the
 * leaves (LOAD/CONST), which recur across buffers, go through lop_intern.
 */
static const kex_lop *lop_new(kex_arena *arena, kex_lop *tmpl) {
  tmpl->hash = lop_hash(tmpl);
  return kex_arena_memdup(arena, tmpl, sizeof *tmpl);
}

/* ---- scheduler state ---- */

typedef struct sched {
  kex_replay *r;
  kex_shape_ctx *sh;
  kex_arena *arena;     /* the replay's: what the schedule keeps */
  kex_arena *scratch;   /* what only kex_schedule_create uses: reset (or destroyed) when it returns */
  kex_error *err;
  ptrvec realizes, allbufs, simple_pads, stack, stack2, group, tmp;
  ptrvec inputs;        /* schedule_group's inputs, kept between groups for its room */
  void *frames;         /* recursive_lazyop's frames (lop_frame), kept between calls for their room */
  uint32_t capframes;
  kex_ptrmap visit;     /* (tr, st) pairs of _recursive_group; (buf, st) memo of _recursive_lazyop */
  uint32_t epoch;    /* for lb->mark */
  struct kex_sched_tables *lops;
} sched;

/*
 * An allocation or a ShapeTracker call just failed: KEX_ENOMEM, or what the
 * ShapeTracker code refused (KEX_ELIMIT for int64 overflow, KEX_EINVAL).
 */
static int oom(sched *s) {
  const char *why = NULL;
  int code = kex_shape_error(s->sh, &why);
  if (code) return kex_err_set(s->err, code, "while scheduling: %s", why);
  return kex_err_set(s->err, KEX_ENOMEM, "out of memory while scheduling");
}

static int add_realize(sched *s, kex_lb *lb) {
  if (lb->flags & F_REALIZES) return 0;
  lb->flags |= F_REALIZES;
  return pv_push(&s->realizes, lb);
}

static bool in_realizes(const kex_lb *lb) { return lb->flags & F_REALIZES; }

static int add_child(sched *s, kex_lb *parent, kex_lb *child) {
  if (parent->nchildren == parent->capchildren) {
    uint32_t ncap = parent->capchildren ? parent->capchildren * 2 : 4;
    kex_lb **nc = kex_arena_alloc(s->arena, sizeof *nc * ncap);
    if (!nc) return KEX_ENOMEM;
    if (parent->nchildren) memcpy(nc, parent->children, sizeof *nc * parent->nchildren);
    parent->children = nc;
    parent->capchildren = ncap;
  }
  parent->children[parent->nchildren++] = child;
  return 0;
}

/*
 * _recurse_lb: DFS from an output base.  Frames are (lb, next src) pairs on
 * s->stack (a view frame is replaced by its base, a tail call).
 */
static int recurse_lb(sched *s, kex_lb *root) {
  ptrvec *st = &s->stack;
  st->len = 0;
  /* frames are stored as two consecutive slots: lb and (intptr) next */
  if (pv_push(st, root) || pv_push(st, (void *)(intptr_t)-1)) return KEX_ENOMEM;
  while (st->len) {
    kex_lb *buf = st->v[st->len - 2];
    intptr_t next = (intptr_t)st->v[st->len - 1];
    if (next == -1) {
      if ((buf->flags & F_ALLBUFS) || buf->base->realized) {
        st->len -= 2;
        continue;
      }
      if (!kex_lb_is_base(buf)) {
        kex_lb *base = buf->base;
        const kex_view *last = kex_st_last(buf->st);
        int64_t base_prod = kex_lb_size(base);
        bool pad = false;
        if (buf->st->nviews == 1 && last->mask) {
          int64_t m = 1; /* prod of the mask's extents, 0 when one is empty */
          bool ovf = false;  /* a product past int64 is past base_prod too: not a simple pad */
          for (int i = 0; i < last->ndim; i++)
            if (last->mask[2 * i + 1] == last->mask[2 * i]) m = 0;
          for (int i = 0; i < last->ndim && m; i++)
            ovf |= __builtin_mul_overflow(m, last->mask[2 * i + 1] - last->mask[2 * i], &m);
          pad = !ovf && base_prod >= m;
        }
        if (pad) {
          if (!(base->flags & F_SIMPLE_PAD)) {
            base->flags |= F_SIMPLE_PAD;
            if (pv_push(&s->simple_pads, base)) return KEX_ENOMEM;
          }
        } else if (base_prod < kex_lb_size(buf)) {
          if (add_realize(s, base)) return KEX_ENOMEM;
        }
        st->v[st->len - 2] = base; /* tail call on the base */
        continue;
      }
      buf->flags |= F_ALLBUFS;
      if (pv_push(&s->allbufs, buf)) return KEX_ENOMEM;
      if (buf->forced_realize || KEX_OP_IS_LOAD(buf->op))
        if (add_realize(s, buf)) return KEX_ENOMEM;
      if ((buf->op == KEX_OP_COPY || buf->op == KEX_OP_VIEW) && add_realize(s, buf->srcs[0]->base)) return KEX_ENOMEM;
      next = 0;
    }
    if (next < buf->nsrc) {
      kex_lb *x = buf->srcs[next];
      bool dup = false;
      for (intptr_t j = 0; j < next; j++) dup |= buf->srcs[j]->base == x->base;
      if (!dup && add_child(s, x->base, buf)) return KEX_ENOMEM;
      st->v[st->len - 1] = (void *)(next + 1);
      if (pv_push(st, x) || pv_push(st, (void *)(intptr_t)-1)) return KEX_ENOMEM;
    } else {
      st->len -= 2;
    }
  }
  return 0;
}

/* _is_padding_okay: no UNSAFE_PAD_OP reachable before a realized/realizing buffer. 1, 0, or <0. */
static int padding_okay(sched *s, kex_lb *p) {
  if (in_realizes(p) || p->realized) return 1;
  uint32_t ep = ++s->epoch;
  ptrvec *st = &s->stack2;
  st->len = 0;
  if (pv_push(st, p)) return KEX_ENOMEM;
  p->mark = ep;
  while (st->len) {
    kex_lb *b = st->v[--st->len];
    if (in_realizes(b) || b->realized) continue;
    if (KEX_OP_IS_UNSAFE_PAD(b->op)) return 0;
    for (int i = 0; i < b->nsrc; i++) {
      kex_lb *x = b->srcs[i]->base;
      if (x->mark == ep) continue;
      x->mark = ep;
      if (pv_push(st, x)) return KEX_ENOMEM;
    }
  }
  return 1;
}

/* dedup(s for s in nxt.srcs if s.base is tr): count and first. */
static int srcs_of(const kex_lb *nxt, const kex_lb *tr, kex_lb **first) {
  int n = 0;
  *first = NULL;
  for (int i = 0; i < nxt->nsrc; i++) {
    kex_lb *x = nxt->srcs[i];
    if (x->base != tr) continue;
    bool seen = false;
    for (int j = 0; j < i; j++) seen |= nxt->srcs[j] == x;
    if (seen) continue;
    if (!n) *first = x;
    n++;
  }
  return n;
}

static int group_add(sched *s, kex_lb *lb, uint32_t gep) {
  if (lb->mark2 == gep) return 0;
  lb->mark2 = gep;
  return pv_push(&s->group, lb);
}

/*
 * _recursive_group(r, r.st, r) with a (tr, st) visited set.  Frames on
 * s->stack: tr, st, next child.
 */
static int recursive_group(sched *s, kex_lb *r, uint32_t gep) {
  ptrvec *st = &s->stack;
  st->len = 0;
  kex_ptrmap_clear(&s->visit);
  if (pv_push(st, r) || pv_push(st, (void *)r->st) || pv_push(st, (void *)(intptr_t)-1)) return KEX_ENOMEM;
  while (st->len) {
    kex_lb *tr = st->v[st->len - 3];
    const kex_st *tst = st->v[st->len - 2];
    intptr_t next = (intptr_t)st->v[st->len - 1];
    if (next == -1) {
      if (kex_ptrmap_find(&s->visit, tr, tst)) {
        st->len -= 3;
        continue;
      }
      if (kex_ptrmap_put(&s->visit, tr, tst, (void *)1)) return KEX_ENOMEM;
      if (in_realizes(tr)) {
        if (!kex_st_contiguous(tst) || kex_st_size(tst) != kex_st_size(r->st) || tr->reduce_for_op)
          if (group_add(s, r, gep)) return KEX_ENOMEM;
        if (group_add(s, tr, gep)) return KEX_ENOMEM;
        st->len -= 3;
        continue;
      }
      next = 0;
    }
    /* advance to the next unrealized child */
    while (next < tr->nchildren && tr->children[next]->realized) next++;
    if (next >= tr->nchildren) {
      st->len -= 3;
      continue;
    }
    kex_lb *nxt = tr->children[next];
    st->v[st->len - 1] = (void *)(next + 1);
    kex_lb *first;
    if (KEX_OP_IS_REDUCE(nxt->op) || srcs_of(nxt, tr, &first) > 1) {
      if (group_add(s, r, gep)) return KEX_ENOMEM;
      st->len -= 3; /* return from this frame */
      continue;
    }
    const kex_st *cst = kex_st_add(s->sh, tst, first->st);
    if (!cst) return KEX_ENOMEM;
    if (pv_push(st, nxt) || pv_push(st, (void *)cst) || pv_push(st, (void *)(intptr_t)-1)) return KEX_ENOMEM;
  }
  return 0;
}

/* group_reduce(r): spec 6.3. */
static int group_reduce(sched *s, kex_lb *r) {
  uint32_t gep = ++s->epoch; /* group membership: lb->mark2 == gep */
  s->group.len = 0;
  int rc = recursive_group(s, r, gep);
  if (rc) return rc;
  bool can_chase = true;
  for (uint32_t i = 0; i < s->group.len; i++)
    if (((kex_lb *)s->group.v[i])->reduce_for_op) can_chase = false;
  bool forced = r->mark2 == gep;
  if (!forced && s->group.len > 1) {
    /* parents of the group: another reduce upstream forces r */
    uint32_t ep = ++s->epoch;
    ptrvec *st = &s->stack;
    st->len = 0;
    for (uint32_t i = 0; i < s->group.len; i++) {
      kex_lb *g = s->group.v[i];
      g->mark = ep;
      if (pv_push(st, g)) return KEX_ENOMEM;
    }
    while (st->len && !forced) {
      kex_lb *p = st->v[--st->len];
      if (KEX_OP_IS_REDUCE(p->op)) {
        forced = true;
        break;
      }
      for (int i = 0; i < p->nsrc; i++) {
        kex_lb *x = p->srcs[i]->base;
        if (x->realized || x == r || x->mark == ep) continue;
        x->mark = ep;
        if (pv_push(st, x)) return KEX_ENOMEM;
      }
    }
    /* descendants that can cleanly join as more outputs */
    if (!forced) {
      ep = ++s->epoch;
      st->len = 0;
      s->tmp.len = 0;
      for (uint32_t i = 0; i < s->group.len; i++) {
        kex_lb *g = s->group.v[i];
        g->mark = ep;
        if (pv_push(st, g)) return KEX_ENOMEM;
      }
      bool clean = true;
      while (st->len) {
        kex_lb *c = st->v[--st->len];
        if (KEX_OP_IS_REDUCE(c->op) || !kex_st_contiguous(c->st) || kex_st_size(c->st) != kex_st_size(r->st) ||
            c->reduce_for_op) {
          clean = false;
          break;
        }
        if (in_realizes(c) && c->mark2 != gep && pv_push(&s->tmp, c)) return KEX_ENOMEM;
        for (uint32_t i = 0; i < c->nchildren; i++) {
          kex_lb *x = c->children[i];
          if (x->realized || x->device != r->device || x->mark == ep) continue;
          x->mark = ep;
          if (pv_push(st, x)) return KEX_ENOMEM;
        }
      }
      if (clean)
        for (uint32_t i = 0; i < s->tmp.len; i++)
          if (group_add(s, s->tmp.v[i], gep)) return KEX_ENOMEM;
    }
  }
  if (!forced) {
    bool has_assign = false;
    for (uint32_t i = 0; i < s->group.len; i++) has_assign |= ((kex_lb *)s->group.v[i])->op == KEX_OP_ASSIGN;
    if (has_assign) {
      uint32_t ep = ++s->epoch;
      ptrvec *st = &s->stack;
      st->len = 0;
      if (pv_push(st, r)) return KEX_ENOMEM;
      for (uint32_t i = 0; i < s->group.len; i++)
        if (pv_push(st, s->group.v[i])) return KEX_ENOMEM;
      while (st->len && !forced) {
        kex_lb *p = ((kex_lb *)st->v[--st->len])->base;
        if (p->mark == ep) continue;
        p->mark = ep;
        if (p->realized || in_realizes(p)) {
          if ((p->flags & F_ASSIGN_TARGET) && p->assign_of->mark2 != gep) {
            forced = true;
            can_chase = false;
          }
          continue;
        }
        for (int i = 0; i < p->nsrc; i++)
          if (pv_push(st, p->srcs[i])) return KEX_ENOMEM;
      }
    }
  }
  if (forced) {
    kex_lb *tr = r;
    if (can_chase) {
      const kex_st *cst = r->st;
      while (tr->nchildren == 1) {
        kex_lb *nxt = tr->children[0], *first;
        if (srcs_of(nxt, tr, &first) > 1 || kex_st_size(cst) != kex_st_size(first->st)) break;
        cst = kex_st_add(s->sh, cst, first->st);
        if (!cst) return KEX_ENOMEM;
        if (!kex_st_contiguous(cst) || KEX_OP_IS_REDUCE(nxt->op)) break;
        tr = nxt;
      }
      if (tr->op == KEX_OP_CAST && kex_dtype_size(tr->dtype) > kex_dtype_size(tr->srcs[0]->dtype)) tr = tr->srcs[0]->base;
      tr->reduce_for_op = r;
    }
    return add_realize(s, tr) ? KEX_ENOMEM : 0;
  }
  for (uint32_t i = 0; i < s->group.len; i++) ((kex_lb *)s->group.v[i])->reduce_for_op = r;
  return 0;
}

/* ---- AST construction: _schedule_group / _recursive_lazyop ---- */

typedef struct group_ctx {
  kex_lb **outs;
  uint32_t nout;
  ptrvec inputs;
  uint32_t gep; /* lb->mark2 == gep: in outs; lb->mark == gep + 1: in inputs (slot in group_slot) */
  uint32_t nops; /* inner AST nodes (ALU, cast, reduce, STORE) built for this kernel so far */
} group_ctx;

/* "node 12" for a buffer a graph node made, else a description of the internal buffer. */
static const char *lb_where(const kex_lb *lb, char *buf, size_t len) {
  if (lb->graph_node >= 0) snprintf(buf, len, "node %d", (int)lb->graph_node);
  else if (lb->base->graph_node >= 0) snprintf(buf, len, "a buffer made for node %d", (int)lb->base->graph_node);
  else snprintf(buf, len, "an internal %s buffer", kex_op_short(lb->op));
  return buf;
}

/*
 * The kernel limits (the graph's max_kernel_depth and max_kernel_ops) for a
 * new inner AST node of depth `depth` made for `at` in the kernel that
 * stores g->outs[out]: 0, or KEX_ELIMIT naming the kernel, the value and the
 * limit.  `store` is true for the STORE itself (depth is then the kernel's).
 */
static int kernel_limits(sched *s, group_ctx *g, uint32_t out, const kex_lb *at, uint32_t depth, bool store) {
  const kex_limits *lim = &s->r->graph->limits;
  uint32_t kdepth = store ? depth : depth + 1; /* the STORE above adds a level */
  char ob[64], ab[64];
  g->nops++;
  if (kdepth > lim->max_kernel_depth)
    return kex_err_set(s->err, KEX_ELIMIT,
                       "%s: the kernel storing it has an AST %u levels deep (reached at %s, %s), more than the limit "
                       "of %u (max_kernel_depth); realize an intermediate (CONTIGUOUS) to split it",
                       lb_where(g->outs[out], ob, sizeof ob), kdepth, lb_where(at, ab, sizeof ab), kex_op_short(at->op),
                       lim->max_kernel_depth);
  if (g->nops > lim->max_kernel_ops)
    return kex_err_set(s->err, KEX_ELIMIT,
                       "%s: the kernel storing it reaches %u operations (at %s, %s), more than the limit of %u "
                       "(max_kernel_ops); realize an intermediate (CONTIGUOUS) to split it",
                       lb_where(g->outs[out], ob, sizeof ob), g->nops, lb_where(at, ab, sizeof ab),
                       kex_op_short(at->op), lim->max_kernel_ops);
  return 0;
}

static int out_index(const group_ctx *g, const kex_lb *lb) {
  for (uint32_t i = 0; i < g->nout; i++)
    if (g->outs[i] == lb) return (int)i;
  return -1;
}

static const kex_lop *make_leaf(sched *s, kex_op op, kex_dtype dt, int idx, const kex_st *st, kex_const val) {
  kex_lop t = {0};
  t.op = op;
  t.dtype = dt;
  t.idx = idx;
  t.st = st;
  t.val = val;
  t.depth = 1;
  return lop_intern(s->lops, s->arena, &t);
}

/* The kernel-input case of _recursive_lazyop. */
static int lazyop_input(sched *s, group_ctx *g, kex_lb *buf, const kex_st *st, const kex_lop **res) {
  st = kex_st_simplify(s->sh, st);
  if (!st) return oom(s);
  if ((buf->flags & F_ASSIGN_TARGET) && buf->assign_of->mark2 == g->gep) {
    if (!kex_st_contiguous(st)) {
      const kex_view *v = st->views[0];
      bool ok = false;
      if (st->nviews == 1 && v->mask) {
        const kex_st *full = kex_st_from_shape_of(s->sh, st);
        const kex_st *a = full ? kex_st_shrink(s->sh, full, v->mask) : NULL;
        const kex_st *b = kex_st_shrink(s->sh, st, v->mask);
        if (!a || !b) return oom(s);
        ok = a == b;
      }
      if (!ok) {
        char text[1024];
        kex_st_repr(st, text, sizeof text);
        int node = buf->assign_of->graph_node;
        return kex_err_set(s->err, KEX_EASSIGN,
                           "node %d (ASSIGN): must be contiguous for assign %s (the value reads its own target through a "
                           "non-contiguous view; make that read .contiguous() first)",
                           node, text);
      }
    }
    *res = make_leaf(s, KEX_OP_LOAD, buf->dtype, out_index(g, buf->assign_of), st, kex_const_int(0));
    return *res ? 0 : oom(s);
  }
  if (buf->mark != g->gep + 1) {
    buf->mark = g->gep + 1;
    buf->input_slot = (int32_t)g->inputs.len;
    if (pv_push(&g->inputs, buf)) return oom(s);
  }
  *res = make_leaf(s, KEX_OP_LOAD, buf->dtype, (int)g->nout + buf->input_slot, st, kex_const_int(0));
  return *res ? 0 : oom(s);
}

/* Iterative _recursive_lazyop(out, st).  Frames: buf, st, child st, next, results. */
typedef struct lop_frame {
  kex_lb *buf;
  const kex_st *st;
  const kex_st *child_st;
  int next;
  const kex_lop *res[3];
} lop_frame;

static int recursive_lazyop(sched *s, group_ctx *g, uint32_t outi, const kex_st *out_st, const kex_lop **result) {
  kex_lb *out = g->outs[outi];
  lop_frame *fr = s->frames;
  uint32_t n = 0;
  int rc = 0;
  const kex_lop *ret = NULL;
#define PUSH(b, t)                                                   \
  do {                                                               \
    if (kex_arena_grow(s->scratch, &fr, n, &s->capframes, sizeof *fr, 64)) { \
      rc = oom(s);                                                   \
      goto out;                                                      \
    }                                                                \
    s->frames = fr;                                                  \
    fr[n++] = (lop_frame){(b), (t), NULL, -1, {NULL, NULL, NULL}};   \
  } while (0)
  PUSH(out, out_st);
  while (n) {
    lop_frame *f = &fr[n - 1];
    const kex_lop *done = NULL;
    if (f->next == -1) {
      kex_lb *buf = f->buf;
      const kex_st *st = f->st;
      if (!kex_lb_is_base(buf)) {
        st = kex_st_add(s->sh, buf->st, st);
        if (!st) {
          rc = oom(s);
          goto out;
        }
        buf = buf->base;
        f->buf = buf;
        f->st = st;
      }
      bool leaf = buf->op == KEX_OP_CONST || buf->realized || (in_realizes(buf) && buf->mark2 != g->gep);
      if (leaf && buf->memo_epoch == g->gep && buf->memo_st == st) {
        done = buf->memo_lop; /* the same leaf again (e.g. an input read by every node of a chain) */
      } else if (leaf) {
        if (buf->op == KEX_OP_CONST) {
          const kex_st *ss = kex_st_simplify(s->sh, st);
          done = ss ? make_leaf(s, KEX_OP_BCONST, buf->dtype, 0, ss, buf->arg) : NULL;
          if (!done) {
            rc = oom(s);
            goto out;
          }
        } else if ((rc = lazyop_input(s, g, buf, st, &done))) {
          goto out;
        }
        buf->memo_epoch = g->gep;
        buf->memo_st = st;
        buf->memo_lop = done;
      } else if (buf->op == KEX_OP_CONTIGUOUS || buf->op == KEX_OP_ASSIGN) {
        f->buf = buf->srcs[0]; /* the store does the work */
        continue;
      } else {
        f->child_st = st;
        if (KEX_OP_IS_REDUCE(buf->op)) {
          kex_lb *src = buf->srcs[0];
          f->child_st = kex_st_from_shape_of(s->sh, src->st);
          if (!f->child_st) {
            rc = oom(s);
            goto out;
          }
          f->st = f->child_st;
        }
        if (buf->memo_epoch == g->gep && buf->memo_st == f->st) {
          done = buf->memo_lop;
        } else {
          void **memo = s->visit.len ? kex_ptrmap_find(&s->visit, buf, f->st) : NULL;
          if (memo) done = *memo;
          else f->next = 0;
        }
      }
    }
    if (!done) {
      if (f->next < f->buf->nsrc) {
        kex_lb *child = f->buf->srcs[f->next];
        const kex_st *cst = f->child_st;
        PUSH(child, cst);
        continue;
      }
      kex_lb *buf = f->buf;
      kex_lop t = {0};
      t.op = buf->op;
      t.nsrc = buf->nsrc;
      for (int i = 0; i < buf->nsrc; i++) {
        t.src[i] = f->res[i];
        if (f->res[i]->depth > t.depth) t.depth = f->res[i]->depth;
      }
      t.depth++;
      t.dtype = buf->dtype;
      if (buf->op == KEX_OP_CAST || buf->op == KEX_OP_BITCAST) t.cast_to = buf->dtype;
      if (KEX_OP_IS_REDUCE(buf->op)) t.axis_mask = buf->axis_mask;
      if ((rc = kernel_limits(s, g, outi, buf, t.depth, false))) goto out;
      done = lop_new(s->arena, &t);
      if (!done) {
        rc = oom(s);
        goto out;
      }
      if (buf->memo_epoch != g->gep) {
        buf->memo_epoch = g->gep;
        buf->memo_st = f->st;
        buf->memo_lop = done;
      } else if (kex_ptrmap_put(&s->visit, buf, f->st, (void *)done)) {
        rc = oom(s);
        goto out;
      }
    }
    n--;
    if (n) {
      lop_frame *p = &fr[n - 1];
      p->res[p->next++] = done;
    } else {
      ret = done;
    }
  }
#undef PUSH
out:
  *result = ret;
  return rc;
}

static kex_item_kind loadop_kind(kex_op op) {
  switch (op) {
  case KEX_OP_EMPTY: return KEX_ITEM_EMPTY;
  case KEX_OP_COPY: return KEX_ITEM_COPY;
  case KEX_OP_CUSTOM: return KEX_ITEM_CUSTOM;
  case KEX_OP_VIEW: return KEX_ITEM_VIEW;
  default: return KEX_ITEM_KERNEL;
  }
}

/* _schedule_group: one prescheduled item for a group of outputs. */
static int schedule_group(sched *s, kex_lb **outs, uint32_t nout, kex_sched_item *it) {
  int rc = 0;
  group_ctx g = {outs, nout, s->inputs, ++s->epoch};
  g.inputs.len = 0;
  ++s->epoch; /* gep + 1 marks inputs */
  memset(it, 0, sizeof *it);
  it->kind = loadop_kind(outs[0]->op);
  it->nout = nout;
  it->outs = outs;
  for (uint32_t i = 0; i < nout; i++) outs[i]->mark2 = g.gep;
  if (it->kind != KEX_ITEM_KERNEL) {
    for (int i = 0; i < outs[0]->nsrc; i++)
      if (pv_push(&g.inputs, outs[0]->srcs[i]->base)) {
        rc = oom(s);
        goto out;
      }
  } else {
    it->ast = kex_arena_calloc(s->arena, nout, sizeof *it->ast);
    if (!it->ast) {
      rc = oom(s);
      goto out;
    }
    kex_ptrmap_clear(&s->visit);
    for (uint32_t i = 0; i < nout; i++) {
      kex_lb *o = outs[i];
      const kex_lb *shape_of = o->reduce_for_op ? o->reduce_for_op : o;
      const kex_st *ost = kex_st_from_shape_of(s->sh, shape_of->st);
      if (!ost) {
        rc = oom(s);
        goto out;
      }
      const kex_lop *lop;
      if ((rc = recursive_lazyop(s, &g, i, ost, &lop))) goto out;
      const kex_st *view = (o->op == KEX_OP_ASSIGN && o->assign_st) ? o->assign_st : ost;
      view = kex_st_simplify(s->sh, view);
      kex_lop t = {0};
      t.op = KEX_OP_STORE;
      t.nsrc = 1;
      t.src[0] = lop;
      t.dtype = o->dtype;
      t.idx = (int32_t)i;
      t.st = view;
      t.depth = lop->depth + 1;
      if ((rc = kernel_limits(s, &g, i, o, t.depth, true))) goto out;
      it->ast[i] = view ? lop_new(s->arena, &t) : NULL;
      if (!it->ast[i]) {
        rc = oom(s);
        goto out;
      }
    }
  }
  it->nin = g.inputs.len;
  it->ins = kex_arena_alloc(s->arena, sizeof(kex_lb *) * (g.inputs.len ? g.inputs.len : 1));
  if (it->ins && g.inputs.len) memcpy(it->ins, g.inputs.v, sizeof(kex_lb *) * g.inputs.len);
  if (!it->ins) rc = oom(s);
out:
  s->inputs = g.inputs;
  return rc;
}

/* ---- the whole schedule ---- */

int kex_memplan(kex_schedule *sc, kex_arena *scratch, kex_error *err); /* memplan.c */

/*
 * Which buffers are realized (tinygrad's realizes): the outputs' bases and
 * what _recurse_lb finds under them, assign targets marked, unsafe pads and
 * the reduces' groups decided.  0, or the error of oom().
 */
static int find_realizes(sched *s) {
  const kex_replay *r = s->r;
  const kex_graph *gr = r->graph;
  for (uint32_t i = 0; i < gr->noutputs; i++) {
    kex_lb *b = r->node_lb[gr->outputs[i]]->base;
    if (!b->realized && add_realize(s, b)) return oom(s);
  }
  for (uint32_t i = 0; i < gr->noutputs; i++)
    if (recurse_lb(s, r->node_lb[gr->outputs[i]]->base)) return oom(s);
  /* assign_targets */
  for (uint32_t i = 0; i < s->realizes.len; i++) {
    kex_lb *x = s->realizes.v[i];
    if (x->op == KEX_OP_ASSIGN && !x->realized) {
      kex_lb *t = x->srcs[1];
      t->flags |= F_ASSIGN_TARGET;
      t->assign_of = x;
    }
  }
  /* pads that are not safe to fuse realize first */
  for (uint32_t i = 0; i < s->simple_pads.len; i++) {
    kex_lb *p = s->simple_pads.v[i];
    int ok = padding_okay(s, p);
    if (ok < 0 || (!ok && add_realize(s, p))) return oom(s);
  }
  /* reduce grouping */
  for (uint32_t i = 0; i < s->allbufs.len; i++) {
    kex_lb *rb = s->allbufs.v[i];
    if (!KEX_OP_IS_REDUCE(rb->op) || in_realizes(rb)) continue;
    if (group_reduce(s, rb)) return oom(s);
  }
  return 0;
}

/*
 * The prescheduled items (tinygrad's prescheduled): the realized buffers
 * grouped by the reduce they belong to, each group scheduled into one item.
 * *pre (in the scratch arena) gets *npre items.  0, or an error.
 */
static int preschedule(sched *s, kex_sched_item **pre, uint32_t *npre) {
  ptrvec keys = {.a = s->scratch};
  ptrvec *members = NULL;
  uint32_t capm = 0;
  int rc = 0;
  for (uint32_t i = 0; i < s->realizes.len; i++) {
    kex_lb *b = s->realizes.v[i];
    if (b->realized || b->op == KEX_OP_CONST) continue;
    kex_lb *key = b->reduce_for_op ? b->reduce_for_op : b;
    if (key->group_slot < 0 || key->group_slot >= (int32_t)keys.len || keys.v[key->group_slot] != key) {
      key->group_slot = (int32_t)keys.len;
      if (pv_push(&keys, key) || kex_arena_grow(s->scratch, &members, keys.len - 1, &capm, sizeof *members, 16))
        goto nomem;
      members[keys.len - 1] = (ptrvec){.a = s->scratch};
    }
    if (pv_push(&members[key->group_slot], b)) goto nomem;
  }
  *npre = keys.len;
  *pre = kex_arena_calloc(s->scratch, *npre ? *npre : 1, sizeof **pre);
  if (!*pre) goto nomem;
  for (uint32_t k = 0; k < *npre; k++) {
    kex_lb **outs = kex_arena_memdup(s->arena, members[k].v, sizeof(kex_lb *) * members[k].len);
    if (!outs) goto nomem;
    if ((rc = schedule_group(s, outs, members[k].len, &(*pre)[k]))) goto out;
  }
  goto out;
nomem:
  rc = oom(s);
out:
  for (uint32_t k = 0; k < keys.len; k++) ((kex_lb *)keys.v[k])->group_slot = -1;
  return rc;
}

/*
 * Order the prescheduled items (tinygrad's graph + in_degree + BFS): an edge
 * from the item that writes a buffer to each item that reads it, and from
 * each reader of an assign target to the item that assigns it; Kahn's BFS in
 * prescheduled order fills sc->items.  0, KEX_ECYCLE, or the error of oom().
 */
static int order_items(sched *s, kex_schedule *sc, kex_sched_item *pre, uint32_t npre) {
  const kex_replay *r = s->r;
  uint32_t *in_degree = kex_arena_calloc(s->scratch, npre ? npre : 1, sizeof *in_degree);
  uint32_t *queue = kex_arena_alloc(s->scratch, sizeof *queue * (npre ? npre : 1));
  ptrvec *edges = kex_arena_alloc(s->scratch, sizeof *edges * (npre ? npre : 1));
  int rc = 0;
  if (!in_degree || !edges || !queue) goto nomem;
  for (uint32_t k = 0; k < npre; k++) edges[k] = (ptrvec){.a = s->scratch};
  /* schedule_targets: output base -> prescheduled index (in group_slot, reset by preschedule) */
  for (uint32_t k = 0; k < npre; k++)
    for (uint32_t j = 0; j < pre[k].nout; j++) pre[k].outs[j]->group_slot = (int32_t)k;
  for (uint32_t k = 0; k < npre; k++) {
    uint32_t ep = ++s->epoch;
    for (uint32_t j = 0; j < pre[k].nin; j++) {
      kex_lb *x = pre[k].ins[j];
      if (x->group_slot >= 0) {
        uint32_t p = (uint32_t)x->group_slot;
        if (pre[p].outs[0]->mark != ep) { /* set(): one edge per parent item */
          pre[p].outs[0]->mark = ep;
          if (pv_push(&edges[p], (void *)(uintptr_t)k)) goto nomem;
          in_degree[k]++;
        }
      }
    }
    ep = ++s->epoch;
    for (uint32_t j = 0; j < pre[k].nin; j++) {
      kex_lb *x = pre[k].ins[j];
      if ((x->flags & F_ASSIGN_TARGET) && x->assign_of->group_slot >= 0) {
        uint32_t a = (uint32_t)x->assign_of->group_slot;
        if (pre[a].outs[0]->mark2 != ep) {
          pre[a].outs[0]->mark2 = ep;
          if (pv_push(&edges[k], (void *)(uintptr_t)a)) goto nomem;
          in_degree[a]++;
        }
      }
    }
  }
  /* Kahn BFS in prescheduled order */
  sc->items = kex_arena_calloc(s->arena, npre ? npre : 1, sizeof *sc->items);
  if (!sc->items) goto nomem;
  uint32_t qh = 0, qt = 0;
  for (uint32_t k = 0; k < npre; k++)
    if (!in_degree[k]) queue[qt++] = k;
  while (qh < qt) {
    uint32_t k = queue[qh++];
    kex_sched_item *it = &sc->items[sc->nitems++];
    *it = pre[k];
    for (uint32_t j = 0; j < it->nout; j++) it->outs[j]->realized = true;
    if (it->kind == KEX_ITEM_KERNEL) sc->nkernels++;
    it->bufs = kex_arena_alloc(s->arena, sizeof(uint32_t) * (it->nout + it->nin + 1));
    if (!it->bufs) goto nomem;
    for (uint32_t j = 0; j < it->nout + it->nin; j++) {
      kex_lb *b = j < it->nout ? it->outs[j] : it->ins[j - it->nout];
      if (r->buffers[b->buffer].size != 0) it->bufs[it->nbufs++] = b->buffer;
    }
    for (uint32_t e = 0; e < edges[k].len; e++) {
      uint32_t c = (uint32_t)(uintptr_t)edges[k].v[e];
      if (--in_degree[c] == 0) queue[qt++] = c;
    }
  }
  if (sc->nitems != npre)
    rc = kex_err_set(s->err, KEX_ECYCLE, "cycle detected in graph, prescheduled %u but only scheduled %u", npre,
                     sc->nitems);
  goto out;
nomem:
  rc = oom(s);
out:
  return rc;
}

int kex_schedule_create(kex_replay *r, kex_schedule **out, kex_error *err) {
  int rc = 0;
  *out = NULL;
  sched s = {0};
  s.r = r;
  s.sh = r->shape;
  s.arena = r->arena;
  s.err = err;
  kex_arena own_scratch;
  kex_replay_tables *keep = r->opts.tables;
  if (keep && !keep->scratch.block_size) kex_arena_init(&keep->scratch, 0);
  if (!keep) kex_arena_init(&own_scratch, 0);
  s.scratch = keep ? &keep->scratch : &own_scratch;
  s.realizes.a = s.allbufs.a = s.simple_pads.a = s.stack.a = s.stack2.a = s.group.a = s.tmp.a = s.inputs.a = s.scratch;
  (void)kex_shape_error(s.sh, NULL); /* a long-lived context may hold an earlier graph's refusal */
  kex_schedule *sc = kex_arena_calloc(r->arena, 1, sizeof *sc);
  struct kex_sched_tables *lops = kex_arena_calloc(r->arena, 1, sizeof *lops);
  kex_sched_item *pre = NULL;
  uint32_t npre = 0;
  if (!sc || !lops) {
    rc = oom(&s);
    goto out;
  }
  lops->keep = r->opts.tables;
  lops->lops = lops->keep ? kex_replay_tables_take(&lops->keep->lops, &lop_table_type) : kex_dict_make(&lop_table_type);
  if (lops->keep) s.visit = kex_replay_tables_take(&lops->keep->visit, NULL);
  (void)kex_dict_reserve(&lops->lops, r->nlbs / 4); /* about one leaf LazyOp per four LazyBuffers */
  sc->replay = r;
  sc->tables = lops;
  s.lops = lops;
  if (!(rc = find_realizes(&s)) && !(rc = preschedule(&s, &pre, &npre)) && !(rc = order_items(&s, sc, pre, npre)))
    rc = kex_memplan(sc, s.scratch, err);
out:
  if (lops && lops->keep) kex_replay_tables_give(&lops->keep->visit, &s.visit);
  else kex_ptrmap_free(&s.visit);
  if (keep) kex_arena_reset(s.scratch);
  else kex_arena_destroy(s.scratch);
  if (rc) {
    kex_schedule_free(sc);
    sc = NULL;
  }
  *out = sc;
  return rc;
}

void kex_schedule_free(kex_schedule *s) {
  if (!s) return;
  if (s->tables && s->tables->keep) kex_replay_tables_give(&s->tables->keep->lops, &s->tables->lops);
  else if (s->tables) kex_dict_free(&s->tables->lops);
}

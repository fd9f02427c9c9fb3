/*
 * astkey.c - canonical AST text and its SHA-256 (the beam cache's AST key).
 *
 * One pass over the kernel's STORE roots with an explicit stack: a node is
 * numbered when its last source is done (postorder, roots and sources in
 * order).  Two core/dict tables make the numbering canonical: a pointer memo (each
 * kex_lop is formatted once) and a structural table keyed by the node's
 * line body, whose sources are already canonical numbers, so equal sub-DAGs
 * get one number whether or not the scheduler shared their pointers.  The
 * text buffer doubles as the store of the line bodies the structural table
 * compares against.  SHA-256 (core/codec.c) is tested against the FIPS
 * 180-4 vectors in tests/unit/test_astkey.c.
 */
#include "codegen/astkey.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dict.h"
#include "core/hash.h"

/* ---- a growable text buffer (sticky OOM) ---- */

typedef struct text_buf {
  char *p;
  size_t len, cap;
  bool oom;
} text_buf;

static bool buf_reserve(text_buf *b, size_t extra) {
  if (b->oom) return false;
  if (b->len + extra + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = kex_realloc(b->p, cap);
  if (!p) return !(b->oom = true);
  b->p = p, b->cap = cap;
  return true;
}

static void buf_put(text_buf *b, const char *s, size_t n) {
  if (!buf_reserve(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void buf_printf(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(text_buf *b, const char *fmt, ...) {
  va_list ap;
  char small[128];
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    buf_put(b, small, (size_t)n);
    return;
  }
  if (!buf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* ShapeTracker repr appended to b. */
static void buf_st(text_buf *b, const kex_st *st) {
  char small[512];
  int n = kex_st_repr(st, small, sizeof small);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    buf_put(b, small, (size_t)n);
    return;
  }
  if (!buf_reserve(b, (size_t)n)) return;
  kex_st_repr(st, b->p + b->len, (size_t)n + 1);
  b->len += (size_t)n;
}

/* ---- the walk ---- */

typedef struct node_rec {
  size_t body_off; /* offset of the line body in the text */
  uint32_t body_len;
  uint64_t hash;
} node_rec;

typedef struct walk_frame {
  const kex_lop *n;
  uint32_t next; /* next source to visit */
} walk_frame;

typedef struct ast_walk {
  text_buf text, line;
  kex_dict numbered; /* pointer memo: node_number entries, keyed by the kex_lop's address */
  kex_dict bodies;   /* structural table: uint32_t node ids, keyed by their line body (probe: the walk's line) */
  node_rec *nodes;
  uint32_t nnodes, capnodes;
  walk_frame *stack;
  uint32_t sp, capstack;
} ast_walk;

typedef struct node_number {
  const kex_lop *n;
  uint32_t id;
} node_number;

static uint64_t ptr_hash(const void *p) { return kex_hash_u64(0, (uint64_t)(uintptr_t)p); }

static bool number_eq(const void *entry, const void *probe) { return ((const node_number *)entry)->n == probe; }

/* A node id matches the walk's current line when its body is that line. */
static bool body_eq(const void *entry, const void *probe) {
  const ast_walk *w = probe;
  const node_rec *r = &w->nodes[*(const uint32_t *)entry];
  return r->body_len == w->line.len && !memcmp(w->text.p + r->body_off, w->line.p, w->line.len);
}

static const kex_dict_type number_type = {sizeof(node_number), number_eq, 1024};
static const kex_dict_type body_type = {sizeof(uint32_t), body_eq, 1024};

/* The canonical number of a finished node, or -1 when not seen yet. */
static int64_t memo_get(const ast_walk *w, const kex_lop *n) {
  const node_number *e = kex_dict_find(&w->numbered, ptr_hash(n), n);
  return e ? (int64_t)e->id : -1;
}

static int memo_put(ast_walk *w, const kex_lop *n, uint32_t id) {
  bool found;
  node_number *e = kex_dict_insert(&w->numbered, ptr_hash(n), n, &found);
  if (!e) return KEX_ENOMEM;
  *e = (node_number){n, id};
  return 0;
}

/* The id of the node whose body is w->line (hash h), -1 when new. */
static int64_t struct_find(const ast_walk *w, uint64_t h) {
  const uint32_t *id = kex_dict_find(&w->bodies, h, w);
  return id ? (int64_t)*id : -1;
}

/* Add node id, whose body is w->line. */
static int struct_add(ast_walk *w, uint32_t id) {
  bool found;
  uint32_t *e = kex_dict_insert(&w->bodies, w->nodes[id].hash, w, &found);
  if (!e) return KEX_ENOMEM;
  *e = id;
  return 0;
}

/* The line body of n (sources already numbered) into w->line. */
static int format_body(ast_walk *w, const kex_lop *n, int64_t idx, kex_error *err) {
  text_buf *b = &w->line;
  b->len = 0;
  if (b->p) b->p[0] = 0;
  buf_printf(b, "%s %s", kex_op_name(n->op), kex_dtypes[n->dtype].name);
  switch (n->op) {
  case KEX_OP_LOAD:
  case KEX_OP_STORE:
  case KEX_OP_BCONST:
    if (!n->st) return kex_err_set(err, KEX_EINVAL, "AST node %lld (%s) has no ShapeTracker", (long long)idx,
                                   kex_op_name(n->op));
    if (n->op == KEX_OP_BCONST) {
      if (n->val.kind == KEX_CONST_FLOAT) {
        uint64_t bits;
        memcpy(&bits, &n->val.f, sizeof bits);
        buf_printf(b, " val=f:0x%016llx", (unsigned long long)bits);
      } else if (n->val.kind == KEX_CONST_INT) {
        buf_printf(b, " val=i:%lld", (long long)n->val.i);
      } else if (n->val.kind == KEX_CONST_BOOL) {
        buf_printf(b, " val=b:%d", n->val.b ? 1 : 0);
      } else {
        return kex_err_set(err, KEX_EINVAL, "AST node %lld: const kind %d is unknown", (long long)idx,
                           (int)n->val.kind);
      }
    } else {
      buf_printf(b, " idx=%d", (int)n->idx);
    }
    buf_put(b, " st=", 4);
    buf_st(b, n->st);
    break;
  case KEX_OP_CAST:
  case KEX_OP_BITCAST:
    if ((unsigned)n->cast_to >= KEX_DT_COUNT)
      return kex_err_set(err, KEX_EINVAL, "AST node %lld: cast dtype %d is out of range", (long long)idx,
                         (int)n->cast_to);
    buf_printf(b, " to=%s", kex_dtypes[n->cast_to].name);
    break;
  case KEX_OP_SUM:
  case KEX_OP_RMAX:
    buf_put(b, " axis=(", 7);
    for (int a = 0; a < 32; a++)
      if (n->axis_mask >> a & 1) buf_printf(b, "%d,", a);
    buf_put(b, ")", 1);
    break;
  default:
    break;
  }
  for (uint32_t i = 0; i < n->nsrc; i++) buf_printf(b, "%s%u", i ? ",%" : " src=%", (unsigned)memo_get(w, n->src[i]));
  return b->oom ? KEX_ENOMEM : 0;
}

static int check_node(const kex_lop *n, const char *what, uint32_t i, kex_error *err) {
  if (!n) return kex_err_set(err, KEX_EINVAL, "AST %s %u is NULL", what, i);
  if ((unsigned)n->op >= KEX_OP_COUNT) return kex_err_set(err, KEX_EINVAL, "AST %s %u: op %d is out of range", what, i, (int)n->op);
  if ((unsigned)n->dtype >= KEX_DT_COUNT)
    return kex_err_set(err, KEX_EINVAL, "AST %s %u: dtype %d is out of range", what, i, (int)n->dtype);
  if (n->nsrc > 3) return kex_err_set(err, KEX_EINVAL, "AST %s %u: %u sources (at most 3)", what, i, n->nsrc);
  return 0;
}

static int push(ast_walk *w, const kex_lop *n, kex_error *err) {
  if (w->sp == w->capstack) {
    if (w->capstack >= KEX_AST_MAX_NODES)
      return kex_err_set(err, KEX_ELIMIT, "AST is deeper than %u nodes (or cyclic)", KEX_AST_MAX_NODES);
    uint32_t cap = w->capstack ? w->capstack * 2 : 256;
    walk_frame *s = kex_realloc(w->stack, cap * sizeof *s);
    if (!s) return kex_err_set(err, KEX_ENOMEM, "AST key: out of memory for the walk stack");
    w->stack = s, w->capstack = cap;
  }
  w->stack[w->sp++] = (walk_frame){n, 0};
  return 0;
}

/* Number a node whose sources are all numbered: reuse a structurally equal one or append its line. */
static int finish(ast_walk *w, const kex_lop *n, kex_error *err) {
  int rc = format_body(w, n, w->nnodes, err);
  if (rc) return rc == KEX_ENOMEM ? kex_err_set(err, rc, "AST key: out of memory") : rc;
  uint64_t h = kex_hash_bytes(w->line.p, w->line.len, 0);
  int64_t id = struct_find(w, h);
  if (id < 0) {
    if (w->nnodes >= KEX_AST_MAX_NODES)
      return kex_err_set(err, KEX_ELIMIT, "AST has more than %u distinct nodes", KEX_AST_MAX_NODES);
    if (w->nnodes == w->capnodes) {
      uint32_t cap = w->capnodes ? w->capnodes * 2 : 256;
      node_rec *r = kex_realloc(w->nodes, cap * sizeof *r);
      if (!r) return kex_err_set(err, KEX_ENOMEM, "AST key: out of memory");
      w->nodes = r, w->capnodes = cap;
    }
    id = w->nnodes;
    buf_printf(&w->text, "%%%u ", (unsigned)id);
    size_t off = w->text.len;
    buf_put(&w->text, w->line.p, w->line.len);
    buf_put(&w->text, "\n", 1);
    if (w->text.oom) return kex_err_set(err, KEX_ENOMEM, "AST key: out of memory for the text");
    w->nodes[w->nnodes++] = (node_rec){off, (uint32_t)w->line.len, h};
    if (struct_add(w, (uint32_t)id)) return kex_err_set(err, KEX_ENOMEM, "AST key: out of memory");
  }
  if (memo_put(w, n, (uint32_t)id)) return kex_err_set(err, KEX_ENOMEM, "AST key: out of memory");
  return 0;
}

static void walk_free(ast_walk *w) {
  kex_free(w->line.p);
  kex_dict_free(&w->numbered);
  kex_dict_free(&w->bodies);
  kex_free(w->nodes);
  kex_free(w->stack);
}

int kex_ast_text(const kex_lop *const *ast, uint32_t nout, char **out, size_t *len, kex_error *err) {
  ast_walk w = {.numbered = kex_dict_make(&number_type), .bodies = kex_dict_make(&body_type)};
  int rc = 0;

  *out = NULL;
  if (len) *len = 0;
  if (nout == 0 || !ast) {
    rc = kex_err_set(err, KEX_EINVAL, "AST key: a kernel needs at least one output");
    goto out;
  }
  if (nout > KEX_AST_MAX_OUTPUTS) {
    rc = kex_err_set(err, KEX_ELIMIT, "AST key: %u outputs (at most %u)", nout, KEX_AST_MAX_OUTPUTS);
    goto out;
  }
  buf_printf(&w.text, "%s\noutputs %u\n", KEX_AST_KEY_VERSION, nout);
  for (uint32_t r = 0; r < nout; r++) {
    if ((rc = check_node(ast[r], "output", r, err))) goto out;
    if (memo_get(&w, ast[r]) >= 0) continue;
    if ((rc = push(&w, ast[r], err))) goto out;
    while (w.sp) {
      walk_frame *f = &w.stack[w.sp - 1];
      if (f->next < f->n->nsrc) {
        const kex_lop *c = f->n->src[f->next++];
        if ((rc = check_node(c, "source of node at depth", w.sp, err))) goto out;
        if (memo_get(&w, c) < 0 && (rc = push(&w, c, err))) goto out;
        continue;
      }
      if ((rc = finish(&w, f->n, err))) goto out;
      w.sp--;
    }
  }
  for (uint32_t r = 0; r < nout; r++) buf_printf(&w.text, "out %%%u\n", (unsigned)memo_get(&w, ast[r]));
  if (w.text.oom) {
    rc = kex_err_set(err, KEX_ENOMEM, "AST key: out of memory for the text");
    goto out;
  }
  *out = w.text.p;
  if (len) *len = w.text.len;
  w.text.p = NULL;
out:
  kex_free(w.text.p);
  walk_free(&w);
  return rc;
}

int kex_ast_key(const kex_lop *const *ast, uint32_t nout, kex_ast_digest *key, kex_error *err) {
  char *text = NULL;
  size_t len = 0;
  int rc = kex_ast_text(ast, nout, &text, &len, err);
  if (rc) goto out;
  if (kex_sha256_bytes(text, len, key->bytes)) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory hashing the AST");
    goto out;
  }
  kex_hex(key->bytes, KEX_AST_KEY_BYTES, key->hex);
out:
  kex_free(text);
  return rc;
}

/*
 * graph.c - the client graph: builder, validation, and the JSON loader.
 *
 * A graph arrives either node by node through kex_graph_add (the protobuf
 * decoder and tests) or as the JSON text of ../shared/graph-format.md
 * (kex_graph_from_json, parsed with jansson).  Both paths meet in graph_add,
 * which checks one node against the nodes before it and the kex_limits,
 * infers its dtype and shape with the rules of LazyBuffer.e / cast / r and
 * the view methods (spec section 5), and copies everything it keeps into the
 * graph's arena.  Every shape, given or inferred, is bounded (max_elements
 * on the product of its non-zero dims, so a 0 dim cannot hide a huge one),
 * so is every |STRIDE|, and every node's dependency depth (1 + its deepest
 * source) is at most max_depth; the graph keeps the limits for the scheduler.  Every refusal names the node index, the op and what was
 * wrong; structural errors are KEX_EINVAL, exceeded limits KEX_ELIMIT, and an
 * allocation failure anywhere is KEX_ENOMEM with nothing leaked.  Buffer
 * handles are only stored here; resolving them (NOT_FOUND) is the daemon's.
 */
#include "sched/graph.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/codec.h"

#define GRAPH_FORMAT "kex.graph.v1"
#define GRAPH_DEFAULT_DEVICE "default"
#define GRAPH_MIN_CAP 16u
#define SHAPE_STR_MAX 200 /* room for a shape in a message; longer ones are cut */

/* ---- op table ---- */

static const struct {
  const char *name;
  int nsrc;
} gop_table[KEX_GOP_COUNT] = {
#define XX(e, name, nsrc) {name, nsrc},
    KEX_GOP_MAP(XX)
#undef XX
};

const char *kex_gop_name(kex_gop op) { return (unsigned)op < KEX_GOP_COUNT ? gop_table[op].name : "?"; }

int kex_gop_from_name(const char *name) {
  for (int i = 0; i < KEX_GOP_COUNT; i++) /* the first byte first: a strcmp per table entry per node added up */
    if (gop_table[i].name[0] == name[0] && strcmp(gop_table[i].name, name) == 0) return i;
  return -1;
}

int kex_gop_nsrc(kex_gop op) { return (unsigned)op < KEX_GOP_COUNT ? gop_table[op].nsrc : -1; }

static bool gop_is_input(kex_gop op) { return op == KEX_GOP_BUFFER || op == KEX_GOP_EMPTY || op == KEX_GOP_CONST; }
static bool gop_is_unary(kex_gop op) { return op >= KEX_GOP_EXP2 && op <= KEX_GOP_NEG; }
static bool gop_is_cast(kex_gop op) { return op == KEX_GOP_CAST || op == KEX_GOP_BITCAST; }
static bool gop_is_binary(kex_gop op) { return op >= KEX_GOP_ADD && op <= KEX_GOP_XOR; }
static bool gop_is_ternary(kex_gop op) { return op == KEX_GOP_WHERE || op == KEX_GOP_MULACC; }
static bool gop_is_reduce(kex_gop op) { return op == KEX_GOP_REDUCE_SUM || op == KEX_GOP_REDUCE_MAX; }
bool kex_gop_is_movement(kex_gop op) { return op >= KEX_GOP_RESHAPE && op <= KEX_GOP_STRIDE; }

uint32_t kex_graph_base(const kex_graph *g, uint32_t idx) {
  while (idx < g->nnodes && kex_gop_is_movement(g->nodes[idx].op)) idx = g->nodes[idx].src[0];
  return idx;
}

/* ---- small helpers ---- */

/*
 * Element count of a shape: *nonzero gets the product of its non-zero dims
 * and *prod the true product (0 when any dim is 0).  0, or -1 when the
 * non-zero dims overflow int64 (the true product is then unknown).
 */
static int shape_prod(uint32_t ndim, const int64_t *shape, int64_t *nonzero, int64_t *prod) {
  int64_t p = 1;
  bool zero = false;
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] == 0) zero = true;
    else if (__builtin_mul_overflow(p, shape[i], &p)) return -1;
  }
  *nonzero = p;
  *prod = zero ? 0 : p;
  return 0;
}

/* The dims limit in force: the configured one, never above the hard KEX_MAX_DIMS. */
static uint32_t limit_dims(const kex_limits *lim) {
  return lim->max_dims < KEX_MAX_DIMS ? lim->max_dims : KEX_MAX_DIMS;
}

/* The node limit in force; indices are returned as int, so never above INT_MAX. */
static uint32_t limit_nodes(const kex_limits *lim) {
  return lim->max_nodes < (uint32_t)INT_MAX ? lim->max_nodes : (uint32_t)INT_MAX;
}

/*
 * Check a shape (`what` names it in messages) against the dims and elements
 * limits: KEX_ELIMIT when over, KEX_EINVAL for a negative dim.  The elements
 * limit applies to the product of the non-zero dims, so a 0 elsewhere does not
 * let a huge dim through: (2**62+1, 4, 0) is refused although it holds
 * nothing, since a REDUCE over its 0 axis would hold (2**62+1, 4, 1).
 * *elements receives the element count (0 when a dim is 0).  `idx`/`opname`
 * prefix the message.
 */
static int check_shape(uint32_t idx, const char *opname, const char *what, uint32_t ndim, const int64_t *shape,
                       const kex_limits *lim, int64_t *elements, kex_error *err) {
  char sb[SHAPE_STR_MAX];
  int64_t nonzero, n;
  if (ndim > limit_dims(lim))
    return kex_err_set(err, KEX_ELIMIT, "node %u (%s): %s has %u dims, more than the limit of %u (max_dims)", idx,
                       opname, what, ndim, limit_dims(lim));
  if (ndim && !shape) return kex_err_set(err, KEX_EINVAL, "node %u (%s): %s is missing", idx, opname, what);
  for (uint32_t i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return kex_err_set(err, KEX_EINVAL, "node %u (%s): %s %s has negative dim %u (%" PRId64 ")", idx, opname, what,
                         kex_tuple_repr(sb, sizeof sb, (int)ndim, shape), i, shape[i]);
  if (shape_prod(ndim, shape, &nonzero, &n) < 0)
    return kex_err_set(err, KEX_ELIMIT,
                       "node %u (%s): %s %s: its non-zero dims multiply past int64, more than the limit of %" PRId64
                       " elements",
                       idx, opname, what, kex_tuple_repr(sb, sizeof sb, (int)ndim, shape), lim->max_elements);
  if (nonzero > lim->max_elements)
    return kex_err_set(err, KEX_ELIMIT,
                       "node %u (%s): %s %s: its non-zero dims multiply to %" PRId64 ", more than the limit of %" PRId64
                       " elements",
                       idx, opname, what, kex_tuple_repr(sb, sizeof sb, (int)ndim, shape), nonzero, lim->max_elements);
  *elements = n;
  return 0;
}

/*
 * Convert a CONST or fill value to dtype `dt` as tinygrad's dtypes.as_const
 * does.  Refuses (KEX_EINVAL) what Python's int() would raise on (inf, nan)
 * and floats outside the int64 range for int dtypes.
 */
static int convert_const(uint32_t idx, const char *opname, const char *what, kex_const v, kex_dtype dt,
                         kex_const *out, kex_error *err) {
  if ((unsigned)v.kind > KEX_CONST_BOOL)
    return kex_err_set(err, KEX_EINVAL, "node %u (%s): %s has an unknown kind %d", idx, opname, what, (int)v.kind);
  if (kex_dtype_is_int(dt) && v.kind == KEX_CONST_FLOAT) {
    char rb[64];
    kex_const_repr(v, rb, sizeof rb);
    if (!isfinite(v.f))
      return kex_err_set(err, KEX_EINVAL, "node %u (%s): %s %s cannot be converted to int dtype %s", idx, opname, what,
                         rb, kex_dtypes[dt].name);
    if (v.f >= 9223372036854775808.0 || v.f < -9223372036854775808.0)
      return kex_err_set(err, KEX_EINVAL, "node %u (%s): %s %s is out of the int64 range of dtype %s", idx, opname,
                         what, rb, kex_dtypes[dt].name);
  }
  *out = kex_const_as(v, dt);
  return 0;
}

/* Grow g->nodes to hold at least `need` nodes. 0 or KEX_ENOMEM (graph unchanged). */
static int reserve_nodes(kex_graph *g, uint32_t need) {
  if (need <= g->cap) return 0;
  uint32_t cap = g->cap ? g->cap : GRAPH_MIN_CAP;
  while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
  kex_gnode *nodes = kex_realloc(g->nodes, (size_t)cap * sizeof *nodes);
  if (!nodes) return KEX_ENOMEM;
  g->nodes = nodes;
  g->cap = cap;
  return 0;
}

/* ---- builder ---- */

kex_graph *kex_graph_new(const char *device) {
  kex_graph *g = kex_calloc(1, sizeof *g);
  if (!g) return NULL;
  kex_arena_init(&g->arena, 0);
  g->limits = KEX_LIMITS_DEFAULT;
  g->device = kex_arena_strdup(&g->arena, device ? device : GRAPH_DEFAULT_DEVICE);
  if (!g->device) {
    kex_arena_destroy(&g->arena);
    kex_free(g);
    return NULL;
  }
  return g;
}

void kex_graph_free(kex_graph *g) {
  if (!g) return;
  kex_free(g->nodes);
  kex_free(g->outputs);
  kex_arena_destroy(&g->arena);
  kex_free(g);
}

/* The inline data of a BUFFER: raw bytes (builder) or base64 text (JSON). */
typedef struct inline_data {
  const uint8_t *bytes;
  size_t len;
  const char *b64; /* when non-NULL, bytes/len are unused */
  size_t b64_len;
} inline_data;

#define FAIL(code, ...)                           \
  do {                                            \
    rc = node_err(err, code, idx, op, __VA_ARGS__); \
    goto out;                                     \
  } while (0)
#define NOMEM()          \
  do {                   \
    rc = KEX_ENOMEM;     \
    kex_err_set(err, KEX_ENOMEM, "node %u (%s): out of memory", idx, kex_gop_name(op)); \
    goto out;            \
  } while (0)

/* Set *err to "node IDX (OP): <message>" and return code. */
static int node_err(kex_error *err, int code, uint32_t idx, kex_gop op, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int node_err(kex_error *err, int code, uint32_t idx, kex_gop op, const char *fmt, ...) {
  char msg[KEX_ERROR_MSG_MAX];
  KEX_VFORMAT(msg, fmt);
  return kex_err_set(err, code, "node %u (%s): %s", idx, kex_gop_name(op), msg);
}

/*
 * Validate an input node (BUFFER EMPTY CONST) into *n: dtype, shape, value,
 * and a BUFFER's contents (checked against max_buffer_bytes and, for inline
 * data, its exact length and max_inline_bytes; base64 is decoded into the
 * arena here).  0 or a negative code with *err set.
 */
static int add_input(kex_graph *g, uint32_t idx, const kex_gnode *in, const inline_data *data, const kex_limits *lim,
                     kex_gnode *n, kex_error *err) {
  kex_gop op = in->op;
  const char *opname = kex_gop_name(op);
  int64_t elements, bytes;
  int rc = 0;
  if ((unsigned)in->dtype >= KEX_DT_COUNT) FAIL(KEX_EINVAL, "unknown dtype %d", (int)in->dtype);
  n->dtype = in->dtype;
  if ((rc = check_shape(idx, opname, "shape", in->ndim, in->shape, lim, &elements, err)) < 0) goto out;
  n->ndim = in->ndim;
  if (!(n->shape = kex_arena_memdup(&g->arena, in->shape, (size_t)in->ndim * sizeof *in->shape))) NOMEM();
  if (in->device) {
    if (!*in->device) FAIL(KEX_EINVAL, "device is empty");
    if (!(n->device = kex_arena_strdup(&g->arena, in->device))) NOMEM();
  }
  if (op == KEX_GOP_CONST) {
    if ((rc = convert_const(idx, opname, "value", in->value, in->dtype, &n->value, err)) < 0) goto out;
  }
  if (op == KEX_GOP_CONST) goto out; /* a 0-d constant viewed: no buffer of this size */

  /* BUFFER and EMPTY each become one buffer of prod(shape) * itemsize bytes */
  if (__builtin_mul_overflow(elements, (int64_t)kex_dtype_size(in->dtype), &bytes) || bytes > lim->max_buffer_bytes)
    FAIL(KEX_ELIMIT, "buffer of %" PRId64 " elements of %s is more than the limit of %" PRId64 " bytes", elements,
         kex_dtypes[in->dtype].name, lim->max_buffer_bytes);
  if (op != KEX_GOP_BUFFER) goto out;
  n->bufsrc = in->bufsrc;
  switch (in->bufsrc) {
  case KEX_BUF_DATA: {
    int64_t len = data->b64 ? kex_base64_decoded_len(data->b64, data->b64_len) : (int64_t)data->len;
    if (len < 0) FAIL(KEX_EINVAL, "data is not valid base64: its length %zu is not a multiple of 4", data->b64_len);
    if (len != bytes)
      FAIL(KEX_EINVAL, "inline data is %" PRId64 " bytes, expected prod(shape) * itemsize = %" PRId64 " * %d = %" PRId64,
           len, elements, kex_dtype_size(in->dtype), bytes);
    if (len > lim->max_inline_bytes - g->inline_bytes)
      FAIL(KEX_ELIMIT, "inline data of %" PRId64 " bytes brings the graph's total past the limit of %" PRId64 " bytes",
           len, lim->max_inline_bytes);
    uint8_t *buf = kex_arena_alloc(&g->arena, (size_t)len);
    if (!buf) NOMEM();
    if (data->b64) {
      size_t bad = 0;
      if (kex_base64_decode(data->b64, data->b64_len, buf, &bad) < 0)
        FAIL(KEX_EINVAL, "data is not valid base64: character '%c' (0x%02x) at offset %zu", data->b64[bad] >= 0x20 && data->b64[bad] < 0x7f ? data->b64[bad] : '?',
             (unsigned char)data->b64[bad], bad);
    } else if (len) {
      if (!data->bytes) FAIL(KEX_EINVAL, "inline data is missing");
      memcpy(buf, data->bytes, (size_t)len);
    }
    n->data = buf;
    n->data_len = (size_t)len;
    g->inline_bytes += len;
    break;
  }
  case KEX_BUF_FILL_RANDOM: n->seed = in->seed; break;
  case KEX_BUF_FILL_ARANGE: break;
  case KEX_BUF_FILL_VALUE:
    if ((rc = convert_const(idx, opname, "fill value", in->fill, in->dtype, &n->fill, err)) < 0) goto out;
    break;
  case KEX_BUF_HANDLE:
    if (!in->handle || !*in->handle) FAIL(KEX_EINVAL, "buffer handle is empty");
    if (!(n->handle = kex_arena_strdup(&g->arena, in->handle))) NOMEM();
    break;
  default: FAIL(KEX_EINVAL, "unknown buffer source %d", (int)in->bufsrc);
  }
out:
  return rc;
}

/* Elementwise ops: equal shapes, dtype rules of LazyBuffer.e and cast. */
static int add_elementwise(kex_graph *g, uint32_t idx, const kex_gnode *in, kex_gnode *n, kex_error *err) {
  kex_gop op = in->op;
  const kex_gnode *s[3] = {NULL, NULL, NULL};
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  int rc = 0;
  for (int i = 0; i < in->nsrc; i++) s[i] = &g->nodes[in->src[i]];
  for (int i = 1; i < in->nsrc; i++)
    if (s[i]->ndim != s[0]->ndim || memcmp(s[i]->shape, s[0]->shape, s[0]->ndim * sizeof *s[0]->shape))
      FAIL(KEX_EINVAL, "source shapes do not match: node %u has %s, node %u has %s", in->src[0],
           kex_tuple_repr(sa, sizeof sa, (int)s[0]->ndim, s[0]->shape), in->src[i], kex_tuple_repr(sb, sizeof sb, (int)s[i]->ndim, s[i]->shape));
  n->ndim = s[0]->ndim;
  n->shape = s[0]->shape; /* shapes are immutable arena arrays: shared */
  if (gop_is_cast(op)) {
    if ((unsigned)in->dtype >= KEX_DT_COUNT) FAIL(KEX_EINVAL, "unknown dtype %d", (int)in->dtype);
    if (op == KEX_GOP_BITCAST && kex_dtype_size(in->dtype) != kex_dtype_size(s[0]->dtype))
      FAIL(KEX_EINVAL, "bitcast from %s (%d bytes) to %s (%d bytes) changes the itemsize", kex_dtypes[s[0]->dtype].name,
           kex_dtype_size(s[0]->dtype), kex_dtypes[in->dtype].name, kex_dtype_size(in->dtype));
    n->dtype = in->dtype;
    goto out;
  }
  int first = 0;
  if (op == KEX_GOP_WHERE) {
    if (s[0]->dtype != KEX_DT_BOOL)
      FAIL(KEX_EINVAL, "condition node %u is %s, must be bool", in->src[0], kex_dtypes[s[0]->dtype].name);
    first = 1;
  }
  for (int i = first + 1; i < in->nsrc; i++)
    if (s[i]->dtype != s[first]->dtype)
      FAIL(KEX_EINVAL, "source dtypes do not match: node %u is %s, node %u is %s", in->src[first],
           kex_dtypes[s[first]->dtype].name, in->src[i], kex_dtypes[s[i]->dtype].name);
  n->dtype = (op == KEX_GOP_CMPLT || op == KEX_GOP_CMPEQ) ? KEX_DT_BOOL : s[in->nsrc - 1]->dtype;
out:
  return rc;
}

/* REDUCE_SUM / REDUCE_MAX: axes in range, distinct; keepdim shape; dtype kept. */
static int add_reduce(kex_graph *g, uint32_t idx, const kex_gnode *in, kex_gnode *n, kex_error *err) {
  kex_gop op = in->op;
  const kex_gnode *s = &g->nodes[in->src[0]];
  char sb[SHAPE_STR_MAX];
  uint32_t seen = 0; /* bit per dim: ndim <= KEX_MAX_DIMS <= 32 */
  int64_t *shape = NULL;
  int rc = 0;
  if (in->naxis && !in->axis) FAIL(KEX_EINVAL, "axis is missing");
  for (uint32_t i = 0; i < in->naxis; i++) {
    int32_t a = in->axis[i];
    if (a < 0)
      FAIL(KEX_EINVAL, "axis %" PRId32 " is negative (the client normalises axes to 0..ndim-1)", a);
    if ((uint32_t)a >= s->ndim)
      FAIL(KEX_EINVAL, "axis %" PRId32 " is out of range for source node %u of shape %s", a, in->src[0],
           kex_tuple_repr(sb, sizeof sb, (int)s->ndim, s->shape));
    if (seen & (1u << a)) FAIL(KEX_EINVAL, "axis %" PRId32 " is given twice", a);
    seen |= 1u << a;
  }
  if (!(shape = kex_arena_alloc(&g->arena, (size_t)s->ndim * sizeof *shape))) NOMEM();
  for (uint32_t d = 0; d < s->ndim; d++) shape[d] = (seen & (1u << d)) ? 1 : s->shape[d];
  if (!(n->axis = kex_arena_memdup(&g->arena, in->axis, (size_t)in->naxis * sizeof *in->axis))) NOMEM();
  n->naxis = in->naxis;
  n->ndim = s->ndim;
  n->shape = shape;
  n->dtype = s->dtype;
out:
  return rc;
}

/*
 * Movement ops: check `arg` against the source shape as the LazyBuffer view
 * methods (and ShapeTracker) require, and compute the new shape.
 */
static int add_movement(kex_graph *g, uint32_t idx, const kex_gnode *in, const kex_limits *lim, kex_gnode *n,
                        kex_error *err) {
  kex_gop op = in->op;
  const char *opname = kex_gop_name(op);
  const kex_gnode *s = &g->nodes[in->src[0]];
  const int64_t *arg = in->arg;
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  int64_t shape[KEX_MAX_DIMS];
  uint32_t ndim = s->ndim, want = (op == KEX_GOP_PAD || op == KEX_GOP_SHRINK) ? 2 * s->ndim : s->ndim;
  int64_t elements, src_elements = 0, src_nonzero;
  int rc = 0;
  if (in->narg && !arg) FAIL(KEX_EINVAL, "arg is missing");
  if (op == KEX_GOP_RESHAPE) {
    if ((rc = check_shape(idx, opname, "new shape", in->narg, arg, lim, &elements, err)) < 0) goto out;
    if (shape_prod(s->ndim, s->shape, &src_nonzero, &src_elements) < 0) FAIL(KEX_EINTERNAL, "source shape overflows");
    if (elements != src_elements)
      FAIL(KEX_EINVAL, "reshape from %s (%" PRId64 " elements) to %s (%" PRId64 " elements) changes the element count",
           kex_tuple_repr(sa, sizeof sa, (int)s->ndim, s->shape), src_elements, kex_tuple_repr(sb, sizeof sb, (int)in->narg, arg), elements);
    ndim = in->narg;
    if (ndim) memcpy(shape, arg, (size_t)ndim * sizeof *shape);
    goto copy;
  }
  if (in->narg != want) {
    if (op == KEX_GOP_PAD || op == KEX_GOP_SHRINK)
      FAIL(KEX_EINVAL, "arg has %u pairs, source node %u of shape %s has %u dims", in->narg / 2, in->src[0],
           kex_tuple_repr(sa, sizeof sa, (int)s->ndim, s->shape), s->ndim);
    FAIL(KEX_EINVAL, "arg has %u entries, source node %u of shape %s has %u dims", in->narg, in->src[0],
         kex_tuple_repr(sa, sizeof sa, (int)s->ndim, s->shape), s->ndim);
  }
  if (op == KEX_GOP_PAD || op == KEX_GOP_SHRINK) {
    if (in->narg % 2) FAIL(KEX_EINVAL, "arg must hold pairs, got %u numbers", in->narg);
  }
  switch (op) {
  case KEX_GOP_EXPAND:
    for (uint32_t d = 0; d < ndim; d++) {
      if (arg[d] < 0) FAIL(KEX_EINVAL, "expand to %s: dim %u is negative", kex_tuple_repr(sa, sizeof sa, (int)ndim, arg), d);
      if (arg[d] != s->shape[d] && s->shape[d] != 1)
        FAIL(KEX_EINVAL, "expand from %s to %s: dim %u of size %" PRId64 " is not 1 and cannot become %" PRId64,
             kex_tuple_repr(sa, sizeof sa, (int)s->ndim, s->shape), kex_tuple_repr(sb, sizeof sb, (int)ndim, arg), d, s->shape[d], arg[d]);
      shape[d] = arg[d];
    }
    break;
  case KEX_GOP_PERMUTE: {
    uint32_t seen = 0;
    for (uint32_t d = 0; d < ndim; d++) {
      if (arg[d] < 0 || arg[d] >= (int64_t)ndim || (seen & (1u << arg[d])))
        FAIL(KEX_EINVAL, "order %s is not a permutation of 0..%u", kex_tuple_repr(sa, sizeof sa, (int)ndim, arg),
             ndim ? ndim - 1 : 0);
      seen |= 1u << arg[d];
      shape[d] = s->shape[arg[d]];
    }
    break;
  }
  case KEX_GOP_PAD:
    for (uint32_t d = 0; d < ndim; d++) {
      int64_t b = arg[2 * d], a = arg[2 * d + 1];
      if (b < 0 || a < 0)
        FAIL(KEX_EINVAL, "pad (%" PRId64 ", %" PRId64 ") of dim %u is negative (use SHRINK)", b, a, d);
      if (__builtin_add_overflow(s->shape[d], b, &shape[d]) || __builtin_add_overflow(shape[d], a, &shape[d]))
        FAIL(KEX_ELIMIT, "pad (%" PRId64 ", %" PRId64 ") of dim %u overflows", b, a, d);
    }
    break;
  case KEX_GOP_SHRINK:
    for (uint32_t d = 0; d < ndim; d++) {
      int64_t b = arg[2 * d], e = arg[2 * d + 1];
      if (b < 0 || b > e || e > s->shape[d])
        FAIL(KEX_EINVAL, "shrink (%" PRId64 ", %" PRId64 ") of dim %u (size %" PRId64 ") is out of range (need 0 <= begin <= end <= size)",
             b, e, d, s->shape[d]);
      shape[d] = e - b;
    }
    break;
  case KEX_GOP_STRIDE:
    for (uint32_t d = 0; d < ndim; d++) {
      if (arg[d] == 0) FAIL(KEX_EINVAL, "stride of dim %u is 0", d);
      if (arg[d] < 0 ? arg[d] == INT64_MIN || -arg[d] > lim->max_elements : arg[d] > lim->max_elements)
        FAIL(KEX_ELIMIT, "stride %" PRId64 " of dim %u is beyond the limit of +-%" PRId64 " (max_elements)", arg[d], d,
             lim->max_elements);
      uint64_t m = arg[d] < 0 ? (uint64_t)0 - (uint64_t)arg[d] : (uint64_t)arg[d];
      uint64_t sz = (uint64_t)s->shape[d];
      shape[d] = (int64_t)(sz / m + (sz % m != 0)); /* ceil(size / |stride|) */
    }
    break;
  default: FAIL(KEX_EINTERNAL, "not a movement op");
  }
  if ((rc = check_shape(idx, opname, "result", ndim, shape, lim, &elements, err)) < 0) goto out;
copy:
  if (!(n->arg = kex_arena_memdup(&g->arena, arg, (size_t)in->narg * sizeof *arg))) NOMEM();
  n->narg = in->narg;
  if (!(n->shape = kex_arena_memdup(&g->arena, shape, (size_t)ndim * sizeof *shape))) NOMEM();
  n->ndim = (uint8_t)ndim;
  n->dtype = s->dtype;
out:
  return rc;
}

/*
 * The one validation path of both the builder and the JSON loader: check
 * node `in` as node g->nnodes and append it.  Returns its index, or a
 * negative code with *err naming the node; the graph is unchanged then
 * (apart from arena space, which dies with the graph).
 */
static int graph_add(kex_graph *g, const kex_gnode *in, const inline_data *data, const kex_limits *lim,
                     kex_error *err) {
  kex_limits deflim = KEX_LIMITS_DEFAULT;
  uint32_t idx = g->nnodes;
  kex_gop op = in->op;
  kex_gnode n;
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  int rc = 0;
  if (!lim) lim = &deflim;
  if ((unsigned)op >= KEX_GOP_COUNT)
    return kex_err_set(err, KEX_EINVAL, "node %u: unknown op %d", idx, (int)op);
  if (idx >= limit_nodes(lim))
    FAIL(KEX_ELIMIT, "the graph has more than the limit of %u nodes", limit_nodes(lim));
  if (in->nsrc != kex_gop_nsrc(op)) FAIL(KEX_EINVAL, "takes %d sources, got %u", kex_gop_nsrc(op), in->nsrc);
  for (int i = 0; i < in->nsrc; i++)
    if (in->src[i] >= idx) FAIL(KEX_EINVAL, "source %u is not an earlier node", in->src[i]);
  if (reserve_nodes(g, idx + 1) < 0) NOMEM();

  memset(&n, 0, sizeof n);
  n.op = op;
  n.nsrc = in->nsrc;
  memcpy(n.src, in->src, sizeof n.src);
  for (int i = in->nsrc; i < 3; i++) n.src[i] = 0;
  if (gop_is_input(op)) {
    static const inline_data no_data = {NULL, 0, NULL, 0};
    rc = add_input(g, idx, in, data ? data : &no_data, lim, &n, err);
  } else if (gop_is_unary(op) || gop_is_cast(op) || gop_is_binary(op) || gop_is_ternary(op)) {
    rc = add_elementwise(g, idx, in, &n, err);
  } else if (gop_is_reduce(op)) {
    rc = add_reduce(g, idx, in, &n, err);
  } else if (kex_gop_is_movement(op)) {
    rc = add_movement(g, idx, in, lim, &n, err);
  } else {
    const kex_gnode *s = &g->nodes[in->src[0]];
    n.dtype = s->dtype;
    n.ndim = s->ndim;
    n.shape = s->shape;
    if (op == KEX_GOP_ASSIGN) {
      const kex_gnode *t = &g->nodes[in->src[1]];
      uint32_t base = kex_graph_base(g, in->src[1]);
      if (t->ndim != s->ndim || memcmp(t->shape, s->shape, s->ndim * sizeof *s->shape))
        FAIL(KEX_EINVAL, "ASSIGN value node %u has shape %s, target node %u has shape %s", in->src[0],
             kex_tuple_repr(sa, sizeof sa, (int)s->ndim, s->shape), in->src[1], kex_tuple_repr(sb, sizeof sb, (int)t->ndim, t->shape));
      if (t->dtype != s->dtype)
        FAIL(KEX_EINVAL, "ASSIGN value node %u is %s, target node %u is %s", in->src[0], kex_dtypes[s->dtype].name,
             in->src[1], kex_dtypes[t->dtype].name);
      if (g->nodes[base].op != KEX_GOP_BUFFER)
        FAIL(KEX_EINVAL, "ASSIGN target node %u (base node %u, %s) is not a held (realized) buffer", in->src[1], base,
             kex_gop_name(g->nodes[base].op));
    } else if (op == KEX_GOP_COPY) {
      if (!in->device || !*in->device) FAIL(KEX_EINVAL, "COPY needs a target device");
      if (!(n.device = kex_arena_strdup(&g->arena, in->device))) NOMEM();
    }
  }
  if (rc < 0) goto out;
  /* every node's shape, inferred ones too (a REDUCE turns a 0 dim into 1), is within the limits */
  if (!gop_is_input(op) && !kex_gop_is_movement(op)) {
    int64_t elements;
    if ((rc = check_shape(idx, kex_gop_name(op), "result shape", n.ndim, n.shape, lim, &elements, err)) < 0) goto out;
  }
  n.depth = 1;
  for (int i = 0; i < in->nsrc; i++)
    if (g->nodes[in->src[i]].depth >= n.depth) n.depth = g->nodes[in->src[i]].depth + 1;
  if (n.depth > lim->max_depth)
    FAIL(KEX_ELIMIT, "its dependency chain is %u nodes deep, more than the limit of %u (max_depth)", n.depth,
         lim->max_depth);
  g->nodes[idx] = n;
  g->nnodes++;
  g->limits = *lim;
  rc = (int)idx;
out:
  return rc;
}

int kex_graph_add(kex_graph *g, const kex_gnode *node, const kex_limits *limits, kex_error *err) {
  inline_data data = {node->data, node->data_len, NULL, 0};
  return graph_add(g, node, &data, limits, err);
}

int kex_graph_add_output(kex_graph *g, uint32_t idx, const kex_limits *limits, kex_error *err) {
  kex_limits deflim = KEX_LIMITS_DEFAULT;
  if (!limits) limits = &deflim;
  if (idx >= g->nnodes)
    return kex_err_set(err, KEX_EINVAL, "output node %u is not a node index (the graph has %u nodes)", idx, g->nnodes);
  if (g->noutputs >= limits->max_outputs)
    return kex_err_set(err, KEX_ELIMIT, "output node %u: more than the limit of %u outputs", idx, limits->max_outputs);
  if (g->noutputs == g->outcap) {
    uint32_t cap = g->outcap ? g->outcap * 2 : GRAPH_MIN_CAP;
    uint32_t *outs = kex_realloc(g->outputs, (size_t)cap * sizeof *outs);
    if (!outs) return kex_err_set(err, KEX_ENOMEM, "output node %u: out of memory", idx);
    g->outputs = outs;
    g->outcap = cap;
  }
  g->outputs[g->noutputs++] = idx;
  return 0;
}

#undef FAIL
#undef NOMEM

/* ---- JSON ---- */

/*
 * jansson allocates through kex_malloc (so the failure hook reaches it), via
 * json_alloc, which also records a failure: jansson reports some allocation
 * failures inside its lexer as syntax errors, and this flag tells them apart.
 */
static pthread_once_t json_alloc_once = PTHREAD_ONCE_INIT;
static _Thread_local bool json_alloc_failed;

static void *json_alloc(size_t size) {
  void *p = kex_malloc(size);
  if (!p) json_alloc_failed = true;
  return p;
}

static void json_alloc_init(void) { json_set_alloc_funcs(json_alloc, kex_free); }

/* Which node fields an op takes. */
enum {
  F_SRC = 1 << 0,
  F_DTYPE = 1 << 1,
  F_SHAPE = 1 << 2,
  F_ARG = 1 << 3,
  F_AXIS = 1 << 4,
  F_VALUE = 1 << 5,
  F_DATA = 1 << 6,
  F_FILL = 1 << 7,
  F_BUFFER = 1 << 8,
  F_DEVICE = 1 << 9,
};

static const struct {
  const char *name;
  unsigned flag;
} json_fields[] = {
    {"src", F_SRC},   {"dtype", F_DTYPE}, {"shape", F_SHAPE},   {"arg", F_ARG},         {"axis", F_AXIS},
    {"value", F_VALUE}, {"data", F_DATA}, {"fill", F_FILL}, {"buffer", F_BUFFER}, {"device", F_DEVICE},
};

static unsigned op_fields(kex_gop op) {
  switch (op) {
  case KEX_GOP_BUFFER: return F_SRC | F_DTYPE | F_SHAPE | F_DATA | F_FILL | F_BUFFER | F_DEVICE;
  case KEX_GOP_EMPTY: return F_SRC | F_DTYPE | F_SHAPE | F_DEVICE;
  case KEX_GOP_CONST: return F_SRC | F_DTYPE | F_SHAPE | F_VALUE | F_DEVICE;
  case KEX_GOP_CAST:
  case KEX_GOP_BITCAST: return F_SRC | F_DTYPE;
  case KEX_GOP_REDUCE_SUM:
  case KEX_GOP_REDUCE_MAX: return F_SRC | F_AXIS;
  case KEX_GOP_COPY: return F_SRC | F_DEVICE;
  default: return kex_gop_is_movement(op) ? F_SRC | F_ARG : F_SRC;
  }
}

#define JFAIL(code, ...)                                       \
  do {                                                         \
    rc = node_err(err, code, idx, op, __VA_ARGS__);            \
    goto out;                                                  \
  } while (0)

/* A JSON scalar as a kex_const: integer, real, true/false, "inf" "-inf" "nan". -1 when none of these. */
static int json_to_const(const json_t *v, kex_const *out) {
  if (json_is_integer(v)) *out = kex_const_int(json_integer_value(v));
  else if (json_is_real(v)) *out = kex_const_float(json_real_value(v));
  else if (json_is_boolean(v)) *out = kex_const_bool(json_is_true(v));
  else if (json_is_string(v) && strcmp(json_string_value(v), "inf") == 0) *out = kex_const_float(INFINITY);
  else if (json_is_string(v) && strcmp(json_string_value(v), "-inf") == 0) *out = kex_const_float(-INFINITY);
  else if (json_is_string(v) && strcmp(json_string_value(v), "nan") == 0) *out = kex_const_float(NAN);
  else return -1;
  return 0;
}

/*
 * Read a JSON array of integers (or, with pairs, of [int, int] arrays,
 * flattened) into a new kex_malloc'd array *out of *n entries (caller frees;
 * NULL for an empty array).  0, KEX_EINVAL for wrong types, KEX_ENOMEM.
 */
static int json_int_list(uint32_t idx, kex_gop op, const char *field, const json_t *a, bool pairs, int64_t **out,
                         uint32_t *n, kex_error *err) {
  int64_t *v = NULL;
  size_t len, i;
  int rc = 0;
  *out = NULL;
  *n = 0;
  if (!json_is_array(a)) JFAIL(KEX_EINVAL, "\"%s\" must be an array", field);
  len = json_array_size(a);
  if (len > UINT32_MAX / 2) JFAIL(KEX_ELIMIT, "\"%s\" has too many entries", field);
  if (len == 0) goto out;
  if (!(v = kex_malloc(len * (pairs ? 2 : 1) * sizeof *v))) {
    rc = kex_err_set(err, KEX_ENOMEM, "node %u (%s): out of memory", idx, kex_gop_name(op));
    goto out;
  }
  for (i = 0; i < len; i++) {
    const json_t *e = json_array_get(a, i);
    if (pairs) {
      if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(json_array_get(e, 0)) ||
          !json_is_integer(json_array_get(e, 1)))
        JFAIL(KEX_EINVAL, "\"%s\"[%zu] must be a pair of integers [a, b]", field, i);
      v[2 * i] = json_integer_value(json_array_get(e, 0));
      v[2 * i + 1] = json_integer_value(json_array_get(e, 1));
    } else {
      if (!json_is_integer(e)) JFAIL(KEX_EINVAL, "\"%s\"[%zu] must be an integer", field, i);
      v[i] = json_integer_value(e);
    }
  }
  *out = v;
  *n = (uint32_t)(len * (pairs ? 2 : 1));
  v = NULL;
out:
  kex_free(v);
  return rc;
}

/* The BUFFER "fill" object: exactly one of random (seed >= 0), arange (true), value. */
static int json_fill(uint32_t idx, kex_gop op, const json_t *f, kex_gnode *n, kex_error *err) {
  const json_t *v;
  int rc = 0;
  if (!json_is_object(f) || json_object_size(f) != 1)
    JFAIL(KEX_EINVAL, "\"fill\" must be an object with one of \"random\", \"arange\", \"value\"");
  if ((v = json_object_get(f, "random"))) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      JFAIL(KEX_EINVAL, "fill \"random\" must be a non-negative integer seed");
    n->bufsrc = KEX_BUF_FILL_RANDOM;
    n->seed = (uint64_t)json_integer_value(v);
  } else if ((v = json_object_get(f, "arange"))) {
    if (!json_is_true(v)) JFAIL(KEX_EINVAL, "fill \"arange\" must be true");
    n->bufsrc = KEX_BUF_FILL_ARANGE;
  } else if ((v = json_object_get(f, "value"))) {
    if (json_to_const(v, &n->fill) < 0)
      JFAIL(KEX_EINVAL, "fill \"value\" must be a number, true/false, or \"inf\"/\"-inf\"/\"nan\"");
    n->bufsrc = KEX_BUF_FILL_VALUE;
  } else {
    JFAIL(KEX_EINVAL, "\"fill\" must be an object with one of \"random\", \"arange\", \"value\"");
  }
out:
  return rc;
}

/*
 * Turn JSON node `idx` into a kex_gnode and add it with graph_add.  Checks
 * what only the JSON form can get wrong (types, unknown or missing fields,
 * negative source indices); temporaries are freed before returning.
 * The node index (>= 0) or a negative code with *err set.
 */
static int json_node(kex_graph *g, uint32_t idx, const json_t *jn, const kex_limits *lim, kex_error *err) {
  kex_gnode n;
  inline_data data = {NULL, 0, NULL, 0};
  int64_t *shape = NULL, *arg = NULL, *axis64 = NULL;
  int32_t *axis = NULL;
  const char *key;
  const json_t *v, *jop;
  unsigned allowed, have = 0;
  kex_gop op = KEX_GOP_COUNT; /* kex_gop_name gives "?" until known */
  uint32_t cnt;
  int rc = 0;
  memset(&n, 0, sizeof n);
  if (!json_is_object(jn)) {
    rc = kex_err_set(err, KEX_EINVAL, "node %u: must be a JSON object", idx);
    goto out;
  }
  jop = json_object_get(jn, "op");
  if (!jop) {
    rc = kex_err_set(err, KEX_EINVAL, "node %u: missing \"op\"", idx);
    goto out;
  }
  if (!json_is_string(jop) || kex_gop_from_name(json_string_value(jop)) < 0) {
    char *s = json_is_string(jop) ? NULL : json_dumps(jop, JSON_ENCODE_ANY | JSON_COMPACT);
    rc = kex_err_set(err, KEX_EINVAL, "node %u: unknown op %s%s%s", idx, s ? "" : "\"",
                     s ? s : json_is_string(jop) ? json_string_value(jop) : "?", s ? "" : "\"");
    kex_free(s);
    goto out;
  }
  op = n.op = (kex_gop)kex_gop_from_name(json_string_value(jop));
  allowed = op_fields(op);
  json_object_foreach((json_t *)jn, key, v) {
    unsigned flag = 0;
    if (strcmp(key, "op") == 0) continue;
    for (size_t i = 0; i < sizeof json_fields / sizeof json_fields[0]; i++)
      if (strcmp(key, json_fields[i].name) == 0) flag = json_fields[i].flag;
    if (!(flag & allowed)) JFAIL(KEX_EINVAL, "unexpected field \"%s\"", key);
    have |= flag;
  }

  /* src */
  if ((v = json_object_get(jn, "src"))) {
    size_t len;
    if (!json_is_array(v)) JFAIL(KEX_EINVAL, "\"src\" must be an array");
    len = json_array_size(v);
    if (len != (size_t)kex_gop_nsrc(op)) JFAIL(KEX_EINVAL, "takes %d sources, got %zu", kex_gop_nsrc(op), len);
    for (size_t i = 0; i < len; i++) {
      const json_t *e = json_array_get(v, i);
      if (!json_is_integer(e)) JFAIL(KEX_EINVAL, "\"src\"[%zu] must be an integer", i);
      json_int_t s = json_integer_value(e);
      if (s < 0) JFAIL(KEX_EINVAL, "source %" JSON_INTEGER_FORMAT " is negative", s);
      if (s >= (json_int_t)idx) JFAIL(KEX_EINVAL, "source %" JSON_INTEGER_FORMAT " is not an earlier node", s);
      n.src[i] = (uint32_t)s;
    }
    n.nsrc = (uint8_t)len;
  } else if (kex_gop_nsrc(op) > 0) {
    JFAIL(KEX_EINVAL, "missing \"src\"");
  }

  /* dtype */
  if ((v = json_object_get(jn, "dtype"))) {
    if (!json_is_string(v)) JFAIL(KEX_EINVAL, "\"dtype\" must be a string");
    int dt = kex_dtype_from_name(json_string_value(v));
    if (dt < 0) JFAIL(KEX_EINVAL, "unknown dtype \"%s\"", json_string_value(v));
    n.dtype = (kex_dtype)dt;
  } else if (allowed & F_DTYPE) {
    JFAIL(KEX_EINVAL, "missing \"dtype\"");
  }

  /* shape */
  if ((v = json_object_get(jn, "shape"))) {
    if ((rc = json_int_list(idx, op, "shape", v, false, &shape, &cnt, err)) < 0) goto out;
    if (cnt > limit_dims(lim))
      JFAIL(KEX_ELIMIT, "shape has %u dims, more than the limit of %u (max_dims)", cnt, limit_dims(lim));
    n.ndim = (uint8_t)cnt;
    n.shape = shape;
  } else if (allowed & F_SHAPE) {
    JFAIL(KEX_EINVAL, "missing \"shape\"");
  }

  /* arg */
  if ((v = json_object_get(jn, "arg"))) {
    bool pairs = op == KEX_GOP_PAD || op == KEX_GOP_SHRINK;
    if ((rc = json_int_list(idx, op, "arg", v, pairs, &arg, &n.narg, err)) < 0) goto out;
    n.arg = arg;
  } else if (allowed & F_ARG) {
    JFAIL(KEX_EINVAL, "missing \"arg\"");
  }

  /* axis */
  if ((v = json_object_get(jn, "axis"))) {
    if ((rc = json_int_list(idx, op, "axis", v, false, &axis64, &n.naxis, err)) < 0) goto out;
    if (n.naxis && !(axis = kex_malloc(n.naxis * sizeof *axis))) {
      rc = kex_err_set(err, KEX_ENOMEM, "node %u (%s): out of memory", idx, kex_gop_name(op));
      goto out;
    }
    for (uint32_t i = 0; i < n.naxis; i++) {
      if (axis64[i] < 0) JFAIL(KEX_EINVAL, "axis %" PRId64 " is negative (the client normalises axes to 0..ndim-1)", axis64[i]);
      if (axis64[i] > INT32_MAX) JFAIL(KEX_EINVAL, "axis %" PRId64 " is out of range", axis64[i]);
      axis[i] = (int32_t)axis64[i];
    }
    n.axis = axis;
  } else if (allowed & F_AXIS) {
    JFAIL(KEX_EINVAL, "missing \"axis\"");
  }

  /* value */
  if ((v = json_object_get(jn, "value"))) {
    if (json_to_const(v, &n.value) < 0)
      JFAIL(KEX_EINVAL, "\"value\" must be a number, true/false, or \"inf\"/\"-inf\"/\"nan\"");
  } else if (allowed & F_VALUE) {
    JFAIL(KEX_EINVAL, "missing \"value\"");
  }

  /* BUFFER contents: exactly one of data, fill, buffer */
  if (op == KEX_GOP_BUFFER) {
    unsigned srcs = have & (F_DATA | F_FILL | F_BUFFER);
    if (srcs == 0) JFAIL(KEX_EINVAL, "BUFFER needs one of \"data\", \"fill\", \"buffer\"");
    if (srcs & (srcs - 1)) JFAIL(KEX_EINVAL, "BUFFER takes only one of \"data\", \"fill\", \"buffer\"");
    if ((v = json_object_get(jn, "data"))) {
      if (!json_is_string(v)) JFAIL(KEX_EINVAL, "\"data\" must be a base64 string");
      n.bufsrc = KEX_BUF_DATA;
      data.b64 = json_string_value(v);
      data.b64_len = json_string_length(v);
    } else if ((v = json_object_get(jn, "fill"))) {
      if ((rc = json_fill(idx, op, v, &n, err)) < 0) goto out;
    } else {
      v = json_object_get(jn, "buffer");
      if (!json_is_string(v) || !*json_string_value(v)) JFAIL(KEX_EINVAL, "\"buffer\" must be a non-empty handle string");
      n.bufsrc = KEX_BUF_HANDLE;
      n.handle = json_string_value(v);
    }
  }

  /* device */
  if ((v = json_object_get(jn, "device"))) {
    if (!json_is_string(v) || !*json_string_value(v)) JFAIL(KEX_EINVAL, "\"device\" must be a non-empty string");
    n.device = json_string_value(v);
  } else if (op == KEX_GOP_COPY) {
    JFAIL(KEX_EINVAL, "missing \"device\"");
  }

  rc = graph_add(g, &n, &data, lim, err);
out:
  kex_free(shape);
  kex_free(arg);
  kex_free(axis64);
  kex_free(axis);
  return rc;
}

#undef JFAIL

int kex_graph_from_json(const char *text, size_t len, const kex_limits *limits, kex_graph **out, kex_error *err) {
  kex_limits deflim = KEX_LIMITS_DEFAULT;
  json_error_t jerr;
  json_t *root = NULL;
  const json_t *gj, *v, *nodes, *outputs;
  const char *key, *device = GRAPH_DEFAULT_DEVICE;
  kex_graph *g = NULL;
  int rc = 0;
  *out = NULL;
  if (!limits) limits = &deflim;
  if ((int64_t)len > KEX_LIMIT_JSON_BYTES) {
    rc = kex_err_set(err, KEX_ELIMIT, "graph JSON is %zu bytes, more than the limit of %lld", len,
                     (long long)KEX_LIMIT_JSON_BYTES);
    goto out;
  }
  pthread_once(&json_alloc_once, json_alloc_init);
  json_alloc_failed = false;
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    if (json_alloc_failed || json_error_code(&jerr) == json_error_out_of_memory)
      rc = kex_err_set(err, KEX_ENOMEM, "graph JSON: out of memory");
    else
      rc = kex_err_set(err, KEX_EPARSE, "graph JSON, line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    goto out;
  }
  if (!json_is_object(root)) {
    rc = kex_err_set(err, KEX_EINVAL, "graph JSON: the top level must be an object");
    goto out;
  }
  gj = root;
  if (!json_object_get(root, "nodes") && (v = json_object_get(root, "graph"))) {
    if (!json_is_object(v)) {
      rc = kex_err_set(err, KEX_EINVAL, "graph JSON: \"graph\" must be an object");
      goto out;
    }
    gj = v;
  }
  json_object_foreach((json_t *)gj, key, v) {
    if (strcmp(key, "format") && strcmp(key, "device") && strcmp(key, "nodes") && strcmp(key, "outputs")) {
      rc = kex_err_set(err, KEX_EINVAL, "graph JSON: unexpected field \"%s\"", key);
      goto out;
    }
  }
  if ((v = json_object_get(gj, "format")) && (!json_is_string(v) || strcmp(json_string_value(v), GRAPH_FORMAT))) {
    rc = kex_err_set(err, KEX_EINVAL, "graph JSON: \"format\" must be \"%s\"%s%s%s", GRAPH_FORMAT,
                     json_is_string(v) ? ", not \"" : "", json_is_string(v) ? json_string_value(v) : "",
                     json_is_string(v) ? "\"" : "");
    goto out;
  }
  if ((v = json_object_get(gj, "device"))) {
    if (!json_is_string(v) || !*json_string_value(v)) {
      rc = kex_err_set(err, KEX_EINVAL, "graph JSON: \"device\" must be a non-empty string");
      goto out;
    }
    device = json_string_value(v);
  }
  nodes = json_object_get(gj, "nodes");
  outputs = json_object_get(gj, "outputs");
  if (!nodes || !json_is_array(nodes)) {
    rc = kex_err_set(err, KEX_EINVAL, "graph JSON: %s", nodes ? "\"nodes\" must be an array" : "missing \"nodes\"");
    goto out;
  }
  if (!outputs || !json_is_array(outputs)) {
    rc = kex_err_set(err, KEX_EINVAL, "graph JSON: %s", outputs ? "\"outputs\" must be an array" : "missing \"outputs\"");
    goto out;
  }
  if (json_array_size(nodes) > limit_nodes(limits)) {
    rc = kex_err_set(err, KEX_ELIMIT, "node %u: the graph has more than the limit of %u nodes (%zu given)",
                     limit_nodes(limits), limit_nodes(limits), json_array_size(nodes));
    goto out;
  }
  if (!(g = kex_graph_new(device))) {
    rc = kex_err_set(err, KEX_ENOMEM, "graph: out of memory");
    goto out;
  }
  g->limits = *limits;
  if (reserve_nodes(g, (uint32_t)json_array_size(nodes)) < 0) {
    rc = kex_err_set(err, KEX_ENOMEM, "graph: out of memory for %zu nodes", json_array_size(nodes));
    goto out;
  }
  for (size_t i = 0; i < json_array_size(nodes); i++)
    if ((rc = json_node(g, (uint32_t)i, json_array_get(nodes, i), limits, err)) < 0) goto out;
  for (size_t i = 0; i < json_array_size(outputs); i++) {
    const json_t *o = json_array_get(outputs, i);
    if (!json_is_integer(o) || json_integer_value(o) < 0 || json_integer_value(o) >= (json_int_t)g->nnodes) {
      char *s = json_dumps(o, JSON_ENCODE_ANY | JSON_COMPACT);
      rc = kex_err_set(err, s ? KEX_EINVAL : KEX_ENOMEM, "outputs[%zu] = %s is not a node index (the graph has %u nodes)",
                       i, s ? s : "?", g->nnodes);
      kex_free(s);
      goto out;
    }
    if ((rc = kex_graph_add_output(g, (uint32_t)json_integer_value(o), limits, err)) < 0) goto out;
  }
  *out = g;
  g = NULL;
  rc = 0;
out:
  kex_graph_free(g);
  json_decref(root);
  return rc;
}

int kex_graph_from_json_file(const char *path, const kex_limits *limits, kex_graph **out, kex_error *err) {
  FILE *f = NULL;
  char *text = NULL;
  long size;
  int rc = 0;
  *out = NULL;
  if (!(f = fopen(path, "rb"))) {
    rc = kex_err_set(err, KEX_EIO, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0) {
    rc = kex_err_set(err, KEX_EIO, "%s: cannot find its size: %s", path, strerror(errno));
    goto out;
  }
  if ((int64_t)size > KEX_LIMIT_JSON_BYTES) {
    rc = kex_err_set(err, KEX_ELIMIT, "%s: %ld bytes, more than the graph JSON limit of %lld", path, size,
                     (long long)KEX_LIMIT_JSON_BYTES);
    goto out;
  }
  if (!(text = kex_malloc((size_t)size + 1))) {
    rc = kex_err_set(err, KEX_ENOMEM, "%s: out of memory for %ld bytes", path, size);
    goto out;
  }
  if (fread(text, 1, (size_t)size, f) != (size_t)size) {
    rc = kex_err_set(err, KEX_EIO, "%s: short read", path);
    goto out;
  }
  rc = kex_graph_from_json(text, (size_t)size, limits, out, err);
out:
  kex_free(text);
  if (f) fclose(f);
  return rc;
}

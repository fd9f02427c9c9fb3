/*
 * graph.h - the client graph (../shared/graph-format.md) as kex holds it.
 *
 * A kex_graph is a validated list of nodes in topological order.  It is built
 * either node by node through the builder API (the protobuf decoder and tests
 * use it) or from the JSON form by kex_graph_from_json (jansson).  Validation
 * infers every node's dtype and shape and refuses, with a message naming the
 * node index and what was wrong, everything graph-format.md lists.
 *
 * Ownership: a graph owns an arena; every pointer inside it (shapes, args,
 * strings, decoded data) lives in that arena and dies with kex_graph_free.
 */
#ifndef KEX_SCHED_GRAPH_H
#define KEX_SCHED_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/limits.h"

/* XX(enum, graph-format name, number of sources: -1 = special) */
#define KEX_GOP_MAP(XX)          \
  XX(BUFFER, "BUFFER", 0)        \
  XX(EMPTY, "EMPTY", 0)          \
  XX(CONST, "CONST", 0)          \
  XX(EXP2, "EXP2", 1)            \
  XX(LOG2, "LOG2", 1)            \
  XX(SIN, "SIN", 1)              \
  XX(SQRT, "SQRT", 1)            \
  XX(NEG, "NEG", 1)              \
  XX(CAST, "CAST", 1)            \
  XX(BITCAST, "BITCAST", 1)      \
  XX(ADD, "ADD", 2)              \
  XX(SUB, "SUB", 2)              \
  XX(MUL, "MUL", 2)              \
  XX(DIV, "DIV", 2)              \
  XX(MAX, "MAX", 2)              \
  XX(MOD, "MOD", 2)              \
  XX(CMPLT, "CMPLT", 2)          \
  XX(CMPEQ, "CMPEQ", 2)          \
  XX(XOR, "XOR", 2)              \
  XX(WHERE, "WHERE", 3)          \
  XX(MULACC, "MULACC", 3)        \
  XX(REDUCE_SUM, "REDUCE_SUM", 1) \
  XX(REDUCE_MAX, "REDUCE_MAX", 1) \
  XX(RESHAPE, "RESHAPE", 1)      \
  XX(EXPAND, "EXPAND", 1)        \
  XX(PERMUTE, "PERMUTE", 1)      \
  XX(PAD, "PAD", 1)              \
  XX(SHRINK, "SHRINK", 1)        \
  XX(STRIDE, "STRIDE", 1)        \
  XX(CONTIGUOUS, "CONTIGUOUS", 1) \
  XX(ASSIGN, "ASSIGN", 2)        \
  XX(COPY, "COPY", 1)

typedef enum kex_gop {
#define XX(e, name, nsrc) KEX_GOP_##e,
  KEX_GOP_MAP(XX)
#undef XX
  KEX_GOP_COUNT
} kex_gop;

const char *kex_gop_name(kex_gop op);
int kex_gop_from_name(const char *name); /* -1 when unknown */
int kex_gop_nsrc(kex_gop op);

/* Where a BUFFER's contents come from. */
typedef enum kex_buffer_source {
  KEX_BUF_DATA,       /* inline bytes (data, data_len) */
  KEX_BUF_FILL_RANDOM, /* fill {"random": seed} */
  KEX_BUF_FILL_ARANGE, /* fill {"arange": true} */
  KEX_BUF_FILL_VALUE,  /* fill {"value": x} */
  KEX_BUF_HANDLE,     /* a buffer the job holds (handle) */
} kex_buffer_source;

typedef struct kex_gnode {
  /* fields ordered so that what the replay (sched/lazy.c) reads of a node other than a CONST's value is
     its first 64 bytes (one cache line), the inputs' fields after */
  kex_gop op;
  uint8_t nsrc;
  /* inferred for every node after validation (given for inputs/CONST) */
  uint8_t ndim;
  uint32_t src[3];
  kex_dtype dtype;
  /* movement ops: RESHAPE/EXPAND new shape (narg = ndim); PERMUTE order; PAD/SHRINK
     pairs flattened (narg = 2*ndim); STRIDE one int per dim. */
  uint32_t narg;
  /* REDUCE_*: the reduced axes in the order given (kept as size-1 dims) */
  uint32_t naxis;
  const int64_t *shape;
  const int64_t *arg;
  const int32_t *axis;
  const char *device;  /* COPY target, or an input's device; NULL = graph device */
  /* CONST value (converted with dtypes.as_const), CAST/BITCAST target = dtype */
  kex_const value;
  uint32_t depth; /* inferred: 1 for an input, else 1 + the deepest source (<= max_depth) */
  /* BUFFER */
  kex_buffer_source bufsrc;
  const uint8_t *data; /* KEX_BUF_DATA: decoded bytes, prod(shape)*itemsize */
  size_t data_len;
  uint64_t seed;       /* KEX_BUF_FILL_RANDOM */
  kex_const fill;      /* KEX_BUF_FILL_VALUE */
  const char *handle;  /* KEX_BUF_HANDLE */
} kex_gnode;

typedef struct kex_graph {
  kex_arena arena;
  const char *device; /* the graph's "device" ("default" when absent) */
  uint32_t nnodes, cap;
  kex_gnode *nodes;
  uint32_t noutputs, outcap;
  uint32_t *outputs;
  int64_t inline_bytes; /* total inline BUFFER data so far (max_inline_bytes) */
  kex_limits limits;    /* the limits of the latest kex_graph_add / the JSON load (defaults when
                           none was given); the scheduler applies max_kernel_depth/ops from here */
} kex_graph;

/*
 * Note: nodes and outputs are growable arrays from kex_realloc (not the arena,
 * so growth wastes nothing); they too die with kex_graph_free.
 */

/* True for the movement ops RESHAPE EXPAND PERMUTE PAD SHRINK STRIDE. */
bool kex_gop_is_movement(kex_gop op);
/* The base of node idx: follows src[0] of movement ops back to a non-movement node. */
uint32_t kex_graph_base(const kex_graph *g, uint32_t idx);

/* ---- builder ---- */

/* New empty graph on `device` (NULL = "default"). NULL on OOM. */
kex_graph *kex_graph_new(const char *device);
void kex_graph_free(kex_graph *g);

/*
 * Append a node; *node is copied shallowly and the arrays it points to are
 * copied into the graph's arena.  The node is validated against the nodes
 * before it and `limits` (its inferred dtype/shape/depth filled in; NULL =
 * KEX_LIMITS_DEFAULT), and the graph keeps a copy of `limits`.  Every shape
 * (given or inferred) must have non-negative dims whose non-zero ones
 * multiply, without overflow, to at most max_elements, even when another dim
 * is 0; a STRIDE's |value| is at most max_elements.  Returns the node index
 * (>= 0) or a negative error with *err naming the node: KEX_EINVAL (bad
 * structure), KEX_ELIMIT (node/dim/element/byte/depth limits;
 * RESOURCE_EXHAUSTED), KEX_ENOMEM.
 */
int kex_graph_add(kex_graph *g, const kex_gnode *node, const kex_limits *limits, kex_error *err);
/* Mark node `idx` as an output. 0, KEX_EINVAL (index out of range), KEX_ELIMIT, KEX_ENOMEM. */
int kex_graph_add_output(kex_graph *g, uint32_t idx, const kex_limits *limits, kex_error *err);

/*
 * Parse and validate the JSON form ({"format": "kex.graph.v1", ...}).  Also
 * accepts a case file's object by looking for a "graph" member when the top
 * level has no "nodes".  On success *out owns a new graph; on failure *out is
 * NULL and *err says which node or field was wrong (KEX_EPARSE for malformed
 * JSON, else as kex_graph_add).
 */
int kex_graph_from_json(const char *text, size_t len, const kex_limits *limits, kex_graph **out, kex_error *err);
int kex_graph_from_json_file(const char *path, const kex_limits *limits, kex_graph **out, kex_error *err);

#endif

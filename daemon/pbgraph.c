/*
 * pbgraph.c - a protobuf Graph (kex.v1.Graph) into the kex_graph builder
 * API (sched/graph.h), for Plan, Submit and Tune.  Every refusal names the
 * node: a device the daemon does not have, an op's missing or extra
 * arguments, a BUFFER handle the job does not hold or whose dtype or shape
 * differs; the builder refuses the rest (shapes, limits).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "daemon/rpc.h"
#include "sched/graph.h"

#define RPC_GRAPH_FORMAT "kex.graph.v1"

/* ---- Graph (protobuf) -> kex_graph ---- */

#define NODE_FAIL(code, ...)                                                            \
  do {                                                                                  \
    char m_[KEX_ERROR_MSG_MAX];                                                         \
    snprintf(m_, sizeof m_, __VA_ARGS__);                                               \
    rc = kex_err_set(err, code, "node %u (%s): %s", idx, pn->op ? pn->op : "?", m_);    \
    goto out;                                                                           \
  } while (0)

/* A Scalar as a kex_const; -1 when it is empty or an unknown special string. */
static int scalar_to_const(const Kex__V1__Scalar *s, kex_const *out) {
  switch (s->kind_case) {
  case KEX__V1__SCALAR__KIND_INT_VALUE: *out = kex_const_int(s->int_value); return 0;
  case KEX__V1__SCALAR__KIND_FLOAT_VALUE: *out = kex_const_float(s->float_value); return 0;
  case KEX__V1__SCALAR__KIND_BOOL_VALUE: *out = kex_const_bool(s->bool_value); return 0;
  case KEX__V1__SCALAR__KIND_SPECIAL:
    if (strcmp(s->special, "inf") == 0) *out = kex_const_float(INFINITY);
    else if (strcmp(s->special, "-inf") == 0) *out = kex_const_float(-INFINITY);
    else if (strcmp(s->special, "nan") == 0) *out = kex_const_float(NAN);
    else return -1;
    return 0;
  default: return -1;
  }
}

/* The movement arg each op takes, as the oneof case. */
static Kex__V1__Node__ArgCase arg_case_for(kex_gop op) {
  switch (op) {
  case KEX_GOP_RESHAPE:
  case KEX_GOP_EXPAND: return KEX__V1__NODE__ARG_NEW_SHAPE;
  case KEX_GOP_PERMUTE: return KEX__V1__NODE__ARG_ORDER;
  case KEX_GOP_PAD:
  case KEX_GOP_SHRINK: return KEX__V1__NODE__ARG_PAIRS;
  case KEX_GOP_STRIDE: return KEX__V1__NODE__ARG_STRIDES;
  default: return KEX__V1__NODE__ARG__NOT_SET;
  }
}

static const char *arg_case_name(Kex__V1__Node__ArgCase c) {
  switch (c) {
  case KEX__V1__NODE__ARG_NEW_SHAPE: return "new_shape";
  case KEX__V1__NODE__ARG_ORDER: return "order";
  case KEX__V1__NODE__ARG_PAIRS: return "pairs";
  case KEX__V1__NODE__ARG_STRIDES: return "strides";
  default: return "none";
  }
}

static bool gop_is_input(kex_gop op) { return op == KEX_GOP_BUFFER || op == KEX_GOP_EMPTY || op == KEX_GOP_CONST; }

/*
 * Add protobuf node `idx` to g: the checks only the protobuf form can get
 * wrong (op and dtype names, fields the op does not take, the oneof that
 * must match the op, unknown buffer handles), then kex_graph_add for the
 * rest.  0 or a negative code with *err naming the node.
 */
static int node_from_pb(kex_graph *g, uint32_t idx, const Kex__V1__Node *pn, const kex_limits *lim, kexd_job *job,
                        kex_error *err) {
  kex_gnode n;
  int64_t *pairs = NULL;
  int op, rc = 0;
  memset(&n, 0, sizeof n);
  if (!pn->op || (op = kex_gop_from_name(pn->op)) < 0) NODE_FAIL(KEX_EINVAL, "unknown op \"%s\"", pn->op ? pn->op : "");
  n.op = (kex_gop)op;
  /* src */
  if (pn->n_src != (size_t)kex_gop_nsrc(n.op)) NODE_FAIL(KEX_EINVAL, "takes %d sources, got %zu", kex_gop_nsrc(n.op), pn->n_src);
  for (size_t i = 0; i < pn->n_src; i++) {
    if (pn->src[i] >= idx) NODE_FAIL(KEX_EINVAL, "source %u is not an earlier node", pn->src[i]);
    n.src[i] = pn->src[i];
  }
  n.nsrc = (uint8_t)pn->n_src;
  /* dtype */
  bool takes_dtype = gop_is_input(n.op) || n.op == KEX_GOP_CAST || n.op == KEX_GOP_BITCAST;
  if (pn->dtype && *pn->dtype) {
    int dt = kex_dtype_from_name(pn->dtype);
    if (!takes_dtype) NODE_FAIL(KEX_EINVAL, "unexpected field \"dtype\"");
    if (dt < 0) NODE_FAIL(KEX_EINVAL, "unknown dtype \"%s\"", pn->dtype);
    n.dtype = (kex_dtype)dt;
  } else if (takes_dtype) {
    NODE_FAIL(KEX_EINVAL, "missing \"dtype\"");
  }
  /* shape: inputs only; empty is the 0-d shape [] */
  if (pn->n_shape && !gop_is_input(n.op)) NODE_FAIL(KEX_EINVAL, "unexpected field \"shape\"");
  if (gop_is_input(n.op)) {
    uint32_t maxd = lim->max_dims < KEX_MAX_DIMS ? lim->max_dims : KEX_MAX_DIMS;
    if (pn->n_shape > maxd)
      NODE_FAIL(KEX_ELIMIT, "shape has %zu dims, more than the limit of %u (--max-dims)", pn->n_shape, maxd);
    n.ndim = (uint8_t)pn->n_shape;
    n.shape = pn->shape;
  }
  /* arg */
  Kex__V1__Node__ArgCase want = arg_case_for(n.op);
  if (pn->arg_case != want) {
    if (want == KEX__V1__NODE__ARG__NOT_SET) NODE_FAIL(KEX_EINVAL, "unexpected field \"%s\"", arg_case_name(pn->arg_case));
    if (pn->arg_case == KEX__V1__NODE__ARG__NOT_SET) NODE_FAIL(KEX_EINVAL, "missing \"%s\"", arg_case_name(want));
    NODE_FAIL(KEX_EINVAL, "takes \"%s\", not \"%s\"", arg_case_name(want), arg_case_name(pn->arg_case));
  }
  if (want == KEX__V1__NODE__ARG_PAIRS) {
    const Kex__V1__Pairs *p = pn->pairs;
    if (p->n_pairs > KEX_MAX_DIMS) NODE_FAIL(KEX_EINVAL, "has %zu pairs, more than any shape's %d dims", p->n_pairs, KEX_MAX_DIMS);
    if (p->n_pairs && !(pairs = kex_malloc(2 * p->n_pairs * sizeof *pairs))) NODE_FAIL(KEX_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->n_pairs; i++) {
      pairs[2 * i] = p->pairs[i]->first;
      pairs[2 * i + 1] = p->pairs[i]->second;
    }
    n.narg = (uint32_t)(2 * p->n_pairs);
    n.arg = pairs;
  } else if (want != KEX__V1__NODE__ARG__NOT_SET) {
    const Kex__V1__Ints *v = pn->new_shape; /* the union's members are all Ints * but pairs */
    if (v->n_values > KEX_MAX_DIMS) NODE_FAIL(KEX_ELIMIT, "\"%s\" has %zu entries, more than the limit of %d dims", arg_case_name(want), v->n_values, KEX_MAX_DIMS);
    n.narg = (uint32_t)v->n_values;
    n.arg = v->values;
  }
  /* axis */
  bool is_reduce = n.op == KEX_GOP_REDUCE_SUM || n.op == KEX_GOP_REDUCE_MAX;
  if (pn->n_axis && !is_reduce) NODE_FAIL(KEX_EINVAL, "unexpected field \"axis\"");
  if (pn->n_axis > KEX_MAX_DIMS) NODE_FAIL(KEX_EINVAL, "\"axis\" has %zu entries, more than any shape's %d dims", pn->n_axis, KEX_MAX_DIMS);
  n.naxis = (uint32_t)pn->n_axis;
  n.axis = pn->axis;
  /* value */
  if (pn->value && n.op != KEX_GOP_CONST) NODE_FAIL(KEX_EINVAL, "unexpected field \"value\"");
  if (n.op == KEX_GOP_CONST) {
    if (!pn->value) NODE_FAIL(KEX_EINVAL, "missing \"value\"");
    if (scalar_to_const(pn->value, &n.value) < 0)
      NODE_FAIL(KEX_EINVAL, "\"value\" must be a number, true/false, or \"inf\"/\"-inf\"/\"nan\"");
  }
  /* BUFFER contents */
  if (pn->contents_case != KEX__V1__NODE__CONTENTS__NOT_SET && n.op != KEX_GOP_BUFFER)
    NODE_FAIL(KEX_EINVAL, "unexpected contents (data, fill or buffer): only BUFFER takes them");
  if (n.op == KEX_GOP_BUFFER) {
    switch (pn->contents_case) {
    case KEX__V1__NODE__CONTENTS_DATA:
      n.bufsrc = KEX_BUF_DATA;
      n.data = pn->data.data;
      n.data_len = pn->data.len;
      break;
    case KEX__V1__NODE__CONTENTS_FILL_RANDOM: n.bufsrc = KEX_BUF_FILL_RANDOM; n.seed = pn->fill_random; break;
    case KEX__V1__NODE__CONTENTS_FILL_ARANGE:
      if (!pn->fill_arange) NODE_FAIL(KEX_EINVAL, "fill \"arange\" must be true");
      n.bufsrc = KEX_BUF_FILL_ARANGE;
      break;
    case KEX__V1__NODE__CONTENTS_FILL_VALUE:
      if (scalar_to_const(pn->fill_value, &n.fill) < 0)
        NODE_FAIL(KEX_EINVAL, "fill \"value\" must be a number, true/false, or \"inf\"/\"-inf\"/\"nan\"");
      n.bufsrc = KEX_BUF_FILL_VALUE;
      break;
    case KEX__V1__NODE__CONTENTS_BUFFER:
      if (!pn->buffer || !*pn->buffer) NODE_FAIL(KEX_EINVAL, "\"buffer\" must be a non-empty handle");
    {
      const kexd_buffer *kb = job ? kexd_job_find_buffer(job, pn->buffer) : NULL;
      if (!kb) NODE_FAIL(KEX_ENOTFOUND, "unknown buffer handle \"%.64s\": the job holds no buffer of that name", pn->buffer);
      if (kb->dtype != n.dtype)
        NODE_FAIL(KEX_EINVAL, "buffer %.8s holds %s, the node says %s", kb->handle, kex_dtypes[kb->dtype].name,
                  kex_dtypes[n.dtype].name);
      bool same = kb->ndim == n.ndim;
      for (uint8_t k = 0; same && k < n.ndim; k++) same = kb->shape[k] == n.shape[k];
      if (!same) NODE_FAIL(KEX_EINVAL, "buffer %.8s has another shape than the node's", kb->handle);
      n.bufsrc = KEX_BUF_HANDLE;
      n.handle = pn->buffer;
      break;
    }
    default: NODE_FAIL(KEX_EINVAL, "BUFFER needs one of \"data\", \"fill_*\", \"buffer\"");
    }
  }
  /* device */
  if (pn->device && *pn->device) {
    if (!gop_is_input(n.op) && n.op != KEX_GOP_COPY) NODE_FAIL(KEX_EINVAL, "unexpected field \"device\"");
    n.device = pn->device;
  }
  if ((rc = kex_graph_add(g, &n, lim, err)) >= 0) rc = 0;
out:
  kex_free(pairs);
  return rc;
}

#undef NODE_FAIL

/*
 * Build and validate a kex_graph from pg.  On success *out owns a new graph.
 * Errors as kex_graph_add (KEX_EINVAL naming the node, KEX_ELIMIT for the
 * limits, KEX_ENOMEM), KEX_ENOTFOUND for an unknown buffer handle.
 */
int kexd_rpc_graph_from_pb(const kexd *d, const Kex__V1__Graph *pg, const char *device, const kex_limits *lim,
                           kexd_job *job, kex_graph **out, kex_error *err) {
  kex_graph *g = NULL;
  int rc = 0;
  *out = NULL;
  if (pg->format && *pg->format && strcmp(pg->format, RPC_GRAPH_FORMAT) != 0) {
    rc = kex_err_set(err, KEX_EINVAL, "graph: \"format\" must be \"%s\", not \"%.64s\"", RPC_GRAPH_FORMAT, pg->format);
    goto out;
  }
  if (pg->n_nodes > lim->max_nodes) {
    rc = kex_err_set(err, KEX_ELIMIT, "graph: %zu nodes, more than the limit of %u (--max-nodes)", pg->n_nodes,
                     lim->max_nodes);
    goto out;
  }
  if (pg->n_outputs > lim->max_outputs) {
    rc = kex_err_set(err, KEX_ELIMIT, "graph: %zu outputs, more than the limit of %u (--max-outputs)", pg->n_outputs,
                     lim->max_outputs);
    goto out;
  }
  if (!(g = kex_graph_new(device))) {
    rc = kex_err_set(err, KEX_ENOMEM, "graph: out of memory");
    goto out;
  }
  for (size_t i = 0; i < pg->n_nodes; i++) {
    const Kex__V1__Node *pn = pg->nodes[i];
    if (pn->device && *pn->device && kexd_rpc_device_index(d, pn->device) < 0) {
      rc = kex_err_set(err, KEX_EINVAL, "node %zu (%s): device \"%.64s\" is not one of this kexd's devices", i,
                       pn->op ? pn->op : "?", pn->device);
      goto out;
    }
    if ((rc = node_from_pb(g, (uint32_t)i, pn, lim, job, err)) < 0) goto out;
  }
  for (size_t i = 0; i < pg->n_outputs; i++)
    if ((rc = kex_graph_add_output(g, pg->outputs[i], lim, err)) < 0) goto out;
  *out = g;
  g = NULL;
out:
  kex_graph_free(g);
  return rc;
}

/*
 * rpc.c - decode, validate and route: one handler per method.
 *
 * Each handler runs on the loop thread with the request's bytes, unpacks them
 * with protobuf-c (allocating through kex_malloc; the size was capped by
 * gRPC at --max-message and is checked again here), checks the job token,
 * does its work and ends the call with a reply or a status whose message a
 * person can act on.  Nothing a client sends can make the daemon exit: every
 * failure becomes a status.
 *
 * Plan converts the protobuf Graph into the kex_graph builder API (every
 * refusal names the node), then replays and schedules it -- on the loop
 * thread for small graphs, on the libuv worker pool for large ones -- and
 * replies with the schedule items as `kex plan --json` prints them.
 *
 * Submit lives in submit.c (it reuses the Graph conversion; BUFFER nodes
 * may name a job's buffer handle, in Plan too).
 *
 * Upload (a client stream), Download (a server stream) and Free move a
 * job's buffers: the bytes go to and from the device only through its
 * runner (dispatch.c), one work item at a time, and the handler's state
 * lives until the last of its read, write or device item comes back.
 * kexd --test-busy-work adds /kex.v1.Kex/_BusyWork (tests only).
 *
 * Tune and the beam-cache methods live in tune.c.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/accept_guard.h"
#include "daemon/kexd.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kex/v1/kex.pb-c.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#ifdef KEXD_HAVE_DEVICES
#include "devices/device.h"
#endif

#define RPC_GRAPH_FORMAT "kex.graph.v1"
#define RPC_SERVICE "kex.v1.Kex"
#define RPC_HEALTH_SERVICE "grpc.health.v1.Health"

/* ---- protobuf-c through kex_malloc ---- */

static _Thread_local bool pb_alloc_failed; /* an unpack failed for memory, not for bad bytes */

static void *pb_alloc(void *ud, size_t size) {
  void *p;
  (void)ud;
  p = kex_malloc(size);
  if (!p) pb_alloc_failed = true;
  return p;
}

static void pb_free(void *ud, void *p) {
  (void)ud;
  kex_free(p);
}

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* A kex error as a call status: the message when there is one, else the code's text. */
static void fail_kex(kexd_call *c, int rc, const kex_error *err) {
  kexd_call_finish(c, kex_err_grpc_status(rc), err && err->msg[0] ? err->msg : kex_strerror(rc), NULL);
}

/*
 * Unpack the request of call c as `desc`.  On failure the call is finished
 * (INVALID_ARGUMENT for missing or malformed bytes, RESOURCE_EXHAUSTED for
 * size or memory) and NULL is returned.  Free the result with free_msg.
 */
static ProtobufCMessage *decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                size_t len) {
  ProtobufCMessage *m;
  if (!req) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: the request carries no %s message", kexd_call_method(c),
                    desc->name);
    return NULL;
  }
  if (d->cfg.max_message > 0 && len > (size_t)d->cfg.max_message) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: request of %zu bytes is more than the limit of %d bytes",
                    kexd_call_method(c), len, d->cfg.max_message);
    return NULL;
  }
  pb_alloc_failed = false;
  m = protobuf_c_message_unpack(desc, &pb_allocator, len, req);
  if (!m) {
    if (pb_alloc_failed)
      kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory decoding a %zu-byte request",
                      kexd_call_method(c), len);
    else
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: the request is not a valid %s message (%zu bytes)",
                      kexd_call_method(c), desc->name, len);
  } else {
    char why[KEX_ERROR_MSG_MAX];
    if (kexd_wire_check_strings(desc, req, len, why, sizeof why) < 0) { /* strings are compared whole: no NUL, UTF-8 */
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", kexd_call_method(c), why);
      protobuf_c_message_free_unpacked(m, &pb_allocator);
      m = NULL;
    }
  }
  return m;
}

static void free_msg(ProtobufCMessage *m) {
  if (m) protobuf_c_message_free_unpacked(m, &pb_allocator);
}

/* The job named by token, lease renewed; NULL with the call finished (INVALID_ARGUMENT / NOT_FOUND). */
static kexd_job *need_job(kexd *d, kexd_call *c, const char *token) {
  kexd_job *job;
  if (!token || !*token) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: missing job token (field `job`; OpenJob returns one)",
                    kexd_call_method(c));
    return NULL;
  }
  if (!(job = kexd_jobs_find(&d->jobs, token)))
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "%s: unknown job token (never opened, closed, or expired after its lease)",
                    kexd_call_method(c));
  return job;
}

ProtobufCMessage *kexd_rpc_decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                  size_t len) {
  return decode(d, c, desc, req, len);
}

void kexd_rpc_free_msg(ProtobufCMessage *m) { free_msg(m); }

kexd_job *kexd_rpc_need_job(kexd *d, kexd_call *c, const char *token) { return need_job(d, c, token); }

/* ---- grpc.health.v1.Health ---- */

static bool health_known(const char *service) {
  return !*service || strcmp(service, RPC_SERVICE) == 0 || strcmp(service, RPC_HEALTH_SERVICE) == 0;
}

static void rpc_health_check(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Grpc__Health__V1__HealthCheckRequest *m =
      (Grpc__Health__V1__HealthCheckRequest *)decode(d, c, &grpc__health__v1__health_check_request__descriptor, req, len);
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  if (!m) return;
  if (!health_known(m->service)) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "unknown service \"%s\"", m->service);
  } else {
    r.status = kexd_server_stopping(d->server) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                                                : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  }
  free_msg(&m->base);
}

/*
 * Watch: SERVING now, then nothing until the server stops (NOT_SERVING, then
 * OK) or the client goes away.  The state is freed exactly once: when the
 * call is finished or cancelled and no write is outstanding.
 */
typedef struct health_watch {
  bool writing, stop_pending, dead;
} health_watch;

static void watch_end(kexd_call *c, health_watch *w) {
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  kex_free(w);
}

static void watch_written(kexd_call *c, int ok, void *ud) {
  health_watch *w = ud;
  w->writing = false;
  if (w->dead) {
    kex_free(w);
    return;
  }
  if (ok && w->stop_pending) watch_end(c, w);
  /* !ok: the call died; its cancel hook follows and frees w */
}

static void watch_cancelled(kexd_call *c, void *ud) {
  health_watch *w = ud;
  (void)c;
  w->dead = true;
  if (!w->writing) kex_free(w);
}

static void watch_stop(kexd_call *c, void *ud) {
  health_watch *w = ud;
  if (w->writing) w->stop_pending = true;
  else watch_end(c, w);
}

static void rpc_health_watch(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Grpc__Health__V1__HealthCheckRequest *m =
      (Grpc__Health__V1__HealthCheckRequest *)decode(d, c, &grpc__health__v1__health_check_request__descriptor, req, len);
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  health_watch *w = NULL;
  int rc;
  if (!m) return;
  if (!health_known(m->service)) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "unknown service \"%s\"", m->service);
    goto out;
  }
  if (kexd_server_stopping(d->server)) {
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
    goto out;
  }
  if (!(w = kex_calloc(1, sizeof *w))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  w->writing = true;
  if ((rc = kexd_call_write(c, &r.base, watch_written, w)) < 0) {
    kex_free(w);
    kexd_call_failf(c, GRPC_STATUS_INTERNAL, "cannot send the health status: %s", kex_strerror(rc));
    goto out;
  }
  kexd_call_set_hooks(c, watch_cancelled, watch_stop, w);
out:
  free_msg(&m->base);
}

/* ---- jobs ---- */

static void rpc_open_job(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__OpenJobRequest *m = (Kex__V1__OpenJobRequest *)decode(d, c, &kex__v1__open_job_request__descriptor, req, len);
  Kex__V1__OpenJobReply r = KEX__V1__OPEN_JOB_REPLY__INIT;
  kexd_job *job;
  kex_error err = {0};
  char peer[KEXD_PEER_MAX];
  uint64_t memory;
  int rc;
  if (!m) return;
  memory = m->memory_limit ? m->memory_limit : d->cfg.job_memory_default;
  kexd_call_peer_host(c, peer, sizeof peer);
  if (memory > d->cfg.job_memory_max)
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "OpenJob: memory_limit %" PRIu64 " is more than the server's limit of %" PRIu64
                    " bytes (--job-memory-max)",
                    memory, d->cfg.job_memory_max);
  else if (m->weight > KEXD_LIMIT_WEIGHT)
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "OpenJob: weight %u is more than the limit of %u",
                    m->weight, KEXD_LIMIT_WEIGHT);
  else if ((rc = kexd_jobs_open(&d->jobs, m->name, m->weight, memory, peer, &job, &err)) < 0)
    kexd_call_failf(c, kex_err_grpc_status(rc), "OpenJob: %s", err.msg);
  else {
    kex_log(KEX_LOG_INFO, job->log_id, 0, "job \"%s\" opened by %s (weight %u, memory limit %" PRIu64 " bytes)",
            job->name, peer, job->weight, job->memory_limit);
    r.job = job->token;
    r.lease_seconds = (uint32_t)ceil(d->cfg.lease_s);
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  }
  free_msg(&m->base);
}

static void rpc_close_job(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__CloseJobRequest *m =
      (Kex__V1__CloseJobRequest *)decode(d, c, &kex__v1__close_job_request__descriptor, req, len);
  Kex__V1__CloseJobReply r = KEX__V1__CLOSE_JOB_REPLY__INIT;
  if (!m) return;
  if (need_job(d, c, m->job)) {
    kexd_jobs_close_job(&d->jobs, m->job);
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  }
  free_msg(&m->base);
}

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
    if (pn->n_shape > maxd) NODE_FAIL(KEX_ELIMIT, "shape has %zu dims, more than the limit of %u", pn->n_shape, maxd);
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

/* ---- Plan ---- */

/* One Plan in progress; owns the graph, the replay's arena and the reply. */
typedef struct plan_work {
  uv_work_t req;
  kexd *d;
  kexd_call *call;
  char job[9];
  kex_graph *g;
  kex_replay_opts ro;
  kex_arena arena;       /* the replay, the schedule and the reply live here */
  kex_replay *replay;
  kex_schedule *sched;
  Kex__V1__PlanReply reply;
  int rc;
  kex_error err;
} plan_work;

static void plan_work_free(plan_work *w) {
  kex_schedule_free(w->sched);
  kex_replay_free(w->replay);
  kex_graph_free(w->g);
  kex_arena_destroy(&w->arena);
  kex_free(w);
}

/* A JSON array of integers as an arena array of uint32; NULL on OOM (n = 0 gives a non-NULL pointer). */
static uint32_t *json_u32s(kex_arena *a, const json_t *arr, size_t *n) {
  uint32_t *v;
  *n = json_array_size(arr);
  if (!(v = kex_arena_alloc(a, (*n ? *n : 1) * sizeof *v))) return NULL;
  for (size_t i = 0; i < *n; i++) v[i] = (uint32_t)json_integer_value(json_array_get(arr, i));
  return v;
}

/* Fill w->reply from the schedule (the `kex plan --json` items).  0 or KEX_ENOMEM. */
static int plan_reply_build(plan_work *w) {
  kex_arena *a = &w->arena;
  Kex__V1__PlanReply *r = &w->reply;
  json_t *items = kex_schedule_to_json(w->sched);
  int rc = 0;
  kex__v1__plan_reply__init(r);
  if (!items) return KEX_ENOMEM;
  r->kernels = w->sched->nkernels;
  r->intermediate_buffers = w->sched->nplanned_buffers;
  r->planned_buffers = w->sched->nplanned_after;
  r->bytes_before = w->sched->planned_bytes_before;
  r->bytes_after = w->sched->planned_bytes_after;
  r->n_items = json_array_size(items);
  if (!(r->items = kex_arena_calloc(a, r->n_items ? r->n_items : 1, sizeof *r->items))) goto nomem;
  for (size_t i = 0; i < r->n_items; i++) {
    const json_t *o = json_array_get(items, i), *ast = json_object_get(o, "ast");
    Kex__V1__PlanItem *it = kex_arena_alloc(a, sizeof *it);
    if (!it) goto nomem;
    kex__v1__plan_item__init(it);
    if (!(it->kind = kex_arena_strdup(a, json_string_value(json_object_get(o, "kind")))) ||
        !(it->label = kex_arena_strdup(a, json_string_value(json_object_get(o, "label")))) ||
        !(it->outputs = json_u32s(a, json_object_get(o, "outputs"), &it->n_outputs)) ||
        !(it->inputs = json_u32s(a, json_object_get(o, "inputs"), &it->n_inputs)) ||
        !(it->planned = json_u32s(a, json_object_get(o, "buffers_planned"), &it->n_planned)))
      goto nomem;
    it->n_ast = json_is_array(ast) ? json_array_size(ast) : 0;
    if (!(it->ast = kex_arena_alloc(a, (it->n_ast ? it->n_ast : 1) * sizeof *it->ast))) goto nomem;
    for (size_t k = 0; k < it->n_ast; k++)
      if (!(it->ast[k] = kex_arena_strdup(a, json_string_value(json_array_get(ast, k))))) goto nomem;
    r->items[i] = it;
  }
  goto out;
nomem:
  rc = KEX_ENOMEM;
out:
  json_decref(items);
  return rc;
}

/* Replay, schedule and build the reply; safe on a worker thread (touches only w). */
static void plan_run(plan_work *w) {
  double t0 = now_us(), t1;
  w->rc = kex_replay_graph(w->g, &w->ro, &w->arena, &w->replay, &w->err);
  if (!w->rc) w->rc = kex_schedule_create(w->replay, &w->sched, &w->err);
  t1 = now_us();
  if (!w->rc && (w->rc = plan_reply_build(w)) < 0) kex_err_set(&w->err, w->rc, "Plan: out of memory building the reply");
  w->reply.schedule_us = t1 - t0;
}

/* Reply on the loop thread and free the work. */
static void plan_done(plan_work *w) {
  kexd *d = w->d;
  if (w->rc < 0) {
    d->plan_errors++;
    kex_log(KEX_LOG_INFO, w->job, 0, "Plan refused: %s", w->err.msg[0] ? w->err.msg : kex_strerror(w->rc));
    fail_kex(w->call, w->rc, &w->err);
  } else {
    d->kernels_planned += w->reply.kernels;
    kex_log(KEX_LOG_DEBUG, w->job, 0, "Plan: %u nodes -> %u kernels in %.0f us", w->g->nnodes, w->reply.kernels,
            w->reply.schedule_us);
    kexd_call_finish(w->call, GRPC_STATUS_OK, NULL, &w->reply.base);
  }
  d->plans_in_flight--;
  kexd_call_unref(w->call);
  plan_work_free(w);
}

static void plan_work_cb(uv_work_t *req) { plan_run(req->data); }

static void plan_after_work_cb(uv_work_t *req, int status) {
  plan_work *w = req->data;
  if (status < 0 && !w->rc) w->rc = kex_err_set(&w->err, KEX_EINTERNAL, "Plan: the worker pool dropped the job");
  plan_done(w);
}

/* Which configured device a graph's "device" names; NULL when none. */
static const char *resolve_device(const kexd *d, const char *name) {
  if (!name || !*name || strcmp(name, "default") == 0) return d->cfg.devices[0];
  for (uint32_t i = 0; i < d->cfg.ndevices; i++)
    if (strcmp(d->cfg.devices[i], name) == 0) return d->cfg.devices[i];
  return NULL;
}

static void rpc_plan(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__PlanRequest *m = (Kex__V1__PlanRequest *)decode(d, c, &kex__v1__plan_request__descriptor, req, len);
  kexd_job *job;
  plan_work *w = NULL;
  const char *dev;
  int rc;
  if (!m) return;
  if (!(job = need_job(d, c, m->job))) goto out;
  d->plans++;
  job->plans++;
  if (!m->graph) {
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Plan: missing graph");
    goto out;
  }
  if (!(dev = resolve_device(d, m->graph->device))) {
    char names[KEXD_MAX_DEVICES * (KEXD_DEVICE_NAME_MAX + 2)] = "";
    for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
      if (i) strcat(names, ", ");
      strcat(names, d->cfg.devices[i]);
    }
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices (%s)",
                    m->graph->device, names);
    goto out;
  }
  if (!(w = kex_calloc(1, sizeof *w))) {
    d->plan_errors++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Plan: out of memory");
    goto out;
  }
  kex_arena_init(&w->arena, 0);
  w->d = d;
  w->call = c;
  memcpy(w->job, job->log_id, sizeof w->job);
  /* a cpu device follows tinygrad's CLANG rules (buffer views), every other its GPU (OpenCL) rules */
  w->ro.buffer_view = strncmp(dev, "cpu", 3) == 0;
  w->ro.device_name = dev;
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                    &d->cfg.limits, job, &w->g, &w->err)) < 0) {
    d->plan_errors++;
    kex_log(KEX_LOG_INFO, w->job, 0, "Plan refused: %s", w->err.msg);
    fail_kex(c, rc, &w->err);
    plan_work_free(w);
    goto out;
  }
  kexd_call_ref(c); /* the plan's own reference: the call outlives a cancel until plan_done */
  d->plans_in_flight++;
  if (w->g->nnodes <= d->cfg.plan_inline_nodes) {
    plan_run(w);
    plan_done(w);
  } else {
    w->req.data = w;
    if ((rc = uv_queue_work(d->loop, &w->req, plan_work_cb, plan_after_work_cb)) < 0) {
      plan_run(w); /* the pool refused: do it here rather than fail */
      plan_done(w);
    }
  }
out:
  free_msg(&m->base);
}

/* ---- buffers: Upload, Download, Free ---- */

static int device_index(const kexd *d, const char *name) { return kexd_rpc_device_index(d, name); }

int kexd_rpc_device_index(const kexd *d, const char *name) {
  if (!name || !*name || strcmp(name, "default") == 0) return 0;
  for (uint32_t i = 0; i < d->cfg.ndevices; i++)
    if (strcmp(d->cfg.devices[i], name) == 0) return (int)i;
  return -1;
}

/* "float32 [2, 3]" into out[cap]. */
static void describe_buffer(char *out, size_t cap, kex_dtype dt, const int64_t *shape, size_t ndim) {
  size_t n = (size_t)snprintf(out, cap, "%s [", kex_dtypes[dt].name);
  for (size_t i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/*
 * One Upload stream.  Freed exactly once, by whoever sees it last: the read
 * callback or the device callback when the call is over, or the cancel hook
 * when neither is outstanding.
 */
typedef struct upload {
  kexd *d;
  kexd_call *call;
  uint64_t job;            /* 0 until the header */
  char log_id[9];
  bool have_header, reading, on_device, dead;
  kex_dtype dtype;
  uint8_t ndim;
  int64_t shape[KEX_MAX_DIMS];
  uint32_t device;
  uint64_t total, got, reserved;
  uint8_t *bytes;          /* cap bytes, grown as chunks arrive (never past total) */
  uint64_t cap;
  kexd_work work;
} upload;

static void upload_free(upload *u) {
  kexd_job *job = u->reserved ? kexd_jobs_find_id(&u->d->jobs, u->job) : NULL;
  if (job) kexd_job_unreserve(job, u->reserved);
  kex_free(u->bytes);
  kex_free(u);
}

/* End the call with an error, count it, free u. */
static void upload_fail(upload *u, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void upload_fail(upload *u, int status, const char *fmt, ...) {
  char msg[KEX_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  u->d->upload_errors++;
  kex_log(KEX_LOG_INFO, u->job ? u->log_id : NULL, 0, "Upload refused: %s", msg);
  kexd_call_finish(u->call, status, msg, NULL);
  upload_free(u);
}

static void upload_cancelled(kexd_call *c, void *ud) {
  upload *u = ud;
  (void)c;
  u->dead = true;
  if (!u->reading && !u->on_device) upload_free(u);
}

/* The buffer is on the device (or the device refused it): hand out the handle. */
static void upload_on_device(kexd_work *w) {
  upload *u = w->ud;
  kexd *d = u->d;
  kexd_call *c = u->call;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, u->job);
  kexd_buffer *b;
  int rc;
  u->on_device = false;
  if (job) kexd_job_unreserve(job, u->reserved);
  u->reserved = 0;
  kex_free(u->bytes);
  u->bytes = NULL;
  if (w->rc < 0) {
    if (u->dead) upload_free(u);
    else upload_fail(u, kex_err_grpc_status(w->rc), "Upload: %s", w->err.msg[0] ? w->err.msg : kex_strerror(w->rc));
  } else if (u->dead || !job) {
    kexd_jobs_free_device_buffer(&d->jobs, w->out_buf, u->device, u->job, w->weight);
    if (u->dead) upload_free(u);
    else upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed while its buffer was being uploaded");
  } else if ((rc = kexd_job_add_buffer(&d->jobs, job, w->out_buf, u->device, u->dtype, u->shape, u->ndim, u->total,
                                       &b)) < 0) {
    kexd_jobs_free_device_buffer(&d->jobs, w->out_buf, u->device, u->job, w->weight);
    upload_fail(u, kex_err_grpc_status(rc), "Upload: cannot record the buffer: %s", kex_strerror(rc));
  } else {
    Kex__V1__UploadReply r = KEX__V1__UPLOAD_REPLY__INIT;
    r.handle = b->handle;
    r.bytes = b->bytes;
    d->uploads++;
    kex_log(KEX_LOG_DEBUG, u->log_id, 0, "Upload: %" PRIu64 " bytes as buffer %.8s on %s", b->bytes, b->handle,
            d->cfg.devices[u->device]);
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
    upload_free(u);
  }
  kexd_call_unref(c); /* the device item's reference */
}

/* The header: check dtype, shape, device and the job's memory limit; reserve and allocate.  0 or the call is ended. */
static int upload_header(upload *u, kexd_job *job, const Kex__V1__UploadHeader *h) {
  const kex_limits *lim = &u->d->cfg.limits;
  uint32_t maxd = lim->max_dims < KEX_MAX_DIMS ? lim->max_dims : KEX_MAX_DIMS;
  uint64_t elements = 1;
  kex_error err = {0};
  int dt, dev;
  if (!h->dtype || (dt = kex_dtype_from_name(h->dtype)) < 0) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: unknown dtype \"%.64s\"", h->dtype ? h->dtype : "");
    return -1;
  }
  if (h->n_shape > maxd) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: shape has %zu dims, more than the limit of %u",
                h->n_shape, maxd);
    return -1;
  }
  for (size_t i = 0; i < h->n_shape; i++) {
    if (h->shape[i] < 0) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: shape dim %zu is %" PRId64 ", negative", i, h->shape[i]);
      return -1;
    }
    if (h->shape[i] && elements > (uint64_t)lim->max_elements / (uint64_t)h->shape[i]) {
      upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: shape has more than the limit of %" PRId64
                  " elements (--max-elements)", lim->max_elements);
      return -1;
    }
    elements *= (uint64_t)h->shape[i];
    u->shape[i] = h->shape[i];
  }
  if ((dev = device_index(u->d, h->device)) < 0) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: device \"%.64s\" is not one of this kexd's devices",
                h->device);
    return -1;
  }
  u->dtype = (kex_dtype)dt;
  u->ndim = (uint8_t)h->n_shape;
  u->device = (uint32_t)dev;
  u->total = elements * (uint64_t)kex_dtype_size(u->dtype);
  if (u->total > (uint64_t)lim->max_buffer_bytes) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: %" PRIu64 " bytes, more than the limit of %" PRId64
                " bytes of one buffer (--max-buffer-bytes)", u->total, lim->max_buffer_bytes);
    return -1;
  }
  if (kexd_job_reserve(job, u->total, &err) < 0) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: %s", err.msg);
    return -1;
  }
  u->reserved = u->total;
  u->have_header = true;
  return 0;
}

/* All chunks are in: check the total and send the bytes to the device.  The call is ended on failure. */
static void upload_end(upload *u) {
  kexd_job *job = kexd_jobs_find_id(&u->d->jobs, u->job);
  char what[160];
  int rc;
  if (!u->have_header) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the stream ended without a header");
    return;
  }
  if (u->got != u->total) {
    describe_buffer(what, sizeof what, u->dtype, u->shape, u->ndim);
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: got %" PRIu64 " bytes, %s needs %" PRIu64, u->got, what,
                u->total);
    return;
  }
  if (!job) {
    upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed during the upload");
    return;
  }
  memset(&u->work, 0, sizeof u->work);
  u->work.kind = KEXD_WORK_UPLOAD;
  u->work.job = job->id;
  u->work.weight = job->weight;
  u->work.size = u->total;
  u->work.src = u->bytes;
  u->work.src_size = u->total;
  u->work.done = upload_on_device;
  u->work.ud = u;
  if ((rc = kexd_dispatch_post(u->d->disp, u->device, &u->work)) < 0) {
    upload_fail(u, GRPC_STATUS_UNAVAILABLE, "Upload: the device runner is not available: %s", kex_strerror(rc));
    return;
  }
  u->on_device = true;
  kexd_call_ref(u->call);
}

static void upload_on_message(kexd_call *c, const uint8_t *msg, size_t len, int ok, void *ud) {
  upload *u = ud;
  kexd *d = u->d;
  Kex__V1__UploadRequest *m = NULL;
  kexd_job *job;
  int rc;
  u->reading = false;
  if (u->dead) {
    upload_free(u);
    return;
  }
  if (!ok) {
    upload_fail(u, GRPC_STATUS_CANCELLED, "Upload: the stream broke");
    return;
  }
  if (!msg) {
    upload_end(u);
    return;
  }
  if (!(m = (Kex__V1__UploadRequest *)decode(d, c, &kex__v1__upload_request__descriptor, msg, len))) {
    d->upload_errors++;
    upload_free(u);
    return;
  }
  if (*m->job || !u->have_header) {
    if (!(job = need_job(d, c, m->job))) {
      d->upload_errors++;
      upload_free(u);
      goto out;
    }
    if (u->have_header && job->id != u->job) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the stream names two different jobs");
      goto out;
    }
  } else if (!(job = kexd_jobs_find_id(&d->jobs, u->job))) {
    upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed during the upload");
    goto out;
  } else {
    job->last_used_ms = uv_now(d->loop);
  }
  if (!u->have_header) {
    u->job = job->id;
    memcpy(u->log_id, job->log_id, sizeof u->log_id);
    if (m->part_case != KEX__V1__UPLOAD_REQUEST__PART_HEADER) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the first message must carry the header (dtype, shape)");
      goto out;
    }
    if (upload_header(u, job, m->header) < 0) goto out;
  } else if (m->part_case == KEX__V1__UPLOAD_REQUEST__PART_HEADER) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: a second header after %" PRIu64 " bytes", u->got);
    goto out;
  } else if (m->part_case == KEX__V1__UPLOAD_REQUEST__PART_CHUNK) {
    if (m->chunk.len > u->total - u->got) {
      char what[160];
      describe_buffer(what, sizeof what, u->dtype, u->shape, u->ndim);
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: more than the %" PRIu64 " bytes %s needs (got %" PRIu64
                  " so far, then a chunk of %zu)", u->total, what, u->got, m->chunk.len);
      goto out;
    }
    if (u->got + m->chunk.len > u->cap) { /* a header alone never makes kexd allocate the whole buffer */
      uint64_t cap = u->cap * 2 > u->got + m->chunk.len ? u->cap * 2 : u->got + m->chunk.len;
      uint8_t *nb;
      if (cap > u->total) cap = u->total;
      if (!(nb = kex_realloc(u->bytes, cap))) {
        upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: out of memory for %" PRIu64 " bytes", cap);
        goto out;
      }
      u->bytes = nb;
      u->cap = cap;
    }
    if (m->chunk.len) memcpy(u->bytes + u->got, m->chunk.data, m->chunk.len);
    u->got += m->chunk.len;
  } else {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: a message with neither header nor chunk");
    goto out;
  }
  if ((rc = kexd_call_read(c, upload_on_message, u)) < 0) {
    upload_fail(u, GRPC_STATUS_INTERNAL, "Upload: cannot read the stream: %s", kex_strerror(rc));
    goto out;
  }
  u->reading = true;
out:
  free_msg(&m->base);
}

static void rpc_upload(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  upload *u;
  int rc;
  (void)req;
  (void)len;
  if (!(u = kex_calloc(1, sizeof *u))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: out of memory");
    return;
  }
  u->d = d;
  u->call = c;
  if ((rc = kexd_call_read(c, upload_on_message, u)) < 0) {
    kex_free(u);
    kexd_call_failf(c, GRPC_STATUS_INTERNAL, "Upload: cannot read the stream: %s", kex_strerror(rc));
    return;
  }
  u->reading = true;
  kexd_call_set_hooks(c, upload_cancelled, NULL, u);
}

/*
 * One Download stream: copy a chunk out on the device's runner, write it,
 * repeat.  At most one of the two is outstanding (`busy`); the buffer is
 * referenced throughout, so a Free or CloseJob meanwhile only frees it after.
 */
typedef struct download {
  kexd *d;
  kexd_call *call;
  kexd_buffer *buf;
  uint64_t job;
  uint64_t offset;
  size_t chunk;
  bool busy, dead;
  uint8_t *data;
  size_t n;
  kexd_work work;
} download;

static void download_free(download *dl) {
  kexd_buffer_unref(&dl->d->jobs, dl->buf);
  kex_free(dl->data);
  kex_free(dl);
}

static void download_cancelled(kexd_call *c, void *ud) {
  download *dl = ud;
  (void)c;
  dl->dead = true;
  if (!dl->busy) download_free(dl);
}

static void download_on_copy(kexd_work *w);

/* Copy the next chunk out.  The call is ended (and dl freed) on failure. */
static void download_next(download *dl) {
  kexd_job *job = kexd_jobs_find_id(&dl->d->jobs, dl->job);
  int rc;
  if (!job) {
    kexd_call_failf(dl->call, GRPC_STATUS_NOT_FOUND, "Download: the job was closed during the download");
    download_free(dl);
    return;
  }
  dl->n = dl->buf->bytes - dl->offset < dl->chunk ? (size_t)(dl->buf->bytes - dl->offset) : dl->chunk;
  if (!(dl->data = kex_malloc(dl->n ? dl->n : 1))) {
    kexd_call_failf(dl->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "Download: out of memory for a %zu-byte chunk", dl->n);
    download_free(dl);
    return;
  }
  memset(&dl->work, 0, sizeof dl->work);
  dl->work.kind = KEXD_WORK_COPY_OUT;
  dl->work.job = job->id;
  dl->work.weight = job->weight;
  dl->work.buf = dl->buf->dev_buf;
  dl->work.offset = dl->offset;
  dl->work.size = dl->n;
  dl->work.dst = dl->data;
  dl->work.done = download_on_copy;
  dl->work.ud = dl;
  if (dl->n == 0) { /* an empty buffer: one empty chunk, nothing to copy */
    dl->work.rc = 0;
    dl->busy = true;
    kexd_call_ref(dl->call);
    download_on_copy(&dl->work);
    return;
  }
  if ((rc = kexd_dispatch_post(dl->d->disp, dl->buf->device, &dl->work)) < 0) {
    kexd_call_failf(dl->call, GRPC_STATUS_UNAVAILABLE, "Download: the device runner is not available: %s",
                    kex_strerror(rc));
    download_free(dl);
    return;
  }
  dl->busy = true;
  kexd_call_ref(dl->call);
}

static void download_written(kexd_call *c, int ok, void *ud) {
  download *dl = ud;
  dl->busy = false;
  kex_free(dl->data);
  dl->data = NULL;
  if (dl->dead) {
    download_free(dl);
    return;
  }
  if (!ok) {
    kexd_call_failf(c, GRPC_STATUS_CANCELLED, "Download: the stream broke");
    download_free(dl);
    return;
  }
  dl->offset += dl->n;
  if (dl->offset >= dl->buf->bytes) {
    dl->d->downloads++;
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, NULL);
    download_free(dl);
    return;
  }
  download_next(dl);
}

static void download_on_copy(kexd_work *w) {
  download *dl = w->ud;
  kexd_call *c = dl->call;
  Kex__V1__DownloadChunk m = KEX__V1__DOWNLOAD_CHUNK__INIT;
  int rc;
  dl->busy = false;
  if (dl->dead) {
    download_free(dl);
  } else if (w->rc < 0) {
    kexd_call_finish(c, kex_err_grpc_status(w->rc),
                     w->rc == KEX_ECANCELLED ? "Download: the job was closed during the download"
                     : w->err.msg[0]         ? w->err.msg
                                             : kex_strerror(w->rc),
                     NULL);
    download_free(dl);
  } else {
    m.offset = dl->offset;
    m.data.data = dl->data;
    m.data.len = dl->n;
    if (dl->offset == 0) {
      m.dtype = (char *)kex_dtypes[dl->buf->dtype].name;
      m.n_shape = dl->buf->ndim;
      m.shape = dl->buf->shape;
      m.total_bytes = dl->buf->bytes;
    }
    if ((rc = kexd_call_write(c, &m.base, download_written, dl)) < 0) {
      kexd_call_failf(c, GRPC_STATUS_INTERNAL, "Download: cannot send a chunk: %s", kex_strerror(rc));
      download_free(dl);
    } else {
      dl->busy = true;
    }
  }
  kexd_call_unref(c); /* the copy's reference */
}

static void rpc_download(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__DownloadRequest *m =
      (Kex__V1__DownloadRequest *)decode(d, c, &kex__v1__download_request__descriptor, req, len);
  kexd_job *job;
  kexd_buffer *b;
  download *dl;
  size_t max_chunk = KEXD_DOWNLOAD_CHUNK;
  if (!m) return;
  if (!(job = need_job(d, c, m->job))) goto out;
  if (m->chunk_bytes && m->chunk_bytes < d->cfg.download_chunk_min) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "Download: chunk_bytes %u is under the server's minimum of %u bytes (--download-chunk-min; 0 "
                    "asks for the default)",
                    m->chunk_bytes, d->cfg.download_chunk_min);
    goto out;
  }
  if (!(b = kexd_job_find_buffer(job, m->handle))) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "Download: job '%s' holds no buffer \"%.40s\"", job->name, m->handle);
    goto out;
  }
  if (!(dl = kex_calloc(1, sizeof *dl))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Download: out of memory");
    goto out;
  }
  /* room for the chunk's other fields under --max-message */
  if (d->cfg.max_message > 8192 && (size_t)d->cfg.max_message - 4096 < max_chunk) max_chunk = (size_t)d->cfg.max_message - 4096;
  dl->d = d;
  dl->call = c;
  dl->buf = b;
  dl->job = job->id;
  dl->chunk = m->chunk_bytes && m->chunk_bytes < max_chunk ? m->chunk_bytes : max_chunk;
  kexd_buffer_ref(b);
  kexd_call_set_hooks(c, download_cancelled, NULL, dl);
  download_next(dl);
out:
  free_msg(&m->base);
}

static void rpc_free(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__FreeRequest *m = (Kex__V1__FreeRequest *)decode(d, c, &kex__v1__free_request__descriptor, req, len);
  Kex__V1__FreeReply r = KEX__V1__FREE_REPLY__INIT;
  kexd_job *job;
  if (!m) return;
  if (!(job = need_job(d, c, m->job))) goto out;
  for (size_t i = 0; i < m->n_handles; i++) /* all or nothing: check every handle first */
    if (!kexd_job_find_buffer(job, m->handles[i])) {
      kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "Free: job '%s' holds no buffer \"%.40s\" (handle %zu); nothing freed",
                      job->name, m->handles[i], i);
      goto out;
    }
  for (size_t i = 0; i < m->n_handles; i++)
    if (kexd_job_free_buffer(&d->jobs, job, m->handles[i]) == 0) r.freed++; /* a repeated handle counts once */
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
out:
  free_msg(&m->base);
}

/* ---- _BusyWork (kexd --test-busy-work only) ---- */

typedef struct busy_item {
  kexd_work work;
  double ms;
} busy_item;

/* Spin for arg's milliseconds on the runner thread; the device time is the wall time spun. */
static int busy_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  const busy_item *b = arg;
  double t0 = now_us(), t;
  (void)dev;
  (void)err;
  do t = now_us();
  while (t - t0 < b->ms * 1e3);
  *device_s = (t - t0) / 1e6;
  return 0;
}

static void busy_done(kexd_work *w) { kex_free(w->ud); }

static void rpc_busy_work(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__BusyWorkRequest *m =
      (Kex__V1__BusyWorkRequest *)decode(d, c, &kex__v1__busy_work_request__descriptor, req, len);
  Kex__V1__BusyWorkReply r = KEX__V1__BUSY_WORK_REPLY__INIT;
  kexd_job *job;
  int dev, rc;
  if (!m) return;
  if (!(job = need_job(d, c, m->job))) goto out;
  if (m->items > KEXD_BUSY_MAX_ITEMS || !(m->ms >= 0 && m->ms <= KEXD_BUSY_MAX_MS)) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "_BusyWork: items must be <= %d and ms in [0, %g]",
                    KEXD_BUSY_MAX_ITEMS, KEXD_BUSY_MAX_MS);
    goto out;
  }
  if ((dev = device_index(d, m->device)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "_BusyWork: device \"%.64s\" is not one of this kexd's devices",
                    m->device);
    goto out;
  }
  for (uint32_t i = 0; i < m->items; i++) {
    busy_item *b = kex_calloc(1, sizeof *b);
    if (!b) break;
    b->ms = m->ms;
    b->work.kind = KEXD_WORK_RUN;
    b->work.job = job->id;
    b->work.weight = job->weight;
    b->work.fn = busy_run;
    b->work.arg = b;
    b->work.done = busy_done;
    b->work.ud = b;
    if ((rc = kexd_dispatch_post(d->disp, (uint32_t)dev, &b->work)) < 0) {
      kex_free(b);
      break;
    }
    r.queued++;
  }
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
out:
  free_msg(&m->base);
}

/* ---- devices and stats ---- */

#define RPC_MAX_LISTED (2 * KEXD_MAX_DEVICES) /* devices in one ListDevices reply */

#ifdef KEXD_HAVE_DEVICES
/*
 * The discovered device a configured name opens, as kex_device_open picks it:
 * "opencl" the first GPU else the first OpenCL device, "opencl:<sub>" a name
 * containing sub, "cpu" the C backend, "default" the first GPU, OpenCL device, cpu.
 */
static const kex_device_desc *match_device(const kex_device_desc *descs, size_t n, const char *name) {
  const kex_device_desc *first_cl = NULL, *gpu = NULL, *cpu = NULL;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(descs[i].kind, "opencl") == 0) {
      if (!first_cl) first_cl = &descs[i];
      if (!gpu && descs[i].is_gpu) gpu = &descs[i];
    } else if (strcmp(descs[i].kind, "cpu") == 0 && !cpu) {
      cpu = &descs[i];
    }
  }
  if (strcmp(name, "opencl") == 0) return gpu ? gpu : first_cl;
  if (strcmp(name, "cpu") == 0) return cpu;
  if (strcmp(name, "default") == 0) return gpu ? gpu : first_cl ? first_cl : cpu;
  for (size_t i = 0; i < n; i++)
    if (strcmp(descs[i].open_name, name) == 0) return &descs[i];
  if (strncmp(name, "opencl:", 7) == 0)
    for (size_t i = 0; i < n; i++)
      if (strcmp(descs[i].kind, "opencl") == 0 && strcasestr(descs[i].name, name + 7)) return &descs[i];
  return NULL;
}
#endif

static void rpc_list_devices(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__ListDevicesRequest *m =
      (Kex__V1__ListDevicesRequest *)decode(d, c, &kex__v1__list_devices_request__descriptor, req, len);
  Kex__V1__ListDevicesReply r = KEX__V1__LIST_DEVICES_REPLY__INIT;
  Kex__V1__Device devs[RPC_MAX_LISTED], *ptrs[RPC_MAX_LISTED];
  size_t n = 0;
  if (!m) return;
  if (*m->job && !need_job(d, c, m->job)) goto out;
  /* the names kexd was configured with, the first the default ... */
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    kex__v1__device__init(&devs[n]);
    devs[n].name = d->cfg.devices[i];
    devs[n].kind = strncmp(d->cfg.devices[i], "cpu", 3) == 0 ? "cpu" : "opencl";
    devs[n].is_default = i == 0;
    ptrs[n] = &devs[n];
    n++;
  }
#ifdef KEXD_HAVE_DEVICES
  /* ... with what devices/ finds on this machine (listed once; OpenCL discovery takes ~20 ms) */
  if (!d->devices_listed) {
    kex_device_desc *descs = NULL;
    kex_error err = {0};
    int rc = kex_device_list(&descs, &d->ndevice_descs, &err);
    d->devices_listed = rc < 0 ? rc : 1;
    d->device_descs = descs;
    if (rc < 0) KEX_WARN("ListDevices: %s", err.msg[0] ? err.msg : kex_strerror(rc));
  }
  const kex_device_desc *descs = d->device_descs;
  for (size_t i = 0; i < n; i++) {
    const kex_device_desc *dd = match_device(descs, d->ndevice_descs, devs[i].name);
    if (!dd) continue;
    devs[i].kind = (char *)dd->kind;
    devs[i].device_name = (char *)dd->name;
    devs[i].vendor = (char *)dd->platform;
    devs[i].available = true;
  }
  for (size_t i = 0; i < d->ndevice_descs && n < RPC_MAX_LISTED; i++) {
    bool listed = false;
    for (size_t k = 0; k < n; k++) listed |= strcmp(devs[k].name, descs[i].open_name) == 0;
    if (listed) continue;
    kex__v1__device__init(&devs[n]);
    devs[n].name = (char *)descs[i].open_name;
    devs[n].kind = (char *)descs[i].kind;
    devs[n].device_name = (char *)descs[i].name;
    devs[n].vendor = (char *)descs[i].platform;
    devs[n].available = true;
    ptrs[n] = &devs[n];
    n++;
  }
#endif
  r.n_devices = n;
  r.devices = ptrs;
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
out:
  free_msg(&m->base);
}

static void rpc_get_stats(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  Kex__V1__GetStatsRequest *m = (Kex__V1__GetStatsRequest *)decode(d, c, &kex__v1__get_stats_request__descriptor, req, len);
  Kex__V1__StatsReply r = KEX__V1__STATS_REPLY__INIT;
  const kexd_server_stats *ss = kexd_server_get_stats(d->server);
  kexd_job *job = NULL;
  Kex__V1__JobStats *js = NULL, **jsp = NULL;
  if (!m) return;
  if (*m->job && !(job = need_job(d, c, m->job))) goto out;
  r.jobs_open = d->jobs.njobs;
  r.jobs_opened = d->jobs.opened;
  r.jobs_closed = d->jobs.closed;
  r.jobs_expired = d->jobs.expired;
  r.submissions = d->submissions;
  r.plans = d->plans;
  r.plan_errors = d->plan_errors;
  r.kernels_planned = d->kernels_planned;
  r.calls = ss->calls;
  r.calls_failed = ss->calls_failed;
  uv_update_time(d->loop);
  r.uptime_s = (uv_now(d->loop) - d->started_ms) / 1e3;
  r.buffers_freed = d->jobs.buffers_freed;
  r.submissions_done = d->submissions_done;
  r.submissions_failed = d->submissions_failed;
  r.schedule_cache_hits = d->sched_cache_hits;
  r.schedule_cache_misses = d->sched_cache_misses;
  r.program_cache_memory_hits = d->prog_cache_memory_hits;
  r.program_cache_sqlite_hits = d->prog_cache_sqlite_hits;
  r.program_cache_misses = d->prog_cache_misses;
  {
    kexd_tune_counters tc;
    kexd_tune_stats(d, &tc);
    r.beam_cache_hits = tc.beam_hits;
    r.beam_cache_misses = tc.beam_misses;
    r.searches_run = tc.searches;
    r.searches_cancelled = tc.searches_cancelled;
  }
  {
    kexd_accept_stats as;
    kexd_accept_guard_stats(&as);
    r.connections_open = as.open;
    r.connections_refused = as.refused_limit + as.refused_fds;
  }
  r.jobs_evicted = d->jobs.evicted;
  for (uint32_t i = 0; i < d->jobs.njobs; i++) r.bytes_held += d->jobs.jobs[i]->bytes_held;
  /* one job when a token was given, every open job otherwise */
  r.n_job_stats = job ? 1 : d->jobs.njobs;
  if (r.n_job_stats) {
    if (!(js = kex_calloc(r.n_job_stats, sizeof *js)) || !(jsp = kex_calloc(r.n_job_stats, sizeof *jsp))) {
      kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "GetStats: out of memory");
      goto out;
    }
    for (size_t i = 0; i < r.n_job_stats; i++) {
      const kexd_job *jb = job ? job : d->jobs.jobs[i];
      kexd_flow_stats fs;
      kexd_dispatch_job_stats(d->disp, jb->id, &fs);
      kex__v1__job_stats__init(&js[i]);
      js[i].name = jb->name;
      js[i].weight = jb->weight;
      js[i].memory_limit = jb->memory_limit;
      js[i].bytes_held = jb->bytes_held;
      js[i].bytes_reserved = jb->bytes_reserved;
      js[i].buffers = jb->nbufs;
      js[i].queued = fs.queued;
      js[i].running = fs.running;
      js[i].items_done = fs.items_done;
      js[i].device_time_s = fs.device_s;
      jsp[i] = &js[i];
    }
    r.job_stats = jsp;
  }
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
out:
  kex_free(jsp);
  kex_free(js);
  free_msg(&m->base);
}

int kexd_rpc_register(kexd *d) {
  static const struct {
    const char *path;
    kexd_payload payload;
    kexd_handler fn;
  } table[] = {
      {"/grpc.health.v1.Health/Check", KEXD_PAYLOAD_ONE, rpc_health_check},
      {"/grpc.health.v1.Health/Watch", KEXD_PAYLOAD_ONE, rpc_health_watch},
      {"/kex.v1.Kex/OpenJob", KEXD_PAYLOAD_ONE, rpc_open_job},
      {"/kex.v1.Kex/CloseJob", KEXD_PAYLOAD_ONE, rpc_close_job},
      {"/kex.v1.Kex/Plan", KEXD_PAYLOAD_ONE, rpc_plan},
      {"/kex.v1.Kex/ListDevices", KEXD_PAYLOAD_ONE, rpc_list_devices},
      {"/kex.v1.Kex/GetStats", KEXD_PAYLOAD_ONE, rpc_get_stats},
      {"/kex.v1.Kex/Submit", KEXD_PAYLOAD_ONE, kexd_rpc_submit},
      {"/kex.v1.Kex/Upload", KEXD_PAYLOAD_STREAM, rpc_upload},
      {"/kex.v1.Kex/Download", KEXD_PAYLOAD_ONE, rpc_download},
      {"/kex.v1.Kex/Free", KEXD_PAYLOAD_ONE, rpc_free},
      {"/kex.v1.Kex/Tune", KEXD_PAYLOAD_ONE, kexd_rpc_tune},
      {"/kex.v1.Kex/ListCache", KEXD_PAYLOAD_ONE, kexd_rpc_list_cache},
      {"/kex.v1.Kex/GetCacheEntry", KEXD_PAYLOAD_ONE, kexd_rpc_get_cache_entry},
      {"/kex.v1.Kex/ExportCache", KEXD_PAYLOAD_ONE, kexd_rpc_export_cache},
      {"/kex.v1.Kex/ImportCache", KEXD_PAYLOAD_STREAM, kexd_rpc_import_cache},
      {"/kex.v1.Kex/DeleteCache", KEXD_PAYLOAD_ONE, kexd_rpc_delete_cache},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    int rc = kexd_server_add_method(d->server, table[i].path, table[i].payload, table[i].fn, d);
    if (rc < 0) {
      KEX_ERROR("cannot register %s: %s", table[i].path, kex_strerror(rc));
      return rc;
    }
  }
  if (d->cfg.test_busy_work) {
    int rc = kexd_server_add_method(d->server, "/kex.v1.Kex/_BusyWork", KEXD_PAYLOAD_ONE, rpc_busy_work, d);
    if (rc < 0) return rc;
    KEX_WARN("--test-busy-work: serving /kex.v1.Kex/_BusyWork (a test facility; never use it in production)");
  }
  return 0;
}

/*
 * rpc.c - the method table: every kex.v1.Kex and grpc.health.v1.Health
 * path, the request type it takes, whether it names a job, who may call it
 * (the gate: kexd_rpc_check_caller with its role rule), and the handler
 * that serves it.  For a unary method the table does what every handler
 * would otherwise open with: it decodes the request (request.c: size,
 * protobuf-c, strings checked on the wire), looks up the job its `job`
 * field names (a method with JOB_OPTIONAL takes "" as none), and frees the
 * request once the handler returns; the handler gets a kexd_req.  The two
 * client streams (Upload, ImportCache) read their own messages.
 *
 * The handlers live one concept per file: info.c (health, devices,
 * stats), job_rpc.c (jobs), pbgraph.c (Graph conversion), plan.c,
 * buffers.c (Upload, Download, Free), submit.c, tune.c (Tune),
 * cache_rpc.c (the cache methods); the streaming ones write through
 * stream.c.  Each handler runs on the loop thread; nothing a client sends
 * can make the daemon exit: every failure becomes a status.
 */
#include <grpc/status.h>
#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/trace.h"
#include "daemon/rpc.h"
#include "grpc/health/v1/health.pb-c.h"

typedef enum job_rule {
  JOB_NONE,     /* the request names no job */
  JOB_OPTIONAL, /* `job` may be "" (no job); a token must name one of the caller's */
  JOB_REQUIRED, /* `job` must name one of the caller's jobs */
} job_rule;

typedef struct method {
  const char *path;
  const ProtobufCMessageDescriptor *req; /* unary: the request type; NULL for a client stream */
  job_rule job;
  kexd_role_rule role;  /* who may call it (kexd_rpc_check_caller) */
  kexd_method_fn fn;    /* unary */
  kexd_handler stream;  /* client stream: reads its own messages */
  bool test_only;       /* registered with --test-busy-work only */
} method;

#define UNARY(name, type, rule, role, fn) \
  {"/kex.v1.Kex/" name, &kex__v1__##type##__descriptor, rule, KEXD_CALLER_##role, fn, NULL, false}
#define HEALTH(name, fn) \
  {"/grpc.health.v1.Health/" name, &grpc__health__v1__health_check_request__descriptor, JOB_NONE, KEXD_CALLER_ANYONE, \
   fn, NULL, false}

static const method methods[] = {
    HEALTH("Check", kexd_rpc_health_check),
    HEALTH("Watch", kexd_rpc_health_watch),
    UNARY("OpenJob", open_job_request, JOB_NONE, TENANT, kexd_rpc_open_job),
    UNARY("CloseJob", close_job_request, JOB_REQUIRED, TENANT, kexd_rpc_close_job),
    UNARY("HoldJob", hold_job_request, JOB_REQUIRED, TENANT, kexd_rpc_hold_job),
    UNARY("Plan", plan_request, JOB_REQUIRED, TENANT, kexd_rpc_plan),
    UNARY("ListDevices", list_devices_request, JOB_OPTIONAL, TENANT, kexd_rpc_list_devices),
    UNARY("GetStats", get_stats_request, JOB_OPTIONAL, TENANT, kexd_rpc_get_stats),
    UNARY("Submit", submit_request, JOB_REQUIRED, TENANT, kexd_rpc_submit),
    {"/kex.v1.Kex/Upload", NULL, JOB_REQUIRED, KEXD_CALLER_TENANT, NULL, kexd_rpc_upload, false},
    UNARY("Download", download_request, JOB_REQUIRED, TENANT, kexd_rpc_download),
    UNARY("Free", free_request, JOB_REQUIRED, TENANT, kexd_rpc_free),
    UNARY("Tune", tune_request, JOB_REQUIRED, TUNER, kexd_rpc_tune),
    UNARY("ListCache", list_cache_request, JOB_REQUIRED, TENANT, kexd_rpc_list_cache),
    UNARY("GetCacheEntry", get_cache_entry_request, JOB_REQUIRED, TENANT, kexd_rpc_get_cache_entry),
    UNARY("ExportCache", export_cache_request, JOB_REQUIRED, ADMIN, kexd_rpc_export_cache),
    {"/kex.v1.Kex/ImportCache", NULL, JOB_REQUIRED, KEXD_CALLER_ADMIN, NULL, kexd_rpc_import_cache, false},
    UNARY("DeleteCache", delete_cache_request, JOB_REQUIRED, ADMIN, kexd_rpc_delete_cache),
    {"/kex.v1.Kex/_BusyWork", &kex__v1__busy_work_request__descriptor, JOB_REQUIRED, KEXD_CALLER_TENANT,
     kexd_rpc_busy_work, NULL, true},
};

#define NMETHODS (sizeof methods / sizeof methods[0])

/* What the server hands each unary call: the daemon and the method (kexd.rpc_routes). */
typedef struct route {
  kexd *d;
  const method *m;
} route;

/* The token in the request's `job` field ("" when the message has none set). */
static const char *job_field(const method *m, const ProtobufCMessage *msg) {
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(m->req, "job");
  const char *token = f && f->type == PROTOBUF_C_TYPE_STRING ? *(char *const *)((const char *)msg + f->offset) : NULL;
  return token ? token : "";
}

static void serve(kexd *d, const method *m, kexd_call *c, const uint8_t *bytes, size_t len) {
  kexd_req r = {NULL, NULL, kex_trace_now_us()};
  const char *token;
  if (!(r.msg = kexd_rpc_decode(d, c, m->req, bytes, len))) return;
  token = m->job == JOB_NONE ? "" : job_field(m, r.msg);
  if ((m->job == JOB_REQUIRED || *token) && !(r.job = kexd_rpc_need_job(d, c, token))) goto out;
  m->fn(d, c, &r);
out:
  kexd_rpc_free_msg(r.msg);
}

static void serve_route(kexd_call *c, const uint8_t *bytes, size_t len, void *ud) {
  route *rt = ud;
  serve(rt->d, rt->m, c, bytes, len);
}

/* The method table's row of path, or NULL. */
static const method *method_of(const char *path) {
  for (size_t i = 0; i < NMETHODS; i++)
    if (strcmp(methods[i].path, path) == 0) return &methods[i];
  return NULL;
}

bool kexd_rpc_gate(kexd_call *c, void *ud) {
  const method *m = method_of(kexd_call_method(c));
  return kexd_rpc_check_caller(ud, c, m ? m->role : KEXD_CALLER_TENANT);
}

void kexd_rpc_serve(kexd *d, const char *path, kexd_call *c, const uint8_t *bytes, size_t len) {
  for (size_t i = 0; i < NMETHODS; i++) {
    if (strcmp(methods[i].path, path) != 0) continue;
    if (methods[i].fn) serve(d, &methods[i], c, bytes, len);
    else methods[i].stream(c, bytes, len, d);
    return;
  }
  kexd_call_failf(c, GRPC_STATUS_UNIMPLEMENTED, "%s: no such method", path);
}

int kexd_rpc_register(kexd *d) {
  route *routes = kex_calloc(NMETHODS, sizeof *routes);
  if (!routes) return KEX_ENOMEM;
  kex_free(d->rpc_routes);
  d->rpc_routes = routes;
  for (size_t i = 0; i < NMETHODS; i++) {
    const method *m = &methods[i];
    int rc;
    if (m->test_only && !d->cfg.test_busy_work) continue;
    routes[i] = (route){d, m};
    rc = m->fn ? kexd_server_add_method(d->server, m->path, KEXD_PAYLOAD_ONE, serve_route, &routes[i])
               : kexd_server_add_method(d->server, m->path, KEXD_PAYLOAD_STREAM, m->stream, d);
    if (rc < 0) {
      KEX_ERROR("cannot register %s: %s", m->path, kex_strerror(rc));
      return rc;
    }
    if (m->test_only) KEX_WARN("--test-busy-work: serving %s (a test facility; never use it in production)", m->path);
  }
  return 0;
}

/*
 * rpc.c - the method table: every kex.v1.Kex and grpc.health.v1.Health
 * path, the request type it takes, whether it names a job, who may call it
 * (the gate: kexd_rpc_check_caller with its role rule), and the handler
 * that serves it.  For a unary method the table does what every handler
 * would otherwise open with: it decodes the request (request.c: size,
 * protobuf-c, strings checked on the wire), looks up the job its `job`
 * field names (a method with JOB_OPTIONAL takes "" as none), checks a
 * call that can start a beam search (Submit, Tune: the search column,
 * kexd_rpc_search_begin: may_tune, the width limits, the device's search
 * slots), and frees the request once the handler returns; the handler gets
 * a kexd_req.  A search whose device has no free slot waits in line
 * (searches.c): the table keeps its decoded request in the call and runs
 * the handler when the slot comes (resume_search), the job looked up
 * again then.  The two client streams (Upload, ImportCache) read their own
 * messages.
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
#include "daemon/kept.h"
#include "daemon/rpc.h"
#include "grpc/health/v1/health.pb-c.h"

typedef enum job_rule {
  JOB_NONE,     /* the request names no job */
  JOB_OPTIONAL, /* `job` may be "" (no job); a token must name one of the caller's */
  JOB_REQUIRED, /* `job` must name one of the caller's jobs */
} job_rule;

/* Whether a call of the method can start a beam search: the permission and the limits of one
   (kexd_rpc_search_begin: may_tune, --max-beam and max_beam, a search slot), checked here for
   every method that can, after the decode and before its handler, never by a handler. */
typedef enum search_rule {
  SEARCH_NONE,
  SEARCH_IF_BEAM, /* Submit: when its beam.beam_width > 0 (a width from --beam alone is the operator's) */
  SEARCH_ALWAYS,  /* Tune: beam.beam_width, else --beam, else TUNE_DEFAULT_WIDTH (2) */
} search_rule;

#define TUNE_DEFAULT_WIDTH 2 /* Tune with beam_width 0 and no --beam */

typedef struct method {
  const char *path;
  const ProtobufCMessageDescriptor *req; /* unary: the request type; NULL for a client stream */
  job_rule job;
  kexd_role_rule role;  /* who may call it (kexd_rpc_check_caller) */
  search_rule search;   /* unary: whether it can start a search (search_gate) */
  kexd_method_fn fn;    /* unary */
  kexd_handler stream;  /* client stream: reads its own messages */
  bool test_only;       /* registered with --test-busy-work only */
} method;

#define UNARY_SEARCH(name, type, rule, role, search, fn) \
  {"/kex.v1.Kex/" name, &kex__v1__##type##__descriptor, rule, KEXD_CALLER_##role, SEARCH_##search, fn, NULL, false}
#define UNARY(name, type, rule, role, fn) UNARY_SEARCH(name, type, rule, role, NONE, fn)
#define HEALTH(name, fn) \
  {"/grpc.health.v1.Health/" name, &grpc__health__v1__health_check_request__descriptor, JOB_NONE, KEXD_CALLER_ANYONE, \
   SEARCH_NONE, fn, NULL, false}

static const method methods[] = {
    HEALTH("Check", kexd_rpc_health_check),
    HEALTH("Watch", kexd_rpc_health_watch),
    UNARY("OpenJob", open_job_request, JOB_NONE, TENANT, kexd_rpc_open_job),
    UNARY("CloseJob", close_job_request, JOB_REQUIRED, TENANT, kexd_rpc_close_job),
    UNARY("HoldJob", hold_job_request, JOB_REQUIRED, TENANT, kexd_rpc_hold_job),
    UNARY("Plan", plan_request, JOB_REQUIRED, TENANT, kexd_rpc_plan),
    UNARY("ListDevices", list_devices_request, JOB_OPTIONAL, TENANT, kexd_rpc_list_devices),
    UNARY("GetStats", get_stats_request, JOB_OPTIONAL, TENANT, kexd_rpc_get_stats),
    UNARY_SEARCH("Submit", submit_request, JOB_REQUIRED, TENANT, IF_BEAM, kexd_rpc_submit),
    {"/kex.v1.Kex/Upload", NULL, JOB_REQUIRED, KEXD_CALLER_TENANT, SEARCH_NONE, NULL, kexd_rpc_upload, false},
    UNARY("Download", download_request, JOB_REQUIRED, TENANT, kexd_rpc_download),
    UNARY("Free", free_request, JOB_REQUIRED, TENANT, kexd_rpc_free),
    UNARY_SEARCH("Tune", tune_request, JOB_REQUIRED, TUNER, ALWAYS, kexd_rpc_tune), /* TUNER: refused before the decode */
    UNARY("ListCache", list_cache_request, JOB_REQUIRED, TENANT, kexd_rpc_list_cache),
    UNARY("GetCacheEntry", get_cache_entry_request, JOB_REQUIRED, TENANT, kexd_rpc_get_cache_entry),
    UNARY("ExportCache", export_cache_request, JOB_REQUIRED, ADMIN, kexd_rpc_export_cache),
    {"/kex.v1.Kex/ImportCache", NULL, JOB_REQUIRED, KEXD_CALLER_ADMIN, SEARCH_NONE, NULL, kexd_rpc_import_cache, false},
    UNARY("DeleteCache", delete_cache_request, JOB_REQUIRED, ADMIN, kexd_rpc_delete_cache),
    {"/kex.v1.Kex/_BusyWork", &kex__v1__busy_work_request__descriptor, JOB_REQUIRED, KEXD_CALLER_TENANT, SEARCH_NONE,
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

static void resume_search(kexd *d, kexd_call *c);

/*
 * The search column: a Submit's or Tune's BeamOptions and the device its graph names (a Submit's
 * graph_ref: the kept graph's) to kexd_rpc_search_begin, which refuses a search the caller may not
 * start; rq->beam_width is the width the handler uses.  0: go on; KEXD_SEARCH_WAITING: the call waits
 * for a slot (resume_search goes on); -1: refused (the call finished).
 */
static int search_gate(kexd *d, const method *m, kexd_call *c, kexd_req *rq) {
  const Kex__V1__BeamOptions *beam;
  const Kex__V1__Graph *graph;
  const char *device = NULL;
  if (m->req == &kex__v1__submit_request__descriptor) {
    const Kex__V1__SubmitRequest *s = rq->msg;
    beam = s->beam, graph = s->graph;
    if (!graph && s->graph_ref && *s->graph_ref) device = kexd_kept_device(rq->job, s->graph_ref);
  } else {
    const Kex__V1__TuneRequest *t = rq->msg;
    beam = t->beam, graph = t->graph;
  }
  if (graph) device = graph->device ? graph->device : "";
  return kexd_rpc_search_begin(d, c, rq->job, beam, m->search == SEARCH_ALWAYS ? TUNE_DEFAULT_WIDTH : 0, device,
                               &rq->beam_width, resume_search);
}

static void serve(kexd *d, const method *m, kexd_call *c, const uint8_t *bytes, size_t len) {
  kexd_req r = {NULL, NULL, kex_trace_now_us(), 0};
  const char *token;
  int rc;
  if (!(r.msg = kexd_rpc_decode(d, c, m->req, bytes, len))) return;
  token = m->job == JOB_NONE ? "" : job_field(m, r.msg);
  if ((m->job == JOB_REQUIRED || *token) && !(r.job = kexd_rpc_need_job(d, c, token))) goto out;
  if (m->search != SEARCH_NONE && (rc = search_gate(d, m, c, &r)) != 0) {
    if (rc == KEXD_SEARCH_WAITING) { /* the call keeps the request until its slot comes (or it ends first) */
      kexd_search_place *pl = &((kexd_call_info *)kexd_call_ext(c))->search;
      pl->msg = r.msg, pl->method = m, pl->arrived_us = r.arrived_us, pl->width = r.beam_width;
      return;
    }
    goto out;
  }
  m->fn(d, c, &r);
out:
  kexd_rpc_free_msg(r.msg);
}

/*
 * A search that waited got its slot (searches.c, on a later turn of the loop): its method's handler runs
 * now with the request the call kept, unless the deadline passed (DEADLINE_EXCEEDED) or the job was closed
 * meanwhile (NOT_FOUND; jobs.c's removed hook ends such a call at once already).  The job's lease is renewed,
 * as at arrival.
 */
static void resume_search(kexd *d, kexd_call *c) {
  kexd_call_info *ci = kexd_call_ext(c);
  const method *m = ci->search.method;
  kexd_req r = {ci->search.msg, NULL, ci->search.arrived_us, ci->search.width};
  const char *name = kexd_call_name(c);
  ci->search.msg = NULL;
  if (kexd_call_time_left(c) <= 0) {
    kexd_call_failf(c, GRPC_STATUS_DEADLINE_EXCEEDED, "%s: the deadline passed while the search waited for a slot",
                    name);
  } else if (!(r.job = kexd_jobs_find_id(&d->jobs, ci->job))) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "%s: the job was closed while its search waited for a slot", name);
  } else {
    uv_update_time(d->loop);
    r.job->last_used_ms = uv_now(d->loop);
    m->fn(d, c, &r);
  }
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

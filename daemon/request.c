/*
 * request.c - the plumbing every method handler shares: unpacking a request
 * with protobuf-c through kex_malloc (size checked again, strings checked on
 * the wire by wire.c), the job check, the device index, failing a call with
 * a kex error; and the per-call gate and end (--auth tokens and roles,
 * the tenant check on jobs, the Submit slots and the search permission
 * with its slot (searches.c), one access-log line per call).  Loop thread
 * only (the decode's out-of-memory flag is per-thread).
 */
#include <grpc/status.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "search/beam.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"
#include "proto/pballoc.h"

double kexd_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

void kexd_rpc_fail(kexd_call *c, int rc, const kex_error *err) {
  kexd_call_finish(c, kex_err_grpc_status(rc), err && err->msg[0] ? err->msg : kex_strerror(rc), NULL);
}

ProtobufCMessage *kexd_rpc_decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                  size_t len) {
  ProtobufCMessage *m;
  char why[KEX_ERROR_MSG_MAX];
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
  kex_pb_alloc_reset();
  if (!(m = protobuf_c_message_unpack(desc, &kex_pb_allocator, len, req))) {
    if (kex_pb_alloc_failed())
      kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory decoding a %zu-byte request",
                      kexd_call_method(c), len);
    else
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: the request is not a valid %s message (%zu bytes)",
                      kexd_call_method(c), desc->name, len);
    return NULL;
  }
  if (kexd_wire_check_strings(desc, req, len, why, sizeof why) < 0) { /* strings are compared whole: no NUL, UTF-8 */
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", kexd_call_method(c), why);
    protobuf_c_message_free_unpacked(m, &kex_pb_allocator);
    return NULL;
  }
  return m;
}

void kexd_rpc_free_msg(ProtobufCMessage *m) {
  if (m) protobuf_c_message_free_unpacked(m, &kex_pb_allocator);
}

kexd_job *kexd_rpc_need_job(kexd *d, kexd_call *c, const char *token) {
  kexd_call_info *ci = kexd_call_ext(c);
  kexd_job *job;
  const char *owner;
  if (!token || !*token) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: missing job token (field `job`; OpenJob returns one)",
                    kexd_call_method(c));
    return NULL;
  }
  job = kexd_jobs_find(&d->jobs, token);
  if (job && ci->tenant && strcmp(job->use->name, ci->tenant->name) != 0) job = NULL; /* another tenant's */
  if (!job && (owner = kexd_jobs_token_owner(&d->jobs, token))) {
    kexd_call_failf(c, GRPC_STATUS_FAILED_PRECONDITION,
                    "%s: the job belongs to node %.*s at %.*s (its token says so); this is node %s at %s: send the "
                    "job's calls to its node", kexd_call_method(c), (int)strcspn(owner, "@"), owner,
                    KEXD_ADVERTISE_MAX, owner + strcspn(owner, "@") + 1, d->jobs.node, d->jobs.advertise);
    return NULL;
  }
  if (!job) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "%s: unknown job token (never opened, closed, or expired after its lease)",
                    kexd_call_method(c));
    return NULL;
  }
  ci->job = job->id;
  memcpy(ci->job_log, job->log_id, sizeof ci->job_log);
  return job;
}

/* ---- the gate and the end of each call ---- */

static const char *const status_names[KEXD_STATUS_CODES] = {
    "OK",      "CANCELLED",           "UNKNOWN", "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};

/* "/kex.v1.Kex/OpenJob" -> "OpenJob" for messages (kexd_call_name of a call). */
static const char *short_method(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* The one refusal of a search to a tenant whose may_tune is false (Tune at the gate, a beam Submit in
   kexd_rpc_search_begin).  False, the call finished. */
static bool refuse_search(kexd *d, kexd_call *c, const kexd_tenant *t) {
  d->permission_denied++;
  kexd_call_failf(c, GRPC_STATUS_PERMISSION_DENIED,
                  "%s: tenant '%s' may not run beam searches (Tune, or Submit with beam.beam_width): may_tune is "
                  "false in --auth", kexd_call_name(c), t->name);
  return false;
}

bool kexd_rpc_check_caller(kexd *d, kexd_call *c, kexd_role_rule rule) {
  kexd_call_info *ci = kexd_call_ext(c);
  const char *path = kexd_call_method(c), *why = NULL;
  char val[KEXD_AUTH_TOKEN_MAX], peer[KEXD_PEER_MAX];
  const kexd_tenant *t = NULL;
  int rc;
  if (!d->auth || rule == KEXD_CALLER_ANYONE) return true; /* load balancers need no token */
  rc = kexd_call_metadata(c, "authorization", val, sizeof val);
  if (rc == KEX_ENOTFOUND) why = "no authorization metadata";
  else if (rc < 0) why = "an authorization metadata value too long";
  else if (strncasecmp(val, "Bearer ", 7) != 0) why = "authorization is not \"Bearer TOKEN\"";
  else if (!(t = kexd_auth_check(d->auth, val + 7, strlen(val + 7)))) why = "an unknown token";
  memset(val, 0, sizeof val);
  if (!t) {
    d->unauthenticated++;
    kexd_call_peer_host(c, peer, sizeof peer);
    KEX_WARN("unauthenticated call to %s from %s: %s", short_method(path), peer, why);
    kexd_call_failf(c, GRPC_STATUS_UNAUTHENTICATED, "%s: %s (send authorization: Bearer TOKEN with a token of kexd's "
                    "--auth file)", short_method(path), why);
    return false;
  }
  kexd_auth_ref(t->table);
  ci->tenant = t;
  if (t->role != KEXD_ROLE_ADMIN && rule == KEXD_CALLER_ADMIN) {
    d->permission_denied++;
    kexd_call_failf(c, GRPC_STATUS_PERMISSION_DENIED, "%s: tenant '%s' is a user; it is for admins", short_method(path),
                    t->name);
    return false;
  }
  if (!t->may_tune && rule == KEXD_CALLER_TUNER) return refuse_search(d, c, t);
  return true;
}

const kexd_tenant *kexd_rpc_tenant(kexd_call *c) { return ((kexd_call_info *)kexd_call_ext(c))->tenant; }

const char *kexd_rpc_tenant_name(kexd_call *c) {
  const kexd_tenant *t = kexd_rpc_tenant(c);
  return t ? t->name : KEXD_ANONYMOUS_TENANT;
}

void kexd_rpc_call_end(kexd_call *c, int status, void *ud) {
  kexd *d = ud;
  kexd_call_info *ci = kexd_call_ext(c);
  char peer[KEXD_PEER_MAX];
  if (ci->submit_job) {
    kexd_job *job = kexd_jobs_find_id(&d->jobs, ci->submit_job);
    if (job && job->submits) job->submits--;
    ci->submit_job = 0;
  }
  kexd_search_slot_end(d, c); /* its search slot given back, or its place in line left */
  if (kex_log_get_level() <= KEX_LOG_INFO) {
    kexd_call_peer_host(c, peer, sizeof peer);
    char ms[32];
    snprintf(ms, sizeof ms, "%.3f", kexd_call_age_ms(c));
    const char *kv[] = {"method", kexd_call_name(c), "tenant", ci->tenant ? ci->tenant->name : "-",
                        "peer", peer, "status", status >= 0 && status < KEXD_STATUS_CODES ? status_names[status] : "UNKNOWN",
                        "ms", ms, NULL};
    kex_log_kv(KEX_LOG_INFO, ci->job ? ci->job_log : NULL, "access", kv);
  }
  if (ci->tenant) kexd_auth_unref(ci->tenant->table);
  ci->tenant = NULL;
}

int kexd_rpc_beam_options(kexd *d, kexd_call *c, const Kex__V1__BeamOptions *b, uint32_t fallback, uint32_t *width) {
  const char *m = kexd_call_name(c);
  uint32_t w = b && b->beam_width ? b->beam_width : d->cfg.beam ? d->cfg.beam : fallback;
  if (w > KEX_BEAM_MAX_WIDTH || (w && b && (b->max_upcast > KEXD_BEAM_MAX_LIMIT || b->max_local > KEXD_BEAM_MAX_LIMIT))) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: beam.beam_width must be at most %d and max_upcast, "
                    "max_local at most %d", m, KEX_BEAM_MAX_WIDTH, KEXD_BEAM_MAX_LIMIT);
    return -1;
  }
  *width = w;
  return 0;
}

/* The beam width limits (--max-beam, the tenant's max_beam) of a width kexd_rpc_beam_options checked.  0, or -1 with the call finished. */
static int check_beam(kexd *d, kexd_call *c, kexd_job *job, uint64_t width) {
  const kexd_tenant *t = kexd_rpc_tenant(c);
  const char *m = kexd_call_name(c);
  if (!width) return 0; /* hand-coded opts */
  if (width > d->cfg.max_beam) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: beam width %llu is more than the limit of %u (--max-beam)",
                    m, (unsigned long long)width, d->cfg.max_beam);
    return -1;
  }
  if (t && t->max_beam && width > t->max_beam) {
    job->use->refused++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "%s: beam width %llu is more than tenant '%s''s limit max_beam %u (--auth)", m,
                    (unsigned long long)width, t->name, t->max_beam);
    return -1;
  }
  return 0;
}

int kexd_rpc_submit_begin(kexd *d, kexd_call *c, kexd_job *job, uint32_t width) {
  kexd_call_info *ci = kexd_call_ext(c);
  if (check_beam(d, c, job, width) < 0) return -1;
  if (job->submits >= d->cfg.max_submits_per_job) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "Submit: job '%s' has %u submissions in flight, the limit (--max-submits-per-job)", job->name,
                    job->submits);
    return -1;
  }
  job->submits++;
  job->use->submissions++;
  ci->submit_job = job->id;
  return 0;
}

int kexd_rpc_search_begin(kexd *d, kexd_call *c, kexd_job *job, const Kex__V1__BeamOptions *b, uint32_t fallback,
                          const char *device, uint32_t *width, kexd_search_resume resume) {
  const kexd_tenant *t = kexd_rpc_tenant(c);
  int dev;
  if (kexd_rpc_beam_options(d, c, b, fallback, width) < 0) return -1;
  /* Submit (fallback 0) without a beam_width of its own searches only if the operator's --beam says so: the
     operator's choice for every Submit, not the tenant's request, so neither may_tune nor a search slot. */
  if (!*width || (!fallback && !(b && b->beam_width))) return 0;
  if (t && !t->may_tune) {
    refuse_search(d, c, t);
    return -1;
  }
  if (check_beam(d, c, job, *width) < 0) return -1;
  if (!device || (dev = kexd_rpc_device_index(d, device)) < 0 || dev >= KEXD_MAX_DEVICES) return 0;
  return kexd_search_slot(d, c, job, (uint32_t)dev, resume); /* now, or a place in the device's line */
}

int kexd_rpc_device_index(const kexd *d, const char *name) {
  if (!name || !*name || strcmp(name, "default") == 0) return 0;
  for (uint32_t i = 0; i < d->cfg.ndevices; i++)
    if (strcmp(d->cfg.devices[i], name) == 0) return (int)i;
  return -1;
}

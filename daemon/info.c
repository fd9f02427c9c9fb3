/*
 * info.c - what kexd says about itself: grpc.health.v1 (Check, Watch),
 * ListDevices (the devices it serves, discovered once) and GetStats (the
 * daemon's counters, connections and every job's or one job's usage).
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/accept_guard.h"
#include "daemon/fleet.h"
#include "daemon/rpc.h"
#include "realize/engine.h"
#include "daemon/stream.h"
#include "grpc/health/v1/health.pb-c.h"
#ifdef KEXD_HAVE_DEVICES
#include "devices/device.h"
#endif

#define RPC_SERVICE "kex.v1.Kex"
#define RPC_HEALTH_SERVICE "grpc.health.v1.Health"

/* ---- grpc.health.v1.Health ---- */

static bool health_known(const char *service) {
  return !*service || strcmp(service, RPC_SERVICE) == 0 || strcmp(service, RPC_HEALTH_SERVICE) == 0;
}

void kexd_rpc_health_check(kexd *d, kexd_call *c, kexd_req *rq) {
  Grpc__Health__V1__HealthCheckRequest *m = rq->msg;
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  if (!health_known(m->service)) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "unknown service \"%s\"", m->service);
  } else {
    r.status = kexd_server_stopping(d->server) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                                                : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  }
}

/*
 * Watch: SERVING now, then nothing until the server stops (NOT_SERVING, then
 * OK) or the client goes away; written through the one server-stream
 * writer (stream.h), which frees the watch once the call is over.
 */
typedef struct health_watch {
  kexd_stream st;
  bool sent, stopping;
} health_watch;

static void watch_drained(void *owner) {
  health_watch *w = owner;
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  int rc;
  if (w->stopping) {
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    kexd_stream_finish(&w->st, GRPC_STATUS_OK, NULL, &r.base);
  } else if (!w->sent) {
    w->sent = true;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if ((rc = kexd_stream_write(&w->st, &r.base)) < 0 && !kexd_stream_dead(&w->st))
      kexd_stream_failf(&w->st, GRPC_STATUS_INTERNAL, "cannot send the health status: %s", kex_strerror(rc));
  } /* else: nothing to say until kexd stops */
}

static void watch_stopping(void *owner) {
  health_watch *w = owner;
  w->stopping = true;
  kexd_stream_pump(&w->st);
}

static void watch_release(void *owner) { kex_free(owner); }

static const kexd_stream_ops watch_ops = {"Watch", NULL, watch_drained, NULL, watch_release, watch_stopping};

void kexd_rpc_health_watch(kexd *d, kexd_call *c, kexd_req *rq) {
  Grpc__Health__V1__HealthCheckRequest *m = rq->msg;
  health_watch *w;
  if (!health_known(m->service)) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "unknown service \"%s\"", m->service);
    return;
  }
  if (!(w = kex_calloc(1, sizeof *w))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->stopping = kexd_server_stopping(d->server); /* then NOT_SERVING at once */
  kexd_stream_start(&w->st, d->streams, c, &watch_ops, w);
  kexd_stream_pump(&w->st);
}

/* ---- devices and stats ---- */

#define RPC_MAX_LISTED (2 * KEXD_MAX_DEVICES) /* devices in one ListDevices reply */


void kexd_rpc_list_devices(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__ListDevicesReply r = KEX__V1__LIST_DEVICES_REPLY__INIT;
  Kex__V1__Device devs[RPC_MAX_LISTED], *ptrs[RPC_MAX_LISTED];
  size_t n = 0;
  (void)rq; /* the table checked the job a request may name; the list is the same for every caller */
  /* the names kexd was configured with, the first the default ... */
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    kex__v1__device__init(&devs[n]);
    devs[n].name = d->cfg.devices[i];
    devs[n].kind = d->targets[i].rules;
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
    const kex_device_desc *dd = kex_device_desc_match(descs, d->ndevice_descs, devs[i].name);
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
}

void kexd_rpc_get_stats(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__StatsReply r = KEX__V1__STATS_REPLY__INIT;
  Kex__V1__FleetStats fleet = KEX__V1__FLEET_STATS__INIT;
  const kexd_server_stats *ss = kexd_server_get_stats(d->server);
  kexd_job *job = rq->job;
  Kex__V1__JobStats *js = NULL, **jsp = NULL;
  Kex__V1__TenantStats *ts = NULL, **tsp = NULL;
  const kexd_tenant *t = kexd_rpc_tenant(c);
  const char *only = t && t->role != KEXD_ROLE_ADMIN ? t->name : NULL; /* a user sees its own tenant */
  uint32_t njs = 0;
  r.tenant = (char *)kexd_rpc_tenant_name(c);
  if (!(ts = kex_calloc(d->jobs.nuses + 1, sizeof *ts)) || !(tsp = kex_calloc(d->jobs.nuses + 1, sizeof *tsp)) ||
      !(js = kex_calloc(d->jobs.njobs + 1, sizeof *js)) || !(jsp = kex_calloc(d->jobs.njobs + 1, sizeof *jsp))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "GetStats: out of memory");
    goto out;
  }
  for (uint32_t i = 0; i < d->jobs.nuses; i++) {
    const kexd_tenant_use *u = d->jobs.uses[i];
    Kex__V1__TenantStats *x = &ts[r.n_tenant_stats];
    if (only && strcmp(u->name, only) != 0) continue;
    kex__v1__tenant_stats__init(x);
    x->name = (char *)u->name;
    x->jobs_open = u->jobs;
    x->bytes_held = u->bytes_held;
    x->bytes_reserved = u->bytes_reserved;
    x->jobs_opened = u->jobs_opened;
    x->submissions = u->submissions;
    x->refused = u->refused;
    tsp[r.n_tenant_stats++] = x;
  }
  r.tenant_stats = tsp;
  /* one job when a token was given, else every open job the caller may see */
  for (uint32_t i = 0; i < (job ? 1 : d->jobs.njobs); i++) {
    const kexd_job *jb = job ? job : d->jobs.jobs[i];
    kexd_flow_stats fs;
    if (only && strcmp(jb->use->name, only) != 0) continue;
    kexd_dispatch_job_stats(d->disp, jb->id, &fs);
    kex__v1__job_stats__init(&js[njs]);
    js[njs].name = jb->name;
    js[njs].tenant = jb->use->name;
    js[njs].weight = jb->weight;
    js[njs].memory_limit = jb->memory_limit;
    js[njs].bytes_held = jb->bytes_held;
    js[njs].bytes_reserved = jb->bytes_reserved;
    js[njs].buffers = jb->nbufs;
    js[njs].queued = fs.queued;
    js[njs].running = fs.running;
    js[njs].items_done = fs.items_done;
    js[njs].device_time_s = fs.device_s;
    jsp[njs] = &js[njs];
    njs++;
  }
  r.n_job_stats = njs;
  r.job_stats = njs ? jsp : NULL;
  if (only) { /* no server-wide counters: only its own tenant's */
    r.jobs_open = r.n_tenant_stats ? tsp[0]->jobs_open : 0;
    r.bytes_held = r.n_tenant_stats ? tsp[0]->bytes_held : 0;
    r.jobs_opened = r.n_tenant_stats ? tsp[0]->jobs_opened : 0;
    r.submissions = r.n_tenant_stats ? tsp[0]->submissions : 0;
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
    goto out;
  }
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
  for (uint32_t i = 0; i < KEXD_MAX_DEVICES; i++) {
    if (!d->engines[i]) continue;
    kex_engine_stats es = kex_engine_get_stats(d->engines[i]);
    r.program_cache_sqlite_hits += es.sqlite_hits;
    r.program_cache_misses += es.compiled;
  }
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
  kexd_fleet_counters fc;
  kexd_fleet_stats(d, &fc);
  fleet.state = (char *)fc.state;
  fleet.hits = fc.hits;
  fleet.published = fc.published;
  fleet.lease_waits = fc.lease_waits;
  fleet.takeovers = fc.takeovers;
  fleet.rejected = fc.rejected;
  fleet.errors = fc.errors;
  fleet.outages = fc.outages;
  r.fleet = &fleet;
  r.jobs_evicted = d->jobs.evicted;
  for (uint32_t i = 0; i < d->jobs.njobs; i++) r.bytes_held += d->jobs.jobs[i]->bytes_held;
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
out:
  kex_free(jsp);
  kex_free(js);
  kex_free(tsp);
  kex_free(ts);
}

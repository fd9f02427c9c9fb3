/*
 * job_rpc.c - OpenJob (with the tenant's max_jobs, else --tenant-max-jobs, and max_weight), CloseJob
 * and HoldJob (the job table is jobs.c), and the
 * test-only _BusyWork (kexd --test-busy-work), which queues busy-CPU items
 * on a device runner charged to a job, to measure fair queueing.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/rpc.h"
#include "daemon/stream.h"

/* ---- jobs ---- */

/* u takes its limits from tenant t's entry (NULL: none, or no --auth: unlimited). */
static void tenant_limits(kexd *d, kexd_tenant_use *u, const kexd_tenant *t) {
  double budget = !t ? 0 : t->max_compile_seconds ? t->max_compile_seconds : d->cfg.tenant_compile_budget_s;
  u->max_bytes = t ? t->max_bytes : 0;
  kexd_tenant_budget_set(u, budget, t && !t->max_compile_seconds, uv_now(d->loop));
}

void kexd_tenant_limits_refresh(kexd *d) {
  for (uint32_t i = 0; i < d->jobs.nuses; i++) {
    kexd_tenant_use *u = d->jobs.uses[i];
    const kexd_tenant *t = NULL;
    for (uint32_t k = 0; d->auth && k < d->auth->n && !t; k++)
      if (strcmp(d->auth->tenants[k].name, u->name) == 0) t = &d->auth->tenants[k];
    tenant_limits(d, u, t);
  }
}

void kexd_rpc_open_job(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__OpenJobRequest *m = rq->msg;
  Kex__V1__OpenJobReply r = KEX__V1__OPEN_JOB_REPLY__INIT;
  kexd_job *job;
  kex_error err = {0};
  char peer[KEXD_PEER_MAX], token[KEXD_WIRE_TOKEN_MAX + 1];
  uint64_t memory;
  const kexd_tenant *t = kexd_rpc_tenant(c);
  kexd_tenant_use *use;
  int rc;
  memory = m->memory_limit ? m->memory_limit : d->cfg.job_memory_default;
  kexd_call_peer_host(c, peer, sizeof peer);
  if (!(use = kexd_jobs_tenant_use(&d->jobs, kexd_rpc_tenant_name(c)))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "OpenJob: out of memory");
    return;
  }
  tenant_limits(d, use, t);
  if (memory > d->cfg.job_memory_max)
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "OpenJob: memory_limit %" PRIu64 " is more than the server's limit of %" PRIu64
                    " bytes (--job-memory-max)",
                    memory, d->cfg.job_memory_max);
  else if (m->weight > d->cfg.max_weight)
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "OpenJob: weight %u is more than the limit of %u (--max-weight)",
                    m->weight, d->cfg.max_weight);
  else if (t && t->max_weight && (m->weight ? m->weight : 1) > t->max_weight) {
    use->refused++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "OpenJob: weight %u is more than tenant '%s''s limit max_weight %u (--auth)", m->weight, t->name,
                    t->max_weight);
  } else if (t && use->jobs >= (t->max_jobs ? t->max_jobs : d->cfg.tenant_max_jobs)) {
    use->refused++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "OpenJob: tenant '%s' holds %u jobs open, its limit %s",
                    t->name, use->jobs, t->max_jobs ? "max_jobs (--auth)" : "--tenant-max-jobs (no max_jobs in --auth)");
  } else if ((rc = kexd_jobs_open(&d->jobs, m->name, m->weight, memory, peer, use, &job, &err)) < 0)
    kexd_call_failf(c, kex_err_grpc_status(rc), "OpenJob: %s", err.msg);
  else {
    kexd_call_info *ci = kexd_call_ext(c);
    ci->job = job->id;
    memcpy(ci->job_log, job->log_id, sizeof ci->job_log);
    kex_log(KEX_LOG_INFO, job->log_id, 0,
            "job \"%s\" opened by %s for tenant %s (weight %u, memory limit %" PRIu64 " bytes)", job->name, peer,
            use->name, job->weight, job->memory_limit);
    kexd_job_wire_token(&d->jobs, job, token);
    r.job = token;
    r.node = d->jobs.node;
    r.advertise = d->jobs.advertise;
    r.lease_seconds = (uint32_t)ceil(d->cfg.lease_s);
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
  }
}

void kexd_rpc_close_job(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__CloseJobRequest *m = rq->msg;
  Kex__V1__CloseJobReply r = KEX__V1__CLOSE_JOB_REPLY__INIT;
  kexd_jobs_close_job(&d->jobs, m->job);
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
}

/* ---- _BusyWork (kexd --test-busy-work only) ---- */

typedef struct busy_item {
  kexd_work work;
  double ms;
} busy_item;

/* Spin for arg's milliseconds on the runner thread; the device time is the wall time spun. */
static int busy_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  const busy_item *b = arg;
  double t0 = kexd_now_us(), t;
  (void)dev;
  (void)err;
  do t = kexd_now_us();
  while (t - t0 < b->ms * 1e3);
  *device_s = (t - t0) / 1e6;
  return 0;
}

static void busy_done(kexd_work *w) { kex_free(w->ud); }

void kexd_rpc_busy_work(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__BusyWorkRequest *m = rq->msg;
  Kex__V1__BusyWorkReply r = KEX__V1__BUSY_WORK_REPLY__INIT;
  kexd_job *job = rq->job;
  int dev, rc;
  if (m->items > KEXD_BUSY_MAX_ITEMS || !(m->ms >= 0 && m->ms <= KEXD_BUSY_MAX_MS)) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "_BusyWork: items must be <= %d and ms in [0, %g]",
                    KEXD_BUSY_MAX_ITEMS, KEXD_BUSY_MAX_MS);
    return;
  }
  if ((dev = kexd_rpc_device_index(d, m->device)) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "_BusyWork: device \"%.64s\" is not one of this kexd's devices",
                    m->device);
    return;
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
}

/* ---- HoldJob: a job that lives exactly as long as its client's call ---- */

typedef struct job_hold {
  kexd_stream st;        /* the one server-stream writer (stream.h); it frees the hold when the call is over */
  kexd *d;
  uint64_t job;
  bool sent, ending;
} job_hold;

/* Detach the hold from its job (if the job is still open and still held by h). */
static void hold_unbind(job_hold *h) {
  kexd_job *job = kexd_jobs_find_id(&h->d->jobs, h->job);
  if (job && job->on_close_ud == h) {
    job->held = false;
    job->on_close = NULL;
    job->on_close_ud = NULL;
  }
}

/* The event that says the job is held, then nothing until the hold ends (status OK). */
static void hold_drained(void *owner) {
  job_hold *h = owner;
  Kex__V1__HoldJobEvent ev = KEX__V1__HOLD_JOB_EVENT__INIT;
  int rc;
  if (h->ending) {
    kexd_stream_finish(&h->st, GRPC_STATUS_OK, "the hold ended", NULL);
  } else if (!h->sent) {
    h->sent = true;
    ev.held = true;
    if ((rc = kexd_stream_write(&h->st, &ev.base)) < 0 && !kexd_stream_dead(&h->st)) {
      hold_unbind(h);
      kexd_stream_failf(&h->st, GRPC_STATUS_INTERNAL, "HoldJob: cannot send the event: %s", kex_strerror(rc));
    }
  }
}

/* The client cancelled, its connection broke, or keepalive found it gone: close the job. */
static void hold_cancelled(void *owner) {
  job_hold *h = owner;
  hold_unbind(h);
  kexd_jobs_close_id(&h->d->jobs, h->job, "its HoldJob call ended (the client went away)");
}

/* The job was closed (CloseJob, shutdown): end the hold's call. */
static void hold_job_closed(void *owner) {
  job_hold *h = owner;
  h->ending = true;
  kexd_stream_pump(&h->st);
}

/* kexd is stopping: end the hold (every job closes with the daemon). */
static void hold_stopping(void *owner) {
  hold_unbind(owner);
  hold_job_closed(owner);
}

static void hold_release(void *owner) { kex_free(owner); }

static const kexd_stream_ops hold_ops = {"HoldJob", NULL, hold_drained, hold_cancelled, hold_release, hold_stopping};

void kexd_rpc_hold_job(kexd *d, kexd_call *c, kexd_req *rq) {
  kexd_job *job = rq->job;
  job_hold *h;
  if (job->held) {
    kexd_call_failf(c, GRPC_STATUS_ALREADY_EXISTS, "HoldJob: job '%s' is held by another call already", job->name);
    return;
  }
  if (!(h = kex_calloc(1, sizeof *h))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "HoldJob: out of memory");
    return;
  }
  h->d = d;
  h->job = job->id;
  job->held = true;
  job->on_close = hold_job_closed;
  job->on_close_ud = h;
  kex_log(KEX_LOG_INFO, job->log_id, 0, "job \"%s\" held: it closes when this call ends", job->name);
  kexd_stream_start(&h->st, d->streams, c, &hold_ops, h);
  kexd_stream_pump(&h->st);
}

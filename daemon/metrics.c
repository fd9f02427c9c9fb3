/*
 * metrics.c - GET /metrics in Prometheus' text exposition format (0.0.4),
 * served by libmicrohttpd on its own thread (--metrics; metrics.h).
 *
 * Threads.  The loop owns the counters (the kexd struct, the server's
 * per-method counts, the jobs).  A scrape, on the HTTP thread, bumps
 * `requested` and wakes the loop (the loop bridge, bridge.h); the loop's on_snapshot
 * collects every counter into its own scratch snapshot, then takes the
 * lock only to copy it into `published` and signal.  The HTTP thread waits
 * at most KEXD_METRICS_WAIT_MS, copies the published snapshot out under the
 * lock and formats it unlocked.  The connection counters come from the
 * accept guard, which is safe on any thread.
 *
 * The metrics listener is opened here (so a taken port is an error that
 * names it) and exempted from the accept guard: scrapes are neither gRPC
 * connections nor counted as such; libmicrohttpd caps them.
 */
#include "daemon/metrics.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/alloc.h"
#include "core/strbuf.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/accept_guard.h"
#include "daemon/bridge.h"
#include "daemon/fleet.h"
#include "daemon/kexd.h"
#include "daemon/rpc.h"
#include "realize/engine.h"

#ifndef KEX_VERSION
#define KEX_VERSION "unknown"
#endif

#define METRICS_ADDR_MAX 256   /* bytes of --metrics */
#define METRICS_BACKLOG 64     /* listen(2) backlog */
#define METRICS_TEXT_START 8192 /* first size of the formatted page; it grows by doubling */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* grpc_status_code names, as the code label. */
static const char *const code_names[KEXD_STATUS_CODES] = {
    "OK",        "CANCELLED",          "UNKNOWN",        "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};

/* Everything a scrape reports that the loop owns. */
/*
 * The per-tenant series: one row each (a new one is a kexd_tenant_use
 * field and a row here).  Values are the field (uint32_t when `u32`,
 * else uint64_t) times `scale`.
 */
typedef struct tenant_row {
  const char *name, *type, *help;
  size_t off;
  bool u32;
  double scale;
} tenant_row;

#define TU(f) offsetof(kexd_tenant_use, f)
static const tenant_row tenant_rows[] = {
    {"kex_tenant_jobs_open", "gauge", "Jobs open now, by tenant (\"anonymous\" without --auth).", TU(jobs), true, 1},
    {"kex_tenant_held_bytes", "gauge", "Bytes of device memory the tenant's buffers hold (Downloads in progress too).",
     TU(bytes_held), false, 1},
    {"kex_tenant_submissions_total", "counter", "Submit calls admitted, by tenant.", TU(submissions), false, 1},
    {"kex_tenant_refused_total", "counter", "Calls refused RESOURCE_EXHAUSTED over one of the tenant's limits.",
     TU(refused), false, 1},
    {"kex_tenant_compile_seconds_total", "counter", "Seconds the tenant's new kernels spent compiling.",
     TU(compile_us), false, 1e-6},
    {"kex_tenant_search_seconds_total", "counter", "Seconds of beam search the tenant's Submits and Tunes ran.",
     TU(search_us), false, 1e-6},
    {"kex_tenant_compile_budget_refused_total", "counter",
     "Submits refused RESOURCE_EXHAUSTED because they needed a kernel compiled while the tenant's compile budget "
     "(max_compile_seconds, --tenant-compile-budget) was spent.", TU(compile_budget_refused), false, 1},
    {"kex_tenant_search_wait_seconds_total", "counter",
     "Seconds the tenant's searches waited in line for a search slot (--max-tunes-per-device).", TU(search_wait_us),
     false, 1e-6},
};
#undef TU
#define KEXD_METRICS_TENANT_ROWS ((int)(sizeof tenant_rows / sizeof tenant_rows[0]))

static double tenant_value(const tenant_row *r, const kexd_tenant_use *u) {
  const char *base = (const char *)u + r->off;
  return r->scale * (r->u32 ? (double)__atomic_load_n((const uint32_t *)(const void *)base, __ATOMIC_RELAXED)
                             : (double)__atomic_load_n((const uint64_t *)(const void *)base, __ATOMIC_RELAXED));
}

typedef struct snapshot {
  uint32_t nmethods; /* rows of rpcs: registered methods, then one for unregistered paths */
  const char *paths[KEXD_METRICS_MAX_METHODS + 1]; /* NULL: unregistered paths (the server owns the strings) */
  uint64_t rpcs[KEXD_METRICS_MAX_METHODS + 1][KEXD_STATUS_CODES];
  uint64_t submissions, submissions_failed;
  kexd_histogram submit_seconds;
  double kernel_seconds, uptime_s;
  uint64_t bytes_held, jobs_open;
  uint64_t prog_memory_hits, prog_sqlite_hits, prog_misses;
  uint64_t sched_hits, sched_misses;
  kexd_tune_counters tune;
  kexd_fleet_counters fleet;
  /* by tenant (the usage records of jobs.c; at most KEXD_METRICS_MAX_TENANTS, then one "_other" row) */
  uint32_t ntenants;
  struct {
    char name[KEXD_TENANT_NAME_MAX + 1];
    double v[KEXD_METRICS_TENANT_ROWS]; /* tenant_rows' values */
  } tenants[KEXD_METRICS_MAX_TENANTS + 1];
  uint64_t unauthenticated, permission_denied, auth_reloads, auth_reload_errors;
  /* by device (the configured ones, in order) */
  uint32_t ndevices;
  struct {
    char name[KEXD_DEVICE_NAME_MAX];
    double busy_s;
    kexd_histogram wait;
    uint64_t held_bytes;
    uint32_t searches, searches_waiting; /* holding a search slot, waiting for one */
  } devices[KEXD_MAX_DEVICES];
} snapshot;

struct kexd_metrics {
  kexd *d;
  kexd_wake wake;          /* the loop bridge (bridge.h) */
  struct MHD_Daemon *mhd;
  int port;                /* bound (logged) */
  snapshot scratch;       /* the loop's, filled without the lock */
  pthread_mutex_t lock;   /* protects what follows */
  pthread_cond_t cond;
  uint64_t requested, answered;
  bool closing;
  snapshot published;
};

/* ---- the loop side ---- */

/* Every counter the loop owns into s. */
static void collect(kexd *d, snapshot *s) {
  uint32_t n = kexd_server_methods(d->server);
  if (n > KEXD_METRICS_MAX_METHODS) n = KEXD_METRICS_MAX_METHODS;
  for (uint32_t i = 0; i < n; i++)
    memcpy(s->rpcs[i], kexd_server_method_codes(d->server, i, &s->paths[i]), sizeof s->rpcs[i]);
  memcpy(s->rpcs[n], kexd_server_method_codes(d->server, kexd_server_methods(d->server), &s->paths[n]),
         sizeof s->rpcs[n]);
  s->nmethods = n + 1;
  s->submissions = d->submissions;
  s->submissions_failed = d->submissions_failed;
  s->submit_seconds = d->submit_seconds;
  s->kernel_seconds = d->kernel_seconds;
  uv_update_time(d->loop);
  s->uptime_s = (uv_now(d->loop) - d->started_ms) / 1e3;
  s->jobs_open = d->jobs.njobs;
  s->bytes_held = 0;
  for (uint32_t i = 0; i < d->jobs.njobs; i++) s->bytes_held += d->jobs.jobs[i]->bytes_held;
  s->prog_memory_hits = d->prog_cache_memory_hits;
  s->prog_sqlite_hits = s->prog_misses = 0;
  for (uint32_t i = 0; i < KEXD_MAX_DEVICES; i++) {
    if (!d->engines[i]) continue;
    kex_engine_stats es = kex_engine_get_stats(d->engines[i]);
    s->prog_sqlite_hits += es.sqlite_hits;
    s->prog_misses += es.compiled;
  }
  s->sched_hits = d->sched_cache_hits;
  s->sched_misses = d->sched_cache_misses;
  kexd_tune_stats(d, &s->tune);
  kexd_fleet_stats(d, &s->fleet);
  s->ntenants = 0;
  for (uint32_t i = 0; i < d->jobs.nuses; i++) {
    const kexd_tenant_use *u = d->jobs.uses[i];
    uint32_t k = i < KEXD_METRICS_MAX_TENANTS ? i : KEXD_METRICS_MAX_TENANTS;
    if (k == s->ntenants) {
      snprintf(s->tenants[k].name, sizeof s->tenants[k].name, "%s", k < KEXD_METRICS_MAX_TENANTS ? u->name : "_other");
      memset(s->tenants[k].v, 0, sizeof s->tenants[k].v);
      s->ntenants++;
    }
    for (int r = 0; r < KEXD_METRICS_TENANT_ROWS; r++) s->tenants[k].v[r] += tenant_value(&tenant_rows[r], u);
  }
  s->ndevices = d->cfg.ndevices;
  for (uint32_t i = 0; i < s->ndevices; i++) {
    snprintf(s->devices[i].name, sizeof s->devices[i].name, "%s", d->cfg.devices[i]);
    kexd_dispatch_device_stats(d->disp, i, &s->devices[i].busy_s, &s->devices[i].wait);
    s->devices[i].held_bytes = d->jobs.held_by_device[i];
    kexd_search_counts(d, i, &s->devices[i].searches, &s->devices[i].searches_waiting);
  }
  s->unauthenticated = d->unauthenticated;
  s->permission_denied = d->permission_denied;
  s->auth_reloads = d->auth_reloads;
  s->auth_reload_errors = d->auth_reload_errors;
}

/* A scrape asked: publish a fresh snapshot (the lock is held only for the copy). */
static void on_snapshot(kexd_wake *w) {
  kexd_metrics *m = w->data;
  uint64_t want;
  pthread_mutex_lock(&m->lock);
  want = m->requested;
  pthread_mutex_unlock(&m->lock);
  collect(m->d, &m->scratch);
  pthread_mutex_lock(&m->lock);
  m->published = m->scratch;
  m->answered = want;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}

/* ---- the HTTP thread ---- */

/* The /metrics text being written. */
typedef kex_strbuf page;

static void head(page *p, const char *name, const char *type, const char *help) {
  kex_strbuf_printf(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped, as the format asks. */
static void put_label(page *p, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"') kex_strbuf_printf(p, "\\%c", *v);
    else if (*v == '\n') kex_strbuf_printf(p, "\\n");
    else kex_strbuf_printf(p, "%c", *v);
  }
}

/* The series of histogram `name` (one label device="dev" when dev is not NULL): cumulative buckets, sum, count. */
static void put_histogram(page *p, const char *name, const char *dev, const kexd_histogram *h) {
  uint64_t cum = 0;
  for (int i = 0; i <= KEXD_METRICS_BUCKETS; i++) {
    cum += h->buckets[i];
    kex_strbuf_printf(p, "%s_bucket{", name);
    if (dev) {
      kex_strbuf_printf(p, "device=\"");
      put_label(p, dev);
      kex_strbuf_printf(p, "\",");
    }
    if (i < KEXD_METRICS_BUCKETS) kex_strbuf_printf(p, "le=\"%g\"} %llu\n", kexd_histogram_le[i], (unsigned long long)cum);
    else kex_strbuf_printf(p, "le=\"+Inf\"} %llu\n", (unsigned long long)h->count);
  }
  for (int k = 0; k < 2; k++) {
    kex_strbuf_printf(p, "%s_%s", name, k ? "count" : "sum");
    if (dev) {
      kex_strbuf_printf(p, "{device=\"");
      put_label(p, dev);
      kex_strbuf_printf(p, "\"}");
    }
    if (k) kex_strbuf_printf(p, " %llu\n", (unsigned long long)h->count);
    else kex_strbuf_printf(p, " %.9g\n", h->sum);
  }
}

/* A gauge or counter sample `name{device="dev"} value`. */
static void put_device_sample(page *p, const char *name, const char *dev, double v) {
  kex_strbuf_printf(p, "%s{device=\"", name);
  put_label(p, dev);
  kex_strbuf_printf(p, "\"} %.9g\n", v);
}

/* The page for snapshot s (and the accept guard's counters). */
static void format(page *p, const snapshot *s) {
  kexd_accept_stats as;
  head(p, "kex_build_info", "gauge", "kexd's version (always 1).");
  kex_strbuf_printf(p, "kex_build_info{version=\"%s\"} 1\n", KEX_VERSION);
  head(p, "kex_uptime_seconds", "gauge", "Seconds since kexd started.");
  kex_strbuf_printf(p, "kex_uptime_seconds %.3f\n", s->uptime_s);
  head(p, "kex_rpcs_total", "counter",
       "gRPC calls finished, by method and status code (a client cancel counts as CANCELLED; method \"unknown\" is "
       "every unregistered path).");
  for (uint32_t i = 0; i < s->nmethods; i++)
    for (int k = 0; k < KEXD_STATUS_CODES; k++) {
      if (!s->rpcs[i][k]) continue;
      kex_strbuf_printf(p, "kex_rpcs_total{method=\"");
      put_label(p, s->paths[i] ? s->paths[i] : "unknown");
      kex_strbuf_printf(p, "\",code=\"%s\"} %llu\n", code_names[k], (unsigned long long)s->rpcs[i][k]);
    }
  head(p, "kex_submissions_total", "counter", "Submit calls accepted for an open job.");
  kex_strbuf_printf(p, "kex_submissions_total %llu\n", (unsigned long long)s->submissions);
  head(p, "kex_submissions_failed_total", "counter", "Submit calls that ended with an error status.");
  kex_strbuf_printf(p, "kex_submissions_failed_total %llu\n", (unsigned long long)s->submissions_failed);
  head(p, "kex_submission_seconds", "histogram",
       "Seconds from a Submit's arrival to its done event, for submissions that succeeded.");
  put_histogram(p, "kex_submission_seconds", NULL, &s->submit_seconds);
  head(p, "kex_kernel_run_seconds_total", "counter", "Device seconds Submit's kernels ran, as the device measured them.");
  kex_strbuf_printf(p, "kex_kernel_run_seconds_total %.9g\n", s->kernel_seconds);
  head(p, "kex_held_bytes", "gauge", "Bytes of device memory the open jobs' buffers hold.");
  kex_strbuf_printf(p, "kex_held_bytes %llu\n", (unsigned long long)s->bytes_held);
  head(p, "kex_jobs_open", "gauge", "Jobs open now.");
  kex_strbuf_printf(p, "kex_jobs_open %llu\n", (unsigned long long)s->jobs_open);
  for (int r = 0; r < KEXD_METRICS_TENANT_ROWS; r++) {
    head(p, tenant_rows[r].name, tenant_rows[r].type, tenant_rows[r].help);
    for (uint32_t i = 0; i < s->ntenants; i++)
      kex_strbuf_printf(p, "%s{tenant=\"%s\"} %.17g\n", tenant_rows[r].name, s->tenants[i].name, s->tenants[i].v[r]);
  }
  head(p, "kex_auth_refused_total", "counter", "Calls refused by --auth: no or unknown token, or a role or may_tune.");
  kex_strbuf_printf(p, "kex_auth_refused_total{code=\"UNAUTHENTICATED\"} %llu\n", (unsigned long long)s->unauthenticated);
  kex_strbuf_printf(p, "kex_auth_refused_total{code=\"PERMISSION_DENIED\"} %llu\n", (unsigned long long)s->permission_denied);
  head(p, "kex_auth_reloads_total", "counter", "SIGHUP reloads of --auth: ok (swapped in) or error (kept the old).");
  kex_strbuf_printf(p, "kex_auth_reloads_total{result=\"ok\"} %llu\n", (unsigned long long)s->auth_reloads);
  kex_strbuf_printf(p, "kex_auth_reloads_total{result=\"error\"} %llu\n", (unsigned long long)s->auth_reload_errors);
  head(p, "kex_program_cache_hits_total", "counter",
       "Submit's kernels whose program was loaded already (tier memory) or read from the SQLite cache (tier sqlite).");
  kex_strbuf_printf(p, "kex_program_cache_hits_total{tier=\"memory\"} %llu\n", (unsigned long long)s->prog_memory_hits);
  kex_strbuf_printf(p, "kex_program_cache_hits_total{tier=\"sqlite\"} %llu\n", (unsigned long long)s->prog_sqlite_hits);
  head(p, "kex_program_cache_misses_total", "counter", "Submit's kernels that had to be compiled.");
  kex_strbuf_printf(p, "kex_program_cache_misses_total %llu\n", (unsigned long long)s->prog_misses);
  head(p, "kex_schedule_cache_hits_total", "counter", "Submissions whose graph structure was scheduled already.");
  kex_strbuf_printf(p, "kex_schedule_cache_hits_total %llu\n", (unsigned long long)s->sched_hits);
  head(p, "kex_schedule_cache_misses_total", "counter", "Submissions whose graph structure had to be scheduled.");
  kex_strbuf_printf(p, "kex_schedule_cache_misses_total %llu\n", (unsigned long long)s->sched_misses);
  head(p, "kex_beam_cache_hits_total", "counter", "Beam searches answered from the cache (Tune and Submit).");
  kex_strbuf_printf(p, "kex_beam_cache_hits_total %llu\n", (unsigned long long)s->tune.beam_hits);
  head(p, "kex_beam_cache_misses_total", "counter", "Beam cache lookups that found nothing (Tune and Submit).");
  kex_strbuf_printf(p, "kex_beam_cache_misses_total %llu\n", (unsigned long long)s->tune.beam_misses);
  head(p, "kex_beam_searches_total", "counter", "Beam searches run.");
  kex_strbuf_printf(p, "kex_beam_searches_total %llu\n", (unsigned long long)s->tune.searches);
  head(p, "kex_beam_searches_cancelled_total", "counter", "Beam searches cancelled before they ended.");
  kex_strbuf_printf(p, "kex_beam_searches_cancelled_total %llu\n", (unsigned long long)s->tune.searches_cancelled);
  head(p, "kex_beam_search_seconds_total", "counter", "Wall seconds of the beam searches that finished (Tune and Submit).");
  kex_strbuf_printf(p, "kex_beam_search_seconds_total %.9g\n", s->tune.search_seconds);
  head(p, "kex_fleet_up", "gauge", "1 while the fleet cache's Redis (--fleet-cache) is connected; 0 when down or off.");
  kex_strbuf_printf(p, "kex_fleet_up %d\n", s->fleet.up ? 1 : 0);
  head(p, "kex_fleet_hits_total", "counter", "Beam results taken from the fleet cache: searches this node did not run.");
  kex_strbuf_printf(p, "kex_fleet_hits_total %llu\n", (unsigned long long)s->fleet.hits);
  head(p, "kex_fleet_published_total", "counter", "Beam results this node searched and published to the fleet cache.");
  kex_strbuf_printf(p, "kex_fleet_published_total %llu\n", (unsigned long long)s->fleet.published);
  head(p, "kex_fleet_lease_waits_total", "counter", "Searches that waited for a peer searching the same kernel.");
  kex_strbuf_printf(p, "kex_fleet_lease_waits_total %llu\n", (unsigned long long)s->fleet.lease_waits);
  head(p, "kex_fleet_rejected_total", "counter", "Fleet cache values refused: invalid, or for another device or key.");
  kex_strbuf_printf(p, "kex_fleet_rejected_total %llu\n", (unsigned long long)s->fleet.rejected);
  head(p, "kex_fleet_errors_total", "counter", "Fleet cache commands that failed or timed out, and connection losses.");
  kex_strbuf_printf(p, "kex_fleet_errors_total %llu\n", (unsigned long long)s->fleet.errors);
  head(p, "kex_queue_wait_seconds", "histogram",
       "Seconds a device item (a Submit's setup, kernels and outputs, an upload, a download, a search's timing run) "
       "waited in its job's fair queue before the device ran it, by device.");
  for (uint32_t i = 0; i < s->ndevices; i++) put_histogram(p, "kex_queue_wait_seconds", s->devices[i].name, &s->devices[i].wait);
  head(p, "kex_device_busy_seconds_total", "counter", "Wall seconds the device's runner spent running items, by device.");
  for (uint32_t i = 0; i < s->ndevices; i++)
    put_device_sample(p, "kex_device_busy_seconds_total", s->devices[i].name, s->devices[i].busy_s);
  head(p, "kex_device_held_bytes", "gauge", "Device memory that open jobs' buffers hold, by device.");
  for (uint32_t i = 0; i < s->ndevices; i++)
    put_device_sample(p, "kex_device_held_bytes", s->devices[i].name, (double)s->devices[i].held_bytes);
  head(p, "kex_device_searches", "gauge", "Beam searches holding one of the device's search slots now, by device.");
  for (uint32_t i = 0; i < s->ndevices; i++)
    put_device_sample(p, "kex_device_searches", s->devices[i].name, (double)s->devices[i].searches);
  head(p, "kex_device_searches_waiting", "gauge", "Beam searches waiting in line for a search slot now, by device.");
  for (uint32_t i = 0; i < s->ndevices; i++)
    put_device_sample(p, "kex_device_searches_waiting", s->devices[i].name, (double)s->devices[i].searches_waiting);
  kexd_accept_guard_stats(&as);
  head(p, "kex_connections_open", "gauge", "gRPC client connections open now.");
  kex_strbuf_printf(p, "kex_connections_open %u\n", as.open);
  head(p, "kex_connections_max", "gauge", "The cap on gRPC client connections (--max-connections).");
  kex_strbuf_printf(p, "kex_connections_max %u\n", as.max);
  head(p, "kex_connections_refused_total", "counter",
       "gRPC connections closed at accept: over --max-connections (reason limit) or no descriptor free (reason "
       "descriptors).");
  kex_strbuf_printf(p, "kex_connections_refused_total{reason=\"limit\"} %llu\n", (unsigned long long)as.refused_limit);
  kex_strbuf_printf(p, "kex_connections_refused_total{reason=\"descriptors\"} %llu\n", (unsigned long long)as.refused_fds);
}

/* Ask the loop for a fresh snapshot and wait for it, at most KEXD_METRICS_WAIT_MS; a copy of the newest into *out. */
static void take_snapshot(kexd_metrics *m, snapshot *out) {
  struct timespec until;
  uint64_t want;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += KEXD_METRICS_WAIT_MS / 1000;
  until.tv_nsec += (KEXD_METRICS_WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&m->lock);
  want = ++m->requested;
  if (!m->closing) kexd_wake_send(&m->wake);
  while (m->answered < want && !m->closing)
    if (pthread_cond_timedwait(&m->cond, &m->lock, &until) == ETIMEDOUT) break;
  *out = m->published;
  pthread_mutex_unlock(&m->lock);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *body, size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ret;
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, status == MHD_HTTP_OK ? METRICS_CONTENT_TYPE : "text/plain");
  ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

/* libmicrohttpd's request handler: GET (or HEAD) /metrics; 404 for another path, 405 for another method. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  kexd_metrics *m = cls;
  snapshot *s = NULL;
  page p = {0};
  enum MHD_Result ret;
  (void)version, (void)upload, (void)upload_size, (void)con_cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    static const char msg[] = "only GET /metrics\n";
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, msg, sizeof msg - 1);
  }
  if (strcmp(url, "/metrics") != 0) {
    static const char msg[] = "not found: kexd serves /metrics\n";
    return reply(conn, MHD_HTTP_NOT_FOUND, msg, sizeof msg - 1);
  }
  if (!(s = kex_malloc(sizeof *s)) || !(p.p = kex_malloc(METRICS_TEXT_START))) {
    p.oom = true;
  } else {
    p.cap = METRICS_TEXT_START;
    take_snapshot(m, s);
    format(&p, s);
  }
  if (p.oom) {
    static const char msg[] = "out of memory\n";
    ret = reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, msg, sizeof msg - 1);
  } else {
    ret = reply(conn, MHD_HTTP_OK, p.p, p.len);
  }
  kex_free(p.p);
  kex_free(s);
  return ret;
}

/* ---- start and stop ---- */

/*
 * A listening socket on addr ("HOST:PORT", "[V6]:PORT").  The descriptor,
 * or KEX_EINVAL / KEX_EUNAVAILABLE (logged, naming the address; optional:
 * a port in use is a warning that kexd goes on without metrics).
 */
static int open_listener(const char *addr, bool optional) {
  char host[METRICS_ADDR_MAX], *port;
  struct addrinfo hints, *ai = NULL;
  int fd = -1, one = 1, rc, e;
  if (strlen(addr) >= sizeof host || !(port = strrchr(strcpy(host, addr), ':')) || port == host || !port[1]) {
    KEX_ERROR("--metrics %s: not HOST:PORT (or \"off\")", addr);
    return KEX_EINVAL;
  }
  *port++ = '\0';
  if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1] */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0) {
    KEX_ERROR("--metrics %s: %s", addr, gai_strerror(rc));
    return KEX_EINVAL;
  }
  fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, METRICS_BACKLOG) < 0) {
    e = errno;
    if (optional && e == EADDRINUSE)
      KEX_WARN("metrics: the default address %s is in use (another kexd?): running without metrics; give --metrics "
               "HOST:PORT (or off) to choose", addr);
    else
      KEX_ERROR("cannot serve metrics on %s: %s (--metrics; is another kexd running?)", addr, strerror(e));
    if (fd >= 0) close(fd);
    fd = KEX_EUNAVAILABLE;
  }
  freeaddrinfo(ai);
  return fd;
}

static void on_closed(kexd_wake *w) {
  kexd_metrics *m = w->data;
  pthread_cond_destroy(&m->cond);
  pthread_mutex_destroy(&m->lock);
  kex_free(m);
}

int kexd_metrics_start(kexd *d, const char *addr, bool optional, kexd_metrics **out) {
  kexd_metrics *m = NULL;
  pthread_condattr_t ca;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd, rc = 0;
  *out = NULL;
  if ((fd = open_listener(addr, optional)) < 0) return fd;
  if (!(m = kex_calloc(1, sizeof *m))) {
    KEX_ERROR("--metrics %s: out of memory", addr);
    rc = KEX_ENOMEM;
    goto out_fd;
  }
  m->d = d;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    m->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
  pthread_mutex_init(&m->lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cond, &ca);
  pthread_condattr_destroy(&ca);
  if (kexd_wake_init(d->loop, &m->wake, on_snapshot, m) < 0) {
    KEX_ERROR("--metrics %s: cannot create the loop handle", addr);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->lock);
    kex_free(m);
    rc = KEX_EINTERNAL;
    goto out_fd;
  }
  collect(d, &m->published); /* a scrape that finds the loop busy still gets numbers */
  kexd_accept_guard_pass(fd);
  m->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC, 0, NULL, NULL, on_request,
                            m, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)KEXD_METRICS_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)KEXD_METRICS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)KEXD_METRICS_TIMEOUT_S, MHD_OPTION_END);
  if (!m->mhd) {
    KEX_ERROR("cannot serve metrics on %s: libmicrohttpd would not start", addr);
    kexd_accept_guard_pass(-1);
    kexd_wake_close(&m->wake, on_closed);
    rc = KEX_EINTERNAL;
    goto out_fd;
  }
  KEX_INFO("metrics on http://%s/metrics (port %d)", addr, m->port);
  *out = m;
  return 0;
out_fd:
  close(fd);
  return rc;
}

void kexd_metrics_stop(kexd_metrics *m) {
  if (!m) return;
  pthread_mutex_lock(&m->lock);
  m->closing = true;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
  MHD_stop_daemon(m->mhd); /* joins the HTTP thread and closes the listener */
  kexd_accept_guard_pass(-1);
  kexd_wake_close(&m->wake, on_closed);
}

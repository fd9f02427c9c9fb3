/*
 * config.c - kexd's settings: one table of flags that drives parsing, the
 * environment and --help.
 *
 * Each row names a flag, its environment variable (KEX_ plus the flag's
 * name in capitals, '-' as '_'; test-only flags have none), its type and
 * range, the kexd_config field it sets and its help text.  The default a
 * row shows in --help is read from a freshly defaulted kexd_config, so the
 * defaults live in one place (config_defaults) and the text never drifts
 * from them.  The environment is read first, then argv: a flag wins.
 *
 * Every quantity a client can choose is bounded by one of these rows (the
 * "limits" section of --help); a request over a limit is answered
 * RESOURCE_EXHAUSTED naming the flag and the value.
 */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "daemon/fleet.h"
#include "devices/device.h"
#include "search/beam.h"

typedef enum flag_type {
  FLAG_U32,     /* uint32_t field, range [lo, hi] */
  FLAG_I64,     /* int64_t field */
  FLAG_U64,     /* uint64_t field */
  FLAG_INT,     /* int field */
  FLAG_SECONDS, /* double field, range [dlo, dhi] */
  FLAG_STRING,  /* const char * field */
  FLAG_BOOL,    /* bool field, no argument */
  FLAG_DEVICES, /* "a,b": devices/ndevices */
  FLAG_LOG,     /* a log level (not stored in the config) */
  FLAG_FAULT,   /* "KIND:N": test_fault_kind/n */
  FLAG_HELP,
  FLAG_VERSION,  /* print the version, exit 0 */
  FLAG_LOG_FORMAT, /* text or json (not stored in the config) */
} flag_type;

typedef struct flag {
  const char *name; /* without "--" */
  const char *arg;  /* the argument's name in --help; NULL: none */
  flag_type type;
  size_t offset;    /* of the field in kexd_config */
  long long lo, hi; /* integer range */
  double dlo, dhi;  /* seconds range */
  bool test_only;   /* no environment variable; marked in --help */
  const char *section;
  const char *help;
} flag;

#define F(field) offsetof(kexd_config, field)
#define LIM(field) (offsetof(kexd_config, limits) + offsetof(kex_limits, field))

/* clang-format off */
static const flag flags[] = {
  /* the server */
  {"listen", "ADDR", FLAG_STRING, F(listen), 0, 0, 0, 0, false, "server",
   "gRPC address (host:port, or unix:/path)"},
  {"node-name", "NAME", FLAG_STRING, F(node_name), 0, 0, 0, 0, false, NULL,
   "this node's name in a fleet: in every job token and in errors that name the node (1-31 of A-Z a-z 0-9 "
   "._:/[]-; default: the --listen address)"},
  {"advertise", "ADDR", FLAG_STRING, F(advertise), 0, 0, 0, 0, false, NULL,
   "the address clients reach this node at; a job's token carries it and clients send the job's calls there "
   "(host:port, 1-62 characters; default: the --listen address)"},
  {"tls-cert", "FILE", FLAG_STRING, F(tls_cert), 0, 0, 0, 0, false, NULL,
   "serve TLS only, with this PEM certificate chain (needs --tls-key; default: plaintext)"},
  {"tls-key", "FILE", FLAG_STRING, F(tls_key), 0, 0, 0, 0, false, NULL,
   "the PEM private key of --tls-cert"},
  {"tls-client-ca", "FILE", FLAG_STRING, F(tls_client_ca), 0, 0, 0, 0, false, NULL,
   "mutual TLS: require a client certificate signed by these PEM roots; others are refused (needs --tls-cert)"},
  {"auth", "FILE", FLAG_STRING, F(auth), 0, 0, 0, 0, false, NULL,
   "tenants and the SHA-256 of their tokens (JSON); every call but the health check needs authorization: Bearer "
   "TOKEN; SIGHUP reloads it (default: no tokens, loopback only)"},
  {"insecure", NULL, FLAG_BOOL, F(insecure), 0, 0, 0, 0, false, NULL,
   "allow a --listen or --metrics address other than loopback without --auth and --tls-cert (anyone who reaches "
   "it may run anything)"},
  {"metrics", "ADDR", FLAG_STRING, F(metrics), 0, 0, 0, 0, false, NULL,
   "serve Prometheus metrics at http://ADDR/metrics (host:port; \"off\": none); not loopback: needs --auth and "
   "--tls-cert, or --insecure; the default address, when taken, is skipped with a warning (a given one is an error)"},
  {"cache", "PATH", FLAG_STRING, F(cache_path), 0, 0, 0, 0, false, NULL,
   "the SQLite cache file (programs and beam results; \"\": none); default $XDG_CACHE_HOME/kex/cache.db, else "
   "~/.cache/kex/cache.db"},
  {"fleet-cache", "URL", FLAG_STRING, F(fleet_cache), 0, 0, 0, 0, false, NULL,
   "share beam results with other kexd nodes through Redis: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (no TLS: "
   "keep Redis on a private network, docs/fleet.md; default: none)"},
  {"fleet-lease", "SECONDS", FLAG_SECONDS, F(fleet_lease_s), 0, 0, 1, KEXD_FLEET_LEASE_MAX_S, false, NULL,
   "fleet cache: a search's lease on its kernel (renewed every third of it while it runs; a peer takes the search "
   "over when it expires)"},
  {"fleet-timeout", "SECONDS", FLAG_SECONDS, F(fleet_timeout_s), 0, 0, 0.001, 60, false, NULL,
   "fleet cache: one Redis command waits at most this long, then the node searches locally"},
  {"fleet-wait-max", "SECONDS", FLAG_SECONDS, F(fleet_wait_max_s), 0, 0, 0, 86400, false, NULL,
   "fleet cache: a search waits at most this long for a peer searching the same kernel, then searches itself"},
  {"device", "NAME[,NAME]", FLAG_DEVICES, 0, 0, 0, 0, 0, false, NULL,
   "devices, the first is the default (opencl, opencl:NAME, cpu)"},
  {"workers", "N", FLAG_U32, F(workers), 0, 1024, 0, 0, false, NULL,
   "threads of the one worker pool (planning, compiles, the program cache, beam candidates, the cpu device's "
   "launch helpers; 0: the CPUs kexd may run on, at least 4)"},
  {"grace", "SECONDS", FLAG_SECONDS, F(grace_s), 0, 0, 0, 3600, false, NULL,
   "at SIGTERM, in-flight calls get this long"},
  {"beam", "N", FLAG_U32, F(beam), 0, KEX_BEAM_MAX_WIDTH, 0, 0, false, NULL,
   "Submit's beam width when a request asks for none (0: hand-coded opts); Tune's (2 when this is 0)"},
  {"plan-inline-nodes", "N", FLAG_U32, F(plan_inline_nodes), 0, INT_MAX, 0, 0, false, NULL,
   "graphs up to N nodes are planned on the loop thread, larger ones on the worker pool"},
  {"plan-warm-bytes", "BYTES", FLAG_U64, F(plan_warm_bytes), 0, 1ull << 32, 0, 0, false, NULL,
   "Plan: each thread keeps the interned views and the replay's memory of its last graphs, up to this many bytes "
   "(past it, it starts afresh; 0: off)"},
  {"inline-output-max", "BYTES", FLAG_U64, F(inline_output_max), 0, INT64_MAX, 0, 0, false, NULL,
   "Submit: outputs up to this many bytes come back inline in the done event (a request may ask for fewer)"},
  {"schedule-cache", "N", FLAG_U32, F(schedule_cache), 0, 1 << 20, 0, 0, false, NULL,
   "Submit: graph structures whose schedule and programs are kept (0: off)"},
  {"log", "LEVEL", FLAG_LOG, 0, 0, 0, 0, 0, false, NULL, "debug, info, warn, error or off (default info)"},
  {"log-format", "FORMAT", FLAG_LOG_FORMAT, 0, 0, 0, 0, 0, false, NULL,
   "text, or json: one JSON object per line (default text)"},
  {"help", NULL, FLAG_HELP, 0, 0, 0, 0, 0, false, NULL, "this text"},
  {"version", NULL, FLAG_VERSION, 0, 0, 0, 0, 0, false, NULL, "print kexd's version"},
  /* connections */
  {"max-connections", "N", FLAG_U32, F(max_connections), 0, 1 << 20, 0, 0, false, "connections",
   "client connections open at once; more are closed at accept (0: sized from the descriptor limit, at most "
   "1024)"},
  {"idle-timeout", "SECONDS", FLAG_SECONDS, F(idle_timeout_s), 0, 0, 0.1, 1e7, false, NULL,
   "a connection with no call in flight this long is closed"},
  {"handshake-timeout", "SECONDS", FLAG_SECONDS, F(handshake_timeout_s), 0, 0, 0.1, 3600, false, NULL,
   "a connection that has not completed the HTTP/2 handshake (preface and SETTINGS) this long is closed"},
  {"keepalive", "SECONDS", FLAG_SECONDS, F(keepalive_s), 0, 0, 1, 1e7, false, NULL,
   "an idle connection is pinged this often, and closed when a ping goes unanswered for 20 s"},
  {"max-streams", "N", FLAG_U32, F(max_streams), 1, 1 << 20, 0, 0, false, NULL,
   "calls at once on one connection (HTTP/2 streams); more wait for one to end"},
  {"max-message", "BYTES", FLAG_INT, F(max_message), 1024, INT_MAX, 0, 0, false, NULL,
   "largest gRPC message either way"},
  /* jobs */
  {"max-jobs", "N", FLAG_U32, F(max_jobs), 1, 1 << 20, 0, 0, false, "jobs",
   "jobs open at once; when full, the opening tenant's job idle longest is closed for its new one (if idle "
   "--job-evict-idle; never another tenant's)"},
  {"job-evict-idle", "SECONDS", FLAG_SECONDS, F(job_evict_idle_s), 0, 0, 0, 1e7, false, NULL,
   "a full job table closes the opening tenant's job idle longest only when it has been idle at least this long"},
  {"max-jobs-per-peer", "N", FLAG_U32, F(max_jobs_per_peer), 1, 1 << 20, 0, 0, false, NULL,
   "jobs one client address may hold open at once"},
  {"tenant-max-jobs", "N", FLAG_U32, F(tenant_max_jobs), 1, 1 << 20, 0, 0, false, NULL,
   "with --auth: jobs one tenant may hold open at once when its entry sets no max_jobs (a full --max-jobs table "
   "makes room only from the opening tenant's own idle jobs)"},
  {"tenant-compile-budget", "SECONDS", FLAG_SECONDS, F(tenant_compile_budget_s), 0, 0, 0, KEXD_COMPILE_BUDGET_MAX_S,
   false, NULL,
   "with --auth: the compile seconds one tenant may spend in any hour when its entry sets no max_compile_seconds "
   "(a token bucket refilled at SECONDS per hour; while it is empty, a call that needs a new kernel compiled is "
   "refused, cached kernels still run; 0: unlimited)"},
  {"lease", "SECONDS", FLAG_SECONDS, F(lease_s), 0, 0, 0.1, 1e7, false, NULL,
   "a job no call names for this long is closed"},
  {"job-memory-default", "BYTES", FLAG_U64, F(job_memory_default), 1, INT64_MAX, 0, 0, false, NULL,
   "memory limit of a job whose OpenJob asks for 0"},
  {"max-weight", "N", FLAG_U32, F(max_weight), 1, 1 << 20, 0, 0, false, NULL,
   "the largest weight (fair-queueing share) an OpenJob may ask for"},
  {"max-buffers-per-job", "N", FLAG_U32, F(max_buffers_per_job), 1, 1 << 24, 0, 0, false, NULL,
   "buffers one job may hold (uploads and outputs), and so the handles one Free may name"},
  {"max-submits-per-job", "N", FLAG_U32, F(max_submits_per_job), 1, 1 << 20, 0, 0, false, NULL,
   "Submit calls one job may have in flight"},
  {"max-kept-graphs", "N", FLAG_U32, F(max_kept_graphs), 1, 1 << 20, 0, 0, false, NULL,
   "graphs one job keeps on kexd (Submit keep_as, named again by graph_ref); past it the job's least recently "
   "used one goes"},
  {"max-kept-graph-bytes", "BYTES", FLAG_U64, F(max_kept_graph_bytes), 1, INT64_MAX, 0, 0, false, NULL,
   "bytes of the graphs one job keeps; a larger graph is not kept (RESOURCE_EXHAUSTED)"},
  {"max-beam", "N", FLAG_U32, F(max_beam), 1, KEX_BEAM_MAX_WIDTH, 0, 0, false, NULL,
   "the widest beam a Submit or Tune may ask for"},
  {"job-memory-max", "BYTES", FLAG_U64, F(job_memory_max), 1, INT64_MAX, 0, 0, false, NULL,
   "the largest memory limit an OpenJob may ask for"},
  /* graphs */
  {"max-nodes", "N", FLAG_U32, LIM(max_nodes), 1, INT_MAX, 0, 0, false, "graphs",
   "nodes per graph"},
  {"max-dims", "N", FLAG_U32, LIM(max_dims), 0, KEX_MAX_DIMS, 0, 0, false, NULL,
   "dims per shape, at most 16 (tinygrad's repeat and conv reshape through up to 12)"},
  {"max-elements", "N", FLAG_I64, LIM(max_elements), 1, INT64_MAX, 0, 0, false, NULL,
   "elements of one node's shape (the product of its non-zero dims)"},
  {"max-inline-bytes", "BYTES", FLAG_I64, LIM(max_inline_bytes), 0, INT64_MAX, 0, 0, false, NULL,
   "inline BUFFER bytes per graph"},
  {"max-buffer-bytes", "BYTES", FLAG_I64, LIM(max_buffer_bytes), 0, INT64_MAX, 0, 0, false, NULL,
   "bytes of one input buffer"},
  {"max-outputs", "N", FLAG_U32, LIM(max_outputs), 0, UINT32_MAX, 0, 0, false, NULL, "outputs per graph"},
  {"max-depth", "N", FLAG_U32, LIM(max_depth), 1, UINT32_MAX, 0, 0, false, NULL,
   "nodes on the longest dependency chain of a graph"},
  {"max-kernel-depth", "N", FLAG_U32, LIM(max_kernel_depth), 1, UINT32_MAX, 0, 0, false, NULL,
   "AST depth of one kernel, an abuse guard (deep expressions render through variables); CONTIGUOUS splits a "
   "deeper chain"},
  {"max-kernel-ops", "N", FLAG_U32, LIM(max_kernel_ops), 1, UINT32_MAX, 0, 0, false, NULL,
   "ALU, cast, reduce and store operations in one kernel (bounds compile time)"},
  /* the cache and downloads */
  {"import-max-bytes", "BYTES", FLAG_U64, F(import_max_bytes), 1, INT64_MAX, 0, 0, false, "transfers",
   "bytes of one ImportCache stream"},
  {"import-streams", "N", FLAG_U32, F(import_streams), 1, 1 << 16, 0, 0, false, NULL,
   "ImportCache streams at once (all clients)"},
  {"download-chunk-min", "BYTES", FLAG_U32, F(download_chunk_min), 1, KEXD_DOWNLOAD_CHUNK, 0, 0, false, NULL,
   "the smallest chunk_bytes a Download may ask for"},
  /* devices */
  {"max-programs", "N", FLAG_U32, F(max_programs), 1, 1 << 20, 0, 0, false, "devices",
   "programs kept loaded per device; past it the least recently used one not in use is unloaded (and reloaded "
   "from the cache when needed)"},
  {"compile-slots", "N", FLAG_U32, F(compile_slots), 1, 64, 0, 0, false, NULL,
   "kernels compiled at once per device, shared fairly between tenants (jobs without --auth) by compile "
   "seconds; one that has none in flight gets an extra slot while all are taken"},
  {"compile-timeout", "SECONDS", FLAG_SECONDS, F(compile_timeout_s), 0, 0, 0, 86400, false, NULL,
   "one kernel's compile is stopped after this long and its kernel fails, named (0: no limit; cpu: the "
   "compiler is killed; OpenCL builds inside the driver and cannot be stopped); a source that failed to "
   "compile fails again at once"},
  {"max-tunes-per-device", "N", FLAG_U32, F(max_tunes_per_device), 1, 1024, 0, 0, false, NULL,
   "beam searches at once on one device (Tune calls and Submits with beam.beam_width, each for its whole call); "
   "more wait in line, and a freed slot goes to the tenant (job without --auth) charged least slot seconds over "
   "its weight"},
  {"max-search-queue", "N", FLAG_U32, F(max_search_queue), 0, KEXD_LIMIT_SEARCH_QUEUE_MAX, 0, 0, false, NULL,
   "searches that may wait for a slot per device (each until its deadline); more are refused (0: none wait)"},
  {"max-search-queue-per-payer", "N", FLAG_U32, F(max_search_queue_per_payer), 1, KEXD_LIMIT_SEARCH_QUEUE_MAX, 0, 0,
   false, NULL,
   "of them, searches of one tenant (one job without --auth); more of its own are refused"},
  {"launch-quantum", "SECONDS", FLAG_SECONDS, F(launch_quantum_s), 0, 0, 0, 10, false, NULL,
   "a submission's kernels go to the device back to back with one wait, about this much device time (from the "
   "plan's last run) per fair-queue turn; other jobs' turns come between (0: one kernel per turn)"},
  {"kernel-time-limit", "SECONDS", FLAG_SECONDS, F(kernel_time_limit_s), 0, 0, 0, 86400, false, NULL,
   "seconds one kernel may run (0: none): cpu stops it between ranges, OpenCL fails it when it ends; the "
   "submission fails DEADLINE_EXCEEDED"},
  /* tests */
  {"test-busy-work", NULL, FLAG_BOOL, F(test_busy_work), 0, 0, 0, 0, true, "tests",
   "serve /kex.v1.Kex/_BusyWork, which queues busy-CPU items on a device runner for a job"},
  {"test-fault", "KIND:N", FLAG_FAULT, 0, 0, 0, 0, 0, true, NULL,
   "each device instance (compile, run) fails its N-th call of KIND (compile, alloc, launch, copy)"},
};
/* clang-format on */
#define NFLAGS (sizeof flags / sizeof flags[0])

/* Split "a,b" into cfg->devices; -1 with a message for an empty, long or extra name. */
static int parse_devices(kexd_config *cfg, const char *what, const char *s) {
  const char *p = s;
  cfg->ndevices = 0;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (n == 0 || n >= KEXD_DEVICE_NAME_MAX || cfg->ndevices == KEXD_MAX_DEVICES) {
      fprintf(stderr, "kexd: %s: \"%s\": names must be 1-%d characters, at most %d of them\n", what, s,
              KEXD_DEVICE_NAME_MAX - 1, KEXD_MAX_DEVICES);
      return -1;
    }
    memcpy(cfg->devices[cfg->ndevices], p, n);
    cfg->devices[cfg->ndevices++][n] = '\0';
    p = comma ? comma + 1 : p + n;
  }
  if (!cfg->ndevices) {
    fprintf(stderr, "kexd: %s: no device named\n", what);
    return -1;
  }
  return 0;
}

/* "compile:2" into cfg->test_fault_kind/n; -1 with a message when it is not KIND:N. */
static int parse_fault(kexd_config *cfg, const char *what, const char *s) {
  const char *colon = strchr(s, ':');
  for (int k = 0; colon && k < KEX_FAULT_KIND_COUNT; k++) {
    const char *name = kex_fault_kind_name((kex_fault_kind)k);
    char *end;
    long long n;
    if (strlen(name) != (size_t)(colon - s) || strncmp(s, name, (size_t)(colon - s)) != 0) continue;
    errno = 0;
    n = strtoll(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || n < 1 || n > INT_MAX) break;
    cfg->test_fault_kind = k;
    cfg->test_fault_n = (unsigned long)n;
    return 0;
  }
  fprintf(stderr, "kexd: %s: \"%s\" is not KIND:N with KIND compile, alloc, launch or copy and N >= 1\n", what, s);
  return -1;
}

/* Set the field of row f from text s (what: "--name" or "KEX_NAME", for messages).  0, 1 for --help, -1. */
static int flag_set(kexd_config *cfg, const flag *f, const char *what, const char *s) {
  char *field = (char *)cfg + f->offset, *end;
  long long v;
  double dv;
  switch (f->type) {
  case FLAG_U32:
  case FLAG_I64:
  case FLAG_U64:
  case FLAG_INT:
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < f->lo || v > f->hi) {
      fprintf(stderr, "kexd: %s: \"%s\" is not an integer in [%lld, %lld]\n", what, s, f->lo, f->hi);
      return -1;
    }
    if (f->type == FLAG_U32) *(uint32_t *)field = (uint32_t)v;
    else if (f->type == FLAG_I64) *(int64_t *)field = v;
    else if (f->type == FLAG_U64) *(uint64_t *)field = (uint64_t)v;
    else *(int *)field = (int)v;
    return 0;
  case FLAG_SECONDS:
    errno = 0;
    dv = strtod(s, &end);
    if (errno || end == s || *end || !(dv >= f->dlo && dv <= f->dhi)) {
      fprintf(stderr, "kexd: %s: \"%s\" is not a number of seconds in [%g, %g]\n", what, s, f->dlo, f->dhi);
      return -1;
    }
    *(double *)field = dv;
    return 0;
  case FLAG_STRING:
    if (!*s && f->offset != F(cache_path)) { /* --cache "": no cache file */
      fprintf(stderr, "kexd: %s: an empty value\n", what);
      return -1;
    }
    *(const char **)field = s;
    return 0;
  case FLAG_BOOL: *(bool *)field = true; return 0;
  case FLAG_DEVICES: return parse_devices(cfg, what, s);
  case FLAG_FAULT: return parse_fault(cfg, what, s);
  case FLAG_LOG: {
    int l = kex_log_parse_level(s);
    if (l < 0) {
      fprintf(stderr, "kexd: %s: \"%s\" is not debug, info, warn, error or off\n", what, s);
      return -1;
    }
    kex_log_set_level((enum kex_log_level)l);
    return 0;
  }
  case FLAG_LOG_FORMAT:
    if (strcmp(s, "text") != 0 && strcmp(s, "json") != 0) {
      fprintf(stderr, "kexd: %s: \"%s\" is not text or json\n", what, s);
      return -1;
    }
    kex_log_set_json(strcmp(s, "json") == 0);
    return 0;
  case FLAG_HELP: return 1;
  case FLAG_VERSION: return 2;
  }
  return -1;
}

/* "KEX_MAX_JOBS" for "max-jobs" into buf. */
static void env_name(const flag *f, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "KEX_%s", f->name);
  for (size_t i = 4; i < n && i < cap; i++) buf[i] = buf[i] == '-' ? '_' : (char)toupper((unsigned char)buf[i]);
}

/* The default --metrics, one object: kexd_config_parse tells it from a flag that names the same address. */
static const char default_metrics[] = KEXD_DEFAULT_METRICS;

void kexd_config_defaults(kexd_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->listen = KEXD_DEFAULT_LISTEN;
  cfg->metrics = default_metrics;
  cfg->lease_s = KEXD_DEFAULT_LEASE_S;
  cfg->grace_s = KEXD_DEFAULT_GRACE_S;
  cfg->fleet_lease_s = KEXD_FLEET_DEFAULT_LEASE_S;
  cfg->fleet_timeout_s = KEXD_FLEET_DEFAULT_TIMEOUT_S;
  cfg->fleet_wait_max_s = KEXD_FLEET_DEFAULT_WAIT_MAX_S;
  cfg->max_message = KEXD_DEFAULT_MAX_MESSAGE;
  cfg->limits = KEX_LIMITS_DEFAULT;
  cfg->max_jobs = KEXD_LIMIT_JOBS;
  cfg->max_jobs_per_peer = KEXD_LIMIT_JOBS_PER_PEER;
  cfg->tenant_max_jobs = KEXD_LIMIT_JOBS_PER_TENANT;
  cfg->tenant_compile_budget_s = KEXD_DEFAULT_TENANT_COMPILE_BUDGET_S;
  cfg->job_evict_idle_s = KEXD_DEFAULT_JOB_EVICT_IDLE_S;
  cfg->job_memory_default = KEXD_DEFAULT_JOB_MEMORY;
  cfg->job_memory_max = KEXD_LIMIT_JOB_MEMORY;
  cfg->max_weight = KEXD_LIMIT_WEIGHT;
  cfg->max_buffers_per_job = KEXD_LIMIT_BUFFERS_PER_JOB;
  cfg->plan_inline_nodes = KEXD_DEFAULT_PLAN_INLINE_NODES;
  cfg->plan_warm_bytes = KEXD_DEFAULT_PLAN_WARM_BYTES;
  cfg->inline_output_max = KEXD_DEFAULT_INLINE_OUTPUT;
  cfg->schedule_cache = KEXD_DEFAULT_SCHEDULE_CACHE;
  cfg->idle_timeout_s = KEXD_DEFAULT_IDLE_TIMEOUT_S;
  cfg->handshake_timeout_s = KEXD_DEFAULT_HANDSHAKE_TIMEOUT_S;
  cfg->keepalive_s = KEXD_DEFAULT_KEEPALIVE_S;
  cfg->max_streams = KEXD_LIMIT_STREAMS;
  cfg->import_max_bytes = KEXD_LIMIT_IMPORT_BYTES;
  cfg->import_streams = KEXD_LIMIT_IMPORT_STREAMS;
  cfg->download_chunk_min = KEXD_LIMIT_DOWNLOAD_CHUNK_MIN;
  cfg->max_programs = KEXD_DEFAULT_MAX_PROGRAMS;
  cfg->compile_slots = KEXD_DEFAULT_COMPILE_SLOTS;
  cfg->compile_timeout_s = KEXD_DEFAULT_COMPILE_TIMEOUT_S;
  cfg->kernel_time_limit_s = KEXD_DEFAULT_KERNEL_TIME_LIMIT_S;
  cfg->launch_quantum_s = KEXD_DEFAULT_LAUNCH_QUANTUM_S;
  cfg->max_submits_per_job = KEXD_LIMIT_SUBMITS_PER_JOB;
  cfg->max_kept_graphs = KEXD_LIMIT_KEPT_GRAPHS;
  cfg->max_kept_graph_bytes = KEXD_LIMIT_KEPT_GRAPH_BYTES;
  cfg->max_tunes_per_device = KEXD_LIMIT_TUNES_PER_DEVICE;
  cfg->max_search_queue = KEXD_LIMIT_SEARCH_QUEUE;
  cfg->max_search_queue_per_payer = KEXD_LIMIT_SEARCH_QUEUE_PER_PAYER;
  cfg->max_beam = KEXD_LIMIT_BEAM;
  cfg->test_fault_kind = -1;
  parse_devices(cfg, "default", KEXD_DEFAULT_DEVICES);
}

/* The default of row f as text ("" when it has none worth showing). */
static void default_text(const kexd_config *def, const flag *f, char *buf, size_t cap) {
  const char *field = (const char *)def + f->offset;
  buf[0] = '\0';
  switch (f->type) {
  case FLAG_U32: snprintf(buf, cap, "%" PRIu32, *(const uint32_t *)field); break;
  case FLAG_I64: snprintf(buf, cap, "%" PRId64, *(const int64_t *)field); break;
  case FLAG_U64: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)field); break;
  case FLAG_INT: snprintf(buf, cap, "%d", *(const int *)field); break;
  case FLAG_SECONDS: snprintf(buf, cap, "%g", *(const double *)field); break;
  case FLAG_STRING:
    if (*(const char *const *)field) snprintf(buf, cap, "%s", *(const char *const *)field);
    break;
  case FLAG_DEVICES: snprintf(buf, cap, "%s", KEXD_DEFAULT_DEVICES); break;
  default: break;
  }
}

void kexd_config_usage(FILE *out) {
  kexd_config def;
  char env[64], dflt[64], left[64];
  kexd_config_defaults(&def);
  fprintf(out, "usage: kexd [options]\n\nEvery option is also an environment variable (shown in brackets); an option "
               "wins over the environment.\n");
  for (size_t i = 0; i < NFLAGS; i++) {
    const flag *f = &flags[i];
    if (f->section) fprintf(out, "\n%s%s:\n", f->section, f->test_only ? " (TESTS ONLY: never in production)" : "");
    snprintf(left, sizeof left, "--%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
    fprintf(out, "  %-28s %s", left, f->help);
    default_text(&def, f, dflt, sizeof dflt);
    if (f->type != FLAG_HELP && f->type != FLAG_BOOL && f->type != FLAG_FAULT && f->offset != F(cache_path) &&
        f->type != FLAG_LOG && f->type != FLAG_LOG_FORMAT && f->type != FLAG_VERSION && dflt[0])
      fprintf(out, " (default %s)", dflt);
    if (!f->test_only && f->type != FLAG_HELP && f->type != FLAG_VERSION && f->type != FLAG_BOOL) {
      env_name(f, env, sizeof env);
      fprintf(out, " [%s]", env);
    }
    fputc('\n', out);
  }
  fprintf(out, "\nexit codes: 0 after a clean stop (SIGTERM/SIGINT), 1 cannot start, 2 bad flags\n");
}

/*
 * True when --listen ADDR can only be reached from this machine: a unix:
 * socket, localhost, 127.0.0.0/8 or [::1] (gRPC's "ipv4:", "ipv6:" and
 * "dns:" prefixes allowed).  Everything else (0.0.0.0, [::], other names
 * and addresses) is open.
 */
static bool listen_is_loopback(const char *addr) {
  char host[256];
  const char *end;
  size_t n;
  if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0) return true;
  if (strncmp(addr, "ipv4:", 5) == 0 || strncmp(addr, "ipv6:", 5) == 0) addr += 5;
  else if (strncmp(addr, "dns:", 4) == 0) addr += 4;
  if (strncmp(addr, "///", 3) == 0) addr += 3;
  if (*addr == '[') {
    end = strchr(addr, ']');
    if (!end) return false;
    addr++;
  } else {
    end = strrchr(addr, ':');
    if (!end) end = addr + strlen(addr);
  }
  n = (size_t)(end - addr);
  if (n >= sizeof host) return false;
  memcpy(host, addr, n);
  host[n] = '\0';
  if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) return true;
  return strncmp(host, "127.", 4) == 0 && strspn(host, "0123456789.") == n;
}

/* $XDG_CACHE_HOME/kex/cache.db, else $HOME/.cache/kex/cache.db (kex_malloc'd; NULL on OOM). */
static char *default_cache_path(void) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char buf[PATH_MAX];
  if (xdg && *xdg) snprintf(buf, sizeof buf, "%s/kex/cache.db", xdg);
  else snprintf(buf, sizeof buf, "%s/.cache/kex/cache.db", home && *home ? home : ".");
  return kex_strdup(buf);
}

int kexd_config_parse(kexd_config *cfg, int argc, char **argv) {
  struct option opts[NFLAGS + 1];
  char env[64], what[80];
  const char *cache;
  int c, idx, rc;
  kexd_config_defaults(cfg);
  memset(opts, 0, sizeof opts);
  for (size_t i = 0; i < NFLAGS; i++) {
    opts[i].name = flags[i].name;
    opts[i].has_arg = flags[i].arg ? required_argument : no_argument;
    opts[i].val = 256 + (int)i;
  }
  for (size_t i = 0; i < NFLAGS; i++) { /* the environment first */
    const char *v;
    if (flags[i].test_only || flags[i].type == FLAG_HELP || flags[i].type == FLAG_BOOL ||
        flags[i].type == FLAG_VERSION)
      continue;
    env_name(&flags[i], env, sizeof env);
    if ((v = getenv(env)) && *v && flag_set(cfg, &flags[i], env, v) < 0) return -1;
  }
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    if (c == 'h') {
      kexd_config_usage(stdout);
      return 1;
    }
    if (c < 256 || c >= 256 + (int)NFLAGS) {
      kexd_config_usage(stderr);
      return -1;
    }
    snprintf(what, sizeof what, "--%s", flags[c - 256].name);
    if ((rc = flag_set(cfg, &flags[c - 256], what, optarg ? optarg : "")) != 0) {
      if (rc == 2) printf("kexd %s\n", KEX_VERSION);
      else if (rc > 0) kexd_config_usage(stdout);
      return rc > 0 ? 1 : rc;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kexd: unexpected argument \"%s\"\n", argv[optind]);
    kexd_config_usage(stderr);
    return -1;
  }
  if (cfg->fleet_cache) {
    kexd_fleet_url u;
    kex_error ferr = {0};
    if (kexd_fleet_parse_url(cfg->fleet_cache, &u, &ferr)) {
      fprintf(stderr, "kexd: --fleet-cache (KEX_FLEET_CACHE): %s\n", ferr.msg);
      return -1;
    }
  }
  if (!cfg->tls_cert != !cfg->tls_key) {
    fprintf(stderr, "kexd: --tls-cert and --tls-key (KEX_TLS_CERT, KEX_TLS_KEY) go together: %s is missing\n",
            cfg->tls_cert ? "--tls-key" : "--tls-cert");
    return -1;
  }
  if (cfg->tls_client_ca && !cfg->tls_cert) {
    fprintf(stderr, "kexd: --tls-client-ca needs --tls-cert and --tls-key\n");
    return -1;
  }
  if (!cfg->insecure && !listen_is_loopback(cfg->listen) && (!cfg->auth || !cfg->tls_cert)) {
    fprintf(stderr,
            "kexd: refusing to listen on %s: it is not a loopback address, and without %s anyone who reaches it "
            "could %s; give --auth FILE and --tls-cert/--tls-key, listen on 127.0.0.1 or a unix: socket, or pass "
            "--insecure to accept the risk\n",
            cfg->listen, !cfg->auth && !cfg->tls_cert ? "--auth and TLS" : !cfg->auth ? "--auth" : "TLS",
            !cfg->auth ? "open jobs, run kernels and delete the beam cache" : "read the tokens off the wire");
    return -1;
  }
  if (cfg->advertise && kexd_node_field_ok(cfg->advertise, KEXD_ADVERTISE_MAX) && !kexd_address_ok(cfg->advertise)) {
    fprintf(stderr, "kexd: --advertise \"%s\" is not HOST:PORT, [IPv6]:PORT (PORT 1-65535) or unix:/PATH: clients "
            "could not reach the jobs it names\n", cfg->advertise);
    return -1;
  }
  cfg->metrics_default = cfg->metrics == default_metrics;
  /* the gRPC rule for the metrics port too: it names tenants and the load; a malformed address fails at start */
  if (!cfg->insecure && strcmp(cfg->metrics, "off") != 0 && strchr(cfg->metrics, ':') &&
      !listen_is_loopback(cfg->metrics) && (!cfg->auth || !cfg->tls_cert)) {
    fprintf(stderr,
            "kexd: refusing to serve metrics on %s: it is not a loopback address, and without %s this kexd is not "
            "meant to be reached from elsewhere (the metrics name tenants and show the load); give --auth FILE and "
            "--tls-cert/--tls-key, serve them on 127.0.0.1 (or --metrics off), or pass --insecure to accept the "
            "risk\n",
            cfg->metrics, !cfg->auth && !cfg->tls_cert ? "--auth and TLS" : !cfg->auth ? "--auth" : "TLS");
    return -1;
  }
  if (!cfg->node_name) cfg->node_name = cfg->listen;
  if (!cfg->advertise) cfg->advertise = cfg->listen;
  if (!kexd_node_field_ok(cfg->node_name, KEXD_NODE_NAME_MAX) ||
      !kexd_node_field_ok(cfg->advertise, KEXD_ADVERTISE_MAX)) {
    bool name_bad = !kexd_node_field_ok(cfg->node_name, KEXD_NODE_NAME_MAX);
    fprintf(stderr, "kexd: --%s \"%s\" (default: --listen) must be 1-%d characters of A-Z a-z 0-9 . _ : / [ ] -\n",
            name_bad ? "node-name" : "advertise", name_bad ? cfg->node_name : cfg->advertise,
            name_bad ? KEXD_NODE_NAME_MAX : KEXD_ADVERTISE_MAX);
    return -1;
  }
  if (cfg->beam > cfg->max_beam) {
    fprintf(stderr, "kexd: --beam %u is more than --max-beam %u: every Submit would be refused\n", cfg->beam,
            cfg->max_beam);
    return -1;
  }
  cache = cfg->cache_path;
  cfg->cache_path = cache ? kex_strdup(cache) : default_cache_path();
  if (!cfg->cache_path) {
    fprintf(stderr, "kexd: out of memory\n");
    return -1;
  }
  return 0;
}

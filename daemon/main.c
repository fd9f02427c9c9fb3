/*
 * main.c - kexd: flags and environment, the loop, signals.
 *
 * Every setting is a flag and (for the common ones) an environment variable;
 * a flag wins over the environment.  SIGTERM and SIGINT stop the server
 * gracefully (server.c); kexd exits 0 after a clean stop, 1 when it cannot
 * start (e.g. the port is taken), 2 for bad flags.
 */
#include <errno.h>
#include <getopt.h>
#include <grpc/grpc.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/kexd.h"
#include "daemon/rpc.h"
#include "devices/device.h"
#include "search/beam.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kexd [options]\n"
          "\n"
          "  --listen ADDR          gRPC address (KEX_LISTEN; default %s; unix:/path works too)\n"
          "  --cache PATH           beam cache database (KEX_CACHE; default $XDG_CACHE_HOME/kex/cache.db,\n"
          "                         else ~/.cache/kex/cache.db)\n"
          "  --device NAME[,NAME]   devices, the first is the default (KEX_DEVICE; default %s);\n"
          "                         a name starting with \"cpu\" follows tinygrad's CLANG rules\n"
          "  --workers N            worker pool threads (KEX_WORKERS; default: libuv's, 4)\n"
          "  --lease SECONDS        a job idle this long is closed (KEX_LEASE; default %.0f)\n"
          "  --grace SECONDS        at SIGTERM, in-flight calls get this long (KEX_GRACE; default %.0f)\n"
          "  --max-message BYTES    largest gRPC message either way (KEX_MAX_MESSAGE; default %d)\n"
          "  --max-nodes N          nodes per graph (default %u)\n"
          "  --max-dims N           dims per shape (default %u, at most %d)\n"
          "  --max-elements N       elements of one node's shape (default %lld)\n"
          "  --max-inline-bytes N   inline BUFFER bytes per graph (default %lld)\n"
          "  --max-buffer-bytes N   bytes of one input buffer (default %lld)\n"
          "  --max-outputs N        outputs per graph (default %u)\n"
          "  --max-jobs N           jobs open at once (default %d)\n"
          "  --plan-inline-nodes N  graphs up to N nodes are planned on the loop thread, larger\n"
          "                         ones on the worker pool (default %d)\n"
          "  --inline-output-max N  Submit: outputs up to N bytes come back inline in the done event\n"
          "                         (KEX_INLINE_OUTPUT_MAX; default %u; a request may ask for another)\n"
          "  --schedule-cache N     Submit: graph structures whose schedule and programs are kept (default %d; 0 off)\n"
          "  --beam N               Submit's beam width when a request asks for none (KEX_BEAM; default 0 =\n"
          "                         hand-coded opts); Tune's when a request asks for none (2 when this is 0)\n"
          "  --test-busy-work       TESTS ONLY (off by default): serve /kex.v1.Kex/_BusyWork, which\n"
          "                         queues busy-CPU items on a device runner for a job\n"
          "  --test-fault KIND:N    TESTS ONLY (off by default): Submit's compile device fails its N-th\n"
          "                         call of KIND (compile, alloc, launch, copy) -- proves a compile failure is\n"
          "                         INTERNAL with the message and kexd keeps serving\n"
          "  --log LEVEL            debug, info, warn, error (KEX_LOG; default info)\n"
          "  --help                 this text\n"
          "\n"
          "exit codes: 0 after a clean stop (SIGTERM/SIGINT), 1 cannot start, 2 bad flags\n",
          KEXD_DEFAULT_LISTEN, KEXD_DEFAULT_DEVICES, KEXD_DEFAULT_LEASE_S, KEXD_DEFAULT_GRACE_S,
          KEXD_DEFAULT_MAX_MESSAGE, KEX_LIMIT_NODES, KEX_LIMIT_DIMS, KEX_MAX_DIMS, (long long)KEX_LIMIT_ELEMENTS,
          (long long)KEX_LIMIT_INLINE_BYTES, (long long)KEX_LIMIT_BUFFER_BYTES, KEX_LIMIT_OUTPUTS, KEXD_LIMIT_JOBS,
          KEXD_DEFAULT_PLAN_INLINE_NODES, KEXD_DEFAULT_INLINE_OUTPUT, KEXD_DEFAULT_SCHEDULE_CACHE);
}

/* An integer flag in [lo, hi]; -1 with a message when it is not. */
static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
  char *end;
  long long v;
  errno = 0;
  v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "kexd: %s: \"%s\" is not an integer in [%lld, %lld]\n", flag, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* A number of seconds in [lo, hi]; -1 with a message when it is not. */
static int parse_seconds(const char *flag, const char *s, double lo, double hi, double *out) {
  char *end;
  double v;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    fprintf(stderr, "kexd: %s: \"%s\" is not a number of seconds in [%g, %g]\n", flag, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* Split "a,b" into cfg->devices; -1 with a message for an empty, long or extra name. */
static int parse_devices(kexd_config *cfg, const char *s) {
  const char *p = s;
  cfg->ndevices = 0;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (n == 0 || n >= KEXD_DEVICE_NAME_MAX || cfg->ndevices == KEXD_MAX_DEVICES) {
      fprintf(stderr, "kexd: --device: \"%s\": names must be 1-%d characters, at most %d of them\n", s,
              KEXD_DEVICE_NAME_MAX - 1, KEXD_MAX_DEVICES);
      return -1;
    }
    memcpy(cfg->devices[cfg->ndevices], p, n);
    cfg->devices[cfg->ndevices++][n] = '\0';
    p = comma ? comma + 1 : p + n;
  }
  if (!cfg->ndevices) {
    fprintf(stderr, "kexd: --device: no device named\n");
    return -1;
  }
  return 0;
}

/* $XDG_CACHE_HOME/kex/cache.db, else $HOME/.cache/kex/cache.db (kex_malloc'd; NULL on OOM). */
static char *default_cache_path(void) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char buf[PATH_MAX];
  if (xdg && *xdg) snprintf(buf, sizeof buf, "%s/kex/cache.db", xdg);
  else snprintf(buf, sizeof buf, "%s/.cache/kex/cache.db", home && *home ? home : ".");
  return kex_strdup(buf);
}

enum {
  OPT_LISTEN = 256, OPT_CACHE, OPT_DEVICE, OPT_WORKERS, OPT_LEASE, OPT_GRACE, OPT_MAX_MESSAGE, OPT_MAX_NODES,
  OPT_MAX_DIMS, OPT_MAX_ELEMENTS, OPT_MAX_INLINE, OPT_MAX_BUFFER, OPT_MAX_OUTPUTS, OPT_MAX_JOBS, OPT_PLAN_INLINE,
  OPT_LOG, OPT_TEST_BUSY, OPT_HELP, OPT_INLINE_OUTPUT, OPT_SCHEDULE_CACHE, OPT_TEST_FAULT, OPT_BEAM
};

/* "compile:2" into cfg->test_fault_kind/n; -1 with a message when it is not KIND:N. */
static int parse_fault(kexd_config *cfg, const char *s) {
  const char *colon = strchr(s, ':');
  long long n;
  for (int k = 0; colon && k < KEX_FAULT_KIND_COUNT; k++) {
    const char *name = kex_fault_kind_name((kex_fault_kind)k);
    if (strlen(name) == (size_t)(colon - s) && strncmp(s, name, (size_t)(colon - s)) == 0) {
      if (parse_int("--test-fault", colon + 1, 1, INT_MAX, &n) < 0) return -1;
      cfg->test_fault_kind = k;
      cfg->test_fault_n = (unsigned long)n;
      return 0;
    }
  }
  fprintf(stderr, "kexd: --test-fault: \"%s\" is not KIND:N with KIND compile, alloc, launch or copy\n", s);
  return -1;
}

/* Fill cfg from the environment, then argv.  0, 1 for --help (exit 0), -1 for bad flags (exit 2). */
static int parse_config(kexd_config *cfg, int argc, char **argv) {
  static const struct option opts[] = {
      {"listen", required_argument, NULL, OPT_LISTEN},
      {"cache", required_argument, NULL, OPT_CACHE},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"workers", required_argument, NULL, OPT_WORKERS},
      {"lease", required_argument, NULL, OPT_LEASE},
      {"grace", required_argument, NULL, OPT_GRACE},
      {"max-message", required_argument, NULL, OPT_MAX_MESSAGE},
      {"max-nodes", required_argument, NULL, OPT_MAX_NODES},
      {"max-dims", required_argument, NULL, OPT_MAX_DIMS},
      {"max-elements", required_argument, NULL, OPT_MAX_ELEMENTS},
      {"max-inline-bytes", required_argument, NULL, OPT_MAX_INLINE},
      {"max-buffer-bytes", required_argument, NULL, OPT_MAX_BUFFER},
      {"max-outputs", required_argument, NULL, OPT_MAX_OUTPUTS},
      {"max-jobs", required_argument, NULL, OPT_MAX_JOBS},
      {"plan-inline-nodes", required_argument, NULL, OPT_PLAN_INLINE},
      {"log", required_argument, NULL, OPT_LOG},
      {"test-busy-work", no_argument, NULL, OPT_TEST_BUSY},
      {"inline-output-max", required_argument, NULL, OPT_INLINE_OUTPUT},
      {"schedule-cache", required_argument, NULL, OPT_SCHEDULE_CACHE},
      {"test-fault", required_argument, NULL, OPT_TEST_FAULT},
      {"beam", required_argument, NULL, OPT_BEAM},
      {"help", no_argument, NULL, OPT_HELP},
      {0}};
  const char *env, *cache = NULL;
  long long v;
  int c;
  memset(cfg, 0, sizeof *cfg);
  cfg->listen = KEXD_DEFAULT_LISTEN;
  cfg->lease_s = KEXD_DEFAULT_LEASE_S;
  cfg->grace_s = KEXD_DEFAULT_GRACE_S;
  cfg->max_message = KEXD_DEFAULT_MAX_MESSAGE;
  cfg->limits = KEX_LIMITS_DEFAULT;
  cfg->max_jobs = KEXD_LIMIT_JOBS;
  cfg->plan_inline_nodes = KEXD_DEFAULT_PLAN_INLINE_NODES;
  cfg->inline_output_max = KEXD_DEFAULT_INLINE_OUTPUT;
  cfg->schedule_cache = KEXD_DEFAULT_SCHEDULE_CACHE;
  cfg->test_fault_kind = -1;
  parse_devices(cfg, KEXD_DEFAULT_DEVICES);
  /* environment first, flags override */
  if ((env = getenv("KEX_LISTEN")) && *env) cfg->listen = env;
  if ((env = getenv("KEX_CACHE")) && *env) cache = env;
  if ((env = getenv("KEX_DEVICE")) && *env && parse_devices(cfg, env) < 0) return -1;
  if ((env = getenv("KEX_WORKERS")) && *env) {
    if (parse_int("KEX_WORKERS", env, 1, 1024, &v) < 0) return -1;
    cfg->workers = (uint32_t)v;
  }
  if ((env = getenv("KEX_LEASE")) && *env && parse_seconds("KEX_LEASE", env, 0.1, 1e7, &cfg->lease_s) < 0) return -1;
  if ((env = getenv("KEX_GRACE")) && *env && parse_seconds("KEX_GRACE", env, 0, 3600, &cfg->grace_s) < 0) return -1;
  if ((env = getenv("KEX_MAX_MESSAGE")) && *env) {
    if (parse_int("KEX_MAX_MESSAGE", env, 1024, INT_MAX, &v) < 0) return -1;
    cfg->max_message = (int)v;
  }
  if ((env = getenv("KEX_INLINE_OUTPUT_MAX")) && *env) {
    if (parse_int("KEX_INLINE_OUTPUT_MAX", env, 0, INT64_MAX, &v) < 0) return -1;
    cfg->inline_output_max = (uint64_t)v;
  }
  if ((env = getenv("KEX_BEAM")) && *env) {
    if (parse_int("KEX_BEAM", env, 0, KEX_BEAM_MAX_WIDTH, &v) < 0) return -1;
    cfg->beam = (uint32_t)v;
  }
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case OPT_LISTEN: cfg->listen = optarg; break;
    case OPT_CACHE: cache = optarg; break;
    case OPT_DEVICE:
      if (parse_devices(cfg, optarg) < 0) return -1;
      break;
    case OPT_WORKERS:
      if (parse_int("--workers", optarg, 1, 1024, &v) < 0) return -1;
      cfg->workers = (uint32_t)v;
      break;
    case OPT_LEASE:
      if (parse_seconds("--lease", optarg, 0.1, 1e7, &cfg->lease_s) < 0) return -1;
      break;
    case OPT_GRACE:
      if (parse_seconds("--grace", optarg, 0, 3600, &cfg->grace_s) < 0) return -1;
      break;
    case OPT_MAX_MESSAGE:
      if (parse_int("--max-message", optarg, 1024, INT_MAX, &v) < 0) return -1;
      cfg->max_message = (int)v;
      break;
    case OPT_MAX_NODES:
      if (parse_int("--max-nodes", optarg, 1, INT_MAX, &v) < 0) return -1;
      cfg->limits.max_nodes = (uint32_t)v;
      break;
    case OPT_MAX_DIMS:
      if (parse_int("--max-dims", optarg, 0, KEX_MAX_DIMS, &v) < 0) return -1;
      cfg->limits.max_dims = (uint32_t)v;
      break;
    case OPT_MAX_ELEMENTS:
      if (parse_int("--max-elements", optarg, 1, INT64_MAX, &v) < 0) return -1;
      cfg->limits.max_elements = v;
      break;
    case OPT_MAX_INLINE:
      if (parse_int("--max-inline-bytes", optarg, 0, INT64_MAX, &v) < 0) return -1;
      cfg->limits.max_inline_bytes = v;
      break;
    case OPT_MAX_BUFFER:
      if (parse_int("--max-buffer-bytes", optarg, 0, INT64_MAX, &v) < 0) return -1;
      cfg->limits.max_buffer_bytes = v;
      break;
    case OPT_MAX_OUTPUTS:
      if (parse_int("--max-outputs", optarg, 0, UINT32_MAX, &v) < 0) return -1;
      cfg->limits.max_outputs = (uint32_t)v;
      break;
    case OPT_MAX_JOBS:
      if (parse_int("--max-jobs", optarg, 1, 1 << 20, &v) < 0) return -1;
      cfg->max_jobs = (uint32_t)v;
      break;
    case OPT_PLAN_INLINE:
      if (parse_int("--plan-inline-nodes", optarg, 0, INT_MAX, &v) < 0) return -1;
      cfg->plan_inline_nodes = (uint32_t)v;
      break;
    case OPT_LOG: {
      int l = kex_log_parse_level(optarg);
      if (l < 0) {
        fprintf(stderr, "kexd: --log: \"%s\" is not debug, info, warn, error or off\n", optarg);
        return -1;
      }
      kex_log_set_level((enum kex_log_level)l);
      break;
    }
    case OPT_TEST_BUSY: cfg->test_busy_work = true; break;
    case OPT_INLINE_OUTPUT:
      if (parse_int("--inline-output-max", optarg, 0, INT64_MAX, &v) < 0) return -1;
      cfg->inline_output_max = (uint64_t)v;
      break;
    case OPT_SCHEDULE_CACHE:
      if (parse_int("--schedule-cache", optarg, 0, 1 << 20, &v) < 0) return -1;
      cfg->schedule_cache = (uint32_t)v;
      break;
    case OPT_BEAM:
      if (parse_int("--beam", optarg, 0, KEX_BEAM_MAX_WIDTH, &v) < 0) return -1;
      cfg->beam = (uint32_t)v;
      break;
    case OPT_TEST_FAULT:
      if (parse_fault(cfg, optarg) < 0) return -1;
      break;
    case OPT_HELP:
    case 'h': usage(stdout); return 1;
    default: usage(stderr); return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kexd: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    return -1;
  }
  cfg->cache_path = cache ? kex_strdup(cache) : default_cache_path();
  if (!cfg->cache_path) {
    fprintf(stderr, "kexd: out of memory\n");
    return -1;
  }
  return 0;
}

typedef struct daemon_state {
  kexd d;
  uv_signal_t sigterm, sigint;
  bool signals_open;
} daemon_state;

static void on_signal(uv_signal_t *h, int signum) {
  daemon_state *st = h->data;
  if (kexd_server_stopping(st->d.server)) {
    KEX_INFO("%s again: already stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    return;
  }
  KEX_INFO("%s: stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  kexd_server_stop(st->d.server);
}

/* Close the handles main owns; uv_run returns once every handle is closed. */
static void close_handles(daemon_state *st) {
  kexd_jobs_close(&st->d.jobs); /* cancels queued work and posts the buffers' frees ... */
  if (st->d.disp) kexd_dispatch_stop(st->d.disp, NULL, NULL); /* ... which run before the runners exit */
  kexd_tune_close(&st->d); /* every call is gone: no search routes device jobs any more */
  if (st->signals_open) {
    st->signals_open = false;
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_close((uv_handle_t *)&st->sigint, NULL);
  }
}

static void on_stopped(void *ud) { close_handles(ud); }

int main(int argc, char **argv) {
  static daemon_state st;
  kexd *d = &st.d;
  uv_loop_t loop;
  kexd_server_opts so;
  char workers[16];
  int rc, ret = 0;
  rc = parse_config(&d->cfg, argc, argv);
  if (rc) return rc > 0 ? 0 : 2;
  if (d->cfg.workers) { /* before the first uv_queue_work: libuv reads it once */
    snprintf(workers, sizeof workers, "%u", d->cfg.workers);
    setenv("UV_THREADPOOL_SIZE", workers, 1);
  }
  grpc_init();
  if (uv_loop_init(&loop) < 0) {
    KEX_ERROR("cannot create the event loop");
    grpc_shutdown();
    return 1;
  }
  d->loop = &loop;
  d->started_ms = uv_now(&loop);
  memset(&so, 0, sizeof so);
  so.listen = d->cfg.listen;
  so.max_message = d->cfg.max_message;
  so.grace_s = d->cfg.grace_s;
  so.on_stopped = on_stopped;
  so.ud = &st;
  if ((rc = kexd_server_new(&loop, &so, &d->server)) < 0) {
    KEX_ERROR("cannot create the gRPC server: %s", kex_strerror(rc));
    ret = 1;
    goto out_loop;
  }
  if ((rc = kexd_dispatch_new(&loop, (const char(*)[KEXD_DISPATCH_NAME_MAX])d->cfg.devices, d->cfg.ndevices, &d->disp)) < 0) {
    KEX_ERROR("cannot create the device dispatcher: %s", kex_strerror(rc));
    ret = 1;
    goto out_server;
  }
  if (d->cfg.test_fault_kind >= 0)
    KEX_WARN("--test-fault %s:%lu: Submit's compile device fails on purpose (a test facility; never use it in production)",
             kex_fault_kind_name((kex_fault_kind)d->cfg.test_fault_kind), d->cfg.test_fault_n);
  if (kexd_submit_init(d) < 0 || kexd_tune_init(d) < 0 || kexd_rpc_register(d) < 0 || kexd_jobs_init(&d->jobs, &loop, d->cfg.lease_s, d->cfg.max_jobs, d->disp) < 0) {
    ret = 1;
    goto out_handles;
  }
  uv_signal_init(&loop, &st.sigterm);
  uv_signal_init(&loop, &st.sigint);
  st.sigterm.data = st.sigint.data = &st;
  st.signals_open = true;
  uv_signal_start(&st.sigterm, on_signal, SIGTERM);
  uv_signal_start(&st.sigint, on_signal, SIGINT);
  if ((rc = kexd_server_start(d->server)) < 0) {
    ret = 1;
    if (kexd_server_port(d->server) == 0) goto out_handles; /* never listened: nothing is running */
    uv_run(&loop, UV_RUN_DEFAULT); /* started, then failed: kexd_server_start stopped it */
    goto out_server;
  }
  {
    char devs[KEXD_MAX_DEVICES * (KEXD_DEVICE_NAME_MAX + 1)] = "";
    for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
      if (i) strcat(devs, ",");
      strcat(devs, d->cfg.devices[i]);
    }
    KEX_INFO("kexd listening on %s (port %d); devices %s; lease %.1f s; grace %.1f s; max message %d bytes; cache %s; "
             "beam %u",
             d->cfg.listen, kexd_server_port(d->server), devs, d->cfg.lease_s, d->cfg.grace_s, d->cfg.max_message,
             d->cfg.cache_path, d->cfg.beam);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  KEX_INFO("kexd stopped");
  goto out_server;
out_handles:
  close_handles(&st);
  uv_run(&loop, UV_RUN_DEFAULT);
out_server:
  kexd_submit_free(d); /* after the runners exited: their loaded programs are freed here */
  kexd_tune_free(d);
  kexd_server_free(d->server);
  kexd_dispatch_free(d->disp);
out_loop:
  if (uv_loop_close(&loop) != 0) KEX_WARN("event loop closed with handles still open");
  grpc_shutdown();
  kex_free(d->cfg.cache_path);
  kex_free(d->device_descs);
  return ret;
}

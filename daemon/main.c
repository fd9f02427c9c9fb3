/*
 * main.c - kexd: the descriptor limit, the loop, signals.
 *
 * Settings come from config.c (one table of flags and environment
 * variables).  At start kexd raises its descriptor soft limit to the hard
 * limit, sizes --max-connections from it when not given, and installs the
 * accept guard (accept_guard.c) before gRPC accepts anything.  With
 * --tls-cert/--tls-key (and --tls-client-ca) it reads the PEM files here, so a
 * bad one stops kexd before it listens; server.c serves TLS with them.  SIGTERM and
 * SIGINT stop the server gracefully (server.c); kexd exits 0 after a clean
 * stop, 1 when it cannot start (e.g. the port is taken), 2 for bad flags.
 * --metrics serves Prometheus metrics (metrics.c) from just before the
 * gRPC server starts until it has stopped.  --workers sizes the process's
 * one worker pool (core/pool.h: requests' off-loop work, searches and
 * their candidates, the cpu device's launch helpers), set here before its
 * first use.
 * --auth loads the tenants file
 * (auth.c) before listening (a bad one stops kexd); SIGHUP reloads it on
 * the loop thread, swapping the table only when the new file is good (calls
 * in flight keep the table that admitted them).
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/accept_guard.h"
#include "daemon/auth.h"
#include "daemon/config.h"
#include "daemon/fleet.h"
#include "daemon/kexd.h"
#include "daemon/rpc.h"
#include "daemon/stream.h"
#include "daemon/work.h"
#include "realize/engine.h"
#include "devices/device.h"
#include "search/beam.h"
#include "core/pool.h"

typedef struct daemon_state {
  kexd d;
  uv_signal_t sigterm, sigint, sighup;
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
  kexd_fleet_close(&st->d); /* searches still running go local */
  kexd_metrics_stop(st->d.metrics);
  st->d.metrics = NULL;
  kexd_jobs_close(&st->d.jobs); /* cancels queued work and posts the buffers' frees ... */
  if (st->d.disp) kexd_dispatch_stop(st->d.disp, NULL, NULL); /* ... which run before the runners exit */
  kexd_streams_close(st->d.streams); /* every call is gone: no stream is written any more */
  kexd_searches_close(&st->d);       /* ... and none waits for a search slot */
  if (st->signals_open) {
    st->signals_open = false;
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_close((uv_handle_t *)&st->sigint, NULL);
    uv_close((uv_handle_t *)&st->sighup, NULL);
  }
}

/* SIGHUP: reload --auth; a bad file keeps the tenants in force. */
static void on_sighup(uv_signal_t *h, int signum) {
  daemon_state *st = h->data;
  kexd *d = &st->d;
  kexd_auth *a;
  char why[768];
  (void)signum;
  if (!d->cfg.auth) {
    KEX_INFO("SIGHUP: no --auth file to reload");
    return;
  }
  if (kexd_auth_load(d->cfg.auth, &a, why, sizeof why) < 0) {
    d->auth_reload_errors++;
    KEX_ERROR("SIGHUP: %s; keeping the %u tenants loaded before", why, d->auth->n);
    return;
  }
  kexd_auth_unref(d->auth);
  d->auth = a;
  d->auth_reloads++;
  kexd_tenant_limits_refresh(d);
  KEX_INFO("SIGHUP: --auth %s reloaded: %u tenants", d->cfg.auth, a->n);
}

static void on_stopped(void *ud) { close_handles(ud); }

/* The dispatcher's question before it posts a search's device job: is the job still open? */
static bool job_open(void *ud, uint64_t job) {
  kexd *d = ud;
  return kexd_jobs_find_id(&d->jobs, job) != NULL;
}

/*
 * Raise the descriptor soft limit to the hard limit (logged), and size
 * --max-connections from it when the flag was not given: the limit less
 * KEXD_DESCRIPTOR_RESERVE for kexd's own files, at most
 * KEXD_LIMIT_CONNECTIONS.  Then install the accept guard with that cap.
 */
static void size_connections(kexd_config *cfg) {
  struct rlimit rl;
  uint64_t soft = 1024, avail;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rlim_t old = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &rl) < 0) rl.rlim_cur = old;
    }
    soft = rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : (uint64_t)rl.rlim_cur;
    KEX_INFO("descriptors: soft limit %llu (was %llu), hard limit %llu", (unsigned long long)rl.rlim_cur,
             (unsigned long long)old, (unsigned long long)rl.rlim_max);
  }
  avail = soft > 2 * KEXD_DESCRIPTOR_RESERVE ? soft - KEXD_DESCRIPTOR_RESERVE : soft / 2;
  if (!cfg->max_connections) cfg->max_connections = (uint32_t)(avail < KEXD_LIMIT_CONNECTIONS ? avail : KEXD_LIMIT_CONNECTIONS);
  else if (cfg->max_connections > avail)
    KEX_WARN("--max-connections %u is more than the %llu descriptors left for connections: past that, connections "
             "are closed at accept (descriptor exhaustion, recovered)", cfg->max_connections, (unsigned long long)avail);
  kexd_accept_guard_init(cfg->max_connections);
}

/*
 * Read the PEM file `path` (named by `flag` in messages) into *out, a
 * NUL-terminated kex_malloc'd string the caller frees.  The file must hold a
 * "-----BEGIN <...marker>-----" block and be under KEXD_LIMIT_PEM_BYTES.
 * 0, or -1 with a message naming the flag and the file (*out NULL).
 */
static int read_pem(const char *flag, const char *path, const char *marker, char **out) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL, *p;
  size_t n = 0;
  int rc = -1;
  *out = NULL;
  if (!f) {
    KEX_ERROR("%s %s: cannot open: %s", flag, path, strerror(errno));
    goto out;
  }
  if (!(buf = kex_malloc(KEXD_LIMIT_PEM_BYTES + 1))) {
    KEX_ERROR("%s %s: out of memory", flag, path);
    goto out;
  }
  n = fread(buf, 1, KEXD_LIMIT_PEM_BYTES + 1, f);
  if (ferror(f)) {
    KEX_ERROR("%s %s: cannot read: %s", flag, path, strerror(errno));
    goto out;
  }
  if (n > KEXD_LIMIT_PEM_BYTES) {
    KEX_ERROR("%s %s: larger than %u bytes", flag, path, KEXD_LIMIT_PEM_BYTES);
    goto out;
  }
  buf[n] = '\0';
  for (p = strstr(buf, "-----BEGIN "); p; p = strstr(p + 1, "-----BEGIN ")) {
    const char *label = p + 11, *end = strstr(label, "-----");
    size_t m = strlen(marker);
    if (end && (size_t)(end - label) >= m && strncmp(end - m, marker, m) == 0) break; /* "...<marker>-----" */
  }
  if (!p || memchr(buf, '\0', n)) {
    KEX_ERROR("%s %s: not PEM (no -----BEGIN ...%s----- block)", flag, path, marker);
    goto out;
  }
  *out = buf;
  buf = NULL;
  rc = 0;
out:
  kex_free(buf);
  if (f) fclose(f);
  return rc;
}

/* The PEM texts of --tls-cert, --tls-key and --tls-client-ca (NULL when not given). */
typedef struct tls_pems {
  char *cert, *key, *client_ca;
} tls_pems;

static void tls_pems_free(tls_pems *p) {
  kex_free(p->cert);
  kex_free(p->key);
  kex_free(p->client_ca);
  *p = (tls_pems){0};
}

/* Read the TLS files the flags name.  0, or -1 (said why; nothing kept). */
static int tls_pems_read(const kexd_config *cfg, tls_pems *p) {
  *p = (tls_pems){0};
  if (cfg->tls_cert && (read_pem("--tls-cert", cfg->tls_cert, "CERTIFICATE", &p->cert) < 0 ||
                        read_pem("--tls-key", cfg->tls_key, "PRIVATE KEY", &p->key) < 0 ||
                        (cfg->tls_client_ca &&
                         read_pem("--tls-client-ca", cfg->tls_client_ca, "CERTIFICATE", &p->client_ca) < 0))) {
    tls_pems_free(p);
    return -1;
  }
  return 0;
}

/* The gRPC server's options from kexd's flags, the TLS texts and the per-call hooks of request.c. */
static void server_opts(daemon_state *st, const tls_pems *pems, kexd_server_opts *so) {
  const kexd_config *cfg = &st->d.cfg;
  memset(so, 0, sizeof *so);
  so->listen = cfg->listen;
  so->max_message = cfg->max_message;
  so->grace_s = cfg->grace_s;
  so->idle_timeout_s = cfg->idle_timeout_s;
  so->handshake_timeout_s = cfg->handshake_timeout_s;
  so->keepalive_s = cfg->keepalive_s;
  so->max_streams = (int)cfg->max_streams;
  so->tls_cert_pem = pems->cert;
  so->tls_key_pem = pems->key;
  so->tls_client_ca_pem = pems->client_ca;
  so->tls_cert_file = cfg->tls_cert;
  so->tls_key_file = cfg->tls_key;
  so->on_stopped = on_stopped;
  so->ud = st;
  so->gate = kexd_rpc_gate;
  so->on_end = kexd_rpc_call_end;
  so->call_ud = &st->d;
  so->call_ext_size = sizeof(kexd_call_info);
}

/* SIGTERM and SIGINT stop kexd gracefully, SIGHUP reloads --auth. */
static void start_signals(daemon_state *st, uv_loop_t *loop) {
  uv_signal_init(loop, &st->sigterm);
  uv_signal_init(loop, &st->sigint);
  uv_signal_init(loop, &st->sighup);
  st->sigterm.data = st->sigint.data = st->sighup.data = st;
  st->signals_open = true;
  uv_signal_start(&st->sigterm, on_signal, SIGTERM);
  uv_signal_start(&st->sigint, on_signal, SIGINT);
  uv_signal_start(&st->sighup, on_sighup, SIGHUP);
}

/* The one line that says kexd is up and how it is configured. */
static void log_listening(const kexd *d) {
  char devs[KEXD_MAX_DEVICES * (KEXD_DEVICE_NAME_MAX + 1)] = "";
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    if (i) strcat(devs, ",");
    strcat(devs, d->cfg.devices[i]);
  }
  KEX_INFO("kexd listening on %s (port %d); devices %s; lease %.1f s; grace %.1f s; max message %d bytes; cache %s; "
           "beam %u; max connections %u; max jobs %u (%u per peer); %s; metrics %s; %s",
           d->cfg.listen, kexd_server_port(d->server), devs, d->cfg.lease_s, d->cfg.grace_s, d->cfg.max_message,
           d->cfg.cache_path, d->cfg.beam, d->cfg.max_connections, d->cfg.max_jobs, d->cfg.max_jobs_per_peer,
           !d->cfg.tls_cert ? "plaintext" : d->cfg.tls_client_ca ? "TLS, client certificates required" : "TLS",
           d->cfg.metrics, d->auth ? "tokens required (--auth)" : "no tokens (no --auth)");
}

int main(int argc, char **argv) {
  static daemon_state st;
  kexd *d = &st.d;
  uv_loop_t loop;
  kexd_server_opts so;
  tls_pems pems;
  int rc, ret = 0;
  rc = kexd_config_parse(&d->cfg, argc, argv);
  if (rc) return rc > 0 ? 0 : 2;
  if (d->cfg.auth) {
    char why[768];
    if (kexd_auth_load(d->cfg.auth, &d->auth, why, sizeof why) < 0) {
      KEX_ERROR("%s", why);
      kex_free(d->cfg.cache_path);
      return 1;
    }
    KEX_INFO("--auth %s: %u tenants", d->cfg.auth, d->auth->n);
  }
  if (tls_pems_read(&d->cfg, &pems) < 0) {
    kex_free(d->cfg.cache_path);
    return 1;
  }
  size_connections(&d->cfg);
  kex_pool_process_size((int)d->cfg.workers); /* before the pool's first use */
  grpc_init();
  if (uv_loop_init(&loop) < 0) {
    KEX_ERROR("cannot create the event loop");
    grpc_shutdown();
    tls_pems_free(&pems);
    return 1;
  }
  d->loop = &loop;
  d->started_ms = uv_now(&loop);
  server_opts(&st, &pems, &so);
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
    KEX_WARN("--test-fault %s:%lu: the compile and run devices fail on purpose (a test facility; never use it in production)",
             kex_fault_kind_name((kex_fault_kind)d->cfg.test_fault_kind), d->cfg.test_fault_n);
  kexd_dispatch_set_job_check(d->disp, job_open, d);
  if ((rc = kexd_streams_new(&loop, &d->streams)) < 0) {
    KEX_ERROR("cannot create the stream writers' hub: %s", kex_strerror(rc));
    ret = 1;
    goto out_handles;
  }
  if (kexd_engines_start(d) < 0) {
    ret = 1;
    goto out_handles;
  }
  kexd_engines_targets(d); /* each device opened once to read its rules and capabilities */
  if (kexd_submit_init(d) < 0 || kexd_tune_init(d) < 0 || kexd_searches_init(d) < 0 || kexd_cache_rpc_init(d) < 0 ||
      kexd_rpc_register(d) < 0 ||
      kexd_jobs_init(&d->jobs, &loop, d->cfg.lease_s, d->cfg.max_jobs, d->disp) < 0 || kexd_fleet_start(d) < 0) {
    ret = 1;
    goto out_handles;
  }
  d->jobs.removed = kexd_search_job_removed; /* a closed job's searches waiting for a slot end with it */
  d->jobs.removed_ud = d;
  d->jobs.max_per_peer = d->cfg.max_jobs_per_peer;
  kexd_jobs_set_node(&d->jobs, d->cfg.node_name, d->cfg.advertise);
  KEX_INFO("node %s, advertised at %s: its job tokens name both, and clients of a fleet send a job's calls there",
           d->cfg.node_name, d->cfg.advertise);
  d->jobs.evict_idle_ms = (uint64_t)(d->cfg.job_evict_idle_s * 1000);
  d->jobs.max_buffers = d->cfg.max_buffers_per_job;
  start_signals(&st, &loop);
  if (strcmp(d->cfg.metrics, "off") != 0 &&
      (rc = kexd_metrics_start(d, d->cfg.metrics, d->cfg.metrics_default, &d->metrics)) < 0 &&
      !(d->cfg.metrics_default && rc == KEX_EUNAVAILABLE)) { /* the default port taken: warned, no metrics */
    ret = 1;
    goto out_handles;
  }
  rc = kexd_server_start(d->server);
  tls_pems_free(&pems); /* gRPC holds its own copies */
  if (rc < 0) {
    ret = 1;
    if (kexd_server_port(d->server) == 0) goto out_handles; /* never listened: nothing is running */
    uv_run(&loop, UV_RUN_DEFAULT); /* started, then failed: kexd_server_start stopped it */
    goto out_server;
  }
  log_listening(d);
  uv_run(&loop, UV_RUN_DEFAULT);
  KEX_INFO("kexd stopped");
  goto out_server;
out_handles:
  close_handles(&st);
  uv_run(&loop, UV_RUN_DEFAULT);
out_server:
  kexd_submit_free(d); /* after the runners exited: their loaded programs are freed here */
  kexd_tune_free(d);
  kexd_searches_free(d);
  kexd_fleet_free(d); /* every search is back */
  kexd_cache_rpc_free(d);
  kexd_engines_free(d); /* the worker threads are idle: the loop ran out */
  kexd_streams_free(d->streams);
  kexd_server_free(d->server);
  kex_free(d->rpc_routes);
  kexd_dispatch_free(d->disp);
out_loop:
  if (uv_loop_close(&loop) != 0) KEX_WARN("event loop closed with handles still open");
  grpc_shutdown();
  kex_free(d->cfg.cache_path);
  kex_free(d->device_descs);
  kexd_auth_unref(d->auth);
  tls_pems_free(&pems);
  return ret;
}

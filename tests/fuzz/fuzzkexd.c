/*
 * fuzzkexd.c - the in-process kexd of fuzzkexd.h (no server, no devices).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "codegen/target.h"
#include "core/alloc.h"
#include "core/log.h"
#include "daemon/config.h"
#include "daemon/dispatch.h"
#include "daemon/jobs.h"
#include "daemon/rpc.h"
#include "daemon/stream.h"
#include "daemon/work.h"
#include "tests/fuzz/fuzzkexd.h"

static kexd d;
static uv_loop_t loop;
static int ready;

static int stopped;

static void on_stopped(void *ud) {
  (void)ud;
  stopped = 1;
}

static void teardown(void) {
  kexd_jobs_close(&d.jobs); /* posts the buffers' frees ... */
  if (d.disp) {
    kexd_dispatch_stop(d.disp, on_stopped, NULL); /* ... which run before the runner exits */
    while (!stopped) uv_run(&loop, UV_RUN_ONCE);
  }
  if (d.streams) kexd_streams_close(d.streams); /* every call is gone: no stream is written any more */
  kexd_searches_close(&d);
  uv_run(&loop, UV_RUN_DEFAULT);
  kexd_tune_free(&d);
  kexd_searches_free(&d);
  kexd_cache_rpc_free(&d);
  kexd_engines_free(&d);
  kexd_streams_free(d.streams);
  kexd_dispatch_free(d.disp);
  uv_loop_close(&loop);
  kex_free(d.cfg.cache_path);
}

static void open_job(void) {
  kexd_job *job;
  kexd_buffer *b;
  kex_error err;
  static const int64_t shape[1] = {4};
  kexd_tenant_use *use = kexd_jobs_tenant_use(&d.jobs, KEXD_ANONYMOUS_TENANT);
  if (!use || kexd_jobs_open(&d.jobs, "fuzz", 1, d.cfg.job_memory_default, "fuzz", use, &job, &err) < 0) abort();
  if (kexd_jobs_set_token(&d.jobs, job, FUZZ_TOKEN) < 0) abort();
  if (kexd_job_add_buffer(&d.jobs, job, NULL, 0, KEX_DT_FLOAT32, shape, 1, 16, &b) < 0 ||
      kexd_job_set_handle(&d.jobs, job, b, FUZZ_HANDLE) < 0)
    abort();
}

static void setup(int serving, const char *cache_path) {
  if (!getenv("KEX_LOG")) kex_log_set_level(KEX_LOG_WARN); /* a line per refused input would be most of the time */
  kexd_config_defaults(&d.cfg);
  if (serving) {
    d.cfg.ndevices = 1;
    snprintf(d.cfg.devices[0], sizeof d.cfg.devices[0], "cpu");
    if (!(d.cfg.cache_path = kex_malloc(strlen(cache_path) + 1))) abort();
    memcpy(d.cfg.cache_path, cache_path, strlen(cache_path) + 1);
  }
  for (uint32_t i = 0; i < d.cfg.ndevices; i++) kex_target_for_name(d.cfg.devices[i], &d.targets[i]);
  if (uv_loop_init(&loop) < 0) abort();
  d.loop = &loop;
  if (serving) {
    if (kexd_dispatch_new(&loop, (const char(*)[KEXD_DISPATCH_NAME_MAX])d.cfg.devices, d.cfg.ndevices, &d.disp) < 0 ||
        kexd_streams_new(&loop, &d.streams) < 0 ||
        kexd_engines_start(&d) < 0 || kexd_tune_init(&d) < 0 || kexd_cache_rpc_init(&d) < 0)
      abort();
  }
  if (kexd_jobs_init(&d.jobs, &loop, d.cfg.lease_s, d.cfg.max_jobs, d.disp) < 0 || kexd_searches_init(&d) < 0) abort();
  kexd_jobs_set_node(&d.jobs, "fuzz", "127.0.0.1:1"); /* FUZZ_TOKEN works bare; a tail reaches the node checks */
  d.jobs.max_buffers = d.cfg.max_buffers_per_job;
  open_job();
  atexit(teardown);
  ready = 1;
}

kexd *fuzz_kexd(void) {
  if (!ready) setup(0, NULL);
  return &d;
}

kexd *fuzz_kexd_serving(const char *cache_path) {
  if (!ready) setup(1, cache_path);
  return &d;
}

void fuzz_kexd_reset_job(kexd *dp) {
  kexd_jobs_close_job(&dp->jobs, FUZZ_TOKEN);
  open_job();
}

void fuzz_kexd_run_once(kexd *dp) { uv_run(dp->loop, UV_RUN_ONCE); }

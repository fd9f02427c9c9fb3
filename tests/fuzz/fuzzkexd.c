/*
 * fuzzkexd.c - the in-process kexd of fuzzkexd.h (no server, no devices).
 */
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "codegen/target.h"
#include "core/alloc.h"
#include "daemon/config.h"
#include "daemon/jobs.h"
#include "tests/fuzz/fuzzkexd.h"

static void *pb_alloc(void *ud, size_t n) {
  (void)ud;
  return kex_malloc(n);
}

static void pb_free(void *ud, void *p) {
  (void)ud;
  kex_free(p);
}

ProtobufCAllocator fuzz_pb_allocator = {pb_alloc, pb_free, NULL};

static kexd d;
static uv_loop_t loop;
static int ready;

static void teardown(void) {
  kexd_jobs_close(&d.jobs);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

kexd *fuzz_kexd(void) {
  kexd_job *job;
  kexd_buffer *b;
  kex_error err;
  static const int64_t shape[1] = {4};
  if (ready) return &d;
  kexd_config_defaults(&d.cfg);
  for (uint32_t i = 0; i < d.cfg.ndevices; i++) kex_target_for_name(d.cfg.devices[i], &d.targets[i]);
  if (uv_loop_init(&loop) < 0) abort();
  d.loop = &loop;
  if (kexd_jobs_init(&d.jobs, &loop, d.cfg.lease_s, d.cfg.max_jobs, NULL) < 0) abort();
  if (kexd_jobs_open(&d.jobs, "fuzz", 1, d.cfg.job_memory_default, "fuzz", &job, &err) < 0) abort();
  memcpy(job->token, FUZZ_TOKEN, sizeof job->token);
  if (kexd_job_add_buffer(&d.jobs, job, NULL, 0, KEX_DT_FLOAT32, shape, 1, 16, &b) < 0) abort();
  memcpy(b->handle, FUZZ_HANDLE, sizeof b->handle);
  atexit(teardown);
  ready = 1;
  return &d;
}

/*
 * work.c - kexd's worker pool behind the engine's executor interface
 * (work.h): a kex_work keeps its uv_work_t in the executor's bytes; and
 * kexd's engines.
 */
#include "daemon/work.h"

#include <stddef.h>

#include "core/errors.h"
#include "core/log.h"
#include "daemon/kexd.h"

_Static_assert(sizeof(uv_work_t) <= KEX_WORK_PRIV, "a uv_work_t fits in kex_work.priv");

static void work_cb(uv_work_t *req) {
  kex_work *w = req->data;
  w->fn(w);
}

static void after_cb(uv_work_t *req, int status) {
  kex_work *w = req->data;
  w->after(w, status);
}

int kexd_work_submit(uv_loop_t *loop, kex_work *w) {
  uv_work_t *req = (uv_work_t *)(void *)w->priv.bytes;
  req->data = w;
  return uv_queue_work(loop, req, work_cb, after_cb) < 0 ? KEX_EUNAVAILABLE : 0;
}

static int exec_submit(void *ctx, kex_work *w) { return kexd_work_submit(ctx, w); }

kex_executor kexd_work_executor(uv_loop_t *loop) { return (kex_executor){exec_submit, loop}; }

/* The device runners' opener (dispatch.h): the engine of the device opens it. */
static int open_for_runner(void *ud, uint32_t device, kex_device **out, kex_error *err) {
  kexd *d = ud;
  if (device >= KEXD_MAX_DEVICES || !d->engines[device]) return kex_err_set(err, KEX_EUNAVAILABLE, "no such device");
  return kex_engine_open_instance(d->engines[device], out, err);
}

int kexd_engines_start(kexd *d) {
  if (kex_cache_conns_create(d->cfg.cache_path, &d->conns) < 0) return KEX_ENOMEM;
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    kex_engine_config ec = {.device = d->cfg.devices[i], .fault_kind = d->cfg.test_fault_kind,
                            .fault_n = d->cfg.test_fault_n, .compile_slots = d->cfg.compile_slots, .conns = d->conns,
                            .exec = kexd_work_executor(d->loop)};
    if (kex_engine_create(&ec, &d->engines[i]) < 0) return KEX_ENOMEM;
  }
  if (d->disp) kexd_dispatch_set_opener(d->disp, open_for_runner, d);
  return 0;
}

void kexd_engines_targets(kexd *d) {
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    kex_engine_target(d->engines[i], &d->targets[i]);
    KEX_INFO("device %s: %s rules; local memory %lld bytes, work-group %lld threads%s", d->cfg.devices[i],
             d->targets[i].rules, (long long)d->targets[i].caps.shared_max,
             (long long)d->targets[i].caps.max_local_size, d->targets[i].caps.supports_float4 ? ", float4" : "");
  }
}

void kexd_engines_free(kexd *d) {
  for (uint32_t i = 0; i < KEXD_MAX_DEVICES; i++) {
    kex_engine_free(d->engines[i]);
    d->engines[i] = NULL;
  }
  kex_cache_conns_free(d->conns);
  d->conns = NULL;
}

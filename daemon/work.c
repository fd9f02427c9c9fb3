/*
 * work.c - kexd's worker pool behind the engine's executor interface
 * (work.h): a kex_work keeps its uv_work_t in the executor's bytes.
 */
#include "daemon/work.h"

#include <stddef.h>

#include "core/errors.h"

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

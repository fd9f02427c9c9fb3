/*
 * work.c - kexd's pool work behind the engine's executor interface
 * (work.h): the work runs on the process's pool (core/pool.h) and comes
 * back to the loop through the loop bridge (bridge.h); and kexd's engines.
 */
#include "daemon/work.h"

#include <pthread.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/pool.h"
#include "daemon/bridge.h"
#include "daemon/kexd.h"

/*
 * The work of one loop.  Finished work waits in a locked list for the
 * loop; the wake that brings it there is open exactly while some work is
 * out (so the loop lives while it is, as with uv_queue_work), opened at the
 * first submit after none was out and closed when the last comes back.
 */
struct kexd_workq {
  uv_loop_t *loop;
  pthread_mutex_t mu;
  kex_work *head, *tail; /* under mu: finished, `after` not yet run */
  kexd_wake *wake;       /* under mu: open while pending > 0 */
  uint64_t pending;      /* under mu: submitted, `after` not yet run */
};

/* What a kex_work keeps in its executor bytes. */
typedef struct work_priv {
  kex_pool_job job; /* first: the pool's job is the work's priv */
  kex_work *next;
  kexd_workq *q;
} work_priv;

_Static_assert(sizeof(work_priv) <= KEX_WORK_PRIV, "kexd's work fits in kex_work.priv");

static work_priv *priv_of(kex_work *w) { return (work_priv *)(void *)w->priv.bytes; }

/* Pool thread: the work, then hand it to the loop (the wake is open: this work is pending). */
static void run_work(kex_pool_job *job, int worker) {
  (void)worker;
  kex_work *w = (kex_work *)(void *)((char *)job - offsetof(kex_work, priv));
  kexd_workq *q = priv_of(w)->q;
  w->fn(w);
  pthread_mutex_lock(&q->mu);
  priv_of(w)->next = NULL;
  if (q->tail)
    priv_of(q->tail)->next = w;
  else
    q->head = w;
  q->tail = w;
  kexd_wake_send(q->wake); /* under mu: the loop closes the wake under mu, once nothing is pending */
  pthread_mutex_unlock(&q->mu);
}

static void wake_closed(kexd_wake *wake) { kex_free(wake); }

/* Loop thread: run the `after` of everything finished; close the wake when nothing is out. */
static void on_finished(kexd_wake *wake) {
  kexd_workq *q = wake->data;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    kex_work *w = q->head;
    q->head = q->tail = NULL;
    for (kex_work *x = w; x; x = priv_of(x)->next) q->pending--;
    if (!w && q->pending == 0 && q->wake == wake) { /* nothing is out: the loop may end */
      q->wake = NULL;
      kexd_wake_close(wake, wake_closed);
    }
    pthread_mutex_unlock(&q->mu);
    if (!w) break;
    while (w) {
      kex_work *next = priv_of(w)->next;
      w->after(w, 0); /* may free w, may submit more */
      w = next;
    }
  }
}

int kexd_work_submit(kexd *d, kex_work *w) {
  kexd_workq *q = d->workq;
  if (!q) return KEX_EUNAVAILABLE;
  pthread_mutex_lock(&q->mu);
  if (!q->wake) {
    kexd_wake *wake = kex_calloc(1, sizeof *wake);
    if (!wake || kexd_wake_init(q->loop, wake, on_finished, q) < 0) {
      pthread_mutex_unlock(&q->mu);
      kex_free(wake);
      return KEX_EUNAVAILABLE;
    }
    q->wake = wake;
  }
  q->pending++;
  pthread_mutex_unlock(&q->mu);
  priv_of(w)->q = q;
  if (w->background) kex_pool_detach_background(kex_pool_process(), &priv_of(w)->job, run_work);
  else kex_pool_detach(kex_pool_process(), &priv_of(w)->job, run_work, false);
  return 0;
}

static int exec_submit(void *ctx, kex_work *w) { return kexd_work_submit(ctx, w); }

kex_executor kexd_work_executor(kexd *d) { return (kex_executor){exec_submit, d}; }

/* The device runners' opener (dispatch.h): the engine of the device opens it. */
static int open_for_runner(void *ud, uint32_t device, kex_device **out, kex_error *err) {
  kexd *d = ud;
  if (device >= KEXD_MAX_DEVICES || !d->engines[device]) return kex_err_set(err, KEX_EUNAVAILABLE, "no such device");
  return kex_engine_open_instance(d->engines[device], out, err);
}

int kexd_engines_start(kexd *d) {
  if (!(d->workq = kex_calloc(1, sizeof *d->workq))) return KEX_ENOMEM;
  d->workq->loop = d->loop;
  pthread_mutex_init(&d->workq->mu, NULL);
  if (kex_cache_conns_create(d->cfg.cache_path, &d->conns) < 0) return KEX_ENOMEM;
  for (uint32_t i = 0; i < d->cfg.ndevices; i++) {
    kex_engine_config ec = {.device = d->cfg.devices[i], .fault_kind = d->cfg.test_fault_kind,
                            .fault_n = d->cfg.test_fault_n, .compile_slots = d->cfg.compile_slots, .conns = d->conns,
                            .compile_timeout_s = d->cfg.compile_timeout_s,
                            .exec = kexd_work_executor(d)};
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
  if (d->workq) pthread_mutex_destroy(&d->workq->mu);
  kex_free(d->workq);
  d->workq = NULL;
}

/*
 * pool.c - the worker pool of pool.h: one mutex, a FIFO of intrusive jobs,
 * one condition variable for "work queued" and one for "a job finished".
 */
#include "search/pool.h"

#include <pthread.h>
#include <unistd.h>

#include "core/alloc.h"

struct kex_pool {
  pthread_mutex_t mu;
  pthread_cond_t work, finished;
  kex_pool_job *head, *tail;
  int nthreads, stopping;
  pthread_t threads[KEX_POOL_MAX_THREADS];
  int ids[KEX_POOL_MAX_THREADS];
};

typedef struct worker_arg {
  kex_pool *pool;
  int id;
} worker_arg;

static void *worker_main(void *arg) {
  kex_pool *p = ((worker_arg *)arg)->pool;
  int id = ((worker_arg *)arg)->id;
  kex_free(arg);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->head && !p->stopping) pthread_cond_wait(&p->work, &p->mu);
    if (!p->head) break; /* stopping and drained */
    kex_pool_job *j = p->head;
    p->head = j->next;
    if (!p->head) p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    j->fn(j, id);
    pthread_mutex_lock(&p->mu);
    j->done = 1;
    pthread_cond_broadcast(&p->finished);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int kex_pool_create(int nthreads, kex_pool **out, kex_error *err) {
  *out = NULL;
  if (nthreads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    nthreads = n > 0 ? (int)n : 1;
  }
  if (nthreads > KEX_POOL_MAX_THREADS) nthreads = KEX_POOL_MAX_THREADS;
  kex_pool *p = kex_calloc(1, sizeof *p);
  if (!p) return kex_err_set(err, KEX_ENOMEM, "out of memory creating a worker pool");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->finished, NULL);
  int rc = 0;
  for (int i = 0; i < nthreads; i++) {
    worker_arg *a = kex_malloc(sizeof *a);
    if (!a) {
      rc = kex_err_set(err, KEX_ENOMEM, "out of memory starting pool worker %d", i);
      break;
    }
    a->pool = p;
    a->id = i;
    if (pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
      kex_free(a);
      rc = kex_err_set(err, KEX_EINTERNAL, "pthread_create failed for pool worker %d", i);
      break;
    }
    p->nthreads++;
  }
  if (rc) {
    kex_pool_destroy(p);
    return rc;
  }
  *out = p;
  return 0;
}

int kex_pool_size(const kex_pool *p) { return p->nthreads; }

void kex_pool_submit(kex_pool *p, kex_pool_job *job, kex_pool_fn fn) {
  job->fn = fn;
  job->next = NULL;
  job->done = 0;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = job;
  else
    p->head = job;
  p->tail = job;
  pthread_cond_signal(&p->work);
  pthread_mutex_unlock(&p->mu);
}

void kex_pool_wait(kex_pool *p, kex_pool_job *job) {
  pthread_mutex_lock(&p->mu);
  while (!job->done) pthread_cond_wait(&p->finished, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void kex_pool_destroy(kex_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->finished);
  pthread_mutex_destroy(&p->mu);
  kex_free(p);
}

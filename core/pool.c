/*
 * pool.c - the worker pool of pool.h: one mutex, two FIFOs of intrusive
 * jobs (the foreground lane, and the background lane a worker takes from
 * only when the foreground one is empty), one condition variable for "work
 * queued" and one for "a job finished".
 */
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

/* One lane of queued jobs, in submission order (a front job at its head). */
typedef struct lane {
  kex_pool_job *head, *tail;
} lane;

struct kex_pool {
  pthread_mutex_t mu;
  pthread_cond_t work, finished;
  lane fg, bg; /* under mu: foreground jobs; background jobs, taken only while fg is empty */
  int nthreads, stopping;
  pthread_t threads[KEX_POOL_MAX_THREADS];
  /* stand-ins (kex_pool_block), under mu */
  int blocked, standins;
  bool standin_used[KEX_POOL_MAX_STANDINS];
  pthread_cond_t standin_gone;
};

typedef struct worker_arg {
  kex_pool *pool;
  int id;
} worker_arg;

/* The pool whose worker this thread is, and its index there. */
static _Thread_local const kex_pool *self_pool;
static _Thread_local int self_id = -1;

int kex_pool_self(const kex_pool *p) { return p && self_pool == p ? self_id : -1; }

/* Under mu: run j (taken off the queue) on this thread as worker id, then mark it done. */
static void run_job(kex_pool *p, kex_pool_job *j, int id) {
  bool detached = j->detached;
  pthread_mutex_unlock(&p->mu);
  j->fn(j, id);
  pthread_mutex_lock(&p->mu);
  if (!detached) {
    j->done = 1;
    pthread_cond_broadcast(&p->finished);
  }
}

/* A new thread of p as worker `id` (its argument freed): the pool locked, for its loop. */
static kex_pool *thread_start(void *arg, int *id) {
  kex_pool *p = ((worker_arg *)arg)->pool;
  *id = ((worker_arg *)arg)->id;
  kex_free(arg);
  self_pool = p;
  self_id = *id;
  pthread_mutex_lock(&p->mu);
  return p;
}

/* Under mu: whether any job is queued, in either lane. */
static bool queued(const kex_pool *p) { return p->fg.head || p->bg.head; }

/* Under mu: take the next job (the foreground lane's head, else the background lane's) and run it as worker id. */
static void run_head(kex_pool *p, int id) {
  lane *l = p->fg.head ? &p->fg : &p->bg;
  kex_pool_job *j = l->head;
  l->head = j->next;
  if (!l->head) l->tail = NULL;
  run_job(p, j, id);
}

static void *worker_main(void *arg) {
  int id;
  kex_pool *p = thread_start(arg, &id);
  for (;;) {
    while (!queued(p) && !p->stopping) pthread_cond_wait(&p->work, &p->mu);
    if (!queued(p)) break; /* stopping and drained */
    run_head(p, id);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* The CPUs this process may run on (at least 1). */
static int allowed_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int kex_pool_create(int nthreads, kex_pool **out, kex_error *err) {
  *out = NULL;
  if (nthreads <= 0) nthreads = allowed_cpus();
  if (nthreads > KEX_POOL_MAX_THREADS) nthreads = KEX_POOL_MAX_THREADS;
  kex_pool *p = kex_calloc(1, sizeof *p);
  if (!p) return kex_err_set(err, KEX_ENOMEM, "out of memory creating a worker pool");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->finished, NULL);
  pthread_cond_init(&p->standin_gone, NULL);
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
int kex_pool_ids(const kex_pool *p) { return p->nthreads + KEX_POOL_MAX_STANDINS; }

/* A stand-in: a worker while more workers are blocked than stand-ins run; then it leaves. */
static void *standin_main(void *arg) {
  int id;
  kex_pool *p = thread_start(arg, &id);
  for (;;) {
    if (p->standins > p->blocked || (p->stopping && !queued(p))) break;
    if (!queued(p))
      pthread_cond_wait(&p->work, &p->mu);
    else
      run_head(p, id);
  }
  p->standins--;
  p->standin_used[id - p->nthreads] = false;
  pthread_cond_broadcast(&p->standin_gone);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

bool kex_pool_block(kex_pool *p) {
  if (kex_pool_self(p) < 0) return false;
  pthread_mutex_lock(&p->mu);
  p->blocked++;
  int i = 0;
  while (i < KEX_POOL_MAX_STANDINS && p->standin_used[i]) i++;
  worker_arg *a = p->standins < p->blocked && i < KEX_POOL_MAX_STANDINS ? kex_malloc(sizeof *a) : NULL;
  if (a) {
    pthread_t t;
    pthread_attr_t attr;
    *a = (worker_arg){p, p->nthreads + i};
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, standin_main, a) == 0) {
      p->standin_used[i] = true;
      p->standins++;
    } else {
      kex_free(a);
      KEX_WARN("worker pool: cannot start a stand-in for a blocked worker: the wait holds it");
    }
    pthread_attr_destroy(&attr);
  }
  pthread_mutex_unlock(&p->mu);
  return true;
}

void kex_pool_unblock(kex_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->blocked--;
  pthread_cond_broadcast(&p->work); /* an idle stand-in too many leaves now, a busy one after its job */
  pthread_mutex_unlock(&p->mu);
}

static void enqueue(kex_pool *p, kex_pool_job *job, kex_pool_fn fn, bool front, bool detached, bool background) {
  pthread_mutex_lock(&p->mu);
  lane *l = background ? &p->bg : &p->fg;
  job->fn = fn;
  job->next = NULL;
  job->done = 0;
  job->detached = detached;
  job->background = background;
  if (front) {
    job->next = l->head;
    l->head = job;
    if (!l->tail) l->tail = job;
  } else {
    if (l->tail)
      l->tail->next = job;
    else
      l->head = job;
    l->tail = job;
  }
  pthread_cond_signal(&p->work);
  pthread_mutex_unlock(&p->mu);
}

void kex_pool_submit(kex_pool *p, kex_pool_job *job, kex_pool_fn fn) { enqueue(p, job, fn, false, false, false); }
void kex_pool_submit_front(kex_pool *p, kex_pool_job *job, kex_pool_fn fn) { enqueue(p, job, fn, true, false, false); }
void kex_pool_submit_background(kex_pool *p, kex_pool_job *job, kex_pool_fn fn) {
  enqueue(p, job, fn, false, false, true);
}
void kex_pool_detach(kex_pool *p, kex_pool_job *job, kex_pool_fn fn, bool front) {
  enqueue(p, job, fn, front, true, false);
}
void kex_pool_detach_background(kex_pool *p, kex_pool_job *job, kex_pool_fn fn) {
  enqueue(p, job, fn, false, true, true);
}

/* Under mu: take job off its lane; false when it is not queued. */
static bool unqueue(kex_pool *p, kex_pool_job *job) {
  lane *l = job->background ? &p->bg : &p->fg;
  kex_pool_job *prev = NULL;
  for (kex_pool_job *j = l->head; j; prev = j, j = j->next) {
    if (j != job) continue;
    if (prev)
      prev->next = j->next;
    else
      l->head = j->next;
    if (l->tail == j) l->tail = prev;
    j->next = NULL;
    return true;
  }
  return false;
}

void kex_pool_wait(kex_pool *p, kex_pool_job *job) {
  int me = kex_pool_self(p);
  pthread_mutex_lock(&p->mu);
  /* a worker does not sleep on a job nobody has started: it runs it (its own index is free: it is here) */
  if (!job->done && me >= 0 && unqueue(p, job)) run_job(p, job, me);
  while (!job->done) pthread_cond_wait(&p->finished, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

bool kex_pool_cancel(kex_pool *p, kex_pool_job *job) {
  pthread_mutex_lock(&p->mu);
  bool taken = unqueue(p, job);
  if (taken) {
    job->done = 1;
    pthread_cond_broadcast(&p->finished);
  }
  pthread_mutex_unlock(&p->mu);
  return taken;
}

void kex_pool_destroy(kex_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_lock(&p->mu);
  while (p->standins > 0) pthread_cond_wait(&p->standin_gone, &p->mu);
  pthread_mutex_unlock(&p->mu);
  pthread_cond_destroy(&p->standin_gone);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->finished);
  pthread_mutex_destroy(&p->mu);
  kex_free(p);
}

/* ---- the process's pool ---- */

static pthread_mutex_t process_mu = PTHREAD_MUTEX_INITIALIZER;
static kex_pool *process_pool;
static int process_threads;

bool kex_pool_process_size(int nthreads) {
  pthread_mutex_lock(&process_mu);
  bool ok = !process_pool;
  if (ok) process_threads = nthreads;
  pthread_mutex_unlock(&process_mu);
  return ok;
}

kex_pool *kex_pool_process(void) {
  pthread_mutex_lock(&process_mu);
  if (!process_pool) {
    int n = process_threads;
    if (n <= 0) n = allowed_cpus() > KEX_POOL_MIN_PROCESS_THREADS ? allowed_cpus() : KEX_POOL_MIN_PROCESS_THREADS;
    kex_error err = {0};
    if (kex_pool_create(n, &process_pool, &err) < 0) {
      KEX_ERROR("cannot start the worker pool: %s", err.msg);
      abort();
    }
  }
  kex_pool *p = process_pool;
  pthread_mutex_unlock(&process_mu);
  return p;
}

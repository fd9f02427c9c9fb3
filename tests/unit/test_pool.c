/*
 * test_pool.c - unit tests for core/pool.h, the process's one worker pool:
 * FIFO order, a job submitted to the front, the background lane (a
 * queued foreground job overtakes queued background ones, which still
 * run, in order, and can be cancelled), a worker that waits for a queued
 * job runs it itself (nested waits on a one-thread pool end; a background
 * job waited for goes ahead of queued foreground work), cancel, detached
 * jobs, worker indexes, and the process pool's size.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"

/* Where jobs write their values in the order they ran. */
typedef struct logbook {
  pthread_mutex_t mu;
  int v[16], n;
} logbook;

typedef struct item {
  kex_pool_job job; /* first */
  int value;
  logbook *book;    /* where the job writes value when it runs */
  int worker;
} item;

static void record(kex_pool_job *job, int worker) {
  item *it = (item *)job;
  it->worker = worker;
  pthread_mutex_lock(&it->book->mu);
  it->book->v[it->book->n++] = it->value;
  pthread_mutex_unlock(&it->book->mu);
}

/* A job that holds the only worker until `release` is set. */
typedef struct gate {
  kex_pool_job job;
  atomic_int started, release;
} gate;

static void hold(kex_pool_job *job, int worker) {
  (void)worker;
  gate *g = (gate *)job;
  atomic_store(&g->started, 1);
  while (!atomic_load(&g->release)) {
  }
}

/* Occupy p's only worker with g until g.release is set. */
static void hold_worker(kex_pool *p, gate *g) {
  kex_pool_submit(p, &g->job, hold);
  while (!atomic_load(&g->started)) {
  }
}

static kex_pool *one_thread(void) {
  kex_pool *p = NULL;
  kex_error err = {0};
  assert_int_equal(kex_pool_create(1, &p, &err), 0);
  assert_int_equal(kex_pool_size(p), 1);
  return p;
}

/* Jobs queued behind a busy worker run in submission order, a front job first. */
static void test_fifo_and_front(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  logbook lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
  gate g = {0};
  hold_worker(p, &g);
  item it[4];
  for (int i = 0; i < 4; i++) it[i] = (item){.value = i, .book = &lb, .worker = -1};
  kex_pool_submit(p, &it[0].job, record);
  kex_pool_submit(p, &it[1].job, record);
  kex_pool_submit(p, &it[2].job, record);
  kex_pool_submit_front(p, &it[3].job, record);
  atomic_store(&g.release, 1);
  for (int i = 0; i < 4; i++) kex_pool_wait(p, &it[i].job);
  kex_pool_wait(p, &g.job);
  assert_int_equal(lb.n, 4);
  int want[4] = {3, 0, 1, 2};
  assert_memory_equal(lb.v, want, sizeof want);
  for (int i = 0; i < 4; i++) assert_int_equal(it[i].worker, 0);
  kex_pool_destroy(p);
}

/*
 * Background jobs queued behind a busy worker run after every foreground job queued before or after them,
 * in their own submission order; a background job can be cancelled like any other.
 */
static void test_background_lane(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  logbook lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
  gate g = {0};
  hold_worker(p, &g);
  item it[7];
  for (int i = 0; i < 7; i++) it[i] = (item){.value = i, .book = &lb, .worker = -1};
  kex_pool_submit_background(p, &it[0].job, record);
  kex_pool_submit_background(p, &it[1].job, record);
  kex_pool_submit(p, &it[2].job, record);
  kex_pool_submit_background(p, &it[3].job, record);
  kex_pool_submit(p, &it[4].job, record);
  kex_pool_submit_front(p, &it[5].job, record);
  kex_pool_submit_background(p, &it[6].job, record);
  assert_true(kex_pool_cancel(p, &it[3].job));
  atomic_store(&g.release, 1);
  for (int i = 0; i < 7; i++) kex_pool_wait(p, &it[i].job);
  kex_pool_wait(p, &g.job);
  int want[6] = {5, 2, 4, 0, 1, 6};
  assert_int_equal(lb.n, 6);
  assert_memory_equal(lb.v, want, sizeof want);
  kex_pool_destroy(p);
}

/*
 * A worker that waits for its own background job while foreground jobs are queued (a search's candidate while
 * other calls' work waits) runs it at once itself: the wait neither deadlocks on a one-thread pool nor waits for
 * the foreground queue to drain.
 */
typedef struct searcher {
  kex_pool_job job;
  kex_pool *p;
  atomic_int fg_queued;
  item cand[3];
} searcher;

static void search_like(kex_pool_job *job, int worker) {
  searcher *s = (searcher *)job;
  (void)worker;
  while (!atomic_load(&s->fg_queued)) {
  }
  for (int i = 0; i < 3; i++) kex_pool_submit_background(s->p, &s->cand[i].job, record);
  for (int i = 0; i < 3; i++) kex_pool_wait(s->p, &s->cand[i].job);
}

static void test_wait_background_busy(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  logbook lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
  searcher s = {.p = p};
  item fg[4];
  for (int i = 0; i < 3; i++) s.cand[i] = (item){.value = 10 + i, .book = &lb, .worker = -1};
  for (int i = 0; i < 4; i++) fg[i] = (item){.value = i, .book = &lb, .worker = -1};
  kex_pool_submit(p, &s.job, search_like);
  for (int i = 0; i < 4; i++) kex_pool_submit(p, &fg[i].job, record);
  atomic_store(&s.fg_queued, 1);
  kex_pool_wait(p, &s.job);
  for (int i = 0; i < 4; i++) kex_pool_wait(p, &fg[i].job);
  int want[7] = {10, 11, 12, 0, 1, 2, 3};
  assert_int_equal(lb.n, 7);
  assert_memory_equal(lb.v, want, sizeof want);
  for (int i = 0; i < 3; i++) assert_int_equal(s.cand[i].worker, 0);
  kex_pool_destroy(p);
}

/* A job that waits for another job on a one-thread pool: the worker runs the awaited one itself. */
typedef struct nest {
  kex_pool_job job;
  kex_pool *p;
  item inner;
  int depth;
  struct nest *child;
  int self_seen;
} nest;

static void nested(kex_pool_job *job, int worker) {
  nest *n = (nest *)job;
  n->self_seen = kex_pool_self(n->p);
  assert_int_equal(n->self_seen, worker);
  kex_pool_submit(n->p, &n->inner.job, record);
  if (n->child) kex_pool_submit(n->p, &n->child->job, nested);
  kex_pool_wait(n->p, &n->inner.job);
  if (n->child) kex_pool_wait(n->p, &n->child->job);
}

static void test_nested_wait_one_thread(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  logbook lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
  nest n[3];
  memset(n, 0, sizeof n);
  for (int i = 0; i < 3; i++) {
    n[i].p = p;
    n[i].inner = (item){.value = 10 + i, .book = &lb};
    n[i].child = i < 2 ? &n[i + 1] : NULL;
  }
  kex_pool_submit(p, &n[0].job, nested);
  kex_pool_wait(p, &n[0].job); /* not a worker: sleeps until the worker is done */
  assert_int_equal(lb.n, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(n[i].self_seen, 0);
  assert_int_equal(kex_pool_self(p), -1);
  kex_pool_destroy(p);
}

/* Cancel takes a queued job off the queue (it never runs); a finished one cannot be cancelled. */
static void test_cancel(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  logbook lb = {.mu = PTHREAD_MUTEX_INITIALIZER};
  gate g = {0};
  hold_worker(p, &g);
  item a = {.value = 1, .book = &lb}, b = {.value = 2, .book = &lb};
  kex_pool_submit(p, &a.job, record);
  kex_pool_submit(p, &b.job, record);
  assert_true(kex_pool_cancel(p, &a.job));
  assert_false(kex_pool_cancel(p, &g.job)); /* running */
  kex_pool_wait(p, &a.job);                 /* a cancelled job counts as finished */
  atomic_store(&g.release, 1);
  kex_pool_wait(p, &b.job);
  assert_false(kex_pool_cancel(p, &b.job));
  assert_int_equal(lb.n, 1);
  assert_int_equal(lb.v[0], 2);
  kex_pool_destroy(p);
}

/* A detached job may end its own life: the pool does not touch it once it started. */
typedef struct detached {
  kex_pool_job job;
  atomic_int *count;
} detached;

static void free_self(kex_pool_job *job, int worker) {
  (void)worker;
  detached *d = (detached *)job;
  atomic_int *count = d->count;
  memset(d, 0xA5, sizeof *d); /* what a free would leave: the pool must not read or write it after this */
  atomic_fetch_add(count, 1);
}

static void test_detached(void **state) {
  (void)state;
  kex_pool *p = NULL;
  kex_error err = {0};
  assert_int_equal(kex_pool_create(3, &p, &err), 0);
  atomic_int count = 0;
  detached d[64];
  for (int i = 0; i < 64; i++) {
    d[i].count = &count;
    kex_pool_detach(p, &d[i].job, free_self, i % 2 == 0);
  }
  kex_pool_destroy(p); /* drains the queue */
  assert_int_equal(atomic_load(&count), 64);
}

/* A worker blocked on something outside the pool (kex_pool_block): a stand-in runs the queue meanwhile. */
typedef struct blocker {
  kex_pool_job job;
  kex_pool *p;
  atomic_int *flag;
  int counted, saw_flag;
} blocker;

typedef struct setter {
  kex_pool_job job;
  atomic_int *flag;
  int worker;
} setter;

static void wait_outside(kex_pool_job *job, int worker) {
  (void)worker;
  blocker *b = (blocker *)job;
  b->counted = kex_pool_block(b->p);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do { /* at most 5 s: without a stand-in the setter never runs (the only worker is here) */
    if (atomic_load(b->flag)) break;
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 < 5.0);
  b->saw_flag = atomic_load(b->flag);
  if (b->counted) kex_pool_unblock(b->p);
}

static void set_flag(kex_pool_job *job, int worker) {
  setter *st = (setter *)job;
  st->worker = worker;
  atomic_store(st->flag, 1);
}

static void test_block_stand_in(void **state) {
  (void)state;
  kex_pool *p = one_thread();
  assert_int_equal(kex_pool_ids(p), 1 + KEX_POOL_MAX_STANDINS);
  assert_false(kex_pool_block(p)); /* not a worker of p: nothing counted */
  atomic_int flag = 0;
  blocker b = {.p = p, .flag = &flag};
  setter st = {.flag = &flag, .worker = -1};
  kex_pool_submit(p, &b.job, wait_outside);
  kex_pool_submit(p, &st.job, set_flag);
  kex_pool_wait(p, &b.job);
  kex_pool_wait(p, &st.job);
  assert_true(b.counted);
  assert_true(b.saw_flag);
  assert_int_equal(st.worker, 1); /* the stand-in's own index, past the workers' */
  kex_pool_destroy(p);            /* waits for the stand-in to leave */
}

/* The process pool's size is settable before its first use only. */
static void test_process_pool(void **state) {
  (void)state;
  assert_true(kex_pool_process_size(3));
  kex_pool *p = kex_pool_process();
  assert_non_null(p);
  assert_ptr_equal(kex_pool_process(), p);
  assert_int_equal(kex_pool_size(p), 3);
  assert_false(kex_pool_process_size(5));
  assert_int_equal(kex_pool_size(kex_pool_process()), 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fifo_and_front), cmocka_unit_test(test_background_lane),
      cmocka_unit_test(test_wait_background_busy), cmocka_unit_test(test_nested_wait_one_thread),
      cmocka_unit_test(test_cancel),         cmocka_unit_test(test_detached),
      cmocka_unit_test(test_block_stand_in), cmocka_unit_test(test_process_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

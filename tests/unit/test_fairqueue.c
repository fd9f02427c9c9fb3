/*
 * test_fairqueue.c - the weighted fair queue in front of each device
 * (daemon/dispatch.c), with a real runner thread on a "cpu" device.
 *
 * Each item here reports the device time it "used" (a fixed number, so the
 * checks read the queue's own accounting, never a clock).  A gate item of
 * a job of its own holds the runner while a test queues everything, so the
 * order the runner picks in is the queue's alone.  Checked: two saturating
 * jobs of weights 1 and 3 share the device's time 1:3 at every point of
 * the run, within the one item a virtual-time queue may be ahead (the
 * largest item's time over its job's weight); a job's items run in the
 * order posted, singly or as chains; a job that was idle while another ran
 * starts level with it instead of running alone on banked credit; a
 * cancelled job's queued items end KEX_ECANCELLED without running, except
 * its must_run ones; each job's counters add up what its items reported;
 * bad posts are refused with done never called.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/log.h"
#include "daemon/dispatch.h"

#define MAX_ITEMS 512
#define GATE_JOB 99

typedef struct item {
  kexd_work w;
  uint32_t seq;  /* its place among its job's items, in posting order */
  double cost;   /* the device time it reports (seconds) */
  bool done;
} item;

/* What the runner ran, in order (the runner thread writes it; the test reads it once every done has run). */
typedef struct ran_item {
  uint64_t job;
  uint32_t seq;
  double cost;
} ran_item;

static struct {
  uv_loop_t loop;
  kexd_dispatch *disp;
  item items[MAX_ITEMS];
  uint32_t nitems, ndone;
  ran_item ran[MAX_ITEMS];
  uint32_t nran;
  pthread_mutex_t gate_lock;
  pthread_cond_t gate_cv;
  bool gate_started, gate_open;
  bool stopped;
} fx;

static int open_cpu(void *ud, uint32_t index, kex_device **out, kex_error *err) {
  (void)ud, (void)index;
  return kex_device_open("cpu", out, err);
}

static int run_item(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  item *it = arg;
  (void)dev, (void)err;
  fx.ran[fx.nran++] = (ran_item){it->w.job, it->seq, it->cost};
  *device_s = it->cost;
  return 0;
}

/* Holds the runner until gate_release. */
static int run_gate(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  (void)dev, (void)arg, (void)err;
  pthread_mutex_lock(&fx.gate_lock);
  fx.gate_started = true;
  pthread_cond_broadcast(&fx.gate_cv);
  while (!fx.gate_open) pthread_cond_wait(&fx.gate_cv, &fx.gate_lock);
  pthread_mutex_unlock(&fx.gate_lock);
  *device_s = 0;
  return 0;
}

static void on_done(kexd_work *w) {
  ((item *)w->ud)->done = true;
  fx.ndone++;
}

static void on_stopped(void *ud) {
  (void)ud;
  fx.stopped = true;
}

static int setup(void **state) {
  static const char names[1][KEXD_DISPATCH_NAME_MAX] = {"cpu"};
  (void)state;
  memset(&fx, 0, sizeof fx);
  pthread_mutex_init(&fx.gate_lock, NULL);
  pthread_cond_init(&fx.gate_cv, NULL);
  if (uv_loop_init(&fx.loop) < 0 || kexd_dispatch_new(&fx.loop, names, 1, &fx.disp) < 0) return -1;
  kexd_dispatch_set_opener(fx.disp, open_cpu, NULL);
  return 0;
}

/* Stop the dispatcher; the loop must then close clean. */
static int teardown(void **state) {
  (void)state;
  kexd_dispatch_stop(fx.disp, on_stopped, NULL);
  while (!fx.stopped) uv_run(&fx.loop, UV_RUN_ONCE);
  kexd_dispatch_free(fx.disp);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  pthread_cond_destroy(&fx.gate_cv);
  pthread_mutex_destroy(&fx.gate_lock);
  return uv_loop_close(&fx.loop);
}

/* n new items of job (weight w, reporting `cost` each, seq counting on from the job's last). */
static item *new_items(uint64_t job, uint32_t weight, uint32_t n, double cost) {
  static uint32_t next_seq[GATE_JOB + 1];
  assert_true(fx.nitems + n <= MAX_ITEMS && job <= GATE_JOB);
  if (fx.nitems == 0) memset(next_seq, 0, sizeof next_seq);
  item *first = &fx.items[fx.nitems];
  for (uint32_t i = 0; i < n; i++) {
    item *it = &fx.items[fx.nitems++];
    memset(it, 0, sizeof *it);
    it->w.kind = KEXD_WORK_RUN;
    it->w.job = job;
    it->w.weight = weight;
    it->w.fn = job == GATE_JOB ? run_gate : run_item;
    it->w.arg = it;
    it->w.done = on_done;
    it->w.ud = it;
    it->seq = next_seq[job]++;
    it->cost = cost;
  }
  return first;
}

/* Post n items of job one by one. */
static void post(uint64_t job, uint32_t weight, uint32_t n, double cost) {
  item *it = new_items(job, weight, n, cost);
  for (uint32_t i = 0; i < n; i++) assert_int_equal(kexd_dispatch_post(fx.disp, 0, &it[i].w), 0);
}

/* Post n items of job as one chain (kexd_dispatch_post_chain takes an array of kexd_work: works[i] is a copy of
   item i's, pointing back at the item). */
static void post_chain(uint64_t job, uint32_t weight, uint32_t n, double cost, kexd_work *works) {
  item *it = new_items(job, weight, n, cost);
  for (uint32_t i = 0; i < n; i++) {
    works[i] = it[i].w;
    works[i].arg = &it[i];
    works[i].ud = &it[i];
  }
  assert_int_equal(kexd_dispatch_post_chain(fx.disp, 0, works, n, NULL), 0);
}

/* Hold the runner with a gate item: what is posted next waits behind it. */
static void gate_close(void) {
  fx.gate_started = fx.gate_open = false;
  post(GATE_JOB, 1, 1, 0);
  pthread_mutex_lock(&fx.gate_lock);
  while (!fx.gate_started) pthread_cond_wait(&fx.gate_cv, &fx.gate_lock);
  pthread_mutex_unlock(&fx.gate_lock);
}

static void gate_release(void) {
  pthread_mutex_lock(&fx.gate_lock);
  fx.gate_open = true;
  pthread_cond_broadcast(&fx.gate_cv);
  pthread_mutex_unlock(&fx.gate_lock);
}

/* Run the loop until every posted item's done ran. */
static void wait_all(uint32_t extra_dones) {
  while (fx.ndone < fx.nitems + extra_dones) uv_run(&fx.loop, UV_RUN_ONCE);
}

/* Every job's items ran in the order they were posted. */
static void check_order(void) {
  int64_t last[GATE_JOB + 1];
  memset(last, -1, sizeof last);
  for (uint32_t i = 0; i < fx.nran; i++) {
    const ran_item *r = &fx.ran[i];
    if ((int64_t)r->seq <= last[r->job]) fail_msg("job %llu: item %u ran after item %lld", (unsigned long long)r->job,
                                                   r->seq, (long long)last[r->job]);
    last[r->job] = r->seq;
  }
}

/*
 * From ran[from] on, while jobs a and b both still have items to run: their virtual times (device time over
 * weight, from each one's start `va0`, `vb0`) never differ by more than `slack`.  Returns how many picks that was.
 */
static uint32_t check_share(uint32_t from, uint64_t a, uint32_t wa, double va0, uint64_t b, uint32_t wb, double vb0,
                            double slack) {
  uint32_t left_a = 0, left_b = 0, i;
  double va = va0, vb = vb0;
  for (i = from; i < fx.nran; i++) left_a += fx.ran[i].job == a, left_b += fx.ran[i].job == b;
  for (i = from; i < fx.nran && left_a && left_b; i++) {
    const ran_item *r = &fx.ran[i];
    if (r->job == a) va += r->cost / wa, left_a--;
    if (r->job == b) vb += r->cost / wb, left_b--;
    if (va - vb > slack + 1e-12 || vb - va > slack + 1e-12)
      fail_msg("pick %u: job %llu at virtual time %g, job %llu at %g (more than %g apart)", i - from,
               (unsigned long long)a, va, (unsigned long long)b, vb, slack);
  }
  return i - from;
}

/* Weights 1 and 3, items of 3 ms and 1 ms: b gets three times a's device time, at every point of the run. */
static void test_weights_share_device_time(void **state) {
  (void)state;
  static kexd_work chain[120];
  const double cost_a = 0.003, cost_b = 0.001;
  gate_close();
  post(1, 1, 20, cost_a);
  post_chain(2, 3, 120, cost_b, chain);
  gate_release();
  wait_all(0);
  assert_int_equal(fx.nran, 140);
  check_order();
  /* a virtual-time queue is at most one item ahead: the largest item's time over its job's weight */
  uint32_t both = check_share(0, 1, 1, 0, 2, 3, 0, cost_a / 1 > cost_b / 3 ? cost_a : cost_b / 3);
  assert_true(both >= 100); /* b's 120 items (40 of virtual time) end with a about 40/3 = 13 items in */
  double ta = 0, tb = 0;
  for (uint32_t i = 0; i < both; i++) fx.ran[i].job == 1 ? (ta += fx.ran[i].cost) : (tb += fx.ran[i].cost);
  assert_true(tb / ta > 2.5 && tb / ta < 3.5);
  /* the job counters hold what the items reported */
  kexd_flow_stats sa, sb;
  kexd_dispatch_job_stats(fx.disp, 1, &sa);
  kexd_dispatch_job_stats(fx.disp, 2, &sb);
  assert_int_equal(sa.items_done, 20);
  assert_int_equal(sb.items_done, 120);
  assert_int_equal(sa.queued + sa.running + sb.queued + sb.running, 0);
  assert_float_equal(sa.device_s, 20 * cost_a, 1e-9);
  assert_float_equal(sb.device_s, 120 * cost_b, 1e-9);
}

/* Equal weights and costs: the two jobs alternate (neither is more than one item ahead). */
static void test_equal_weights_alternate(void **state) {
  (void)state;
  gate_close();
  post(3, 2, 30, 0.002);
  post(4, 2, 30, 0.002);
  gate_release();
  wait_all(0);
  check_order();
  assert_true(check_share(0, 3, 2, 0, 4, 2, 0, 0.001) >= 58); /* until one of them has run its 30 */
}

/* A job that was idle while another ran gets no credit for it: when both queue again, they share from there. */
static void test_idle_job_banks_no_credit(void **state) {
  (void)state;
  const double cost = 0.001;
  gate_close();
  post(6, 1, 1, cost);  /* b runs once ... */
  post(5, 1, 20, cost); /* ... then a runs alone while b has nothing queued */
  gate_release();
  wait_all(0);
  uint32_t phase2 = fx.nran;
  double va0 = 0, vb0 = 0;
  for (uint32_t i = 0; i < phase2; i++) fx.ran[i].job == 5 ? (va0 += cost) : (vb0 += cost);
  assert_float_equal(va0 - vb0, 19 * cost, 1e-9);
  gate_close();
  post(6, 1, 10, cost);
  post(5, 1, 10, cost);
  gate_release();
  wait_all(0);
  check_order();
  /* b's virtual time starts where a's is, not 19 items behind: from here on they are level within an item.  With
     banked credit b would run its 10 items first. */
  assert_true(check_share(phase2, 5, 1, 0, 6, 1, 0, cost) >= 18);
  uint32_t a_first10 = 0;
  for (uint32_t i = phase2; i < phase2 + 10; i++) a_first10 += fx.ran[i].job == 5;
  assert_true(a_first10 >= 4);
}

/* Cancelling a job: its queued items end KEX_ECANCELLED unrun, its must_run ones still run, other jobs unharmed. */
static void test_cancel_job(void **state) {
  (void)state;
  gate_close();
  item *c = new_items(7, 1, 5, 0.001);
  c[2].w.must_run = true;
  for (int i = 0; i < 5; i++) assert_int_equal(kexd_dispatch_post(fx.disp, 0, &c[i].w), 0);
  post(8, 1, 3, 0.001);
  kexd_flow_stats s;
  kexd_dispatch_job_stats(fx.disp, 7, &s);
  assert_int_equal(s.queued, 5);
  kexd_dispatch_cancel_job(fx.disp, 7);
  gate_release();
  wait_all(0);
  uint32_t ran7 = 0, ran8 = 0;
  for (uint32_t i = 0; i < fx.nran; i++) {
    ran7 += fx.ran[i].job == 7;
    ran8 += fx.ran[i].job == 8;
    if (fx.ran[i].job == 7) assert_int_equal(fx.ran[i].seq, 2);
  }
  assert_int_equal(ran7, 1);
  assert_int_equal(ran8, 3);
  for (int i = 0; i < 5; i++) {
    assert_true(c[i].done);
    if (i == 2) {
      assert_int_equal(c[i].w.rc, 0);
    } else {
      assert_int_equal(c[i].w.rc, KEX_ECANCELLED);
      assert_non_null(strstr(c[i].w.err.msg, "cancelled"));
    }
  }
  kexd_dispatch_job_stats(fx.disp, 7, &s); /* its flow is gone once empty */
  assert_int_equal(s.items_done + s.queued + s.running, 0);
}

/* Bad posts are refused whole and their done never runs; a chain reports whether the runner was idle. */
static void test_bad_posts(void **state) {
  (void)state;
  item *it = new_items(9, 1, 2, 0.001);
  kexd_work w = it[0].w, chain[2] = {it[0].w, it[1].w};
  bool idle = false;
  assert_int_equal(kexd_dispatch_post(fx.disp, 1, &w), KEX_EINVAL); /* one device: index 1 is none */
  w.done = NULL;
  assert_int_equal(kexd_dispatch_post(fx.disp, 0, &w), KEX_EINVAL);
  w = it[0].w;
  w.fn = NULL;
  assert_int_equal(kexd_dispatch_post(fx.disp, 0, &w), KEX_EINVAL);
  w = it[0].w;
  w.kind = KEXD_WORK_COPY_OUT; /* no buffer */
  assert_int_equal(kexd_dispatch_post(fx.disp, 0, &w), KEX_EINVAL);
  chain[1].job = 10; /* two jobs in one chain */
  assert_int_equal(kexd_dispatch_post_chain(fx.disp, 0, chain, 2, &idle), KEX_EINVAL);
  assert_int_equal(kexd_dispatch_post_chain(fx.disp, 0, chain, 0, &idle), KEX_EINVAL);
  chain[1].job = 9;
  assert_int_equal(kexd_dispatch_post_chain(fx.disp, 0, chain, 2, &idle), 0);
  assert_true(idle);
  wait_all(0);
  assert_int_equal(fx.nran, 2);
  gate_close();
  item *more = new_items(9, 1, 1, 0.001);
  assert_int_equal(kexd_dispatch_post_chain(fx.disp, 0, &more->w, 1, &idle), 0);
  assert_false(idle); /* the gate is running */
  gate_release();
  wait_all(0);
  /* once stopping, nothing more is taken */
  kexd_dispatch_stop(fx.disp, on_stopped, NULL);
  w = more->w;
  assert_int_equal(kexd_dispatch_post(fx.disp, 0, &w), KEX_EUNAVAILABLE);
  assert_int_equal(fx.ndone, fx.nitems);
}

int main(void) {
  kex_log_set_level(KEX_LOG_WARN);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_weights_share_device_time), T(test_equal_weights_alternate), T(test_idle_job_banks_no_credit),
      T(test_cancel_job),                T(test_bad_posts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_engine.c - the engine's program stage (realize/engine.h) on the cpu
 * device: the first request compiles every kernel and stores it in the
 * SQLite cache, a second one (a new engine, as after a restart) reads them
 * all from SQLite and gets the same binaries; through an executor, `done`
 * comes exactly once with the same results, the slots' line serves two
 * requests, a cancelled request stops, a failing compile (the fault
 * device) names the kernel, and the caller's gate (admit) is asked once
 * when kernels are left to compile -- its refusal fails the request with
 * nothing compiled -- and never when every program was in SQLite.  Also kex_run_graph with the program cache:
 * the same outputs with and without it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "realize/engine.h"
#include "realize/run.h"
#include "sample.h"

static kex_device *cpu;
static char cpu_skip[600];
static char tmpdir[256];
static int file_counter;

/* Two kernels: a reduce and an elementwise op after it. */
static const char *GRAPH = "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4,8],\"fill\":{\"random\":7}},"
                           "{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]},{\"op\":\"CONTIGUOUS\",\"src\":[1]},"
                           "{\"op\":\"EXP2\",\"src\":[2]}],\"outputs\":[3]}";

static void cache_file(char *buf, size_t len) { snprintf(buf, len, "%s/c%d.db", tmpdir, file_counter++); }

/* A plan of GRAPH lowered for the cpu device (not compiled). */
static kex_rplan *plan_of(kex_graph **g) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_target t;
  kex_plan_policy pol;
  kex_rplan *p = NULL;
  assert_int_equal(kex_graph_from_json(GRAPH, strlen(GRAPH), &lim, g, &err), 0);
  kex_target_for_device(kex_device_get_info(cpu), &t);
  kex_plan_policy_hand(&pol);
  assert_int_equal(kex_plan_build(*g, &t, &pol, NULL, &p, &err), 0);
  assert_true(p->nkernels >= 2);
  return p;
}

typedef struct req_arrays {
  kex_prog_req r;
  bool need[8];
  unsigned char *bins[8];
  size_t binlens[8];
  double compile_us[8];
  uint8_t from[8];
  atomic_bool cancelled;
  int done_calls, holds;
} req_arrays;

static void req_init(req_arrays *a, const kex_rplan *p) {
  memset(a, 0, sizeof *a);
  for (uint32_t k = 0; k < p->nkernels; k++) a->need[k] = true;
  atomic_init(&a->cancelled, false);
  a->r = (kex_prog_req){.rp = p, .need = a->need, .cancelled = &a->cancelled, .owner = a, .bins = a->bins,
                        .binlens = a->binlens, .compile_us = a->compile_us, .from = a->from};
}

static void req_free(req_arrays *a, const kex_rplan *p) {
  for (uint32_t k = 0; k < p->nkernels; k++) kex_free(a->bins[k]);
  kex_prog_req_clear(&a->r);
}

/* memory -> SQLite -> compile: a fresh cache compiles and stores, a new engine on it reads every program back. */
static void test_sqlite_then_compile(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  char path[300];
  cache_file(path, sizeof path);
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  kex_cache_conns *conns = NULL;
  assert_int_equal(kex_cache_conns_create(path, &conns), 0);
  req_arrays a, b;
  unsigned char *first[8] = {0};
  size_t firstlen[8] = {0};
  for (int round = 0; round < 2; round++) {
    kex_engine *e = NULL;
    kex_engine_config ec = {.instance = cpu, .fault_kind = -1, .conns = conns};
    assert_int_equal(kex_engine_create(&ec, &e), 0);
    req_arrays *r = round ? &b : &a;
    req_init(r, p);
    assert_int_equal(kex_engine_programs_now(e, &r->r), 0);
    kex_engine_stats st = kex_engine_get_stats(e);
    for (uint32_t k = 0; k < p->nkernels; k++) {
      assert_non_null(r->bins[k]);
      assert_int_equal(r->from[k], round ? KEX_PROG_SQLITE : KEX_PROG_COMPILED);
      if (!round) {
        first[k] = r->bins[k], firstlen[k] = r->binlens[k];
      } else {
        assert_int_equal(r->binlens[k], firstlen[k]);
        assert_memory_equal(r->bins[k], first[k], firstlen[k]);
      }
    }
    assert_int_equal(st.compiled, round ? 0 : p->nkernels);
    assert_int_equal(st.sqlite_hits, round ? p->nkernels : 0);
    kex_engine_free(e);
  }
  req_free(&a, p);
  req_free(&b, p);
  kex_cache_conns_free(conns);
  kex_plan_destroy(p);
  kex_graph_free(g);
}

/* The end of an engine test: the engine, the plan and its graph freed. */
static void end_engine(kex_engine *e, kex_rplan *p, kex_graph *g) {
  kex_engine_free(e);
  kex_plan_destroy(p);
  kex_graph_free(g);
}

/* An executor that runs each work item at once, on this thread (fn, then after). */
static int direct_submit(void *ctx, kex_work *w) {
  int *refuse_after = ctx;
  if (*refuse_after == 0) return KEX_EUNAVAILABLE;
  if (*refuse_after > 0) (*refuse_after)--;
  w->fn(w);
  w->after(w, 0);
  return 0;
}

/* r's stage is over, once, with every hold given back and every kernel compiled. */
static void assert_all_compiled(const req_arrays *r, const kex_rplan *p) {
  assert_int_equal(r->done_calls, 1);
  assert_int_equal(r->holds, 0);
  assert_int_equal(r->r.rc, 0);
  for (uint32_t k = 0; k < p->nkernels; k++) assert_int_equal(r->from[k], KEX_PROG_COMPILED);
}

static bool never_dead(kex_prog_req *r) { (void)r; return false; }
static void hold(kex_prog_req *r) { ((req_arrays *)r->owner)->holds++; }
static void release(kex_prog_req *r) { ((req_arrays *)r->owner)->holds--; }
static void done(kex_prog_req *r) { ((req_arrays *)r->owner)->done_calls++; }

/* Through an executor: done exactly once, every hold given back, the same programs; a refusing pool fails it. */
static void test_executor(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  int budget = -1; /* take everything */
  kex_engine *e = NULL;
  kex_engine_config ec = {.instance = cpu, .fault_kind = -1, .compile_slots = 2,
                          .exec = {direct_submit, &budget}};
  assert_int_equal(kex_engine_create(&ec, &e), 0);
  req_arrays a, b;
  req_init(&a, p);
  req_init(&b, p);
  for (req_arrays *r = &a; r; r = r == &a ? &b : NULL) {
    r->r.dead = never_dead, r->r.hold = hold, r->r.release = release, r->r.done = done;
    kex_engine_programs(e, &r->r);
    assert_all_compiled(r, p);
  }
  req_free(&a, p);
  req_free(&b, p);
  /* the pool takes the lookup but not the compiles: the request fails, done still once */
  budget = 1;
  req_init(&a, p);
  a.r.dead = never_dead, a.r.hold = hold, a.r.release = release, a.r.done = done;
  kex_engine_programs(e, &a.r);
  assert_int_equal(a.done_calls, 1);
  assert_int_equal(a.holds, 0);
  assert_int_equal(a.r.rc, KEX_EUNAVAILABLE);
  req_free(&a, p);
  /* cancelled before it starts: the lookup stops, done once with KEX_ECANCELLED */
  budget = -1;
  req_init(&a, p);
  a.r.dead = never_dead, a.r.hold = hold, a.r.release = release, a.r.done = done;
  atomic_store(&a.cancelled, true);
  kex_engine_programs(e, &a.r);
  assert_int_equal(a.done_calls, 1);
  assert_int_equal(a.r.rc, KEX_ECANCELLED);
  req_free(&a, p);
  end_engine(e, p, g);
}

static int admit_calls;
static uint32_t admit_misses;
static int admit_refuse(kex_prog_req *r, kex_error *err) {
  admit_calls++, admit_misses = r->nmisses;
  return kex_err_set(err, KEX_ELIMIT, "over the budget");
}
static int admit_allow(kex_prog_req *r, kex_error *err) {
  (void)err;
  admit_calls++, admit_misses = r->nmisses;
  return 0;
}

/*
 * The gate: asked once with every kernel a miss, it refuses: done once with its code and message, nothing
 * compiled (directly too); it allows: every kernel compiled; then all in SQLite: it is not asked.
 */
static void test_admit(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  char path[300];
  cache_file(path, sizeof path);
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  kex_cache_conns *conns = NULL;
  assert_int_equal(kex_cache_conns_create(path, &conns), 0);
  int take_all = -1;
  kex_engine *e = NULL;
  kex_engine_config ec = {.instance = cpu, .fault_kind = -1, .conns = conns, .exec = {direct_submit, &take_all}};
  assert_int_equal(kex_engine_create(&ec, &e), 0);
  req_arrays a;
  int (*const gates[3])(kex_prog_req *, kex_error *) = {admit_refuse, admit_allow, admit_refuse};
  for (int i = 0; i < 3; i++) {
    admit_calls = 0, admit_misses = 0;
    req_init(&a, p);
    a.r.dead = never_dead, a.r.hold = hold, a.r.release = release, a.r.done = done, a.r.admit = gates[i];
    kex_engine_programs(e, &a.r);
    assert_int_equal(a.done_calls, 1);
    assert_int_equal(a.holds, 0);
    if (i == 0) { /* refused: nothing compiled */
      assert_int_equal(admit_calls, 1);
      assert_int_equal(admit_misses, p->nkernels);
      assert_int_equal(a.r.rc, KEX_ELIMIT);
      assert_string_equal(a.r.err.msg, "over the budget");
      for (uint32_t k = 0; k < p->nkernels; k++) assert_null(a.bins[k]);
      assert_int_equal(kex_engine_get_stats(e).compiled, 0);
    } else if (i == 1) { /* allowed: every kernel compiled */
      assert_int_equal(admit_calls, 1);
      assert_all_compiled(&a, p);
    } else { /* every program in SQLite: the gate is not asked */
      assert_int_equal(admit_calls, 0);
      assert_int_equal(a.r.rc, 0);
      for (uint32_t k = 0; k < p->nkernels; k++) assert_int_equal(a.from[k], KEX_PROG_SQLITE);
    }
    req_free(&a, p);
  }
  kex_engine_free(e);
  kex_cache_conns_free(conns);
  /* directly (kex_engine_programs_now), without a cache: refused, nothing compiled */
  kex_engine_config ed = {.instance = cpu, .fault_kind = -1};
  assert_int_equal(kex_engine_create(&ed, &e), 0);
  admit_calls = 0;
  req_init(&a, p);
  a.r.admit = admit_refuse;
  assert_int_equal(kex_engine_programs_now(e, &a.r), KEX_ELIMIT);
  assert_int_equal(admit_calls, 1);
  assert_int_equal(kex_engine_get_stats(e).compiled, 0);
  req_free(&a, p);
  end_engine(e, p, g);
}

/* An executor that queues work; the test runs it (fn, then after) when it chooses. */
typedef struct deferred {
  kex_work *q[16];
  int n;
} deferred;

static int deferred_submit(void *ctx, kex_work *w) {
  deferred *d = ctx;
  assert_true(d->n < 16);
  d->q[d->n++] = w;
  return 0;
}

/* Run the oldest queued work. */
static void deferred_run(deferred *d) {
  assert_true(d->n > 0);
  kex_work *w = d->q[0];
  memmove(d->q, d->q + 1, (size_t)(d->n - 1) * sizeof *d->q);
  d->n--;
  w->fn(w);
  w->after(w, 0);
}

static req_arrays *hold_log[32];
static int nhold_log;
static void logged_hold(kex_prog_req *r) {
  hold(r);
  hold_log[nhold_log++] = r->owner;
}

/*
 * Fair compile slots: with one slot held by payer a's compile, payer b's
 * first kernel starts at once in an extra slot (not after a's next); a
 * payer with a compile in flight waits for a fair slot.
 */
static void test_fair_slots(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  deferred dq = {0};
  kex_engine *e = NULL;
  kex_engine_config ec = {.instance = cpu, .fault_kind = -1, .compile_slots = 1, .exec = {deferred_submit, &dq}};
  assert_int_equal(kex_engine_create(&ec, &e), 0);
  req_arrays a, b;
  req_init(&a, p);
  req_init(&b, p);
  a.r.payer = "a", b.r.payer = "b";
  nhold_log = 0;
  for (req_arrays *r = &a; r; r = r == &a ? &b : NULL)
    r->r.dead = never_dead, r->r.hold = logged_hold, r->r.release = release, r->r.done = done;
  kex_engine_programs(e, &a.r);
  deferred_run(&dq); /* a's lookup: a's first kernel takes the slot */
  assert_int_equal(dq.n, 1);
  kex_engine_programs(e, &b.r);
  deferred_run(&dq); /* a's first compile ends: a's second kernel takes the slot */
  deferred_run(&dq); /* b's lookup: every slot taken, b has none in flight: an extra slot */
  assert_int_equal(dq.n, 2);
  /* holds in order: a lookup, a compile, b lookup, a compile, b compile */
  req_arrays *want[] = {&a, &a, &b, &a, &b};
  assert_int_equal(nhold_log, 5);
  for (int i = 0; i < 5; i++) assert_ptr_equal(hold_log[i], want[i]);
  while (dq.n) deferred_run(&dq);
  assert_all_compiled(&a, p);
  assert_all_compiled(&b, p);
  req_free(&a, p);
  req_free(&b, p);
  end_engine(e, p, g);
}

/* A source that failed to compile fails again at once, named, without a second compile. */
static void test_failed_source_remembered(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  char *bad = kex_strdup("this is not C;");
  char *good = p->progs[0].src;
  p->progs[0].src = bad;
  kex_engine *e = NULL;
  kex_engine_config ec = {.instance = cpu, .fault_kind = -1};
  assert_int_equal(kex_engine_create(&ec, &e), 0);
  for (int round = 0; round < 2; round++) {
    req_arrays a;
    req_init(&a, p);
    assert_int_equal(kex_engine_programs_now(e, &a.r), KEX_ECOMPILE);
    assert_non_null(strstr(a.r.err.msg, "compiling kernel 0 ("));
    assert_true((strstr(a.r.err.msg, "failed before, not compiled again") != NULL) == (round == 1));
    req_free(&a, p);
  }
  assert_int_equal(kex_engine_get_stats(e).compiled, 0);
  p->progs[0].src = good; /* another source compiles */
  req_arrays a;
  req_init(&a, p);
  assert_int_equal(kex_engine_programs_now(e, &a.r), 0);
  req_free(&a, p);
  kex_free(bad);
  end_engine(e, p, g);
}

/* The compile timeout: a compile past it is stopped (cc killed) with KEX_EDEADLINE; one under it compiles. */
typedef struct cancel_later {
  atomic_bool *flag;
  int ms;
} cancel_later;

static void *cancel_after(void *arg) {
  cancel_later *c = arg;
  usleep((useconds_t)c->ms * 1000);
  atomic_store(c->flag, true);
  return NULL;
}

static void test_compile_timeout(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  const char *head = "void slow(void **b, const int *ints, int s, int e) { (void)ints; (void)s; (void)e; "
                     "volatile float *o = b[0]; float x = o[0];";
  size_t cap = strlen(head) + 60000 * 40 + 64, n = 0;
  char *src = kex_malloc(cap);
  n += (size_t)snprintf(src, cap, "%s", head);
  for (int i = 0; i < 60000; i++) n += (size_t)snprintf(src + n, cap - n, " x = x * 1.0001f + o[%d];", i % 7);
  snprintf(src + n, cap - n, " o[0] = x; }");
  unsigned char *bin = NULL;
  size_t len = 0;
  kex_error err = {0};
  assert_true(kex_device_set_compile_time_limit(cpu, 0.3));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(kex_device_compile(cpu, src, "slow", &bin, &len, &err), KEX_EDEADLINE);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  assert_true(s < 3.0); /* stopped near its limit, not compiled to the end */
  assert_non_null(strstr(err.msg, "slow"));
  assert_non_null(strstr(err.msg, "compile time limit"));
  assert_null(bin);
  /* no limit, but the caller gives up: the compiler is stopped at once (KEX_ECANCELLED), not run to the end */
  assert_true(kex_device_set_compile_time_limit(cpu, 0));
  atomic_bool cancel = false;
  cancel_later cl = {&cancel, 200};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, cancel_after, &cl), 0);
  kex_prewarm_item it = {.source = src, .name = "slow", .cancel = &cancel};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(kex_device_compile_for_launch(cpu, &it, &bin, &len, &err), KEX_ECANCELLED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_int_equal(pthread_join(t, NULL), 0);
  s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  assert_true(s < 3.0);
  assert_non_null(strstr(err.msg, "slow"));
  assert_null(bin);
  /* under the limit: a small kernel compiles */
  const char *small = "void tiny(void **b, const int *i, int s, int e) { (void)b; (void)i; (void)s; (void)e; }";
  assert_true(kex_device_set_compile_time_limit(cpu, 30));
  assert_int_equal(kex_device_compile(cpu, small, "tiny", &bin, &len, &err), 0);
  kex_free(bin);
  assert_true(kex_device_set_compile_time_limit(cpu, 0));
  kex_free(src);
}

/* A failing compile names the kernel and still reports its time; nothing is stored. */
static void test_compile_fault(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  kex_graph *g = NULL;
  kex_rplan *p = plan_of(&g);
  kex_device *fd = NULL;
  assert_int_equal(kex_fault_device_new(cpu, KEX_FAULT_COMPILE, 2, &fd), 0);
  kex_engine *e = NULL;
  kex_engine_config ec = {.instance = fd, .fault_kind = -1};
  assert_int_equal(kex_engine_create(&ec, &e), 0);
  req_arrays a;
  req_init(&a, p);
  assert_int_equal(kex_engine_programs_now(e, &a.r), KEX_EDEVICE);
  assert_non_null(strstr(a.r.err.msg, "compiling kernel 1 ("));
  assert_non_null(strstr(a.r.err.msg, "injected failure"));
  assert_true(a.r.compile_us[1] > 0); /* the failed compile's time is reported, for its payer to be charged */
  req_free(&a, p);
  kex_engine_free(e);
  kex_device_unref(fd);
  kex_plan_destroy(p);
  kex_graph_free(g);
}

/* kex_run_graph with the program cache: the same outputs as without, and the second run reads SQLite. */
static void test_run_with_cache(void **state) {
  (void)state;
  if (!cpu) { printf("skipped: %s\n", cpu_skip); skip(); }
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  char path[300];
  cache_file(path, sizeof path);
  assert_int_equal(kex_graph_from_json(GRAPH, strlen(GRAPH), &lim, &g, &err), 0);
  kex_run_result r[3];
  kex_run_opts off = {.repeat = 1, .cache_path = ""}, on = {.repeat = 1, .cache_path = path, .program_cache = true};
  assert_int_equal(kex_run_graph(g, cpu, &off, &r[0], &err), 0);
  assert_int_equal(kex_run_graph(g, cpu, &on, &r[1], &err), 0);
  assert_int_equal(kex_run_graph(g, cpu, &on, &r[2], &err), 0);
  assert_int_equal(access(path, F_OK), 0);
  for (int i = 1; i < 3; i++) {
    assert_int_equal(r[i].noutputs, r[0].noutputs);
    assert_int_equal(r[i].nkernels, r[0].nkernels);
    for (uint32_t j = 0; j < r[0].noutputs; j++) {
      assert_int_equal(r[i].outputs[j].nbytes, r[0].outputs[j].nbytes);
      assert_memory_equal(r[i].outputs[j].data, r[0].outputs[j].data, r[0].outputs[j].nbytes);
    }
  }
  for (int i = 0; i < 3; i++) kex_run_result_free(&r[i]);
  kex_graph_free(g);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/kex-test-engine-XXXXXX", base && base[0] ? base : "/tmp");
  if (!mkdtemp(tmpdir)) return 1;
  kex_test_device_open("cpu", &cpu, cpu_skip, sizeof cpu_skip);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sqlite_then_compile),
      cmocka_unit_test(test_executor),
      cmocka_unit_test(test_admit),
      cmocka_unit_test(test_fair_slots),
      cmocka_unit_test(test_failed_source_remembered),
      cmocka_unit_test(test_compile_timeout),
      cmocka_unit_test(test_compile_fault),
      cmocka_unit_test(test_run_with_cache),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  kex_device_unref(cpu);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) rc = rc ? rc : 1;
  return rc;
}

/*
 * test_jobtable.c - kexd's job table (daemon/jobs.c) on its own loop, with
 * no device runner (buffer records without device memory).
 *
 * Open, find and close by token (bare or with this node's suffix; one
 * character off, another node's or a closed job's finds nothing, and a
 * job's id is never reused); the limits on both sides: jobs open at once
 * (--max-jobs, the job idle longest closed to make room only when idle
 * long enough, a held one never), jobs per client address for the
 * anonymous tenant, the name length; the lease sweep closing idle jobs
 * but not held ones; each job's memory limit and buffer count, its
 * buffer handles meaning nothing in another job, and every byte counted
 * for the job, its tenant and its device until the buffer or job goes; a
 * tenant's compile budget (a token bucket of compile seconds per hour).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/log.h"
#include "daemon/jobs.h"

typedef struct fixture {
  uv_loop_t loop;
  kexd_jobs jobs;
  kexd_tenant_use *anon;
} fixture;

static fixture fx;

static int setup(void **state) {
  (void)state;
  memset(&fx, 0, sizeof fx);
  if (uv_loop_init(&fx.loop) < 0 || kexd_jobs_init(&fx.jobs, &fx.loop, 60, 0, NULL) < 0) return -1;
  fx.anon = kexd_jobs_tenant_use(&fx.jobs, KEXD_ANONYMOUS_TENANT);
  return fx.anon ? 0 : -1;
}

/* Close the table; its timer closes with the loop, which must then close clean. */
static int teardown(void **state) {
  (void)state;
  kexd_jobs_close(&fx.jobs);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  return uv_loop_close(&fx.loop);
}

/* Open a job of tenant `use` for peer; fails the test unless it opens. */
static kexd_job *open_ok(const char *name, const char *peer, kexd_tenant_use *use) {
  kexd_job *job = NULL;
  kex_error err = {0};
  if (kexd_jobs_open(&fx.jobs, name, 1, 0, peer, use, &job, &err) != 0) fail_msg("open \"%s\": %s", name, err.msg);
  return job;
}

/* Open expecting a refusal: its code, with err's message in *why. */
static int open_refused(const char *name, const char *peer, kexd_tenant_use *use, char *why, size_t cap) {
  kexd_job *job = (kexd_job *)1;
  kex_error err = {0};
  int rc = kexd_jobs_open(&fx.jobs, name, 1, 0, peer, use, &job, &err);
  assert_true(rc < 0);
  assert_null(job);
  snprintf(why, cap, "%s", err.msg);
  return rc;
}

/* Make job look idle for `ms` milliseconds (its last call that long before the loop's now). */
static void idle_for(kexd_job *job, uint64_t ms) {
  uv_update_time(&fx.loop);
  job->last_used_ms = uv_now(&fx.loop) - ms;
}

static void test_open_find_close(void **state) {
  (void)state;
  kexd_job *a = open_ok("a", "p", fx.anon), *b = open_ok("b", "p", fx.anon);
  char token[KEXD_TOKEN_LEN + 1];
  assert_int_equal(strlen(a->token), KEXD_TOKEN_LEN);
  assert_int_equal(strspn(a->token, "0123456789abcdef"), KEXD_TOKEN_LEN);
  assert_string_not_equal(a->token, b->token);
  /* the log id: 8 hex of the token's SHA-256, never a part of the secret itself */
  assert_int_equal(strspn(a->log_id, "0123456789abcdef"), 8);
  assert_int_equal(a->log_id[8], '\0');
  assert_true(memcmp(a->log_id, a->token, 8) != 0);
  assert_true(b->id > a->id);
  assert_ptr_equal(kexd_jobs_find(&fx.jobs, a->token), a);
  assert_ptr_equal(kexd_jobs_find(&fx.jobs, b->token), b);
  assert_ptr_equal(kexd_jobs_find_id(&fx.jobs, b->id), b);
  assert_int_equal(fx.anon->jobs, 2);
  /* one character off, one short, one long, empty, NULL: nothing */
  memcpy(token, a->token, sizeof token);
  token[KEXD_TOKEN_LEN - 1] = token[KEXD_TOKEN_LEN - 1] == '0' ? '1' : '0';
  assert_null(kexd_jobs_find(&fx.jobs, token));
  memcpy(token, a->token, sizeof token);
  token[KEXD_TOKEN_LEN - 1] = '\0';
  assert_null(kexd_jobs_find(&fx.jobs, token));
  char longer[KEXD_TOKEN_LEN + 2];
  snprintf(longer, sizeof longer, "%s0", a->token);
  assert_null(kexd_jobs_find(&fx.jobs, longer));
  assert_null(kexd_jobs_find(&fx.jobs, ""));
  assert_null(kexd_jobs_find(&fx.jobs, NULL));
  /* close: gone, once; the other stays; ids are not reused */
  uint64_t a_id = a->id;
  memcpy(token, a->token, sizeof token);
  assert_int_equal(kexd_jobs_close_job(&fx.jobs, token), 0);
  assert_null(kexd_jobs_find(&fx.jobs, token));
  assert_null(kexd_jobs_find_id(&fx.jobs, a_id));
  assert_int_equal(kexd_jobs_close_job(&fx.jobs, token), KEX_ENOTFOUND);
  assert_ptr_equal(kexd_jobs_find(&fx.jobs, b->token), b);
  assert_int_equal(fx.anon->jobs, 1);
  assert_int_equal(fx.anon->jobs_opened, 2);
  kexd_job *c = open_ok("c", "p", fx.anon);
  assert_true(c->id > b->id);
  uint64_t c_id = c->id;
  assert_int_equal(kexd_jobs_close_id(&fx.jobs, c_id, "test"), 0);
  assert_int_equal(kexd_jobs_close_id(&fx.jobs, c_id, "test"), KEX_ENOTFOUND);
  assert_int_equal(fx.jobs.opened, 3);
  assert_int_equal(fx.jobs.closed, 2);
}

static void test_tokens_of_nodes(void **state) {
  (void)state;
  char wire[KEXD_WIRE_TOKEN_MAX + 1], other[KEXD_WIRE_TOKEN_MAX + 8];
  kexd_job *before = open_ok("before", "p", fx.anon);
  kexd_job_wire_token(&fx.jobs, before, wire);
  assert_string_equal(wire, before->token); /* no node named yet: the bare secret */
  kexd_jobs_set_node(&fx.jobs, "node-a", "10.0.0.1:50051");
  kexd_job *job = open_ok("j", "p", fx.anon);
  kexd_job_wire_token(&fx.jobs, job, wire);
  assert_int_equal(strlen(wire), KEXD_TOKEN_LEN + strlen(".node-a@10.0.0.1:50051"));
  assert_string_equal(wire + KEXD_TOKEN_LEN, ".node-a@10.0.0.1:50051");
  assert_ptr_equal(kexd_jobs_find(&fx.jobs, wire), job);
  assert_ptr_equal(kexd_jobs_find(&fx.jobs, job->token), job);
  assert_null(kexd_jobs_token_owner(&fx.jobs, wire)); /* this node's */
  /* the same secret with another node's suffix: not found here, and the owner is named */
  snprintf(other, sizeof other, "%s.node-b@10.0.0.2:1", job->token);
  assert_null(kexd_jobs_find(&fx.jobs, other));
  assert_string_equal(kexd_jobs_token_owner(&fx.jobs, other), "node-b@10.0.0.2:1");
  /* not well-formed: no owner (no dot, no @, a bad name or address, a secret that is not 32 hex digits) */
  static const char *const bad[] = {"node-b@h", ".node-b", ".bad name@h", ".node-b@", ".@h"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(other, sizeof other, "%s%s", job->token, bad[i]);
    if (kexd_jobs_token_owner(&fx.jobs, other)) fail_msg("an owner in \"%s\"", other);
  }
  snprintf(other, sizeof other, "%.31sg.node-b@h", job->token);
  assert_null(kexd_jobs_token_owner(&fx.jobs, other));
  /* node fields: 1..max characters of KEXD_NODE_CHARS */
  char name[KEXD_NODE_NAME_MAX + 2];
  memset(name, 'n', sizeof name);
  name[KEXD_NODE_NAME_MAX] = '\0';
  assert_true(kexd_node_field_ok(name, KEXD_NODE_NAME_MAX));
  name[KEXD_NODE_NAME_MAX] = 'n';
  name[KEXD_NODE_NAME_MAX + 1] = '\0';
  assert_false(kexd_node_field_ok(name, KEXD_NODE_NAME_MAX));
  assert_false(kexd_node_field_ok("", KEXD_NODE_NAME_MAX));
  assert_false(kexd_node_field_ok("a b", KEXD_NODE_NAME_MAX));
  assert_true(kexd_node_field_ok("[::1]:50051", KEXD_ADVERTISE_MAX));
}

/* --max-jobs: at the limit a new job is refused unless the job idle longest has been idle long enough. */
static void test_job_limit_and_eviction(void **state) {
  (void)state;
  char why[512];
  kexd_job *jobs[3];
  fx.jobs.max_jobs = 3;
  for (int i = 0; i < 3; i++) jobs[i] = open_ok("j", "p", fx.anon);
  assert_int_equal(open_refused("j", "p", fx.anon, why, sizeof why), KEX_ELIMIT);
  assert_non_null(strstr(why, "3 jobs are open, the limit (--max-jobs)"));
  /* idle just under the eviction age: still refused */
  idle_for(jobs[1], fx.jobs.evict_idle_ms - 1000);
  assert_int_equal(open_refused("j", "p", fx.anon, why, sizeof why), KEX_ELIMIT);
  /* a held job is never evicted, however idle */
  jobs[1]->held = true;
  idle_for(jobs[1], fx.jobs.evict_idle_ms + 1000);
  assert_int_equal(open_refused("j", "p", fx.anon, why, sizeof why), KEX_ELIMIT);
  assert_int_equal(fx.jobs.evicted, 0);
  /* idle past it (and not the idlest held one): evicted, the new job takes its place */
  jobs[1]->held = false;
  idle_for(jobs[2], fx.jobs.evict_idle_ms + 10);
  uint64_t idlest = jobs[1]->id, other = jobs[2]->id;
  kexd_job *fresh = open_ok("fresh", "p", fx.anon);
  assert_int_equal(fx.jobs.evicted, 1);
  assert_null(kexd_jobs_find_id(&fx.jobs, idlest));
  assert_non_null(kexd_jobs_find_id(&fx.jobs, other));
  assert_ptr_equal(kexd_jobs_find_id(&fx.jobs, fresh->id), fresh);
  assert_int_equal(fx.jobs.njobs, 3);
  assert_int_equal(fx.anon->jobs, 3);
}

static int closed_hooks;
static void count_close(void *ud) { closed_hooks += ud == &closed_hooks; }

/* A job's close hook (HoldJob's) runs once, however the job ends. */
static void test_close_hook(void **state) {
  (void)state;
  kexd_job *a = open_ok("a", "p", fx.anon), *b = open_ok("b", "p", fx.anon);
  closed_hooks = 0;
  a->on_close = b->on_close = count_close;
  a->on_close_ud = b->on_close_ud = &closed_hooks;
  assert_int_equal(kexd_jobs_close_job(&fx.jobs, a->token), 0);
  assert_int_equal(closed_hooks, 1);
  fx.jobs.max_jobs = 1;
  idle_for(b, fx.jobs.evict_idle_ms + 10);
  open_ok("c", "p", fx.anon); /* evicts b */
  assert_int_equal(closed_hooks, 2);
}

/* --max-jobs-per-peer binds the anonymous tenant only, per address. */
static void test_peer_limit(void **state) {
  (void)state;
  char why[512];
  kexd_tenant_use *alice = kexd_jobs_tenant_use(&fx.jobs, "alice");
  fx.jobs.max_per_peer = 2;
  open_ok("1", "ipv4:10.0.0.1", fx.anon);
  open_ok("2", "ipv4:10.0.0.1", fx.anon);
  assert_int_equal(open_refused("3", "ipv4:10.0.0.1", fx.anon, why, sizeof why), KEX_ELIMIT);
  assert_non_null(strstr(why, "ipv4:10.0.0.1 holds 2 jobs open, the limit per client address"));
  open_ok("3", "ipv4:10.0.0.2", fx.anon);
  for (int i = 0; i < 3; i++) open_ok("t", "ipv4:10.0.0.1", alice); /* a tenant of --auth: its max_jobs instead */
  assert_int_equal(alice->jobs, 3);
  assert_int_equal(fx.anon->jobs, 3);
}

static void test_name_limit(void **state) {
  (void)state;
  char name[KEXD_JOB_NAME_MAX + 2], why[512];
  memset(name, 'n', sizeof name);
  name[KEXD_JOB_NAME_MAX] = '\0';
  kexd_job *job = open_ok(name, "p", fx.anon);
  assert_string_equal(job->name, name);
  name[KEXD_JOB_NAME_MAX] = 'n';
  name[KEXD_JOB_NAME_MAX + 1] = '\0';
  assert_int_equal(open_refused(name, "p", fx.anon, why, sizeof why), KEX_EINVAL);
  assert_non_null(strstr(why, "the name is 257 bytes, more than the limit of 256"));
  job = open_ok(NULL, NULL, fx.anon); /* no name, no peer */
  assert_string_equal(job->name, "");
}

/* The sweep closes jobs idle past their lease, never a held one. */
static void test_lease_expiry(void **state) {
  (void)state;
  kexd_job *stale = open_ok("stale", "p", fx.anon), *held = open_ok("held", "p", fx.anon);
  kexd_job *fresh = open_ok("fresh", "p", fx.anon);
  uint64_t stale_id = stale->id;
  idle_for(stale, 61000);
  idle_for(held, 61000);
  held->held = true;
  for (int i = 0; i < 100 && !fx.jobs.expired; i++) uv_run(&fx.loop, UV_RUN_ONCE); /* the sweep's timer */
  assert_int_equal(fx.jobs.expired, 1);
  assert_null(kexd_jobs_find_id(&fx.jobs, stale_id));
  assert_ptr_equal(kexd_jobs_find_id(&fx.jobs, held->id), held);
  assert_ptr_equal(kexd_jobs_find_id(&fx.jobs, fresh->id), fresh);
}

static kexd_buffer *add_buffer(kexd_job *job, uint32_t device, uint64_t bytes) {
  static const int64_t shape[1] = {4};
  kexd_buffer *b = NULL;
  assert_int_equal(kexd_job_add_buffer(&fx.jobs, job, NULL, device, KEX_DT_FLOAT32, shape, 1, bytes, &b), 0);
  return b;
}

/* A job's memory limit counts what its buffers hold and its uploads reserve; its buffer count is bounded too. */
static void test_memory_and_buffers(void **state) {
  (void)state;
  kex_error err = {0};
  kexd_job *job = NULL, *other;
  fx.jobs.max_buffers = 3;
  assert_int_equal(kexd_jobs_open(&fx.jobs, "m", 2, 100, "p", fx.anon, &job, &err), 0);
  other = open_ok("other", "p", fx.anon);
  assert_int_equal(job->weight, 2);
  assert_int_equal(kexd_job_reserve(job, 60, &err), 0);
  assert_int_equal(kexd_job_reserve(job, 41, &err), KEX_ELIMIT);
  assert_non_null(strstr(err.msg, "job 'm' would hold 101 bytes, over its memory limit of 100 bytes"));
  assert_int_equal(kexd_job_reserve(job, 40, &err), 0); /* exactly the limit */
  assert_int_equal(kexd_job_reserve(job, UINT64_MAX, &err), KEX_ELIMIT); /* no wrap-around */
  assert_int_equal(fx.anon->bytes_reserved, 100);
  /* the upload lands: reserved becomes held, on the job, its tenant and its device */
  kexd_job_unreserve(job, 60);
  kexd_buffer *b = add_buffer(job, 1, 60);
  assert_int_equal(job->bytes_held, 60);
  assert_int_equal(fx.anon->bytes_held, 60);
  assert_int_equal(fx.jobs.held_by_device[1], 60);
  assert_int_equal(kexd_job_reserve(job, 1, &err), KEX_ELIMIT);
  kexd_job_unreserve(job, 1000); /* more than reserved: gives back what there is */
  assert_int_equal(job->bytes_reserved, 0);
  assert_int_equal(fx.anon->bytes_reserved, 0);
  /* handles: found in their job only */
  assert_int_equal(strlen(b->handle), KEXD_HANDLE_LEN);
  assert_ptr_equal(kexd_job_find_buffer(job, b->handle), b);
  assert_null(kexd_job_find_buffer(other, b->handle));
  assert_int_equal(kexd_job_free_buffer(&fx.jobs, other, b->handle), KEX_ENOTFOUND);
  /* the buffer count: 3 held, the 4th upload is refused */
  add_buffer(job, 0, 10);
  kexd_buffer *c = add_buffer(job, 0, 10);
  assert_int_equal(kexd_job_reserve(job, 1, &err), KEX_ELIMIT);
  assert_non_null(strstr(err.msg, "job 'm' holds 3 buffers, the limit (--max-buffers-per-job)"));
  char handle[KEXD_HANDLE_LEN + 1];
  memcpy(handle, c->handle, sizeof handle);
  assert_int_equal(kexd_job_free_buffer(&fx.jobs, job, handle), 0);
  assert_null(kexd_job_find_buffer(job, handle));
  assert_int_equal(kexd_job_free_buffer(&fx.jobs, job, handle), KEX_ENOTFOUND);
  assert_int_equal(kexd_job_reserve(job, 1, &err), 0);
  assert_int_equal(job->bytes_held, 70);
  /* a Download's reference keeps the buffer past its job's close: its bytes stay charged to the tenant and its
     device until the last reference goes (pinned bytes are never uncounted) */
  kexd_buffer_ref(b);
  assert_int_equal(kexd_jobs_close_job(&fx.jobs, job->token), 0);
  assert_int_equal(fx.anon->bytes_held, 60);
  assert_int_equal(fx.anon->bytes_reserved, 0);
  assert_int_equal(fx.jobs.held_by_device[0], 0);
  assert_int_equal(fx.jobs.held_by_device[1], 60);
  assert_int_equal(fx.jobs.buffers_freed, 2);
  assert_int_equal(b->bytes, 60);
  kexd_buffer_unref(&fx.jobs, b);
  assert_int_equal(fx.jobs.buffers_freed, 3);
  assert_int_equal(fx.anon->bytes_held, 0);
  assert_int_equal(fx.jobs.held_by_device[1], 0);
}

/*
 * The compile budget: unlimited waits for nothing; a bucket starts full, a
 * compile that starts with any left may overdraw it, and the wait is the
 * debt over the refill rate; the refill stops at a full bucket; a shrunk
 * bucket keeps its debt, a grown one is not filled by growing.
 */
static void test_compile_budget(void **state) {
  (void)state;
  kexd_tenant_use *u = kexd_jobs_tenant_use(&fx.jobs, "alice");
  assert_non_null(u);
  assert_true(kexd_tenant_budget_wait(u, 0) == 0); /* no budget: unlimited */
  kexd_tenant_budget_charge(u, 1e6, 0);
  assert_true(kexd_tenant_budget_wait(u, 0) == 0); /* and never charged */
  kexd_tenant_budget_set(u, 36, false, 1000);     /* 36 s per hour: 0.01 s per s */
  assert_true(u->compile_left_s == 36 && !u->compile_budget_flag);
  kexd_tenant_budget_charge(u, 35.75, 1000);
  assert_true(kexd_tenant_budget_wait(u, 1000) == 0); /* 0.25 s left: a compile may start */
  kexd_tenant_budget_charge(u, 2.25, 1000);           /* it took 2.25 s: 2 s of debt */
  assert_float_equal(kexd_tenant_budget_wait(u, 1000), 200, 1e-6);
  assert_float_equal(kexd_tenant_budget_wait(u, 101000), 100, 1e-6); /* 100 s later, 1 s refilled */
  assert_true(kexd_tenant_budget_wait(u, 201000) > 0);   /* empty exactly: still the next refill's */
  assert_true(kexd_tenant_budget_wait(u, 201001) == 0);
  assert_true(kexd_tenant_budget_wait(u, 999999999) == 0);
  assert_float_equal(u->compile_left_s, 36, 1e-9);     /* full, never more */
  kexd_tenant_budget_set(u, 10, true, 999999999);        /* smaller: at most full */
  assert_true(u->compile_left_s == 10 && u->compile_budget_flag);
  kexd_tenant_budget_charge(u, 12, 999999999);
  kexd_tenant_budget_set(u, 3600, false, 999999999);     /* larger: the debt stays */
  assert_float_equal(kexd_tenant_budget_wait(u, 999999999), 2, 1e-6);
  kexd_tenant_budget_set(u, 0, false, 999999999);        /* unlimited again */
  assert_true(kexd_tenant_budget_wait(u, 999999999) == 0);
  kexd_tenant_budget_set(u, 5, false, 999999999);        /* limited again: full */
  assert_true(u->compile_left_s == 5);
}

int main(void) {
  kex_log_set_level(KEX_LOG_WARN);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_open_find_close), T(test_tokens_of_nodes), T(test_job_limit_and_eviction), T(test_close_hook),
      T(test_peer_limit),      T(test_name_limit),      T(test_lease_expiry),           T(test_memory_and_buffers),
      T(test_compile_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_stream.c - the server-stream writer (daemon/stream.c) on its own
 * loop, with fakecall.c's call taking the writes (each outstanding until
 * the test completes it, as gRPC's write batch would).
 *
 * Events pushed from another thread reach the loop and are written in
 * the order pushed, one write at a time, each offered as "more to follow"
 * exactly when another event is queued behind it (or the owner promises
 * one); nothing is drained while the owner holds work; the owner is
 * released exactly once, only when the call is over and nothing is held,
 * referenced or being written.  A write that breaks ends the call
 * CANCELLED naming the method and tells the owner; a client cancel does
 * too; a last message sent with the status reports whether it went out.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <grpc/status.h>

#include "core/alloc.h"
#include "daemon/stream.h"
#include "grpc/health/v1/health.pb-c.h"
#include "tests/fuzz/fakecall.h"

#define MAX_EVENTS 32

typedef struct event {
  kexd_stream_ev base; /* first: the stream frees the event */
  uint32_t seq;
} event;

/* What drained does: nothing (wait), finish the call, or finish it with a last message. */
typedef enum on_drained { WAIT, FINISH, FINISH_LAST } on_drained;

typedef struct owner {
  kexd_stream st;
  on_drained drained_does;
  bool promise_more;                 /* ops->more's answer */
  uint32_t written[MAX_EVENTS], nwritten;
  bool more_of[MAX_EVENTS];          /* whether each write was offered as "more to follow" */
  uint32_t drained, cancelled, released;
  bool delivered_at_release;
} owner;

static struct {
  uv_loop_t loop;
  kexd_streams *hub;
  kexd_call call;
  owner o;
} fx;

static const Grpc__Health__V1__HealthCheckResponse serving_msg = {
    PROTOBUF_C_MESSAGE_INIT(&grpc__health__v1__health_check_response__descriptor),
    GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING};

static void on_event(void *ud, kexd_stream_ev *ev) {
  owner *o = ud;
  assert_int_equal(kexd_stream_write(&o->st, &serving_msg.base), 0);
  assert_true(o->nwritten < MAX_EVENTS);
  o->more_of[o->nwritten] = fx.call.write_more;
  o->written[o->nwritten++] = ((event *)ev)->seq;
}

static void on_drained_cb(void *ud) {
  owner *o = ud;
  o->drained++;
  if (o->drained_does == FINISH) kexd_stream_finish(&o->st, GRPC_STATUS_OK, NULL, NULL);
  if (o->drained_does == FINISH_LAST) kexd_stream_finish_last(&o->st, &serving_msg.base);
}

static void on_cancelled(void *ud) { ((owner *)ud)->cancelled++; }

static void on_release(void *ud) {
  owner *o = ud;
  o->released++;
  o->delivered_at_release = kexd_stream_delivered(&o->st);
}

static bool on_more(void *ud) { return ((owner *)ud)->promise_more; }

static const kexd_stream_ops ops = {"Test", on_event, on_drained_cb, on_cancelled, on_release, NULL, on_more};

static int setup(void **state) {
  (void)state;
  memset(&fx, 0, sizeof fx);
  if (uv_loop_init(&fx.loop) < 0 || kexd_streams_new(&fx.loop, &fx.hub) < 0) return -1;
  fx.call.method = "/kex.v1.Kex/Test";
  fx.call.refs = 1; /* the handler's, released by the finish */
  fx.call.accept_writes = true;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  kexd_streams_close(fx.hub);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  kexd_streams_free(fx.hub);
  return uv_loop_close(&fx.loop);
}

static event *new_event(uint32_t seq) {
  event *e = kex_calloc(1, sizeof *e);
  assert_non_null(e);
  e->seq = seq;
  return e;
}

/* Another thread pushes events 0..4 on stream `st` (as a worker's progress does). */
static void *push_five(void *st) {
  for (uint32_t i = 0; i < 5; i++) kexd_stream_push(st, &new_event(i)->base);
  return NULL;
}

/* Start the owner's stream on the fixture's call, drained doing `does`; with `hold`, work in flight. */
static owner *start(on_drained does, bool hold) {
  owner *o = &fx.o;
  o->drained_does = does;
  kexd_stream_start(&o->st, fx.hub, &fx.call, &ops, o);
  if (hold) kexd_stream_hold(&o->st);
  return o;
}

/* The owner was released exactly once, and the call holds no reference any more. */
static void expect_released(const owner *o) {
  assert_int_equal(o->released, 1);
  assert_int_equal(fx.call.refs, 0);
}

/* Run the loop until the first of the pushed events is being written. */
static void run_until_writing(void) {
  for (int i = 0; i < 1000 && !fx.call.write_pending; i++) uv_run(&fx.loop, UV_RUN_ONCE);
  assert_true(fx.call.write_pending);
}

static void test_events_in_order_one_write_at_a_time(void **state) {
  (void)state;
  owner *o = start(FINISH, true); /* held: the work that pushes */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, push_five, &o->st), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  run_until_writing();
  for (uint32_t i = 0; i < 5; i++) {
    assert_int_equal(o->nwritten, i + 1);
    assert_true(fx.call.write_pending);
    fuzz_call_complete_write(&fx.call, 1); /* the next one is written from its completion */
  }
  assert_int_equal(o->nwritten, 5);
  for (uint32_t i = 0; i < 5; i++) {
    assert_int_equal(o->written[i], i);
    assert_int_equal(o->more_of[i], i < 4); /* the last had nothing queued behind it */
  }
  assert_int_equal(fx.call.overlapping, 0);
  /* held: not drained, not finished */
  assert_int_equal(o->drained, 0);
  assert_false(fx.call.finished);
  /* the work is back: drained finishes the call, and the owner is released once */
  kexd_stream_unhold(&o->st);
  assert_int_equal(o->drained, 1);
  assert_true(fx.call.finished);
  assert_int_equal(fx.call.status, GRPC_STATUS_OK);
  expect_released(o);
  assert_int_equal(o->cancelled, 0);
}

/* Events pushed on the loop thread need no wake: the owner's pump writes them. */
static void test_loop_push_and_more_promise(void **state) {
  (void)state;
  owner *o = start(WAIT, false);
  o->promise_more = true;
  kexd_stream_push(&o->st, &new_event(7)->base);
  kexd_stream_pump(&o->st);
  assert_int_equal(o->nwritten, 1);
  assert_true(o->more_of[0]); /* nothing queued, but the owner promised more */
  fuzz_call_complete_write(&fx.call, 1);
  assert_int_equal(o->drained, 1); /* waited: did nothing */
  assert_int_equal(o->released, 0);
  /* a reference keeps the owner past the finish */
  kexd_stream_ref(&o->st);
  kexd_stream_finish(&o->st, GRPC_STATUS_OK, NULL, NULL);
  kexd_stream_finish(&o->st, GRPC_STATUS_INTERNAL, "twice", NULL); /* idempotent */
  assert_int_equal(fx.call.status, GRPC_STATUS_OK);
  assert_int_equal(o->released, 0);
  kexd_stream_unref(&o->st);
  expect_released(o);
}

/* A write that breaks: the owner is told, the call ends CANCELLED naming the method, release waits for the hold. */
static void test_broken_write(void **state) {
  (void)state;
  owner *o = start(FINISH, true);
  kexd_stream_push(&o->st, &new_event(0)->base);
  kexd_stream_push(&o->st, &new_event(1)->base);
  kexd_stream_pump(&o->st);
  assert_int_equal(o->nwritten, 1);
  fuzz_call_complete_write(&fx.call, 0);
  assert_int_equal(o->cancelled, 1);
  assert_true(kexd_stream_dead(&o->st));
  assert_true(fx.call.finished);
  assert_int_equal(fx.call.status, GRPC_STATUS_CANCELLED);
  assert_string_equal(fx.call.details, "Test: the stream broke");
  assert_int_equal(o->nwritten, 1); /* the queued event is not written */
  assert_int_equal(kexd_stream_write(&o->st, &serving_msg.base), KEX_EINVAL);
  kexd_stream_push(&o->st, &new_event(2)->base); /* freed with the stream */
  assert_int_equal(o->released, 0);
  kexd_stream_unhold(&o->st);
  expect_released(o);
  assert_int_equal(o->drained, 0);
  assert_int_equal(o->cancelled, 1);
}

/* The client cancels while work is held: the owner is told at once, released when the work is back. */
static void test_client_cancel(void **state) {
  (void)state;
  owner *o = start(FINISH, true);
  fuzz_call_cancel(&fx.call);
  assert_int_equal(o->cancelled, 1);
  assert_true(kexd_stream_dead(&o->st));
  assert_int_equal(o->released, 0);
  kexd_stream_unhold(&o->st);
  expect_released(o);
  assert_int_equal(o->drained, 0);
  assert_int_equal(fx.call.status, GRPC_STATUS_CANCELLED);
}

/* The last message goes with the status; the owner learns it went out. */
static void test_finish_last(void **state) {
  (void)state;
  owner *o = start(FINISH_LAST, false);
  kexd_stream_pump(&o->st);
  assert_int_equal(o->drained, 1);
  assert_true(fx.call.finished);
  assert_int_equal(fx.call.status, GRPC_STATUS_OK);
  expect_released(o);
  assert_true(o->delivered_at_release);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_events_in_order_one_write_at_a_time), T(test_loop_push_and_more_promise), T(test_broken_write),
      T(test_client_cancel), T(test_finish_last),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

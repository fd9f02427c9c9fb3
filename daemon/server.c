/*
 * server.c - gRPC C core <-> libuv: the completion-queue thread, the call
 * state machine and graceful shutdown (../shared/notes/stack.md sections 1-2).
 * The types it shares with call.c (what a handler reads about its call) are
 * in server_int.h.
 *
 * Threads: the cq thread only waits in grpc_completion_queue_next, appends
 * each completed tag to a locked FIFO and wakes the loop (its kexd_wake:
 * the loop bridge, bridge.h, which coalesces, so the loop always drains the whole list).  The loop
 * thread owns every call object and runs every tag's handler; it is the only
 * thread that starts batches or posts requests.
 *
 * The harvest: after starting a stream message's write (kexd_call_write_more),
 * the loop, before it sleeps (a uv_prepare handle), takes the completions
 * already on the queue and runs them at once.  A stream's next message can
 * only start when the last one's write completed, so that completion
 * costs no hop through the cq thread (two thread wake-ups) and the next
 * message goes out sooner.  Only then: a second thread in
 * grpc_completion_queue_next finds the cq thread polling, waits on a
 * condition variable with a past deadline and wakes it, futex calls on
 * both threads, which a call that ends in one batch (a unary reply, a
 * batched Submit: message and status together) would pay for nothing
 * (bench/results/rpc.md: harvesting before every sleep cost kexd 11-16%
 * more CPU per batched Submit).  The two paths may run one
 * call's tags in a different order than the queue had them; the handlers
 * depend on no order between a call's different batches (gRPC promises
 * none).
 *
 * A call object is reference counted: one reference per outstanding
 * operation (the posted request, each batch) plus the handler's, released
 * by kexd_call_finish or by a client cancel.  It is freed when the count
 * reaches zero, never inside the handler that is using it.
 *
 * Shutdown order (stack.md section 1, steps 17-21): shutdown_and_notify ->
 * on_stop hooks of active calls -> grace timer -> cancel_all_calls -> wait
 * for the shutdown tag and the last call object -> grpc_server_destroy ->
 * completion queue shutdown -> the cq thread sees GRPC_QUEUE_SHUTDOWN, says
 * so and exits -> the loop joins it, closes its handles, calls on_stopped.
 */
#include "daemon/server.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/server_int.h"

#define SERVER_PREPOST_PER_METHOD 8 /* requests kept posted per registered method */
#define SERVER_PREPOST_GENERIC 4    /* generic requests kept posted (unknown methods) */
#define SERVER_DETAILS_MAX 512      /* bytes of a status message built here */
#define SERVER_KEEPALIVE_TIMEOUT_MS 20000 /* a keepalive ping unanswered this long closes the connection */
#define SERVER_HARVEST_MAX 64       /* completions the loop takes off the queue itself before it sleeps */

static void call_unref(kexd_call *c);
static void maybe_finalize(kexd_server *s);

/* Count a finished call under its method (unregistered paths together) and status (UNKNOWN when out of range). */
static void count_status(kexd_call *c, int status) {
  uint64_t *codes = c->m ? ((method *)c->m)->codes : c->srv->unknown_codes;
  codes[status >= 0 && status < KEXD_STATUS_CODES ? status : GRPC_STATUS_UNKNOWN]++;
  if (c->srv->opts.on_end) c->srv->opts.on_end(c, status, c->srv->opts.call_ud);
}

/* ---- the cq thread ---- */

static void tag_push(kexd_server *s, tag *t) {
  pthread_mutex_lock(&s->lock);
  t->next = NULL;
  if (s->tail) s->tail->next = t;
  else s->head = t;
  s->tail = t;
  pthread_mutex_unlock(&s->lock);
}

/* The only thread besides the loop: waits on the queue, forwards tags, exits at GRPC_QUEUE_SHUTDOWN. */
static void *cq_thread_main(void *arg) {
  kexd_server *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    tag *t = ev.tag;
    t->success = ev.success;
    tag_push(s, t);
    kexd_wake_send(&s->wake);
  }
  pthread_mutex_lock(&s->lock);
  s->cq_done = true;
  pthread_mutex_unlock(&s->lock);
  kexd_wake_send(&s->wake);
  return NULL;
}

static void handle_closed(kexd_server *s) {
  if (--s->handles_open == 0 && s->opts.on_stopped) s->opts.on_stopped(s->opts.ud);
}

static void on_handle_closed(uv_handle_t *h) { handle_closed(h->data); }
static void on_wake_closed(kexd_wake *w) { handle_closed(w->data); }

/* Loop side of the hop: run every queued tag; after the cq thread is done, join it and close the handles. */
static void on_async(kexd_wake *w) {
  kexd_server *s = w->data;
  tag *t;
  bool done;
  pthread_mutex_lock(&s->lock);
  t = s->head;
  s->head = s->tail = NULL;
  done = s->cq_done;
  pthread_mutex_unlock(&s->lock);
  while (t) {
    tag *next = t->next; /* read first: the handler may re-queue or free t */
    t->fn(t);
    t = next;
  }
  if (done && !s->thread_joined) {
    pthread_join(s->cq_thread, NULL);
    s->thread_joined = true;
    kexd_wake_close(&s->wake, on_wake_closed);
    uv_close((uv_handle_t *)&s->grace, on_handle_closed);
    uv_close((uv_handle_t *)&s->harvest, on_handle_closed);
  }
}

/* Before the loop sleeps, when a stream write is out: run the completions already queued (see Threads above). */
static void on_harvest(uv_prepare_t *p) {
  kexd_server *s = p->data;
  if (!s->harvest_due) return;
  s->harvest_due = false;
  for (int i = 0; i < SERVER_HARVEST_MAX && !s->server_destroyed; i++) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;
    tag *t = ev.tag;
    t->success = ev.success;
    t->fn(t);
  }
}

/* ---- call objects ---- */

#define CALL_FROM(t, field) ((kexd_call *)((char *)(t) - offsetof(kexd_call, field)))

static void call_free(kexd_call *c) {
  kexd_server *s = c->srv;
  if (c->call) grpc_call_unref(c->call);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->read_bb) grpc_byte_buffer_destroy(c->read_bb);
  grpc_metadata_array_destroy(&c->md);
  if (c->generic) grpc_call_details_destroy(&c->details);
  kex_free(c->method_name);
  kex_free(c);
  s->nobjects--;
  maybe_finalize(s);
}

static void call_unref(kexd_call *c) {
  if (--c->refs == 0) call_free(c);
}

void kexd_call_ref(kexd_call *c) { c->refs++; }
void kexd_call_unref(kexd_call *c) { call_unref(c); }

static void active_remove(kexd_call *c) {
  kexd_server *s = c->srv;
  if (!c->active) return;
  c->active = false;
  if (c->prev) c->prev->next = c->next;
  else s->active = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
  s->nactive--;
}

static void active_add(kexd_call *c) {
  kexd_server *s = c->srv;
  c->active = true;
  c->prev = NULL;
  c->next = s->active;
  if (s->active) s->active->prev = c;
  s->active = c;
  s->nactive++;
}

static void on_new_call(tag *t);
static void on_close(tag *t);
static void on_recv(tag *t);
static void on_write(tag *t);
static void on_finish(tag *t);
static void on_read(tag *t);

/* Post one request for method m (NULL: generic).  0 or a negative code; logged. */
static int post_request(kexd_server *s, const method *m) {
  kexd_call *c = kex_calloc(1, sizeof *c + s->opts.call_ext_size);
  grpc_call_error e;
  if (!c) {
    KEX_ERROR("server: out of memory posting a request");
    return KEX_ENOMEM;
  }
  c->srv = s;
  c->m = m;
  c->generic = m == NULL;
  c->refs = 1; /* the posted request */
  c->t_new.fn = on_new_call;
  c->t_close.fn = on_close;
  c->t_recv.fn = on_recv;
  c->t_write.fn = on_write;
  c->t_finish.fn = on_finish;
  c->t_read.fn = on_read;
  grpc_metadata_array_init(&c->md);
  s->nobjects++;
  if (m)
    e = grpc_server_request_registered_call(s->server, m->registered, &c->call, &c->deadline, &c->md,
                                            m->payload == KEXD_PAYLOAD_ONE ? &c->payload : NULL, s->cq, s->cq,
                                            &c->t_new);
  else {
    grpc_call_details_init(&c->details);
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq, &c->t_new);
  }
  if (e != GRPC_CALL_OK) {
    KEX_ERROR("server: cannot post a request for %s: %s", m ? m->path : "any method", grpc_call_error_to_string(e));
    call_unref(c);
    return KEX_EINTERNAL;
  }
  return 0;
}

/* Start a batch on c holding one reference; the reference is dropped again if grpc refuses it. */
static int start_batch(kexd_call *c, const grpc_op *ops, size_t n, tag *t) {
  grpc_call_error e;
  c->refs++;
  e = grpc_call_start_batch(c->call, ops, n, t, NULL);
  if (e != GRPC_CALL_OK) {
    KEX_ERROR("server: %s: grpc_call_start_batch: %s", kexd_call_method(c), grpc_call_error_to_string(e));
    c->refs--;
    return KEX_EINTERNAL;
  }
  return 0;
}

/* The gate hook: true when the handler may run. */
static bool s_gate(kexd_call *c) { return !c->srv->opts.gate || c->srv->opts.gate(c, c->srv->opts.call_ud); }

/* Hand the request bytes (if any) to the method's handler, if the gate lets it. */
static void dispatch(kexd_call *c) {
  const uint8_t *req = NULL;
  size_t len = 0;
  grpc_byte_buffer_reader r;
  grpc_slice all;
  bool have = false;
  if (c->payload && grpc_byte_buffer_reader_init(&r, c->payload)) {
    all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    have = true;
    req = GRPC_SLICE_START_PTR(all);
    len = GRPC_SLICE_LENGTH(all);
    if (!req) req = (const uint8_t *)""; /* an empty message is still a message */
  }
  if (c->payload) {
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
  }
  if (s_gate(c)) c->m->fn(c, req, len, c->m->ud);
  if (have) grpc_slice_unref(all);
}

/* A request matched a call (success) or was killed by shutdown (failure). */
static void on_new_call(tag *t) {
  kexd_call *c = CALL_FROM(t, t_new);
  kexd_server *s = c->srv;
  grpc_op op;
  if (!t->success) {
    call_unref(c); /* a pending request returned at shutdown */
    return;
  }
  if (!s->stopping) post_request(s, c->m); /* re-post first: keep the method accepting */
  s->stats.calls++;
  c->arrived = gpr_now(GPR_CLOCK_MONOTONIC);
  active_add(c); /* the request's reference becomes the handler's */
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (start_batch(c, &op, 1, &c->t_close) < 0) {
    kexd_call_finish(c, GRPC_STATUS_INTERNAL, "server could not watch the call", NULL);
    return;
  }
  if (c->generic) {
    char *path = grpc_slice_to_c_string(c->details.method);
    c->method_name = kex_strdup(path ? path : "?");
    gpr_free(path);
    for (uint32_t i = 0; c->method_name && i < s->nmethods; i++)
      if (strcmp(s->methods[i].path, c->method_name) == 0) c->m = &s->methods[i];
    if (!c->m) { /* the gate first: a caller it refuses learns nothing of which methods exist */
      if (s_gate(c)) {
        s->stats.unimplemented++;
        kex_log(KEX_LOG_DEBUG, NULL, 0, "unknown method %s: UNIMPLEMENTED", c->method_name ? c->method_name : "?");
        kexd_call_failf(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method %s", c->method_name ? c->method_name : "?");
      }
      return;
    }
    if (c->m->payload == KEXD_PAYLOAD_ONE) {
      memset(&op, 0, sizeof op);
      op.op = GRPC_OP_RECV_MESSAGE;
      op.data.recv_message.recv_message = &c->payload;
      if (start_batch(c, &op, 1, &c->t_recv) < 0)
        kexd_call_finish(c, GRPC_STATUS_INTERNAL, "server could not read the request", NULL);
      return;
    }
  }
  dispatch(c);
}

/* The generic path's request message arrived. */
static void on_recv(tag *t) {
  kexd_call *c = CALL_FROM(t, t_recv);
  if (!c->finished) {
    if (!t->success) kexd_call_finish(c, GRPC_STATUS_INTERNAL, "server could not read the request", NULL);
    else dispatch(c);
  }
  call_unref(c);
}

/* The call is over; cancelled = cancel, deadline, network error or cancel_all_calls. */
static void on_close(tag *t) {
  kexd_call *c = CALL_FROM(t, t_close);
  if (c->close_cancelled && !c->finished) {
    c->cancelled = true;
    kex_log(KEX_LOG_DEBUG, NULL, 0, "%s: cancelled by the client or the server", kexd_call_method(c));
    if (c->on_cancel) c->on_cancel(c, c->hook_ud);
    if (!c->finished) { /* finished for the handler: release its reference */
      c->finished = true;
      count_status(c, GRPC_STATUS_CANCELLED);
      active_remove(c);
      call_unref(c);
    }
  } else if (c->close_cancelled) {
    c->cancelled = true;
  }
  call_unref(c);
}

static void on_write(tag *t) {
  kexd_call *c = CALL_FROM(t, t_write);
  void (*done)(kexd_call *, int, void *) = c->write_done;
  c->writing = false;
  if (c->write_bb) grpc_byte_buffer_destroy(c->write_bb);
  c->write_bb = NULL;
  c->write_done = NULL;
  if (done) done(c, t->success && !c->cancelled, c->write_ud);
  call_unref(c);
}

/* One client-stream message arrived (or the stream ended, or the call died). */
static void on_read(tag *t) {
  kexd_call *c = CALL_FROM(t, t_read);
  kexd_read_cb done = c->read_done;
  void *ud = c->read_ud;
  grpc_byte_buffer *bb = c->read_bb;
  grpc_byte_buffer_reader r;
  c->reading = false;
  c->read_bb = NULL;
  c->read_done = NULL;
  if (!t->success || c->cancelled) {
    if (done) done(c, NULL, 0, 0, ud);
  } else if (!bb) {
    if (done) done(c, NULL, 0, 1, ud); /* the client half-closed: end of stream */
  } else if (grpc_byte_buffer_reader_init(&r, bb)) {
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    const uint8_t *p = GRPC_SLICE_START_PTR(all);
    grpc_byte_buffer_reader_destroy(&r);
    if (done) done(c, p ? p : (const uint8_t *)"", GRPC_SLICE_LENGTH(all), 1, ud);
    grpc_slice_unref(all);
  } else if (done) {
    done(c, NULL, 0, 0, ud);
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  call_unref(c);
}

int kexd_call_read(kexd_call *c, kexd_read_cb done, void *ud) {
  grpc_op op;
  if (c->finished || c->reading || !done) return KEX_EINVAL;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->read_bb;
  c->read_done = done;
  c->read_ud = ud;
  c->reading = true;
  if (start_batch(c, &op, 1, &c->t_read) < 0) {
    c->reading = false;
    c->read_done = NULL;
    return KEX_EINTERNAL;
  }
  return 0;
}

static void on_finish(tag *t) {
  kexd_call *c = CALL_FROM(t, t_finish);
  void (*done)(kexd_call *, int, void *) = c->finish_done;
  int sent = c->finish_bb != NULL; /* the last message was part of the batch */
  if (c->finish_bb) grpc_byte_buffer_destroy(c->finish_bb);
  c->finish_bb = NULL;
  c->finish_done = NULL;
  if (done) done(c, t->success && sent, c->finish_ud);
  call_unref(c);
}

/* A byte buffer holding msg packed; NULL with *size set when it is over max. */
static grpc_byte_buffer *pack_message(const kexd_server *s, const ProtobufCMessage *msg, size_t *size) {
  grpc_slice sl;
  grpc_byte_buffer *bb;
  *size = protobuf_c_message_get_packed_size(msg);
  if (s->opts.max_message > 0 && *size > (size_t)s->opts.max_message) return NULL;
  sl = grpc_slice_malloc(*size);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
  bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

int kexd_call_write(kexd_call *c, const ProtobufCMessage *msg, void (*done)(kexd_call *, int, void *), void *ud) {
  return kexd_call_write_more(c, msg, false, done, ud);
}

int kexd_call_write_more(kexd_call *c, const ProtobufCMessage *msg, bool more, void (*done)(kexd_call *, int, void *),
                         void *ud) {
  grpc_op ops[2];
  size_t n = 0, size;
  grpc_byte_buffer *bb;
  if (c->finished || c->writing) return KEX_EINVAL;
  if (!(bb = pack_message(c->srv, msg, &size))) {
    KEX_WARN("%s: stream message of %zu bytes is more than the limit of %d", kexd_call_method(c), size,
             c->srv->opts.max_message);
    return KEX_ELIMIT;
  }
  memset(ops, 0, sizeof ops);
  if (!c->initial_md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->initial_md_sent = true;
  } else if (more) { /* see server.h: with the initial metadata the completion would wait for the flush */
    ops[n].flags = GRPC_WRITE_BUFFER_HINT;
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = bb;
  c->write_bb = bb;
  c->write_done = done;
  c->write_ud = ud;
  c->writing = true;
  if (start_batch(c, ops, n, &c->t_write) < 0) {
    c->writing = false;
    c->write_bb = NULL;
    c->write_done = NULL;
    grpc_byte_buffer_destroy(bb);
    return KEX_EINTERNAL;
  }
  c->srv->harvest_due = true; /* the next message waits for this write's completion: take it before sleeping */
  return 0;
}

bool kexd_call_writing(const kexd_call *c) { return c->writing; }

int kexd_call_finish(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg) {
  return kexd_call_finish_notify(c, status, details, msg, NULL, NULL);
}

int kexd_call_finish_notify(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg,
                            void (*done)(kexd_call *, int ok, void *ud), void *ud) {
  kexd_server *s = c->srv;
  grpc_op ops[3];
  size_t n = 0, size = 0;
  grpc_byte_buffer *bb = NULL;
  char big[SERVER_DETAILS_MAX];
  grpc_slice det;
  int rc = 0;
  if (c->finished) return KEX_ECANCELLED; /* cancelled first: the handler's reference is gone already */
  c->finished = true;
  active_remove(c);
  if (msg && status == GRPC_STATUS_OK && c->writing) {
    KEX_ERROR("%s: finish with a message while a write is pending", kexd_call_method(c));
    status = GRPC_STATUS_INTERNAL;
    details = "server error: reply while a write is pending";
  }
  if (msg && status == GRPC_STATUS_OK && !(bb = pack_message(s, msg, &size))) {
    snprintf(big, sizeof big, "the reply is %zu bytes, more than the server's limit of %d bytes (--max-message)",
             size, s->opts.max_message);
    status = GRPC_STATUS_RESOURCE_EXHAUSTED;
    details = big;
  }
  memset(ops, 0, sizeof ops);
  if (!c->initial_md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->initial_md_sent = true;
  }
  if (bb) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
  }
  det = details ? grpc_slice_from_copied_string(details) : grpc_empty_slice();
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)status;
  ops[n++].data.send_status_from_server.status_details = &det;
  c->finish_bb = bb;
  c->finish_done = done;
  c->finish_ud = ud;
  if (status != GRPC_STATUS_OK) s->stats.calls_failed++;
  count_status(c, status);
  if ((rc = start_batch(c, ops, n, &c->t_finish)) < 0) {
    c->finish_bb = NULL;
    c->finish_done = NULL;
    if (bb) grpc_byte_buffer_destroy(bb);
  }
  grpc_slice_unref(det); /* copied by start_batch */
  call_unref(c);         /* the handler's reference */
  return rc;
}

int kexd_call_failf(kexd_call *c, int status, const char *fmt, ...) {
  char msg[SERVER_DETAILS_MAX];
  KEX_VFORMAT(msg, fmt);
  return kexd_call_finish(c, status, msg, NULL);
}

/* ---- the server ---- */

/* Seconds as a gRPC millisecond argument; 0 or less: gRPC's default (INT_MAX: never). */
static int ms_arg(double s) {
  if (!(s > 0)) return INT_MAX;
  return s * 1000 >= INT_MAX ? INT_MAX : (int)(s * 1000 + 0.5);
}

int kexd_server_new(uv_loop_t *loop, const kexd_server_opts *opts, kexd_server **out) {
  kexd_server *s = NULL;
  grpc_arg args[9];
  grpc_channel_args cargs;
  int rc = 0;
  *out = NULL;
  if (!(s = kex_calloc(1, sizeof *s)) || !(s->listen = kex_strdup(opts->listen))) {
    rc = KEX_ENOMEM;
    goto out;
  }
  s->loop = loop;
  s->opts = *opts;
  s->opts.listen = s->listen;
  s->t_shutdown.fn = NULL; /* set below; static function */
  pthread_mutex_init(&s->lock, NULL);
  memset(args, 0, sizeof args);
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = opts->max_message;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = opts->max_message;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT; /* a second kexd on a taken port must fail, not share it */
  args[2].value.integer = 0;
  args[3].type = GRPC_ARG_INTEGER; /* connections with no call this long are closed */
  args[3].key = (char *)GRPC_ARG_MAX_CONNECTION_IDLE_MS;
  args[3].value.integer = ms_arg(opts->idle_timeout_s);
  args[4].type = GRPC_ARG_INTEGER; /* ... and ones that never finish the HTTP/2 handshake */
  args[4].key = (char *)GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
  args[4].value.integer = ms_arg(opts->handshake_timeout_s);
  args[5].type = GRPC_ARG_INTEGER; /* a peer that vanished mid-call is noticed by an unanswered ping */
  args[5].key = (char *)GRPC_ARG_KEEPALIVE_TIME_MS;
  args[5].value.integer = ms_arg(opts->keepalive_s);
  args[6].type = GRPC_ARG_INTEGER;
  args[6].key = (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
  args[6].value.integer = SERVER_KEEPALIVE_TIMEOUT_MS;
  args[7].type = GRPC_ARG_INTEGER;
  args[7].key = (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS;
  args[7].value.integer = 1;
  args[8].type = GRPC_ARG_INTEGER; /* calls at once on one connection (HTTP/2 streams) */
  args[8].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
  args[8].value.integer = opts->max_streams > 0 ? opts->max_streams : INT_MAX;
  cargs.num_args = 9;
  cargs.args = args;
  s->server = grpc_server_create(&cargs, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  if (!s->server || !s->cq) {
    rc = KEX_EINTERNAL;
    goto out;
  }
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  *out = s;
  s = NULL;
out:
  if (s) kexd_server_free(s);
  return rc;
}

int kexd_server_add_method(kexd_server *s, const char *path, kexd_payload payload, kexd_handler fn, void *ud) {
  method *m;
  if (s->started || !path || path[0] != '/' || !fn) return KEX_EINVAL;
  if (s->nmethods == s->capmethods) {
    uint32_t cap = s->capmethods ? 2 * s->capmethods : 16;
    method *nm = kex_realloc(s->methods, cap * sizeof *nm);
    if (!nm) return KEX_ENOMEM;
    s->methods = nm;
    s->capmethods = cap;
  }
  m = &s->methods[s->nmethods];
  memset(m, 0, sizeof *m);
  if (!(m->path = kex_strdup(path))) return KEX_ENOMEM;
  m->payload = payload;
  m->fn = fn;
  m->ud = ud;
  m->registered = grpc_server_register_method(
      s->server, path, NULL,
      payload == KEXD_PAYLOAD_ONE ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER : GRPC_SRM_PAYLOAD_NONE, 0);
  if (!m->registered) {
    kex_free(m->path);
    return KEX_EINVAL;
  }
  s->nmethods++;
  return 0;
}

static void on_shutdown(tag *t) {
  kexd_server *s = (kexd_server *)((char *)t - offsetof(kexd_server, t_shutdown));
  s->shutdown_done = true;
  kex_log(KEX_LOG_DEBUG, NULL, 0, "server: shutdown tag arrived (%u call objects left)", s->nobjects);
  maybe_finalize(s);
}

int kexd_server_start(kexd_server *s) {
  grpc_server_credentials *creds;
  int rc = 0;
  s->t_shutdown.fn = on_shutdown;
  if (s->opts.tls_cert_pem) {
    grpc_ssl_pem_key_cert_pair pair = {s->opts.tls_key_pem, s->opts.tls_cert_pem};
    creds = grpc_ssl_server_credentials_create_ex(
        s->opts.tls_client_ca_pem, &pair, 1,
        s->opts.tls_client_ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (!creds) {
    KEX_ERROR("cannot create TLS credentials from %s and %s", s->opts.tls_cert_file, s->opts.tls_key_file);
    return KEX_EUNAVAILABLE;
  }
  s->port = grpc_server_add_http2_port(s->server, s->listen, creds);
  grpc_server_credentials_release(creds);
  if (s->port == 0 && s->opts.tls_cert_pem) {
    KEX_ERROR("cannot listen on %s with TLS: the address is in use or invalid, or gRPC refused the certificate "
              "%s with the key %s (not a certificate chain and its matching private key)",
              s->listen, s->opts.tls_cert_file, s->opts.tls_key_file);
    return KEX_EUNAVAILABLE;
  }
  if (s->port == 0) {
    KEX_ERROR("cannot listen on %s: the address is in use (is another kexd running?) or invalid", s->listen);
    return KEX_EUNAVAILABLE;
  }
  if (kexd_wake_init(s->loop, &s->wake, on_async, s) < 0 || uv_timer_init(s->loop, &s->grace) < 0 ||
      uv_prepare_init(s->loop, &s->harvest) < 0) {
    KEX_ERROR("server: cannot create the loop handles");
    return KEX_EINTERNAL;
  }
  s->grace.data = s->harvest.data = s;
  s->handles_open = 3;
  uv_prepare_start(&s->harvest, on_harvest);
  grpc_server_start(s->server);
  s->started = true;
  if (pthread_create(&s->cq_thread, NULL, cq_thread_main, s) != 0) {
    KEX_ERROR("server: cannot start the completion queue thread");
    rc = KEX_EINTERNAL;
    goto fail;
  }
  s->thread_started = true;
  for (uint32_t i = 0; i < s->nmethods; i++)
    for (int k = 0; k < SERVER_PREPOST_PER_METHOD; k++)
      if ((rc = post_request(s, &s->methods[i])) < 0) goto fail;
  for (int k = 0; k < SERVER_PREPOST_GENERIC; k++)
    if ((rc = post_request(s, NULL)) < 0) goto fail;
  return 0;
fail:
  kexd_server_stop(s);
  return rc;
}

int kexd_server_port(const kexd_server *s) { return s->port; }
bool kexd_server_stopping(const kexd_server *s) { return s->stopping; }
uint32_t kexd_server_calls_active(const kexd_server *s) { return s->nactive; }
const kexd_server_stats *kexd_server_get_stats(const kexd_server *s) { return &s->stats; }
uint32_t kexd_server_methods(const kexd_server *s) { return s->nmethods; }

const uint64_t *kexd_server_method_codes(const kexd_server *s, uint32_t i, const char **path) {
  *path = i < s->nmethods ? s->methods[i].path : NULL;
  return i < s->nmethods ? s->methods[i].codes : s->unknown_codes;
}

/* Grace is over: whatever is still in flight is cancelled (and idle client connections dropped). */
static void on_grace(uv_timer_t *t) {
  kexd_server *s = t->data;
  if (s->server_destroyed) return;
  KEX_INFO("shutdown: grace period over, cancelling %u call(s) still in flight", s->nactive);
  grpc_server_cancel_all_calls(s->server);
}

/* Once the shutdown tag and the last call object are in, destroy the server and shut the queue. */
static void maybe_finalize(kexd_server *s) {
  if (!s->stopping || !s->shutdown_done || s->nobjects || s->server_destroyed) return;
  s->server_destroyed = true;
  uv_timer_stop(&s->grace);
  grpc_server_destroy(s->server);
  s->server = NULL;
  grpc_completion_queue_shutdown(s->cq); /* no batch is started after this: no call objects are left */
}

void kexd_server_stop(kexd_server *s) {
  kexd_call *c, *next;
  if (s->stopping || !s->started) return;
  s->stopping = true;
  KEX_INFO("shutdown: no new calls; %u in flight get %.1f s to finish", s->nactive, s->opts.grace_s);
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  for (c = s->active; c; c = next) {
    next = c->next;
    if (c->on_stop) c->on_stop(c, c->hook_ud);
  }
  uv_timer_start(&s->grace, on_grace, (uint64_t)(s->opts.grace_s * 1000 + 0.5), 0);
  maybe_finalize(s);
}

void kexd_server_free(kexd_server *s) {
  if (!s) return;
  if (s->server) {
    /* never started, or start failed before the thread ran: nothing can be in flight */
    if (!s->started) grpc_server_destroy(s->server);
    else if (!s->server_destroyed) grpc_server_destroy(s->server);
    s->server = NULL;
  }
  if (s->cq) {
    if (!s->thread_started) {
      grpc_completion_queue_shutdown(s->cq);
      while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN) {
      }
    }
    grpc_completion_queue_destroy(s->cq);
  }
  for (uint32_t i = 0; i < s->nmethods; i++) kex_free(s->methods[i].path);
  kex_free(s->methods);
  pthread_mutex_destroy(&s->lock);
  kex_free(s->listen);
  kex_free(s);
}

/*
 * bench/rpc_c.c - kexd RPC latency and throughput from a C client
 * (build/bench_rpc; bench/rpc.py runs it and merges its JSON into
 * bench/results/rpc.json).
 *
 * Starts its own kexd (--device cpu, a fresh --cache in a temporary
 * directory, 127.0.0.1 on a free port) unless --server names one, and
 * measures, for --seconds each after a warm-up, at 1 and 8 calls in flight
 * (8 threads on one channel, each with its own completion queue and call
 * loop; the *_async kinds: one thread keeping 8 calls going).  The seconds are split in --rounds rounds that take turns over the
 * kinds (health, submit, ... , health, submit, ...), so a machine whose load
 * changes during the run (shared cores) weighs on every kind alike; each
 * ratio is a p50 over the health p50 of the same rounds.
 *
 *   health          grpc.health.v1.Health/Check: the cheapest call kexd serves, the baseline
 *   submit          a tiny cached Submit with default options (16-element add, same
 *                   structure every call): one RPC, every event streamed, read and checked
 *                   (accepted, scheduled, running, done), the output kept as a job buffer
 *                   with its bytes inline.  Freeing those buffers is the client's own later
 *                   call: each thread frees its handles 64 at a time with one Free, outside
 *                   the per-call latency (inside the calls/s wall time)
 *   submit_free     the same Submit + a Free of its output after each: two RPCs, what
 *                   bench/rpc.py's Python client's "submit_free" does
 *   submit_inline   the same Submit with free_outputs set: the output comes back inline
 *                   and is not kept, so one RPC
 *   submit_min      the same Submit with free_outputs and only_done: one RPC whose
 *                   stream is the done event alone
 *   submit_batched  "submit" with batched_events, as kex's own clients send it: every
 *                   event, those ready together in one message (a quick Submit's whole
 *                   stream is one message and the status); read and checked the same way
 *   libkex          kex_submit (graph as JSON) through libkex, the C client library (it
 *                   sets batched_events), the output kept and freed 64 at a time as in
 *                   "submit": what a C program using kex pays for its Submit
 *   health_async    health and submit_batched with every call in flight driven by one
 *   batched_async   thread on one completion queue (see measure_async); batched_async's
 *                   ratio is to health_async
 *
 * The core rows use gRPC C core directly with the request encoded once.
 * Every Submit's output bytes are checked (arange + 1).  Prints a table and,
 * with --json FILE, writes the numbers (p50/p99 in us, calls/s).
 *
 * Usage: build/bench_rpc [--kexd build/daemon/kexd | --server ADDR] [--seconds 2] [--rounds 10] [--json FILE]
 *                        [--only health,...,libkex,health_async,batched_async] [--inflight 1,8]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/libkex.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kex/v1/kex.pb-c.h"

#define N_ELEMS 16
#define MAX_THREADS 64
#define CALL_TIMEOUT_S 30
#define FREE_BATCH 64 /* "submit": output handles one Free releases */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static pid_t g_kexd = -1;
static char g_tmp[256];

/* CPU seconds (user + system) the kexd this bench started has used so far; 0 with --server. */
static double kexd_cpu_s(void) {
  char path[64], buf[1024], *p;
  unsigned long ut = 0, st = 0;
  FILE *f;
  if (g_kexd <= 0) return 0;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)g_kexd);
  if (!(f = fopen(path, "r"))) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  if (!(p = strrchr(buf, ')')) || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
  return (double)(ut + st) / sysconf(_SC_CLK_TCK);
}

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bench_rpc: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (g_kexd > 0) kill(g_kexd, SIGTERM), waitpid(g_kexd, NULL, 0);
  exit(1);
}

/* ---- the workload ---- */

typedef struct bench {
  char addr[128];
  grpc_channel *ch;
  void *m_check, *m_submit, *m_free, *m_open;
  kex_client *lk; /* libkex client on the same server */
  char job[128];
  grpc_slice check_req, submit_req, inline_req, min_req, batched_req;
  char graph_json[1024];
} bench;

static grpc_slice pack(const ProtobufCMessage *m) {
  grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(m));
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  return s;
}

static gpr_timespec deadline(void) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(CALL_TIMEOUT_S, GPR_TIMESPAN));
}

/* Run one batch on cq (a pluck queue) and wait for it; 1 when it succeeded. */
static int batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n, void *tag) {
  if (grpc_call_start_batch(call, ops, n, tag, NULL) != GRPC_CALL_OK) return 0;
  grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static grpc_slice readall(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  grpc_slice s;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
  s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return s;
}

/* ops[0..3]: send the metadata, the request `out` and the close; receive the initial metadata into imd. */
static void request_ops(grpc_op *ops, grpc_byte_buffer *out, grpc_metadata_array *imd) {
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = imd;
}

/* A unary call: req out, the reply's bytes in *reply (unref it).  Returns the gRPC status; *msg its details. */
static int unary(bench *b, grpc_completion_queue *cq, void *method, grpc_slice req, grpc_slice *reply, char *msg,
                 size_t msglen) {
  grpc_call *call = grpc_channel_create_registered_call(b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, deadline(), NULL);
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&req, 1), *in = NULL;
  grpc_metadata_array imd, tmd;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  grpc_metadata_array_init(&imd);
  grpc_metadata_array_init(&tmd);
  request_ops(ops, out, &imd);
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &details;
  if (!batch(call, cq, ops, 6, call)) status = GRPC_STATUS_INTERNAL;
  *reply = in ? readall(in) : grpc_empty_slice();
  if (msg) snprintf(msg, msglen, "%.*s", (int)GRPC_SLICE_LENGTH(details), (const char *)GRPC_SLICE_START_PTR(details));
  if (in) grpc_byte_buffer_destroy(in);
  grpc_byte_buffer_destroy(out);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&imd);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  return status;
}

static void health(bench *b, grpc_completion_queue *cq) {
  grpc_slice reply;
  char msg[256];
  int st = unary(b, cq, b->m_check, b->check_req, &reply, msg, sizeof msg);
  if (st != GRPC_STATUS_OK) die("Health/Check: status %d: %s", st, msg);
  Grpc__Health__V1__HealthCheckResponse *r =
      grpc__health__v1__health_check_response__unpack(NULL, GRPC_SLICE_LENGTH(reply), GRPC_SLICE_START_PTR(reply));
  if (!r || r->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) die("Health/Check: not SERVING");
  grpc__health__v1__health_check_response__free_unpacked(r, NULL);
  grpc_slice_unref(reply);
}

/* The output must be arange(16) + 1. */
static void check_output(const Kex__V1__Output *o) {
  if (!o->has_data || o->data.len != N_ELEMS * sizeof(float)) die("Submit: the output is not inline (%zu bytes)", o->data.len);
  for (int i = 0; i < N_ELEMS; i++) {
    float v;
    memcpy(&v, o->data.data + i * sizeof v, sizeof v);
    if (v != (float)i + 1.0f) die("Submit: output[%d] = %g, expected %d", i, v, i + 1);
  }
}

/* Free the job buffers handles[0..n) with one Free. */
static void free_handles(bench *b, grpc_completion_queue *cq, char **handles, size_t n) {
  Kex__V1__FreeRequest fr = KEX__V1__FREE_REQUEST__INIT;
  grpc_slice reply, fs;
  char msg[256];
  fr.job = b->job;
  fr.n_handles = n;
  fr.handles = handles;
  fs = pack(&fr.base);
  int st = unary(b, cq, b->m_free, fs, &reply, msg, sizeof msg);
  grpc_slice_unref(fs);
  if (st != GRPC_STATUS_OK) die("Free: status %d: %s", st, msg);
  grpc_slice_unref(reply);
}

/* What becomes of a Submit's output: freed at once, kept (its handle returned), or never a buffer (free_outputs). */
typedef enum out_mode { OUT_FREE, OUT_KEEP, OUT_NONE } out_mode;

/* Check one event: not after done, the done event's output (its handle into handle[128]); its kind into *seen. */
static void submit_event(const Kex__V1__SubmitEvent *ev, bool *done, int *seen, char *handle) {
  if (*done) die("Submit: an event after done");
  *seen |= 1 << ev->event_case;
  if (ev->event_case == KEX__V1__SUBMIT_EVENT__EVENT_DONE) {
    if (ev->done->n_outputs != 1) die("Submit: %zu outputs", ev->done->n_outputs);
    check_output(ev->done->outputs[0]);
    snprintf(handle, 128, "%s", ev->done->outputs[0]->handle);
    *done = true;
  }
}

/*
 * One Submit: every event read and checked (accepted, scheduled, running...,
 * done; only done when only_done); its output's handle into keep[128]
 * (OUT_KEEP).  A batched request's messages may hold several events; after
 * its done event the status is read at once (as libkex does).
 */
static void submit(bench *b, grpc_completion_queue *cq, grpc_slice req, out_mode mode, bool only_done, bool batched,
                   char *keep) {
  grpc_call *call =
      grpc_channel_create_registered_call(b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, b->m_submit, deadline(), NULL);
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&req, 1), *in = NULL;
  grpc_metadata_array imd, tmd;
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[4], sop, rop;
  char handle[128] = "";
  int seen = 0; /* bit per event kind */
  bool done = false;
  memset(ops, 0, sizeof ops);
  memset(&sop, 0, sizeof sop);
  grpc_metadata_array_init(&imd);
  grpc_metadata_array_init(&tmd);
  request_ops(ops, out, &imd);
  if (grpc_call_start_batch(call, ops, 4, &ops[0], NULL) != GRPC_CALL_OK) die("Submit: start_batch");
  for (;;) {
    memset(&rop, 0, sizeof rop);
    rop.op = GRPC_OP_RECV_MESSAGE;
    rop.data.recv_message.recv_message = &in;
    if (!batch(call, cq, &rop, 1, &rop) || !in) break;
    grpc_slice s = readall(in);
    grpc_byte_buffer_destroy(in);
    in = NULL;
    Kex__V1__SubmitEvent *ev = kex__v1__submit_event__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    if (!ev) die("Submit: an event does not decode");
    if (ev->n_following && !batched) die("Submit: batched events without batched_events");
    submit_event(ev, &done, &seen, handle);
    for (size_t k = 0; k < ev->n_following; k++) submit_event(ev->following[k], &done, &seen, handle);
    kex__v1__submit_event__free_unpacked(ev, NULL);
    if (done && batched) break;
  }
  grpc_event ev0 = grpc_completion_queue_pluck(cq, &ops[0], gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  (void)ev0;
  sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  sop.data.recv_status_on_client.trailing_metadata = &tmd;
  sop.data.recv_status_on_client.status = &status;
  sop.data.recv_status_on_client.status_details = &details;
  batch(call, cq, &sop, 1, &sop);
  if (status != GRPC_STATUS_OK)
    die("Submit: status %d: %.*s", status, (int)GRPC_SLICE_LENGTH(details), (const char *)GRPC_SLICE_START_PTR(details));
  int need = 1 << KEX__V1__SUBMIT_EVENT__EVENT_ACCEPTED | 1 << KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED |
             1 << KEX__V1__SUBMIT_EVENT__EVENT_RUNNING | 1 << KEX__V1__SUBMIT_EVENT__EVENT_DONE;
  if (only_done) need = 1 << KEX__V1__SUBMIT_EVENT__EVENT_DONE;
  if ((seen & ~(1 << KEX__V1__SUBMIT_EVENT__EVENT_COMPILING)) != need || (only_done && seen != need))
    die("Submit: events (mask 0x%x) are not the expected ones (0x%x)", seen, need);
  grpc_byte_buffer_destroy(out);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&imd);
  grpc_metadata_array_destroy(&tmd);
  grpc_call_unref(call);
  if (mode != OUT_NONE && !handle[0]) die("Submit: no output handle");
  if (mode == OUT_FREE) {
    char *hs[1] = {handle};
    free_handles(b, cq, hs, 1);
  } else if (mode == OUT_KEEP) {
    memcpy(keep, handle, sizeof handle);
  } else if (handle[0]) {
    die("Submit with free_outputs: the output still has a handle (%s)", handle);
  }
}

/* One kex_submit through libkex, its output checked and its handle into keep[128]. */
static void submit_libkex(bench *b, char *keep) {
  kex_result *res = NULL;
  kex_status st;
  kex_submit_opts o = {.timeout_s = CALL_TIMEOUT_S};
  if (kex_submit(b->lk, b->job, b->graph_json, &o, NULL, NULL, &res, &st) < 0) die("libkex submit: %s", st.msg);
  if (res->noutputs != 1 || !res->outputs[0].has_data || res->outputs[0].buf.nbytes != N_ELEMS * sizeof(float))
    die("libkex submit: %zu outputs, not inline", res->noutputs);
  for (int i = 0; i < N_ELEMS; i++)
    if (((const float *)res->outputs[0].buf.data)[i] != (float)i + 1.0f) die("libkex submit: output[%d] is wrong", i);
  snprintf(keep, 128, "%s", res->outputs[0].handle);
  kex_result_free(res);
}

/* ---- the measurement ---- */

typedef enum kind {
  K_HEALTH, K_SUBMIT, K_SUBMIT_FREE, K_SUBMIT_INLINE, K_SUBMIT_MIN, K_SUBMIT_BATCHED, K_LIBKEX, K_HEALTH_ASYNC,
  K_BATCHED_ASYNC, K_COUNT
} kind;
static const char *kind_names[K_COUNT] = {"health", "submit", "submit_free", "submit_inline", "submit_min",
                                          "submit_batched", "libkex", "health_async", "batched_async"};

/* A thread's output handles not freed yet ("submit"). */
typedef struct kept {
  char h[FREE_BATCH][128];
  char *p[FREE_BATCH];
  size_t n;
} kept;

static void kept_flush(bench *b, grpc_completion_queue *cq, kept *kp) {
  for (size_t i = 0; i < kp->n; i++) kp->p[i] = kp->h[i];
  if (kp->n) free_handles(b, cq, kp->p, kp->n);
  kp->n = 0;
}

/* One call of kind k; "submit" keeps its output in kp (flushed by the caller when full). */
static void one_call(bench *b, grpc_completion_queue *cq, kind k, kept *kp) {
  switch (k) {
  case K_HEALTH: health(b, cq); break;
  case K_SUBMIT: submit(b, cq, b->submit_req, OUT_KEEP, false, false, kp->h[kp->n++]); break;
  case K_SUBMIT_FREE: submit(b, cq, b->submit_req, OUT_FREE, false, false, NULL); break;
  case K_SUBMIT_INLINE: submit(b, cq, b->inline_req, OUT_NONE, false, false, NULL); break;
  case K_SUBMIT_MIN: submit(b, cq, b->min_req, OUT_NONE, true, false, NULL); break;
  case K_SUBMIT_BATCHED: submit(b, cq, b->batched_req, OUT_KEEP, false, true, kp->h[kp->n++]); break;
  case K_LIBKEX: submit_libkex(b, kp->h[kp->n++]); break;
  default: break;
  }
}

/* Latencies (us) of one kind at one in-flight count, over all rounds, and the wall seconds they took. */
typedef struct acc {
  double *lat;
  size_t n, cap;
  double wall_s, kexd_cpu_s; /* kexd's CPU seconds during the rounds (0 with --server) */
  double round_p50[256];
  int rounds;
} acc;

typedef struct worker {
  bench *b;
  kind k;
  double stop_at;
  double *lat; /* us */
  size_t n, cap;
  pthread_t th;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  kept *kp = calloc(1, sizeof *kp);
  if (!kp) die("out of memory");
  while (now_s() < w->stop_at) {
    double t0 = now_s();
    one_call(w->b, cq, w->k, kp);
    if (w->n == w->cap) {
      w->cap = w->cap ? 2 * w->cap : 4096;
      if (!(w->lat = realloc(w->lat, w->cap * sizeof *w->lat))) die("out of memory");
    }
    w->lat[w->n++] = (now_s() - t0) * 1e6;
    if (kp->n == FREE_BATCH) kept_flush(w->b, cq, kp);
  }
  kept_flush(w->b, cq, kp);
  free(kp);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return NULL;
}

static double pctl(const double *sorted, size_t n, double q) {
  size_t i = (size_t)(q * n);
  return n ? sorted[i < n ? i : n - 1] : 0;
}

/*
 * The async kinds: one thread keeps `inflight` calls going on one completion
 * queue (grpc_completion_queue_next), starting the next call as one ends --
 * what a throughput client does, instead of a blocked thread per call.  On
 * a machine whose cores the client shares with kexd, the threaded kinds'
 * client spends 3x the CPU per call at 8 in flight (each completion wakes
 * another thread), which caps the calls/s that kexd is shown to serve.
 */
typedef struct aslot {
  grpc_call *call;
  grpc_byte_buffer *out, *in;
  grpc_metadata_array imd, tmd;
  grpc_status_code status;
  grpc_slice details;
  grpc_op ops[6];
  char handle[128];
  int seen, stage; /* stage 0: request (and, for health, everything); 1: reading events; 2: the status */
  bool done;
  double t0;
} aslot;

/* Start slot sl's next call of kind k (K_HEALTH_ASYNC or K_BATCHED_ASYNC). */
static void aslot_start(bench *b, grpc_completion_queue *cq, kind k, aslot *sl) {
  grpc_slice req = k == K_HEALTH_ASYNC ? b->check_req : b->batched_req;
  memset(sl, 0, sizeof *sl);
  sl->call = grpc_channel_create_registered_call(b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                 k == K_HEALTH_ASYNC ? b->m_check : b->m_submit, deadline(), NULL);
  sl->out = grpc_raw_byte_buffer_create(&req, 1);
  sl->details = grpc_empty_slice();
  sl->status = GRPC_STATUS_UNKNOWN;
  grpc_metadata_array_init(&sl->imd);
  grpc_metadata_array_init(&sl->tmd);
  request_ops(sl->ops, sl->out, &sl->imd);
  sl->ops[4].op = GRPC_OP_RECV_MESSAGE;
  sl->ops[4].data.recv_message.recv_message = &sl->in;
  size_t n = 5;
  if (k == K_HEALTH_ASYNC) { /* unary: the status in the same batch */
    sl->ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sl->ops[5].data.recv_status_on_client.trailing_metadata = &sl->tmd;
    sl->ops[5].data.recv_status_on_client.status = &sl->status;
    sl->ops[5].data.recv_status_on_client.status_details = &sl->details;
    n = 6;
  }
  sl->t0 = now_s();
  if (grpc_call_start_batch(sl->call, sl->ops, n, sl, NULL) != GRPC_CALL_OK) die("async: start_batch");
}

/* Release what slot sl's finished call holds. */
static void aslot_end(aslot *sl) {
  if (sl->in) grpc_byte_buffer_destroy(sl->in);
  grpc_byte_buffer_destroy(sl->out);
  grpc_slice_unref(sl->details);
  grpc_metadata_array_destroy(&sl->imd);
  grpc_metadata_array_destroy(&sl->tmd);
  grpc_call_unref(sl->call);
}

/* A batch of slot sl completed: true when its call is over (checked; its output handle in sl->handle). */
static bool aslot_step(kind k, aslot *sl, bool ok) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  if (k == K_HEALTH_ASYNC) {
    if (!ok || sl->status != GRPC_STATUS_OK || !sl->in) die("async Health/Check: status %d", sl->status);
    grpc_slice r = readall(sl->in);
    Grpc__Health__V1__HealthCheckResponse *m =
        grpc__health__v1__health_check_response__unpack(NULL, GRPC_SLICE_LENGTH(r), GRPC_SLICE_START_PTR(r));
    if (!m || m->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
      die("async Health/Check: not SERVING");
    grpc__health__v1__health_check_response__free_unpacked(m, NULL);
    grpc_slice_unref(r);
    return true;
  }
  if (sl->stage == 2) {
    if (sl->status != GRPC_STATUS_OK)
      die("async Submit: status %d: %.*s", sl->status, (int)GRPC_SLICE_LENGTH(sl->details),
          (const char *)GRPC_SLICE_START_PTR(sl->details));
    int need = 1 << KEX__V1__SUBMIT_EVENT__EVENT_ACCEPTED | 1 << KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED |
               1 << KEX__V1__SUBMIT_EVENT__EVENT_RUNNING | 1 << KEX__V1__SUBMIT_EVENT__EVENT_DONE;
    if ((sl->seen & ~(1 << KEX__V1__SUBMIT_EVENT__EVENT_COMPILING)) != need || !sl->handle[0])
      die("async Submit: events (mask 0x%x) are not the expected ones (0x%x)", sl->seen, need);
    return true;
  }
  if (!ok || !sl->in) die("async Submit: the stream ended before its done event");
  grpc_slice r = readall(sl->in);
  grpc_byte_buffer_destroy(sl->in);
  sl->in = NULL;
  Kex__V1__SubmitEvent *ev = kex__v1__submit_event__unpack(NULL, GRPC_SLICE_LENGTH(r), GRPC_SLICE_START_PTR(r));
  grpc_slice_unref(r);
  if (!ev) die("async Submit: an event does not decode");
  submit_event(ev, &sl->done, &sl->seen, sl->handle);
  for (size_t i = 0; i < ev->n_following; i++) submit_event(ev->following[i], &sl->done, &sl->seen, sl->handle);
  kex__v1__submit_event__free_unpacked(ev, NULL);
  if (sl->done) { /* after done, the status at once (as libkex does) */
    sl->stage = 2;
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &sl->tmd;
    op.data.recv_status_on_client.status = &sl->status;
    op.data.recv_status_on_client.status_details = &sl->details;
  } else {
    sl->stage = 1;
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &sl->in;
  }
  sl->ops[0] = op; /* the op array must live until the batch completes */
  if (grpc_call_start_batch(sl->call, sl->ops, 1, sl, NULL) != GRPC_CALL_OK) die("async Submit: start_batch");
  return false;
}

/* One async round: `inflight` calls of kind k from this thread until stop_at; latencies into w. */
static void measure_async(bench *b, kind k, int inflight, worker *w) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  grpc_completion_queue *fcq = grpc_completion_queue_create_for_pluck(NULL); /* the Frees, in line */
  aslot *slots = calloc((size_t)inflight, sizeof *slots);
  kept *kp = calloc(1, sizeof *kp);
  int running = 0;
  if (!slots || !kp) die("out of memory");
  for (int i = 0; i < inflight; i++) aslot_start(b, cq, k, &slots[i]), running++;
  while (running) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) die("async: the completion queue ended");
    aslot *sl = ev.tag;
    if (!aslot_step(k, sl, ev.success)) continue;
    double t1 = now_s();
    if (w->n == w->cap) {
      w->cap = w->cap ? 2 * w->cap : 4096;
      if (!(w->lat = realloc(w->lat, w->cap * sizeof *w->lat))) die("out of memory");
    }
    w->lat[w->n++] = (t1 - sl->t0) * 1e6;
    if (k == K_BATCHED_ASYNC) {
      memcpy(kp->h[kp->n++], sl->handle, sizeof sl->handle);
      if (kp->n == FREE_BATCH) kept_flush(b, fcq, kp);
    }
    aslot_end(sl);
    if (t1 < w->stop_at) aslot_start(b, cq, k, sl);
    else running--;
  }
  kept_flush(b, fcq, kp);
  free(kp);
  free(slots);
  grpc_completion_queue *qs[2] = {cq, fcq};
  for (int i = 0; i < 2; i++) {
    grpc_completion_queue_shutdown(qs[i]);
    while ((i ? grpc_completion_queue_pluck(qs[i], NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
              : grpc_completion_queue_next(qs[i], gpr_inf_future(GPR_CLOCK_REALTIME), NULL)).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(qs[i]);
  }
}

/* One round: kind k at `inflight` for `seconds`, its latencies appended to a (after a warm-up in the first round). */
static void measure(bench *b, kind k, int inflight, double seconds, acc *a) {
  worker ws[MAX_THREADS];
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  kept *kp = calloc(1, sizeof *kp);
  size_t total = 0, first = a->n;
  double t0;
  if (!kp) die("out of memory");
  for (int i = 0; i < (a->rounds ? 5 : 50); i++) { /* warm-up */
    one_call(b, cq, k == K_HEALTH_ASYNC ? K_HEALTH : k == K_BATCHED_ASYNC ? K_SUBMIT_BATCHED : k, kp);
    if (kp->n == FREE_BATCH) kept_flush(b, cq, kp);
  }
  kept_flush(b, cq, kp);
  free(kp);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  memset(ws, 0, sizeof ws);
  double c0 = kexd_cpu_s();
  t0 = now_s();
  bool async = k == K_HEALTH_ASYNC || k == K_BATCHED_ASYNC;
  if (async) {
    ws[0].b = b, ws[0].k = k, ws[0].stop_at = t0 + seconds;
    measure_async(b, k, inflight, &ws[0]);
    total = ws[0].n;
  } else {
    for (int i = 0; i < inflight; i++) {
      ws[i].b = b, ws[i].k = k, ws[i].stop_at = t0 + seconds;
      if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0) die("pthread_create");
    }
    for (int i = 0; i < inflight; i++) pthread_join(ws[i].th, NULL), total += ws[i].n;
  }
  a->wall_s += now_s() - t0;
  a->kexd_cpu_s += kexd_cpu_s() - c0;
  if (a->n + total > a->cap) {
    a->cap = 2 * (a->n + total) + 4096;
    if (!(a->lat = realloc(a->lat, a->cap * sizeof *a->lat))) die("out of memory");
  }
  for (int i = 0; i < (async ? 1 : inflight); i++)
    memcpy(a->lat + a->n, ws[i].lat, ws[i].n * sizeof *a->lat), a->n += ws[i].n, free(ws[i].lat);
  qsort(a->lat + first, a->n - first, sizeof *a->lat, cmp_double);
  if (a->rounds < (int)(sizeof a->round_p50 / sizeof a->round_p50[0]))
    a->round_p50[a->rounds++] = pctl(a->lat + first, a->n - first, 0.5);
}

/* ---- kexd ---- */

static int free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(fd, (struct sockaddr *)&a, &len) < 0)
    die("no free port: %s", strerror(errno));
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static void start_kexd(const char *kexd, char *addr, size_t addrlen) {
  char listen[64], cache[300];
  snprintf(g_tmp, sizeof g_tmp, "/tmp/kex-bench-rpc-XXXXXX");
  if (!mkdtemp(g_tmp)) die("mkdtemp: %s", strerror(errno));
  snprintf(cache, sizeof cache, "%s/cache.db", g_tmp);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", free_port());
  snprintf(addr, addrlen, "%s", listen);
  g_kexd = fork();
  if (g_kexd < 0) die("fork: %s", strerror(errno));
  if (g_kexd == 0) {
    execl(kexd, kexd, "--listen", listen, "--device", "cpu", "--cache", cache, "--log", "warn", "--metrics", "off", (char *)NULL);
    fprintf(stderr, "bench_rpc: cannot run %s: %s\n", kexd, strerror(errno));
    _exit(127);
  }
}

static void stop_kexd(void) {
  char cmd[300];
  if (g_kexd <= 0) return;
  kill(g_kexd, SIGTERM);
  waitpid(g_kexd, NULL, 0);
  g_kexd = -1;
  snprintf(cmd, sizeof cmd, "%s/cache.db", g_tmp), unlink(cmd);
  snprintf(cmd, sizeof cmd, "%s/cache.db-wal", g_tmp), unlink(cmd);
  snprintf(cmd, sizeof cmd, "%s/cache.db-shm", g_tmp), unlink(cmd);
  rmdir(g_tmp);
}

/* Wait until Health/Check answers SERVING (10 s at most). */
static void wait_ready(bench *b) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  double t_end = now_s() + 10;
  for (;;) {
    grpc_slice reply;
    int st = unary(b, cq, b->m_check, b->check_req, &reply, NULL, 0);
    grpc_slice_unref(reply);
    if (st == GRPC_STATUS_OK) break;
    if (now_s() > t_end) die("kexd at %s did not become ready", b->addr);
    usleep(50000);
  }
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* The tiny graph: BUFFER float32[16] arange, + CONST 1.0 reshaped and expanded, ADD; its one output inline. */
static grpc_slice submit_request(const char *job, bool free_outputs, bool only_done, bool batched) {
  Kex__V1__SubmitRequest r = KEX__V1__SUBMIT_REQUEST__INIT;
  Kex__V1__Graph g = KEX__V1__GRAPH__INIT;
  Kex__V1__Node n[5], *np[5];
  Kex__V1__Scalar one = KEX__V1__SCALAR__INIT;
  Kex__V1__Ints s1 = KEX__V1__INTS__INIT, sn = KEX__V1__INTS__INIT;
  int64_t shape[1] = {N_ELEMS}, v1[1] = {1}, vn[1] = {N_ELEMS};
  uint32_t src1[1] = {1}, src2[1] = {2}, src3[2] = {0, 3}, outs[1] = {4};
  for (int i = 0; i < 5; i++) kex__v1__node__init(&n[i]), np[i] = &n[i];
  one.kind_case = KEX__V1__SCALAR__KIND_FLOAT_VALUE;
  one.float_value = 1.0;
  s1.n_values = 1, s1.values = v1;
  sn.n_values = 1, sn.values = vn;
  n[0].op = "BUFFER", n[0].dtype = "float32", n[0].n_shape = 1, n[0].shape = shape;
  n[0].contents_case = KEX__V1__NODE__CONTENTS_FILL_ARANGE, n[0].fill_arange = true;
  n[1].op = "CONST", n[1].dtype = "float32", n[1].value = &one;
  n[2].op = "RESHAPE", n[2].n_src = 1, n[2].src = src1, n[2].arg_case = KEX__V1__NODE__ARG_NEW_SHAPE, n[2].new_shape = &s1;
  n[3].op = "EXPAND", n[3].n_src = 1, n[3].src = src2, n[3].arg_case = KEX__V1__NODE__ARG_NEW_SHAPE, n[3].new_shape = &sn;
  n[4].op = "ADD", n[4].n_src = 2, n[4].src = src3;
  g.device = "cpu";
  g.n_nodes = 5, g.nodes = np;
  g.n_outputs = 1, g.outputs = outs;
  r.job = (char *)job;
  r.graph = &g;
  r.free_outputs = free_outputs;
  r.batched_events = batched;
  r.only_done = only_done;
  return pack(&r.base);
}

static bool listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return true;
    p = e ? e + 1 : NULL;
  }
  return false;
}

int main(int argc, char **argv) {
  const char *kexd = "build/daemon/kexd", *server = NULL, *json = NULL;
  const char *only = "health,submit,submit_free,submit_inline,submit_min,submit_batched,libkex,health_async,batched_async";
  const char *inflights = "1,8";
  double seconds = 2.0;
  int rounds = 10;
  bench b;
  memset(&b, 0, sizeof b);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--kexd") && v) kexd = v, i++;
    else if (!strcmp(a, "--server") && v) server = v, i++;
    else if (!strcmp(a, "--seconds") && v) seconds = atof(v), i++;
    else if (!strcmp(a, "--json") && v) json = v, i++;
    else if (!strcmp(a, "--rounds") && v) rounds = atoi(v), i++;
    else if (!strcmp(a, "--only") && v) only = v, i++;
    else if (!strcmp(a, "--inflight") && v) inflights = v, i++;
    else {
      fprintf(stderr, "usage: %s [--kexd PATH | --server ADDR] [--seconds S] [--rounds N] [--json FILE] [--only LIST] "
              "[--inflight 1,8]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1 || rounds > 256) rounds = 10;
  signal(SIGPIPE, SIG_IGN);
  if (server) snprintf(b.addr, sizeof b.addr, "%s", server);
  else start_kexd(kexd, b.addr, sizeof b.addr);
  grpc_init();
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  b.ch = grpc_channel_create(b.addr, creds, NULL);
  grpc_channel_credentials_release(creds);
  b.m_check = grpc_channel_register_call(b.ch, "/grpc.health.v1.Health/Check", NULL, NULL);
  b.m_submit = grpc_channel_register_call(b.ch, "/kex.v1.Kex/Submit", NULL, NULL);
  b.m_free = grpc_channel_register_call(b.ch, "/kex.v1.Kex/Free", NULL, NULL);
  b.m_open = grpc_channel_register_call(b.ch, "/kex.v1.Kex/OpenJob", NULL, NULL);
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  b.check_req = pack(&hr.base);
  wait_ready(&b);
  {
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    Kex__V1__OpenJobRequest oj = KEX__V1__OPEN_JOB_REQUEST__INIT;
    grpc_slice req, reply;
    char msg[256];
    oj.name = "bench-rpc";
    req = pack(&oj.base);
    int st = unary(&b, cq, b.m_open, req, &reply, msg, sizeof msg);
    if (st != GRPC_STATUS_OK) die("OpenJob: status %d: %s", st, msg);
    Kex__V1__OpenJobReply *r = kex__v1__open_job_reply__unpack(NULL, GRPC_SLICE_LENGTH(reply), GRPC_SLICE_START_PTR(reply));
    if (!r) die("OpenJob: reply does not decode");
    snprintf(b.job, sizeof b.job, "%s", r->job);
    kex__v1__open_job_reply__free_unpacked(r, NULL);
    grpc_slice_unref(req), grpc_slice_unref(reply);
    b.submit_req = submit_request(b.job, false, false, false);
    b.inline_req = submit_request(b.job, true, false, false);
    b.min_req = submit_request(b.job, true, true, false);
    b.batched_req = submit_request(b.job, false, false, true);
    submit(&b, cq, b.submit_req, OUT_FREE, false, false, NULL); /* first: compiles */
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
  }
  snprintf(b.graph_json, sizeof b.graph_json,
           "{\"format\": \"kex.graph.v1\", \"device\": \"cpu\", \"nodes\": ["
           "{\"op\": \"BUFFER\", \"dtype\": \"float32\", \"shape\": [%d], \"fill\": {\"arange\": true}},"
           "{\"op\": \"CONST\", \"dtype\": \"float32\", \"shape\": [], \"value\": 1.0},"
           "{\"op\": \"RESHAPE\", \"src\": [1], \"arg\": [1]},"
           "{\"op\": \"EXPAND\", \"src\": [2], \"arg\": [%d]},"
           "{\"op\": \"ADD\", \"src\": [0, 3]}], \"outputs\": [4]}",
           N_ELEMS, N_ELEMS);
  if (listed(only, "libkex")) {
    kex_status st;
    kex_client_opts o = {0};
    if (kex_client_connect(b.addr, &o, &b.lk, &st) < 0) die("libkex connect: %s", st.msg);
  }
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) die("cannot write %s: %s", json, strerror(errno));
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 3) load[0] = load[1] = load[2] = -1;
  if (jf)
    fprintf(jf, "{\n  \"client\": \"C (gRPC C core, one channel, a thread per call in flight; the *_async kinds: one thread, one completion queue)\",\n  \"seconds\": %g,\n"
            "  \"rounds\": %d,\n  \"load_average_before\": [%.2f, %.2f, %.2f]", seconds, rounds, load[0], load[1], load[2]);
  for (const char *p = inflights; p && *p;) {
    int inflight = atoi(p);
    acc accs[K_COUNT];
    p = strchr(p, ',');
    if (p) p++;
    if (inflight < 1 || inflight > MAX_THREADS) die("--inflight: 1..%d", MAX_THREADS);
    memset(accs, 0, sizeof accs);
    for (int r = 0; r < rounds; r++) /* the kinds take turns: health, submit, ..., health, submit, ... */
      for (int k = 0; k < K_COUNT; k++)
        if (listed(only, kind_names[k])) measure(&b, (kind)k, inflight, seconds / rounds, &accs[k]);
    for (int k = 0; k < K_COUNT; k++) {
      acc *a = &accs[k], *h = &accs[k == K_BATCHED_ASYNC ? K_HEALTH_ASYNC : K_HEALTH]; /* each against its own health */
      if (!a->rounds) continue;
      qsort(a->lat, a->n, sizeof *a->lat, cmp_double);
      double p50 = pctl(a->lat, a->n, 0.5), p99 = pctl(a->lat, a->n, 0.99), per_s = a->wall_s > 0 ? a->n / a->wall_s : 0;
      double ratio = 0, rr[256];
      if (k != K_HEALTH && k != K_HEALTH_ASYNC && h->rounds == a->rounds) { /* the median over rounds of each round's ratio */
        for (int r = 0; r < a->rounds; r++) rr[r] = h->round_p50[r] > 0 ? a->round_p50[r] / h->round_p50[r] : 0;
        qsort(rr, a->rounds, sizeof *rr, cmp_double);
        ratio = rr[a->rounds / 2];
      }
      printf("%-14s %d in flight: p50 %8.0f us  p99 %8.0f us  %8.0f calls/s", kind_names[k], inflight, p50, p99, per_s);
      if (ratio > 0) printf("  %.2fx health (median of %d rounds)", ratio, a->rounds);
      printf("\n");
      fflush(stdout);
      if (jf) {
        fprintf(jf, ",\n  \"%s_inflight%d\": {\"p50_us\": %.1f, \"p99_us\": %.1f, \"calls_per_s\": %.1f, \"calls\": %zu",
                kind_names[k], inflight, p50, p99, per_s, a->n);
        if (ratio > 0) fprintf(jf, ", \"ratio_to_health_rounds\": %.3f", ratio);
        if (a->kexd_cpu_s > 0) fprintf(jf, ", \"kexd_cpu_us_per_call\": %.1f", a->kexd_cpu_s / (a->n ? a->n : 1) * 1e6);
        fprintf(jf, "}");
      }
      free(a->lat);
    }
  }
  if (jf) fprintf(jf, "\n}\n"), fclose(jf);
  if (b.lk) kex_client_close(b.lk);
  grpc_slice_unref(b.check_req), grpc_slice_unref(b.submit_req), grpc_slice_unref(b.inline_req);
  grpc_slice_unref(b.min_req), grpc_slice_unref(b.batched_req);
  grpc_channel_destroy(b.ch);
  grpc_shutdown();
  stop_kexd();
  return 0;
}

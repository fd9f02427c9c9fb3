/*
 * fakecall.c - the per-call half of daemon/server.h without gRPC, for the
 * fuzz targets and the daemon's unit tests that run kexd's real handlers
 * (fuzz_rpc, fuzz_stream, tests/unit/test_methods.c ...): a call is a
 * kexd_call the caller drives by hand -- it starts the handler, hands each
 * read the next framed message (or the end of the stream, or a broken
 * stream), completes each stream write (accept_writes), fires the cancel
 * hook when asked, and afterwards checks that the handler finished the
 * call and released every reference.  The few kexd_server_* functions
 * other daemon files call (stats, "stopping") answer as a server with no
 * calls would; kexd_server_add_method records what the method table
 * registers.  Linked in place of daemon/server.c: the handlers, the job
 * table, the device runners and the cache are the daemon's own.
 */
#include <grpc/status.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "daemon/server.h"
#include "tests/fuzz/fakecall.h"

const char *kexd_call_method(const kexd_call *c) { return c->method; }

double kexd_call_time_left(const kexd_call *c) {
  (void)c;
  return INFINITY;
}

bool kexd_call_cancelled(const kexd_call *c) { return c->cancelled; }

void *kexd_call_ext(kexd_call *c) { return &c->ext; }

double kexd_call_age_ms(const kexd_call *c) {
  (void)c;
  return 0;
}

/* The one metadata key a call carries here: authorization. */
int kexd_call_metadata(const kexd_call *c, const char *key, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  if (!c->authorization || strcmp(key, "authorization") != 0) return KEX_ENOTFOUND;
  if (strlen(c->authorization) >= cap) return KEX_ELIMIT;
  memcpy(buf, c->authorization, strlen(c->authorization) + 1);
  return 0;
}

int kexd_call_peer_host(const kexd_call *c, char *buf, size_t cap) {
  (void)c;
  return (size_t)snprintf(buf, cap, "ipv4:127.0.0.1") < cap ? 0 : KEX_ELIMIT;
}

void kexd_call_set_hooks(kexd_call *c, void (*on_cancel)(kexd_call *, void *), void (*on_stop)(kexd_call *, void *),
                         void *ud) {
  c->on_cancel = on_cancel;
  c->on_stop = on_stop;
  c->hook_ud = ud;
}

void kexd_call_ref(kexd_call *c) { c->refs++; }

void kexd_call_unref(kexd_call *c) {
  if (c->refs <= 0) __builtin_trap(); /* a reference released twice */
  c->refs--;
}

/* Without accept_writes a stream write is refused (client streams answer with one reply: a write would be a
   handler bug there); with it the write is outstanding until fuzz_call_complete_write. */
int kexd_call_write_more(kexd_call *c, const ProtobufCMessage *msg, bool more,
                         void (*done)(kexd_call *, int ok, void *ud), void *ud) {
  c->writes++;
  if (!c->accept_writes || c->finished) return KEX_EINVAL;
  if (c->write_pending) {
    c->overlapping++;
    return KEX_EINVAL;
  }
  if (!done || protobuf_c_message_get_packed_size(msg) > 4096) __builtin_trap();
  c->write_pending = true;
  c->write_more = more;
  c->write_done = done;
  c->write_ud = ud;
  return 0;
}

int kexd_call_write(kexd_call *c, const ProtobufCMessage *msg, void (*done)(kexd_call *, int ok, void *ud), void *ud) {
  return kexd_call_write_more(c, msg, false, done, ud);
}

void fuzz_call_complete_write(kexd_call *c, int ok) {
  if (!c->write_pending) __builtin_trap();
  c->write_pending = false;
  c->write_done(c, ok, c->write_ud);
}

int kexd_call_read(kexd_call *c, kexd_read_cb done, void *ud) {
  if (c->finished || c->reading || !done) return KEX_EINVAL;
  c->reading = true;
  c->read_cb = done;
  c->read_ud = ud;
  return 0;
}

bool kexd_call_writing(const kexd_call *c) { return c->write_pending; }

int kexd_call_finish(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg) {
  if (c->finished && c->cancelled) return KEX_ECANCELLED; /* as server.c: the handler's reference is gone already */
  if (c->finished) __builtin_trap(); /* a call ended twice */
  c->finished = true;
  c->status = status;
  snprintf(c->details, sizeof c->details, "%s", details ? details : "");
  if (msg && status == 0) { /* the reply must pack as grpc would send it */
    uint8_t buf[4096];
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n <= sizeof buf && protobuf_c_message_pack(msg, buf) != n) __builtin_trap();
  }
  kexd_call_unref(c);
  return 0;
}

/* As kexd_call_finish; done runs at once (ok: the message was part of an OK finish). */
int kexd_call_finish_notify(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg,
                            void (*done)(kexd_call *, int ok, void *ud), void *ud) {
  int rc = kexd_call_finish(c, status, details, msg);
  if (rc == 0 && done) done(c, msg && status == 0, ud);
  return rc;
}

int kexd_call_failf(kexd_call *c, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (status == 0 || !msg[0]) __builtin_trap(); /* every failure says why */
  return kexd_call_finish(c, status, msg, NULL);
}

void fuzz_call_cancel(kexd_call *c) {
  c->cancelled = true;
  if (c->finished) return;
  if (c->on_cancel) c->on_cancel(c, c->hook_ud);
  if (!c->finished) { /* as server.c's on_close: finished for the handler, its reference released */
    c->finished = true;
    c->status = GRPC_STATUS_CANCELLED;
    kexd_call_unref(c);
  }
}

void fuzz_call_wait(kexd_call *c, uv_loop_t *loop, int seconds) {
  time_t t0 = time(NULL);
  while (!(c->finished && c->refs == 0 && !c->reading)) {
    if (time(NULL) - t0 > seconds) {
      fprintf(stderr, "fakecall: %s not over after %d s (finished %d, refs %d, reading %d)\n", c->method, seconds,
              c->finished, c->refs, c->reading);
      __builtin_trap();
    }
    if (c->reading) { /* a handler that reads again after the end: the stream is over */
      kexd_read_cb cb = c->read_cb;
      c->reading = false;
      c->read_cb = NULL;
      cb(c, NULL, 0, 0, c->read_ud);
    } else {
      uv_run(loop, UV_RUN_ONCE);
    }
  }
}

int fuzz_call_unary(kexd *d, kexd_call *c, const char *path, const char *authorization, const ProtobufCMessage *msg) {
  uint8_t buf[4096];
  size_t n = msg ? protobuf_c_message_get_packed_size(msg) : 0;
  if (n > sizeof buf) __builtin_trap();
  if (msg) protobuf_c_message_pack(msg, buf);
  memset(c, 0, sizeof *c);
  c->method = path;
  c->refs = 1;
  c->authorization = authorization;
  if (kexd_rpc_gate(c, d)) kexd_rpc_serve(d, path, c, msg ? buf : NULL, n);
  fuzz_call_wait(c, d->loop, 30);
  kexd_rpc_call_end(c, c->status, d);
  return c->status;
}

/* ---- the server, as one with no calls ---- */

static fuzz_method registered[FUZZ_MAX_METHODS];
static uint32_t nregistered;

int kexd_server_add_method(kexd_server *s, const char *path, kexd_payload payload, kexd_handler fn, void *ud) {
  (void)s;
  if (nregistered == FUZZ_MAX_METHODS) return KEX_ELIMIT;
  registered[nregistered++] = (fuzz_method){path, payload, fn, ud};
  return 0;
}

uint32_t fuzz_server_methods(const fuzz_method **out) {
  *out = registered;
  return nregistered;
}

void fuzz_server_forget(void) { nregistered = 0; }

const kexd_server_stats *kexd_server_get_stats(const kexd_server *s) {
  static const kexd_server_stats none;
  (void)s;
  return &none;
}

uint32_t kexd_server_methods(const kexd_server *s) {
  (void)s;
  return 0;
}

const uint64_t *kexd_server_method_codes(const kexd_server *s, uint32_t i, const char **path) {
  static const uint64_t zeros[64]; /* every status code's count: 0 */
  (void)s, (void)i;
  *path = "";
  return zeros;
}

bool kexd_server_stopping(const kexd_server *s) {
  (void)s;
  return false;
}

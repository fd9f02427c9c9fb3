/*
 * server.h - the gRPC C core server on a libuv loop (../shared/notes/stack.md
 * sections 1 and 2, shape A).
 *
 * One thread blocks in grpc_completion_queue_next and hands every completed
 * tag to the loop thread through a locked list and uv_async_send.  Everything
 * else -- call state, handlers, replies -- runs on the loop thread, so
 * handlers need no locks.  Methods are registered by path before start; a
 * generic grpc_server_request_call is always posted too, so a call to any
 * path is accepted: a registered path is routed to its handler, any other is
 * answered UNIMPLEMENTED at once.
 *
 * A handler receives a kexd_call holding one reference (the handler's) and
 * must end it exactly once with kexd_call_finish (which may carry a last
 * message), possibly later, e.g. from a pool work's after-callback (work.h); it may
 * write stream messages before that with kexd_call_write.  If the client
 * cancels first, the handler's on_cancel hook (if set) runs and the call is
 * finished for it; a handler that still holds work in flight keeps the call
 * alive with kexd_call_ref / kexd_call_unref.
 */
#ifndef KEX_DAEMON_SERVER_H
#define KEX_DAEMON_SERVER_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <uv.h>

typedef struct kexd_server kexd_server;
typedef struct kexd_call kexd_call;

/* How a method's request arrives: one message read before the handler runs, or a client stream. */
typedef enum kexd_payload { KEXD_PAYLOAD_ONE, KEXD_PAYLOAD_STREAM } kexd_payload;

/*
 * A method handler, on the loop thread.  req/len: the request message bytes
 * (req NULL when the client sent none, or for KEXD_PAYLOAD_STREAM); the bytes
 * are valid only during the call.
 */
typedef void (*kexd_handler)(kexd_call *call, const uint8_t *req, size_t len, void *ud);

typedef struct kexd_server_opts {
  const char *listen;    /* "127.0.0.1:50051", "unix:/path" */
  int max_message;       /* bytes, both directions */
  double grace_s;        /* in-flight calls get this long to finish at stop */
  double idle_timeout_s; /* a connection with no call this long is closed (0: never) */
  double handshake_timeout_s; /* ... one that has not finished the HTTP/2 handshake (0: gRPC's 120 s) */
  double keepalive_s;    /* idle connections are pinged this often (0: gRPC's 2 h) */
  int max_streams;       /* calls at once on one connection (0: no limit) */
  /* TLS: NULL tls_cert_pem serves plaintext.  The PEM texts need only live until kexd_server_start
     returns (gRPC copies them); the file names are for messages. */
  const char *tls_cert_pem, *tls_key_pem; /* the certificate chain and its private key */
  const char *tls_client_ca_pem;          /* non-NULL: clients must present a certificate it verifies (mTLS) */
  const char *tls_cert_file, *tls_key_file;
  void (*on_stopped)(void *ud); /* the server is gone; the loop may be closed */
  void *ud;
  /* Per-call hooks (optional), with call_ud.  gate runs before a registered method's handler, and before an
     unregistered path is answered UNIMPLEMENTED (so a caller it refuses cannot list methods): false means
     it finished the call itself (refused) and the handler is not run.  on_end runs once per call that a
     handler could have owned, when it is finished or cancelled, with its status.  Each call carries
     call_ext_size zeroed bytes for them (kexd_call_ext). */
  bool (*gate)(kexd_call *c, void *call_ud);
  void (*on_end)(kexd_call *c, int status, void *call_ud);
  void *call_ud;
  size_t call_ext_size;
} kexd_server_opts;

/*
 * Create the server on `loop` (not started): grpc server, completion queue,
 * async handle.  Call grpc_init() first.  0 or a negative KEX_E* code.
 */
int kexd_server_new(uv_loop_t *loop, const kexd_server_opts *opts, kexd_server **out);
/* Register a method path (before start).  0, KEX_EINVAL, KEX_ENOMEM. */
int kexd_server_add_method(kexd_server *s, const char *path, kexd_payload payload, kexd_handler fn, void *ud);
/*
 * Bind and start: pre-post the requests and start the completion queue
 * thread.  With opts.tls_cert_pem the port serves TLS only (gRPC's SSL
 * server credentials; with tls_client_ca_pem a client certificate is
 * required and verified).  KEX_EUNAVAILABLE when the address cannot be
 * bound or gRPC refuses the certificate or key (message logged).  On failure the server can only be freed with kexd_server_free.
 */
int kexd_server_start(kexd_server *s);
/* The port bound (after start). */
int kexd_server_port(const kexd_server *s);
/*
 * Graceful stop, on the loop thread: stop accepting, tell streaming calls
 * (their on_stop hook), give in-flight calls grace_s, then cancel the rest,
 * destroy the server, drain the queue, join the thread, close the handles
 * and call on_stopped.  Idempotent.
 */
void kexd_server_stop(kexd_server *s);
bool kexd_server_stopping(const kexd_server *s);
/* Free a server that was never started or has stopped (on_stopped ran). */
void kexd_server_free(kexd_server *s);
/* Calls being served now (handlers not yet finished). */
uint32_t kexd_server_calls_active(const kexd_server *s);

/* ---- per call ---- */

const char *kexd_call_method(const kexd_call *c);
/* The method's last part, for messages: "OpenJob" of "/kex.v1.Kex/OpenJob". */
static inline const char *kexd_call_name(const kexd_call *c) {
  const char *path = kexd_call_method(c), *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}
/* Seconds left before the client's deadline (INFINITY when none). */
double kexd_call_time_left(const kexd_call *c);
bool kexd_call_cancelled(const kexd_call *c);
/*
 * The client's address without its port ("ipv4:127.0.0.1", "ipv6:[::1]",
 * "unix:..."), into buf: what per-peer limits count.  0, KEX_ELIMIT
 * (truncated to cap), KEX_ENOMEM.
 */
int kexd_call_peer_host(const kexd_call *c, char *buf, size_t cap);
/* The opts.call_ext_size bytes of this call (zeroed when it arrived). */
void *kexd_call_ext(kexd_call *c);
/* Milliseconds since the call arrived. */
double kexd_call_age_ms(const kexd_call *c);
/*
 * The value of the client's request metadata `key` (lower case) into buf,
 * NUL-terminated.  0; KEX_ENOTFOUND (none); KEX_ELIMIT (longer than cap - 1
 * bytes, or it holds a NUL: buf is left empty).
 */
int kexd_call_metadata(const kexd_call *c, const char *key, char *buf, size_t cap);
/* Handler hooks: the client cancelled / the server is stopping.  Both optional. */
void kexd_call_set_hooks(kexd_call *c, void (*on_cancel)(kexd_call *, void *), void (*on_stop)(kexd_call *, void *),
                         void *ud);
void kexd_call_ref(kexd_call *c);
void kexd_call_unref(kexd_call *c);

/*
 * Send one stream message (initial metadata first if not yet sent).  Only
 * one write may be outstanding; `done(call, ok, ud)` runs when it completes
 * (ok 0: the call is dead).  0, KEX_EINVAL (finished or a write pending),
 * KEX_ENOMEM, KEX_EINTERNAL (grpc refused the batch).
 */
int kexd_call_write(kexd_call *c, const ProtobufCMessage *msg, void (*done)(kexd_call *, int ok, void *ud), void *ud);
/*
 * kexd_call_write with `more` true: the caller promises another write (or
 * the status) right after this one completes, so gRPC may keep the message
 * in its buffer (GRPC_WRITE_BUFFER_HINT) and send it in one TCP write with
 * the next; the write then completes at once.  The first write of a call
 * (the one carrying the initial metadata) is never buffered: its completion
 * would wait for the flush.
 */
int kexd_call_write_more(kexd_call *c, const ProtobufCMessage *msg, bool more,
                         void (*done)(kexd_call *, int ok, void *ud), void *ud);
/*
 * Read the next message of a client stream (KEXD_PAYLOAD_STREAM methods).
 * Only one read may be outstanding; `done(call, msg, len, ok, ud)` runs on
 * the loop thread when it completes: ok 1 with msg != NULL is a message (the
 * bytes are valid only during the callback; an empty message has len 0 and
 * msg != NULL), ok 1 with msg == NULL the end of the stream (the client
 * half-closed), ok 0 a dead call (cancelled or broken; the handler should
 * finish or drop it).  0, KEX_EINVAL (finished, a read pending, no
 * callback), KEX_EINTERNAL; when it returns an error, done is never called.
 */
typedef void (*kexd_read_cb)(kexd_call *c, const uint8_t *msg, size_t len, int ok, void *ud);
int kexd_call_read(kexd_call *c, kexd_read_cb done, void *ud);
/* True while a write is outstanding. */
bool kexd_call_writing(const kexd_call *c);
/*
 * End the call: an optional last message (only with status 0), then the
 * status with `details` (may be NULL).  Releases the handler's reference.
 * Does nothing (but release) after a cancel.  Returns 0 or a negative code
 * (the reference is released either way).  A reply larger than max_message
 * is replaced by RESOURCE_EXHAUSTED naming its size.
 */
int kexd_call_finish(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg);
/*
 * kexd_call_finish that tells when the final batch completed: done(call,
 * ok, ud) runs on the loop then, ok 1 when the last message (msg) and the
 * status went out, 0 when the call died first or msg was replaced by an
 * error status.  done does not run when this returns non-zero.
 */
int kexd_call_finish_notify(kexd_call *c, int status, const char *details, const ProtobufCMessage *msg,
                            void (*done)(kexd_call *, int ok, void *ud), void *ud);
/* kexd_call_finish with a printf-style details message and no message. */
int kexd_call_failf(kexd_call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Counters the server keeps (GetStats). */
typedef struct kexd_server_stats {
  uint64_t calls;        /* calls accepted, any method */
  uint64_t calls_failed; /* finished with a status other than OK */
  uint64_t unimplemented;
} kexd_server_stats;
const kexd_server_stats *kexd_server_get_stats(const kexd_server *s);

/*
 * Calls finished per method and status code (metrics.c), on the loop
 * thread.  A call the client cancelled before its handler finished counts
 * as CANCELLED.  kexd_server_methods() is the number of registered
 * methods; for i below it, *path is the method's path, for i equal to it
 * *path is NULL and the counts are of every unregistered path together.
 * The paths live as long as the server.  Returns KEXD_STATUS_CODES counts,
 * indexed by grpc_status_code.
 */
#define KEXD_STATUS_CODES 17 /* gRPC status codes: 0 (OK) to 16 (UNAUTHENTICATED) */
uint32_t kexd_server_methods(const kexd_server *s);
const uint64_t *kexd_server_method_codes(const kexd_server *s, uint32_t i, const char **path);

#endif

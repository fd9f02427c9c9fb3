/*
 * fakecall.h - the call object of fakecall.c (daemon/server.h's kexd_call
 * without gRPC), public so the fuzz targets and the daemon's unit tests can
 * drive it.
 */
#ifndef KEX_TESTS_FUZZ_FAKECALL_H
#define KEX_TESTS_FUZZ_FAKECALL_H

#include <stdbool.h>

#include "daemon/kexd.h"
#include "daemon/rpc.h"
#include "daemon/server.h"

struct kexd_call {
  const char *method;
  int refs;                 /* the handler's (1 at the start) and those it takes */
  bool finished, cancelled, reading;
  kexd_read_cb read_cb;     /* the outstanding read */
  void *read_ud;
  void (*on_cancel)(kexd_call *, void *);
  void (*on_stop)(kexd_call *, void *);
  void *hook_ud;
  int status;               /* as finished */
  char details[512];
  unsigned writes;          /* stream writes tried (refused unless accept_writes) */
  kexd_call_info ext;       /* kexd_call_ext: what request.c keeps per call (no gate ran: no tenant, no token) */
  const char *authorization; /* the request's `authorization` metadata (NULL: none) */
  /* accept_writes: a stream write is taken and stays outstanding until fuzz_call_complete_write */
  bool accept_writes;
  bool write_pending, write_more; /* the outstanding write, and whether it was offered with more */
  unsigned overlapping;     /* writes tried while one was outstanding (a handler bug) */
  void (*write_done)(kexd_call *, int ok, void *ud);
  void *write_ud;
};

/* What kexd_server_add_method was given for one path (the method table's registration, rpc.c). */
typedef struct fuzz_method {
  const char *path;
  kexd_payload payload;
  kexd_handler fn;
  void *ud;
} fuzz_method;

#define FUZZ_MAX_METHODS 64

/* The methods registered since the last fuzz_server_forget, in order, into *out; returns how many. */
uint32_t fuzz_server_methods(const fuzz_method **out);
void fuzz_server_forget(void);

/*
 * The client cancels c, as daemon/server.c handles it: the cancel hook, then
 * (unless the hook finished it) the call is finished as CANCELLED for the
 * handler and its reference released; a later kexd_call_finish is
 * KEX_ECANCELLED.  An outstanding read is the caller's to complete (not ok).
 */
void fuzz_call_cancel(kexd_call *c);
/*
 * Run loop until c is over: finished and every reference released (an
 * outstanding read is completed as a broken stream).  Still not over after
 * `seconds`: the handler lost the call; the process traps.
 */
void fuzz_call_wait(kexd_call *c, uv_loop_t *loop, int seconds);
/* Complete c's outstanding write (ok 0: the stream broke), as the server's write batch does. */
void fuzz_call_complete_write(kexd_call *c, int ok);
/*
 * One unary call from its start to its end, as daemon/server.c runs it: a
 * call of `path` with `authorization` metadata (NULL: none) through the gate
 * (kexd_rpc_gate), kexd_rpc_serve with msg packed (NULL: no message), run
 * until over (fuzz_call_wait), then the end hook (kexd_rpc_call_end).
 * *c holds the call's end (status, details, ext); returns c->status.
 */
int fuzz_call_unary(kexd *d, kexd_call *c, const char *path, const char *authorization, const ProtobufCMessage *msg);

#endif

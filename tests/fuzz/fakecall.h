/*
 * fakecall.h - the call object of fakecall.c (daemon/server.h's kexd_call
 * without gRPC), public so the fuzz target can drive it.
 */
#ifndef KEX_TESTS_FUZZ_FAKECALL_H
#define KEX_TESTS_FUZZ_FAKECALL_H

#include <stdbool.h>

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
  unsigned writes;          /* stream writes tried (refused) */
  kexd_call_info ext;       /* kexd_call_ext: what request.c keeps per call (no gate ran: no tenant, no token) */
};

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

#endif

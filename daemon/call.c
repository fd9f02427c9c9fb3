/*
 * call.c - what a handler reads about its call (server.h): the method it
 * was called as, its deadline, whether the client cancelled, its request
 * metadata and peer, its age, the gate's extension bytes, and the hooks a
 * handler installs for a cancel or a stop.  The call state machine that
 * moves a call is server.c's; the types are server_int.h's.
 */
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/errors.h"
#include "daemon/server_int.h"

const char *kexd_call_method(const kexd_call *c) {
  if (c->method_name) return c->method_name;
  return c->m ? c->m->path : "?";
}

double kexd_call_time_left(const kexd_call *c) {
  gpr_timespec d = c->generic ? c->details.deadline : c->deadline, left;
  if (d.tv_sec == INT64_MAX) return INFINITY;
  left = gpr_time_sub(d, gpr_now(d.clock_type));
  return left.tv_sec + left.tv_nsec / 1e9;
}

bool kexd_call_cancelled(const kexd_call *c) { return c->cancelled; }

void *kexd_call_ext(kexd_call *c) { return c->ext; }

double kexd_call_age_ms(const kexd_call *c) {
  gpr_timespec d = gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), c->arrived);
  return d.tv_sec * 1e3 + d.tv_nsec / 1e6;
}

int kexd_call_metadata(const kexd_call *c, const char *key, char *buf, size_t cap) {
  buf[0] = '\0';
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_metadata *m = &c->md.metadata[i];
    size_t n = GRPC_SLICE_LENGTH(m->value);
    if (GRPC_SLICE_LENGTH(m->key) != strlen(key) || memcmp(GRPC_SLICE_START_PTR(m->key), key, strlen(key)) != 0)
      continue;
    if (n >= cap || memchr(GRPC_SLICE_START_PTR(m->value), '\0', n)) return KEX_ELIMIT;
    memcpy(buf, GRPC_SLICE_START_PTR(m->value), n);
    buf[n] = '\0';
    return 0;
  }
  return KEX_ENOTFOUND;
}

int kexd_call_peer_host(const kexd_call *c, char *buf, size_t cap) {
  char *peer = grpc_call_get_peer(c->call), *colon;
  int rc = 0;
  if (!peer) return KEX_ENOMEM;
  /* "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555": drop the port; "unix:..." stays whole */
  colon = strrchr(peer, ':');
  if (colon && (strncmp(peer, "ipv4:", 5) == 0 || strncmp(peer, "ipv6:", 5) == 0) && colon > peer + 4) *colon = '\0';
  if (strlen(peer) >= cap) rc = KEX_ELIMIT;
  snprintf(buf, cap, "%s", peer);
  gpr_free(peer);
  return rc;
}

void kexd_call_set_hooks(kexd_call *c, void (*on_cancel)(kexd_call *, void *), void (*on_stop)(kexd_call *, void *),
                         void *ud) {
  c->on_cancel = on_cancel;
  c->on_stop = on_stop;
  c->hook_ud = ud;
}

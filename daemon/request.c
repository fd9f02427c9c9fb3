/*
 * request.c - the plumbing every method handler shares: unpacking a request
 * with protobuf-c through kex_malloc (size checked again, strings checked on
 * the wire by wire.c), the job check, the device index, failing a call with
 * a kex error.  Loop thread only (the decode's out-of-memory flag is
 * per-thread).
 */
#include <grpc/status.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"

static _Thread_local bool pb_alloc_failed; /* an unpack failed for memory, not for bad bytes */

static void *pb_alloc(void *ud, size_t size) {
  void *p;
  (void)ud;
  p = kex_malloc(size);
  if (!p) pb_alloc_failed = true;
  return p;
}

static void pb_free(void *ud, void *p) {
  (void)ud;
  kex_free(p);
}

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

double kexd_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

void kexd_rpc_fail(kexd_call *c, int rc, const kex_error *err) {
  kexd_call_finish(c, kex_err_grpc_status(rc), err && err->msg[0] ? err->msg : kex_strerror(rc), NULL);
}

ProtobufCMessage *kexd_rpc_decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                  size_t len) {
  ProtobufCMessage *m;
  char why[KEX_ERROR_MSG_MAX];
  if (!req) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: the request carries no %s message", kexd_call_method(c),
                    desc->name);
    return NULL;
  }
  if (d->cfg.max_message > 0 && len > (size_t)d->cfg.max_message) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: request of %zu bytes is more than the limit of %d bytes",
                    kexd_call_method(c), len, d->cfg.max_message);
    return NULL;
  }
  pb_alloc_failed = false;
  if (!(m = protobuf_c_message_unpack(desc, &pb_allocator, len, req))) {
    if (pb_alloc_failed)
      kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory decoding a %zu-byte request",
                      kexd_call_method(c), len);
    else
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: the request is not a valid %s message (%zu bytes)",
                      kexd_call_method(c), desc->name, len);
    return NULL;
  }
  if (kexd_wire_check_strings(desc, req, len, why, sizeof why) < 0) { /* strings are compared whole: no NUL, UTF-8 */
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", kexd_call_method(c), why);
    protobuf_c_message_free_unpacked(m, &pb_allocator);
    return NULL;
  }
  return m;
}

void kexd_rpc_free_msg(ProtobufCMessage *m) {
  if (m) protobuf_c_message_free_unpacked(m, &pb_allocator);
}

kexd_job *kexd_rpc_need_job(kexd *d, kexd_call *c, const char *token) {
  kexd_job *job;
  if (!token || !*token) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: missing job token (field `job`; OpenJob returns one)",
                    kexd_call_method(c));
    return NULL;
  }
  if (!(job = kexd_jobs_find(&d->jobs, token)))
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "%s: unknown job token (never opened, closed, or expired after its lease)",
                    kexd_call_method(c));
  return job;
}

int kexd_rpc_device_index(const kexd *d, const char *name) {
  if (!name || !*name || strcmp(name, "default") == 0) return 0;
  for (uint32_t i = 0; i < d->cfg.ndevices; i++)
    if (strcmp(d->cfg.devices[i], name) == 0) return (int)i;
  return -1;
}

/*
 * rpc.h - what rpc.c shares with the other method files of the daemon
 * (submit.c): request decoding, the job check, the protobuf Graph
 * conversion and device names.  Loop thread only.
 */
#ifndef KEX_DAEMON_RPC_H
#define KEX_DAEMON_RPC_H

#include <protobuf-c/protobuf-c.h>

#include "daemon/kexd.h"
#include "kex/v1/kex.pb-c.h"
#include "sched/graph.h"

/*
 * Unpack call c's request as `desc` (protobuf-c through kex_malloc).  On
 * failure the call is finished (INVALID_ARGUMENT / RESOURCE_EXHAUSTED) and
 * NULL is returned.  Free the result with kexd_rpc_free_msg.
 */
ProtobufCMessage *kexd_rpc_decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                  size_t len);
void kexd_rpc_free_msg(ProtobufCMessage *m);
/* The job named by token, lease renewed; NULL with the call finished (INVALID_ARGUMENT / NOT_FOUND). */
kexd_job *kexd_rpc_need_job(kexd *d, kexd_call *c, const char *token);
/*
 * Build and validate a kex_graph from pg; BUFFER nodes naming a `buffer`
 * handle are checked against `job` (may be NULL: every handle is unknown):
 * KEX_ENOTFOUND for a handle the job does not hold, KEX_EINVAL for a dtype
 * or shape that differs from the buffer's.  On success *out owns the graph.
 */
int kexd_rpc_graph_from_pb(const Kex__V1__Graph *pg, const char *device, const kex_limits *lim, kexd_job *job,
                           kex_graph **out, kex_error *err);
/* Index of the configured device `name` names ("" and "default": the first); -1 when none. */
int kexd_rpc_device_index(const kexd *d, const char *name);

/* ---- submit.c ---- */

/* Set up Submit's caches (program, structure); 0 or KEX_ENOMEM. */
int kexd_submit_init(kexd *d);
/* Free them; after the device runners have exited (the loaded programs are theirs). */
void kexd_submit_free(kexd *d);
/* The Submit handler. */
void kexd_rpc_submit(kexd_call *c, const uint8_t *req, size_t len, void *ud);

#endif

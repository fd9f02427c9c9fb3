/*
 * kept.h - graphs a job keeps on kexd, so a repeated Submit sends only its inputs.
 *
 * A Submit with `keep_as = ID` stores its graph (protobuf bytes) under ID in
 * its job; a later Submit of the same job names it with `graph_ref = ID` and
 * `bindings`: per BUFFER node, the buffer handle or inline bytes of this run.
 * A training step (tinygrad's TinyJit on KEX) then sends no graph bytes kexd
 * has seen.  Bounded per job by --max-kept-graphs and --max-kept-graph-bytes:
 * past them the job's least recently used kept graph goes (never another
 * job's); a graph larger than the byte limit alone is refused.  Loop thread.
 */
#ifndef KEXD_KEPT_H
#define KEXD_KEPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "kex/v1/kex.pb-c.h"

#define KEXD_KEPT_ID_MAX 64  /* characters of an ID: [A-Za-z0-9._-] */
#define KEXD_KEPT_DEVICE_MAX 64 /* bytes of the kept graph's device name, NUL included (KEXD_DISPATCH_NAME_MAX) */

typedef struct kexd_job kexd_job;

typedef struct kexd_kept {
  char id[KEXD_KEPT_ID_MAX + 1];
  uint8_t *bytes;            /* the packed Graph */
  size_t len;
  uint64_t used;             /* the job's kept clock at its last use */
  char device[KEXD_KEPT_DEVICE_MAX]; /* its graph's `device` (the method table's search check reads it) */
} kexd_kept;

/* Keep graph g under id in job (replacing one of that id), evicting the job's least recently used ones past
 * max_n graphs or max_bytes bytes.  0; KEX_EINVAL (a bad id), KEX_ELIMIT (g alone is over max_bytes),
 * KEX_ENOMEM; err says which, naming the limit. */
int kexd_kept_put(kexd_job *job, const char *id, const Kex__V1__Graph *g, uint32_t max_n, uint64_t max_bytes,
                  kex_error *err);

/* The graph job keeps under m->graph_ref with m->bindings applied: a Graph unpacked with kex_pb_allocator
 * that the caller frees (protobuf_c_message_free_unpacked).  NULL with err: KEX_ENOTFOUND (no such kept
 * graph), KEX_EINVAL (a binding names no BUFFER node, or binds one twice), KEX_ENOMEM. */
Kex__V1__Graph *kexd_kept_bind(kexd_job *job, const Kex__V1__SubmitRequest *m, kex_error *err);

/* The `device` of the graph job keeps under id ("" for the default), or NULL when it keeps none. */
const char *kexd_kept_device(kexd_job *job, const char *id);

/* Free everything job keeps (the job is closing). */
void kexd_kept_free_all(kexd_job *job);

#endif

/*
 * pballoc.h - the one protobuf-c allocator every kex side unpacks with
 * (kexd's request decode, libkex's replies, the fuzz targets): memory
 * through kex_malloc (core/alloc.h, so a test's allocation failures and
 * the heap accounting see it), and a per-thread flag that tells an unpack
 * that failed for memory from one that failed for bad bytes.
 */
#ifndef KEX_PROTO_PBALLOC_H
#define KEX_PROTO_PBALLOC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>

extern ProtobufCAllocator kex_pb_allocator;

/* Clear this thread's out-of-memory flag (before an unpack). */
void kex_pb_alloc_reset(void);
/* Whether an allocation on this thread failed since the last reset. */
bool kex_pb_alloc_failed(void);

#endif

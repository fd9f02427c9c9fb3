/*
 * pballoc.c - protobuf-c's allocator through kex_malloc (pballoc.h).
 */
#include "proto/pballoc.h"

#include "core/alloc.h"

static _Thread_local bool alloc_failed; /* an allocation failed since kex_pb_alloc_reset */

static void *pb_alloc(void *ud, size_t size) {
  void *p = kex_malloc(size);
  (void)ud;
  if (!p) alloc_failed = true;
  return p;
}

static void pb_free(void *ud, void *p) {
  (void)ud;
  kex_free(p);
}

ProtobufCAllocator kex_pb_allocator = {pb_alloc, pb_free, NULL};

void kex_pb_alloc_reset(void) { alloc_failed = false; }

bool kex_pb_alloc_failed(void) { return alloc_failed; }

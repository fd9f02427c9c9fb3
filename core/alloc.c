/*
 * alloc.c - libc allocation behind a failure-injection hook.
 */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_ulong alloc_calls;     /* allocations attempted so far */
static atomic_ulong fail_at_call;    /* 0 = disarmed, else the call number that fails */
static atomic_int fail_sticky;       /* fail every call after fail_at_call too */

static int should_fail(void) {
  unsigned long n = atomic_fetch_add(&alloc_calls, 1) + 1;
  unsigned long at = atomic_load(&fail_at_call);
  if (at == 0) return 0;
  if (n == at) return 1;
  return n > at && atomic_load(&fail_sticky);
}

void kex_alloc_fail_at(unsigned long n, int sticky) {
  atomic_store(&fail_sticky, sticky);
  atomic_store(&fail_at_call, n ? atomic_load(&alloc_calls) + n : 0);
}

unsigned long kex_alloc_count(void) { return atomic_load(&alloc_calls); }

void *kex_malloc(size_t size) { return should_fail() ? NULL : malloc(size ? size : 1); }

void *kex_calloc(size_t n, size_t size) { return should_fail() ? NULL : calloc(n ? n : 1, size ? size : 1); }

void *kex_realloc(void *p, size_t size) { return should_fail() ? NULL : realloc(p, size ? size : 1); }

void kex_free(void *p) { free(p); }

int kex_grow_slow(void *pv, uint32_t *cap, size_t elem, uint32_t first) {
  void *p, *np;
  uint32_t ncap;
  ncap = *cap ? *cap * 2 : first;
  memcpy(&p, pv, sizeof p);
  if (!(np = kex_realloc(p, (size_t)ncap * elem))) return -1;
  memcpy(pv, &np, sizeof np);
  *cap = ncap;
  return 0;
}

char *kex_strndup(const char *s, size_t n) {
  char *d = kex_malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

char *kex_strdup(const char *s) { return kex_strndup(s, strlen(s)); }

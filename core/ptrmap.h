/*
 * ptrmap.h - a hash map from a pair of pointers to a pointer.
 *
 * Open addressing with linear probing, power-of-two capacity, grown at 50%
 * load; memory from kex_malloc.  Keys are compared by address, so it serves
 * visited sets ((node, ShapeTracker) pairs), memo tables and numberings
 * (b = NULL for a single-pointer key).  A key's first pointer must not be NULL.
 */
#ifndef KEX_CORE_PTRMAP_H
#define KEX_CORE_PTRMAP_H

#include <stdint.h>

typedef struct kex_ptrmap {
  uint32_t cap, len;
  const void **ka, **kb;
  void **val;
} kex_ptrmap;

/* The slot holding (a, b)'s value, or NULL when absent.  Valid until the next put. */
void **kex_ptrmap_find(const kex_ptrmap *m, const void *a, const void *b);
/* Insert or overwrite.  0, or KEX_ENOMEM (the map is unchanged). */
int kex_ptrmap_put(kex_ptrmap *m, const void *a, const void *b, void *v);
/* Forget every entry, keeping the memory. */
void kex_ptrmap_clear(kex_ptrmap *m);
/* Release the memory; the map is empty and reusable. */
void kex_ptrmap_free(kex_ptrmap *m);

#endif

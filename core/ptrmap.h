/*
 * ptrmap.h - a hash map from a pair of pointers to a pointer.
 *
 * A core/dict.h table whose entries are (a, b, value) and whose keys
 * compare by address, so it serves visited sets ((node, ShapeTracker)
 * pairs), memo tables and numberings (b = NULL for a single-pointer key).
 * A zeroed kex_ptrmap is an empty map.
 */
#ifndef KEX_CORE_PTRMAP_H
#define KEX_CORE_PTRMAP_H

#include <stdint.h>

#include "core/dict.h"

typedef kex_dict kex_ptrmap;

/* The slot holding (a, b)'s value, or NULL when absent.  Valid until the next put. */
void **kex_ptrmap_find(const kex_ptrmap *m, const void *a, const void *b);
/* Insert or overwrite.  0, or KEX_ENOMEM (the map is unchanged). */
int kex_ptrmap_put(kex_ptrmap *m, const void *a, const void *b, void *v);
/* Forget every entry, keeping the memory. */
void kex_ptrmap_clear(kex_ptrmap *m);
/* Release the memory; the map is empty and reusable. */
void kex_ptrmap_free(kex_ptrmap *m);

#endif

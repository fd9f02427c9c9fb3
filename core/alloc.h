/*
 * alloc.h - the allocator every kex module uses.
 *
 * kex_malloc & co. behave like the libc functions but can be made to fail at
 * the N-th call (kex_alloc_fail_at), which is how tests prove that out of
 * memory is an ordinary error path (KEX_ENOMEM), never a crash or a leak.
 * The hook is process-global and thread-safe (an atomic counter).
 */
#ifndef KEX_CORE_ALLOC_H
#define KEX_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *kex_malloc(size_t size);
void *kex_calloc(size_t n, size_t size);
void *kex_realloc(void *p, size_t size);
void kex_free(void *p);
char *kex_strdup(const char *s);
char *kex_strndup(const char *s, size_t n);

/*
 * Room for one more element in a doubling array: *(T **)pv holds *cap
 * elements of elem bytes, len of them used.  When len == *cap it grows to
 * first elements (an empty array) or twice *cap.  Returns 0, or -1 when out of
 * memory (the array and *cap unchanged).  The check is inline; kex_grow_slow
 * is the growing half.
 */
int kex_grow_slow(void *pv, uint32_t *cap, size_t elem, uint32_t first);
static inline int kex_grow(void *pv, uint32_t len, uint32_t *cap, size_t elem, uint32_t first) {
  return len < *cap ? 0 : kex_grow_slow(pv, cap, elem, first);
}

/*
 * Make the n-th allocation from now fail (n >= 1), and every one after it
 * when `sticky` is nonzero.  n == 0 disarms the hook.  Returns nothing.
 */
void kex_alloc_fail_at(unsigned long n, int sticky);
/* Number of allocations made through kex_malloc & co. since start. */
unsigned long kex_alloc_count(void);

#endif

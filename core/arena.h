/*
 * arena.h - bump allocator whose lifetime is one pass or one submission.
 *
 * Memory comes in blocks from kex_malloc; kex_arena_alloc never frees
 * individually; kex_arena_reset/kex_arena_destroy release everything at once.
 * Allocation failure returns NULL (never aborts).
 */
#ifndef KEX_CORE_ARENA_H
#define KEX_CORE_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct kex_arena_block kex_arena_block;

typedef struct kex_arena {
  kex_arena_block *head; /* current block, linked to older ones */
  char *cur, *end;       /* free space in head */
  size_t block_size;     /* default size of a new block */
  size_t total;          /* bytes of blocks in use since init/reset */
  kex_arena_block *spare; /* standard-size blocks kept by kex_arena_reset for reuse */
} kex_arena;

/* Initialise an empty arena (no allocation yet).  block_size 0 = 64 KiB. */
void kex_arena_init(kex_arena *a, size_t block_size);
/* Release every block; the arena is empty and reusable afterwards. */
void kex_arena_destroy(kex_arena *a);
/*
 * Release everything allocated, keeping the standard-size blocks for the next
 * use (a per-submission arena that is reset instead of destroyed stops paying
 * for page faults).  Pointers from before the reset are invalid after it.
 */
void kex_arena_reset(kex_arena *a);
/* Bytes of every block the arena holds: those in use and the spare ones a reset kept. */
size_t kex_arena_held(const kex_arena *a);
/* Aligned (16 bytes) allocation; NULL when out of memory. */
void *kex_arena_alloc(kex_arena *a, size_t size);
/* Zeroed allocation; NULL when out of memory. */
void *kex_arena_calloc(kex_arena *a, size_t n, size_t size);
/* Copy of `size` bytes of src; NULL when out of memory. */
void *kex_arena_memdup(kex_arena *a, const void *src, size_t size);
char *kex_arena_strdup(kex_arena *a, const char *s);
/*
 * kex_grow (core/alloc.h) for an array in arena a: *(T **)pv holds *cap
 * elements of elem bytes, len used; when len == *cap it grows to first
 * elements or twice *cap: in place when the array is the arena's last
 * allocation and its block has room, else copied to a new allocation (the
 * old copy stays until the arena is reset).  0, or -1 when out of memory
 * (the array and *cap unchanged).
 */
int kex_arena_grow_slow(kex_arena *a, void *pv, uint32_t *cap, size_t elem, uint32_t first);
static inline int kex_arena_grow(kex_arena *a, void *pv, uint32_t len, uint32_t *cap, size_t elem, uint32_t first) {
  return len < *cap ? 0 : kex_arena_grow_slow(a, pv, cap, elem, first);
}

#endif

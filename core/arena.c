/*
 * arena.c - block-chained bump allocator.
 */
#include "core/arena.h"

#include <string.h>

#include "core/alloc.h"

struct kex_arena_block {
  kex_arena_block *prev;
  size_t size;
  _Alignas(16) char data[];
};

void kex_arena_init(kex_arena *a, size_t block_size) {
  memset(a, 0, sizeof *a);
  a->block_size = block_size ? block_size : 64 * 1024;
}

static void free_chain(kex_arena_block *b) {
  while (b) {
    kex_arena_block *prev = b->prev;
    kex_free(b);
    b = prev;
  }
}

void kex_arena_destroy(kex_arena *a) {
  free_chain(a->head);
  free_chain(a->spare);
  size_t bs = a->block_size;
  kex_arena_init(a, bs);
}

void kex_arena_reset(kex_arena *a) {
  kex_arena_block *b = a->head;
  while (b) {
    kex_arena_block *prev = b->prev;
    if (b->size == a->block_size) {
      b->prev = a->spare;
      a->spare = b;
    } else {
      kex_free(b);
    }
    b = prev;
  }
  a->head = NULL;
  a->cur = a->end = NULL;
  a->total = 0;
}

size_t kex_arena_held(const kex_arena *a) {
  size_t n = 0;
  for (const kex_arena_block *b = a->head; b; b = b->prev) n += b->size;
  for (const kex_arena_block *b = a->spare; b; b = b->prev) n += b->size;
  return n;
}

void *kex_arena_alloc(kex_arena *a, size_t size) {
  /* rounding up to 16 and adding the block header must not wrap around */
  if (size > SIZE_MAX - 15 - sizeof(kex_arena_block)) return NULL;
  size = (size + 15) & ~(size_t)15;
  if (size == 0) size = 16;
  if ((size_t)(a->end - a->cur) < size) {
    size_t bsize = a->block_size;
    if (size > bsize / 4) bsize = size > bsize ? size : bsize; /* big requests get their own block */
    kex_arena_block *b;
    if (bsize == a->block_size && a->spare) {
      b = a->spare;
      a->spare = b->prev;
    } else {
      b = kex_malloc(sizeof *b + bsize);
      if (!b) return NULL;
    }
    b->size = bsize;
    a->total += bsize;
    if (size > a->block_size / 4 && a->head && a->cur != a->end) {
      /* keep filling the current block; chain the big one behind it */
      b->prev = a->head->prev;
      a->head->prev = b;
      return b->data;
    }
    b->prev = a->head;
    a->head = b;
    a->cur = b->data;
    a->end = b->data + bsize;
  }
  void *p = a->cur;
  a->cur += size;
  return p;
}

void *kex_arena_calloc(kex_arena *a, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = kex_arena_alloc(a, n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void *kex_arena_memdup(kex_arena *a, const void *src, size_t size) {
  void *p = kex_arena_alloc(a, size);
  if (p && size) memcpy(p, src, size);
  return p;
}

char *kex_arena_strdup(kex_arena *a, const char *s) { return kex_arena_memdup(a, s, strlen(s) + 1); }

int kex_arena_grow_slow(kex_arena *a, void *pv, uint32_t *cap, size_t elem, uint32_t first) {
  char *p, *np;
  uint64_t ncap = *cap ? (uint64_t)*cap * 2 : first;
  if (ncap > UINT32_MAX || (elem && ncap > SIZE_MAX / 2 / elem)) return -1;
  size_t old = (size_t)*cap * elem, size = (size_t)ncap * elem;
  memcpy(&p, pv, sizeof p);
  if (p && old && p + ((old + 15) & ~(size_t)15) == a->cur && (size_t)(a->end - p) >= size) {
    a->cur = p + ((size + 15) & ~(size_t)15); /* the last allocation: it grows where it is */
  } else {
    if (!(np = kex_arena_alloc(a, size))) return -1;
    if (old) memcpy(np, p, old);
    memcpy(pv, &np, sizeof np);
  }
  *cap = (uint32_t)ncap;
  return 0;
}

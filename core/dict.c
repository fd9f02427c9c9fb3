/*
 * dict.c - open-addressing hash table with per-use entry type (see dict.h).
 */
#include "core/dict.h"

#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"

#define DICT_MIN_CAP 64

/* 0 marks an empty slot, so a key whose hash is 0 is stored under 1. */
static inline uint64_t slot_hash(uint64_t h) { return h ? h : 1; }

static inline void *entry_at(const kex_dict *d, uint32_t i) { return d->entries + (size_t)i * d->type->entry_size; }

void *kex_dict_find(const kex_dict *d, uint64_t h, const void *probe) {
  if (!d->len) return NULL;
  h = slot_hash(h);
  uint32_t mask = d->cap - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    uint64_t s = d->hashes[i];
    if (!s) return NULL;
    if (s == h && d->type->eq(entry_at(d, i), probe)) return entry_at(d, i);
  }
}

static int grow(kex_dict *d) {
  uint32_t ncap = d->cap ? d->cap * 2 : DICT_MIN_CAP, mask = ncap - 1;
  size_t esz = d->type->entry_size;
  uint64_t *nh = kex_calloc(ncap, sizeof *nh);
  unsigned char *ne = kex_malloc(ncap * esz);
  if (!nh || !ne) {
    kex_free(nh);
    kex_free(ne);
    return KEX_ENOMEM;
  }
  for (uint32_t i = 0; i < d->cap; i++) {
    uint64_t s = d->hashes[i];
    if (!s) continue;
    uint32_t j = (uint32_t)s & mask;
    while (nh[j]) j = (j + 1) & mask;
    nh[j] = s;
    memcpy(ne + (size_t)j * esz, entry_at(d, i), esz);
  }
  kex_free(d->hashes);
  kex_free(d->entries);
  d->hashes = nh;
  d->entries = ne;
  d->cap = ncap;
  return 0;
}

void *kex_dict_insert(kex_dict *d, uint64_t h, const void *probe, bool *found) {
  if ((d->len + 1) * 10 > d->cap * 7 && grow(d)) return NULL;
  h = slot_hash(h);
  uint32_t mask = d->cap - 1, i = (uint32_t)h & mask;
  for (uint64_t s; (s = d->hashes[i]); i = (i + 1) & mask) {
    if (s == h && d->type->eq(entry_at(d, i), probe)) {
      *found = true;
      return entry_at(d, i);
    }
  }
  d->hashes[i] = h;
  d->len++;
  *found = false;
  return memset(entry_at(d, i), 0, d->type->entry_size);
}

void kex_dict_cancel(kex_dict *d, void *entry) {
  size_t off = (size_t)((unsigned char *)entry - d->entries);
  uint32_t i = (uint32_t)(off / d->type->entry_size);
  /* the entry was the last one inserted, in what was an empty slot: no probe chain runs through it yet */
  d->hashes[i] = 0;
  d->len--;
}

void *kex_dict_next(const kex_dict *d, uint32_t *pos) {
  for (; *pos < d->cap; (*pos)++)
    if (d->hashes[*pos]) return entry_at(d, (*pos)++);
  return NULL;
}

void kex_dict_clear(kex_dict *d) {
  if (d->len) memset(d->hashes, 0, sizeof *d->hashes * d->cap);
  d->len = 0;
}

void kex_dict_free(kex_dict *d) {
  kex_free(d->hashes);
  kex_free(d->entries);
  *d = kex_dict_make(d->type);
}

/*
 * dict.c - growing, cancelling, removing, walking and freeing a core/dict
 * table (the probe loops are inline in dict.h).
 */
#include "core/dict.h"

#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"

#define DICT_MIN_CAP 64

/* Move every entry of d into the empty nh/ne (ncap slots); N is the entry size, a constant in each expansion so
   that the copy is a move, not a call. */
#define REHASH(N)                                                 \
  for (uint32_t i = 0; i < d->cap; i++) {                         \
    uint64_t s = d->hashes[i];                                    \
    if (!s) continue;                                             \
    uint32_t j = (uint32_t)s & mask;                              \
    while (nh[j]) j = (j + 1) & mask;                             \
    nh[j] = s;                                                    \
    memcpy(ne + (size_t)j * (N), d->entries + (size_t)i * (N), N); \
  }

/* Move the entries into ncap (a power of two, above len / 0.7) new slots.  0 or KEX_ENOMEM (d unchanged). */
static int dict_resize(kex_dict *d, uint32_t ncap) {
  uint32_t mask = ncap - 1;
  size_t esz = d->type->entry_size;
  uint64_t *nh = kex_calloc(ncap, sizeof *nh);
  unsigned char *ne = kex_malloc(ncap * esz);
  if (!nh || !ne) {
    kex_free(nh);
    kex_free(ne);
    return KEX_ENOMEM;
  }
  switch (esz) {
  case 4: REHASH(4); break;
  case 8: REHASH(8); break;
  case 16: REHASH(16); break;
  case 24: REHASH(24); break;
  case 32: REHASH(32); break;
  default: REHASH(esz); break;
  }
  kex_free(d->hashes);
  kex_free(d->entries);
  d->hashes = nh;
  d->entries = ne;
  d->cap = ncap;
  d->grow_at = (uint32_t)((uint64_t)ncap * 7 / 10); /* (len + 1) * 10 > cap * 7 exactly when len >= this */
  return 0;
}

int kex__dict_grow(kex_dict *d) {
  return dict_resize(d, d->cap ? d->cap * 2 : d->type->min_cap ? d->type->min_cap : DICT_MIN_CAP);
}

int kex_dict_reserve(kex_dict *d, uint32_t n) {
  uint64_t cap = 16;
  if (d->len || n > (UINT32_MAX / 2) / 10) return 0;
  while (cap * 7 < ((uint64_t)n + 1) * 10) cap *= 2; /* an insert grows at (len + 1) * 10 > cap * 7 (grow_at) */
  return cap > d->cap ? dict_resize(d, (uint32_t)cap) : 0;
}

void kex_dict_cancel(kex_dict *d, void *entry) {
  /* the entry was the last one inserted, in what was an empty slot: no probe chain runs through it yet */
  d->hashes[(size_t)((unsigned char *)entry - d->entries) / d->type->entry_size] = 0;
  d->len--;
}

void kex_dict_remove(kex_dict *d, void *entry) {
  size_t esz = d->type->entry_size;
  uint32_t mask = d->cap - 1, i = (uint32_t)((size_t)((unsigned char *)entry - d->entries) / esz);
  for (uint32_t j = (i + 1) & mask; d->hashes[j]; j = (j + 1) & mask) {
    uint32_t home = (uint32_t)d->hashes[j] & mask;
    /* j's entry may fill the hole at i when its home is not in (i, j] (cyclically) */
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      d->hashes[i] = d->hashes[j];
      memcpy(d->entries + (size_t)i * esz, d->entries + (size_t)j * esz, esz);
      i = j;
    }
  }
  d->hashes[i] = 0;
  d->len--;
}

void *kex_dict_next(const kex_dict *d, uint32_t *pos) {
  for (; *pos < d->cap; (*pos)++)
    if (d->hashes[*pos]) return d->entries + (size_t)(*pos)++ * d->type->entry_size;
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

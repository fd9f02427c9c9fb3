/*
 * dict.h - the one hash table: open addressing, per-use hash and equality.
 *
 * Modelled on Redis' dict/dictType: a kex_dict_type says what one use of
 * the table stores and how keys compare; the table itself only probes,
 * grows and forgets.  Entries are fixed-size records (type->entry_size
 * bytes, e.g. an interned object's pointer, or a (key, value) pair) stored
 * inline, and each slot's 64-bit hash beside them, so probing compares
 * hashes first and calls type->eq only on a hash match, and growing never
 * calls back.  Linear probing, power-of-two capacity, grown at 70% load,
 * removal by moving the rest of the probe run back (no tombstones);
 * memory from kex_malloc.  Hashes are the caller's (kex_hash_* of the key):
 * a table never hashes, so a key may be probed with a differently shaped
 * "probe" (a view's buffer before it is interned) as long as the hash and
 * type->eq agree.
 *
 * Users: the shape context's intern tables and memo (sched/view.c,
 * sched/shapetracker.c), the lazy-buffer cache (sched/lazy.c), the
 * schedule's LazyOp table (sched/schedule.c), uop hash-consing
 * (codegen/uops.c), the AST key's tables (codegen/astkey.c), kexd's
 * loaded-programs index (daemon/programs.c) and kex_ptrmap (core/ptrmap.c).
 */
#ifndef KEX_CORE_DICT_H
#define KEX_CORE_DICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kex_dict_type {
  size_t entry_size; /* bytes of one entry */
  /* Does the stored entry match the probe?  Called only when their hashes are equal. */
  bool (*eq)(const void *entry, const void *probe);
  uint32_t min_cap; /* slots of the first allocation (a power of two); 0 means 64 */
} kex_dict_type;

typedef struct kex_dict {
  const kex_dict_type *type;
  uint64_t *hashes;       /* cap slot hashes, 0 = empty */
  unsigned char *entries; /* cap entries of type->entry_size bytes */
  uint32_t cap, len;
} kex_dict;

/* An empty dict of that type (no memory until the first insert). */
static inline kex_dict kex_dict_make(const kex_dict_type *type) { return (kex_dict){.type = type}; }

/* The entry matching probe (whose hash is h), or NULL.  Valid until the next insert. */
static inline void *kex_dict_find(const kex_dict *d, uint64_t h, const void *probe);

/*
 * Find probe (hash h), or make room for it.  Returns the matching entry
 * with *found = true, or a new entry with *found = false that the caller
 * fills before the next call on d (or gives back with kex_dict_cancel);
 * NULL when growing ran out of memory (d is unchanged).  The pointer is
 * valid until the next insert.
 */
static inline void *kex_dict_insert(kex_dict *d, uint64_t h, const void *probe, bool *found);

/* Give back the entry the last kex_dict_insert just made (when filling it failed). */
void kex_dict_cancel(kex_dict *d, void *entry);

/* Remove a stored entry (a pointer find or insert returned); later entries of its probe run move back.  No
   memory is allocated or freed.  Other entry pointers are invalid afterwards. */
void kex_dict_remove(kex_dict *d, void *entry);

/* Walk the entries: start with *pos = 0; NULL when done.  No insert during a walk. */
void *kex_dict_next(const kex_dict *d, uint32_t *pos);

/* Forget every entry, keeping the memory. */
void kex_dict_clear(kex_dict *d);
/* Make room for n entries without growing (a no-op when there already is, or d holds entries).  0 or KEX_ENOMEM;
   the dict is usable either way. */
int kex_dict_reserve(kex_dict *d, uint32_t n);
/* Bytes of the table's memory (0 before its first insert). */
static inline size_t kex_dict_bytes(const kex_dict *d) {
  return d->cap ? (size_t)d->cap * (sizeof *d->hashes + d->type->entry_size) : 0;
}
/* Release the memory; the dict is empty and reusable (its type stays). */
void kex_dict_free(kex_dict *d);

/* ---- the probe loops, inline: they are the hot path of interning ---- */

/* Double the capacity (or allocate the first slots).  0 or KEX_ENOMEM. */
int kex__dict_grow(kex_dict *d);

/* 0 marks an empty slot, so a key whose hash is 0 is stored under 1. */
static inline uint64_t kex__dict_hash(uint64_t h) { return h ? h : 1; }

static inline void *kex_dict_find(const kex_dict *d, uint64_t h, const void *probe) {
  if (!d->len) return NULL;
  h = kex__dict_hash(h);
  uint32_t mask = d->cap - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    uint64_t s = d->hashes[i];
    if (!s) return NULL;
    unsigned char *e = d->entries + i * d->type->entry_size;
    if (s == h && d->type->eq(e, probe)) return e;
  }
}

static inline void *kex_dict_insert(kex_dict *d, uint64_t h, const void *probe, bool *found) {
  if ((d->len + 1) * 10 > d->cap * 7 && kex__dict_grow(d)) return NULL;
  h = kex__dict_hash(h);
  uint32_t mask = d->cap - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    uint64_t s = d->hashes[i];
    unsigned char *e = d->entries + i * d->type->entry_size;
    if (!s) {
      d->hashes[i] = h;
      d->len++;
      *found = false;
      return e;
    }
    if (s == h && d->type->eq(e, probe)) {
      *found = true;
      return e;
    }
  }
}

#endif

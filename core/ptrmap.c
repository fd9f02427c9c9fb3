/*
 * ptrmap.c - pointer-pair hash map over core/dict.
 */
#include "core/ptrmap.h"

#include "core/errors.h"
#include "core/hash.h"

typedef struct ptr_entry {
  const void *a, *b;
  void *val;
} ptr_entry;

static bool ptr_eq(const void *entry, const void *probe) {
  const ptr_entry *e = entry, *k = probe;
  return e->a == k->a && e->b == k->b;
}

static const kex_dict_type ptrmap_type = {sizeof(ptr_entry), ptr_eq};

static uint64_t ptr_hash(const void *a, const void *b) { return kex_hash_mix((uintptr_t)a, (uintptr_t)b); }

void **kex_ptrmap_find(const kex_ptrmap *m, const void *a, const void *b) {
  ptr_entry k = {a, b, NULL};
  ptr_entry *e = kex_dict_find(m, ptr_hash(a, b), &k);
  return e ? &e->val : NULL;
}

int kex_ptrmap_put(kex_ptrmap *m, const void *a, const void *b, void *v) {
  ptr_entry k = {a, b, v};
  bool found;
  m->type = &ptrmap_type; /* a zeroed map has none yet */
  ptr_entry *e = kex_dict_insert(m, ptr_hash(a, b), &k, &found);
  if (!e) return KEX_ENOMEM;
  *e = k;
  return 0;
}

void kex_ptrmap_clear(kex_ptrmap *m) { kex_dict_clear(m); }

void kex_ptrmap_free(kex_ptrmap *m) { kex_dict_free(m); }

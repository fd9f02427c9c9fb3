/*
 * ptrmap.c - pointer-pair hash map.
 */
#include "core/ptrmap.h"

#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/hash.h"

static uint32_t slot_of(const void *a, const void *b, uint32_t cap) {
  return (uint32_t)kex_hash_mix((uintptr_t)a, (uintptr_t)b) & (cap - 1);
}

void **kex_ptrmap_find(const kex_ptrmap *m, const void *a, const void *b) {
  if (!m->len) return NULL;
  for (uint32_t i = slot_of(a, b, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (!m->ka[i]) return NULL;
    if (m->ka[i] == a && m->kb[i] == b) return &m->val[i];
  }
}

static int grow(kex_ptrmap *m) {
  uint32_t ncap = m->cap ? m->cap * 2 : 64;
  const void **na = kex_calloc(ncap, sizeof *na), **nb = kex_malloc(sizeof *nb * ncap);
  void **nv = kex_malloc(sizeof *nv * ncap);
  if (!na || !nb || !nv) {
    kex_free(na);
    kex_free(nb);
    kex_free(nv);
    return KEX_ENOMEM;
  }
  for (uint32_t i = 0; i < m->cap; i++) {
    if (!m->ka[i]) continue;
    uint32_t j = slot_of(m->ka[i], m->kb[i], ncap);
    while (na[j]) j = (j + 1) & (ncap - 1);
    na[j] = m->ka[i];
    nb[j] = m->kb[i];
    nv[j] = m->val[i];
  }
  kex_free(m->ka);
  kex_free(m->kb);
  kex_free(m->val);
  m->ka = na;
  m->kb = nb;
  m->val = nv;
  m->cap = ncap;
  return 0;
}

int kex_ptrmap_put(kex_ptrmap *m, const void *a, const void *b, void *v) {
  if ((m->len + 1) * 2 > m->cap && grow(m)) return KEX_ENOMEM;
  uint32_t i = slot_of(a, b, m->cap);
  for (; m->ka[i]; i = (i + 1) & (m->cap - 1)) {
    if (m->ka[i] == a && m->kb[i] == b) {
      m->val[i] = v;
      return 0;
    }
  }
  m->ka[i] = a;
  m->kb[i] = b;
  m->val[i] = v;
  m->len++;
  return 0;
}

void kex_ptrmap_clear(kex_ptrmap *m) {
  if (m->len) memset(m->ka, 0, sizeof *m->ka * m->cap);
  m->len = 0;
}

void kex_ptrmap_free(kex_ptrmap *m) {
  kex_free(m->ka);
  kex_free(m->kb);
  kex_free(m->val);
  memset(m, 0, sizeof *m);
}

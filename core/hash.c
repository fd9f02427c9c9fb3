/*
 * hash.c - byte-string hashing.
 */
#include "core/hash.h"

#include <string.h>

uint64_t kex_hash_bytes(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = kex_hash_mix(seed, len);
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    h = kex_hash_mix(h, v);
    p += 8;
    len -= 8;
  }
  uint64_t tail = 0;
  if (len) memcpy(&tail, p, len); /* data may be NULL when len is 0 */
  return kex_hash_mix(h, tail ^ ((uint64_t)len << 56));
}

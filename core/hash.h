/*
 * hash.h - 64-bit hashing for hash-consing and structure keys.
 *
 * kex_hash_bytes is a fast, seeded, non-cryptographic hash (wyhash-style
 * multiply-mix); kex_hash_mix combines two 64-bit values.  Keys meant to
 * persist across processes (cache keys) use kex_hash_bytes with seed 0.
 */
#ifndef KEX_CORE_HASH_H
#define KEX_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t kex_hash_mix(uint64_t a, uint64_t b) {
  __uint128_t r = (__uint128_t)(a ^ 0x9e3779b97f4a7c15ull) * (b ^ 0xbf58476d1ce4e5b9ull);
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t kex_hash_u64(uint64_t h, uint64_t v) { return kex_hash_mix(h, v + 0x94d049bb133111ebull); }

uint64_t kex_hash_bytes(const void *data, size_t len, uint64_t seed);

#endif

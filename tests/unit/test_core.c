/*
 * test_core.c - unit tests for core/: the error table, the allocation hook,
 * arenas, hashing, the dtype table and promotion lattice, scalar constants,
 * op names and constant folding (python_alu), and logging.
 *
 * Expected values come from tinygrad 0.9.0's semantics as written in
 * spec/tinygrad-engine.md sections 1 and 2 (and Python's own arithmetic),
 * never from running the code under test.  The allocation hook is process
 * global, so every test that arms it disarms it in its teardown.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/strbuf.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "core/codec.h"
#include "core/dict.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/hash.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/npy.h"
#include "core/ops.h"
#include "core/ptrmap.h"

static const int all_codes[] = {
#define XX(name, value, msg, grpc) KEX_E##name,
    KEX_ERRNO_MAP(XX)
#undef XX
};
#define N_CODES ((int)(sizeof all_codes / sizeof all_codes[0]))

static int disarm_alloc_hook(void **state) {
  (void)state;
  kex_alloc_fail_at(0, 0);
  return 0;
}

/* ---- errors ---- */

static void test_err_table_complete(void **state) {
  (void)state;
  assert_true(N_CODES >= 18);
  for (int i = 0; i < N_CODES; i++) {
    int c = all_codes[i];
    assert_true(c < 0);
    assert_string_not_equal(kex_strerror(c), "unknown error");
    assert_string_not_equal(kex_errname(c), "UNKNOWN");
    int g = kex_err_grpc_status(c);
    /* every failure is a real gRPC error status, never OK and never the catch-all */
    assert_in_range(g, KEX_GRPC_CANCELLED, KEX_GRPC_UNAUTHENTICATED);
    assert_int_not_equal(g, KEX_GRPC_UNKNOWN);
    for (int j = 0; j < i; j++) {
      assert_int_not_equal(c, all_codes[j]);
      assert_string_not_equal(kex_errname(c), kex_errname(all_codes[j]));
    }
  }
}

static void test_err_success_and_unknown(void **state) {
  (void)state;
  assert_string_equal(kex_strerror(0), "success");
  assert_string_equal(kex_errname(0), "OK");
  assert_int_equal(kex_err_grpc_status(0), KEX_GRPC_OK);
  const int outside[] = {1, 42, -1000, -(N_CODES + 1)};
  for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
    assert_string_equal(kex_strerror(outside[i]), "unknown error");
    assert_string_equal(kex_errname(outside[i]), "UNKNOWN");
    assert_int_equal(kex_err_grpc_status(outside[i]), KEX_GRPC_UNKNOWN);
  }
}

static void test_err_grpc_mapping(void **state) {
  (void)state;
  /* the mappings graph-format.md and DESIGN.md promise to clients */
  assert_int_equal(kex_err_grpc_status(KEX_EINVAL), KEX_GRPC_INVALID_ARGUMENT);
  assert_int_equal(kex_err_grpc_status(KEX_EPARSE), KEX_GRPC_INVALID_ARGUMENT);
  assert_int_equal(kex_err_grpc_status(KEX_ENOMEM), KEX_GRPC_RESOURCE_EXHAUSTED);
  assert_int_equal(kex_err_grpc_status(KEX_ELIMIT), KEX_GRPC_RESOURCE_EXHAUSTED);
  assert_int_equal(kex_err_grpc_status(KEX_ENOTFOUND), KEX_GRPC_NOT_FOUND);
  assert_int_equal(kex_err_grpc_status(KEX_EDEADLINE), KEX_GRPC_DEADLINE_EXCEEDED);
  assert_int_equal(kex_err_grpc_status(KEX_ECANCELLED), KEX_GRPC_CANCELLED);
  assert_int_equal(kex_err_grpc_status(KEX_EUNAVAILABLE), KEX_GRPC_UNAVAILABLE);
  assert_string_equal(kex_errname(KEX_ENOMEM), "NOMEM");
  assert_string_equal(kex_strerror(KEX_ENOMEM), "out of memory");
}

static void test_err_set_formats(void **state) {
  (void)state;
  kex_error err;
  memset(&err, 0x55, sizeof err);
  int rc = kex_err_set(&err, KEX_EINVAL, "node %d: unknown dtype '%s'", 3, "float8");
  assert_int_equal(rc, KEX_EINVAL);
  assert_int_equal(err.code, KEX_EINVAL);
  assert_string_equal(err.msg, "node 3: unknown dtype 'float8'");
  /* a NULL error is allowed and still returns the code */
  assert_int_equal(kex_err_set(NULL, KEX_ELIMIT, "nodes %u > %u", 5u, 4u), KEX_ELIMIT);
}

static void test_err_set_truncates(void **state) {
  (void)state;
  char big[3 * KEX_ERROR_MSG_MAX];
  for (size_t i = 0; i < sizeof big - 1; i++) big[i] = (char)('a' + i % 26);
  big[sizeof big - 1] = 0;
  kex_error err;
  assert_int_equal(kex_err_set(&err, KEX_EPARSE, "%s", big), KEX_EPARSE);
  assert_int_equal(strlen(err.msg), KEX_ERROR_MSG_MAX - 1);
  assert_memory_equal(err.msg, big, KEX_ERROR_MSG_MAX - 1);
  /* exactly at the boundary: MAX-1 characters fit, unchanged */
  big[KEX_ERROR_MSG_MAX - 1] = 0;
  kex_err_set(&err, KEX_EPARSE, "%s", big);
  assert_string_equal(err.msg, big);
}

/* ---- allocation hook ---- */

static void test_alloc_fail_nth(void **state) {
  (void)state;
  unsigned long before = kex_alloc_count();
  kex_alloc_fail_at(3, 0);
  void *p1 = kex_malloc(8), *p2 = kex_malloc(8), *p3 = kex_malloc(8), *p4 = kex_malloc(8);
  assert_non_null(p1);
  assert_non_null(p2);
  assert_null(p3);
  assert_non_null(p4); /* not sticky: only the 3rd failed */
  assert_int_equal(kex_alloc_count() - before, 4);
  kex_free(p1);
  kex_free(p2);
  kex_free(p4);
  kex_free(NULL);
}

static void test_alloc_fail_sticky(void **state) {
  (void)state;
  kex_alloc_fail_at(2, 1);
  void *p1 = kex_malloc(8);
  assert_non_null(p1);
  for (int i = 0; i < 5; i++) assert_null(kex_malloc(8));
  kex_alloc_fail_at(0, 0); /* disarm */
  void *p2 = kex_malloc(8);
  assert_non_null(p2);
  kex_free(p1);
  kex_free(p2);
}

static void test_alloc_fail_every_kind(void **state) {
  (void)state;
  char *s = kex_malloc(4);
  assert_non_null(s);
  memcpy(s, "abc", 4);
  kex_alloc_fail_at(1, 0);
  assert_null(kex_realloc(s, 1024));
  assert_string_equal(s, "abc"); /* a failed realloc leaves the block alone */
  kex_alloc_fail_at(1, 0);
  assert_null(kex_calloc(4, 4));
  kex_alloc_fail_at(1, 0);
  assert_null(kex_strdup("hello"));
  kex_alloc_fail_at(1, 0);
  assert_null(kex_strndup("hello", 2));
  char *d = kex_strndup("hello", 2);
  assert_string_equal(d, "he");
  kex_free(d);
  kex_free(s);
}

/* ---- arena ---- */

static void test_arena_alignment(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 256);
  unsigned char *prev[64];
  size_t sizes[64];
  for (int i = 0; i < 64; i++) {
    sizes[i] = (size_t)(i * 7 % 61); /* includes 0 */
    prev[i] = kex_arena_alloc(&a, sizes[i]);
    assert_non_null(prev[i]);
    assert_int_equal((uintptr_t)prev[i] % 16, 0);
    memset(prev[i], i, sizes[i]);
  }
  for (int i = 0; i < 64; i++)
    for (size_t k = 0; k < sizes[i]; k++) assert_int_equal(prev[i][k], i); /* no overlap */
  kex_arena_destroy(&a);
}

static void test_arena_big_allocations(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 4096);
  char *small1 = kex_arena_alloc(&a, 32);
  assert_non_null(small1);
  memset(small1, 'x', 32);
  size_t big_size = 1 << 20;
  char *big = kex_arena_alloc(&a, big_size);
  assert_non_null(big);
  assert_int_equal((uintptr_t)big % 16, 0);
  memset(big, 'b', big_size);
  assert_true(a.total >= big_size + 4096);
  char *small2 = kex_arena_alloc(&a, 32); /* still room in the first block */
  assert_non_null(small2);
  assert_ptr_equal(small2, small1 + 32);
  memset(small2, 'y', 32);
  char *big2 = kex_arena_alloc(&a, 5000); /* > block size: its own block, chained behind */
  assert_non_null(big2);
  memset(big2, 'c', 5000);
  char *small3 = kex_arena_alloc(&a, 16); /* the first block is still the current one */
  assert_ptr_equal(small3, small2 + 32);
  for (size_t i = 0; i < big_size; i += 4099) assert_int_equal(big[i], 'b');
  for (int i = 0; i < 32; i++) {
    assert_int_equal(small1[i], 'x');
    assert_int_equal(small2[i], 'y');
  }
  kex_arena_destroy(&a);
}

static void test_arena_many_small(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 0); /* default 64 KiB blocks */
  enum { N = 100000 };
  uint32_t **ptrs = malloc(N * sizeof *ptrs);
  assert_non_null(ptrs);
  for (uint32_t i = 0; i < N; i++) {
    ptrs[i] = kex_arena_alloc(&a, sizeof(uint32_t));
    assert_non_null(ptrs[i]);
    *ptrs[i] = i * 2654435761u;
  }
  for (uint32_t i = 0; i < N; i++) assert_int_equal(*ptrs[i], i * 2654435761u);
  /* 16 bytes per allocation after rounding: at least 1.6 MB in 64 KiB blocks */
  assert_true(a.total >= (size_t)N * 16);
  assert_true(a.total < (size_t)N * 16 + 2 * 64 * 1024);
  free(ptrs);
  kex_arena_destroy(&a);
}

static void test_arena_calloc_zeroes(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 1024);
  /* dirty the block, then reuse its memory after destroy */
  for (int round = 0; round < 2; round++) {
    unsigned char *p = kex_arena_calloc(&a, 100, 7);
    assert_non_null(p);
    for (int i = 0; i < 700; i++) assert_int_equal(p[i], 0);
    memset(p, 0xff, 700);
    unsigned char *q = kex_arena_calloc(&a, 1, 200);
    for (int i = 0; i < 200; i++) assert_int_equal(q[i], 0);
    kex_arena_destroy(&a);
  }
  assert_null(kex_arena_calloc(&a, SIZE_MAX / 2, 4)); /* n*size overflows */
  kex_arena_destroy(&a);
}

static void test_arena_huge_request_fails(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 1024);
  /* rounding SIZE_MAX up to 16 must not wrap around to a tiny block */
  assert_null(kex_arena_alloc(&a, SIZE_MAX));
  assert_null(kex_arena_alloc(&a, SIZE_MAX - 8));
  assert_null(kex_arena_calloc(&a, 1, SIZE_MAX - 15));
  void *p = kex_arena_alloc(&a, 16);
  assert_non_null(p); /* still usable */
  kex_arena_destroy(&a);
}

static void test_arena_destroy_and_reuse(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 512);
  for (int i = 0; i < 100; i++) assert_non_null(kex_arena_alloc(&a, 100));
  assert_true(a.total > 0);
  kex_arena_destroy(&a);
  assert_null(a.head);
  assert_int_equal(a.total, 0);
  assert_int_equal(a.block_size, 512);
  char *s = kex_arena_strdup(&a, "kernel E_4");
  assert_string_equal(s, "kernel E_4");
  const int src[3] = {1, 2, 3};
  int *d = kex_arena_memdup(&a, src, sizeof src);
  assert_memory_equal(d, src, sizeof src);
  assert_ptr_not_equal(d, src);
  kex_arena_destroy(&a);
  kex_arena_destroy(&a); /* destroying an empty arena is harmless */
}

/* kex_arena_grow: in place while the array is the last allocation, else a copy; contents kept; held bytes counted. */
static void test_arena_grow(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 4096);
  uint32_t *v = NULL, len = 0, cap = 0;
  for (uint32_t i = 0; i < 200; i++) {
    uint32_t *before = v, oldcap = cap;
    assert_int_equal(kex_arena_grow(&a, &v, len, &cap, sizeof *v, 4), 0);
    if (oldcap && cap != oldcap && cap * sizeof *v <= 4096) assert_ptr_equal(v, before); /* grew where it was */
    v[len++] = i;
  }
  assert_true(cap >= 200);
  for (uint32_t i = 0; i < 200; i++) assert_int_equal(v[i], i);
  /* not the last allocation any more: growing copies */
  uint32_t *w = NULL, wlen = 0, wcap = 0;
  assert_int_equal(kex_arena_grow(&a, &w, wlen, &wcap, sizeof *w, 4), 0);
  w[wlen++] = 7;
  assert_non_null(kex_arena_alloc(&a, 16));
  uint32_t *wbefore = w;
  for (uint32_t i = 1; i < 64; i++) {
    assert_int_equal(kex_arena_grow(&a, &w, wlen, &wcap, sizeof *w, 4), 0);
    w[wlen++] = 7 + i;
  }
  assert_ptr_not_equal(w, wbefore);
  for (uint32_t i = 0; i < 64; i++) assert_int_equal(w[i], 7 + i);
  assert_true(kex_arena_held(&a) >= a.total);
  kex_arena_reset(&a);
  assert_int_equal(a.total, 0);
  assert_true(kex_arena_held(&a) > 0); /* the spare blocks */
  kex_arena_destroy(&a);
  assert_int_equal(kex_arena_held(&a), 0);
}

static void test_arena_alloc_hook(void **state) {
  (void)state;
  kex_arena a;
  kex_arena_init(&a, 1024);
  kex_alloc_fail_at(1, 0);
  assert_null(kex_arena_alloc(&a, 16)); /* the first block cannot be had */
  assert_null(a.head);
  char *p = kex_arena_alloc(&a, 16);
  assert_non_null(p);
  strcpy(p, "survives");
  /* the current block has room: no allocation, so an armed hook does not fire */
  kex_alloc_fail_at(1, 1);
  assert_non_null(kex_arena_alloc(&a, 64));
  /* a new block is needed: the hook fires, the arena keeps what it had */
  assert_null(kex_arena_alloc(&a, 4096));
  assert_non_null(kex_arena_strdup(&a, "x")); /* fits in the current block: no allocation */
  kex_alloc_fail_at(0, 0);
  assert_string_equal(p, "survives");
  assert_non_null(kex_arena_alloc(&a, 4096));
  kex_arena_destroy(&a);
}

/* ---- hashing ---- */

static void test_hash_deterministic_and_distinct(void **state) {
  (void)state;
  const char *s = "LazyBuffer(ADD, (0, 1))";
  uint64_t h1 = kex_hash_bytes(s, strlen(s), 0);
  assert_true(h1 == kex_hash_bytes(s, strlen(s), 0));
  char copy[64];
  strcpy(copy, s);
  assert_true(h1 == kex_hash_bytes(copy, strlen(copy), 0)); /* content, not address */
  /* 2000 distinct short and long inputs give 2000 distinct hashes */
  enum { N = 2000 };
  uint64_t *hs = malloc(N * sizeof *hs);
  assert_non_null(hs);
  for (int i = 0; i < N; i++) {
    char buf[64];
    int len = snprintf(buf, sizeof buf, i % 2 ? "node-%d" : "a-much-longer-node-name-%d-with-tail", i);
    hs[i] = kex_hash_bytes(buf, (size_t)len, 0);
    for (int j = 0; j < i; j++) assert_true(hs[i] != hs[j]);
  }
  free(hs);
  /* length is part of the key: trailing zero bytes change the hash */
  const char zeros[9] = {0};
  for (size_t n = 0; n < 8; n++) assert_true(kex_hash_bytes(zeros, n, 0) != kex_hash_bytes(zeros, n + 1, 0));
  /* one flipped bit anywhere changes the hash */
  unsigned char block[40];
  memset(block, 7, sizeof block);
  uint64_t base = kex_hash_bytes(block, sizeof block, 0);
  for (size_t i = 0; i < sizeof block; i++) {
    block[i] ^= 1;
    assert_true(kex_hash_bytes(block, sizeof block, 0) != base);
    block[i] ^= 1;
  }
}

static void test_hash_seed_and_mix(void **state) {
  (void)state;
  const char *s = "seeded";
  assert_true(kex_hash_bytes(s, 6, 0) != kex_hash_bytes(s, 6, 1));
  assert_true(kex_hash_bytes(s, 6, 1) != kex_hash_bytes(s, 6, 2));
  assert_true(kex_hash_bytes(NULL, 0, 0) != kex_hash_bytes(NULL, 0, 1));
  assert_true(kex_hash_bytes(NULL, 0, 5) == kex_hash_bytes("", 0, 5));
  uint64_t h = 12345;
  assert_true(kex_hash_u64(h, 1) != kex_hash_u64(h, 2));
  assert_true(kex_hash_u64(h, 0) != kex_hash_u64(h + 1, 0));
  assert_true(kex_hash_mix(1, 2) != kex_hash_mix(2, 1)); /* order matters for chained keys */
}

/* ---- dtypes ---- */

static void test_dtype_table(void **state) {
  (void)state;
  static const struct {
    kex_dtype dt;
    const char *name, *tg;
    int size;
    char kind;
  } want[] = {
      {KEX_DT_BOOL, "bool", "bool", 1, 'b'},          {KEX_DT_INT8, "int8", "char", 1, 'i'},
      {KEX_DT_UINT8, "uint8", "uchar", 1, 'u'},       {KEX_DT_INT16, "int16", "short", 2, 'i'},
      {KEX_DT_UINT16, "uint16", "ushort", 2, 'u'},    {KEX_DT_INT32, "int32", "int", 4, 'i'},
      {KEX_DT_UINT32, "uint32", "uint", 4, 'u'},      {KEX_DT_INT64, "int64", "long", 8, 'i'},
      {KEX_DT_UINT64, "uint64", "ulong", 8, 'u'},     {KEX_DT_FLOAT16, "float16", "half", 2, 'f'},
      {KEX_DT_BFLOAT16, "bfloat16", "bfloat16", 2, 'f'}, {KEX_DT_FLOAT32, "float32", "float", 4, 'f'},
      {KEX_DT_FLOAT64, "float64", "double", 8, 'f'},
  };
  assert_int_equal(KEX_DT_COUNT, 13);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    kex_dtype d = want[i].dt;
    assert_int_equal(d, (int)i); /* enum order = tinygrad priority order */
    assert_string_equal(kex_dtypes[d].name, want[i].name);
    assert_string_equal(kex_dtype_tgname(d), want[i].tg);
    assert_int_equal(kex_dtype_size(d), want[i].size);
    assert_int_equal(kex_dtypes[d].kind, want[i].kind);
    assert_int_equal(kex_dtype_is_float(d), want[i].kind == 'f');
    assert_int_equal(kex_dtype_is_int(d), want[i].kind == 'i' || want[i].kind == 'u');
    assert_int_equal(kex_dtype_is_unsigned(d), want[i].kind == 'u');
  }
  assert_string_equal(kex_dtypes[KEX_DT_UINT8].cl_name, "uchar");
  assert_string_equal(kex_dtypes[KEX_DT_BOOL].clang_name, "_Bool");
  assert_string_equal(kex_dtypes[KEX_DT_FLOAT16].clang_name, "__fp16");
}

static void test_dtype_from_name(void **state) {
  (void)state;
  for (int i = 0; i < KEX_DT_COUNT; i++) assert_int_equal(kex_dtype_from_name(kex_dtypes[i].name), i);
  const char *bad[] = {"", "float", "half", "int", "Float32", "float32 ", "float8"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(kex_dtype_from_name(bad[i]), -1);
}

static void test_dtype_lub(void **state) {
  (void)state;
  static const kex_dtype cases[][3] = {
      {KEX_DT_INT8, KEX_DT_UINT8, KEX_DT_INT16},       {KEX_DT_BOOL, KEX_DT_FLOAT16, KEX_DT_FLOAT16},
      {KEX_DT_INT64, KEX_DT_UINT64, KEX_DT_FLOAT16},   {KEX_DT_INT32, KEX_DT_UINT32, KEX_DT_INT64},
      {KEX_DT_UINT8, KEX_DT_UINT16, KEX_DT_UINT16},    {KEX_DT_INT16, KEX_DT_UINT16, KEX_DT_INT32},
      {KEX_DT_BOOL, KEX_DT_BOOL, KEX_DT_BOOL},         {KEX_DT_BOOL, KEX_DT_INT8, KEX_DT_INT8},
      {KEX_DT_BOOL, KEX_DT_UINT8, KEX_DT_UINT8},       {KEX_DT_FLOAT16, KEX_DT_BFLOAT16, KEX_DT_FLOAT32},
      {KEX_DT_INT32, KEX_DT_FLOAT16, KEX_DT_FLOAT16},  {KEX_DT_INT32, KEX_DT_BFLOAT16, KEX_DT_BFLOAT16},
      {KEX_DT_UINT64, KEX_DT_FLOAT32, KEX_DT_FLOAT32}, {KEX_DT_FLOAT32, KEX_DT_FLOAT64, KEX_DT_FLOAT64},
      {KEX_DT_INT8, KEX_DT_UINT64, KEX_DT_FLOAT16},    {KEX_DT_UINT32, KEX_DT_INT8, KEX_DT_INT64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(kex_dtype_lub(cases[i][0], cases[i][1]), cases[i][2]);
    assert_int_equal(kex_dtype_lub(cases[i][1], cases[i][0]), cases[i][2]); /* symmetric */
  }
  for (int d = 0; d < KEX_DT_COUNT; d++) {
    assert_int_equal(kex_dtype_lub((kex_dtype)d, (kex_dtype)d), d);
    assert_int_equal(kex_dtype_lub((kex_dtype)d, KEX_DT_FLOAT64), KEX_DT_FLOAT64);
  }
}

static void test_dtype_sum_acc_and_upper_float(void **state) {
  (void)state;
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_FLOAT16), KEX_DT_FLOAT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_BFLOAT16), KEX_DT_FLOAT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_FLOAT32), KEX_DT_FLOAT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_FLOAT64), KEX_DT_FLOAT64);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_INT8), KEX_DT_INT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_BOOL), KEX_DT_INT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_INT64), KEX_DT_INT64);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_UINT8), KEX_DT_UINT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_UINT16), KEX_DT_UINT32);
  assert_int_equal(kex_dtype_sum_acc(KEX_DT_UINT64), KEX_DT_UINT64);
  assert_int_equal(kex_dtype_least_upper_float(KEX_DT_INT32), KEX_DT_FLOAT32);
  assert_int_equal(kex_dtype_least_upper_float(KEX_DT_BOOL), KEX_DT_FLOAT32);
  assert_int_equal(kex_dtype_least_upper_float(KEX_DT_FLOAT16), KEX_DT_FLOAT16);
  assert_int_equal(kex_dtype_least_upper_float(KEX_DT_FLOAT64), KEX_DT_FLOAT64);
}

/* ---- scalar constants ---- */

static void test_const_as(void **state) {
  (void)state;
  kex_const c = kex_const_as(kex_const_float(2.7), KEX_DT_INT32);
  assert_int_equal(c.kind, KEX_CONST_INT);
  assert_int_equal(c.i, 2);
  assert_int_equal(kex_const_as(kex_const_float(-2.7), KEX_DT_INT8).i, -2); /* int() truncates toward 0 */
  assert_int_equal(kex_const_as(kex_const_bool(true), KEX_DT_UINT8).i, 1);
  c = kex_const_as(kex_const_int(3), KEX_DT_FLOAT16);
  assert_int_equal(c.kind, KEX_CONST_FLOAT);
  assert_true(c.f == 3.0);
  c = kex_const_as(kex_const_float(0.5), KEX_DT_BOOL);
  assert_int_equal(c.kind, KEX_CONST_BOOL);
  assert_true(c.b);
  assert_false(kex_const_as(kex_const_int(0), KEX_DT_BOOL).b);
  assert_true(kex_const_as(kex_const_int(-4), KEX_DT_BOOL).b);
  assert_true(kex_const_as_double(kex_const_bool(true)) == 1.0);
}

static void test_const_truncate(void **state) {
  (void)state;
  assert_int_equal(kex_const_truncate(kex_const_int(2147483648ll), KEX_DT_INT32).i, INT32_MIN);
  assert_int_equal(kex_const_truncate(kex_const_int(-1), KEX_DT_UINT32).i, 4294967295ll);
  assert_int_equal(kex_const_truncate(kex_const_int(300), KEX_DT_UINT8).i, 44);
  assert_int_equal(kex_const_truncate(kex_const_int(200), KEX_DT_INT8).i, -56);
  assert_int_equal(kex_const_truncate(kex_const_int(70000), KEX_DT_INT16).i, 70000 - 65536);
  assert_int_equal(kex_const_truncate(kex_const_float(3.9), KEX_DT_INT32).i, 3);
  /* float32 rounds: 0.1 is not a float */
  kex_const f = kex_const_truncate(kex_const_float(0.1), KEX_DT_FLOAT32);
  assert_true(f.f == (double)0.1f);
  assert_true(f.f != 0.1);
  assert_true(kex_const_truncate(kex_const_float(1e39), KEX_DT_FLOAT32).f == INFINITY);
  /* float16: 11 significant bits; 65520 rounds (to even) past 65504 -> inf */
  assert_true(kex_const_truncate(kex_const_float(1.0 + 1.0 / 1024), KEX_DT_FLOAT16).f == 1.0 + 1.0 / 1024);
  assert_true(kex_const_truncate(kex_const_float(1.0 + 1.0 / 4096), KEX_DT_FLOAT16).f == 1.0);
  assert_true(kex_const_truncate(kex_const_float(65504), KEX_DT_FLOAT16).f == 65504.0);
  assert_true(isinf(kex_const_truncate(kex_const_float(65520), KEX_DT_FLOAT16).f));
  /* bfloat16: 8 significant bits, round to nearest even */
  assert_true(kex_const_truncate(kex_const_float(1.0 + 1.0 / 512), KEX_DT_BFLOAT16).f == 1.0);
  assert_true(kex_const_truncate(kex_const_float(1.0 + 3.0 / 512), KEX_DT_BFLOAT16).f == 1.0 + 4.0 / 512);
  assert_true(isnan(kex_const_truncate(kex_const_float(NAN), KEX_DT_BFLOAT16).f));
}

static void test_const_eq_and_repr(void **state) {
  (void)state;
  assert_true(kex_const_eq(kex_const_int(3), kex_const_int(3)));
  assert_false(kex_const_eq(kex_const_int(1), kex_const_float(1.0))); /* kinds differ */
  assert_true(kex_const_eq(kex_const_float(NAN), kex_const_float(NAN)));
  assert_true(kex_const_eq(kex_const_bool(false), kex_const_bool(false)));
  char buf[64];
  const struct {
    kex_const c;
    const char *repr;
  } want[] = {
      {kex_const_int(1), "1"},           {kex_const_int(-42), "-42"},        {kex_const_float(1.0), "1.0"},
      {kex_const_float(-0.5), "-0.5"},   {kex_const_float(INFINITY), "inf"}, {kex_const_float(-INFINITY), "-inf"},
      {kex_const_float(NAN), "nan"},     {kex_const_bool(true), "True"},     {kex_const_bool(false), "False"},
      {kex_const_float(0.1), "0.1"},     {kex_const_float(1.0 / 3), "0.3333333333333333"},
      {kex_const_float(1.4426950408889634), "1.4426950408889634"},
      {kex_const_float(1e16), "1e+16"},  {kex_const_float(1e-05), "1e-05"},  {kex_const_float(0.0001), "0.0001"},
      {kex_const_float(1e15), "1000000000000000.0"}, {kex_const_float(2.5e-300), "2.5e-300"},
      {kex_const_float(12345678901234568.0), "1.2345678901234568e+16"}, {kex_const_float(-1.5e300), "-1.5e+300"},
      {kex_const_float(123456.789), "123456.789"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    kex_const_repr(want[i].c, buf, sizeof buf);
    assert_string_equal(buf, want[i].repr);
  }
}

/* ---- ops ---- */

static kex_const alu2(kex_op op, kex_dtype dt, kex_const a, kex_const b) {
  kex_const s[2] = {a, b};
  return kex_exec_alu(op, dt, s, 2);
}

static kex_const alu1(kex_op op, kex_dtype dt, kex_const a) { return kex_exec_alu(op, dt, &a, 1); }

static void test_op_names(void **state) {
  (void)state;
  assert_string_equal(kex_op_name(KEX_OP_ADD), "BinaryOps.ADD");
  assert_string_equal(kex_op_name(KEX_OP_EXP2), "UnaryOps.EXP2");
  assert_string_equal(kex_op_name(KEX_OP_WHERE), "TernaryOps.WHERE");
  assert_string_equal(kex_op_name(KEX_OP_RMAX), "ReduceOps.MAX");
  assert_string_equal(kex_op_name(KEX_OP_BCONST), "BufferOps.CONST");
  assert_string_equal(kex_op_name(KEX_OP_CONST), "LoadOps.CONST");
  assert_string_equal(kex_op_name(KEX_OP_VIEW), "LoadOps.VIEW");
  assert_string_equal(kex_op_short(KEX_OP_RMAX), "MAX");
  assert_string_equal(kex_op_name(KEX_OP_COUNT), "?");
  /* family ranges partition the enum */
  for (int o = 0; o < KEX_OP_COUNT; o++) {
    int fams = KEX_OP_IS_UNARY(o) + KEX_OP_IS_BINARY(o) + KEX_OP_IS_TERNARY(o) + KEX_OP_IS_REDUCE(o) +
               KEX_OP_IS_BUFFER(o) + KEX_OP_IS_LOAD(o);
    assert_int_equal(fams, 1);
    const char *name = kex_op_name((kex_op)o);
    assert_int_equal(KEX_OP_IS_ALU(o), strncmp(name, "UnaryOps.", 9) == 0 || strncmp(name, "BinaryOps.", 10) == 0 ||
                                           strncmp(name, "TernaryOps.", 11) == 0);
  }
  assert_true(KEX_OP_IS_UNSAFE_PAD(KEX_OP_DIV) && KEX_OP_IS_UNSAFE_PAD(KEX_OP_EXP2));
  assert_false(KEX_OP_IS_UNSAFE_PAD(KEX_OP_ADD) || KEX_OP_IS_UNSAFE_PAD(KEX_OP_SQRT));
}

static void test_alu_mod_truncates(void **state) {
  (void)state;
  assert_int_equal(alu2(KEX_OP_MOD, KEX_DT_INT32, kex_const_int(-7), kex_const_int(3)).i, -1);
  assert_int_equal(alu2(KEX_OP_MOD, KEX_DT_INT32, kex_const_int(7), kex_const_int(-3)).i, 1);
  assert_int_equal(alu2(KEX_OP_MOD, KEX_DT_INT32, kex_const_int(-7), kex_const_int(-3)).i, -1);
  assert_int_equal(alu2(KEX_OP_MOD, KEX_DT_INT32, kex_const_int(7), kex_const_int(3)).i, 1);
  assert_int_equal(alu2(KEX_OP_MOD, KEX_DT_INT32, kex_const_int(6), kex_const_int(3)).i, 0);
}

static void test_alu_div(void **state) {
  (void)state;
  assert_int_equal(alu2(KEX_OP_DIV, KEX_DT_INT32, kex_const_int(7), kex_const_int(2)).i, 3);
  assert_int_equal(alu2(KEX_OP_DIV, KEX_DT_INT32, kex_const_int(-7), kex_const_int(2)).i, -3); /* not -4 */
  assert_int_equal(alu2(KEX_OP_DIV, KEX_DT_INT32, kex_const_int(7), kex_const_int(-2)).i, -3);
  kex_const q = alu2(KEX_OP_DIV, KEX_DT_FLOAT32, kex_const_float(1.0), kex_const_float(0.0));
  assert_int_equal(q.kind, KEX_CONST_FLOAT);
  assert_true(isinf(q.f) && q.f > 0);
  q = alu2(KEX_OP_DIV, KEX_DT_FLOAT32, kex_const_float(-2.0), kex_const_float(0.0));
  assert_true(isinf(q.f) && q.f < 0);
  assert_true(isnan(alu2(KEX_OP_DIV, KEX_DT_FLOAT32, kex_const_float(0.0), kex_const_float(0.0)).f));
  assert_true(alu2(KEX_OP_DIV, KEX_DT_FLOAT32, kex_const_float(1.0), kex_const_float(4.0)).f == 0.25);
}

static void test_alu_unary(void **state) {
  (void)state;
  kex_const r = alu1(KEX_OP_LOG2, KEX_DT_FLOAT32, kex_const_float(0.0));
  assert_true(isinf(r.f) && r.f < 0);
  assert_true(isnan(alu1(KEX_OP_LOG2, KEX_DT_FLOAT32, kex_const_float(-1.0)).f));
  assert_true(alu1(KEX_OP_LOG2, KEX_DT_FLOAT32, kex_const_float(8.0)).f == 3.0);
  assert_true(isnan(alu1(KEX_OP_SQRT, KEX_DT_FLOAT32, kex_const_float(-1.0)).f));
  assert_true(alu1(KEX_OP_SQRT, KEX_DT_FLOAT32, kex_const_float(9.0)).f == 3.0);
  assert_true(alu1(KEX_OP_EXP2, KEX_DT_FLOAT32, kex_const_float(3.0)).f == 8.0);
  assert_true(isinf(alu1(KEX_OP_EXP2, KEX_DT_FLOAT32, kex_const_float(200.0)).f)); /* 2^200 overflows float32 */
  assert_true(alu1(KEX_OP_SIN, KEX_DT_FLOAT32, kex_const_float(0.0)).f == 0.0);
  /* CAST truncates to the target dtype */
  assert_int_equal(alu1(KEX_OP_CAST, KEX_DT_UINT8, kex_const_int(257)).i, 1);
}

static void test_alu_neg(void **state) {
  (void)state;
  kex_const r = alu1(KEX_OP_NEG, KEX_DT_BOOL, kex_const_bool(true));
  assert_int_equal(r.kind, KEX_CONST_BOOL);
  assert_false(r.b); /* NEG of a bool is `not` */
  assert_true(alu1(KEX_OP_NEG, KEX_DT_BOOL, kex_const_bool(false)).b);
  assert_int_equal(alu1(KEX_OP_NEG, KEX_DT_INT32, kex_const_int(5)).i, -5);
  assert_int_equal(alu1(KEX_OP_NEG, KEX_DT_INT32, kex_const_int(INT32_MIN)).i, INT32_MIN); /* wraps */
  assert_true(alu1(KEX_OP_NEG, KEX_DT_FLOAT32, kex_const_float(1.5)).f == -1.5);
}

/* Client constants at int64's edges fold without undefined behaviour (the UBSan build aborts on any). */
static void test_alu_int64_edges(void **state) {
  (void)state;
  assert_true(alu1(KEX_OP_NEG, KEX_DT_INT64, kex_const_int(INT64_MIN)).i == INT64_MIN); /* wraps */
  assert_true(alu2(KEX_OP_MOD, KEX_DT_INT64, kex_const_int(INT64_MIN), kex_const_int(-1)).i == 0);
  assert_true(alu2(KEX_OP_MOD, KEX_DT_INT64, kex_const_int(INT64_MIN), kex_const_int(3)).i == -2); /* C's truncation */
  assert_true(alu2(KEX_OP_MOD, KEX_DT_INT64, kex_const_int(7), kex_const_int(INT64_MIN)).i == 7);
  assert_true(alu2(KEX_OP_DIV, KEX_DT_INT64, kex_const_int(INT64_MIN), kex_const_int(-1)).i == INT64_MIN);
  assert_true(alu2(KEX_OP_DIV, KEX_DT_INT64, kex_const_int(-7), kex_const_int(2)).i == -3);
}

static void test_alu_compare_gives_bool(void **state) {
  (void)state;
  kex_const r = alu2(KEX_OP_CMPLT, KEX_DT_BOOL, kex_const_int(1), kex_const_int(2));
  assert_int_equal(r.kind, KEX_CONST_BOOL);
  assert_true(r.b);
  assert_false(alu2(KEX_OP_CMPLT, KEX_DT_BOOL, kex_const_float(2.5), kex_const_float(2.5)).b);
  assert_true(alu2(KEX_OP_CMPLT, KEX_DT_BOOL, kex_const_float(2.4), kex_const_int(3)).b);
  r = alu2(KEX_OP_CMPEQ, KEX_DT_BOOL, kex_const_float(2.0), kex_const_int(2));
  assert_int_equal(r.kind, KEX_CONST_BOOL);
  assert_true(r.b);
  assert_false(alu2(KEX_OP_CMPEQ, KEX_DT_BOOL, kex_const_float(NAN), kex_const_float(NAN)).b);
}

static void test_alu_binary_wraps_and_max(void **state) {
  (void)state;
  assert_int_equal(alu2(KEX_OP_ADD, KEX_DT_INT32, kex_const_int(INT32_MAX), kex_const_int(1)).i, INT32_MIN);
  assert_int_equal(alu2(KEX_OP_MUL, KEX_DT_UINT8, kex_const_int(16), kex_const_int(16)).i, 0);
  assert_int_equal(alu2(KEX_OP_SUB, KEX_DT_UINT32, kex_const_int(0), kex_const_int(1)).i, 4294967295ll);
  assert_int_equal(alu2(KEX_OP_XOR, KEX_DT_INT32, kex_const_int(6), kex_const_int(3)).i, 5);
  assert_true(alu2(KEX_OP_XOR, KEX_DT_BOOL, kex_const_bool(true), kex_const_bool(true)).b == false);
  assert_int_equal(alu2(KEX_OP_MAX, KEX_DT_INT32, kex_const_int(2), kex_const_int(3)).i, 3);
  assert_int_equal(alu2(KEX_OP_MAX, KEX_DT_INT32, kex_const_int(-2), kex_const_int(-3)).i, -2);
  assert_true(alu2(KEX_OP_MAX, KEX_DT_FLOAT32, kex_const_float(-0.5), kex_const_float(0.25)).f == 0.25);
  /* Python's max(a, b) keeps a unless b > a: max(nan, 1) = nan, max(1, nan) = 1 */
  assert_true(isnan(alu2(KEX_OP_MAX, KEX_DT_FLOAT32, kex_const_float(NAN), kex_const_float(1.0)).f));
  assert_true(alu2(KEX_OP_MAX, KEX_DT_FLOAT32, kex_const_float(1.0), kex_const_float(NAN)).f == 1.0);
  assert_true(alu2(KEX_OP_ADD, KEX_DT_FLOAT32, kex_const_float(0.1), kex_const_float(0.2)).f == (double)(float)(0.1 + 0.2));
}

static void test_alu_where_mulacc(void **state) {
  (void)state;
  kex_const s[3] = {kex_const_bool(true), kex_const_float(1.5), kex_const_float(-2.0)};
  assert_true(kex_exec_alu(KEX_OP_WHERE, KEX_DT_FLOAT32, s, 3).f == 1.5);
  s[0] = kex_const_bool(false);
  assert_true(kex_exec_alu(KEX_OP_WHERE, KEX_DT_FLOAT32, s, 3).f == -2.0);
  kex_const m[3] = {kex_const_int(3), kex_const_int(4), kex_const_int(5)};
  assert_int_equal(kex_exec_alu(KEX_OP_MULACC, KEX_DT_INT32, m, 3).i, 17);
}

/* ---- logging ---- */

static void test_log_parse_level(void **state) {
  (void)state;
  assert_int_equal(kex_log_parse_level("debug"), KEX_LOG_DEBUG);
  assert_int_equal(kex_log_parse_level("info"), KEX_LOG_INFO);
  assert_int_equal(kex_log_parse_level("warn"), KEX_LOG_WARN);
  assert_int_equal(kex_log_parse_level("error"), KEX_LOG_ERROR);
  assert_int_equal(kex_log_parse_level("off"), KEX_LOG_OFF);
  assert_int_equal(kex_log_parse_level("WARN"), -1);
  assert_int_equal(kex_log_parse_level("warning"), -1);
  assert_int_equal(kex_log_parse_level(""), -1);
}

/* Everything written to f so far, NUL-terminated, in buf. */
static void read_stream(FILE *f, char *buf, size_t len) {
  fflush(f);
  rewind(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
}

static void test_log_writes_lines(void **state) {
  (void)state;
  FILE *f = tmpfile();
  assert_non_null(f);
  enum kex_log_level saved = kex_log_get_level();
  kex_log_set_stream(f);
  kex_log_set_level(KEX_LOG_WARN);
  assert_int_equal(kex_log_get_level(), KEX_LOG_WARN);
  KEX_INFO("below the threshold %d", 1);
  KEX_WARN("kernel %s took %d ms", "E_4", 42);
  kex_log(KEX_LOG_ERROR, "train", 7, "device lost");
  kex_log(KEX_LOG_OFF, NULL, 0, "never written");
  char buf[2048];
  read_stream(f, buf, sizeof buf);
  kex_log_set_stream(NULL);
  kex_log_set_level(saved);
  fclose(f);

  assert_null(strstr(buf, "below the threshold"));
  assert_null(strstr(buf, "never written"));
  char *line1 = buf, *nl = strchr(buf, '\n');
  assert_non_null(nl);
  *nl = 0;
  char *line2 = nl + 1;
  assert_non_null(strstr(line1, "warn"));
  assert_non_null(strstr(line1, "kernel E_4 took 42 ms"));
  assert_true(line1[4] == '-' && line1[10] == 'T'); /* starts with an ISO date */
  assert_non_null(strstr(line2, "error"));
  assert_non_null(strstr(line2, "job=train sub=7"));
  assert_non_null(strstr(line2, "device lost"));
  assert_int_equal(line2[strlen(line2) - 1], '\n');
}

/* ---- limits ---- */

static void test_limits_defaults(void **state) {
  (void)state;
  kex_limits l = KEX_LIMITS_DEFAULT;
  assert_int_equal(l.max_nodes, KEX_LIMIT_NODES);
  assert_int_equal(l.max_dims, KEX_LIMIT_DIMS);
  assert_true(l.max_dims <= KEX_MAX_DIMS);
  assert_true(l.max_elements == KEX_LIMIT_ELEMENTS);
  assert_true(l.max_inline_bytes == KEX_LIMIT_INLINE_BYTES);
  assert_true(l.max_buffer_bytes == KEX_LIMIT_BUFFER_BYTES);
  assert_int_equal(l.max_outputs, KEX_LIMIT_OUTPUTS);
}


/* ptrmap: pairs are distinct keys, values overwrite, growth keeps every entry, OOM leaves the map intact. */
static void test_ptrmap(void **state) {
  (void)state;
  static char objs[3000];
  kex_ptrmap m = {0};
  assert_null(kex_ptrmap_find(&m, &objs[0], NULL));
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(kex_ptrmap_put(&m, &objs[i], NULL, &objs[i + 1]), 0);
    assert_int_equal(kex_ptrmap_put(&m, &objs[i], &objs[1], &objs[i + 2]), 0);
  }
  assert_int_equal(m.len, 2000);
  for (int i = 0; i < 1000; i++) {
    void **v = kex_ptrmap_find(&m, &objs[i], NULL);
    assert_non_null(v);
    assert_ptr_equal(*v, &objs[i + 1]);
    v = kex_ptrmap_find(&m, &objs[i], &objs[1]);
    assert_non_null(v);
    assert_ptr_equal(*v, &objs[i + 2]);
  }
  assert_null(kex_ptrmap_find(&m, &objs[1500], NULL));
  assert_int_equal(kex_ptrmap_put(&m, &objs[5], NULL, &objs[2999]), 0);
  assert_int_equal(m.len, 2000);
  assert_ptr_equal(*kex_ptrmap_find(&m, &objs[5], NULL), &objs[2999]);
  /* a put that must grow fails cleanly under OOM and keeps the old contents */
  for (int k = 1000; (m.len + 1) * 10 <= m.cap * 7; k++) assert_int_equal(kex_ptrmap_put(&m, &objs[k], &objs[2], NULL), 0);
  uint32_t len = m.len;
  kex_alloc_fail_at(1, 1);
  int rc = kex_ptrmap_put(&m, &objs[2500], NULL, NULL);
  kex_alloc_fail_at(0, 0);
  assert_int_equal(rc, KEX_ENOMEM);
  assert_int_equal(m.len, len);
  assert_ptr_equal(*kex_ptrmap_find(&m, &objs[7], NULL), &objs[8]);
  kex_ptrmap_clear(&m);
  assert_int_equal(m.len, 0);
  assert_null(kex_ptrmap_find(&m, &objs[7], NULL));
  kex_ptrmap_free(&m);
}

/* dict removal: with long probe runs that wrap around the table, every entry left stays findable. */
typedef struct dict_ent {
  uint64_t key, val;
} dict_ent;
static bool dict_ent_eq(const void *e, const void *probe) { return ((const dict_ent *)e)->key == *(const uint64_t *)probe; }
static const kex_dict_type dict_ent_type = {sizeof(dict_ent), dict_ent_eq, 64};
/* few homes, some at the table's end: runs collide and wrap */
static uint64_t dict_ent_hash(uint64_t key) { return key % 3 ? 61 + key % 3 : 64 * key + 5; }

static void test_dict_remove(void **state) {
  (void)state;
  kex_dict d = kex_dict_make(&dict_ent_type);
  bool present[40] = {0}, found;
  for (uint64_t k = 0; k < 40; k++) {
    dict_ent *e = kex_dict_insert(&d, dict_ent_hash(k), &k, &found);
    assert_non_null(e);
    assert_false(found);
    *e = (dict_ent){k, 1000 + k};
    present[k] = true;
  }
  assert_int_equal(d.cap, 64); /* no growth: the runs stay long */
  for (uint64_t n = 0; n < 40; n++) {
    uint64_t k = (n * 17) % 40; /* a scattered order */
    dict_ent *e = kex_dict_find(&d, dict_ent_hash(k), &k);
    assert_non_null(e);
    kex_dict_remove(&d, e);
    present[k] = false;
    assert_int_equal(d.len, 39 - n);
    for (uint64_t j = 0; j < 40; j++) {
      dict_ent *f = kex_dict_find(&d, dict_ent_hash(j), &j);
      if (!present[j]) {
        assert_null(f);
      } else {
        assert_non_null(f);
        assert_int_equal(f->val, 1000 + j);
      }
    }
  }
  kex_dict_free(&d);
}

/* kex_dict_reserve: n entries fit without growing; a table that holds entries is left alone; OOM leaves it usable. */
static void test_dict_reserve(void **state) {
  (void)state;
  kex_dict d = kex_dict_make(&dict_ent_type);
  assert_int_equal(kex_dict_reserve(&d, 0), 0);
  assert_int_equal(d.cap, 16);
  kex_dict_free(&d);
  assert_int_equal(kex_dict_reserve(&d, 300), 0);
  uint32_t cap = d.cap;
  assert_true(cap >= 300 && (cap & (cap - 1)) == 0);
  bool found;
  for (uint64_t k = 0; k < 300; k++) {
    dict_ent *e = kex_dict_insert(&d, k * 0x9e3779b97f4a7c15ull, &k, &found);
    assert_non_null(e);
    *e = (dict_ent){k, k};
  }
  assert_int_equal(d.cap, cap); /* no growth */
  assert_int_equal(kex_dict_reserve(&d, 5000), 0);
  assert_int_equal(d.cap, cap); /* it holds entries: unchanged */
  for (uint64_t k = 0; k < 300; k++) assert_non_null(kex_dict_find(&d, k * 0x9e3779b97f4a7c15ull, &k));
  kex_dict_free(&d);
  kex_alloc_fail_at(1, 1);
  int rc = kex_dict_reserve(&d, 100);
  kex_alloc_fail_at(0, 0);
  assert_int_equal(rc, KEX_ENOMEM);
  assert_int_equal(d.cap, 0);
  uint64_t k = 7;
  assert_non_null(kex_dict_insert(&d, 7, &k, &found)); /* still usable */
  kex_dict_free(&d);
}

/* base64: round trips of every length around a chunk edge; strict decoding refuses at the first wrong character. */
static void test_base64(void **state) {
  (void)state;
  static uint8_t raw[2400], back[2400];
  for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)(i * 131 + 7);
  for (size_t n = 0; n < sizeof raw; n += n < 16 ? 1 : 97) {
    char *t = kex_base64_encode(raw, n);
    assert_non_null(t);
    assert_int_equal(strlen(t), 4 * ((n + 2) / 3));
    assert_int_equal(kex_base64_decoded_len(t, strlen(t)), n);
    assert_int_equal(kex_base64_decode(t, strlen(t), back, NULL), 0);
    assert_memory_equal(back, raw, n);
    kex_free(t);
  }
  char *t = kex_base64_encode("\xc9\x19\x62\x3d", 4);
  assert_string_equal(t, "yRliPQ==");
  kex_free(t);
  static const struct {
    const char *text;
    size_t bad;
  } refused[] = {{"AA-A", 2}, {"AA=AAAAA", 2}, {"AAB=", 2}, {"AB==", 1}, {" AAA", 0}, {"AAAA AA=", 4}, {"AAAAAA=A", 6}};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    size_t bad = 99;
    assert_int_equal(kex_base64_decode(refused[i].text, strlen(refused[i].text), back, &bad), KEX_EPARSE);
    assert_int_equal(bad, refused[i].bad);
  }
  assert_int_equal(kex_base64_decoded_len("AAAAA", 5), -1);
  assert_int_equal(kex_base64_decode("AAA=", 4, back, NULL), 0);
}

/* SHA-256 of "abc" (FIPS 180-4's first vector), and hex both ways. */
static void test_sha256_hex(void **state) {
  (void)state;
  uint8_t d[32], back[32];
  char hex[65];
  assert_int_equal(kex_sha256_bytes("abc", 3, d), 0);
  kex_hex(d, 32, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert_int_equal(kex_unhex(hex, back, 32), 0);
  assert_memory_equal(back, d, 32);
  assert_int_equal(kex_unhex("0g", back, 1), KEX_EPARSE);
}

/* .npy: what the writer writes the reader reads back (dtype, shape, data at a 64-byte boundary); bad headers refused. */
static void test_npy_round_trip(void **state) {
  (void)state;
  char path[] = "/tmp/kex_test_npy_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  const int32_t data[6] = {1, -2, 3, -4, 5, -6};
  const int64_t shape[2] = {2, 3};
  kex_error err;
  assert_int_equal(kex_npy_write(path, KEX_DT_INT32, 2, shape, data, &err), 0);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  kex_dtype dt;
  int ndim;
  int64_t got[4];
  assert_int_equal(kex_npy_read_header(f, path, 4, &dt, &ndim, got, &err), 0);
  assert_int_equal(dt, KEX_DT_INT32);
  assert_int_equal(ndim, 2);
  assert_int_equal(got[0], 2);
  assert_int_equal(got[1], 3);
  assert_int_equal(ftell(f) % 64, 0);
  int32_t back[6];
  assert_int_equal(fread(back, 4, 6, f), 6);
  assert_memory_equal(back, data, sizeof data);
  rewind(f);
  assert_int_equal(kex_npy_read_header(f, path, 1, &dt, &ndim, got, &err), KEX_EPARSE);
  assert_non_null(strstr(err.msg, "more than 1 dims"));
  fclose(f);
  f = fopen(path, "wb");
  fputs("not numpy at all", f);
  fclose(f);
  f = fopen(path, "rb");
  assert_int_equal(kex_npy_read_header(f, path, 4, &dt, &ndim, got, &err), KEX_EPARSE);
  assert_non_null(strstr(err.msg, "not a .npy file"));
  fclose(f);
  assert_string_equal(kex_npy_descr(KEX_DT_BOOL), "|b1");
  assert_string_equal(kex_npy_descr(KEX_DT_FLOAT16), "<f2");
  unlink(path);
}

/* kex_i64_text writes what "%lld" does, the extremes too; the strbuf appends add exactly their bytes. */
static void test_strbuf_appends(void **state) {
  (void)state;
  const long long vals[] = {0, 1, -1, 9, 10, -10, 123456789, -987654321, 9223372036854775807LL, -9223372036854775807LL - 1};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
    char a[KEX_I64_TEXT_MAX], b[32];
    int n = kex_i64_text(vals[i], a);
    snprintf(b, sizeof b, "%lld", vals[i]);
    assert_string_equal(a, b);
    assert_int_equal(n, (int)strlen(b));
  }
  kex_strbuf sb = {0};
  kex_strbuf_puts(&sb, "%");
  kex_strbuf_i64(&sb, -42);
  kex_strbuf_put(&sb, " = xyz", 4);
  kex_strbuf_printf(&sb, "|%d", 7);
  assert_false(sb.oom);
  assert_string_equal(sb.p, "%-42 = x|7");
  assert_int_equal(sb.len, strlen(sb.p));
  kex_free(sb.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_err_table_complete),
      cmocka_unit_test(test_err_success_and_unknown),
      cmocka_unit_test(test_err_grpc_mapping),
      cmocka_unit_test(test_err_set_formats),
      cmocka_unit_test(test_err_set_truncates),
      cmocka_unit_test_teardown(test_alloc_fail_nth, disarm_alloc_hook),
      cmocka_unit_test_teardown(test_alloc_fail_sticky, disarm_alloc_hook),
      cmocka_unit_test_teardown(test_alloc_fail_every_kind, disarm_alloc_hook),
      cmocka_unit_test(test_arena_alignment),
      cmocka_unit_test(test_arena_big_allocations),
      cmocka_unit_test(test_arena_grow),
      cmocka_unit_test(test_arena_many_small),
      cmocka_unit_test(test_arena_calloc_zeroes),
      cmocka_unit_test(test_arena_huge_request_fails),
      cmocka_unit_test(test_arena_destroy_and_reuse),
      cmocka_unit_test_teardown(test_arena_alloc_hook, disarm_alloc_hook),
      cmocka_unit_test(test_hash_deterministic_and_distinct),
      cmocka_unit_test(test_hash_seed_and_mix),
      cmocka_unit_test(test_dtype_table),
      cmocka_unit_test(test_dtype_from_name),
      cmocka_unit_test(test_dtype_lub),
      cmocka_unit_test(test_dtype_sum_acc_and_upper_float),
      cmocka_unit_test(test_const_as),
      cmocka_unit_test(test_const_truncate),
      cmocka_unit_test(test_const_eq_and_repr),
      cmocka_unit_test(test_op_names),
      cmocka_unit_test(test_alu_mod_truncates),
      cmocka_unit_test(test_alu_div),
      cmocka_unit_test(test_alu_unary),
      cmocka_unit_test(test_alu_neg),
      cmocka_unit_test(test_alu_int64_edges),
      cmocka_unit_test(test_alu_compare_gives_bool),
      cmocka_unit_test(test_alu_binary_wraps_and_max),
      cmocka_unit_test(test_alu_where_mulacc),
      cmocka_unit_test(test_log_parse_level),
      cmocka_unit_test(test_log_writes_lines),
      cmocka_unit_test(test_limits_defaults),
      cmocka_unit_test(test_ptrmap),
      cmocka_unit_test(test_dict_remove),
      cmocka_unit_test(test_dict_reserve),
      cmocka_unit_test(test_base64),        cmocka_unit_test(test_strbuf_appends),
      cmocka_unit_test(test_sha256_hex),
      cmocka_unit_test(test_npy_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

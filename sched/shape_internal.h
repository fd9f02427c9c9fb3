/*
 * shape_internal.h - what view.c and shapetracker.c share and nobody else
 * calls: the context layout, the intern tables and the memo table.
 *
 * Intern tables (kex__ptab) hold pointers to objects whose first field is
 * their 64-bit hash (kex_view, kex_st), open addressing with linear probing,
 * power-of-two capacity, grown at 70% load.  The memo table maps
 * (op, a, b) pointer triples to a result pointer (KEX__MEMO_NONE for
 * tinygrad's None).  All table memory comes from kex_malloc.
 */
#ifndef KEX_SCHED_SHAPE_INTERNAL_H
#define KEX_SCHED_SHAPE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "sched/shapetracker.h"

typedef struct kex__ptab {
  const void **slots;
  size_t cap, count;
} kex__ptab;

enum kex__memo_op {
  KEX__MEMO_VIEW_ADD = 1,
  KEX__MEMO_VIEW_RESHAPE,
  KEX__MEMO_ST_ADD,
  KEX__MEMO_ST_SIMPLIFY,
  KEX__MEMO_ST_EXPR,
  KEX__MEMO_ST_STRIDES,
};

typedef struct kex__memo_ent {
  const void *a, *b;
  uint32_t op; /* 0 = empty slot */
  const void *val;
} kex__memo_ent;

typedef struct kex__memo {
  kex__memo_ent *slots;
  size_t cap, count;
} kex__memo;

struct kex_shape_ctx {
  kex_arena *arena;
  kex_sym_ctx sym;
  kex__ptab views, sts;
  kex__memo memo;
  int rc;        /* why the last failed call failed when not OOM (kex_shape_error), else 0 */
  char msg[256]; /* its message */
};

/* The result marker for a memoised None. */
extern const char kex__memo_none;
#define KEX__MEMO_NONE ((const void *)&kex__memo_none)

/* Make room for one more entry (grows and rehashes).  0 or KEX_ENOMEM. */
int kex__ptab_reserve(kex__ptab *t);
/* Memo lookup: true and *val when present. */
bool kex__memo_get(const kex__memo *m, uint32_t op, const void *a, const void *b, const void **val);
/* Memo insert (overwrites).  0 or KEX_ENOMEM (the memo is only a cache, callers may ignore it). */
int kex__memo_put(kex__memo *m, uint32_t op, const void *a, const void *b, const void *val);

/*
 * Record why a call on ctx fails (the first reason since the last
 * kex_shape_error) and return code, so callers can `return kex__shape_fail(...)`.
 */
int kex__shape_fail(kex_shape_ctx *ctx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The code of a failure just seen: the recorded one, else KEX_ENOMEM. */
static inline int kex__shape_fail_code(const kex_shape_ctx *ctx) { return ctx->rc ? ctx->rc : KEX_ENOMEM; }

/* strides_for_shape (canonicalized row-major strides).  false when a stride overflows int64. */
bool kex__strides_for_shape(int ndim, const int64_t *shape, int64_t *out);

#endif

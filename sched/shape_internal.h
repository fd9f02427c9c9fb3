/*
 * shape_internal.h - what view.c and shapetracker.c share and nobody else
 * calls: the context layout, the intern tables and the memo table.
 *
 * The intern tables are core/dict.h tables of pointers to the interned
 * objects (kex_view, kex_st, each carrying its 64-bit hash).  The memo
 * table, a dict too, maps (op, a, b) pointer triples to a result pointer
 * (KEX__MEMO_NONE for tinygrad's None).
 */
#ifndef KEX_SCHED_SHAPE_INTERNAL_H
#define KEX_SCHED_SHAPE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dict.h"
#include "core/errors.h"
#include "sched/shapetracker.h"

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
  uint32_t op;
  const void *val;
} kex__memo_ent;

struct kex_shape_ctx {
  kex_arena *arena;
  kex_sym_ctx sym;
  kex_dict views; /* of const kex_view * */
  kex_dict sts;   /* of const kex_st * */
  kex_dict memo;  /* of kex__memo_ent */
  kex_dict moves; /* of movement-op results (shapetracker.c) */
  int rc;        /* why the last failed call failed when not OOM (kex_shape_error), else 0 */
  char msg[256]; /* its message */
};

/* The sts and moves tables' types (shapetracker.c). */
extern const kex_dict_type kex__st_type;
extern const kex_dict_type kex__move_type;

/* The result marker for a memoised None. */
extern const char kex__memo_none;
#define KEX__MEMO_NONE ((const void *)&kex__memo_none)

/* Memo lookup: true and *val when present. */
bool kex__memo_get(const kex_dict *m, uint32_t op, const void *a, const void *b, const void **val);
/* Memo insert (overwrites).  0 or KEX_ENOMEM (the memo is only a cache, callers may ignore it). */
int kex__memo_put(kex_dict *m, uint32_t op, const void *a, const void *b, const void *val);

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

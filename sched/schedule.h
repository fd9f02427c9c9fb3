/*
 * schedule.h - tinygrad 0.9.0's scheduler (spec section 6): which kernels
 * run, in what order, with which ASTs and buffers, plus the memory planner.
 *
 * An AST is a DAG of kex_lop nodes (tinygrad's LazyOp): each kernel item has
 * one STORE per output; LOAD/CONST leaves carry MemBuffer/ConstBuffer args
 * with simplified ShapeTrackers.  Nodes are hash-consed per schedule, so
 * equal sub-ASTs are the same pointer.
 *
 * Ownership: the schedule and everything it points to live in the replay's
 * arena; kex_schedule_free releases the few heap tables it owns.
 */
#ifndef KEX_SCHED_SCHEDULE_H
#define KEX_SCHED_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/errors.h"
#include "sched/lazy.h"

typedef struct kex_lop kex_lop;
struct kex_lop {
  kex_op op;
  uint8_t nsrc;
  kex_dtype dtype;           /* LazyOp.dtype */
  const kex_lop *src[3];
  /* args */
  int32_t idx;               /* LOAD/STORE: MemBuffer.idx */
  const kex_st *st;          /* LOAD/STORE/CONST */
  kex_const val;             /* CONST */
  kex_dtype cast_to;         /* CAST/BITCAST */
  uint32_t axis_mask;        /* SUM/MAX */
  uint32_t depth;            /* 1 for a leaf, else 1 + the deepest src (not part of equality) */
  uint64_t hash;             /* leaves (LOAD/CONST, interned): the LazyOp table's hash; inner nodes: 0 */
};

typedef enum kex_item_kind {
  KEX_ITEM_KERNEL,
  KEX_ITEM_EMPTY,
  KEX_ITEM_COPY,
  KEX_ITEM_CUSTOM,
  KEX_ITEM_VIEW,
} kex_item_kind;

typedef struct kex_sched_item {
  kex_item_kind kind;
  uint32_t nout, nin;
  kex_lb **outs;            /* output LazyBuffers (bases), group order */
  kex_lb **ins;             /* input bases, first-visit order */
  const kex_lop **ast;      /* KERNEL: nout STOREs */
  uint32_t nbufs;           /* bufs: outputs then inputs, size-0 buffers dropped */
  uint32_t *bufs;           /* buffer ids (kex_replay.buffers) before planning */
  uint32_t *planned;        /* the same after the memory planner */
} kex_sched_item;

typedef struct kex_schedule {
  kex_replay *replay;
  uint32_t nitems;
  kex_sched_item *items;
  uint32_t nkernels;
  /* memory planner result */
  uint32_t nplanned_buffers;   /* distinct intermediate buffers before planning */
  uint32_t nplanned_after;     /* distinct buffers they map to after planning */
  int64_t planned_bytes_before, planned_bytes_after;
  struct kex_sched_tables *tables;
} kex_schedule;

/*
 * Schedule the replay's graph outputs (create_schedule_with_vars with an empty
 * `seen`, then memory_planner).  On success *out is a new schedule.  Errors:
 * KEX_ENOMEM; KEX_EASSIGN ("must be contiguous for assign", naming the node);
 * KEX_ECYCLE; KEX_ELIMIT when a kernel's AST is deeper than the graph's
 * limits.max_kernel_depth or has more than limits.max_kernel_ops operations
 * (naming the node the kernel stores, the value and the limit), or when view
 * arithmetic would overflow int64.  The replay's LazyBuffers are marked
 * realized as tinygrad does.
 */
int kex_schedule_create(kex_replay *r, kex_schedule **out, kex_error *err);
void kex_schedule_free(kex_schedule *s);

/* "kernel:3out", "LoadOps.EMPTY" ... (the cases' `items` form). */
int kex_item_label(const kex_sched_item *it, char *buf, size_t len);

/*
 * Stable text form: a header line per item, then one line per AST node
 * (postorder, shared nodes printed once, referenced as %N) with its
 * ShapeTracker views.  Ends with "kernels: N".
 */
int kex_schedule_print(const kex_schedule *s, FILE *f);
/* The same with notes[i] (text ending in a newline, or NULL) printed under item i's header line. */
int kex_schedule_print_annotated(const kex_schedule *s, FILE *f, const char *const *notes);
/* The same as a JSON array of items (jansson json_t*, cast to void* to keep jansson out of the header). */
void *kex_schedule_to_json(const kex_schedule *s);

/*
 * Item i of s in that JSON's terms, without JSON (kexd's Plan reply): a
 * kernel or not, its label, and its output / input / planned buffer ids
 * (pointers into s, valid while it lives).
 */
typedef struct kex_item_view {
  bool kernel;
  char label[64];
  const uint32_t *outputs, *inputs, *planned;
  uint32_t noutputs, ninputs, nplanned;
} kex_item_view;
void kex_schedule_item_view(const kex_schedule *s, uint32_t i, kex_item_view *v);
struct kex_strbuf;
/* Item i's AST lines (the JSON's "ast"; none for a load op) appended to b, each ended by '\n'.  0 or KEX_ENOMEM. */
int kex_schedule_item_ast(const kex_schedule *s, uint32_t i, struct kex_strbuf *b);

#endif

/*
 * lazy.h - LazyBuffers: the replay of a client graph with tinygrad 0.9.0's
 * folding, lazycache and view rules (spec section 5), and the scheduler's
 * view of them.
 *
 * A kex_lb is either a base (owns op, arg, srcs and a buffer) or a view
 * (base != self, st maps onto the base's shape).  kex_replay walks a validated
 * kex_graph in order and calls the LazyBuffer method each node names; the
 * result maps every graph node to its LazyBuffer.  Everything lives in the
 * caller's arena, the replay itself included; the replay owns only its hash
 * tables (kex_replay_free, before the arena is reset or destroyed).
 */
#ifndef KEX_SCHED_LAZY_H
#define KEX_SCHED_LAZY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/dict.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/ops.h"
#include "sched/graph.h"
#include "sched/shapetracker.h"

typedef struct kex_lb kex_lb;

struct kex_lb {
  /* fields ordered so that none pads (192 bytes on LP64); lb_alloc and lb_set_base (lazy.c) set each field above
     `flags` one by one and clear from `flags` to the end as one stretch: a new field needs its line there */
  uint32_t id;          /* creation order */
  kex_dtype dtype;
  kex_lb *base;         /* == self for a base */
  const kex_st *st;
  const char *device;   /* interned: compare by pointer */
  /* ---- base only ---- */
  kex_op op;
  uint32_t axis_mask;         /* SUM/RMAX: reduced axes */
  uint8_t nsrc;
  bool realized;              /* holds data (BUFFER input, or scheduled) */
  bool forced_realize;
  uint32_t buffer;            /* buffer id (ASSIGN shares its target's, VIEW is a sub-buffer) */
  int32_t graph_node;         /* graph node that created it, -1 for internal nodes */
  kex_lb *srcs[3];
  kex_const arg;              /* CONST value */
  const kex_st *assign_st;    /* ASSIGN: target view when not contiguous (arg=(st,)), else NULL */
  kex_lb *contiguous_child;   /* contiguous copy made by contiguous() ... */
  const kex_st *contiguous_child_st; /* ... and the view that reads this base through it */
  /* ---- scheduler scratch (sched/schedule.c) ---- */
  uint32_t flags;
  uint32_t nchildren, capchildren;
  uint32_t mark, mark2;       /* visit epochs */
  int32_t group_slot;         /* output group / schedule target index, -1 when none */
  int32_t input_slot;         /* index among the current kernel's inputs */
  uint32_t memo_epoch;        /* one-entry memo of _recursive_lazyop: (this, memo_st) -> memo_lop; before it,
                                 _recursive_group's first visit of this (memo_st) */
  kex_lb **children;
  kex_lb *reduce_for_op;
  kex_lb *assign_of;          /* for an assign target: the ASSIGN in this schedule */
  const void *memo_st, *memo_lop;
};

static inline bool kex_lb_is_base(const kex_lb *lb) { return lb->base == lb; }
static inline int kex_lb_ndim(const kex_lb *lb) { return kex_st_ndim(lb->st); }
static inline const int64_t *kex_lb_shape(const kex_lb *lb) { return kex_st_shape(lb->st); }
static inline int64_t kex_lb_size(const kex_lb *lb) { return kex_st_size(lb->st); }

/* Buffers the replay created: id -> (device, size, dtype), plus sub-buffer views. */
typedef struct kex_buffer_info {
  const char *device;
  int64_t size;        /* elements */
  kex_dtype dtype;
  int32_t view_of;     /* -1, or the buffer this is a sub-buffer of */
  int64_t offset;      /* bytes into view_of */
  int32_t graph_node;  /* the graph node whose base owns it (-1 internal) */
  bool held;           /* input, output or assign target: the memory planner leaves it alone */
} kex_buffer_info;

/*
 * Hash tables a replay and its schedule take instead of making their own,
 * and give back emptied (their memory kept) when they are freed, and an
 * arena for the schedule's temporaries: how a long-lived caller
 * (sched/warm.c) stops allocating them for every graph.
 * A zeroed one holds none yet.  One replay (and its schedule) at a time.
 */
typedef struct kex_replay_tables {
  kex_dict lbs, consts; /* the lazycache and the const memo (lazy.c) */
  kex_dict lops, visit; /* the LazyOp table and the visited set (schedule.c) */
  kex_arena scratch;    /* the schedule's temporaries, reset when it is made (zeroed: set up on first use) */
  /* the replay's buffer table (kex_replay.buffers), kept with its capacity: growing it from malloc inside a
     warm Plan cost kexd 30-50 us of malloc_consolidate, after the request's decode had freed thousands of
     small chunks */
  kex_buffer_info *buffers;
  uint32_t capbuffers;
} kex_replay_tables;

/* Take the table kept in *slot (an empty one of type when it holds none), leaving *slot empty. */
static inline kex_dict kex_replay_tables_take(kex_dict *slot, const kex_dict_type *type) {
  kex_dict d = slot->type ? *slot : kex_dict_make(type);
  *slot = (kex_dict){0};
  return d;
}
/* Give d back to *slot, emptied; *d is empty afterwards. */
static inline void kex_replay_tables_give(kex_dict *slot, kex_dict *d) {
  kex_dict_clear(d);
  *slot = *d;
  *d = (kex_dict){0};
}

typedef struct kex_replay_opts {
  /* tinygrad's view_supported_devices rule (CLANG/LLVM/CUDA/DISK): CONTIGUOUS of a
     consecutive view and BITCAST become LoadOps.VIEW without a kernel. */
  bool buffer_view;
  const char *device_name; /* what "default" means: "opencl" or "cpu" */
  /* Optional long-lived ShapeTracker context (views are immutable values, so one
     context can serve many replays, as tinygrad's process-wide View caches do).
     NULL: the replay makes its own in its arena.  Not thread-safe: one per thread. */
  kex_shape_ctx *shape;
  /* Optional tables to reuse (see kex_replay_tables); NULL: the replay and its schedule allocate their own. */
  kex_replay_tables *tables;
} kex_replay_opts;

/* The replay rules of a device: tinygrad's CLANG rules (buffer views, "cpu") or its GPU rules ("opencl"). */
kex_replay_opts kex_replay_opts_for(bool clang_rules);

typedef struct kex_replay {
  kex_arena *arena;
  kex_shape_ctx *shape;
  bool own_shape;      /* shape was made for this replay */
  const kex_graph *graph;
  kex_replay_opts opts;
  kex_lb **node_lb;    /* per graph node */
  uint32_t nlbs;
  uint32_t nbuffers, capbuffers;
  kex_buffer_info *buffers;
  struct kex_lazycache *cache;
  const char *default_device;
} kex_replay;

/*
 * Replay every node of g (already validated).  On success *out is a new
 * replay whose objects live in `arena`; free the replay's tables with
 * kex_replay_free (the arena keeps the objects).  Errors: KEX_ENOMEM,
 * KEX_EINVAL (a rule tinygrad asserts on, message names the node).
 */
int kex_replay_graph(const kex_graph *g, const kex_replay_opts *opts, kex_arena *arena, kex_replay **out,
                     kex_error *err);
void kex_replay_free(kex_replay *r);

#endif

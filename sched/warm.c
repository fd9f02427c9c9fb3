/*
 * warm.c - one thread's warm replay state (see warm.h): a long-lived
 * ShapeTracker context in an arena of its own, a replay arena reset after
 * each graph, and the replay's and schedule's hash tables handed from one
 * graph to the next (kex_replay_tables); all dropped together when they
 * pass the caller's limit.
 */
#include "sched/warm.h"

#include "core/alloc.h"

/* The replay arena's block size: big enough that a large graph's arrays (buffers, stacks) fit in reused blocks
   instead of blocks of their own, which a reset frees. */
#define KEX_SCHED_WARM_BLOCK (256u << 10)

struct kex_sched_warm {
  kex_arena shape_arena; /* the interned views and ShapeTrackers (and their memo's results) */
  kex_shape_ctx *shape;  /* NULL until the first begin after a reset */
  kex_arena arena;       /* one replay's objects: reset at each end */
  kex_replay_tables tables; /* the replay's and its schedule's hash tables, between graphs */
  bool busy;             /* between a begin and its end */
  uint64_t replays, resets;
};

kex_sched_warm *kex_sched_warm_new(void) {
  kex_sched_warm *w = kex_calloc(1, sizeof *w);
  if (!w) return NULL;
  kex_arena_init(&w->shape_arena, 0);
  kex_arena_init(&w->arena, KEX_SCHED_WARM_BLOCK);
  kex_arena_init(&w->tables.scratch, KEX_SCHED_WARM_BLOCK);
  return w;
}

/* Drop everything the state holds: the next begin starts from nothing. */
static void warm_empty(kex_sched_warm *w) {
  kex_shape_ctx_free(w->shape);
  w->shape = NULL;
  kex_arena_destroy(&w->shape_arena);
  kex_arena_destroy(&w->arena);
  kex_dict_free(&w->tables.lbs);
  kex_dict_free(&w->tables.consts);
  kex_dict_free(&w->tables.lops);
  kex_dict_free(&w->tables.visit);
  kex_arena_destroy(&w->tables.scratch);
  kex_free(w->tables.buffers);
  w->tables.buffers = NULL;
  w->tables.capbuffers = 0;
}

void kex_sched_warm_free(kex_sched_warm *w) {
  if (!w) return;
  warm_empty(w);
  kex_free(w);
}

kex_arena *kex_sched_warm_begin(kex_sched_warm *w, uint32_t nnodes, kex_replay_opts *opts) {
  if (w->busy) return NULL;
  if (!w->shape && !(w->shape = kex_shape_ctx_new(&w->shape_arena))) return NULL;
  kex_shape_ctx_reserve(w->shape, nnodes); /* sizes the tables once: a no-op while they hold entries */
  w->busy = true;
  w->replays++;
  opts->shape = w->shape;
  opts->tables = &w->tables;
  return &w->arena;
}

bool kex_sched_warm_end(kex_sched_warm *w, size_t limit) {
  w->busy = false;
  kex_arena_reset(&w->arena);
  if (kex_sched_warm_bytes(w) <= limit) return false;
  warm_empty(w);
  w->resets++;
  return true;
}

size_t kex_sched_warm_bytes(const kex_sched_warm *w) {
  const kex_replay_tables *t = &w->tables;
  return kex_arena_held(&w->shape_arena) + kex_arena_held(&w->arena) + (w->shape ? kex_shape_ctx_bytes(w->shape) : 0) +
         kex_dict_bytes(&t->lbs) + kex_dict_bytes(&t->consts) + kex_dict_bytes(&t->lops) + kex_dict_bytes(&t->visit) +
         kex_arena_held(&t->scratch) + (size_t)t->capbuffers * sizeof *t->buffers;
}

uint64_t kex_sched_warm_replays(const kex_sched_warm *w) { return w->replays; }
uint64_t kex_sched_warm_resets(const kex_sched_warm *w) { return w->resets; }

/*
 * warm.h - one thread's warm state for repeated replays and schedules: what
 * a long-lived process (kexd's Plan) keeps between graphs instead of making
 * it afresh for each.
 *
 * It holds a ShapeTracker context (sched/shapetracker.h) whose interned
 * views and ShapeTrackers outlive one replay, as tinygrad's process-wide
 * View caches do: they are immutable values keyed by their content, so a
 * replay that meets a view an earlier graph made gets the same object and
 * the same results (the memo table maps interned objects to interned
 * results, nothing else).  It holds the arena one replay and its schedule
 * allocate from (every per-graph temporary included), reset (not freed)
 * after each, and their hash tables (kex_replay_tables: the lazycache, the
 * const memo, the LazyOp table, the visited set), emptied (not freed), so
 * the next graph reuses the same memory while it is still in cache.
 *
 * Bounded: kex_sched_warm_end drops everything (a fresh, empty state) when
 * the state holds more than the caller's limit in bytes, so it never keeps
 * more than the limit between graphs, however many distinct shapes clients
 * send.  Within one graph it grows as a cold replay would (the graph limits
 * bound that).
 *
 * Threads: a state belongs to one thread at a time (kexd keeps one per
 * thread); nothing in it is locked.
 */
#ifndef KEX_SCHED_WARM_H
#define KEX_SCHED_WARM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "sched/lazy.h"

typedef struct kex_sched_warm kex_sched_warm;

/* An empty state (no memory beyond itself until the first begin).  NULL on OOM. */
kex_sched_warm *kex_sched_warm_new(void);
/* Free the state and everything it holds.  NULL is a no-op.  Not while a replay from it is alive. */
void kex_sched_warm_free(kex_sched_warm *w);
/*
 * Begin one replay of a graph of nnodes nodes: sets opts->shape to the
 * state's ShapeTracker context and returns the arena the replay (and its
 * schedule) allocate from.  NULL when the state is already in use (a
 * begin without its end) or out of memory: the caller replays cold then.
 * Until kex_sched_warm_end, the replay's objects live in the state.
 */
kex_arena *kex_sched_warm_begin(kex_sched_warm *w, uint32_t nnodes, kex_replay_opts *opts);
/*
 * End the replay begun last: its replay and schedule must be freed first,
 * and nothing from its arena or its shape context may be used afterwards.
 * The arena is reset for the next begin; when the state then holds more
 * than limit bytes, it is emptied (a reset).  Returns true on a reset.
 */
bool kex_sched_warm_end(kex_sched_warm *w, size_t limit);
/* Bytes the state holds now (arena blocks, spare blocks kept for reuse, the shape context's tables). */
size_t kex_sched_warm_bytes(const kex_sched_warm *w);
/* Replays begun since the state was made, and how many resets kex_sched_warm_end made. */
uint64_t kex_sched_warm_replays(const kex_sched_warm *w);
uint64_t kex_sched_warm_resets(const kex_sched_warm *w);

#endif

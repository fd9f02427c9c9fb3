/*
 * memplan.c - tinygrad's _internal_memory_planner (spec section 6.5).
 *
 * Walk the schedule in order; every intermediate buffer (not held by the
 * client: inputs, outputs and assign targets are held, as their LazyBuffers
 * are alive) takes, at its first appearance, a free buffer with the same
 * (device, size, dtype) from a pool, else keeps its own; at its last
 * appearance the buffer it was given returns to the pool.  Sub-buffer views
 * follow their base.  Kernel count and kernels are unchanged; the result is
 * item->planned and the before/after totals on the schedule.
 */
#include <string.h>

#include "core/alloc.h"
#include "sched/schedule.h"

/* Plan sc's buffers; its temporaries in scratch.  0 or KEX_ENOMEM with *err. */
int kex_memplan(kex_schedule *sc, kex_arena *scratch, kex_error *err);

typedef struct pool {
  const char *device;
  int64_t size;
  kex_dtype dtype;
  uint32_t len, cap;
  uint32_t *free_ids;
} pool;

static pool *find_pool(kex_arena *a, pool **pools, uint32_t *npools, uint32_t *cap, const kex_buffer_info *b) {
  for (uint32_t i = 0; i < *npools; i++) {
    pool *p = &(*pools)[i];
    if (p->device == b->device && p->size == b->size && p->dtype == b->dtype) return p;
  }
  if (kex_arena_grow(a, pools, *npools, cap, sizeof **pools, 16)) return NULL;
  pool *p = &(*pools)[(*npools)++];
  *p = (pool){b->device, b->size, b->dtype, 0, 0, NULL};
  return p;
}

static int pool_push(kex_arena *a, pool *p, uint32_t id) {
  for (uint32_t i = 0; i < p->len; i++)
    if (p->free_ids[i] == id) return 0;
  if (kex_arena_grow(a, &p->free_ids, p->len, &p->cap, sizeof *p->free_ids, 8)) return KEX_ENOMEM;
  p->free_ids[p->len++] = id;
  return 0;
}

int kex_memplan(kex_schedule *sc, kex_arena *scratch, kex_error *err) {
  kex_replay *r = sc->replay;
  int rc = 0;
  uint32_t nb = r->nbuffers;
  int32_t *last = kex_arena_alloc(scratch, sizeof *last * (nb ? nb : 1));
  int64_t *assigned = kex_arena_alloc(scratch, sizeof *assigned * (nb ? nb : 1));
  pool *pools = NULL;
  uint32_t npools = 0, cap = 0;
  if (!last || !assigned) goto nomem;
  for (uint32_t i = 0; i < nb; i++) {
    last[i] = -1;
    assigned[i] = -1;
  }
  for (uint32_t i = 0; i < sc->nitems; i++)
    for (uint32_t j = 0; j < sc->items[i].nbufs; j++) last[sc->items[i].bufs[j]] = (int32_t)i;

  int64_t before = 0, after = 0;
  uint32_t nbefore = 0, nafter = 0;
  for (uint32_t i = 0; i < sc->nitems; i++) {
    kex_sched_item *it = &sc->items[i];
    it->planned = kex_arena_alloc(r->arena, sizeof(uint32_t) * (it->nbufs + 1));
    if (!it->planned) goto nomem;
    for (uint32_t j = 0; j < it->nbufs; j++) {
      uint32_t b = it->bufs[j];
      const kex_buffer_info *bi = &r->buffers[b];
      if (bi->held) {
        it->planned[j] = b;
        continue;
      }
      if (bi->view_of >= 0) { /* a sub-buffer: rebuilt on its (possibly reassigned) base */
        it->planned[j] = b;
        continue;
      }
      pool *p = find_pool(scratch, &pools, &npools, &cap, bi);
      if (!p) goto nomem;
      if (assigned[b] < 0) {
        nbefore++;
        before += bi->size * kex_dtype_size(bi->dtype);
        if (p->len) {
          assigned[b] = p->free_ids[--p->len];
        } else {
          assigned[b] = b;
          nafter++;
          after += bi->size * kex_dtype_size(bi->dtype);
        }
      }
      it->planned[j] = (uint32_t)assigned[b];
      if ((int32_t)i == last[b] && pool_push(scratch, p, (uint32_t)assigned[b])) goto nomem;
    }
  }
  sc->nplanned_buffers = nbefore;
  sc->nplanned_after = nafter;
  sc->planned_bytes_before = before;
  sc->planned_bytes_after = after;
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory in the memory planner");
out:
  return rc;
}

/*
 * planned.h - a graph replayed and scheduled, for the unit tests that start
 * from one (test_schedule, test_kernel, test_astkey, test_codegen): plan a
 * graph or its JSON text under tinygrad's cpu or GPU (opencl) device rules,
 * find its n-th kernel, free it; and the macros that write small graphs as
 * JSON text.
 */
#ifndef KEX_TESTS_PLANNED_H
#define KEX_TESTS_PLANNED_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

typedef struct planned {
  kex_arena arena;
  kex_graph *g;
  kex_replay *r;
  kex_schedule *s;
  kex_error err;
  int rc;
} planned;

/*
 * Replay g (p owns it from now on) under the cpu or opencl device rules and
 * schedule it.  Returns p->rc: 0, or the code with p->err.  Free p with
 * planned_free either way.
 */
static inline int plan_graph(planned *p, kex_graph *g, bool cpu) {
  kex_replay_opts ro = {cpu, cpu ? "cpu" : "opencl", NULL};
  kex_arena_init(&p->arena, 0);
  p->g = g;
  p->r = NULL;
  p->s = NULL;
  memset(&p->err, 0, sizeof p->err);
  p->rc = kex_replay_graph(g, &ro, &p->arena, &p->r, &p->err);
  if (!p->rc) p->rc = kex_schedule_create(p->r, &p->s, &p->err);
  return p->rc;
}

/* plan_graph of the graph in JSON text, which must parse (else the test fails). */
static inline int plan_text(planned *p, const char *json, bool cpu) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  if (kex_graph_from_json(json, strlen(json), &lim, &g, &err)) fail_msg("graph: %s", err.msg);
  return plan_graph(p, g, cpu);
}

static inline void planned_free(planned *p) {
  kex_schedule_free(p->s);
  kex_replay_free(p->r);
  kex_graph_free(p->g);
  kex_arena_destroy(&p->arena);
}

/* The n-th kernel item (0-based) of the schedule; the test fails when there is none. */
static inline const kex_sched_item *nth_kernel(const planned *p, int n) {
  for (uint32_t i = 0; i < p->s->nitems; i++)
    if (p->s->items[i].kind == KEX_ITEM_KERNEL && n-- == 0) return &p->s->items[i];
  fail_msg("no kernel %d", n);
  return NULL;
}

/* A graph's JSON text: its nodes and outputs; a float32 BUFFER of random numbers; a float32 CONST. */
#define G(nodes, outs) "{\"format\":\"kex.graph.v1\",\"nodes\":[" nodes "],\"outputs\":[" outs "]}"
#define BUFF(shape) "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":" shape ",\"fill\":{\"random\":1}}"
#define CONSTF(v, shape) "{\"op\":\"CONST\",\"dtype\":\"float32\",\"shape\":" shape ",\"value\":" v "}"

/* tinygrad's `a @ b` for (N,K)@(K,N) */
#define MATMUL(N, K)                                                                                    \
  G(BUFF("[" #N "," #K "]") "," BUFF("[" #K "," #N "]") ",{\"op\":\"RESHAPE\",\"src\":[0],\"arg\":[" #N \
    ",1," #K "]},{\"op\":\"EXPAND\",\"src\":[2],\"arg\":[" #N "," #N "," #K "]}"                        \
    ",{\"op\":\"PERMUTE\",\"src\":[1],\"arg\":[1,0]},{\"op\":\"RESHAPE\",\"src\":[4],\"arg\":[1," #N    \
    "," #K "]},{\"op\":\"EXPAND\",\"src\":[5],\"arg\":[" #N "," #N "," #K "]}"                          \
    ",{\"op\":\"MUL\",\"src\":[3,6]},{\"op\":\"REDUCE_SUM\",\"src\":[7],\"axis\":[2]}"                  \
    ",{\"op\":\"RESHAPE\",\"src\":[8],\"arg\":[" #N "," #N "]}",                                        \
    "9")

#endif

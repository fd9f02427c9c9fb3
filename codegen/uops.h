/*
 * uops.h - tinygrad 0.9.0's UOp graph (codegen/uops.py, spec section 9).
 *
 * A UOp is (uop, dtype, vin, arg).  Nodes live in a kex_uop_graph's arena and
 * are hash-consed: kex_uop_add with equal (uop, dtype, vin, arg) returns the
 * same pointer, so pointer equality is value equality.  After the linearizer
 * has built the graph, kex_uop_linearize rewrites it with tinygrad's
 * constant_folder to a fixpoint and toposorts it into the linear program that
 * the renderer walks (with ENDRANGE / ENDIF entries inserted).
 *
 * Errors: constructors return NULL when out of memory (and set g->oom);
 * every constructor accepts NULL operands and then returns NULL, so a chain
 * of calls needs one check at the end.  Walks use explicit stacks: uop graphs
 * of long elementwise chains are deep.
 */
#ifndef KEX_SEARCH_UOPS_H
#define KEX_SEARCH_UOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/dict.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/ops.h"

/* In tinygrad's order: the toposort breaks ties by this value. */
#define KEX_UOP_MAP(XX) \
  XX(SINK) XX(DEFINE_GLOBAL) XX(DEFINE_VAR) XX(DEFINE_LOCAL) XX(DEFINE_ACC) XX(CONST) XX(SPECIAL) XX(NOOP) XX(UNMUL) \
  XX(GEP) XX(CAST) XX(BITCAST) XX(ALU) XX(WMMA) XX(LOAD) XX(STORE) XX(PHI) XX(BARRIER) XX(IF) XX(RANGE) XX(ENDRANGE) XX(ENDIF)

typedef enum kex_uop_kind {
#define XX(n) KEX_UOP_##n,
  KEX_UOP_MAP(XX)
#undef XX
  KEX_UOP_COUNT
} kex_uop_kind;

const char *kex_uop_name(kex_uop_kind k); /* "RANGE" */

/* A uop dtype: scalar type, vector width (1, 2, 4; 0 = no dtype, None), pointer flag (PtrDType). */
typedef struct kex_udtype {
  kex_dtype dt;
  uint8_t vec;
  bool ptr;
} kex_udtype;

static inline kex_udtype kex_ud(kex_dtype dt) { return (kex_udtype){dt, 1, false}; }
static inline kex_udtype kex_ud_vec(kex_dtype dt, int n) { return (kex_udtype){dt, (uint8_t)n, false}; }
static inline kex_udtype kex_ud_ptr(kex_dtype dt) { return (kex_udtype){dt, 1, true}; }
static inline kex_udtype kex_ud_none(void) { return (kex_udtype){KEX_DT_BOOL, 0, false}; }
static inline bool kex_ud_eq(kex_udtype a, kex_udtype b) { return a.dt == b.dt && a.vec == b.vec && a.ptr == b.ptr; }

/*
 * The arg, by uop:
 *   ALU           op
 *   CONST         c (already dtypes.as_const'ed)
 *   DEFINE_ACC    c = initial value, i[0] = buffer index, i[1] = acc number
 *   DEFINE_GLOBAL i[0] = MemBuffer idx, i[1] = is output
 *   DEFINE_LOCAL  name, i[0] = size in elements
 *   SPECIAL       i[0] = dimension, name ("gidx0", "lidx1", "idx0"), i[1] = size
 *   RANGE         i[0] = depth, i[1] = index (tinygrad's (depth, i))
 *   GEP           i[0] = element
 */
typedef struct kex_uop_arg {
  kex_op op;
  kex_const c;
  int64_t i[2];
  const char *name;
} kex_uop_arg;

typedef struct kex_uop kex_uop;
struct kex_uop {
  kex_uop_kind uop;
  kex_udtype dtype;
  uint32_t nvin;
  const kex_uop *const *vin;
  kex_uop_arg arg;
  uint32_t id;   /* creation order within the graph */
  uint64_t hash;
};

typedef struct kex_uop_graph {
  kex_arena arena;
  uint32_t n, cap;       /* nodes made so far (ids 0..n-1) */
  const kex_uop **nodes; /* by id (heap) */
  kex_dict table;        /* hash-consing: const kex_uop * entries, probed with a uop_probe */
  bool oom;
  bool no_loop_collapse; /* set when loop_collapse left an UNMUL that sum_collapse could not remove */
  /* linearize() result */
  uint32_t nlinear;
  const kex_uop **linear; /* heap */
} kex_uop_graph;

void kex_uop_graph_init(kex_uop_graph *g);
void kex_uop_graph_free(kex_uop_graph *g);

/* UOpGraph.add: the hash-consed node (uop, dtype, vin[0..nvin), arg); arg may be NULL (no arg). */
const kex_uop *kex_uop_add(kex_uop_graph *g, kex_uop_kind uop, kex_udtype dtype, const kex_uop *const *vin,
                           uint32_t nvin, const kex_uop_arg *arg);
/* CONST of dtype (the value converted with dtypes.as_const). */
const kex_uop *kex_uop_const(kex_uop_graph *g, kex_udtype dtype, kex_const c);
const kex_uop *kex_uop_const_int(kex_uop_graph *g, int64_t v); /* int32 CONST */
/* UOp.alu: dtype bool for CMPLT/CMPEQ, else the last operand's. */
const kex_uop *kex_uop_alu(kex_uop_graph *g, kex_op op, const kex_uop *a, const kex_uop *b, const kex_uop *c);
/* ALU with an explicit dtype. */
const kex_uop *kex_uop_alu_dt(kex_uop_graph *g, kex_op op, kex_udtype dt, const kex_uop *a, const kex_uop *b,
                              const kex_uop *c);
const kex_uop *kex_uop_1(kex_uop_graph *g, kex_uop_kind uop, kex_udtype dt, const kex_uop *a);

/*
 * UOpGraph.linearize over the given STOREs (sinks): SINK, graph_rewrite with
 * constant_folder to a fixpoint, NOOPs dropped, toposort with tinygrad's
 * priority rule (loop bodies first), DEFINE_ACC hoisted before its first
 * loop, ENDRANGE after a loop's last scope child, ENDIFs at the end.  The
 * result is g->linear[0..nlinear) (SINK excluded).  0, KEX_ENOMEM, or
 * KEX_EINTERNAL (rewrite did not converge) with err set.
 */
int kex_uop_linearize(kex_uop_graph *g, const kex_uop *const *sinks, uint32_t nsinks, kex_error *err);

/* flops_mem(): ALU count and LOAD/STORE bytes times the loop trip counts of the linear program. */
void kex_uop_flops_mem(const kex_uop_graph *g, int64_t *flops, int64_t *mem);

/* One line per linear uop (debugging): "  12 ALU           float  [3, 11]  ADD". */
void kex_uop_print(const kex_uop_graph *g, void *file);

#endif

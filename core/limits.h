/*
 * limits.h - every bound kex puts on external input, with its default.
 *
 * A kex_limits value travels with each graph load so that the daemon's flags
 * (and tests) can tighten or widen them; the KEX_LIMIT_* macros are the
 * defaults and the hard ceilings of the fixed-size data structures.  A graph
 * keeps the limits it was loaded with, so the scheduler applies the per-kernel
 * ones (max_kernel_depth, max_kernel_ops) to the same values.
 */
#ifndef KEX_CORE_LIMITS_H
#define KEX_CORE_LIMITS_H

#include <stdint.h>

/*
 * hard: dims of any shape (the ShapeTracker's fixed arrays, a few KiB of
 * stack per call).  tinygrad reshapes to 2 * ndim dims in Tensor.repeat
 * (which _pool calls when a kernel is larger than its stride), and to
 * ndim + 2 * k for k pooled dims when _pool splits the stride: test_ops'
 * repeat of 6 dims reaches 12, its conv3d 11.
 */
#define KEX_MAX_DIMS 16
#define KEX_LIMIT_NODES (1u << 20)            /* default: nodes per graph */
#define KEX_LIMIT_DIMS KEX_MAX_DIMS           /* default: dims per shape (<= KEX_MAX_DIMS) */
#define KEX_LIMIT_ELEMENTS (1ll << 32)        /* default: elements of one node's shape (product of its
                                                 non-zero dims), and the largest |STRIDE| */
#define KEX_LIMIT_INLINE_BYTES (256ll << 20)  /* default: total inline BUFFER data bytes */
#define KEX_LIMIT_BUFFER_BYTES (4ll << 30)    /* default: bytes of one input buffer */
#define KEX_LIMIT_OUTPUTS 4096                /* default: outputs per graph */
#define KEX_LIMIT_JSON_BYTES (1ll << 30)      /* default: bytes of a JSON graph file */
/*
 * default: the longest dependency chain of a graph, in nodes (an input is 1,
 * every other node 1 + the deepest of its sources).  tinygrad 0.9.0 walks
 * these chains recursively (_recurse_lb, _recursive_lazyop with a generator
 * frame per level) under sys.setrecursionlimit(10000), so ~5,000 levels is
 * the most it can schedule; the deepest of ../shared/cases is 140.
 */
#define KEX_LIMIT_DEPTH 4096
/*
 * default: the depth of one kernel's AST (STORE down to its deepest
 * LOAD/CONST, each level one node).  An abuse guard only: the renderers give
 * a value its own variable before its expression nests NEST_MAX brackets
 * (codegen/render.c), so the compiler sees bounded nesting at any depth, and
 * no pass over an AST (scheduler, lowering, renderer) recurses on it
 * (test_codegen renders one this deep on a 256 KiB stack).  With the other defaults it never binds (an AST is at most
 * max_kernel_ops + 1 and max_depth + 1 levels deep); it bounds the depth when
 * those are raised.  The deepest kernel of ../shared/cases is 24 levels.
 */
#define KEX_LIMIT_KERNEL_DEPTH 10000
/*
 * default: operations in one kernel's AST (ALU, cast, reduce and STORE
 * nodes; a sub-AST shared within the kernel counts once).  Compile time grows
 * faster than linearly with it, under the device's build lock; a chain of
 * max_depth elementwise ops fits, and the largest kernel of ../shared/cases
 * has 33.
 */
#define KEX_LIMIT_KERNEL_OPS 4096

typedef struct kex_limits {
  uint32_t max_nodes;
  uint32_t max_dims;
  int64_t max_elements;
  int64_t max_inline_bytes;
  int64_t max_buffer_bytes;
  uint32_t max_outputs;
  uint32_t max_depth;
  uint32_t max_kernel_depth;
  uint32_t max_kernel_ops;
} kex_limits;

#define KEX_LIMITS_DEFAULT                                                                         \
  ((kex_limits){KEX_LIMIT_NODES, KEX_LIMIT_DIMS, KEX_LIMIT_ELEMENTS, KEX_LIMIT_INLINE_BYTES,       \
                KEX_LIMIT_BUFFER_BYTES, KEX_LIMIT_OUTPUTS, KEX_LIMIT_DEPTH, KEX_LIMIT_KERNEL_DEPTH, \
                KEX_LIMIT_KERNEL_OPS})

#endif

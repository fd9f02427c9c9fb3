/*
 * limits.h - every bound kex puts on external input, with its default.
 *
 * A kex_limits value travels with each graph load so that the daemon's flags
 * (and tests) can tighten or widen them; the KEX_LIMIT_* macros are the
 * defaults and the hard ceilings of the fixed-size data structures.
 */
#ifndef KEX_CORE_LIMITS_H
#define KEX_CORE_LIMITS_H

#include <stdint.h>

#define KEX_MAX_DIMS 16                       /* hard: dims of any shape (ShapeTracker arrays) */
#define KEX_LIMIT_NODES (1u << 20)            /* default: nodes per graph */
#define KEX_LIMIT_DIMS 8                      /* default: dims per shape (<= KEX_MAX_DIMS) */
#define KEX_LIMIT_ELEMENTS (1ll << 32)        /* default: elements of one node's shape */
#define KEX_LIMIT_INLINE_BYTES (256ll << 20)  /* default: total inline BUFFER data bytes */
#define KEX_LIMIT_BUFFER_BYTES (4ll << 30)    /* default: bytes of one input buffer */
#define KEX_LIMIT_OUTPUTS 4096                /* default: outputs per graph */
#define KEX_LIMIT_JSON_BYTES (1ll << 30)      /* default: bytes of a JSON graph file */

typedef struct kex_limits {
  uint32_t max_nodes;
  uint32_t max_dims;
  int64_t max_elements;
  int64_t max_inline_bytes;
  int64_t max_buffer_bytes;
  uint32_t max_outputs;
} kex_limits;

#define KEX_LIMITS_DEFAULT                                                                               \
  ((kex_limits){KEX_LIMIT_NODES, KEX_LIMIT_DIMS, KEX_LIMIT_ELEMENTS, KEX_LIMIT_INLINE_BYTES, \
                KEX_LIMIT_BUFFER_BYTES, KEX_LIMIT_OUTPUTS})

#endif

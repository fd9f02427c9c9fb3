/*
 * astkey.h - the canonical key of a kernel: which beam-cache entry it owns.
 *
 * A kernel is its nout STORE ASTs (kex_lop DAGs).  kex_ast_text writes them
 * as one versioned canonical text; kex_ast_key is the SHA-256 of that text.
 * The text depends only on the ASTs' values, never on pointers, arenas or
 * which sub-DAGs happen to be shared: nodes are numbered in a canonical
 * postorder (roots in order, sources in order) and structurally equal nodes
 * are one number, referenced as %N.  The walk uses an explicit stack, so a
 * 100k-deep chain costs heap, not C stack.
 *
 * The text (format version kex.ast.v1):
 *
 *   kex.ast.v1
 *   outputs <nout>
 *   %<i> <op> <dtype>[ <args>][ src=%a,%b,...]      one line per distinct node
 *   out %<i>                                        one line per STORE, in order
 *
 * <op> is tinygrad's name ("BinaryOps.ADD"), <dtype> the graph-format name
 * ("float32").  Args, by op: LOAD/STORE "idx=<MemBuffer.idx> st=<repr>",
 * BufferOps.CONST "val=<c> st=<repr>", CAST/BITCAST "to=<dtype>",
 * SUM/MAX "axis=(a,b,)" (tuple syntax, the bits of axis_mask).  <repr> is
 * kex_st_repr (tinygrad's ShapeTracker repr); a const is "i:<int>",
 * "b:0|1" or "f:0x<16 hex digits of the IEEE-754 double bits>" (so 0.0 and
 * -0.0, and each NaN payload, are different keys).  Any change to this
 * format must bump the version string.
 *
 * SHA-256 and hex come from core/codec.h (OpenSSL underneath), included
 * here for the key's users.
 */
#ifndef KEX_SEARCH_ASTKEY_H
#define KEX_SEARCH_ASTKEY_H

#include <stddef.h>
#include <stdint.h>

#include "core/codec.h"
#include "core/errors.h"
#include "sched/schedule.h"

#define KEX_AST_KEY_VERSION "kex.ast.v1"
#define KEX_AST_KEY_BYTES 32
#define KEX_AST_KEY_HEX (2 * KEX_AST_KEY_BYTES + 1) /* hex digits + NUL */
#define KEX_AST_MAX_OUTPUTS 4096                    /* STORE roots per kernel */
#define KEX_AST_MAX_NODES (1u << 24)                /* distinct nodes one key walks */

/* ---- AST keys ---- */

typedef struct kex_ast_digest {
  uint8_t bytes[KEX_AST_KEY_BYTES];
  char hex[KEX_AST_KEY_HEX];
} kex_ast_digest;

/*
 * The canonical text of the kernel whose outputs are ast[0..nout-1]
 * (STORE roots).  On success *out is a NUL-terminated kex_malloc'd string
 * owned by the caller (kex_free) and *len (when not NULL) its length.
 * Errors: KEX_EINVAL (nout == 0, a NULL root or source, an op/dtype out of
 * range; the message names the node), KEX_ELIMIT (more than
 * KEX_AST_MAX_OUTPUTS roots or KEX_AST_MAX_NODES distinct nodes),
 * KEX_ENOMEM.  *out is NULL on error.
 */
int kex_ast_text(const kex_lop *const *ast, uint32_t nout, char **out, size_t *len, kex_error *err);

/* SHA-256 of kex_ast_text into *key (bytes and hex).  Errors as kex_ast_text. */
int kex_ast_key(const kex_lop *const *ast, uint32_t nout, kex_ast_digest *key, kex_error *err);

#endif

/*
 * render.h - tinygrad 0.9.0's C-style renderer (renderer/cstyle.py, spec 10)
 * for two dialects: OpenCL C and C for the cpu device (devices/device.h's
 * calling convention: buffers unpacked from `void **bufs`, the outermost
 * global loop running over [gidx_start, gidx_end)).
 *
 * Input: a linearized uop graph (kex_uop_linearize).  Output: the kernel
 * source, kex_malloc'd, owned by the caller.
 */
#ifndef KEX_SEARCH_RENDER_H
#define KEX_SEARCH_RENDER_H

#include "core/errors.h"
#include "codegen/uops.h"

/*
 * Render g->linear as kernel `name` in `dialect` (kex_dialect of lower.h).
 * 0 with *src set, KEX_ENOMEM, KEX_EUNSUPPORTED (a uop the dialect cannot
 * express, e.g. SPECIAL or DEFINE_LOCAL on cpu), KEX_EINTERNAL.
 */
int kex_render_cstyle(int dialect, const char *name, const kex_uop_graph *g, char **src, kex_error *err);

#endif

/*
 * npy.h - numpy's .npy file format (version 1.0 written, 1.0-3.0 read).
 *
 * The one reader and writer of .npy files: `kex run --out`, `kex download`,
 * `kex upload` and libkex all go through it.  Pure data: a header is
 * parsed from or written to a stdio stream; no device, no wire.  Arrays are
 * little-endian and in C order; numpy has no bfloat16, so the writer widens
 * bfloat16 data to float32.
 */
#ifndef KEX_CORE_NPY_H
#define KEX_CORE_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/dtype.h"
#include "core/errors.h"

#define KEX_NPY_HEADER_MAX 4096 /* bytes of a .npy header the reader accepts */

/* numpy's descr of dt ("<f4", "|b1"); bfloat16's is float32's (the writer widens it). */
const char *kex_npy_descr(kex_dtype dt);

/*
 * Read the preamble and header of the .npy stream f (path names it in
 * messages): its dtype and shape (at most max_dims dims); f is left at the
 * data.  0, or KEX_EPARSE (not .npy, truncated, Fortran order, big-endian,
 * a dtype kex has no name for, a bad shape, more than max_dims dims).
 */
int kex_npy_read_header(FILE *f, const char *path, int max_dims, kex_dtype *dt, int *ndim, int64_t *shape,
                        kex_error *err);

/*
 * Write data (the C-order elements of a dt array of that shape) as the .npy
 * file path.  0, or KEX_EIO with the path and the system's reason.
 */
int kex_npy_write(const char *path, kex_dtype dt, int ndim, const int64_t *shape, const void *data, kex_error *err);

#endif

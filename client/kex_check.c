/*
 * kex_check.c - `kex run --check CASE.json`: a case file of ../shared/cases
 * holds a graph with real input data (`numeric.graph`) and the outputs
 * tinygrad computed for it (`numeric.expected`: dtype, shape, base64
 * little-endian bytes) with the tolerances to compare at (`rtol`, `atol`).
 * This file reads the case and compares what a run produced with it, output
 * by output, the way tests/unit/test_run.c does: floats pass when both are
 * NaN, equal, or |got - want| <= atol + rtol * |want|; other dtypes must be
 * equal.  The in-process run (kex.c) and the server's (kex_remote.c) both
 * print through here, so the PASS/FAIL lines are the same in both modes.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kex_cli.h"
#include "core/alloc.h"
#include "core/codec.h"
#include "core/dtype.h"

#define CASE_FILE_MAX (256ll << 20) /* bytes of a case file */

int kex_cli_case_load(const char *cmd, const char *path, kex_cli_case *c) {
  json_error_t jerr;
  json_t *root = NULL, *num, *graph, *exp;
  FILE *f = NULL;
  long size = 0;
  int ret = 0;
  memset(c, 0, sizeof *c);
  if (!(f = fopen(path, "rb"))) {
    fprintf(stderr, "kex %s: %s: cannot open: %s\n", cmd, path, strerror(errno));
    return 2;
  }
  if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || size > CASE_FILE_MAX || fseek(f, 0, SEEK_SET)) {
    fprintf(stderr, "kex %s: %s: cannot read (or larger than %lld bytes)\n", cmd, path, CASE_FILE_MAX);
    ret = 2;
    goto out;
  }
  if (!(root = json_loadf(f, 0, &jerr))) {
    fprintf(stderr, "kex %s: %s: line %d: %s\n", cmd, path, jerr.line, jerr.text);
    ret = 2;
    goto out;
  }
  num = json_object_get(root, "numeric");
  graph = json_object_get(num, "graph");
  exp = json_object_get(num, "expected");
  if (!json_is_object(num) || !json_is_object(graph) || !json_is_array(exp)) {
    fprintf(stderr, "kex %s: %s: not a case with a numeric graph (\"numeric\": {\"graph\", \"expected\", \"rtol\", "
                    "\"atol\"}; ../shared/cases/README.md)\n", cmd, path);
    ret = 2;
    goto out;
  }
  if (!(c->graph_text = json_dumps(graph, JSON_COMPACT))) {
    fprintf(stderr, "kex %s: out of memory\n", cmd);
    ret = 1;
    goto out;
  }
  c->expected = json_incref(exp);
  c->nexpected = json_array_size(exp);
  c->rtol = json_number_value(json_object_get(num, "rtol"));
  c->atol = json_number_value(json_object_get(num, "atol"));
out:
  if (ret) kex_cli_case_free(c);
  json_decref(root);
  fclose(f);
  return ret;
}

void kex_cli_case_free(kex_cli_case *c) {
  free(c->graph_text); /* jansson's allocator */
  json_decref(c->expected);
  memset(c, 0, sizeof *c);
}

/* "(2, 3)" / "(10,)" / "()" */
static void shape_text(int ndim, const int64_t *shape, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "(");
  for (int d = 0; d < ndim && n < cap; d++) n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (n < cap) snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
}

bool kex_cli_case_check(kex_cli_case *c, size_t i, const char *dtype, int ndim, const int64_t *shape,
                        const void *data, size_t nbytes, bool quiet, json_t **details) {
  json_t *e = json_array_get(c->expected, i), *eshape = json_object_get(e, "shape");
  const char *edtype = json_string_value(json_object_get(e, "dtype")), *b64 = json_string_value(json_object_get(e, "data"));
  int dt = kex_dtype_from_name(dtype);
  char reason[512] = "", shp[256];
  unsigned char *want = NULL;
  size_t nvalues = 0, nbad = 0, first_bad = 0;
  double max_diff = 0, first_got = 0, first_want = 0;
  bool pass = false;
  shape_text(ndim, shape, shp, sizeof shp);
  if (!e) {
    snprintf(reason, sizeof reason, "the case expects %zu output%s, this is one more", c->nexpected,
             c->nexpected == 1 ? "" : "s");
    goto report;
  }
  if (!edtype || !b64 || !json_is_array(eshape)) {
    snprintf(reason, sizeof reason, "the case's expected output %zu lacks dtype, shape or data", i);
    goto report;
  }
  if (strcmp(edtype, dtype) != 0 || dt < 0) {
    snprintf(reason, sizeof reason, "dtype %s, the case expects %s", dtype, edtype);
    goto report;
  }
  bool same_shape = json_array_size(eshape) == (size_t)ndim;
  for (int d = 0; same_shape && d < ndim; d++)
    same_shape = json_integer_value(json_array_get(eshape, (size_t)d)) == shape[d];
  if (!same_shape) {
    char *es = json_dumps(eshape, JSON_COMPACT);
    snprintf(reason, sizeof reason, "shape %s, the case expects %s", shp, es ? es : "?");
    free(es);
    goto report;
  }
  if (!(want = kex_malloc(strlen(b64) / 4 * 3 + 4))) {
    snprintf(reason, sizeof reason, "out of memory decoding the expected data");
    goto report;
  }
  size_t b64_len = strlen(b64);
  long wn = kex_base64_decode(b64, b64_len, want, NULL) ? -1 : (long)kex_base64_decoded_len(b64, b64_len);
  size_t item = (size_t)kex_dtype_size((kex_dtype)dt);
  if (wn < 0) {
    snprintf(reason, sizeof reason, "the case's expected data is not base64");
    goto report;
  }
  if ((size_t)wn != nbytes || !item) {
    snprintf(reason, sizeof reason, "%zu bytes, the case's data has %ld", nbytes, wn);
    goto report;
  }
  nvalues = nbytes / item;
  bool fl = kex_dtype_is_float((kex_dtype)dt);
  for (size_t k = 0; k < nvalues; k++) {
    double g = kex_dtype_element((kex_dtype)dt, data, k), w = kex_dtype_element((kex_dtype)dt, want, k);
    bool ok = fl ? (isnan(g) && isnan(w)) || g == w || fabs(g - w) <= c->atol + c->rtol * fabs(w) : g == w;
    if (!(isnan(g) && isnan(w)) && g != w) max_diff = fmax(max_diff, isfinite(g - w) ? fabs(g - w) : INFINITY);
    if (ok) continue;
    if (!nbad++) {
      first_bad = k;
      first_got = g;
      first_want = w;
    }
  }
  if (nbad)
    snprintf(reason, sizeof reason, "%zu of %zu values out of tolerance, first [%zu]: got %.9g, want %.9g", nbad,
             nvalues, first_bad, first_got, first_want);
  pass = nbad == 0;
report:
  if (pass) c->npassed++;
  else c->nfailed++;
  if (!quiet) {
    if (pass)
      printf("output %zu: PASS %s %s, %zu values, max |diff| %.3g (rtol %g, atol %g)\n", i, dtype, shp, nvalues, max_diff,
             c->rtol, c->atol);
    else
      printf("output %zu: FAIL %s %s: %s (rtol %g, atol %g)\n", i, dtype, shp, reason, c->rtol, c->atol);
  }
  if (details) {
    json_t *s = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(s, json_integer(shape[d]));
    *details = json_pack("{s:I, s:b, s:s, s:o, s:I, s:I, s:o}", "output", (json_int_t)i, "pass", pass, "dtype", dtype,
                         "shape", s, "values", (json_int_t)nvalues, "mismatches", (json_int_t)nbad, "max_abs_diff",
                         isfinite(max_diff) ? json_real(max_diff) : json_null());
    if (*details && !pass) json_object_set_new(*details, "reason", json_string(reason));
  }
  kex_free(want);
  return pass;
}

bool kex_cli_case_finish(kex_cli_case *c, size_t noutputs, bool quiet) {
  for (size_t i = noutputs; i < c->nexpected; i++) {
    c->nfailed++;
    if (!quiet) printf("output %zu: FAIL the case expects it, the run produced %zu output%s\n", i, noutputs,
                       noutputs == 1 ? "" : "s");
  }
  if (!quiet)
    printf("check: %zu of %zu outputs passed\n", c->npassed, c->npassed + c->nfailed);
  return c->nfailed == 0 && c->npassed > 0;
}

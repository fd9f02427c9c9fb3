/*
 * test_graph.c - the client graph: validation, the JSON loader, limits, OOM.
 *
 * Every refusal of graph-format.md is tested on both sides of its boundary
 * (accepted just inside, refused just outside) and checks the error code and
 * that the message names the node.  Every case file of ../shared/cases loads
 * (graph and numeric.graph), and a load under an allocation failure at each
 * successive allocation returns KEX_ENOMEM without leaking (ASan build).
 *
 * JSON in this file is written with single quotes; q() turns them into
 * double quotes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/alloc.h"
#include "sched/graph.h"

#define JSON_MAX (64 * 1024)

/* The JSON text with ' replaced by " (static buffer, one at a time). */
static const char *q(const char *s) {
  static char buf[JSON_MAX];
  size_t i;
  for (i = 0; s[i] && i + 1 < sizeof buf; i++) buf[i] = s[i] == '\'' ? '"' : s[i];
  buf[i] = 0;
  return buf;
}

/* A graph JSON from a nodes list and an outputs list (single-quoted). */
static const char *graph_json(const char *nodes, const char *outputs) {
  static char buf[JSON_MAX];
  int n = snprintf(buf, sizeof buf, "{'format': 'kex.graph.v1', 'device': 'default', 'nodes': [%s], 'outputs': [%s]}",
                   nodes, outputs);
  assert_true(n > 0 && (size_t)n < sizeof buf);
  return q(buf);
}

static int load_text(const char *text, const kex_limits *lim, kex_graph **g, kex_error *err) {
  memset(err, 0, sizeof *err);
  return kex_graph_from_json(text, strlen(text), lim, g, err);
}

/* Load must succeed; returns the graph (caller frees). */
static kex_graph *accept_(const char *text, const kex_limits *lim, int line) {
  kex_graph *g = (kex_graph *)1;
  kex_error err;
  int rc = load_text(text, lim, &g, &err);
  if (rc != 0) {
    print_error("line %d: load refused: %d (%s): %s\n", line, rc, kex_errname(rc), err.msg);
    fail();
  }
  assert_non_null(g);
  return g;
}
#define ACCEPT(text, lim) accept_((text), (lim), __LINE__)
#define ACCEPT_FREE(text, lim) kex_graph_free(ACCEPT(text, lim))

/* Load must fail with `code` and a message containing every needle given. */
static void refuse_(const char *text, const kex_limits *lim, int code, const char *needle, const char *needle2,
                    int line) {
  kex_graph *g = (kex_graph *)1;
  kex_error err;
  int rc = load_text(text, lim, &g, &err);
  if (rc != code || err.code != code || !strstr(err.msg, needle) || (needle2 && !strstr(err.msg, needle2))) {
    print_error("line %d: got %d (%s) \"%s\"; want %d (%s) with \"%s\"%s%s\n", line, rc, kex_errname(rc), err.msg,
                code, kex_errname(code), needle, needle2 ? " and " : "", needle2 ? needle2 : "");
    fail();
  }
  assert_null(g);
}
#define REFUSE(text, lim, code, needle) refuse_((text), (lim), (code), (needle), NULL, __LINE__)
#define REFUSE2(text, lim, code, needle, needle2) refuse_((text), (lim), (code), (needle), (needle2), __LINE__)

#define E44 "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4, 4]}"

static void assert_shape(const kex_gnode *n, uint32_t ndim, const int64_t *want) {
  assert_int_equal(n->ndim, ndim);
  for (uint32_t i = 0; i < ndim; i++) assert_int_equal(n->shape[i], want[i]);
}

/* ---- op table ---- */

static void test_gop_names(void **state) {
  (void)state;
  for (int i = 0; i < KEX_GOP_COUNT; i++) assert_int_equal(kex_gop_from_name(kex_gop_name((kex_gop)i)), i);
  assert_int_equal(kex_gop_from_name("FOO"), -1);
  assert_int_equal(kex_gop_nsrc(KEX_GOP_WHERE), 3);
  assert_int_equal(kex_gop_nsrc(KEX_GOP_CONST), 0);
}

/* ---- the example of graph-format.md ---- */

static void test_format_example(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'data': 'AACAPwAAAEA='},"
                                   "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'fill': {'random': 7}},"
                                   "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [2]},"
                                   "{'op': 'CONST', 'dtype': 'float32', 'shape': [2], 'value': 2.0},"
                                   "{'op': 'MUL', 'src': [0, 3]},"
                                   "{'op': 'ADD', 'src': [4, 1]},"
                                   "{'op': 'REDUCE_SUM', 'src': [5], 'axis': [0]},"
                                   "{'op': 'RESHAPE', 'src': [6], 'arg': []},"
                                   "{'op': 'CAST', 'src': [7], 'dtype': 'float16'}",
                                   "7, 8"),
                        NULL);
  assert_int_equal(g->nnodes, 9);
  assert_string_equal(g->device, "default");
  float f[2];
  assert_int_equal(g->nodes[0].bufsrc, KEX_BUF_DATA);
  assert_int_equal(g->nodes[0].data_len, 8);
  memcpy(f, g->nodes[0].data, 8);
  assert_true(f[0] == 1.0f && f[1] == 2.0f);
  assert_int_equal(g->nodes[1].bufsrc, KEX_BUF_FILL_RANDOM);
  assert_int_equal(g->nodes[1].seed, 7);
  assert_int_equal(g->nodes[3].value.kind, KEX_CONST_FLOAT);
  assert_true(g->nodes[3].value.f == 2.0);
  assert_int_equal(g->nodes[6].ndim, 1);
  assert_int_equal(g->nodes[6].shape[0], 1);
  assert_int_equal(g->nodes[7].ndim, 0);
  assert_int_equal(g->nodes[8].dtype, KEX_DT_FLOAT16);
  assert_int_equal(g->noutputs, 2);
  assert_int_equal(g->outputs[0], 7);
  assert_int_equal(g->outputs[1], 8);
  kex_graph_free(g);
}

/* ---- movement ops ---- */

static void test_reshape_element_count(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'RESHAPE', 'src': [0], 'arg': [2, 8]}", "1"), NULL);
  const int64_t want[] = {2, 8};
  assert_shape(&g->nodes[1], 2, want);
  kex_graph_free(g);
  REFUSE(graph_json(E44 "," E44 "," E44 "," E44 "," E44 ", {'op': 'RESHAPE', 'src': [0], 'arg': [3, 5]}", "5"), NULL,
         KEX_EINVAL,
         "node 5 (RESHAPE): reshape from (4, 4) (16 elements) to (3, 5) (15 elements) changes the element count");
  REFUSE(graph_json(E44 ", {'op': 'RESHAPE', 'src': [0], 'arg': [16, -1]}", "1"), NULL, KEX_EINVAL,
         "node 1 (RESHAPE)");
  /* reshape to the same shape is a no-op that must be accepted */
  ACCEPT_FREE(graph_json(E44 ", {'op': 'RESHAPE', 'src': [0], 'arg': [4, 4]}", "1"), NULL);
  /* zero-element shapes reshape among themselves */
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0, 4]}, {'op': 'RESHAPE', 'src': [0], 'arg': [4, 0, 2]}", "1"), NULL);
}

static void test_expand(void **state) {
  (void)state;
  const char *base = "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 4]}";
  char nodes[512];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'EXPAND', 'src': [0], 'arg': [3, 4]}", base);
  kex_graph *g = ACCEPT(graph_json(nodes, "1"), NULL);
  const int64_t want[] = {3, 4};
  assert_shape(&g->nodes[1], 2, want);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'EXPAND', 'src': [0], 'arg': [3, 5]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (EXPAND)", "dim 1 of size 4 is not 1");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'EXPAND', 'src': [0], 'arg': [1, 3, 4]}", base);
  REFUSE(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (EXPAND)");
}

static void test_permute(void **state) {
  (void)state;
  const char *base = "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [2, 3, 4]}";
  char nodes[512];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'PERMUTE', 'src': [0], 'arg': [2, 0, 1]}", base);
  kex_graph *g = ACCEPT(graph_json(nodes, "1"), NULL);
  const int64_t want[] = {4, 2, 3};
  assert_shape(&g->nodes[1], 3, want);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'PERMUTE', 'src': [0], 'arg': [2, 0, 0]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (PERMUTE)", "not a permutation");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'PERMUTE', 'src': [0], 'arg': [3, 0, 1]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (PERMUTE)", "not a permutation");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'PERMUTE', 'src': [0], 'arg': [1, 0]}", base);
  REFUSE(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (PERMUTE)");
}

static void test_pad(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'PAD', 'src': [0], 'arg': [[0, 0], [1, 2]]}", "1"), NULL);
  const int64_t want[] = {4, 7};
  assert_shape(&g->nodes[1], 2, want);
  kex_graph_free(g);
  REFUSE2(graph_json(E44 ", {'op': 'PAD', 'src': [0], 'arg': [[0, 0], [-1, 2]]}", "1"), NULL, KEX_EINVAL,
          "node 1 (PAD)", "negative");
  REFUSE2(graph_json(E44 ", {'op': 'PAD', 'src': [0], 'arg': [[0, 0]]}", "1"), NULL, KEX_EINVAL, "node 1 (PAD)",
          "1 pairs");
  REFUSE2(graph_json(E44 ", {'op': 'PAD', 'src': [0], 'arg': [[0, 0], [1]]}", "1"), NULL, KEX_EINVAL, "node 1 (PAD)",
          "pair of integers");
}

static void test_shrink(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'SHRINK', 'src': [0], 'arg': [[0, 4], [1, 3]]}", "1"), NULL);
  const int64_t want[] = {4, 2};
  assert_shape(&g->nodes[1], 2, want);
  kex_graph_free(g);
  /* empty slice begin == end is in range */
  ACCEPT_FREE(graph_json(E44 ", {'op': 'SHRINK', 'src': [0], 'arg': [[4, 4], [0, 4]]}", "1"), NULL);
  REFUSE2(graph_json(E44 ", {'op': 'SHRINK', 'src': [0], 'arg': [[0, 5], [1, 3]]}", "1"), NULL, KEX_EINVAL,
          "node 1 (SHRINK)", "out of range");
  REFUSE2(graph_json(E44 ", {'op': 'SHRINK', 'src': [0], 'arg': [[0, 4], [3, 2]]}", "1"), NULL, KEX_EINVAL,
          "node 1 (SHRINK)", "out of range");
  REFUSE2(graph_json(E44 ", {'op': 'SHRINK', 'src': [0], 'arg': [[-1, 4], [0, 4]]}", "1"), NULL, KEX_EINVAL,
          "node 1 (SHRINK)", "out of range");
}

static void test_stride(void **state) {
  (void)state;
  const char *base = "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [5, 4]}";
  char nodes[512];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [1, 1]}, {'op': 'STRIDE', 'src': [0], 'arg': [-2, 3]}", base);
  kex_graph *g = ACCEPT(graph_json(nodes, "1, 2"), NULL);
  const int64_t same[] = {5, 4}, strided[] = {3, 2};
  assert_shape(&g->nodes[1], 2, same);
  assert_shape(&g->nodes[2], 2, strided);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [1, 0]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (STRIDE)", "stride of dim 1 is 0");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [1]}", base);
  REFUSE(graph_json(nodes, "1"), NULL, KEX_EINVAL, "node 1 (STRIDE)");
}

/* ---- reduce ---- */

static void test_reduce_axis(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'REDUCE_MAX', 'src': [0], 'axis': [1]}", "1"), NULL);
  const int64_t want[] = {4, 1};
  assert_shape(&g->nodes[1], 2, want);
  assert_int_equal(g->nodes[1].dtype, KEX_DT_FLOAT32);
  assert_int_equal(g->nodes[1].naxis, 1);
  kex_graph_free(g);
  REFUSE2(graph_json(E44 ", {'op': 'REDUCE_SUM', 'src': [0], 'axis': [2]}", "1"), NULL, KEX_EINVAL,
          "node 1 (REDUCE_SUM)", "out of range");
  REFUSE2(graph_json(E44 ", {'op': 'REDUCE_SUM', 'src': [0], 'axis': [-1]}", "1"), NULL, KEX_EINVAL,
          "node 1 (REDUCE_SUM)", "client normalises");
  REFUSE2(graph_json(E44 ", {'op': 'REDUCE_SUM', 'src': [0], 'axis': [1, 1]}", "1"), NULL, KEX_EINVAL,
          "node 1 (REDUCE_SUM)", "twice");
  REFUSE(graph_json(E44 ", {'op': 'REDUCE_SUM', 'src': [0], 'axis': [4294967296]}", "1"), NULL, KEX_EINVAL,
         "node 1 (REDUCE_SUM)");
}

/* ---- elementwise ---- */

static void test_elementwise_shapes(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 "," E44 ", {'op': 'ADD', 'src': [0, 1]}", "2"), NULL);
  const int64_t want[] = {4, 4};
  assert_shape(&g->nodes[2], 2, want);
  kex_graph_free(g);
  REFUSE2(graph_json(E44 ", {'op': 'EMPTY', 'dtype': 'float32', 'shape': [4, 1]}, {'op': 'ADD', 'src': [0, 1]}", "2"),
          NULL, KEX_EINVAL, "node 2 (ADD)", "(4, 4)");
  REFUSE(graph_json(E44 ", {'op': 'EMPTY', 'dtype': 'float32', 'shape': [16]}, {'op': 'MUL', 'src': [1, 0]}", "2"),
         NULL, KEX_EINVAL, "node 2 (MUL): source shapes do not match");
}

static void test_elementwise_dtypes(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 "," E44 ", {'op': 'CMPLT', 'src': [0, 1]}, {'op': 'CMPEQ', 'src': [0, 1]},"
                                   "{'op': 'NEG', 'src': [0]}, {'op': 'MULACC', 'src': [0, 1, 4]}",
                                   "2, 3, 5"),
                        NULL);
  assert_int_equal(g->nodes[2].dtype, KEX_DT_BOOL);
  assert_int_equal(g->nodes[3].dtype, KEX_DT_BOOL);
  assert_int_equal(g->nodes[4].dtype, KEX_DT_FLOAT32);
  assert_int_equal(g->nodes[5].dtype, KEX_DT_FLOAT32);
  kex_graph_free(g);
  REFUSE2(graph_json(E44 ", {'op': 'EMPTY', 'dtype': 'int32', 'shape': [4, 4]}, {'op': 'SUB', 'src': [0, 1]}", "2"),
          NULL, KEX_EINVAL, "node 2 (SUB)", "int32");
  REFUSE(graph_json(E44 ", {'op': 'EMPTY', 'dtype': 'float16', 'shape': [4, 4]}, {'op': 'MULACC', 'src': [0, 0, 1]}", "2"),
         NULL, KEX_EINVAL, "node 2 (MULACC)");
}

static void test_where(void **state) {
  (void)state;
  const char *in = "{'op': 'EMPTY', 'dtype': 'bool', 'shape': [4, 4]}," E44 ","
                   "{'op': 'EMPTY', 'dtype': 'int32', 'shape': [4, 4]}";
  char nodes[1024];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'WHERE', 'src': [0, 1, 1]}", in);
  kex_graph *g = ACCEPT(graph_json(nodes, "3"), NULL);
  assert_int_equal(g->nodes[3].dtype, KEX_DT_FLOAT32);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'WHERE', 'src': [1, 1, 1]}", in);
  REFUSE2(graph_json(nodes, "3"), NULL, KEX_EINVAL, "node 3 (WHERE)", "must be bool");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'WHERE', 'src': [0, 1, 2]}", in);
  REFUSE2(graph_json(nodes, "3"), NULL, KEX_EINVAL, "node 3 (WHERE)", "dtypes do not match");
}

static void test_cast_bitcast(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'CAST', 'src': [0], 'dtype': 'float16'},"
                                   "{'op': 'BITCAST', 'src': [0], 'dtype': 'int32'},"
                                   "{'op': 'CAST', 'src': [0], 'dtype': 'float32'}",
                                   "1, 2, 3"),
                        NULL);
  assert_int_equal(g->nodes[1].dtype, KEX_DT_FLOAT16);
  assert_int_equal(g->nodes[2].dtype, KEX_DT_INT32);
  assert_int_equal(g->nodes[3].dtype, KEX_DT_FLOAT32);
  kex_graph_free(g);
  REFUSE2(graph_json(E44 ", {'op': 'BITCAST', 'src': [0], 'dtype': 'int16'}", "1"), NULL, KEX_EINVAL,
          "node 1 (BITCAST)", "itemsize");
  REFUSE2(graph_json(E44 ", {'op': 'CAST', 'src': [0]}", "1"), NULL, KEX_EINVAL, "node 1 (CAST)", "missing \"dtype\"");
}

/* ---- inputs ---- */

static void test_const_values(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json("{'op': 'CONST', 'dtype': 'int32', 'shape': [], 'value': 2.7},"
                                   "{'op': 'CONST', 'dtype': 'int32', 'shape': [], 'value': -2.7},"
                                   "{'op': 'CONST', 'dtype': 'bool', 'shape': [], 'value': 0.5},"
                                   "{'op': 'CONST', 'dtype': 'float32', 'shape': [3], 'value': '-inf'},"
                                   "{'op': 'CONST', 'dtype': 'float32', 'shape': [], 'value': true},"
                                   "{'op': 'CONST', 'dtype': 'bool', 'shape': [], 'value': 0},"
                                   "{'op': 'CONST', 'dtype': 'float64', 'shape': [], 'value': 'nan'}",
                                   "0"),
                        NULL);
  assert_int_equal(g->nodes[0].value.kind, KEX_CONST_INT);
  assert_int_equal(g->nodes[0].value.i, 2);
  assert_int_equal(g->nodes[1].value.i, -2);
  assert_int_equal(g->nodes[2].value.kind, KEX_CONST_BOOL);
  assert_true(g->nodes[2].value.b);
  assert_int_equal(g->nodes[3].value.kind, KEX_CONST_FLOAT);
  assert_true(g->nodes[3].value.f < 0 && isinf(g->nodes[3].value.f));
  assert_int_equal(g->nodes[4].value.kind, KEX_CONST_FLOAT);
  assert_true(g->nodes[4].value.f == 1.0);
  assert_false(g->nodes[5].value.b);
  assert_true(isnan(g->nodes[6].value.f));
  kex_graph_free(g);
  REFUSE2(graph_json("{'op': 'CONST', 'dtype': 'int32', 'shape': [], 'value': 'inf'}", "0"), NULL, KEX_EINVAL,
          "node 0 (CONST)", "int32");
  REFUSE(graph_json(E44 ", {'op': 'CONST', 'dtype': 'uint8', 'shape': [], 'value': 'nan'}", "0"), NULL, KEX_EINVAL,
         "node 1 (CONST)");
  REFUSE(graph_json("{'op': 'CONST', 'dtype': 'int64', 'shape': [], 'value': 1e30}", "0"), NULL, KEX_EINVAL,
         "node 0 (CONST)");
  REFUSE(graph_json("{'op': 'CONST', 'dtype': 'float32', 'shape': [], 'value': 'infinity'}", "0"), NULL, KEX_EINVAL,
         "node 0 (CONST)");
  REFUSE2(graph_json("{'op': 'CONST', 'dtype': 'float32', 'shape': []}", "0"), NULL, KEX_EINVAL, "node 0 (CONST)",
          "missing \"value\"");
}

static void test_inline_data_length(void **state) {
  (void)state;
  /* float32 [2] = 8 bytes */
  ACCEPT_FREE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'data': 'AAAAAAAAAAA='}", "0"), NULL);
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'data': 'AAAAAAAAAA=='}", "0"), NULL,
          KEX_EINVAL, "node 0 (BUFFER)", "7 bytes");
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'data': 'AAAAAAAAAAAA'}", "0"), NULL,
          KEX_EINVAL, "node 0 (BUFFER)", "9 bytes");
  /* zero elements take empty data */
  ACCEPT_FREE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [0], 'data': ''}", "0"), NULL);
}

static void test_base64_strict(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [4], 'data': 'yRliPQ=='}", "0"), NULL);
  const uint8_t want[] = {0xc9, 0x19, 0x62, 0x3d};
  assert_memory_equal(g->nodes[0].data, want, 4);
  kex_graph_free(g);
  g = ACCEPT(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [3], 'data': '+/9a'}", "0"), NULL);
  const uint8_t want2[] = {0xfb, 0xff, 0x5a};
  assert_memory_equal(g->nodes[0].data, want2, 3);
  kex_graph_free(g);
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [3], 'data': 'AA-A'}", "0"), NULL, KEX_EINVAL,
          "node 0 (BUFFER)", "offset 2");
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [3], 'data': 'AAAAA'}", "0"), NULL, KEX_EINVAL,
          "node 0 (BUFFER)", "multiple of 4");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [3], 'data': 'AA=AAAAA'}", "0"), NULL, KEX_EINVAL,
         "node 0 (BUFFER)");
  /* non-canonical: nonzero bits after the last byte */
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [2], 'data': 'AAB='}", "0"), NULL, KEX_EINVAL,
         "node 0 (BUFFER)");
  ACCEPT_FREE(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [2], 'data': 'AAA='}", "0"), NULL);
}

static void test_buffer_sources(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'fill': {'arange': true}},"
                                   "{'op': 'BUFFER', 'dtype': 'int32', 'shape': [3], 'fill': {'value': 3.9}},"
                                   "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'buffer': 'job1/buf7'},"
                                   "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'fill': {'random': 0}, 'device': 'CLANG'}",
                                   "0"),
                        NULL);
  assert_int_equal(g->nodes[0].bufsrc, KEX_BUF_FILL_ARANGE);
  assert_int_equal(g->nodes[1].bufsrc, KEX_BUF_FILL_VALUE);
  assert_int_equal(g->nodes[1].fill.kind, KEX_CONST_INT);
  assert_int_equal(g->nodes[1].fill.i, 3);
  assert_int_equal(g->nodes[2].bufsrc, KEX_BUF_HANDLE);
  assert_string_equal(g->nodes[2].handle, "job1/buf7");
  assert_string_equal(g->nodes[3].device, "CLANG");
  kex_graph_free(g);
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3]}", "0"), NULL, KEX_EINVAL, "node 0 (BUFFER)",
          "needs one of");
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'fill': {'arange': true}, 'buffer': 'x'}", "0"),
          NULL, KEX_EINVAL, "node 0 (BUFFER)", "only one");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'fill': {'random': -1}}", "0"), NULL,
         KEX_EINVAL, "node 0 (BUFFER)");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'fill': {'zeros': 1}}", "0"), NULL,
         KEX_EINVAL, "node 0 (BUFFER)");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'int8', 'shape': [3], 'fill': {'value': 'nan'}}", "0"), NULL,
         KEX_EINVAL, "node 0 (BUFFER)");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [3], 'buffer': ''}", "0"), NULL, KEX_EINVAL,
         "node 0 (BUFFER)");
}

static void test_shape_negative(void **state) {
  (void)state;
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0]}", "0"), NULL);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [-1]}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "negative");
}

/* ---- structure ---- */

static void test_source_index(void **state) {
  (void)state;
  ACCEPT_FREE(graph_json(E44 ", {'op': 'NEG', 'src': [0]}", "1"), NULL);
  REFUSE2(graph_json(E44 ", {'op': 'NEG', 'src': [1]}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)", "not an earlier node");
  REFUSE2(graph_json(E44 ", {'op': 'NEG', 'src': [2]}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)", "not an earlier node");
  REFUSE2(graph_json(E44 ", {'op': 'NEG', 'src': [-1]}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)", "negative");
  REFUSE2(graph_json(E44 ", {'op': 'NEG', 'src': ['0']}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)", "integer");
}

static void test_source_count(void **state) {
  (void)state;
  REFUSE2(graph_json(E44 ", {'op': 'ADD', 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1 (ADD)", "takes 2 sources, got 1");
  REFUSE2(graph_json(E44 ", {'op': 'ADD', 'src': [0, 0, 0]}", "0"), NULL, KEX_EINVAL, "node 1 (ADD)", "got 3");
  REFUSE2(graph_json(E44 ", {'op': 'WHERE', 'src': [0, 0]}", "0"), NULL, KEX_EINVAL, "node 1 (WHERE)", "got 2");
  REFUSE2(graph_json(E44 ", {'op': 'CONST', 'dtype': 'float32', 'shape': [], 'value': 1, 'src': [0]}", "0"), NULL,
          KEX_EINVAL, "node 1 (CONST)", "takes 0 sources");
  REFUSE2(graph_json(E44 ", {'op': 'NEG'}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)", "missing \"src\"");
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1], 'src': []}", "0"), NULL);
}

static void test_unknown_op_dtype(void **state) {
  (void)state;
  REFUSE2(graph_json(E44 ", {'op': 'FOO', 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1", "unknown op \"FOO\"");
  REFUSE2(graph_json(E44 ", {'op': 7, 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1", "unknown op 7");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float8', 'shape': [4]}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "unknown dtype \"float8\"");
  REFUSE2(graph_json(E44 ", {'op': 'CAST', 'src': [0], 'dtype': 'half'}", "0"), NULL, KEX_EINVAL, "node 1 (CAST)",
          "unknown dtype");
  REFUSE2(graph_json("{'dtype': 'float32', 'shape': [4]}", "0"), NULL, KEX_EINVAL, "node 0", "missing \"op\"");
}

static void test_missing_fields(void **state) {
  (void)state;
  REFUSE2(graph_json("{'op': 'EMPTY', 'shape': [4]}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)", "missing \"dtype\"");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32'}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "missing \"shape\"");
  REFUSE2(graph_json(E44 ", {'op': 'RESHAPE', 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1 (RESHAPE)",
          "missing \"arg\"");
  REFUSE2(graph_json(E44 ", {'op': 'REDUCE_SUM', 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1 (REDUCE_SUM)",
          "missing \"axis\"");
  REFUSE2(graph_json(E44 ", {'op': 'COPY', 'src': [0]}", "0"), NULL, KEX_EINVAL, "node 1 (COPY)", "missing \"device\"");
  kex_graph *g = ACCEPT(graph_json(E44 ", {'op': 'COPY', 'src': [0], 'device': 'CLANG'}", "1"), NULL);
  assert_string_equal(g->nodes[1].device, "CLANG");
  kex_graph_free(g);
}

static void test_wrong_json_types(void **state) {
  (void)state;
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': '4'}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "must be an array");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4.0]}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "must be an integer");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 1, 'shape': [4]}", "0"), NULL, KEX_EINVAL, "node 0 (EMPTY)",
          "must be a string");
  REFUSE(graph_json(E44 ", {'op': 'NEG', 'src': 0}", "0"), NULL, KEX_EINVAL, "node 1 (NEG)");
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'uint8', 'shape': [1], 'data': 5}", "0"), NULL, KEX_EINVAL,
         "node 0 (BUFFER)");
  REFUSE(graph_json("[1]", "0"), NULL, KEX_EINVAL, "node 0");
  REFUSE(q("{'nodes': {}, 'outputs': []}"), NULL, KEX_EINVAL, "\"nodes\" must be an array");
  REFUSE(q("{'nodes': [], 'outputs': 0}"), NULL, KEX_EINVAL, "\"outputs\" must be an array");
  REFUSE(q("[]"), NULL, KEX_EINVAL, "top level");
  REFUSE(q("{'nodes': []}"), NULL, KEX_EINVAL, "missing \"outputs\"");
  REFUSE(q("{'outputs': []}"), NULL, KEX_EINVAL, "missing \"nodes\"");
}

static void test_unexpected_fields(void **state) {
  (void)state;
  REFUSE2(graph_json(E44 ", {'op': 'ADD', 'src': [0, 0], 'dtype': 'float32'}", "0"), NULL, KEX_EINVAL, "node 1 (ADD)",
          "unexpected field \"dtype\"");
  REFUSE2(graph_json(E44 ", {'op': 'RESHAPE', 'src': [0], 'arg': [16], 'axis': [0]}", "0"), NULL, KEX_EINVAL,
          "node 1 (RESHAPE)", "unexpected field \"axis\"");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4], 'colour': 1}", "0"), NULL, KEX_EINVAL,
          "node 0 (EMPTY)", "colour");
  REFUSE(q("{'nodes': [], 'outputs': [], 'extra': 1}"), NULL, KEX_EINVAL, "unexpected field \"extra\"");
}

static void test_format_field(void **state) {
  (void)state;
  ACCEPT_FREE(q("{'format': 'kex.graph.v1', 'nodes': [], 'outputs': []}"), NULL);
  ACCEPT_FREE(q("{'nodes': [], 'outputs': []}"), NULL);
  REFUSE(q("{'format': 'kex.graph.v2', 'nodes': [], 'outputs': []}"), NULL, KEX_EINVAL, "kex.graph.v2");
  REFUSE(q("{'format': 1, 'nodes': [], 'outputs': []}"), NULL, KEX_EINVAL, "\"format\"");
  kex_graph *g = ACCEPT(q("{'device': 'GPU', 'nodes': [], 'outputs': []}"), NULL);
  assert_string_equal(g->device, "GPU");
  kex_graph_free(g);
  REFUSE(q("{'device': '', 'nodes': [], 'outputs': []}"), NULL, KEX_EINVAL, "\"device\"");
}

static void test_malformed_json(void **state) {
  (void)state;
  REFUSE(q("{'nodes': [,], 'outputs': []}"), NULL, KEX_EPARSE, "line 1");
  REFUSE("", NULL, KEX_EPARSE, "graph JSON");
  REFUSE(q("{'nodes': [], 'nodes': [], 'outputs': []}"), NULL, KEX_EPARSE, "duplicate");
}

static void test_graph_wrapper(void **state) {
  (void)state;
  kex_graph *g = ACCEPT(q("{'name': 'x', 'kernels': {'cpu': 1}, 'graph': {'format': 'kex.graph.v1', 'nodes': "
                          "[{'op': 'EMPTY', 'dtype': 'float32', 'shape': [2]}], 'outputs': [0]}}"),
                        NULL);
  assert_int_equal(g->nnodes, 1);
  kex_graph_free(g);
  REFUSE(q("{'graph': 5}"), NULL, KEX_EINVAL, "\"graph\" must be an object");
}

static void test_outputs(void **state) {
  (void)state;
  ACCEPT_FREE(graph_json(E44 "," E44, "1"), NULL);
  REFUSE2(graph_json(E44 "," E44, "2"), NULL, KEX_EINVAL, "outputs[0] = 2", "not a node index");
  REFUSE(graph_json(E44 "," E44, "0, -1"), NULL, KEX_EINVAL, "outputs[1] = -1");
  REFUSE(graph_json(E44, "'0'"), NULL, KEX_EINVAL, "outputs[0]");
}

/* ---- ASSIGN ---- */

static void test_assign_target(void **state) {
  (void)state;
  const char *in = "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [4, 4], 'fill': {'random': 1}}," E44 ","
                   "{'op': 'RESHAPE', 'src': [0], 'arg': [16]}, {'op': 'RESHAPE', 'src': [1], 'arg': [16]}";
  char nodes[1024];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'ASSIGN', 'src': [1, 0]}", in);
  kex_graph *g = ACCEPT(graph_json(nodes, "4"), NULL);
  assert_int_equal(kex_graph_base(g, 2), 0);
  kex_graph_free(g);
  /* target a view (RESHAPE, then PERMUTE of it) of a held buffer */
  snprintf(nodes, sizeof nodes, "%s, {'op': 'ASSIGN', 'src': [3, 2]}", in);
  ACCEPT_FREE(graph_json(nodes, "4"), NULL);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'PERMUTE', 'src': [0], 'arg': [1, 0]}, {'op': 'ASSIGN', 'src': [1, 4]}", in);
  ACCEPT_FREE(graph_json(nodes, "5"), NULL);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'ASSIGN', 'src': [0, 1]}", in);
  REFUSE(graph_json(nodes, "4"), NULL, KEX_EINVAL, "node 4 (ASSIGN): ASSIGN target node 1 (base node 1, EMPTY) is not a held (realized) buffer");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'ASSIGN', 'src': [2, 3]}", in);
  REFUSE2(graph_json(nodes, "4"), NULL, KEX_EINVAL, "node 4 (ASSIGN)", "is not a held (realized) buffer");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'ASSIGN', 'src': [3, 0]}", in);
  REFUSE2(graph_json(nodes, "4"), NULL, KEX_EINVAL, "node 4 (ASSIGN)", "shape");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'EMPTY', 'dtype': 'float16', 'shape': [4, 4]}, {'op': 'ASSIGN', 'src': [4, 0]}", in);
  REFUSE2(graph_json(nodes, "5"), NULL, KEX_EINVAL, "node 5 (ASSIGN)", "float16");
  /* CONTIGUOUS of a buffer is not a movement op: its base is the CONTIGUOUS node */
  snprintf(nodes, sizeof nodes, "%s, {'op': 'CONTIGUOUS', 'src': [0]}, {'op': 'ASSIGN', 'src': [1, 4]}", in);
  REFUSE(graph_json(nodes, "5"), NULL, KEX_EINVAL, "node 5 (ASSIGN)");
}

/* ---- limits ---- */

/* n EMPTY [1] nodes as JSON (static buffer). */
static const char *n_nodes(unsigned n) {
  static char buf[JSON_MAX];
  size_t off = 0;
  for (unsigned i = 0; i < n; i++)
    off += (size_t)snprintf(buf + off, sizeof buf - off, "%s{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1]}",
                            i ? ", " : "");
  return buf;
}

static void test_limit_nodes(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_nodes = 5;
  ACCEPT_FREE(graph_json(n_nodes(5), "0"), &lim);
  REFUSE2(graph_json(n_nodes(6), "0"), &lim, KEX_ELIMIT, "node 5", "limit of 5 nodes");
  /* builder: N accepted, N+1 refused */
  kex_graph *g = kex_graph_new(NULL);
  assert_non_null(g);
  int64_t one = 1;
  kex_gnode n = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = &one};
  kex_error err;
  for (int i = 0; i < 5; i++) assert_int_equal(kex_graph_add(g, &n, &lim, &err), i);
  assert_int_equal(kex_graph_add(g, &n, &lim, &err), KEX_ELIMIT);
  assert_int_equal(err.code, KEX_ELIMIT);
  assert_non_null(strstr(err.msg, "node 5 (EMPTY)"));
  assert_int_equal(g->nnodes, 5);
  assert_int_equal(kex_err_grpc_status(KEX_ELIMIT), KEX_GRPC_RESOURCE_EXHAUSTED);
  kex_graph_free(g);
}

/* An EMPTY float32 node of n dims of 1 ("{'op': 'EMPTY', ...}"), in buf. */
static const char *empty_of_dims(char *buf, size_t len, int n) {
  size_t off = (size_t)snprintf(buf, len, "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [");
  for (int i = 0; i < n; i++) off += (size_t)snprintf(buf + off, len - off, "%s1", i ? ", " : "");
  snprintf(buf + off, len - off, "]}");
  return buf;
}

static void test_limit_dims(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  char nodes[512];
  /* the default is the hard maximum: 16 dims load, 17 are refused naming the limit */
  assert_int_equal(lim.max_dims, KEX_MAX_DIMS);
  assert_int_equal(KEX_MAX_DIMS, 16);
  ACCEPT_FREE(graph_json(empty_of_dims(nodes, sizeof nodes, 16), "0"), &lim);
  REFUSE2(graph_json(empty_of_dims(nodes, sizeof nodes, 17), "0"), &lim, KEX_ELIMIT, "node 0",
          "17 dims, more than the limit of 16 (max_dims)");
  /* tinygrad's x.repeat(2, 4, 3, 3, 2, 2) of a (4, 6, 3) tensor (test_ops.test_repeat): 12 dims between its
     reshapes */
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4, 6, 3]},"
                         "{'op': 'RESHAPE', 'src': [0], 'arg': [1, 1, 1, 1, 1, 1, 1, 4, 1, 6, 1, 3]},"
                         "{'op': 'EXPAND', 'src': [1], 'arg': [2, 1, 4, 1, 3, 1, 3, 4, 2, 6, 2, 3]},"
                         "{'op': 'RESHAPE', 'src': [2], 'arg': [2, 4, 3, 12, 12, 6]}", "3"), &lim);
  /* a configured limit */
  lim.max_dims = 3;
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 2, 3]}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 2, 3, 1]}", "0"), &lim, KEX_ELIMIT,
          "node 0 (EMPTY)", "4 dims, more than the limit of 3 (max_dims)");
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [6]}, {'op': 'RESHAPE', 'src': [0], 'arg': [1, 2, 3]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [6]}, {'op': 'RESHAPE', 'src': [0], 'arg': [1, 2, 3, 1]}", "1"),
          &lim, KEX_ELIMIT, "node 1 (RESHAPE)", "4 dims, more than the limit of 3 (max_dims)");
  /* the hard ceiling holds even when the configured limit is higher */
  lim.max_dims = 1000;
  REFUSE(graph_json(empty_of_dims(nodes, sizeof nodes, KEX_MAX_DIMS + 1), "0"), &lim, KEX_ELIMIT, "node 0 (EMPTY)");
  ACCEPT_FREE(graph_json(empty_of_dims(nodes, sizeof nodes, KEX_MAX_DIMS), "0"), &lim);
}

static void test_limit_elements(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_elements = 64;
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [8, 8]}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [5, 13]}", "0"), &lim, KEX_ELIMIT,
          "node 0 (EMPTY)", "limit of 64 elements");
  /* movement results are checked too: expand and pad */
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 8]}, {'op': 'EXPAND', 'src': [0], 'arg': [8, 8]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 8]}, {'op': 'EXPAND', 'src': [0], 'arg': [9, 8]}", "1"),
          &lim, KEX_ELIMIT, "node 1 (EXPAND)", "elements");
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [7, 8]}, {'op': 'PAD', 'src': [0], 'arg': [[1, 0], [0, 0]]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [7, 8]}, {'op': 'PAD', 'src': [0], 'arg': [[1, 1], [0, 0]]}", "1"),
          &lim, KEX_ELIMIT, "node 1 (PAD)", "elements");
  /* overflow of the product is a limit, not a wrap-around */
  lim = KEX_LIMITS_DEFAULT;
  REFUSE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4294967296, 4294967296, 4294967296]}", "0"), &lim,
         KEX_ELIMIT, "node 0 (EMPTY)");
}

/*
 * The elements limit is on the product of the non-zero dims: a 0 elsewhere in
 * the shape does not let a huge dim through (a REDUCE over the 0 axis would
 * hold it), and the product of the non-zero dims must not overflow.
 */
static void test_limit_elements_zero_dims(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_elements = 64;
  /* inputs: 16*4 = 64 in, 13*5 = 65 out */
  kex_graph *g = ACCEPT(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [16, 4, 0]},"
                                   "{'op': 'REDUCE_SUM', 'src': [0], 'axis': [2]}", "1"), &lim);
  const int64_t reduced[] = {16, 4, 1};
  assert_shape(&g->nodes[1], 3, reduced);
  kex_graph_free(g);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [13, 5, 0]}", "0"), &lim, KEX_ELIMIT,
          "node 0 (EMPTY)", "multiply to 65, more than the limit of 64 elements");
  ACCEPT_FREE(graph_json("{'op': 'CONST', 'dtype': 'float32', 'shape': [0, 64], 'value': 1}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'CONST', 'dtype': 'float32', 'shape': [0, 65], 'value': 1}", "0"), &lim, KEX_ELIMIT,
          "node 0 (CONST)", "65");
  /* movement results: reshape targets, pads and expands of 0-size sources */
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0]},"
                         "{'op': 'RESHAPE', 'src': [0], 'arg': [0, 8, 8]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0]},"
                     "{'op': 'RESHAPE', 'src': [0], 'arg': [0, 5, 13]}", "1"), &lim, KEX_ELIMIT,
          "node 1 (RESHAPE)", "65");
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0, 4]},"
                         "{'op': 'PAD', 'src': [0], 'arg': [[0, 0], [60, 0]]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0, 4]},"
                     "{'op': 'PAD', 'src': [0], 'arg': [[0, 0], [60, 1]]}", "1"), &lim, KEX_ELIMIT, "node 1 (PAD)",
          "65");
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 0]},"
                         "{'op': 'EXPAND', 'src': [0], 'arg': [64, 0]}", "1"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [1, 0]},"
                     "{'op': 'EXPAND', 'src': [0], 'arg': [65, 0]}", "1"), &lim, KEX_ELIMIT, "node 1 (EXPAND)", "65");

  /* the default limit, with the shapes that used to pass as "0 elements" */
  lim = KEX_LIMITS_DEFAULT;
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4294967296, 1, 0]}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4294967297, 1, 0]}", "0"), &lim, KEX_ELIMIT,
          "node 0 (EMPTY)", "4294967297, more than the limit of 4294967296 elements");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4611686018427387905, 4, 0]},"
                     "{'op': 'REDUCE_SUM', 'src': [0], 'axis': [2]}", "1"), &lim, KEX_ELIMIT, "node 0 (EMPTY)",
          "(4611686018427387905, 4, 0)");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4294967296, 4294967296, 0]}", "0"), &lim,
          KEX_ELIMIT, "node 0 (EMPTY)", "multiply past int64");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [0]},"
                     "{'op': 'RESHAPE', 'src': [0], 'arg': [0, 4611686018427387904, 4611686018427387904]}", "1"), &lim,
          KEX_ELIMIT, "node 1 (RESHAPE)", "multiply past int64");
  /* pads near INT64_MAX: of a 0-size dim (the sum fits, the size is over) and past int64 */
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4, 0]},"
                     "{'op': 'PAD', 'src': [0], 'arg': [[9223372036854775803, 0], [0, 0]]}", "1"), &lim, KEX_ELIMIT,
          "node 1 (PAD)", "9223372036854775807, more than the limit");
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4, 0]},"
                     "{'op': 'PAD', 'src': [0], 'arg': [[9223372036854775804, 0], [0, 0]]}", "1"), &lim, KEX_ELIMIT,
          "node 1 (PAD)", "overflows");
  /* the builder path refuses the same */
  g = kex_graph_new(NULL);
  assert_non_null(g);
  int64_t big[3] = {(int64_t)1 << 62 | 1, 4, 0};
  kex_gnode e = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 3, .shape = big};
  kex_error err;
  assert_int_equal(kex_graph_add(g, &e, &lim, &err), KEX_ELIMIT);
  assert_non_null(strstr(err.msg, "node 0 (EMPTY)"));
  big[0] = (int64_t)1 << 30;
  assert_int_equal(kex_graph_add(g, &e, &lim, &err), 0);
  kex_graph_free(g);
}

/* |STRIDE| is at most max_elements; INT64_MIN (no int64 magnitude) is refused, not negated. */
static void test_limit_stride(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_elements = 64;
  const char *base = "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [5, 4]}";
  char nodes[512];
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [64, -64]}", base);
  kex_graph *g = ACCEPT(graph_json(nodes, "1"), &lim);
  const int64_t ones[] = {1, 1};
  assert_shape(&g->nodes[1], 2, ones);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [65, 1]}", base);
  REFUSE2(graph_json(nodes, "1"), &lim, KEX_ELIMIT, "node 1 (STRIDE)", "stride 65 of dim 0 is beyond the limit of +-64");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [1, -65]}", base);
  REFUSE2(graph_json(nodes, "1"), &lim, KEX_ELIMIT, "node 1 (STRIDE)", "stride -65 of dim 1");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [1, -9223372036854775808]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_ELIMIT, "node 1 (STRIDE)", "-9223372036854775808");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [9223372036854775807, 1]}", base);
  REFUSE2(graph_json(nodes, "1"), NULL, KEX_ELIMIT, "node 1 (STRIDE)", "9223372036854775807");
  snprintf(nodes, sizeof nodes, "%s, {'op': 'STRIDE', 'src': [0], 'arg': [4294967296, -4294967296]}", base);
  ACCEPT_FREE(graph_json(nodes, "1"), NULL);
}

/* a chain EMPTY -> NEG -> NEG ... of `len` nodes (JSON, static buffer) */
static const char *neg_chain(unsigned len) {
  static char buf[JSON_MAX];
  size_t off = (size_t)snprintf(buf, sizeof buf, "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4]}");
  for (unsigned i = 1; i < len; i++)
    off += (size_t)snprintf(buf + off, sizeof buf - off, ", {'op': 'NEG', 'src': [%u]}", i - 1);
  return buf;
}

/* The longest dependency chain: depth = 1 + the deepest source, at most max_depth. */
static void test_limit_depth(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_depth = 5;
  kex_graph *g = ACCEPT(graph_json(neg_chain(5), "4"), &lim);
  for (uint32_t i = 0; i < 5; i++) assert_int_equal(g->nodes[i].depth, i + 1);
  assert_int_equal(g->limits.max_depth, 5);
  kex_graph_free(g);
  REFUSE2(graph_json(neg_chain(6), "5"), &lim, KEX_ELIMIT, "node 5 (NEG)",
          "dependency chain is 6 nodes deep, more than the limit of 5 (max_depth)");
  /* depth is the longest path, not the number of nodes: this graph of 7 nodes is 3 deep */
  g = ACCEPT(graph_json("{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4]},"
                        "{'op': 'EMPTY', 'dtype': 'float32', 'shape': [4]},"
                        "{'op': 'NEG', 'src': [0]}, {'op': 'ADD', 'src': [0, 1]}, {'op': 'CMPLT', 'src': [0, 1]},"
                        "{'op': 'WHERE', 'src': [4, 2, 3]}, {'op': 'ADD', 'src': [1, 0]}", "5, 6"), &lim);
  assert_int_equal(g->nodes[5].depth, 3);
  assert_int_equal(g->nodes[6].depth, 2);
  kex_graph_free(g);

  /* builder path, with the default limit: KEX_LIMIT_DEPTH deep accepted, one more refused */
  lim = KEX_LIMITS_DEFAULT;
  g = kex_graph_new(NULL);
  assert_non_null(g);
  int64_t four = 4;
  kex_gnode n = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = &four};
  kex_error err;
  int cur = kex_graph_add(g, &n, &lim, &err);
  for (uint32_t d = 2; d <= KEX_LIMIT_DEPTH; d++) {
    kex_gnode neg = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {(uint32_t)cur}};
    cur = kex_graph_add(g, &neg, &lim, &err);
    assert_true(cur >= 0);
  }
  assert_int_equal(g->nodes[cur].depth, KEX_LIMIT_DEPTH);
  kex_gnode neg = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {(uint32_t)cur}};
  assert_int_equal(kex_graph_add(g, &neg, &lim, &err), KEX_ELIMIT);
  char want[128];
  snprintf(want, sizeof want, "node %u (NEG): its dependency chain is %u nodes deep, more than the limit of %u",
           (unsigned)KEX_LIMIT_DEPTH, (unsigned)KEX_LIMIT_DEPTH + 1, (unsigned)KEX_LIMIT_DEPTH);
  if (!strstr(err.msg, want)) fail_msg("%s", err.msg);
  assert_int_equal(g->nnodes, KEX_LIMIT_DEPTH);
  /* a node that does not deepen the chain is still accepted */
  kex_gnode side = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {0}};
  assert_int_equal(kex_graph_add(g, &side, &lim, &err), KEX_LIMIT_DEPTH);
  kex_graph_free(g);
}

/* The graph keeps the limits it was loaded with (the scheduler's kernel limits come from there). */
static void test_limits_kept(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_kernel_depth = 7;
  lim.max_kernel_ops = 9;
  kex_graph *g = ACCEPT(graph_json(neg_chain(2), "1"), &lim);
  assert_int_equal(g->limits.max_kernel_depth, 7);
  assert_int_equal(g->limits.max_kernel_ops, 9);
  kex_graph_free(g);
  g = ACCEPT(graph_json(neg_chain(2), "1"), NULL);
  assert_int_equal(g->limits.max_kernel_depth, KEX_LIMIT_KERNEL_DEPTH);
  assert_int_equal(g->limits.max_kernel_ops, KEX_LIMIT_KERNEL_OPS);
  assert_int_equal(g->limits.max_depth, KEX_LIMIT_DEPTH);
  kex_graph_free(g);
  g = kex_graph_new(NULL);
  assert_non_null(g);
  assert_int_equal(g->limits.max_kernel_depth, KEX_LIMIT_KERNEL_DEPTH);
  int64_t four = 4;
  kex_gnode n = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = &four};
  kex_error err;
  assert_int_equal(kex_graph_add(g, &n, &lim, &err), 0);
  assert_int_equal(g->limits.max_kernel_depth, 7);
  kex_graph_free(g);
}

static void test_limit_inline_bytes(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_inline_bytes = 16;
  const char *b8 = "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2], 'data': 'AAAAAAAAAAA='}";
  const char *b4 = "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [1], 'data': 'AAAAAA=='}";
  char nodes[1024];
  snprintf(nodes, sizeof nodes, "%s, %s", b8, b8);
  kex_graph *g = ACCEPT(graph_json(nodes, "0"), &lim);
  assert_int_equal(g->inline_bytes, 16);
  kex_graph_free(g);
  snprintf(nodes, sizeof nodes, "%s, %s, %s", b8, b8, b4);
  REFUSE2(graph_json(nodes, "0"), &lim, KEX_ELIMIT, "node 2 (BUFFER)", "limit of 16 bytes");
  /* generated data does not count */
  snprintf(nodes, sizeof nodes, "%s, %s, {'op': 'BUFFER', 'dtype': 'float32', 'shape': [64], 'fill': {'random': 1}}", b8, b8);
  ACCEPT_FREE(graph_json(nodes, "0"), &lim);
}

static void test_limit_buffer_bytes(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_buffer_bytes = 32;
  ACCEPT_FREE(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [8], 'fill': {'arange': true}}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'BUFFER', 'dtype': 'float32', 'shape': [9], 'fill': {'arange': true}}", "0"), &lim,
          KEX_ELIMIT, "node 0 (BUFFER)", "32 bytes");
  ACCEPT_FREE(graph_json("{'op': 'BUFFER', 'dtype': 'float64', 'shape': [4], 'buffer': 'h'}", "0"), &lim);
  REFUSE(graph_json("{'op': 'BUFFER', 'dtype': 'float64', 'shape': [5], 'buffer': 'h'}", "0"), &lim, KEX_ELIMIT,
         "node 0 (BUFFER)");
  /* an EMPTY becomes a buffer of the same size; a CONST does not */
  ACCEPT_FREE(graph_json("{'op': 'EMPTY', 'dtype': 'int32', 'shape': [2, 4]}", "0"), &lim);
  REFUSE2(graph_json("{'op': 'EMPTY', 'dtype': 'int32', 'shape': [3, 3]}", "0"), &lim, KEX_ELIMIT, "node 0 (EMPTY)",
          "32 bytes");
  ACCEPT_FREE(graph_json("{'op': 'CONST', 'dtype': 'int32', 'shape': [3, 3], 'value': 1}", "0"), &lim);
  assert_int_equal(kex_err_grpc_status(KEX_ELIMIT), KEX_GRPC_RESOURCE_EXHAUSTED);
  assert_int_equal(kex_err_grpc_status(KEX_EINVAL), KEX_GRPC_INVALID_ARGUMENT);
}

static void test_limit_outputs(void **state) {
  (void)state;
  kex_limits lim = KEX_LIMITS_DEFAULT;
  lim.max_outputs = 2;
  ACCEPT_FREE(graph_json(n_nodes(3), "0, 1"), &lim);
  REFUSE2(graph_json(n_nodes(3), "0, 1, 2"), &lim, KEX_ELIMIT, "output node 2", "limit of 2 outputs");
}

/* ---- builder ---- */

static void test_builder(void **state) {
  (void)state;
  kex_graph *g = kex_graph_new("CLANG");
  assert_non_null(g);
  assert_string_equal(g->device, "CLANG");
  kex_error err;
  int64_t shape[2] = {2, 2};
  uint8_t bytes[16];
  for (int i = 0; i < 16; i++) bytes[i] = (uint8_t)i;
  kex_gnode b = {.op = KEX_GOP_BUFFER, .dtype = KEX_DT_FLOAT32, .ndim = 2, .shape = shape, .bufsrc = KEX_BUF_DATA,
                 .data = bytes, .data_len = 16};
  assert_int_equal(kex_graph_add(g, &b, NULL, &err), 0);
  bytes[0] = 99;
  shape[0] = 7; /* the graph holds copies */
  assert_int_equal(g->nodes[0].data[0], 0);
  assert_int_equal(g->nodes[0].shape[0], 2);
  b.data_len = 15;
  shape[0] = 2;
  assert_int_equal(kex_graph_add(g, &b, NULL, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "node 1 (BUFFER)"));
  kex_gnode c = {.op = KEX_GOP_CONST, .dtype = KEX_DT_INT32, .ndim = 2, .shape = shape, .value = kex_const_float(-3.9)};
  assert_int_equal(kex_graph_add(g, &c, NULL, &err), 1);
  assert_int_equal(g->nodes[1].value.kind, KEX_CONST_INT);
  assert_int_equal(g->nodes[1].value.i, -3);
  kex_gnode cast = {.op = KEX_GOP_CAST, .nsrc = 1, .src = {1}, .dtype = KEX_DT_FLOAT32};
  assert_int_equal(kex_graph_add(g, &cast, NULL, &err), 2);
  kex_gnode mul = {.op = KEX_GOP_MUL, .nsrc = 2, .src = {0, 2}};
  assert_int_equal(kex_graph_add(g, &mul, NULL, &err), 3);
  assert_int_equal(g->nodes[3].dtype, KEX_DT_FLOAT32);
  kex_gnode bad = {.op = KEX_GOP_MUL, .nsrc = 2, .src = {0, 1}};
  assert_int_equal(kex_graph_add(g, &bad, NULL, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "node 4 (MUL)"));
  kex_gnode fwd = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {4}};
  assert_int_equal(kex_graph_add(g, &fwd, NULL, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "node 4 (NEG)"));
  kex_gnode unk = {.op = (kex_gop)KEX_GOP_COUNT};
  assert_int_equal(kex_graph_add(g, &unk, NULL, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "node 4"));
  kex_gnode badt = {.op = KEX_GOP_EMPTY, .dtype = (kex_dtype)KEX_DT_COUNT, .ndim = 2, .shape = shape};
  assert_int_equal(kex_graph_add(g, &badt, NULL, &err), KEX_EINVAL);
  kex_gnode copy = {.op = KEX_GOP_COPY, .nsrc = 1, .src = {3}};
  assert_int_equal(kex_graph_add(g, &copy, NULL, &err), KEX_EINVAL);
  copy.device = "GPU";
  assert_int_equal(kex_graph_add(g, &copy, NULL, &err), 4);
  assert_string_equal(g->nodes[4].device, "GPU");
  assert_int_equal(kex_graph_add_output(g, 4, NULL, &err), 0);
  assert_int_equal(kex_graph_add_output(g, 5, NULL, &err), KEX_EINVAL);
  assert_int_equal(g->nnodes, 5);
  assert_int_equal(g->noutputs, 1);
  kex_graph_free(g);
}

/* ---- case files ---- */

static const char *cases_dir(void) {
  const char *d = getenv("KEX_CASES_DIR");
  return d ? d : "../shared/cases";
}

/* Load one graph object (a jansson value) through the text loader and check it against the JSON. */
static void load_graph_value(const char *name, const char *which, json_t *gv) {
  char *text = json_dumps(gv, JSON_COMPACT);
  assert_non_null(text);
  kex_graph *g = NULL;
  kex_error err;
  int rc = load_text(text, NULL, &g, &err);
  if (rc != 0) {
    print_error("case %s (%s): %d %s\n", name, which, rc, err.msg);
    fail();
  }
  json_t *nodes = json_object_get(gv, "nodes");
  assert_int_equal(g->nnodes, json_array_size(nodes));
  assert_int_equal(g->noutputs, json_array_size(json_object_get(gv, "outputs")));
  for (uint32_t i = 0; i < g->nnodes; i++) {
    const kex_gnode *n = &g->nodes[i];
    int64_t prod = 1;
    for (uint32_t d = 0; d < n->ndim; d++) prod *= n->shape[d];
    if (n->op == KEX_GOP_BUFFER && n->bufsrc == KEX_BUF_DATA)
      assert_int_equal(n->data_len, prod * kex_dtype_size(n->dtype));
  }
  kex_graph_free(g);
  free(text);
}

static void test_all_cases(void **state) {
  (void)state;
  char path[4096];
  json_error_t jerr;
  snprintf(path, sizeof path, "%s/INDEX.json", cases_dir());
  json_t *index = json_load_file(path, 0, &jerr);
  if (!index) {
    print_error("%s: %s\n", path, jerr.text);
    fail();
  }
  assert_true(json_array_size(index) > 0);
  size_t loaded = 0;
  for (size_t i = 0; i < json_array_size(index); i++) {
    const char *name = json_string_value(json_array_get(index, i));
    assert_non_null(name);
    snprintf(path, sizeof path, "%s/%s.json", cases_dir(), name);
    /* the file loader itself (it unwraps "graph") */
    kex_graph *g = NULL;
    kex_error err;
    int rc = kex_graph_from_json_file(path, NULL, &g, &err);
    if (rc != 0) {
      print_error("case %s: %d %s\n", name, rc, err.msg);
      fail();
    }
    kex_graph_free(g);
    json_t *c = json_load_file(path, 0, &jerr);
    assert_non_null(c);
    load_graph_value(name, "graph", json_object_get(c, "graph"));
    loaded++;
    json_t *num = json_object_get(c, "numeric");
    if (num && !json_is_null(num)) {
      load_graph_value(name, "numeric.graph", json_object_get(num, "graph"));
      loaded++;
    }
    json_decref(c);
  }
  assert_true(loaded >= json_array_size(index));
  json_decref(index);
}

static void test_file_errors(void **state) {
  (void)state;
  kex_graph *g = (kex_graph *)1;
  kex_error err;
  assert_int_equal(kex_graph_from_json_file("/nonexistent/graph.json", NULL, &g, &err), KEX_EIO);
  assert_null(g);
  assert_non_null(strstr(err.msg, "/nonexistent/graph.json"));
}

/* ---- out of memory ---- */

/* Read a whole file into a malloc'd string (not through kex_malloc, so the hook does not count it). */
static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return s;
}

static void oom_loop(const char *text, size_t len) {
  unsigned long n;
  for (n = 1;; n++) {
    kex_graph *g = (kex_graph *)1;
    kex_error err = {0};
    kex_alloc_fail_at(n, 1);
    int rc = kex_graph_from_json(text, len, NULL, &g, &err);
    kex_alloc_fail_at(0, 0);
    if (rc == 0) {
      assert_non_null(g);
      kex_graph_free(g);
      break;
    }
    if (rc != KEX_ENOMEM) {
      print_error("allocation %lu failing gave %d (%s): %s\n", n, rc, kex_errname(rc), err.msg);
      fail();
    }
    assert_null(g);
    assert_true(n < 1000000);
  }
  assert_true(n > 3); /* the load allocates (jansson + graph), so the loop really failed some */
}

static void test_oom_case_file(void **state) {
  (void)state;
  char path[4096];
  const char *names[] = {"basic_binop_fusion", "extra_layernorm", "assign_contiguous_permute"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    size_t len;
    snprintf(path, sizeof path, "%s/%s.json", cases_dir(), names[i]);
    char *text = read_text(path, &len);
    oom_loop(text, len);
    free(text);
  }
}

static void test_oom_all_ops(void **state) {
  (void)state;
  const char *text = graph_json(
      "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2, 2], 'data': 'AAAAAAAAAAAAAAAAAAAAAA=='},"
      "{'op': 'BUFFER', 'dtype': 'float32', 'shape': [2, 2], 'buffer': 'held'},"
      "{'op': 'CONST', 'dtype': 'float32', 'shape': [], 'value': 'inf', 'device': 'CLANG'},"
      "{'op': 'RESHAPE', 'src': [2], 'arg': [1, 1]}, {'op': 'EXPAND', 'src': [3], 'arg': [2, 2]},"
      "{'op': 'ADD', 'src': [0, 4]}, {'op': 'PERMUTE', 'src': [5], 'arg': [1, 0]},"
      "{'op': 'PAD', 'src': [6], 'arg': [[1, 1], [0, 0]]}, {'op': 'SHRINK', 'src': [7], 'arg': [[1, 3], [0, 2]]},"
      "{'op': 'STRIDE', 'src': [8], 'arg': [1, -1]}, {'op': 'REDUCE_SUM', 'src': [9], 'axis': [0]},"
      "{'op': 'CONTIGUOUS', 'src': [10]}, {'op': 'EXPAND', 'src': [11], 'arg': [2, 2]},"
      "{'op': 'ASSIGN', 'src': [12, 1]}, {'op': 'COPY', 'src': [13], 'device': 'GPU'}",
      "13, 14");
  char *copy = strdup(text);
  assert_non_null(copy);
  ACCEPT_FREE(copy, NULL);
  oom_loop(copy, strlen(copy));
  free(copy);
}

static void test_oom_builder(void **state) {
  (void)state;
  unsigned long n;
  int64_t shape[1] = {4};
  for (n = 1;; n++) {
    kex_error err;
    int rc = 0;
    kex_alloc_fail_at(n, 1);
    kex_graph *g = kex_graph_new(NULL);
    if (!g) rc = KEX_ENOMEM;
    for (int i = 0; g && rc >= 0 && i < 40; i++) {
      kex_gnode e = {.op = KEX_GOP_EMPTY, .dtype = KEX_DT_FLOAT32, .ndim = 1, .shape = shape};
      kex_gnode neg = {.op = KEX_GOP_NEG, .nsrc = 1, .src = {(uint32_t)(i ? i - 1 : 0)}};
      rc = kex_graph_add(g, i ? &neg : &e, NULL, &err);
      if (rc >= 0 && i % 2) rc = kex_graph_add_output(g, (uint32_t)i, NULL, &err);
    }
    kex_alloc_fail_at(0, 0);
    if (g && rc >= 0) assert_int_equal(g->nnodes, 40);
    kex_graph_free(g);
    if (rc >= 0) break;
    assert_int_equal(rc, KEX_ENOMEM);
  }
  assert_true(n > 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gop_names),
      cmocka_unit_test(test_format_example),
      cmocka_unit_test(test_reshape_element_count),
      cmocka_unit_test(test_expand),
      cmocka_unit_test(test_permute),
      cmocka_unit_test(test_pad),
      cmocka_unit_test(test_shrink),
      cmocka_unit_test(test_stride),
      cmocka_unit_test(test_reduce_axis),
      cmocka_unit_test(test_elementwise_shapes),
      cmocka_unit_test(test_elementwise_dtypes),
      cmocka_unit_test(test_where),
      cmocka_unit_test(test_cast_bitcast),
      cmocka_unit_test(test_const_values),
      cmocka_unit_test(test_inline_data_length),
      cmocka_unit_test(test_base64_strict),
      cmocka_unit_test(test_buffer_sources),
      cmocka_unit_test(test_shape_negative),
      cmocka_unit_test(test_source_index),
      cmocka_unit_test(test_source_count),
      cmocka_unit_test(test_unknown_op_dtype),
      cmocka_unit_test(test_missing_fields),
      cmocka_unit_test(test_wrong_json_types),
      cmocka_unit_test(test_unexpected_fields),
      cmocka_unit_test(test_format_field),
      cmocka_unit_test(test_malformed_json),
      cmocka_unit_test(test_graph_wrapper),
      cmocka_unit_test(test_outputs),
      cmocka_unit_test(test_assign_target),
      cmocka_unit_test(test_limit_nodes),
      cmocka_unit_test(test_limit_dims),
      cmocka_unit_test(test_limit_elements),
      cmocka_unit_test(test_limit_elements_zero_dims),
      cmocka_unit_test(test_limit_stride),
      cmocka_unit_test(test_limit_depth),
      cmocka_unit_test(test_limits_kept),
      cmocka_unit_test(test_limit_inline_bytes),
      cmocka_unit_test(test_limit_buffer_bytes),
      cmocka_unit_test(test_limit_outputs),
      cmocka_unit_test(test_builder),
      cmocka_unit_test(test_all_cases),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_oom_case_file),
      cmocka_unit_test(test_oom_all_ops),
      cmocka_unit_test(test_oom_builder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

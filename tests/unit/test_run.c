/*
 * test_run.c - kex_run_graph, the in-process `kex run` pipeline, end to end:
 * every `numeric` case of ../shared/cases/ on the opencl device (PoCL here)
 * and on the cpu device, with the device's own scheduling rules (cpu: CLANG's
 * buffer views) and the memory planner's shared buffers, compared with
 * tinygrad's outputs at the case's tolerances.  Also fill specs, .npy output,
 * and a compile failure that names the kernel (through the fault device).
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "realize/run.h"
#include "sample.h"

typedef struct run_case {
  char name[128];
  char path[600];
  bool cpu;
} run_case;

static kex_device *devs[2];
static char dev_skip[2][600];

static const char *cases_dir(void) {
  const char *d = getenv("KEX_CASES_DIR");
  return d ? d : "../shared/cases";
}

static size_t unb64(const char *s, unsigned char *out) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t n = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (; *s && *s != '='; s++) {
    const char *p = strchr(tab, *s);
    if (!p) continue;
    acc = acc << 6 | (uint32_t)(p - tab);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[n++] = (unsigned char)(acc >> bits);
    }
  }
  return n;
}

static void test_numeric_case(void **state) {
  const run_case *c = *state;
  int d = c->cpu;
  if (!devs[d]) {
    printf("skipped: %s\n", dev_skip[d]);
    skip();
  }
  json_t *root = json_load_file(c->path, 0, NULL);
  assert_non_null(root);
  json_t *num = json_object_get(root, "numeric");
  char *text = json_dumps(json_object_get(num, "graph"), JSON_COMPACT);
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  assert_int_equal(kex_graph_from_json(text, strlen(text), &lim, &g, &err), 0);
  free(text);
  for (uint32_t i = 0; i < g->nnodes; i++)
    if (kex_device_check_dtype(devs[d], g->nodes[i].dtype, &err)) {
      printf("skipped: %s\n", err.msg);
      kex_graph_free(g);
      json_decref(root);
      skip();
    }
  kex_run_opts ro = {1, false};
  kex_run_result res;
  int rc = kex_run_graph(g, devs[d], &ro, &res, &err);
  if (rc) fail_msg("%s on %s: %s", c->name, d ? "cpu" : "opencl", err.msg);
  double rtol = json_number_value(json_object_get(num, "rtol")), atol = json_number_value(json_object_get(num, "atol"));
  json_t *exp = json_object_get(num, "expected");
  assert_int_equal(res.noutputs, json_array_size(exp));
  int bad = 0;
  for (uint32_t o = 0; o < res.noutputs; o++) {
    json_t *e = json_array_get(exp, o);
    const char *b64 = json_string_value(json_object_get(e, "data"));
    unsigned char *want = malloc(strlen(b64) + 4);
    size_t wn = unb64(b64, want);
    kex_dtype dt = (kex_dtype)kex_dtype_from_name(json_string_value(json_object_get(e, "dtype")));
    assert_int_equal(res.outputs[o].dtype, dt);
    assert_int_equal(res.outputs[o].nbytes, wn);
    for (size_t i = 0; i < wn / (size_t)kex_dtype_size(dt); i++) {
      double gv = kex_dtype_element(dt, res.outputs[o].data, i), wv = kex_dtype_element(dt, want, i);
      bool ok = kex_dtype_is_float(dt) ? (isnan(gv) && isnan(wv)) || gv == wv || fabs(gv - wv) <= atol + rtol * fabs(wv)
                                       : gv == wv;
      if (!ok && bad++ < 5) printf("  output %u [%zu]: got %.9g, want %.9g\n", o, i, gv, wv);
    }
    free(want);
  }
  kex_run_result_free(&res);
  kex_graph_free(g);
  json_decref(root);
  if (bad) fail_msg("%s on %s: %d values out of tolerance", c->name, d ? "cpu" : "opencl", bad);
}

/* fill specs are deterministic, typed and in range; .npy has numpy's header */
static void test_fill_and_npy(void **state) {
  (void)state;
  const char *json = "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[64],\"fill\":{\"random\":3}},"
                     "{\"op\":\"BUFFER\",\"dtype\":\"int32\",\"shape\":[64],\"fill\":{\"arange\":true}},"
                     "{\"op\":\"CAST\",\"src\":[1],\"dtype\":\"float32\"},{\"op\":\"ADD\",\"src\":[0,2]}],\"outputs\":[3]}";
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err;
  kex_graph *g = NULL;
  assert_int_equal(kex_graph_from_json(json, strlen(json), &lim, &g, &err), 0);
  kex_device *dev = devs[1] ? devs[1] : devs[0]; /* the fills are the host's: any device */
  if (!dev) { printf("skipped: %s; %s\n", dev_skip[0], dev_skip[1]); skip(); }
  kex_run_opts ro = {3, true};
  kex_run_result a, b;
  assert_int_equal(kex_run_graph(g, dev, &ro, &a, &err), 0);
  assert_int_equal(kex_run_graph(g, dev, &ro, &b, &err), 0);
  assert_int_equal(a.nkernels, 1);
  assert_non_null(a.kernels[0].source);
  assert_true(a.kernels[0].us > 0);
  assert_memory_equal(a.outputs[0].data, b.outputs[0].data, a.outputs[0].nbytes);
  for (int i = 0; i < 64; i++) {
    double v = kex_dtype_element(KEX_DT_FLOAT32, a.outputs[0].data, (size_t)i) - i;
    assert_true(v >= 0 && v < 1);
  }
  char dir[] = "/tmp/kex-npy-XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/out0.npy", dir);
  assert_int_equal(kex_write_npy(path, KEX_DT_FLOAT32, 1, a.outputs[0].shape, a.outputs[0].data, &err), 0);
  FILE *f = fopen(path, "rb");
  char head[128] = {0};
  assert_true(fread(head, 1, sizeof head, f) == sizeof head);
  fseek(f, 0, SEEK_END);
  assert_int_equal(ftell(f) % 64, (64 * 4) % 64); /* header padded to 64 bytes */
  fclose(f);
  assert_memory_equal(head, "\x93NUMPY\x01\x00", 8);
  assert_non_null(strstr(head + 10, "'descr': '<f4', 'fortran_order': False, 'shape': (64,)"));
  unlink(path);
  rmdir(dir);
  kex_run_result_free(&a);
  kex_run_result_free(&b);
  kex_graph_free(g);
}

/* a failing compile comes back as an error naming the kernel, and nothing leaks */
static void test_fault_names_kernel(void **state) {
  (void)state;
  const char *json = "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[8],\"fill\":{\"value\":1}},"
                     "{\"op\":\"EXP2\",\"src\":[0]}],\"outputs\":[1]}";
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  if (!devs[1]) { printf("skipped: %s\n", dev_skip[1]); skip(); }
  assert_int_equal(kex_graph_from_json(json, strlen(json), &lim, &g, &err), 0);
  kex_fault_kind kinds[] = {KEX_FAULT_ALLOC, KEX_FAULT_COMPILE, KEX_FAULT_LAUNCH, KEX_FAULT_COPY};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    kex_device *fd = NULL;
    assert_int_equal(kex_fault_device_new(devs[1], kinds[k], 1, &fd), 0);
    kex_run_opts ro = {1, false};
    kex_run_result res;
    int rc = kex_run_graph(g, fd, &ro, &res, &err);
    assert_int_equal(rc, KEX_EDEVICE);
    if (kinds[k] == KEX_FAULT_COMPILE || kinds[k] == KEX_FAULT_LAUNCH) assert_non_null(strstr(err.msg, "kernel 0 (E_2_4)"));
    assert_non_null(strstr(err.msg, "injected failure"));
    kex_device_unref(fd);
  }
  kex_graph_free(g);
}

int main(void) {
  kex_test_device_open("opencl", &devs[0], dev_skip[0], sizeof dev_skip[0]);
  kex_test_device_open("cpu", &devs[1], dev_skip[1], sizeof dev_skip[1]);
  char index[600];
  snprintf(index, sizeof index, "%s/INDEX.json", cases_dir());
  json_t *names = json_load_file(index, 0, NULL);
  size_t n = json_array_size(names), nt = 0;
  run_case *rc = calloc(2 * n + 1, sizeof *rc);
  struct CMUnitTest *tests = calloc(2 * n + 3, sizeof *tests);
  for (size_t i = 0; i < n; i++) {
    const char *name = json_string_value(json_array_get(names, i));
    char path[600];
    snprintf(path, sizeof path, "%s/%s.json", cases_dir(), name);
    json_t *c = json_load_file(path, 0, NULL);
    bool numeric = json_is_object(json_object_get(c, "numeric"));
    json_decref(c);
    if (!numeric) continue;
    for (int d = 0; d < 2; d++) {
      if (!kex_test_sampled(2 * i + (size_t)d)) continue;
      run_case *r = &rc[nt];
      snprintf(r->name, sizeof r->name, "%s_%s", name, d ? "cpu" : "opencl");
      snprintf(r->path, sizeof r->path, "%s", path);
      r->cpu = d;
      tests[nt++] = (struct CMUnitTest){r->name, test_numeric_case, NULL, NULL, r};
    }
  }
  tests[nt++] = (struct CMUnitTest){"fill_and_npy", test_fill_and_npy, NULL, NULL, NULL};
  tests[nt++] = (struct CMUnitTest){"fault_names_kernel", test_fault_names_kernel, NULL, NULL, NULL};
  int fails = _cmocka_run_group_tests("run", tests, nt, NULL, NULL);
  free(tests);
  free(rc);
  json_decref(names);
  kex_device_unref(devs[0]);
  kex_device_unref(devs[1]);
  return fails;
}

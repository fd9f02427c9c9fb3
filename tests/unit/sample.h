/*
 * sample.h - which entries of a table-driven test run in this build.
 *
 * The normal build runs every case, op and dtype.  The ASan+UBSan build runs
 * the same tests again to find memory and UB errors in kex's own code; for
 * that a fixed slice is enough, and running everything twice would take the
 * suite past its time budget.  meson sets KEX_TEST_SAMPLE=N for the sanitize
 * build: entry i runs when i % N == 0 (deterministic, so a failure replays).
 * Unset or 1: everything runs.
 *
 * KEX_TEST_DEVICES (a comma-separated list of device kinds, e.g. "opencl")
 * leaves the other devices' entries out: bench/gpu.sh sets it on a GPU
 * machine, where the cpu entries would only test that machine's compiler.
 */
#ifndef KEX_TESTS_SAMPLE_H
#define KEX_TESTS_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "devices/device.h"

static inline size_t kex_test_sample_stride(void) {
  const char *s = getenv("KEX_TEST_SAMPLE");
  long n = s ? strtol(s, NULL, 10) : 1;
  return n > 1 ? (size_t)n : 1;
}

/* Does entry i of a table run?  The first call prints which slice runs. */
static inline bool kex_test_sampled(size_t i) {
  static int said;
  size_t n = kex_test_sample_stride();
  if (n > 1 && !said) {
    said = 1;
    printf("KEX_TEST_SAMPLE=%zu: 1 in %zu table entries runs in this build (the normal build runs all)\n", n, n);
  }
  return i % n == 0;
}

/* Does KEX_TEST_DEVICES (unset: every device) list device kind KIND? */
static inline bool kex_test_device_wanted(const char *kind) {
  const char *want = getenv("KEX_TEST_DEVICES");
  if (!want || !*want) return true;
  size_t len = strlen(kind);
  for (const char *p = want; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
    if (strcspn(p, ",") == len && !strncmp(p, kind, len)) return true;
  return false;
}

/* Open device KIND (a test's devs[] slot) unless KEX_TEST_DEVICES leaves it
 * out.  On failure or when left out, *dev is NULL and why (size n) says so. */
static inline void kex_test_device_open(const char *kind, kex_device **dev, char *why, size_t n) {
  *dev = NULL;
  if (!kex_test_device_wanted(kind)) {
    snprintf(why, n, "%s: not in KEX_TEST_DEVICES=%s", kind, getenv("KEX_TEST_DEVICES"));
    return;
  }
  kex_error err = {0};
  if (kex_device_open(kind, dev, &err)) snprintf(why, n, "%s: %s", kind, err.msg);
}

#endif

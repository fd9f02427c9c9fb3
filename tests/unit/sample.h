/*
 * sample.h - which entries of a table-driven test run in this build.
 *
 * The normal build runs every case, op and dtype.  The ASan+UBSan build runs
 * the same tests again to find memory and UB errors in kex's own code; for
 * that a fixed slice is enough, and running everything twice would take the
 * suite past its time budget.  meson sets KEX_TEST_SAMPLE=N for the sanitize
 * build: entry i runs when i % N == 0 (deterministic, so a failure replays).
 * Unset or 1: everything runs.
 */
#ifndef KEX_TESTS_SAMPLE_H
#define KEX_TESTS_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif

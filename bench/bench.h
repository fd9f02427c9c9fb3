/*
 * bench.h - the few helpers every bench/ program shares: a monotonic clock
 * in microseconds, the machine's load average (recorded beside each result,
 * since timings on a busy machine mean little) and a qsort comparator for
 * medians.  Header-only: each benchmark is its own executable.
 */
#ifndef KEX_BENCH_BENCH_H
#define KEX_BENCH_BENCH_H

#include <stdio.h>
#include <time.h>

static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* /proc/loadavg's first three fields ("0.52 0.61 0.70"), or "unknown". */
static inline void loadavg(char *buf, size_t len) {
  FILE *f = fopen("/proc/loadavg", "r");
  double a = 0, b = 0, c = 0;
  if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(buf, len, "%.2f %.2f %.2f", a, b, c);
  else snprintf(buf, len, "unknown");
  if (f) fclose(f);
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#endif

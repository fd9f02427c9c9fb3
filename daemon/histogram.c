/*
 * histogram.c - the histogram of seconds (histogram.h).
 */
#include "daemon/histogram.h"

const double kexd_histogram_le[KEXD_METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5,   1,      2.5,   5,    10,    30,    60};

void kexd_histogram_observe(kexd_histogram *h, double v) {
  int i = 0;
  while (i < KEXD_METRICS_BUCKETS && !(v <= kexd_histogram_le[i])) i++;
  h->buckets[i]++;
  h->count++;
  h->sum += v;
}

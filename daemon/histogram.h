/*
 * histogram.h - a Prometheus histogram of seconds (submission time, queue
 * wait): fixed buckets, kept per bucket and made cumulative only when
 * metrics.c formats it.  Its own file so that the counters' owners
 * (dispatch, Submit) do not depend on the metrics endpoint.
 */
#ifndef KEX_DAEMON_HISTOGRAM_H
#define KEX_DAEMON_HISTOGRAM_H

#include <stdint.h>

#define KEXD_METRICS_BUCKETS 15          /* finite buckets of a histogram (submission seconds, queue wait) */

/* Upper bounds of the buckets, in seconds (+Inf is implicit). */
extern const double kexd_histogram_le[KEXD_METRICS_BUCKETS];

/* A Prometheus histogram kept on the loop thread (cumulative only when formatted). */
typedef struct kexd_histogram {
  uint64_t buckets[KEXD_METRICS_BUCKETS + 1]; /* per bucket, not cumulative; the last is +Inf */
  uint64_t count;
  double sum;
} kexd_histogram;

/* Add one observation (seconds).  Not thread-safe: the loop's, or a device runner's under its lock. */
void kexd_histogram_observe(kexd_histogram *h, double v);

#endif

/*
 * trace.h - a per-submission trace in Chrome's trace-event format.
 *
 * A kex_trace collects complete spans ("ph":"X": a name, a category, a
 * track, a start and a duration in microseconds) from any thread and turns
 * them into the JSON that chrome://tracing and Perfetto open:
 * {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
 * Each track (e.g. "daemon", "worker", "device opencl:0") becomes a thread of
 * one process, named by an "M" metadata event, in the order first used.
 *
 * A submission that did not ask for a trace has none: every function takes a
 * NULL trace and does nothing, so the pipeline calls them unconditionally and
 * pays one branch.  A trace is bounded: past KEX_TRACE_MAX_SPANS spans (or
 * KEX_TRACE_MAX_TRACKS tracks) further spans are counted in "dropped", not
 * stored.  Span names and details are copied.  Thread-safe (one mutex).
 */
#ifndef KEX_CORE_TRACE_H
#define KEX_CORE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define KEX_TRACE_MAX_SPANS 16384 /* ~2 MB of JSON: it travels in one gRPC message */
#define KEX_TRACE_MAX_TRACKS 64

typedef struct kex_trace kex_trace;

/* A new empty trace whose time zero is now; NULL when out of memory. */
kex_trace *kex_trace_create(void);
void kex_trace_free(kex_trace *t);

/* Microseconds on the monotonic clock (the clock every span uses). */
uint64_t kex_trace_now_us(void);

/*
 * Record the span [start_us, end_us) (kex_trace_now_us values) named `name`
 * in category `cat` on track `track`; `detail` (may be NULL) goes into the
 * event's args as {"detail": ...}.  Strings are copied; end before start is
 * taken as a zero-length span.  No-op when t is NULL.
 */
void kex_trace_span(kex_trace *t, const char *track, const char *cat, const char *name, const char *detail,
                    uint64_t start_us, uint64_t end_us);

/* How many spans were stored and how many were dropped over the limits. */
void kex_trace_counts(const kex_trace *t, size_t *stored, size_t *dropped);

/*
 * The trace as a NUL-terminated JSON document (sorted by start time), with
 * `otherData` holding `label` (may be NULL) and the dropped count.  The
 * caller frees it with free(); NULL when out of memory or t is NULL.
 */
char *kex_trace_json(kex_trace *t, const char *label);

#endif

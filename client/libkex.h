/*
 * libkex.h - the C client library of kexd.
 *
 * One kex_client is one gRPC channel to one kexd, or to a fleet of kexds
 * (kex_client_connect).  Every call is synchronous, takes its own
 * completion queue and may run on any thread at the same time as the
 * others (the channels are shared, calls are not).
 *
 * Errors: every fallible function returns 0 or a negative KEX_E* code
 * (core/errors.h) and, when `st` is not NULL, fills *st with the code, the
 * gRPC status the call ended with and the server's message (or, for errors
 * found in the client, a message naming what was wrong).  gRPC statuses map
 * back to kex codes with kex_code_from_grpc().
 *
 * Graphs are passed as kex.graph.v1 JSON text (shared/graph-format.md), either
 * the bare graph object or an object with the graph under "graph" (the form
 * of the test cases); libkex converts them to the protobuf Graph.
 *
 * Ownership: strings passed in are borrowed for the duration of the call.
 * Results are allocated by the library and released with the matching
 * *_free function; fixed-size outputs (tokens, handles) are written into
 * caller buffers of KEX_TOKEN_MAX bytes.
 */
#ifndef KEX_LIBKEX_H
#define KEX_LIBKEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KEX_TOKEN_MAX 128        /* bytes of a job token or buffer handle, NUL included */
#define KEX_CLIENT_DIMS_MAX 16   /* dims of a buffer's shape */
#define KEX_UPLOAD_CHUNK (1u << 20) /* bytes per Upload message */

/* Outcome of a call: kex code, gRPC status and message. */
typedef struct kex_status {
  int code;                     /* 0 or a KEX_E* code */
  int grpc;                     /* gRPC status code (0 = OK); 0 for errors found in the client */
  char msg[KEX_ERROR_MSG_MAX];  /* server's message, or the client's */
} kex_status;

/* How to connect.  Zero-initialize and set what you need. */
typedef struct kex_client_opts {
  const char *token;            /* sent as "authorization: Bearer TOKEN" on every call (NULL = none) */
  bool tls;                     /* TLS (system roots unless root_certs is set) */
  const char *root_certs;       /* PEM file of root certificates; implies tls */
  double timeout_s;             /* deadline of each unary call; 0 = 60 s */
  int max_message;              /* largest message either way; 0 = 64 MiB */
  const char *client_cert;      /* PEM file of this client's certificate chain, for a kexd that requires
                                   client certificates (mutual TLS); needs client_key; implies tls */
  const char *client_key;       /* PEM file of client_cert's private key */
} kex_client_opts;

typedef struct kex_client kex_client;

/* The kex code a gRPC status code maps back to (0 for OK). */
int kex_code_from_grpc(int grpc_status);

/* Name of a gRPC status code ("NOT_FOUND"), "UNKNOWN" for unknown codes. */
const char *kex_grpc_status_name(int grpc_status);

/*
 * Connect to kexd at addr ("host:port" or "unix:/path").  opts may be NULL.
 * The channel connects lazily: an unreachable server shows up as
 * KEX_EUNAVAILABLE on the first call.
 *
 * A fleet: addr "ip:port,ip:port,..." (at most 64, all IPv4 or all IPv6 as
 * "[v6]:port") or "dns:///name:port".  Calls without a job (kex_job_open,
 * health, devices, stats and cache calls with no job) go through one
 * channel with gRPC's round_robin policy, so new jobs spread over the live
 * nodes (a list starts at a random item).  Every call of a job goes to the
 * node its token names ("HEX.NAME@ADDR", kexd --node-name/--advertise),
 * over a channel made at the job's first call; with a list, ADDR must be
 * one of its items (else KEX_EINVAL before anything is sent).  When that
 * node is gone the call is KEX_EUNAVAILABLE with "node NAME at ADDR is
 * unavailable" in the message.  TLS and the token apply to every channel
 * (a list's round-robin channel checks the first item's host).
 *
 * On success *out is a client the caller owns (kex_client_close); on error
 * *out is NULL.  Returns 0, KEX_EINVAL (bad address, or a list that is not
 * IP:PORT items; unreadable root_certs, client_cert or client_key; only
 * one of client_cert and client_key), KEX_ENOMEM.
 */
int kex_client_connect(const char *addr, const kex_client_opts *opts, kex_client **out, kex_status *st);

/* Close the channel and free the client (NULL is a no-op).  No call may be in flight. */
void kex_client_close(kex_client *c);

/*
 * Open a job.  weight 0 means 1; memory_limit 0 means no limit.  The token is
 * written to job (KEX_TOKEN_MAX bytes); *lease_s (may be NULL) receives the
 * lease in seconds.  Returns 0 or the call's error.
 */
int kex_job_open(kex_client *c, const char *name, uint32_t weight, uint64_t memory_limit, char job[KEX_TOKEN_MAX],
                 uint32_t *lease_s, kex_status *st);

/* Close a job: its buffers are freed.  NOT_FOUND for an unknown token. */
int kex_job_close(kex_client *c, const char *job, kex_status *st);

/*
 * Upload nbytes bytes from data as a buffer of dtype and shape, streamed in
 * KEX_UPLOAD_CHUNK pieces.  device NULL or "" = the default device.  The
 * handle (held by the job) is written to handle.  data is borrowed.
 */
int kex_upload(kex_client *c, const char *job, const char *dtype, int ndim, const int64_t *shape, const void *data,
               size_t nbytes, const char *device, char handle[KEX_TOKEN_MAX], kex_status *st);

/*
 * Upload a .npy file (little-endian, C order) streamed from disk chunk by
 * chunk; dtype and shape come from its header.  KEX_EPARSE for a file that is
 * not a .npy kex can read, KEX_EIO when it cannot be read.
 */
int kex_upload_npy(kex_client *c, const char *job, const char *path, const char *device, char handle[KEX_TOKEN_MAX],
                   kex_status *st);

/* A buffer downloaded from kexd. */
typedef struct kex_array {
  char dtype[32];
  int ndim;
  int64_t shape[KEX_CLIENT_DIMS_MAX];
  void *data;                   /* nbytes bytes, owned by the struct */
  size_t nbytes;
} kex_array;

/* Download a buffer the job holds into *out (free with kex_array_free). */
int kex_download(kex_client *c, const char *job, const char *handle, kex_array *out, kex_status *st);

/* Release a kex_array's data (the struct itself is the caller's). */
void kex_array_free(kex_array *b);

/* Write b as a .npy file at path.  KEX_EIO, or KEX_EINVAL for a dtype numpy has no name for (bfloat16). */
int kex_array_write_npy(const kex_array *b, const char *path, kex_status *st);

/* Free n buffers of the job; *freed (may be NULL) receives how many were. */
int kex_free_buffers(kex_client *c, const char *job, const char *const *handles, size_t n, uint32_t *freed,
                     kex_status *st);

/* One schedule item of a plan. */
typedef struct kex_plan_item {
  char *kind;                   /* "kernel" or "loadop" */
  char *label;                  /* "kernel:1out", "LoadOps.EMPTY", ... */
  uint32_t *outputs, *inputs, *planned;
  size_t noutputs, ninputs, nplanned;
  char **ast;                   /* AST lines (postorder) */
  size_t nast;
} kex_plan_item;

/* The reply of Plan. */
typedef struct kex_plan {
  uint32_t kernels;
  double schedule_us;
  kex_plan_item *items;
  size_t nitems;
  uint32_t intermediate_buffers, planned_buffers;
  int64_t bytes_before, bytes_after;
  void *reply_;                 /* private: the decoded reply the items' strings and arrays point into */
} kex_plan;

/* Schedule a graph (JSON text) without running it.  *out is owned by the caller (kex_plan_free). */
int kex_plan_graph(kex_client *c, const char *job, const char *graph_json, kex_plan **out, kex_status *st);

void kex_plan_free(kex_plan *p);

/* Events of a Submit stream, in this order: accepted, scheduled, compiling/running per kernel. */
typedef enum kex_submit_event_kind {
  KEX_EVENT_ACCEPTED,
  KEX_EVENT_SCHEDULED,
  KEX_EVENT_COMPILING,
  KEX_EVENT_RUNNING,
} kex_submit_event_kind;

typedef struct kex_submit_event {
  kex_submit_event_kind kind;
  uint64_t submission;          /* ACCEPTED */
  uint32_t i, n;                /* COMPILING, RUNNING: kernel i of n */
  const char *kernel;           /* COMPILING, RUNNING: the kernel's name */
  const char *const *kernels;   /* SCHEDULED: the kernels, in order */
  size_t nkernels;
} kex_submit_event;

/* Called for each event on the calling thread; everything it points to lives only during the call. */
typedef void (*kex_submit_cb)(const kex_submit_event *ev, void *ud);

typedef struct kex_submit_opts {
  bool return_bytes;            /* send every output's bytes with the result */
  double timeout_s;             /* deadline of the whole submission; 0 = none */
  uint32_t beam_width;          /* > 0: BEAM-search each kernel */
  bool trace;                   /* the server records a trace: kex_result.trace_json */
} kex_submit_opts;

typedef struct kex_output {
  char handle[KEX_TOKEN_MAX];   /* held by the job until freed */
  kex_array buf;               /* dtype, shape; data only with return_bytes */
  bool has_data;
} kex_output;

typedef struct kex_kernel_time {
  char *kernel;
  double compile_us, run_us;
} kex_kernel_time;

/* The done event of a submission. */
typedef struct kex_result {
  kex_output *outputs;
  size_t noutputs;
  kex_kernel_time *kernels;
  size_t nkernels;
  double total_us;
  char **kernel_opts; /* [nkernels]: each kernel's applied opts as `kex run` prints them ("" = none) */
  char *trace_json;   /* with kex_submit_opts.trace: Chrome trace-event JSON (Perfetto opens it); else NULL */
} kex_result;

/*
 * Submit a graph (JSON text): schedule, compile and run it.  cb (may be NULL)
 * sees each event as it arrives; the done event becomes *out (kex_result_free).
 * opts may be NULL.  A deadline that passes is KEX_EDEADLINE.  When this
 * returns an error, *out is NULL (events already delivered stay delivered).
 */
int kex_submit(kex_client *c, const char *job, const char *graph_json, const kex_submit_opts *opts, kex_submit_cb cb,
               void *ud, kex_result **out, kex_status *st);

void kex_result_free(kex_result *r);

typedef struct kex_remote_device {
  char *name, *kind, *vendor, *device_name, *driver_version;
  bool is_default, available;
} kex_remote_device;

/* The devices kexd can run kernels on; *out (n entries) is freed with kex_remote_devices_free. */
int kex_list_devices(kex_client *c, kex_remote_device **out, size_t *n, kex_status *st);

void kex_remote_devices_free(kex_remote_device *d, size_t n);

typedef struct kex_job_stats {
  char *name;
  uint32_t weight, buffers, queued, running;
  uint64_t memory_limit, bytes_held, items_done, bytes_reserved;
  double device_time_s;
  char *tenant; /* its tenant (kexd --auth; "anonymous" without) */
} kex_job_stats;

/* One tenant's usage (StatsReply.tenant_stats). */
typedef struct kex_tenant_stats {
  char *name;
  uint32_t jobs_open;
  uint64_t bytes_held, bytes_reserved, jobs_opened, submissions, refused;
} kex_tenant_stats;

/* StatsReply.fleet: the fleet cache (kexd --fleet-cache; docs/fleet.md). */
typedef struct kex_fleet_stats {
  char state[16];               /* "off", "up", "connecting", "down" */
  uint64_t hits, published, lease_waits, takeovers, rejected, errors, outages;
} kex_fleet_stats;

/* StatsReply: counters since the daemon started (proto/kex/v1/kex.proto says what each counts). */
typedef struct kex_stats {
  uint32_t jobs_open;
  uint64_t jobs_opened, jobs_closed, jobs_expired, submissions, plans, plan_errors, kernels_planned, calls,
      calls_failed, bytes_held, buffers_freed;
  double uptime_s;
  kex_job_stats *jobs;
  size_t njobs;
  /* added after the fields above (the struct is always the library's, so old callers are unaffected) */
  uint64_t submissions_done, submissions_failed;
  uint64_t schedule_cache_hits, schedule_cache_misses;
  uint64_t program_cache_memory_hits, program_cache_sqlite_hits, program_cache_misses;
  uint64_t beam_cache_hits, beam_cache_misses, searches_run, searches_cancelled;
  uint32_t connections_open;
  uint64_t connections_refused, jobs_evicted;
  char *tenant;              /* the caller's tenant (kexd --auth) */
  kex_tenant_stats *tenants; /* a user sees its own; an admin (or no --auth) every tenant */
  size_t ntenants;
  kex_fleet_stats fleet;     /* state "off" without --fleet-cache */
} kex_stats;

/* Server counters; job NULL or "" = every open job, else that job only.  Free with kex_stats_free. */
int kex_get_stats(kex_client *c, const char *job, kex_stats **out, kex_status *st);

/*
 * grpc.health.v1.Health/Check for `service` ("" or NULL: the server as a
 * whole); it needs no token.  *serving is true when the answer is SERVING.
 * 0 or the call's error.
 */
int kex_client_health(kex_client *c, const char *service, bool *serving, kex_status *st);

void kex_stats_free(kex_stats *s);

/* ---- Tune and the beam cache ---- */

/*
 * What the beam cache knows about one kernel on one device (CacheEntry).
 * Every string is owned by the entry and never NULL ("" when the server
 * sent none).
 */
typedef struct kex_remote_cache_entry {
  char *key;                    /* the canonical AST key, 64 hex digits */
  char *device;                 /* the rendered device identity ("kind=...;vendor=...;...") */
  char *kind, *vendor, *device_name, *driver_version, *compiler_version; /* its five fields */
  char *kernel_name;            /* the kernel's name with the chosen opts applied */
  char *opts;                   /* the applied opts, space-separated ("UPCAST(1,4) LOCAL(0,16)"; "" = none) */
  char *search_opts;            /* canonical search options ("beam=2;...") */
  char *codegen;                /* codegen version ("kex.codegen.v1") */
  char *ast_text;               /* kex_client_cache_get only: the AST text the key hashes ("" = not stored) */
  char *source;                 /* kex_client_cache_get only: the rendered kernel ("" = not available) */
  double best_us;               /* the chosen opts' time */
  double hand_us;               /* the hand-coded opts' time */
  double search_s;              /* how long the search took */
  uint64_t candidates;          /* candidates the search timed */
  int64_t created_unix;         /* when the entry was made (unix seconds) */
} kex_remote_cache_entry;

/* Free one entry from kex_client_cache_get (NULL is a no-op). */
void kex_remote_cache_entry_free(kex_remote_cache_entry *e);

/* One event of a Tune stream, for kernel i (1-based) of n. */
typedef struct kex_tune_event {
  uint32_t i, n;
  const char *kernel;           /* the kernel's hand-coded name */
  bool finished;                /* false: progress; true: the kernel's result is in entry */
  const char *phase;            /* "cache", "hand", "search", "compare", "done" */
  uint32_t round;               /* beam round, 1-based (0 before the first) */
  uint32_t round_candidates;    /* candidates in this round */
  uint32_t compiled, timed;     /* candidates compiled / timed so far (this kernel) */
  double best_us;               /* best time so far (0 = none yet) */
  bool from_cache;              /* finished: the result came from the cache (nothing searched) */
  bool hand_won;                /* finished: the hand-coded opts were kept */
  double search_s;              /* finished: wall time spent on this kernel */
  const kex_remote_cache_entry *entry; /* finished: the result (NULL if the server sent none) */
} kex_tune_event;

/* Called for each Tune event on the calling thread; everything it points to lives only during the call. */
typedef void (*kex_tune_cb)(const kex_tune_event *ev, void *ud);

typedef struct kex_tune_opts {
  uint32_t beam_width;          /* 0 = the server's default */
  uint32_t max_upcast, max_local; /* 0 = the server's default */
  uint32_t kernel_timeout_ms;   /* per kernel; 0 = the server's default */
  const char *device;           /* NULL or "" = the graph's device ("device" of the JSON, else the default) */
  double timeout_s;             /* deadline of the whole call; 0 = none */
} kex_tune_opts;

/* The result of one kernel of a Tune. */
typedef struct kex_tune_kernel {
  char *kernel;                 /* the hand-coded name */
  kex_remote_cache_entry entry; /* the chosen opts and their times */
  bool from_cache, hand_won;
  double search_s;
  uint32_t rounds, compiled, timed; /* the largest values the kernel's events reported */
} kex_tune_kernel;

typedef struct kex_tune_result {
  kex_tune_kernel *kernels;     /* in schedule order */
  size_t nkernels;
} kex_tune_result;

/*
 * Beam-search every kernel of a graph (JSON text) on the server, or take
 * each kernel's valid cached result.  cb (may be NULL) sees every event as
 * it arrives; the finished events become *out (kex_tune_result_free).  opts
 * may be NULL.  A deadline that passes is KEX_EDEADLINE.  When this returns
 * an error, *out is NULL (events already delivered stay delivered).
 */
int kex_client_tune(kex_client *c, const char *job, const char *graph_json, const kex_tune_opts *opts, kex_tune_cb cb,
                    void *ud, kex_tune_result **out, kex_status *st);

void kex_tune_result_free(kex_tune_result *r);

/* Which cache entries a call is about; NULL or "" (0 for max_age_s) matches anything. */
typedef struct kex_remote_cache_filter {
  const char *device;           /* substring of the rendered identity */
  const char *kernel_name;      /* substring */
  const char *key_prefix;       /* hex prefix of the AST key */
  int64_t max_age_s;            /* only entries created at most this many seconds ago */
} kex_remote_cache_filter;

/* One page of ListCache. */
typedef struct kex_cache_page {
  kex_remote_cache_entry *entries; /* in key order */
  size_t nentries;
  char *next_page_token;        /* "" = no more pages, else pass it back as page_token */
} kex_cache_page;

/*
 * One page of the beam cache: at most limit entries (0 = the server's 100,
 * at most 1000) matching filter (may be NULL), starting at page_token (NULL
 * or "" = from the start).  *out is the caller's (kex_cache_page_free).
 */
int kex_client_cache_list(kex_client *c, const char *job, const kex_remote_cache_filter *filter, uint32_t limit,
                          const char *page_token, kex_cache_page **out, kex_status *st);

void kex_cache_page_free(kex_cache_page *p);

/*
 * The newest entry for key (64 hex) on device (the rendered identity; NULL
 * or "" = any), with its AST text and source when the server has them.
 * KEX_ENOTFOUND when there is none.  *out is the caller's
 * (kex_remote_cache_entry_free).
 */
int kex_client_cache_get(kex_client *c, const char *job, const char *key, const char *device,
                         kex_remote_cache_entry **out, kex_status *st);

/* Receives the export file piece by piece; nonzero stops the export (KEX_ECANCELLED). */
typedef int (*kex_cache_chunk_cb)(const void *data, size_t len, void *ud);

/*
 * Export the entries matching filter (may be NULL) in the export format of
 * search/cache.h (JSON lines, "kex.cache.export.v1").  The bytes go to cb
 * when it is not NULL, else to f (KEX_EIO when a write fails); *entries
 * (may be NULL) receives how many entries the server wrote.  What was
 * delivered before an error stays delivered.
 */
int kex_client_cache_export(kex_client *c, const char *job, const kex_remote_cache_filter *filter, FILE *f,
                            kex_cache_chunk_cb cb, void *ud, uint64_t *entries, kex_status *st);

#define KEX_IMPORT_ERRORS_MAX 16  /* error lines a kex_import_report keeps */

/* The outcome of an import. */
typedef struct kex_import_report {
  uint32_t imported, rejected;
  uint32_t nerrors;             /* messages kept, at most KEX_IMPORT_ERRORS_MAX */
  char errors[KEX_IMPORT_ERRORS_MAX][256]; /* "line 3: ast_key: not 64 hex digits" */
} kex_import_report;

/*
 * Import an export file read from f (from its current position to EOF),
 * streamed in KEX_UPLOAD_CHUNK messages.  The server checks every entry: a
 * refused line counts in rep->rejected with its message, the rest are
 * stored, and the call returns 0.  A file with nothing to store (a bad
 * header, or every line refused) is KEX_EINVAL (INVALID_ARGUMENT) with the
 * server's message naming the first bad line.  rep may be NULL.  KEX_EIO
 * when f cannot be read.
 */
int kex_client_cache_import(kex_client *c, const char *job, FILE *f, kex_import_report *rep, kex_status *st);

/* Delete the entries matching filter (NULL = all); *deleted (may be NULL) receives how many. */
int kex_client_cache_delete(kex_client *c, const char *job, const kex_remote_cache_filter *filter, uint32_t *deleted,
                            kex_status *st);

#ifdef __cplusplus
}
#endif

#endif

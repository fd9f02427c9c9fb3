/*
 * jobs.h - jobs (tenants): tokens, leases, buffers, memory accounting.
 *
 * A job is opened with a name, a weight and a memory limit and is named in
 * every later call by an unguessable token (128 bits from OpenSSL's DRBG, as
 * 32 hex characters, followed on the wire by the node that holds it).
 * Any call that names a job renews its lease; a uv timer closes jobs idle
 * past their lease.
 *
 * A job holds buffers (device memory), each named by a handle that is just
 * as unguessable and means nothing in another job.  Every byte a job's
 * buffers hold, plus the bytes of its uploads in flight (reserved), counts
 * against its memory limit.  Closing a job (CloseJob, lease expiry,
 * shutdown) cancels its queued device work and frees every buffer it holds
 * through the device's runner.  Loop thread only.
 */
#ifndef KEX_DAEMON_JOBS_H
#define KEX_DAEMON_JOBS_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/dict.h"
#include "core/dtype.h"
#include "core/limits.h"
#include "daemon/auth.h"
#include "daemon/dispatch.h"

#define KEXD_MAX_DEVICES 16                      /* names in --device (device indexes below this) */
#define KEXD_TOKEN_BYTES 16                      /* random bytes per token */
#define KEXD_TOKEN_LEN (2 * KEXD_TOKEN_BYTES)    /* hex characters */
#define KEXD_JOB_NAME_MAX 256                    /* bytes of a job name */
#define KEXD_LIMIT_JOBS 4096                     /* default: jobs open at once */
#define KEXD_HANDLE_LEN KEXD_TOKEN_LEN           /* hex characters of a buffer handle */
#define KEXD_LIMIT_BUFFERS_PER_JOB 65536         /* default: buffers one job may hold (--max-buffers-per-job) */
#define KEXD_DEFAULT_JOB_EVICT_IDLE_S 10.0       /* a full table closes the job idle longest, if idle at least this */
#define KEXD_ANONYMOUS_TENANT "anonymous"        /* the tenant of every job when kexd runs without --auth */
/*
 * A fleet: each kexd is a node with a name (--node-name) and the address
 * clients reach it at (--advertise).  A token on the wire is
 * "HEX.NAME@ADVERTISE" (job->token is the HEX part, the secret), at most
 * KEXD_WIRE_TOKEN_MAX characters: it fits libkex's KEX_TOKEN_MAX buffers.
 */
#define KEXD_NODE_NAME_MAX 31                    /* characters of a node name */
#define KEXD_ADVERTISE_MAX 62                    /* characters of an advertised address */
#define KEXD_NODE_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/[]-" /* of both */
#define KEXD_NODE_SUFFIX_MAX (2 + KEXD_NODE_NAME_MAX + KEXD_ADVERTISE_MAX) /* ".NAME@ADVERTISE" */
#define KEXD_WIRE_TOKEN_MAX (KEXD_TOKEN_LEN + KEXD_NODE_SUFFIX_MAX)

/*
 * What one tenant uses now, over all its jobs (created at its first job,
 * kept for the metrics; the auth file bounds how many there are).  The
 * limit fields are the tenant's from the --auth table, refreshed at each
 * OpenJob and at each reload (0: unlimited).
 *
 * The compile budget is a token bucket of compile seconds: it holds at
 * most compile_budget_s, refills at compile_budget_s per
 * KEXD_COMPILE_BUDGET_PERIOD_S, and is charged the measured seconds of a
 * Submit's compiles once they are all back, so compiles that started with
 * budget left may take it below 0 (the tenant then waits for the refill).
 */
typedef struct kexd_tenant_use {
  char name[KEXD_TENANT_NAME_MAX + 1];
  uint32_t jobs;          /* open now */
  uint64_t bytes_held;    /* by its buffers while alive: its jobs', and those a Download still reads after a Free or
                             CloseJob (charged until the stream ends: bytes pinned for it are never uncounted) */
  uint64_t bytes_reserved;
  uint64_t jobs_opened, submissions, refused; /* since start; refused: calls over one of its limits */
  uint64_t compile_us, search_us; /* since start: its kernels' compiles and its beam searches, wall microseconds */
  uint64_t search_wait_us;        /* since start: its searches' waits for a search slot, wall microseconds */
  uint64_t max_bytes;
  /* the compile budget (kexd_tenant_budget_*) */
  double compile_budget_s;  /* the bucket's size: compile seconds per hour (0: unlimited) */
  bool compile_budget_flag; /* the size is --tenant-compile-budget's (the entry sets no max_compile_seconds) */
  double compile_left_s;    /* seconds in the bucket at compile_left_ms (below 0: overdrawn) */
  uint64_t compile_left_ms; /* uv_now when compile_left_s was last brought up to date */
  uint64_t compile_budget_refused; /* since start: calls refused because the bucket was empty */
} kexd_tenant_use;

/*
 * A buffer a job holds.  Reference counted on the loop thread: the job's
 * table holds one, each Download in progress another; the device memory is
 * freed (a FREE item on the device's runner) when the last goes.  Its
 * bytes count in its job's bytes_held while the job holds it, and in its
 * tenant's (use) and device's until the last reference goes: a Download
 * that stalls after a Free or CloseJob keeps them charged.  dev_buf is
 * only ever dereferenced by that runner.
 */
typedef struct kexd_buffer {
  char handle[KEXD_HANDLE_LEN + 1];
  uint32_t refs;
  kex_dtype dtype;
  uint8_t ndim;
  int64_t shape[KEX_MAX_DIMS];
  uint64_t bytes;
  uint32_t device;       /* index into the configured devices */
  uint64_t job;          /* the job (and flow) it was made for */
  uint32_t weight;
  struct kexd_tenant_use *use; /* charged for its bytes until the last reference goes; NULL: uncharged */
  kex_buffer *dev_buf;
  kexd_work free_work;   /* the FREE item posted at the last reference: freeing never allocates */
  uint32_t slot;         /* its index in its job's bufs while the job holds it */
} kexd_buffer;

typedef struct kexd_job {
  uint64_t id;           /* serial, never reused: names the job's flows and outlives it in messages */
  char token[KEXD_TOKEN_LEN + 1];
  char log_id[9];        /* 8 hex of the SHA-256 of the token: logs never carry any of the token */
  char *name;
  char *peer;            /* the client address that opened it, without the port (per-peer limit) */
  uint32_t weight;
  uint64_t memory_limit;
  uint32_t max_buffers;  /* buffers it may hold (the table's max_buffers when it opened) */
  uint64_t last_used_ms; /* uv_now at the last call naming the job */
  uint64_t opened_ms;
  uint64_t plans;
  kexd_tenant_use *use;  /* its tenant's usage (owned by the table) */
  uint32_t submits;      /* Submit calls in flight (--max-submits-per-job) */
  kexd_buffer **bufs;    /* unordered */
  uint32_t nbufs, capbufs;
  kex_dict buf_index;    /* handle -> buffer (jobs.c: a keyed hash, then a constant-time compare) */
  uint32_t slot;         /* its index in the table's jobs */
  struct kexd_jobs *table; /* the table it is in (its hash key) */
  uint64_t bytes_held;     /* sum of bufs[i]->bytes */
  uint64_t bytes_reserved; /* uploads accepted but not yet on the device */
  struct kexd_kept *kept;  /* graphs it keeps (kept.c), unordered */
  uint32_t nkept, capkept;
  uint64_t kept_bytes, kept_clock;
  /* HoldJob: while held the lease never ends it; on_close (when set) runs once as the job is closed */
  bool held;
  uint32_t searches; /* its calls holding or waiting for a search slot (searches.c): it is in use, not idle */
  void (*on_close)(void *ud);
  void *on_close_ud;
} kexd_job;

typedef struct kexd_jobs {
  uv_loop_t *loop;
  uv_timer_t timer;  /* lease sweep */
  bool timer_open;
  double lease_s;
  uint32_t max_jobs;
  uint32_t max_per_peer; /* jobs one peer may hold (0: no limit) */
  uint64_t evict_idle_ms; /* a full table closes the job idle longest if idle at least this */
  uint32_t max_buffers;   /* buffers one job may hold */
  kexd_job **jobs;   /* unordered */
  uint32_t njobs, cap;
  kex_dict index;    /* token -> job (jobs.c: a keyed hash, then a constant-time compare) */
  struct evp_mac_ctx_st *sip; /* SipHash-2-4 under sip_key: the indexes' hash */
  unsigned char sip_key[16];  /* random, this process's */
  uint64_t opened, closed, expired, evicted; /* evicted: expired early to make room in a full table */
  uint64_t next_id;
  kexd_dispatch *disp; /* where buffers are freed */
  /* called with each job's id as it is removed (closed, expired, evicted), before it is freed; NULL: none */
  void (*removed)(void *ud, uint64_t id);
  void *removed_ud;
  uint64_t buffers_freed;
  kexd_tenant_use **uses; /* every tenant that opened a job, in first-open order */
  uint32_t nuses, capuses;
  uint64_t held_by_device[KEXD_MAX_DEVICES]; /* bytes of every live buffer, by device index (metrics) */
  char node[KEXD_NODE_NAME_MAX + 1];          /* this node's name (kexd_jobs_set_node) */
  char advertise[KEXD_ADVERTISE_MAX + 1];     /* and its address for clients */
  char suffix[KEXD_NODE_SUFFIX_MAX + 1];      /* ".NAME@ADVERTISE", every wire token's tail ("" before set_node) */
} kexd_jobs;

/* Set up (and start the lease timer); buffers are freed through disp.  0 or a negative code. */
int kexd_jobs_init(kexd_jobs *j, uv_loop_t *loop, double lease_s, uint32_t max_jobs, kexd_dispatch *disp);
/* Close every job and the timer (asynchronously: the loop runs its close callback). */
void kexd_jobs_close(kexd_jobs *j);
/*
 * Open a job for client address `peer` and tenant `use` (from
 * kexd_jobs_tenant_use; its jobs and bytes are counted there; the
 * per-peer limit applies only to the anonymous tenant).  name may be empty.  On success
 * *out points to the job (owned by j).  When max_jobs are open, use's job
 * idle longest is closed to make room if it has been idle at least
 * evict_idle_ms (never another tenant's).  Errors, with *err naming the limit and the
 * value: KEX_ELIMIT (the table is full of recently used jobs, or peer holds
 * max_per_peer), KEX_EINVAL (a name over KEXD_JOB_NAME_MAX), KEX_EIO
 * (the random generator), KEX_ENOMEM.
 */
int kexd_jobs_open(kexd_jobs *j, const char *name, uint32_t weight, uint64_t memory_limit, const char *peer,
                   kexd_tenant_use *use, kexd_job **out, kex_error *err);
/*
 * The usage record of tenant `name` (KEXD_ANONYMOUS_TENANT without
 * --auth), made at first use; NULL when out of memory.
 */
kexd_tenant_use *kexd_jobs_tenant_use(kexd_jobs *j, const char *name);
/*
 * Size u's compile budget at budget_s seconds per hour (0: unlimited;
 * from_flag: --tenant-compile-budget's, for messages) at time now_ms.  A
 * bucket that was unlimited starts full; one that shrinks keeps at most the
 * new size, and its debt.
 */
void kexd_tenant_budget_set(kexd_tenant_use *u, double budget_s, bool from_flag, uint64_t now_ms);
/*
 * Seconds from now_ms until u may start a compile: 0 when it may now (no
 * budget, or some left in the bucket), else (more than 0) until the
 * refill brings the bucket above 0.
 */
double kexd_tenant_budget_wait(kexd_tenant_use *u, uint64_t now_ms);
/* Charge u's budget `seconds` of compiling at now_ms (the bucket may go below 0; nothing without a budget). */
void kexd_tenant_budget_charge(kexd_tenant_use *u, double seconds, uint64_t now_ms);
/* True when s is 1..max characters, each one of KEXD_NODE_CHARS (a node name or an advertised address). */
bool kexd_node_field_ok(const char *s, size_t max);
/*
 * True when addr is an address clients can dial, at most
 * KEXD_ADVERTISE_MAX characters: HOST:PORT (a name or IPv4 address) or
 * [IPv6]:PORT, optionally after "dns:///", "ipv4:" or "ipv6:", with PORT
 * 1..65535 in decimal without a leading zero; or unix:/PATH.
 */
bool kexd_address_ok(const char *addr);
/* Name this node (both pass kexd_node_field_ok: config.c checks them).  Tokens opened after carry them. */
void kexd_jobs_set_node(kexd_jobs *j, const char *name, const char *advertise);
/* The token a client gets for job: "HEX.NAME@ADVERTISE" ("HEX" before set_node). */
void kexd_job_wire_token(const kexd_jobs *j, const kexd_job *job, char out[KEXD_WIRE_TOKEN_MAX + 1]);
/*
 * The job with this token, its lease renewed; NULL when unknown.  token is
 * a wire token of this node or its bare HEX part; the HEX is compared in
 * constant time.
 */
kexd_job *kexd_jobs_find(kexd_jobs *j, const char *token);
/*
 * When token is a well-formed wire token of another node: that node's
 * "NAME@ADVERTISE" (a pointer into token); else NULL.  Well-formed: 32
 * lowercase hex, '.', a node name, '@' and an address kexd_address_ok
 * takes; another node: neither the name nor the address is this node's (a
 * token of this node damaged in one place is this node's, unknown).
 */
const char *kexd_jobs_token_owner(const kexd_jobs *j, const char *token);
/* Close the job with this token (its on_close hook runs first).  0 or KEX_ENOTFOUND. */
int kexd_jobs_close_job(kexd_jobs *j, const char *token);
/* The open job with this id (lease not renewed); NULL when it is gone. */
kexd_job *kexd_jobs_find_id(kexd_jobs *j, uint64_t id);
/* Close the open job with this id (its HoldJob ended: the client went away), logging why.  0 or KEX_ENOTFOUND. */
int kexd_jobs_close_id(kexd_jobs *j, uint64_t id, const char *why);

/*
 * Reserve `bytes` of job's memory limit for an upload in flight.  0, or
 * KEX_ELIMIT with *err saying "job 'x' would hold N bytes, over its memory
 * limit of M bytes" (or naming the buffer-count limit, or its tenant's
 * max_bytes); nothing is reserved then.
 */
int kexd_job_reserve(kexd_job *job, uint64_t bytes, kex_error *err);
/* Give back a reservation (the upload finished or failed). */
void kexd_job_unreserve(kexd_job *job, uint64_t bytes);
/*
 * Add a device buffer to the job under a new handle (OpenSSL's DRBG).  On
 * success *out is the record (owned by the job, one reference) and the
 * job's bytes_held has grown by bytes; on failure the caller still owns
 * dev_buf.  KEX_EIO, KEX_ENOMEM.
 */
int kexd_job_add_buffer(kexd_jobs *j, kexd_job *job, kex_buffer *dev_buf, uint32_t device, kex_dtype dtype,
                        const int64_t *shape, uint8_t ndim, uint64_t bytes, kexd_buffer **out);
/* The job's buffer with this handle; NULL when it holds none (a handle of another job included). */
kexd_buffer *kexd_job_find_buffer(kexd_job *job, const char *handle);
/* Remove the buffer from the job (bytes_held shrinks) and drop the job's reference.  0 or KEX_ENOTFOUND. */
int kexd_job_free_buffer(kexd_jobs *j, kexd_job *job, const char *handle);
/* Free a device buffer no job holds (an upload whose job or call went away) through its runner. */
void kexd_jobs_free_device_buffer(kexd_jobs *j, kex_buffer *dev_buf, uint32_t device, uint64_t job, uint32_t weight);
/*
 * Tests and fuzz targets only: name job by `token`, or its buffer b by
 * `handle` (KEXD_TOKEN_LEN characters), in place of the random one, so that
 * a fixed corpus can name them.  0; KEX_EINVAL (not KEXD_TOKEN_LEN
 * characters); KEX_EINTERNAL (another job or buffer of the job has it).
 */
int kexd_jobs_set_token(kexd_jobs *j, kexd_job *job, const char *token);
int kexd_job_set_handle(kexd_jobs *j, kexd_job *job, kexd_buffer *b, const char *handle);
void kexd_buffer_ref(kexd_buffer *b);
/* Drop a reference; the last one posts the device free (loop thread). */
void kexd_buffer_unref(kexd_jobs *j, kexd_buffer *b);

#endif

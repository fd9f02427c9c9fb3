/*
 * rpc.h - what the daemon's method files share: the request plumbing
 * (request.c), the protobuf Graph conversion (pbgraph.c), and every
 * handler the method table (rpc.c) routes to.  Loop thread only, unless
 * a function says otherwise.
 */
#ifndef KEX_DAEMON_RPC_H
#define KEX_DAEMON_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>

#include "daemon/auth.h"
#include "daemon/kexd.h"
#include "kex/v1/kex.pb-c.h"
#include "sched/graph.h"
#include "search/cache.h"

/*
 * Unpack call c's request as `desc` (protobuf-c through kex_malloc).  On
 * failure the call is finished (INVALID_ARGUMENT / RESOURCE_EXHAUSTED) and
 * NULL is returned.  Free the result with kexd_rpc_free_msg.
 */
ProtobufCMessage *kexd_rpc_decode(kexd *d, kexd_call *c, const ProtobufCMessageDescriptor *desc, const uint8_t *req,
                                  size_t len);
void kexd_rpc_free_msg(ProtobufCMessage *m);
/* End call c with kex error rc: err's message when it has one, else the code's text. */
void kexd_rpc_fail(kexd_call *c, int rc, const kex_error *err);
/* CLOCK_MONOTONIC in microseconds. */
double kexd_now_us(void);
/*
 * The job named by token, lease renewed; NULL with the call finished
 * (INVALID_ARGUMENT / NOT_FOUND; a job of another tenant is NOT_FOUND too).
 */
kexd_job *kexd_rpc_need_job(kexd *d, kexd_call *c, const char *token);
/*
 * Build and validate a kex_graph from pg; a node naming a device d does not
 * have is KEX_EINVAL naming the node; BUFFER nodes naming a `buffer`
 * handle are checked against `job` (may be NULL: every handle is unknown):
 * KEX_ENOTFOUND for a handle the job does not hold, KEX_EINVAL for a dtype
 * or shape that differs from the buffer's.  On success *out owns the graph.
 */
int kexd_rpc_graph_from_pb(const kexd *d, const Kex__V1__Graph *pg, const char *device, const kex_limits *lim,
                           kexd_job *job, kex_graph **out, kex_error *err);
/* A waiting search's slot came (searches.c): the call goes on (rpc.c: its handler runs now). */
typedef void (*kexd_search_resume)(kexd *d, kexd_call *c);

/*
 * A call's place among its device's searches (searches.c): holding one of
 * the search slots, or waiting in the device's line for one.
 */
typedef struct kexd_search_place {
  kexd_call *call;
  struct kexd_search_payer *payer; /* who is charged for the slot: the tenant with --auth, else the job */
  struct kexd_search_place *next;  /* the line, while waiting */
  kexd_search_resume resume;       /* how a waiting call goes on when its slot comes */
  double since_us;                 /* kexd_now_us() when it joined the line, then when it took the slot */
  uint32_t weight;                 /* its job's weight (>= 1): the slot's seconds are charged over it */
  kexd_tenant_use *use;            /* its job's tenant's usage record (lives as long as kexd): shows the wait */
  bool waiting;
  /* the caller's continuation while waiting (rpc.c: the decoded request and its method row), which
     kexd_search_slot_end frees when the call ends first */
  void *msg;
  const void *method;
  uint64_t arrived_us;
  uint32_t width;
} kexd_search_place;

/*
 * What request.c keeps on each call (the server's per-call bytes,
 * kexd_call_ext): who it is, the job it named, the slots it holds.
 */
typedef struct kexd_call_info {
  const kexd_tenant *tenant; /* the caller (--auth; a reference on its table); NULL without --auth */
  uint64_t job;              /* the job it named (kexd_rpc_need_job, OpenJob), 0 none */
  char job_log[9];           /* that job's log id */
  uint64_t submit_job;       /* it holds a Submit slot of this job (--max-submits-per-job) */
  uint32_t tune_device;      /* 1 + the device whose search slot it holds or waits for (searches.c); 0 none */
  kexd_search_place search;  /* that slot or place in line */
} kexd_call_info;

/* Who may call a method (the method table's role column, rpc.c). */
typedef enum kexd_role_rule {
  KEXD_CALLER_ANYONE,  /* no token needed, even with --auth (the health check: load balancers) */
  KEXD_CALLER_TENANT,  /* with --auth, any tenant */
  KEXD_CALLER_ADMIN,   /* with --auth, an admin tenant (the beam cache every tenant shares: export, import, delete) */
  KEXD_CALLER_TUNER,   /* with --auth, a tenant whose may_tune is true */
} kexd_role_rule;

/*
 * The server's gate hook (before every registered handler; rpc.c looks up
 * the method's role rule and calls kexd_rpc_check_caller).
 */
bool kexd_rpc_gate(kexd_call *c, void *ud);
/*
 * The caller check of `rule`: with --auth, every method but an ANYONE one
 * needs `authorization: Bearer TOKEN` naming a tenant (else
 * UNAUTHENTICATED, logged with the peer, never the token); a user calling
 * an ADMIN method, or a TUNER one with may_tune false, is
 * PERMISSION_DENIED.  False when it refused (the call is finished).
 */
bool kexd_rpc_check_caller(kexd *d, kexd_call *c, kexd_role_rule rule);
/* The server's on_end hook: give back the call's slots, write its access-log line, drop its tenant. */
void kexd_rpc_call_end(kexd_call *c, int status, void *ud);
/* After an --auth reload: each tenant's usage record takes its limits from the new table (job_rpc.c). */
void kexd_tenant_limits_refresh(kexd *d);
/* The call's tenant; NULL without --auth. */
const kexd_tenant *kexd_rpc_tenant(kexd_call *c);
/* The tenant name jobs opened by c belong to (KEXD_ANONYMOUS_TENANT without --auth). */
const char *kexd_rpc_tenant_name(kexd_call *c);
/*
 * Limits on Submit (the call sites are one line in submit.c / tune.c):
 * beam width (--max-beam, the tenant's max_beam; the width from
 * kexd_rpc_beam_options) and
 * Submit calls in flight for the job (--max-submits-per-job).  0 with a
 * slot taken until the call ends, or -1 with the call finished
 * RESOURCE_EXHAUSTED naming the limit.
 */
int kexd_rpc_submit_begin(kexd *d, kexd_call *c, kexd_job *job, uint32_t width);
/*
 * The one check of a request's BeamOptions (Submit, Tune): *width = its
 * beam_width, else --beam, else `fallback` (Submit 0: hand-coded; Tune 2);
 * a width over KEX_BEAM_MAX_WIDTH or a max_upcast/max_local over
 * KEXD_BEAM_MAX_LIMIT is INVALID_ARGUMENT.  0, or -1 with the call finished.
 * The limits a client meets (--max-beam, the tenant's) are *_begin's.
 * Called only by kexd_rpc_search_begin.
 */
int kexd_rpc_beam_options(kexd *d, kexd_call *c, const Kex__V1__BeamOptions *b, uint32_t fallback, uint32_t *width);
/*
 * A search is a permission wherever it starts (the method table's search
 * column, rpc.c, calls this for Tune and Submit; no handler does): the
 * request's BeamOptions b checked (kexd_rpc_beam_options, the width into
 * *width: b's beam_width, else --beam, else `fallback`); then, when the
 * caller asked for a search (Tune always; Submit when b->beam_width > 0),
 * the tenant's may_tune (PERMISSION_DENIED), the width limits (--max-beam,
 * max_beam) and a search slot on `device` (a configured device name, ""
 * the default; NULL or unknown: no slot, the handler refuses the device)
 * from kexd_search_slot: taken now, or a place in the device's line
 * (`resume` goes on with the call when its slot comes; NULL: the call
 * cannot wait and is refused when every slot is held).  The slot is held
 * until the call ends (kexd_rpc_call_end), whether or not a search runs: a
 * beam Submit whose kernels are all in the beam cache searches nothing,
 * but is checked before kexd knows that.  A Submit whose width comes from
 * the operator's --beam asked for nothing: it needs no may_tune and no
 * slot (its width limits are kexd_rpc_submit_begin's).  0: go on now;
 * KEXD_SEARCH_WAITING: the call waits in line (the caller keeps its
 * continuation in kexd_call_info.search); -1: the call is finished.
 */
int kexd_rpc_search_begin(kexd *d, kexd_call *c, kexd_job *job, const Kex__V1__BeamOptions *b, uint32_t fallback,
                          const char *device, uint32_t *width, kexd_search_resume resume);

/* Index of the configured device `name` names ("" and "default": the first); -1 when none. */
int kexd_rpc_device_index(const kexd *d, const char *name);

/* ---- the handlers (info.c, job_rpc.c, plan.c, buffers.c) ---- */

/*
 * One unary request as the method table (rpc.c) hands it to its handler:
 * decoded, its strings checked, and the job it names looked up.
 */
typedef struct kexd_req {
  /* The request, of the method's type.  The table frees it when the
     handler returns; a handler that keeps it sets msg to NULL and frees it
     later with kexd_rpc_free_msg. */
  void *msg;
  kexd_job *job;       /* the job its `job` field names (lease renewed); NULL for a method without one, or "" */
  uint64_t arrived_us; /* kex_trace_now_us() before the decode (a trace's "decode" span) */
  uint32_t beam_width; /* a method with a search column: the width kexd_rpc_search_begin chose (0: hand-coded) */
} kexd_req;

typedef void (*kexd_method_fn)(kexd *d, kexd_call *c, kexd_req *rq);

/*
 * Serve one request of method `path` as the server would (the fuzz targets
 * call this in place of server.c); an unknown path is UNIMPLEMENTED.
 */
void kexd_rpc_serve(kexd *d, const char *path, kexd_call *c, const uint8_t *req, size_t len);

void kexd_rpc_health_check(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_health_watch(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_list_devices(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_get_stats(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_open_job(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_close_job(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_hold_job(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_busy_work(kexd *d, kexd_call *c, kexd_req *rq); /* --test-busy-work only */
void kexd_rpc_plan(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_download(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_free(kexd *d, kexd_call *c, kexd_req *rq);
/* Client streams: they read their own messages (ud is the kexd). */
void kexd_rpc_upload(kexd_call *c, const uint8_t *req, size_t len, void *ud);

/* ---- submit.c ---- */

/* Set up Submit's caches (program, structure); 0 or KEX_ENOMEM. */
int kexd_submit_init(kexd *d);
/* Free them; after the device runners have exited (the loaded programs are theirs). */
void kexd_submit_free(kexd *d);
/* The Submit handler. */
void kexd_rpc_submit(kexd *d, kexd_call *c, kexd_req *rq);

/* ---- tune.c ---- */

/* Set up Tune's counters.  0 or a negative code. */
int kexd_tune_init(kexd *d);
/* Free them, after the loop ran out. */
void kexd_tune_free(kexd *d);
/* The handler. */
void kexd_rpc_tune(kexd *d, kexd_call *c, kexd_req *rq);

typedef struct kexd_tune_counters {
  uint64_t beam_hits, beam_misses, searches, searches_cancelled;
  double search_seconds; /* wall time of the searches that finished */
} kexd_tune_counters;
/* Beam cache hits/misses and searches run/cancelled since start (Tune and Submit together). */
void kexd_tune_stats(const kexd *d, kexd_tune_counters *out);

/* A beam search for Submit: who pays, with what options, and the flag that stops it. */
typedef struct kexd_beam_req {
  kexd *d;
  uint32_t device;           /* configured device index */
  uint64_t job;              /* charged to this job's flow */
  uint32_t weight;
  int width, upcast_max, local_max; /* 0 limits: the search's defaults */
  uint32_t timeout_ms;       /* per kernel, 0 = none */
  atomic_bool *cancelled;    /* set by the loop: the search stops between candidates */
  const char *tenant;        /* the job's tenant (its usage record's name: lives as long as kexd), stored with results */
  kexd_tenant_use *use;      /* that usage record: the search's time is charged to it */
} kexd_beam_req;

struct kex_graph;
struct kex_schedule;
struct kex_name_counter;
struct kex_program_src;
/*
 * On a worker-pool thread (never the loop): schedule item `item` (a kernel)
 * of s, made from g, lowered with its cached beam opts for br's device, else
 * the opts a search chooses now (device work on the device's runner,
 * charged to br->job; the result stored in the cache file).  Fills *out and
 * the opts string like kex_run_lower_item.  0 or a negative code with *err
 * (KEX_ECANCELLED when br->cancelled stopped it).
 */
int kexd_tune_lower_item(const kexd_beam_req *br, const struct kex_graph *g, const struct kex_schedule *s,
                         uint32_t item, struct kex_name_counter *names, struct kex_program_src *out, char *opts,
                         size_t opts_len, kex_error *err);

/* ---- searches.c: the search slots of each device and the line of searches waiting for one ---- */

#define KEXD_SEARCH_WAITING 1 /* kexd_search_slot, kexd_rpc_search_begin: the call waits in line for a slot */

/* Set up d->searches (the lines, and the wake that gives freed slots on a later turn of the loop).  0 or a code. */
int kexd_searches_init(kexd *d);
/* Close the wake, with the loop's other handles (every call is gone). */
void kexd_searches_close(kexd *d);
/* Free d->searches after the loop ran out. */
void kexd_searches_free(kexd *d);
/*
 * A search slot on device dev for call c's search, paid for by job's
 * payer (the tenant with --auth, else the job) with job's weight.  A free
 * slot nobody waits for is taken now: 0.  Else the call joins the
 * device's line and KEXD_SEARCH_WAITING is returned: it waits, holding no
 * pool worker, until a slot is freed and given to it (resume(d, c), on
 * the loop, on a later turn than the one that freed it), until its call
 * ends (client cancel, deadline: kexd_search_slot_end takes it out of
 * line), or until kexd stops (UNAVAILABLE).  A freed slot goes to the
 * waiting call whose payer has been charged least (within a payer, in
 * turn): each payer is charged the seconds its searches hold slots over
 * their jobs' weights, and a payer with nothing running or waiting is
 * forgotten (it comes back level with the least charged one, not with
 * credit).  -1 with the call finished RESOURCE_EXHAUSTED when the line
 * is full (--max-search-queue), when the payer already has
 * --max-search-queue-per-payer calls in it, or when resume is NULL.
 */
int kexd_search_slot(kexd *d, kexd_call *c, kexd_job *job, uint32_t dev, kexd_search_resume resume);
/* Call c ends: the slot it holds is given back (charged; the line is served on a later turn), or it leaves the line. */
void kexd_search_slot_end(kexd *d, kexd_call *c);
/* Searches holding a slot and waiting for one on device dev now. */
void kexd_search_counts(const kexd *d, uint32_t dev, uint32_t *running, uint32_t *waiting);
/* Job `id` is gone (kexd_jobs.removed, ud the kexd): its calls still waiting for a slot end now, NOT_FOUND. */
void kexd_search_job_removed(void *ud, uint64_t id);

/* ---- cache_rpc.c ---- */

/* Set up the cache RPCs' state (the memo of sources).  0 or KEX_ENOMEM. */
int kexd_cache_rpc_init(kexd *d);
/* Free it, after the loop ran out. */
void kexd_cache_rpc_free(kexd *d);
/* The handlers. */
void kexd_rpc_list_cache(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_get_cache_entry(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_export_cache(kexd *d, kexd_call *c, kexd_req *rq);
void kexd_rpc_import_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud);
void kexd_rpc_delete_cache(kexd *d, kexd_call *c, kexd_req *rq);
/*
 * Any thread: remember the source kexd rendered for (AST key, device kind,
 * opts text), GetCacheEntry's `source` for a matching entry (the last
 * KEXD_TUNE_SOURCES of them).
 */
void kexd_cache_memo_put(kexd *d, const char *ast_hex, const char *kind, const char *opts, const char *src);

/* A cache entry as protobuf; its strings point into the entry and the arrays here (valid while they are). */
typedef struct kexd_pb_entry {
  Kex__V1__CacheEntry m;
  Kex__V1__DeviceIdentity id;
  char opt_s[KEX_CACHE_MAX_OPTS][48];
  char *opt_p[KEX_CACHE_MAX_OPTS];
} kexd_pb_entry;
void kexd_cache_entry_to_pb(kex_cache_entry *e, kexd_pb_entry *p);

#endif

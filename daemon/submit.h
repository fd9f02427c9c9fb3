/*
 * submit.h - what Submit's files share (private to daemon/): the plan of a
 * graph structure, the loaded-programs index,
 * the submitter and one submission.  submit.c has the handler, the
 * submission's life and its stream (its opening comment tells the whole
 * path of a submission); programs.c the loaded programs' index;
 * the engine (realize/engine.h) the SQLite lookups and the compile slots.
 * Every function here runs on the loop thread unless its comment says.
 */
#ifndef KEXD_SUBMIT_H
#define KEXD_SUBMIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/dict.h"
#include "core/log.h"
#include "core/trace.h"
#include "daemon/rpc.h"
#include "daemon/stream.h"
#include "devices/device.h"
#include "realize/engine.h"
#include "realize/plan.h"
#include "realize/run.h"
#include "search/cache.h"

#define SUB_HASH KEX_PLAN_HASH /* bytes of a SHA-256 */
/*
 * A plan whose kernels all ran faster than this last time posts its items
 * with defer_done (dispatch.h): the runner wakes the loop once for the
 * chain instead of once per item.  Progress events of such a submission
 * arrive together, at most this late.
 */
#define SUB_DEFER_KERNEL_US 1000.0
#define SUB_FIRST_BATCH 8 /* steps per device item of a plan that never ran (its kernel times unknown) */

/* The plan builder's plan (realize/plan.h) of one graph structure, shared by its submissions. */
typedef struct plan {
  uint32_t refs;             /* loop thread */
  uint8_t key[SUB_HASH];
  uint64_t last_used;        /* structure cache LRU */
  uint32_t device;
  kex_graph *g;              /* the graph it was built from (the replay points into it) */
  kex_rplan rp;
  double build_us;
  /* loop thread, updated by each successful run: the slowest kernel's time of the last run (-1: never ran) */
  double last_max_kernel_us;
  double *last_kernel_us;    /* [rp.nkernels]: each kernel's time in the last successful run (NULL: never ran) */
  int32_t *same_as;          /* [rp.nkernels]: the earlier kernel with this one's source but for its name, whose
                                program it runs, else -1 (NULL: none shared) */
} plan;

typedef struct submission submission;
typedef struct kexd_submitter kexd_submitter;

/*
 * A program loaded on a device's runner (see the file comment).  The loop
 * owns the record; only the runner dereferences prog.  In the index while
 * loaded; out of it, a record is a submission's own program (a second copy
 * of one in the index), or one on its way out: `unload` frees the program
 * on the runner, and its done frees the record.
 */
typedef struct loaded_prog {
  uint8_t hash[SUB_HASH];
  uint32_t device;
  kexd_submitter *S;
  char name[KEX_PROGRAM_NAME_MAX];
  kex_program *prog;         /* NULL until a SETUP loaded it */
  uint32_t pins;             /* submissions using it now (index records only) */
  uint64_t last_used;        /* S->clock at its last use */
  kexd_work unload;          /* the must_run item that frees prog: unloading never allocates */
  struct loaded_prog *next;  /* S->orphans */
} loaded_prog;

struct kexd_submitter {
  kexd *d;
  uint32_t ndevices;
  uint32_t max_programs;
  /* loop thread only */
  kex_dict *loaded;          /* [ndevices]: source hash -> loaded_prog *, the programs each runner holds */
  loaded_prog *orphans;      /* unloads that could not be posted (stopping): freed with the submitter */
  uint64_t programs_unloaded;
  plan **plans;              /* the structure cache, cfg.schedule_cache entries at most */
  uint32_t nplans;
  uint64_t clock;
};

typedef enum ev_kind { EV_ACCEPTED, EV_SCHEDULED, EV_COMPILING, EV_RUNNING } ev_kind;

/* A progress event, queued on the submission's stream (kex_malloc'd: the stream frees it). */
typedef struct sub_event {
  kexd_stream_ev link; /* first */
  ev_kind kind;
  uint32_t i;
} sub_event;

/* A progress event of a batched stream (SubmitRequest.batched_events) waiting to go out in the next message. */
typedef struct sub_pend {
  ev_kind kind;
  uint32_t i;
} sub_pend;

/* A batch of steps: [first, first + n) of the plan, launched back to back by one device item. */
typedef struct step_arg {
  submission *s;
  uint32_t first, n;
} step_arg;

struct submission {
  kexd *d;
  kexd_call *call;           /* referenced by the stream until it releases the submission */
  /*
   * The call's stream (stream.h): progress events, then the done event (or
   * the error status).  Pool jobs and device items each take a reference
   * (kexd_stream_ref), and so does every loop-thread entry into the
   * submission while it runs, so a pump inside it never frees it.
   */
  kexd_stream st;
  uint64_t id;
  uint64_t job;
  uint32_t weight;
  kexd_tenant_use *use;  /* its tenant's usage record (lives as long as kexd): compile seconds charged */
  char payer[KEXD_TENANT_NAME_MAX + 24]; /* who its compiles are charged to: the tenant (--auth), else the job */
  char log_id[9];
  uint32_t device;
  double t0;
  uint64_t inline_max;
  bool free_outputs;         /* SubmitRequest.free_outputs: bytes only, no job buffers (but ALIAS outputs) */
  bool only_done;            /* SubmitRequest.only_done: no progress events */
  bool batched;              /* SubmitRequest.batched_events: the events ready together go out in one message */
  sub_pend *pend;            /* batched: the events written since the last message, npend of them (cap pend_cap) */
  uint32_t npend, pend_cap;
  kex_graph *g;              /* this request's graph (its input bytes); owned unless it is p->g */
  plan *p;
  bool schedule_cached;
  uint64_t reserved;
  kexd_buffer **handles;     /* [p->rp.nbufs]: the job buffers the graph names, referenced */
  /* the end of the call */
  bool final_ready;          /* final_status (and final_ev when OK) is set: the stream ends once the events are out */
  bool outputs_dropped;      /* the call died before the done event went out: the outputs were freed */
  int final_status;
  char final_msg[KEX_ERROR_MSG_MAX];
  Kex__V1__SubmitEvent *final_ev; /* the done event, when final_status is OK */
  /* the pool: the plan's build (pool_rc, pool_err), then the engine's program stage (preq) */
  kex_work work;
  int pool_rc;
  kex_error pool_err;
  kex_prog_req preq;         /* its arrays: need, bins, binlens, compile_us, from (below) */
  bool *need;                /* [nkernels]: not loaded on the device: read from SQLite or compile */
  unsigned char **bins;      /* [nkernels] */
  size_t *binlens;
  double *compile_us;
  uint8_t *from;             /* [nkernels]: kex_prog_from */
  /* programs (see the file comment): per kernel, the record of its program */
  loaded_prog **lps;         /* [nkernels]: an index record (pinned) or the submission's own */
  bool *pinned;              /* [nkernels]: lps[k] is an index record this submission pinned */
  bool adopted;              /* SETUP's loads were offered to the index */
  /* the runner (see the file comment) */
  atomic_bool cancelled;
  kex_buffer **bufs;         /* [p->rp.nbufs] */
  kex_program **progs;       /* [nkernels] */
  kex_buffer **out_bufs;     /* [noutputs] */
  uint8_t **out_data;        /* [noutputs]: inline bytes */
  double *kernel_us;         /* [nkernels] */
  bool setup_ok, failed;
  uint32_t ran;
  /* device items */
  kexd_work *works;          /* [nbatches + 2]: setup, the batches of steps, finish */
  uint32_t nworks;
  step_arg *stepargs;
  uint32_t items_out;        /* items posted and not back (each also holds a stream reference) */
  bool cork;                 /* the items went out with defer_done: the progress events written before the chain is
                                back may wait in gRPC's buffer for it (sub_more), or, batched, in pend */
  int rc;
  kex_error err;
  char (*handle_str)[KEXD_HANDLE_LEN + 1]; /* [noutputs] */
  kexd_beam_req beam;        /* width 0: hand-coded opts */
  /* SubmitRequest.trace: the spans of this submission (any thread adds them), else NULL */
  kex_trace *trace;
  uint64_t posted_us;        /* trace: when the device items were posted (the queue wait starts) */
  char *trace_json;          /* trace: Done.trace_json, freed with the submission */
};

/* ---- shared between the files (see each definition) ---- */

/* programs.c */
void loaded_index_init(kex_dict *m);
loaded_prog *loaded_find(const kex_dict *m, const uint8_t *hash); /* NULL: not loaded */
void loaded_index_free(kex_dict *m); /* frees every program and record (only once the runners have exited) */
void free_loaded_now(void *v);
void sub_release_programs(submission *s);
void sub_adopt_programs(submission *s);
/* submit.c */
void sub_post(submission *s);
/* trace: a span of s on `track` from t0 to now (no-op, and no clock read, without a trace) */
#define SUB_TRACE_NOW(s) ((s)->trace ? kex_trace_now_us() : 0)
void sub_span(submission *s, const char *track, const char *cat, const char *name, const char *detail, uint64_t t0);
void sub_drop_outputs(submission *s);
void ev_push(submission *s, ev_kind kind, uint32_t i);
void sub_unreserve(submission *s);
void sub_fail(submission *s, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sub_fail_rc(submission *s, int rc, const kex_error *err);

#endif

/*
 * submit.c - Submit: schedule, compile and run a graph for a job, streaming
 * its progress (DESIGN.md, "The path of one submission").  This file has
 * the handler, the structure cache, a submission's life and stream and
 * its items on the device runner; programs.c the loaded programs' index;
 * the engine (realize/engine.h) the SQLite lookups and the compile slots
 * (submit.h shares their types).
 *
 * One submission moves through these stages; every one ends back on the
 * loop thread, which owns the submission, the job, the caches and the
 * stream:
 *
 *   1. loop: decode, check the job and the handles, hash the graph's
 *      structure (nodes, ops, shapes, dtypes, args, constants, outputs;
 *      never the input bytes) and look the hash up in the structure cache.
 *   2. on a miss, a plan is built by the plan builder (realize/plan.h, the
 *      one `kex run` uses): replay + schedule on the loop for small graphs
 *      (--plan-inline-nodes), then on the worker pool (daemon/work.h) the
 *      rest of the replay/schedule for large ones, the per-buffer and
 *      per-item tables, and every kernel lowered with hand-coded opts (or,
 *      for a beam Submit, Tune's hook: cached opts, else a search) and
 *      hashed (SHA-256 of the source).  The plan is immutable from then on
 *      and shared (refcounted on the loop) by every later submission of the
 *      same structure.
 *   3. loop: programs the device has loaded already (the loop's index of
 *      them) are memory hits, pinned for the submission; for the others one
 *      pool job reads the SQLite cache (--cache; kex_cache_program_get with
 *      the device identity), and each kernel still missing is compiled, on
 *      its own pool job, in one of the device's compile slots (below) and
 *      its binary stored (kex_cache_program_put).
 *   4. the job's flow on the device runner (dispatch.c, so fair queueing
 *      applies): one SETUP item (load the new programs, allocate the
 *      buffers, copy the inputs in), one item per kernel, COPY or VIEW, and
 *      one FINISH item (must_run: it always runs, so it is the one that
 *      frees what the submission allocated when anything failed or was
 *      cancelled; on success it turns the outputs into buffers and reads
 *      the inline bytes).
 *   5. loop: outputs become job buffers (kexd_job_add_buffer), the memory
 *      reservation is returned, the programs are unpinned, and the done
 *      event is written in one batch with the status.  A chain of quick items
 *      (defer_done) posted to an idle runner corks the progress events
 *      written meanwhile (sub_more): they wait in gRPC's buffer and leave in
 *      one TCP write with the done event, so a tiny cached Submit costs the
 *      client two wake-ups (accepted; the rest), not four.  A call that dies
 *      before that batch went out (a write fails, or the client cancels or
 *      vanishes) takes its outputs with it: the job never learnt their
 *      handles, so they are freed at once, not at the lease's end.
 *
 * Threads.  The worker pool gets the plan (immutable) and writes only its
 * own result fields of the submission; the runner's closures touch only the
 * device, the plan (read-only) and the submission's device-side fields
 * (bufs, progs, out_bufs, out_data, kernel_us, setup_ok, failed, ran: all
 * of one submission's items run on one runner, in order, so those fields
 * have one thread at a time).  `cancelled` is the one word both sides see:
 * the loop sets it at a client cancel, the closures read it and skip their
 * work.  Each device's compile probe (identity, dtypes) is shared by the
 * pool's threads behind a lock; SQLite is reached through each pool
 * thread's own connection (realize/engine.h); compiles run in slots
 * (below).
 *
 * Loaded programs (each a dlopen()ed .so or an OpenCL program: ~77 KB and
 * 5 mappings on cpu) are bounded per device by max_programs.  The loop owns
 * the index (source hash -> loaded_prog); the runner alone dereferences the
 * programs.  A submission pins the records it uses from its plan to its
 * last item; SETUP loads what it lacks and the loop adopts those into the
 * index when SETUP is back (a program another submission loaded meanwhile
 * stays the submission's own and is unloaded at its end).  Past the limit
 * the least recently used unpinned records leave the index and a must_run
 * item unloads each on the runner; a later use reads SQLite (or compiles)
 * and loads it again.  Pinned programs are never unloaded, so while
 * submissions run their programs may exceed the limit for a while.
 *
 * Compile slots (realize/engine.h): each device compiles --compile-slots
 * kernels at once, shared by weighted fair queueing between payers -- the
 * tenant with --auth, else the job -- charged by measured compile seconds
 * over the job's weight, one kernel at a time; a payer with no compile in
 * flight gets an extra slot while all are taken, so a small graph never
 * waits behind another payer's huge ones.  --compile-timeout stops a
 * compile (cpu: its compiler is killed) and a source that failed is not
 * compiled again.  With --auth a tenant's compile budget
 * (max_compile_seconds, else --tenant-compile-budget; jobs.h) gates the
 * stage: when the lookup leaves kernels to compile and the tenant's bucket
 * is empty the submission is refused RESOURCE_EXHAUSTED (preq_admit);
 * its compiles' seconds are charged to the bucket when they are all back.
 * A device whose compile is thread-safe (cpu: each compile is its own cc)
 * compiles in all slots on one compile instance; otherwise (OpenCL) each
 * slot opens its own.
 *
 * Memory: a submission reserves (kexd_job_reserve) every byte it will
 * allocate before anything runs -- RESOURCE_EXHAUSTED over the job's limit
 * -- and returns the reservation at the end, when its outputs are held.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/codec.h"
#include "daemon/kept.h"
#include "proto/pballoc.h"
#include "daemon/submit.h"
#include "daemon/work.h"
#include "sched/schedule.h"

static bool same_but_name(const char *a, const char *na, const char *b, const char *nb);

/* Pool thread, once per plan: p->same_as, so a graph's identical kernels compile and load once. */
static void plan_same_sources(plan *p) {
  const kex_rplan *rp = &p->rp;
  if (rp->nkernels < 2 || !(p->same_as = kex_malloc(rp->nkernels * sizeof *p->same_as))) return;
  for (uint32_t k = 0; k < rp->nkernels; k++) {
    const kex_plan_prog *pk = &rp->progs[k];
    p->same_as[k] = -1;
    for (uint32_t j = 0; j < k && p->same_as[k] < 0; j++) {
      const kex_plan_prog *pj = &rp->progs[j];
      if (p->same_as[j] >= 0 || pj->has_local != pk->has_local || memcmp(pj->global, pk->global, sizeof pk->global) ||
          (pk->has_local && memcmp(pj->local, pk->local, sizeof pk->local)))
        continue;
      if (memcmp(pj->hash, pk->hash, SUB_HASH) == 0 || same_but_name(pj->src, pj->name, pk->src, pk->name))
        p->same_as[k] = (int32_t)j;
    }
  }
}

static void plan_unref(plan *p) {
  if (!p || --p->refs) return;
  kex_plan_clear(&p->rp);
  kex_graph_free(p->g);
  kex_free(p->last_kernel_us);
  kex_free(p->same_as);
  kex_free(p);
}

/* A beam Submit's kernels: lowered by Tune's hook (cached opts, else a search on the job's flow). */
static int beam_lower(void *arg, const kex_graph *g, const kex_schedule *s, uint32_t item, kex_name_counter *names,
                      kex_program_src *out, char *opts, size_t opts_len, kex_error *err) {
  return kexd_tune_lower_item(arg, g, s, item, names, out, opts, opts_len, err);
}

int kexd_submit_init(kexd *d) {
  kexd_submitter *S = kex_calloc(1, sizeof *S);
  if (!S) return KEX_ENOMEM;
  S->d = d;
  S->ndevices = d->cfg.ndevices;
  S->loaded = kex_calloc(S->ndevices ? S->ndevices : 1, sizeof *S->loaded);
  S->plans = kex_calloc(d->cfg.schedule_cache ? d->cfg.schedule_cache : 1, sizeof *S->plans);
  if (!S->loaded || !S->plans) {
    kex_free(S->loaded), kex_free(S->plans), kex_free(S);
    return KEX_ENOMEM;
  }
  for (uint32_t i = 0; i < S->ndevices; i++) loaded_index_init(&S->loaded[i]);
  S->max_programs = d->cfg.max_programs;
  if (d->disp) kexd_dispatch_set_kernel_time_limit(d->disp, d->cfg.kernel_time_limit_s);
  d->submitter = S;
  return 0;
}

void kexd_submit_free(kexd *d) {
  kexd_submitter *S = d->submitter;
  if (!S) return;
  for (uint32_t i = 0; i < S->ndevices; i++)
    loaded_index_free(&S->loaded[i]); /* the runners have exited: this thread is the only one left */
  while (S->orphans) {
    loaded_prog *lp = S->orphans;
    S->orphans = lp->next;
    free_loaded_now(lp);
  }
  for (uint32_t i = 0; i < S->nplans; i++) plan_unref(S->plans[i]);
  kex_free(S->loaded), kex_free(S->plans);
  kex_free(S);
  d->submitter = NULL;
}

static plan *plan_cache_find(kexd_submitter *S, const uint8_t *key) {
  for (uint32_t i = 0; i < S->nplans; i++)
    if (memcmp(S->plans[i]->key, key, SUB_HASH) == 0) {
      S->plans[i]->last_used = ++S->clock;
      return S->plans[i];
    }
  return NULL;
}

/* Keep p (one more reference) in the structure cache, evicting the least recently used entry when full. */
static void plan_cache_add(kexd *d, plan *p) {
  kexd_submitter *S = d->submitter;
  uint32_t cap = d->cfg.schedule_cache;
  if (!cap || plan_cache_find(S, p->key)) return;
  if (S->nplans == cap) {
    uint32_t lru = 0;
    for (uint32_t i = 1; i < S->nplans; i++)
      if (S->plans[i]->last_used < S->plans[lru]->last_used) lru = i;
    plan_unref(S->plans[lru]);
    S->plans[lru] = S->plans[--S->nplans];
  }
  p->refs++;
  p->last_used = ++S->clock;
  S->plans[S->nplans++] = p;
}

static void h_u64(kex_sha256 *h, uint64_t v) { kex_sha256_update(h, &v, sizeof v); }
static void h_str(kex_sha256 *h, const char *s) {
  size_t n = s ? strlen(s) : 0;
  h_u64(h, n);
  if (n) kex_sha256_update(h, s, n);
}
static void h_i64s(kex_sha256 *h, const int64_t *v, size_t n) {
  h_u64(h, n);
  if (n) kex_sha256_update(h, v, n * sizeof *v);
}
static void h_scalar(kex_sha256 *h, const Kex__V1__Scalar *s) {
  if (!s) return h_u64(h, 0xffff);
  h_u64(h, s->kind_case);
  switch (s->kind_case) {
  case KEX__V1__SCALAR__KIND_INT_VALUE: h_u64(h, (uint64_t)s->int_value); break;
  case KEX__V1__SCALAR__KIND_FLOAT_VALUE: kex_sha256_update(h, &s->float_value, sizeof s->float_value); break;
  case KEX__V1__SCALAR__KIND_BOOL_VALUE: h_u64(h, s->bool_value); break;
  case KEX__V1__SCALAR__KIND_SPECIAL: h_str(h, s->special); break;
  default: break;
  }
}

/*
 * The structure key of a (validated) graph on device `device`: every field
 * but the input bytes (inline data and random seeds).  Which BUFFER nodes
 * name the same handle is part of it; the handles themselves are not.
 */
static void structure_key(const Kex__V1__Graph *pg, uint32_t device, const kexd_beam_req *beam, uint8_t out[SUB_HASH]) {
  kex_sha256 h;
  kex_sha256_init(&h);
  h_str(&h, "kex.submit.structure.v1");
  h_u64(&h, device);
  h_u64(&h, (uint64_t)beam->width); /* a hand-coded plan never serves a beam submission, nor one width another */
  h_u64(&h, (uint64_t)beam->upcast_max);
  h_u64(&h, (uint64_t)beam->local_max);
  h_str(&h, pg->device);
  h_u64(&h, pg->n_nodes);
  for (size_t i = 0; i < pg->n_nodes; i++) {
    const Kex__V1__Node *n = pg->nodes[i];
    h_str(&h, n->op);
    h_u64(&h, n->n_src);
    for (size_t k = 0; k < n->n_src; k++) h_u64(&h, n->src[k]);
    h_str(&h, n->dtype);
    h_i64s(&h, n->shape, n->n_shape);
    h_u64(&h, n->arg_case);
    if (n->arg_case == KEX__V1__NODE__ARG_PAIRS) {
      h_u64(&h, n->pairs->n_pairs);
      for (size_t k = 0; k < n->pairs->n_pairs; k++) h_u64(&h, (uint64_t)n->pairs->pairs[k]->first),
                                                     h_u64(&h, (uint64_t)n->pairs->pairs[k]->second);
    } else if (n->arg_case != KEX__V1__NODE__ARG__NOT_SET) {
      h_i64s(&h, n->new_shape->values, n->new_shape->n_values);
    }
    h_u64(&h, n->n_axis);
    for (size_t k = 0; k < n->n_axis; k++) h_u64(&h, (uint64_t)(int64_t)n->axis[k]);
    h_scalar(&h, n->value);
    h_u64(&h, n->contents_case);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_FILL_VALUE) h_scalar(&h, n->fill_value);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_FILL_ARANGE) h_u64(&h, n->fill_arange);
    if (n->contents_case == KEX__V1__NODE__CONTENTS_BUFFER) { /* the first node naming the same handle */
      size_t first = i;
      for (size_t k = 0; k < i && first == i; k++)
        if (pg->nodes[k]->contents_case == KEX__V1__NODE__CONTENTS_BUFFER && strcmp(pg->nodes[k]->buffer, n->buffer) == 0)
          first = k;
      h_u64(&h, first);
    }
    h_str(&h, n->device);
  }
  h_u64(&h, pg->n_outputs);
  for (size_t i = 0; i < pg->n_outputs; i++) h_u64(&h, pg->outputs[i]);
  kex_sha256_final(&h, out);
}

/*
 * The call died before the done event went out (or the event cannot be
 * sent): free the outputs the submission added to the job -- nobody learnt
 * their handles.  Idempotent; nothing once the event was delivered.
 */
void sub_drop_outputs(submission *s) {
  kexd *d = s->d;
  kexd_job *job;
  uint32_t n = 0;
  if (s->outputs_dropped || !s->final_ev || kexd_stream_delivered(&s->st) || !s->handle_str) return;
  s->outputs_dropped = true;
  if (!(job = kexd_jobs_find_id(&d->jobs, s->job))) return; /* closed: its buffers went with it */
  for (uint32_t j = 0; j < s->p->rp.noutputs; j++)
    if (s->p->rp.outputs[j].kind != KEX_PLAN_OUT_ALIAS && s->handle_str[j][0] &&
        kexd_job_free_buffer(&d->jobs, job, s->handle_str[j]) == 0)
      n++;
  if (n)
    kex_log(KEX_LOG_INFO, s->log_id, 0, "Submit %" PRIu64 ": the call ended before its done event went out: %u "
            "output buffers freed", s->id, n);
}

/* The call is over and nothing of the submission is in flight (kexd_stream_ops.release): free it. */
static void sub_release(void *owner) {
  submission *s = owner;
  kexd *d = s->d;
  sub_drop_outputs(s); /* the call died before the done event went out (nothing once it was delivered) */
  sub_release_programs(s);
  for (uint32_t b = 0; s->handles && b < s->p->rp.nbufs; b++) kexd_buffer_unref(&d->jobs, s->handles[b]);
  for (uint32_t i = 0; s->bins && i < s->p->rp.nkernels; i++) kex_free(s->bins[i]);
  for (uint32_t j = 0; s->out_data && j < s->p->rp.noutputs; j++) kex_free(s->out_data[j]);
  if (s->final_ev) {
    Kex__V1__Done *done = s->final_ev->done;
    for (size_t j = 0; j < done->n_outputs; j++) kex_free(done->outputs[j]);
    for (size_t k = 0; k < done->n_kernels; k++) kex_free(done->kernels[k]);
    kex_free(done->outputs), kex_free(done->kernels), kex_free(done), kex_free(s->final_ev);
  }
  kex_free(s->handles), kex_free(s->need), kex_free(s->bins), kex_free(s->binlens);
  kex_free(s->compile_us), kex_free(s->from), kex_free(s->bufs), kex_free(s->progs), kex_free(s->out_bufs);
  kex_free(s->out_data), kex_free(s->kernel_us), kex_free(s->works), kex_free(s->stepargs), kex_free(s->handle_str);
  kex_prog_req_clear(&s->preq);
  kex_free(s->lps), kex_free(s->pinned), kex_free(s->pend);
  if (!s->p || s->g != s->p->g) kex_graph_free(s->g);
  kex_trace_free(s->trace);
  free(s->trace_json); /* jansson's */
  plan_unref(s->p);
  kex_free(s);
}

void sub_span(submission *s, const char *track, const char *cat, const char *name, const char *detail, uint64_t t0) {
  if (s->trace) kex_trace_span(s->trace, track, cat, name, detail, t0, kex_trace_now_us());
}

/* Queue a progress event (loop thread; the caller pumps).  Best effort: dropped when memory is short. */
void ev_push(submission *s, ev_kind kind, uint32_t i) {
  sub_event *e;
  if (kexd_stream_dead(&s->st) || s->only_done || !(e = kex_malloc(sizeof *e))) return;
  e->kind = kind;
  e->i = i;
  kexd_stream_push(&s->st, &e->link);
}

/* The protobuf-c structs of one progress event. */
typedef struct ev_parts {
  Kex__V1__SubmitEvent ev;
  Kex__V1__Accepted acc;
  Kex__V1__Scheduled sch;
  Kex__V1__KernelEvent kev;
} ev_parts;

/* Fill pt->ev with event (kind, i); names: the kernels' names for a scheduled event (nkernels of them). */
static void ev_fill(const submission *s, ev_kind kind, uint32_t i, char **names, ev_parts *pt) {
  kex__v1__submit_event__init(&pt->ev);
  switch (kind) {
  case EV_ACCEPTED:
    kex__v1__accepted__init(&pt->acc);
    pt->acc.submission = s->id;
    pt->acc.schedule_cached = s->schedule_cached;
    pt->ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_ACCEPTED;
    pt->ev.accepted = &pt->acc;
    break;
  case EV_SCHEDULED:
    kex__v1__scheduled__init(&pt->sch);
    pt->sch.n_kernels = s->p->rp.nkernels;
    pt->sch.kernels = names;
    pt->ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED;
    pt->ev.scheduled = &pt->sch;
    break;
  case EV_COMPILING:
  case EV_RUNNING:
    kex__v1__kernel_event__init(&pt->kev);
    pt->kev.i = i;
    pt->kev.n = s->p->rp.nkernels;
    pt->kev.kernel = s->p->rp.progs[i].name;
    if (kind == EV_COMPILING) {
      pt->ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_COMPILING;
      pt->ev.compiling = &pt->kev;
    } else {
      pt->ev.event_case = KEX__V1__SUBMIT_EVENT__EVENT_RUNNING;
      pt->ev.running = &pt->kev;
    }
    break;
  }
}

/* The kernels' names, for a scheduled event (kex_free; NULL when out of memory, or with no kernels). */
static char **kernel_names(const submission *s) {
  char **names = s->p->rp.nkernels ? kex_calloc(s->p->rp.nkernels, sizeof *names) : NULL;
  for (uint32_t k = 0; names && k < s->p->rp.nkernels; k++) names[k] = s->p->rp.progs[k].name;
  return names;
}

/*
 * Write one progress event (kexd_stream_ops.event); one that cannot be
 * written is skipped.  Batched, the event joins pend instead: sub_drained
 * writes the pending ones as one message.
 */
static void ev_write(void *owner, kexd_stream_ev *link) {
  submission *s = owner;
  const sub_event *e = (const sub_event *)link;
  ev_parts pt;
  char **names = NULL;
  if (s->batched) {
    if (s->npend == s->pend_cap) {
      uint32_t cap = s->pend_cap ? 2 * s->pend_cap : 8;
      sub_pend *np = kex_realloc(s->pend, cap * sizeof *np);
      if (!np) return; /* best effort, as a write that fails */
      s->pend = np;
      s->pend_cap = cap;
    }
    s->pend[s->npend++] = (sub_pend){e->kind, e->i};
    return;
  }
  if (e->kind == EV_SCHEDULED && s->p->rp.nkernels && !(names = kernel_names(s))) return;
  ev_fill(s, e->kind, e->i, names, &pt);
  kexd_stream_write(&s->st, &pt.ev.base);
  kex_free(names);
}

/* The pending events of a batched stream, and after them `last` (the done event, or NULL), as one message. */
typedef struct ev_batch {
  ev_parts *parts;                  /* [npend] */
  Kex__V1__SubmitEvent **following; /* the first event's following: the other pending ones, then last */
  char **names;
  Kex__V1__SubmitEvent *msg;        /* the message: the first pending event (last when none is pending) */
} ev_batch;

static void batch_free(ev_batch *b) {
  kex_free(b->parts), kex_free(b->following), kex_free(b->names);
  *b = (ev_batch){0};
}

/* Build the batch (s->pend stays); 0 or KEX_ENOMEM. */
static int batch_make(const submission *s, Kex__V1__SubmitEvent *last, ev_batch *b) {
  uint32_t n = s->npend, nf = n ? n - 1 + (last != NULL) : 0;
  *b = (ev_batch){.msg = last};
  if (!n) return 0;
  if (!(b->parts = kex_calloc(n, sizeof *b->parts)) || (nf && !(b->following = kex_calloc(nf, sizeof *b->following))) ||
      (s->p->rp.nkernels && !(b->names = kernel_names(s)))) {
    batch_free(b);
    return KEX_ENOMEM;
  }
  for (uint32_t k = 0; k < n; k++) ev_fill(s, s->pend[k].kind, s->pend[k].i, b->names, &b->parts[k]);
  for (uint32_t k = 1; k < n; k++) b->following[k - 1] = &b->parts[k].ev;
  if (last) b->following[nf - 1] = last;
  b->parts[0].ev.n_following = nf;
  b->parts[0].ev.following = b->following;
  b->msg = &b->parts[0].ev;
  return 0;
}

/*
 * The queued events are out (kexd_stream_ops.drained).  Batched, the
 * pending events go out as one message, except while a quick chain is out
 * (cork): then they wait for its end and leave with the done event.  Then
 * nothing until the end is known; then the done event (a success) in one
 * batch with the status, after the pending events in the same message.
 * Only when that batch went out does the client have the output handles
 * (kexd_stream_delivered; else the release frees the outputs).
 */
static void sub_drained(void *owner) {
  submission *s = owner;
  int max = s->d->cfg.max_message;
  bool ok_end = s->final_ready && s->final_status == GRPC_STATUS_OK;
  ev_batch b;
  if (s->npend && !ok_end && (s->final_ready || !(s->cork && s->items_out > 0))) {
    int rc = batch_make(s, NULL, &b);
    s->npend = 0;
    if (!rc) kexd_stream_write(&s->st, &b.msg->base); /* the pump goes on when it fails: a skipped event */
    batch_free(&b);
    return;
  }
  if (!s->final_ready) return;
  if (s->final_status == GRPC_STATUS_OK) {
    if (batch_make(s, s->final_ev, &b) < 0) { /* the progress events are best effort: the done goes alone */
      s->npend = 0;
      b = (ev_batch){.msg = s->final_ev};
    }
    size_t size = protobuf_c_message_get_packed_size(&b.msg->base);
    if (max > 0 && size > (size_t)max) {
      batch_free(&b);
      sub_drop_outputs(s);
      s->d->submissions_done--;
      s->d->submissions_failed++;
      s->final_status = GRPC_STATUS_RESOURCE_EXHAUSTED;
      snprintf(s->final_msg, sizeof s->final_msg, "Submit: the done event is %zu bytes, more than the server's "
               "limit of %d bytes (--max-message): ask for fewer inline bytes (inline_output_max_bytes)", size, max);
      return kexd_stream_pump(&s->st); /* again: the pending events, then the status */
    }
  }
  if (s->final_status != GRPC_STATUS_OK) return kexd_stream_failf(&s->st, s->final_status, "%s", s->final_msg);
  kexd_histogram_observe(&s->d->submit_seconds, (kexd_now_us() - s->t0) / 1e6);
  s->npend = 0;
  kexd_stream_finish_last(&s->st, &b.msg->base); /* packs the message at once */
  batch_free(&b);
}

/* Give the job back the bytes the submission reserved (when the job is still open). */
void sub_unreserve(submission *s) {
  kexd_job *job = s->reserved ? kexd_jobs_find_id(&s->d->jobs, s->job) : NULL;
  if (job) kexd_job_unreserve(job, s->reserved);
  s->reserved = 0;
}

/* The error status (counted), without a pump: sub_fail's body. */
static void sub_end(submission *s, int status, const char *msg) {
  sub_unreserve(s);
  snprintf(s->final_msg, sizeof s->final_msg, "%s", msg);
  s->final_status = status;
  s->final_ready = true;
  s->d->submissions_failed++;
  kex_log(KEX_LOG_INFO, s->log_id, 0, "Submit %" PRIu64 " failed: %s", s->id, s->final_msg);
}

/* End the submission with an error status (counted), once the queued events are out. */
void sub_fail(submission *s, int status, const char *fmt, ...) {
  char msg[KEX_ERROR_MSG_MAX];
  KEX_VFORMAT(msg, fmt);
  sub_end(s, status, msg);
  kexd_stream_pump(&s->st);
}

/* Run work on the worker pool, holding a reference on the stream that `after` drops; the Submit fails when the pool cannot take it. */
static void sub_queue_work(submission *s, kex_work_fn work, kex_work_after_fn after) {
  s->work.fn = work;
  s->work.after = after;
  s->work.data = s;
  s->work.background = s->beam.width > 0; /* the build searches: other calls' pool work goes first */
  kexd_stream_ref(&s->st);
  if (kexd_work_submit(s->d, &s->work) < 0) {
    kexd_stream_unref(&s->st);
    sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the worker pool is not available");
  }
}

/* A failure code as the call's status: the deadline and a gone job win over what the items said. */
void sub_fail_rc(submission *s, int rc, const kex_error *err) {
  kexd *d = s->d;
  const char *msg = err && err->msg[0] ? err->msg : kex_strerror(rc);
  if (!kexd_jobs_find_id(&d->jobs, s->job))
    sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: the job was closed during the submission");
  else if (kexd_call_time_left(s->call) <= 0)
    sub_fail(s, GRPC_STATUS_DEADLINE_EXCEEDED, "Submit: the deadline passed (%s)", msg);
  else
    sub_fail(s, kex_err_grpc_status(rc), "Submit: %s", msg);
}

/* The client cancelled (or its deadline), or a write broke (kexd_stream_ops.cancelled): the work stops. */
static void sub_cancelled(void *owner) {
  submission *s = owner;
  atomic_store(&s->cancelled, true);
  kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": cancelled by the client (or its deadline)", s->id);
  if (kex_engine_programs_cancel(&s->preq)) { /* waiting for a compile slot with none in flight: it left the line */
    sub_end(s, GRPC_STATUS_CANCELLED, "Submit: cancelled"); /* no pump: one could free s under the stream */
  }
}

/*
 * A write after this one is coming (kexd_stream_ops.more): the end is known
 * (once the queued events are out, sub_drained writes the done event or the
 * status at once), or the device items are out with defer_done (sub_post):
 * the loop hears of them only when the chain is back, and the events written
 * meanwhile would arrive together with the next anyway (submit.h,
 * SUB_DEFER_KERNEL_US), so they wait in gRPC's buffer and go out in one TCP
 * write with it.  The first done back before the end ends that (item_done).
 */
static bool sub_more(void *owner) {
  const submission *s = owner;
  return s->final_ready || (s->cork && s->items_out > 0);
}

static const kexd_stream_ops sub_ops = {"Submit", ev_write, sub_drained, sub_cancelled, sub_release, NULL, sub_more};

/* ---- the engine's program stage (realize/engine.h) for a submission ---- */

static bool preq_dead(kex_prog_req *r) { return kexd_stream_dead(&((submission *)r->owner)->st); }
static void preq_hold(kex_prog_req *r) { kexd_stream_ref(&((submission *)r->owner)->st); }
static void preq_release(kex_prog_req *r) { kexd_stream_unref(&((submission *)r->owner)->st); /* may free s */ }

/* Whether sources a and b are the same but for their kernels' names na and nb (tinygrad's name counter calls the
 * second of two identical kernels "...n1"): a program of one runs the other. */
static bool same_but_name(const char *a, const char *na, const char *b, const char *nb) {
  size_t la = strlen(na), lb = strlen(nb);
  if (!la || !lb || strlen(a) - la != strlen(b) - lb) return false;
  while (*a && *b) {
    if (strncmp(a, na, la) == 0 && strncmp(b, nb, lb) == 0) {
      a += la, b += lb;
      continue;
    }
    if (*a++ != *b++) return false;
  }
  return *a == *b;
}

/*
 * The engine's gate (kex_prog_req.admit), once the lookup left kernels to
 * compile: refused (KEX_ELIMIT, RESOURCE_EXHAUSTED) while the tenant's
 * compile budget is spent, naming the tenant, the budget and when the next
 * compile is possible; a submission whose kernels are all loaded or in
 * SQLite never gets here.
 */
static int preq_admit(kex_prog_req *r, kex_error *err) {
  submission *s = r->owner;
  kexd_tenant_use *u = s->use;
  double wait = u && !kexd_stream_dead(&s->st) ? kexd_tenant_budget_wait(u, uv_now(s->d->loop)) : 0;
  if (wait <= 0) return 0;
  u->refused++;
  u->compile_budget_refused++;
  return kex_err_set(err, KEX_ELIMIT,
                     "tenant '%s' has spent its compile budget, %s %g s per hour (%s): %u kernel%s need%s compiling, "
                     "the next compile is possible in %.1f s (kernels in the program cache still run)",
                     u->name, u->compile_budget_flag ? "--tenant-compile-budget" : "max_compile_seconds",
                     u->compile_budget_s, u->compile_budget_flag ? "no max_compile_seconds in --auth" : "--auth",
                     r->nmisses, r->nmisses == 1 ? "" : "s", r->nmisses == 1 ? "s" : "", ceil(wait * 10) / 10);
}

/* Every program is read or compiled (or the stage failed, or the call is gone): go on to the device, or fail. */
static void preq_done(kex_prog_req *r) {
  submission *s = r->owner;
  uint64_t us = 0;
  for (uint32_t k = 0; k < r->rp->nkernels; k++) /* every compile that ran, failed or timed out ones too */
    us += (uint64_t)r->compile_us[k];
  if (s->use) { /* its tenant pays its compiles: the counter and the budget */
    __atomic_fetch_add(&s->use->compile_us, us, __ATOMIC_RELAXED);
    if (us) kexd_tenant_budget_charge(s->use, us / 1e6, uv_now(s->d->loop));
  }
  if (kexd_stream_dead(&s->st)) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (r->rc < 0) return sub_fail_rc(s, r->rc, &r->err);
  sub_post(s);
}

/* The plan is known: reserve memory, resolve the handles and the loaded programs, go on. */
static void sub_planned(submission *s) {
  kexd *d = s->d;
  kexd_submitter *S = d->submitter;
  const plan *p = s->p;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, s->job);
  kex_error err = {0};
  uint32_t nk = p->rp.nkernels ? p->rp.nkernels : 1, nb = p->rp.nbufs ? p->rp.nbufs : 1, no = p->rp.noutputs ? p->rp.noutputs : 1;
  bool any = false;
  if (kexd_stream_dead(&s->st)) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (!job) return sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: the job was closed during the submission");
  ev_push(s, EV_SCHEDULED, 0);
  s->handles = kex_calloc(nb, sizeof *s->handles);
  s->bufs = kex_calloc(nb, sizeof *s->bufs);
  s->progs = kex_calloc(nk, sizeof *s->progs);
  s->out_bufs = kex_calloc(no, sizeof *s->out_bufs);
  s->out_data = kex_calloc(no, sizeof *s->out_data);
  s->kernel_us = kex_calloc(nk, sizeof *s->kernel_us);
  s->need = kex_calloc(nk, sizeof *s->need);
  s->bins = kex_calloc(nk, sizeof *s->bins);
  s->binlens = kex_calloc(nk, sizeof *s->binlens);
  s->compile_us = kex_calloc(nk, sizeof *s->compile_us);
  s->from = kex_calloc(nk, sizeof *s->from);
  s->lps = kex_calloc(nk, sizeof *s->lps);
  s->pinned = kex_calloc(nk, sizeof *s->pinned);
  if (!s->handles || !s->bufs || !s->progs || !s->out_bufs || !s->out_data || !s->kernel_us || !s->need || !s->bins ||
      !s->binlens || !s->compile_us || !s->from || !s->lps || !s->pinned)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (p->rp.buf_handle[b] < 0) continue;
    const kex_gnode *n = &s->g->nodes[p->rp.buf_handle[b]];
    kexd_buffer *kb = kexd_job_find_buffer(job, n->handle);
    if (!kb) return sub_fail(s, GRPC_STATUS_NOT_FOUND, "Submit: node %d: buffer \"%.40s\" was freed", p->rp.buf_handle[b], n->handle);
    if (kb->device != s->device)
      return sub_fail(s, GRPC_STATUS_INVALID_ARGUMENT, "Submit: node %d: buffer %.8s is on device \"%s\", the graph runs on \"%s\"",
                      p->rp.buf_handle[b], kb->handle, d->cfg.devices[kb->device], d->cfg.devices[s->device]);
    kexd_buffer_ref(kb);
    s->handles[b] = kb;
    s->bufs[b] = kb->dev_buf; /* the pointer only: the runner dereferences it */
  }
  if (kexd_job_reserve(job, p->rp.alloc_bytes, &err) < 0)
    return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: %s (the submission needs %" PRIu64 " bytes)", err.msg,
                    p->rp.alloc_bytes);
  s->reserved = p->rp.alloc_bytes;
  for (uint32_t k = 0; k < p->rp.nkernels; k++) {
    if (p->same_as && p->same_as[k] >= 0) continue; /* runs an earlier kernel's program (setup_items) */
    loaded_prog *lp = loaded_find(&S->loaded[s->device], p->rp.progs[k].hash);
    if (lp) { /* loaded: pinned until the submission's last item is back */
      lp->pins++;
      lp->last_used = ++S->clock;
      s->lps[k] = lp;
      s->pinned[k] = true;
      s->progs[k] = lp->prog; /* the pointer only: the runner dereferences it */
      d->prog_cache_memory_hits++;
      continue;
    }
    if (!(lp = kex_calloc(1, sizeof *lp))) return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    memcpy(lp->hash, p->rp.progs[k].hash, SUB_HASH);
    snprintf(lp->name, sizeof lp->name, "%s", p->rp.progs[k].name);
    lp->device = s->device;
    lp->S = S;
    s->lps[k] = lp;
    s->need[k] = true;
    ev_push(s, EV_COMPILING, k), any = true;
  }
  if (!any) { /* every program loaded: the device items first, so the runner starts while the events are written */
    sub_post(s);
    return kexd_stream_pump(&s->st); /* the caller holds a reference: s stays */
  }
  kexd_stream_pump(&s->st);
  s->preq = (kex_prog_req){.rp = &p->rp, .need = s->need, .cancelled = &s->cancelled, .trace = s->trace, .owner = s,
                           .payer = s->payer, .weight = s->weight,
                           .dead = preq_dead, .hold = preq_hold, .release = preq_release, .done = preq_done,
                           .admit = preq_admit,
                           .bins = s->bins, .binlens = s->binlens, .compile_us = s->compile_us, .from = s->from};
  kex_engine_programs(d->engines[s->device], &s->preq); /* SQLite, then the compile slots */
}

static void build_work(kex_work *w) {
  submission *s = w->data;
  plan *p = s->p;
  double t0 = kexd_now_us();
  s->pool_rc = 0;
  kex_plan_policy pol;
  kex_plan_policy_hand(&pol);
  if (s->beam.width > 0) {
    pol.kind = KEX_PLAN_HOOK;
    pol.lower = beam_lower;
    pol.lower_arg = &s->beam;
    pol.cancel = &s->cancelled;
  }
  pol.trace = s->trace;
  if (!p->rp.s) { /* large: the replay and schedule the loop left to the pool */
    uint64_t tt = SUB_TRACE_NOW(s);
    s->pool_rc = kex_plan_schedule(&p->rp, NULL, &s->pool_err);
    sub_span(s, "worker", "plan", "replay + schedule", NULL, tt);
  }
  if (!s->pool_rc) s->pool_rc = kex_plan_lower(&p->rp, &pol, &s->pool_err);
  if (!s->pool_rc) plan_same_sources(p);
  p->build_us += kexd_now_us() - t0;
}

static void build_after(kex_work *w, int status) {
  submission *s = w->data;
  if (status < 0 && !s->pool_rc) s->pool_rc = kex_err_set(&s->pool_err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (s->pool_rc < 0) {
    sub_fail_rc(s, s->pool_rc, &s->pool_err);
  } else {
    plan_cache_add(s->d, s->p);
    sub_planned(s);
  }
  kexd_stream_unref(&s->st); /* the build's: may free s */
}

void kexd_rpc_submit(kexd *d, kexd_call *c, kexd_req *rq) {
  kexd_submitter *S = d->submitter;
  uint64_t tdec = rq->arrived_us; /* a trace's "decode" span starts here */
  Kex__V1__SubmitRequest *m = rq->msg;
  submission *s = NULL;
  kexd_job *job = rq->job;
  uint8_t key[SUB_HASH];
  int dev, rc;
  double t0 = kexd_now_us();
  uint64_t tr0 = m->trace ? kex_trace_now_us() : 0; /* the request is decoded by now */
  Kex__V1__Graph *kept = NULL; /* graph_ref's graph with the bindings: m->graph until decoded */
  kex_error kerr;
  d->submissions++;
  if (m->graph_ref && *m->graph_ref) {
    if (m->graph) {
      d->submissions_failed++;
      kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Submit: graph and graph_ref go alone (one or the other)");
      goto out;
    }
    if (!(kept = kexd_kept_bind(job, m, &kerr))) {
      d->submissions_failed++;
      kexd_call_failf(c, kex_err_grpc_status(kerr.code), "%s", kerr.msg);
      goto out;
    }
    m->graph = kept;
  } else if (m->n_bindings) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Submit: bindings need a graph_ref");
    goto out;
  }
  if (!m->graph) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "Submit: missing graph");
    goto out;
  }
  uint32_t width = rq->beam_width; /* 0: hand-coded; a search the method table allowed (rpc.c's search column) */
  if ((dev = kexd_rpc_device_index(d, m->graph->device)) < 0) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "graph: device \"%.64s\" is not one of this kexd's devices",
                    m->graph->device);
    goto out;
  }
  if (kexd_rpc_submit_begin(d, c, job, width) < 0) { d->submissions_failed++; goto out; } /* request.c: limits */
  if (!(s = kex_calloc(1, sizeof *s))) {
    d->submissions_failed++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    goto out;
  }
  s->d = d;
  s->call = c;
  s->id = d->submissions;
  s->job = job->id;
  s->weight = job->weight;
  s->use = job->use;
  if (d->auth && job->use)
    snprintf(s->payer, sizeof s->payer, "tenant %s", job->use->name);
  else
    snprintf(s->payer, sizeof s->payer, "job %" PRIu64, job->id);
  memcpy(s->log_id, job->log_id, sizeof s->log_id);
  s->device = (uint32_t)dev;
  s->t0 = t0;
  s->free_outputs = m->free_outputs;
  s->only_done = m->only_done;
  s->batched = m->batched_events;
  s->inline_max = m->return_bytes || m->free_outputs ? UINT64_MAX
                  : m->inline_output_max_bytes       ? m->inline_output_max_bytes
                                                     : d->cfg.inline_output_max;
  atomic_init(&s->cancelled, false);
  if (m->trace && !(s->trace = kex_trace_create())) {
    sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory for the trace");
    goto out;
  }
  if (width)
    s->beam = (kexd_beam_req){d, s->device, job->id, job->weight, (int)width, m->beam ? (int)m->beam->max_upcast : 0,
                              m->beam ? (int)m->beam->max_local : 0, m->beam ? m->beam->timeout_ms : 0, &s->cancelled,
                              job->use->name, job->use};
  kexd_stream_start(&s->st, d->streams, c, &sub_ops, s);
  kexd_stream_ref(&s->st); /* this handler's, dropped at its end: nothing frees s under it */
  if ((rc = kexd_rpc_graph_from_pb(d, m->graph, m->graph->device && *m->graph->device ? m->graph->device : NULL,
                                   &d->cfg.limits, job, &s->g, &s->err)) < 0) {
    sub_fail(s, kex_err_grpc_status(rc), "%s", s->err.msg);
    goto out;
  }
  if (s->trace) kex_trace_span(s->trace, "daemon", "request", "decode (protobuf)", NULL, tdec, tr0);
  sub_span(s, "daemon", "request", "validate + graph from protobuf", NULL, tr0);
  structure_key(m->graph, s->device, &s->beam, key);
  if (m->keep_as && *m->keep_as && !kept &&
      (rc = kexd_kept_put(job, m->keep_as, m->graph, d->cfg.max_kept_graphs, d->cfg.max_kept_graph_bytes, &kerr)) < 0) {
    sub_fail(s, kex_err_grpc_status(rc), "%s", kerr.msg);
    goto out;
  }
  plan *p = plan_cache_find(S, key);
  sub_span(s, "daemon", "plan", p ? "structure cache: hit" : "structure cache: miss", NULL, SUB_TRACE_NOW(s));
  if (p) {
    d->sched_cache_hits++;
    s->schedule_cached = true;
    s->p = p;
    p->refs++;
    ev_push(s, EV_ACCEPTED, 0);
    sub_planned(s);
    goto out;
  }
  d->sched_cache_misses++;
  if (!(p = kex_calloc(1, sizeof *p))) {
    sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
    goto out;
  }
  p->refs = 1;
  p->last_max_kernel_us = -1;
  memcpy(p->key, key, sizeof key);
  p->device = s->device;
  p->g = s->g;
  kex_plan_init(&p->rp, p->g, &d->targets[s->device]);
  s->p = p;
  ev_push(s, EV_ACCEPTED, 0);
  if (s->g->nnodes <= d->cfg.plan_inline_nodes) { /* small: replay and schedule here, render on the pool */
    double ts = kexd_now_us();
    uint64_t tt = SUB_TRACE_NOW(s);
    rc = kex_plan_schedule(&p->rp, NULL, &s->err);
    sub_span(s, "daemon", "plan", "replay + schedule", NULL, tt);
    if (rc < 0) {
      sub_fail(s, kex_err_grpc_status(rc), "%s", s->err.msg);
      goto out;
    }
    p->build_us = kexd_now_us() - ts;
  }
  kexd_stream_pump(&s->st);
  sub_queue_work(s, build_work, build_after);
out:
  if (kept) { /* the request does not own it */
    m->graph = NULL;
    protobuf_c_message_free_unpacked(&kept->base, &kex_pb_allocator);
  }
  if (s) kexd_stream_unref(&s->st); /* may free s */
}

/* ---- a submission on its device runner (dispatch.c): SETUP, one item per plan step, FINISH; then the done event ---- */

static int item_fail(submission *s, int rc, kex_error *err, const char *what) {
  char m[KEX_ERROR_MSG_MAX];
  snprintf(m, sizeof m, "%s", err->msg[0] ? err->msg : kex_strerror(rc));
  s->failed = true;
  return kex_err_set(err, rc, "%s: %s", what, m);
}

/* trace: the span [t0, now) on the submission's device track ("device NAME") */
static void device_span(submission *s, const char *cat, const char *name, const char *detail, uint64_t t0) {
  char track[96];
  snprintf(track, sizeof track, "device %s", s->d->cfg.devices[s->device]);
  sub_span(s, track, cat, name, detail, t0);
}

static int setup_items(submission *s, kex_device *dev, kex_error *err);

/* SETUP: load the new programs, allocate the buffers, copy the inputs in. */
static int setup_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  submission *s = arg;
  (void)device_s;
  uint64_t t0 = SUB_TRACE_NOW(s);
  if (s->trace) kex_trace_span(s->trace, "queue", "queue", "queue wait (fair queue)", NULL, s->posted_us, t0);
  int rc = setup_items(s, dev, err);
  if (s->trace) device_span(s, "run", "setup: load programs, allocate, inputs in", NULL, t0);
  return rc;
}

static int setup_items(submission *s, kex_device *dev, kex_error *err) {
  const plan *p = s->p;
  int rc = 0;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  for (uint32_t i = 0; i < p->rp.nkernels; i++) {
    if (p->same_as && p->same_as[i] >= 0) { /* the same source as an earlier kernel (loaded by now): its program */
      s->progs[i] = s->progs[p->same_as[i]];
      continue;
    }
    if (s->progs[i]) continue; /* loaded already: the loop pinned it for this submission */
    if (!s->bins[i]) return item_fail(s, KEX_EINTERNAL, err, "a program is neither loaded nor compiled");
    if ((rc = kex_device_load(dev, s->bins[i], s->binlens[i], p->rp.progs[i].name, &s->progs[i], err)) < 0)
      return item_fail(s, rc, err, p->rp.progs[i].name);
  }
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (!p->rp.buf_alloc[b]) continue;
    if ((rc = kex_device_alloc(dev, p->rp.buf_bytes[b] ? p->rp.buf_bytes[b] : 16, &s->bufs[b], err)) < 0) {
      char what[64];
      snprintf(what, sizeof what, "allocating buffer %u (%zu bytes)", b, (size_t)p->rp.buf_bytes[b]);
      return item_fail(s, rc, err, what);
    }
  }
  for (uint32_t i = 0; i < p->rp.ninputs; i++) {
    const kex_plan_input *in = &p->rp.inputs[i];
    void *host = kex_malloc(in->bytes ? in->bytes : 1);
    char what[64];
    if (!host) return item_fail(s, KEX_ENOMEM, err, "out of memory filling an input");
    snprintf(what, sizeof what, "node %u (BUFFER)", in->node);
    rc = kex_fill_buffer(&s->g->nodes[in->node], host, in->bytes, err);
    if (!rc && in->bytes) rc = kex_buffer_copy_in(s->bufs[in->buf], 0, host, in->bytes, err);
    kex_free(host);
    if (rc < 0) return item_fail(s, rc, err, what);
  }
  s->setup_ok = true;
  s->ran = 1;
  return 0;
}

/* A batch of steps: kernels launched back to back and waited for together (the engine's run-steps stage);
 * cancels and deadlines act between batches.  *device_s: the kernels' profiled time, which the fair queue charges. */
static int step_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  step_arg *sa = arg;
  submission *s = sa->s;
  const kex_rplan *rp = &s->p->rp;
  int rc = 0;
  (void)dev;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  if (!s->setup_ok || s->failed) return kex_err_set(err, KEX_ECANCELLED, "an earlier item failed");
  uint64_t t0 = SUB_TRACE_NOW(s);
  uint32_t failed = sa->first;
  rc = kex_run_steps(rp, sa->first, sa->n, s->bufs, s->progs, 1, s->kernel_us, device_s, &failed, err);
  if (s->trace) { /* one span per step, laid end to end over the batch's wall time by the kernels' device times */
    char track[96];
    snprintf(track, sizeof track, "device %s", s->d->cfg.devices[s->device]);
    uint64_t t1 = SUB_TRACE_NOW(s), at = t0;
    for (uint32_t i = sa->first; i < sa->first + sa->n; i++) {
      const kex_plan_step *st = &rp->steps[i];
      if (st->kind != KEX_PLAN_STEP_KERNEL) {
        if (st->size) device_span(s, "run", "copy", NULL, at);
        continue;
      }
      char detail[64];
      snprintf(detail, sizeof detail, "kernel %u of %u", st->kernel + 1, rp->nkernels);
      uint64_t end = at + (uint64_t)s->kernel_us[st->kernel];
      kex_trace_span(s->trace, track, "run", rp->progs[st->kernel].name, detail, at, end < t1 ? end : t1);
      at = end < t1 ? end : t1;
    }
  }
  if (rc < 0) {
    const kex_plan_step *st = &rp->steps[failed];
    return item_fail(s, rc, err, st->kind == KEX_PLAN_STEP_KERNEL ? rp->progs[st->kernel].name : "copy");
  }
  s->ran += sa->n;
  return 0;
}

/*
 * One output: its buffer (out_bufs[j], except ALIAS) and its inline bytes
 * (when small enough).  With free_outputs only the bytes: a DIRECT output's
 * buffer stays in bufs (finish frees it) and GATHER/CONST get no buffer.
 */
static int output_run(submission *s, kex_device *dev, uint32_t j, kex_error *err) {
  const kex_plan_output *o = &s->p->rp.outputs[j];
  bool inl = o->nbytes <= s->inline_max;
  uint8_t *host = NULL;
  int rc = 0;
  if (o->kind == KEX_PLAN_OUT_DIRECT || o->kind == KEX_PLAN_OUT_ALIAS) {
    kex_buffer *b = s->bufs[o->buf];
    if (o->kind == KEX_PLAN_OUT_DIRECT && !s->free_outputs) {
      s->out_bufs[j] = b;
      s->bufs[o->buf] = NULL;
    }
    if (!inl) return 0;
    if (!(s->out_data[j] = kex_malloc(o->nbytes ? o->nbytes : 1))) return KEX_ENOMEM;
    return o->nbytes ? kex_buffer_copy_out(b, 0, s->out_data[j], o->nbytes, err) : 0;
  }
  if (!(host = kex_calloc(o->nbytes ? o->nbytes : 1, 1))) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  if (o->kind == KEX_PLAN_OUT_CONST) {
    kex_fill_const(o->dtype, o->value, host, o->nbytes / (size_t)kex_dtype_size(o->dtype));
  } else {
    uint8_t *base = kex_malloc(o->base_bytes ? o->base_bytes : 1);
    if (!base) rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
    if (!rc && o->base_bytes) rc = kex_buffer_copy_out(s->bufs[o->buf], 0, base, o->base_bytes, err);
    if (!rc) kex_st_gather(o->st, base, (size_t)kex_dtype_size(o->dtype), host);
    kex_free(base);
  }
  if (!rc && !s->free_outputs) rc = kex_device_alloc(dev, o->nbytes ? o->nbytes : 16, &s->out_bufs[j], err);
  if (!rc && !s->free_outputs && o->nbytes) rc = kex_buffer_copy_in(s->out_bufs[j], 0, host, o->nbytes, err);
  if (!rc && inl) s->out_data[j] = host, host = NULL;
  kex_free(host);
  return rc;
}

/* FINISH (must_run): the outputs when everything ran, then free what is not an output. */
static int finish_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  submission *s = arg;
  const plan *p = s->p;
  int rc = 0;
  (void)device_s;
  bool ok = !atomic_load(&s->cancelled) && s->setup_ok && !s->failed && s->ran == 1 + p->rp.nsteps;
  uint64_t t0 = SUB_TRACE_NOW(s);
  /* the outputs that read a buffer first, then the DIRECT ones, which take theirs: another output may be a view
     of the same buffer (an ASSIGN target returned both as it is and reshaped) */
  for (int direct = 0; direct < 2; direct++)
    for (uint32_t j = 0; ok && j < p->rp.noutputs; j++)
      if ((p->rp.outputs[j].kind == KEX_PLAN_OUT_DIRECT) == direct && (rc = output_run(s, dev, j, err)) < 0) {
        char what[40];
        snprintf(what, sizeof what, "reading output %u", j);
        item_fail(s, rc, err, what);
        ok = false;
      }
  for (uint32_t b = 0; b < p->rp.nbufs; b++) {
    if (p->rp.buf_alloc[b]) kex_buffer_free(s->bufs[b]);
    s->bufs[b] = NULL;
  }
  if (s->trace) device_span(s, "output", "outputs: device to host, free", NULL, t0);
  if (!ok) {
    for (uint32_t j = 0; j < p->rp.noutputs; j++) {
      kex_buffer_free(s->out_bufs[j]);
      s->out_bufs[j] = NULL;
    }
    return rc < 0 ? rc : kex_err_set(err, KEX_ECANCELLED, "the submission did not run to its end");
  }
  return 0;
}

/* The done event (outputs registered as the job's buffers); 0 or a negative code with the call to fail. */
static int build_done(submission *s, kexd_job *job, kex_error *err) {
  kexd *d = s->d;
  const plan *p = s->p;
  Kex__V1__SubmitEvent *ev = kex_calloc(1, sizeof *ev);
  Kex__V1__Done *done = kex_calloc(1, sizeof *done);
  int rc = 0;
  if (!ev || !done) {
    kex_free(ev), kex_free(done);
    return kex_err_set(err, KEX_ENOMEM, "out of memory");
  }
  kex__v1__submit_event__init(ev);
  kex__v1__done__init(done);
  ev->event_case = KEX__V1__SUBMIT_EVENT__EVENT_DONE;
  ev->done = done;
  s->final_ev = ev;
  done->outputs = kex_calloc(p->rp.noutputs ? p->rp.noutputs : 1, sizeof *done->outputs);
  done->kernels = kex_calloc(p->rp.nkernels ? p->rp.nkernels : 1, sizeof *done->kernels);
  s->handle_str = kex_calloc(p->rp.noutputs ? p->rp.noutputs : 1, sizeof *s->handle_str);
  if (!done->outputs || !done->kernels || !s->handle_str) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  for (uint32_t j = 0; j < p->rp.noutputs; j++) {
    const kex_plan_output *o = &p->rp.outputs[j];
    Kex__V1__Output *out = kex_malloc(sizeof *out);
    if (!out) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__output__init(out);
    done->outputs[done->n_outputs++] = out;
    if (o->kind == KEX_PLAN_OUT_ALIAS) {
      const kexd_buffer *kb = s->handles[o->buf];
      memcpy(s->handle_str[j], kb->handle, sizeof s->handle_str[j]);
    } else if (s->free_outputs) {
      s->handle_str[j][0] = '\0'; /* bytes only: the runner freed (or never made) the buffer */
    } else {
      kexd_buffer *kb;
      if ((rc = kexd_job_add_buffer(&d->jobs, job, s->out_bufs[j], s->device, o->dtype, o->shape, o->ndim, o->nbytes,
                                    &kb)) < 0)
        return kex_err_set(err, rc, "cannot record output %u: %s", j, kex_strerror(rc));
      s->out_bufs[j] = NULL;
      memcpy(s->handle_str[j], kb->handle, sizeof s->handle_str[j]);
    }
    out->handle = s->handle_str[j];
    out->dtype = (char *)kex_dtypes[o->dtype].name;
    out->n_shape = o->ndim;
    out->shape = (int64_t *)o->shape;
    out->bytes = o->nbytes;
    if (s->out_data[j]) {
      out->has_data = true;
      out->data.data = s->out_data[j];
      out->data.len = o->nbytes;
    }
  }
  for (uint32_t k = 0; k < p->rp.nkernels; k++) {
    Kex__V1__KernelTime *kt = kex_malloc(sizeof *kt);
    if (!kt) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    kex__v1__kernel_time__init(kt);
    kt->kernel = (char *)p->rp.progs[k].name;
    kt->compile_us = s->compile_us ? s->compile_us[k] : 0;
    kt->run_us = s->kernel_us[k];
    kt->opts = p->rp.progs[k].opts; /* the applied opts, as kex run prints them */
    done->kernels[done->n_kernels++] = kt;
    if (s->from) {
      if (s->from[k] == 0) done->programs_memory++;
      else if (s->from[k] == 1) done->programs_sqlite++;
      else done->programs_compiled++;
    } else {
      done->programs_memory++;
    }
  }
  done->schedule_cached = s->schedule_cached;
  done->schedule_us = s->schedule_cached ? 0 : p->build_us;
  done->total_us = kexd_now_us() - s->t0;
  if (s->trace) {
    char label[64];
    sub_span(s, "daemon", "output", "done event", NULL, SUB_TRACE_NOW(s));
    snprintf(label, sizeof label, "Submit %" PRIu64 " (job %s)", s->id, s->log_id);
    if (!(s->trace_json = kex_trace_json(s->trace, label))) return kex_err_set(err, KEX_ENOMEM, "out of memory");
    done->trace_json = s->trace_json;
  }
  return 0;
}

/* Every device item is back: register the outputs (or free them) and end the call. */
static void sub_complete(submission *s) {
  kexd *d = s->d;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, s->job);
  kex_error err = {0};
  int rc = s->rc;
  sub_unreserve(s);
  sub_release_programs(s); /* no item of it is left on the runner */
  if (!rc && (kexd_stream_dead(&s->st) || !job)) rc = kex_err_set(&s->err, KEX_ECANCELLED, "cancelled");
  if (!rc && (rc = build_done(s, job, &err)) < 0) s->err = err;
  for (uint32_t j = 0; j < s->p->rp.noutputs; j++) /* what did not become a job buffer */
    if (s->out_bufs[j]) {
      kexd_jobs_free_device_buffer(&d->jobs, s->out_bufs[j], s->device, s->job, s->weight);
      s->out_bufs[j] = NULL;
    }
  if (!rc) {
    double slowest = 0;
    for (uint32_t k = 0; k < s->p->rp.nkernels; k++)
      if (s->kernel_us[k] > slowest) slowest = s->kernel_us[k];
    s->p->last_max_kernel_us = slowest;
    if (!s->p->last_kernel_us) s->p->last_kernel_us = kex_calloc(s->p->rp.nkernels ? s->p->rp.nkernels : 1, sizeof(double));
    if (s->p->last_kernel_us) memcpy(s->p->last_kernel_us, s->kernel_us, s->p->rp.nkernels * sizeof(double));
    d->submissions_done++;
    s->final_status = GRPC_STATUS_OK;
    s->final_ready = true;
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "Submit %" PRIu64 ": %u kernels, %.0f us", s->id, s->p->rp.nkernels,
            s->final_ev->done->total_us);
    kexd_stream_pump(&s->st); /* item_done holds a reference: s stays */
  } else {
    sub_drop_outputs(s); /* the outputs build_done recorded before it failed */
    sub_fail_rc(s, rc, &s->err);
  }
}

static void item_done(kexd_work *w) {
  submission *s = w->ud;
  uint32_t idx = (uint32_t)(w - s->works);
  s->items_out--;
  if (w->rc < 0 && (!s->rc || (s->rc == KEX_ECANCELLED && w->rc != KEX_ECANCELLED))) {
    s->rc = w->rc;
    s->err = w->err;
  }
  if (idx == 0) sub_adopt_programs(s); /* whatever SETUP loaded, even when it failed later */
  /* the chain woke the loop before its end (another job's item came between): events go out as they come */
  if (s->items_out && w->woke) s->cork = false;
  bool batch = idx >= 1 && idx + 1 < s->nworks;
  if (w->rc == 0 && batch) s->d->kernel_seconds += w->device_s;
  if (w->rc == 0 && idx == 0) {
    if (s->p->rp.nkernels) ev_push(s, EV_RUNNING, 0);
  } else if (w->rc == 0 && batch) { /* the next kernel after this batch's last one is running now */
    const step_arg *sa = &s->stepargs[idx];
    for (uint32_t i = sa->first + sa->n; i-- > sa->first;)
      if (s->p->rp.steps[i].kind == KEX_PLAN_STEP_KERNEL) {
        if (s->p->rp.steps[i].kernel + 1 < s->p->rp.nkernels) ev_push(s, EV_RUNNING, s->p->rp.steps[i].kernel + 1);
        break;
      }
  }
  if (s->items_out == 0) sub_complete(s);
  else kexd_stream_pump(&s->st);
  kexd_stream_unref(&s->st); /* the item's: may free s */
}

/*
 * The batches of steps, one device item each: consecutive steps whose kernels took about --launch-quantum of
 * device time together in the plan's last run (a kernel longer than the quantum alone), at most
 * KEX_RUN_BATCH_EVENTS; SUB_FIRST_BATCH steps for a plan that never ran; one step with a quantum of 0.  A
 * batch is one turn of the job's flow: other jobs' items run between batches.  Fills sa[] (when not NULL)
 * and returns the number of batches.
 */
static uint32_t batches(const kexd *d, const plan *p, step_arg *sa, submission *s) {
  double q_us = d->cfg.launch_quantum_s * 1e6;
  uint32_t nb = 0, first = 0, n = 0;
  double us = 0;
  for (uint32_t i = 0; i < p->rp.nsteps; i++) {
    const kex_plan_step *st = &p->rp.steps[i];
    double t = st->kind != KEX_PLAN_STEP_KERNEL ? 0 : p->last_kernel_us ? p->last_kernel_us[st->kernel] : q_us;
    bool full = n && (q_us <= 0 || n == KEX_RUN_BATCH_EVENTS ||
                      (p->last_kernel_us ? us + t > q_us : n == SUB_FIRST_BATCH));
    if (full) {
      if (sa) sa[nb] = (step_arg){s, first, n};
      nb++, first = i, n = 0, us = 0;
    }
    n++, us += t;
  }
  if (n) {
    if (sa) sa[nb] = (step_arg){s, first, n};
    nb++;
  }
  return nb;
}

/* Post setup, the batches of steps and finish on the job's flow.  On failure the call is ended. */
void sub_post(submission *s) {
  kexd *d = s->d;
  const plan *p = s->p;
  uint32_t n = batches(d, p, NULL, NULL) + 2;
  s->nworks = n;
  if (kexd_stream_dead(&s->st)) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (kexd_call_time_left(s->call) <= 0) return sub_fail(s, GRPC_STATUS_DEADLINE_EXCEEDED, "Submit: the deadline passed");
  s->works = kex_calloc(n, sizeof *s->works);
  s->stepargs = kex_calloc(n, sizeof *s->stepargs);
  if (!s->works || !s->stepargs) return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
  batches(d, p, s->stepargs + 1, s);
  /* kernels that were quick last time: the setup and every step may wait for the next item to wake the loop */
  bool defer = p->last_max_kernel_us >= 0 && p->last_max_kernel_us < SUB_DEFER_KERNEL_US;
  for (uint32_t i = 0; i < n; i++) {
    kexd_work *w = &s->works[i];
    w->kind = KEXD_WORK_RUN;
    w->defer_done = defer && i < n - 1;
    w->job = s->job;
    w->weight = s->weight;
    w->done = item_done;
    w->ud = s;
    if (i == 0) w->fn = setup_run, w->arg = s;
    else if (i == n - 1) w->fn = finish_run, w->arg = s, w->must_run = true;
    else {
      w->fn = step_run;
      w->arg = &s->stepargs[i];
    }
  }
  s->posted_us = SUB_TRACE_NOW(s);
  bool idle = false;
  int rc = kexd_dispatch_post_chain(d->disp, s->device, s->works, n, &idle); /* one wake of the runner for the chain */
  if (rc < 0)
    return sub_fail(s, GRPC_STATUS_UNAVAILABLE, "Submit: the device runner is not available: %s", kex_strerror(rc));
  s->items_out = n;
  for (uint32_t i = 0; i < n; i++) kexd_stream_ref(&s->st); /* the items', each dropped by item_done */
  s->cork = defer && idle; /* sub_more: the chain runs now and is quick, so its end is near */
}

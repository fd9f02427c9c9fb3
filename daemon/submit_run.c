/*
 * submit_run.c - a submission on its device's runner (dispatch.c): the
 * SETUP item (load programs, allocate, copy inputs in), one item per plan
 * step, the FINISH item (outputs, frees), then back on the loop the done
 * event and the end of the call (submit.c's opening comment).
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/submit.h"

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

/* One kernel launch or copy. */
static int step_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  step_arg *sa = arg;
  submission *s = sa->s;
  const kex_plan_step *st = &s->p->rp.steps[sa->i];
  int rc = 0;
  (void)dev;
  if (atomic_load(&s->cancelled)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  if (!s->setup_ok || s->failed) return kex_err_set(err, KEX_ECANCELLED, "an earlier item failed");
  uint64_t t0 = SUB_TRACE_NOW(s);
  if (st->kind == KEX_PLAN_STEP_KERNEL) {
    const kex_plan_prog *pp = &s->p->rp.progs[st->kernel];
    kex_buffer *args[KEX_DEVICE_MAX_BUFS];
    kex_event *ev = NULL;
    double secs = 0;
    for (uint32_t a = 0; a < st->nargs; a++) args[a] = s->bufs[st->args[a]];
    rc = kex_program_launch(s->progs[st->kernel], pp->global, pp->has_local ? pp->local : NULL, args, (int)st->nargs,
                            NULL, 0, &ev, err);
    if (!rc) rc = kex_event_elapsed(ev, &secs, err);
    kex_event_free(ev);
    if (s->trace) {
      char detail[64];
      snprintf(detail, sizeof detail, "kernel %u of %u", st->kernel + 1, s->p->rp.nkernels);
      device_span(s, "run", pp->name, detail, t0);
    }
    if (rc < 0) return item_fail(s, rc, err, pp->name);
    *device_s = secs;
    s->kernel_us[st->kernel] = secs * 1e6;
  } else if (st->size) {
    void *tmp = kex_malloc(st->size);
    if (!tmp) return item_fail(s, KEX_ENOMEM, err, "out of memory copying");
    rc = kex_buffer_copy_out(s->bufs[st->src], st->off, tmp, st->size, err);
    if (!rc) rc = kex_buffer_copy_in(s->bufs[st->dst], 0, tmp, st->size, err);
    kex_free(tmp);
    if (s->trace) device_span(s, "run", "copy", NULL, t0);
    if (rc < 0) return item_fail(s, rc, err, "copy");
  }
  s->ran++;
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
  if (w->rc == 0 && idx >= 1 && idx <= s->p->rp.nsteps && s->p->rp.steps[idx - 1].kind == KEX_PLAN_STEP_KERNEL)
    s->d->kernel_seconds += w->device_s;
  if (w->rc == 0 && idx == 0) {
    if (s->p->rp.nkernels) ev_push(s, EV_RUNNING, 0);
  } else if (w->rc == 0 && idx <= s->p->rp.nsteps && s->p->rp.steps[idx - 1].kind == KEX_PLAN_STEP_KERNEL &&
             s->p->rp.steps[idx - 1].kernel + 1 < s->p->rp.nkernels) {
    ev_push(s, EV_RUNNING, s->p->rp.steps[idx - 1].kernel + 1);
  }
  if (s->items_out == 0) sub_complete(s);
  else kexd_stream_pump(&s->st);
  kexd_stream_unref(&s->st); /* the item's: may free s */
}

/* Post setup, the steps and finish on the job's flow.  On failure the call is ended. */
void sub_post(submission *s) {
  kexd *d = s->d;
  const plan *p = s->p;
  uint32_t n = p->rp.nsteps + 2;
  if (kexd_stream_dead(&s->st)) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (kexd_call_time_left(s->call) <= 0) return sub_fail(s, GRPC_STATUS_DEADLINE_EXCEEDED, "Submit: the deadline passed");
  s->works = kex_calloc(n, sizeof *s->works);
  s->stepargs = kex_calloc(n, sizeof *s->stepargs);
  if (!s->works || !s->stepargs) return sub_fail(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "Submit: out of memory");
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
      s->stepargs[i] = (step_arg){s, i - 1};
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

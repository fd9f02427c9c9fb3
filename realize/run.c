/*
 * run.c - the run-steps stage (kex_run_steps) and `kex run` in-process
 * (kex_run_graph: the plan builder, the engine's program stage, this).
 *
 * One device buffer per buffer the plan allocates -> BUFFER inputs copied
 * in -> every program from the engine (the SQLite cache, else compiled)
 * and loaded -> the steps in order: COPY copies bytes, a kernel is
 * launched, timed as the median of `repeat` runs after a warm-up -> the
 * outputs read back as the plan says (the buffer itself, its view
 * gathered, or a folded constant).  kexd runs the same steps on its device
 * runner (daemon/submit.c), a batch of steps per item.
 */
#include "realize/run.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One launch; *secs = its device time. */
static int launch_once(kex_program *prog, const kex_plan_prog *pp, kex_buffer *const *args, uint32_t nargs,
                       double *secs, kex_error *err) {
  kex_event *ev = NULL;
  *secs = 0;
  int rc = kex_program_launch(prog, pp->global, pp->has_local ? pp->local : NULL, args, (int)nargs, NULL, 0, &ev, err);
  if (!rc) rc = kex_event_elapsed(ev, secs, err);
  kex_event_free(ev);
  return rc;
}

#define WARMUP_MIN_LAUNCHES 3
#define WARMUP_MAX_LAUNCHES 10
#define WARMUP_SECONDS 0.02

/*
 * Launch prog `runs` times; *secs_out = the median kernel time (seconds).  With runs > 1 the
 * timed runs follow a warm-up of 3 to 10 launches (until 20 ms of kernel
 * time): on these VMs freshly written pages run 2-4x slower for the first
 * launches, which would otherwise land in the median.
 */
static int time_launches(kex_program *prog, const kex_plan_prog *pp, kex_buffer *const *args, uint32_t nargs, int runs,
                         double *secs_out, kex_error *err) {
  double *t = kex_malloc(sizeof *t * (size_t)runs);
  if (!t) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  int rc = 0;
  double warm = 0, secs = 0;
  for (int w = 0; runs > 1 && !rc && w < WARMUP_MAX_LAUNCHES && (w < WARMUP_MIN_LAUNCHES || warm < WARMUP_SECONDS); w++) {
    rc = launch_once(prog, pp, args, nargs, &secs, err);
    warm += secs;
  }
  for (int i = 0; i < runs && !rc; i++) {
    rc = launch_once(prog, pp, args, nargs, &secs, err);
    t[i] = secs;
  }
  if (!rc) {
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    *secs_out = t[runs / 2];
  }
  kex_free(t);
  return rc;
}

/* Copy `size` bytes from src (at src_off) to dst through the host. */
static int copy_between(kex_buffer *dst, kex_buffer *src, size_t src_off, size_t size, kex_error *err) {
  if (!size) return 0;
  void *tmp = kex_malloc(size);
  if (!tmp) return kex_err_set(err, KEX_ENOMEM, "out of memory copying %zu bytes", size);
  int rc = kex_buffer_copy_out(src, src_off, tmp, size, err);
  if (!rc) rc = kex_buffer_copy_in(dst, 0, tmp, size, err);
  kex_free(tmp);
  return rc;
}

/* Read output j of plan p into o (its own shape, row-major). */
static int read_output(const kex_rplan *p, kex_buffer **bufs, uint32_t j, kex_run_output *o, kex_error *err) {
  const kex_plan_output *po = &p->outputs[j];
  o->dtype = po->dtype;
  o->ndim = po->ndim;
  memcpy(o->shape, po->shape, sizeof(int64_t) * (size_t)o->ndim);
  o->nbytes = po->nbytes;
  size_t item = (size_t)kex_dtype_size(po->dtype), n = po->nbytes / item;
  o->data = kex_calloc(n ? n : 1, item);
  if (!o->data) return kex_err_set(err, KEX_ENOMEM, "out of memory reading an output");
  switch (po->kind) {
  case KEX_PLAN_OUT_CONST: /* folded to a constant: nothing ran */
    kex_fill_const(po->dtype, po->value, o->data, n);
    return 0;
  case KEX_PLAN_OUT_DIRECT:
  case KEX_PLAN_OUT_ALIAS:
    return o->nbytes ? kex_buffer_copy_out(bufs[po->buf], 0, o->data, o->nbytes, err) : 0;
  case KEX_PLAN_OUT_GATHER: break;
  }
  void *host = kex_malloc(po->base_bytes ? po->base_bytes : 1);
  if (!host) return kex_err_set(err, KEX_ENOMEM, "out of memory reading an output");
  int rc = po->base_bytes ? kex_buffer_copy_out(bufs[po->buf], 0, host, po->base_bytes, err) : 0;
  if (!rc) kex_st_gather(po->st, host, item, o->data);
  kex_free(host);
  return rc;
}

/* Kernels launched and not yet waited for (at most KEX_RUN_BATCH_EVENTS): their events and steps. */
typedef struct pending {
  kex_event *ev[KEX_RUN_BATCH_EVENTS];
  uint32_t step[KEX_RUN_BATCH_EVENTS];
  uint32_t n;
} pending;

/* Wait for the pending kernels in launch order; each one's time to kernel_us, their sum to *device_s.  The first
 * that failed names *failed; the others are still waited for (their buffers are the caller's to free). */
static int drain(const kex_rplan *p, pending *q, double *kernel_us, double *device_s, uint32_t *failed,
                 kex_error *err) {
  int rc = 0;
  for (uint32_t i = 0; i < q->n; i++) {
    double secs = 0;
    kex_error e2;
    int r = kex_event_elapsed(q->ev[i], &secs, rc ? &e2 : err);
    kex_event_free(q->ev[i]);
    if (r < 0 && !rc) rc = r, *failed = q->step[i];
    kernel_us[p->steps[q->step[i]].kernel] = secs * 1e6;
    if (device_s) *device_s += secs;
  }
  q->n = 0;
  return rc;
}

int kex_run_steps(const kex_rplan *p, uint32_t first, uint32_t n, kex_buffer *const *bufs, kex_program *const *progs,
                  int repeat, double *kernel_us, double *device_s, uint32_t *failed, kex_error *err) {
  kex_buffer *args[KEX_DEVICE_MAX_BUFS];
  pending q = {.n = 0};
  int rc = 0;
  if (device_s) *device_s = 0;
  for (uint32_t i = first; i < first + n && !rc; i++) {
    const kex_plan_step *st = &p->steps[i];
    *failed = i;
    if (st->kind == KEX_PLAN_STEP_COPY) { /* through the host: the kernels before it finish first */
      if (!(rc = drain(p, &q, kernel_us, device_s, failed, err))) {
        *failed = i;
        rc = copy_between(bufs[st->dst], bufs[st->src], st->off, st->size, err);
      }
      continue;
    }
    const kex_plan_prog *pp = &p->progs[st->kernel];
    for (uint32_t a = 0; a < st->nargs; a++) args[a] = bufs[st->args[a]];
    if (repeat > 1) { /* timed: each kernel alone, the median of `repeat` launches */
      double secs = 0;
      if ((rc = time_launches(progs[st->kernel], pp, args, st->nargs, repeat, &secs, err))) break;
      kernel_us[st->kernel] = secs * 1e6;
      if (device_s) *device_s += secs;
      continue;
    }
    /* back to back: launched now, waited for together (the device's queue runs them in order) */
    if (q.n == KEX_RUN_BATCH_EVENTS && (rc = drain(p, &q, kernel_us, device_s, failed, err))) break;
    *failed = i;
    if ((rc = kex_program_launch(progs[st->kernel], pp->global, pp->has_local ? pp->local : NULL, args,
                                 (int)st->nargs, NULL, 0, &q.ev[q.n], err)))
      break;
    q.step[q.n++] = i;
  }
  uint32_t at = *failed;
  int rc2 = drain(p, &q, kernel_us, device_s, failed, rc ? &(kex_error){0} : err);
  if (rc) *failed = at;
  return rc ? rc : rc2;
}

/* Name kernel k of p in *err ("kernel 0 (E_2_4): ..."), keeping its message; returns rc. */
static int name_kernel(const kex_rplan *p, uint32_t k, int rc, kex_error *err) {
  char msg[KEX_ERROR_MSG_MAX];
  snprintf(msg, sizeof msg, "%s", err->msg);
  return kex_err_set(err, rc, "kernel %u (%s): %s", k, p->progs[k].name, msg);
}

/* The program stage on dev (the engine, directly on this thread), then every program loaded into progs. */
static int load_programs(const kex_rplan *p, kex_device *dev, const kex_run_opts *opts, kex_program **progs,
                         kex_error *err) {
  kex_cache_conns *conns = NULL;
  kex_engine *e = NULL;
  uint32_t nk = p->nkernels ? p->nkernels : 1;
  bool *need = kex_calloc(nk, sizeof *need);
  unsigned char **bins = kex_calloc(nk, sizeof *bins);
  size_t *binlens = kex_calloc(nk, sizeof *binlens);
  double *compile_us = kex_calloc(nk, sizeof *compile_us);
  uint8_t *from = kex_calloc(nk, sizeof *from);
  int rc = 0;
  if (!need || !bins || !binlens || !compile_us || !from) goto nomem;
  if (opts->program_cache) { /* a lookup (plan.h's policy): kex_cache_conns_lookup warns when the file cannot open */
    char path[4096];
    kex_error pe = {0};
    if (!opts->cache_path && kex_beam_default_cache_path(path, sizeof path, &pe) < 0)
      KEX_WARN("program cache unavailable, going on without it: %s", pe.msg);
    else if (kex_cache_conns_create(opts->cache_path ? opts->cache_path : path, &conns) < 0)
      goto nomem;
  }
  kex_engine_config ec = {.instance = dev, .fault_kind = -1, .conns = conns};
  if (kex_engine_create(&ec, &e) < 0) goto nomem;
  for (uint32_t k = 0; k < p->nkernels; k++) need[k] = true;
  kex_prog_req r = {.rp = p, .need = need, .bins = bins, .binlens = binlens, .compile_us = compile_us, .from = from};
  if ((rc = kex_engine_programs_now(e, &r)) < 0) *err = r.err;
  kex_prog_req_clear(&r);
  for (uint32_t k = 0; !rc && k < p->nkernels; k++)
    if ((rc = kex_device_load(dev, bins[k], binlens[k], p->progs[k].name, &progs[k], err))) name_kernel(p, k, rc, err);
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory running the graph");
out:
  for (uint32_t k = 0; bins && k < p->nkernels; k++) kex_free(bins[k]);
  kex_free(need), kex_free(bins), kex_free(binlens), kex_free(compile_us), kex_free(from);
  kex_engine_free(e);
  kex_cache_conns_free(conns);
  return rc;
}

/*
 * Run plan p (lowered) on dev: allocate its buffers, fill its inputs, the
 * program stage, run its steps, read its outputs.  *res as kex_run_graph's.
 */
static int plan_run(const kex_rplan *p, kex_device *dev, const kex_run_opts *opts, kex_run_result *res,
                    kex_error *err) {
  int rc = 0;
  uint32_t failed = 0;
  uint32_t nk = p->nkernels ? p->nkernels : 1;
  kex_buffer **bufs = kex_calloc(p->nbufs ? p->nbufs : 1, sizeof *bufs);
  kex_program **progs = kex_calloc(nk, sizeof *progs);
  double *kernel_us = kex_calloc(nk, sizeof *kernel_us);
  memset(res, 0, sizeof *res);
  if (!bufs || !progs || !kernel_us) goto nomem;
  for (uint32_t b = 0; b < p->nbufs; b++) {
    if (p->buf_handle[b] >= 0) { /* handles live in a kexd job: kex_fill_buffer says so */
      const kex_gnode *n = &p->g->nodes[p->buf_handle[b]];
      rc = kex_fill_buffer(n, NULL, 0, err);
      kex_err_set(err, rc, "node %d (BUFFER): %s", p->buf_handle[b], err->msg);
      goto out;
    }
    if (!p->buf_alloc[b]) continue;
    if ((rc = kex_device_check_dtype(dev, p->buf_dtype[b], err))) goto out;
    if ((rc = kex_device_alloc(dev, p->buf_bytes[b] ? p->buf_bytes[b] : 16, &bufs[b], err))) goto out;
  }
  for (uint32_t i = 0; i < p->ninputs; i++) {
    const kex_plan_input *in = &p->inputs[i];
    void *host = kex_malloc(in->bytes ? in->bytes : 1);
    if (!host) goto nomem;
    rc = kex_fill_buffer(&p->g->nodes[in->node], host, in->bytes, err);
    if (rc) kex_err_set(err, rc, "node %u (BUFFER): %s", in->node, err->msg);
    if (!rc && in->bytes) rc = kex_buffer_copy_in(bufs[in->buf], 0, host, in->bytes, err);
    kex_free(host);
    if (rc) goto out;
  }
  if ((rc = load_programs(p, dev, opts, progs, err))) goto out;
  if ((rc = kex_run_steps(p, 0, p->nsteps, bufs, progs, opts->repeat, kernel_us, NULL, &failed, err))) {
    if (p->steps[failed].kind == KEX_PLAN_STEP_KERNEL) name_kernel(p, p->steps[failed].kernel, rc, err);
    goto out;
  }
  res->kernels = kex_calloc(nk, sizeof *res->kernels);
  if (!res->kernels) goto nomem;
  for (uint32_t i = 0; i < p->nsteps; i++) {
    const kex_plan_step *st = &p->steps[i];
    if (st->kind != KEX_PLAN_STEP_KERNEL) continue;
    const kex_plan_prog *pp = &p->progs[st->kernel];
    kex_run_kernel *rk = &res->kernels[res->nkernels];
    snprintf(rk->name, sizeof rk->name, "%s", pp->name);
    snprintf(rk->opts, sizeof rk->opts, "%s", pp->opts);
    rk->us = kernel_us[st->kernel];
    if (opts->keep_source && !(rk->source = kex_strdup(pp->src))) goto nomem;
    res->nkernels++;
  }
  res->outputs = kex_calloc(p->noutputs ? p->noutputs : 1, sizeof *res->outputs);
  if (!res->outputs) goto nomem;
  for (uint32_t j = 0; j < p->noutputs; j++) {
    if ((rc = read_output(p, bufs, j, &res->outputs[j], err))) goto out;
    res->noutputs++;
  }
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory running the graph");
out:
  for (uint32_t k = 0; progs && k < p->nkernels; k++) kex_program_free(progs[k]);
  for (uint32_t b = 0; bufs && b < p->nbufs; b++)
    if (p->buf_alloc[b]) kex_buffer_free(bufs[b]);
  kex_free(bufs), kex_free(progs), kex_free(kernel_us);
  if (rc) kex_run_result_free(res);
  return rc;
}

int kex_run_graph(const kex_graph *g, kex_device *dev, const kex_run_opts *opts, kex_run_result *res,
                  kex_error *err) {
  kex_target target;
  kex_plan_policy pol;
  kex_cache *cache = NULL;
  kex_rplan *p = NULL;
  int rc;
  memset(res, 0, sizeof *res);
  kex_target_for_device(kex_device_get_info(dev), &target);
  if (opts->beam > 0) {
    kex_plan_cache_open(opts->cache_path, KEX_PLAN_CACHE_LOOKUP, "beam cache", &cache, err); /* never fails */
    kex_plan_policy_beam(&pol, opts->beam, dev, cache);
    if (opts->beam_max_candidates > 0) pol.beam.max_candidates = opts->beam_max_candidates;
  } else {
    kex_plan_policy_hand(&pol);
  }
  rc = kex_plan_build(g, &target, &pol, NULL, &p, err);
  if (!rc) rc = plan_run(p, dev, opts, res, err);
  kex_plan_destroy(p);
  kex_cache_close(cache);
  return rc;
}

void kex_run_result_free(kex_run_result *res) {
  for (uint32_t i = 0; i < res->nkernels; i++) kex_free(res->kernels[i].source);
  kex_free(res->kernels);
  for (uint32_t i = 0; i < res->noutputs; i++) kex_free(res->outputs[i].data);
  kex_free(res->outputs);
  memset(res, 0, sizeof *res);
}

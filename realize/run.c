/*
 * run.c - run a graph on one device, in-process (kex run).
 *
 * replay (device rules) -> schedule -> memory plan -> one device buffer per
 * planned buffer -> BUFFER inputs copied in -> items in schedule order:
 * EMPTY allocates nothing more, COPY and VIEW copy bytes, a kernel is
 * built with hand-coded opts, lowered, compiled, loaded and launched (timed
 * as the median of `repeat` runs after a warm-up) -> outputs read back
 * through their ShapeTracker views.  The daemon runs the same steps split
 * across its worker pool and device runner.
 */
#include "realize/run.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "core/log.h"
#include "search/beam.h"
#include "search/cache.h"
#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "codegen/target.h"
#include "sched/schedule.h"


/* Item ii lowered with the opts a BEAM search (or its cached result) chose. */
static int lower_beam(const kex_graph *g, const kex_schedule *s, uint32_t ii, const kex_target *tg, kex_device *dev,
                      const kex_run_opts *opts, kex_cache *cache, kex_name_counter *names, kex_program_src *out,
                      char *ostr, size_t olen, kex_error *err) {
  kex_beam_opts bo;
  kex_beam_opts_init(&bo, opts->beam);
  if (opts->beam_max_candidates > 0) bo.max_candidates = opts->beam_max_candidates;
  bo.cache = cache;
  kex_beam_target t = {g, s, ii, tg};
  kex_beam_result br;
  int rc = kex_beam_optimize(&t, dev, &bo, &br, err);
  if (!rc) rc = kex_target_lower_item(tg, s, &s->items[ii], br.opts, br.nopts, names, out, ostr, olen, err);
  return rc;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static size_t buf_bytes(const kex_buffer_info *bi) { return (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype); }

/* One launch; *secs = its device time. */
static int launch_once(kex_program *prog, const kex_program_src *ps, kex_buffer *const *args, double *secs,
                       kex_error *err) {
  kex_event *ev = NULL;
  *secs = 0;
  int rc = kex_program_launch(prog, ps->global, ps->has_local ? ps->local : NULL, args, (int)ps->nargs, NULL, 0, &ev,
                              err);
  if (!rc) rc = kex_event_elapsed(ev, secs, err);
  kex_event_free(ev);
  return rc;
}

#define WARMUP_MIN_LAUNCHES 3
#define WARMUP_MAX_LAUNCHES 10
#define WARMUP_SECONDS 0.02

/*
 * Launch prog `runs` times; *us = the median kernel time.  With runs > 1 the
 * timed runs follow a warm-up of 3 to 10 launches (until 20 ms of kernel
 * time): on these VMs freshly written pages run 2-4x slower for the first
 * launches, which would otherwise land in the median.
 */
static int time_launches(kex_program *prog, const kex_program_src *ps, kex_buffer *const *args, int runs, double *us,
                         kex_error *err) {
  double *t = kex_malloc(sizeof *t * (size_t)runs);
  if (!t) return kex_err_set(err, KEX_ENOMEM, "out of memory");
  int rc = 0;
  double warm = 0, secs = 0;
  for (int w = 0; runs > 1 && !rc && w < WARMUP_MAX_LAUNCHES && (w < WARMUP_MIN_LAUNCHES || warm < WARMUP_SECONDS); w++) {
    rc = launch_once(prog, ps, args, &secs, err);
    warm += secs;
  }
  for (int i = 0; i < runs && !rc; i++) {
    rc = launch_once(prog, ps, args, &secs, err);
    t[i] = secs * 1e6;
  }
  if (!rc) {
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    *us = t[runs / 2];
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

/* Read graph output lb into o (its own shape, row-major). */
static int read_output(kex_replay *r, kex_buffer **bufs, const int32_t *phys, kex_lb *lb, kex_run_output *o,
                       kex_error *err) {
  o->dtype = lb->dtype;
  o->ndim = kex_lb_ndim(lb);
  memcpy(o->shape, kex_lb_shape(lb), sizeof(int64_t) * (size_t)o->ndim);
  size_t n = (size_t)kex_lb_size(lb), item = (size_t)kex_dtype_size(lb->dtype);
  o->nbytes = n * item;
  o->data = kex_calloc(n ? n : 1, item);
  if (!o->data) return kex_err_set(err, KEX_ENOMEM, "out of memory reading an output");
  kex_lb *base = lb->base;
  if (base->op == KEX_OP_CONST && !base->realized) { /* folded to a constant: nothing ran */
    kex_fill_const(lb->dtype, kex_const_as(base->arg, lb->dtype), o->data, n);
    return 0;
  }
  const kex_buffer_info *bi = &r->buffers[base->buffer];
  size_t bytes = buf_bytes(bi);
  if (lb == base && bytes == o->nbytes) return bytes ? kex_buffer_copy_out(bufs[phys[base->buffer]], 0, o->data, bytes, err) : 0;
  void *host = kex_malloc(bytes ? bytes : 1);
  if (!host) return kex_err_set(err, KEX_ENOMEM, "out of memory reading an output");
  int rc = bytes ? kex_buffer_copy_out(bufs[phys[base->buffer]], 0, host, bytes, err) : 0;
  if (!rc) kex_st_gather(lb->st, host, item, o->data);
  kex_free(host);
  return rc;
}

int kex_run_graph(const kex_graph *g, kex_device *dev, const kex_run_opts *opts, kex_run_result *res,
                  kex_error *err) {
  int rc = 0;
  memset(res, 0, sizeof *res);
  kex_target target;
  kex_target_for_device(kex_device_get_info(dev), &target);
  kex_arena arena;
  kex_arena_init(&arena, 0);
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_buffer **bufs = NULL;
  int32_t *phys = NULL; /* replay buffer id -> index in bufs */
  kex_name_counter names;
  kex_name_counter_init(&names);
  kex_replay_opts ro = kex_target_replay_opts(&target);
  kex_cache *cache = NULL;
  if ((rc = kex_replay_graph(g, &ro, &arena, &r, err)) || (rc = kex_schedule_create(r, &s, err))) goto out;
  if (opts->beam > 0 && !(opts->cache_path && !opts->cache_path[0])) {
    char path[4096];
    kex_error ce = {0};
    int crc = opts->cache_path ? (snprintf(path, sizeof path, "%s", opts->cache_path), 0)
                               : kex_beam_default_cache_path(path, sizeof path, &ce);
    if (!crc) crc = kex_cache_open(path, &cache, &ce);
    if (crc) KEX_WARN("beam cache unavailable, searching without it: %s", ce.msg);
  }

  /* one device buffer per planned buffer id */
  bufs = kex_calloc(r->nbuffers ? r->nbuffers : 1, sizeof *bufs);
  phys = kex_malloc(sizeof *phys * (r->nbuffers ? r->nbuffers : 1));
  if (!bufs || !phys) goto nomem;
  for (uint32_t i = 0; i < r->nbuffers; i++) phys[i] = (int32_t)i;
  for (uint32_t i = 0; i < s->nitems; i++)
    for (uint32_t j = 0; j < s->items[i].nbufs; j++) phys[s->items[i].bufs[j]] = (int32_t)s->items[i].planned[j];
  for (uint32_t i = 0; i < r->nbuffers; i++) {
    uint32_t p = (uint32_t)phys[i];
    if (bufs[p]) continue;
    bool used = r->buffers[i].held;
    for (uint32_t k = 0; k < s->nitems && !used; k++)
      for (uint32_t j = 0; j < s->items[k].nbufs && !used; j++) used = (uint32_t)phys[s->items[k].bufs[j]] == p;
    if (!used) continue;
    if ((rc = kex_device_check_dtype(dev, r->buffers[p].dtype, err))) goto out;
    size_t sz = buf_bytes(&r->buffers[p]);
    if ((rc = kex_device_alloc(dev, sz ? sz : 16, &bufs[p], err))) goto out;
  }
  /* inputs */
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    kex_lb *lb = r->node_lb[ni];
    if (n->op != KEX_GOP_BUFFER || lb->base->op != KEX_OP_EMPTY || !bufs[phys[lb->base->buffer]]) continue;
    const kex_buffer_info *bi = &r->buffers[lb->base->buffer];
    size_t sz = buf_bytes(bi);
    void *host = kex_malloc(sz ? sz : 1);
    if (!host) goto nomem;
    rc = kex_fill_buffer(n, host, sz, err);
    if (rc) kex_err_set(err, rc, "node %u (BUFFER): %s", ni, err->msg);
    if (!rc && sz) rc = kex_buffer_copy_in(bufs[phys[lb->base->buffer]], 0, host, sz, err);
    kex_free(host);
    if (rc) goto out;
  }
  /* the schedule */
  res->kernels = kex_calloc(s->nkernels ? s->nkernels : 1, sizeof *res->kernels);
  if (!res->kernels) goto nomem;
  for (uint32_t ii = 0; ii < s->nitems; ii++) {
    const kex_sched_item *it = &s->items[ii];
    if (it->kind == KEX_ITEM_EMPTY) continue;
    if (it->kind == KEX_ITEM_COPY || it->kind == KEX_ITEM_VIEW) {
      uint32_t dst = it->bufs[0];
      const kex_buffer_info *di = &r->buffers[dst];
      size_t off = it->kind == KEX_ITEM_VIEW && di->view_of >= 0 ? (size_t)di->offset : 0;
      if (it->nbufs < 2) continue;
      if ((rc = copy_between(bufs[phys[dst]], bufs[phys[it->bufs[1]]], off, buf_bytes(di), err))) goto out;
      continue;
    }
    if (it->kind != KEX_ITEM_KERNEL) {
      rc = kex_err_set(err, KEX_EUNSUPPORTED, "schedule item %u: LoadOps.CUSTOM cannot run", ii);
      goto out;
    }
    kex_run_kernel *rk = &res->kernels[res->nkernels];
    kex_program_src ps = {0};
    unsigned char *bin = NULL;
    size_t binsz = 0;
    kex_program *prog = NULL;
    kex_buffer *args[KEX_DEVICE_MAX_BUFS];
    if (opts->beam > 0)
      rc = lower_beam(g, s, ii, &target, dev, opts, cache, &names, &ps, rk->opts, sizeof rk->opts, err);
    else
      rc = kex_target_lower_item(&target, s, it, NULL, 0, &names, &ps, rk->opts, sizeof rk->opts, err);
    if (!rc) {
      snprintf(rk->name, sizeof rk->name, "%s", ps.name);
      rc = kex_device_compile(dev, ps.src, ps.name, &bin, &binsz, err);
    }
    if (!rc) rc = kex_device_load(dev, bin, binsz, ps.name, &prog, err);
    if (!rc && ps.nargs > KEX_DEVICE_MAX_BUFS) rc = kex_err_set(err, KEX_ELIMIT, "%u kernel arguments", ps.nargs);
    for (uint32_t a = 0; !rc && a < ps.nargs; a++) args[a] = bufs[phys[it->bufs[ps.args[a].idx]]];
    if (!rc) rc = time_launches(prog, &ps, args, opts->repeat > 0 ? opts->repeat : 1, &rk->us, err);
    if (rc) {
      char msg[KEX_ERROR_MSG_MAX];
      snprintf(msg, sizeof msg, "%s", err->msg);
      kex_err_set(err, rc, "kernel %u (%s): %s", res->nkernels, ps.name[0] ? ps.name : "?", msg);
    } else {
      if (opts->keep_source) {
        rk->source = ps.src;
        ps.src = NULL;
      }
      res->nkernels++;
    }
    kex_program_free(prog);
    kex_free(bin);
    kex_program_src_free(&ps);
    if (rc) goto out;
  }
  /* outputs */
  res->outputs = kex_calloc(g->noutputs ? g->noutputs : 1, sizeof *res->outputs);
  if (!res->outputs) goto nomem;
  for (uint32_t j = 0; j < g->noutputs; j++) {
    if ((rc = read_output(r, bufs, phys, r->node_lb[g->outputs[j]], &res->outputs[j], err))) goto out;
    res->noutputs++;
  }
  goto out;
nomem:
  rc = kex_err_set(err, KEX_ENOMEM, "out of memory running the graph");
out:
  if (bufs)
    for (uint32_t i = 0; i < r->nbuffers; i++) kex_buffer_free(bufs[i]);
  kex_free(bufs);
  kex_free(phys);
  kex_name_counter_free(&names);
  kex_cache_close(cache);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_arena_destroy(&arena);
  if (rc) kex_run_result_free(res);
  return rc;
}

void kex_run_result_free(kex_run_result *res) {
  for (uint32_t i = 0; i < res->nkernels; i++) kex_free(res->kernels[i].source);
  kex_free(res->kernels);
  for (uint32_t i = 0; i < res->noutputs; i++) kex_free(res->outputs[i].data);
  kex_free(res->outputs);
  memset(res, 0, sizeof *res);
}

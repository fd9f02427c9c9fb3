/*
 * plan.c - the plan builder (see plan.h): replay, schedule, the buffer
 * tables, and every kernel lowered (and compiled) with the opts its policy
 * chooses; the cache-open policy every caller follows.
 *
 * KEX_DUMP_SOURCES=DIR (an existing directory) writes each kernel a plan
 * lowers to DIR/NAME, its kernel name (tinygrad's DEBUG=4, as files): the
 * same environment variable works for `kex run` and for kexd, which is how
 * tests/integration/test_sources.sh checks that both emit the same kernels.
 */
#include "realize/plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/astkey.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/trace.h"

/* ---- the cache policy ---- */

int kex_plan_cache_open(const char *path, kex_plan_cache_use use, const char *what, kex_cache **out, kex_error *err) {
  char buf[4096];
  kex_error ce = {0};
  int rc = 0;
  *out = NULL;
  if (path && !*path) return 0; /* no cache asked for */
  if (!path && (rc = kex_beam_default_cache_path(buf, sizeof buf, &ce)) < 0) {
    if (use == KEX_PLAN_CACHE_KEEP) return kex_err_set(err, rc, "%s", ce.msg);
    KEX_WARN("%s unavailable, going on without it: %s", what, ce.msg);
    return 0;
  }
  if (path) snprintf(buf, sizeof buf, "%s", path);
  if ((rc = kex_cache_open(buf, out, &ce)) < 0) {
    *out = NULL;
    if (use == KEX_PLAN_CACHE_KEEP) return kex_err_set(err, rc, "%s %s cannot be opened: %s", what, buf, ce.msg);
    KEX_WARN("%s %s unavailable, going on without it: %s", what, buf, ce.msg);
  }
  return 0;
}

/* ---- the opts policy ---- */

void kex_plan_policy_hand(kex_plan_policy *p) {
  memset(p, 0, sizeof *p);
  p->kind = KEX_PLAN_HAND;
}

void kex_plan_policy_beam(kex_plan_policy *p, int width, kex_device *dev, kex_cache *cache) {
  memset(p, 0, sizeof *p);
  p->kind = KEX_PLAN_BEAM;
  kex_beam_opts_init(&p->beam, width);
  p->beam.cache = cache;
  p->search_dev = dev;
}

static bool flag_set(void *arg) { return atomic_load((atomic_bool *)arg); }

int kex_plan_choose_opts(const kex_plan_policy *pol, const kex_graph *g, const kex_schedule *s, uint32_t item,
                         const kex_target *t, kex_beam_result *res, kex_error *err) {
  kex_beam_opts bo = pol->beam;
  kex_beam_target bt = {g, s, item, t};
  if (pol->kind != KEX_PLAN_BEAM || !pol->search_dev)
    return kex_err_set(err, KEX_EINVAL, "choosing opts needs a BEAM policy with a device");
  if (!bo.cancelled && pol->cancel) bo.cancelled = flag_set, bo.cancel_arg = pol->cancel;
  return kex_beam_optimize(&bt, pol->search_dev, &bo, res, err);
}

int kex_plan_lower_item(const kex_target *t, const kex_schedule *s, uint32_t item, const kex_opt *opts,
                        uint32_t nopts, kex_name_counter *names, kex_program_src *out, char *optstr,
                        size_t optstr_len, kex_error *err) {
  if (item >= s->nitems || s->items[item].kind != KEX_ITEM_KERNEL)
    return kex_err_set(err, KEX_EINVAL, "schedule item %u is not a kernel", item);
  return kex_target_lower_item(t, s, &s->items[item], opts, nopts, names, out, optstr, optstr_len, err);
}

/* ---- the plan ---- */

void kex_plan_init(kex_rplan *p, const kex_graph *g, const kex_target *t) {
  memset(p, 0, sizeof *p);
  p->g = g;
  p->target = *t;
  kex_arena_init(&p->arena, 0);
}

void kex_plan_use_warm(kex_rplan *p, kex_sched_warm *warm, size_t limit) {
  p->warm = warm;
  p->warm_limit = limit;
}

int kex_plan_schedule(kex_rplan *p, const char *device_name, kex_error *err) {
  kex_replay_opts ro = kex_target_replay_opts(&p->target);
  kex_arena *arena = &p->arena;
  kex_arena *wa = p->warm && !p->warm_begun ? kex_sched_warm_begin(p->warm, p->g->nnodes, &ro) : NULL;
  if (wa) arena = wa, p->warm_begun = true;
  if (device_name) ro.device_name = device_name;
  int rc = kex_replay_graph(p->g, &ro, arena, &p->r, err);
  if (!rc) rc = kex_schedule_create(p->r, &p->s, err);
  return rc;
}

static size_t info_bytes(const kex_buffer_info *bi) { return (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype); }

/* KEX_DUMP_SOURCES (see the file comment): best effort, a failure is logged. */
static void dump_source(const kex_plan_prog *pp) {
  const char *dir = getenv("KEX_DUMP_SOURCES");
  char path[4096];
  if (!dir || !*dir || snprintf(path, sizeof path, "%s/%s", dir, pp->name) >= (int)sizeof path) return;
  FILE *f = fopen(path, "w");
  if (!f || fputs(pp->src, f) < 0) KEX_WARN("KEX_DUMP_SOURCES: cannot write %s: %s", path, strerror(errno));
  if (f) fclose(f);
}

/* Item ii (a kernel) lowered with the policy's opts. */
static int lower_kernel(const kex_rplan *p, const kex_plan_policy *pol, uint32_t ii, kex_name_counter *names,
                        kex_program_src *ps, char *ostr, size_t olen, kex_error *err) {
  kex_beam_result br;
  int rc;
  switch (pol->kind) {
  case KEX_PLAN_HAND: return kex_plan_lower_item(&p->target, p->s, ii, NULL, 0, names, ps, ostr, olen, err);
  case KEX_PLAN_HOOK: return pol->lower(pol->lower_arg, p->g, p->s, ii, names, ps, ostr, olen, err);
  case KEX_PLAN_BEAM:
    if ((rc = kex_plan_choose_opts(pol, p->g, p->s, ii, &p->target, &br, err)) < 0) return rc;
    return kex_plan_lower_item(&p->target, p->s, ii, br.opts, br.nopts, names, ps, ostr, olen, err);
  }
  return kex_err_set(err, KEX_EINVAL, "unknown opts policy %d", (int)pol->kind);
}

/* The buffer tables: which buffers a run allocates, which handles provide, which inputs are filled. */
static int plan_buffers(kex_rplan *p, uint32_t *phys) {
  const kex_replay *r = p->r;
  const kex_schedule *s = p->s;
  const kex_graph *g = p->g;
  uint32_t nb = r->nbuffers ? r->nbuffers : 1;
  p->nbufs = r->nbuffers;
  p->buf_bytes = kex_calloc(nb, sizeof *p->buf_bytes);
  p->buf_dtype = kex_calloc(nb, sizeof *p->buf_dtype);
  p->buf_alloc = kex_calloc(nb, sizeof *p->buf_alloc);
  p->buf_handle = kex_malloc(nb * sizeof *p->buf_handle);
  p->inputs = kex_calloc(g->nnodes ? g->nnodes : 1, sizeof *p->inputs);
  if (!p->buf_bytes || !p->buf_dtype || !p->buf_alloc || !p->buf_handle || !p->inputs) return KEX_ENOMEM;
  for (uint32_t ni = 0; ni < g->nnodes; ni++) p->dtypes |= 1ull << (g->nodes[ni].dtype & 63);
  /* buffer id -> the id the memory planner gave it */
  for (uint32_t i = 0; i < r->nbuffers; i++) phys[i] = i, p->buf_handle[i] = -1;
  for (uint32_t i = 0; i < s->nitems; i++)
    for (uint32_t j = 0; j < s->items[i].nbufs; j++) phys[s->items[i].bufs[j]] = s->items[i].planned[j];
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    const kex_lb *lb = r->node_lb[ni];
    if (n->op != KEX_GOP_BUFFER || lb->base->op != KEX_OP_EMPTY) continue;
    if (n->bufsrc == KEX_BUF_HANDLE) p->buf_handle[phys[lb->base->buffer]] = (int32_t)ni;
  }
  for (uint32_t i = 0; i < r->nbuffers; i++) {
    uint32_t b = phys[i];
    bool used = r->buffers[i].held;
    for (uint32_t k = 0; k < s->nitems && !used; k++)
      for (uint32_t j = 0; j < s->items[k].nbufs && !used; j++) used = phys[s->items[k].bufs[j]] == b;
    if (!used || p->buf_alloc[b] || p->buf_handle[b] >= 0) continue;
    p->buf_alloc[b] = true;
    p->buf_bytes[b] = info_bytes(&r->buffers[b]);
    p->buf_dtype[b] = r->buffers[b].dtype;
    p->alloc_bytes += p->buf_bytes[b];
  }
  for (uint32_t i = 0; i < r->nbuffers; i++)
    if (p->buf_handle[i] >= 0) {
      p->buf_bytes[i] = info_bytes(&r->buffers[i]);
      p->buf_dtype[i] = r->buffers[i].dtype;
    }
  /* inputs with contents to copy in (inline data, fills) */
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    const kex_lb *lb = r->node_lb[ni];
    if (n->op != KEX_GOP_BUFFER || n->bufsrc == KEX_BUF_HANDLE || lb->base->op != KEX_OP_EMPTY) continue;
    uint32_t b = phys[lb->base->buffer];
    if (!p->buf_alloc[b]) continue;
    p->inputs[p->ninputs++] = (kex_plan_input){ni, b, info_bytes(&r->buffers[lb->base->buffer])};
  }
  return 0;
}

/* Kernel ii lowered into the next program and its step.  0 or a negative code with *err naming the kernel. */
static int plan_kernel(kex_rplan *p, const kex_plan_policy *pol, uint32_t ii, const uint32_t *phys,
                       kex_name_counter *names, kex_error *err) {
  const kex_sched_item *it = &p->s->items[ii];
  kex_plan_prog *pp = &p->progs[p->nkernels];
  kex_plan_step *st = &p->steps[p->nsteps];
  kex_program_src ps = {0};
  int rc;
  if (pol->cancel && atomic_load(pol->cancel)) return kex_err_set(err, KEX_ECANCELLED, "cancelled");
  uint64_t t0 = pol->trace ? kex_trace_now_us() : 0;
  rc = lower_kernel(p, pol, ii, names, &ps, pp->opts, sizeof pp->opts, err);
  if (pol->trace)
    kex_trace_span(pol->trace, "plan", pol->kind == KEX_PLAN_HAND ? "lower" : "lower+search",
                   rc < 0 ? "lower (failed)" : ps.name, pp->opts[0] ? pp->opts : NULL, t0, kex_trace_now_us());
  if (rc < 0) {
    char m[KEX_ERROR_MSG_MAX];
    snprintf(m, sizeof m, "%s", err->msg);
    kex_program_src_free(&ps);
    return kex_err_set(err, rc, "kernel %u: %s", p->nkernels, m);
  }
  if (ps.nargs > KEX_DEVICE_MAX_BUFS) {
    rc = kex_err_set(err, KEX_ELIMIT, "kernel %u (%s): %u arguments, more than %d", p->nkernels, ps.name, ps.nargs,
                     KEX_DEVICE_MAX_BUFS);
    kex_program_src_free(&ps);
    return rc;
  }
  snprintf(pp->name, sizeof pp->name, "%s", ps.name);
  memcpy(pp->global, ps.global, sizeof pp->global);
  memcpy(pp->local, ps.local, sizeof pp->local);
  pp->has_local = ps.has_local;
  pp->src = ps.src;
  ps.src = NULL;
  p->nkernels++; /* from here kex_plan_clear frees the source */
  kex_sha256_bytes(pp->src, strlen(pp->src), pp->hash);
  dump_source(pp);
  st->kind = KEX_PLAN_STEP_KERNEL;
  st->kernel = p->nkernels - 1;
  st->nargs = ps.nargs;
  if (!(st->args = kex_malloc((ps.nargs ? ps.nargs : 1) * sizeof *st->args))) {
    kex_program_src_free(&ps);
    return kex_err_set(err, KEX_ENOMEM, "out of memory building the plan");
  }
  for (uint32_t a = 0; a < ps.nargs; a++) st->args[a] = phys[it->bufs[ps.args[a].idx]];
  kex_program_src_free(&ps);
  p->nsteps++;
  return 0;
}

/* How each graph output is read.  claimed[nbufs]: a buffer one output took already. */
static void plan_outputs(kex_rplan *p, const uint32_t *phys, bool *claimed) {
  const kex_graph *g = p->g;
  for (uint32_t j = 0; j < g->noutputs; j++) {
    const kex_lb *lb = p->r->node_lb[g->outputs[j]], *base = lb->base;
    kex_plan_output *o = &p->outputs[p->noutputs++];
    o->dtype = lb->dtype;
    o->ndim = (uint8_t)kex_lb_ndim(lb);
    memcpy(o->shape, kex_lb_shape(lb), sizeof(int64_t) * o->ndim);
    o->nbytes = (size_t)kex_lb_size(lb) * (size_t)kex_dtype_size(lb->dtype);
    if (base->op == KEX_OP_CONST && !base->realized) {
      o->kind = KEX_PLAN_OUT_CONST;
      o->value = kex_const_as(base->arg, lb->dtype);
      p->alloc_bytes += o->nbytes;
      continue;
    }
    o->buf = phys[base->buffer];
    o->base_bytes = info_bytes(&p->r->buffers[base->buffer]);
    bool identity = lb == base && o->base_bytes == o->nbytes;
    if (identity && p->buf_handle[o->buf] >= 0) {
      o->kind = KEX_PLAN_OUT_ALIAS;
    } else if (identity && p->buf_alloc[o->buf] && !claimed[o->buf]) {
      o->kind = KEX_PLAN_OUT_DIRECT;
      claimed[o->buf] = true;
    } else {
      o->kind = KEX_PLAN_OUT_GATHER;
      o->st = lb->st;
      p->alloc_bytes += o->nbytes;
    }
  }
}

int kex_plan_lower(kex_rplan *p, const kex_plan_policy *pol, kex_error *err) {
  int rc = 0;
  if (!p->s && (rc = kex_plan_schedule(p, NULL, err)) < 0) return rc;
  const kex_schedule *s = p->s;
  const kex_graph *g = p->g;
  uint32_t nb = p->r->nbuffers ? p->r->nbuffers : 1;
  uint32_t *phys = kex_malloc(nb * sizeof *phys);
  bool *claimed = kex_calloc(nb, sizeof *claimed);
  kex_name_counter names;
  kex_name_counter_init(&names);
  p->progs = kex_calloc(s->nkernels ? s->nkernels : 1, sizeof *p->progs);
  p->steps = kex_calloc(s->nitems ? s->nitems : 1, sizeof *p->steps);
  p->outputs = kex_calloc(g->noutputs ? g->noutputs : 1, sizeof *p->outputs);
  if (!phys || !claimed || !p->progs || !p->steps || !p->outputs || plan_buffers(p, phys) < 0) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory building the plan");
    goto out;
  }
  for (uint32_t ii = 0; ii < s->nitems; ii++) {
    const kex_sched_item *it = &s->items[ii];
    kex_plan_step *st = &p->steps[p->nsteps];
    if (it->kind == KEX_ITEM_EMPTY) continue;
    if (it->kind == KEX_ITEM_COPY || it->kind == KEX_ITEM_VIEW) {
      const kex_buffer_info *di = &p->r->buffers[it->bufs[0]];
      if (it->nbufs < 2) continue;
      st->kind = KEX_PLAN_STEP_COPY;
      st->dst = phys[it->bufs[0]];
      st->src = phys[it->bufs[1]];
      st->off = it->kind == KEX_ITEM_VIEW && di->view_of >= 0 ? (size_t)di->offset : 0;
      st->size = info_bytes(di);
      p->nsteps++;
      continue;
    }
    if (it->kind != KEX_ITEM_KERNEL) {
      rc = kex_err_set(err, KEX_EUNSUPPORTED, "schedule item %u: LoadOps.CUSTOM cannot run", ii);
      goto out;
    }
    if ((rc = plan_kernel(p, pol, ii, phys, &names, err)) < 0) goto out;
  }
  plan_outputs(p, phys, claimed);
out:
  kex_free(phys);
  kex_free(claimed);
  kex_name_counter_free(&names);
  return rc;
}

int kex_plan_compile(kex_rplan *p, kex_device *dev, kex_error *err) {
  for (uint32_t k = 0; k < p->nkernels; k++) {
    kex_plan_prog *pp = &p->progs[k];
    int rc;
    if (pp->bin) continue;
    if ((rc = kex_device_compile(dev, pp->src, pp->name, &pp->bin, &pp->binlen, err)) < 0) {
      char m[KEX_ERROR_MSG_MAX];
      snprintf(m, sizeof m, "%s", err->msg);
      return kex_err_set(err, rc, "kernel %u (%s): %s", k, pp->name, m);
    }
  }
  return 0;
}

int kex_plan_build(const kex_graph *g, const kex_target *t, const kex_plan_policy *pol, kex_device *dev,
                   kex_rplan **out, kex_error *err) {
  kex_rplan *p = kex_malloc(sizeof *p);
  int rc;
  *out = NULL;
  if (!p) return kex_err_set(err, KEX_ENOMEM, "out of memory building the plan");
  kex_plan_init(p, g, t);
  rc = kex_plan_lower(p, pol, err);
  if (!rc && dev) rc = kex_plan_compile(p, dev, err);
  if (rc < 0) {
    kex_plan_destroy(p);
    return rc;
  }
  *out = p;
  return 0;
}

void kex_plan_clear(kex_rplan *p) {
  for (uint32_t i = 0; p->progs && i < p->nkernels; i++) kex_free(p->progs[i].src), kex_free(p->progs[i].bin);
  for (uint32_t i = 0; p->steps && i < p->nsteps; i++) kex_free(p->steps[i].args);
  kex_free(p->progs), kex_free(p->steps), kex_free(p->inputs), kex_free(p->outputs);
  kex_free(p->buf_bytes), kex_free(p->buf_dtype), kex_free(p->buf_alloc), kex_free(p->buf_handle);
  kex_schedule_free(p->s);
  kex_replay_free(p->r);
  if (p->warm_begun) (void)kex_sched_warm_end(p->warm, p->warm_limit);
  kex_arena_destroy(&p->arena);
  memset(p, 0, sizeof *p);
}

void kex_plan_destroy(kex_rplan *p) {
  if (!p) return;
  kex_plan_clear(p);
  kex_free(p);
}

int kex_plan_find_kernel(const kex_rplan *p, const char *ast_hex, uint32_t *item, kex_error *err) {
  for (uint32_t i = 0; p->s && i < p->s->nitems; i++) {
    kex_ast_digest d;
    int rc;
    if (p->s->items[i].kind != KEX_ITEM_KERNEL) continue;
    if ((rc = kex_ast_key(p->s->items[i].ast, p->s->items[i].nout, &d, err))) return rc;
    if (strcmp(d.hex, ast_hex) == 0) {
      *item = i;
      return 0;
    }
  }
  return kex_err_set(err, KEX_ENOTFOUND, "no kernel has AST key %.16s...", ast_hex);
}

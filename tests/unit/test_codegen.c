/*
 * test_codegen.c - the Linearizer, uop folding and the C-style renderers
 * (codegen/lower.c, uops.c, render.c):
 *
 *   - rendered source of the spec's examples (spec 10: the CLANG
 *     `(a*b).sum(1)+1` loops, the 512x512 matmul's float4 loads/stores and
 *     name on OpenCL);
 *   - correctness on the real devices: graphs built here with random inputs
 *     are scheduled, every kernel gets its hand-coded opts, is lowered,
 *     compiled and launched through devices/device.h on the OpenCL device
 *     (PoCL) and on the cpu device, and the outputs are compared with a
 *     reference interpreter written in plain C below;
 *   - every `numeric` case of ../shared/cases rendered for the cpu device under
 *     tinygrad's GPU rules, run against tinygrad's recorded outputs (the same
 *     cases on the OpenCL device are test_run's).
 *
 * Without an OpenCL platform the OpenCL half is skipped with a printed reason.
 * The schedule is always made with tinygrad's GPU device rules (no buffer
 * views), so every schedule item is a kernel, a copy or an empty buffer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <dirent.h>
#include <pthread.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"
#include "codegen/kernel.h"
#include "codegen/lower.h"
#include "planned.h"
#include "sample.h"
#ifdef KEX_HAVE_DEVICES
#include "devices/device.h"
#endif

/* ---------- planning ---------- */

static int plan(planned *p, kex_graph *g, kex_error *err) {
  int rc = plan_graph(p, g, false);
  if (rc) *err = p->err;
  return rc;
}

/* Lower kernel item it with hand-coded opts (when hand) for caps/dialect. */
static int lower_item(const planned *p, const kex_sched_item *it, const kex_renderer_caps *caps, int dialect,
                      bool hand, kex_name_counter *names, kex_program_src *out, kex_error *err) {
  kex_kernel *k = NULL;
  int rc = kex_kernel_from_item(p->s, it, caps, &k, err);
  if (!rc && hand) rc = kex_kernel_hand_coded_optimizations(k, err);
  if (!rc) rc = kex_lower_kernel(k, caps, dialect, names, out, err);
  kex_kernel_free(k);
  return rc;
}

/* ---------- typed host values ---------- */

static uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (uint32_t)(sign | ((uint32_t)exp << 10) | (mant >> 13));
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
  if (exp == 0) {
    if (!mant) x = sign;
    else {
      int e = -1;
      do { e++; mant <<= 1; } while (!(mant & 0x400));
      x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) x = sign | 0x7f800000 | (mant << 13);
  else x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static double load_typed(const void *p, kex_dtype dt, int64_t i) {
  switch (dt) {
  case KEX_DT_BOOL: return ((const uint8_t *)p)[i] != 0;
  case KEX_DT_INT8: return ((const int8_t *)p)[i];
  case KEX_DT_UINT8: return ((const uint8_t *)p)[i];
  case KEX_DT_INT16: return ((const int16_t *)p)[i];
  case KEX_DT_UINT16: return ((const uint16_t *)p)[i];
  case KEX_DT_INT32: return ((const int32_t *)p)[i];
  case KEX_DT_UINT32: return ((const uint32_t *)p)[i];
  case KEX_DT_INT64: return (double)((const int64_t *)p)[i];
  case KEX_DT_UINT64: return (double)((const uint64_t *)p)[i];
  case KEX_DT_FLOAT16: return h2f(((const uint16_t *)p)[i]);
  case KEX_DT_FLOAT32: return ((const float *)p)[i];
  case KEX_DT_FLOAT64: return ((const double *)p)[i];
  default: return 0;
  }
}

/* ---------- graph builder ---------- */

typedef struct gb {
  kex_graph *g;
  kex_limits lim;
  uint64_t seed;
} gb;

static uint64_t rnd(gb *b) {
  b->seed = b->seed * 6364136223846793005ull + 1442695040888963407ull;
  return b->seed >> 33;
}

static int add(gb *b, kex_gnode n) {
  kex_error err = {0};
  int r = kex_graph_add(b->g, &n, &b->lim, &err);
  if (r < 0) fail_msg("graph add: %s", err.msg);
  return r;
}

/* A BUFFER input with random data: floats in [-1,1) (or [lo, hi) for ints). */
static int input(gb *b, kex_dtype dt, int ndim, const int64_t *shape, double lo, double hi) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  size_t sz = (size_t)n * (size_t)kex_dtype_size(dt);
  uint8_t *d = malloc(sz ? sz : 1);
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(rnd(b) % 1000000) / 1000000.0, v = lo + (hi - lo) * u;
    switch (dt) {
    case KEX_DT_FLOAT32: ((float *)d)[i] = (float)v; break;
    case KEX_DT_INT32: ((int32_t *)d)[i] = (int32_t)floor(v); break;
    case KEX_DT_BOOL: d[i] = v > 0; break;
    case KEX_DT_FLOAT16: ((uint16_t *)d)[i] = f2h((float)v); break;
    default: fail_msg("input dtype");
    }
  }
  kex_gnode nd = {.op = KEX_GOP_BUFFER, .dtype = dt, .ndim = (uint8_t)ndim, .shape = shape, .bufsrc = KEX_BUF_DATA,
                  .data = d, .data_len = sz};
  int r = add(b, nd);
  free(d);
  return r;
}

static int op1(gb *b, kex_gop op, int a) { return add(b, (kex_gnode){.op = op, .nsrc = 1, .src = {(uint32_t)a}}); }
static int op2(gb *b, kex_gop op, int a, int c) {
  return add(b, (kex_gnode){.op = op, .nsrc = 2, .src = {(uint32_t)a, (uint32_t)c}});
}
static int op3(gb *b, kex_gop op, int a, int c, int d) {
  return add(b, (kex_gnode){.op = op, .nsrc = 3, .src = {(uint32_t)a, (uint32_t)c, (uint32_t)d}});
}
static int cast(gb *b, kex_gop op, int a, kex_dtype dt) {
  return add(b, (kex_gnode){.op = op, .nsrc = 1, .src = {(uint32_t)a}, .dtype = dt});
}
static int mov(gb *b, kex_gop op, int a, int narg, const int64_t *arg) {
  return add(b, (kex_gnode){.op = op, .nsrc = 1, .src = {(uint32_t)a}, .narg = (uint32_t)narg, .arg = arg});
}
static int red(gb *b, kex_gop op, int a, int naxis, const int32_t *axis) {
  return add(b, (kex_gnode){.op = op, .nsrc = 1, .src = {(uint32_t)a}, .naxis = (uint32_t)naxis, .axis = axis});
}
static int cnst(gb *b, kex_dtype dt, int ndim, const int64_t *shape, kex_const v) {
  return add(b, (kex_gnode){.op = KEX_GOP_CONST, .dtype = dt, .ndim = (uint8_t)ndim, .shape = shape, .value = v});
}
static void output(gb *b, int n) {
  kex_error err = {0};
  if (kex_graph_add_output(b->g, (uint32_t)n, &b->lim, &err)) fail_msg("output: %s", err.msg);
}
static void gb_init(gb *b, uint64_t seed) {
  b->g = kex_graph_new(NULL);
  b->lim = KEX_LIMITS_DEFAULT;
  b->seed = seed;
  assert_non_null(b->g);
}

/* ---------- reference interpreter over the graph ---------- */

typedef struct rval {
  int64_t n;
  double *v;
} rval;

static double round_to(double x, kex_dtype dt) {
  switch (dt) {
  case KEX_DT_FLOAT32: return (double)(float)x;
  case KEX_DT_FLOAT16: return h2f(f2h((float)x));
  case KEX_DT_INT32: return (double)(int32_t)(int64_t)x;
  case KEX_DT_BOOL: return x != 0;
  default: return x;
  }
}

static void unravel(int64_t i, int nd, const int64_t *shape, int64_t *c) {
  for (int d = nd - 1; d >= 0; d--) {
    c[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
}

static int64_t ravel(int nd, const int64_t *shape, const int64_t *c) {
  int64_t i = 0;
  for (int d = 0; d < nd; d++) i = i * shape[d] + c[d];
  return i;
}

static double alu(kex_gop op, kex_dtype dt, kex_dtype out, double a, double b, double c) {
  bool isf = kex_dtype_is_float(dt);
  switch (op) {
  case KEX_GOP_EXP2: return exp2(a);
  case KEX_GOP_LOG2: return log2(a);
  case KEX_GOP_SIN: return sin(a);
  case KEX_GOP_SQRT: return sqrt(a);
  case KEX_GOP_NEG: return dt == KEX_DT_BOOL ? !a : -a;
  case KEX_GOP_ADD: return a + b;
  case KEX_GOP_SUB: return a - b;
  case KEX_GOP_MUL: return a * b;
  case KEX_GOP_DIV: return isf ? a / b : (double)((int64_t)a / (int64_t)b);
  case KEX_GOP_MAX: return a > b ? a : b;
  case KEX_GOP_MOD: return isf ? fmod(a, b) : (double)((int64_t)a % (int64_t)b);
  case KEX_GOP_CMPLT: return a < b;
  case KEX_GOP_CMPEQ: return a == b;
  case KEX_GOP_XOR: return (double)((int64_t)a ^ (int64_t)b);
  case KEX_GOP_WHERE: return a != 0 ? b : c;
  case KEX_GOP_MULACC: return a * b + c;
  default: break;
  }
  (void)out;
  return 0;
}

static double cast_val(double x, kex_dtype from, kex_dtype to) {
  (void)from;
  if (to == KEX_DT_BOOL) return x != 0;
  if (kex_dtype_is_int(to)) return round_to(trunc(x), to);
  return round_to(x, to);
}

/* Values of every graph node (row-major, as doubles rounded to the node's dtype). */
static rval *reference(const kex_graph *g) {
  rval *vals = calloc(g->nnodes, sizeof *vals);
  for (uint32_t ni = 0; ni < g->nnodes; ni++) {
    const kex_gnode *n = &g->nodes[ni];
    int64_t cnt = 1;
    for (int d = 0; d < n->ndim; d++) cnt *= n->shape[d];
    rval *o = &vals[ni];
    o->n = cnt;
    o->v = calloc((size_t)(cnt ? cnt : 1), sizeof(double));
    const kex_gnode *s0 = n->nsrc ? &g->nodes[n->src[0]] : NULL;
    const double *a = n->nsrc ? vals[n->src[0]].v : NULL, *b = n->nsrc > 1 ? vals[n->src[1]].v : NULL,
                 *c = n->nsrc > 2 ? vals[n->src[2]].v : NULL;
    int64_t ci[KEX_MAX_DIMS], si[KEX_MAX_DIMS];
    switch (n->op) {
    case KEX_GOP_BUFFER:
      for (int64_t i = 0; i < cnt; i++) o->v[i] = load_typed(n->data, n->dtype, i);
      break;
    case KEX_GOP_CONST:
      for (int64_t i = 0; i < cnt; i++) o->v[i] = kex_const_as_double(n->value);
      break;
    case KEX_GOP_CAST:
      for (int64_t i = 0; i < cnt; i++) o->v[i] = cast_val(a[i], s0->dtype, n->dtype);
      break;
    case KEX_GOP_REDUCE_SUM:
    case KEX_GOP_REDUCE_MAX: {
      bool mx = n->op == KEX_GOP_REDUCE_MAX;
      for (int64_t i = 0; i < cnt; i++) o->v[i] = mx ? -INFINITY : 0;
      if (mx && kex_dtype_is_int(n->dtype)) for (int64_t i = 0; i < cnt; i++) o->v[i] = -2147483648.0;
      if (mx && n->dtype == KEX_DT_BOOL) for (int64_t i = 0; i < cnt; i++) o->v[i] = 0;
      for (int64_t i = 0; i < vals[n->src[0]].n; i++) {
        unravel(i, s0->ndim, s0->shape, si);
        for (int d = 0; d < n->ndim; d++) ci[d] = n->shape[d] == 1 ? 0 : si[d];
        int64_t j = ravel(n->ndim, n->shape, ci);
        o->v[j] = mx ? (a[i] > o->v[j] ? a[i] : o->v[j]) : round_to(o->v[j] + a[i], n->dtype == KEX_DT_FLOAT32 ? KEX_DT_FLOAT64 : n->dtype);
      }
      for (int64_t i = 0; i < cnt; i++) o->v[i] = round_to(o->v[i], n->dtype);
      break;
    }
    case KEX_GOP_RESHAPE:
    case KEX_GOP_CONTIGUOUS:
    case KEX_GOP_COPY:
      memcpy(o->v, a, (size_t)cnt * sizeof(double));
      break;
    case KEX_GOP_EXPAND:
    case KEX_GOP_PERMUTE:
    case KEX_GOP_PAD:
    case KEX_GOP_SHRINK:
    case KEX_GOP_STRIDE:
      for (int64_t i = 0; i < cnt; i++) {
        unravel(i, n->ndim, n->shape, ci);
        bool valid = true;
        for (int d = 0; d < s0->ndim; d++) {
          switch (n->op) {
          case KEX_GOP_EXPAND: si[d] = s0->shape[d] == 1 ? 0 : ci[d]; break;
          case KEX_GOP_PERMUTE: si[n->arg[d]] = ci[d]; break;
          case KEX_GOP_PAD:
            si[d] = ci[d] - n->arg[2 * d];
            valid = valid && si[d] >= 0 && si[d] < s0->shape[d];
            break;
          case KEX_GOP_SHRINK: si[d] = ci[d] + n->arg[2 * d]; break;
          default: {
            int64_t m = n->arg[d];
            si[d] = m > 0 ? ci[d] * m : (s0->shape[d] - 1) + ci[d] * m;
          }
          }
        }
        if (n->op == KEX_GOP_PERMUTE)
          for (int d = 0; d < s0->ndim; d++) si[n->arg[d]] = ci[d];
        o->v[i] = valid ? a[ravel(s0->ndim, s0->shape, si)] : 0;
      }
      break;
    default:
      if (n->nsrc >= 1 && n->op >= KEX_GOP_EXP2 && n->op <= KEX_GOP_MULACC) {
        kex_dtype in_dt = n->op == KEX_GOP_WHERE ? g->nodes[n->src[1]].dtype : s0->dtype;
        for (int64_t i = 0; i < cnt; i++)
          o->v[i] = round_to(alu(n->op, in_dt, n->dtype, a[i], b ? b[i] : 0, c ? c[i] : 0), n->dtype);
      } else {
        fail_msg("reference: op %s", kex_gop_name(n->op));
      }
    }
  }
  return vals;
}

static void free_reference(const kex_graph *g, rval *v) {
  for (uint32_t i = 0; i < g->nnodes; i++) free(v[i].v);
  free(v);
}

/* ---------- running a schedule on a device ---------- */

#ifdef KEX_HAVE_DEVICES

typedef struct run_stats {
  int kernels;
  double seconds; /* sum of kernel times */
  char last_name[KEX_PROGRAM_NAME_MAX];
  double last_seconds;
} run_stats;

/*
 * Run every item of p's schedule on dev with its hand-coded opts; read graph
 * output j into outs[j] (malloc'd doubles).  Returns 0, or a KEX_E* code with
 * err set; KEX_EUNSUPPORTED when the device cannot run a dtype of the graph.
 */
static int run_on(planned *p, kex_device *dev, int dialect, double **outs, run_stats *stats, kex_error *err) {
  const kex_renderer_caps *caps = dialect == KEX_DIALECT_OPENCL ? &kex_renderer_opencl : &kex_renderer_cpu;
  kex_replay *r = p->r;
  int rc = 0;
  kex_buffer **bufs = calloc(r->nbuffers, sizeof *bufs);
  kex_name_counter names;
  kex_name_counter_init(&names);
  memset(stats, 0, sizeof *stats);
  for (uint32_t i = 0; i < r->nbuffers; i++) {
    if ((rc = kex_device_check_dtype(dev, r->buffers[i].dtype, err))) goto out;
    size_t sz = (size_t)r->buffers[i].size * (size_t)kex_dtype_size(r->buffers[i].dtype);
    if ((rc = kex_device_alloc(dev, sz ? sz : 16, &bufs[i], err))) goto out;
  }
  for (uint32_t ni = 0; ni < p->g->nnodes; ni++) {
    const kex_gnode *n = &p->g->nodes[ni];
    if (n->op != KEX_GOP_BUFFER) continue;
    kex_lb *lb = r->node_lb[ni];
    if (!lb) continue;
    if (n->bufsrc != KEX_BUF_DATA) {
      rc = kex_err_set(err, KEX_EUNSUPPORTED, "input %u is not inline data", ni);
      goto out;
    }
    if (n->data_len && (rc = kex_buffer_copy_in(bufs[lb->base->buffer], 0, n->data, n->data_len, err))) goto out;
  }
  for (uint32_t ii = 0; ii < p->s->nitems; ii++) {
    const kex_sched_item *it = &p->s->items[ii];
    if (it->kind == KEX_ITEM_EMPTY) continue;
    if (it->kind == KEX_ITEM_COPY) {
      uint32_t dst = it->bufs[0], src = it->bufs[1];
      size_t sz = (size_t)r->buffers[dst].size * (size_t)kex_dtype_size(r->buffers[dst].dtype);
      void *tmp = malloc(sz ? sz : 1);
      rc = kex_buffer_copy_out(bufs[src], 0, tmp, sz, err);
      if (!rc) rc = kex_buffer_copy_in(bufs[dst], 0, tmp, sz, err);
      free(tmp);
      if (rc) goto out;
      continue;
    }
    if (it->kind != KEX_ITEM_KERNEL) {
      rc = kex_err_set(err, KEX_EUNSUPPORTED, "schedule item %u of kind %d", ii, it->kind);
      goto out;
    }
    kex_program_src ps;
    if ((rc = lower_item(p, it, caps, dialect, true, &names, &ps, err))) goto out;
    unsigned char *bin = NULL;
    size_t binsz = 0;
    kex_program *prog = NULL;
    kex_event *ev = NULL;
    kex_buffer *args[KEX_DEVICE_MAX_BUFS];
    rc = kex_device_compile(dev, ps.src, ps.name, &bin, &binsz, err);
    if (rc && getenv("KEX_CODEGEN_VERBOSE")) fprintf(stderr, "%s\n", ps.src);
    if (!rc) rc = kex_device_load(dev, bin, binsz, ps.name, &prog, err);
    for (uint32_t a = 0; !rc && a < ps.nargs; a++) args[a] = bufs[it->bufs[ps.args[a].idx]];
    if (!rc)
      rc = kex_program_launch(prog, ps.global, ps.has_local ? ps.local : NULL, args, (int)ps.nargs, NULL, 0, &ev, err);
    double secs = 0;
    if (!rc) rc = kex_event_elapsed(ev, &secs, err);
    for (int rep = 1; !rc && getenv("KEX_CODEGEN_BENCH") && rep < 6; rep++) { /* timing only: min of 6 launches */
      kex_event *ev2 = NULL;
      double s2 = 0;
      rc = kex_program_launch(prog, ps.global, ps.has_local ? ps.local : NULL, args, (int)ps.nargs, NULL, 0, &ev2, err);
      if (!rc) rc = kex_event_elapsed(ev2, &s2, err);
      kex_event_free(ev2);
      if (!rc && s2 < secs) secs = s2;
    }
    if (!rc) {
      stats->kernels++;
      stats->seconds += secs;
      snprintf(stats->last_name, sizeof stats->last_name, "%s", ps.name);
      stats->last_seconds = secs;
    }
    if (getenv("KEX_CODEGEN_VERBOSE")) fprintf(stderr, "%s %.3f ms\n%s\n", ps.name, secs * 1e3, ps.src);
    kex_event_free(ev);
    kex_program_free(prog);
    kex_free(bin);
    kex_program_src_free(&ps);
    if (rc) goto out;
  }
  for (uint32_t j = 0; j < p->g->noutputs; j++) {
    kex_lb *lb = r->node_lb[p->g->outputs[j]];
    int64_t n = kex_lb_size(lb);
    outs[j] = calloc((size_t)(n ? n : 1), sizeof(double));
    kex_lb *base = lb->base;
    if (base->op == KEX_OP_CONST && !base->realized) {
      for (int64_t i = 0; i < n; i++) outs[j][i] = kex_const_as_double(base->arg);
      continue;
    }
    kex_buffer_info *bi = &r->buffers[base->buffer];
    size_t sz = (size_t)bi->size * (size_t)kex_dtype_size(bi->dtype);
    void *host = malloc(sz ? sz : 1);
    if (sz && (rc = kex_buffer_copy_out(bufs[base->buffer], 0, host, sz, err))) {
      free(host);
      goto out;
    }
    int64_t c[KEX_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
      unravel(i, kex_lb_ndim(lb), kex_lb_shape(lb), c);
      int64_t bi2 = lb == base ? i : kex_st_address(lb->st, c);
      outs[j][i] = bi2 < 0 ? 0 : load_typed(host, bi->dtype, bi2);
    }
    free(host);
  }
out:
  for (uint32_t i = 0; i < r->nbuffers; i++) kex_buffer_free(bufs[i]);
  free(bufs);
  kex_name_counter_free(&names);
  return rc;
}

static kex_device *cl_dev, *cpu_dev;
static const char *cl_skip;
#endif

/* Compare n values; returns the number of mismatches (first few printed). */
static int compare(const char *what, const double *got, const double *want, int64_t n, kex_dtype dt, double rtol,
                   double atol) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    bool ok;
    if (kex_dtype_is_float(dt)) ok = (isnan(g) && isnan(w)) || g == w || fabs(g - w) <= atol + rtol * fabs(w);
    else ok = g == w;
    if (!ok && bad++ < 5) fprintf(stderr, "  %s[%lld]: got %.9g, want %.9g\n", what, (long long)i, g, w);
  }
  return bad;
}

/* ---------- device correctness on built graphs ---------- */

static const char *dev_names[2] = {"opencl", "cpu"};

/* Run b's graph on both devices and compare every output with the reference interpreter. */
static void check_graph(gb *b, const char *label) {
#ifdef KEX_HAVE_DEVICES
  rval *ref = reference(b->g);
  kex_graph *g = b->g;
  for (int d = 0; d < 2; d++) {
    kex_device *dev = d == 0 ? cl_dev : cpu_dev;
    if (!dev) {
      if (d == 0) fprintf(stderr, "[ SKIP ] %s on opencl: %s\n", label, cl_skip);
      continue;
    }
    planned p;
    kex_error err = {0};
    kex_graph *gc = g;
    if (plan(&p, gc, &err)) fail_msg("%s: plan: %s", label, err.msg);
    double *outs[64] = {0};
    run_stats st;
    int rc = run_on(&p, dev, d == 0 ? KEX_DIALECT_OPENCL : KEX_DIALECT_CPU, outs, &st, &err);
    if (rc) fail_msg("%s on %s: %s", label, dev_names[d], err.msg);
    int bad = 0;
    for (uint32_t j = 0; j < g->noutputs; j++) {
      uint32_t on = g->outputs[j];
      char what[128];
      snprintf(what, sizeof what, "%s/%s/out%u", label, dev_names[d], j);
      bad += compare(what, outs[j], ref[on].v, ref[on].n, g->nodes[on].dtype, 1e-4, 1e-5);
      free(outs[j]);
    }
    p.g = NULL; /* the graph is shared by both runs */
    planned_free(&p);
    if (bad) fail_msg("%s on %s: %d values differ", label, dev_names[d], bad);
  }
  free_reference(g, ref);
  kex_graph_free(g);
  b->g = NULL;
#else
  (void)label;
  kex_graph_free(b->g);
  b->g = NULL;
#endif
}

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define A(...) ((const int32_t[]){__VA_ARGS__})

static void test_elementwise_broadcast(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 1);
  int x = input(&b, KEX_DT_FLOAT32, 2, S(64, 1), -1, 1), y = input(&b, KEX_DT_FLOAT32, 2, S(1, 48), -1, 1);
  int xe = mov(&b, KEX_GOP_EXPAND, x, 2, S(64, 48)), ye = mov(&b, KEX_GOP_EXPAND, y, 2, S(64, 48));
  int z = op2(&b, KEX_GOP_ADD, op2(&b, KEX_GOP_MUL, xe, ye), xe);
  output(&b, z);
  int a3 = input(&b, KEX_DT_FLOAT32, 3, S(64, 64, 1), -1, 1), b3 = input(&b, KEX_DT_FLOAT32, 3, S(1, 64, 64), -1, 1);
  output(&b, op2(&b, KEX_GOP_ADD, mov(&b, KEX_GOP_EXPAND, a3, 3, S(64, 64, 64)), mov(&b, KEX_GOP_EXPAND, b3, 3, S(64, 64, 64))));
  check_graph(&b, "broadcast");
}

static void test_unary_binary_float(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 2);
  int x = input(&b, KEX_DT_FLOAT32, 1, S(1000), 0.1, 4), y = input(&b, KEX_DT_FLOAT32, 1, S(1000), -2, 2);
  kex_gop un[] = {KEX_GOP_EXP2, KEX_GOP_LOG2, KEX_GOP_SIN, KEX_GOP_SQRT, KEX_GOP_NEG};
  for (size_t i = 0; i < sizeof un / sizeof *un; i++) output(&b, op1(&b, un[i], x));
  kex_gop bin[] = {KEX_GOP_ADD, KEX_GOP_SUB, KEX_GOP_MUL, KEX_GOP_DIV, KEX_GOP_MAX, KEX_GOP_CMPLT, KEX_GOP_CMPEQ};
  for (size_t i = 0; i < sizeof bin / sizeof *bin; i++) output(&b, op2(&b, bin[i], x, y));
  int c = op2(&b, KEX_GOP_CMPLT, x, y);
  output(&b, op3(&b, KEX_GOP_WHERE, c, x, y));
  output(&b, op2(&b, KEX_GOP_CMPEQ, x, x));
  check_graph(&b, "float ops");
}

static void test_unary_binary_int(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 3);
  int x = input(&b, KEX_DT_INT32, 1, S(999), -1000, 1000), y = input(&b, KEX_DT_INT32, 1, S(999), 1, 50);
  kex_gop bin[] = {KEX_GOP_ADD, KEX_GOP_SUB, KEX_GOP_MUL, KEX_GOP_DIV, KEX_GOP_MAX, KEX_GOP_MOD,
                   KEX_GOP_CMPLT, KEX_GOP_CMPEQ, KEX_GOP_XOR};
  for (size_t i = 0; i < sizeof bin / sizeof *bin; i++) output(&b, op2(&b, bin[i], x, y));
  output(&b, op1(&b, KEX_GOP_NEG, x));
  output(&b, op3(&b, KEX_GOP_WHERE, op2(&b, KEX_GOP_CMPLT, x, y), x, y));
  /* cast chain: int -> float -> half? no: float -> int -> bool -> float */
  int f = cast(&b, KEX_GOP_CAST, x, KEX_DT_FLOAT32);
  int f2 = op2(&b, KEX_GOP_MUL, f, cnst(&b, KEX_DT_FLOAT32, 1, S(999), kex_const_float(0.37)));
  int i2 = cast(&b, KEX_GOP_CAST, f2, KEX_DT_INT32);
  int bo = cast(&b, KEX_GOP_CAST, i2, KEX_DT_BOOL);
  output(&b, cast(&b, KEX_GOP_CAST, bo, KEX_DT_FLOAT32));
  output(&b, i2);
  check_graph(&b, "int ops");
}

static void test_reductions(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 4);
  int x = input(&b, KEX_DT_FLOAT32, 3, S(8, 16, 32), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 1, A(0)));
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 1, A(1)));
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 1, A(2)));
  output(&b, red(&b, KEX_GOP_REDUCE_MAX, x, 1, A(1)));
  output(&b, red(&b, KEX_GOP_REDUCE_MAX, x, 2, A(0, 2)));
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 3, A(0, 1, 2)));
  int y = input(&b, KEX_DT_FLOAT32, 2, S(4096, 16), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, y, 1, A(1)));
  int z = input(&b, KEX_DT_FLOAT32, 2, S(64, 64), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, z, 1, A(1)));
  int w = input(&b, KEX_DT_INT32, 2, S(33, 17), -100, 100);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, w, 1, A(0)));
  output(&b, red(&b, KEX_GOP_REDUCE_MAX, w, 1, A(1)));
  check_graph(&b, "reductions");
}

static void test_big_sum(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 5);
  int x = input(&b, KEX_DT_FLOAT32, 1, S(4194304), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 1, A(0)));
  check_graph(&b, "sum 4M");
}

static int matmul(gb *b, int n, int m, int k, uint64_t seed) {
  (void)seed;
  int a = input(b, KEX_DT_FLOAT32, 2, S(n, k), -1, 1), w = input(b, KEX_DT_FLOAT32, 2, S(k, m), -1, 1);
  int64_t ar[3] = {n, 1, k}, wr[3] = {1, k, m}, ex[3] = {n, m, k};
  int a3 = mov(b, KEX_GOP_EXPAND, mov(b, KEX_GOP_RESHAPE, a, 3, ar), 3, ex);
  int wt = mov(b, KEX_GOP_PERMUTE, mov(b, KEX_GOP_RESHAPE, w, 3, wr), 3, S(0, 2, 1));
  int w3 = mov(b, KEX_GOP_EXPAND, wt, 3, ex);
  int s = red(b, KEX_GOP_REDUCE_SUM, op2(b, KEX_GOP_MUL, a3, w3), 1, A(2));
  return mov(b, KEX_GOP_RESHAPE, s, 2, ((int64_t[]){n, m}));
}

static void test_matmul(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 6);
  output(&b, matmul(&b, 64, 64, 64, 6));
  output(&b, matmul(&b, 512, 512, 512, 7));
  output(&b, matmul(&b, 33, 17, 45, 8));
  check_graph(&b, "matmul");
}

static void test_softmax(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 9);
  int x = input(&b, KEX_DT_FLOAT32, 2, S(4, 8), -3, 3);
  int m = mov(&b, KEX_GOP_EXPAND, red(&b, KEX_GOP_REDUCE_MAX, x, 1, A(1)), 2, S(4, 8));
  int d = op2(&b, KEX_GOP_SUB, x, m);
  int e = op1(&b, KEX_GOP_EXP2, op2(&b, KEX_GOP_MUL, d, cnst(&b, KEX_DT_FLOAT32, 2, S(4, 8), kex_const_float(1.4426950408889634))));
  int s = mov(&b, KEX_GOP_EXPAND, red(&b, KEX_GOP_REDUCE_SUM, e, 1, A(1)), 2, S(4, 8));
  output(&b, op2(&b, KEX_GOP_DIV, e, s));
  check_graph(&b, "softmax");
}

static void test_movement(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 10);
  int x = input(&b, KEX_DT_FLOAT32, 2, S(4, 6), -1, 1);
  int two = cnst(&b, KEX_DT_FLOAT32, 2, S(6, 8), kex_const_float(2.0));
  output(&b, op2(&b, KEX_GOP_MUL, mov(&b, KEX_GOP_PAD, x, 4, S(1, 1, 0, 2)), two));
  int y = input(&b, KEX_DT_FLOAT32, 3, S(5, 7, 9), -1, 1);
  int sh = mov(&b, KEX_GOP_SHRINK, y, 6, S(1, 4, 0, 7, 2, 9));
  int fl = mov(&b, KEX_GOP_STRIDE, sh, 3, S(-1, 1, -1));
  int pe = mov(&b, KEX_GOP_PERMUTE, fl, 3, S(2, 0, 1));
  output(&b, op2(&b, KEX_GOP_ADD, pe, pe));
  output(&b, op1(&b, KEX_GOP_CONTIGUOUS, mov(&b, KEX_GOP_PERMUTE, y, 3, S(1, 2, 0))));
  /* masked loads: cat of two (3,4096) along dim 0, times 2 */
  int c1 = input(&b, KEX_DT_FLOAT32, 2, S(3, 4096), -1, 1), c2 = input(&b, KEX_DT_FLOAT32, 2, S(3, 4096), -1, 1);
  int p1 = mov(&b, KEX_GOP_PAD, c1, 4, S(0, 3, 0, 0)), p2 = mov(&b, KEX_GOP_PAD, c2, 4, S(3, 0, 0, 0));
  output(&b, op2(&b, KEX_GOP_MUL, op2(&b, KEX_GOP_ADD, p1, p2), cnst(&b, KEX_DT_FLOAT32, 2, S(6, 4096), kex_const_float(2))));
  /* pad then reduce (masked loads under a reduce) */
  int q = input(&b, KEX_DT_FLOAT32, 2, S(30, 30), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, mov(&b, KEX_GOP_PAD, q, 4, S(2, 2, 3, 1)), 1, A(1)));
  /* strided subsample */
  output(&b, op2(&b, KEX_GOP_ADD, mov(&b, KEX_GOP_STRIDE, q, 2, S(2, 3)), mov(&b, KEX_GOP_STRIDE, q, 2, S(-2, -3))));
  check_graph(&b, "movement");
}

/*
 * tinygrad's x.repeat(2, 4, 3, 3, 2, 2) of a (4, 6, 3) tensor (test_ops'
 * test_repeat): reshape to 12 dims, expand, reshape to (2, 4, 3, 12, 12, 6),
 * under the default limits (max_dims 16), then * 2 so a kernel computes it.
 */
static void test_repeat_12_dims(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 16);
  int x = input(&b, KEX_DT_FLOAT32, 3, S(4, 6, 3), -1, 1);
  int r = mov(&b, KEX_GOP_RESHAPE, x, 12, S(1, 1, 1, 1, 1, 1, 1, 4, 1, 6, 1, 3));
  r = mov(&b, KEX_GOP_EXPAND, r, 12, S(2, 1, 4, 1, 3, 1, 3, 4, 2, 6, 2, 3));
  r = mov(&b, KEX_GOP_RESHAPE, r, 6, S(2, 4, 3, 12, 12, 6));
  output(&b, op2(&b, KEX_GOP_MUL, r, cnst(&b, KEX_DT_FLOAT32, 6, S(2, 4, 3, 12, 12, 6), kex_const_float(2))));
  check_graph(&b, "repeat");
}

static void test_elementwise_4m(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 11);
  int a = input(&b, KEX_DT_FLOAT32, 1, S(1 << 20), -1, 1), c = input(&b, KEX_DT_FLOAT32, 1, S(1 << 20), -1, 1),
      d = input(&b, KEX_DT_FLOAT32, 1, S(1 << 20), -1, 1);
  output(&b, op2(&b, KEX_GOP_ADD, op2(&b, KEX_GOP_MUL, a, c), d));
  check_graph(&b, "a*b+c");
}

/* ---------- rendered source ---------- */

static void expect_in(const char *src, const char *needle) {
  if (!strstr(src, needle)) fail_msg("source lacks \"%s\":\n%s", needle, src);
}

static void test_render_clang_example(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 12);
  int a = input(&b, KEX_DT_FLOAT32, 2, S(64, 33), -1, 1), v = input(&b, KEX_DT_FLOAT32, 1, S(33), -1, 1);
  int ve = mov(&b, KEX_GOP_EXPAND, mov(&b, KEX_GOP_RESHAPE, v, 2, S(1, 33)), 2, S(64, 33));
  int s = red(&b, KEX_GOP_REDUCE_SUM, op2(&b, KEX_GOP_MUL, a, ve), 1, A(1));
  int one = cnst(&b, KEX_DT_FLOAT32, 2, S(64, 1), kex_const_float(1.0));
  output(&b, op2(&b, KEX_GOP_ADD, s, one));
  planned p;
  kex_error err = {0};
  assert_int_equal(plan(&p, b.g, &err), 0);
  assert_int_equal(p.s->nkernels, 1);
  kex_program_src ps;
  const kex_sched_item *it = NULL;
  for (uint32_t i = 0; i < p.s->nitems; i++)
    if (p.s->items[i].kind == KEX_ITEM_KERNEL) it = &p.s->items[i];
  if (lower_item(&p, it, &kex_renderer_cpu, KEX_DIALECT_CPU, true, NULL, &ps, &err)) fail_msg("%s", err.msg);
  assert_string_equal(ps.name, "r_64_33");
  expect_in(ps.src, "void r_64_33(void **bufs, const int *ints, int gidx_start, int gidx_end) {");
  expect_in(ps.src, "for (int ridx0 = gidx_start; ridx0 < gidx_end; ridx0++) {");
  expect_in(ps.src, "float acc0 = 0.0f;");
  expect_in(ps.src, "for (int ridx1 = 0; ridx1 < 33; ridx1++) {");
  expect_in(ps.src, "float val0 = data1[(ridx0*33)+ridx1];");
  expect_in(ps.src, "float val1 = data2[ridx1];");
  expect_in(ps.src, "acc0 = ((val0*val1)+acc0);");
  expect_in(ps.src, "data0[ridx0] = (acc0+1.0f);");
  assert_int_equal(ps.global[0], 64);
  assert_int_equal(ps.global[1], 1);
  assert_false(ps.has_local);
  assert_int_equal(ps.nargs, 3);
  assert_true(ps.args[0].is_output);
  kex_program_src_free(&ps);
  /* the same kernel for OpenCL: no loops over globals, SPECIALs instead */
  if (lower_item(&p, it, &kex_renderer_opencl, KEX_DIALECT_OPENCL, true, NULL, &ps, &err)) fail_msg("%s", err.msg);
  expect_in(ps.src, "__kernel void ");
  expect_in(ps.src, "const __global float* data1");
  expect_in(ps.src, "get_group_id(0)");
  kex_program_src_free(&ps);
  planned_free(&p);
}

/* Where needle starts in src, failing when it is absent. */
static size_t pos_of(const char *src, const char *needle) {
  const char *at = strstr(src, needle);
  if (!at) fail_msg("source lacks \"%s\":\n%s", needle, src);
  return (size_t)(at - src);
}

/*
 * The C dialect's tile order (render.c swap_loops): a reduction kernel with
 * two global loops walks the pool's range of the first inside the second
 * (a matmul's thread keeps a column strip of B for its row blocks); a kernel
 * without a reduction keeps the row-major walk.  The numbers are the same
 * either way (test_matmul runs the cpu device against the reference).
 */
static void test_render_clang_tile_order(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 14);
  output(&b, matmul(&b, 64, 64, 64, 0));
  int x = input(&b, KEX_DT_FLOAT32, 2, S(64, 48), -1, 1), y = input(&b, KEX_DT_FLOAT32, 2, S(48, 64), -1, 1);
  output(&b, op2(&b, KEX_GOP_ADD, x, mov(&b, KEX_GOP_PERMUTE, y, 2, S(1, 0))));
  planned p;
  kex_error err = {0};
  assert_int_equal(plan(&p, b.g, &err), 0);
  int seen = 0;
  for (uint32_t i = 0; i < p.s->nitems; i++) {
    const kex_sched_item *it = &p.s->items[i];
    if (it->kind != KEX_ITEM_KERNEL) continue;
    kex_program_src ps;
    if (lower_item(&p, it, &kex_renderer_cpu, KEX_DIALECT_CPU, true, NULL, &ps, &err)) fail_msg("%s", err.msg);
    if (ps.name[0] == 'r') { /* the matmul: ridx1 (column blocks) outermost, the pool's range inside it */
      seen |= 1;
      size_t outer = pos_of(ps.src, "\n  for (int ridx1 = 0; ridx1 < "),
             inner = pos_of(ps.src, "\n    for (int ridx0 = gidx_start; ridx0 < gidx_end; ridx0++) {");
      assert_true(outer < inner);
      assert_true(pos_of(ps.src, "for (int ridx2 = 0; ridx2 < ") > inner);
    } else { /* elementwise: the pool's range stays the outermost loop */
      seen |= 2;
      size_t outer = pos_of(ps.src, "\n  for (int ridx0 = gidx_start; ridx0 < gidx_end; ridx0++) {");
      assert_true(pos_of(ps.src, "for (int ridx1 = 0; ridx1 < ") > outer);
    }
    kex_program_src_free(&ps);
    /* OpenCL has no loops over globals to reorder */
    if (lower_item(&p, it, &kex_renderer_opencl, KEX_DIALECT_OPENCL, true, NULL, &ps, &err)) fail_msg("%s", err.msg);
    assert_null(strstr(ps.src, "gidx_start"));
    kex_program_src_free(&ps);
  }
  assert_int_equal(seen, 3);
  planned_free(&p);
}

/* An n x n x n matmul graph in b (gb_init'ed with seed), planned into *p: its kernel's schedule item. */
static const kex_sched_item *plan_matmul(gb *b, uint64_t seed, int n, planned *p) {
  kex_error err = {0};
  const kex_sched_item *it = NULL;
  gb_init(b, seed);
  output(b, matmul(b, n, n, n, 0));
  assert_int_equal(plan(p, b->g, &err), 0);
  for (uint32_t i = 0; i < p->s->nitems; i++)
    if (p->s->items[i].kind == KEX_ITEM_KERNEL) it = &p->s->items[i];
  assert_non_null(it);
  return it;
}

/*
 * The C dialect writes a tile's stores in address order (render.c
 * flush_stores): with the upcasts applied columns, rows, columns, program
 * order stores each row of the 4 x 16 tile in pieces of 4 (offsets 0..3,
 * 64..67, ..., then 4..7), which kept gcc from vectorizing the tile (3.6x
 * slower).  Sorted, the 64 stores' offsets rise.
 */
static void test_render_clang_store_order(void **state) {
  (void)state;
  gb b;
  planned p;
  kex_error err = {0};
  const kex_sched_item *it = plan_matmul(&b, 15, 64, &p);
  kex_opt opts[3] = {kex_opt_make(KEX_OPT_UPCAST, 1, 4), kex_opt_make(KEX_OPT_UPCAST, 0, 4),
                     kex_opt_make(KEX_OPT_UPCAST, 1, 4)};
  kex_kernel *k = NULL;
  kex_program_src ps;
  assert_int_equal(kex_kernel_from_item(p.s, it, &kex_renderer_cpu, &k, &err), 0);
  assert_int_equal(kex_kernel_apply_opts(k, opts, 3, &err), 0);
  if (kex_lower_kernel(k, &kex_renderer_cpu, KEX_DIALECT_CPU, NULL, &ps, &err)) fail_msg("%s", err.msg);
  long last = -1;
  int nstores = 0;
  for (const char *at = ps.src; (at = strstr(at, "data0[")) != NULL; at++) {
    const char *plus = strchr(at, '+'), *close = strchr(at, ']');
    long off = plus && plus < close ? strtol(plus + 1, NULL, 10) : 0;
    if (off <= last) fail_msg("store %d at offset %ld after %ld:\n%s", nstores, off, last, ps.src);
    last = off;
    nstores++;
  }
  assert_int_equal(nstores, 64);
  expect_in(ps.src, "data0[alu2+4] = acc16;"); /* row 0's second piece, moved up from after row 3's first */
  kex_program_src_free(&ps);
  kex_kernel_free(k);
  planned_free(&p);
}

static void test_render_matmul_float4(void **state) {
  (void)state;
  gb b;
  planned p;
  kex_error err = {0};
  const kex_sched_item *it = plan_matmul(&b, 13, 512, &p);
  kex_program_src ps;
  kex_name_counter names;
  kex_name_counter_init(&names);
  if (lower_item(&p, it, &kex_renderer_opencl, KEX_DIALECT_OPENCL, true, &names, &ps, &err)) fail_msg("%s", err.msg);
  assert_string_equal(ps.name, "r_16_8_8_16_128_4_4_4");
  expect_in(ps.src, "int gidx1 = get_group_id(0); /* 8 */");
  expect_in(ps.src, "int lidx3 = get_local_id(1); /* 16 */");
  expect_in(ps.src, "float4 acc0 = (float4)(0.0,0.0,0.0,0.0);");
  expect_in(ps.src, "(float4)(*((__global float4*)(data1+");
  expect_in(ps.src, "*((__global float4*)(data0+");
  assert_int_equal(ps.global[0], 8);
  assert_int_equal(ps.global[1], 16);
  assert_int_equal(ps.local[0], 8);
  assert_int_equal(ps.local[1], 16);
  assert_true(ps.has_local);
  if (getenv("KEX_CODEGEN_VERBOSE")) fprintf(stderr, "%s\n", ps.src);
  kex_program_src_free(&ps);
  /* a repeated name gets n1 */
  if (lower_item(&p, it, &kex_renderer_opencl, KEX_DIALECT_OPENCL, true, &names, &ps, &err)) fail_msg("%s", err.msg);
  assert_string_equal(ps.name, "r_16_8_8_16_128_4_4_4n1");
  kex_program_src_free(&ps);
  kex_name_counter_free(&names);
  planned_free(&p);
}

static void test_render_group_reduce(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 14);
  int x = input(&b, KEX_DT_FLOAT32, 1, S(4194304), -1, 1);
  output(&b, red(&b, KEX_GOP_REDUCE_SUM, x, 1, A(0)));
  planned p;
  kex_error err = {0};
  assert_int_equal(plan(&p, b.g, &err), 0);
  const kex_sched_item *it = NULL;
  for (uint32_t i = 0; i < p.s->nitems && !it; i++)
    if (p.s->items[i].kind == KEX_ITEM_KERNEL) it = &p.s->items[i];
  kex_program_src ps;
  if (lower_item(&p, it, &kex_renderer_opencl, KEX_DIALECT_OPENCL, true, NULL, &ps, &err)) fail_msg("%s", err.msg);
  assert_string_equal(ps.name, "r_256_16_1024");
  expect_in(ps.src, "__attribute__ ((aligned (16))) __local float temp[16];");
  expect_in(ps.src, "barrier(CLK_LOCAL_MEM_FENCE);");
  expect_in(ps.src, "if ((lidx1<1)) {");
  expect_in(ps.src, "for (int ridx1 = 0; ridx1 < 16; ridx1++) {");
  kex_program_src_free(&ps);
  planned_free(&p);
}

/*
 * x = a, then `len` ops x = x*b, x + c, x*b, x - c, ... (MUL, ADD, MUL, SUB
 * repeating) of float32[64] inputs: every MUL's one user is an ADD or SUB.
 * With `exact`, a and c are small integers and b is +-1 (each cast from
 * int32 inputs), so every value is exact in float32 and the reference
 * interpreter's numbers are the device's to the bit, FMA or not.
 */
static void deep_chain(gb *b, int len, bool exact) {
  int a, m, c;
  if (exact) {
    a = cast(b, KEX_GOP_CAST, input(b, KEX_DT_INT32, 1, S(64), -8, 8), KEX_DT_FLOAT32);
    int bit = cast(b, KEX_GOP_CAST, input(b, KEX_DT_INT32, 1, S(64), 0, 2), KEX_DT_FLOAT32);
    m = op2(b, KEX_GOP_SUB, op2(b, KEX_GOP_MUL, bit, cnst(b, KEX_DT_FLOAT32, 1, S(64), kex_const_float(2))),
            cnst(b, KEX_DT_FLOAT32, 1, S(64), kex_const_float(1)));
    c = cast(b, KEX_GOP_CAST, input(b, KEX_DT_INT32, 1, S(64), -4, 4), KEX_DT_FLOAT32);
  } else {
    a = input(b, KEX_DT_FLOAT32, 1, S(64), -1, 1);
    m = input(b, KEX_DT_FLOAT32, 1, S(64), 0.9, 1.1);
    c = input(b, KEX_DT_FLOAT32, 1, S(64), -0.1, 0.1);
  }
  int x = a;
  for (int i = 0; i < len; i++) {
    static const kex_gop ops[4] = {KEX_GOP_MUL, KEX_GOP_ADD, KEX_GOP_MUL, KEX_GOP_SUB};
    x = op2(b, ops[i % 4], x, i % 2 ? c : m);
  }
  output(b, x);
}

/* How deep brackets nest in the deepest line of src (what clang's -fbracket-depth counts). */
static int deepest_line(const char *src) {
  int d = 0, m = 0;
  for (const char *s = src; *s; s++) {
    if (*s == '(' || *s == '[' || *s == '{') m = ++d > m ? d : m;
    else if (*s == ')' || *s == ']' || *s == '}') d--;
    else if (*s == '\n') d = 0;
  }
  return m;
}

/*
 * The operator at the top of a variable's value in `line` ("float alu3 =
 * ((x*y)+z);" -> '+'), 0 when there is none (a name, a call).
 */
static char top_operator(const char *line) {
  const char *v = strstr(line, " = ");
  if (!v) return 0;
  v += 3;
  size_t n = strcspn(v, ";");
  int d = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] == '(') d++;
    else if (v[i] == ')') d--;
    else if (d == 1 && strchr("+-*/", v[i]) && i > 1) return v[i];
  }
  return 0;
}

/*
 * Deep expressions render through variables: the 1000-op chain's kernel
 * (AST 1000+ levels) nests no line past render.c's NEST_MAX (64) plus a
 * few, on both dialects, where inlining it whole would nest ~1000 brackets;
 * a variable never holds a bare product whose user adds it (OpenCL C
 * contracts a*b+c into an FMA only within one expression); a 40-op chain
 * still renders as one expression, as tinygrad renders it.
 */
static void test_render_deep_chain(void **state) {
  (void)state;
  static const kex_renderer_caps *const caps[2] = {&kex_renderer_opencl, &kex_renderer_cpu};
  static const int dialects[2] = {KEX_DIALECT_OPENCL, KEX_DIALECT_CPU};
  for (int len = 40; len <= 1000; len += 960)
    for (int d = 0; d < 2; d++) {
      gb b;
      gb_init(&b, 15);
      b.lim.max_kernel_depth = (uint32_t)len + 16; /* whatever the default */
      deep_chain(&b, len, false);
      planned p;
      kex_error err = {0};
      if (plan(&p, b.g, &err)) fail_msg("%d ops: %s", len, err.msg);
      assert_int_equal(p.s->nkernels, 1);
      const kex_sched_item *it = NULL;
      for (uint32_t i = 0; i < p.s->nitems; i++)
        if (p.s->items[i].kind == KEX_ITEM_KERNEL) it = &p.s->items[i];
      assert_true(it->ast[0]->depth > (uint32_t)len);
      kex_program_src ps;
      if (lower_item(&p, it, caps[d], dialects[d], true, NULL, &ps, &err)) fail_msg("%s", err.msg);
      int vars = 0, deepest = deepest_line(ps.src);
      for (const char *l = strstr(ps.src, "float"); l; l = strstr(l + 1, "float")) {
        if (strncmp(l, "float alu", 9) != 0 && strncmp(l, "float4 alu", 10) != 0) continue; /* a float variable */
        char op = top_operator(l);
        if (op != '+' && op != '-') {
          const char *eol = strchr(l, '\n');
          fail_msg("%s, %d ops: a variable that is not an ADD/SUB:\n%.*s", dev_names[d], len,
                   (int)(eol ? eol - l : (long)strlen(l)), l);
        }
        vars++;
      }
      if (len == 40 && (vars != 0 || deepest < 40)) fail_msg("%s: the 40-op chain split (%d variables, %d deep):\n%s", dev_names[d], vars, deepest, ps.src);
      if (len == 1000 && (vars < 1000 / 64 || deepest > 64 + 8))
        fail_msg("%s: the 1000-op chain has %d variables, a line %d brackets deep", dev_names[d], vars, deepest);
      kex_program_src_free(&ps);
      planned_free(&p);
    }
}

/*
 * A chain of 1,000 elementwise ops under the default limits: one kernel,
 * rendered, compiled (PoCL on opencl, gcc on cpu) and run, every value
 * exact (deep_chain's integers), against the reference interpreter.
 */
static void test_deep_chain_1000(void **state) {
  (void)state;
  gb b;
  gb_init(&b, 17);
  deep_chain(&b, 1000, true);
  planned p;
  kex_error err = {0};
  if (plan(&p, b.g, &err)) fail_msg("%s", err.msg);
  assert_int_equal(p.s->nkernels, 1);
  p.g = NULL; /* check_graph plans b.g again */
  planned_free(&p);
  check_graph(&b, "1000-op chain");
}

/* deepest_line of each dialect's render of a 9,998-op chain (a kernel at the default max_kernel_depth), or -1 */
static void *render_10k_thread(void *arg) {
  int *deepest = arg;
  static const kex_renderer_caps *const caps[2] = {&kex_renderer_opencl, &kex_renderer_cpu};
  static const int dialects[2] = {KEX_DIALECT_OPENCL, KEX_DIALECT_CPU};
  gb b;
  gb_init(&b, 18);
  b.lim.max_depth = KEX_LIMIT_KERNEL_DEPTH + 8; /* the defaults of both bind before max_kernel_depth's */
  b.lim.max_kernel_ops = KEX_LIMIT_KERNEL_DEPTH + 8;
  deep_chain(&b, KEX_LIMIT_KERNEL_DEPTH - 2, false);
  planned p;
  kex_error err = {0};
  deepest[0] = deepest[1] = -1;
  if (plan(&p, b.g, &err) == 0 && p.s->nkernels == 1)
    for (uint32_t i = 0; i < p.s->nitems; i++)
      if (p.s->items[i].kind == KEX_ITEM_KERNEL && p.s->items[i].ast[0]->depth == KEX_LIMIT_KERNEL_DEPTH)
        for (int d = 0; d < 2; d++) {
          kex_program_src ps;
          if (lower_item(&p, &p.s->items[i], caps[d], dialects[d], true, NULL, &ps, &err) == 0) {
            deepest[d] = deepest_line(ps.src);
            kex_program_src_free(&ps);
          }
        }
  planned_free(&p);
  return NULL;
}

/*
 * A kernel at the default max_kernel_depth (10,000 levels) is scheduled,
 * lowered and rendered on a 256 KiB stack (kexd's pool threads have 8 MiB):
 * no pass recurses on the AST, and no line nests past NEST_MAX plus a few.
 */
static void test_render_10k_levels(void **state) {
  (void)state;
  int deepest[2];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t t;
  assert_int_equal(pthread_create(&t, &attr, render_10k_thread, deepest), 0);
  pthread_join(t, NULL);
  pthread_attr_destroy(&attr);
  for (int d = 0; d < 2; d++)
    if (deepest[d] < 0 || deepest[d] > 64 + 8) fail_msg("%s: deepest line %d", dev_names[d], deepest[d]);
}

/* ---------- the numeric cases ---------- */

static int b64val(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static uint8_t *b64decode(const char *s, size_t *len) {
  size_t n = strlen(s);
  uint8_t *out = malloc(n / 4 * 3 + 4);
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64val(s[i]);
    if (v < 0) continue;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (uint8_t)(acc >> bits);
    }
  }
  *len = o;
  return out;
}

static void test_numeric_cases(void **state) {
  (void)state;
#ifdef KEX_HAVE_DEVICES
  const char *dir = getenv("KEX_CASES_DIR");
  if (!dir) dir = "../shared/cases";
  DIR *dd = opendir(dir);
  if (!dd) {
    fprintf(stderr, "[ SKIP ] numeric cases: no %s\n", dir);
    return;
  }
  struct dirent *de;
  char *files[512];
  int nfiles = 0;
  while ((de = readdir(dd)) && nfiles < 512) {
    size_t l = strlen(de->d_name);
    if (l > 5 && !strcmp(de->d_name + l - 5, ".json") && strcmp(de->d_name, "INDEX.json")) files[nfiles++] = strdup(de->d_name);
  }
  closedir(dd);
  for (int i = 0; i < nfiles; i++)
    for (int j = i + 1; j < nfiles; j++)
      if (strcmp(files[i], files[j]) > 0) {
        char *t = files[i];
        files[i] = files[j];
        files[j] = t;
      }
  int total = 0, pass[2] = {0, 0}, skipped[2] = {0, 0}, failed[2] = {0, 0};
  for (int fi = 0; fi < nfiles; fi++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, files[fi]);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *num = root ? json_object_get(root, "numeric") : NULL;
    if (!num || !json_is_object(num) || !kex_test_sampled((size_t)fi)) {
      json_decref(root);
      continue;
    }
    total++;
    double rtol = json_real_value(json_object_get(num, "rtol")), atol = json_real_value(json_object_get(num, "atol"));
    char *text = json_dumps(num, JSON_COMPACT);
    json_t *expected = json_object_get(num, "expected");
    /* d = 0, the OpenCL device under tinygrad's GPU rules, is exactly what test_run
     * runs for every case (kex_run_graph); here only the cpu dialect under the GPU
     * rules (no buffer views), kernels test_run's cpu half never renders */
    for (int d = 1; d < 2; d++) {
      kex_device *dev = d == 0 ? cl_dev : cpu_dev;
      if (!dev) {
        skipped[d]++;
        continue;
      }
      kex_limits lim = KEX_LIMITS_DEFAULT;
      kex_error err = {0};
      kex_graph *g = NULL;
      if (kex_graph_from_json(text, strlen(text), &lim, &g, &err)) fail_msg("%s: graph: %s", files[fi], err.msg);
      planned p;
      if (plan(&p, g, &err)) fail_msg("%s: plan: %s", files[fi], err.msg);
      double *outs[KEX_LIMIT_OUTPUTS > 256 ? 256 : KEX_LIMIT_OUTPUTS] = {0};
      run_stats st;
      int rc = g->noutputs > 256 ? KEX_ELIMIT : run_on(&p, dev, d == 0 ? KEX_DIALECT_OPENCL : KEX_DIALECT_CPU, outs, &st, &err);
      int bad = 0;
      if (rc == KEX_EUNSUPPORTED) {
        fprintf(stderr, "[ SKIP ] %s on %s: %s\n", files[fi], dev_names[d], err.msg);
        skipped[d]++;
      } else if (rc) {
        fprintf(stderr, "[ FAIL ] %s on %s: %s\n", files[fi], dev_names[d], err.msg);
        failed[d]++;
      } else {
        for (uint32_t j = 0; j < g->noutputs && j < json_array_size(expected); j++) {
          json_t *e = json_array_get(expected, j);
          int dt = kex_dtype_from_name(json_string_value(json_object_get(e, "dtype")));
          size_t len;
          uint8_t *raw = b64decode(json_string_value(json_object_get(e, "data")), &len);
          int64_t n = dt >= 0 ? (int64_t)len / kex_dtype_size((kex_dtype)dt) : 0;
          double *want = calloc((size_t)(n ? n : 1), sizeof *want);
          for (int64_t q = 0; q < n; q++) want[q] = load_typed(raw, (kex_dtype)dt, q);
          int64_t have = kex_lb_size(p.r->node_lb[g->outputs[j]]);
          char what[256];
          snprintf(what, sizeof what, "%s/%s/out%u", files[fi], dev_names[d], j);
          if (have != n) {
            fprintf(stderr, "  %s: %lld values, expected %lld\n", what, (long long)have, (long long)n);
            bad++;
          } else {
            bad += compare(what, outs[j], want, n, (kex_dtype)dt, rtol, atol);
          }
          free(want);
          free(raw);
        }
        if (bad) {
          fprintf(stderr, "[ FAIL ] %s on %s: %d values differ\n", files[fi], dev_names[d], bad);
          failed[d]++;
        } else {
          pass[d]++;
        }
      }
      for (uint32_t j = 0; j < g->noutputs && j < 256; j++) free(outs[j]);
      planned_free(&p);
    }
    free(text);
    json_decref(root);
  }
  for (int i = 0; i < nfiles; i++) free(files[i]);
  fprintf(stderr, "numeric cases: %d; opencl: %d pass, %d fail, %d skipped; cpu: %d pass, %d fail, %d skipped\n", total,
          pass[0], failed[0], skipped[0], pass[1], failed[1], skipped[1]);
  assert_int_equal(failed[0], 0);
  assert_int_equal(failed[1], 0);
  assert_true(pass[1] > 0);
#endif
}

static int setup(void **state) {
  (void)state;
#ifdef KEX_HAVE_DEVICES
  kex_error err = {0};
  if (kex_device_open("opencl", &cl_dev, &err)) {
    cl_dev = NULL;
    static char why[KEX_ERROR_MSG_MAX + 64];
    snprintf(why, sizeof why, "no OpenCL device (%s)", err.msg);
    cl_skip = why;
    fprintf(stderr, "[ SKIP ] the OpenCL half: %s\n", why);
  }
  if (kex_device_open("cpu", &cpu_dev, &err)) fail_msg("cpu device: %s", err.msg);
#endif
  return 0;
}

static int teardown(void **state) {
  (void)state;
#ifdef KEX_HAVE_DEVICES
  kex_device_unref(cl_dev);
  kex_device_unref(cpu_dev);
#endif
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_render_clang_example),
      cmocka_unit_test(test_render_clang_tile_order),
      cmocka_unit_test(test_render_clang_store_order),
      cmocka_unit_test(test_render_matmul_float4),
      cmocka_unit_test(test_render_group_reduce),
      cmocka_unit_test(test_render_deep_chain),
      cmocka_unit_test(test_render_10k_levels),
      cmocka_unit_test(test_elementwise_broadcast),
      cmocka_unit_test(test_unary_binary_float),
      cmocka_unit_test(test_unary_binary_int),
      cmocka_unit_test(test_reductions),
      cmocka_unit_test(test_big_sum),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_movement),
      cmocka_unit_test(test_repeat_12_dims),
      cmocka_unit_test(test_elementwise_4m),
      cmocka_unit_test(test_deep_chain_1000),
      cmocka_unit_test(test_numeric_cases),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

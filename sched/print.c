/*
 * print.c - the stable text and JSON forms of a schedule.
 *
 * Each item prints a header line (index, kind, output and input buffers),
 * then its AST as a numbered DAG in postorder: every distinct LazyOp once, as
 * "%N = OP(%a, %b) dtype [idx] [ShapeTracker]", so shared sub-ASTs never
 * repeat and the text stays linear in the AST size.  The walk is iterative.
 */
#include <jansson.h>
#include <string.h>

#include "core/alloc.h"
#include "core/strbuf.h"
#include "core/ptrmap.h"
#include "sched/schedule.h"

int kex_item_label(const kex_sched_item *it, char *buf, size_t len) {
  switch (it->kind) {
  case KEX_ITEM_KERNEL: return snprintf(buf, len, "kernel:%uout", it->nout);
  case KEX_ITEM_EMPTY: return snprintf(buf, len, "LoadOps.EMPTY");
  case KEX_ITEM_COPY: return snprintf(buf, len, "LoadOps.COPY");
  case KEX_ITEM_CUSTOM: return snprintf(buf, len, "LoadOps.CUSTOM");
  case KEX_ITEM_VIEW: return snprintf(buf, len, "LoadOps.VIEW");
  }
  return snprintf(buf, len, "?");
}

static void sb_st(kex_strbuf *b, const kex_st *st) {
  char small[512];
  int n = kex_st_repr(st, small, sizeof small);
  if (n < (int)sizeof small) {
    kex_strbuf_put(b, small, (size_t)n);
    return;
  }
  char *big = kex_malloc((size_t)n + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  kex_st_repr(st, big, (size_t)n + 1);
  kex_strbuf_put(b, big, (size_t)n);
  kex_free(big);
}

/* AST node -> its %N number (stored as number + 1 in the map's value). */
static int num_get(kex_ptrmap *m, const kex_lop *l) {
  void **v = kex_ptrmap_find(m, l, NULL);
  return v ? (int)((uintptr_t)*v - 1) : -1;
}

static int num_put(kex_ptrmap *m, const kex_lop *l, uint32_t v) { return kex_ptrmap_put(m, l, NULL, (void *)(uintptr_t)(v + 1)); }

/*
 * Append the AST lines of one kernel item to b, one line per distinct node,
 * each line starting with `indent`.  Calls line_cb per finished line when given.
 */
static int ast_lines(const kex_sched_item *it, kex_strbuf *b, const char *indent, json_t *arr) {
  kex_ptrmap m = {0};
  const kex_lop **stack = NULL;
  uint32_t n = 0, cap = 0;
  uint32_t next = 0;
  int rc = 0;
  for (uint32_t o = 0; o < it->nout; o++) {
    /* iterative postorder: push root; a node is emitted once all its sources are numbered */
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      const kex_lop **ns = kex_realloc(stack, sizeof *ns * cap);
      if (!ns) goto nomem;
      stack = ns;
    }
    stack[n++] = it->ast[o];
    while (n) {
      const kex_lop *l = stack[n - 1];
      if (num_get(&m, l) >= 0) {
        n--;
        continue;
      }
      bool ready = true;
      for (int i = l->nsrc - 1; i >= 0; i--) {
        if (num_get(&m, l->src[i]) >= 0) continue;
        ready = false;
        if (n == cap) {
          cap *= 2;
          const kex_lop **ns = kex_realloc(stack, sizeof *ns * cap);
          if (!ns) goto nomem;
          stack = ns;
        }
        stack[n++] = l->src[i];
      }
      if (!ready) continue;
      n--;
      if (num_put(&m, l, next)) goto nomem;
      size_t start = b->len;
      /* "%s%%%u = %s(%%a, %%b) dtypes.%s idx=%d", appended piece by piece (printf was most of a Plan's cost) */
      kex_strbuf_puts(b, indent);
      kex_strbuf_put(b, "%", 1);
      kex_strbuf_i64(b, next++);
      kex_strbuf_put(b, " = ", 3);
      kex_strbuf_puts(b, kex_op_name(l->op));
      if (l->nsrc) {
        kex_strbuf_put(b, "(", 1);
        for (int i = 0; i < l->nsrc; i++) {
          kex_strbuf_put(b, i ? ", %" : "%", i ? 3 : 1);
          kex_strbuf_i64(b, num_get(&m, l->src[i]));
        }
        kex_strbuf_put(b, ")", 1);
      }
      kex_strbuf_put(b, " dtypes.", 8);
      kex_strbuf_puts(b, kex_dtype_tgname(l->dtype));
      if (l->op == KEX_OP_LOAD || l->op == KEX_OP_STORE) {
        kex_strbuf_put(b, " idx=", 5);
        kex_strbuf_i64(b, l->idx);
      }
      if (l->op == KEX_OP_BCONST) {
        char v[64];
        kex_const_repr(l->val, v, sizeof v);
        kex_strbuf_printf(b, " val=%s", v);
      }
      if (KEX_OP_IS_REDUCE(l->op)) {
        kex_strbuf_printf(b, " axis=(");
        int k = 0;
        for (int a = 0; a < 32; a++)
          if (l->axis_mask >> a & 1) kex_strbuf_printf(b, "%s%d", k++ ? ", " : "", a);
        kex_strbuf_printf(b, k == 1 ? ",)" : ")");
      }
      if (l->st) {
        kex_strbuf_put(b, " ", 1);
        sb_st(b, l->st);
      }
      if (arr && !b->oom) {
        const char *line = b->p + start + strlen(indent);
        if (json_array_append_new(arr, json_stringn(line, b->len - start - strlen(indent)))) goto nomem;
      }
      kex_strbuf_put(b, "\n", 1);
      if (b->oom) goto nomem;
    }
  }
  goto out;
nomem:
  rc = KEX_ENOMEM;
out:
  kex_free(stack);
  kex_ptrmap_free(&m);
  return rc;
}

static void buf_list(kex_strbuf *b, const uint32_t *ids, uint32_t n) {
  kex_strbuf_printf(b, "[");
  for (uint32_t i = 0; i < n; i++) kex_strbuf_printf(b, "%sbuf%u", i ? ", " : "", ids[i]);
  kex_strbuf_printf(b, "]");
}

/* How many of it->bufs are outputs: its outputs that have a size (at most nbufs). */
static uint32_t item_outputs(const kex_schedule *s, const kex_sched_item *it) {
  uint32_t nout = 0;
  for (uint32_t j = 0; j < it->nout; j++)
    if (s->replay->buffers[it->outs[j]->buffer].size) nout++;
  return nout < it->nbufs ? nout : it->nbufs;
}

int kex_schedule_print(const kex_schedule *s, FILE *f) { return kex_schedule_print_annotated(s, f, NULL); }

int kex_schedule_print_annotated(const kex_schedule *s, FILE *f, const char *const *notes) {
  kex_strbuf b = {0};
  int rc = 0;
  for (uint32_t i = 0; i < s->nitems; i++) {
    const kex_sched_item *it = &s->items[i];
    char label[64];
    kex_item_label(it, label, sizeof label);
    uint32_t nout = item_outputs(s, it);
    kex_strbuf_printf(&b, "item %u: %s outputs=", i, label);
    buf_list(&b, it->bufs, nout);
    kex_strbuf_printf(&b, " inputs=");
    buf_list(&b, it->bufs + nout, it->nbufs - nout);
    kex_strbuf_printf(&b, "\n");
    if (notes && notes[i]) kex_strbuf_printf(&b, "%s", notes[i]);
    if (it->kind == KEX_ITEM_KERNEL && (rc = ast_lines(it, &b, "  ", NULL))) break;
    if (b.oom) break;
    if (b.len > 1 << 16) {
      fwrite(b.p, 1, b.len, f);
      b.len = 0;
    }
  }
  if (!rc && !b.oom) {
    kex_strbuf_printf(&b, "kernels: %u\n", s->nkernels);
    if (b.p) fwrite(b.p, 1, b.len, f);
  }
  if (b.oom) rc = KEX_ENOMEM;
  kex_free(b.p);
  return rc;
}

static json_t *id_array(const uint32_t *ids, uint32_t n) {
  json_t *a = json_array();
  for (uint32_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return a;
}

void kex_schedule_item_view(const kex_schedule *s, uint32_t i, kex_item_view *v) {
  const kex_sched_item *it = &s->items[i];
  uint32_t nout = item_outputs(s, it);
  v->kernel = it->kind == KEX_ITEM_KERNEL;
  kex_item_label(it, v->label, sizeof v->label);
  v->outputs = it->bufs;
  v->noutputs = nout;
  v->inputs = it->bufs + nout;
  v->ninputs = it->nbufs - nout;
  v->planned = it->planned ? it->planned : it->bufs;
  v->nplanned = it->nbufs;
}

int kex_schedule_item_ast(const kex_schedule *s, uint32_t i, kex_strbuf *b) {
  const kex_sched_item *it = &s->items[i];
  return it->kind == KEX_ITEM_KERNEL ? ast_lines(it, b, "", NULL) : 0;
}

void *kex_schedule_to_json(const kex_schedule *s) {
  json_t *items = json_array();
  kex_strbuf b = {0};
  if (!items) return NULL;
  for (uint32_t i = 0; i < s->nitems; i++) {
    const kex_sched_item *it = &s->items[i];
    kex_item_view v;
    kex_schedule_item_view(s, i, &v);
    json_t *ast = json_array();
    json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", "kind", v.kernel ? "kernel" : "loadop", "label", v.label,
                          "outputs", id_array(v.outputs, v.noutputs), "inputs", id_array(v.inputs, v.ninputs),
                          "buffers_planned", id_array(v.planned, v.nplanned), "ast", ast ? ast : json_null());
    if (!o || !ast) goto fail;
    b.len = 0;
    if (it->kind == KEX_ITEM_KERNEL && ast_lines(it, &b, "", ast)) {
      json_decref(o);
      goto fail;
    }
    if (json_array_append_new(items, o)) goto fail;
  }
  kex_free(b.p);
  return items;
fail:
  kex_free(b.p);
  json_decref(items);
  return NULL;
}

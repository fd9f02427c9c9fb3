/*
 * kept.c - graphs a job keeps (kept.h).
 */
#include "daemon/kept.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "daemon/jobs.h"
#include "proto/pballoc.h"

static bool id_ok(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > KEXD_KEPT_ID_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  }
  return true;
}

static kexd_kept *find(kexd_job *job, const char *id) {
  for (uint32_t i = 0; i < job->nkept; i++)
    if (strcmp(job->kept[i].id, id) == 0) return &job->kept[i];
  return NULL;
}

static void drop(kexd_job *job, uint32_t i) {
  job->kept_bytes -= job->kept[i].len;
  kex_free(job->kept[i].bytes);
  job->kept[i] = job->kept[--job->nkept];
}

static void evict_lru(kexd_job *job) {
  uint32_t lru = 0;
  for (uint32_t i = 1; i < job->nkept; i++)
    if (job->kept[i].used < job->kept[lru].used) lru = i;
  drop(job, lru);
}

int kexd_kept_put(kexd_job *job, const char *id, const Kex__V1__Graph *g, uint32_t max_n, uint64_t max_bytes,
                  kex_error *err) {
  if (!id_ok(id))
    return kex_err_set(err, KEX_EINVAL, "Submit: keep_as must be 1-%d characters of A-Z a-z 0-9 . _ -",
                       KEXD_KEPT_ID_MAX);
  size_t len = protobuf_c_message_get_packed_size(&g->base);
  if (len > max_bytes)
    return kex_err_set(err, KEX_ELIMIT, "Submit: keep_as: the graph is %zu bytes, more than a job may keep "
                       "(%" PRIu64 ", --max-kept-graph-bytes)", len, max_bytes);
  kexd_kept *k = find(job, id);
  if (k) drop(job, (uint32_t)(k - job->kept));
  while (job->nkept && (job->nkept >= max_n || job->kept_bytes + len > max_bytes)) evict_lru(job);
  if (job->nkept == job->capkept) {
    uint32_t cap = job->capkept ? job->capkept * 2 : 4;
    kexd_kept *nk = kex_realloc(job->kept, cap * sizeof *nk);
    if (!nk) return kex_err_set(err, KEX_ENOMEM, "Submit: keep_as: out of memory");
    job->kept = nk, job->capkept = cap;
  }
  uint8_t *bytes = kex_malloc(len ? len : 1);
  if (!bytes) return kex_err_set(err, KEX_ENOMEM, "Submit: keep_as: out of memory");
  protobuf_c_message_pack(&g->base, bytes);
  k = &job->kept[job->nkept++];
  memset(k, 0, sizeof *k);
  memcpy(k->id, id, strlen(id) + 1);
  k->bytes = bytes, k->len = len, k->used = ++job->kept_clock;
  snprintf(k->device, sizeof k->device, "%s", g->device ? g->device : ""); /* checked (a configured device) by now */
  job->kept_bytes += len;
  return 0;
}

/* Node n's contents become binding b's (copied: the Graph owns all it points to). */
static int bind_node(Kex__V1__Node *n, const Kex__V1__Binding *b) {
  void *copy = NULL;
  if (b->value_case == KEX__V1__BINDING__VALUE_BUFFER) {
    if (!(copy = kex_strdup(b->buffer))) return KEX_ENOMEM;
  } else if (b->data.len && !(copy = kex_malloc(b->data.len))) {
    return KEX_ENOMEM;
  }
  if (n->contents_case == KEX__V1__NODE__CONTENTS_BUFFER) kex_free(n->buffer);
  if (n->contents_case == KEX__V1__NODE__CONTENTS_DATA) kex_free(n->data.data);
  if (n->contents_case == KEX__V1__NODE__CONTENTS_FILL_VALUE) {
    protobuf_c_message_free_unpacked(&n->fill_value->base, &kex_pb_allocator);
  }
  if (b->value_case == KEX__V1__BINDING__VALUE_BUFFER) {
    n->contents_case = KEX__V1__NODE__CONTENTS_BUFFER;
    n->buffer = copy;
  } else {
    if (b->data.len) memcpy(copy, b->data.data, b->data.len);
    n->contents_case = KEX__V1__NODE__CONTENTS_DATA;
    n->data.data = copy;
    n->data.len = b->data.len;
  }
  return 0;
}

Kex__V1__Graph *kexd_kept_bind(kexd_job *job, const Kex__V1__SubmitRequest *m, kex_error *err) {
  kexd_kept *k = find(job, m->graph_ref);
  if (!k) {
    kex_err_set(err, KEX_ENOTFOUND, "Submit: graph_ref \"%.64s\": job '%s' keeps no graph of that name (send the "
                "graph whole, with keep_as)", m->graph_ref, job->name);
    return NULL;
  }
  k->used = ++job->kept_clock;
  kex_pb_alloc_reset();
  Kex__V1__Graph *g = kex__v1__graph__unpack(&kex_pb_allocator, k->len, k->bytes);
  if (!g) {
    kex_err_set(err, KEX_ENOMEM, "Submit: graph_ref: out of memory");
    return NULL;
  }
  uint8_t *seen = kex_calloc(g->n_nodes ? g->n_nodes : 1, 1);
  if (!seen) {
    kex_err_set(err, KEX_ENOMEM, "Submit: graph_ref: out of memory");
    protobuf_c_message_free_unpacked(&g->base, &kex_pb_allocator);
    return NULL;
  }
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < m->n_bindings; i++) {
    const Kex__V1__Binding *b = m->bindings[i];
    if (b->node >= g->n_nodes || strcmp(g->nodes[b->node]->op, "BUFFER") != 0) {
      rc = kex_err_set(err, KEX_EINVAL, "Submit: binding %zu: node %u of graph \"%.64s\" is not a BUFFER node", i,
                       b->node, m->graph_ref);
    } else if (seen[b->node]) {
      rc = kex_err_set(err, KEX_EINVAL, "Submit: binding %zu: node %u is bound twice", i, b->node);
    } else if (b->value_case == KEX__V1__BINDING__VALUE__NOT_SET) {
      rc = kex_err_set(err, KEX_EINVAL, "Submit: binding %zu: neither buffer nor data", i);
    } else {
      seen[b->node] = 1;
      rc = bind_node(g->nodes[b->node], b);
      if (rc == KEX_ENOMEM) kex_err_set(err, rc, "Submit: graph_ref: out of memory");
    }
  }
  kex_free(seen);
  if (rc < 0) {
    protobuf_c_message_free_unpacked(&g->base, &kex_pb_allocator);
    return NULL;
  }
  return g;
}

const char *kexd_kept_device(kexd_job *job, const char *id) {
  const kexd_kept *k = find(job, id);
  return k ? k->device : NULL;
}

void kexd_kept_free_all(kexd_job *job) {
  for (uint32_t i = 0; i < job->nkept; i++) kex_free(job->kept[i].bytes);
  kex_free(job->kept);
  job->kept = NULL, job->nkept = job->capkept = 0, job->kept_bytes = 0;
}

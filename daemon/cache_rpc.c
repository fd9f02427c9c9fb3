/*
 * cache_rpc.c - the beam-cache RPCs: ListCache, GetCacheEntry,
 * ExportCache (a server stream), ImportCache (a client stream) and
 * DeleteCache, and the memo of rendered sources GetCacheEntry returns.
 *
 * Each call decodes and checks its request on the loop, runs its SQLite
 * work as one piece of pool work (daemon/work.h), and answers from the after-callback; its
 * lifetime and its writes go through the call's kexd_stream (stream.h):
 * ImportCache holds the stream while a read is outstanding, every call
 * while its pool job runs, and ExportCache writes the export in chunks of
 * at most CACHE_EXPORT_CHUNK bytes (under --max-message), the last one
 * carrying the entry count.
 *
 * Visibility: every entry a Tune or beam Submit makes records its job's
 * tenant (search/cache.h's tenant column); with --auth, ListCache and
 * GetCacheEntry show a user only its own tenant's entries, an admin all.
 * Submit and Tune still use any matching entry (the results are shared,
 * the listing is not).
 *
 * SQLite (the policy is search/cache.h's): kexd keeps one connection per
 * worker thread (realize/engine.h, kex_cache_conns); the cache RPCs, Tune
 * and Submit's beam hook use the connection of the thread they run on.
 *
 * GetCacheEntry's `source`: kexd cannot rebuild a kernel from ast_text
 * (there is no kex.ast.v1 parser), so it returns the source it rendered
 * itself: every kernel a Tune or a beam Submit lowered since kexd started
 * is remembered (AST key, device kind, opts text -> source; the last
 * KEXD_TUNE_SOURCES of them, kexd_cache_memo_put).  An entry that matches
 * one of those gets its source; any other (imported, made by another
 * process, before a restart, or with other opts) gets "".
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "codegen/astkey.h"
#include "core/alloc.h"
#include "core/log.h"
#include "daemon/rpc.h"
#include "daemon/work.h"
#include "realize/engine.h"
#include "daemon/stream.h"
#include "search/cache.h"

#define CACHE_LIST_DEFAULT 100
#define CACHE_LIST_MAX 1000
#define CACHE_EXPORT_CHUNK (1u << 20)     /* bytes per ExportCacheChunk at most */
#define CACHE_IMPORT_ERRORS 16            /* messages in an ImportCacheReply */
#define PAGE_TOKEN_PREFIX "kexpg1."

typedef struct source_memo {
  char ast_hex[KEX_AST_KEY_HEX];
  char kind[KEX_DEVICE_FIELD_MAX];
  char *opts;   /* kex_malloc'd */
  char *source; /* kex_malloc'd */
} source_memo;

typedef struct kexd_cache_rpc {
  /* memo_lock protects memo (GetCacheEntry's sources) */
  pthread_mutex_t memo_lock;
  source_memo memo[KEXD_TUNE_SOURCES];
  uint32_t memo_next;
} kexd_cache_rpc;

/* ---- entries as protobuf ---- */

void kexd_cache_entry_to_pb(kex_cache_entry *e, kexd_pb_entry *p) {
  kex__v1__cache_entry__init(&p->m);
  kex__v1__device_identity__init(&p->id);
  p->m.key = e->ast_hex;
  p->m.device = e->device_rendered;
  p->m.kernel_name = e->value.kernel_name;
  for (uint32_t i = 0; i < e->value.nopts && i < KEX_CACHE_MAX_OPTS; i++) {
    kex_opt_short(e->value.opts[i], p->opt_s[i], sizeof p->opt_s[i]);
    p->opt_p[i] = p->opt_s[i];
  }
  p->m.n_opts = e->value.nopts;
  p->m.opts = p->opt_p;
  p->m.best_us = e->value.best_time_s * 1e6;
  p->m.baseline_us = e->value.hand_time_s * 1e6;
  p->m.search_ms = e->value.search_time_s * 1e3;
  p->m.created_unix = e->value.created_at;
  p->m.search_opts = e->search_opts;
  p->m.codegen = e->codegen_version;
  p->m.candidates = e->value.candidates > 0 ? (uint64_t)e->value.candidates : 0;
  p->m.tenant = e->value.tenant;
  p->id.kind = e->device.kind;
  p->id.vendor = e->device.vendor;
  p->id.name = e->device.name;
  p->id.driver_version = e->device.driver_version;
  p->id.compiler_version = e->device.compiler_version;
  p->m.identity = &p->id;
}

/* ---- the memo of rendered sources ---- */

void kexd_cache_memo_put(kexd *d, const char *ast_hex, const char *kind, const char *opts, const char *src) {
  kexd_cache_rpc *T = d->cache_rpc;
  char *o = kex_strdup(opts), *s = kex_strdup(src);
  if (!o || !s) {
    kex_free(o), kex_free(s);
    return;
  }
  pthread_mutex_lock(&T->memo_lock);
  source_memo *m = NULL;
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES && !m; i++)
    if (T->memo[i].source && !strcmp(T->memo[i].ast_hex, ast_hex) && !strcmp(T->memo[i].kind, kind) &&
        !strcmp(T->memo[i].opts, opts))
      m = &T->memo[i];
  if (!m) m = &T->memo[T->memo_next++ % KEXD_TUNE_SOURCES];
  kex_free(m->opts), kex_free(m->source);
  snprintf(m->ast_hex, sizeof m->ast_hex, "%s", ast_hex);
  snprintf(m->kind, sizeof m->kind, "%s", kind);
  m->opts = o;
  m->source = s;
  pthread_mutex_unlock(&T->memo_lock);
}

/* A copy of the remembered source, or NULL. */
static char *memo_get(kexd_cache_rpc *T, const char *ast_hex, const char *kind, const char *opts) {
  char *r = NULL;
  pthread_mutex_lock(&T->memo_lock);
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES && !r; i++)
    if (T->memo[i].source && !strcasecmp(T->memo[i].ast_hex, ast_hex) && !strcmp(T->memo[i].kind, kind) &&
        !strcmp(T->memo[i].opts, opts))
      r = kex_strdup(T->memo[i].source);
  pthread_mutex_unlock(&T->memo_lock);
  return r;
}

/* ---- the cache RPCs (SQLite on the pool, each thread on its own connection) ---- */

typedef enum cache_op { OP_LIST, OP_GET, OP_EXPORT, OP_IMPORT, OP_DELETE } cache_op;

typedef struct cache_req {
  kexd *d;
  kexd_call *call;
  kexd_stream st;            /* the call's lifetime: held while a read or the pool job is out */
  cache_op op;
  ProtobufCMessage *msg;     /* the decoded request (filters point into it) */
  kex_cache_filter filter;
  bool has_filter;
  char tenant[KEX_CACHE_TENANT_MAX]; /* a user's (--auth, not admin): it sees only the entries its tenant made */
  kex_work work;
  int rc;
  kex_error err;
  /* list */
  uint64_t offset;
  uint32_t limit, count;
  kex_cache_entry *entries;  /* [limit + 1] */
  /* get */
  kex_cache_entry entry;
  char *source;
  /* export: the file, then chunks; import: the bytes received */
  char *buf;
  size_t buflen, bufcap, sent;
  uint64_t nentries;
  /* import */
  uint64_t job;
  kex_cache_import_report rep;
  /* delete */
  uint64_t deleted;
} cache_req;

/* The stream is over (kexd_stream_ops.release). */
static void creq_release(void *owner) {
  cache_req *q = owner;
  if (q->op == OP_IMPORT) q->d->imports_active--;
  kexd_rpc_free_msg(q->msg);
  kex_free(q->entries);
  kex_free(q->entry.ast_text);
  kex_free(q->source);
  if (q->op == OP_EXPORT) free(q->buf); /* open_memstream's */
  else kex_free(q->buf);
  kex_free(q);
}


static int list_cb(const kex_cache_entry *e, void *arg) {
  cache_req *q = arg;
  q->entries[q->count] = *e;
  q->entries[q->count].ast_text = NULL;
  q->count++;
  return 0;
}

static void creq_work(kex_work *w) {
  cache_req *q = w->data;
  kexd *d = q->d;
  kexd_cache_rpc *T = d->cache_rpc;
  kex_cache *c;
  int rc = 0;
  if (!(c = kex_cache_conns_get(d->conns, &q->err))) {
    rc = q->err.code ? q->err.code : KEX_EUNAVAILABLE;
    goto out;
  }
  switch (q->op) {
  case OP_LIST: {
    uint32_t got = 0;
    q->count = 0;
    rc = kex_cache_list(c, q->has_filter ? &q->filter : NULL, q->offset, q->limit + 1, list_cb, q, &got, &q->err);
    break;
  }
  case OP_GET: {
    Kex__V1__GetCacheEntryRequest *m = (Kex__V1__GetCacheEntryRequest *)q->msg;
    rc = kex_cache_get_entry_of(c, m->key, m->device, q->tenant, &q->entry, &q->err); /* a user: its own only */
    if (rc == 0) {
      char ot[KEX_CACHE_OPTS_TEXT_MAX];
      if (kex_cache_opts_format(q->entry.value.opts, q->entry.value.nopts, ot, sizeof ot) == 0)
        q->source = memo_get(T, q->entry.ast_hex, q->entry.device.kind, ot);
    }
    break;
  }
  case OP_EXPORT: {
    FILE *f = open_memstream(&q->buf, &q->buflen);
    if (!f) {
      rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot open a memory stream");
      break;
    }
    rc = kex_cache_export(c, f, q->has_filter ? &q->filter : NULL, &q->nentries, &q->err);
    if (fclose(f) != 0 && !rc) rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot finish the export in memory");
    break;
  }
  case OP_IMPORT: {
    FILE *f = q->buflen ? fmemopen(q->buf, q->buflen, "r") : fmemopen((void *)"", 1, "r");
    if (!f) {
      rc = kex_err_set(&q->err, KEX_ENOMEM, "cannot open a memory stream");
      break;
    }
    rc = kex_cache_import(c, f, &q->rep, &q->err);
    fclose(f);
    break;
  }
  case OP_DELETE: rc = kex_cache_delete(c, q->has_filter ? &q->filter : NULL, &q->deleted, &q->err); break;
  }
out:
  q->rc = rc;
}

/* Write the next chunk of the export (the last one carries the entry count), then OK. */
static void export_next(cache_req *q) {
  size_t max = CACHE_EXPORT_CHUNK;
  int mm = q->d->cfg.max_message;
  if (mm > 8192 && (size_t)mm - 4096 < max) max = (size_t)mm - 4096;
  if (q->sent >= q->buflen && q->sent > 0) return kexd_stream_finish(&q->st, GRPC_STATUS_OK, NULL, NULL);
  Kex__V1__ExportCacheChunk ch = KEX__V1__EXPORT_CACHE_CHUNK__INIT;
  size_t n = q->buflen - q->sent < max ? q->buflen - q->sent : max;
  ch.data.data = (uint8_t *)q->buf + q->sent;
  ch.data.len = n;
  if (q->sent + n >= q->buflen) ch.entries = q->nentries;
  q->sent += n ? n : 1; /* an empty export is one empty chunk */
  if (q->sent > q->buflen && q->buflen) q->sent = q->buflen;
  int rc = kexd_stream_write(&q->st, &ch.base);
  if (rc < 0) kexd_stream_failf(&q->st, GRPC_STATUS_INTERNAL, "ExportCache: cannot send a chunk: %s", kex_strerror(rc));
}

/* The page token for offset under filter f: opaque to clients, checked on the way back. */
static uint32_t filter_tag(const Kex__V1__CacheFilter *f) {
  uint32_t h = 2166136261u;
  const char *parts[3] = {f ? f->device : "", f ? f->kernel_name : "", f ? f->key_prefix : ""};
  for (int i = 0; i < 3; i++) {
    for (const char *p = parts[i] ? parts[i] : ""; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ 0xff) * 16777619u;
  }
  int64_t age = f ? f->max_age_s : 0;
  for (int i = 0; i < 8; i++) h = (h ^ (uint8_t)(age >> (8 * i))) * 16777619u;
  return h;
}

static void creq_after(kex_work *w, int status) {
  cache_req *q = w->data;
  if (status < 0 && !q->rc) q->rc = kex_err_set(&q->err, KEX_EINTERNAL, "the worker pool dropped the job");
  kexd_stream_unhold(&q->st);
}

/* The SQLite work is back (kexd_stream_ops.drained): the reply; for ExportCache, each next chunk. */
static void creq_reply(void *owner) {
  cache_req *q = owner;
  const char *method = strrchr(kexd_call_method(q->call), '/');
  method = method ? method + 1 : "cache";
  switch (q->op) {
  case OP_LIST: {
    if (q->rc < 0) break;
    Kex__V1__ListCacheReply r = KEX__V1__LIST_CACHE_REPLY__INIT;
    const Kex__V1__ListCacheRequest *m = (const Kex__V1__ListCacheRequest *)q->msg;
    uint32_t n = q->count > q->limit ? q->limit : q->count;
    kexd_pb_entry *pe = kex_calloc(n ? n : 1, sizeof *pe);
    Kex__V1__CacheEntry **pp = kex_calloc(n ? n : 1, sizeof *pp);
    char token[64] = "";
    if (!pe || !pp) {
      kex_free(pe), kex_free(pp);
      q->rc = kex_err_set(&q->err, KEX_ENOMEM, "out of memory");
      break;
    }
    for (uint32_t i = 0; i < n; i++) {
      kexd_cache_entry_to_pb(&q->entries[i], &pe[i]);
      pp[i] = &pe[i].m;
    }
    if (q->count > q->limit)
      snprintf(token, sizeof token, PAGE_TOKEN_PREFIX "%" PRIu64 ".%08x", q->offset + q->limit, filter_tag(m->filter));
    r.n_entries = n;
    r.entries = pp;
    r.next_page_token = token;
    kexd_stream_finish(&q->st, GRPC_STATUS_OK, NULL, &r.base); /* packs r at once */
    kex_free(pe), kex_free(pp);
    return;
  }
  case OP_GET: {
    if (q->rc == KEX_ENOTFOUND) {
      const Kex__V1__GetCacheEntryRequest *m = (const Kex__V1__GetCacheEntryRequest *)q->msg;
      kexd_stream_failf(&q->st, GRPC_STATUS_NOT_FOUND, "GetCacheEntry: no entry for key %.64s%s%.200s", m->key,
                      *m->device ? " on device " : "", m->device);
      return;
    }
    if (q->rc < 0) break;
    kexd_pb_entry *pe = kex_malloc(sizeof *pe);
    if (!pe) {
      q->rc = kex_err_set(&q->err, KEX_ENOMEM, "out of memory");
      break;
    }
    kexd_cache_entry_to_pb(&q->entry, pe);
    pe->m.ast_text = q->entry.ast_text ? q->entry.ast_text : "";
    pe->m.source = q->source ? q->source : "";
    kexd_stream_finish(&q->st, GRPC_STATUS_OK, NULL, &pe->m.base);
    kex_free(pe);
    return;
  }
  case OP_EXPORT:
    if (q->rc < 0) break;
    return export_next(q);
  case OP_IMPORT: {
    if (q->rc < 0 && q->rc != KEX_EPARSE && q->rc != KEX_ELIMIT) break;
    if (q->rc < 0 && q->rep.imported == 0) { /* the header is wrong, or nothing was valid */
      kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT, "ImportCache: %s", q->err.msg[0] ? q->err.msg : kex_strerror(q->rc));
      return;
    }
    Kex__V1__ImportCacheReply r = KEX__V1__IMPORT_CACHE_REPLY__INIT;
    char *errs[CACHE_IMPORT_ERRORS];
    uint32_t ne = q->rep.nerrors < CACHE_IMPORT_ERRORS ? q->rep.nerrors : CACHE_IMPORT_ERRORS;
    if (ne > KEX_CACHE_IMPORT_ERRORS) ne = KEX_CACHE_IMPORT_ERRORS;
    for (uint32_t i = 0; i < ne; i++) errs[i] = q->rep.errors[i];
    r.imported = (uint32_t)q->rep.imported;
    r.rejected = (uint32_t)q->rep.rejected;
    r.n_errors = ne;
    r.errors = errs;
    kex_log(KEX_LOG_INFO, NULL, 0, "ImportCache: %" PRIu64 " imported, %" PRIu64 " rejected", q->rep.imported,
            q->rep.rejected);
    return kexd_stream_finish(&q->st, GRPC_STATUS_OK, NULL, &r.base);
  }
  case OP_DELETE: {
    if (q->rc < 0) break;
    Kex__V1__DeleteCacheReply r = KEX__V1__DELETE_CACHE_REPLY__INIT;
    r.deleted = q->deleted > UINT32_MAX ? UINT32_MAX : (uint32_t)q->deleted;
    return kexd_stream_finish(&q->st, GRPC_STATUS_OK, NULL, &r.base);
  }
  }
  kexd_stream_failf(&q->st, kex_err_grpc_status(q->rc), "%s: %s", method, q->err.msg[0] ? q->err.msg : kex_strerror(q->rc));
}

/* Queue q's SQLite work (held until creq_after); on failure the call is ended. */
static void creq_start(cache_req *q) {
  q->work = (kex_work){.fn = creq_work, .after = creq_after, .data = q};
  kexd_stream_hold(&q->st);
  if (kexd_work_submit(q->d, &q->work) < 0) {
    kexd_stream_failf(&q->st, GRPC_STATUS_UNAVAILABLE, "the worker pool is not available");
    kexd_stream_unhold(&q->st);
  }
}

static const kexd_stream_ops creq_ops = {"cache", NULL, creq_reply, NULL, creq_release};
static const kexd_stream_ops export_ops = {"ExportCache", NULL, creq_reply, NULL, creq_release};
static const kexd_stream_ops import_ops = {"ImportCache", NULL, creq_reply, NULL, creq_release};

/* A request for call c (its stream started: it owns m); NULL with the call ended. */
static cache_req *creq_new(kexd *d, kexd_call *c, cache_op op, ProtobufCMessage *m) {
  cache_req *q = kex_calloc(1, sizeof *q);
  if (!q) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    kexd_rpc_free_msg(m);
    return NULL;
  }
  q->d = d;
  q->call = c;
  q->op = op;
  q->msg = m;
  const kexd_tenant *t = kexd_rpc_tenant(c);
  if (t && t->role != KEXD_ROLE_ADMIN) snprintf(q->tenant, sizeof q->tenant, "%s", t->name);
  kexd_stream_start(&q->st, d->streams, c, op == OP_IMPORT ? &import_ops : op == OP_EXPORT ? &export_ops : &creq_ops, q);
  return q;
}

/* A unary method's state; it takes the request from the method table (freed with the state). */
static cache_req *creq_take(kexd *d, kexd_call *c, kexd_req *rq, cache_op op) {
  ProtobufCMessage *m = rq->msg;
  rq->msg = NULL;
  return creq_new(d, c, op, m);
}

/* The filter's fields (pointing into the request); INVALID_ARGUMENT for a bad one.  0 or -1 (call ended). */
static int take_filter(cache_req *q, const Kex__V1__CacheFilter *f) {
  if (!f) return 0;
  if (f->max_age_s < 0) {
    kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT, "filter.max_age_s is %" PRId64 ", negative", f->max_age_s);
    return -1;
  }
  for (const char *p = f->key_prefix; p && *p; p++)
    if (!strchr("0123456789abcdefABCDEF", *p) || p - f->key_prefix >= 64) {
      kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT, "filter.key_prefix \"%.80s\" is not at most 64 hex digits",
                      f->key_prefix);
      return -1;
    }
  q->has_filter = true;
  q->filter.device = f->device;
  q->filter.kernel_name = f->kernel_name;
  q->filter.key_prefix = f->key_prefix;
  q->filter.max_age_s = f->max_age_s;
  return 0;
}

void kexd_rpc_list_cache(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__ListCacheRequest *m = rq->msg;
  cache_req *q;
  if (m->limit > CACHE_LIST_MAX) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "ListCache: limit %u is more than %d (0 means %d)", m->limit,
                    CACHE_LIST_MAX, CACHE_LIST_DEFAULT);
    return;
  }
  if (!(q = creq_take(d, c, rq, OP_LIST))) return;
  if (take_filter(q, m->filter) < 0) return;
  if (q->tenant[0]) { /* a user lists its own tenant's entries (a Submit still uses any) */
    q->has_filter = true;
    q->filter.tenant = q->tenant;
  }
  q->limit = m->limit ? m->limit : CACHE_LIST_DEFAULT;
  if (*m->page_token) {
    const char *p = m->page_token;
    char *end = NULL;
    unsigned long long off = 0;
    unsigned long tag = 0;
    bool ok = strncmp(p, PAGE_TOKEN_PREFIX, strlen(PAGE_TOKEN_PREFIX)) == 0;
    if (ok) {
      p += strlen(PAGE_TOKEN_PREFIX);
      off = strtoull(p, &end, 10);
      ok = end != p && *end == '.';
    }
    if (ok) {
      p = end + 1;
      tag = strtoul(p, &end, 16);
      ok = end != p && !*end && tag == filter_tag(m->filter) && off <= INT64_MAX;
    }
    if (!ok) {
      return kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT,
                               "ListCache: page_token is not one ListCache returned for this filter");
    }
    q->offset = off;
  }
  if (!(q->entries = kex_calloc(q->limit + 1, sizeof *q->entries)))
    return kexd_stream_failf(&q->st, GRPC_STATUS_RESOURCE_EXHAUSTED, "ListCache: out of memory");
  creq_start(q);
}

void kexd_rpc_get_cache_entry(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__GetCacheEntryRequest *m = rq->msg;
  cache_req *q;
  uint8_t key[KEX_AST_KEY_BYTES];
  if (strlen(m->key) != 2 * KEX_AST_KEY_BYTES || kex_unhex(m->key, key, sizeof key) < 0) {
    kexd_call_failf(c, GRPC_STATUS_INVALID_ARGUMENT, "GetCacheEntry: key \"%.80s\" is not 64 hex digits", m->key);
    return;
  }
  if ((q = creq_take(d, c, rq, OP_GET))) creq_start(q);
}

/* Export and Delete: the filter, then the work (the call ends on the first that fails). */
static void creq_start_filtered(kexd *d, kexd_call *c, kexd_req *rq, cache_op op, const Kex__V1__CacheFilter *f) {
  cache_req *q;
  if (!(q = creq_take(d, c, rq, op))) return;
  if (take_filter(q, f) < 0) return;
  creq_start(q);
}

void kexd_rpc_export_cache(kexd *d, kexd_call *c, kexd_req *rq) {
  creq_start_filtered(d, c, rq, OP_EXPORT, ((Kex__V1__ExportCacheRequest *)rq->msg)->filter);
}

void kexd_rpc_delete_cache(kexd *d, kexd_call *c, kexd_req *rq) {
  creq_start_filtered(d, c, rq, OP_DELETE, ((Kex__V1__DeleteCacheRequest *)rq->msg)->filter);
}

/* The call was finished by kexd_rpc_decode or kexd_rpc_need_job: the stream is over too. */
static void import_ended(cache_req *q) { kexd_stream_ended(&q->st); }

static void import_next(cache_req *q);

/* One read is back (it was held): keep the bytes and read on, or import what came at the end. */
static void import_read(cache_req *q, const uint8_t *msg, size_t len, int ok) {
  kexd *d = q->d;
  kexd_call *c = q->call;
  Kex__V1__ImportCacheRequest *m = NULL;
  if (kexd_stream_dead(&q->st)) return;
  if (!ok) return kexd_stream_failf(&q->st, GRPC_STATUS_CANCELLED, "ImportCache: the stream broke");
  if (!msg) { /* the end: import what came */
    if (!q->job)
      return kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT,
                               "ImportCache: the stream ended without a message naming the job");
    if (!kexd_jobs_find_id(&d->jobs, q->job))
      return kexd_stream_failf(&q->st, GRPC_STATUS_NOT_FOUND, "ImportCache: the job was closed during the import");
    return creq_start(q);
  }
  if (!(m = (Kex__V1__ImportCacheRequest *)kexd_rpc_decode(d, c, &kex__v1__import_cache_request__descriptor, msg, len)))
    return import_ended(q);
  if (!q->job) {
    kexd_job *job = kexd_rpc_need_job(d, c, m->job);
    if (!job) {
      kexd_rpc_free_msg(&m->base);
      return import_ended(q);
    }
    q->job = job->id;
  } else if (*m->job) {
    kexd_job *job = kexd_jobs_find(&d->jobs, m->job);
    if (!job || job->id != q->job) {
      kexd_rpc_free_msg(&m->base);
      return kexd_stream_failf(&q->st, GRPC_STATUS_INVALID_ARGUMENT, "ImportCache: the stream names two different jobs");
    }
  }
  if (m->data.len > d->cfg.import_max_bytes || q->buflen > d->cfg.import_max_bytes - m->data.len) {
    size_t total = q->buflen + m->data.len;
    kexd_rpc_free_msg(&m->base);
    return kexd_stream_failf(&q->st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "ImportCache: the stream is over the limit of %" PRIu64
                             " bytes (--import-max-bytes); %zu so far",
                             d->cfg.import_max_bytes, total);
  }
  if (q->buflen + m->data.len > q->bufcap) {
    size_t cap = q->bufcap ? q->bufcap * 2 : 65536;
    while (cap < q->buflen + m->data.len) cap *= 2;
    char *nb = kex_realloc(q->buf, cap);
    if (!nb) {
      kexd_rpc_free_msg(&m->base);
      return kexd_stream_failf(&q->st, GRPC_STATUS_RESOURCE_EXHAUSTED, "ImportCache: out of memory for %zu bytes", cap);
    }
    q->buf = nb;
    q->bufcap = cap;
  }
  if (m->data.len) memcpy(q->buf + q->buflen, m->data.data, m->data.len);
  q->buflen += m->data.len;
  kexd_rpc_free_msg(&m->base);
  import_next(q);
}

static void import_on_message(kexd_call *c, const uint8_t *msg, size_t len, int ok, void *ud) {
  cache_req *q = ud;
  (void)c;
  import_read(q, msg, len, ok);
  kexd_stream_unhold(&q->st); /* this read's */
}

/* Read the next message, held until it is back; on failure the call is ended. */
static void import_next(cache_req *q) {
  int rc;
  kexd_stream_hold(&q->st);
  if ((rc = kexd_call_read(q->call, import_on_message, q)) < 0) {
    kexd_stream_failf(&q->st, GRPC_STATUS_INTERNAL, "ImportCache: cannot read the stream: %s", kex_strerror(rc));
    kexd_stream_unhold(&q->st);
  }
}

void kexd_rpc_import_cache(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  cache_req *q;
  (void)req;
  (void)len;
  if (d->imports_active >= d->cfg.import_streams) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "ImportCache: %u import streams are open, the limit (--import-streams); try again later",
                    d->imports_active);
    return;
  }
  if (!(q = creq_new(d, c, OP_IMPORT, NULL))) return;
  d->imports_active++; /* creq_release gives it back */
  import_next(q);
}

/* ---- setup ---- */

int kexd_cache_rpc_init(kexd *d) {
  kexd_cache_rpc *T = kex_calloc(1, sizeof *T);
  if (!T) return KEX_ENOMEM;
  pthread_mutex_init(&T->memo_lock, NULL);
  d->cache_rpc = T;
  return 0;
}

void kexd_cache_rpc_free(kexd *d) {
  kexd_cache_rpc *T = d->cache_rpc;
  if (!T) return;
  for (uint32_t i = 0; i < KEXD_TUNE_SOURCES; i++) kex_free(T->memo[i].opts), kex_free(T->memo[i].source);
  pthread_mutex_destroy(&T->memo_lock);
  kex_free(T);
  d->cache_rpc = NULL;
}

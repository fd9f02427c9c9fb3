/*
 * libkex.c - the C client of kexd on the gRPC C core.
 *
 * Every public call is one gRPC call with its own completion queue, driven
 * synchronously: start a batch, wait for its tag, start the next.  The call
 * always ends with a batch of its own that receives the status, so a server
 * error that cuts a stream short still arrives with its message.  Requests
 * are packed with protobuf-c; replies are unpacked through kex_malloc.
 *
 * Graphs arrive as kex.graph.v1 JSON text; graph_from_json builds the
 * protobuf Graph in an arena that dies with the call.  The conversion is
 * lenient on purpose: it only refuses what cannot be expressed in protobuf
 * (a wrong JSON type), and the daemon checks everything else and answers
 * with a message naming the node.
 */
#include "client/libkex.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/status.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/alloc.h"
#include "core/codec.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "core/npy.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kex/v1/kex.pb-c.h"
#include "proto/pballoc.h"

#define CLIENT_DEFAULT_TIMEOUT_S 60.0
#define CLIENT_DEFAULT_MAX_MESSAGE (64 << 20)
#define CLIENT_CERTS_MAX (4 << 20) /* bytes of a root certificate file */
#define CLIENT_NODES_MAX 64        /* nodes of a fleet one client sends job calls to */
#define CLIENT_SERVERS_MAX 64      /* addresses in a "a:1,b:2" list */
#define CLIENT_ROUND_ROBIN "{\"loadBalancingConfig\":[{\"round_robin\":{}}]}"

/* The methods, in the order of the handle table. */
enum {
  M_OPEN_JOB,
  M_CLOSE_JOB,
  M_UPLOAD,
  M_DOWNLOAD,
  M_FREE,
  M_SUBMIT,
  M_PLAN,
  M_LIST_DEVICES,
  M_GET_STATS,
  M_TUNE,
  M_LIST_CACHE,
  M_GET_CACHE_ENTRY,
  M_EXPORT_CACHE,
  M_IMPORT_CACHE,
  M_DELETE_CACHE,
  M_HEALTH,
  M_COUNT
};

static const char *const method_paths[M_COUNT] = {
    "/kex.v1.Kex/OpenJob", "/kex.v1.Kex/CloseJob", "/kex.v1.Kex/Upload",      "/kex.v1.Kex/Download",
    "/kex.v1.Kex/Free",    "/kex.v1.Kex/Submit",   "/kex.v1.Kex/Plan",        "/kex.v1.Kex/ListDevices",
    "/kex.v1.Kex/GetStats", "/kex.v1.Kex/Tune",     "/kex.v1.Kex/ListCache",   "/kex.v1.Kex/GetCacheEntry",
    "/kex.v1.Kex/ExportCache", "/kex.v1.Kex/ImportCache", "/kex.v1.Kex/DeleteCache", "/grpc.health.v1.Health/Check",
};

/* A channel to one node of a fleet (the advertised address in its jobs' tokens), made at a job's first call. */
typedef struct node_channel {
  char addr[KEX_TOKEN_MAX];
  grpc_channel *channel;
  void *methods[M_COUNT];
} node_channel;

struct kex_client {
  grpc_channel *channel; /* every call of a single server; a fleet's job-less calls (round_robin) */
  void *methods[M_COUNT];
  grpc_metadata auth;  /* "authorization: Bearer ..." when has_auth */
  bool has_auth;
  double timeout_s;
  /* a fleet (several servers): each job's calls go to the node its token names */
  bool fleet;
  grpc_channel_credentials *creds; /* for the node channels */
  int max_message;
  char *servers;                   /* a list target's "a:1,b:2": the addresses node channels may dial */
  pthread_mutex_t lock;            /* nodes */
  node_channel nodes[CLIENT_NODES_MAX];
  size_t nnodes;
};

/* ---- status ---- */

static int status_set(kex_status *st, int code, int grpc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int status_set(kex_status *st, int code, int grpc, const char *fmt, ...) {
  if (st) {
    va_list ap;
    st->code = code;
    st->grpc = grpc;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

static void status_ok(kex_status *st) {
  if (st) {
    st->code = 0;
    st->grpc = 0;
    st->msg[0] = 0;
  }
}

int kex_code_from_grpc(int s) {
  switch (s) {
  case GRPC_STATUS_OK: return 0;
  case GRPC_STATUS_CANCELLED: return KEX_ECANCELLED;
  case GRPC_STATUS_INVALID_ARGUMENT: return KEX_EINVAL;
  case GRPC_STATUS_OUT_OF_RANGE: return KEX_EINVAL;
  case GRPC_STATUS_DEADLINE_EXCEEDED: return KEX_EDEADLINE;
  case GRPC_STATUS_NOT_FOUND: return KEX_ENOTFOUND;
  case GRPC_STATUS_RESOURCE_EXHAUSTED: return KEX_ELIMIT;
  case GRPC_STATUS_UNIMPLEMENTED: return KEX_EUNIMPLEMENTED;
  case GRPC_STATUS_UNAVAILABLE: return KEX_EUNAVAILABLE;
  case GRPC_STATUS_DATA_LOSS: return KEX_ECORRUPT;
  default: return KEX_EINTERNAL; /* UNKNOWN, INTERNAL, PERMISSION_DENIED, UNAUTHENTICATED, ... */
  }
}

const char *kex_grpc_status_name(int s) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  return s >= 0 && s < (int)(sizeof names / sizeof names[0]) ? names[s] : "UNKNOWN";
}

/* ---- connect ---- */

/* Read a whole (small) file into a NUL-terminated kex_malloc'd string; NULL on error. */
static char *read_small_file(const char *path, size_t max) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t n;
  if (!f) return NULL;
  if (!(buf = kex_malloc(max + 1))) goto out;
  n = fread(buf, 1, max, f);
  if (ferror(f) || n == max) {
    kex_free(buf);
    buf = NULL;
    goto out;
  }
  buf[n] = 0;
out:
  fclose(f);
  return buf;
}

/* ---- fleets ---- */

/*
 * Split "host:port" or "[v6]:port" (len bytes at p) into host (cap bytes);
 * the address family of an IP literal host (AF_INET, AF_INET6), or -1.
 */
static int list_host(const char *p, size_t len, char *host, size_t cap) {
  const char *colon = NULL, *end = p + len;
  unsigned char bin[16];
  size_t hn;
  if (len && p[0] == '[') {
    const char *rb = memchr(p, ']', len);
    if (!rb || rb + 1 >= end || rb[1] != ':') return -1;
    colon = rb + 1;
    p++;
    hn = (size_t)(rb - p);
  } else {
    for (const char *q = p; q < end; q++)
      if (*q == ':') colon = q;
    if (!colon) return -1;
    hn = (size_t)(colon - p);
  }
  if (hn == 0 || hn >= cap || colon + 1 >= end || (size_t)(end - colon - 1) > 5) return -1;
  for (const char *q = colon + 1; q < end; q++)
    if (*q < '0' || *q > '9') return -1;
  if (atoi(colon + 1) > 65535) return -1;
  memcpy(host, p, hn);
  host[hn] = 0;
  if (inet_pton(AF_INET, host, bin) == 1) return AF_INET;
  if (inet_pton(AF_INET6, host, bin) == 1) return AF_INET6;
  return -1;
}

/*
 * The gRPC target of addr.  A list "a:1,b:2" of IP literals (all IPv4 or
 * all IPv6) is a fleet: it becomes "ipv4:a:1,b:2" (or "ipv6:"), rotated to
 * start at a random address so that separate processes do not all open
 * their first job on the first node, and c->servers keeps the list (the
 * only addresses job calls may go to); a list already in "ipv4:"/"ipv6:"
 * form is taken the same way.  "dns:..." is a fleet as it is.  *first
 * (fcap bytes) receives the list's first host (the name TLS checks).  0,
 * KEX_EINVAL (an item that is not IP:PORT, mixed families, over
 * CLIENT_SERVERS_MAX items) or KEX_ENOMEM, with *st set.
 */
static int fleet_target(kex_client *c, const char *addr, char *target, size_t tcap, char *first, size_t fcap,
                        kex_status *st) {
  const char *items[CLIENT_SERVERS_MAX];
  size_t lens[CLIENT_SERVERS_MAX], n = 0, len = 0;
  const char *list = addr;
  unsigned rot = 0;
  int family = 0;
  first[0] = 0;
  if (!strncmp(addr, "dns:", 4)) {
    c->fleet = true;
    snprintf(target, tcap, "%s", addr);
    return 0;
  }
  if ((!strncmp(addr, "ipv4:", 5) || !strncmp(addr, "ipv6:", 5)) && strchr(addr, ',')) list = addr + 5;
  if (!strchr(list, ',')) {
    snprintf(target, tcap, "%s", addr);
    return 0;
  }
  for (const char *p = list; ; p++) {
    const char *comma = strchr(p, ',');
    size_t l = comma ? (size_t)(comma - p) : strlen(p);
    char host[64];
    int fam = list_host(p, l, host, sizeof host);
    if (fam < 0 || (family && fam != family) || n == CLIENT_SERVERS_MAX)
      return status_set(st, KEX_EINVAL, 0,
                        "connect: \"%.*s\" in the server list \"%.200s\": a list takes at most %d IP:PORT "
                        "addresses, all IPv4 or all IPv6 ([v6]:PORT); for names use dns:///NAME:PORT",
                        (int)(l < 100 ? l : 100), p, addr, CLIENT_SERVERS_MAX);
    if (!n) snprintf(first, fcap, "%s", host);
    family = fam;
    items[n] = p;
    lens[n++] = l;
    if (!comma) break;
    p = comma;
  }
  if (!(c->servers = kex_strdup(list))) return status_set(st, KEX_ENOMEM, 0, "connect: out of memory");
  if (getrandom(&rot, sizeof rot, GRND_NONBLOCK) != (ssize_t)sizeof rot) rot = 0;
  len = (size_t)snprintf(target, tcap, "%s", family == AF_INET ? "ipv4:" : "ipv6:");
  for (size_t i = 0; i < n && len < tcap; i++) {
    size_t k = (i + rot) % n;
    len += (size_t)snprintf(target + len, tcap - len, "%s%.*s", i ? "," : "", (int)lens[k], items[k]);
  }
  if (len >= tcap) return status_set(st, KEX_EINVAL, 0, "connect: the server list is too long");
  c->fleet = true;
  return 0;
}

/*
 * Fill args (room for 4) and chargs with the max-message arguments of every
 * channel, and (a fleet's round-robin channel) the service config and the
 * name TLS checks when they are not NULL.  Returns chargs.
 */
static grpc_channel_args *channel_args(grpc_arg *args, grpc_channel_args *chargs, int max_message,
                                       const char *service_config, const char *tls_name) {
  size_t n = 0;
  memset(args, 0, 4 * sizeof *args);
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[n++].value.integer = max_message;
  args[n].type = GRPC_ARG_INTEGER;
  args[n].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[n++].value.integer = max_message;
  if (service_config) {
    args[n].type = GRPC_ARG_STRING;
    args[n].key = GRPC_ARG_SERVICE_CONFIG;
    args[n++].value.string = (char *)service_config;
  }
  if (tls_name && *tls_name) {
    args[n].type = GRPC_ARG_STRING;
    args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[n++].value.string = (char *)tls_name;
  }
  chargs->num_args = n;
  chargs->args = args;
  return chargs;
}

/* True when addr is one of the comma-separated list's items (exactly). */
static bool in_list(const char *list, const char *addr) {
  size_t n = strlen(addr);
  for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (!strncmp(p, addr, n) && (p[n] == ',' || p[n] == 0)) return true;
  return false;
}

/*
 * Where a job's calls go.  In a fleet a token "HEX.NAME@ADDR" names the
 * node that holds the job: its calls go to a channel to ADDR (made at the
 * first, kept until kex_client_close) and node receives "NAME at ADDR"
 * for messages; otherwise (one server, or a token that names no node) the
 * client's channel, node "".  0, or KEX_EINVAL (ADDR is not in the
 * client's server list), KEX_ELIMIT (CLIENT_NODES_MAX nodes already),
 * KEX_ENOMEM.
 */
static int job_channel(kex_client *c, const char *job, grpc_channel **ch, void ***methods, char *node, size_t ncap,
                       kex_status *st) {
  const char *at, *addr;
  node_channel *nd = NULL;
  int rc = 0;
  *ch = c->channel;
  *methods = c->methods;
  node[0] = 0;
  if (!c->fleet || !job || strlen(job) <= 33 || job[32] != '.' || !(at = strchr(job + 33, '@')) || !at[1] ||
      strlen(at + 1) >= KEX_TOKEN_MAX)
    return 0;
  addr = at + 1;
  snprintf(node, ncap, "%.*s at %s", (int)(at - job - 33), job + 33, addr);
  if (c->servers && !in_list(c->servers, addr))
    return status_set(st, KEX_EINVAL, 0,
                      "the job's token names node %s, which is not one of this client's servers (%.200s): its calls "
                      "go nowhere else", node, c->servers);
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->nnodes && !nd; i++)
    if (!strcmp(c->nodes[i].addr, addr)) nd = &c->nodes[i];
  if (!nd && c->nnodes == CLIENT_NODES_MAX) {
    rc = status_set(st, KEX_ELIMIT, 0, "node %s: this client already talks to %d nodes, its limit", node,
                    CLIENT_NODES_MAX);
  } else if (!nd) {
    grpc_arg args[4];
    grpc_channel_args chargs;
    nd = &c->nodes[c->nnodes];
    snprintf(nd->addr, sizeof nd->addr, "%s", addr);
    if (!(nd->channel = grpc_channel_create(addr, c->creds, channel_args(args, &chargs, c->max_message, NULL, NULL)))) {
      rc = status_set(st, KEX_ENOMEM, 0, "node %s: cannot create a channel", node);
      nd = NULL;
    } else {
      for (int i = 0; i < M_COUNT; i++)
        nd->methods[i] = grpc_channel_register_call(nd->channel, method_paths[i], NULL, NULL);
      c->nnodes++;
    }
  }
  pthread_mutex_unlock(&c->lock);
  if (nd) {
    *ch = nd->channel;
    *methods = nd->methods;
  }
  return rc;
}

int kex_client_connect(const char *addr, const kex_client_opts *opts, kex_client **out, kex_status *st) {
  kex_client_opts o = {0};
  grpc_channel_credentials *creds = NULL;
  char *pem = NULL, *cert = NULL, *key = NULL;
  grpc_ssl_pem_key_cert_pair pair;
  kex_client *c = NULL;
  char target[CLIENT_SERVERS_MAX * 64], first[64];
  int rc = 0;
  *out = NULL;
  if (opts) o = *opts;
  if (!addr || !*addr) return status_set(st, KEX_EINVAL, 0, "connect: empty server address");
  if (!(c = kex_calloc(1, sizeof *c))) return status_set(st, KEX_ENOMEM, 0, "connect: out of memory");
  pthread_mutex_init(&c->lock, NULL);
  grpc_init();
  if ((rc = fleet_target(c, addr, target, sizeof target, first, sizeof first, st))) goto out;
  c->timeout_s = o.timeout_s > 0 ? o.timeout_s : CLIENT_DEFAULT_TIMEOUT_S;
  if (o.token && *o.token) {
    size_t n = strlen(o.token);
    char *v = kex_malloc(n + 8);
    if (!v) {
      rc = status_set(st, KEX_ENOMEM, 0, "connect: out of memory");
      goto out;
    }
    memcpy(v, "Bearer ", 7);
    memcpy(v + 7, o.token, n + 1);
    c->auth.key = grpc_slice_from_static_string("authorization");
    c->auth.value = grpc_slice_from_copied_string(v);
    c->has_auth = true;
    kex_free(v);
  }
  if (!o.client_cert != !o.client_key) {
    rc = status_set(st, KEX_EINVAL, 0, "connect: a client certificate needs its key and a key its certificate "
                    "(client_cert %s, client_key %s)", o.client_cert ? "set" : "missing",
                    o.client_key ? "set" : "missing");
    goto out;
  }
  if (o.root_certs || o.tls || o.client_cert) {
    errno = 0;
    if (o.root_certs && !(pem = read_small_file(o.root_certs, CLIENT_CERTS_MAX))) {
      rc = status_set(st, KEX_EINVAL, 0, "connect: cannot read root certificates \"%s\": %s", o.root_certs,
                      strerror(errno ? errno : EINVAL));
      goto out;
    }
    errno = 0;
    if (o.client_cert && !(cert = read_small_file(o.client_cert, CLIENT_CERTS_MAX))) {
      rc = status_set(st, KEX_EINVAL, 0, "connect: cannot read the client certificate \"%s\": %s", o.client_cert,
                      strerror(errno ? errno : EINVAL));
      goto out;
    }
    errno = 0;
    if (o.client_key && !(key = read_small_file(o.client_key, CLIENT_CERTS_MAX))) {
      rc = status_set(st, KEX_EINVAL, 0, "connect: cannot read the client key \"%s\": %s", o.client_key,
                      strerror(errno ? errno : EINVAL));
      goto out;
    }
    pair.private_key = key;
    pair.cert_chain = cert;
    creds = grpc_ssl_credentials_create(pem, cert ? &pair : NULL, NULL, NULL);
  } else {
    creds = grpc_insecure_credentials_create();
  }
  if (!creds) {
    rc = status_set(st, KEX_EINVAL, 0, "connect: cannot create channel credentials");
    goto out;
  }
  {
    grpc_arg args[4];
    grpc_channel_args chargs;
    bool tls = o.root_certs || o.tls || o.client_cert;
    c->max_message = o.max_message > 0 ? o.max_message : CLIENT_DEFAULT_MAX_MESSAGE;
    /* a fleet's job-less calls spread over its nodes (round_robin); a list's TLS name is its first host */
    c->channel = grpc_channel_create(target, creds, channel_args(args, &chargs, c->max_message,
                                                                 c->fleet ? CLIENT_ROUND_ROBIN : NULL,
                                                                 c->fleet && tls ? first : NULL));
  }
  if (c->fleet) { /* the node channels use them too */
    c->creds = creds;
    creds = NULL;
  }
  if (!c->channel) {
    rc = status_set(st, KEX_EINVAL, 0, "connect: cannot create a channel to \"%s\"", addr);
    goto out;
  }
  for (int i = 0; i < M_COUNT; i++) c->methods[i] = grpc_channel_register_call(c->channel, method_paths[i], NULL, NULL);
  status_ok(st);
out:
  if (creds) grpc_channel_credentials_release(creds);
  kex_free(pem);
  kex_free(cert);
  kex_free(key);
  if (rc) kex_client_close(c);
  else *out = c;
  return rc;
}

void kex_client_close(kex_client *c) {
  if (!c) return;
  if (c->channel) grpc_channel_destroy(c->channel);
  for (size_t i = 0; i < c->nnodes; i++) grpc_channel_destroy(c->nodes[i].channel);
  if (c->creds) grpc_channel_credentials_release(c->creds);
  kex_free(c->servers);
  pthread_mutex_destroy(&c->lock);
  if (c->has_auth) {
    grpc_slice_unref(c->auth.key);
    grpc_slice_unref(c->auth.value);
  }
  kex_free(c);
  grpc_shutdown();
}

/* ---- one call ---- */

typedef struct rpc {
  kex_client *client;
  const char *name; /* method name for messages */
  grpc_call *call;
  grpc_completion_queue *cq;
  grpc_metadata_array initial_md, trailing_md;
  bool got_initial_md;
  char node[KEX_TOKEN_MAX + 8]; /* "NAME at ADDR": the node the job's call went to (fleet), else "" */
} rpc;

static int rpc_end(rpc *r, kex_status *st);

static gpr_timespec deadline_after(double seconds) {
  if (seconds <= 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                      gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

/* Start a call of method; job (NULL: none) picks the channel (job_channel). */
static int rpc_begin(kex_client *c, int method, const char *job, double timeout_s, rpc *r, kex_status *st) {
  grpc_channel *ch;
  void **methods;
  int rc;
  memset(r, 0, sizeof *r);
  r->client = c;
  r->name = method_paths[method] + strlen("/kex.v1.Kex/");
  if ((rc = job_channel(c, job, &ch, &methods, r->node, sizeof r->node, st))) return rc;
  grpc_metadata_array_init(&r->initial_md);
  grpc_metadata_array_init(&r->trailing_md);
  r->cq = grpc_completion_queue_create_for_next(NULL);
  r->call = grpc_channel_create_registered_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, methods[method],
                                                deadline_after(timeout_s), NULL);
  if (!r->call) {
    kex_status ignored;
    rpc_end(r, &ignored);
    return status_set(st, KEX_EINTERNAL, 0, "%s: cannot create the call", r->name);
  }
  return 0;
}

/* Run one batch and wait for it: 1 when it succeeded, 0 when it did not (the call is over). */
static int rpc_batch(rpc *r, grpc_op *ops, size_t n) {
  grpc_call_error e = grpc_call_start_batch(r->call, ops, n, r, NULL);
  if (e != GRPC_CALL_OK) return 0;
  grpc_event ev = grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/*
 * Receive the call's status and release the call.  Returns 0 for OK, else
 * the mapped kex code with *st holding the server's message.
 */
static int rpc_end(rpc *r, kex_status *st) {
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  int rc = 0;
  if (r->call) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &r->trailing_md;
    op.data.recv_status_on_client.status = &status;
    op.data.recv_status_on_client.status_details = &details;
    op.data.recv_status_on_client.error_string = &error_string;
    if (!rpc_batch(r, &op, 1)) {
      rc = status_set(st, KEX_EINTERNAL, GRPC_STATUS_UNKNOWN, "%s: the call ended without a status", r->name);
    } else if (status != GRPC_STATUS_OK) {
      size_t n = GRPC_SLICE_LENGTH(details);
      rc = kex_code_from_grpc(status);
      if (status == GRPC_STATUS_UNAVAILABLE && r->node[0]) {
        status_set(st, rc, status, "%s: node %s is unavailable; the job lives there, so its calls go nowhere else "
                   "(%.*s)", r->name, r->node, (int)(n < 200 ? n : 200), (const char *)GRPC_SLICE_START_PTR(details));
      } else if (n) {
        status_set(st, rc, status, "%.*s", (int)(n < KEX_ERROR_MSG_MAX - 1 ? n : KEX_ERROR_MSG_MAX - 1),
                   (const char *)GRPC_SLICE_START_PTR(details));
      } else {
        status_set(st, rc, status, "%s: %s", r->name, kex_grpc_status_name(status));
      }
    }
    grpc_slice_unref(details);
    if (error_string) gpr_free((void *)error_string);
    grpc_call_unref(r->call);
    r->call = NULL;
  }
  if (r->cq) {
    grpc_completion_queue_shutdown(r->cq);
    while (grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(r->cq);
    r->cq = NULL;
  }
  grpc_metadata_array_destroy(&r->initial_md);
  grpc_metadata_array_destroy(&r->trailing_md);
  return rc;
}

static void op_send_initial(rpc *r, grpc_op *op) {
  op->op = GRPC_OP_SEND_INITIAL_METADATA;
  if (r->client->has_auth) {
    op->data.send_initial_metadata.count = 1;
    op->data.send_initial_metadata.metadata = &r->client->auth;
  }
}

/* A packed message as a byte buffer (NULL when out of memory). */
static grpc_byte_buffer *pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  grpc_byte_buffer *bb;
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

/* Unpack bb (destroyed) as desc; NULL with *st set when it is not one. */
static ProtobufCMessage *unpack(rpc *r, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, kex_status *st) {
  grpc_byte_buffer_reader rd;
  ProtobufCMessage *m = NULL;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) {
    status_set(st, KEX_ECORRUPT, 0, "%s: unreadable reply", r->name);
  } else {
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    m = protobuf_c_message_unpack(desc, &kex_pb_allocator, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    if (!m) status_set(st, KEX_ECORRUPT, 0, "%s: the reply is not a valid %s (%zu bytes)", r->name, desc->name,
                       (size_t)GRPC_SLICE_LENGTH(s));
    grpc_slice_unref(s);
    grpc_byte_buffer_reader_destroy(&rd);
  }
  grpc_byte_buffer_destroy(bb);
  return m;
}

/* ops[0..3): send the one request (bb) of a unary or server-streaming call and close the sending side. */
static void request_ops(rpc *r, grpc_op *ops, grpc_byte_buffer *bb) {
  memset(ops, 0, 3 * sizeof *ops);
  op_send_initial(r, &ops[0]);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
}

/* Send the one request of a unary or server-streaming call and close the sending side. */
static int rpc_send_request(rpc *r, const ProtobufCMessage *req) {
  grpc_op ops[3];
  grpc_byte_buffer *bb = pack(req);
  int ok;
  request_ops(r, ops, bb);
  ok = rpc_batch(r, ops, 3);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

/*
 * rpc_end, then, when the client itself failed (local != NULL: a bad
 * stream, a read error, out of memory), its own error in *st instead of
 * the status the cancelled call ended with.  Never 0 when local is set.
 */
static int rpc_end_local(rpc *r, const kex_status *local, kex_status *st) {
  int rc = rpc_end(r, st);
  if (!local) return rc;
  if (st) *st = *local;
  return local->code;
}

/*
 * Receive the next message as desc into *out, after sending req first in
 * the same batch (one wait) when req is not NULL: 1 with a message, 0 at the
 * end of the stream (or when the call failed: rpc_end says why), -1 with *st
 * set when the bytes are not a desc.
 */
static int rpc_send_recv(rpc *r, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                         ProtobufCMessage **out, kex_status *st) {
  grpc_op ops[5];
  grpc_byte_buffer *out_bb = req ? pack(req) : NULL, *bb = NULL;
  size_t n = 0;
  int ok;
  *out = NULL;
  memset(ops, 0, sizeof ops);
  if (req) request_ops(r, ops, out_bb), n = 3;
  if (!r->got_initial_md) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
    r->got_initial_md = true;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &bb;
  ok = rpc_batch(r, ops, n);
  if (out_bb) grpc_byte_buffer_destroy(out_bb);
  if (!ok || !bb) {
    if (bb) grpc_byte_buffer_destroy(bb);
    return 0;
  }
  if (!(*out = unpack(r, bb, desc, st))) return -1;
  return 1;
}

/* Receive the next message as desc into *out (rpc_send_recv without a request). */
static int rpc_recv(rpc *r, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, kex_status *st) {
  return rpc_send_recv(r, NULL, desc, out, st);
}

/* A unary call: request out, one reply in (*reply owned by the caller, free_msg). */
static int unary(kex_client *c, int method, const char *job, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply, kex_status *st) {
  rpc r;
  int rc, got = 0;
  *reply = NULL;
  if ((rc = rpc_begin(c, method, job, c->timeout_s, &r, st))) return rc;
  got = rpc_send_recv(&r, req, reply_desc, reply, st);
  if (got < 0) {
    kex_status ignored;
    rpc_end(&r, &ignored);
    return st ? st->code : KEX_ECORRUPT;
  }
  rc = rpc_end(&r, st);
  if (!rc && !*reply) rc = status_set(st, KEX_ECORRUPT, 0, "%s: the server sent OK without a reply", r.name);
  if (rc && *reply) {
    protobuf_c_message_free_unpacked(*reply, &kex_pb_allocator);
    *reply = NULL;
  }
  if (!rc) status_ok(st);
  return rc;
}

static void free_msg(void *m) {
  if (m) protobuf_c_message_free_unpacked(m, &kex_pb_allocator);
}

/* ---- jobs ---- */

static void copy_token(char dst[KEX_TOKEN_MAX], const char *src) {
  snprintf(dst, KEX_TOKEN_MAX, "%s", src ? src : "");
}

int kex_job_open(kex_client *c, const char *name, uint32_t weight, uint64_t memory_limit, char job[KEX_TOKEN_MAX],
                 uint32_t *lease_s, kex_status *st) {
  Kex__V1__OpenJobRequest req = KEX__V1__OPEN_JOB_REQUEST__INIT;
  Kex__V1__OpenJobReply *rep = NULL;
  int rc;
  req.name = (char *)(name ? name : "");
  req.weight = weight;
  req.memory_limit = memory_limit;
  job[0] = 0;
  if ((rc = unary(c, M_OPEN_JOB, NULL, &req.base, &kex__v1__open_job_reply__descriptor, (ProtobufCMessage **)&rep, st)))
    return rc;
  copy_token(job, rep->job);
  if (lease_s) *lease_s = rep->lease_seconds;
  free_msg(rep);
  return 0;
}

int kex_job_close(kex_client *c, const char *job, kex_status *st) {
  Kex__V1__CloseJobRequest req = KEX__V1__CLOSE_JOB_REQUEST__INIT;
  ProtobufCMessage *rep = NULL;
  int rc;
  req.job = (char *)(job ? job : "");
  rc = unary(c, M_CLOSE_JOB, req.job, &req.base, &kex__v1__close_job_reply__descriptor, &rep, st);
  free_msg(rep);
  return rc;
}

/* ---- buffers ---- */

/* Reads the next up-to-cap bytes of an upload into buf; returns the count or -1 with *st set. */
typedef long (*upload_reader)(void *ud, void *buf, size_t cap, kex_status *st);

/* End a server stream: when the client failed (local says why), cancel the call first.  The call's status, or the
   client's reason. */
static int rpc_end_read(rpc *r, bool failed, const kex_status *local, kex_status *st) {
  if (failed) grpc_call_cancel(r->call, NULL); /* gRPC: safe to call more than once */
  return rpc_end_local(r, failed ? local : NULL, st);
}

/* Send one message of a client stream (the first one with the initial metadata): 1 sent, 0 the call is over. */
static int rpc_send_stream(rpc *r, const ProtobufCMessage *m, bool first) {
  grpc_op ops[2];
  grpc_byte_buffer *bb = pack(m);
  size_t n = 0;
  int ok;
  memset(ops, 0, sizeof ops);
  if (first) op_send_initial(r, &ops[n++]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = bb;
  ok = rpc_batch(r, ops, n);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

/*
 * End a client stream: when sent_all, close the send side and receive the
 * one reply into *reply; then the call's status (local, when the client
 * failed, wins).  0 with *reply set, or the error (st says it; an OK
 * status without a reply is KEX_ECORRUPT, named after method).
 */
static int rpc_end_stream(rpc *r, bool sent_all, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
                          const kex_status *local, const char *method, kex_status *st) {
  int got = 0, rc;
  if (sent_all) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (rpc_batch(r, &op, 1)) got = rpc_recv(r, desc, reply, st);
  }
  if (got < 0) {
    kex_status ignored;
    rpc_end(r, &ignored);
    return st ? st->code : KEX_ECORRUPT;
  }
  rc = rpc_end_local(r, local, st);
  if (!rc && !*reply) rc = status_set(st, KEX_ECORRUPT, 0, "%s: the server sent OK without a reply", method);
  return rc;
}

/* Upload: the header, then nbytes from read in chunks, then the reply. */
static int upload_stream(kex_client *c, const char *job, const char *dtype, int ndim, const int64_t *shape,
                         const char *device, size_t nbytes, upload_reader read, void *ud, char handle[KEX_TOKEN_MAX],
                         kex_status *st) {
  Kex__V1__UploadRequest req = KEX__V1__UPLOAD_REQUEST__INIT;
  Kex__V1__UploadHeader hdr = KEX__V1__UPLOAD_HEADER__INIT;
  Kex__V1__UploadReply *rep = NULL;
  unsigned char *chunk = NULL;
  kex_status local_err = {0};
  bool client_failed = false;
  rpc r;
  bool sent_all = false;
  int rc;
  handle[0] = 0;
  if (ndim < 0 || ndim > KEX_CLIENT_DIMS_MAX) return status_set(st, KEX_EINVAL, 0, "Upload: %d dims", ndim);
  if ((rc = rpc_begin(c, M_UPLOAD, job, 0, &r, st))) return rc;
  if (!(chunk = kex_malloc(KEX_UPLOAD_CHUNK))) {
    client_failed = true;
    status_set(&local_err, KEX_ENOMEM, 0, "Upload: out of memory");
    grpc_call_cancel(r.call, NULL);
    goto finish;
  }
  hdr.dtype = (char *)dtype;
  hdr.n_shape = (size_t)ndim;
  hdr.shape = (int64_t *)shape;
  hdr.device = (char *)(device ? device : "");
  req.job = (char *)(job ? job : "");
  req.part_case = KEX__V1__UPLOAD_REQUEST__PART_HEADER;
  req.header = &hdr;
  if (!rpc_send_stream(&r, &req.base, true)) goto finish; /* the server ended the call: rpc_end says why */
  req.header = NULL;
  req.part_case = KEX__V1__UPLOAD_REQUEST__PART_CHUNK;
  for (size_t sent = 0; sent < nbytes;) {
    size_t want = nbytes - sent < KEX_UPLOAD_CHUNK ? nbytes - sent : KEX_UPLOAD_CHUNK;
    long n = read(ud, chunk, want, &local_err);
    if (n <= 0) {
      if (n == 0) status_set(&local_err, KEX_EIO, 0, "Upload: the data ended after %zu of %zu bytes", sent, nbytes);
      client_failed = true;
      grpc_call_cancel(r.call, NULL);
      goto finish;
    }
    req.chunk.data = chunk;
    req.chunk.len = (size_t)n;
    if (!rpc_send_stream(&r, &req.base, false)) goto finish;
    sent += (size_t)n;
  }
  sent_all = true;
finish:
  rc = rpc_end_stream(&r, sent_all, &kex__v1__upload_reply__descriptor, (ProtobufCMessage **)&rep,
                      client_failed ? &local_err : NULL, "Upload", st);
  if (!rc) {
    copy_token(handle, rep->handle);
    status_ok(st);
  }
  free_msg(rep);
  kex_free(chunk);
  return rc;
}

typedef struct mem_reader {
  const unsigned char *p;
  size_t left;
} mem_reader;

static long read_mem(void *ud, void *buf, size_t cap, kex_status *st) {
  mem_reader *m = ud;
  size_t n = cap < m->left ? cap : m->left;
  (void)st;
  memcpy(buf, m->p, n);
  m->p += n;
  m->left -= n;
  return (long)n;
}

static int dtype_itemsize(const char *dtype) {
  int dt = dtype ? kex_dtype_from_name(dtype) : -1;
  return dt < 0 ? -1 : kex_dtype_size((kex_dtype)dt);
}

/* prod(shape) * itemsize, or -1 when a dim is negative or the product overflows. */
static long long shape_bytes(int ndim, const int64_t *shape, int itemsize) {
  long long n = itemsize;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && n > (1ll << 62) / shape[i])) return -1;
    n *= shape[i];
  }
  return n;
}

int kex_upload(kex_client *c, const char *job, const char *dtype, int ndim, const int64_t *shape, const void *data,
               size_t nbytes, const char *device, char handle[KEX_TOKEN_MAX], kex_status *st) {
  int isz = dtype_itemsize(dtype);
  mem_reader m = {data, nbytes};
  handle[0] = 0;
  if (isz < 0) return status_set(st, KEX_EINVAL, 0, "Upload: unknown dtype \"%s\"", dtype ? dtype : "");
  if (ndim < 0 || ndim > KEX_CLIENT_DIMS_MAX || shape_bytes(ndim, shape, isz) != (long long)nbytes)
    return status_set(st, KEX_EINVAL, 0, "Upload: %zu bytes do not fill a %s buffer of that shape", nbytes, dtype);
  return upload_stream(c, job, dtype, ndim, shape, device, nbytes, read_mem, &m, handle, st);
}

/* ---- .npy ---- */

static long read_file_chunk(void *ud, void *buf, size_t cap, kex_status *st) {
  FILE *f = ud;
  size_t n = fread(buf, 1, cap, f);
  if (n == 0 && ferror(f)) return status_set(st, KEX_EIO, 0, "Upload: read error: %s", strerror(errno)), -1;
  return (long)n;
}

int kex_upload_npy(kex_client *c, const char *job, const char *path, const char *device, char handle[KEX_TOKEN_MAX],
                   kex_status *st) {
  const char *dtype;
  int64_t shape[KEX_CLIENT_DIMS_MAX];
  int ndim = 0, rc;
  long long nbytes;
  kex_dtype dt;
  kex_error err;
  FILE *f = fopen(path, "rb");
  handle[0] = 0;
  if (!f) return status_set(st, KEX_EIO, 0, "%s: %s", path, strerror(errno));
  if ((rc = kex_npy_read_header(f, path, KEX_CLIENT_DIMS_MAX, &dt, &ndim, shape, &err))) {
    status_set(st, rc, 0, "%s", err.msg);
    goto out;
  }
  dtype = kex_dtypes[dt].name;
  nbytes = shape_bytes(ndim, shape, dtype_itemsize(dtype));
  if (nbytes < 0) {
    rc = status_set(st, KEX_EPARSE, 0, "%s: shape too large", path);
    goto out;
  }
  rc = upload_stream(c, job, dtype, ndim, shape, device, (size_t)nbytes, read_file_chunk, f, handle, st);
out:
  fclose(f);
  return rc;
}

int kex_array_write_npy(const kex_array *b, const char *path, kex_status *st) {
  int dt = kex_dtype_from_name(b->dtype), rc;
  kex_error err;
  if (dt < 0 || dt == KEX_DT_BFLOAT16) return status_set(st, KEX_EINVAL, 0, "%s: numpy has no dtype for %s", path, b->dtype);
  if (shape_bytes(b->ndim, b->shape, kex_dtype_size((kex_dtype)dt)) != (long long)b->nbytes)
    return status_set(st, KEX_EINVAL, 0, "%s: %zu bytes do not fill a %s array of that shape", path, b->nbytes, b->dtype);
  if ((rc = kex_npy_write(path, (kex_dtype)dt, b->ndim, b->shape, b->data, &err))) return status_set(st, rc, 0, "%s", err.msg);
  status_ok(st);
  return 0;
}

/* ---- download, free ---- */

void kex_array_free(kex_array *b) {
  if (!b) return;
  kex_free(b->data);
  b->data = NULL;
  b->nbytes = 0;
}

/* Set dtype and shape of b from protobuf fields. */
static int buffer_meta(kex_array *b, const char *dtype, size_t nshape, const int64_t *shape) {
  snprintf(b->dtype, sizeof b->dtype, "%s", dtype ? dtype : "");
  if (nshape > KEX_CLIENT_DIMS_MAX) return -1;
  b->ndim = (int)nshape;
  for (size_t i = 0; i < nshape; i++) b->shape[i] = shape[i];
  return 0;
}

int kex_download(kex_client *c, const char *job, const char *handle, kex_array *out, kex_status *st) {
  Kex__V1__DownloadRequest req = KEX__V1__DOWNLOAD_REQUEST__INIT;
  Kex__V1__DownloadChunk *ch = NULL;
  kex_status local_err = {0};
  bool first = true;
  size_t total = 0;
  rpc r;
  int rc, got = 0;
  memset(out, 0, sizeof *out);
  req.job = (char *)(job ? job : "");
  req.handle = (char *)(handle ? handle : "");
  if ((rc = rpc_begin(c, M_DOWNLOAD, job, 0, &r, st))) return rc;
  if (!rpc_send_request(&r, &req.base)) goto finish;
  while ((got = rpc_recv(&r, &kex__v1__download_chunk__descriptor, (ProtobufCMessage **)&ch, &local_err)) == 1) {
    if (first) {
      first = false;
      total = ch->total_bytes;
      if (buffer_meta(out, ch->dtype, ch->n_shape, ch->shape) < 0 ||
          !(out->data = kex_malloc(total ? total : 1))) {
        status_set(&local_err, total ? KEX_ENOMEM : KEX_ECORRUPT, 0, "Download: cannot hold %zu bytes", total);
        got = -1;
      }
    }
    if (got == 1 && (ch->offset > total || ch->data.len > total - ch->offset)) {
      status_set(&local_err, KEX_ECORRUPT, 0, "Download: chunk at %llu of %zu bytes past the %zu-byte buffer",
                 (unsigned long long)ch->offset, ch->data.len, total);
      got = -1;
    }
    if (got == 1) {
      if (ch->data.len) memcpy((unsigned char *)out->data + ch->offset, ch->data.data, ch->data.len);
      out->nbytes += ch->data.len;
    }
    free_msg(ch);
    ch = NULL;
    if (got < 0) break;
  }
finish:
  rc = rpc_end_read(&r, got < 0, &local_err, st);
  if (!rc && first) {
    rc = status_set(st, KEX_ECORRUPT, 0, "Download: the server sent OK without any chunk");
  } else if (!rc && out->nbytes != total) {
    rc = status_set(st, KEX_ECORRUPT, 0, "Download: got %zu of %zu bytes", out->nbytes, total);
  }
  if (rc) kex_array_free(out);
  else status_ok(st);
  return rc;
}

int kex_free_buffers(kex_client *c, const char *job, const char *const *handles, size_t n, uint32_t *freed,
                     kex_status *st) {
  Kex__V1__FreeRequest req = KEX__V1__FREE_REQUEST__INIT;
  Kex__V1__FreeReply *rep = NULL;
  int rc;
  req.job = (char *)(job ? job : "");
  req.n_handles = n;
  req.handles = (char **)handles;
  if ((rc = unary(c, M_FREE, req.job, &req.base,
                  &kex__v1__free_reply__descriptor, (ProtobufCMessage **)&rep, st))) return rc;
  if (freed) *freed = rep->freed;
  free_msg(rep);
  return 0;
}

/* ---- JSON graph -> protobuf Graph ---- */

typedef struct graph_build {
  kex_arena *arena;
  kex_status *st;
} graph_build;

#define GB_FAIL(...)                                                 \
  do {                                                               \
    status_set(gb->st, KEX_EPARSE, 0, __VA_ARGS__);                  \
    return -1;                                                       \
  } while (0)

/* Decode base64 text s (strict, as the graph format writes it) into arena memory: 0, -1 when it is not base64, -2
   when out of memory. */
static int b64_decode(kex_arena *a, const char *s, ProtobufCBinaryData *out) {
  size_t n = strlen(s);
  int64_t len = kex_base64_decoded_len(s, n);
  unsigned char *d;
  if (len < 0) return -1;
  if (!(d = kex_arena_alloc(a, (size_t)len + 1))) return -2;
  if (kex_base64_decode(s, n, d, NULL)) return -1;
  out->data = d;
  out->len = (size_t)len;
  return 0;
}

static int json_ints(graph_build *gb, uint32_t idx, const char *field, json_t *v, int64_t **out, size_t *n) {
  size_t i;
  json_t *x;
  if (!json_is_array(v)) GB_FAIL("node %u: \"%s\" must be a list of integers", idx, field);
  *n = json_array_size(v);
  if (!(*out = kex_arena_alloc(gb->arena, (*n ? *n : 1) * sizeof **out))) GB_FAIL("out of memory");
  json_array_foreach(v, i, x) {
    if (!json_is_integer(x)) GB_FAIL("node %u: \"%s\"[%zu] must be an integer", idx, field, i);
    (*out)[i] = json_integer_value(x);
  }
  return 0;
}

static int json_scalar(graph_build *gb, uint32_t idx, const char *field, json_t *v, Kex__V1__Scalar **out) {
  Kex__V1__Scalar *s = kex_arena_calloc(gb->arena, 1, sizeof *s);
  if (!s) GB_FAIL("out of memory");
  kex__v1__scalar__init(s);
  if (json_is_integer(v)) {
    s->kind_case = KEX__V1__SCALAR__KIND_INT_VALUE;
    s->int_value = json_integer_value(v);
  } else if (json_is_real(v)) {
    s->kind_case = KEX__V1__SCALAR__KIND_FLOAT_VALUE;
    s->float_value = json_real_value(v);
  } else if (json_is_boolean(v)) {
    s->kind_case = KEX__V1__SCALAR__KIND_BOOL_VALUE;
    s->bool_value = json_is_true(v);
  } else if (json_is_string(v)) {
    s->kind_case = KEX__V1__SCALAR__KIND_SPECIAL;
    s->special = kex_arena_strdup(gb->arena, json_string_value(v));
  } else {
    GB_FAIL("node %u: \"%s\" must be a number, true/false, or \"inf\"/\"-inf\"/\"nan\"", idx, field);
  }
  *out = s;
  return 0;
}

static Kex__V1__Ints *make_ints(graph_build *gb, int64_t *v, size_t n) {
  Kex__V1__Ints *x = kex_arena_calloc(gb->arena, 1, sizeof *x);
  if (!x) return NULL;
  kex__v1__ints__init(x);
  x->values = v;
  x->n_values = n;
  return x;
}

/* The "arg" of a movement op: pairs for PAD/SHRINK (or a list of lists), else one list of ints. */
static int json_arg(graph_build *gb, uint32_t idx, Kex__V1__Node *n, json_t *v) {
  bool pairs = strcmp(n->op, "PAD") == 0 || strcmp(n->op, "SHRINK") == 0 ||
               (json_is_array(v) && json_array_size(v) && json_is_array(json_array_get(v, 0)));
  if (pairs) {
    size_t i;
    json_t *p;
    Kex__V1__Pairs *ps = kex_arena_calloc(gb->arena, 1, sizeof *ps);
    if (!json_is_array(v)) GB_FAIL("node %u: \"arg\" must be a list of [a, b] pairs", idx);
    if (!ps) GB_FAIL("out of memory");
    kex__v1__pairs__init(ps);
    ps->n_pairs = json_array_size(v);
    if (!(ps->pairs = kex_arena_calloc(gb->arena, ps->n_pairs ? ps->n_pairs : 1, sizeof *ps->pairs))) GB_FAIL("out of memory");
    json_array_foreach(v, i, p) {
      Kex__V1__Pair *pr = kex_arena_calloc(gb->arena, 1, sizeof *pr);
      if (!pr) GB_FAIL("out of memory");
      kex__v1__pair__init(pr);
      if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 0)) ||
          !json_is_integer(json_array_get(p, 1)))
        GB_FAIL("node %u: \"arg\"[%zu] must be a pair of integers", idx, i);
      pr->first = json_integer_value(json_array_get(p, 0));
      pr->second = json_integer_value(json_array_get(p, 1));
      ps->pairs[i] = pr;
    }
    n->arg_case = KEX__V1__NODE__ARG_PAIRS;
    n->pairs = ps;
    return 0;
  }
  int64_t *vals;
  size_t nv;
  if (json_ints(gb, idx, "arg", v, &vals, &nv)) return -1;
  Kex__V1__Ints *ints = make_ints(gb, vals, nv);
  if (!ints) GB_FAIL("out of memory");
  if (strcmp(n->op, "PERMUTE") == 0) {
    n->arg_case = KEX__V1__NODE__ARG_ORDER;
    n->order = ints;
  } else if (strcmp(n->op, "STRIDE") == 0) {
    n->arg_case = KEX__V1__NODE__ARG_STRIDES;
    n->strides = ints;
  } else {
    n->arg_case = KEX__V1__NODE__ARG_NEW_SHAPE;
    n->new_shape = ints;
  }
  return 0;
}

static int json_node(graph_build *gb, uint32_t idx, json_t *jn, Kex__V1__Node **out) {
  Kex__V1__Node *n = kex_arena_calloc(gb->arena, 1, sizeof *n);
  json_t *v;
  if (!n) GB_FAIL("out of memory");
  kex__v1__node__init(n);
  if (!json_is_object(jn)) GB_FAIL("node %u: must be an object", idx);
  if (!(v = json_object_get(jn, "op")) || !json_is_string(v)) GB_FAIL("node %u: missing \"op\"", idx);
  n->op = kex_arena_strdup(gb->arena, json_string_value(v));
  if ((v = json_object_get(jn, "src"))) {
    int64_t *src;
    if (json_ints(gb, idx, "src", v, &src, &n->n_src)) return -1;
    if (!(n->src = kex_arena_alloc(gb->arena, (n->n_src ? n->n_src : 1) * sizeof *n->src))) GB_FAIL("out of memory");
    for (size_t i = 0; i < n->n_src; i++) {
      if (src[i] < 0 || src[i] > UINT32_MAX) GB_FAIL("node %u: source %lld is not a node index", idx, (long long)src[i]);
      n->src[i] = (uint32_t)src[i];
    }
  }
  if ((v = json_object_get(jn, "dtype"))) {
    if (!json_is_string(v)) GB_FAIL("node %u: \"dtype\" must be a string", idx);
    n->dtype = kex_arena_strdup(gb->arena, json_string_value(v));
  }
  if ((v = json_object_get(jn, "shape")) && json_ints(gb, idx, "shape", v, &n->shape, &n->n_shape)) return -1;
  if ((v = json_object_get(jn, "arg")) && json_arg(gb, idx, n, v)) return -1;
  if ((v = json_object_get(jn, "axis"))) {
    int64_t *ax;
    if (json_ints(gb, idx, "axis", v, &ax, &n->n_axis)) return -1;
    if (!(n->axis = kex_arena_alloc(gb->arena, (n->n_axis ? n->n_axis : 1) * sizeof *n->axis))) GB_FAIL("out of memory");
    for (size_t i = 0; i < n->n_axis; i++) n->axis[i] = (int32_t)ax[i];
  }
  if ((v = json_object_get(jn, "value")) && json_scalar(gb, idx, "value", v, &n->value)) return -1;
  if ((v = json_object_get(jn, "data"))) {
    int r;
    if (!json_is_string(v)) GB_FAIL("node %u: \"data\" must be a base64 string", idx);
    if ((r = b64_decode(gb->arena, json_string_value(v), &n->data)) == -2) GB_FAIL("out of memory");
    if (r < 0) GB_FAIL("node %u: \"data\" is not base64", idx);
    n->contents_case = KEX__V1__NODE__CONTENTS_DATA;
  } else if ((v = json_object_get(jn, "fill"))) {
    json_t *f;
    if (!json_is_object(v)) GB_FAIL("node %u: \"fill\" must be an object", idx);
    if ((f = json_object_get(v, "random"))) {
      if (!json_is_integer(f) || json_integer_value(f) < 0) GB_FAIL("node %u: fill \"random\" must be a seed >= 0", idx);
      n->contents_case = KEX__V1__NODE__CONTENTS_FILL_RANDOM;
      n->fill_random = (uint64_t)json_integer_value(f);
    } else if ((f = json_object_get(v, "arange"))) {
      n->contents_case = KEX__V1__NODE__CONTENTS_FILL_ARANGE;
      n->fill_arange = json_is_true(f);
    } else if ((f = json_object_get(v, "value"))) {
      if (json_scalar(gb, idx, "fill.value", f, &n->fill_value)) return -1;
      n->contents_case = KEX__V1__NODE__CONTENTS_FILL_VALUE;
    } else {
      GB_FAIL("node %u: \"fill\" needs one of \"random\", \"arange\", \"value\"", idx);
    }
  } else if ((v = json_object_get(jn, "buffer"))) {
    if (!json_is_string(v)) GB_FAIL("node %u: \"buffer\" must be a handle string", idx);
    n->contents_case = KEX__V1__NODE__CONTENTS_BUFFER;
    n->buffer = kex_arena_strdup(gb->arena, json_string_value(v));
  }
  if ((v = json_object_get(jn, "device"))) {
    if (!json_is_string(v)) GB_FAIL("node %u: \"device\" must be a string", idx);
    n->device = kex_arena_strdup(gb->arena, json_string_value(v));
  }
  *out = n;
  return 0;
}

/*
 * The block size of the arena a graph is built in: about what the graph
 * needs (its nodes and strings take less than twice its JSON text), 4 KiB
 * at least and 64 KiB at most.  A fixed 64 KiB block cost a tiny Submit a
 * 64 KiB malloc and free per call, and glibc consolidates its fast bins on
 * every free that large (malloc_consolidate in a profile of kex_submit).
 */
static size_t graph_arena_block(const char *graph_json) {
  size_t n = graph_json ? 2 * strnlen(graph_json, 64 * 1024) : 0;
  return n < 4096 ? 4096 : n > 64 * 1024 ? 64 * 1024 : n;
}

/* Parse graph_json into *g (arena memory).  0, or KEX_EPARSE/KEX_ENOMEM with *st set. */
static int graph_from_json(const char *graph_json, kex_arena *arena, Kex__V1__Graph *g, kex_status *st) {
  graph_build gbs = {arena, st}, *gb = &gbs;
  json_error_t jerr;
  json_t *root = NULL, *gj, *nodes, *outs, *v;
  int rc = KEX_EPARSE;
  kex__v1__graph__init(g);
  if (!graph_json) return status_set(st, KEX_EINVAL, 0, "graph: NULL JSON text");
  if (!(root = json_loads(graph_json, 0, &jerr))) {
    status_set(st, KEX_EPARSE, 0, "graph: JSON error at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    goto out;
  }
  gj = root;
  if (json_is_object(root) && !json_object_get(root, "nodes") && json_is_object(json_object_get(root, "graph")))
    gj = json_object_get(root, "graph");
  if (!json_is_object(gj)) {
    status_set(st, KEX_EPARSE, 0, "graph: the JSON is not an object");
    goto out;
  }
  if ((v = json_object_get(gj, "format")) && json_is_string(v)) g->format = kex_arena_strdup(arena, json_string_value(v));
  if ((v = json_object_get(gj, "device")) && json_is_string(v)) g->device = kex_arena_strdup(arena, json_string_value(v));
  nodes = json_object_get(gj, "nodes");
  outs = json_object_get(gj, "outputs");
  if (!json_is_array(nodes)) {
    status_set(st, KEX_EPARSE, 0, "graph: missing \"nodes\" list");
    goto out;
  }
  g->n_nodes = json_array_size(nodes);
  if (!(g->nodes = kex_arena_calloc(arena, g->n_nodes ? g->n_nodes : 1, sizeof *g->nodes))) {
    rc = status_set(st, KEX_ENOMEM, 0, "graph: out of memory");
    goto out;
  }
  for (size_t i = 0; i < g->n_nodes; i++)
    if (json_node(gb, (uint32_t)i, json_array_get(nodes, i), &g->nodes[i])) goto out;
  if (outs) {
    int64_t *o;
    size_t n;
    if (json_ints(gb, 0, "outputs", outs, &o, &n)) {
      status_set(st, KEX_EPARSE, 0, "graph: \"outputs\" must be a list of node indices");
      goto out;
    }
    if (!(g->outputs = kex_arena_alloc(arena, (n ? n : 1) * sizeof *g->outputs))) {
      rc = status_set(st, KEX_ENOMEM, 0, "graph: out of memory");
      goto out;
    }
    for (size_t i = 0; i < n; i++) g->outputs[i] = o[i] < 0 || o[i] > UINT32_MAX ? UINT32_MAX : (uint32_t)o[i];
    g->n_outputs = n;
  }
  rc = 0;
out:
  json_decref(root);
  return rc;
}

/* ---- plan ---- */

static char *dupstr(const char *s) { return kex_strdup(s ? s : ""); }

void kex_plan_free(kex_plan *p) {
  if (!p) return;
  kex_free(p->items);
  free_msg(p->reply_);
  kex_free(p);
}

/* The plan takes the reply: its items point into it (kex_plan_free frees both). */
static int plan_take(Kex__V1__PlanReply *rep, kex_plan **out) {
  kex_plan *p = kex_calloc(1, sizeof *p);
  if (!p || !(p->items = kex_calloc(rep->n_items ? rep->n_items : 1, sizeof *p->items))) {
    kex_free(p);
    return KEX_ENOMEM;
  }
  p->reply_ = rep;
  p->kernels = rep->kernels;
  p->schedule_us = rep->schedule_us;
  p->intermediate_buffers = rep->intermediate_buffers;
  p->planned_buffers = rep->planned_buffers;
  p->bytes_before = rep->bytes_before;
  p->bytes_after = rep->bytes_after;
  p->nitems = rep->n_items;
  for (size_t i = 0; i < rep->n_items; i++) {
    const Kex__V1__PlanItem *src = rep->items[i];
    p->items[i] = (kex_plan_item){src->kind,        src->label,       src->outputs,   src->inputs,
                                  src->planned,     src->n_outputs,   src->n_inputs,  src->n_planned,
                                  src->ast,         src->n_ast};
  }
  *out = p;
  return 0;
}

int kex_plan_graph(kex_client *c, const char *job, const char *graph_json, kex_plan **out, kex_status *st) {
  Kex__V1__PlanRequest req = KEX__V1__PLAN_REQUEST__INIT;
  Kex__V1__Graph g;
  Kex__V1__PlanReply *rep = NULL;
  kex_arena arena;
  int rc;
  *out = NULL;
  kex_arena_init(&arena, graph_arena_block(graph_json));
  if ((rc = graph_from_json(graph_json, &arena, &g, st))) goto out;
  req.job = (char *)(job ? job : "");
  req.graph = &g;
  if ((rc = unary(c, M_PLAN, req.job, &req.base, &kex__v1__plan_reply__descriptor, (ProtobufCMessage **)&rep, st)))
    goto out;
  if ((rc = plan_take(rep, out))) status_set(st, rc, 0, "Plan: out of memory");
  else rep = NULL;
out:
  free_msg(rep);
  kex_arena_destroy(&arena);
  return rc;
}

/* ---- submit ---- */

void kex_result_free(kex_result *r) {
  if (!r) return;
  for (size_t i = 0; i < r->noutputs; i++) kex_array_free(&r->outputs[i].buf);
  for (size_t i = 0; i < r->nkernels; i++) {
    kex_free(r->kernels[i].kernel);
    if (r->kernel_opts) kex_free(r->kernel_opts[i]);
  }
  kex_free(r->outputs);
  kex_free(r->kernels);
  kex_free(r->kernel_opts);
  kex_free(r->trace_json);
  kex_free(r);
}

static int result_copy(const Kex__V1__Done *d, kex_result **out) {
  kex_result *r = kex_calloc(1, sizeof *r);
  if (!r) return KEX_ENOMEM;
  r->total_us = d->total_us;
  if (!(r->outputs = kex_calloc(d->n_outputs ? d->n_outputs : 1, sizeof *r->outputs)) ||
      !(r->kernels = kex_calloc(d->n_kernels ? d->n_kernels : 1, sizeof *r->kernels)) ||
      !(r->kernel_opts = kex_calloc(d->n_kernels ? d->n_kernels : 1, sizeof *r->kernel_opts)))
    goto nomem;
  for (size_t i = 0; i < d->n_outputs; i++) {
    const Kex__V1__Output *o = d->outputs[i];
    kex_output *ko = &r->outputs[i];
    r->noutputs = i + 1;
    copy_token(ko->handle, o->handle);
    if (buffer_meta(&ko->buf, o->dtype, o->n_shape, o->shape) < 0) goto nomem;
    ko->has_data = o->has_data;
    if (o->has_data) {
      if (!(ko->buf.data = kex_malloc(o->data.len ? o->data.len : 1))) goto nomem;
      if (o->data.len) memcpy(ko->buf.data, o->data.data, o->data.len);
      ko->buf.nbytes = o->data.len;
    }
  }
  for (size_t i = 0; i < d->n_kernels; i++) {
    r->nkernels = i + 1;
    if (!(r->kernels[i].kernel = dupstr(d->kernels[i]->kernel)) ||
        !(r->kernel_opts[i] = dupstr(d->kernels[i]->opts ? d->kernels[i]->opts : "")))
      goto nomem;
    r->kernels[i].compile_us = d->kernels[i]->compile_us;
    r->kernels[i].run_us = d->kernels[i]->run_us;
  }
  if (d->trace_json && d->trace_json[0] && !(r->trace_json = dupstr(d->trace_json))) goto nomem;
  *out = r;
  return 0;
nomem:
  kex_result_free(r);
  return KEX_ENOMEM;
}

/* Hand one event to cb, or copy the done event into *out; 0, or -1 with *st set (out of memory). */
static int submit_event(const Kex__V1__SubmitEvent *ev, kex_submit_cb cb, void *ud, kex_result **out, kex_status *st) {
  kex_submit_event e;
  memset(&e, 0, sizeof e);
  switch (ev->event_case) {
  case KEX__V1__SUBMIT_EVENT__EVENT_ACCEPTED:
    e.kind = KEX_EVENT_ACCEPTED;
    e.submission = ev->accepted->submission;
    break;
  case KEX__V1__SUBMIT_EVENT__EVENT_SCHEDULED:
    e.kind = KEX_EVENT_SCHEDULED;
    e.kernels = (const char *const *)ev->scheduled->kernels;
    e.nkernels = ev->scheduled->n_kernels;
    break;
  case KEX__V1__SUBMIT_EVENT__EVENT_COMPILING:
  case KEX__V1__SUBMIT_EVENT__EVENT_RUNNING: {
    bool comp = ev->event_case == KEX__V1__SUBMIT_EVENT__EVENT_COMPILING;
    const Kex__V1__KernelEvent *k = comp ? ev->compiling : ev->running;
    e.kind = comp ? KEX_EVENT_COMPILING : KEX_EVENT_RUNNING;
    e.i = k->i;
    e.n = k->n;
    e.kernel = k->kernel;
    break;
  }
  case KEX__V1__SUBMIT_EVENT__EVENT_DONE:
    if (!*out && result_copy(ev->done, out)) {
      status_set(st, KEX_ENOMEM, 0, "Submit: out of memory copying the result");
      return -1;
    }
    return 0;
  default: return 0; /* an event this client does not know: newer server */
  }
  if (cb) cb(&e, ud);
  return 0;
}

/*
 * The events come batched (SubmitRequest.batched_events): a message holds
 * every event that was ready when it was written, so a quick submission is
 * one message; the request goes out with the first read, and once the done
 * event is in, the next thing on the stream is the status.
 */
int kex_submit(kex_client *c, const char *job, const char *graph_json, const kex_submit_opts *opts, kex_submit_cb cb,
               void *ud, kex_result **out, kex_status *st) {
  Kex__V1__SubmitRequest req = KEX__V1__SUBMIT_REQUEST__INIT;
  Kex__V1__BeamOptions beam = KEX__V1__BEAM_OPTIONS__INIT;
  Kex__V1__SubmitEvent *ev = NULL;
  Kex__V1__Graph g;
  kex_submit_opts o = {0};
  kex_status local_err = {0};
  kex_arena arena;
  rpc r;
  int rc, got;
  *out = NULL;
  if (opts) o = *opts;
  kex_arena_init(&arena, graph_arena_block(graph_json));
  if ((rc = graph_from_json(graph_json, &arena, &g, st))) goto out;
  req.job = (char *)(job ? job : "");
  req.graph = &g;
  req.return_bytes = o.return_bytes;
  req.trace = o.trace;
  req.batched_events = true;
  if (o.beam_width) {
    beam.beam_width = o.beam_width;
    req.beam = &beam;
  }
  if ((rc = rpc_begin(c, M_SUBMIT, job, o.timeout_s, &r, st))) goto out;
  got = rpc_send_recv(&r, &req.base, &kex__v1__submit_event__descriptor, (ProtobufCMessage **)&ev, &local_err);
  while (got == 1) {
    if (submit_event(ev, cb, ud, out, &local_err) < 0) got = -1;
    for (size_t k = 0; got == 1 && k < ev->n_following; k++)
      if (submit_event(ev->following[k], cb, ud, out, &local_err) < 0) got = -1;
    free_msg(ev);
    ev = NULL;
    if (got < 0 || *out) break;
    got = rpc_recv(&r, &kex__v1__submit_event__descriptor, (ProtobufCMessage **)&ev, &local_err);
  }
  rc = rpc_end_read(&r, got < 0, &local_err, st);
  if (!rc && !*out) {
    rc = status_set(st, KEX_ECORRUPT, 0, "Submit: the stream ended OK without a done event");
  }
  if (rc) {
    kex_result_free(*out);
    *out = NULL;
  }
out:
  kex_arena_destroy(&arena);
  if (!rc) status_ok(st);
  return rc;
}

/* ---- devices, stats ---- */

void kex_remote_devices_free(kex_remote_device *d, size_t n) {
  if (!d) return;
  for (size_t i = 0; i < n; i++) {
    kex_free(d[i].name);
    kex_free(d[i].kind);
    kex_free(d[i].vendor);
    kex_free(d[i].device_name);
    kex_free(d[i].driver_version);
  }
  kex_free(d);
}

int kex_list_devices(kex_client *c, kex_remote_device **out, size_t *n, kex_status *st) {
  Kex__V1__ListDevicesRequest req = KEX__V1__LIST_DEVICES_REQUEST__INIT;
  Kex__V1__ListDevicesReply *rep = NULL;
  kex_remote_device *d = NULL;
  int rc;
  *out = NULL;
  *n = 0;
  if ((rc = unary(c, M_LIST_DEVICES, NULL, &req.base,
                  &kex__v1__list_devices_reply__descriptor, (ProtobufCMessage **)&rep,
                  st)))
    return rc;
  if (!(d = kex_calloc(rep->n_devices ? rep->n_devices : 1, sizeof *d))) goto nomem;
  for (size_t i = 0; i < rep->n_devices; i++) {
    const Kex__V1__Device *s = rep->devices[i];
    d[i].name = dupstr(s->name);
    d[i].kind = dupstr(s->kind);
    d[i].vendor = dupstr(s->vendor);
    d[i].device_name = dupstr(s->device_name);
    d[i].driver_version = dupstr(s->driver_version);
    d[i].is_default = s->is_default;
    d[i].available = s->available;
    if (!d[i].name || !d[i].kind || !d[i].vendor || !d[i].device_name || !d[i].driver_version) {
      kex_remote_devices_free(d, i + 1);
      goto nomem;
    }
  }
  *out = d;
  *n = rep->n_devices;
  free_msg(rep);
  return 0;
nomem:
  free_msg(rep);
  return status_set(st, KEX_ENOMEM, 0, "ListDevices: out of memory");
}

void kex_stats_free(kex_stats *s) {
  if (!s) return;
  for (size_t i = 0; i < s->njobs; i++) {
    kex_free(s->jobs[i].name);
    kex_free(s->jobs[i].tenant);
  }
  for (size_t i = 0; i < s->ntenants; i++) kex_free(s->tenants[i].name);
  kex_free(s->jobs);
  kex_free(s->tenants);
  kex_free(s->tenant);
  kex_free(s);
}

int kex_client_health(kex_client *c, const char *service, bool *serving, kex_status *st) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  Grpc__Health__V1__HealthCheckResponse *rep = NULL;
  int rc;
  *serving = false;
  req.service = (char *)(service ? service : "");
  if ((rc = unary(c, M_HEALTH, NULL, &req.base, &grpc__health__v1__health_check_response__descriptor,
                  (ProtobufCMessage **)&rep, st)))
    return rc;
  *serving = rep->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  free_msg(rep);
  return 0;
}

int kex_get_stats(kex_client *c, const char *job, kex_stats **out, kex_status *st) {
  Kex__V1__GetStatsRequest req = KEX__V1__GET_STATS_REQUEST__INIT;
  Kex__V1__StatsReply *rep = NULL;
  kex_stats *s;
  int rc;
  *out = NULL;
  req.job = (char *)(job ? job : "");
  if ((rc = unary(c, M_GET_STATS, req.job, &req.base,
                  &kex__v1__stats_reply__descriptor, (ProtobufCMessage **)&rep, st)))
    return rc;
  if (!(s = kex_calloc(1, sizeof *s)) || !(s->jobs = kex_calloc(rep->n_job_stats ? rep->n_job_stats : 1, sizeof *s->jobs))) {
    kex_free(s);
    free_msg(rep);
    return status_set(st, KEX_ENOMEM, 0, "GetStats: out of memory");
  }
  s->jobs_open = rep->jobs_open;
  s->jobs_opened = rep->jobs_opened;
  s->jobs_closed = rep->jobs_closed;
  s->jobs_expired = rep->jobs_expired;
  s->submissions = rep->submissions;
  s->plans = rep->plans;
  s->plan_errors = rep->plan_errors;
  s->kernels_planned = rep->kernels_planned;
  s->calls = rep->calls;
  s->calls_failed = rep->calls_failed;
  s->uptime_s = rep->uptime_s;
  s->bytes_held = rep->bytes_held;
  s->buffers_freed = rep->buffers_freed;
  s->submissions_done = rep->submissions_done;
  s->submissions_failed = rep->submissions_failed;
  s->schedule_cache_hits = rep->schedule_cache_hits;
  s->schedule_cache_misses = rep->schedule_cache_misses;
  s->program_cache_memory_hits = rep->program_cache_memory_hits;
  s->program_cache_sqlite_hits = rep->program_cache_sqlite_hits;
  s->program_cache_misses = rep->program_cache_misses;
  s->beam_cache_hits = rep->beam_cache_hits;
  s->beam_cache_misses = rep->beam_cache_misses;
  s->searches_run = rep->searches_run;
  s->searches_cancelled = rep->searches_cancelled;
  s->connections_open = rep->connections_open;
  s->connections_refused = rep->connections_refused;
  s->jobs_evicted = rep->jobs_evicted;
  for (size_t i = 0; i < rep->n_job_stats; i++) {
    const Kex__V1__JobStats *j = rep->job_stats[i];
    kex_job_stats *d = &s->jobs[i];
    s->njobs = i + 1;
    if (!(d->name = dupstr(j->name)) || !(d->tenant = dupstr(j->tenant))) {
      kex_stats_free(s);
      free_msg(rep);
      return status_set(st, KEX_ENOMEM, 0, "GetStats: out of memory");
    }
    d->weight = j->weight;
    d->memory_limit = j->memory_limit;
    d->bytes_held = j->bytes_held;
    d->buffers = j->buffers;
    d->queued = j->queued;
    d->running = j->running;
    d->items_done = j->items_done;
    d->device_time_s = j->device_time_s;
    d->bytes_reserved = j->bytes_reserved;
  }
  if (rep->fleet) {
    const Kex__V1__FleetStats *f = rep->fleet;
    s->fleet = (kex_fleet_stats){.hits = f->hits, .published = f->published, .lease_waits = f->lease_waits,
                                 .takeovers = f->takeovers, .rejected = f->rejected, .errors = f->errors,
                                 .outages = f->outages};
    snprintf(s->fleet.state, sizeof s->fleet.state, "%s", f->state);
  } else {
    snprintf(s->fleet.state, sizeof s->fleet.state, "off");
  }
  bool ok = (s->tenant = dupstr(rep->tenant)) &&
            (s->tenants = kex_calloc(rep->n_tenant_stats ? rep->n_tenant_stats : 1, sizeof *s->tenants));
  for (size_t i = 0; ok && i < rep->n_tenant_stats; i++) {
    const Kex__V1__TenantStats *t = rep->tenant_stats[i];
    s->tenants[i] = (kex_tenant_stats){dupstr(t->name), t->jobs_open, t->bytes_held, t->bytes_reserved,
                                       t->jobs_opened, t->submissions, t->refused};
    s->ntenants = i + 1;
    ok = s->tenants[i].name != NULL;
  }
  if (!ok) {
    kex_stats_free(s);
    free_msg(rep);
    return status_set(st, KEX_ENOMEM, 0, "GetStats: out of memory");
  }
  *out = s;
  free_msg(rep);
  return 0;
}

/* ---- Tune and the beam cache ---- */

static void cache_entry_clear(kex_remote_cache_entry *e) {
  char **fields[] = {&e->key,    &e->device,      &e->kind,        &e->vendor, &e->device_name, &e->driver_version,
                     &e->compiler_version, &e->kernel_name, &e->opts, &e->search_opts, &e->codegen, &e->ast_text,
                     &e->source};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    kex_free(*fields[i]);
    *fields[i] = NULL;
  }
}

void kex_remote_cache_entry_free(kex_remote_cache_entry *e) {
  if (!e) return;
  cache_entry_clear(e);
  kex_free(e);
}

/* The opts of a CacheEntry joined by single spaces (kex_malloc'd; NULL when out of memory). */
static char *join_opts(char **opts, size_t n) {
  size_t len = 1;
  char *s, *p;
  for (size_t i = 0; i < n; i++) len += strlen(opts[i] ? opts[i] : "") + 1;
  if (!(s = kex_malloc(len))) return NULL;
  p = s;
  for (size_t i = 0; i < n; i++) {
    size_t k = strlen(opts[i] ? opts[i] : "");
    if (i) *p++ = ' ';
    if (k) memcpy(p, opts[i], k);
    p += k;
  }
  *p = 0;
  return s;
}

/* Fill *e (zeroed by the caller) from a CacheEntry (src may be NULL: all empty).  0 or KEX_ENOMEM (*e cleared). */
static int cache_entry_copy(const Kex__V1__CacheEntry *src, kex_remote_cache_entry *e) {
  static const Kex__V1__CacheEntry empty = KEX__V1__CACHE_ENTRY__INIT;
  static const Kex__V1__DeviceIdentity no_identity = KEX__V1__DEVICE_IDENTITY__INIT;
  const Kex__V1__DeviceIdentity *id;
  if (!src) src = &empty;
  id = src->identity ? src->identity : &no_identity;
  e->key = dupstr(src->key);
  e->device = dupstr(src->device);
  e->kind = dupstr(id->kind);
  e->vendor = dupstr(id->vendor);
  e->device_name = dupstr(id->name);
  e->driver_version = dupstr(id->driver_version);
  e->compiler_version = dupstr(id->compiler_version);
  e->kernel_name = dupstr(src->kernel_name);
  e->opts = join_opts(src->opts, src->n_opts);
  e->search_opts = dupstr(src->search_opts);
  e->codegen = dupstr(src->codegen);
  e->ast_text = dupstr(src->ast_text);
  e->source = dupstr(src->source);
  e->best_us = src->best_us;
  e->hand_us = src->baseline_us;
  e->search_s = src->search_ms / 1e3;
  e->candidates = src->candidates;
  e->created_unix = src->created_unix;
  if (!e->key || !e->device || !e->kind || !e->vendor || !e->device_name || !e->driver_version ||
      !e->compiler_version || !e->kernel_name || !e->opts || !e->search_opts || !e->codegen || !e->ast_text ||
      !e->source) {
    cache_entry_clear(e);
    return KEX_ENOMEM;
  }
  return 0;
}

/* The protobuf CacheFilter of f (may be NULL); pointers borrow f's strings. */
static void filter_to_pb(const kex_remote_cache_filter *f, Kex__V1__CacheFilter *pb) {
  kex__v1__cache_filter__init(pb);
  if (!f) return;
  if (f->device) pb->device = (char *)f->device;
  if (f->kernel_name) pb->kernel_name = (char *)f->kernel_name;
  if (f->key_prefix) pb->key_prefix = (char *)f->key_prefix;
  pb->max_age_s = f->max_age_s;
}

void kex_tune_result_free(kex_tune_result *r) {
  if (!r) return;
  for (size_t i = 0; i < r->nkernels; i++) {
    kex_free(r->kernels[i].kernel);
    cache_entry_clear(&r->kernels[i].entry);
  }
  kex_free(r->kernels);
  kex_free(r);
}

/* Account one TuneEvent in *res: 0, or a kex code with *err set (a bad index, out of memory). */
static int tune_take(const Kex__V1__TuneEvent *ev, kex_tune_result *res, size_t *finished, kex_status *err) {
  kex_tune_kernel *k;
  if (!res->kernels) {
    if (ev->n == 0 || ev->n > (1u << 24))
      return status_set(err, KEX_ECORRUPT, 0, "Tune: an event for kernel %u of %u", ev->i, ev->n);
    if (!(res->kernels = kex_calloc(ev->n, sizeof *res->kernels)))
      return status_set(err, KEX_ENOMEM, 0, "Tune: out of memory");
    res->nkernels = ev->n;
  }
  if (ev->n != res->nkernels || ev->i < 1 || ev->i > res->nkernels)
    return status_set(err, KEX_ECORRUPT, 0, "Tune: an event for kernel %u of %u in a tune of %zu kernels", ev->i,
                      ev->n, res->nkernels);
  k = &res->kernels[ev->i - 1];
  if (ev->round > k->rounds) k->rounds = ev->round;
  if (ev->compiled > k->compiled) k->compiled = ev->compiled;
  if (ev->timed > k->timed) k->timed = ev->timed;
  if (!ev->finished) return 0;
  if (k->kernel) return status_set(err, KEX_ECORRUPT, 0, "Tune: kernel %u finished twice", ev->i);
  if (!(k->kernel = dupstr(ev->kernel)) || cache_entry_copy(ev->entry, &k->entry)) {
    kex_free(k->kernel);
    k->kernel = NULL;
    return status_set(err, KEX_ENOMEM, 0, "Tune: out of memory copying the result");
  }
  k->from_cache = ev->from_cache;
  k->hand_won = ev->hand_won;
  k->search_s = ev->search_s;
  (*finished)++;
  return 0;
}

int kex_client_tune(kex_client *c, const char *job, const char *graph_json, const kex_tune_opts *opts, kex_tune_cb cb,
                    void *ud, kex_tune_result **out, kex_status *st) {
  Kex__V1__TuneRequest req = KEX__V1__TUNE_REQUEST__INIT;
  Kex__V1__BeamOptions beam = KEX__V1__BEAM_OPTIONS__INIT;
  Kex__V1__TuneEvent *ev = NULL;
  Kex__V1__Graph g;
  kex_tune_opts o = {0};
  kex_tune_result *res = NULL;
  kex_status local_err = {0};
  size_t finished = 0;
  kex_arena arena;
  rpc r;
  int rc, got = 0;
  *out = NULL;
  if (opts) o = *opts;
  kex_arena_init(&arena, graph_arena_block(graph_json));
  if ((rc = graph_from_json(graph_json, &arena, &g, st))) goto out;
  if (!(res = kex_calloc(1, sizeof *res))) {
    rc = status_set(st, KEX_ENOMEM, 0, "Tune: out of memory");
    goto out;
  }
  if (o.device && *o.device) g.device = (char *)o.device;
  beam.beam_width = o.beam_width;
  beam.max_upcast = o.max_upcast;
  beam.max_local = o.max_local;
  beam.timeout_ms = o.kernel_timeout_ms;
  req.job = (char *)(job ? job : "");
  req.graph = &g;
  req.beam = &beam;
  if ((rc = rpc_begin(c, M_TUNE, job, o.timeout_s, &r, st))) goto out;
  if (!rpc_send_request(&r, &req.base)) goto finish;
  while ((got = rpc_recv(&r, &kex__v1__tune_event__descriptor, (ProtobufCMessage **)&ev, &local_err)) == 1) {
    if (tune_take(ev, res, &finished, &local_err)) {
      got = -1;
    } else if (cb) {
      kex_tune_event e;
      size_t i = ev->i - 1;
      memset(&e, 0, sizeof e);
      e.i = ev->i;
      e.n = ev->n;
      e.kernel = ev->kernel;
      e.finished = ev->finished;
      e.phase = ev->phase;
      e.round = ev->round;
      e.round_candidates = ev->round_candidates;
      e.compiled = ev->compiled;
      e.timed = ev->timed;
      e.best_us = ev->best_us;
      e.from_cache = ev->from_cache;
      e.hand_won = ev->hand_won;
      e.search_s = ev->search_s;
      e.entry = ev->finished ? &res->kernels[i].entry : NULL;
      cb(&e, ud);
    }
    free_msg(ev);
    ev = NULL;
    if (got < 0) break;
  }
finish:
  rc = rpc_end_read(&r, got < 0, &local_err, st);
  if (!rc && finished != res->nkernels) {
    rc = status_set(st, KEX_ECORRUPT, 0, "Tune: the stream ended OK after %zu of %zu kernels", finished,
                    res->nkernels);
  }
out:
  if (rc) kex_tune_result_free(res);
  else *out = res;
  kex_arena_destroy(&arena);
  if (!rc) status_ok(st);
  return rc;
}

void kex_cache_page_free(kex_cache_page *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nentries; i++) cache_entry_clear(&p->entries[i]);
  kex_free(p->entries);
  kex_free(p->next_page_token);
  kex_free(p);
}

int kex_client_cache_list(kex_client *c, const char *job, const kex_remote_cache_filter *filter, uint32_t limit,
                          const char *page_token, kex_cache_page **out, kex_status *st) {
  Kex__V1__ListCacheRequest req = KEX__V1__LIST_CACHE_REQUEST__INIT;
  Kex__V1__CacheFilter f;
  Kex__V1__ListCacheReply *rep = NULL;
  kex_cache_page *p = NULL;
  int rc;
  *out = NULL;
  filter_to_pb(filter, &f);
  req.job = (char *)(job ? job : "");
  req.filter = &f;
  req.limit = limit;
  req.page_token = (char *)(page_token ? page_token : "");
  if ((rc = unary(c, M_LIST_CACHE, req.job, &req.base,
                  &kex__v1__list_cache_reply__descriptor, (ProtobufCMessage **)&rep, st)))
    return rc;
  if (!(p = kex_calloc(1, sizeof *p)) || !(p->next_page_token = dupstr(rep->next_page_token)) ||
      !(p->entries = kex_calloc(rep->n_entries ? rep->n_entries : 1, sizeof *p->entries)))
    goto nomem;
  for (size_t i = 0; i < rep->n_entries; i++) {
    if (cache_entry_copy(rep->entries[i], &p->entries[i])) goto nomem;
    p->nentries = i + 1;
  }
  *out = p;
  free_msg(rep);
  return 0;
nomem:
  kex_cache_page_free(p);
  free_msg(rep);
  return status_set(st, KEX_ENOMEM, 0, "ListCache: out of memory");
}

int kex_client_cache_get(kex_client *c, const char *job, const char *key, const char *device,
                         kex_remote_cache_entry **out, kex_status *st) {
  Kex__V1__GetCacheEntryRequest req = KEX__V1__GET_CACHE_ENTRY_REQUEST__INIT;
  Kex__V1__CacheEntry *rep = NULL;
  kex_remote_cache_entry *e;
  int rc;
  *out = NULL;
  req.job = (char *)(job ? job : "");
  req.key = (char *)(key ? key : "");
  req.device = (char *)(device ? device : "");
  if ((rc = unary(c, M_GET_CACHE_ENTRY, req.job, &req.base,
                  &kex__v1__cache_entry__descriptor, (ProtobufCMessage **)&rep, st)))
    return rc;
  if (!(e = kex_calloc(1, sizeof *e)) || cache_entry_copy(rep, e)) {
    kex_free(e);
    free_msg(rep);
    return status_set(st, KEX_ENOMEM, 0, "GetCacheEntry: out of memory");
  }
  *out = e;
  free_msg(rep);
  return 0;
}

int kex_client_cache_export(kex_client *c, const char *job, const kex_remote_cache_filter *filter, FILE *f,
                            kex_cache_chunk_cb cb, void *ud, uint64_t *entries, kex_status *st) {
  Kex__V1__ExportCacheRequest req = KEX__V1__EXPORT_CACHE_REQUEST__INIT;
  Kex__V1__CacheFilter pf;
  Kex__V1__ExportCacheChunk *ch = NULL;
  kex_status local_err = {0};
  uint64_t n = 0;
  rpc r;
  int rc, got = 0;
  if (entries) *entries = 0;
  if (!cb && !f) return status_set(st, KEX_EINVAL, 0, "ExportCache: neither a file nor a callback");
  filter_to_pb(filter, &pf);
  req.job = (char *)(job ? job : "");
  req.filter = &pf;
  if ((rc = rpc_begin(c, M_EXPORT_CACHE, job, 0, &r, st))) return rc;
  if (!rpc_send_request(&r, &req.base)) goto finish;
  while ((got = rpc_recv(&r, &kex__v1__export_cache_chunk__descriptor, (ProtobufCMessage **)&ch, &local_err)) == 1) {
    if (ch->entries) n = ch->entries;
    if (ch->data.len) {
      if (cb) {
        if (cb(ch->data.data, ch->data.len, ud)) {
          status_set(&local_err, KEX_ECANCELLED, 0, "ExportCache: stopped by the callback");
          got = -1;
        }
      } else if (fwrite(ch->data.data, 1, ch->data.len, f) != ch->data.len) {
        status_set(&local_err, KEX_EIO, 0, "ExportCache: write error: %s", strerror(errno));
        got = -1;
      }
    }
    free_msg(ch);
    ch = NULL;
    if (got < 0) break;
  }
finish:
  rc = rpc_end_read(&r, got < 0, &local_err, st);
  if (!rc) {
    if (entries) *entries = n;
    status_ok(st);
  }
  return rc;
}

int kex_client_cache_import(kex_client *c, const char *job, FILE *f, kex_import_report *rep, kex_status *st) {
  Kex__V1__ImportCacheRequest req = KEX__V1__IMPORT_CACHE_REQUEST__INIT;
  Kex__V1__ImportCacheReply *reply = NULL;
  unsigned char *chunk = NULL;
  kex_status local_err = {0};
  bool client_failed = false;
  rpc r;
  bool sent_all = false;
  int rc;
  if (rep) memset(rep, 0, sizeof *rep);
  if (!f) return status_set(st, KEX_EINVAL, 0, "ImportCache: no file");
  if (!(chunk = kex_malloc(KEX_UPLOAD_CHUNK))) return status_set(st, KEX_ENOMEM, 0, "ImportCache: out of memory");
  if ((rc = rpc_begin(c, M_IMPORT_CACHE, job, 0, &r, st))) goto out;
  req.job = (char *)(job ? job : "");
  for (bool first = true;; first = false) {
    size_t n = fread(chunk, 1, KEX_UPLOAD_CHUNK, f);
    if (n == 0 && ferror(f)) {
      status_set(&local_err, KEX_EIO, 0, "ImportCache: read error: %s", strerror(errno));
      client_failed = true;
      grpc_call_cancel(r.call, NULL);
      goto finish;
    }
    if (n == 0 && !first) break;
    req.data.data = chunk;
    req.data.len = n;
    if (!rpc_send_stream(&r, &req.base, first)) goto finish; /* the server ended the call: rpc_end says why */
    req.job = (char *)"";                                     /* the job goes in the first message only */
    if (n < KEX_UPLOAD_CHUNK && feof(f)) break;
  }
  sent_all = true;
finish:
  rc = rpc_end_stream(&r, sent_all, &kex__v1__import_cache_reply__descriptor, (ProtobufCMessage **)&reply,
                      client_failed ? &local_err : NULL, "ImportCache", st);
  if (!rc) {
    if (rep) {
      rep->imported = reply->imported;
      rep->rejected = reply->rejected;
      for (size_t i = 0; i < reply->n_errors && i < KEX_IMPORT_ERRORS_MAX; i++) {
        snprintf(rep->errors[i], sizeof rep->errors[i], "%s", reply->errors[i] ? reply->errors[i] : "");
        rep->nerrors = (uint32_t)i + 1;
      }
    }
    status_ok(st);
  }
out:
  free_msg(reply);
  kex_free(chunk);
  return rc;
}

int kex_client_cache_delete(kex_client *c, const char *job, const kex_remote_cache_filter *filter, uint32_t *deleted,
                            kex_status *st) {
  Kex__V1__DeleteCacheRequest req = KEX__V1__DELETE_CACHE_REQUEST__INIT;
  Kex__V1__CacheFilter f;
  Kex__V1__DeleteCacheReply *rep = NULL;
  int rc;
  if (deleted) *deleted = 0;
  filter_to_pb(filter, &f);
  req.job = (char *)(job ? job : "");
  req.filter = &f;
  if ((rc = unary(c, M_DELETE_CACHE, req.job, &req.base,
                  &kex__v1__delete_cache_reply__descriptor, (ProtobufCMessage **)&rep,
                  st)))
    return rc;
  if (deleted) *deleted = rep->deleted;
  free_msg(rep);
  return 0;
}

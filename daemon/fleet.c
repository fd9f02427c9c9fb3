/*
 * fleet.c - the fleet cache (fleet.h): a hiredis async connection on the
 * loop, the bridge that lets a search's worker thread run one Redis command
 * with a bounded wait, leases and their renewal timer, and the beam hook.
 *
 * The bridge: a worker allocates a command (fleet_cmd), queues it under
 * f->mu and wakes the loop (f->wake, the loop bridge); the loop sends every queued command
 * (or fails it at once when Redis is not up) and hiredis calls on_reply on
 * the loop with the reply, which is copied into the command and the worker
 * woken (f->cond).  A worker that waited --fleet-timeout marks its command
 * abandoned and leaves; whichever side finishes last frees it (the loop
 * when the reply comes after, or when the connection drops).  Nothing the
 * loop does waits on a worker or on Redis.
 */
#include "daemon/fleet.h"

#include <ctype.h>
#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "core/alloc.h"
#include "core/codec.h"
#include "core/log.h"
#include "core/pool.h"
#include "daemon/bridge.h"
#include "daemon/kexd.h"

#define CMD_ARGS 7    /* the most arguments a command here takes (EVAL script 1 key token ms max_ms) */
#define TOKEN_MAX 96  /* bytes of a lease token: "<host>:<pid>:<32 hex>" cut to fit */

/* Renew the lease (ARGV[2] ms) only while it is still ours (ARGV[1]). */
static const char renew_script[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/*
 * Take the lease (ARGV[1] the token, ARGV[2] its ms): 1 taken; 2 taken
 * over from a holder whose lease has no expiry or one past ARGV[3] ms (no
 * kexd sets such a lease: a stuck or hostile writer's); 0 another holds it.
 */
static const char take_script[] =
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
    "local t = redis.call('pttl', KEYS[1]) "
    "if t == -1 or t > tonumber(ARGV[3]) then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end "
    "return 0";
/* GET the value only when it is at most ARGV[1] bytes; else its length (an integer): it is never sent. */
static const char get_script[] =
    "local n = redis.call('strlen', KEYS[1]) "
    "if n > tonumber(ARGV[1]) then return n end "
    "return redis.call('get', KEYS[1])";
/* Delete the lease only while it is still ours. */
static const char release_script[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_UP, CONN_CLOSED };
static const char *const state_names[] = {"down", "connecting", "up", "off"};

enum cmd_state { CMD_QUEUED, CMD_DONE, CMD_ABANDONED };

/* A result to publish when Redis is back. */
typedef struct kexd_fleet_unsent {
  struct kexd_fleet_unsent *next;
  char key[KEXD_FLEET_KEY_MAX];
  char *line;
} kexd_fleet_unsent;

/* One command from a worker; see the file comment for who frees it. */
typedef struct fleet_cmd_t {
  struct fleet_cmd_t *next;
  int argc;
  const char *argv[CMD_ARGS];
  size_t argvlen[CMD_ARGS];
  int state;       /* enum cmd_state, under f->mu */
  int rc;          /* 0: a reply came; KEX_EUNAVAILABLE: not sent or the connection dropped */
  int type;        /* REDIS_REPLY_* */
  long long integer;
  char *str;       /* kex_malloc'd copy of a string/status/error reply, or NULL */
  size_t len;
  char data[];     /* the arguments' bytes */
} fleet_cmd_t;

/* A lease a search holds: renewed by the loop's timer until the search removes it. */
typedef struct kexd_fleet_lease {
  struct kexd_fleet_lease *next;
  char key[KEXD_FLEET_KEY_MAX];
  char token[TOKEN_MAX];
} kexd_fleet_lease;

struct kexd_fleet {
  kexd *d;
  uv_loop_t *loop;
  kexd_fleet_url url;
  char where[KEXD_FLEET_HOST_MAX + 32]; /* "HOST:PORT/DB", for the log (no password) */
  uint64_t lease_ms, timeout_ms, wait_max_ms;
  /* the loop's */
  redisAsyncContext *ac;
  kexd_wake wake;            /* the loop bridge (bridge.h) */
  uv_timer_t retry, renew;
  bool handles_open, down_logged;
  const char *dropping;       /* why this side is dropping the connection (on_disconnect's reason), or NULL */
  double backoff_s;
  /* shared, under mu */
  uv_mutex_t mu;
  uv_cond_t cond;
  int state;                  /* enum conn_state */
  fleet_cmd_t *queue, **queue_tail;
  kexd_fleet_lease *leases;
  kexd_fleet_unsent *unsent;  /* results searched while Redis was down, newest first (KEXD_FLEET_UNSENT_MAX) */
  uint32_t nunsent;
  /* any thread */
  atomic_uint_fast64_t hits, published, lease_waits, takeovers, rejected, errors, outages;
  atomic_int slow_in_row;
};

/* ---- URL and keys ---- */

/* Copy src[n] into dst[cap] as a string: false when it does not fit or holds a NUL. */
static bool copy_part(char *dst, size_t cap, const char *src, size_t n) {
  if (n >= cap || memchr(src, 0, n)) return false;
  memcpy(dst, src, n);
  dst[n] = 0;
  return true;
}

int kexd_fleet_parse_url(const char *url, kexd_fleet_url *out, kex_error *err) {
  static const char scheme[] = "redis://";
  memset(out, 0, sizeof *out);
  out->port = 6379;
  if (!url || strncmp(url, scheme, sizeof scheme - 1))
    return kex_err_set(err, KEX_EINVAL, "fleet cache URL must start with redis:// (TLS is not supported)");
  const char *p = url + sizeof scheme - 1, *end = p + strcspn(p, "/");
  const char *at = memchr(p, '@', (size_t)(end - p));
  if (at) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (!colon) return kex_err_set(err, KEX_EINVAL, "fleet cache URL: credentials must be [USER]:PASSWORD@");
    if (!copy_part(out->user, sizeof out->user, p, (size_t)(colon - p)) ||
        !copy_part(out->password, sizeof out->password, colon + 1, (size_t)(at - colon - 1)) || !out->password[0])
      return kex_err_set(err, KEX_EINVAL, "fleet cache URL: the user or password is empty or over %d bytes",
                         KEXD_FLEET_SECRET_MAX - 1);
    p = at + 1;
  }
  const char *hend = end;
  const char *colon = memchr(p, ':', (size_t)(end - p));
  if (colon) {
    char *e;
    long port = strtol(colon + 1, &e, 10);
    if (e != end || colon + 1 == end || port < 1 || port > 65535)
      return kex_err_set(err, KEX_EINVAL, "fleet cache URL: the port is not a number in 1..65535");
    out->port = (int)port;
    hend = colon;
  }
  if (hend == p || !copy_part(out->host, sizeof out->host, p, (size_t)(hend - p)))
    return kex_err_set(err, KEX_EINVAL, "fleet cache URL: the host is empty or over %d bytes", KEXD_FLEET_HOST_MAX - 1);
  if (*end == '/' && end[1]) {
    char *e;
    long db = strtol(end + 1, &e, 10);
    if (*e || db < 0 || db > KEXD_FLEET_DB_MAX || !isdigit((unsigned char)end[1]))
      return kex_err_set(err, KEX_EINVAL, "fleet cache URL: the database is not a number in 0..%d", KEXD_FLEET_DB_MAX);
    out->db = (int)db;
  }
  return 0;
}

int kexd_fleet_key(const kex_cache_beam_key *key, const char *kind, char *buf, size_t len) {
  const kex_device_identity *dv = key->device;
  const char *parts[] = {dv->kind, dv->vendor, dv->name, dv->driver_version, dv->compiler_version,
                         key->search_opts, key->codegen_version};
  uint8_t digest[32];
  char hex[65];
  unsigned int dlen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, "kex.fleet.v1", 13) &&
           EVP_DigestUpdate(ctx, key->ast_key, KEX_AST_KEY_BYTES);
  for (size_t i = 0; ok && i < sizeof parts / sizeof *parts; i++) /* each field with its NUL: no two keys concatenate alike */
    ok = EVP_DigestUpdate(ctx, parts[i], strlen(parts[i]) + 1);
  ok = ok && EVP_DigestFinal_ex(ctx, digest, &dlen) && dlen == sizeof digest;
  EVP_MD_CTX_free(ctx);
  if (!ok) return KEX_ENOMEM;
  kex_hex(digest, sizeof digest, hex);
  int n = snprintf(buf, len, "kex:v1:%s:%s", kind, hex);
  return n < 0 || (size_t)n >= len ? KEX_ELIMIT : 0;
}

/* ---- the connection (loop thread) ---- */

static void set_state(kexd_fleet *f, int state) {
  uv_mutex_lock(&f->mu);
  f->state = state;
  uv_mutex_unlock(&f->mu);
}

static void fleet_connect(kexd_fleet *f);

static void on_retry(uv_timer_t *t) { fleet_connect(t->data); }

/* Redis is not reachable (why): log it once per outage, count it, retry after the backoff. */
static void went_down(kexd_fleet *f, const char *why) {
  f->ac = NULL;
  if (f->state == CONN_CLOSED) return;
  set_state(f, CONN_DOWN);
  atomic_fetch_add(&f->errors, 1);
  if (!f->down_logged) {
    f->down_logged = true;
    atomic_fetch_add(&f->outages, 1);
    KEX_WARN("fleet cache %s unreachable (%s): searching locally, reconnecting with backoff", f->where, why);
  } else {
    KEX_DEBUG("fleet cache %s: still unreachable (%s)", f->where, why);
  }
  uv_timer_start(&f->retry, on_retry, (uint64_t)(f->backoff_s * 1000), 0);
  f->backoff_s = fmin(f->backoff_s * 2, KEXD_FLEET_BACKOFF_MAX_S);
}

static void publish_unsent(kexd_fleet *f);

/* The PING sent after AUTH and SELECT answered: Redis serves (a TCP connect alone is not enough: a stopped process's
   socket still accepts). */
static void on_ping(redisAsyncContext *ac, void *r, void *priv) {
  const redisReply *reply = r;
  kexd_fleet *f = ac->data;
  (void)priv;
  if (!reply || reply->type != REDIS_REPLY_STATUS || f->state != CONN_CONNECTING) return;
  uv_timer_stop(&f->retry); /* the connect timeout */
  set_state(f, CONN_UP);
  atomic_store(&f->slow_in_row, 0);
  f->backoff_s = KEXD_FLEET_BACKOFF_MIN_S;
  if (f->down_logged) KEX_INFO("fleet cache %s reachable again: sharing beam results", f->where);
  else KEX_INFO("fleet cache %s connected: sharing beam results", f->where);
  f->down_logged = false;
  publish_unsent(f);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  kexd_fleet *f = ac->data;
  if (status != REDIS_OK) /* hiredis frees ac after this */
    went_down(f, ac->errstr[0] ? ac->errstr : "connect failed");
  /* else on_ping says when it serves */
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  kexd_fleet *f = ac->data;
  (void)status;
  const char *why = f->dropping ? f->dropping : ac->errstr[0] ? ac->errstr : "connection closed";
  f->dropping = NULL;
  went_down(f, why);
}

/* AUTH and SELECT: an error reply drops the connection (it would answer nothing else usefully). */
static void on_setup_reply(redisAsyncContext *ac, void *r, void *what) {
  const redisReply *reply = r;
  kexd_fleet *f = ac->data;
  if (reply && reply->type == REDIS_REPLY_ERROR) {
    KEX_ERROR("fleet cache %s: %s refused: %.200s", f->where, (const char *)what, reply->str);
    redisAsyncDisconnect(ac);
  }
}

/* The connect (and its PING) did not finish in --fleet-timeout, at least 1 s (a black-holed address, a stopped
   process): drop it and retry. */
static void on_connect_timeout(uv_timer_t *t) {
  kexd_fleet *f = t->data;
  if (f->state != CONN_CONNECTING || !f->ac) return;
  redisAsyncContext *ac = f->ac;
  f->ac = NULL;
  redisAsyncFree(ac); /* queued commands get NULL replies; a TCP-connected one calls on_disconnect (went_down) */
  if (f->state == CONN_CONNECTING) went_down(f, "connect timed out");
}

static void fleet_connect(kexd_fleet *f) {
  if (f->state == CONN_CLOSED) return;
  redisAsyncContext *ac = redisAsyncConnect(f->url.host, f->url.port);
  if (!ac || ac->err) {
    char why[128];
    snprintf(why, sizeof why, "%s", ac ? ac->errstr : "out of memory");
    if (ac) redisAsyncFree(ac);
    went_down(f, why);
    return;
  }
  ac->data = f;
  if (redisLibuvAttach(ac, f->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    went_down(f, "cannot attach to the loop");
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  f->ac = ac;
  set_state(f, CONN_CONNECTING);
  if (f->url.password[0]) {
    if (f->url.user[0])
      redisAsyncCommand(ac, on_setup_reply, (void *)"AUTH", "AUTH %s %s", f->url.user, f->url.password);
    else
      redisAsyncCommand(ac, on_setup_reply, (void *)"AUTH", "AUTH %s", f->url.password);
  }
  if (f->url.db) redisAsyncCommand(ac, on_setup_reply, (void *)"SELECT", "SELECT %d", f->url.db);
  redisAsyncCommand(ac, on_ping, NULL, "PING");
  uv_timer_start(&f->retry, on_connect_timeout, f->timeout_ms > 1000 ? f->timeout_ms : 1000, 0);
}

/* ---- the bridge ---- */

/* Loop: the command's outcome (reply NULL: not sent or dropped); frees it when its worker has left. */
static void cmd_finish(kexd_fleet *f, fleet_cmd_t *c, const redisReply *reply) {
  uv_mutex_lock(&f->mu);
  if (c->state == CMD_ABANDONED) {
    uv_mutex_unlock(&f->mu);
    kex_free(c);
    return;
  }
  c->rc = reply ? 0 : KEX_EUNAVAILABLE;
  if (reply) {
    c->type = reply->type;
    c->integer = reply->integer;
    if ((reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS || reply->type == REDIS_REPLY_ERROR) &&
        reply->len <= KEXD_FLEET_VALUE_MAX && (c->str = kex_malloc(reply->len + 1))) {
      memcpy(c->str, reply->str, reply->len);
      c->str[reply->len] = 0;
      c->len = reply->len;
    } else if (reply->type == REDIS_REPLY_STRING) {
      c->type = REDIS_REPLY_ERROR; /* over KEXD_FLEET_VALUE_MAX (or no memory): not taken */
    }
  }
  c->state = CMD_DONE;
  uv_cond_broadcast(&f->cond);
  uv_mutex_unlock(&f->mu);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv) {
  if (priv) cmd_finish(ac->data, priv, reply);
}

/* Loop: send what the workers queued; fail it at once when Redis is not up.  Drop a Redis that stopped answering. */
static void on_async(kexd_wake *w) {
  kexd_fleet *f = w->data;
  uv_mutex_lock(&f->mu);
  fleet_cmd_t *q = f->queue;
  f->queue = NULL;
  f->queue_tail = &f->queue;
  uv_mutex_unlock(&f->mu);
  if (f->state == CONN_UP && f->ac && atomic_load(&f->slow_in_row) >= KEXD_FLEET_SLOW_TIMEOUTS) {
    KEX_DEBUG("fleet cache %s: %d commands in a row unanswered", f->where, KEXD_FLEET_SLOW_TIMEOUTS);
    atomic_store(&f->slow_in_row, 0);
    f->dropping = "not answering";
    redisAsyncFree(f->ac); /* calls on_disconnect (went_down) and fails every pending command */
    f->dropping = NULL;
    if (f->state != CONN_DOWN) went_down(f, "not answering");
  }
  while (q) {
    fleet_cmd_t *next = q->next;
    if (!(f->state == CONN_UP && f->ac &&
          redisAsyncCommandArgv(f->ac, on_reply, q, q->argc, q->argv, q->argvlen) == REDIS_OK))
      cmd_finish(f, q, NULL);
    q = next;
  }
}

static bool is_up(kexd_fleet *f) {
  uv_mutex_lock(&f->mu);
  bool up = f->state == CONN_UP;
  uv_mutex_unlock(&f->mu);
  return up;
}

/*
 * Worker: run one command (argv[argc], copied) and wait at most
 * --fleet-timeout.  0 with *out (the caller frees it with kex_free after
 * reading; out->str too) when Redis answered; KEX_EUNAVAILABLE (not up, or
 * the connection dropped), KEX_EDEADLINE (no answer in time; counted toward
 * KEXD_FLEET_SLOW_TIMEOUTS), KEX_ENOMEM.  Failures are counted in errors.
 */
static int fleet_cmd(kexd_fleet *f, int argc, const char *const *argv, const size_t *argvlen, fleet_cmd_t **out) {
  size_t total = 0;
  *out = NULL;
  for (int i = 0; i < argc; i++) total += argvlen[i];
  fleet_cmd_t *c = kex_calloc(1, sizeof *c + total + 1);
  if (!c) return KEX_ENOMEM;
  char *p = c->data;
  c->argc = argc;
  for (int i = 0; i < argc; i++) {
    memcpy(p, argv[i], argvlen[i]);
    c->argv[i] = p;
    c->argvlen[i] = argvlen[i];
    p += argvlen[i];
  }
  uv_mutex_lock(&f->mu);
  if (f->state != CONN_UP) {
    uv_mutex_unlock(&f->mu);
    kex_free(c);
    return KEX_EUNAVAILABLE;
  }
  *f->queue_tail = c;
  f->queue_tail = &c->next;
  kexd_wake_send(&f->wake);
  uint64_t deadline = uv_hrtime() + f->timeout_ms * 1000000ull;
  while (c->state == CMD_QUEUED) {
    uint64_t now = uv_hrtime();
    if (now >= deadline || uv_cond_timedwait(&f->cond, &f->mu, deadline - now) == UV_ETIMEDOUT) {
      if (c->state == CMD_QUEUED) break;
    }
  }
  int rc;
  if (c->state == CMD_QUEUED) {
    c->state = CMD_ABANDONED; /* the loop frees it */
    uv_mutex_unlock(&f->mu);
    atomic_fetch_add(&f->slow_in_row, 1);
    atomic_fetch_add(&f->errors, 1);
    kexd_wake_send(&f->wake); /* let the loop judge whether Redis stopped answering */
    return KEX_EDEADLINE;
  }
  uv_mutex_unlock(&f->mu);
  atomic_store(&f->slow_in_row, 0);
  if ((rc = c->rc) == 0 && c->type == REDIS_REPLY_ERROR) {
    KEX_DEBUG("fleet cache %s: %.*s: %s", f->where, (int)argvlen[0], argv[0], c->str ? c->str : "error");
    rc = KEX_EIO;
  }
  if (rc) {
    atomic_fetch_add(&f->errors, 1);
    kex_free(c->str);
    kex_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

static void cmd_free(fleet_cmd_t *c) {
  if (!c) return;
  kex_free(c->str);
  kex_free(c);
}

/* Worker: a command whose reply only matters as success (EVAL, SET). */
static int fleet_cmd_strs(kexd_fleet *f, int argc, const char *const *argv, fleet_cmd_t **out) {
  size_t lens[CMD_ARGS];
  for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
  return fleet_cmd(f, argc, argv, lens, out);
}

/* ---- leases: the renewal timer (loop) ---- */

static void on_renew(uv_timer_t *t) {
  kexd_fleet *f = t->data;
  char ms[24];
  snprintf(ms, sizeof ms, "%" PRIu64, f->lease_ms);
  uv_mutex_lock(&f->mu);
  for (kexd_fleet_lease *l = f->leases; l && f->state == CONN_UP && f->ac; l = l->next) {
    const char *argv[] = {"EVAL", renew_script, "1", l->key, l->token, ms};
    size_t lens[6];
    for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
    redisAsyncCommandArgv(f->ac, on_reply, NULL, 6, argv, lens); /* the reply is not needed */
  }
  uv_mutex_unlock(&f->mu);
}

/* ---- the beam hook (the search's thread) ---- */

/* A token no other holder has: host, pid and 16 random bytes. */
static void make_token(char *buf, size_t len) {
  uint8_t r[16];
  char hex[33], host[64] = "";
  if (RAND_bytes(r, sizeof r) != 1) /* never expected; still unique enough with the time */
    for (size_t i = 0; i < sizeof r; i++) r[i] = (uint8_t)(uv_hrtime() >> (i % 8 * 8));
  kex_hex(r, sizeof r, hex);
  gethostname(host, sizeof host - 1);
  snprintf(buf, len, "%.40s:%ld:%s", host, (long)getpid(), hex);
}

/*
 * GET the result key (get_script: a value over KEXD_FLEET_VALUE_MAX bytes
 * is refused by its length, never sent): 0 when a value for exactly key
 * validated and is now in o->cache (a hit once the search found it usable:
 * hook_checked); KEX_ENOTFOUND when there is none or it was refused
 * (counted in rejected, logged); other codes when Redis did not answer.
 */
static int take_result(kexd_fleet *f, const kex_beam_opts *o, const kex_cache_beam_key *key, const char *rkey) {
  char max[24];
  snprintf(max, sizeof max, "%u", KEXD_FLEET_VALUE_MAX);
  const char *argv[] = {"EVAL", get_script, "1", rkey, max};
  fleet_cmd_t *c;
  kex_error err = {0};
  int rc = fleet_cmd_strs(f, 5, argv, &c);
  if (rc) return rc;
  if (c->type == REDIS_REPLY_NIL) {
    rc = KEX_ENOTFOUND;
  } else if (c->type != REDIS_REPLY_STRING) {
    atomic_fetch_add(&f->rejected, 1);
    if (c->type == REDIS_REPLY_INTEGER)
      KEX_WARN("fleet cache %s: value of %s refused unread: %lld bytes (limit %u)", f->where, rkey, c->integer,
               KEXD_FLEET_VALUE_MAX);
    else
      KEX_WARN("fleet cache %s: value of %s refused: not a string (%.200s)", f->where, rkey, c->str ? c->str : "");
    rc = KEX_ENOTFOUND;
  } else if ((rc = kex_cache_import_line(o->cache, c->str, c->len, key, &err)) == 0) {
    /* counted in hook_checked */
  } else {
    atomic_fetch_add(&f->rejected, 1);
    KEX_WARN("fleet cache %s: value of %s refused: %.300s", f->where, rkey, err.msg);
    rc = KEX_ENOTFOUND;
  }
  cmd_free(c);
  return rc;
}

/*
 * take_script: 0 when this search holds the lease now (a lease with no
 * expiry, or one longer than any kexd sets, is taken over: counted in
 * rejected), KEX_ENOTFOUND when another holds it, else Redis failed.
 */
static int take_lease(kexd_fleet *f, kexd_fleet_lease *l) {
  char ms[24], max_ms[24];
  snprintf(ms, sizeof ms, "%" PRIu64, f->lease_ms);
  snprintf(max_ms, sizeof max_ms, "%" PRIu64, (uint64_t)KEXD_FLEET_LEASE_MAX_S * 1000);
  const char *argv[] = {"EVAL", take_script, "1", l->key, l->token, ms, max_ms};
  fleet_cmd_t *c;
  int rc = fleet_cmd_strs(f, 7, argv, &c);
  if (rc) return rc;
  rc = c->type == REDIS_REPLY_INTEGER && c->integer >= 1 ? 0 : KEX_ENOTFOUND;
  if (c->type == REDIS_REPLY_INTEGER && c->integer == 2) {
    atomic_fetch_add(&f->rejected, 1);
    KEX_WARN("fleet cache %s: lease %s had no expiry (or one longer than %us): taken over", f->where, l->key,
             (unsigned)KEXD_FLEET_LEASE_MAX_S);
  }
  cmd_free(c);
  return rc;
}

static int hook_fetch(void *arg, const kex_beam_opts *o, const kex_cache_beam_key *key) {
  kexd_fleet_search *s = arg;
  kexd_fleet *f = s->f;
  char rkey[KEXD_FLEET_KEY_MAX];
  kexd_fleet_lease *l = NULL;
  bool waited = false, blocked = false;
  kex_pool *pool = o->pool ? o->pool : kex_pool_process();
  int rc;
  if (!is_up(f)) return KEX_EUNAVAILABLE;
  if ((rc = kexd_fleet_key(key, "beam", rkey, sizeof rkey))) return rc;
  if (!(l = kex_calloc(1, sizeof *l))) return KEX_ENOMEM;
  if ((rc = kexd_fleet_key(key, "lease", l->key, sizeof l->key))) goto out;
  make_token(l->token, sizeof l->token);
  uint64_t t0 = uv_hrtime();
  for (;;) {
    if ((rc = take_result(f, o, key, rkey)) != KEX_ENOTFOUND) goto out; /* a hit, or Redis failed: search locally */
    if ((rc = take_lease(f, l)) == 0) {
      if (waited) atomic_fetch_add(&f->takeovers, 1);
      uv_mutex_lock(&f->mu);
      l->next = f->leases;
      f->leases = l;
      uv_mutex_unlock(&f->mu);
      s->lease = l;
      l = NULL;
      rc = KEX_ENOTFOUND; /* search, holding the lease */
      goto out;
    }
    if (rc != KEX_ENOTFOUND) goto out;
    if (!waited) {
      waited = true;
      atomic_fetch_add(&f->lease_waits, 1);
      KEX_DEBUG("fleet cache: %s is being searched by a peer: waiting for its result", rkey);
      blocked = kex_pool_block(pool); /* the wait does not hold a worker: a stand-in runs others' work */
    }
    if ((uv_hrtime() - t0) / 1000000 >= f->wait_max_ms || (o->cancelled && o->cancelled(o->cancel_arg))) {
      rc = KEX_EDEADLINE; /* search here (a cancelled one stops at once) */
      goto out;
    }
    usleep(KEXD_FLEET_POLL_MS * 1000);
  }
out:
  if (blocked) kex_pool_unblock(pool);
  kex_free(l);
  return rc;
}

/* The search found the fetched entry usable (a hit) or not (dropped: counted in rejected, and searched). */
static void hook_checked(void *arg, const kex_beam_opts *o, const kex_cache_beam_key *key, bool usable) {
  kexd_fleet_search *s = arg;
  (void)o;
  (void)key;
  atomic_fetch_add(usable ? &s->f->hits : &s->f->rejected, 1);
}

/* Keep a result to publish when Redis is back (the oldest dropped past KEXD_FLEET_UNSENT_MAX); takes line. */
static void keep_unsent(kexd_fleet *f, const char *rkey, char *line) {
  kexd_fleet_unsent *u = kex_calloc(1, sizeof *u);
  if (!u) {
    kex_free(line);
    return;
  }
  snprintf(u->key, sizeof u->key, "%s", rkey);
  u->line = line;
  uv_mutex_lock(&f->mu);
  u->next = f->unsent;
  f->unsent = u;
  kexd_fleet_unsent *drop = NULL;
  if (++f->nunsent > KEXD_FLEET_UNSENT_MAX) { /* the oldest is the last */
    kexd_fleet_unsent **pp = &f->unsent;
    while ((*pp)->next) pp = &(*pp)->next;
    drop = *pp;
    *pp = NULL;
    f->nunsent--;
  }
  uv_mutex_unlock(&f->mu);
  if (drop) {
    kex_free(drop->line);
    kex_free(drop);
  }
}

/* Loop, Redis up again: SET every kept result (the replies are not needed). */
static void publish_unsent(kexd_fleet *f) {
  uv_mutex_lock(&f->mu);
  kexd_fleet_unsent *u = f->unsent;
  f->unsent = NULL;
  f->nunsent = 0;
  uv_mutex_unlock(&f->mu);
  uint32_t n = 0;
  while (u) {
    kexd_fleet_unsent *next = u->next;
    const char *argv[] = {"SET", u->key, u->line};
    size_t lens[] = {3, strlen(u->key), strlen(u->line)};
    if (f->ac && redisAsyncCommandArgv(f->ac, on_reply, NULL, 3, argv, lens) == REDIS_OK) {
      atomic_fetch_add(&f->published, 1);
      n++;
    }
    kex_free(u->line);
    kex_free(u);
    u = next;
  }
  if (n) KEX_INFO("fleet cache %s: published %u results searched while it was unreachable", f->where, n);
}

static void hook_done(void *arg, const kex_beam_opts *o, const kex_cache_beam_key *key, bool stored) {
  kexd_fleet_search *s = arg;
  kexd_fleet *f = s->f;
  fleet_cmd_t *c = NULL;
  char rkey[KEXD_FLEET_KEY_MAX];
  char *line = NULL;
  kex_error err = {0};
  if (stored && kexd_fleet_key(key, "beam", rkey, sizeof rkey) == 0) {
    if (kex_cache_beam_line(o->cache, key, &line, &err)) {
      KEX_WARN("fleet cache: cannot encode the result to publish: %s", err.msg);
    } else if (strlen(line) > KEXD_FLEET_VALUE_MAX) {
      KEX_WARN("fleet cache: result of %s not published: %zu bytes (limit %u)", rkey, strlen(line),
               KEXD_FLEET_VALUE_MAX);
    } else if (!is_up(f)) {
      keep_unsent(f, rkey, line); /* published when Redis is back (publish_unsent) */
      line = NULL;
    } else {
      const char *argv[] = {"SET", rkey, line};
      if (fleet_cmd_strs(f, 3, argv, &c) == 0) atomic_fetch_add(&f->published, 1);
      cmd_free(c);
      c = NULL;
    }
    kex_free(line);
  }
  kexd_fleet_lease *l = s->lease;
  if (!l) return;
  s->lease = NULL;
  uv_mutex_lock(&f->mu);
  for (kexd_fleet_lease **pp = &f->leases; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      break;
    }
  uv_mutex_unlock(&f->mu);
  const char *argv[] = {"EVAL", release_script, "1", l->key, l->token};
  fleet_cmd_strs(f, 5, argv, &c); /* a failure leaves the lease to expire */
  cmd_free(c);
  kex_free(l);
}

const kex_beam_remote *kexd_fleet_hook(kexd *d, kexd_fleet_search *s) {
  memset(s, 0, sizeof *s);
  if (!d->fleet) return NULL;
  s->f = d->fleet;
  s->hook.fetch = hook_fetch;
  s->hook.checked = hook_checked;
  s->hook.done = hook_done;
  s->hook.arg = s;
  return &s->hook;
}

/* ---- setup ---- */

int kexd_fleet_start(kexd *d) {
  kex_error err = {0};
  kexd_fleet *f;
  d->fleet = NULL;
  if (!d->cfg.fleet_cache || !*d->cfg.fleet_cache) return 0;
  if (!(f = kex_calloc(1, sizeof *f))) return KEX_ENOMEM;
  if (kexd_fleet_parse_url(d->cfg.fleet_cache, &f->url, &err)) {
    KEX_ERROR("--fleet-cache: %s", err.msg);
    kex_free(f);
    return KEX_EINVAL;
  }
  f->d = d;
  f->loop = d->loop;
  snprintf(f->where, sizeof f->where, "%s:%d/%d", f->url.host, f->url.port, f->url.db);
  f->lease_ms = (uint64_t)(d->cfg.fleet_lease_s * 1000);
  f->timeout_ms = (uint64_t)(d->cfg.fleet_timeout_s * 1000);
  if (!f->timeout_ms) f->timeout_ms = 1;
  f->wait_max_ms = (uint64_t)(d->cfg.fleet_wait_max_s * 1000);
  f->backoff_s = KEXD_FLEET_BACKOFF_MIN_S;
  f->queue_tail = &f->queue;
  f->state = CONN_DOWN;
  if (uv_mutex_init(&f->mu)) {
    kex_free(f);
    return KEX_ENOMEM;
  }
  if (uv_cond_init(&f->cond)) {
    uv_mutex_destroy(&f->mu);
    kex_free(f);
    return KEX_ENOMEM;
  }
  if (kexd_wake_init(f->loop, &f->wake, on_async, f) < 0) {
    uv_cond_destroy(&f->cond);
    uv_mutex_destroy(&f->mu);
    kex_free(f);
    return KEX_ENOMEM;
  }
  uv_timer_init(f->loop, &f->retry);
  uv_timer_init(f->loop, &f->renew);
  f->retry.data = f->renew.data = f;
  f->handles_open = true;
  uint64_t every = f->lease_ms / 3 ? f->lease_ms / 3 : 1;
  uv_timer_start(&f->renew, on_renew, every, every);
  d->fleet = f;
  KEX_INFO("fleet cache %s: lease %.1f s, timeout %.3f s, wait at most %.0f s for a peer's search", f->where,
           d->cfg.fleet_lease_s, d->cfg.fleet_timeout_s, d->cfg.fleet_wait_max_s);
  fleet_connect(f);
  return 0;
}

void kexd_fleet_close(kexd *d) {
  kexd_fleet *f = d->fleet;
  if (!f || !f->handles_open) return;
  uv_mutex_lock(&f->mu);
  f->state = CONN_CLOSED; /* workers stop queueing: they search locally */
  uv_mutex_unlock(&f->mu);
  on_async(&f->wake);     /* fails what is queued */
  if (f->ac) {
    redisAsyncContext *ac = f->ac;
    f->ac = NULL;
    redisAsyncFree(ac);   /* fails what is in flight */
  }
  f->handles_open = false;
  kexd_wake_close(&f->wake, NULL);
  uv_close((uv_handle_t *)&f->retry, NULL);
  uv_close((uv_handle_t *)&f->renew, NULL);
}

void kexd_fleet_free(kexd *d) {
  kexd_fleet *f = d->fleet;
  if (!f) return;
  while (f->leases) { /* none: every search is back; kept for safety */
    kexd_fleet_lease *l = f->leases;
    f->leases = l->next;
    kex_free(l);
  }
  while (f->unsent) { /* never published: Redis did not come back */
    kexd_fleet_unsent *u = f->unsent;
    f->unsent = u->next;
    kex_free(u->line);
    kex_free(u);
  }
  uv_cond_destroy(&f->cond);
  uv_mutex_destroy(&f->mu);
  kex_free(f);
  d->fleet = NULL;
}

void kexd_fleet_stats(const kexd *d, kexd_fleet_counters *out) {
  kexd_fleet *f = d->fleet;
  memset(out, 0, sizeof *out);
  out->state = "off";
  if (!f) return;
  uv_mutex_lock(&f->mu);
  out->state = state_names[f->state];
  out->up = f->state == CONN_UP;
  uv_mutex_unlock(&f->mu);
  out->hits = atomic_load(&f->hits);
  out->published = atomic_load(&f->published);
  out->lease_waits = atomic_load(&f->lease_waits);
  out->takeovers = atomic_load(&f->takeovers);
  out->rejected = atomic_load(&f->rejected);
  out->errors = atomic_load(&f->errors);
  out->outages = atomic_load(&f->outages);
}

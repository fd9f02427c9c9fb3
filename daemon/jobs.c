/*
 * jobs.c - the job table: tokens from OpenSSL's DRBG, lookup, lease expiry,
 * and each job's buffers and memory accounting.
 *
 * Tokens and buffer handles are secrets: a lookup must not tell a caller
 * how close a guess came.  The table's jobs and each job's buffers are
 * unordered arrays, each with an index (core/dict) whose hash is SipHash-2-4
 * under a random per-process key (OpenSSL's EVP_MAC): a caller cannot choose
 * which entries a guess meets, and the one candidate with an equal hash is
 * compared with CRYPTO_memcmp (constant time).  So a lookup costs the same
 * few hundred nanoseconds with 1 buffer or 65,536 (the linear constant-time
 * scan it replaces took milliseconds there, per handle, on the loop thread).
 * A token on the wire carries the node that holds the job after its secret
 * ("HEX.NAME@ADVERTISE", the fleet's routing key); only the HEX part is
 * secret.  The lease sweep runs on a uv
 * timer a few times per lease (at least every second) and closes every job
 * whose last call is older than the lease.  Closing a job cancels its
 * queued device work and drops its buffers (the device memory is freed by
 * the runner once no Download holds a buffer any more).  Loop thread only.
 */
#include "daemon/jobs.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/kept.h"

#define JOBS_SWEEP_MIN_MS 100
#define JOBS_SWEEP_MAX_MS 1000

static void job_free(kexd_job *job) {
  if (!job) return;
  kex_dict_free(&job->buf_index);
  kexd_kept_free_all(job);
  kex_free(job->bufs);
  kex_free(job->name);
  kex_free(job->peer);
  kex_free(job);
}

/*
 * n random bytes into raw.  0 or KEX_EIO.  OpenSSL's DRBG (a CSPRNG seeded
 * and reseeded from the kernel) rather than one getrandom(2) per handle:
 * every Submit draws an output handle, and on a virtual machine that system
 * call was one of the dearest of the ~20 a Submit costs.
 */
static int random_bytes(unsigned char *raw, size_t n) {
  return n <= INT_MAX && RAND_bytes(raw, (int)n) == 1 ? 0 : KEX_EIO;
}

/* 128 random bits as 32 hex characters and a NUL into out.  0 or KEX_EIO. */
static int random_hex(char out[KEXD_TOKEN_LEN + 1]) {
  static const char hex[] = "0123456789abcdef";
  unsigned char raw[KEXD_TOKEN_BYTES];
  if (random_bytes(raw, sizeof raw) < 0) return KEX_EIO;
  for (size_t i = 0; i < sizeof raw; i++) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  out[KEXD_TOKEN_LEN] = '\0';
  memset(raw, 0, sizeof raw);
  return 0;
}

/*
 * The job's log id: the first 8 hex characters of the SHA-256 of its token.
 * Logs name jobs by it; it tells nothing about the token (not even a
 * prefix), yet one job's lines share it.  0 or KEX_EIO.
 */
static int log_id_of(const char token[KEXD_TOKEN_LEN + 1], char out[9]) {
  static const char hex[] = "0123456789abcdef";
  unsigned char h[EVP_MAX_MD_SIZE];
  unsigned int hl = 0;
  if (!EVP_Digest(token, KEXD_TOKEN_LEN, h, &hl, EVP_sha256(), NULL) || hl < 4) return KEX_EIO;
  for (int i = 0; i < 4; i++) {
    out[2 * i] = hex[h[i] >> 4];
    out[2 * i + 1] = hex[h[i] & 15];
  }
  out[8] = '\0';
  return 0;
}

/* ---- the secret indexes (see the file comment) ---- */

/* One entry of an index: a token's or handle's characters, inside the object they name. */
typedef struct secret_entry {
  const char *secret; /* KEXD_TOKEN_LEN characters (a handle is as long) */
  void *obj;          /* the kexd_job or kexd_buffer */
} secret_entry;

static bool secret_eq(const void *entry, const void *probe) {
  return CRYPTO_memcmp(((const secret_entry *)entry)->secret, probe, KEXD_TOKEN_LEN) == 0;
}

static const kex_dict_type secret_index = {sizeof(secret_entry), secret_eq, 16};

/* SipHash-2-4 (64 bits) of a secret under the table's key; 0 when OpenSSL fails (then every secret shares one
   probe run: slower, still right; kexd_jobs_init checks that it works). */
static uint64_t secret_hash(const kexd_jobs *j, const char *secret) {
  size_t size = sizeof(uint64_t), n = 0;
  OSSL_PARAM params[2] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size), OSSL_PARAM_construct_end()};
  unsigned char out[sizeof(uint64_t)];
  uint64_t h;
  if (EVP_MAC_init(j->sip, j->sip_key, sizeof j->sip_key, params) != 1 ||
      EVP_MAC_update(j->sip, (const unsigned char *)secret, KEXD_TOKEN_LEN) != 1 ||
      EVP_MAC_final(j->sip, out, &n, sizeof out) != 1 || n != sizeof out)
    return 0;
  memcpy(&h, out, sizeof h);
  return h;
}

/* The object an index holds under `secret` (exactly KEXD_TOKEN_LEN characters, else none), or NULL. */
static void *index_find(const kexd_jobs *j, const kex_dict *d, const char *secret) {
  if (!secret || strnlen(secret, KEXD_TOKEN_LEN + 1) != KEXD_TOKEN_LEN) return NULL;
  const secret_entry *e = kex_dict_find(d, secret_hash(j, secret), secret);
  return e ? e->obj : NULL;
}

/* Add obj under its secret (which lives as long as obj).  0, KEX_ENOMEM, or KEX_EINTERNAL when the secret is
   there already (2^-128 for random ones: believed impossible). */
static int index_add(const kexd_jobs *j, kex_dict *d, const char *secret, void *obj) {
  bool found;
  secret_entry *e = kex_dict_insert(d, secret_hash(j, secret), secret, &found);
  if (!e) return KEX_ENOMEM;
  if (found) return KEX_EINTERNAL;
  e->secret = secret;
  e->obj = obj;
  return 0;
}

static void index_remove(const kexd_jobs *j, kex_dict *d, const char *secret) {
  secret_entry *e = kex_dict_find(d, secret_hash(j, secret), secret);
  if (e) kex_dict_remove(d, e);
}

/* A buffer joins (held) or leaves its job: the job's byte count follows. */
static void account_held(kexd_job *job, const kexd_buffer *b, bool held) {
  job->bytes_held = held ? job->bytes_held + b->bytes : job->bytes_held - b->bytes;
}

/*
 * A buffer is made (charged) or its last reference went: its tenant's and
 * its device's byte counts follow.  Charged for its whole life, not only
 * while a job holds it: a Download may read it after a Free or CloseJob,
 * and the bytes it pins stay the tenant's until then.
 */
static void account_alive(kexd_jobs *j, kexd_buffer *b, bool alive) {
  uint64_t *counts[2] = {b->use ? &b->use->bytes_held : NULL,
                         b->device < KEXD_MAX_DEVICES ? &j->held_by_device[b->device] : NULL};
  for (int k = 0; k < 2; k++)
    if (counts[k]) *counts[k] = alive ? *counts[k] + b->bytes : *counts[k] - b->bytes;
  if (!alive) b->use = NULL;
}

/* Remove jobs[i] (order is not kept): cancel its queued work, drop its buffers. */
static void jobs_remove(kexd_jobs *j, uint32_t i) {
  kexd_job *job = j->jobs[i];
  void (*on_close)(void *) = job->on_close;
  job->on_close = NULL;
  if (on_close) on_close(job->on_close_ud); /* a HoldJob call ends with the job */
  if (j->removed) j->removed(j->removed_ud, job->id); /* e.g. its searches waiting for a slot end */
  if (job->use) {
    job->use->jobs--;
    job->use->bytes_reserved -= job->bytes_reserved;
  }
  while (job->nbufs) { /* first: their FREE items join the job's flow, which cancelling keeps */
    kexd_buffer *b = job->bufs[--job->nbufs];
    account_held(job, b, false);
    kexd_buffer_unref(j, b);
  }
  if (j->disp) kexd_dispatch_cancel_job(j->disp, job->id);
  index_remove(j, &j->index, job->token);
  job_free(job);
  j->jobs[i] = j->jobs[--j->njobs];
  if (i < j->njobs) j->jobs[i]->slot = i;
}

static void on_sweep(uv_timer_t *t) {
  kexd_jobs *j = t->data;
  uint64_t now = uv_now(j->loop), lease_ms = (uint64_t)(j->lease_s * 1000);
  for (uint32_t i = 0; i < j->njobs;) {
    kexd_job *job = j->jobs[i];
    if (!job->held && !job->searches && now - job->last_used_ms >= lease_ms) {
      kex_log(KEX_LOG_INFO, job->log_id, 0, "job \"%s\" expired: idle for %.1f s (lease %.1f s)", job->name,
              (now - job->last_used_ms) / 1e3, j->lease_s);
      j->expired++;
      jobs_remove(j, i);
    } else {
      i++;
    }
  }
}

int kexd_jobs_init(kexd_jobs *j, uv_loop_t *loop, double lease_s, uint32_t max_jobs, kexd_dispatch *disp) {
  uint64_t period;
  memset(j, 0, sizeof *j);
  j->loop = loop;
  j->disp = disp;
  j->lease_s = lease_s;
  j->max_jobs = max_jobs ? max_jobs : KEXD_LIMIT_JOBS;
  j->evict_idle_ms = (uint64_t)(KEXD_DEFAULT_JOB_EVICT_IDLE_S * 1000);
  j->index = kex_dict_make(&secret_index);
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
  j->sip = mac ? EVP_MAC_CTX_new(mac) : NULL;
  EVP_MAC_free(mac); /* the context keeps its own reference */
  if (!j->sip || random_bytes(j->sip_key, sizeof j->sip_key) < 0 || !secret_hash(j, "0123456789abcdef0123456789abcdef")) {
    KEX_ERROR("jobs: OpenSSL's SipHash (EVP_MAC \"SIPHASH\") or its random generator is not available");
    EVP_MAC_CTX_free(j->sip);
    j->sip = NULL;
    return KEX_EINTERNAL;
  }
  if (uv_timer_init(loop, &j->timer) < 0) return KEX_EINTERNAL;
  j->timer.data = j;
  j->timer_open = true;
  period = (uint64_t)(lease_s * 1000 / 4);
  if (period < JOBS_SWEEP_MIN_MS) period = JOBS_SWEEP_MIN_MS;
  if (period > JOBS_SWEEP_MAX_MS) period = JOBS_SWEEP_MAX_MS;
  uv_timer_start(&j->timer, on_sweep, period, period);
  return 0;
}

void kexd_jobs_close(kexd_jobs *j) {
  while (j->njobs) jobs_remove(j, j->njobs - 1);
  kex_free(j->jobs);
  j->jobs = NULL;
  j->cap = 0;
  kex_dict_free(&j->index);
  EVP_MAC_CTX_free(j->sip);
  j->sip = NULL;
  for (uint32_t i = 0; i < j->nuses; i++) kex_free(j->uses[i]);
  kex_free(j->uses);
  j->uses = NULL;
  j->nuses = j->capuses = 0;
  if (j->timer_open) {
    j->timer_open = false;
    uv_close((uv_handle_t *)&j->timer, NULL);
  }
}

/*
 * The index of the job with this token ("HEX", or "HEX" plus this node's
 * suffix), or -1.  The suffix names the node (public); only the HEX part is
 * secret and compared in constant time.
 */
static int find_index(const kexd_jobs *j, const char *token) {
  char hex[KEXD_TOKEN_LEN + 1];
  size_t n = token ? strlen(token) : 0;
  if (n < KEXD_TOKEN_LEN || (n > KEXD_TOKEN_LEN && strcmp(token + KEXD_TOKEN_LEN, j->suffix) != 0)) return -1;
  memcpy(hex, token, KEXD_TOKEN_LEN);
  hex[KEXD_TOKEN_LEN] = '\0';
  const kexd_job *job = index_find(j, &j->index, hex);
  return job ? (int)job->slot : -1;
}

bool kexd_node_field_ok(const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  return n >= 1 && n <= max && strspn(s, KEXD_NODE_CHARS) == n;
}

void kexd_jobs_set_node(kexd_jobs *j, const char *name, const char *advertise) {
  snprintf(j->node, sizeof j->node, "%s", name);
  snprintf(j->advertise, sizeof j->advertise, "%s", advertise);
  snprintf(j->suffix, sizeof j->suffix, ".%s@%s", j->node, j->advertise);
}

void kexd_job_wire_token(const kexd_jobs *j, const kexd_job *job, char out[KEXD_WIRE_TOKEN_MAX + 1]) {
  snprintf(out, KEXD_WIRE_TOKEN_MAX + 1, "%s%s", job->token, j->suffix);
}

/* True when s[0..n) is a decimal port 1..65535 without a leading zero. */
static bool port_ok(const char *s, size_t n) {
  unsigned long v = 0;
  if (n == 0 || n > 5 || s[0] == '0') return false;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (unsigned long)(s[i] - '0');
  }
  return v <= 65535;
}

bool kexd_address_ok(const char *addr) {
  const char *host, *colon;
  size_t n;
  if (!kexd_node_field_ok(addr, KEXD_ADVERTISE_MAX)) return false;
  if (strncmp(addr, "unix:/", 6) == 0) return addr[6] != '\0' && !strstr(addr, "//");
  if (strncmp(addr, "dns:///", 7) == 0) addr += 7;
  else if (strncmp(addr, "ipv4:", 5) == 0 || strncmp(addr, "ipv6:", 5) == 0) addr += 5;
  host = addr;
  if (*host == '[') { /* [IPv6]:PORT */
    const char *rb = strchr(host, ']');
    if (!rb || rb == host + 1 || strspn(host + 1, "0123456789abcdefABCDEF:.") != (size_t)(rb - host - 1) ||
        rb[1] != ':')
      return false;
    return port_ok(rb + 2, strlen(rb + 2));
  }
  if (!(colon = strchr(host, ':')) || colon == host) return false; /* HOST:PORT, one colon */
  n = (size_t)(colon - host);
  if (strspn(host, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_") != n || host[0] == '.' ||
      host[0] == '-' || strstr(host, ".."))
    return false;
  return port_ok(colon + 1, strlen(colon + 1));
}

const char *kexd_jobs_token_owner(const kexd_jobs *j, const char *token) {
  const char *owner, *at;
  char name[KEXD_NODE_NAME_MAX + 1];
  if (!token || strlen(token) <= KEXD_TOKEN_LEN + 1 || token[KEXD_TOKEN_LEN] != '.') return NULL;
  if (strspn(token, "0123456789abcdef") != KEXD_TOKEN_LEN || strcmp(token + KEXD_TOKEN_LEN, j->suffix) == 0)
    return NULL;
  owner = token + KEXD_TOKEN_LEN + 1;
  if (!(at = strchr(owner, '@')) || (size_t)(at - owner) > KEXD_NODE_NAME_MAX) return NULL;
  memcpy(name, owner, (size_t)(at - owner));
  name[at - owner] = '\0';
  if (!kexd_node_field_ok(name, KEXD_NODE_NAME_MAX) || !kexd_address_ok(at + 1)) return NULL; /* malformed */
  /* this node's name or address with the rest changed is a damaged token of this node, not another node's */
  if (strcmp(name, j->node) == 0 || strcmp(at + 1, j->advertise) == 0) return NULL;
  return owner;
}

/*
 * The table is full: close tenant use's job idle longest, when it has been
 * idle at least j->evict_idle_ms (its lease would end first anyway).  Never
 * another tenant's: one tenant filling the table cannot make room by
 * closing the jobs of others.  True when a slot was freed.
 */
static bool evict_idlest(kexd_jobs *j, const kexd_tenant_use *use) {
  uint64_t now;
  int best = -1;
  uv_update_time(j->loop);
  now = uv_now(j->loop);
  for (uint32_t i = 0; i < j->njobs; i++) {
    const kexd_job *c = j->jobs[i];
    if (!c->held && !c->searches && c->use == use && (best < 0 || c->last_used_ms < j->jobs[best]->last_used_ms)) best = (int)i;
  }
  if (best < 0 || now - j->jobs[best]->last_used_ms < j->evict_idle_ms) return false;
  kex_log(KEX_LOG_INFO, j->jobs[best]->log_id, 0,
          "job \"%s\" expired early: the job table is full (--max-jobs %u) and of its tenant's jobs it was idle "
          "longest (%.1f s)",
          j->jobs[best]->name, j->max_jobs, (now - j->jobs[best]->last_used_ms) / 1e3);
  j->expired++;
  j->evicted++;
  jobs_remove(j, (uint32_t)best);
  return true;
}

kexd_tenant_use *kexd_jobs_tenant_use(kexd_jobs *j, const char *name) {
  kexd_tenant_use *u;
  for (uint32_t i = 0; i < j->nuses; i++)
    if (strcmp(j->uses[i]->name, name) == 0) return j->uses[i];
  if (kex_grow(&j->uses, j->nuses, &j->capuses, sizeof *j->uses, 8)) return NULL;
  if (!(u = kex_calloc(1, sizeof *u))) return NULL;
  snprintf(u->name, sizeof u->name, "%s", name);
  j->uses[j->nuses++] = u;
  return u;
}

/* Bring u's bucket up to now_ms: the refill since compile_left_ms, at most a full bucket. */
static void budget_refill(kexd_tenant_use *u, uint64_t now_ms) {
  if (u->compile_budget_s > 0 && now_ms > u->compile_left_ms) {
    u->compile_left_s += (double)(now_ms - u->compile_left_ms) / 1e3 * u->compile_budget_s / KEXD_COMPILE_BUDGET_PERIOD_S;
    if (u->compile_left_s > u->compile_budget_s) u->compile_left_s = u->compile_budget_s;
  }
  if (now_ms > u->compile_left_ms) u->compile_left_ms = now_ms;
}

void kexd_tenant_budget_set(kexd_tenant_use *u, double budget_s, bool from_flag, uint64_t now_ms) {
  budget_refill(u, now_ms);
  if (!(u->compile_budget_s > 0)) u->compile_left_s = budget_s; /* was unlimited: full */
  else if (u->compile_left_s > budget_s) u->compile_left_s = budget_s;
  u->compile_budget_s = budget_s > 0 ? budget_s : 0;
  u->compile_budget_flag = from_flag;
}

double kexd_tenant_budget_wait(kexd_tenant_use *u, uint64_t now_ms) {
  double wait;
  if (!(u->compile_budget_s > 0)) return 0;
  budget_refill(u, now_ms);
  if (u->compile_left_s > 0) return 0;
  wait = -u->compile_left_s * KEXD_COMPILE_BUDGET_PERIOD_S / u->compile_budget_s;
  return wait > 1e-3 ? wait : 1e-3; /* exactly empty: the next millisecond's refill */
}

void kexd_tenant_budget_charge(kexd_tenant_use *u, double seconds, uint64_t now_ms) {
  if (!(u->compile_budget_s > 0)) return;
  budget_refill(u, now_ms);
  u->compile_left_s -= seconds;
}

int kexd_jobs_open(kexd_jobs *j, const char *name, uint32_t weight, uint64_t memory_limit, const char *peer,
                   kexd_tenant_use *use, kexd_job **out, kex_error *err) {
  kexd_job *job = NULL;
  uint32_t same_peer = 0;
  int rc = 0;
  *out = NULL;
  if (!name) name = "";
  if (!peer) peer = "";
  if (strlen(name) > KEXD_JOB_NAME_MAX)
    return kex_err_set(err, KEX_EINVAL, "the name is %zu bytes, more than the limit of %d", strlen(name),
                       KEXD_JOB_NAME_MAX);
  for (uint32_t i = 0; i < j->njobs; i++)
    if (strcmp(j->jobs[i]->peer, peer) == 0 && j->jobs[i]->use == use) same_peer++;
  if (j->max_per_peer && same_peer >= j->max_per_peer && strcmp(use->name, KEXD_ANONYMOUS_TENANT) == 0)
    return kex_err_set(err, KEX_ELIMIT, "%s holds %u jobs open, the limit per client address (--max-jobs-per-peer)",
                       peer, same_peer);
  if (j->njobs >= j->max_jobs && !evict_idlest(j, use))
    return kex_err_set(err, KEX_ELIMIT,
                       "%u jobs are open, the limit (--max-jobs), and none of tenant '%s' has been idle for %.1f s "
                       "(--job-evict-idle) to make room",
                       j->njobs, use->name, j->evict_idle_ms / 1e3);
  if (kex_grow(&j->jobs, j->njobs, &j->cap, sizeof *j->jobs, 16))
    return kex_err_set(err, KEX_ENOMEM, "out of memory for the job table");
  if (!(job = kex_calloc(1, sizeof *job)) || !(job->name = kex_strdup(name)) || !(job->peer = kex_strdup(peer))) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory for a job");
    goto out;
  }
  if ((rc = random_hex(job->token)) < 0) {
    kex_err_set(err, rc, "the random generator failed");
    goto out;
  }
  if ((rc = log_id_of(job->token, job->log_id)) < 0) {
    kex_err_set(err, rc, "OpenSSL's SHA-256 failed");
    goto out;
  }
  job->buf_index = kex_dict_make(&secret_index);
  job->table = j;
  if ((rc = index_add(j, &j->index, job->token, job)) < 0) { /* EINTERNAL: 2^-128, believed impossible */
    kex_err_set(err, rc, rc == KEX_ENOMEM ? "out of memory for the job table" : "a token collided");
    goto out;
  }
  job->id = ++j->next_id;
  job->weight = weight ? weight : 1;
  job->memory_limit = memory_limit;
  job->max_buffers = j->max_buffers ? j->max_buffers : KEXD_LIMIT_BUFFERS_PER_JOB;
  job->opened_ms = job->last_used_ms = uv_now(j->loop);
  job->use = use;
  use->jobs++;
  use->jobs_opened++;
  job->slot = j->njobs;
  j->jobs[j->njobs++] = job;
  j->opened++;
  *out = job;
  job = NULL;
out:
  job_free(job);
  return rc;
}

kexd_job *kexd_jobs_find(kexd_jobs *j, const char *token) {
  int i = find_index(j, token);
  if (i < 0) return NULL;
  uv_update_time(j->loop);
  j->jobs[i]->last_used_ms = uv_now(j->loop);
  return j->jobs[i];
}

int kexd_jobs_close_job(kexd_jobs *j, const char *token) {
  int i = find_index(j, token);
  if (i < 0) return KEX_ENOTFOUND;
  kex_log(KEX_LOG_INFO, j->jobs[i]->log_id, 0, "job \"%s\" closed", j->jobs[i]->name);
  j->closed++;
  jobs_remove(j, (uint32_t)i);
  return 0;
}

int kexd_jobs_close_id(kexd_jobs *j, uint64_t id, const char *why) {
  for (uint32_t i = 0; i < j->njobs; i++)
    if (j->jobs[i]->id == id) {
      kex_log(KEX_LOG_INFO, j->jobs[i]->log_id, 0, "job \"%s\" closed: %s", j->jobs[i]->name, why);
      j->closed++;
      jobs_remove(j, i);
      return 0;
    }
  return KEX_ENOTFOUND;
}

kexd_job *kexd_jobs_find_id(kexd_jobs *j, uint64_t id) {
  for (uint32_t i = 0; i < j->njobs; i++)
    if (j->jobs[i]->id == id) return j->jobs[i];
  return NULL;
}

/* ---- buffers ---- */

int kexd_job_reserve(kexd_job *job, uint64_t bytes, kex_error *err) {
  uint64_t would = job->bytes_held + job->bytes_reserved + bytes;
  if (job->nbufs >= job->max_buffers)
    return kex_err_set(err, KEX_ELIMIT, "job '%s' holds %u buffers, the limit (--max-buffers-per-job)", job->name,
                       job->nbufs);
  if (job->memory_limit && (would > job->memory_limit || would < bytes))
    return kex_err_set(err, KEX_ELIMIT, "job '%s' would hold %" PRIu64 " bytes, over its memory limit of %" PRIu64
                       " bytes", job->name, would, job->memory_limit);
  if (job->use && job->use->max_bytes) {
    uint64_t tw = job->use->bytes_held + job->use->bytes_reserved + bytes;
    if (tw > job->use->max_bytes || tw < bytes) {
      job->use->refused++;
      return kex_err_set(err, KEX_ELIMIT, "tenant '%s' would hold %" PRIu64 " bytes, over its limit max_bytes %" PRIu64
                         " (--auth)", job->use->name, tw, job->use->max_bytes);
    }
  }
  job->bytes_reserved += bytes;
  if (job->use) job->use->bytes_reserved += bytes;
  return 0;
}

void kexd_job_unreserve(kexd_job *job, uint64_t bytes) {
  uint64_t give = bytes > job->bytes_reserved ? job->bytes_reserved : bytes;
  job->bytes_reserved -= give;
  if (job->use) job->use->bytes_reserved -= give;
}

int kexd_job_add_buffer(kexd_jobs *j, kexd_job *job, kex_buffer *dev_buf, uint32_t device, kex_dtype dtype,
                        const int64_t *shape, uint8_t ndim, uint64_t bytes, kexd_buffer **out) {
  kexd_buffer *b;
  int rc;
  (void)j;
  *out = NULL;
  if (ndim > KEX_MAX_DIMS) return KEX_EINVAL;
  if (kex_grow(&job->bufs, job->nbufs, &job->capbufs, sizeof *job->bufs, 8)) return KEX_ENOMEM;
  if (!(b = kex_calloc(1, sizeof *b))) return KEX_ENOMEM;
  if ((rc = random_hex(b->handle)) < 0 || (rc = index_add(j, &job->buf_index, b->handle, b)) < 0) {
    kex_free(b); /* EINTERNAL: a handle collided, 2^-128: believed impossible */
    return rc;
  }
  b->refs = 1;
  b->dtype = dtype;
  b->ndim = ndim;
  if (ndim) memcpy(b->shape, shape, ndim * sizeof *shape);
  b->bytes = bytes;
  b->device = device;
  b->job = job->id;
  b->weight = job->weight;
  b->use = job->use;
  b->dev_buf = dev_buf;
  b->slot = job->nbufs;
  job->bufs[job->nbufs++] = b;
  account_held(job, b, true);
  account_alive(j, b, true);
  *out = b;
  return 0;
}

kexd_buffer *kexd_job_find_buffer(kexd_job *job, const char *handle) {
  return index_find(job->table, &job->buf_index, handle);
}

int kexd_job_free_buffer(kexd_jobs *j, kexd_job *job, const char *handle) {
  kexd_buffer *b = index_find(j, &job->buf_index, handle);
  if (!b) return KEX_ENOTFOUND;
  index_remove(j, &job->buf_index, b->handle);
  job->bufs[b->slot] = job->bufs[--job->nbufs];
  job->bufs[b->slot]->slot = b->slot;
  account_held(job, b, false);
  kexd_buffer_unref(j, b);
  return 0;
}

/* Move obj's entry in index d from its secret (the characters at `secret`) to `fixed`, written over them. */
static int index_rekey(const kexd_jobs *j, kex_dict *d, char *secret, const char *fixed, void *obj) {
  if (!fixed || strnlen(fixed, KEXD_TOKEN_LEN + 1) != KEXD_TOKEN_LEN) return KEX_EINVAL;
  if (index_find(j, d, fixed)) return index_find(j, d, fixed) == obj ? 0 : KEX_EINTERNAL;
  index_remove(j, d, secret);
  memcpy(secret, fixed, KEXD_TOKEN_LEN);
  return index_add(j, d, secret, obj);
}

int kexd_jobs_set_token(kexd_jobs *j, kexd_job *job, const char *token) {
  int rc = index_rekey(j, &j->index, job->token, token, job);
  if (rc == 0) memcpy(job->log_id, job->token, 8);
  return rc;
}

int kexd_job_set_handle(kexd_jobs *j, kexd_job *job, kexd_buffer *b, const char *handle) {
  return index_rekey(j, &job->buf_index, b->handle, handle, b);
}

void kexd_buffer_ref(kexd_buffer *b) { b->refs++; }

static void buffer_freed(kexd_work *w) {
  kexd_buffer *b = w->ud;
  kex_free(b);
}

void kexd_buffer_unref(kexd_jobs *j, kexd_buffer *b) {
  int rc;
  if (!b || --b->refs) return;
  j->buffers_freed++;
  account_alive(j, b, false);
  if (!b->dev_buf) {
    kex_free(b);
    return;
  }
  memset(&b->free_work, 0, sizeof b->free_work);
  b->free_work.kind = KEXD_WORK_FREE;
  /* a buffer that outlived its job (a Download held it) is freed on the daemon's own flow, 0 */
  b->free_work.job = kexd_jobs_find_id(j, b->job) ? b->job : 0;
  b->free_work.weight = b->free_work.job ? b->weight : 1;
  b->free_work.must_run = true;
  b->free_work.buf = b->dev_buf;
  b->free_work.done = buffer_freed;
  b->free_work.ud = b;
  if (!j->disp || (rc = kexd_dispatch_post(j->disp, b->device, &b->free_work)) < 0) {
    /* only after the runners stopped: the process is exiting and takes the memory with it */
    KEX_WARN("a buffer of %" PRIu64 " bytes (job %" PRIu64 ") not freed on its device: the dispatcher is stopped",
             b->bytes, b->job);
    kex_free(b);
  }
}

void kexd_jobs_free_device_buffer(kexd_jobs *j, kex_buffer *dev_buf, uint32_t device, uint64_t job, uint32_t weight) {
  kexd_buffer *b;
  if (!dev_buf) return;
  if (!(b = kex_calloc(1, sizeof *b))) {
    KEX_ERROR("out of memory freeing a device buffer: %zu bytes stay allocated", kex_buffer_size(dev_buf));
    return;
  }
  b->refs = 1;
  b->device = device;
  b->job = job;
  b->weight = weight;
  b->dev_buf = dev_buf;
  kexd_buffer_unref(j, b);
}

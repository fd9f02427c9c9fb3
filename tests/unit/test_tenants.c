/*
 * test_tenants.c - kexd's tenants: the --auth file (daemon/auth.c), the
 * caller check the method table runs before every handler
 * (daemon/request.c, kexd_rpc_check_caller) and a tenant's quotas.
 *
 * The file is loaded strictly: each malformed entry is refused with a
 * message naming the file and the entry, every limit on both sides; a token
 * is found by its SHA-256 and by nothing else.  With --auth, every method
 * kexd registers refuses a call without a known token (UNAUTHENTICATED,
 * saying why), a user calling an admin method and a tenant whose may_tune
 * is false calling Tune (PERMISSION_DENIED), and lets the rest through,
 * giving back the reference on the table each call took.  The quotas
 * (max_jobs, max_weight, max_bytes, max_beam, may_tune for a beam Submit)
 * hold on both sides and one tenant's jobs are unknown to another.
 * Searches share a device's slots (daemon/searches.c): with every slot
 * held a search waits in line, and a freed slot goes to the payer charged
 * least slot seconds over its weight, not to the first in line; the line's
 * limits (--max-search-queue, --max-search-queue-per-payer) hold on both
 * sides; a call that ends while waiting leaves the line and frees the
 * request it kept; one whose job closed meanwhile ends NOT_FOUND when its
 * slot comes, and gives the slot on.
 *
 * The daemon's own objects on an in-process kexd (tests/fuzz/fuzzkexd.c)
 * with fakecall.c's calls in place of gRPC.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <grpc/status.h>
#include <openssl/evp.h>

#include "core/alloc.h"
#include "core/log.h"
#include "daemon/auth.h"
#include "daemon/rpc.h"
#include "tests/fuzz/fakecall.h"
#include "tests/fuzz/fuzzkexd.h"

static char dir[] = "/tmp/kex-test-tenants-XXXXXX";
static char path[sizeof dir + 16];

/* The SHA-256 of token as 64 hex digits (what `kex auth token` writes into the file). */
static void sha_hex(const char *token, char out[2 * KEXD_SHA256_LEN + 1]) {
  unsigned char h[KEXD_SHA256_LEN];
  unsigned int n = 0;
  assert_true(EVP_Digest(token, strlen(token), h, &n, EVP_sha256(), NULL) && n == sizeof h);
  for (size_t i = 0; i < sizeof h; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Write text as the --auth file and load it: kexd_auth_load's result, *a and why filled. */
static int load(const char *text, kexd_auth **a, char *why, size_t cap) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
  why[0] = '\0';
  return kexd_auth_load(path, a, why, cap);
}

/* alice's token is "abc": its SHA-256 is FIPS 180-2's first example, so the file holds the hash of the raw token */
#define ALICE_SHA "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

/* The table the caller and quota tests use: ops (admin), alice (a user with every limit), carol (may_tune false). */
static kexd_auth *load_table(void) {
  char ops[65], carol[65], text[1024], why[512];
  kexd_auth *a = NULL;
  sha_hex("ops-token", ops);
  sha_hex("carol-token", carol);
  snprintf(text, sizeof text,
           "{\"tenants\": [{\"name\": \"ops\", \"role\": \"admin\", \"token_sha256\": \"%s\"},"
           " {\"name\": \"alice\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\", \"max_jobs\": 2,"
           " \"max_bytes\": 1000, \"max_weight\": 4, \"max_beam\": 2},"
           " {\"name\": \"carol\", \"role\": \"user\", \"token_sha256\": \"%s\", \"may_tune\": false}]}",
           ops, carol);
  if (load(text, &a, why, sizeof why) != 0) fail_msg("the table did not load: %s", why);
  return a;
}

static int setup(void **state) {
  (void)state;
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/auth.json", dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(path);
  return rmdir(dir);
}

static void test_load_valid(void **state) {
  (void)state;
  kexd_auth *a = load_table();
  assert_int_equal(a->n, 3);
  assert_int_equal(a->refs, 1);
  const kexd_tenant *ops = &a->tenants[0], *alice = &a->tenants[1], *carol = &a->tenants[2];
  assert_string_equal(ops->name, "ops");
  assert_int_equal(ops->role, KEXD_ROLE_ADMIN);
  assert_string_equal(kexd_role_name(ops->role), "admin");
  assert_int_equal(ops->max_jobs, 0); /* left out: unlimited */
  assert_true(ops->may_tune);         /* left out: may tune */
  assert_int_equal(alice->role, KEXD_ROLE_USER);
  assert_string_equal(kexd_role_name(alice->role), "user");
  assert_int_equal(alice->max_jobs, 2);
  assert_int_equal(alice->max_bytes, 1000);
  assert_int_equal(alice->max_weight, 4);
  assert_int_equal(alice->max_beam, 2);
  assert_false(carol->may_tune);
  assert_ptr_equal(alice->table, a);
  /* each token finds its tenant */
  assert_ptr_equal(kexd_auth_check(a, "abc", 3), alice);
  assert_ptr_equal(kexd_auth_check(a, "ops-token", 9), ops);
  assert_ptr_equal(kexd_auth_check(a, "carol-token", 11), carol);
  kexd_auth_unref(a);
}

static void test_wrong_tokens(void **state) {
  (void)state;
  kexd_auth *a = load_table();
  /* the wrong secret, a prefix, a longer one, another case, empty; the length is the caller's */
  static const char *const wrong[] = {"abd", "ab", "abcd", "ABC", "", " abc", ALICE_SHA};
  for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++)
    if (kexd_auth_check(a, wrong[i], strlen(wrong[i]))) fail_msg("token \"%s\" found a tenant", wrong[i]);
  assert_null(kexd_auth_check(a, "abcd", 2));
  assert_non_null(kexd_auth_check(a, "abcd", 3));
  assert_null(kexd_auth_check(NULL, "abc", 3)); /* no table: nobody */
  kexd_auth_unref(a);
}

/* One tenant entry around `fields` (name "t", role user, a good hash unless fields say otherwise). */
static void entry(char *out, size_t cap, const char *fields) {
  snprintf(out, cap, "{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"%s}]}",
           fields);
}

static void test_load_malformed(void **state) {
  (void)state;
  static const struct {
    const char *text;   /* the file, or NULL: entry() around `fields` */
    const char *fields;
    const char *why;    /* in the message */
  } bad[] = {
      {"not json", NULL, "line 1"},
      {"{\"tenants\": {}}", NULL, "one key, \"tenants\""},
      {"{\"tenants\": [], \"more\": 1}", NULL, "one key, \"tenants\""},
      {"[]", NULL, "one key, \"tenants\""},
      {"{\"tenants\": [1]}", NULL, "tenants[0]: not an object"},
      {"{\"tenants\": [{\"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"}]}", NULL, "tenants[0]: \"name\" must be"},
      {"{\"tenants\": [{\"name\": \"a b\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"}]}", NULL,
       "\"name\" must be"},
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"root\", \"token_sha256\": \"" ALICE_SHA "\"}]}", NULL,
       "tenants[0] (\"t\"): \"role\" must be"},
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"abc\"}]}", NULL, "token_sha256"},
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": "
       "\"ga7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\"}]}", NULL, "token_sha256"},
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "0\"}]}", NULL, "token_sha256"},
      {NULL, ", \"max_job\": 1", "unknown key \"max_job\""},
      {NULL, ", \"max_jobs\": -1", "max_jobs must be an integer in [0, 4294967295]"},
      {NULL, ", \"max_jobs\": 4294967296", "max_jobs must be an integer"},
      {NULL, ", \"max_weight\": 4294967296", "max_weight must be an integer"},
      {NULL, ", \"max_beam\": 1.5", "max_beam must be an integer"},
      {NULL, ", \"max_bytes\": \"1\"", "max_bytes must be an integer"},
      {NULL, ", \"max_compile_seconds\": 0", "max_compile_seconds must be a number of seconds in (0, 1e+06]"},
      {NULL, ", \"max_compile_seconds\": -0.5", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": 1000000.001", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": 1e300", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": \"60\"", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": true", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": null", "max_compile_seconds must be a number"},
      {NULL, ", \"max_compile_seconds\": NaN", "line 1"}, /* not JSON */
      {NULL, ", \"may_tune\": 1", "\"may_tune\" must be true or false"},
      {NULL, ", \"name\": \"u\"", "line 1"}, /* a key twice */
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"},"
       " {\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"}]}", NULL,
       "tenants[1] (\"t\"): the name is used by tenants[0] too"},
      {"{\"tenants\": [{\"name\": \"t\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"},"
       " {\"name\": \"u\", \"role\": \"admin\", \"token_sha256\": \"" ALICE_SHA "\"}]}", NULL,
       "tenants[1] (\"u\"): the token_sha256 of tenants[0] (\"t\") too"},
  };
  char text[1024], why[512], prefix[sizeof path + 16];
  snprintf(prefix, sizeof prefix, "--auth %s: ", path);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kexd_auth *a = (kexd_auth *)1;
    if (!bad[i].text) entry(text, sizeof text, bad[i].fields);
    if (load(bad[i].text ? bad[i].text : text, &a, why, sizeof why) != -1) fail_msg("loaded: %s", bad[i].text ? bad[i].text : text);
    assert_null(a);
    if (!strstr(why, bad[i].why) || strncmp(why, prefix, strlen(prefix)) != 0)
      fail_msg("case %zu: \"%s\" does not name the file and say \"%s\"", i, why, bad[i].why);
  }
  kexd_auth *a = NULL;
  assert_int_equal(kexd_auth_load("/nonexistent/auth.json", &a, why, sizeof why), -1);
  assert_non_null(strstr(why, "cannot open"));
  /* the limits, each at its largest, load */
  entry(text, sizeof text, ", \"max_jobs\": 4294967295, \"max_weight\": 4294967295, \"max_beam\": 4294967295, "
                           "\"max_bytes\": 9223372036854775807, \"may_tune\": true");
  assert_int_equal(load(text, &a, why, sizeof why), 0);
  assert_int_equal(a->tenants[0].max_jobs, UINT32_MAX);
  assert_int_equal(a->tenants[0].max_bytes, INT64_MAX);
  assert_true(a->tenants[0].max_compile_seconds == 0); /* left out: --tenant-compile-budget */
  kexd_auth_unref(a);
  /* the compile budget at its largest (an integer), and a small fraction of a second */
  entry(text, sizeof text, ", \"max_compile_seconds\": 1000000");
  assert_int_equal(load(text, &a, why, sizeof why), 0);
  assert_true(a->tenants[0].max_compile_seconds == KEXD_COMPILE_BUDGET_MAX_S);
  kexd_auth_unref(a);
  entry(text, sizeof text, ", \"max_compile_seconds\": 0.001");
  assert_int_equal(load(text, &a, why, sizeof why), 0);
  assert_true(a->tenants[0].max_compile_seconds == 0.001);
  kexd_auth_unref(a);
}

/* A name of n characters: 1-KEXD_TENANT_NAME_MAX of [A-Za-z0-9._-] load, n beyond does not. */
static void test_name_limit(void **state) {
  (void)state;
  char name[KEXD_TENANT_NAME_MAX + 2], text[1024], why[512];
  kexd_auth *a = NULL;
  memset(name, 'n', sizeof name - 1);
  name[KEXD_TENANT_NAME_MAX] = '\0';
  name[0] = '.', name[1] = '_', name[2] = '-', name[3] = 'Z', name[4] = '9';
  snprintf(text, sizeof text, "{\"tenants\": [{\"name\": \"%s\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"}]}",
           name);
  assert_int_equal(load(text, &a, why, sizeof why), 0);
  assert_string_equal(a->tenants[0].name, name);
  kexd_auth_unref(a);
  name[KEXD_TENANT_NAME_MAX] = 'n';
  name[KEXD_TENANT_NAME_MAX + 1] = '\0';
  snprintf(text, sizeof text, "{\"tenants\": [{\"name\": \"%s\", \"role\": \"user\", \"token_sha256\": \"" ALICE_SHA "\"}]}",
           name);
  assert_int_equal(load(text, &a, why, sizeof why), -1);
  assert_non_null(strstr(why, "\"name\" must be 1-64 characters"));
}

/* KEXD_AUTH_MAX_TENANTS entries load; one more does not. */
static void test_tenant_count_limit(void **state) {
  (void)state;
  for (uint32_t n = KEXD_AUTH_MAX_TENANTS; n <= KEXD_AUTH_MAX_TENANTS + 1; n++) {
    size_t cap = 64 + (size_t)n * 160, len;
    char *text = kex_malloc(cap), why[512];
    kexd_auth *a = NULL;
    assert_non_null(text);
    len = (size_t)snprintf(text, cap, "{\"tenants\": [");
    for (uint32_t i = 0; i < n; i++)
      len += (size_t)snprintf(text + len, cap - len, "%s{\"name\": \"t%u\", \"role\": \"user\", \"token_sha256\": \"%064x\"}",
                              i ? ", " : "", i, i);
    snprintf(text + len, cap - len, "]}");
    int rc = load(text, &a, why, sizeof why);
    kex_free(text);
    if (n == KEXD_AUTH_MAX_TENANTS) {
      assert_int_equal(rc, 0);
      assert_int_equal(a->n, n);
      kexd_auth_unref(a);
    } else {
      assert_int_equal(rc, -1);
      assert_non_null(strstr(why, "more than 4096 tenants"));
    }
  }
}

/* A file of KEXD_LIMIT_AUTH_BYTES loads; one byte more does not (padded with white space). */
static void test_file_size_limit(void **state) {
  (void)state;
  for (size_t size = KEXD_LIMIT_AUTH_BYTES; size <= KEXD_LIMIT_AUTH_BYTES + 1; size++) {
    char *text = kex_malloc(size + 1), why[512];
    kexd_auth *a = NULL;
    assert_non_null(text);
    memset(text, ' ', size);
    memcpy(text, "{\"tenants\": []}", 15);
    text[size] = '\0';
    int rc = load(text, &a, why, sizeof why);
    kex_free(text);
    if (size == KEXD_LIMIT_AUTH_BYTES) {
      assert_int_equal(rc, 0);
      assert_int_equal(a->n, 0);
      kexd_auth_unref(a);
    } else {
      assert_int_equal(rc, -1);
      assert_non_null(strstr(why, "larger than 4194304 bytes"));
    }
  }
}

/* "/kex.v1.Kex/Tune" -> "Tune" */
static const char *short_name(const char *p) { return strrchr(p, '/') + 1; }

static bool is_admin_method(const char *p) {
  return !strcmp(p, "/kex.v1.Kex/ExportCache") || !strcmp(p, "/kex.v1.Kex/ImportCache") ||
         !strcmp(p, "/kex.v1.Kex/DeleteCache");
}

/*
 * The gate of one call of `path` with `authorization`: -1 when it let the call through, else the status it
 * finished it with (details into *details).  The end hook runs either way, as the server's does.
 */
static int gate(kexd *d, const char *path, const char *authorization, char *details, size_t cap) {
  kexd_call c;
  int rc;
  memset(&c, 0, sizeof c);
  c.method = path;
  c.refs = 1;
  c.authorization = authorization;
  rc = kexd_rpc_gate(&c, d) ? -1 : c.status;
  assert_true(rc == -1 ? !c.finished : c.finished && c.refs == 0);
  snprintf(details, cap, "%s", c.details);
  kexd_rpc_call_end(&c, rc < 0 ? 0 : rc, d);
  return rc;
}

/* Every method kexd registers, with each kind of caller: who gets through, and what the others are told. */
static void test_roles_per_method(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  const fuzz_method *m;
  char details[512], long_token[KEXD_AUTH_TOKEN_MAX + 8];
  fuzz_server_forget();
  assert_int_equal(kexd_rpc_register(d), 0);
  uint32_t n = fuzz_server_methods(&m);
  assert_true(n >= 18);
  /* without --auth every method is open */
  for (uint32_t i = 0; i < n; i++) assert_int_equal(gate(d, m[i].path, NULL, details, sizeof details), -1);
  d->auth = load_table();
  memset(long_token, 'x', sizeof long_token - 1);
  long_token[sizeof long_token - 1] = '\0';
  memcpy(long_token, "Bearer ", 7);
  uint64_t unauth0 = d->unauthenticated, denied0 = d->permission_denied, unauth = 0, denied = 0;
  for (uint32_t i = 0; i < n; i++) {
    const char *p = m[i].path;
    bool anyone = strncmp(p, "/grpc.health.v1.Health/", 23) == 0;
    static const struct {
      const char *authorization, *why;
    } refused[] = {
        {NULL, "no authorization metadata"},
        {"Basic ops-token", "authorization is not \"Bearer TOKEN\""},
        {"Bearer wrong", "an unknown token"},
        {"Bearer ", "an unknown token"},
        {"Bearer abc ", "an unknown token"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
      int rc = gate(d, p, refused[k].authorization, details, sizeof details);
      if (anyone) {
        assert_int_equal(rc, -1); /* the health check: load balancers send no token */
        continue;
      }
      if (rc != GRPC_STATUS_UNAUTHENTICATED || !strstr(details, refused[k].why) || !strstr(details, short_name(p)))
        fail_msg("%s with authorization \"%s\": status %d \"%s\"", p, refused[k].authorization ? refused[k].authorization : "(none)",
                 rc, details);
      assert_null(strstr(details, "ops-token")); /* a token is never echoed */
      unauth++;
    }
    if (!anyone) {
      assert_int_equal(gate(d, p, long_token, details, sizeof details), GRPC_STATUS_UNAUTHENTICATED);
      assert_non_null(strstr(details, "too long"));
      unauth++;
    }
    /* the admin, in either case of "Bearer", may call everything */
    assert_int_equal(gate(d, p, "Bearer ops-token", details, sizeof details), -1);
    assert_int_equal(gate(d, p, "bearer ops-token", details, sizeof details), -1);
    /* a user: not the admin methods */
    int rc = gate(d, p, "Bearer abc", details, sizeof details);
    if (is_admin_method(p)) {
      if (rc != GRPC_STATUS_PERMISSION_DENIED || !strstr(details, "tenant 'alice' is a user; it is for admins"))
        fail_msg("alice calls %s: status %d \"%s\"", p, rc, details);
      denied++;
    } else if (rc != -1) {
      fail_msg("alice may call %s: status %d \"%s\"", p, rc, details);
    }
    /* may_tune false: not Tune either */
    rc = gate(d, p, "Bearer carol-token", details, sizeof details);
    if (is_admin_method(p) || !strcmp(p, "/kex.v1.Kex/Tune")) {
      assert_int_equal(rc, GRPC_STATUS_PERMISSION_DENIED);
      if (!is_admin_method(p)) assert_non_null(strstr(details, "tenant 'carol' may not run beam searches"));
      denied++;
    } else if (rc != -1) {
      fail_msg("carol may call %s: status %d \"%s\"", p, rc, details);
    }
  }
  assert_int_equal(d->unauthenticated - unauth0, unauth);
  assert_int_equal(d->permission_denied - denied0, denied);
  assert_int_equal(denied, 3 + 4); /* alice: 3 admin methods; carol: those and Tune */
  /* an unknown path is no one's to call without a token */
  assert_int_equal(gate(d, "/kex.v1.Kex/Nope", NULL, details, sizeof details), GRPC_STATUS_UNAUTHENTICATED);
  /* every call gave back its reference on the table */
  assert_int_equal(d->auth->refs, 1);
  kexd_auth_unref(d->auth);
  d->auth = NULL;
  kex_free(d->rpc_routes);
  d->rpc_routes = NULL;
}

/* OpenJob as `authorization` with weight w: the status; *job the job it opened (else NULL). */
static int open_job(kexd *d, const char *authorization, uint32_t w, kexd_job **job, char *details, size_t cap) {
  Kex__V1__OpenJobRequest r = KEX__V1__OPEN_JOB_REQUEST__INIT;
  kexd_call c;
  r.name = "quota";
  r.weight = w;
  int rc = fuzz_call_unary(d, &c, "/kex.v1.Kex/OpenJob", authorization, &r.base);
  *job = rc == GRPC_STATUS_OK ? kexd_jobs_find_id(&d->jobs, c.ext.job) : NULL;
  assert_true(rc != GRPC_STATUS_OK || *job);
  snprintf(details, cap, "%s", c.details);
  return rc;
}

static int close_job(kexd *d, const char *authorization, const kexd_job *job) {
  Kex__V1__CloseJobRequest r = KEX__V1__CLOSE_JOB_REQUEST__INIT;
  kexd_call c;
  r.job = (char *)job->token;
  return fuzz_call_unary(d, &c, "/kex.v1.Kex/CloseJob", authorization, &r.base);
}

static void test_quota_jobs(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  kexd_job *a1, *a2, *a3, *o;
  char details[512];
  d->auth = load_table();
  /* max_jobs 2: the third is refused, naming the limit; closing one makes room */
  assert_int_equal(open_job(d, "Bearer abc", 1, &a1, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(open_job(d, "Bearer abc", 1, &a2, details, sizeof details), GRPC_STATUS_OK);
  assert_string_equal(a1->use->name, "alice");
  assert_int_equal(a1->use->jobs, 2);
  assert_int_equal(open_job(d, "Bearer abc", 1, &a3, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(details, "tenant 'alice' holds 2 jobs open, its limit max_jobs"));
  assert_int_equal(a1->use->refused, 1);
  /* another tenant is not counted against alice's limit, and may not touch alice's jobs */
  assert_int_equal(open_job(d, "Bearer ops-token", 1, &o, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(close_job(d, "Bearer carol-token", a1), GRPC_STATUS_NOT_FOUND);
  assert_ptr_equal(kexd_jobs_find_id(&d->jobs, a1->id), a1);
  assert_int_equal(close_job(d, "Bearer abc", a1), GRPC_STATUS_OK);
  assert_int_equal(open_job(d, "Bearer abc", 1, &a3, details, sizeof details), GRPC_STATUS_OK);
  /* max_weight 4: 4 is alice's, 5 is not; the server's --max-weight binds the admin */
  assert_int_equal(close_job(d, "Bearer abc", a3), GRPC_STATUS_OK);
  assert_int_equal(open_job(d, "Bearer abc", 4, &a3, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(a3->weight, 4);
  assert_int_equal(close_job(d, "Bearer abc", a3), GRPC_STATUS_OK);
  assert_int_equal(open_job(d, "Bearer abc", 5, &a3, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(details, "weight 5 is more than tenant 'alice''s limit max_weight 4"));
  kexd_job *big;
  assert_int_equal(open_job(d, "Bearer ops-token", d->cfg.max_weight + 1, &big, details, sizeof details),
                   GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(details, "(--max-weight)"));
  assert_int_equal(open_job(d, "Bearer ops-token", d->cfg.max_weight, &big, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(close_job(d, "Bearer ops-token", big), GRPC_STATUS_OK);
  assert_int_equal(close_job(d, "Bearer ops-token", o), GRPC_STATUS_OK);
  assert_int_equal(close_job(d, "Bearer abc", a2), GRPC_STATUS_OK);
  assert_int_equal(kexd_jobs_tenant_use(&d->jobs, "alice")->jobs, 0);
  assert_int_equal(d->auth->refs, 1);
  kexd_auth_unref(d->auth);
  d->auth = NULL;
}

/* max_bytes counts every job of the tenant, held and reserved together. */
static void test_quota_bytes(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  kexd_job *j1, *j2;
  kex_error err = {0};
  char details[512];
  d->auth = load_table();
  assert_int_equal(open_job(d, "Bearer abc", 1, &j1, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(open_job(d, "Bearer abc", 1, &j2, details, sizeof details), GRPC_STATUS_OK);
  assert_int_equal(j1->use->max_bytes, 1000);
  assert_int_equal(kexd_job_reserve(j1, 600, &err), 0);
  assert_int_equal(kexd_job_reserve(j2, 401, &err), KEX_ELIMIT);
  assert_non_null(strstr(err.msg, "tenant 'alice' would hold 1001 bytes, over its limit max_bytes 1000"));
  assert_int_equal(j2->bytes_reserved, 0);
  assert_int_equal(kexd_job_reserve(j2, 400, &err), 0); /* exactly the limit */
  assert_int_equal(j1->use->bytes_reserved, 1000);
  kexd_job_unreserve(j1, 600);
  assert_int_equal(kexd_job_reserve(j2, 600, &err), 0);
  assert_int_equal(kexd_job_reserve(j1, 1, &err), KEX_ELIMIT);
  /* closing a job gives its reservations back to the tenant */
  assert_int_equal(close_job(d, "Bearer abc", j2), GRPC_STATUS_OK);
  assert_int_equal(kexd_jobs_tenant_use(&d->jobs, "alice")->bytes_reserved, 0);
  assert_int_equal(kexd_job_reserve(j1, 1000, &err), 0);
  assert_int_equal(close_job(d, "Bearer abc", j1), GRPC_STATUS_OK);
  kexd_auth_unref(d->auth);
  d->auth = NULL;
}

/* A search's permission and width (the method table's search column, kexd_rpc_search_begin) for `tenant`. */
static int search(kexd *d, const kexd_tenant *tenant, kexd_job *job, uint32_t width, uint32_t fallback, char *details,
                  size_t cap) {
  Kex__V1__BeamOptions b = KEX__V1__BEAM_OPTIONS__INIT;
  kexd_call c;
  uint32_t w = 0;
  memset(&c, 0, sizeof c);
  c.method = fallback ? "/kex.v1.Kex/Tune" : "/kex.v1.Kex/Submit";
  c.refs = 1;
  c.ext.tenant = tenant;
  kexd_auth_ref(tenant->table);
  b.beam_width = width;
  int rc = kexd_rpc_search_begin(d, &c, job, &b, fallback, "", &w, NULL) == 0 ? -1 : c.status;
  assert_true(rc == -1 ? !c.finished && (!width || w == width) : c.finished);
  snprintf(details, cap, "%s", c.details);
  kexd_rpc_call_end(&c, 0, d); /* gives back the search slot */
  assert_int_equal(d->tunes_active[0], 0);
  return rc;
}

static void test_quota_beam(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  kexd_job *job;
  char details[512];
  d->auth = load_table();
  const kexd_tenant *ops = &d->auth->tenants[0], *alice = &d->auth->tenants[1], *carol = &d->auth->tenants[2];
  assert_int_equal(open_job(d, "Bearer abc", 1, &job, details, sizeof details), GRPC_STATUS_OK);
  /* max_beam 2, for Tune and for a Submit that asks for a search */
  for (uint32_t fallback = 0; fallback <= 2; fallback += 2) {
    assert_int_equal(search(d, alice, job, 2, fallback, details, sizeof details), -1);
    assert_int_equal(search(d, alice, job, 3, fallback, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "beam width 3 is more than tenant 'alice''s limit max_beam 2"));
    /* the server's --max-beam binds everyone */
    assert_int_equal(search(d, ops, job, d->cfg.max_beam, fallback, details, sizeof details), -1);
    assert_int_equal(search(d, ops, job, d->cfg.max_beam + 1, fallback, details, sizeof details),
                     GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "(--max-beam)"));
    /* may_tune false: no search at all, whatever the width */
    assert_int_equal(search(d, carol, job, 1, fallback, details, sizeof details), GRPC_STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(details, "may_tune is false"));
  }
  /* a Submit that asks for no search needs no permission */
  assert_int_equal(search(d, carol, job, 0, 0, details, sizeof details), -1);
  assert_int_equal(close_job(d, "Bearer abc", job), GRPC_STATUS_OK);
  kexd_auth_unref(d->auth);
  d->auth = NULL;
}

/* ---- the search slots and their line (daemon/searches.c) ---- */

static kexd_call *granted[16]; /* the waiting calls whose slot came, in order */
static int ngranted;

static void on_granted(kexd *d, kexd_call *c) {
  (void)d;
  granted[ngranted++] = c;
}

/* A Tune-like search of width 1 for job (no --auth: the job pays) as call c: kexd_rpc_search_begin's result. */
static int search_as(kexd *d, kexd_call *c, kexd_job *job, kexd_search_resume resume) {
  Kex__V1__BeamOptions b = KEX__V1__BEAM_OPTIONS__INIT;
  uint32_t w = 0;
  memset(c, 0, sizeof *c);
  c->method = "/kex.v1.Kex/Tune";
  c->refs = 1;
  c->ext.job = job->id;
  b.beam_width = 1;
  return kexd_rpc_search_begin(d, c, job, &b, 2, "", &w, resume);
}

/* Run the loop until n calls have got their slot (the slot is given on a later turn: the wake). */
static void wait_granted(kexd *d, int n) {
  for (int i = 0; i < 200 && ngranted < n; i++) {
    uv_run(d->loop, UV_RUN_NOWAIT);
    if (ngranted < n) usleep(1000);
  }
  assert_int_equal(ngranted, n);
}

/* Hold for ms, then end call c (its slot given back, charged the time it held it). */
static void hold_then_end(kexd *d, kexd_call *c, int ms) {
  usleep((useconds_t)ms * 1000);
  kexd_rpc_call_end(c, 0, d);
}

static kexd_job *anon_job(kexd *d, uint32_t weight) {
  kexd_job *job;
  char details[512];
  assert_int_equal(open_job(d, NULL, weight, &job, details, sizeof details), GRPC_STATUS_OK);
  return job;
}

/*
 * With one slot: a freed slot goes to the payer charged least, not the first in line (job 1 waits twice,
 * job 2 once: 1, 2, 1), and the charge is slot seconds over the job's weight (job 4 of weight 10 goes again
 * before job 3 of weight 1, which held the slot as long).
 */
static void test_search_line_fair(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  uint32_t max0 = d->cfg.max_tunes_per_device;
  kexd_job *j0 = anon_job(d, 1), *j1 = anon_job(d, 1), *j2 = anon_job(d, 1), *j3 = anon_job(d, 1),
           *j4 = anon_job(d, 10);
  kexd_call c0, c1, c2, c3, b1, b2, a1, a2;
  uint32_t running, waiting;
  d->cfg.max_tunes_per_device = 1;
  ngranted = 0;
  assert_int_equal(search_as(d, &c0, j0, on_granted), 0);
  assert_int_equal(search_as(d, &c1, j1, on_granted), KEXD_SEARCH_WAITING);
  assert_int_equal(search_as(d, &c2, j1, on_granted), KEXD_SEARCH_WAITING);
  assert_int_equal(search_as(d, &c3, j2, on_granted), KEXD_SEARCH_WAITING);
  assert_false(c1.finished || c2.finished || c3.finished);
  kexd_search_counts(d, 0, &running, &waiting);
  assert_int_equal(running, 1);
  assert_int_equal(waiting, 3);
  kexd_rpc_call_end(&c0, 0, d);
  assert_int_equal(ngranted, 0); /* not inside the end of the call that freed it */
  wait_granted(d, 1);
  assert_ptr_equal(granted[0], &c1); /* payers level: the first in line */
  hold_then_end(d, &c1, 5);
  wait_granted(d, 2);
  assert_ptr_equal(granted[1], &c3); /* job 1 was charged for c1's time: job 2 goes first */
  hold_then_end(d, &c3, 5);
  wait_granted(d, 3);
  assert_ptr_equal(granted[2], &c2);
  /* weights: job 3 (1) and job 4 (10) each hold the slot ~30 ms; job 4 is charged a tenth of it */
  assert_int_equal(search_as(d, &b1, j3, on_granted), KEXD_SEARCH_WAITING);
  assert_int_equal(search_as(d, &b2, j3, on_granted), KEXD_SEARCH_WAITING);
  assert_int_equal(search_as(d, &a1, j4, on_granted), KEXD_SEARCH_WAITING);
  assert_int_equal(search_as(d, &a2, j4, on_granted), KEXD_SEARCH_WAITING);
  hold_then_end(d, &c2, 1);
  wait_granted(d, 4);
  assert_ptr_equal(granted[3], &b1);
  hold_then_end(d, &b1, 30);
  wait_granted(d, 5);
  assert_ptr_equal(granted[4], &a1);
  hold_then_end(d, &a1, 30);
  wait_granted(d, 6);
  assert_ptr_equal(granted[5], &a2); /* equal weights would give b2 here */
  hold_then_end(d, &a2, 1);
  wait_granted(d, 7);
  assert_ptr_equal(granted[6], &b2);
  kexd_rpc_call_end(&b2, 0, d);
  kexd_search_counts(d, 0, &running, &waiting);
  assert_int_equal(running + waiting, 0);
  assert_int_equal(d->tunes_active[0], 0);
  kexd_job *jobs[] = {j0, j1, j2, j3, j4};
  for (int i = 0; i < 5; i++) assert_int_equal(close_job(d, NULL, jobs[i]), GRPC_STATUS_OK);
  d->cfg.max_tunes_per_device = max0;
}

/* A Tune request for job as the method table gets it: packed into buf, its length returned. */
static size_t tune_request(const kexd_job *job, uint8_t *buf, size_t cap) {
  Kex__V1__TuneRequest r = KEX__V1__TUNE_REQUEST__INIT;
  Kex__V1__Graph g = KEX__V1__GRAPH__INIT;
  Kex__V1__BeamOptions b = KEX__V1__BEAM_OPTIONS__INIT;
  r.job = (char *)job->token;
  r.graph = &g;
  b.beam_width = 1;
  r.beam = &b;
  assert_true(protobuf_c_message_get_packed_size(&r.base) <= cap);
  return protobuf_c_message_pack(&r.base, buf);
}

/*
 * The line's limits on both sides, a call that cannot wait, a waiting call that ends (client cancel or deadline:
 * the end hook) leaving the line with its kept request freed, one whose job closed while it waited: NOT_FOUND
 * when its slot comes, which then goes on to the next; and kexd stopping: UNAVAILABLE at once.
 */
static void test_search_line_limits(void **state) {
  (void)state;
  kexd *d = fuzz_kexd();
  uint32_t max0 = d->cfg.max_tunes_per_device, q0 = d->cfg.max_search_queue, pq0 = d->cfg.max_search_queue_per_payer;
  kexd_job *j0 = anon_job(d, 1), *j1 = anon_job(d, 1), *j2 = anon_job(d, 1), *j3 = anon_job(d, 1);
  kexd_call c0, c1, c2, c3, c4, t1, t2;
  uint8_t buf[512];
  uint32_t running, waiting;
  d->cfg.max_tunes_per_device = 1;
  d->cfg.max_search_queue = 2;
  d->cfg.max_search_queue_per_payer = 1;
  ngranted = 0;
  assert_int_equal(search_as(d, &c0, j0, on_granted), 0);
  assert_int_equal(search_as(d, &c1, j1, NULL), -1); /* cannot wait: refused as before */
  assert_int_equal(c1.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(c1.details, "device opencl runs 1 searches"));
  assert_non_null(strstr(c1.details, "(--max-tunes-per-device)"));
  kexd_rpc_call_end(&c1, c1.status, d);
  assert_int_equal(search_as(d, &c1, j1, on_granted), KEXD_SEARCH_WAITING); /* its payer's one place */
  uint64_t refused0 = j1->use->refused;
  assert_int_equal(search_as(d, &c2, j1, on_granted), -1);
  assert_int_equal(c2.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(c2.details, "job 'quota' has 1 searches waiting for a slot on device opencl, the limit "
                                     "(--max-search-queue-per-payer)"));
  assert_int_equal(j1->use->refused, refused0 + 1);
  kexd_rpc_call_end(&c2, c2.status, d);
  assert_int_equal(search_as(d, &c3, j2, on_granted), KEXD_SEARCH_WAITING); /* the line's second place */
  assert_int_equal(search_as(d, &c4, j3, on_granted), -1);
  assert_int_equal(c4.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(c4.details, "and 2 wait for a slot, the limit (--max-search-queue)"));
  kexd_rpc_call_end(&c4, c4.status, d);
  /* c1 ends while waiting (the client cancelled, or its deadline): its place is free for its payer again */
  fuzz_call_cancel(&c1);
  kexd_rpc_call_end(&c1, c1.status, d);
  kexd_search_counts(d, 0, &running, &waiting);
  assert_int_equal(waiting, 1);
  assert_int_equal(d->tunes_active[0], 1);
  /* through the method table: a waiting Tune keeps its request (freed when it ends first: LeakSanitizer) */
  memset(&t1, 0, sizeof t1);
  t1.method = "/kex.v1.Kex/Tune";
  t1.refs = 1;
  kexd_rpc_serve(d, t1.method, &t1, buf, tune_request(j1, buf, sizeof buf));
  assert_false(t1.finished);
  assert_non_null(t1.ext.search.msg);
  fuzz_call_cancel(&t1);
  kexd_rpc_call_end(&t1, t1.status, d);
  assert_int_equal(t1.ext.tune_device, 0);
  /* a Tune whose job closes while it waits: NOT_FOUND when its slot comes, and the slot goes on to c3 */
  memset(&t2, 0, sizeof t2);
  t2.method = "/kex.v1.Kex/Tune";
  t2.refs = 1;
  d->cfg.max_search_queue = 3;
  kexd_rpc_serve(d, t2.method, &t2, buf, tune_request(j1, buf, sizeof buf));
  assert_false(t2.finished);
  assert_int_equal(close_job(d, NULL, j1), GRPC_STATUS_OK);
  kexd_rpc_call_end(&c0, 0, d);
  /* the line: c3 (job 2) then t2 (job 1, which waited first but came back later: level, behind c3) */
  wait_granted(d, 1);
  assert_ptr_equal(granted[0], &c3);
  kexd_rpc_call_end(&c3, 0, d);
  for (int i = 0; i < 200 && !t2.finished; i++) uv_run(d->loop, UV_RUN_NOWAIT), usleep(1000);
  assert_int_equal(t2.status, GRPC_STATUS_NOT_FOUND);
  assert_non_null(strstr(t2.details, "Tune: the job was closed while its search waited for a slot"));
  kexd_rpc_call_end(&t2, t2.status, d);
  /* kexd stopping: a search still in line ends UNAVAILABLE at once (its stop hook), leaving the line */
  assert_int_equal(search_as(d, &c0, j0, on_granted), 0);
  assert_int_equal(search_as(d, &c4, j3, on_granted), KEXD_SEARCH_WAITING);
  assert_non_null(c4.on_stop);
  c4.on_stop(&c4, c4.hook_ud);
  assert_int_equal(c4.status, GRPC_STATUS_UNAVAILABLE);
  assert_non_null(strstr(c4.details, "Tune: kexd is stopping; the search waited for a slot on device opencl"));
  kexd_rpc_call_end(&c4, c4.status, d);
  kexd_rpc_call_end(&c0, 0, d);
  kexd_search_counts(d, 0, &running, &waiting);
  assert_int_equal(running + waiting, 0);
  kexd_job *jobs[] = {j0, j2, j3};
  for (int i = 0; i < 3; i++) assert_int_equal(close_job(d, NULL, jobs[i]), GRPC_STATUS_OK);
  d->cfg.max_tunes_per_device = max0;
  d->cfg.max_search_queue = q0;
  d->cfg.max_search_queue_per_payer = pq0;
}

int main(void) {
  (void)fuzz_kexd();
  kex_log_set_level(KEX_LOG_ERROR); /* after fuzzkexd's own level: the refusals here are expected */
#define T(f) cmocka_unit_test(f)
  const struct CMUnitTest tests[] = {T(test_load_valid), T(test_wrong_tokens), T(test_load_malformed), T(test_name_limit),
                                     T(test_tenant_count_limit), T(test_file_size_limit), T(test_roles_per_method),
                                     T(test_quota_jobs), T(test_quota_bytes), T(test_quota_beam),
                                     T(test_search_line_fair), T(test_search_line_limits)};
  return cmocka_run_group_tests(tests, setup, teardown);
}

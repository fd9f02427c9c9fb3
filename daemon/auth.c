/*
 * auth.c - the --auth file: parse it with jansson, check every entry, and
 * find a tenant by its bearer token (SHA-256 with OpenSSL, compared with
 * CRYPTO_memcmp against every entry so the time says nothing about which
 * entry or byte differed).  Strict: an unknown key, a duplicate name or
 * token, a bad role, hash or limit stops the load with a message naming the
 * entry, so a typo never silently widens a tenant's rights.
 */
#include "daemon/auth.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"

const char *kexd_role_name(kexd_role r) { return r == KEXD_ROLE_ADMIN ? "admin" : "user"; }

void kexd_auth_ref(kexd_auth *a) {
  if (a) a->refs++;
}

void kexd_auth_unref(kexd_auth *a) {
  if (!a || --a->refs) return;
  OPENSSL_cleanse(a->tenants, a->n * sizeof *a->tenants);
  kex_free(a->tenants);
  kex_free(a);
}

/* A name safe in log lines and metric labels: 1-64 of [A-Za-z0-9._-]. */
static bool good_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > KEXD_TENANT_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
          s[i] == '.' || s[i] == '_' || s[i] == '-'))
      return false;
  return true;
}

/* An optional non-negative integer limit up to max into *out (0 when absent).  0 or -1 with why. */
static int get_limit(json_t *e, const char *key, uint64_t max, uint64_t *out, const char *where, char *why,
                     size_t cap) {
  json_t *v = json_object_get(e, key);
  *out = 0;
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max) {
    snprintf(why, cap, "%s: %s must be an integer in [0, %" PRIu64 "] (0 or left out: unlimited)", where, key, max);
    return -1;
  }
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/*
 * The optional compile budget max_compile_seconds into *out (0 when absent):
 * a number in (0, KEXD_COMPILE_BUDGET_MAX_S].  0 or -1 with why.
 */
static int get_budget(json_t *e, const char *key, double *out, const char *where, char *why, size_t cap) {
  json_t *v = json_object_get(e, key);
  double x = v && json_is_number(v) ? json_number_value(v) : 0;
  *out = 0;
  if (!v) return 0;
  if (!json_is_number(v) || !(x > 0 && x <= KEXD_COMPILE_BUDGET_MAX_S)) {
    snprintf(why, cap, "%s: %s must be a number of seconds in (0, %g] (left out: kexd --tenant-compile-budget)", where,
             key, KEXD_COMPILE_BUDGET_MAX_S);
    return -1;
  }
  *out = x;
  return 0;
}

static int parse_tenant(json_t *e, size_t i, kexd_tenant *t, char *why, size_t cap) {
  static const char *const keys[] = {"name", "role", "token_sha256", "max_jobs", "max_bytes",
                                     "max_weight", "max_beam", "max_compile_seconds", "may_tune"};
  char where[128];
  const char *key, *name, *role, *hex;
  json_t *v;
  uint64_t lim;
  long hexlen = 0;
  unsigned char *raw = NULL;
  snprintf(where, sizeof where, "tenants[%zu]", i);
  if (!json_is_object(e)) return snprintf(why, cap, "%s: not an object", where), -1;
  name = json_string_value(json_object_get(e, "name"));
  if (!name || !good_name(name))
    return snprintf(why, cap, "%s: \"name\" must be 1-%d characters of A-Z a-z 0-9 . _ -", where,
                    KEXD_TENANT_NAME_MAX), -1;
  snprintf(where, sizeof where, "tenants[%zu] (\"%s\")", i, name);
  snprintf(t->name, sizeof t->name, "%s", name);
  json_object_foreach(e, key, v) {
    bool known = false;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) known |= strcmp(key, keys[k]) == 0;
    if (!known) return snprintf(why, cap, "%s: unknown key \"%.64s\"", where, key), -1;
  }
  role = json_string_value(json_object_get(e, "role"));
  if (!role || (strcmp(role, "admin") != 0 && strcmp(role, "user") != 0))
    return snprintf(why, cap, "%s: \"role\" must be \"admin\" or \"user\"", where), -1;
  t->role = strcmp(role, "admin") == 0 ? KEXD_ROLE_ADMIN : KEXD_ROLE_USER;
  hex = json_string_value(json_object_get(e, "token_sha256"));
  if (!hex || strlen(hex) != 2 * KEXD_SHA256_LEN || strspn(hex, "0123456789abcdefABCDEF") != strlen(hex) ||
      !(raw = OPENSSL_hexstr2buf(hex, &hexlen)) || hexlen != KEXD_SHA256_LEN) {
    OPENSSL_free(raw);
    return snprintf(why, cap, "%s: \"token_sha256\" must be the SHA-256 of the token as 64 hex digits (kex auth token "
                    "makes one)", where), -1;
  }
  memcpy(t->token_sha256, raw, KEXD_SHA256_LEN);
  OPENSSL_free(raw);
  if (get_limit(e, "max_jobs", UINT32_MAX, &lim, where, why, cap) < 0) return -1;
  t->max_jobs = (uint32_t)lim;
  if (get_limit(e, "max_bytes", INT64_MAX, &t->max_bytes, where, why, cap) < 0) return -1;
  if (get_limit(e, "max_weight", UINT32_MAX, &lim, where, why, cap) < 0) return -1;
  t->max_weight = (uint32_t)lim;
  if (get_limit(e, "max_beam", UINT32_MAX, &lim, where, why, cap) < 0) return -1;
  t->max_beam = (uint32_t)lim;
  if (get_budget(e, "max_compile_seconds", &t->max_compile_seconds, where, why, cap) < 0) return -1;
  v = json_object_get(e, "may_tune");
  if (v && !json_is_boolean(v)) return snprintf(why, cap, "%s: \"may_tune\" must be true or false", where), -1;
  t->may_tune = !v || json_is_true(v);
  return 0;
}

int kexd_auth_load(const char *path, kexd_auth **out, char *why, size_t cap) {
  kexd_auth *a = NULL;
  json_t *root = NULL, *arr;
  json_error_t jerr;
  struct stat st;
  char msg[512];
  int rc = -1;
  *out = NULL;
  msg[0] = '\0';
  if (stat(path, &st) < 0) {
    snprintf(msg, sizeof msg, "cannot open: %s", strerror(errno));
    goto out;
  }
  if (st.st_size > KEXD_LIMIT_AUTH_BYTES) {
    snprintf(msg, sizeof msg, "larger than %u bytes", KEXD_LIMIT_AUTH_BYTES);
    goto out;
  }
  if (!(root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
    snprintf(msg, sizeof msg, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    goto out;
  }
  arr = json_object_get(root, "tenants");
  if (!json_is_object(root) || !json_is_array(arr) || json_object_size(root) != 1) {
    snprintf(msg, sizeof msg, "must be an object with one key, \"tenants\", an array");
    goto out;
  }
  if (json_array_size(arr) > KEXD_AUTH_MAX_TENANTS) {
    snprintf(msg, sizeof msg, "more than %d tenants", KEXD_AUTH_MAX_TENANTS);
    goto out;
  }
  if (!(a = kex_calloc(1, sizeof *a)) ||
      (json_array_size(arr) && !(a->tenants = kex_calloc(json_array_size(arr), sizeof *a->tenants)))) {
    snprintf(msg, sizeof msg, "out of memory");
    goto out;
  }
  a->refs = 1;
  snprintf(a->path, sizeof a->path, "%s", path);
  for (size_t i = 0; i < json_array_size(arr); i++) {
    kexd_tenant *t = &a->tenants[i];
    if (parse_tenant(json_array_get(arr, i), i, t, msg, sizeof msg) < 0) goto out;
    t->table = a;
    for (uint32_t k = 0; k < a->n; k++) {
      if (strcmp(a->tenants[k].name, t->name) == 0) {
        snprintf(msg, sizeof msg, "tenants[%zu] (\"%s\"): the name is used by tenants[%u] too", i, t->name, k);
        goto out;
      }
      if (memcmp(a->tenants[k].token_sha256, t->token_sha256, KEXD_SHA256_LEN) == 0) {
        snprintf(msg, sizeof msg, "tenants[%zu] (\"%s\"): the token_sha256 of tenants[%u] (\"%s\") too", i, t->name, k,
                 a->tenants[k].name);
        goto out;
      }
    }
    a->n++;
  }
  *out = a;
  a = NULL;
  rc = 0;
out:
  if (rc < 0) snprintf(why, cap, "--auth %s: %s", path, msg);
  if (a) {
    a->refs = 1;
    kexd_auth_unref(a);
  }
  json_decref(root);
  return rc;
}

const kexd_tenant *kexd_auth_check(const kexd_auth *a, const char *token, size_t len) {
  uint8_t h[KEXD_SHA256_LEN];
  unsigned int hl = 0;
  const kexd_tenant *found = NULL;
  if (!a || !EVP_Digest(token, len, h, &hl, EVP_sha256(), NULL) || hl != KEXD_SHA256_LEN) return NULL;
  for (uint32_t i = 0; i < a->n; i++)
    if (CRYPTO_memcmp(a->tenants[i].token_sha256, h, KEXD_SHA256_LEN) == 0) found = &a->tenants[i];
  OPENSSL_cleanse(h, sizeof h);
  return found;
}

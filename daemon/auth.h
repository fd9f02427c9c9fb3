/*
 * auth.h - tenants and their tokens (kexd --auth FILE).
 *
 * The file is JSON: {"tenants": [{"name": "ops", "role": "admin",
 * "token_sha256": "<64 hex>"}, {"name": "alice", "role": "user",
 * "token_sha256": "<64 hex>", "max_jobs": 4, "max_bytes": 1073741824,
 * "max_weight": 4, "max_beam": 4, "max_compile_seconds": 600, "may_tune":
 * true}]}.  Only the SHA-256 of each token is kept; a limit left out is
 * unlimited (max_jobs: kexd's --tenant-max-jobs; max_compile_seconds:
 * --tenant-compile-budget).  max_compile_seconds (a number > 0) is a
 * compile budget: the seconds of compiling new kernels the tenant may
 * spend in any hour, a token bucket that holds that many seconds and
 * refills at that many per hour; while it is empty the tenant's calls that
 * need a kernel compiled are refused, those whose kernels are all in the
 * program cache still run (jobs.h, kexd_tenant_budget_wait).  A user may
 * Tune
 * (or Submit with beam.beam_width: any search it asks for) unless may_tune
 * is false.  A loaded file is an immutable, reference
 * counted table: kexd holds the current one, each call the one that
 * admitted it, so SIGHUP swaps in a new table while calls in flight keep
 * theirs.  Loop thread only (the counts are not atomic).
 */
#ifndef KEX_DAEMON_AUTH_H
#define KEX_DAEMON_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEXD_TENANT_NAME_MAX 64          /* bytes of a tenant name */
#define KEXD_AUTH_MAX_TENANTS 4096       /* entries in one --auth file */
#define KEXD_LIMIT_AUTH_BYTES (4u << 20) /* bytes of an --auth file */
#define KEXD_AUTH_TOKEN_MAX 512          /* bytes of an authorization metadata value */
#define KEXD_SHA256_LEN 32
#define KEXD_COMPILE_BUDGET_MAX_S 1e6    /* the largest max_compile_seconds (and --tenant-compile-budget) */
#define KEXD_COMPILE_BUDGET_PERIOD_S 3600.0 /* a compile budget refills its whole size in this many seconds */

typedef enum kexd_role { KEXD_ROLE_USER, KEXD_ROLE_ADMIN } kexd_role;

typedef struct kexd_auth kexd_auth;

typedef struct kexd_tenant {
  char name[KEXD_TENANT_NAME_MAX + 1];
  kexd_role role;
  uint8_t token_sha256[KEXD_SHA256_LEN];
  uint32_t max_jobs;    /* jobs open at once (0: --tenant-max-jobs) */
  uint64_t max_bytes;   /* bytes its jobs hold and reserve together (0: unlimited) */
  uint32_t max_weight;  /* an OpenJob weight (0: unlimited) */
  uint32_t max_beam;    /* a Submit or Tune beam width (0: unlimited) */
  double max_compile_seconds; /* compile seconds per hour, a token bucket (0: --tenant-compile-budget) */
  bool may_tune;
  kexd_auth *table;     /* the table it belongs to */
} kexd_tenant;

struct kexd_auth {
  uint32_t refs;
  uint32_t n;
  kexd_tenant *tenants;
  char path[256]; /* for messages */
};

/*
 * Load and check the --auth file `path`.  0 with *out holding one
 * reference, or -1 with why naming the file and the entry (nothing
 * allocated).
 */
int kexd_auth_load(const char *path, kexd_auth **out, char *why, size_t cap);
void kexd_auth_ref(kexd_auth *a);
void kexd_auth_unref(kexd_auth *a);
/*
 * The tenant whose token is `token` (len bytes), or NULL.  Its SHA-256 is
 * compared with every entry in constant time (CRYPTO_memcmp, no early
 * exit).
 */
const kexd_tenant *kexd_auth_check(const kexd_auth *a, const char *token, size_t len);
/* "admin" / "user". */
const char *kexd_role_name(kexd_role r);

#endif

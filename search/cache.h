/*
 * cache.h - the on-disk cache kexd and the kex CLI share: compiled program
 * binaries and beam-search results, in one SQLite file (WAL mode).
 *
 * Trust (DESIGN.md): nothing executable ever enters through this module
 * from outside.  Program rows are written only by kex_cache_program_put,
 * which the daemon calls with a binary its own compiler just built from
 * source it rendered itself; each row keeps that source and the binary's
 * SHA-256, and kex_cache_program_get returns a binary only when the stored
 * source is byte-equal to the source the caller rendered now and the
 * binary still hashes to the stored digest (anything else -- a row written
 * into the file by hand, by an older kex's import, or damaged -- is deleted
 * and reported, never loaded).  Export/import carry beam results only
 * (opts, timings, identity, AST text): a "program" line is refused.
 *
 * Keys are exact, so a hit can never be another kernel's or another
 * device's entry:
 *
 *   programs      (SHA-256 of the kernel source, device identity)
 *   beam results  (AST key (codegen/astkey.h), device identity,
 *                  search options string, codegen version string)
 *
 * A device identity is stored as its five fields (devices/device.h); two
 * identities are the same device only when all five are byte-equal.  The
 * search options string (beam width, limits) and codegen version are
 * canonical strings the caller builds; they are compared byte for byte.
 *
 * Schema (version KEX_CACHE_SCHEMA_VERSION = 5):
 *
 *   schema_version(version INTEGER)                      one row
 *   devices(id INTEGER PRIMARY KEY, kind, vendor, name, driver_version,
 *           compiler_version, rendered,  UNIQUE(the five fields))
 *   programs(source_sha256 BLOB, device_id -> devices, kernel_name,
 *            source TEXT (v3), binary BLOB, binary_sha256 BLOB (v3),
 *            created_at,  PRIMARY KEY(source_sha256, device_id))
 *   beam_results(ast_key BLOB, device_id -> devices, search_opts, codegen_version,
 *                opts TEXT, best_time_s, hand_time_s, search_time_s, kernel_name,
 *                created_at, candidates (v2), ast_text (v2), decision_samples,
 *                decision_spread, decision_tie (v4: how the search decided, beam.h),
 *                tenant (v5: the kexd tenant whose search made it; NULL: in-process,
 *                imported, from a peer, or older),
 *                PRIMARY KEY(ast_key, device_id, search_opts, codegen_version))
 *
 * `opts` is the portable text of the applied opts: kex_opt_short forms
 * separated by one space ("UPCAST(1,4) UPCAST(0,4) LOCAL(0,16)", "" for
 * none, "NOLOCALS", None axes/amts as "None").  `created_at` is unix
 * seconds.  A file of an older version is migrated on open (0 -> 1 -> 2 ->
 * 3 -> 4 -> 5, each step in the transaction that bumps the version); a newer
 * version is refused (3 -> 4 adds the decision columns, 0 for older rows;
 * 4 -> 5 the tenant, NULL for older rows).  Exports do not carry the
 * tenant: an imported entry has none.
 * Migration 2 -> 3 deletes every program row: a v2 row has no
 * source or binary digest to verify it by (and may have come from an
 * import), so its kernel is simply compiled again.  A row that does not
 * decode (bad opts text, wrong column types, out-of-range values) or, for
 * a program, does not verify, is logged, deleted and reported as
 * KEX_ECORRUPT, never returned as a hit.
 *
 * Export format (kex_cache_export / kex_cache_import), JSON lines, UTF-8:
 *
 *   line 1:  {"format":"kex.cache.export.v1","schema":4}
 *   then one object per beam result:
 *   {"type":"beam","ast_key":"<64 hex>","device":DEV,"search_opts":"...",
 *    "codegen_version":"...","opts":"UPCAST(1,4) ...","best_time_s":1.5e-05,
 *    "hand_time_s":2e-05,"search_time_s":12.5,"candidates":140,
 *    "kernel_name":"r_16_8_8","created_at":1718000000,"ast_text":"kex.ast.v1\n..."|null,
 *    "samples":256,"spread":0.034,"tie":false}
 *   DEV = {"kind":"...","vendor":"...","name":"...","driver_version":"...","compiler_version":"..."}
 *
 * Every field is required (ast_text may be null) except samples, spread
 * and tie (schema 4: the search's decision; absent in older exports, read
 * as 0, 0, false; when present a non-negative integer, a finite
 * non-negative number and a boolean).  Import checks each line
 * (types, lengths, hex, opts text, finite non-negative times, and that
 * ast_text hashes to ast_key when given) and refuses a bad line naming its
 * number; good lines are stored in one transaction under the identity they
 * name, so an entry made on another device can only ever hit there.  The
 * "program" lines that exports of schema 1 and 2 carried (compiled
 * binaries) are refused, each reported, without being decoded: compiled
 * programs are never imported, each kexd compiles from the source it
 * renders.  The beam lines of such a file still import.  Imported opts are
 * still only data: the search checks them against the kernel and its
 * limits at use and drops an entry that fails (kex_cache_beam_drop).
 *
 * Connections -- the one policy every user of this module follows: a
 * kex_cache handle is one SQLite connection (kex_cache_open: WAL,
 * synchronous=NORMAL, busy timeout KEX_CACHE_BUSY_TIMEOUT_MS, SQLite's
 * multi-thread mode), and it belongs to one thread: each thread that uses
 * the cache opens its own and no handle is shared between threads, not
 * even behind a lock.
 *   - A tool that uses the cache from one thread (kex run, kex tune, kex
 *     cache, the benchmarks) opens one handle for its run and closes it at
 *     the end.
 *   - kexd keeps one handle per worker thread (libuv's pool: the only
 *     threads where kexd touches the cache -- Submit's program lookups and
 *     stores, Tune, Submit's beam hook, the cache RPCs), opened at the
 *     thread's first use and closed when kexd exits (kexd_cache_conn,
 *     daemon/cache_rpc.c); an open that fails is tried again at that
 *     thread's next use.  The loop thread and the device runners never
 *     touch the cache.
 *   - A beam search (search/beam.h) uses the handle its caller passes in
 *     opts->cache, on the calling thread; its pool workers never touch it.
 * Any number of connections and processes may share one file (WAL).
 * Opening waits for other openers too: the switch to WAL and the schema
 * transaction are retried with backoff while another connection holds the
 * file, for up to KEX_CACHE_BUSY_TIMEOUT_MS.  Do not carry a handle across
 * fork().
 *
 * Errors: 0 or a negative KEX_E* code with *err (may be NULL) naming what
 * failed; SQLite failures carry sqlite3_errmsg: KEX_EIO (I/O, cannot open,
 * read-only, disk full), KEX_EUNAVAILABLE (still busy after the timeout),
 * KEX_ECORRUPT (a damaged file or row), KEX_ENOMEM, KEX_EINTERNAL (other).
 */
#ifndef KEX_SEARCH_CACHE_H
#define KEX_SEARCH_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/errors.h"
#include "devices/device.h"
#include "codegen/astkey.h"
#include "codegen/kernel.h"

#define KEX_CACHE_SCHEMA_VERSION 5
#define KEX_CACHE_BUSY_TIMEOUT_MS 5000
#define KEX_CACHE_MAX_OPTS 64                        /* opts of one beam result */
#define KEX_CACHE_OPTS_TEXT_MAX 2048                 /* bytes of the opts text */
#define KEX_CACHE_SEARCH_OPTS_MAX 512                /* bytes of a search options string, NUL included */
#define KEX_CACHE_CODEGEN_MAX 128                    /* bytes of a codegen version, NUL included */
#define KEX_CACHE_KERNEL_NAME_MAX (KEX_DEVICE_KERNEL_NAME_MAX + 1) /* NUL included */
#define KEX_CACHE_AST_TEXT_MAX (256u << 20)          /* bytes of a stored AST text */
#define KEX_CACHE_LIST_MAX 100000                    /* entries of one list page */
#define KEX_CACHE_TENANT_MAX 65                      /* bytes of a tenant name, NUL included (kexd's are 1-64) */
/* bytes of one import line (sized so an old export's program line is read whole, then refused) */
#define KEX_CACHE_IMPORT_LINE_MAX ((size_t)KEX_DEVICE_BINARY_MAX / 3 * 4 + (1u << 20))
#define KEX_CACHE_IMPORT_ERRORS 8                    /* messages kept in an import report */

typedef struct kex_cache kex_cache;

/*
 * Open (creating when missing, with its parent directories) the cache file
 * at path, migrate it to the current schema, and return a new handle in
 * *out (kex_cache_close).  While another connection holds the file (another
 * process creating or migrating it at the same moment) the WAL switch and
 * the schema transaction are retried with backoff for up to
 * KEX_CACHE_BUSY_TIMEOUT_MS.  Errors: KEX_EIO (cannot create the directory
 * or open the file), KEX_EUNSUPPORTED (a newer schema version, or a SQLite
 * file that is not a kex cache), KEX_ECORRUPT (not a database),
 * KEX_EUNAVAILABLE (still locked after the timeout), KEX_ENOMEM.
 */
int kex_cache_open(const char *path, kex_cache **out, kex_error *err);
/* Finalize the statements and close the file.  NULL is a no-op. */
void kex_cache_close(kex_cache *c);
/* The schema version the open file has (KEX_CACHE_SCHEMA_VERSION after open). */
int kex_cache_schema_version(kex_cache *c, kex_error *err);

/* What one handle has seen (for the daemon's stats). */
typedef struct kex_cache_stats {
  uint64_t beam_hits, beam_misses, program_hits, program_misses;
  uint64_t corrupt_dropped;  /* rows that did not decode, program rows that did not verify */
  uint64_t unusable_dropped; /* beam results dropped by kex_cache_beam_drop */
} kex_cache_stats;
void kex_cache_get_stats(const kex_cache *c, kex_cache_stats *out);

/* ---- programs ---- */

typedef struct kex_cache_program {
  char kernel_name[KEX_CACHE_KERNEL_NAME_MAX];
  void *binary; /* kex_malloc'd, owned by the caller after a hit (kex_free) */
  size_t binary_len;
  int64_t created_at;
} kex_cache_program;

/*
 * Store (or replace) the binary this process's compiler built from
 * source[source_len] (which this process rendered) on device `dev`, with
 * the source itself and the binary's SHA-256, by which kex_cache_program_get
 * verifies the row.  Never call it with a binary that came from anywhere
 * else.  Errors: KEX_EINVAL (empty binary or source, a bad identity or
 * kernel name), KEX_ELIMIT (binary over KEX_DEVICE_BINARY_MAX, source over
 * KEX_DEVICE_SOURCE_MAX), SQLite.
 */
int kex_cache_program_put(kex_cache *c, const char *source, size_t source_len, const kex_device_identity *dev,
                          const char *kernel_name, const void *binary, size_t binary_len, kex_error *err);
/*
 * Look the binary up by source[source_len], the source the caller rendered
 * now: 0 and *out filled (out->binary is the caller's) only when the row's
 * stored source is byte-equal to it and its binary hashes to the stored
 * SHA-256.  KEX_ENOTFOUND (a miss; *out zeroed), KEX_ECORRUPT (a row that
 * did not decode or verify was deleted, logged and counted in
 * corrupt_dropped; *out zeroed: compile as on a miss), SQLite errors.
 */
int kex_cache_program_get(kex_cache *c, const char *source, size_t source_len, const kex_device_identity *dev,
                          kex_cache_program *out, kex_error *err);

/* ---- beam results ---- */

typedef struct kex_cache_beam_key {
  uint8_t ast_key[KEX_AST_KEY_BYTES];
  const kex_device_identity *device;
  const char *search_opts;     /* canonical, < KEX_CACHE_SEARCH_OPTS_MAX bytes */
  const char *codegen_version; /* < KEX_CACHE_CODEGEN_MAX bytes */
} kex_cache_beam_key;

typedef struct kex_cache_beam_value {
  uint32_t nopts;
  kex_opt opts[KEX_CACHE_MAX_OPTS];
  double best_time_s;   /* the winner's measured time */
  double hand_time_s;   /* the hand-coded heuristic's time */
  double search_time_s; /* how long the search took */
  int64_t candidates;   /* candidates timed */
  char kernel_name[KEX_CACHE_KERNEL_NAME_MAX];
  int64_t created_at;   /* unix seconds; 0 on put means now */
  /* how the search decided (search/beam.h; 0, 0, false for results stored before schema 4) */
  int64_t decision_samples; /* paired rounds of the final comparison */
  double decision_spread;   /* its measured noise, relative */
  bool decision_tie;        /* the tie rule, not a time difference, chose the kernel */
  char tenant[KEX_CACHE_TENANT_MAX]; /* the kexd tenant whose search made it; "" none (put: stored as NULL) */
} kex_cache_beam_value;

/*
 * Store (or replace) a beam result.  ast_text (may be NULL) is the
 * kex_ast_text the key was made from, kept for kex_cache_get_entry; when
 * given it must hash to key->ast_key.  Errors: KEX_EINVAL (a field out of
 * range, named), KEX_ELIMIT (a string over its limit), SQLite.
 */
int kex_cache_beam_put(kex_cache *c, const kex_cache_beam_key *key, const kex_cache_beam_value *val,
                       const char *ast_text, kex_error *err);
/*
 * 0 and *out filled on a hit; KEX_ENOTFOUND on a miss; KEX_ECORRUPT when
 * the row did not decode (it is deleted and logged; treat it as a miss);
 * SQLite errors.
 */
int kex_cache_beam_get(kex_cache *c, const kex_cache_beam_key *key, kex_cache_beam_value *out, kex_error *err);
/*
 * Delete the beam result of key whose opts are still val's opts, because
 * the caller found it unusable (the opts do not apply to the kernel or
 * break its limits): logged with the key and `why`, counted in
 * unusable_dropped.  A row stored since with other opts is left alone.
 * 0 (also when no row matched), KEX_EINVAL (a bad key), SQLite errors.
 */
int kex_cache_beam_drop(kex_cache *c, const kex_cache_beam_key *key, const kex_cache_beam_value *val, const char *why,
                        kex_error *err);

/* ---- listing, lookup, delete (the cache API) ---- */

typedef struct kex_cache_entry {
  uint8_t ast_key[KEX_AST_KEY_BYTES];
  char ast_hex[KEX_AST_KEY_HEX];
  kex_device_identity device;
  char device_rendered[KEX_DEVICE_IDENTITY_STR_MAX];
  char search_opts[KEX_CACHE_SEARCH_OPTS_MAX];
  char codegen_version[KEX_CACHE_CODEGEN_MAX];
  kex_cache_beam_value value;
  char *ast_text; /* kex_cache_get_entry only: kex_malloc'd (caller frees) or NULL when not stored */
} kex_cache_entry;

/* Beam-result filters; NULL or "" (0 for max_age_s) matches anything. */
typedef struct kex_cache_filter {
  const char *device;      /* substring of the rendered identity ("kind=...;vendor=...;...") */
  const char *kernel_name; /* substring */
  const char *key_prefix;  /* prefix of the AST key's hex (either case) */
  int64_t max_age_s;       /* only entries created at most this many seconds ago */
  const char *tenant;      /* only entries this tenant made (exact; kexd shows a user its own) */
} kex_cache_filter;

/* Called per entry; the entry is valid during the call only.  Nonzero stops the listing. */
typedef int (*kex_cache_entry_cb)(const kex_cache_entry *e, void *arg);

/*
 * The beam results matching filter (NULL = all), in key order (AST key,
 * device, search options, codegen version), skipping `offset` and passing
 * at most `limit` (1..KEX_CACHE_LIST_MAX) to cb.  The callback must not use
 * c.  Rows that do not decode are dropped as in kex_cache_beam_get and not
 * passed.  *count (may be NULL) = entries passed.  Errors: KEX_EINVAL (a bad
 * limit or a key prefix that is not hex), SQLite.
 */
int kex_cache_list(kex_cache *c, const kex_cache_filter *filter, uint64_t offset, uint32_t limit,
                   kex_cache_entry_cb cb, void *arg, uint32_t *count, kex_error *err);
/*
 * The newest beam result whose AST key is ast_hex (64 hex digits) and, when
 * device is neither NULL nor "", whose rendered identity is exactly device.
 * *out is filled, with out->ast_text when stored (caller kex_frees it).
 * Errors: KEX_EINVAL (bad hex), KEX_ENOTFOUND, KEX_ECORRUPT, SQLite.
 */
int kex_cache_get_entry(kex_cache *c, const char *ast_hex, const char *device, kex_cache_entry *out,
                        kex_error *err);
/* The same, among the entries tenant made (NULL or "": any; KEX_ENOTFOUND when it made none). */
int kex_cache_get_entry_of(kex_cache *c, const char *ast_hex, const char *device, const char *tenant,
                           kex_cache_entry *out, kex_error *err);
/* Delete the beam results matching filter (NULL = all) in one transaction; *deleted = rows removed. */
int kex_cache_delete(kex_cache *c, const kex_cache_filter *filter, uint64_t *deleted, kex_error *err);

/* ---- export / import (format above) ---- */

/*
 * Write the header and every beam result matching filter (NULL = all).
 * Compiled programs are never exported.  *count (may be NULL) = entries
 * written.  Errors: KEX_EIO (a write failed), KEX_ENOMEM, SQLite.
 */
int kex_cache_export(kex_cache *c, FILE *f, const kex_cache_filter *filter, uint64_t *count, kex_error *err);

typedef struct kex_cache_import_report {
  uint64_t imported, rejected;
  uint32_t nerrors;                                /* messages kept (at most KEX_CACHE_IMPORT_ERRORS) */
  char errors[KEX_CACHE_IMPORT_ERRORS][256];       /* "line 3: ast_key: not 64 hex digits" */
} kex_cache_import_report;

/*
 * Read an export from f; store every valid beam result (replacing entries
 * with the same key) in one transaction.  "program" lines are refused
 * (compiled programs are never imported).  *rep (may be NULL) counts
 * imported and rejected lines.  Returns 0 when every line was stored;
 * KEX_EPARSE when the header is missing or wrong (nothing stored) or some
 * lines were refused (the others are stored; err names the first refused
 * line); KEX_ELIMIT for a line over KEX_CACHE_IMPORT_LINE_MAX; KEX_EIO,
 * KEX_ENOMEM, SQLite.
 */
int kex_cache_import(kex_cache *c, FILE *f, kex_cache_import_report *rep, kex_error *err);

/*
 * One beam result as its export line (the format above, one object, no
 * newline): the row of key, in *line (kex_malloc'd, the caller frees).
 * What kexd's fleet cache publishes (daemon/fleet.h): the same codec as
 * export/import, so every field a beam result carries travels.  Errors:
 * KEX_ENOTFOUND, KEX_ECORRUPT (a damaged row, dropped), KEX_ENOMEM, SQLite.
 */
int kex_cache_beam_line(kex_cache *c, const kex_cache_beam_key *key, char **line, kex_error *err);
/*
 * Validate one export line (line[len], no newline) exactly as
 * kex_cache_import validates each line, and store it in its own
 * transaction.  When expect is not NULL the line must be for that key --
 * AST key, the five identity fields, search options and codegen version
 * byte-equal -- or it is refused and nothing is stored (an entry made on
 * another device is never taken for this one).  Errors: KEX_EPARSE (a bad
 * line, or another key; err says which field), KEX_EINVAL, KEX_ELIMIT
 * (over KEX_CACHE_IMPORT_LINE_MAX or a field's limit), KEX_ENOMEM, SQLite.
 */
int kex_cache_import_line(kex_cache *c, const char *line, size_t len, const kex_cache_beam_key *expect,
                          kex_error *err);

/* ---- helpers ---- */

/*
 * The opts text ("UPCAST(1,4) LOCAL(0,16)") of opts[n] into buf[len]:
 * 0, or KEX_ELIMIT when it does not fit.  Parse the reverse: 0 with
 * opts[*n], KEX_EPARSE naming the bad token, KEX_ELIMIT over max opts.
 */
int kex_cache_opts_format(const kex_opt *opts, uint32_t n, char *buf, size_t len);
int kex_cache_opts_parse(const char *text, kex_opt *opts, uint32_t max, uint32_t *n, kex_error *err);

#endif

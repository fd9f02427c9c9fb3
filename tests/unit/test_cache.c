/*
 * test_cache.c - the SQLite cache (search/cache.c) on real files in a
 * mkdtemp directory: program and beam round trips; keys that differ only in
 * device identity, search options or codegen version miss; damaged rows are
 * dropped and reported, never returned; migration of a hand-made v1 file; a
 * newer or foreign file refused; integrity after many writes; two handles
 * and a forked writer sharing one file; a writer killed with SIGKILL in the
 * middle of a big transaction leaves only whole entries; export/import
 * reproduces every entry and keeps foreign identities foreign; malformed
 * import lines refused by line number; list filters, paging and delete.
 * Trust: program rows tampered with in the file are dropped, never
 * returned; v2 program rows are dropped by the migration; "program" import
 * lines (old exports, the attack) are refused and never stored; an
 * unusable beam result is dropped only while it still has its bad opts.
 * Several processes opening one new file at once all succeed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "core/alloc.h"
#include "core/log.h"
#include "codegen/astkey.h"
#include "search/cache.h"

static char tmpdir[256];
static int file_counter;

/* A fresh path in the temp dir (the file does not exist yet). */
static void fresh_path(char *buf, size_t len, const char *tag) {
  snprintf(buf, len, "%s/%s-%d/cache.db", tmpdir, tag, file_counter++);
}

static kex_device_identity identity(const char *kind, const char *name, const char *driver, const char *compiler) {
  kex_device_identity d;
  memset(&d, 0, sizeof d);
  snprintf(d.kind, sizeof d.kind, "%s", kind);
  snprintf(d.vendor, sizeof d.vendor, "ACME; Inc=1");
  snprintf(d.name, sizeof d.name, "%s", name);
  snprintf(d.driver_version, sizeof d.driver_version, "%s", driver);
  snprintf(d.compiler_version, sizeof d.compiler_version, "%s", compiler);
  return d;
}

static kex_device_identity this_dev(void) { return identity("opencl", "pthread-cpu", "6.0", "OpenCL C 1.2 PoCL 6.0"); }

static kex_cache *open_ok(const char *path) {
  kex_cache *c = NULL;
  kex_error err = {0};
  if (kex_cache_open(path, &c, &err)) fail_msg("open %s: %s", path, err.msg);
  return c;
}

static void key_of(int n, uint8_t out[32]) {
  char s[32];
  snprintf(s, sizeof s, "kernel-%d", n);
  kex_sha256_bytes(s, strlen(s), out);
}

static kex_cache_beam_value value_of(int n) {
  kex_cache_beam_value v;
  memset(&v, 0, sizeof v);
  v.nopts = 3;
  v.opts[0] = kex_opt_make(KEX_OPT_UPCAST, 1, 4);
  v.opts[1] = kex_opt_make(KEX_OPT_LOCAL, 0, n % 32);
  v.opts[2] = kex_opt_make(KEX_OPT_GROUPTOP, 0, 256);
  v.best_time_s = 1e-6 * (n + 1);
  v.hand_time_s = 2e-6 * (n + 1);
  v.search_time_s = 0.5 + n;
  v.candidates = 100 + n;
  snprintf(v.kernel_name, sizeof v.kernel_name, "r_%d_16", n);
  v.decision_samples = 9 + n;
  v.decision_spread = 0.01 * (n % 7);
  v.decision_tie = n % 2;
  return v;
}

static void beam_put_ok(kex_cache *c, int n, const kex_device_identity *d, const char *so, const char *cg) {
  kex_cache_beam_key k = {.device = d, .search_opts = so, .codegen_version = cg};
  kex_cache_beam_value v = value_of(n);
  kex_error err = {0};
  key_of(n, k.ast_key);
  if (kex_cache_beam_put(c, &k, &v, NULL, &err)) fail_msg("beam put %d: %s", n, err.msg);
}

static int beam_get(kex_cache *c, int n, const kex_device_identity *d, const char *so, const char *cg,
                    kex_cache_beam_value *out, kex_error *err) {
  kex_cache_beam_key k = {.device = d, .search_opts = so, .codegen_version = cg};
  key_of(n, k.ast_key);
  return kex_cache_beam_get(c, &k, out, err);
}

static void expect_beam_value(const kex_cache_beam_value *got, int n) {
  kex_cache_beam_value want = value_of(n);
  assert_int_equal(got->nopts, want.nopts);
  for (uint32_t i = 0; i < want.nopts; i++) {
    assert_int_equal(got->opts[i].op, want.opts[i].op);
    assert_int_equal(got->opts[i].axis, want.opts[i].axis);
    assert_int_equal(got->opts[i].amt, want.opts[i].amt);
  }
  assert_true(got->best_time_s == want.best_time_s);
  assert_true(got->hand_time_s == want.hand_time_s);
  assert_true(got->search_time_s == want.search_time_s);
  assert_int_equal(got->candidates, want.candidates);
  assert_string_equal(got->kernel_name, want.kernel_name);
  assert_true(got->created_at > 0);
  assert_int_equal(got->decision_samples, want.decision_samples);
  assert_true(got->decision_spread == want.decision_spread);
  assert_int_equal(got->decision_tie, want.decision_tie);
}

static int64_t sql_int(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  int64_t v = -1;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

static void sql_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  char *msg = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) fail_msg("%s: %s", sql, msg);
  sqlite3_close(db);
}

/* Remove a database file and its WAL companions. */
static void remove_db(const char *path) {
  char p[600];
  unlink(path);
  snprintf(p, sizeof p, "%s-wal", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", path);
  unlink(p);
}

static void expect_integrity_ok(const char *path) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
  sqlite3_finalize(s);
  sqlite3_close(db);
}

/* ---- round trips and misses ---- */

static void test_program_roundtrip(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "prog");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev(), other = this_dev();
  snprintf(other.driver_version, sizeof other.driver_version, "6.1");
  const char *src = "__kernel void E_4(__global float *a) { a[get_global_id(0)] = 1.0f; }";
  uint8_t bin[3000];
  for (size_t i = 0; i < sizeof bin; i++) bin[i] = (uint8_t)(i * 7 + 1);
  kex_error err = {0};
  kex_cache_program p;
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), KEX_ENOTFOUND);
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", bin, sizeof bin, &err), 0);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_int_equal(p.binary_len, sizeof bin);
  assert_memory_equal(p.binary, bin, sizeof bin);
  assert_string_equal(p.kernel_name, "E_4");
  kex_free(p.binary);
  /* another driver version, another source: misses */
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &other, &p, &err), KEX_ENOTFOUND);
  assert_null(p.binary);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src) - 1, &d, &p, &err), KEX_ENOTFOUND);
  /* replace */
  bin[0] ^= 0xff;
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", bin, sizeof bin, &err), 0);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_int_equal(((uint8_t *)p.binary)[0], bin[0]);
  kex_free(p.binary);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 1);
  /* bad input */
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "bad name!", bin, sizeof bin, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "kernel name"));
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", bin, 0, &err), KEX_EINVAL);
  kex_device_identity empty = d;
  empty.vendor[0] = 0;
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &empty, "E_4", bin, 1, &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "vendor"));
  /* the row keeps what verifies it: the source itself and the binary's SHA-256 */
  assert_int_equal(sql_int(path, "SELECT length(source) FROM programs"), (int64_t)strlen(src));
  assert_int_equal(sql_int(path, "SELECT length(binary_sha256) FROM programs"), 32);
  /* a damaged row is dropped, not returned */
  sql_exec(path, "UPDATE programs SET binary = 'not a blob'");
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), KEX_ECORRUPT);
  assert_null(p.binary);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 0);
  kex_cache_close(c);
}

/*
 * Program rows written into the file by someone else -- an attacker with
 * the file, or an old kex's import of a "program" line -- are never
 * returned: each one is deleted, reported as KEX_ECORRUPT naming the
 * kernel and the reason, and counted; the next get is a plain miss (the
 * caller compiles), and a row this process stores again verifies.
 */
static void test_program_tampered_rows_never_returned(void **state) {
  (void)state;
  char path[512], sql[8192], hex[65], evil_hex[2 * 64 + 1], evil_sha[65];
  fresh_path(path, sizeof path, "tamper");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev();
  const char *src = "void E_4(float* restrict data0, const float* restrict data1, const float* restrict data2) {}";
  uint8_t good[64], evil[64], h[32];
  for (size_t i = 0; i < sizeof good; i++) good[i] = (uint8_t)(i + 1), evil[i] = (uint8_t)(0xc0 + (i & 15));
  kex_error err = {0};
  kex_cache_program p;
  kex_cache_stats st;
  kex_sha256_bytes(src, strlen(src), h);
  kex_hex(h, 32, hex);
  kex_hex(evil, sizeof evil, evil_hex);
  kex_sha256_bytes(evil, sizeof evil, h);
  kex_hex(h, 32, evil_sha);
  kex_log_set_level(KEX_LOG_OFF);
  /* the good row first: stored by this process, it hits */
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", good, sizeof good, &err), 0);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_memory_equal(p.binary, good, sizeof good);
  kex_free(p.binary);
  struct {
    const char *what;
    char set[512];
    const char *why;
  } tamper[6] = {
      /* other bytes under the key, the old digest left: the binary does not hash to it */
      {"binary replaced", "", "does not hash"},
      /* other bytes and their own digest, but no source (what an old import's row amounts to) */
      {"binary and digest replaced, source emptied", "", "not byte-equal"},
      /* other bytes and their own digest, and a source that is not the one rendered now */
      {"binary, digest and source replaced", "", "not byte-equal"},
      {"source one byte longer", "source = source || ' '", "not byte-equal"},
      {"digest not 32 bytes", "binary_sha256 = x'00'", "binary_sha256"},
      {"source not text", "source = CAST(source AS BLOB)", "not byte-equal"},
  };
  snprintf(tamper[0].set, sizeof tamper[0].set, "binary = x'%s'", evil_hex);
  snprintf(tamper[1].set, sizeof tamper[1].set, "binary = x'%s', binary_sha256 = x'%s', source = ''", evil_hex, evil_sha);
  snprintf(tamper[2].set, sizeof tamper[2].set, "binary = x'%s', binary_sha256 = x'%s', source = 'int evil;'", evil_hex,
           evil_sha);
  for (size_t t = 0; t < sizeof tamper / sizeof *tamper; t++) {
    assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", good, sizeof good, &err), 0);
    snprintf(sql, sizeof sql, "UPDATE programs SET %s WHERE source_sha256 = x'%s'", tamper[t].set, hex);
    sql_exec(path, sql);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 1);
    kex_cache_get_stats(c, &st);
    uint64_t dropped = st.corrupt_dropped;
    memset(&err, 0, sizeof err);
    int rc = kex_cache_program_get(c, src, strlen(src), &d, &p, &err);
    if (rc != KEX_ECORRUPT) fail_msg("%s: get returned %d (%s), want KEX_ECORRUPT", tamper[t].what, rc, err.msg);
    assert_null(p.binary);
    assert_int_equal(p.binary_len, 0);
    if (!strstr(err.msg, tamper[t].why) || !strstr(err.msg, "E_4") || !strstr(err.msg, hex))
      fail_msg("%s: message \"%s\" does not name the kernel, the key and \"%s\"", tamper[t].what, err.msg, tamper[t].why);
    kex_cache_get_stats(c, &st);
    assert_int_equal(st.corrupt_dropped, dropped + 1);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 0); /* deleted, not just skipped */
    assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), KEX_ENOTFOUND);
  }
  /* a row inserted from scratch for a key this process never stored (the attack: key = SHA-256 of the source) */
  snprintf(sql, sizeof sql,
           "INSERT INTO programs(source_sha256, device_id, kernel_name, source, binary, binary_sha256, created_at) "
           "SELECT x'%s', id, 'E_4', 'int evil;', x'%s', x'%s', 1 FROM devices",
           hex, evil_hex, evil_sha);
  sql_exec(path, sql);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), KEX_ECORRUPT);
  assert_null(p.binary);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 0);
  kex_log_set_level(KEX_LOG_WARN);
  /* what this process stores again verifies and hits */
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", good, sizeof good, &err), 0);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_int_equal(p.binary_len, sizeof good);
  assert_memory_equal(p.binary, good, sizeof good);
  kex_free(p.binary);
  kex_cache_get_stats(c, &st);
  assert_int_equal(st.corrupt_dropped, sizeof tamper / sizeof *tamper + 1);
  assert_int_equal(st.program_hits, 2);
  kex_cache_close(c);
}

static void test_beam_roundtrip_and_misses(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "beam");
  kex_cache *c = open_ok(path);
  assert_int_equal(kex_cache_schema_version(c, NULL), KEX_CACHE_SCHEMA_VERSION);
  kex_device_identity d = this_dev();
  const char *so = "beam=2;upcast_max=256;local_max=1024", *cg = "kex-codegen-1";
  kex_cache_beam_value v;
  kex_error err = {0};
  assert_int_equal(beam_get(c, 1, &d, so, cg, &v, &err), KEX_ENOTFOUND);
  beam_put_ok(c, 1, &d, so, cg);
  assert_int_equal(beam_get(c, 1, &d, so, cg, &v, &err), 0);
  expect_beam_value(&v, 1);

  /* each key part alone makes a miss */
  kex_device_identity d2 = d;
  snprintf(d2.compiler_version, sizeof d2.compiler_version, "OpenCL C 1.2 PoCL 6.1");
  assert_int_equal(beam_get(c, 1, &d2, so, cg, &v, &err), KEX_ENOTFOUND);
  d2 = d;
  snprintf(d2.kind, sizeof d2.kind, "cpu");
  assert_int_equal(beam_get(c, 1, &d2, so, cg, &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 1, &d, "beam=4;upcast_max=256;local_max=1024", cg, &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 1, &d, so, "kex-codegen-2", &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 2, &d, so, cg, &v, &err), KEX_ENOTFOUND);
  /* identities whose fields differ only in where a separator falls are different devices */
  kex_device_identity a = identity("opencl", "x;y", "1", "c"), b = identity("opencl", "x", "1", "c");
  snprintf(b.vendor, sizeof b.vendor, "ACME; Inc=1;y");
  beam_put_ok(c, 3, &a, so, cg);
  assert_int_equal(beam_get(c, 3, &b, so, cg, &v, &err), KEX_ENOTFOUND);

  /* NOLOCALS and None survive the opts text */
  kex_cache_beam_key k = {.device = &d, .search_opts = so, .codegen_version = cg};
  key_of(9, k.ast_key);
  kex_cache_beam_value w = value_of(9);
  w.nopts = 2;
  w.opts[0] = kex_opt_make(KEX_OPT_NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE);
  w.opts[1] = kex_opt_make(KEX_OPT_TC, 0, KEX_OPT_NONE);
  assert_int_equal(kex_cache_beam_put(c, &k, &w, NULL, &err), 0);
  assert_int_equal(kex_cache_beam_get(c, &k, &v, &err), 0);
  assert_int_equal(v.nopts, 2);
  assert_int_equal(v.opts[0].op, KEX_OPT_NOLOCALS);
  assert_int_equal(v.opts[1].amt, KEX_OPT_NONE);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results WHERE opts = 'NOLOCALS TC(0,None)'"), 1);

  /* bad values are refused before they reach the file */
  w.best_time_s = -1;
  assert_int_equal(kex_cache_beam_put(c, &k, &w, NULL, &err), KEX_EINVAL);
  w.best_time_s = 1e-5;
  assert_int_equal(kex_cache_beam_put(c, &k, &w, "kex.ast.v1\nnot the text of this key\n", &err), KEX_EINVAL);
  assert_non_null(strstr(err.msg, "does not hash"));

  kex_cache_stats st;
  kex_cache_get_stats(c, &st);
  assert_int_equal(st.beam_hits, 2);
  assert_int_equal(st.beam_misses, 7);
  kex_cache_close(c);
  /* the file persists: a new handle hits */
  c = open_ok(path);
  assert_int_equal(beam_get(c, 1, &d, so, cg, &v, &err), 0);
  kex_cache_close(c);
}

static void test_opts_text(void **state) {
  (void)state;
  kex_opt o[4];
  uint32_t n = 0;
  kex_error err = {0};
  char buf[128];
  assert_int_equal(kex_cache_opts_parse("", o, 4, &n, &err), 0);
  assert_int_equal(n, 0);
  assert_int_equal(kex_cache_opts_parse("UPCAST(1,4) UNROLL(0,0) PADTO(2,32)", o, 4, &n, &err), 0);
  assert_int_equal(n, 3);
  assert_int_equal(kex_cache_opts_format(o, n, buf, sizeof buf), 0);
  assert_string_equal(buf, "UPCAST(1,4) UNROLL(0,0) PADTO(2,32)");
  const char *bad[] = {"UPCAST(1,4", "UPCAST(1,4)  LOCAL(0,2)", "FOO(1,2)", "UPCAST(-1,4)", "UPCAST(1,4) ", "upcast(1,4)",
                       "UPCAST(1,99999999999)", "NOLOCALSX"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (kex_cache_opts_parse(bad[i], o, 4, &n, &err) != KEX_EPARSE) fail_msg("accepted \"%s\"", bad[i]);
  assert_int_equal(kex_cache_opts_parse("LOCAL(0,2) LOCAL(0,2) LOCAL(0,2) LOCAL(0,2) LOCAL(0,2)", o, 4, &n, &err),
                   KEX_ELIMIT);
  assert_int_equal(kex_cache_opts_format(o, 4, buf, 12), KEX_ELIMIT);
}

/* ---- damaged rows ---- */

static void test_corrupt_rows_dropped(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "corrupt");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev();
  kex_cache_beam_value v;
  kex_error err = {0};
  for (int i = 0; i < 4; i++) beam_put_ok(c, i, &d, "s", "g");
  /* another process (or a bug) writes bad values straight into the file */
  sql_exec(path, "UPDATE beam_results SET opts = 'UPCAST(1,' WHERE kernel_name = 'r_0_16';"
                 "UPDATE beam_results SET best_time_s = 'fast' WHERE kernel_name = 'r_1_16';"
                 "UPDATE beam_results SET kernel_name = 'r 2; drop' WHERE kernel_name = 'r_2_16';");
  kex_log_set_level(KEX_LOG_OFF);
  assert_int_equal(beam_get(c, 0, &d, "s", "g", &v, &err), KEX_ECORRUPT);
  assert_non_null(strstr(err.msg, "opts"));
  assert_int_equal(v.nopts, 0);
  assert_int_equal(beam_get(c, 1, &d, "s", "g", &v, &err), KEX_ECORRUPT);
  assert_non_null(strstr(err.msg, "time"));
  assert_int_equal(v.best_time_s, 0);
  /* a listing passes only the good rows and drops the bad one it met */
  uint32_t n = 0;
  assert_int_equal(kex_cache_list(c, NULL, 0, 100, NULL, NULL, &n, &err), 0);
  assert_int_equal(n, 1);
  kex_log_set_level(KEX_LOG_WARN);
  /* gone: now plain misses, and only the good row is left in the file */
  assert_int_equal(beam_get(c, 0, &d, "s", "g", &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 1, &d, "s", "g", &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 3, &d, "s", "g", &v, &err), 0);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 1);
  kex_cache_stats st;
  kex_cache_get_stats(c, &st);
  assert_int_equal(st.corrupt_dropped, 3);
  kex_cache_close(c);
}

/* ---- schema versions ---- */

/* The version-1 schema, exactly as migration 0 -> 1 wrote it. */
static const char v1_schema[] =
    "CREATE TABLE schema_version(version INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES (1);"
    "CREATE TABLE devices(id INTEGER PRIMARY KEY, kind TEXT NOT NULL, vendor TEXT NOT NULL, name TEXT NOT NULL,"
    " driver_version TEXT NOT NULL, compiler_version TEXT NOT NULL, rendered TEXT NOT NULL,"
    " UNIQUE(kind, vendor, name, driver_version, compiler_version));"
    "CREATE TABLE programs(source_sha256 BLOB NOT NULL, device_id INTEGER NOT NULL REFERENCES devices(id),"
    " kernel_name TEXT NOT NULL, binary BLOB NOT NULL, created_at INTEGER NOT NULL,"
    " PRIMARY KEY(source_sha256, device_id));"
    "CREATE TABLE beam_results(ast_key BLOB NOT NULL, device_id INTEGER NOT NULL REFERENCES devices(id),"
    " search_opts TEXT NOT NULL, codegen_version TEXT NOT NULL, opts TEXT NOT NULL, best_time_s REAL NOT NULL,"
    " hand_time_s REAL NOT NULL, search_time_s REAL NOT NULL, kernel_name TEXT NOT NULL,"
    " created_at INTEGER NOT NULL, PRIMARY KEY(ast_key, device_id, search_opts, codegen_version));";

static void test_migration_from_v1(void **state) {
  (void)state;
  char path[512], sql[4096], hex[65];
  uint8_t key[32];
  fresh_path(path, sizeof path, "v1");
  kex_cache_close(open_ok(path)); /* makes the directory; then replace the file with a v1 one */
  remove_db(path);
  key_of(5, key);
  kex_hex(key, 32, hex);
  kex_device_identity d = this_dev();
  snprintf(sql, sizeof sql,
           "%s INSERT INTO devices VALUES (1, '%s', '%s', '%s', '%s', '%s', 'old');"
           "INSERT INTO beam_results VALUES (x'%s', 1, 's', 'g', 'UPCAST(0,4)', 1e-5, 2e-5, 3.0, 'E_5', %lld);",
           v1_schema, d.kind, d.vendor, d.name, d.driver_version, d.compiler_version, hex, (long long)time(NULL));
  sql_exec(path, sql);
  assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), 1);

  kex_cache *c = open_ok(path);
  assert_int_equal(kex_cache_schema_version(c, NULL), KEX_CACHE_SCHEMA_VERSION);
  kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
  memcpy(k.ast_key, key, 32);
  kex_cache_beam_value v;
  kex_error err = {0};
  assert_int_equal(kex_cache_beam_get(c, &k, &v, &err), 0);
  assert_int_equal(v.nopts, 1);
  assert_int_equal(v.opts[0].amt, 4);
  assert_int_equal(v.candidates, 0); /* the v2 column's default */
  assert_string_equal(v.kernel_name, "E_5");
  /* v2 columns and indexes exist and work */
  beam_put_ok(c, 6, &d, "s", "g");
  assert_int_equal(sql_int(path, "SELECT candidates FROM beam_results WHERE kernel_name = 'r_6_16'"), 106);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'beam_results_created'"), 1);
  kex_cache_close(c);
  /* reopening a current file changes nothing */
  c = open_ok(path);
  assert_int_equal(kex_cache_schema_version(c, NULL), KEX_CACHE_SCHEMA_VERSION);
  kex_cache_close(c);
  expect_integrity_ok(path);
}

/* The version-2 additions, exactly as migration 1 -> 2 wrote them. */
static const char v2_additions[] =
    "ALTER TABLE beam_results ADD COLUMN candidates INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE beam_results ADD COLUMN ast_text TEXT;"
    "CREATE INDEX beam_results_created ON beam_results(created_at);"
    "CREATE INDEX beam_results_kernel ON beam_results(kernel_name);"
    "CREATE INDEX programs_device ON programs(device_id);"
    "UPDATE schema_version SET version = 2;";

/*
 * A v2 file's program rows have nothing to verify them by (and an import
 * may have written them): migration 2 -> 3 drops every one of them and
 * keeps the beam results; the kernel's source then misses and a program
 * stored afterwards verifies.
 */
static void test_migration_from_v2_drops_programs(void **state) {
  (void)state;
  char path[512], sql[8192], hex[65], shex[65];
  uint8_t key[32], skey[32];
  const char *src = "void E_4(float* restrict data0) { data0[0] = 1.0f; }";
  fresh_path(path, sizeof path, "v2");
  kex_cache_close(open_ok(path));
  remove_db(path);
  key_of(5, key);
  kex_hex(key, 32, hex);
  kex_sha256_bytes(src, strlen(src), skey);
  kex_hex(skey, 32, shex);
  kex_device_identity d = this_dev();
  snprintf(sql, sizeof sql,
           "%s %s INSERT INTO devices VALUES (1, '%s', '%s', '%s', '%s', '%s', 'old');"
           "INSERT INTO beam_results VALUES (x'%s', 1, 's', 'g', 'UPCAST(0,4)', 1e-5, 2e-5, 3.0, 'E_5', %lld, 7, NULL);"
           "INSERT INTO programs VALUES (x'%s', 1, 'E_4', x'c0ffee', 1);"
           "INSERT INTO programs VALUES (x'%s', 1, 'E_5', x'c0ffee', 1);",
           v1_schema, v2_additions, d.kind, d.vendor, d.name, d.driver_version, d.compiler_version, hex,
           (long long)time(NULL), shex, hex);
  sql_exec(path, sql);
  assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), 2);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 2);

  kex_log_set_level(KEX_LOG_OFF);
  kex_cache *c = open_ok(path);
  kex_log_set_level(KEX_LOG_WARN);
  assert_int_equal(kex_cache_schema_version(c, NULL), KEX_CACHE_SCHEMA_VERSION);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 0);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM pragma_table_info('programs') WHERE name IN "
                                 "('source', 'binary_sha256')"), 2);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'programs_device'"), 1);
  kex_cache_program p;
  kex_error err = {0};
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), KEX_ENOTFOUND);
  assert_null(p.binary);
  /* the beam result is untouched */
  kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
  memcpy(k.ast_key, key, 32);
  kex_cache_beam_value v;
  assert_int_equal(kex_cache_beam_get(c, &k, &v, &err), 0);
  assert_int_equal(v.candidates, 7);
  assert_string_equal(v.kernel_name, "E_5");
  /* a program compiled now is stored and verifies */
  uint8_t bin[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_4", bin, sizeof bin, &err), 0);
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_memory_equal(p.binary, bin, sizeof bin);
  kex_free(p.binary);
  kex_cache_close(c);
  expect_integrity_ok(path);
}

/*
 * Migration 3 -> 4 adds the decision columns (0 for the rows already
 * there) in the transaction that bumps the version; an export line without
 * the decision fields (an older kex's) still imports, with 0, 0, false,
 * and one whose fields have the wrong types is refused.
 */
static void test_migration_from_v3_decision(void **state) {
  (void)state;
  char path[512], line[4096], hex[65];
  fresh_path(path, sizeof path, "v3");
  kex_device_identity d = this_dev();
  kex_cache *c = open_ok(path);
  beam_put_ok(c, 3, &d, "s", "g");
  kex_cache_close(c);
  /* back to a v3 file: the v4 and v5 columns gone, the version 3 */
  sql_exec(path, "ALTER TABLE beam_results DROP COLUMN tenant;"
                 "ALTER TABLE beam_results DROP COLUMN decision_samples;"
                 "ALTER TABLE beam_results DROP COLUMN decision_spread;"
                 "ALTER TABLE beam_results DROP COLUMN decision_tie;"
                 "UPDATE schema_version SET version = 3;");
  kex_log_set_level(KEX_LOG_OFF);
  c = open_ok(path);
  kex_log_set_level(KEX_LOG_WARN);
  assert_int_equal(kex_cache_schema_version(c, NULL), KEX_CACHE_SCHEMA_VERSION);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM pragma_table_info('beam_results') WHERE name IN "
                                 "('decision_samples', 'decision_spread', 'decision_tie', 'tenant')"), 4);
  kex_cache_beam_value v;
  kex_error err = {0};
  assert_int_equal(beam_get(c, 3, &d, "s", "g", &v, &err), 0);
  assert_int_equal(v.candidates, 103);
  assert_int_equal(v.decision_samples, 0);
  assert_true(v.decision_spread == 0);
  assert_false(v.decision_tie);
  /* an old export line (no decision fields) imports; wrong types are refused */
  uint8_t key[32];
  key_of(4, key);
  kex_hex(key, 32, hex);
  const char *tails[] = {"}", ",\"samples\":12,\"spread\":0.5,\"tie\":true}", ",\"tie\":1}", ",\"samples\":-1}",
                         ",\"spread\":\"x\"}"};
  const int want_rc[] = {0, 0, KEX_EPARSE, KEX_EPARSE, KEX_EPARSE};
  for (int i = 0; i < 5; i++) {
    snprintf(line, sizeof line,
             "{\"format\":\"kex.cache.export.v1\",\"schema\":3}\n{\"type\":\"beam\",\"ast_key\":\"%s\",\"device\":"
             "{\"kind\":\"%s\",\"vendor\":\"%s\",\"name\":\"%s\",\"driver_version\":\"%s\",\"compiler_version\":\"%s\"},"
             "\"search_opts\":\"s\",\"codegen_version\":\"g\",\"opts\":\"UPCAST(0,4)\",\"best_time_s\":1e-05,"
             "\"hand_time_s\":2e-05,\"search_time_s\":1.5,\"candidates\":3,\"kernel_name\":\"E_4\",\"created_at\":1,"
             "\"ast_text\":null%s\n",
             hex, d.kind, d.vendor, d.name, d.driver_version, d.compiler_version, tails[i]);
    FILE *f = fmemopen(line, strlen(line), "r");
    kex_cache_import_report rep;
    assert_int_equal(kex_cache_import(c, f, &rep, &err), want_rc[i]);
    fclose(f);
    assert_int_equal(rep.imported, want_rc[i] ? 0 : 1);
    if (want_rc[i]) continue;
    assert_int_equal(beam_get(c, 4, &d, "s", "g", &v, &err), 0);
    assert_int_equal(v.decision_samples, i ? 12 : 0);
    assert_true(v.decision_spread == (i ? 0.5 : 0));
    assert_int_equal(v.decision_tie, i == 1);
  }
  kex_cache_close(c);
  expect_integrity_ok(path);
}

static void test_newer_or_foreign_refused(void **state) {
  (void)state;
  char path[512];
  kex_cache *c = (kex_cache *)1;
  kex_error err = {0};
  char sql[128], want[64];
  fresh_path(path, sizeof path, "newer");
  kex_cache_close(open_ok(path));
  snprintf(sql, sizeof sql, "UPDATE schema_version SET version = %d", KEX_CACHE_SCHEMA_VERSION + 1);
  sql_exec(path, sql);
  assert_int_equal(kex_cache_open(path, &c, &err), KEX_EUNSUPPORTED);
  assert_null(c);
  snprintf(want, sizeof want, "schema version %d", KEX_CACHE_SCHEMA_VERSION + 1);
  assert_non_null(strstr(err.msg, want));
  snprintf(want, sizeof want, "up to %d", KEX_CACHE_SCHEMA_VERSION);
  assert_non_null(strstr(err.msg, want));
  assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), KEX_CACHE_SCHEMA_VERSION + 1); /* left untouched */

  /* tinygrad's own cache.db is not ours */
  fresh_path(path, sizeof path, "foreign");
  kex_cache_close(open_ok(path));
  remove_db(path);
  sql_exec(path, "CREATE TABLE beam_search_16 (ast blob, amt integer, val blob)");
  assert_int_equal(kex_cache_open(path, &c, &err), KEX_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "not a kex cache"));

  /* a file that is not SQLite at all */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("this is not a database, it is a text file that is long enough to have a header...\n", f);
  fclose(f);
  char wal[600];
  snprintf(wal, sizeof wal, "%s-wal", path);
  unlink(wal);
  int rc = kex_cache_open(path, &c, &err);
  assert_true(rc == KEX_ECORRUPT || rc == KEX_EIO);

  /* a parent that is a file cannot become a directory */
  snprintf(wal, sizeof wal, "%s/sub/cache.db", path);
  assert_int_equal(kex_cache_open(wal, &c, &err), KEX_EIO);
  assert_int_equal(kex_cache_open("", &c, &err), KEX_EINVAL);
}

/* ---- many writes, many writers ---- */

static void test_integrity_after_many_writes(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/deep/er/and/deeper/cache.db", tmpdir); /* mkdir -p */
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev(), d2 = identity("cpu", "host", "1", "cc 12");
  for (int i = 0; i < 2000; i++) beam_put_ok(c, i, i % 3 ? &d : &d2, "s", "g");
  for (int i = 0; i < 500; i++) beam_put_ok(c, i, i % 3 ? &d : &d2, "s", "g"); /* replacements */
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 2000);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM devices"), 2);
  expect_integrity_ok(path);
  kex_cache_close(c);
  sqlite3 *db;
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
  sqlite3_finalize(s);
  sqlite3_close(db);
}

/* Child body: open its own handle and write entries [from, from + n); exit status 0 on success. */
static int child_writes(const char *path, int from, int n) {
  kex_cache *c = NULL;
  kex_error err = {0};
  kex_device_identity d = this_dev();
  if (kex_cache_open(path, &c, &err)) return 10;
  for (int i = from; i < from + n; i++) {
    kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
    kex_cache_beam_value v = value_of(i);
    key_of(i, k.ast_key);
    if (kex_cache_beam_put(c, &k, &v, NULL, &err)) {
      fprintf(stderr, "child put %d: %s\n", i, err.msg);
      return 11;
    }
  }
  kex_cache_close(c);
  return 0;
}

static void test_two_handles_and_fork(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "shared");
  kex_cache *a = open_ok(path), *b = open_ok(path);
  kex_device_identity d = this_dev();
  kex_cache_beam_value v;
  kex_error err = {0};
  for (int i = 0; i < 200; i++) beam_put_ok(i % 2 ? a : b, i, &d, "s", "g");
  for (int i = 0; i < 200; i++) {
    assert_int_equal(beam_get(i % 2 ? b : a, i, &d, "s", "g", &v, &err), 0);
    expect_beam_value(&v, i);
  }
  kex_cache_close(b);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_writes(path, 1000, 600));
  for (int i = 2000; i < 2600; i++) beam_put_ok(a, i, &d, "s", "g"); /* the parent writes at the same time */
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(beam_get(a, 1599, &d, "s", "g", &v, &err), 0);
  expect_beam_value(&v, 1599);
  kex_cache_close(a);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 1400);
  expect_integrity_ok(path);
}

#define OPEN_ROUNDS 20
#define OPEN_PROCS 4
#define OPEN_THREADS 2

/* What one opener saw (a thread of a forked child). */
typedef struct opener {
  const char *path;
  int id, rc;
  char msg[KEX_ERROR_MSG_MAX];
} opener;

/* Open the (new) file, store one beam result and one program, close: o->rc 0 or the failing code. */
static void *opener_run(void *arg) {
  opener *o = arg;
  kex_cache *c = NULL;
  kex_error err = {0};
  kex_device_identity d = this_dev();
  char src[64];
  uint8_t bin[16] = {1, 2, 3};
  o->rc = kex_cache_open(o->path, &c, &err);
  if (!o->rc) {
    kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
    kex_cache_beam_value v = value_of(o->id);
    key_of(o->id, k.ast_key);
    o->rc = kex_cache_beam_put(c, &k, &v, NULL, &err);
  }
  if (!o->rc) {
    snprintf(src, sizeof src, "source of opener %d", o->id);
    o->rc = kex_cache_program_put(c, src, strlen(src), &d, "E_1", bin, sizeof bin, &err);
  }
  if (o->rc) snprintf(o->msg, sizeof o->msg, "%s", err.msg);
  kex_cache_close(c);
  return NULL;
}

/* Child body: wait for the start signal (EOF on fd), then OPEN_THREADS threads open at once; exit 0 when all did. */
static int child_opens(const char *path, int fd, int id) {
  pthread_t th[OPEN_THREADS];
  opener o[OPEN_THREADS];
  char ch;
  int bad = 0;
  if (read(fd, &ch, 1) != 0) return 20;
  for (int t = 0; t < OPEN_THREADS; t++) {
    o[t] = (opener){path, id * OPEN_THREADS + t, 0, ""};
    if (pthread_create(&th[t], NULL, opener_run, &o[t])) return 21;
  }
  for (int t = 0; t < OPEN_THREADS; t++) {
    pthread_join(th[t], NULL);
    if (o[t].rc) {
      fprintf(stderr, "opener %d: %s\n", o[t].id, o[t].msg);
      bad++;
    }
  }
  return bad;
}

/*
 * Several processes (each with two threads) open one NEW cache file at the
 * same instant, 20 times over: every open succeeds (the WAL switch and the
 * schema transaction wait and retry while another opener holds the file),
 * and the file ends with every opener's entries.
 */
static void test_concurrent_open_new_file(void **state) {
  (void)state;
  int failures = 0;
  for (int round = 0; round < OPEN_ROUNDS; round++) {
    char path[512];
    int fds[2];
    pid_t pids[OPEN_PROCS];
    fresh_path(path, sizeof path, "race");
    kex_cache_close(open_ok(path)); /* makes the directory; the file itself must be new */
    remove_db(path);
    assert_int_equal(pipe(fds), 0);
    for (int p = 0; p < OPEN_PROCS; p++) {
      pids[p] = fork();
      assert_true(pids[p] >= 0);
      if (pids[p] == 0) {
        close(fds[1]);
        _exit(child_opens(path, fds[0], p));
      }
    }
    close(fds[0]);
    close(fds[1]); /* go */
    for (int p = 0; p < OPEN_PROCS; p++) {
      int status = 0;
      assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
      assert_true(WIFEXITED(status));
      failures += WEXITSTATUS(status);
    }
    if (!failures) {
      assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), OPEN_PROCS * OPEN_THREADS);
      assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), OPEN_PROCS * OPEN_THREADS);
      assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), KEX_CACHE_SCHEMA_VERSION);
    }
  }
  if (failures) fail_msg("%d of %d opens failed", failures, OPEN_ROUNDS * OPEN_PROCS * OPEN_THREADS);
}

#define KILL_BATCH 400

/* Child body: import batches of KILL_BATCH entries (one transaction each) until killed. */
static int child_imports_forever(const char *path) {
  kex_cache *c = NULL;
  kex_error err = {0};
  if (kex_cache_open(path, &c, &err)) return 10;
  for (int batch = 0;; batch++) {
    FILE *f = tmpfile();
    if (!f) return 12;
    fprintf(f, "{\"format\":\"kex.cache.export.v1\",\"schema\":2}\n");
    for (int i = 0; i < KILL_BATCH; i++) {
      int n = batch * KILL_BATCH + i;
      uint8_t key[32];
      char hex[65];
      key_of(n, key);
      kex_hex(key, 32, hex);
      fprintf(f,
              "{\"type\":\"beam\",\"ast_key\":\"%s\",\"device\":{\"kind\":\"opencl\",\"vendor\":\"v\",\"name\":\"n\","
              "\"driver_version\":\"1\",\"compiler_version\":\"c\"},\"search_opts\":\"s\",\"codegen_version\":\"g\","
              "\"opts\":\"UPCAST(0,4) LOCAL(0,%d)\",\"best_time_s\":%d,\"hand_time_s\":%d,\"search_time_s\":1,"
              "\"candidates\":%d,\"kernel_name\":\"k_%d\",\"created_at\":%d,\"ast_text\":null}\n",
              hex, n % 64, n, 2 * n, 3 * n, n, 1000 + n);
    }
    rewind(f);
    int rc = kex_cache_import(c, f, NULL, &err);
    fclose(f);
    if (rc) return 13;
  }
}

typedef struct kill_check {
  uint32_t n, bad;
} kill_check;

/* Every surviving entry must be whole: its fields agree with the number in its kernel name. */
static int check_whole(const kex_cache_entry *e, void *arg) {
  kill_check *k = arg;
  int n = atoi(e->value.kernel_name + 2);
  uint8_t key[32];
  key_of(n, key);
  k->n++;
  if (memcmp(key, e->ast_key, 32) || e->value.best_time_s != n || e->value.hand_time_s != 2 * n ||
      e->value.candidates != 3 * n || e->value.created_at != 1000 + n || e->value.nopts != 2 ||
      e->value.opts[1].amt != n % 64)
    k->bad++;
  return 0;
}

static void test_kill9_mid_transaction(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "kill");
  kex_cache_close(open_ok(path));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_imports_forever(path));
  /* wait until a few batches are in, then kill it at a random point of the next one */
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int64_t n = sql_int(path, "SELECT count(*) FROM beam_results");
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (n >= 3 * KILL_BATCH || now.tv_sec - start.tv_sec > 60) break;
    usleep(20000);
  }
  usleep((useconds_t)(rand() % 30000));
  assert_int_equal(kill(pid, SIGKILL), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status)); /* it was killed, not finished or failed */
  assert_int_equal(WTERMSIG(status), SIGKILL);

  kex_cache *c = open_ok(path);
  expect_integrity_ok(path);
  kill_check k = {0};
  kex_error err = {0};
  assert_int_equal(kex_cache_list(c, NULL, 0, KEX_CACHE_LIST_MAX, check_whole, &k, NULL, &err), 0);
  int64_t rows = sql_int(path, "SELECT count(*) FROM beam_results");
  assert_true(rows >= 3 * KILL_BATCH);
  assert_int_equal(rows % KILL_BATCH, 0); /* only whole transactions */
  assert_int_equal(k.n, rows);
  assert_int_equal(k.bad, 0);
  /* and the file takes new writes */
  kex_device_identity d = this_dev();
  beam_put_ok(c, 999999, &d, "s", "g");
  kex_cache_close(c);
}

/* ---- export / import ---- */

typedef struct collected {
  char lines[64][2048];
  uint32_t n;
} collected;

static int collect(const kex_cache_entry *e, void *arg) {
  collected *col = arg;
  char opts[256];
  kex_cache_opts_format(e->value.opts, e->value.nopts, opts, sizeof opts);
  if (col->n < 64)
    snprintf(col->lines[col->n++], sizeof col->lines[0], "%s|%.60s|%.40s|%.20s|%.100s|%.17g|%.17g|%.17g|%lld|%.60s|%lld",
             e->ast_hex, e->device_rendered, e->search_opts, e->codegen_version, opts, e->value.best_time_s,
             e->value.hand_time_s, e->value.search_time_s, (long long)e->value.candidates, e->value.kernel_name,
             (long long)e->value.created_at);
  return 0;
}

static void test_export_import(void **state) {
  (void)state;
  char p1[512], p2[512];
  fresh_path(p1, sizeof p1, "export");
  fresh_path(p2, sizeof p2, "import");
  kex_cache *a = open_ok(p1);
  kex_device_identity d = this_dev(), d2 = identity("cpu", "host \"quoted\" \xc3\xa9", "1", "cc 12 -O2");
  kex_error err = {0};
  for (int i = 0; i < 20; i++) beam_put_ok(a, i, i % 2 ? &d : &d2, i % 3 ? "beam=2" : "beam=4", "g1");
  /* one entry with its AST text */
  const char *text = "kex.ast.v1\noutputs 1\n%0 BufferOps.LOAD float32 idx=1 st=X\nout %0\n";
  kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
  kex_sha256_bytes(text, strlen(text), k.ast_key);
  kex_cache_beam_value v = value_of(77);
  assert_int_equal(kex_cache_beam_put(a, &k, &v, text, &err), 0);
  uint8_t bin[1000];
  for (size_t i = 0; i < sizeof bin; i++) bin[i] = (uint8_t)(i * 31);
  for (int i = 0; i < 3; i++) {
    char src[32];
    snprintf(src, sizeof src, "source %d", i);
    assert_int_equal(kex_cache_program_put(a, src, strlen(src), i ? &d : &d2, "E_1", bin, sizeof bin - (size_t)i, &err), 0);
  }
  FILE *f = tmpfile();
  uint64_t count = 0;
  assert_int_equal(kex_cache_export(a, f, NULL, &count, &err), 0);
  assert_int_equal(count, 21); /* the beam results; compiled programs are never exported */
  rewind(f);
  char line[4096];
  int nlines = 0, nprograms = 0;
  while (fgets(line, sizeof line, f))
    if (strchr(line, '\n')) nlines++, nprograms += strstr(line, "\"type\":\"program\"") != NULL;
  assert_int_equal(nlines, 1 + 21);
  assert_int_equal(nprograms, 0);
  rewind(f);
  kex_cache *b = open_ok(p2);
  kex_cache_import_report rep;
  assert_int_equal(kex_cache_import(b, f, &rep, &err), 0);
  assert_int_equal(rep.imported, 21);
  assert_int_equal(rep.rejected, 0);
  fclose(f);

  collected *ca = calloc(1, sizeof *ca), *cb = calloc(1, sizeof *cb);
  assert_int_equal(kex_cache_list(a, NULL, 0, 100, collect, ca, NULL, &err), 0);
  assert_int_equal(kex_cache_list(b, NULL, 0, 100, collect, cb, NULL, &err), 0);
  assert_int_equal(ca->n, 21);
  assert_int_equal(cb->n, ca->n);
  for (uint32_t i = 0; i < ca->n; i++) assert_string_equal(ca->lines[i], cb->lines[i]);
  free(ca);
  free(cb);
  kex_cache_entry *e = calloc(1, sizeof *e);
  char hex[65];
  kex_hex(k.ast_key, 32, hex);
  assert_int_equal(kex_cache_get_entry(b, hex, NULL, e, &err), 0);
  assert_non_null(e->ast_text);
  assert_string_equal(e->ast_text, text);
  assert_int_equal(e->value.decision_samples, v.decision_samples); /* the decision travels in the export line */
  assert_true(e->value.decision_spread == v.decision_spread);
  assert_int_equal(e->value.decision_tie, v.decision_tie);
  kex_free(e->ast_text);
  free(e);
  for (int i = 0; i < 3; i++) { /* the programs stayed where they were compiled */
    char src[32];
    kex_cache_program p;
    snprintf(src, sizeof src, "source %d", i);
    assert_int_equal(kex_cache_program_get(b, src, strlen(src), i ? &d : &d2, &p, &err), KEX_ENOTFOUND);
    assert_int_equal(kex_cache_program_get(a, src, strlen(src), i ? &d : &d2, &p, &err), 0);
    kex_free(p.binary);
  }
  assert_int_equal(sql_int(p2, "SELECT count(*) FROM programs"), 0);
  /* a filtered export: one device only */
  kex_cache_filter flt = {.device = "kind=cpu"};
  f = tmpfile();
  assert_int_equal(kex_cache_export(a, f, &flt, &count, &err), 0);
  assert_int_equal(count, 10);
  fclose(f);
  kex_cache_close(a);
  kex_cache_close(b);
}

static void test_import_foreign_identity(void **state) {
  (void)state;
  char path[512], hex[65];
  uint8_t key[32];
  fresh_path(path, sizeof path, "foreignid");
  kex_cache *c = open_ok(path);
  key_of(42, key);
  kex_hex(key, 32, hex);
  char buf[2048];
  snprintf(buf, sizeof buf,
           "{\"format\":\"kex.cache.export.v1\",\"schema\":2}\n"
           "{\"type\":\"beam\",\"ast_key\":\"%s\",\"device\":{\"kind\":\"opencl\",\"vendor\":\"NVIDIA Corporation\","
           "\"name\":\"NVIDIA H200\",\"driver_version\":\"550.54\",\"compiler_version\":\"OpenCL C 1.2 CUDA\"},"
           "\"search_opts\":\"s\",\"codegen_version\":\"g\",\"opts\":\"UPCAST(0,4) LOCAL(0,32)\",\"best_time_s\":1e-6,"
           "\"hand_time_s\":2e-6,\"search_time_s\":3,\"candidates\":5,\"kernel_name\":\"E_32768_32_4\",\"created_at\":%lld,"
           "\"ast_text\":null}\n",
           hex, (long long)time(NULL));
  FILE *f = fmemopen(buf, strlen(buf), "r");
  kex_error err = {0};
  kex_cache_import_report rep;
  assert_int_equal(kex_cache_import(c, f, &rep, &err), 0);
  fclose(f);
  assert_int_equal(rep.imported, 1);
  /* this device misses: the entry was made elsewhere */
  kex_device_identity d = this_dev();
  kex_cache_beam_value v;
  assert_int_equal(beam_get(c, 42, &d, "s", "g", &v, &err), KEX_ENOTFOUND);
  /* it is stored under its own identity, where it hits */
  kex_device_identity h200 = identity("opencl", "NVIDIA H200", "550.54", "OpenCL C 1.2 CUDA");
  snprintf(h200.vendor, sizeof h200.vendor, "NVIDIA Corporation");
  assert_int_equal(beam_get(c, 42, &h200, "s", "g", &v, &err), 0);
  assert_string_equal(v.kernel_name, "E_32768_32_4");
  kex_cache_entry *e = calloc(1, sizeof *e);
  assert_int_equal(kex_cache_get_entry(c, hex, NULL, e, &err), 0);
  assert_string_equal(e->device.name, "NVIDIA H200");
  assert_string_equal(e->device_rendered, "kind=opencl;vendor=NVIDIA Corporation;name=NVIDIA H200;driver=550.54;"
                                          "compiler=OpenCL C 1.2 CUDA");
  assert_int_equal(kex_cache_get_entry(c, hex, e->device_rendered, e, &err), 0);
  assert_int_equal(kex_cache_get_entry(c, hex, "kind=opencl;vendor=v", e, &err), KEX_ENOTFOUND);
  assert_int_equal(kex_cache_get_entry(c, "zz", NULL, e, &err), KEX_EINVAL);
  free(e);
  kex_cache_close(c);
}

static void test_import_malformed_lines(void **state) {
  (void)state;
  char path[512], hex[65], other[65];
  uint8_t key[32];
  fresh_path(path, sizeof path, "malformed");
  kex_cache *c = open_ok(path);
  key_of(1, key);
  kex_hex(key, 32, hex);
  key_of(2, key);
  kex_hex(key, 32, other);
#define DEV "\"device\":{\"kind\":\"cpu\",\"vendor\":\"v\",\"name\":\"n\",\"driver_version\":\"1\",\"compiler_version\":\"c\"}"
#define BEAM(key, opts, best, kname, extra)                                                                        \
  "{\"type\":\"beam\",\"ast_key\":\"" key "\"," DEV ",\"search_opts\":\"s\",\"codegen_version\":\"g\",\"opts\":\"" opts \
  "\",\"best_time_s\":" best ",\"hand_time_s\":1,\"search_time_s\":1,\"candidates\":1,\"kernel_name\":\"" kname   \
  "\",\"created_at\":5" extra "}\n"
  char buf[8192];
  snprintf(buf, sizeof buf,
           "{\"format\":\"kex.cache.export.v1\",\"schema\":2}\n"                                   /* 1 */
           BEAM("%s", "UPCAST(0,4)", "1", "E_1", ",\"ast_text\":null")                             /* 2 ok */
           "not json at all\n"                                                                     /* 3 */
           BEAM("%.60s", "UPCAST(0,4)", "1", "E_1", ",\"ast_text\":null")                          /* 4 short key */
           BEAM("%s", "UPCAST(0,", "1", "E_1", ",\"ast_text\":null")                               /* 5 opts */
           BEAM("%s", "UPCAST(0,4)", "-1", "E_1", ",\"ast_text\":null")                            /* 6 time */
           BEAM("%s", "UPCAST(0,4)", "1", "E 1", ",\"ast_text\":null")                             /* 7 name */
           BEAM("%s", "UPCAST(0,4)", "1", "E_1", "")                                               /* 8 no ast_text */
           BEAM("%s", "UPCAST(0,4)", "1", "E_1", ",\"ast_text\":\"kex.ast.v1\\nwrong\\n\"")        /* 9 hash */
           "{\"type\":\"program\",\"source_sha256\":\"%s\"," DEV ",\"kernel_name\":\"E_1\",\"binary\":\"AAE=\",\"created_at\":1}\n" /* 10 refused */
           "{\"type\":\"program\",\"source_sha256\":\"%s\"," DEV ",\"kernel_name\":\"E_1\",\"binary\":\"A*E=\",\"created_at\":1}\n" /* 11 b64 */
           "{\"type\":\"shader\"}\n"                                                               /* 12 */
           BEAM("%s", "UPCAST(0,4)", "1", "E_2", ",\"ast_text\":null"),                            /* 13 ok */
           hex, hex, hex, hex, hex, hex, hex, other, other, other);
  FILE *f = fmemopen(buf, strlen(buf), "r");
  kex_error err = {0};
  kex_cache_import_report rep;
  assert_int_equal(kex_cache_import(c, f, &rep, &err), KEX_EPARSE);
  fclose(f);
  assert_int_equal(rep.imported, 2);
  assert_int_equal(rep.rejected, 10);
  assert_non_null(strstr(err.msg, "10 line(s) refused, 2 stored; first: line 3"));
  assert_int_equal(rep.nerrors, KEX_CACHE_IMPORT_ERRORS);
  const char *want[] = {"line 3: not a JSON object", "line 4: ast_key", "line 5: opts", "line 6: best_time_s",
                        "line 7: cache: kernel name", "line 8: ast_text", "line 9: cache: the AST text does not hash",
                        "line 10: type \"program\" refused: compiled programs are never imported"};
  for (int i = 0; i < KEX_CACHE_IMPORT_ERRORS; i++)
    if (strncmp(rep.errors[i], want[i], strlen(want[i]))) fail_msg("error %d is \"%s\", want \"%s...\"", i, rep.errors[i], want[i]);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 2);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 0); /* neither program line: one well-formed, one not */

  /* no header: nothing stored */
  const char *nohdr = BEAM("0000000000000000000000000000000000000000000000000000000000000000", "", "1", "E_3", ",\"ast_text\":null");
  f = fmemopen((void *)nohdr, strlen(nohdr), "r");
  assert_int_equal(kex_cache_import(c, f, &rep, &err), KEX_EPARSE);
  fclose(f);
  assert_int_equal(rep.imported, 0);
  assert_non_null(strstr(err.msg, "line 1"));
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 2);
  kex_cache_close(c);
#undef BEAM
#undef DEV
}

/*
 * The attack: an old-format export whose "program" line carries other bytes
 * for the SHA-256 of a source this cache compiled.  The line is refused
 * (reported with its number and why), the good row is untouched and still
 * what a get returns; the file's beam line imports.
 */
static void test_import_old_export_program_refused(void **state) {
  (void)state;
  char path[512], buf[4096], shex[65], khex[65];
  uint8_t h[32];
  fresh_path(path, sizeof path, "oldexport");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev();
  const char *src = "__kernel void E_2(__global float* data0, const __global float* data1) {}";
  uint8_t good[32];
  for (size_t i = 0; i < sizeof good; i++) good[i] = (uint8_t)(3 * i + 1);
  kex_error err = {0};
  assert_int_equal(kex_cache_program_put(c, src, strlen(src), &d, "E_2", good, sizeof good, &err), 0);
  kex_sha256_bytes(src, strlen(src), h);
  kex_hex(h, 32, shex);
  key_of(3, h);
  kex_hex(h, 32, khex);
  snprintf(buf, sizeof buf,
           "{\"format\":\"kex.cache.export.v1\",\"schema\":2}\n"
           "{\"type\":\"program\",\"source_sha256\":\"%s\",\"device\":{\"kind\":\"%s\",\"vendor\":\"%s\","
           "\"name\":\"%s\",\"driver_version\":\"%s\",\"compiler_version\":\"%s\"},\"kernel_name\":\"E_2\","
           "\"binary\":\"f0VMRgIBAQAAAAAAAAAAAA==\",\"created_at\":1}\n"
           "{\"type\":\"beam\",\"ast_key\":\"%s\",\"device\":{\"kind\":\"cpu\",\"vendor\":\"v\",\"name\":\"n\","
           "\"driver_version\":\"1\",\"compiler_version\":\"c\"},\"search_opts\":\"s\",\"codegen_version\":\"g\","
           "\"opts\":\"UPCAST(0,4)\",\"best_time_s\":1,\"hand_time_s\":1,\"search_time_s\":1,\"candidates\":1,"
           "\"kernel_name\":\"E_3\",\"created_at\":5,\"ast_text\":null}\n",
           shex, d.kind, d.vendor, d.name, d.driver_version, d.compiler_version, khex);
  FILE *f = fmemopen(buf, strlen(buf), "r");
  kex_cache_import_report rep;
  assert_int_equal(kex_cache_import(c, f, &rep, &err), KEX_EPARSE);
  fclose(f);
  assert_int_equal(rep.imported, 1);
  assert_int_equal(rep.rejected, 1);
  assert_int_equal(rep.nerrors, 1);
  assert_string_equal(rep.errors[0], "line 2: type \"program\" refused: compiled programs are never imported, each "
                                     "kexd compiles from the source it renders");
  assert_non_null(strstr(err.msg, "1 line(s) refused, 1 stored; first: line 2: type \"program\" refused"));
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 1);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM programs"), 1);
  kex_cache_program p;
  assert_int_equal(kex_cache_program_get(c, src, strlen(src), &d, &p, &err), 0);
  assert_int_equal(p.binary_len, sizeof good);
  assert_memory_equal(p.binary, good, sizeof good);
  kex_free(p.binary);
  /* a file of nothing but program lines stores nothing */
  snprintf(buf, sizeof buf, "{\"format\":\"kex.cache.export.v1\",\"schema\":1}\n{\"type\":\"program\"}\n");
  f = fmemopen(buf, strlen(buf), "r");
  assert_int_equal(kex_cache_import(c, f, &rep, &err), KEX_EPARSE);
  fclose(f);
  assert_int_equal(rep.imported, 0);
  assert_int_equal(rep.rejected, 1);
  assert_non_null(strstr(rep.errors[0], "line 2: type \"program\" refused"));
  kex_cache_close(c);
}

/* kex_cache_beam_drop deletes the row only while it still has the unusable opts, and counts it. */
/* One entry as its export line, validated and stored elsewhere only for the key asked for (the fleet cache's codec). */
static void test_beam_line(void **state) {
  (void)state;
  char p1[512], p2[512];
  fresh_path(p1, sizeof p1, "line-a");
  fresh_path(p2, sizeof p2, "line-b");
  kex_cache *a = open_ok(p1), *b = open_ok(p2);
  kex_device_identity d = this_dev(), other = identity("opencl", "another gpu", "6.0", "OpenCL C 1.2 PoCL 6.0");
  kex_cache_beam_key k = {.device = &d, .search_opts = "beam=2", .codegen_version = "g1"};
  kex_cache_beam_value v;
  kex_error err = {0};
  char *line = NULL;
  key_of(5, k.ast_key);
  assert_int_equal(kex_cache_beam_line(a, &k, &line, &err), KEX_ENOTFOUND);
  assert_null(line);
  beam_put_ok(a, 5, &d, "beam=2", "g1");
  assert_int_equal(kex_cache_beam_line(a, &k, &line, &err), 0);
  assert_non_null(strstr(line, "\"type\":\"beam\""));
  assert_null(strchr(line, '\n'));
  /* another device, search options or codegen asked for: refused, nothing stored */
  kex_cache_beam_key ko = k, ks = k, kc = k;
  ko.device = &other;
  ks.search_opts = "beam=4";
  kc.codegen_version = "g2";
  assert_int_equal(kex_cache_import_line(b, line, strlen(line), &ko, &err), KEX_EPARSE);
  assert_non_null(strstr(err.msg, "not for the key"));
  assert_int_equal(kex_cache_import_line(b, line, strlen(line), &ks, &err), KEX_EPARSE);
  assert_int_equal(kex_cache_import_line(b, line, strlen(line), &kc, &err), KEX_EPARSE);
  assert_int_equal(beam_get(b, 5, &d, "beam=2", "g1", &v, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(b, 5, &other, "beam=2", "g1", &v, &err), KEX_ENOTFOUND);
  /* a damaged line is refused as import refuses it */
  assert_int_equal(kex_cache_import_line(b, line, strlen(line) - 1, &k, &err), KEX_EPARSE);
  assert_int_equal(kex_cache_import_line(b, "{\"type\":\"program\"}", 19, &k, &err), KEX_EPARSE);
  /* the right key: stored, the same value */
  assert_int_equal(kex_cache_import_line(b, line, strlen(line), &k, &err), 0);
  assert_int_equal(beam_get(b, 5, &d, "beam=2", "g1", &v, &err), 0);
  expect_beam_value(&v, 5);
  kex_free(line);
  kex_cache_close(a);
  kex_cache_close(b);
  remove_db(p1);
  remove_db(p2);
}

static void test_beam_drop(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "drop");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev();
  kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
  kex_cache_beam_value v = value_of(4), other = value_of(4), got;
  kex_cache_stats st;
  kex_error err = {0};
  key_of(4, k.ast_key);
  beam_put_ok(c, 4, &d, "s", "g");
  beam_put_ok(c, 5, &d, "s", "g");
  other.opts[0] = kex_opt_make(KEX_OPT_UPCAST, 0, 2); /* a row stored since with other opts is left alone */
  kex_log_set_level(KEX_LOG_OFF);
  assert_int_equal(kex_cache_beam_drop(c, &k, &other, "test", &err), 0);
  assert_int_equal(beam_get(c, 4, &d, "s", "g", &got, &err), 0);
  kex_cache_get_stats(c, &st);
  assert_int_equal(st.unusable_dropped, 0);
  /* another search options string is another key */
  kex_cache_beam_key k2 = k;
  k2.search_opts = "t";
  assert_int_equal(kex_cache_beam_drop(c, &k2, &v, "test", &err), 0);
  assert_int_equal(beam_get(c, 4, &d, "s", "g", &got, &err), 0);
  assert_int_equal(kex_cache_beam_drop(c, &k, &v, "opt 0 UPCAST(1,4) does not apply: invalid axis", &err), 0);
  kex_log_set_level(KEX_LOG_WARN);
  assert_int_equal(beam_get(c, 4, &d, "s", "g", &got, &err), KEX_ENOTFOUND);
  assert_int_equal(beam_get(c, 5, &d, "s", "g", &got, &err), 0); /* only that row */
  kex_cache_get_stats(c, &st);
  assert_int_equal(st.unusable_dropped, 1);
  assert_int_equal(st.corrupt_dropped, 0);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results"), 1);
  kex_cache_close(c);
}

/* ---- list filters, paging, delete ---- */

static int count_cb(const kex_cache_entry *e, void *arg) {
  (void)e;
  (*(int *)arg)++;
  return 0;
}

static uint32_t list_n(kex_cache *c, const kex_cache_filter *f) {
  uint32_t n = 0;
  kex_error err = {0};
  if (kex_cache_list(c, f, 0, 1000, NULL, NULL, &n, &err)) fail_msg("list: %s", err.msg);
  return n;
}

/*
 * Schema 5: a beam result remembers the tenant whose search made it; a
 * filter (and kex_cache_get_entry_of) by tenant sees only its own, a
 * lookup by key (kex_cache_beam_get: Submit's) any; "" is stored as none;
 * a row from before the column (a v4 file) has none.
 */
static void test_tenant_column(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "tenant");
  kex_device_identity d = this_dev();
  kex_cache *c = open_ok(path);
  kex_error err = {0};
  beam_put_ok(c, 1, &d, "s", "g"); /* no tenant */
  kex_cache_close(c);
  sql_exec(path, "ALTER TABLE beam_results DROP COLUMN tenant; UPDATE schema_version SET version = 4;");
  kex_log_set_level(KEX_LOG_OFF);
  c = open_ok(path); /* migrates 4 -> 5 */
  kex_log_set_level(KEX_LOG_WARN);
  assert_int_equal(kex_cache_schema_version(c, NULL), 5);
  const char *who[] = {"alice", "bob", "alice"};
  for (int n = 2; n <= 4; n++) {
    kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
    kex_cache_beam_value v = value_of(n);
    key_of(n, k.ast_key);
    snprintf(v.tenant, sizeof v.tenant, "%s", who[n - 2]);
    assert_int_equal(kex_cache_beam_put(c, &k, &v, NULL, &err), 0);
  }
  assert_int_equal(list_n(c, NULL), 4);
  assert_int_equal(list_n(c, &(kex_cache_filter){.tenant = "alice"}), 2);
  assert_int_equal(list_n(c, &(kex_cache_filter){.tenant = "bob"}), 1);
  assert_int_equal(list_n(c, &(kex_cache_filter){.tenant = "carol"}), 0);
  assert_int_equal(list_n(c, &(kex_cache_filter){.tenant = ""}), 4);
  assert_int_equal(sql_int(path, "SELECT count(*) FROM beam_results WHERE tenant IS NULL"), 1);
  kex_cache_beam_value v;
  assert_int_equal(beam_get(c, 3, &d, "s", "g", &v, &err), 0); /* bob's, found by anyone's lookup */
  assert_string_equal(v.tenant, "bob");
  char hex[65];
  uint8_t key[32];
  key_of(3, key);
  kex_hex(key, 32, hex);
  kex_cache_entry e;
  assert_int_equal(kex_cache_get_entry_of(c, hex, NULL, "alice", &e, &err), KEX_ENOTFOUND);
  assert_int_equal(kex_cache_get_entry_of(c, hex, NULL, "bob", &e, &err), 0);
  assert_string_equal(e.value.tenant, "bob");
  kex_free(e.ast_text);
  assert_int_equal(kex_cache_get_entry(c, hex, NULL, &e, &err), 0);
  kex_free(e.ast_text);
  kex_cache_beam_value big = value_of(5);
  memset(big.tenant, 'x', sizeof big.tenant); /* no NUL: over the limit */
  kex_cache_beam_key k = {.device = &d, .search_opts = "s", .codegen_version = "g"};
  key_of(5, k.ast_key);
  assert_int_equal(kex_cache_beam_put(c, &k, &big, NULL, &err), KEX_ELIMIT);
  kex_cache_close(c);
}

typedef struct page_seen {
  char hex[64][65];
  int n;
} page_seen;

static int page_cb(const kex_cache_entry *e, void *arg) {
  page_seen *p = arg;
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->hex[i], e->ast_hex)) fail_msg("entry %s listed twice", e->ast_hex);
  if (p->n < 64) snprintf(p->hex[p->n++], 65, "%s", e->ast_hex);
  return 0;
}

static void test_list_filters_paging_delete(void **state) {
  (void)state;
  char path[512];
  fresh_path(path, sizeof path, "list");
  kex_cache *c = open_ok(path);
  kex_device_identity d = this_dev(), d2 = identity("cpu", "host", "1", "cc 12");
  kex_error err = {0};
  for (int i = 0; i < 30; i++) beam_put_ok(c, i, i < 10 ? &d2 : &d, "s", "g");
  /* ten of them are old */
  sql_exec(path, "UPDATE beam_results SET created_at = created_at - 86400 WHERE candidates >= 120");
  assert_int_equal(list_n(c, NULL), 30);
  assert_int_equal(list_n(c, &(kex_cache_filter){.device = "kind=cpu"}), 10);
  assert_int_equal(list_n(c, &(kex_cache_filter){.device = "PoCL"}), 20);
  assert_int_equal(list_n(c, &(kex_cache_filter){.device = "vendor=ACME\\; Inc\\=1"}), 30); /* escaped rendering */
  assert_int_equal(list_n(c, &(kex_cache_filter){.kernel_name = "r_2"}), 11); /* r_2_16, r_20_16 .. r_29_16 */
  assert_int_equal(list_n(c, &(kex_cache_filter){.max_age_s = 3600}), 20);
  assert_int_equal(list_n(c, &(kex_cache_filter){.kernel_name = "r_2", .max_age_s = 3600}), 1);
  assert_int_equal(list_n(c, &(kex_cache_filter){.device = "no such device"}), 0);
  uint8_t key[32];
  char hex[65];
  key_of(7, key);
  kex_hex(key, 32, hex);
  hex[6] = 0;
  assert_int_equal(list_n(c, &(kex_cache_filter){.key_prefix = hex}), 1);
  for (char *p = hex; *p; p++)
    if (*p >= 'a') *p = (char)(*p - 'a' + 'A');
  assert_int_equal(list_n(c, &(kex_cache_filter){.key_prefix = hex}), 1);
  uint32_t n = 0;
  assert_int_equal(kex_cache_list(c, &(kex_cache_filter){.key_prefix = "xyz"}, 0, 10, NULL, NULL, &n, &err), KEX_EINVAL);
  assert_int_equal(kex_cache_list(c, NULL, 0, 0, NULL, NULL, &n, &err), KEX_EINVAL);

  /* pages of 7 cover all 30 exactly once */
  page_seen seen = {0};
  for (uint64_t off = 0;; off += 7) {
    assert_int_equal(kex_cache_list(c, NULL, off, 7, page_cb, &seen, &n, &err), 0);
    assert_true(n <= 7);
    if (n < 7) break;
  }
  assert_int_equal(seen.n, 30);
  for (int i = 1; i < seen.n; i++) assert_true(strcmp(seen.hex[i - 1], seen.hex[i]) < 0); /* key order */
  int stopped = 0;
  assert_int_equal(kex_cache_list(c, NULL, 0, 100, count_cb, &stopped, &n, &err), 0);
  assert_int_equal(stopped, 30);

  /* delete by filter */
  uint64_t deleted = 0;
  assert_int_equal(kex_cache_delete(c, &(kex_cache_filter){.device = "kind=cpu", .kernel_name = "r_1"}, &deleted, &err), 0);
  assert_int_equal(deleted, 1); /* r_1_16 (r_1x_16 are on the other device) */
  assert_int_equal(kex_cache_delete(c, &(kex_cache_filter){.max_age_s = 3600, .device = "PoCL"}, &deleted, &err), 0);
  assert_int_equal(deleted, 10); /* 10..19 are recent and on d */
  assert_int_equal(list_n(c, NULL), 19);
  assert_int_equal(kex_cache_delete(c, NULL, &deleted, &err), 0);
  assert_int_equal(deleted, 19);
  assert_int_equal(list_n(c, NULL), 0);
  kex_cache_close(c);
}

/* ---- setup ---- */

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/kex-test-cache-XXXXXX", base && base[0] ? base : "/tmp");
  if (!mkdtemp(tmpdir)) return -1;
  srand((unsigned)time(NULL));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_program_roundtrip),
      cmocka_unit_test(test_program_tampered_rows_never_returned),
      cmocka_unit_test(test_beam_roundtrip_and_misses),
      cmocka_unit_test(test_opts_text),
      cmocka_unit_test(test_corrupt_rows_dropped),
      cmocka_unit_test(test_migration_from_v1),
      cmocka_unit_test(test_migration_from_v2_drops_programs),
      cmocka_unit_test(test_migration_from_v3_decision),
      cmocka_unit_test(test_tenant_column),
      cmocka_unit_test(test_newer_or_foreign_refused),
      cmocka_unit_test(test_integrity_after_many_writes),
      cmocka_unit_test(test_two_handles_and_fork),
      cmocka_unit_test(test_concurrent_open_new_file),
      cmocka_unit_test(test_kill9_mid_transaction),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_import_foreign_identity),
      cmocka_unit_test(test_import_malformed_lines),
      cmocka_unit_test(test_import_old_export_program_refused),
      cmocka_unit_test(test_beam_line),
      cmocka_unit_test(test_beam_drop),
      cmocka_unit_test(test_list_filters_paging_delete),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

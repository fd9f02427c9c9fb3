/*
 * fuzz_cache.c - fuzz target: the cache reader (search/cache.c) on what a
 * damaged or hostile cache gives it.  The first byte picks the mode:
 *
 *   0  the rest is an export file, read by kex_cache_import (the line
 *      parser ImportCache runs on a client's bytes);
 *   1  a beam_results row made by kex_cache_beam_put has one column
 *      overwritten in SQLite (byte 1 picks the column, byte 2 the SQLite
 *      type: NULL, INTEGER, REAL, TEXT or BLOB, the rest is the value), then
 *      read back by kex_cache_beam_get, kex_cache_list, kex_cache_get_entry
 *      and kex_cache_export;
 *   2  the same for a programs row made by kex_cache_program_put, read by
 *      kex_cache_program_get;
 *   3  the same for the devices row both name, read by all the getters.
 *
 * The file is a real SQLite cache in a temporary folder (tmpcache.c),
 * written through a second sqlite3 connection the way a damaged disk or a
 * hand edit would; after each input every row is put back.  Any input must
 * end in a clean refusal (a corrupt row is dropped, never returned): no
 * crash, leak or sanitizer report.  A getter that returns a row whose
 * values differ from what was stored, when the input changed nothing the
 * reader looks at, is not checked here (that is tests/unit's job).
 *
 * Built like fuzz_wire: with -Dfuzzer=true a libFuzzer target, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/cache).
 */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "tests/fuzz/tmpcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const beam_cols[] = {"ast_key", "device_id", "search_opts", "codegen_version", "opts",
                                        "best_time_s", "hand_time_s", "search_time_s", "kernel_name", "created_at",
                                        "candidates", "ast_text"};
static const char *const prog_cols[] = {"source_sha256", "device_id", "kernel_name", "source",
                                        "binary", "binary_sha256", "created_at"};
static const char *const dev_cols[] = {"id", "kind", "vendor", "name", "driver_version", "compiler_version", "rendered"};

static const char SOURCE[] = "__kernel void E_4(__global float* data0) { data0[get_global_id(0)] = 1.0f; }";
static const uint8_t BINARY[] = {0x7f, 'E', 'L', 'F', 1, 2, 3, 4};

static sqlite3 *raw; /* the second connection: the damage */
static kex_device_identity ident = {"cpu", "fuzz", "fuzz device", "1", "cc 1"};
static kex_cache_beam_key bkey;

/* Every row back as the API wrote it. */
static void restore(kex_cache *c) {
  kex_cache_beam_value v;
  kex_error err;
  sqlite3_exec(raw, "DELETE FROM beam_results; DELETE FROM programs; DELETE FROM devices;", NULL, NULL, NULL);
  memset(&v, 0, sizeof v);
  v.nopts = 2;
  v.opts[0] = (kex_opt){.op = KEX_OPT_UPCAST, .axis = 0, .amt = 4};
  v.opts[1] = (kex_opt){.op = KEX_OPT_LOCAL, .axis = 0, .amt = 16};
  v.best_time_s = 1.5e-5;
  v.hand_time_s = 2e-5;
  v.search_time_s = 1.0;
  v.candidates = 10;
  snprintf(v.kernel_name, sizeof v.kernel_name, "r_16_8_8");
  if (kex_cache_beam_put(c, &bkey, &v, NULL, &err) < 0 ||
      kex_cache_program_put(c, SOURCE, sizeof SOURCE - 1, &ident, "E_4", BINARY, sizeof BINARY, &err) < 0) {
    fprintf(stderr, "fuzz_cache: cannot write the rows back: %s\n", err.msg);
    abort();
  }
}

static void teardown(void) {
  sqlite3_close(raw);
  raw = NULL;
}

static kex_cache *setup(void) {
  kex_cache *c = fuzz_tmpcache();
  for (int i = 0; i < KEX_AST_KEY_BYTES; i++) bkey.ast_key[i] = (uint8_t)(i * 7 + 1);
  bkey.device = &ident;
  bkey.search_opts = "beam=2";
  bkey.codegen_version = "kex-fuzz";
  if (sqlite3_open(fuzz_tmpcache_path(), &raw) != SQLITE_OK) abort();
  sqlite3_busy_timeout(raw, 5000);
  atexit(teardown); /* registered after tmpcache's: runs before it */
  restore(c);
  return c;
}

/* UPDATE table SET col = (fuzzed value of the chosen type). */
static void damage(const char *table, const char *col, uint8_t type, const uint8_t *v, size_t n) {
  char sql[160];
  sqlite3_stmt *s;
  int64_t iv = 0;
  double dv = 0;
  snprintf(sql, sizeof sql, "UPDATE %s SET %s = ?1", table, col);
  if (sqlite3_prepare_v2(raw, sql, -1, &s, NULL) != SQLITE_OK) return;
  switch (type % 5) {
  case 0: sqlite3_bind_null(s, 1); break;
  case 1: memcpy(&iv, v, n < sizeof iv ? n : sizeof iv); sqlite3_bind_int64(s, 1, iv); break;
  case 2: memcpy(&dv, v, n < sizeof dv ? n : sizeof dv); sqlite3_bind_double(s, 1, dv); break;
  case 3: sqlite3_bind_text(s, 1, (const char *)v, (int)n, SQLITE_TRANSIENT); break;
  default: sqlite3_bind_blob(s, 1, n ? (const void *)v : (const void *)"", (int)n, SQLITE_TRANSIENT); break;
  }
  sqlite3_step(s); /* a constraint may refuse it: then the row stays good */
  sqlite3_finalize(s);
}

static int count_cb(const kex_cache_entry *e, void *arg) {
  (void)e;
  (*(uint32_t *)arg)++;
  return 0;
}

/* Every getter over the (maybe damaged) rows. */
static void read_all(kex_cache *c) {
  kex_cache_beam_value v;
  kex_cache_program p;
  kex_cache_entry e;
  kex_error err;
  char hex[KEX_AST_KEY_HEX];
  uint32_t n = 0, count = 0;
  if (kex_cache_beam_get(c, &bkey, &v, &err) == 0 && v.nopts > KEX_CACHE_MAX_OPTS) __builtin_trap();
  if (kex_cache_program_get(c, SOURCE, sizeof SOURCE - 1, &ident, &p, &err) == 0) kex_free(p.binary);
  kex_cache_list(c, NULL, 0, 100, count_cb, &n, &count, &err);
  for (int i = 0; i < KEX_AST_KEY_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", bkey.ast_key[i]);
  if (kex_cache_get_entry(c, hex, NULL, &e, &err) == 0) kex_free(e.ast_text);
  FILE *f = fopen("/dev/null", "w");
  if (f) {
    kex_cache_export(c, f, NULL, NULL, &err);
    fclose(f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static kex_cache *c;
  kex_error err;
  if (!c) c = setup();
  if (size < 1) return 0;
  switch (data[0] % 4) {
  case 0: {
    kex_cache_import_report rep;
    FILE *f = size > 1 ? fmemopen((void *)(data + 1), size - 1, "r") : fmemopen((void *)"", 1, "r");
    if (!f) return 0;
    kex_cache_import(c, f, &rep, &err);
    fclose(f);
    read_all(c);
    break;
  }
  case 1:
  case 2:
  case 3: {
    if (size < 3) return 0;
    const char *const *cols = data[0] % 4 == 1 ? beam_cols : data[0] % 4 == 2 ? prog_cols : dev_cols;
    size_t ncols = data[0] % 4 == 1 ? sizeof beam_cols / sizeof *beam_cols
                   : data[0] % 4 == 2 ? sizeof prog_cols / sizeof *prog_cols
                                      : sizeof dev_cols / sizeof *dev_cols;
    const char *table = data[0] % 4 == 1 ? "beam_results" : data[0] % 4 == 2 ? "programs" : "devices";
    damage(table, cols[data[1] % ncols], data[2], data + 3, size - 3);
    read_all(c);
    break;
  }
  }
  restore(c);
  return 0;
}

/*
 * cache.c - the SQLite program and beam cache (cache.h has the schema and
 * the export format).
 *
 * One handle = one connection in WAL mode with a busy timeout, foreign keys
 * on, and its prepared statements (prepared on first use, kept until
 * close).  Every write is one BEGIN IMMEDIATE ... COMMIT, so concurrent
 * writers queue on the busy timeout instead of failing on a lock upgrade,
 * and a process killed mid-write leaves the last committed state.  Opening
 * retries the WAL switch and the schema transaction with backoff while
 * another opener holds the file (SQLite does not always call the busy
 * handler there: two processes creating one new file used to fail with
 * "database is locked").  Every read decodes and checks its row; a row
 * that does not decode, or a program row that does not verify against the
 * source rendered now and its binary digest, is deleted and reported
 * (KEX_ECORRUPT), never returned.  Import takes beam results only.
 *
 * Device identities are rows of `devices`; the rendered form kept there is
 * only for display and substring filters (the key is the five fields),
 * rendered by kex_device_identity_render.
 */
#include "search/cache.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

/* ---- statements ---- */

#define BEAM_COLS                                                                                         \
  "b.rowid, b.ast_key, d.kind, d.vendor, d.name, d.driver_version, d.compiler_version, d.rendered, "      \
  "b.search_opts, b.codegen_version, b.opts, b.best_time_s, b.hand_time_s, b.search_time_s, b.candidates, " \
  "b.kernel_name, b.created_at, b.decision_samples, b.decision_spread, b.decision_tie, b.tenant"
#define BEAM_FROM " FROM beam_results b JOIN devices d ON d.id = b.device_id"
#define DEV_MATCH "d.kind = ?2 AND d.vendor = ?3 AND d.name = ?4 AND d.driver_version = ?5 AND d.compiler_version = ?6"
/* ?1 device substring, ?2 kernel substring, ?3 key prefix (upper hex), ?4 min created_at, ?7 tenant */
#define FILTER_WHERE                                                                              \
  " WHERE (?1 = '' OR instr(d.rendered, ?1) > 0) AND (?2 = '' OR instr(b.kernel_name, ?2) > 0)" \
  " AND (?3 = '' OR substr(hex(b.ast_key), 1, length(?3)) = ?3) AND b.created_at >= ?4"        \
  " AND (?7 = '' OR b.tenant = ?7)"

#define STMT_MAP(XX)                                                                                             \
  XX(BEGIN, "BEGIN IMMEDIATE")                                                                                    \
  XX(COMMIT, "COMMIT")                                                                                            \
  XX(ROLLBACK, "ROLLBACK")                                                                                        \
  XX(DEV_INSERT, "INSERT OR IGNORE INTO devices(kind, vendor, name, driver_version, compiler_version, rendered) " \
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6)")                                                               \
  XX(DEV_ID, "SELECT id FROM devices WHERE kind = ?1 AND vendor = ?2 AND name = ?3 AND driver_version = ?4 "     \
             "AND compiler_version = ?5")                                                                         \
  XX(PROG_PUT, "INSERT OR REPLACE INTO programs(source_sha256, device_id, kernel_name, source, binary, "        \
               "binary_sha256, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")                                  \
  XX(PROG_GET, "SELECT p.rowid, p.kernel_name, p.binary, p.created_at, p.source, p.binary_sha256 FROM programs p " \
               "JOIN devices d ON d.id = p.device_id WHERE p.source_sha256 = ?1 AND " DEV_MATCH)                 \
  XX(PROG_DROP, "DELETE FROM programs WHERE rowid = ?1")                                                          \
  XX(BEAM_PUT, "INSERT OR REPLACE INTO beam_results(ast_key, device_id, search_opts, codegen_version, opts, "     \
               "best_time_s, hand_time_s, search_time_s, candidates, kernel_name, created_at, ast_text, "         \
               "decision_samples, decision_spread, decision_tie, tenant) "                                        \
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)")                  \
  XX(BEAM_GET, "SELECT " BEAM_COLS BEAM_FROM " WHERE b.ast_key = ?1 AND " DEV_MATCH                              \
               " AND b.search_opts = ?7 AND b.codegen_version = ?8")                                              \
  XX(BEAM_LINE, "SELECT " BEAM_COLS ", b.ast_text" BEAM_FROM " WHERE b.ast_key = ?1 AND " DEV_MATCH                \
                " AND b.search_opts = ?7 AND b.codegen_version = ?8")                                             \
  XX(BEAM_DROP, "DELETE FROM beam_results WHERE rowid = ?1")                                                      \
  XX(BEAM_DROP_KEY, "DELETE FROM beam_results WHERE ast_key = ?1 AND device_id IN (SELECT d.id FROM devices d "   \
                    "WHERE " DEV_MATCH ") AND search_opts = ?7 AND codegen_version = ?8 AND opts = ?9")           \
  XX(BEAM_LIST, "SELECT " BEAM_COLS BEAM_FROM FILTER_WHERE                                                        \
                " ORDER BY b.ast_key, d.id, b.search_opts, b.codegen_version LIMIT ?5 OFFSET ?6")                \
  XX(BEAM_ENTRY, "SELECT " BEAM_COLS ", b.ast_text" BEAM_FROM                                                     \
                 " WHERE b.ast_key = ?1 AND (?2 = '' OR d.rendered = ?2) AND (?3 = '' OR b.tenant = ?3)"          \
                 " ORDER BY b.created_at DESC LIMIT 1")                                                          \
  XX(BEAM_DELETE, "DELETE FROM beam_results WHERE rowid IN (SELECT b.rowid" BEAM_FROM FILTER_WHERE ")")          \
  XX(BEAM_EXPORT, "SELECT " BEAM_COLS ", b.ast_text" BEAM_FROM FILTER_WHERE                                       \
                  " ORDER BY b.ast_key, d.id, b.search_opts, b.codegen_version")

enum {
#define XX(name, sql) STMT_##name,
  STMT_MAP(XX)
#undef XX
  STMT_COUNT
};

static const char *const stmt_sql[STMT_COUNT] = {
#define XX(name, sql) sql,
    STMT_MAP(XX)
#undef XX
};

/* Column indexes of BEAM_COLS. */
enum { BC_ROWID, BC_KEY, BC_KIND, BC_VENDOR, BC_NAME, BC_DRIVER, BC_COMPILER, BC_RENDERED, BC_SEARCH, BC_CODEGEN,
       BC_OPTS, BC_BEST, BC_HAND, BC_SEARCH_TIME, BC_CANDIDATES, BC_KERNEL, BC_CREATED, BC_SAMPLES, BC_SPREAD, BC_TIE,
       BC_TENANT, BC_AST_TEXT };

struct kex_cache {
  sqlite3 *db;
  char *path;
  sqlite3_stmt *stmt[STMT_COUNT];
  kex_cache_stats stats;
};

/* ---- errors ---- */

static int sqlite_code(int rc) {
  switch (rc & 0xff) {
  case SQLITE_NOMEM: return KEX_ENOMEM;
  case SQLITE_BUSY:
  case SQLITE_LOCKED: return KEX_EUNAVAILABLE;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB: return KEX_ECORRUPT;
  case SQLITE_IOERR:
  case SQLITE_CANTOPEN:
  case SQLITE_READONLY:
  case SQLITE_FULL:
  case SQLITE_PERM: return KEX_EIO;
  case SQLITE_TOOBIG: return KEX_ELIMIT;
  default: return KEX_EINTERNAL;
  }
}

/* Map a SQLite result to a KEX_E* code with the connection's message. */
static int db_err(kex_cache *c, int rc, kex_error *err, const char *what) {
  return kex_err_set(err, sqlite_code(rc), "cache %s: %s: %s (%s)", c->path, what,
                     c->db ? sqlite3_errmsg(c->db) : "no connection", sqlite3_errstr(rc));
}

static int get_stmt(kex_cache *c, int which, sqlite3_stmt **out, kex_error *err) {
  if (!c->stmt[which]) {
    int rc = sqlite3_prepare_v3(c->db, stmt_sql[which], -1, SQLITE_PREPARE_PERSISTENT, &c->stmt[which], NULL);
    if (rc != SQLITE_OK) return db_err(c, rc, err, "prepare");
  }
  *out = c->stmt[which];
  return 0;
}

static void stmt_done(sqlite3_stmt *s) {
  if (!s) return;
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
}

/* Run a statement that returns no rows. */
static int run_stmt(kex_cache *c, int which, kex_error *err, const char *what) {
  sqlite3_stmt *s = NULL;
  int rc = get_stmt(c, which, &s, err);
  if (rc) return rc;
  rc = sqlite3_step(s);
  stmt_done(s);
  return rc == SQLITE_DONE ? 0 : db_err(c, rc, err, what);
}

static int tx_begin(kex_cache *c, kex_error *err) { return run_stmt(c, STMT_BEGIN, err, "begin"); }
static int tx_commit(kex_cache *c, kex_error *err) { return run_stmt(c, STMT_COMMIT, err, "commit"); }
static void tx_rollback(kex_cache *c) {
  if (!sqlite3_get_autocommit(c->db)) run_stmt(c, STMT_ROLLBACK, NULL, "rollback");
}

/* ---- small checks and encodings ---- */

static bool field_ok(const char *s, size_t cap) { return s && s[0] && memchr(s, 0, cap) != NULL; }

static int check_identity(const kex_device_identity *d, kex_error *err) {
  if (!d) return kex_err_set(err, KEX_EINVAL, "cache: no device identity");
  const char *names[5] = {"kind", "vendor", "name", "driver_version", "compiler_version"};
  const char *vals[5] = {d->kind, d->vendor, d->name, d->driver_version, d->compiler_version};
  for (int i = 0; i < 5; i++)
    if (!field_ok(vals[i], KEX_DEVICE_FIELD_MAX))
      return kex_err_set(err, KEX_EINVAL, "cache: device identity %s is empty or not terminated", names[i]);
  return 0;
}

static int check_kernel_name(const char *name, kex_error *err) {
  size_t n = name ? strnlen(name, KEX_CACHE_KERNEL_NAME_MAX) : 0;
  if (n == 0 || n >= KEX_CACHE_KERNEL_NAME_MAX)
    return kex_err_set(err, KEX_EINVAL, "cache: kernel name must be 1..%d bytes", KEX_CACHE_KERNEL_NAME_MAX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'))
      return kex_err_set(err, KEX_EINVAL, "cache: kernel name \"%.*s\" has a character outside [A-Za-z0-9_]",
                         (int)n, name);
  }
  return 0;
}

static int check_string(const char *s, size_t cap, const char *what, kex_error *err) {
  if (!s) return kex_err_set(err, KEX_EINVAL, "cache: %s is missing", what);
  if (strnlen(s, cap) >= cap) return kex_err_set(err, KEX_ELIMIT, "cache: %s is %zu bytes or longer (limit %zu)", what, cap, cap - 1);
  return 0;
}

static bool time_ok(double t) { return isfinite(t) && t >= 0; }

/* Copy a NUL-terminated string into dst[cap], cut to fit (always terminated). */
static void copy_cut(char *dst, size_t cap, const char *src) {
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n) memcpy(dst, src, n);
  dst[n] = 0;
}

static void copy_field(char *dst, size_t cap, const unsigned char *src) { copy_cut(dst, cap, (const char *)src); }

int kex_cache_opts_format(const kex_opt *opts, uint32_t n, char *buf, size_t len) {
  size_t at = 0;
  if (len == 0) return KEX_ELIMIT;
  buf[0] = 0;
  for (uint32_t i = 0; i < n; i++) {
    char one[64];
    int k = kex_opt_short(opts[i], one, sizeof one);
    if (k < 0 || (size_t)k >= sizeof one || at + (i ? 1 : 0) + (size_t)k + 1 > len) return KEX_ELIMIT;
    if (i) buf[at++] = ' ';
    memcpy(buf + at, one, (size_t)k + 1);
    at += (size_t)k;
  }
  return 0;
}

/* One number or "None" of an opt ("4", "None"); advances *p. */
static bool parse_opt_field(const char **p, int32_t *v) {
  if (!strncmp(*p, "None", 4)) {
    *v = KEX_OPT_NONE;
    *p += 4;
    return true;
  }
  const char *s = *p;
  long long x = 0;
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') {
    x = x * 10 + (*s++ - '0');
    if (x > INT32_MAX) return false;
  }
  *v = (int32_t)x;
  *p = s;
  return true;
}

int kex_cache_opts_parse(const char *text, kex_opt *opts, uint32_t max, uint32_t *n, kex_error *err) {
  const char *p = text;
  *n = 0;
  if (!text) return kex_err_set(err, KEX_EPARSE, "opts text is missing");
  if (strlen(text) >= KEX_CACHE_OPTS_TEXT_MAX)
    return kex_err_set(err, KEX_ELIMIT, "opts text over %d bytes", KEX_CACHE_OPTS_TEXT_MAX - 1);
  while (*p) {
    if (*n && *p++ != ' ') return kex_err_set(err, KEX_EPARSE, "opts text: expected one space at byte %td", p - 1 - text);
    if (*n >= max) return kex_err_set(err, KEX_ELIMIT, "opts text: more than %u opts", max);
    const char *tok = p;
    kex_opt o = {0};
    if (!strncmp(p, "NOLOCALS", 8) && (p[8] == ' ' || !p[8])) {
      o = kex_opt_make(KEX_OPT_NOLOCALS, KEX_OPT_NONE, KEX_OPT_NONE);
      p += 8;
    } else {
      int op = -1;
      for (int i = 0; i < KEX_OPT_COUNT; i++) {
        const char *name = kex_optop_name((kex_optop)i);
        size_t l = strlen(name);
        if (i != KEX_OPT_NOLOCALS && !strncmp(p, name, l) && p[l] == '(') {
          op = i;
          p += l + 1;
          break;
        }
      }
      if (op < 0 || !parse_opt_field(&p, &o.axis) || *p++ != ',' || !parse_opt_field(&p, &o.amt) || *p++ != ')')
        return kex_err_set(err, KEX_EPARSE, "opts text: bad opt at byte %td (\"%.24s\")", tok - text, tok);
      o.op = (kex_optop)op;
    }
    opts[(*n)++] = o;
  }
  return 0;
}

/* ---- open, schema, migrations ---- */

/* Each step takes the file from version i to i + 1 (run inside the upgrade transaction). */
static const char *const migrations[KEX_CACHE_SCHEMA_VERSION] = {
    /* 0 -> 1 */
    "CREATE TABLE schema_version(version INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES (0);"
    "CREATE TABLE devices(id INTEGER PRIMARY KEY, kind TEXT NOT NULL, vendor TEXT NOT NULL, name TEXT NOT NULL,"
    " driver_version TEXT NOT NULL, compiler_version TEXT NOT NULL, rendered TEXT NOT NULL,"
    " UNIQUE(kind, vendor, name, driver_version, compiler_version));"
    "CREATE TABLE programs(source_sha256 BLOB NOT NULL, device_id INTEGER NOT NULL REFERENCES devices(id),"
    " kernel_name TEXT NOT NULL, binary BLOB NOT NULL, created_at INTEGER NOT NULL,"
    " PRIMARY KEY(source_sha256, device_id));"
    "CREATE TABLE beam_results(ast_key BLOB NOT NULL, device_id INTEGER NOT NULL REFERENCES devices(id),"
    " search_opts TEXT NOT NULL, codegen_version TEXT NOT NULL, opts TEXT NOT NULL, best_time_s REAL NOT NULL,"
    " hand_time_s REAL NOT NULL, search_time_s REAL NOT NULL, kernel_name TEXT NOT NULL,"
    " created_at INTEGER NOT NULL, PRIMARY KEY(ast_key, device_id, search_opts, codegen_version));",
    /* 1 -> 2: candidates tried, the AST text, indexes for the list filters */
    "ALTER TABLE beam_results ADD COLUMN candidates INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE beam_results ADD COLUMN ast_text TEXT;"
    "CREATE INDEX beam_results_created ON beam_results(created_at);"
    "CREATE INDEX beam_results_kernel ON beam_results(kernel_name);"
    "CREATE INDEX programs_device ON programs(device_id);",
    /*
     * 2 -> 3: a program row keeps the source it was compiled from and its
     * binary's SHA-256, checked on every get.  v2 rows have neither (and an
     * import could have written them), so they are dropped, not converted:
     * their kernels are compiled again from the source rendered then.
     */
    "DROP TABLE programs;"
    "CREATE TABLE programs(source_sha256 BLOB NOT NULL, device_id INTEGER NOT NULL REFERENCES devices(id),"
    " kernel_name TEXT NOT NULL, source TEXT NOT NULL, binary BLOB NOT NULL, binary_sha256 BLOB NOT NULL,"
    " created_at INTEGER NOT NULL, PRIMARY KEY(source_sha256, device_id));"
    "CREATE INDEX programs_device ON programs(device_id);",
    /* 3 -> 4: how the search decided (search/beam.h): paired rounds, measured noise, whether the tie rule chose */
    "ALTER TABLE beam_results ADD COLUMN decision_samples INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE beam_results ADD COLUMN decision_spread REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE beam_results ADD COLUMN decision_tie INTEGER NOT NULL DEFAULT 0;",
    /* 4 -> 5: the kexd tenant whose search made the entry (NULL for older rows, imports, peers, in-process) */
    "ALTER TABLE beam_results ADD COLUMN tenant TEXT;",
};

/* mkdir -p of the directory part of path. */
static int make_parent_dirs(const char *path, kex_error *err) {
  int rc = 0;
  char *dir = kex_strdup(path);
  if (!dir) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) goto out;
  *slash = 0;
  for (char *p = dir + 1;; p++) {
    if (*p && *p != '/') continue;
    char saved = *p;
    *p = 0;
    struct stat st;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      rc = kex_err_set(err, KEX_EIO, "cache: cannot create directory %s: %s", dir, strerror(errno));
      goto out;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
      rc = kex_err_set(err, KEX_EIO, "cache: %s is not a directory", dir);
      goto out;
    }
    *p = saved;
    if (!saved) break;
  }
out:
  kex_free(dir);
  return rc;
}

/* A one-value query: *out = first column of the first row (0 when no row). */
static int query_int(kex_cache *c, const char *sql, int64_t *out, kex_error *err) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(c->db, sql, -1, &s, NULL);
  *out = 0;
  if (rc != SQLITE_OK) {
    rc = db_err(c, rc, err, sql);
    goto out;
  }
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) *out = sqlite3_column_int64(s, 0);
  rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(c, rc, err, sql);
out:
  sqlite3_finalize(s);
  return rc;
}

/* The file's version: 0 for an empty file; KEX_EUNSUPPORTED for a SQLite file that is not ours. */
static int read_version(kex_cache *c, int64_t *version, kex_error *err) {
  int64_t ours = 0, tables = 0;
  int rc = query_int(c, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'", &ours, err);
  if (!rc) rc = query_int(c, "SELECT count(*) FROM sqlite_master", &tables, err);
  if (rc) return rc;
  if (!ours) {
    *version = 0;
    if (tables) return kex_err_set(err, KEX_EUNSUPPORTED, "cache %s: a SQLite file that is not a kex cache (no schema_version table)", c->path);
    return 0;
  }
  return query_int(c, "SELECT version FROM schema_version", version, err);
}

static int migrate(kex_cache *c, kex_error *err) {
  int64_t version = 0;
  int rc = tx_begin(c, err);
  if (rc) goto out;
  if ((rc = read_version(c, &version, err))) goto out;
  if (version > KEX_CACHE_SCHEMA_VERSION || version < 0) {
    rc = kex_err_set(err, KEX_EUNSUPPORTED, "cache %s has schema version %lld; this kex knows versions up to %d",
                     c->path, (long long)version, KEX_CACHE_SCHEMA_VERSION);
    goto out;
  }
  for (int64_t v = version; v < KEX_CACHE_SCHEMA_VERSION; v++) {
    char *msg = NULL;
    char bump[80];
    int64_t programs = 0;
    if (v == 2 && (rc = query_int(c, "SELECT count(*) FROM programs", &programs, err))) goto out;
    int src = sqlite3_exec(c->db, migrations[v], NULL, NULL, &msg);
    if (src == SQLITE_OK) {
      snprintf(bump, sizeof bump, "UPDATE schema_version SET version = %lld", (long long)v + 1);
      src = sqlite3_exec(c->db, bump, NULL, NULL, &msg);
    }
    if (src != SQLITE_OK) {
      rc = kex_err_set(err, sqlite_code(src), "cache %s: migration %lld -> %lld failed: %s", c->path, (long long)v,
                       (long long)v + 1, msg ? msg : sqlite3_errstr(src));
      sqlite3_free(msg);
      goto out;
    }
    if (version > 0) KEX_INFO("cache %s: migrated schema %lld -> %lld", c->path, (long long)v, (long long)v + 1);
    if (programs > 0)
      KEX_WARN("cache %s: dropped %lld compiled program(s) of schema 2: they cannot be verified (no source or binary "
               "digest) and are compiled again on use", c->path, (long long)programs);
  }
  rc = tx_commit(c, err);
out:
  if (rc) tx_rollback(c);
  return rc;
}

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Per-connection settings and the switch to WAL.  The mode switch needs the
 * file to itself and SQLite may report SQLITE_BUSY there without calling
 * the busy handler (another connection is creating or switching the same
 * new file): KEX_EUNAVAILABLE, which kex_cache_open retries.  A file system
 * without WAL support keeps its mode (logged once per open).
 */
static int setup_connection(kex_cache *c, kex_error *err) {
  sqlite3_stmt *s = NULL;
  char *msg = NULL;
  int rc = 0;
  int src = sqlite3_exec(c->db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;", NULL, NULL, &msg);
  if (src == SQLITE_OK) src = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode=WAL", -1, &s, NULL);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src == SQLITE_ROW) {
    const char *mode = (const char *)sqlite3_column_text(s, 0);
    if (!mode || strcmp(mode, "wal"))
      KEX_WARN("cache %s: journal mode is %s, not wal (the file system may not support it)", c->path,
               mode ? mode : "unknown");
    src = SQLITE_OK;
  }
  if (src != SQLITE_OK)
    rc = kex_err_set(err, sqlite_code(src), "cache %s: setting up the connection: %s", c->path,
                     msg ? msg : sqlite3_errmsg(c->db));
  sqlite3_finalize(s);
  sqlite3_free(msg);
  return rc;
}

int kex_cache_open(const char *path, kex_cache **out, kex_error *err) {
  kex_cache *c = NULL;
  int rc = 0, src;
  double start = mono_ms(), wait_ms = 1;
  unsigned tries = 0;
  uint64_t jitter = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(start * 1e3);

  *out = NULL;
  if (!path || !path[0]) return kex_err_set(err, KEX_EINVAL, "cache: empty path");
  if ((rc = make_parent_dirs(path, err))) goto out;
  c = kex_calloc(1, sizeof *c);
  if (!c || !(c->path = kex_strdup(path))) {
    rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
    goto out;
  }
  src = sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (src != SQLITE_OK) {
    rc = db_err(c, src, err, "open");
    goto out;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_timeout(c->db, KEX_CACHE_BUSY_TIMEOUT_MS);
  /* the WAL switch, then the schema (one BEGIN IMMEDIATE transaction): again while the file is busy */
  for (;;) {
    tries++;
    rc = setup_connection(c, err);
    if (!rc) rc = migrate(c, err);
    if (rc != KEX_EUNAVAILABLE || mono_ms() - start + wait_ms > KEX_CACHE_BUSY_TIMEOUT_MS) break;
    jitter ^= jitter << 13, jitter ^= jitter >> 7, jitter ^= jitter << 17;
    double ms = wait_ms * (0.5 + (double)(jitter % 1000) / 1000.0); /* 0.5x .. 1.5x: openers spread out */
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
    if (wait_ms < 64) wait_ms *= 2;
  }
  if (rc == KEX_EUNAVAILABLE) {
    char why[KEX_ERROR_MSG_MAX];
    snprintf(why, sizeof why, "%s", err ? err->msg : "");
    kex_err_set(err, rc, "%.400s (still locked by another connection after %u tries in %.0f ms)", why, tries,
                mono_ms() - start);
  } else if (!rc && tries > 1) {
    KEX_DEBUG("cache %s: opened after %u tries (%.0f ms; another connection held the file)", path, tries,
              mono_ms() - start);
  }
  if (rc) goto out;
  *out = c;
  c = NULL;
out:
  kex_cache_close(c);
  return rc;
}

void kex_cache_close(kex_cache *c) {
  if (!c) return;
  for (int i = 0; i < STMT_COUNT; i++) sqlite3_finalize(c->stmt[i]);
  sqlite3_close(c->db);
  kex_free(c->path);
  kex_free(c);
}

int kex_cache_schema_version(kex_cache *c, kex_error *err) {
  int64_t v = 0;
  int rc = query_int(c, "SELECT version FROM schema_version", &v, err);
  return rc ? rc : (int)v;
}

void kex_cache_get_stats(const kex_cache *c, kex_cache_stats *out) { *out = c->stats; }

/* ---- devices ---- */

static int bind_identity(sqlite3_stmt *s, int first, const kex_device_identity *d) {
  const char *vals[5] = {d->kind, d->vendor, d->name, d->driver_version, d->compiler_version};
  for (int i = 0; i < 5; i++) {
    int rc = sqlite3_bind_text(s, first + i, vals[i], -1, SQLITE_STATIC);
    if (rc != SQLITE_OK) return rc;
  }
  return SQLITE_OK;
}

/* The devices row of d, inserted when new (inside the caller's transaction). */
static int device_id(kex_cache *c, const kex_device_identity *d, int64_t *id, kex_error *err) {
  char rendered[KEX_DEVICE_IDENTITY_STR_MAX];
  sqlite3_stmt *s = NULL;
  int rc, src;

  if (kex_device_identity_render(d, rendered, sizeof rendered) < 0)
    return kex_err_set(err, KEX_ELIMIT, "cache: device identity renders longer than %d bytes", KEX_DEVICE_IDENTITY_STR_MAX);
  if ((rc = get_stmt(c, STMT_DEV_INSERT, &s, err))) goto out;
  src = bind_identity(s, 1, d);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 6, rendered, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src != SQLITE_DONE) {
    rc = db_err(c, src, err, "insert device");
    goto out;
  }
  stmt_done(s);
  if ((rc = get_stmt(c, STMT_DEV_ID, &s, err))) goto out;
  src = bind_identity(s, 1, d);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src != SQLITE_ROW) {
    rc = db_err(c, src, err, "find device");
    goto out;
  }
  *id = sqlite3_column_int64(s, 0);
out:
  stmt_done(s);
  return rc;
}

/* ---- programs ---- */

int kex_cache_program_put(kex_cache *c, const char *source, size_t source_len, const kex_device_identity *dev,
                          const char *kernel_name, const void *binary, size_t binary_len, kex_error *err) {
  uint8_t hash[32], bin_hash[32];
  int64_t dev_id = 0;
  sqlite3_stmt *s = NULL;
  int rc, src;

  if (!source || !source_len) return kex_err_set(err, KEX_EINVAL, "cache: program source is empty");
  if (source_len > KEX_DEVICE_SOURCE_MAX)
    return kex_err_set(err, KEX_ELIMIT, "cache: source of %zu bytes over the %u-byte limit", source_len, KEX_DEVICE_SOURCE_MAX);
  if (!binary || !binary_len) return kex_err_set(err, KEX_EINVAL, "cache: program binary is empty");
  if (binary_len > KEX_DEVICE_BINARY_MAX)
    return kex_err_set(err, KEX_ELIMIT, "cache: binary of %zu bytes over the %u-byte limit", binary_len, KEX_DEVICE_BINARY_MAX);
  if ((rc = check_identity(dev, err)) || (rc = check_kernel_name(kernel_name, err))) return rc;
  if (kex_sha256_bytes(source, source_len, hash) || kex_sha256_bytes(binary, binary_len, bin_hash))
    return kex_err_set(err, KEX_ENOMEM, "cache: out of memory hashing");
  if ((rc = tx_begin(c, err))) goto out;
  if ((rc = device_id(c, dev, &dev_id, err))) goto out;
  if ((rc = get_stmt(c, STMT_PROG_PUT, &s, err))) goto out;
  src = sqlite3_bind_blob(s, 1, hash, 32, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 2, dev_id);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 3, kernel_name, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text64(s, 4, source, source_len, SQLITE_STATIC, SQLITE_UTF8);
  if (src == SQLITE_OK) src = sqlite3_bind_blob64(s, 5, binary, binary_len, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_blob(s, 6, bin_hash, 32, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 7, (int64_t)time(NULL));
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src != SQLITE_DONE) {
    rc = db_err(c, src, err, "store program");
    goto out;
  }
  stmt_done(s);
  s = NULL;
  rc = tx_commit(c, err);
out:
  stmt_done(s);
  if (rc) tx_rollback(c);
  return rc;
}

/* Delete one row by rowid after a failed decode or check (its own statement, outside any open read). */
static void drop_row(kex_cache *c, int which, int64_t rowid, const char *table, const char *why) {
  sqlite3_stmt *s = NULL;
  kex_error e = {0};
  c->stats.corrupt_dropped++;
  KEX_WARN("cache %s: dropping %s row %lld: %s", c->path, table, (long long)rowid, why);
  if (get_stmt(c, which, &s, &e)) goto out;
  sqlite3_bind_int64(s, 1, rowid);
  if (sqlite3_step(s) != SQLITE_DONE) KEX_WARN("cache %s: could not delete %s row %lld: %s", c->path, table,
                                              (long long)rowid, sqlite3_errmsg(c->db));
out:
  stmt_done(s);
  if (e.code) KEX_WARN("%s", e.msg);
}

int kex_cache_program_get(kex_cache *c, const char *source, size_t source_len, const kex_device_identity *dev,
                          kex_cache_program *out, kex_error *err) {
  uint8_t hash[32];
  sqlite3_stmt *s = NULL;
  int64_t bad_row = -1;
  char why[128] = "", kname[KEX_CACHE_KERNEL_NAME_MAX] = "", hex[65];
  int rc, src;

  memset(out, 0, sizeof *out);
  if (!source) return kex_err_set(err, KEX_EINVAL, "cache: program source is missing");
  if ((rc = check_identity(dev, err))) return rc;
  if (kex_sha256_bytes(source, source_len, hash)) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory hashing");
  kex_hex(hash, 32, hex);
  if ((rc = get_stmt(c, STMT_PROG_GET, &s, err))) goto out;
  src = sqlite3_bind_blob(s, 1, hash, 32, SQLITE_STATIC);
  if (src == SQLITE_OK) src = bind_identity(s, 2, dev);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src == SQLITE_DONE) {
    c->stats.program_misses++;
    rc = KEX_ENOTFOUND;
    kex_err_set(err, rc, "cache: no program for this source on this device");
    goto out;
  }
  if (src != SQLITE_ROW) {
    rc = db_err(c, src, err, "find program");
    goto out;
  }
  /* the row must prove it is what this process compiled from this very source (types read before any conversion) */
  int t_name = sqlite3_column_type(s, 1), t_bin = sqlite3_column_type(s, 2), t_created = sqlite3_column_type(s, 3);
  int t_src = sqlite3_column_type(s, 4), t_hash = sqlite3_column_type(s, 5);
  const unsigned char *name = sqlite3_column_text(s, 1);
  int blen = sqlite3_column_bytes(s, 2);
  uint8_t bin_hash[32];
  copy_field(kname, sizeof kname, name);
  if (t_name != SQLITE_TEXT || check_kernel_name((const char *)name, NULL)) {
    snprintf(why, sizeof why, "kernel_name is not a kernel name");
  } else if (t_bin != SQLITE_BLOB || blen <= 0) {
    snprintf(why, sizeof why, "binary is not a non-empty blob");
  } else if (t_created != SQLITE_INTEGER) {
    snprintf(why, sizeof why, "created_at is not an integer");
  } else if (t_src != SQLITE_TEXT || (size_t)sqlite3_column_bytes(s, 4) != source_len ||
             memcmp(sqlite3_column_text(s, 4), source, source_len) != 0) {
    snprintf(why, sizeof why, "its source is not byte-equal to the source rendered now");
  } else if (t_hash != SQLITE_BLOB || sqlite3_column_bytes(s, 5) != 32) {
    snprintf(why, sizeof why, "binary_sha256 is not a 32-byte blob");
  } else if (kex_sha256_bytes(sqlite3_column_blob(s, 2), (size_t)blen, bin_hash)) {
    rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory hashing a %d-byte binary", blen);
    goto out;
  } else if (memcmp(bin_hash, sqlite3_column_blob(s, 5), 32) != 0) {
    snprintf(why, sizeof why, "its binary does not hash to its binary_sha256");
  }
  if (why[0]) {
    bad_row = sqlite3_column_int64(s, 0);
    goto out;
  }
  out->binary = kex_malloc((size_t)blen);
  if (!out->binary) {
    rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory for a %d-byte binary", blen);
    goto out;
  }
  memcpy(out->binary, sqlite3_column_blob(s, 2), (size_t)blen);
  out->binary_len = (size_t)blen;
  copy_field(out->kernel_name, sizeof out->kernel_name, name);
  out->created_at = sqlite3_column_int64(s, 3);
  c->stats.program_hits++;
out:
  stmt_done(s);
  if (bad_row >= 0) {
    char what[320];
    snprintf(what, sizeof what, "kernel %.64s, source SHA-256 %s: %s", kname[0] ? kname : "?", hex, why);
    drop_row(c, STMT_PROG_DROP, bad_row, "programs", what);
    rc = kex_err_set(err, KEX_ECORRUPT, "cache %s: dropped a program row that does not verify (%s)", c->path, what);
  }
  return rc;
}

/* ---- beam results ---- */

static int check_beam_key(const kex_cache_beam_key *key, kex_error *err) {
  int rc = check_identity(key->device, err);
  if (!rc) rc = check_string(key->search_opts, KEX_CACHE_SEARCH_OPTS_MAX, "search options", err);
  if (!rc) rc = check_string(key->codegen_version, KEX_CACHE_CODEGEN_MAX, "codegen version", err);
  return rc;
}

static int check_beam_value(const kex_cache_beam_value *v, kex_error *err) {
  if (v->nopts > KEX_CACHE_MAX_OPTS) return kex_err_set(err, KEX_ELIMIT, "cache: %u opts (at most %d)", v->nopts, KEX_CACHE_MAX_OPTS);
  for (uint32_t i = 0; i < v->nopts; i++) {
    const kex_opt *o = &v->opts[i];
    if ((unsigned)o->op >= KEX_OPT_COUNT || o->axis < KEX_OPT_NONE || o->amt < KEX_OPT_NONE)
      return kex_err_set(err, KEX_EINVAL, "cache: opt %u is out of range (op %d, axis %d, amt %d)", i, (int)o->op,
                         (int)o->axis, (int)o->amt);
  }
  if (!time_ok(v->best_time_s) || !time_ok(v->hand_time_s) || !time_ok(v->search_time_s))
    return kex_err_set(err, KEX_EINVAL, "cache: times must be finite and non-negative (best %g, hand %g, search %g)",
                       v->best_time_s, v->hand_time_s, v->search_time_s);
  if (v->candidates < 0) return kex_err_set(err, KEX_EINVAL, "cache: candidates %lld < 0", (long long)v->candidates);
  if (v->decision_samples < 0 || !time_ok(v->decision_spread))
    return kex_err_set(err, KEX_EINVAL, "cache: decision samples %lld or spread %g out of range",
                       (long long)v->decision_samples, v->decision_spread);
  if (v->created_at < 0) return kex_err_set(err, KEX_EINVAL, "cache: created_at %lld < 0", (long long)v->created_at);
  if (strnlen(v->tenant, sizeof v->tenant) == sizeof v->tenant)
    return kex_err_set(err, KEX_ELIMIT, "cache: tenant over %d bytes", KEX_CACHE_TENANT_MAX - 1);
  return check_kernel_name(v->kernel_name, err);
}

/* Store one beam row inside an open transaction. */
static int beam_store(kex_cache *c, const kex_cache_beam_key *key, const kex_cache_beam_value *val,
                      const char *ast_text, kex_error *err) {
  char opts[KEX_CACHE_OPTS_TEXT_MAX];
  int64_t dev_id = 0;
  sqlite3_stmt *s = NULL;
  int rc, src;

  if (kex_cache_opts_format(val->opts, val->nopts, opts, sizeof opts))
    return kex_err_set(err, KEX_ELIMIT, "cache: opts text over %d bytes", KEX_CACHE_OPTS_TEXT_MAX - 1);
  if ((rc = device_id(c, key->device, &dev_id, err))) goto out;
  if ((rc = get_stmt(c, STMT_BEAM_PUT, &s, err))) goto out;
  src = sqlite3_bind_blob(s, 1, key->ast_key, KEX_AST_KEY_BYTES, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 2, dev_id);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 3, key->search_opts, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 4, key->codegen_version, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 5, opts, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_double(s, 6, val->best_time_s);
  if (src == SQLITE_OK) src = sqlite3_bind_double(s, 7, val->hand_time_s);
  if (src == SQLITE_OK) src = sqlite3_bind_double(s, 8, val->search_time_s);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 9, val->candidates);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 10, val->kernel_name, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 11, val->created_at ? val->created_at : (int64_t)time(NULL));
  if (src == SQLITE_OK) src = ast_text ? sqlite3_bind_text(s, 12, ast_text, -1, SQLITE_STATIC) : sqlite3_bind_null(s, 12);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 13, val->decision_samples);
  if (src == SQLITE_OK) src = sqlite3_bind_double(s, 14, val->decision_spread);
  if (src == SQLITE_OK) src = sqlite3_bind_int(s, 15, val->decision_tie ? 1 : 0);
  if (src == SQLITE_OK)
    src = val->tenant[0] ? sqlite3_bind_text(s, 16, val->tenant, -1, SQLITE_STATIC) : sqlite3_bind_null(s, 16);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src != SQLITE_DONE) rc = db_err(c, src, err, "store beam result");
out:
  stmt_done(s);
  return rc;
}

static int check_ast_text(const uint8_t *key, const char *ast_text, kex_error *err) {
  uint8_t d[32];
  if (!ast_text) return 0;
  size_t n = strnlen(ast_text, KEX_CACHE_AST_TEXT_MAX);
  if (n >= KEX_CACHE_AST_TEXT_MAX) return kex_err_set(err, KEX_ELIMIT, "cache: AST text over %u bytes", KEX_CACHE_AST_TEXT_MAX - 1);
  if (kex_sha256_bytes(ast_text, n, d)) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory hashing");
  if (memcmp(d, key, 32)) return kex_err_set(err, KEX_EINVAL, "cache: the AST text does not hash to the AST key");
  return 0;
}

int kex_cache_beam_put(kex_cache *c, const kex_cache_beam_key *key, const kex_cache_beam_value *val,
                       const char *ast_text, kex_error *err) {
  int rc = check_beam_key(key, err);
  if (!rc) rc = check_beam_value(val, err);
  if (!rc) rc = check_ast_text(key->ast_key, ast_text, err);
  if (rc) return rc;
  if ((rc = tx_begin(c, err))) goto out;
  if ((rc = beam_store(c, key, val, ast_text, err))) goto out;
  rc = tx_commit(c, err);
out:
  if (rc) tx_rollback(c);
  return rc;
}

static bool col_number(sqlite3_stmt *s, int i, double *v) {
  int t = sqlite3_column_type(s, i);
  if (t != SQLITE_FLOAT && t != SQLITE_INTEGER) return false;
  *v = sqlite3_column_double(s, i);
  return time_ok(*v);
}

/*
 * Decode the BEAM_COLS of the current row into *e: true, or false with
 * why[] naming the bad column.  e->ast_text is left alone.
 */
static bool decode_beam_row(sqlite3_stmt *s, kex_cache_entry *e, char *why, size_t whylen) {
  kex_error perr = {0};
  kex_cache_beam_value *v = &e->value;
  memset(v, 0, sizeof *v);
  if (sqlite3_column_type(s, BC_KEY) != SQLITE_BLOB || sqlite3_column_bytes(s, BC_KEY) != KEX_AST_KEY_BYTES) {
    snprintf(why, whylen, "ast_key is not a 32-byte blob");
    return false;
  }
  memcpy(e->ast_key, sqlite3_column_blob(s, BC_KEY), KEX_AST_KEY_BYTES);
  kex_hex(e->ast_key, KEX_AST_KEY_BYTES, e->ast_hex);
  copy_field(e->device.kind, KEX_DEVICE_FIELD_MAX, sqlite3_column_text(s, BC_KIND));
  copy_field(e->device.vendor, KEX_DEVICE_FIELD_MAX, sqlite3_column_text(s, BC_VENDOR));
  copy_field(e->device.name, KEX_DEVICE_FIELD_MAX, sqlite3_column_text(s, BC_NAME));
  copy_field(e->device.driver_version, KEX_DEVICE_FIELD_MAX, sqlite3_column_text(s, BC_DRIVER));
  copy_field(e->device.compiler_version, KEX_DEVICE_FIELD_MAX, sqlite3_column_text(s, BC_COMPILER));
  copy_field(e->device_rendered, sizeof e->device_rendered, sqlite3_column_text(s, BC_RENDERED));
  const unsigned char *so = sqlite3_column_text(s, BC_SEARCH), *cg = sqlite3_column_text(s, BC_CODEGEN);
  if (sqlite3_column_type(s, BC_SEARCH) != SQLITE_TEXT || strlen((const char *)so) >= KEX_CACHE_SEARCH_OPTS_MAX ||
      sqlite3_column_type(s, BC_CODEGEN) != SQLITE_TEXT || strlen((const char *)cg) >= KEX_CACHE_CODEGEN_MAX) {
    snprintf(why, whylen, "search_opts or codegen_version is not a text within its limit");
    return false;
  }
  copy_field(e->search_opts, sizeof e->search_opts, so);
  copy_field(e->codegen_version, sizeof e->codegen_version, cg);
  if (sqlite3_column_type(s, BC_OPTS) != SQLITE_TEXT ||
      kex_cache_opts_parse((const char *)sqlite3_column_text(s, BC_OPTS), v->opts, KEX_CACHE_MAX_OPTS, &v->nopts, &perr)) {
    snprintf(why, whylen, "opts: %.160s", perr.msg[0] ? perr.msg : "not text");
    return false;
  }
  if (!col_number(s, BC_BEST, &v->best_time_s) || !col_number(s, BC_HAND, &v->hand_time_s) ||
      !col_number(s, BC_SEARCH_TIME, &v->search_time_s)) {
    snprintf(why, whylen, "a time column is not a finite non-negative number");
    return false;
  }
  if (sqlite3_column_type(s, BC_CANDIDATES) != SQLITE_INTEGER || sqlite3_column_int64(s, BC_CANDIDATES) < 0 ||
      sqlite3_column_type(s, BC_CREATED) != SQLITE_INTEGER) {
    snprintf(why, whylen, "candidates or created_at is not an integer");
    return false;
  }
  v->candidates = sqlite3_column_int64(s, BC_CANDIDATES);
  v->created_at = sqlite3_column_int64(s, BC_CREATED);
  if (sqlite3_column_type(s, BC_SAMPLES) != SQLITE_INTEGER || sqlite3_column_int64(s, BC_SAMPLES) < 0 ||
      !col_number(s, BC_SPREAD, &v->decision_spread) || sqlite3_column_type(s, BC_TIE) != SQLITE_INTEGER) {
    snprintf(why, whylen, "decision_samples, decision_spread or decision_tie is out of range");
    return false;
  }
  v->decision_samples = sqlite3_column_int64(s, BC_SAMPLES);
  v->decision_tie = sqlite3_column_int64(s, BC_TIE) != 0;
  const unsigned char *kn = sqlite3_column_text(s, BC_KERNEL);
  if (sqlite3_column_type(s, BC_KERNEL) != SQLITE_TEXT || check_kernel_name((const char *)kn, NULL)) {
    snprintf(why, whylen, "kernel_name is not a kernel name");
    return false;
  }
  copy_field(v->kernel_name, sizeof v->kernel_name, kn);
  if (sqlite3_column_type(s, BC_TENANT) == SQLITE_TEXT)
    copy_field(v->tenant, sizeof v->tenant, sqlite3_column_text(s, BC_TENANT));
  return true;
}

/*
 * Steps s (bound to select one beam_results row; src is the binding's result)
 * and decodes the row into e.  Returns 0; KEX_ENOTFOUND when there is no row
 * (err untouched, the caller says what was missing); KEX_ECORRUPT when the
 * row does not decode (err untouched, *bad_row and why set: the caller drops
 * it with drop_damaged_beam once s is done); or the SQLite error as "what".
 */
static int step_beam_row(kex_cache *c, sqlite3_stmt *s, int src, kex_cache_entry *e, const char *what, char *why,
                         size_t whylen, int64_t *bad_row, kex_error *err) {
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src == SQLITE_DONE) return KEX_ENOTFOUND;
  if (src != SQLITE_ROW) return db_err(c, src, err, what);
  if (decode_beam_row(s, e, why, whylen)) return 0;
  *bad_row = sqlite3_column_int64(s, BC_ROWID);
  return KEX_ECORRUPT;
}

/* Drops the damaged beam_results row step_beam_row found; returns KEX_ECORRUPT. */
static int drop_damaged_beam(kex_cache *c, int64_t bad_row, const char *why, kex_error *err) {
  drop_row(c, STMT_BEAM_DROP, bad_row, "beam_results", why);
  return kex_err_set(err, KEX_ECORRUPT, "cache %s: dropped a damaged beam result: %s", c->path, why);
}

/* Binds key as ?1 (AST key), ?2..?6 (identity), ?7 (search options), ?8 (codegen version). */
static int bind_beam_key(sqlite3_stmt *s, const kex_cache_beam_key *key) {
  int src = sqlite3_bind_blob(s, 1, key->ast_key, KEX_AST_KEY_BYTES, SQLITE_STATIC);
  if (src == SQLITE_OK) src = bind_identity(s, 2, key->device);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 7, key->search_opts, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 8, key->codegen_version, -1, SQLITE_STATIC);
  return src;
}

int kex_cache_beam_get(kex_cache *c, const kex_cache_beam_key *key, kex_cache_beam_value *out, kex_error *err) {
  sqlite3_stmt *s = NULL;
  kex_cache_entry *e = NULL;
  int64_t bad_row = -1;
  char why[KEX_ERROR_MSG_MAX / 2] = "";
  int rc, src;

  memset(out, 0, sizeof *out);
  if ((rc = check_beam_key(key, err))) return rc;
  if (!(e = kex_malloc(sizeof *e))) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
  if ((rc = get_stmt(c, STMT_BEAM_GET, &s, err))) goto out;
  src = bind_beam_key(s, key);
  rc = step_beam_row(c, s, src, e, "find beam result", why, sizeof why, &bad_row, err);
  if (rc == KEX_ENOTFOUND) {
    c->stats.beam_misses++;
    rc = kex_err_set(err, KEX_ENOTFOUND, "cache: no beam result for this kernel, device, search and codegen");
  }
  if (rc) goto out;
  *out = e->value;
  c->stats.beam_hits++;
out:
  stmt_done(s);
  kex_free(e);
  if (bad_row >= 0) rc = drop_damaged_beam(c, bad_row, why, err);
  return rc;
}

int kex_cache_beam_drop(kex_cache *c, const kex_cache_beam_key *key, const kex_cache_beam_value *val, const char *why,
                        kex_error *err) {
  char opts[KEX_CACHE_OPTS_TEXT_MAX], hex[KEX_AST_KEY_HEX];
  sqlite3_stmt *s = NULL;
  int rc, src;

  if ((rc = check_beam_key(key, err))) return rc;
  if (kex_cache_opts_format(val->opts, val->nopts, opts, sizeof opts))
    return kex_err_set(err, KEX_EINVAL, "cache: opts to drop do not format within %d bytes", KEX_CACHE_OPTS_TEXT_MAX - 1);
  kex_hex(key->ast_key, KEX_AST_KEY_BYTES, hex);
  if ((rc = tx_begin(c, err))) goto out;
  if ((rc = get_stmt(c, STMT_BEAM_DROP_KEY, &s, err))) goto out;
  src = bind_beam_key(s, key);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 9, opts, -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_step(s);
  if (src != SQLITE_DONE) {
    rc = db_err(c, src, err, "drop beam result");
    goto out;
  }
  int64_t n = sqlite3_changes64(c->db);
  stmt_done(s);
  s = NULL;
  if ((rc = tx_commit(c, err))) goto out;
  if (n > 0) {
    c->stats.unusable_dropped += (uint64_t)n;
    KEX_WARN("cache %s: dropped beam result %s (search %s, codegen %s, opts \"%s\"): %s", c->path, hex,
             key->search_opts, key->codegen_version, opts, why ? why : "unusable");
  }
out:
  stmt_done(s);
  if (rc) tx_rollback(c);
  return rc;
}

/* ---- list, get, delete ---- */

static int bind_filter(kex_cache *c, sqlite3_stmt *s, const kex_cache_filter *f, kex_error *err) {
  char prefix[KEX_AST_KEY_HEX] = "";
  const char *dev = f && f->device ? f->device : "", *kn = f && f->kernel_name ? f->kernel_name : "";
  const char *kp = f && f->key_prefix ? f->key_prefix : "";
  size_t n = strlen(kp);
  if (n >= sizeof prefix) return kex_err_set(err, KEX_EINVAL, "cache: key prefix longer than %d hex digits", KEX_AST_KEY_HEX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = kp[i];
    if (ch >= 'a' && ch <= 'f') ch = (char)(ch - 'a' + 'A');
    if (!((ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'F')))
      return kex_err_set(err, KEX_EINVAL, "cache: key prefix \"%s\" is not hex", kp);
    prefix[i] = ch;
  }
  prefix[n] = 0;
  int64_t min_created = f && f->max_age_s > 0 ? (int64_t)time(NULL) - f->max_age_s : INT64_MIN;
  int src = sqlite3_bind_text(s, 1, dev, -1, SQLITE_TRANSIENT);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 2, kn, -1, SQLITE_TRANSIENT);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 3, prefix, -1, SQLITE_TRANSIENT);
  if (src == SQLITE_OK) src = sqlite3_bind_int64(s, 4, min_created);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 7, f && f->tenant ? f->tenant : "", -1, SQLITE_TRANSIENT);
  return src == SQLITE_OK ? 0 : db_err(c, src, err, "bind filter");
}

/* Rows to drop after a read statement finished (decode failures seen while stepping). */
typedef struct bad_rows {
  int64_t rows[64];
  char why[64][96];
  uint32_t n;
} bad_rows;

static void note_bad(bad_rows *b, int64_t row, const char *why) {
  if (b->n < 64) {
    b->rows[b->n] = row;
    copy_cut(b->why[b->n], sizeof b->why[b->n], why);
    b->n++;
  }
}

static void drop_bad(kex_cache *c, const bad_rows *b) {
  for (uint32_t i = 0; i < b->n; i++) drop_row(c, STMT_BEAM_DROP, b->rows[i], "beam_results", b->why[i]);
}

int kex_cache_list(kex_cache *c, const kex_cache_filter *filter, uint64_t offset, uint32_t limit,
                   kex_cache_entry_cb cb, void *arg, uint32_t *count, kex_error *err) {
  sqlite3_stmt *s = NULL;
  kex_cache_entry *e = NULL;
  bad_rows *bad = NULL;
  uint32_t passed = 0;
  int rc = 0, src;

  if (count) *count = 0;
  if (limit == 0 || limit > KEX_CACHE_LIST_MAX)
    return kex_err_set(err, KEX_EINVAL, "cache: list limit %u outside 1..%d", limit, KEX_CACHE_LIST_MAX);
  if (offset > INT64_MAX) return kex_err_set(err, KEX_EINVAL, "cache: list offset too large");
  e = kex_calloc(1, sizeof *e);
  bad = kex_calloc(1, sizeof *bad);
  if (!e || !bad) {
    rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
    goto out;
  }
  if ((rc = get_stmt(c, STMT_BEAM_LIST, &s, err)) || (rc = bind_filter(c, s, filter, err))) goto out;
  sqlite3_bind_int64(s, 5, limit);
  sqlite3_bind_int64(s, 6, (int64_t)offset);
  while ((src = sqlite3_step(s)) == SQLITE_ROW) {
    char why[96];
    if (!decode_beam_row(s, e, why, sizeof why)) {
      note_bad(bad, sqlite3_column_int64(s, BC_ROWID), why);
      continue;
    }
    passed++;
    if (cb && cb(e, arg)) break;
  }
  if (src != SQLITE_ROW && src != SQLITE_DONE) rc = db_err(c, src, err, "list beam results");
out:
  stmt_done(s);
  if (bad) drop_bad(c, bad);
  if (count) *count = passed;
  kex_free(bad);
  kex_free(e);
  return rc;
}

int kex_cache_get_entry(kex_cache *c, const char *ast_hex, const char *device, kex_cache_entry *out,
                        kex_error *err) {
  return kex_cache_get_entry_of(c, ast_hex, device, NULL, out, err);
}

int kex_cache_get_entry_of(kex_cache *c, const char *ast_hex, const char *device, const char *tenant,
                           kex_cache_entry *out, kex_error *err) {
  uint8_t key[KEX_AST_KEY_BYTES];
  sqlite3_stmt *s = NULL;
  int64_t bad_row = -1;
  char why[96] = "";
  int rc, src;

  memset(out, 0, sizeof *out);
  if (!ast_hex || kex_unhex(ast_hex, key, KEX_AST_KEY_BYTES))
    return kex_err_set(err, KEX_EINVAL, "cache: AST key \"%.80s\" is not 64 hex digits", ast_hex ? ast_hex : "");
  if ((rc = get_stmt(c, STMT_BEAM_ENTRY, &s, err))) goto out;
  src = sqlite3_bind_blob(s, 1, key, KEX_AST_KEY_BYTES, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 2, device ? device : "", -1, SQLITE_STATIC);
  if (src == SQLITE_OK) src = sqlite3_bind_text(s, 3, tenant ? tenant : "", -1, SQLITE_STATIC);
  rc = step_beam_row(c, s, src, out, "get entry", why, sizeof why, &bad_row, err);
  if (rc == KEX_ENOTFOUND)
    rc = kex_err_set(err, KEX_ENOTFOUND, "cache: no beam result with AST key %s%s%s", ast_hex,
                     device && device[0] ? " on " : "", device ? device : "");
  if (rc) goto out;
  if (sqlite3_column_type(s, BC_AST_TEXT) == SQLITE_TEXT) {
    out->ast_text = kex_strdup((const char *)sqlite3_column_text(s, BC_AST_TEXT));
    if (!out->ast_text) rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory for the AST text");
  }
out:
  stmt_done(s);
  if (bad_row >= 0) rc = drop_damaged_beam(c, bad_row, why, err);
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}

int kex_cache_delete(kex_cache *c, const kex_cache_filter *filter, uint64_t *deleted, kex_error *err) {
  sqlite3_stmt *s = NULL;
  int rc, src;

  if (deleted) *deleted = 0;
  if ((rc = tx_begin(c, err))) goto out;
  if ((rc = get_stmt(c, STMT_BEAM_DELETE, &s, err)) || (rc = bind_filter(c, s, filter, err))) goto out;
  src = sqlite3_step(s);
  if (src != SQLITE_DONE) {
    rc = db_err(c, src, err, "delete beam results");
    goto out;
  }
  if (deleted) *deleted = (uint64_t)sqlite3_changes64(c->db);
  stmt_done(s);
  s = NULL;
  rc = tx_commit(c, err);
out:
  stmt_done(s);
  if (rc) {
    tx_rollback(c);
    if (deleted) *deleted = 0;
  }
  return rc;
}

/* ---- export ---- */

static json_t *identity_json(const kex_device_identity *d) {
  return json_pack("{s:s, s:s, s:s, s:s, s:s}", "kind", d->kind, "vendor", d->vendor, "name", d->name,
                   "driver_version", d->driver_version, "compiler_version", d->compiler_version);
}

#define EXPORT_JSON_FLAGS (JSON_COMPACT | JSON_ENSURE_ASCII)

/* Write one object as a line; steals obj. */
static int write_line(FILE *f, json_t *obj, kex_error *err) {
  int rc = 0;
  if (!obj) return kex_err_set(err, KEX_ENOMEM, "cache export: out of memory");
  if (json_dumpf(obj, f, EXPORT_JSON_FLAGS) != 0 || fputc('\n', f) == EOF)
    rc = kex_err_set(err, KEX_EIO, "cache export: write failed: %s", strerror(errno));
  json_decref(obj);
  return rc;
}

static json_t *beam_json(const kex_cache_entry *e, const char *ast_text) {
  char opts[KEX_CACHE_OPTS_TEXT_MAX];
  if (kex_cache_opts_format(e->value.opts, e->value.nopts, opts, sizeof opts)) return NULL;
  return json_pack("{s:s, s:s, s:o, s:s, s:s, s:s, s:f, s:f, s:f, s:I, s:s, s:I, s:o, s:I, s:f, s:b}", "type", "beam", "ast_key",
                   e->ast_hex, "device", identity_json(&e->device), "search_opts", e->search_opts, "codegen_version",
                   e->codegen_version, "opts", opts, "best_time_s", e->value.best_time_s, "hand_time_s",
                   e->value.hand_time_s, "search_time_s", e->value.search_time_s, "candidates",
                   (json_int_t)e->value.candidates, "kernel_name", e->value.kernel_name, "created_at",
                   (json_int_t)e->value.created_at, "ast_text", ast_text ? json_string(ast_text) : json_null(),
                   "samples", (json_int_t)e->value.decision_samples, "spread", e->value.decision_spread, "tie",
                   e->value.decision_tie);
}

int kex_cache_beam_line(kex_cache *c, const kex_cache_beam_key *key, char **line, kex_error *err) {
  sqlite3_stmt *s = NULL;
  kex_cache_entry *e = NULL;
  int64_t bad_row = -1;
  char why[KEX_ERROR_MSG_MAX / 2] = "";
  int rc, src;

  *line = NULL;
  if ((rc = check_beam_key(key, err))) return rc;
  if (!(e = kex_malloc(sizeof *e))) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
  if ((rc = get_stmt(c, STMT_BEAM_LINE, &s, err))) goto out;
  src = bind_beam_key(s, key);
  rc = step_beam_row(c, s, src, e, "encode beam result", why, sizeof why, &bad_row, err);
  if (rc == KEX_ENOTFOUND) rc = kex_err_set(err, KEX_ENOTFOUND, "cache: no beam result to encode for this key");
  if (rc) goto out;
  const char *ast_text = sqlite3_column_type(s, BC_AST_TEXT) == SQLITE_TEXT ? (const char *)sqlite3_column_text(s, BC_AST_TEXT) : NULL;
  json_t *o = beam_json(e, ast_text);
  size_t n = o ? json_dumpb(o, NULL, 0, EXPORT_JSON_FLAGS) : 0; /* sized first: jansson's allocator may be kex's or libc's */
  if (n && (*line = kex_malloc(n + 1)) && json_dumpb(o, *line, n, EXPORT_JSON_FLAGS) == n) (*line)[n] = '\0';
  else {
    kex_free(*line);
    *line = NULL;
    rc = kex_err_set(err, KEX_ENOMEM, "cache: out of memory encoding a beam result");
  }
  json_decref(o);
out:
  stmt_done(s);
  kex_free(e);
  if (bad_row >= 0) rc = drop_damaged_beam(c, bad_row, why, err);
  return rc;
}

int kex_cache_export(kex_cache *c, FILE *f, const kex_cache_filter *filter, uint64_t *count, kex_error *err) {
  sqlite3_stmt *s = NULL;
  kex_cache_entry *e = NULL;
  uint64_t n = 0;
  bool began = false;
  int rc, src;

  if (count) *count = 0;
  if (!(e = kex_calloc(1, sizeof *e))) return kex_err_set(err, KEX_ENOMEM, "cache: out of memory");
  /* one read transaction: the export is one consistent snapshot */
  if ((src = sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL)) != SQLITE_OK) {
    rc = db_err(c, src, err, "begin export");
    goto out;
  }
  began = true;
  if ((rc = write_line(f, json_pack("{s:s, s:i}", "format", "kex.cache.export.v1", "schema", KEX_CACHE_SCHEMA_VERSION), err)))
    goto out;
  if ((rc = get_stmt(c, STMT_BEAM_EXPORT, &s, err)) || (rc = bind_filter(c, s, filter, err))) goto out;
  while ((src = sqlite3_step(s)) == SQLITE_ROW) {
    char why[96];
    if (!decode_beam_row(s, e, why, sizeof why)) {
      KEX_WARN("cache %s: export skips a damaged beam row: %s", c->path, why);
      continue;
    }
    const char *ast_text = sqlite3_column_type(s, BC_AST_TEXT) == SQLITE_TEXT ? (const char *)sqlite3_column_text(s, BC_AST_TEXT) : NULL;
    if ((rc = write_line(f, beam_json(e, ast_text), err))) goto out;
    n++;
  }
  if (src != SQLITE_DONE) {
    rc = db_err(c, src, err, "export beam results");
    goto out;
  }
  stmt_done(s);
  s = NULL;
  if (fflush(f) != 0) rc = kex_err_set(err, KEX_EIO, "cache export: flush failed: %s", strerror(errno));
out:
  stmt_done(s);
  if (began) sqlite3_exec(c->db, rc ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
  if (count) *count = rc ? 0 : n;
  kex_free(e);
  return rc;
}

/* ---- import ---- */

/* One line of f into *buf (kex_realloc'd), without the newline: 1 read, 0 EOF, KEX_ELIMIT, KEX_ENOMEM, KEX_EIO. */
static int read_line(FILE *f, char **buf, size_t *cap, size_t *len) {
  *len = 0;
  for (;;) {
    if (*cap - *len < 4096) {
      size_t ncap = *cap ? *cap * 2 : 65536;
      char *p = kex_realloc(*buf, ncap);
      if (!p) return KEX_ENOMEM;
      *buf = p, *cap = ncap;
    }
    if (!fgets(*buf + *len, (int)(*cap - *len), f)) {
      if (ferror(f)) return KEX_EIO;
      return *len ? 1 : 0;
    }
    *len += strlen(*buf + *len);
    if (*len && (*buf)[*len - 1] == '\n') {
      (*buf)[--*len] = 0;
      return 1;
    }
    if (*len > KEX_CACHE_IMPORT_LINE_MAX) return KEX_ELIMIT;
  }
}

static int json_field_string(json_t *o, const char *name, size_t cap, char *dst, kex_error *err) {
  json_t *v = json_object_get(o, name);
  if (!json_is_string(v)) return kex_err_set(err, KEX_EPARSE, "%s: missing or not a string", name);
  size_t n = json_string_length(v);
  if (n >= cap) return kex_err_set(err, KEX_EPARSE, "%s: %zu bytes (limit %zu)", name, n, cap - 1);
  if (strlen(json_string_value(v)) != n) return kex_err_set(err, KEX_EPARSE, "%s: contains a NUL", name);
  memcpy(dst, json_string_value(v), n + 1);
  return 0;
}

static int json_field_time(json_t *o, const char *name, double *dst, kex_error *err) {
  json_t *v = json_object_get(o, name);
  if (!json_is_number(v) || !time_ok(json_number_value(v)))
    return kex_err_set(err, KEX_EPARSE, "%s: missing or not a finite non-negative number", name);
  *dst = json_number_value(v);
  return 0;
}

static int json_field_int(json_t *o, const char *name, int64_t *dst, kex_error *err) {
  json_t *v = json_object_get(o, name);
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return kex_err_set(err, KEX_EPARSE, "%s: missing or not a non-negative integer", name);
  *dst = json_integer_value(v);
  return 0;
}

/* The decision fields (schema 4), optional so that older exports import: absent, they stay 0, 0, false. */
static int json_decision(json_t *o, kex_cache_beam_value *v, kex_error *err) {
  json_t *tie = json_object_get(o, "tie");
  int rc = 0;
  if (json_object_get(o, "samples")) rc = json_field_int(o, "samples", &v->decision_samples, err);
  if (!rc && json_object_get(o, "spread")) rc = json_field_time(o, "spread", &v->decision_spread, err);
  if (!rc && tie) {
    if (!json_is_boolean(tie)) return kex_err_set(err, KEX_EPARSE, "tie: not a boolean");
    v->decision_tie = json_is_true(tie);
  }
  return rc;
}

static int json_identity(json_t *o, kex_device_identity *d, kex_error *err) {
  json_t *dev = json_object_get(o, "device");
  int rc;
  if (!json_is_object(dev)) return kex_err_set(err, KEX_EPARSE, "device: missing or not an object");
  if ((rc = json_field_string(dev, "kind", KEX_DEVICE_FIELD_MAX, d->kind, err)) ||
      (rc = json_field_string(dev, "vendor", KEX_DEVICE_FIELD_MAX, d->vendor, err)) ||
      (rc = json_field_string(dev, "name", KEX_DEVICE_FIELD_MAX, d->name, err)) ||
      (rc = json_field_string(dev, "driver_version", KEX_DEVICE_FIELD_MAX, d->driver_version, err)) ||
      (rc = json_field_string(dev, "compiler_version", KEX_DEVICE_FIELD_MAX, d->compiler_version, err)))
    return rc;
  kex_error ierr = {0};
  return check_identity(d, &ierr) ? kex_err_set(err, KEX_EPARSE, "device: %s", ierr.msg) : 0;
}

static int json_hex32(json_t *o, const char *name, uint8_t *out, kex_error *err) {
  json_t *v = json_object_get(o, name);
  if (!json_is_string(v) || json_string_length(v) != 64 || kex_unhex(json_string_value(v), out, 32))
    return kex_err_set(err, KEX_EPARSE, "%s: not 64 hex digits", name);
  return 0;
}

/*
 * Validate and store one entry object (inside the import transaction).
 * Only beam results are data this module takes from outside: a "program"
 * line (a compiled binary, as exports of schema 1 and 2 carried) is
 * refused before any of its fields is read.
 */
static bool same_key(const kex_cache_beam_key *a, const kex_cache_beam_key *b) {
  const kex_device_identity *x = a->device, *y = b->device;
  return !memcmp(a->ast_key, b->ast_key, KEX_AST_KEY_BYTES) && !strcmp(x->kind, y->kind) &&
         !strcmp(x->vendor, y->vendor) && !strcmp(x->name, y->name) && !strcmp(x->driver_version, y->driver_version) &&
         !strcmp(x->compiler_version, y->compiler_version) && !strcmp(a->search_opts, b->search_opts) &&
         !strcmp(a->codegen_version, b->codegen_version);
}

static int import_entry(kex_cache *c, json_t *o, const kex_cache_beam_key *expect, kex_error *err) {
  kex_device_identity *dev = NULL;
  kex_cache_beam_value *v = NULL;
  char *search = NULL, *codegen = NULL, *opts = NULL;
  int rc = 0;
  const char *type = json_string_value(json_object_get(o, "type"));
  json_t *at = json_object_get(o, "ast_text");
  const char *ast_text = NULL;

  if (!type) return kex_err_set(err, KEX_EPARSE, "type: missing or not a string");
  if (!strcmp(type, "program"))
    return kex_err_set(err, KEX_EPARSE, "type \"program\" refused: compiled programs are never imported, each kexd "
                       "compiles from the source it renders");
  if (strcmp(type, "beam")) return kex_err_set(err, KEX_EPARSE, "type: \"%.32s\" is not \"beam\"", type);
  dev = kex_calloc(1, sizeof *dev);
  v = kex_calloc(1, sizeof *v);
  search = kex_malloc(KEX_CACHE_SEARCH_OPTS_MAX);
  codegen = kex_malloc(KEX_CACHE_CODEGEN_MAX);
  opts = kex_malloc(KEX_CACHE_OPTS_TEXT_MAX);
  if (!dev || !v || !search || !codegen || !opts) {
    rc = kex_err_set(err, KEX_ENOMEM, "out of memory");
    goto out;
  }
  kex_cache_beam_key key = {.device = dev, .search_opts = search, .codegen_version = codegen};
  if ((rc = json_identity(o, dev, err)) || (rc = json_hex32(o, "ast_key", key.ast_key, err)) ||
      (rc = json_field_string(o, "search_opts", KEX_CACHE_SEARCH_OPTS_MAX, search, err)) ||
      (rc = json_field_string(o, "codegen_version", KEX_CACHE_CODEGEN_MAX, codegen, err)) ||
      (rc = json_field_string(o, "opts", KEX_CACHE_OPTS_TEXT_MAX, opts, err)) ||
      (rc = json_field_time(o, "best_time_s", &v->best_time_s, err)) ||
      (rc = json_field_time(o, "hand_time_s", &v->hand_time_s, err)) ||
      (rc = json_field_time(o, "search_time_s", &v->search_time_s, err)) ||
      (rc = json_field_int(o, "candidates", &v->candidates, err)) ||
      (rc = json_field_string(o, "kernel_name", KEX_CACHE_KERNEL_NAME_MAX, v->kernel_name, err)) ||
      (rc = json_field_int(o, "created_at", &v->created_at, err)) || (rc = json_decision(o, v, err)))
    goto out;
  if (expect && !same_key(&key, expect)) {
    rc = kex_err_set(err, KEX_EPARSE, "the entry is not for the key asked for (AST key, device identity, search "
                     "options or codegen version differ)");
    goto out;
  }
  if (json_is_string(at)) {
    ast_text = json_string_value(at);
    if (strncmp(ast_text, KEX_AST_KEY_VERSION "\n", sizeof KEX_AST_KEY_VERSION)) {
      rc = kex_err_set(err, KEX_EPARSE, "ast_text: does not start with %s", KEX_AST_KEY_VERSION);
      goto out;
    }
  } else if (!json_is_null(at)) {
    rc = kex_err_set(err, KEX_EPARSE, "ast_text: missing or neither a string nor null");
    goto out;
  }
  if ((rc = kex_cache_opts_parse(opts, v->opts, KEX_CACHE_MAX_OPTS, &v->nopts, err))) {
    rc = KEX_EPARSE;
    goto out;
  }
  if ((rc = check_beam_value(v, err)) || (rc = check_ast_text(key.ast_key, ast_text, err))) {
    rc = KEX_EPARSE;
    goto out;
  }
  rc = beam_store(c, &key, v, ast_text, err);
out:
  kex_free(opts);
  kex_free(codegen);
  kex_free(search);
  kex_free(v);
  kex_free(dev);
  return rc;
}

static json_t *load_line(const char *line, size_t len, json_error_t *jerr) {
  return json_loadb(line, len, JSON_REJECT_DUPLICATES, jerr);
}

int kex_cache_import_line(kex_cache *c, const char *line, size_t len, const kex_cache_beam_key *expect, kex_error *err) {
  json_error_t jerr;
  int rc;
  if (len > KEX_CACHE_IMPORT_LINE_MAX) return kex_err_set(err, KEX_ELIMIT, "cache: a line of %zu bytes (limit %zu)", len, (size_t)KEX_CACHE_IMPORT_LINE_MAX);
  json_t *o = load_line(line, len, &jerr);
  if (!o || !json_is_object(o)) {
    rc = kex_err_set(err, KEX_EPARSE, "not a JSON object: %s", o ? "" : jerr.text);
    goto out;
  }
  if ((rc = tx_begin(c, err))) goto out;
  if ((rc = import_entry(c, o, expect, err)) == 0) rc = tx_commit(c, err);
  if (rc) tx_rollback(c);
out:
  json_decref(o);
  return rc;
}

static void report_error(kex_cache_import_report *rep, const char *msg) {
  if (rep->nerrors < KEX_CACHE_IMPORT_ERRORS) copy_cut(rep->errors[rep->nerrors++], sizeof rep->errors[0], msg);
}

int kex_cache_import(kex_cache *c, FILE *f, kex_cache_import_report *rep_out, kex_error *err) {
  kex_cache_import_report rep = {0};
  char *line = NULL;
  size_t cap = 0, len = 0;
  uint64_t lineno = 0;
  char first_bad[KEX_ERROR_MSG_MAX] = "";
  json_t *o = NULL;
  int rc, got;

  if ((rc = tx_begin(c, err))) goto out;
  while ((got = read_line(f, &line, &cap, &len)) == 1) {
    json_error_t jerr;
    kex_error lerr = {0};
    char msg[KEX_ERROR_MSG_MAX];
    lineno++;
    o = load_line(line, len, &jerr);
    if (lineno == 1) {
      json_t *fmt = o ? json_object_get(o, "format") : NULL, *schema = o ? json_object_get(o, "schema") : NULL;
      if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "kex.cache.export.v1") || !json_is_integer(schema) ||
          json_integer_value(schema) < 1 || json_integer_value(schema) > KEX_CACHE_SCHEMA_VERSION) {
        rc = kex_err_set(err, KEX_EPARSE, "cache import: line 1 is not a kex.cache.export.v1 header with a known schema");
        goto out;
      }
    } else if (!o || !json_is_object(o)) {
      snprintf(msg, sizeof msg, "line %llu: not a JSON object: %s", (unsigned long long)lineno, o ? "" : jerr.text);
      rep.rejected++;
      report_error(&rep, msg);
      if (!first_bad[0]) copy_cut(first_bad, sizeof first_bad, msg);
    } else if ((rc = import_entry(c, o, NULL, &lerr))) {
      if (rc != KEX_EPARSE && rc != KEX_EINVAL && rc != KEX_ELIMIT) {
        rc = kex_err_set(err, rc, "cache import: line %llu: %s", (unsigned long long)lineno, lerr.msg);
        goto out;
      }
      snprintf(msg, sizeof msg, "line %llu: %.400s", (unsigned long long)lineno, lerr.msg);
      rep.rejected++;
      report_error(&rep, msg);
      if (!first_bad[0]) copy_cut(first_bad, sizeof first_bad, msg);
      rc = 0;
    } else {
      rep.imported++;
    }
    json_decref(o);
    o = NULL;
  }
  if (got < 0) {
    rc = kex_err_set(err, got, "cache import: line %llu: %s", (unsigned long long)lineno + 1,
                     got == KEX_ELIMIT ? "longer than the line limit" : got == KEX_ENOMEM ? "out of memory" : "read failed");
    goto out;
  }
  if (lineno == 0) {
    rc = kex_err_set(err, KEX_EPARSE, "cache import: empty input (no kex.cache.export.v1 header)");
    goto out;
  }
  if ((rc = tx_commit(c, err))) goto out;
  if (rep.rejected)
    rc = kex_err_set(err, KEX_EPARSE, "cache import: %llu line(s) refused, %llu stored; first: %.300s",
                     (unsigned long long)rep.rejected, (unsigned long long)rep.imported, first_bad);
out:
  json_decref(o);
  kex_free(line);
  if (rc && rc != KEX_EPARSE) rep.imported = 0;
  if (sqlite3_get_autocommit(c->db) == 0) {
    tx_rollback(c);
    rep.imported = 0;
  }
  if (rep_out) *rep_out = rep;
  return rc;
}

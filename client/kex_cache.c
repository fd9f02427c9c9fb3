/*
 * kex_cache.c - `kex cache`: the beam-result cache (search/cache.h) from the
 * command line, in-process on a cache file or, with `kex --server ADDR
 * cache ...`, on the cache of a kexd (libkex's kex_client_cache_*).
 *
 *   kex cache ls     [filters] [--json]
 *   kex cache show   AST_PREFIX [--device S] [--graph FILE.json] [--json]
 *   kex cache export [filters] [--out FILE] [--json]
 *   kex cache import FILE [--json]
 *   kex cache rm     (filters | --all) [--json]
 *
 * Filters: --device S (substring of the rendered device identity),
 * --name S (kernel name substring), --ast PREFIX (AST key hex prefix),
 * --max-age AGE (seconds, or with s/m/h/d).  In-process, every command
 * takes --cache PATH (default: $KEX_CACHE, $XDG_CACHE_HOME/kex/cache.db,
 * ~/.cache/kex/cache.db).  The cache stores the AST text, not the source:
 * in-process, `show --graph FILE` renders the source by scheduling FILE on
 * the entry's device kind and lowering the kernel whose AST key matches with
 * the cached opts; a server renders the source itself (GetCacheEntry).
 *
 * `import` takes beam results only (opts, timings, identity, AST text):
 * a "program" line, as exports of schema 1 and 2 carried, is refused and
 * reported with its line number (exit 2), and the file's beam lines are
 * still stored; `export` never writes compiled programs.
 *
 * Both modes print with the same code (cache_args, cache_row and the
 * printers below); with a server, "cache" in `ls --json` is the server's
 * address instead of the file's path.  Exit codes: 0 ok, 2 bad input (usage,
 * an unknown or ambiguous key, refused import lines; INVALID_ARGUMENT or
 * NOT_FOUND from a server, printed with its message), 1 other errors.
 */
#if defined(KEX_HAVE_RUN) || defined(KEX_HAVE_LIBKEX)
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/kex_cli.h"
#include "core/alloc.h"

/* ---- what both modes share: the command line and the printers ---- */

static void cache_usage(FILE *f) {
  fputs("usage: kex cache ls     [--device S] [--name S] [--ast PREFIX] [--max-age AGE] [--json] [--cache PATH]\n"
        "       kex cache show   AST_PREFIX [--device S] [--graph FILE.json] [--json] [--cache PATH]\n"
        "       kex cache export [filters] [--out FILE] [--json] [--cache PATH]\n"
        "       kex cache import FILE [--json] [--cache PATH]\n"
        "       kex cache rm     (filters | --all) [--json] [--cache PATH]\n"
        "       kex --server ADDR cache ...   the same on kexd's cache (no --cache, --graph; --job T)\n",
        f);
}

/* A parsed `kex cache` command line. */
typedef struct cache_args {
  const char *sub;             /* "ls", "show", "export", "import", "rm" */
  const char *cache_path, *outp, *graph, *job;
  const char *device, *kernel_name, *key_prefix; /* the filter */
  int64_t max_age_s;
  bool json, all, filtered;
  const char *arg;             /* show: AST_PREFIX; import: FILE */
} cache_args;

static int parse_age(const char *s, int64_t *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mul = 1;
  if (*end == 'm') mul = 60;
  else if (*end == 'h') mul = 3600;
  else if (*end == 'd') mul = 86400;
  else if (*end && *end != 's') return -1;
  if (*end && end[1]) return -1;
  *out = (int64_t)(v * mul);
  if (*out == 0) *out = 1;
  return 0;
}

/* Parse argv (argv[1] is the subcommand) into *a: -1 to go on, else the exit code (help, usage errors). */
static int cache_parse(int argc, char **argv, cache_args *a) {
  const char *age = NULL;
  int c;
  memset(a, 0, sizeof *a);
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    cache_usage(stdout);
    return 0;
  }
  if (argc < 2) {
    cache_usage(stderr);
    return 2;
  }
  a->sub = argv[1];
  const kex_cli_opt opts[] = {{"cache", 'c', KEX_CLI_STR, &a->cache_path},
                              {"json", 'j', KEX_CLI_FLAG, &a->json},
                              {"device", 'd', KEX_CLI_STR, &a->device},
                              {"name", 'n', KEX_CLI_STR, &a->kernel_name},
                              {"ast", 'a', KEX_CLI_STR, &a->key_prefix},
                              {"max-age", 'A', KEX_CLI_STR, &age},
                              {"out", 'o', KEX_CLI_STR, &a->outp},
                              {"graph", 'g', KEX_CLI_STR, &a->graph},
                              {"all", 'L', KEX_CLI_FLAG, &a->all},
                              {"job", 0, KEX_CLI_STR, &a->job},
                              {0}};
  if ((c = kex_cli_options("cache", opts, argc - 1, argv + 1, cache_usage)) >= 0) return c;
  if (age && parse_age(age, &a->max_age_s)) {
    fprintf(stderr, "kex cache: bad --max-age '%s' (seconds, or with s/m/h/d)\n", age);
    return 2;
  }
  bool is_show = !strcmp(a->sub, "show"), is_import = !strcmp(a->sub, "import");
  if (strcmp(a->sub, "ls") && !is_show && strcmp(a->sub, "export") && !is_import && strcmp(a->sub, "rm")) {
    fprintf(stderr, "kex cache: unknown subcommand '%s'\n", a->sub);
    cache_usage(stderr);
    return 2;
  }
  int npos = argc - 1 - optind; /* the options were parsed from argv + 1 */
  if (((is_show || is_import) && npos != 1) || (!(is_show || is_import) && npos != 0)) {
    fprintf(stderr, "kex cache %s: wrong number of arguments\n", a->sub);
    cache_usage(stderr);
    return 2;
  }
  if (npos) a->arg = argv[1 + optind];
  a->filtered = (a->device && *a->device) || (a->kernel_name && *a->kernel_name) || (a->key_prefix && *a->key_prefix) ||
                a->max_age_s;
  if (!strcmp(a->sub, "rm") && !a->filtered && !a->all) {
    fprintf(stderr, "kex cache rm: give a filter or --all\n");
    return 2;
  }
  return -1;
}

/* One beam result as both modes print it. */
typedef struct cache_row {
  const char *ast_key, *device, *kind, *device_name, *search_opts, *codegen, *kernel_name, *opts;
  double us, hand_us, search_s;
  int64_t candidates, created_at;
} cache_row;

static json_t *row_json(const cache_row *r) {
  char when[KEX_CLI_ISO8601_MAX];
  kex_cli_iso8601(r->created_at, when);
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:f, s:f, s:f, s:I, s:I, s:s}", "ast_key", r->ast_key, "device",
                   r->device, "search_opts", r->search_opts, "codegen_version", r->codegen, "kernel_name",
                   r->kernel_name, "opts", r->opts, "us", r->us, "hand_us", r->hand_us, "search_s", r->search_s,
                   "candidates", (json_int_t)r->candidates, "created_at", (json_int_t)r->created_at, "created", when);
}

/* The line of `ls`. */
static void row_line(const cache_row *r) {
  long age = (long)(time(NULL) - r->created_at);
  printf("%.16s  %-8s %-24.24s %-26s %-40s %9.2f us (hand %9.2f) %6lds ago\n", r->ast_key, r->kind, r->device_name,
         r->kernel_name, r->opts[0] ? r->opts : "(no opts)", r->us, r->hand_us, age);
}

/* `ls` collects entries through this; `show` counts the distinct keys. */
typedef struct ls_state {
  bool json;
  json_t *arr;                 /* --json: the entries; NULL: lines are printed (unless json) */
  char first_hex[80];           /* the first entry's AST key (64 hex) */
  char first_dev[4096];         /* and its rendered device (KEX_DEVICE_IDENTITY_STR_MAX is 2600) */
  uint32_t distinct;
  uint64_t n;
} ls_state;

/* `cache show PREFIX` needs the prefix to name exactly one key: 0, or 2 after saying why (more: " or more" when the
   count of keys is a lower bound). */
static int show_one_key(const char *prefix, unsigned distinct, const char *more) {
  if (distinct == 0) {
    fprintf(stderr, "kex cache show: no entry with AST key prefix '%s'\n", prefix);
    return 2;
  }
  if (distinct > 1) {
    fprintf(stderr, "kex cache show: AST key prefix '%s' is ambiguous (%u%s keys)\n", prefix, distinct, more);
    return 2;
  }
  return 0;
}

static void ls_take(ls_state *st, const cache_row *r) {
  st->n++;
  if (!st->distinct || strcmp(st->first_hex, r->ast_key) != 0) {
    if (!st->distinct) {
      snprintf(st->first_hex, sizeof st->first_hex, "%s", r->ast_key);
      snprintf(st->first_dev, sizeof st->first_dev, "%s", r->device);
    }
    st->distinct++;
  }
  if (st->arr) json_array_append_new(st->arr, row_json(r));
  else if (!st->json) row_line(r);
}

/* The end of `ls`: the JSON document, or the count line.  where = the cache file or the server. */
static void ls_finish(const ls_state *st, const char *where) {
  if (st->arr) {
    json_t *doc = json_pack("{s:s, s:O}", "cache", where, "entries", st->arr);
    json_dumpf(doc, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(doc);
  } else {
    printf("%llu entr%s in %s\n", (unsigned long long)st->n, st->n == 1 ? "y" : "ies", where);
  }
}

/* `show`'s report: the entry, its AST text and source (NULL = not stored / not rendered). */
static void show_print(const cache_row *r, const char *ast_text, const char *source, bool as_json, bool remote) {
  if (as_json) {
    json_t *o = row_json(r);
    json_object_set_new(o, "ast_text", ast_text ? json_string(ast_text) : json_null());
    json_object_set_new(o, "source", source ? json_string(source) : json_null());
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
    return;
  }
  char when[KEX_CLI_ISO8601_MAX];
  kex_cli_iso8601(r->created_at, when);
  printf("ast_key:         %s\ndevice:          %s\nsearch_opts:     %s\ncodegen_version: %s\n"
         "kernel:          %s\nopts:            %s\ntime:            %.2f us (hand-coded %.2f us)\n"
         "search:          %.2f s, %lld candidates timed\ncreated_at:      %s\n",
         r->ast_key, r->device, r->search_opts, r->codegen, r->kernel_name, r->opts[0] ? r->opts : "(no opts)", r->us,
         r->hand_us, r->search_s, (long long)r->candidates, when);
  printf("ast:\n%s\n", ast_text ? ast_text : "(not stored)");
  printf("source:\n%s\n", source ? source
                                 : remote ? "(not available from the server)"
                                          : "(not stored; give --graph FILE.json to render it)");
}

/* `export`'s closing line: on stdout when the export went to a file, else on stderr. */
static void export_print(const cache_args *a, uint64_t n) {
  FILE *msg = a->outp ? stdout : stderr;
  if (a->json)
    fprintf(msg, "{\"exported\":%llu}\n", (unsigned long long)n);
  else
    fprintf(msg, "exported %llu entries\n", (unsigned long long)n);
}

/*
 * `export` around a writer, the same in both modes: opens --out (stdout
 * without it), lets write() fill it (0, or the exit status after saying why),
 * closes it and prints the count.  Returns the exit status.
 */
typedef int (*export_writer)(FILE *out, uint64_t *n, void *ctx);
static int export_run(const cache_args *a, export_writer write, void *ctx) {
  FILE *out = a->outp ? fopen(a->outp, "w") : stdout;
  uint64_t n = 0;
  int ret;
  if (!out) {
    fprintf(stderr, "kex cache export: cannot write %s\n", a->outp);
    return 1;
  }
  ret = write(out, &n, ctx);
  if (out != stdout && fclose(out) && !ret) {
    fprintf(stderr, "kex cache export: writing %s failed\n", a->outp);
    ret = 1;
  }
  if (!ret) export_print(a, n);
  return ret;
}

static void import_print(bool as_json, uint64_t imported, uint64_t rejected, const char *const *errors,
                         uint32_t nerrors) {
  if (as_json) {
    json_t *errs = json_array();
    for (uint32_t i = 0; i < nerrors; i++) json_array_append_new(errs, json_string(errors[i]));
    json_t *o = json_pack("{s:I, s:I, s:o}", "imported", (json_int_t)imported, "rejected", (json_int_t)rejected,
                          "errors", errs);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
  } else {
    printf("imported %llu, rejected %llu\n", (unsigned long long)imported, (unsigned long long)rejected);
    for (uint32_t i = 0; i < nerrors; i++) printf("  %s\n", errors[i]);
  }
}

static void rm_print(bool as_json, uint64_t n) {
  if (as_json)
    printf("{\"deleted\":%llu}\n", (unsigned long long)n);
  else
    printf("deleted %llu entries\n", (unsigned long long)n);
}
#endif

/* ---- in-process ---- */

#ifdef KEX_HAVE_RUN
#include "core/arena.h"
#include "realize/plan.h" /* the plan stage, and through it the cache (search/cache.h) and the target */

int kex_cmd_cache(int argc, char **argv);

/* A row of an in-process entry; ot (the opts text buffer) must outlive the row. */
static cache_row row_of(const kex_cache_entry *e, char ot[KEX_CACHE_OPTS_TEXT_MAX]) {
  kex_cache_opts_format(e->value.opts, e->value.nopts, ot, KEX_CACHE_OPTS_TEXT_MAX);
  cache_row r = {e->ast_hex,
                 e->device_rendered,
                 e->device.kind,
                 e->device.name,
                 e->search_opts,
                 e->codegen_version,
                 e->value.kernel_name,
                 ot,
                 e->value.best_time_s * 1e6,
                 e->value.hand_time_s * 1e6,
                 e->value.search_time_s,
                 e->value.candidates,
                 e->value.created_at};
  return r;
}

static int ls_cb(const kex_cache_entry *e, void *arg) {
  char ot[KEX_CACHE_OPTS_TEXT_MAX];
  cache_row r = row_of(e, ot);
  ls_take(arg, &r);
  return 0;
}

/* Render the kernel of graph `gpath` whose AST key is e's, with e's opts (the plan builder's schedule and lowering). */
static char *render_from_graph(const char *gpath, const kex_cache_entry *e, kex_error *err) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_graph *g = NULL;
  kex_program_src ps = {0};
  char *src = NULL;
  kex_target target;
  kex_rplan p;
  kex_target_for_name(e->device.kind, &target); /* the rules of the device kind the entry was made on */
  int rc = kex_graph_from_json_file(gpath, &lim, &g, err);
  kex_plan_init(&p, g, &target);
  if (!rc) rc = kex_plan_schedule(&p, NULL, err);
  uint32_t item = 0;
  int frc = rc ? rc : kex_plan_find_kernel(&p, e->ast_hex, &item, err);
  if (!frc) {
    rc = kex_plan_lower_item(&target, p.s, item, e->value.opts, e->value.nopts, NULL, &ps, NULL, 0, err);
    if (!rc) src = kex_strdup(ps.src);
  }
  if (!rc && frc == KEX_ENOTFOUND) kex_err_set(err, KEX_ENOTFOUND, "no kernel of %s has AST key %.16s...", gpath, e->ast_hex);
  kex_program_src_free(&ps);
  kex_plan_clear(&p);
  kex_graph_free(g);
  return src;
}

typedef struct local_export {
  kex_cache *cache;
  const kex_cache_filter *filter;
} local_export;

static int local_export_write(FILE *out, uint64_t *n, void *ctx) {
  local_export *ex = ctx;
  kex_error err = {0};
  if (kex_cache_export(ex->cache, out, ex->filter, n, &err)) {
    fprintf(stderr, "kex cache export: %s\n", err.msg);
    return 1;
  }
  return 0;
}

int kex_cmd_cache(int argc, char **argv) {
  cache_args a;
  int ret = cache_parse(argc, argv, &a), rc;
  if (ret >= 0) return ret;
  ret = 0;
  if (a.job) {
    fprintf(stderr, "kex cache: --job needs --server\n");
    return 2;
  }
  kex_cache_filter f = {a.device, a.kernel_name, a.key_prefix, a.max_age_s};
  char cp[4096];
  kex_error err = {0};
  kex_cache *cache = NULL;
  if (a.cache_path)
    snprintf(cp, sizeof cp, "%s", a.cache_path);
  else if ((rc = kex_beam_default_cache_path(cp, sizeof cp, &err))) {
    fprintf(stderr, "kex cache: %s\n", err.msg);
    return 1;
  }
  /* plan.h's cache policy: the cache is the subject here, so one that cannot be opened is an error */
  if ((rc = kex_plan_cache_open(cp, KEX_PLAN_CACHE_KEEP, "cache", &cache, &err))) {
    fprintf(stderr, "kex cache: %s\n", err.msg);
    return rc == KEX_EUNSUPPORTED || rc == KEX_ECORRUPT ? 2 : 1;
  }
  if (!cache) {
    fprintf(stderr, "kex cache: --cache needs a file name\n");
    return 2;
  }
  if (!strcmp(a.sub, "ls")) {
    ls_state st = {a.json, a.json ? json_array() : NULL, "", "", 0, 0};
    if ((rc = kex_cache_list(cache, &f, 0, KEX_CACHE_LIST_MAX, ls_cb, &st, NULL, &err))) {
      fprintf(stderr, "kex cache ls: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else {
      ls_finish(&st, cp);
    }
    json_decref(st.arr);
  } else if (!strcmp(a.sub, "show")) {
    kex_cache_filter sf = f;
    sf.key_prefix = a.arg;
    ls_state st = {true, NULL, "", "", 0, 0};
    kex_cache_entry e;
    memset(&e, 0, sizeof e);
    if ((rc = kex_cache_list(cache, &sf, 0, KEX_CACHE_LIST_MAX, ls_cb, &st, NULL, &err))) {
      fprintf(stderr, "kex cache show: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else if ((ret = show_one_key(a.arg, st.distinct, ""))) {
    } else if ((rc = kex_cache_get_entry(cache, st.first_hex, f.device && *f.device ? st.first_dev : NULL, &e, &err))) {
      fprintf(stderr, "kex cache show: %s\n", err.msg);
      ret = 1;
    } else {
      char *src = NULL, ot[KEX_CACHE_OPTS_TEXT_MAX];
      kex_error gerr = {0};
      if (a.graph && !(src = render_from_graph(a.graph, &e, &gerr))) {
        fprintf(stderr, "kex cache show: %s\n", gerr.msg);
        /* a missing or unreadable graph file is the caller's mistake (2), as everywhere in kex */
        ret = gerr.code == KEX_EIO || gerr.code == KEX_EPARSE || gerr.code == KEX_EINVAL || gerr.code == KEX_ENOTFOUND
                  ? 2
                  : 1;
      }
      cache_row r = row_of(&e, ot);
      show_print(&r, e.ast_text, src, a.json, false);
      kex_free(src);
      kex_free(e.ast_text);
    }
  } else if (!strcmp(a.sub, "export")) {
    local_export ex = {cache, a.filtered ? &f : NULL};
    ret = export_run(&a, local_export_write, &ex);
  } else if (!strcmp(a.sub, "import")) {
    FILE *in = fopen(a.arg, "r");
    kex_cache_import_report rep = {0};
    if (!in) {
      fprintf(stderr, "kex cache import: cannot read %s\n", a.arg);
      ret = 2;
    } else {
      rc = kex_cache_import(cache, in, &rep, &err);
      fclose(in);
      if (rc) {
        fprintf(stderr, "kex cache import: %s\n", err.msg);
        ret = rc == KEX_EPARSE || rc == KEX_ELIMIT ? 2 : 1;
      }
      const char *errs[KEX_CACHE_IMPORT_ERRORS];
      for (uint32_t i = 0; i < rep.nerrors && i < KEX_CACHE_IMPORT_ERRORS; i++) errs[i] = rep.errors[i];
      import_print(a.json, rep.imported, rep.rejected, errs, rep.nerrors);
    }
  } else {
    uint64_t n = 0;
    if ((rc = kex_cache_delete(cache, a.filtered ? &f : NULL, &n, &err))) {
      fprintf(stderr, "kex cache rm: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else {
      rm_print(a.json, n);
    }
  }
  kex_cache_close(cache);
  return ret;
}
#endif

/* ---- against a server ---- */

#ifdef KEX_HAVE_LIBKEX
#define REMOTE_PAGE 1000 /* entries asked for per ListCache page */

static cache_row row_of_remote(const kex_remote_cache_entry *e) {
  cache_row r = {e->key,         e->device,  e->kind,    e->device_name, e->search_opts,   e->codegen,
                 e->kernel_name, e->opts,    e->best_us, e->hand_us,     e->search_s, (int64_t)e->candidates,
                 e->created_unix};
  return r;
}

/*
 * Every entry matching f, page by page, into st; stop early once st has
 * seen more than stop_after distinct keys (0 = never).  0 or the exit code.
 */
static int remote_list(kex_cli_remote *r, const char *cmd, const kex_remote_cache_filter *f, ls_state *st,
                       uint32_t stop_after) {
  char *token = NULL;
  int ret = 0;
  for (;;) {
    kex_cache_page *p = NULL;
    kex_status s;
    if (kex_client_cache_list(r->client, r->job, f, REMOTE_PAGE, token, &p, &s)) {
      ret = kex_cli_fail(cmd, &s);
      break;
    }
    for (size_t i = 0; i < p->nentries; i++) {
      cache_row row = row_of_remote(&p->entries[i]);
      ls_take(st, &row);
    }
    kex_free(token);
    token = NULL;
    bool more = p->next_page_token[0] && !(stop_after && st->distinct > stop_after);
    if (more && !(token = kex_strdup(p->next_page_token))) {
      fprintf(stderr, "kex %s: out of memory\n", cmd);
      ret = 1;
    }
    kex_cache_page_free(p);
    if (!more || ret) break;
  }
  kex_free(token);
  return ret;
}

static int export_to(const void *data, size_t len, void *ud) {
  return fwrite(data, 1, len, ud) != len;
}

typedef struct remote_export {
  kex_cli_remote *r;
  const kex_remote_cache_filter *filter;
  const char *outp;
} remote_export;

static int remote_export_write(FILE *out, uint64_t *n, void *ctx) {
  remote_export *ex = ctx;
  kex_status st;
  if (!kex_client_cache_export(ex->r->client, ex->r->job, ex->filter, NULL, export_to, out, n, &st)) return 0;
  if (st.code != KEX_ECANCELLED) return kex_cli_fail("cache export", &st);
  fprintf(stderr, "kex cache export: writing %s failed\n", ex->outp ? ex->outp : "stdout");
  return 1;
}

int kex_remote_cmd_cache(kex_cli_remote *r, int argc, char **argv) {
  cache_args a;
  int ret = cache_parse(argc, argv, &a);
  kex_status st;
  if (ret >= 0) return ret;
  ret = 0;
  if (a.cache_path || a.graph) {
    fprintf(stderr, "kex cache: --%s is in-process only (a server uses its own cache and renders the source)\n",
            a.cache_path ? "cache" : "graph");
    return 2;
  }
  FILE *in = NULL;
  if (!strcmp(a.sub, "import") && !(in = fopen(a.arg, "rb"))) {
    fprintf(stderr, "kex cache import: cannot read %s\n", a.arg);
    return 2;
  }
  kex_remote_cache_filter f = {a.device, a.kernel_name, a.key_prefix, a.max_age_s};
  if ((ret = kex_cli_remote_open(r, "cache", a.job, true))) goto out;
  if (!strcmp(a.sub, "ls")) {
    ls_state ls = {a.json, a.json ? json_array() : NULL, "", "", 0, 0};
    if (!(ret = remote_list(r, "cache ls", &f, &ls, 0))) ls_finish(&ls, r->server);
    json_decref(ls.arr);
  } else if (!strcmp(a.sub, "show")) {
    kex_remote_cache_filter sf = f;
    kex_remote_cache_entry *e = NULL;
    ls_state ls = {true, NULL, "", "", 0, 0};
    sf.key_prefix = a.arg;
    if ((ret = remote_list(r, "cache show", &sf, &ls, 1))) {
    } else if ((ret = show_one_key(a.arg, ls.distinct, " or more"))) {
    } else if (kex_client_cache_get(r->client, r->job, ls.first_hex, f.device && *f.device ? ls.first_dev : NULL, &e,
                                    &st)) {
      ret = kex_cli_fail("cache show", &st);
    } else {
      cache_row row = row_of_remote(e);
      show_print(&row, e->ast_text[0] ? e->ast_text : NULL, e->source[0] ? e->source : NULL, a.json, true);
    }
    kex_remote_cache_entry_free(e);
  } else if (!strcmp(a.sub, "export")) {
    remote_export ex = {r, a.filtered ? &f : NULL, a.outp};
    ret = export_run(&a, remote_export_write, &ex);
  } else if (!strcmp(a.sub, "import")) {
    kex_import_report rep;
    if (kex_client_cache_import(r->client, r->job, in, &rep, &st)) {
      ret = kex_cli_fail("cache import", &st);
    } else {
      const char *errs[KEX_IMPORT_ERRORS_MAX];
      for (uint32_t i = 0; i < rep.nerrors; i++) errs[i] = rep.errors[i];
      if (rep.rejected) {
        fprintf(stderr, "kex cache import: %u line%s refused%s%s\n", rep.rejected, rep.rejected == 1 ? "" : "s",
                rep.nerrors ? ": " : "", rep.nerrors ? rep.errors[0] : "");
        ret = 2;
      }
      import_print(a.json, rep.imported, rep.rejected, errs, rep.nerrors);
    }
  } else {
    uint32_t n = 0;
    if (kex_client_cache_delete(r->client, r->job, a.filtered ? &f : NULL, &n, &st))
      ret = kex_cli_fail("cache rm", &st);
    else
      rm_print(a.json, n);
  }
out:
  if (in) fclose(in);
  kex_cli_remote_done(r);
  return ret;
}
#endif

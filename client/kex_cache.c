/*
 * kex_cache.c - `kex cache`: the beam-result cache file (search/cache.h)
 * from the command line, in-process.
 *
 *   kex cache ls     [filters] [--json]
 *   kex cache show   AST_PREFIX [--device S] [--graph FILE.json] [--json]
 *   kex cache export [filters] [--out FILE] [--json]
 *   kex cache import FILE [--json]
 *   kex cache rm     (filters | --all) [--json]
 *
 * Filters: --device S (substring of the rendered device identity),
 * --name S (kernel name substring), --ast PREFIX (AST key hex prefix),
 * --max-age AGE (seconds, or with s/m/h/d).  Every command takes
 * --cache PATH (default: $KEX_CACHE, $XDG_CACHE_HOME/kex/cache.db,
 * ~/.cache/kex/cache.db).  The cache stores the AST text, not the source:
 * `show --graph FILE` renders the source by scheduling FILE on the entry's
 * device kind and lowering the kernel whose AST key matches with the
 * cached opts.
 */
#ifdef KEX_HAVE_RUN
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "search/astkey.h"
#include "search/beam.h"
#include "search/cache.h"
#include "search/lower.h"
#include "search/run.h"

int kex_cmd_cache(int argc, char **argv);

static void cache_usage(FILE *f) {
  fputs("usage: kex cache ls     [--device S] [--name S] [--ast PREFIX] [--max-age AGE] [--json] [--cache PATH]\n"
        "       kex cache show   AST_PREFIX [--device S] [--graph FILE.json] [--json] [--cache PATH]\n"
        "       kex cache export [filters] [--out FILE] [--json] [--cache PATH]\n"
        "       kex cache import FILE [--json] [--cache PATH]\n"
        "       kex cache rm     (filters | --all) [--json] [--cache PATH]\n",
        f);
}

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

static json_t *entry_json(const kex_cache_entry *e) {
  char ot[KEX_CACHE_OPTS_TEXT_MAX];
  kex_cache_opts_format(e->value.opts, e->value.nopts, ot, sizeof ot);
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:f, s:f, s:f, s:I, s:I}", "ast_key", e->ast_hex, "device",
                   e->device_rendered, "search_opts", e->search_opts, "codegen_version", e->codegen_version,
                   "kernel_name", e->value.kernel_name, "opts", ot, "us", e->value.best_time_s * 1e6, "hand_us",
                   e->value.hand_time_s * 1e6, "search_s", e->value.search_time_s, "candidates",
                   (json_int_t)e->value.candidates, "created_at", (json_int_t)e->value.created_at);
}

typedef struct ls_state {
  bool json;
  json_t *arr;
  char first_hex[KEX_AST_KEY_HEX];
  char first_dev[KEX_DEVICE_IDENTITY_STR_MAX];
  uint32_t distinct;
} ls_state;

static int ls_cb(const kex_cache_entry *e, void *arg) {
  ls_state *st = arg;
  if (!st->distinct || strcmp(st->first_hex, e->ast_hex) != 0) {
    if (!st->distinct) {
      snprintf(st->first_hex, sizeof st->first_hex, "%s", e->ast_hex);
      snprintf(st->first_dev, sizeof st->first_dev, "%s", e->device_rendered);
    }
    st->distinct++;
  }
  if (st->arr) {
    json_array_append_new(st->arr, entry_json(e));
    return 0;
  }
  if (st->json) return 0;
  char ot[KEX_CACHE_OPTS_TEXT_MAX];
  kex_cache_opts_format(e->value.opts, e->value.nopts, ot, sizeof ot);
  long age = (long)(time(NULL) - e->value.created_at);
  printf("%.16s  %-8s %-24.24s %-26s %-40s %9.2f us (hand %9.2f) %6lds ago\n", e->ast_hex, e->device.kind,
         e->device.name, e->value.kernel_name, ot[0] ? ot : "(no opts)", e->value.best_time_s * 1e6,
         e->value.hand_time_s * 1e6, age);
  return 0;
}

/* Render the kernel of graph `gpath` whose AST key is e's, with e's opts. */
static char *render_from_graph(const char *gpath, const kex_cache_entry *e, kex_error *err) {
  kex_limits lim = KEX_LIMITS_DEFAULT;
  kex_graph *g = NULL;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_kernel *k = NULL;
  kex_program_src ps = {0};
  char *src = NULL;
  kex_arena arena;
  kex_arena_init(&arena, 0);
  bool cpu = strcmp(e->device.kind, "cpu") == 0 || strstr(e->device.kind, "+cpu") != NULL;
  const kex_renderer_caps *caps = cpu ? &kex_renderer_cpu : &kex_renderer_opencl;
  kex_replay_opts ro = kex_run_replay_opts(cpu);
  int rc = kex_graph_from_json_file(gpath, &lim, &g, err);
  if (!rc) rc = kex_replay_graph(g, &ro, &arena, &r, err);
  if (!rc) rc = kex_schedule_create(r, &s, err);
  for (uint32_t i = 0; !rc && s && i < s->nitems; i++) {
    if (s->items[i].kind != KEX_ITEM_KERNEL) continue;
    kex_ast_digest d;
    if (kex_ast_key(s->items[i].ast, s->items[i].nout, &d, err) || strcmp(d.hex, e->ast_hex)) continue;
    rc = kex_kernel_from_item(s, &s->items[i], caps, &k, err);
    if (!rc) rc = kex_beam_apply_opts(k, e->value.opts, e->value.nopts, err);
    if (!rc) rc = kex_lower_kernel(k, caps, cpu ? KEX_DIALECT_CPU : KEX_DIALECT_OPENCL, NULL, &ps, err);
    if (!rc) src = kex_strdup(ps.src);
    break;
  }
  if (!rc && !src) kex_err_set(err, KEX_ENOTFOUND, "no kernel of %s has AST key %.16s...", gpath, e->ast_hex);
  kex_program_src_free(&ps);
  kex_kernel_free(k);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_arena_destroy(&arena);
  kex_graph_free(g);
  return src;
}

int kex_cmd_cache(int argc, char **argv) {
  static const struct option lopts[] = {
      {"cache", required_argument, NULL, 'c'},   {"json", no_argument, NULL, 'j'},       {"device", required_argument, NULL, 'd'},
      {"name", required_argument, NULL, 'n'},    {"ast", required_argument, NULL, 'a'},  {"max-age", required_argument, NULL, 'A'},
      {"out", required_argument, NULL, 'o'},     {"graph", required_argument, NULL, 'g'}, {"all", no_argument, NULL, 'L'},
      {"help", no_argument, NULL, 'h'},          {0}};
  if (argc < 2) {
    cache_usage(stderr);
    return 2;
  }
  const char *sub = argv[1], *cache_path = NULL, *outp = NULL, *graph = NULL;
  bool as_json = false, all = false;
  kex_cache_filter f = {0};
  int c;
  optind = 2;
  while ((c = getopt_long(argc, argv, "c:jd:n:a:A:o:g:Lh", lopts, NULL)) != -1) {
    switch (c) {
    case 'c': cache_path = optarg; break;
    case 'j': as_json = true; break;
    case 'd': f.device = optarg; break;
    case 'n': f.kernel_name = optarg; break;
    case 'a': f.key_prefix = optarg; break;
    case 'A':
      if (parse_age(optarg, &f.max_age_s)) {
        fprintf(stderr, "kex cache: bad --max-age '%s' (seconds, or with s/m/h/d)\n", optarg);
        return 2;
      }
      break;
    case 'o': outp = optarg; break;
    case 'g': graph = optarg; break;
    case 'L': all = true; break;
    case 'h': cache_usage(stdout); return 0;
    default: cache_usage(stderr); return 2;
    }
  }
  bool is_ls = !strcmp(sub, "ls"), is_show = !strcmp(sub, "show"), is_export = !strcmp(sub, "export"),
       is_import = !strcmp(sub, "import"), is_rm = !strcmp(sub, "rm");
  if (!is_ls && !is_show && !is_export && !is_import && !is_rm) {
    fprintf(stderr, "kex cache: unknown subcommand '%s'\n", sub);
    cache_usage(stderr);
    return 2;
  }
  int npos = argc - optind;
  if (((is_show || is_import) && npos != 1) || (!(is_show || is_import) && npos != 0)) {
    fprintf(stderr, "kex cache %s: wrong number of arguments\n", sub);
    cache_usage(stderr);
    return 2;
  }
  bool filtered = (f.device && *f.device) || (f.kernel_name && *f.kernel_name) || (f.key_prefix && *f.key_prefix) ||
                  f.max_age_s;
  if (is_rm && !filtered && !all) {
    fprintf(stderr, "kex cache rm: give a filter or --all\n");
    return 2;
  }
  char cp[4096];
  kex_error err = {0};
  kex_cache *cache = NULL;
  int ret = 0, rc;
  if (cache_path)
    snprintf(cp, sizeof cp, "%s", cache_path);
  else if ((rc = kex_beam_default_cache_path(cp, sizeof cp, &err))) {
    fprintf(stderr, "kex cache: %s\n", err.msg);
    return 1;
  }
  if ((rc = kex_cache_open(cp, &cache, &err))) {
    fprintf(stderr, "kex cache: %s: %s\n", cp, err.msg);
    return rc == KEX_EUNSUPPORTED || rc == KEX_ECORRUPT ? 2 : 1;
  }
  if (is_ls) {
    ls_state st = {as_json, as_json ? json_array() : NULL, "", "", 0};
    uint32_t n = 0;
    if ((rc = kex_cache_list(cache, &f, 0, KEX_CACHE_LIST_MAX, ls_cb, &st, &n, &err))) {
      fprintf(stderr, "kex cache ls: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else if (as_json) {
      json_t *doc = json_pack("{s:s, s:O}", "cache", cp, "entries", st.arr);
      json_dumpf(doc, stdout, JSON_COMPACT);
      fputc('\n', stdout);
      json_decref(doc);
    } else {
      printf("%u entr%s in %s\n", n, n == 1 ? "y" : "ies", cp);
    }
    json_decref(st.arr);
  } else if (is_show) {
    kex_cache_filter sf = f;
    sf.key_prefix = argv[optind];
    ls_state st = {true, NULL, "", "", 0};
    uint32_t n = 0;
    kex_cache_entry e;
    memset(&e, 0, sizeof e);
    if ((rc = kex_cache_list(cache, &sf, 0, KEX_CACHE_LIST_MAX, ls_cb, &st, &n, &err))) {
      fprintf(stderr, "kex cache show: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else if (st.distinct == 0) {
      fprintf(stderr, "kex cache show: no entry with AST key prefix '%s'\n", argv[optind]);
      ret = 2;
    } else if (st.distinct > 1) {
      fprintf(stderr, "kex cache show: AST key prefix '%s' is ambiguous (%u keys)\n", argv[optind], st.distinct);
      ret = 2;
    } else if ((rc = kex_cache_get_entry(cache, st.first_hex, f.device && *f.device ? st.first_dev : NULL, &e, &err))) {
      fprintf(stderr, "kex cache show: %s\n", err.msg);
      ret = 1;
    } else {
      char *src = NULL;
      kex_error gerr = {0};
      if (graph && !(src = render_from_graph(graph, &e, &gerr))) {
        fprintf(stderr, "kex cache show: %s\n", gerr.msg);
        ret = 1;
      }
      if (as_json) {
        json_t *o = entry_json(&e);
        json_object_set_new(o, "ast_text", e.ast_text ? json_string(e.ast_text) : json_null());
        json_object_set_new(o, "source", src ? json_string(src) : json_null());
        json_dumpf(o, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(o);
      } else {
        char ot[KEX_CACHE_OPTS_TEXT_MAX];
        kex_cache_opts_format(e.value.opts, e.value.nopts, ot, sizeof ot);
        printf("ast_key:         %s\ndevice:          %s\nsearch_opts:     %s\ncodegen_version: %s\n"
               "kernel:          %s\nopts:            %s\ntime:            %.2f us (hand-coded %.2f us)\n"
               "search:          %.2f s, %lld candidates timed\ncreated_at:      %lld\n",
               e.ast_hex, e.device_rendered, e.search_opts, e.codegen_version, e.value.kernel_name,
               ot[0] ? ot : "(no opts)", e.value.best_time_s * 1e6, e.value.hand_time_s * 1e6, e.value.search_time_s,
               (long long)e.value.candidates, (long long)e.value.created_at);
        printf("ast:\n%s\n", e.ast_text ? e.ast_text : "(not stored)");
        printf("source:\n%s\n", src ? src : "(not stored; give --graph FILE.json to render it)");
      }
      kex_free(src);
      kex_free(e.ast_text);
    }
  } else if (is_export) {
    FILE *out = outp ? fopen(outp, "w") : stdout;
    uint64_t n = 0;
    if (!out) {
      fprintf(stderr, "kex cache export: cannot write %s\n", outp);
      ret = 1;
    } else if ((rc = kex_cache_export(cache, out, filtered ? &f : NULL, &n, &err))) {
      fprintf(stderr, "kex cache export: %s\n", err.msg);
      ret = 1;
    }
    if (out && out != stdout && fclose(out) && !ret) {
      fprintf(stderr, "kex cache export: writing %s failed\n", outp);
      ret = 1;
    }
    if (!ret) {
      FILE *msg = outp ? stdout : stderr;
      if (as_json)
        fprintf(msg, "{\"exported\":%llu}\n", (unsigned long long)n);
      else
        fprintf(msg, "exported %llu entries\n", (unsigned long long)n);
    }
  } else if (is_import) {
    FILE *in = fopen(argv[optind], "r");
    kex_cache_import_report rep = {0};
    if (!in) {
      fprintf(stderr, "kex cache import: cannot read %s\n", argv[optind]);
      ret = 2;
    } else {
      rc = kex_cache_import(cache, in, &rep, &err);
      fclose(in);
      if (rc) {
        fprintf(stderr, "kex cache import: %s\n", err.msg);
        ret = rc == KEX_EPARSE || rc == KEX_ELIMIT ? 2 : 1;
      }
      if (as_json) {
        json_t *errs = json_array();
        for (uint32_t i = 0; i < rep.nerrors; i++) json_array_append_new(errs, json_string(rep.errors[i]));
        json_t *o = json_pack("{s:I, s:I, s:o}", "imported", (json_int_t)rep.imported, "rejected",
                              (json_int_t)rep.rejected, "errors", errs);
        json_dumpf(o, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(o);
      } else {
        printf("imported %llu, rejected %llu\n", (unsigned long long)rep.imported, (unsigned long long)rep.rejected);
        for (uint32_t i = 0; i < rep.nerrors; i++) printf("  %s\n", rep.errors[i]);
      }
    }
  } else {
    uint64_t n = 0;
    if ((rc = kex_cache_delete(cache, filtered ? &f : NULL, &n, &err))) {
      fprintf(stderr, "kex cache rm: %s\n", err.msg);
      ret = rc == KEX_EINVAL ? 2 : 1;
    } else if (as_json) {
      printf("{\"deleted\":%llu}\n", (unsigned long long)n);
    } else {
      printf("deleted %llu entries\n", (unsigned long long)n);
    }
  }
  kex_cache_close(cache);
  return ret;
}
#endif

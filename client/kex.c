/*
 * kex.c - the kex command line: main, and the in-process plan and run.
 *
 * `kex plan [--device opencl|cpu] [--json] FILE.json` replays a graph and
 * schedules it in-process (no daemon): it prints every schedule item (kind,
 * output and input buffers, AST) and ends with `kernels: N`; --json prints
 * {"kernels": N, "schedule_us": T, "items": [...]} where T is the time to
 * replay and schedule, excluding JSON parsing.  `kex run` also compiles and
 * runs it and prints each kernel (numbered from 1, as `kex tune` numbers
 * them) and the outputs, or with --check CASE.json compares the outputs
 * with the case's (kex_check.c).  With --server ADDR or KEX_SERVER the same
 * command lines go to a kexd (kex_remote.c runs first and takes them).
 * Exit codes: 0 ok, 2 bad input (usage, a missing, unreadable or invalid
 * graph), 1 anything else (and a failed --check).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/kex_cli.h"
#include "core/alloc.h"
#include "core/codec.h"
#include "core/arena.h"
#include "core/errors.h"
#include "core/npy.h"
#include "realize/plan.h" /* the plan stage (graph, replay, schedule, lowering: sched/ and codegen/ through it) */
#ifdef KEX_HAVE_RUN
#include <sys/stat.h>

#include "realize/run.h"

int kex_cmd_tune(int argc, char **argv);
int kex_cmd_auth(int argc, char **argv); /* client/kex_auth.c */
int kex_cmd_cache(int argc, char **argv);
#endif

#ifndef KEX_VERSION
#define KEX_VERSION "unknown" /* meson.build passes the project's version */
#endif

const char *kex_cli_version(void) { return KEX_VERSION; }

void kex_cli_iso8601(int64_t t, char out[KEX_CLI_ISO8601_MAX]) {
  time_t tt = (time_t)t;
  struct tm tm;
  if (!gmtime_r(&tt, &tm) || !strftime(out, KEX_CLI_ISO8601_MAX, "%Y-%m-%dT%H:%M:%SZ", &tm))
    snprintf(out, KEX_CLI_ISO8601_MAX, "-");
}

double kex_cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void kex_cli_bytes_text(uint64_t n, char *out, size_t cap) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0) snprintf(out, cap, "%llu B", (unsigned long long)n);
  else snprintf(out, cap, "%.1f %s", v, unit[u]);
}

/* The option of opts that getopt_long's code c stands for (256 + index for a long-only one); NULL for none. */
static const kex_cli_opt *opt_of(const kex_cli_opt *opts, size_t n, int c) {
  if (c >= 256 && (size_t)(c - 256) < n) return &opts[c - 256];
  for (size_t i = 0; i < n; i++)
    if (opts[i].short_name && opts[i].short_name == c) return &opts[i];
  return NULL;
}

/* Store optarg as o says.  0, or -1 after saying why the value is refused. */
static int opt_store(const char *cmd, const kex_cli_opt *o) {
  char *end = NULL;
  long long i = 0;
  double v;
  switch (o->kind) {
  case KEX_CLI_FLAG: *(bool *)o->dst = true; return 0;
  case KEX_CLI_STR: *(const char **)o->dst = optarg; return 0;
  case KEX_CLI_LOCAL:
  case KEX_CLI_LOCAL_ARG: fprintf(stderr, "kex %s: --%s is in-process only (%s)\n", cmd, o->name, o->why); return -1;
  case KEX_CLI_INT:
  case KEX_CLI_NUM:
    errno = 0;
    if (o->kind == KEX_CLI_INT) i = strtoll(optarg, &end, 10), v = (double)i; /* i exact: v only for the range */
    else v = strtod(optarg, &end);
    if (end == optarg || *end || errno || !(v >= o->min && v <= o->max)) {
      fprintf(stderr, "kex %s: --%s must be %s in [%.15g, %.15g], not '%s'\n", cmd, o->name,
              o->kind == KEX_CLI_INT ? "a whole number" : "a number", o->min, o->max, optarg);
      return -1;
    }
    if (o->kind == KEX_CLI_INT) *(long long *)o->dst = i;
    else *(double *)o->dst = v;
    return 0;
  }
  return -1;
}

int kex_cli_options(const char *cmd, const kex_cli_opt *opts, int argc, char **argv, void (*usage)(FILE *)) {
  struct option lo[KEX_CLI_OPTS_MAX + 2];
  char shorts[3 * KEX_CLI_OPTS_MAX + 2] = "h", *sp = shorts + 1;
  size_t n = 0;
  int c;
  for (; opts[n].name && n < KEX_CLI_OPTS_MAX; n++) {
    bool flag = opts[n].kind == KEX_CLI_FLAG || opts[n].kind == KEX_CLI_LOCAL;
    lo[n] = (struct option){opts[n].name, flag ? no_argument : required_argument, NULL, 256 + (int)n};
    if (opts[n].short_name) {
      *sp++ = opts[n].short_name;
      if (lo[n].has_arg == required_argument) *sp++ = ':';
    }
  }
  *sp = 0;
  lo[n] = (struct option){"help", no_argument, NULL, 'h'};
  lo[n + 1] = (struct option){0};
  optind = 1;
  while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
    const kex_cli_opt *o = c == 'h' ? NULL : opt_of(opts, n, c);
    if (c == 'h') {
      usage(stdout);
      return 0;
    }
    if (!o) {
      usage(stderr);
      return 2;
    }
    if (opt_store(cmd, o) < 0) return 2;
  }
  return -1;
}

int kex_cli_args(const char *cmd, const kex_cli_opt *opts, const char *what, const char **operand, int argc,
                 char **argv, void (*usage)(FILE *)) {
  int rc = kex_cli_options(cmd, opts, argc, argv, usage);
  if (rc >= 0) return rc;
  if (!what) return kex_cli_no_operand(cmd, argc, argv) ? -1 : 2;
  return (*operand = kex_cli_one_operand(cmd, what, argc, argv, usage)) ? -1 : 2;
}

bool kex_cli_no_operand(const char *cmd, int argc, char **argv) {
  if (optind == argc) return true;
  fprintf(stderr, "kex %s: unexpected argument '%s'\n", cmd, argv[optind]);
  return false;
}

const char *kex_cli_one_operand(const char *cmd, const char *what, int argc, char **argv, void (*usage)(FILE *)) {
  if (optind == argc - 1) return argv[optind];
  fprintf(stderr, "kex %s: expected one %s\n", cmd, what);
  if (usage) usage(stderr);
  return NULL;
}

int kex_cli_server_addr(const char *in, char *out, size_t cap) {
  const char *colon = strrchr(in, ':'), *bracket = strrchr(in, ']');
  int n;
  if (strchr(in, ',') && !strchr(in, '/') && strncmp(in, "ipv4:", 5) && strncmp(in, "ipv6:", 5)) {
    /* a fleet "a,b:2": each server as one address (libkex makes the list a round_robin target) */
    size_t len = 0;
    for (const char *p = in; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
      char one[KEX_CLI_ADDR_MAX];
      size_t l = strchr(p, ',') ? (size_t)(strchr(p, ',') - p) : strlen(p);
      if (l == 0 || l >= sizeof one) return -1;
      memcpy(one, p, l);
      one[l] = 0;
      if (len >= cap || kex_cli_server_addr(one, out + len + (len ? 1 : 0), cap - len - (len ? 1 : 0))) return -1;
      if (len) out[len] = ',';
      len += strlen(out + len);
    }
    return 0;
  }
  if (strstr(in, ":/") || !strncmp(in, "unix:", 5) || !strncmp(in, "unix-abstract:", 14) ||
      !strncmp(in, "ipv4:", 5) || !strncmp(in, "ipv6:", 5) || !strncmp(in, "dns:", 4) || !strncmp(in, "vsock:", 6))
    n = snprintf(out, cap, "%s", in);                                  /* a gRPC target scheme */
  else if (in[0] == '[')
    n = bracket && colon > bracket ? snprintf(out, cap, "%s", in)     /* [v6]:port */
                                   : snprintf(out, cap, "%s:" KEX_CLI_DEFAULT_PORT, in);
  else if (colon && strchr(in, ':') != colon)
    n = snprintf(out, cap, "[%s]:" KEX_CLI_DEFAULT_PORT, in);          /* a bare IPv6 literal */
  else if (colon)
    n = snprintf(out, cap, "%s", in);                                  /* host:port */
  else
    n = snprintf(out, cap, "%s:" KEX_CLI_DEFAULT_PORT, in);            /* host */
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

void kex_cli_print_values(int dt, const void *data, size_t nbytes) {
  size_t item = dt < 0 || dt >= KEX_DT_COUNT ? 0 : (size_t)kex_dtype_size((kex_dtype)dt), n = item ? nbytes / item : 0;
  printf("[");
  for (size_t i = 0; i < n && i < 8; i++) printf("%s%.6g", i ? ", " : "", kex_dtype_element((kex_dtype)dt, data, i));
  printf("%s]\n", n > 8 ? ", ..." : "");
}

void kex_cli_start_hint(FILE *f, const char *addr) {
  if (strchr(addr, ',') || !strncmp(addr, "dns:", 4))
    fprintf(f, "kex: is kexd running on every node of %s? start each with build/daemon/kexd --listen HOST:PORT "
               "--node-name NAME (a job's calls go to the node that opened it; new jobs go to the live nodes)\n",
            addr);
  else if (!strcmp(addr, KEX_CLI_DEFAULT_SERVER))
    fprintf(f, "kex: is kexd running at %s? start one with scripts/run.sh (it builds kexd and listens there), or "
               "with build/daemon/kexd --listen %s\n", addr, addr);
  else
    fprintf(f, "kex: is kexd running at %s? start one with scripts/run.sh --listen %s, or with build/daemon/kexd "
               "--listen %s\n", addr, addr, addr);
}

static void usage(FILE *f) {
  fputs("usage: kex [--server ADDR] <command> [options]\n"
        "\n"
        "commands (in-process, or on a kexd with --server ADDR / KEX_SERVER=ADDR):\n"
        "  plan [--device D] [--json] [--source] FILE.json\n"
        "      replay and schedule a graph; print every schedule item\n"
        "      (kind, output/input buffers, AST with ShapeTrackers) and `kernels: N`.\n"
        "      --device  whose rules apply: opencl (tinygrad's GPU device, default)\n"
        "                or cpu (tinygrad's CLANG device: consecutive CONTIGUOUS\n"
        "                and BITCAST become buffer views, no kernel); with --server,\n"
        "                one of the server's devices (kex devices)\n"
        "      --json    print {\"kernels\": N, \"schedule_us\": T, \"items\": [...]}\n"
        "      --source  also print each kernel's rendered source (in-process only)\n"
        "  run [--device D] [--json] [--repeat N] [--beam N] [--cache PATH|--no-cache] [--out DIR] [--source] FILE.json\n"
        "  run --check CASE.json [--device D] [--json] [--beam N] [--cache PATH|--no-cache]\n"
        "      schedule, lower, compile and run a graph; print each kernel (kernel 1..N:\n"
        "      name, applied opts, time) and then the outputs.\n"
        "      --device  opencl (first OpenCL GPU, else first OpenCL device; default),\n"
        "                cpu (C source -> cc -> dlopen), or opencl:<name substring>;\n"
        "                with --server, one of the server's devices (kex devices)\n"
        "      --repeat  time each kernel as the median of N runs after a warm-up\n"
        "                (with --server and N > 1: N + 1 submissions of the graph)\n"
        "      --beam N  BEAM-search each kernel (width N) or use the cached result\n"
        "      --cache   the cache file kernels' programs (and beam results) are read from\n"
        "                and programs stored in (default: kexd's default file); --no-cache: none\n"
        "      --check   run a case file's numeric graph (../shared/cases/*.json) and\n"
        "                print PASS or FAIL per output against its expected outputs and\n"
        "                tolerances; exit 0 only when every output passes\n"
        "      --out     write each output as DIR/out<i>.npy\n"
        "      --source  print each kernel's rendered source (in-process only)\n"
        "      --json    print {\"kernels\": [{\"name\", \"opts\", \"us\"}],\n"
        "                \"outputs\": [{\"dtype\", \"shape\", \"data\"}]} (data: base64, little-endian)\n"
        "  tune [--device D] [--beam N] [--json] [--cache PATH|--no-cache] FILE.json\n"
        "      BEAM-search every kernel and store the results in the cache\n"
        "  cache ls|show|export|import|rm [--json] [--cache PATH] ...   (kex cache --help)\n"
        "  doctor [--json] [--cache PATH]\n"
        "      this machine's OpenCL platforms and devices with their capabilities,\n"
        "      the cache file and its size, and whether a kexd answers at --server /\n"
        "      KEX_SERVER (else " KEX_CLI_DEFAULT_SERVER ")\n"
        "  devices, stats, top, upload, download, job    server only (kex --server ADDR help)\n"
        "  --version   print kex's version\n"
        "  auth token [--name N] [--role user|admin]   a new token and its kexd --auth entry\n"
        "  help        this text\n"
        "\n"
        "--server HOST without a port means HOST:" KEX_CLI_DEFAULT_PORT ". Start a kexd with scripts/run.sh.\n"
        "exit codes: 0 success, 2 bad input (usage, a missing or invalid graph), 1 other errors\n",
        f);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int exit_code(int rc) {
  return (rc == KEX_EINVAL || rc == KEX_EPARSE || rc == KEX_ELIMIT || rc == KEX_EASSIGN || rc == KEX_ENOTFOUND) ? 2 : 1;
}

int kex_cli_graph_load(const char *cmd, const char *path, kex_graph **g) {
  kex_limits limits = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  int rc = kex_graph_from_json_file(path, &limits, g, &err);
  if (!rc) return 0;
  const char *m = err.msg[0] ? err.msg : kex_strerror(rc);
  if (strncmp(m, path, strlen(path)) == 0) fprintf(stderr, "kex %s: %s\n", cmd, m); /* the message names the file */
  else fprintf(stderr, "kex %s: %s: %s\n", cmd, path, m);
  return rc == KEX_EIO ? 2 : exit_code(rc);
}

static int cmd_plan(int argc, char **argv) {
  const char *device = "opencl";
  bool as_json = false, source = false;
  const kex_cli_opt opts[] = {{"device", 'd', KEX_CLI_STR, &device},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"source", 's', KEX_CLI_FLAG, &source},
                              {0}};
  const char *path = NULL;
  int c = kex_cli_args("plan", opts, "graph file", &path, argc, argv, usage);
  if (c >= 0) return c;
  kex_target target;
  if (kex_target_for_name(device, &target) < 0) {
    fprintf(stderr, "kex plan: unknown device '%s' (opencl or cpu)\n", device);
    return 2;
  }
  kex_error err = {0};
  kex_graph *g = NULL;
  kex_rplan plan;
  bool planned = false;
  kex_schedule *s = NULL;
  int rc, ret = kex_cli_graph_load("plan", path, &g);
  if (ret) goto out;
  kex_plan_init(&plan, g, &target); /* the engine's plan stage: replay + schedule (realize/plan.h) */
  planned = true;
  double t0 = now_us();
  rc = kex_plan_schedule(&plan, device, &err);
  s = plan.s;
  double t1 = now_us();
  if (rc) {
    fprintf(stderr, "kex plan: %s: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = exit_code(rc);
    goto out;
  }
  char **notes = kex_calloc(s->nitems ? s->nitems : 1, sizeof *notes);
  char **names = kex_calloc(s->nitems ? s->nitems : 1, sizeof *names);
  char **kopts = kex_calloc(s->nitems ? s->nitems : 1, sizeof *kopts);
  char **sources = kex_calloc(s->nitems ? s->nitems : 1, sizeof *sources);
  if (!notes || !names || !kopts || !sources) {
    fprintf(stderr, "kex plan: out of memory\n");
    ret = 1;
    goto out_notes;
  }
#ifdef KEX_HAVE_RUN
  {
    /* kernel names, applied (hand-coded) opts and the rendered source, as `kex run` would make them */
    kex_name_counter nc;
    kex_name_counter_init(&nc);
    for (uint32_t i = 0; i < s->nitems; i++) {
      if (s->items[i].kind != KEX_ITEM_KERNEL) continue;
      kex_program_src ps = {0};
      char o[512] = "";
      kex_error lerr = {0};
      size_t len = 0;
      FILE *m = open_memstream(&notes[i], &len);
      if (kex_plan_lower_item(&target, s, i, NULL, 0, &nc, &ps, o, sizeof o, &lerr) == 0) {
        fprintf(m, "  kernel %s opts: %s\n", ps.name, o[0] ? o : "(none)");
        names[i] = strdup(ps.name);
        kopts[i] = strdup(o);
        if (source) {
          sources[i] = strdup(ps.src);
          for (const char *p = ps.src; *p;) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            fprintf(m, "  | %.*s\n", (int)n, p);
            p += n + (nl ? 1 : 0);
          }
        }
      } else {
        fprintf(m, "  kernel: lowering failed: %s\n", lerr.msg);
      }
      fclose(m);
      kex_program_src_free(&ps);
    }
    kex_name_counter_free(&nc);
  }
#else
  (void)source;
#endif
  if (as_json) {
    json_t *items = kex_schedule_to_json(s);
    for (uint32_t i = 0; items && i < s->nitems; i++) {
      json_t *it = json_array_get(items, i);
      if (names[i]) json_object_set_new(it, "name", json_string(names[i]));
      if (kopts[i]) json_object_set_new(it, "opts", json_string(kopts[i]));
      if (sources[i]) json_object_set_new(it, "source", json_string(sources[i]));
    }
    json_t *o = items ? json_pack("{s:i, s:f, s:o, s:{s:i, s:i, s:I, s:I}}", "kernels", (json_int_t)s->nkernels,
                                  "schedule_us", t1 - t0, "items", items, "memory", "intermediate_buffers",
                                  (json_int_t)s->nplanned_buffers, "planned_buffers", (json_int_t)s->nplanned_after,
                                  "bytes_before", (json_int_t)s->planned_bytes_before, "bytes_after",
                                  (json_int_t)s->planned_bytes_after)
                      : NULL;
    if (!o || json_dumpf(o, stdout, JSON_COMPACT) < 0) {
      fprintf(stderr, "kex plan: out of memory writing JSON\n");
      ret = 1;
    }
    fputc('\n', stdout);
    json_decref(o);
  } else if (kex_schedule_print_annotated(s, stdout, (const char *const *)notes)) {
    fprintf(stderr, "kex plan: out of memory printing the schedule\n");
    ret = 1;
  }
out_notes:
  for (uint32_t i = 0; i < s->nitems; i++) {
    if (notes) free(notes[i]);
    if (names) free(names[i]);
    if (kopts) free(kopts[i]);
    if (sources) free(sources[i]);
  }
  kex_free(notes);
  kex_free(names);
  kex_free(kopts);
  kex_free(sources);
out:
  if (planned) kex_plan_clear(&plan);
  kex_graph_free(g);
  return ret;
}


#ifdef KEX_HAVE_RUN
static int cmd_run(int argc, char **argv) {
  const char *device = "opencl", *outdir = NULL, *cache = NULL;
  bool as_json = false, source = false, check = false, no_cache = false;
  long long repeat = 1, beam = 0;
  const kex_cli_opt opts[] = {{"device", 'd', KEX_CLI_STR, &device},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"repeat", 'r', KEX_CLI_INT, &repeat, 1, 100000},
                              {"out", 'o', KEX_CLI_STR, &outdir},
                              {"source", 's', KEX_CLI_FLAG, &source},
                              {"beam", 'b', KEX_CLI_INT, &beam, 0, KEX_BEAM_MAX_WIDTH},
                              {"check", 0, KEX_CLI_FLAG, &check},
                              {"cache", 'c', KEX_CLI_STR, &cache},
                              {"no-cache", 'n', KEX_CLI_FLAG, &no_cache},
                              {0}};
  int c = kex_cli_options("run", opts, argc, argv, usage);
  if (c >= 0) return c;
  const char *path = kex_cli_one_operand("run", check ? "case file" : "graph file", argc, argv, usage);
  if (!path) return 2;
  kex_limits limits = KEX_LIMITS_DEFAULT;
  kex_error err = {0};
  kex_graph *g = NULL;
  kex_device *dev = NULL;
  kex_run_result res = {0};
  kex_cli_case kc = {0};
  int ret = 0, rc;
  if (check) {
    if ((ret = kex_cli_case_load("run", path, &kc))) goto out;
    if ((rc = kex_graph_from_json(kc.graph_text, strlen(kc.graph_text), &limits, &g, &err))) {
      fprintf(stderr, "kex run: %s: numeric graph: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
      ret = exit_code(rc);
      goto out;
    }
  } else if ((ret = kex_cli_graph_load("run", path, &g))) {
    goto out;
  }
  if ((rc = kex_device_open(device, &dev, &err))) {
    fprintf(stderr, "kex run: device '%s': %s\n", device, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = rc == KEX_EINVAL ? 2 : 1;
    goto out;
  }
  kex_run_opts ro = {.repeat = (int)repeat, .keep_source = source, .beam = (int)beam,
                     .cache_path = no_cache ? "" : cache, .program_cache = true};
  if ((rc = kex_run_graph(g, dev, &ro, &res, &err))) {
    fprintf(stderr, "kex run: %s: %s\n", path, err.msg[0] ? err.msg : kex_strerror(rc));
    ret = exit_code(rc);
    goto out;
  }
  if (outdir) {
    mkdir(outdir, 0777);
    for (uint32_t i = 0; i < res.noutputs; i++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/out%u.npy", outdir, i);
      const kex_run_output *o = &res.outputs[i];
      if ((rc = kex_npy_write(p, o->dtype, o->ndim, o->shape, o->data, &err))) {
        fprintf(stderr, "kex run: %s\n", err.msg);
        ret = 1;
        goto out;
      }
    }
  }
  if (as_json) {
    json_t *ks = json_array(), *os = json_array(), *checks = check ? json_array() : NULL;
    for (uint32_t i = 0; i < res.nkernels; i++) {
      json_t *k = json_pack("{s:s, s:s, s:f}", "name", res.kernels[i].name, "opts", res.kernels[i].opts, "us",
                            res.kernels[i].us);
      if (source && res.kernels[i].source) json_object_set_new(k, "source", json_string(res.kernels[i].source));
      json_array_append_new(ks, k);
    }
    for (uint32_t i = 0; i < res.noutputs; i++) {
      const kex_run_output *o = &res.outputs[i];
      json_t *shape = json_array();
      for (int d = 0; d < o->ndim; d++) json_array_append_new(shape, json_integer(o->shape[d]));
      char *b64 = kex_base64_encode(o->data, o->nbytes);
      json_array_append_new(os, json_pack("{s:s, s:o, s:s}", "dtype", kex_dtypes[o->dtype].name, "shape", shape,
                                          "data", b64 ? b64 : ""));
      kex_free(b64);
      if (check) {
        json_t *d = NULL;
        kex_cli_case_check(&kc, i, kex_dtypes[o->dtype].name, o->ndim, o->shape, o->data, o->nbytes, true, &d);
        json_array_append_new(checks, d);
      }
    }
    json_t *doc = json_pack("{s:o, s:o}", "kernels", ks, "outputs", os);
    if (check) {
      bool all = kex_cli_case_finish(&kc, res.noutputs, true);
      json_object_set_new(doc, "check", json_pack("{s:b, s:I, s:o}", "passed", all, "expected_outputs",
                                                  (json_int_t)kc.nexpected, "outputs", checks));
      ret = all ? 0 : 1;
    }
    json_dumpf(doc, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(doc);
  } else {
    for (uint32_t i = 0; i < res.nkernels; i++) {
      const kex_run_kernel *k = &res.kernels[i];
      printf("kernel %u: %-28s %-44s %10.2f us\n", i + 1, k->name, k->opts[0] ? k->opts : "(no opts)", k->us);
      if (source && k->source) printf("%s\n", k->source);
    }
    for (uint32_t i = 0; i < res.noutputs; i++) {
      const kex_run_output *o = &res.outputs[i];
      if (check) {
        kex_cli_case_check(&kc, i, kex_dtypes[o->dtype].name, o->ndim, o->shape, o->data, o->nbytes, false, NULL);
        continue;
      }
      printf("output %u: %s (", i, kex_dtypes[o->dtype].name);
      for (int d = 0; d < o->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)o->shape[d]);
      printf(o->ndim == 1 ? ",) " : ") ");
      kex_cli_print_values((int)o->dtype, o->data, o->nbytes);
    }
    if (check) ret = kex_cli_case_finish(&kc, res.noutputs, false) ? 0 : 1;
  }
out:
  kex_cli_case_free(&kc);
  kex_run_result_free(&res);
  kex_device_unref(dev);
  kex_graph_free(g);
  return ret;
}
#endif

#ifdef KEX_HAVE_LIBKEX
int kex_remote_main(int argc, char **argv); /* client/kex_remote.c: -1 = not a server command line */
#endif

int main(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
    printf("kex %s\n", kex_cli_version());
    return 0;
  }
#ifdef KEX_HAVE_LIBKEX
  int remote_rc = kex_remote_main(argc, argv);
  if (remote_rc >= 0) return remote_rc;
#endif
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "auth") == 0) return kex_cmd_auth(argc - 1, argv + 1); /* client/kex_auth.c */
  if (strcmp(cmd, "doctor") == 0) return kex_cmd_doctor(NULL, argc - 1, argv + 1); /* client/kex_doctor.c */
#ifdef KEX_HAVE_RUN
  if (strcmp(cmd, "run") == 0) return cmd_run(argc - 1, argv + 1);
  if (strcmp(cmd, "tune") == 0) return kex_cmd_tune(argc - 1, argv + 1);   /* client/kex_tune.c */
  if (strcmp(cmd, "cache") == 0) return kex_cmd_cache(argc - 1, argv + 1); /* client/kex_cache.c */
#else
  if (strcmp(cmd, "run") == 0) {
    fprintf(stderr, "kex run: this build has no kernel runner (devices/ and search/ lowering are missing)\n");
    return 1;
  }
#endif
  fprintf(stderr, "kex: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}

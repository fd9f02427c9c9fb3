/*
 * kex_remote.c - the kex command line against a running kexd (libkex).
 *
 * `kex --server ADDR CMD ...` (or KEX_SERVER=ADDR kex CMD ...) sends the
 * work to kexd instead of doing it in-process: plan and run print what the
 * in-process commands print (plan: items, AST lines, `kernels: N`; run:
 * kernels with their times, then the outputs; tune and cache: kex_tune.c and
 * kex_cache.c, which print both modes with one printer), and devices,
 * stats, upload, download and job open|close exist only here.  Commands
 * that need a job take --job TOKEN or KEX_JOB; without one they open a
 * temporary job for the call and close it after (kex_cli_remote_open).
 *
 * Progress of a run goes to stderr: a bar when stderr is a terminal, plain
 * lines otherwise, nothing with --json (stdout stays exactly the result).
 * Exit codes: 0 ok, 2 bad input (usage; INVALID_ARGUMENT or NOT_FOUND from
 * the server, printed with its message; an unreadable file), 1 other errors.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/kex_cli.h"
#include "client/libkex.h"
#include "core/alloc.h"
#include "core/dtype.h"

#define REMOTE_GRAPH_MAX (1ll << 30) /* bytes of a graph file */

int kex_remote_main(int argc, char **argv);

typedef kex_cli_remote remote;

static void remote_usage(FILE *f) {
  fputs("usage: kex --server ADDR [--token T] [--tls] [--root-certs PEM] <command> [options]\n"
        "       (KEX_SERVER, KEX_TOKEN and KEX_JOB work as --server, --token and --job)\n"
        "\n"
        "commands against kexd:\n"
        "  plan [--json] [--job T] FILE.json\n"
        "      schedule a graph on the server; print every item, its AST and `kernels: N`\n"
        "  run [--json] [--out DIR] [--beam N] [--timeout S] [--job T] FILE.json\n"
        "      schedule, compile and run a graph on the server; print each kernel and the outputs\n"
        "      --out DIR  write each output as DIR/out<i>.npy\n"
        "  tune [--device D] [--beam N] [--timeout S] [--json] [--job T] FILE.json\n"
        "      BEAM-search every kernel on the server; the results go to the server's cache\n"
        "  cache ls|show|export|import|rm [--json] ...   the server's beam cache (kex cache --help)\n"
        "  devices [--json]                 the devices kexd runs kernels on\n"
        "  stats [--json] [--job T]         server counters (one job with --job)\n"
        "  upload [--device D] [--job T] FILE.npy      upload an array; prints its handle\n"
        "  download [--out FILE.npy] [--job T] HANDLE  download a buffer (print it, or write .npy)\n"
        "  job open [--name N] [--weight W] [--memory-limit BYTES] [--json]   prints the job token\n"
        "  job close [TOKEN]                close a job (TOKEN, --job or KEX_JOB)\n"
        "\n"
        "Without --job (or KEX_JOB) a command opens a temporary job and closes it after;\n"
        "buffers it uploads or computes go away with it.\n"
        "exit codes: 0 success, 2 bad input (usage, INVALID_ARGUMENT/NOT_FOUND from the server), 1 other errors\n",
        f);
}

/* The exit code of a failed call. */
static int exit_for(int code) {
  return code == KEX_EINVAL || code == KEX_ENOTFOUND || code == KEX_EPARSE || code == KEX_EASSIGN ? 2 : 1;
}

int kex_cli_fail(const char *cmd, const kex_status *st) {
  fprintf(stderr, "kex %s: %s%s%s\n", cmd, st->grpc ? kex_grpc_status_name(st->grpc) : "", st->grpc ? ": " : "",
          st->msg[0] ? st->msg : kex_strerror(st->code));
  return exit_for(st->code);
}

#define fail kex_cli_fail

int kex_cli_remote_open(remote *r, const char *cmd, const char *job_opt, bool want_job) {
  kex_status st;
  kex_client_opts o = {.token = r->token, .tls = r->tls, .root_certs = r->root_certs};
  const char *j = job_opt ? job_opt : getenv("KEX_JOB");
  if (!r->client && kex_client_connect(r->server, &o, &r->client, &st)) return fail(cmd, &st);
  if (!want_job) return 0;
  if (j && *j) {
    snprintf(r->job, sizeof r->job, "%s", j);
    return 0;
  }
  if (kex_job_open(r->client, "kex-cli", 0, 0, r->job, NULL, &st)) return fail(cmd, &st);
  r->temp_job = true;
  return 0;
}

void kex_cli_remote_done(remote *r) {
  kex_status st;
  if (r->temp_job) kex_job_close(r->client, r->job, &st);
  r->temp_job = false;
}

char *kex_cli_read_graph(const char *cmd, const char *path) {
  FILE *f = fopen(path, "rb");
  char *s = NULL;
  long n;
  if (!f) {
    fprintf(stderr, "kex %s: %s: cannot open\n", cmd, path);
    return NULL;
  }
  if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || n > REMOTE_GRAPH_MAX || fseek(f, 0, SEEK_SET) ||
      !(s = kex_malloc((size_t)n + 1)) || fread(s, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "kex %s: %s: cannot read\n", cmd, path);
    kex_free(s);
    s = NULL;
  } else {
    s[n] = 0;
  }
  fclose(f);
  return s;
}

/* ---- plan ---- */

static json_t *u32_array(const uint32_t *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static void print_bufs(const uint32_t *v, size_t n) {
  printf("[");
  for (size_t i = 0; i < n; i++) printf("%sbuf%u", i ? ", " : "", v[i]);
  printf("]");
}

static int cmd_plan(remote *r, int argc, char **argv) {
  static const struct option opts[] = {
      {"json", no_argument, NULL, 'j'}, {"job", required_argument, NULL, 'J'}, {"help", no_argument, NULL, 'h'}, {0}};
  const char *job = NULL;
  bool as_json = false;
  int c, ret = 0;
  kex_status st;
  kex_plan *p = NULL;
  char *text = NULL;
  optind = 1;
  while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
    switch (c) {
    case 'j': as_json = true; break;
    case 'J': job = optarg; break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kex plan: expected one graph file\n");
    return 2;
  }
  if (!(text = kex_cli_read_graph("plan", argv[optind]))) return 2;
  if ((ret = kex_cli_remote_open(r, "plan", job, true))) goto out;
  if (kex_plan_graph(r->client, r->job, text, &p, &st)) {
    ret = fail("plan", &st);
    goto out;
  }
  if (as_json) {
    json_t *items = json_array();
    for (size_t i = 0; i < p->nitems; i++) {
      const kex_plan_item *it = &p->items[i];
      json_t *ast = json_array();
      for (size_t j = 0; j < it->nast; j++) json_array_append_new(ast, json_string(it->ast[j]));
      json_array_append_new(items, json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", "kind", it->kind, "label", it->label,
                                             "outputs", u32_array(it->outputs, it->noutputs), "inputs",
                                             u32_array(it->inputs, it->ninputs), "buffers_planned",
                                             u32_array(it->planned, it->nplanned), "ast", ast));
    }
    json_t *o = json_pack("{s:i, s:f, s:o, s:{s:i, s:i, s:I, s:I}}", "kernels", (json_int_t)p->kernels, "schedule_us",
                          p->schedule_us, "items", items, "memory", "intermediate_buffers",
                          (json_int_t)p->intermediate_buffers, "planned_buffers", (json_int_t)p->planned_buffers,
                          "bytes_before", (json_int_t)p->bytes_before, "bytes_after", (json_int_t)p->bytes_after);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
  } else {
    for (size_t i = 0; i < p->nitems; i++) {
      const kex_plan_item *it = &p->items[i];
      printf("item %zu: %s outputs=", i, it->label);
      print_bufs(it->outputs, it->noutputs);
      printf(" inputs=");
      print_bufs(it->inputs, it->ninputs);
      printf("\n");
      for (size_t j = 0; j < it->nast; j++) printf("  %s\n", it->ast[j]);
    }
    printf("kernels: %u\n", p->kernels);
  }
out:
  kex_plan_free(p);
  kex_cli_remote_done(r);
  kex_free(text);
  return ret;
}

/* ---- run ---- */

static char *base64(const unsigned char *p, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = kex_malloc(4 * ((n + 2) / 3) + 1), *o = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    *o++ = tab[v >> 18 & 63];
    *o++ = tab[v >> 12 & 63];
    *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *o = 0;
  return out;
}

/* "dtype (shape) [values]": up to 8 leading elements, as the in-process `kex run` prints them. */
static void print_buffer(const kex_array *b) {
  int dt = kex_dtype_from_name(b->dtype);
  size_t item = dt < 0 ? 0 : (size_t)kex_dtype_size((kex_dtype)dt), n = item ? b->nbytes / item : 0;
  printf("%s (", b->dtype);
  for (int d = 0; d < b->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)b->shape[d]);
  printf(b->ndim == 1 ? ",) [" : ") [");
  for (size_t i = 0; i < n && i < 8; i++) {
    const unsigned char *p = (const unsigned char *)b->data + i * item;
    double v = 0;
    switch ((kex_dtype)dt) {
    case KEX_DT_BOOL: v = *p != 0; break;
    case KEX_DT_INT8: v = *(const int8_t *)p; break;
    case KEX_DT_UINT8: v = *p; break;
    case KEX_DT_INT16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
    case KEX_DT_UINT16: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
    case KEX_DT_INT32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
    case KEX_DT_UINT32: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
    case KEX_DT_INT64: { int64_t x; memcpy(&x, p, 8); v = (double)x; break; }
    case KEX_DT_UINT64: { uint64_t x; memcpy(&x, p, 8); v = (double)x; break; }
    case KEX_DT_FLOAT16: { _Float16 x; memcpy(&x, p, 2); v = x; break; }
    case KEX_DT_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); v = f; break; }
    case KEX_DT_FLOAT32: { float x; memcpy(&x, p, 4); v = x; break; }
    default: memcpy(&v, p, 8); break;
    }
    printf("%s%.6g", i ? ", " : "", v);
  }
  printf("%s]\n", n > 8 ? ", ..." : "");
}

typedef struct progress {
  bool tty, quiet;
  size_t nkernels;
} progress;

static void on_event(const kex_submit_event *ev, void *ud) {
  progress *p = ud;
  if (p->quiet) return;
  switch (ev->kind) {
  case KEX_EVENT_ACCEPTED:
    if (!p->tty) fprintf(stderr, "accepted: submission %llu\n", (unsigned long long)ev->submission);
    break;
  case KEX_EVENT_SCHEDULED:
    p->nkernels = ev->nkernels;
    if (!p->tty) fprintf(stderr, "scheduled: %zu kernels\n", ev->nkernels);
    break;
  case KEX_EVENT_COMPILING:
  case KEX_EVENT_RUNNING: {
    const char *what = ev->kind == KEX_EVENT_COMPILING ? "compiling" : "running";
    if (!p->tty) {
      fprintf(stderr, "%s %u/%u %s\n", what, ev->i + 1, ev->n, ev->kernel ? ev->kernel : "");
      break;
    }
    /* the bar counts compile steps in the first half and run steps in the second */
    unsigned n = ev->n ? ev->n : 1, done = (ev->kind == KEX_EVENT_RUNNING ? n : 0) + ev->i + 1, width = 30;
    unsigned fill = done * width / (2 * n);
    fprintf(stderr, "\r[");
    for (unsigned i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %-9s %u/%u %-32.32s", what, ev->i + 1, ev->n, ev->kernel ? ev->kernel : "");
    fflush(stderr);
    break;
  }
  }
}

static int cmd_run(remote *r, int argc, char **argv) {
  static const struct option opts[] = {{"json", no_argument, NULL, 'j'},          {"job", required_argument, NULL, 'J'},
                                       {"out", required_argument, NULL, 'o'},     {"beam", required_argument, NULL, 'b'},
                                       {"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
                                       {0}};
  const char *job = NULL, *outdir = NULL;
  bool as_json = false;
  int c, ret = 0, beam = 0;
  double timeout = 0;
  kex_status st;
  kex_result *res = NULL;
  kex_array *bufs = NULL;
  char *text = NULL;
  optind = 1;
  while ((c = getopt_long(argc, argv, "jo:b:t:h", opts, NULL)) != -1) {
    switch (c) {
    case 'j': as_json = true; break;
    case 'J': job = optarg; break;
    case 'o': outdir = optarg; break;
    case 'b': beam = atoi(optarg); break;
    case 't': timeout = atof(optarg); break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (beam < 0 || beam > 64 || timeout < 0) {
    fprintf(stderr, "kex run: --beam must be in [0, 64] and --timeout >= 0\n");
    return 2;
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kex run: expected one graph file\n");
    return 2;
  }
  if (!(text = kex_cli_read_graph("run", argv[optind]))) return 2;
  if ((ret = kex_cli_remote_open(r, "run", job, true))) goto out;
  progress pr = {isatty(2), as_json, 0};
  kex_submit_opts so = {.return_bytes = true, .timeout_s = timeout, .beam_width = (uint32_t)beam};
  int rc = kex_submit(r->client, r->job, text, &so, on_event, &pr, &res, &st);
  if (pr.tty && !pr.quiet) fprintf(stderr, "\r%72s\r", "");
  if (rc) {
    ret = fail("run", &st);
    goto out;
  }
  /* every output's bytes: inline, or downloaded */
  if (!(bufs = kex_calloc(res->noutputs ? res->noutputs : 1, sizeof *bufs))) {
    fprintf(stderr, "kex run: out of memory\n");
    ret = 1;
    goto out;
  }
  for (size_t i = 0; i < res->noutputs; i++) {
    const kex_output *o = &res->outputs[i];
    if (o->has_data) {
      bufs[i] = o->buf;
      bufs[i].data = NULL; /* borrowed below, not owned */
    } else if (kex_download(r->client, r->job, o->handle, &bufs[i], &st)) {
      ret = fail("run", &st);
      goto out;
    }
  }
#define OUT_DATA(i) (res->outputs[i].has_data ? res->outputs[i].buf.data : bufs[i].data)
  if (outdir) {
    mkdir(outdir, 0777);
    for (size_t i = 0; i < res->noutputs; i++) {
      char p[4096];
      kex_array b = bufs[i];
      b.data = OUT_DATA(i);
      snprintf(p, sizeof p, "%s/out%zu.npy", outdir, i);
      if (kex_array_write_npy(&b, p, &st)) {
        ret = fail("run", &st);
        goto out;
      }
    }
  }
  if (as_json) {
    json_t *ks = json_array(), *os = json_array();
    for (size_t i = 0; i < res->nkernels; i++)
      json_array_append_new(ks, json_pack("{s:s, s:s, s:f, s:f}", "name", res->kernels[i].kernel, "opts", "", "us",
                                          res->kernels[i].run_us, "compile_us", res->kernels[i].compile_us));
    for (size_t i = 0; i < res->noutputs; i++) {
      const kex_array *b = &bufs[i];
      json_t *shape = json_array();
      for (int d = 0; d < b->ndim; d++) json_array_append_new(shape, json_integer(b->shape[d]));
      char *b64 = base64(OUT_DATA(i), b->nbytes);
      json_array_append_new(os, json_pack("{s:s, s:o, s:s, s:s}", "dtype", b->dtype, "shape", shape, "data",
                                          b64 ? b64 : "", "handle", res->outputs[i].handle));
      kex_free(b64);
    }
    json_t *doc = json_pack("{s:o, s:o, s:f}", "kernels", ks, "outputs", os, "total_us", res->total_us);
    json_dumpf(doc, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(doc);
  } else {
    for (size_t i = 0; i < res->nkernels; i++)
      printf("kernel %zu: %-28s %-44s %10.2f us\n", i, res->kernels[i].kernel, "(opts not reported)",
             res->kernels[i].run_us);
    for (size_t i = 0; i < res->noutputs; i++) {
      kex_array b = bufs[i];
      b.data = OUT_DATA(i);
      printf("output %zu: ", i);
      print_buffer(&b);
    }
  }
#undef OUT_DATA
out:
  if (bufs && res)
    for (size_t i = 0; i < res->noutputs; i++)
      if (!res->outputs[i].has_data) kex_array_free(&bufs[i]);
  kex_free(bufs);
  kex_result_free(res);
  kex_cli_remote_done(r);
  kex_free(text);
  return ret;
}

/* ---- devices, stats ---- */

static int cmd_devices(remote *r, int argc, char **argv) {
  bool as_json = argc == 2 && strcmp(argv[1], "--json") == 0;
  kex_remote_device *d = NULL;
  size_t n = 0;
  kex_status st;
  int ret;
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    remote_usage(stdout);
    return 0;
  }
  if (argc > 2 || (argc == 2 && !as_json)) {
    fprintf(stderr, "kex devices: takes only --json\n");
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "devices", NULL, false))) return ret;
  if (kex_list_devices(r->client, &d, &n, &st)) return fail("devices", &st);
  if (as_json) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:s, s:b, s:b}", "name", d[i].name, "kind", d[i].kind,
                                         "vendor", d[i].vendor, "device_name", d[i].device_name, "driver_version",
                                         d[i].driver_version, "is_default", d[i].is_default, "available",
                                         d[i].available));
    json_dumpf(a, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(a);
  } else {
    for (size_t i = 0; i < n; i++)
      printf("%-24s %-8s %-12s %s%s%s\n", d[i].name, d[i].kind, d[i].available ? "available" : "unavailable",
             d[i].device_name, d[i].driver_version[0] ? " " : "", d[i].driver_version);
    for (size_t i = 0; i < n; i++)
      if (d[i].is_default) printf("default: %s\n", d[i].name);
  }
  kex_remote_devices_free(d, n);
  return 0;
}

static int cmd_stats(remote *r, int argc, char **argv) {
  static const struct option opts[] = {
      {"json", no_argument, NULL, 'j'}, {"job", required_argument, NULL, 'J'}, {"help", no_argument, NULL, 'h'}, {0}};
  const char *job = getenv("KEX_JOB");
  bool as_json = false;
  kex_stats *s = NULL;
  kex_status st;
  int c, ret;
  optind = 1;
  while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
    switch (c) {
    case 'j': as_json = true; break;
    case 'J': job = optarg; break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "kex stats: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "stats", NULL, false))) return ret;
  if (kex_get_stats(r->client, job, &s, &st)) return fail("stats", &st);
  if (as_json) {
    json_t *jobs = json_array();
    for (size_t i = 0; i < s->njobs; i++) {
      const kex_job_stats *j = &s->jobs[i];
      json_array_append_new(jobs, json_pack("{s:s, s:i, s:I, s:I, s:i, s:i, s:i, s:I, s:f}", "name", j->name, "weight",
                                            (json_int_t)j->weight, "memory_limit", (json_int_t)j->memory_limit,
                                            "bytes_held", (json_int_t)j->bytes_held, "buffers", (json_int_t)j->buffers,
                                            "queued", (json_int_t)j->queued, "running", (json_int_t)j->running,
                                            "items_done", (json_int_t)j->items_done, "device_time_s", j->device_time_s));
    }
    json_t *o = json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o}", "jobs_open",
                          (json_int_t)s->jobs_open, "jobs_opened", (json_int_t)s->jobs_opened, "jobs_closed",
                          (json_int_t)s->jobs_closed, "jobs_expired", (json_int_t)s->jobs_expired, "submissions",
                          (json_int_t)s->submissions, "plans", (json_int_t)s->plans, "plan_errors",
                          (json_int_t)s->plan_errors, "kernels_planned", (json_int_t)s->kernels_planned, "calls",
                          (json_int_t)s->calls, "calls_failed", (json_int_t)s->calls_failed, "bytes_held",
                          (json_int_t)s->bytes_held, "uptime_s", s->uptime_s, "jobs", jobs);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
  } else {
    printf("uptime: %.1f s\njobs: %u open, %llu opened, %llu closed, %llu expired\n", s->uptime_s, s->jobs_open,
           (unsigned long long)s->jobs_opened, (unsigned long long)s->jobs_closed, (unsigned long long)s->jobs_expired);
    printf("calls: %llu (%llu failed)\nplans: %llu (%llu failed, %llu kernels)\nsubmissions: %llu\nbytes held: %llu\n",
           (unsigned long long)s->calls, (unsigned long long)s->calls_failed, (unsigned long long)s->plans,
           (unsigned long long)s->plan_errors, (unsigned long long)s->kernels_planned,
           (unsigned long long)s->submissions, (unsigned long long)s->bytes_held);
    for (size_t i = 0; i < s->njobs; i++) {
      const kex_job_stats *j = &s->jobs[i];
      printf("job %s: weight %u, %u buffers, %llu bytes, %u queued, %u running, %llu done, %.3f s device\n", j->name,
             j->weight, j->buffers, (unsigned long long)j->bytes_held, j->queued, j->running,
             (unsigned long long)j->items_done, j->device_time_s);
    }
  }
  kex_stats_free(s);
  return 0;
}

/* ---- upload, download ---- */

static int cmd_upload(remote *r, int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, NULL, 'J'},
                                       {"device", required_argument, NULL, 'd'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0}};
  const char *job = NULL, *device = NULL;
  char handle[KEX_TOKEN_MAX];
  kex_status st;
  int c, ret;
  optind = 1;
  while ((c = getopt_long(argc, argv, "d:h", opts, NULL)) != -1) {
    switch (c) {
    case 'J': job = optarg; break;
    case 'd': device = optarg; break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kex upload: expected one .npy file\n");
    return 2;
  }
  if (access(argv[optind], R_OK) != 0) {
    fprintf(stderr, "kex upload: %s: cannot read\n", argv[optind]);
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "upload", job, true))) goto out;
  if (r->temp_job)
    fprintf(stderr, "kex upload: no --job or KEX_JOB: the buffer lives in a temporary job that closes now "
                    "(kex job open makes one that stays)\n");
  if (kex_upload_npy(r->client, r->job, argv[optind], device, handle, &st)) {
    ret = fail("upload", &st);
    goto out;
  }
  printf("%s\n", handle);
out:
  kex_cli_remote_done(r);
  return ret;
}

static int cmd_download(remote *r, int argc, char **argv) {
  static const struct option opts[] = {{"job", required_argument, NULL, 'J'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0}};
  const char *job = NULL, *out = NULL;
  kex_array b = {0};
  kex_status st;
  int c, ret;
  optind = 1;
  while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (c) {
    case 'J': job = optarg; break;
    case 'o': out = optarg; break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kex download: expected one buffer handle\n");
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "download", job, true))) goto done;
  if (kex_download(r->client, r->job, argv[optind], &b, &st)) {
    ret = fail("download", &st);
    goto done;
  }
  if (out) {
    if (kex_array_write_npy(&b, out, &st)) ret = fail("download", &st);
  } else {
    print_buffer(&b);
  }
done:
  kex_array_free(&b);
  kex_cli_remote_done(r);
  return ret;
}

/* ---- job ---- */

static int cmd_job(remote *r, int argc, char **argv) {
  static const struct option opts[] = {{"name", required_argument, NULL, 'n'},
                                       {"weight", required_argument, NULL, 'w'},
                                       {"memory-limit", required_argument, NULL, 'm'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"job", required_argument, NULL, 'J'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0}};
  const char *name = "kex-cli", *job = getenv("KEX_JOB");
  long long weight = 0, mem = 0;
  bool as_json = false;
  kex_status st;
  int c, ret;
  if (argc < 2 || (strcmp(argv[1], "open") != 0 && strcmp(argv[1], "close") != 0)) {
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
      remote_usage(stdout);
      return 0;
    }
    fprintf(stderr, "kex job: expected `open` or `close`\n");
    return 2;
  }
  bool open = strcmp(argv[1], "open") == 0;
  optind = 1;
  while ((c = getopt_long(argc - 1, argv + 1, "n:w:m:jh", opts, NULL)) != -1) {
    switch (c) {
    case 'n': name = optarg; break;
    case 'w': weight = atoll(optarg); break;
    case 'm': mem = atoll(optarg); break;
    case 'j': as_json = true; break;
    case 'J': job = optarg; break;
    case 'h': remote_usage(stdout); return 0;
    default: remote_usage(stderr); return 2;
    }
  }
  if (weight < 0 || weight > UINT32_MAX || mem < 0) {
    fprintf(stderr, "kex job open: --weight and --memory-limit must be non-negative\n");
    return 2;
  }
  if (!open && optind < argc - 1) job = argv[1 + optind];
  if (!open && (!job || !*job)) {
    fprintf(stderr, "kex job close: which job? (TOKEN, --job or KEX_JOB)\n");
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "job", NULL, false))) return ret;
  if (open) {
    uint32_t lease = 0;
    if (kex_job_open(r->client, name, (uint32_t)weight, (uint64_t)mem, r->job, &lease, &st)) return fail("job open", &st);
    if (as_json) printf("{\"job\":\"%s\",\"lease_seconds\":%u}\n", r->job, lease);
    else printf("%s\n", r->job);
    return 0;
  }
  if (kex_job_close(r->client, job, &st)) return fail("job close", &st);
  return 0;
}

/* ---- entry ---- */

static bool is_remote_only(const char *cmd) {
  return strcmp(cmd, "devices") == 0 || strcmp(cmd, "stats") == 0 || strcmp(cmd, "upload") == 0 ||
         strcmp(cmd, "download") == 0 || strcmp(cmd, "job") == 0;
}

/*
 * The server-mode entry point, called first by kex.c's main: -1 when the
 * command line is not for a server (no --server, no KEX_SERVER, an
 * in-process command), else the exit code.
 */
int kex_remote_main(int argc, char **argv) {
  remote r = {0};
  int i = 1, ret;
  r.server = getenv("KEX_SERVER");
  r.token = getenv("KEX_TOKEN");
  bool flag = false;
  while (i < argc && strncmp(argv[i], "--", 2) == 0) {
    const char *a = argv[i];
    if (strcmp(a, "--tls") == 0) {
      r.tls = true;
      i++;
      continue;
    }
    if (strcmp(a, "--server") != 0 && strcmp(a, "--token") != 0 && strcmp(a, "--root-certs") != 0) break;
    if (i + 1 >= argc) {
      fprintf(stderr, "kex: %s needs a value\n", a);
      return 2;
    }
    if (strcmp(a, "--server") == 0) r.server = argv[i + 1], flag = true;
    else if (strcmp(a, "--token") == 0) r.token = argv[i + 1];
    else r.root_certs = argv[i + 1];
    i += 2;
  }
  if (i > 1 && !flag && !r.server) {
    fprintf(stderr, "kex: %s needs --server ADDR (or KEX_SERVER)\n", argv[1]);
    return 2;
  }
  if (i >= argc) {
    if (!flag) return -1;
    remote_usage(stderr);
    return 2;
  }
  const char *cmd = argv[i];
  if (!r.server || !*r.server) {
    if (!is_remote_only(cmd)) return -1;
    fprintf(stderr, "kex %s: needs a server: kex --server ADDR %s ... (or KEX_SERVER=ADDR)\n", cmd, cmd);
    return 2;
  }
  argc -= i;
  argv += i;
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    remote_usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "plan") == 0) ret = cmd_plan(&r, argc, argv);
  else if (strcmp(cmd, "run") == 0) ret = cmd_run(&r, argc, argv);
  else if (strcmp(cmd, "devices") == 0) ret = cmd_devices(&r, argc, argv);
  else if (strcmp(cmd, "stats") == 0) ret = cmd_stats(&r, argc, argv);
  else if (strcmp(cmd, "upload") == 0) ret = cmd_upload(&r, argc, argv);
  else if (strcmp(cmd, "download") == 0) ret = cmd_download(&r, argc, argv);
  else if (strcmp(cmd, "job") == 0) ret = cmd_job(&r, argc, argv);
  else if (strcmp(cmd, "tune") == 0) ret = kex_remote_cmd_tune(&r, argc, argv);   /* kex_tune.c */
  else if (strcmp(cmd, "cache") == 0) ret = kex_remote_cmd_cache(&r, argc, argv); /* kex_cache.c */
  else {
    fprintf(stderr, "kex: '%s' does not run against a server (plan, run, tune, cache, devices, stats, upload, download, "
                    "job)\n", cmd);
    remote_usage(stderr);
    ret = 2;
  }
  kex_client_close(r.client);
  return ret;
}

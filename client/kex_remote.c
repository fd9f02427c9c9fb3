/*
 * kex_remote.c - the kex command line against a running kexd (libkex).
 *
 * `kex --server ADDR CMD ...` (or KEX_SERVER=ADDR kex CMD ...) sends the
 * work to kexd instead of doing it in-process, with the same flags: plan
 * and run print what the in-process commands print (plan: items, AST lines,
 * `kernels: N`; run: kernels numbered from 1 with their times, then the
 * outputs, or PASS/FAIL per output with --check; --device names one of the
 * server's devices and becomes the graph's device; --repeat N > 1 submits
 * the graph N + 1 times and reports each kernel's median; tune and cache:
 * kex_tune.c and kex_cache.c, which print both modes with one printer;
 * doctor: kex_doctor.c), and devices, stats, top (kex_top.c), upload,
 * download and job open|close exist only here.  ADDR without a port means
 * port 50051; a list "a,b:2" or dns:///NAME:PORT is a fleet (libkex sends a
 * job's calls to the node its token names).  Commands that need a job take --job TOKEN or KEX_JOB; without
 * one they open a temporary job for the call and close it after
 * (kex_cli_remote_open).  A server that does not answer (UNAVAILABLE) gets
 * a second line saying how to start kexd.
 *
 * Progress of a run goes to stderr: a bar when stderr is a terminal, plain
 * lines otherwise, nothing with --json (stdout stays exactly the result).
 * Exit codes: 0 ok, 2 bad input (usage; INVALID_ARGUMENT or NOT_FOUND from
 * the server, printed with its message; an unreadable file), 1 other errors.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/kex_cli.h"
#include "client/libkex.h"
#include "core/alloc.h"
#include "core/strbuf.h"
#include "core/codec.h"
#include "core/dtype.h"

#define REMOTE_GRAPH_MAX (1ll << 30) /* bytes of a graph file */
#define REMOTE_REPEAT_MAX 100000     /* --repeat, as in-process */

/* The address this command line dials (kex_remote_main sets it): the start hint names it. */
static const char *cli_server = KEX_CLI_DEFAULT_SERVER;

int kex_remote_main(int argc, char **argv);

typedef kex_cli_remote remote;

static void remote_usage(FILE *f) {
  fputs("usage: kex --server ADDR [--token-file PATH] [--tls] [--root-certs PEM]\n"
        "           [--client-cert PEM --client-key PEM] <command> [options]\n"
        "       (--client-cert/--client-key: mutual TLS, for a kexd started with --tls-client-ca)\n"
        "       (the token: KEX_TOKEN, or --token-file PATH (its first line); --token T works too\n"
        "        but every user of the machine can read it in ps, so kex warns)\n"
        "       (KEX_SERVER and KEX_JOB work as --server and --job;\n"
        "        ADDR without a port means port " KEX_CLI_DEFAULT_PORT ";\n"
        "        a fleet: ADDR,ADDR,... (IP addresses) or dns:///NAME:PORT -- new jobs go to the\n"
        "        live nodes, a job's calls to the node its token names)\n"
        "\n"
        "commands against kexd (the flags of the in-process commands work here too):\n"
        "  plan [--device D] [--json] [--job T] FILE.json\n"
        "      schedule a graph on the server; print every item, its AST and `kernels: N`\n"
        "  run [--device D] [--json] [--repeat N] [--beam N] [--out DIR] [--trace F] [--timeout S] [--job T] FILE.json\n"
        "  run --check CASE.json [--device D] [--json] [--beam N] [--timeout S] [--job T]\n"
        "      schedule, compile and run a graph on the server; print each kernel and the outputs\n"
        "      --device D  one of the server's devices (kex devices); default: the graph's\n"
        "      --repeat N  N > 1: submit N + 1 times (a warm-up, then N timed) and report\n"
        "                  each kernel's median time\n"
        "      --check     run a case file's numeric graph; PASS or FAIL per output (exit 0 only\n"
        "                  when all pass)\n"
        "      --out DIR   write each output as DIR/out<i>.npy\n"
        "      --trace F   write the submission's trace (Chrome trace-event JSON; Perfetto opens it)\n"
        "  tune [--device D] [--beam N] [--timeout S] [--json] [--job T] FILE.json\n"
        "      BEAM-search every kernel on the server; the results go to the server's cache\n"
        "  cache ls|show|export|import|rm [--json] ...   the server's beam cache (kex cache --help)\n"
        "  devices [--json]                 the devices kexd runs kernels on\n"
        "  stats [--json] [--job T]         every server counter (one job with --job)\n"
        "  health [--service NAME]          the grpc.health.v1 check: prints SERVING (exit 0) or NOT_SERVING\n"
        "  top [--once] [--json] [--interval S]\n"
        "      a live view of the server (jobs, queued and running items, device busy share,\n"
        "      bytes held, cache hit rates), refreshed every second until q or Ctrl-C;\n"
        "      --once prints one view (two samples S apart, default 1) and exits\n"
        "  doctor [--json]                  this machine's devices and cache, and the server\n"
        "  upload [--device D] [--job T] FILE.npy      upload an array; prints its handle\n"
        "  download [--out FILE.npy] [--job T] HANDLE  download a buffer (print it, or write .npy)\n"
        "  job open [--name N] [--weight W] [--memory-limit BYTES] [--json]   prints the job token\n"
        "  job close [TOKEN]                close a job (TOKEN, --job or KEX_JOB)\n"
        "\n"
        "Without --job (or KEX_JOB) a command opens a temporary job and closes it after;\n"
        "buffers it uploads or computes go away with it.\n"
        "No kexd yet? scripts/run.sh starts one on " KEX_CLI_DEFAULT_SERVER ".\n"
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
  if (st->code == KEX_EUNAVAILABLE) kex_cli_start_hint(stderr, cli_server);
  return exit_for(st->code);
}

#define fail kex_cli_fail

int kex_cli_remote_open(remote *r, const char *cmd, const char *job_opt, bool want_job) {
  kex_status st;
  kex_client_opts o = {.token = r->token, .tls = r->tls, .root_certs = r->root_certs,
                       .client_cert = r->client_cert, .client_key = r->client_key};
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
  kex_strbuf b = {0};
  if (!f) {
    fprintf(stderr, "kex %s: %s: cannot open: %s\n", cmd, path, strerror(errno));
    return NULL;
  }
  if (kex_strbuf_read(&b, f, REMOTE_GRAPH_MAX)) {
    fprintf(stderr, "kex %s: %s: cannot read\n", cmd, path);
    kex_free(b.p);
    b.p = NULL;
  }
  fclose(f);
  return b.p;
}

/* ---- the graph of a command line ---- */

/*
 * Adjust the graph JSON text *text (kex_malloc'd: the graph, or an object
 * with the graph under "graph") for the command line: with device, the graph
 * names that device (the server runs it there, as Tune's device does); with
 * repeat > 1, a graph that ASSIGNs while using a buffer the job holds is
 * refused, since each of the N + 1 submissions would change that buffer.  On
 * success *text may have been replaced (the old text freed).  0, or the
 * exit code after printing why (2).
 */
static int prepare_graph(const char *cmd, const char *path, char **text, const char *device, int repeat) {
  json_error_t jerr;
  json_t *root, *g;
  int ret = 0;
  if ((!device || !*device) && repeat <= 1) return 0;
  if (!(root = json_loads(*text, 0, &jerr))) {
    fprintf(stderr, "kex %s: %s: line %d: %s\n", cmd, path, jerr.line, jerr.text);
    return 2;
  }
  g = json_is_object(json_object_get(root, "graph")) ? json_object_get(root, "graph") : root;
  if (!json_is_object(g)) {
    fprintf(stderr, "kex %s: %s: not a kex.graph.v1 graph (a JSON object)\n", cmd, path);
    ret = 2;
    goto out;
  }
  if (repeat > 1) {
    json_t *nodes = json_object_get(g, "nodes"), *n;
    size_t i, held = SIZE_MAX, assign = SIZE_MAX;
    json_array_foreach(nodes, i, n) {
      if (json_object_get(n, "buffer") && held == SIZE_MAX) held = i;
      const char *op = json_string_value(json_object_get(n, "op"));
      if (op && !strcmp(op, "ASSIGN") && assign == SIZE_MAX) assign = i;
    }
    if (held != SIZE_MAX && assign != SIZE_MAX) {
      fprintf(stderr, "kex %s: --repeat submits the graph %d times, and node %zu ASSIGNs while node %zu is a buffer the "
                      "job holds: it would change each time (run it once)\n", cmd, repeat + 1, assign, held);
      ret = 2;
      goto out;
    }
  }
  if (device && *device) {
    char *t;
    if (json_object_set_new(g, "device", json_string(device)) || !(t = json_dumps(root, JSON_COMPACT))) {
      fprintf(stderr, "kex %s: out of memory\n", cmd);
      ret = 1;
      goto out;
    }
    char *k = kex_strdup(t);
    free(t); /* jansson's allocator */
    if (!k) {
      fprintf(stderr, "kex %s: out of memory\n", cmd);
      ret = 1;
      goto out;
    }
    kex_free(*text);
    *text = k;
  }
out:
  json_decref(root);
  return ret;
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
  const char *job = NULL, *device = NULL;
  bool as_json = false;
  int c, ret = 0;
  kex_status st;
  kex_plan *p = NULL;
  char *text = NULL;
  const kex_cli_opt opts[] = {{"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"job", 0, KEX_CLI_STR, &job},
                              {"device", 'd', KEX_CLI_STR, &device},
                              {"source", 's', KEX_CLI_LOCAL, NULL, 0, 0, "the Plan reply carries no source"},
                              {0}};
  const char *path = NULL;
  if ((c = kex_cli_args("plan", opts, "graph file", &path, argc, argv, remote_usage)) >= 0) return c;
  if (!(text = kex_cli_read_graph("plan", path))) return 2;
  if ((ret = prepare_graph("plan", path, &text, device, 1))) goto out;
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

/* "dtype (shape) [values]": up to 8 leading elements, as the in-process `kex run` prints them. */
static void print_buffer(const kex_array *b) {
  int dt = kex_dtype_from_name(b->dtype);
  printf("%s (", b->dtype);
  for (int d = 0; d < b->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)b->shape[d]);
  printf(b->ndim == 1 ? ",) " : ") ");
  kex_cli_print_values(dt, b->data, b->nbytes);
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
    fprintf(stderr, "] %3u%% %-9s %u/%u %-32.32s", done * 100 / (2 * n), what, ev->i + 1, ev->n,
            ev->kernel ? ev->kernel : "");
    fflush(stderr);
    break;
  }
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/*
 * The timed submissions of --repeat N after the first (the warm-up, whose
 * result *first is what the command reports): each kernel's run_us becomes
 * the median of N more submissions.  Outputs of those submissions that are
 * new buffers are freed at once (a held buffer keeps its handle and stays).
 * 0 or the exit code.
 */
static int repeat_runs(remote *r, const char *text, const kex_submit_opts *so, int repeat, bool tty, bool quiet,
                       kex_result *first) {
  size_t nk = first->nkernels;
  double *times = kex_calloc(nk * (size_t)repeat + 1, sizeof *times);
  kex_status st;
  int ret = 0;
  if (!times) {
    fprintf(stderr, "kex run: out of memory\n");
    return 1;
  }
  for (int k = 0; k < repeat && !ret; k++) {
    kex_result *res = NULL;
    if (!quiet) {
      if (tty) fprintf(stderr, "\r\033[Ktimed run %d/%d", k + 1, repeat);
      else fprintf(stderr, "timed run %d/%d\n", k + 1, repeat);
      fflush(stderr);
    }
    if (kex_submit(r->client, r->job, text, so, NULL, NULL, &res, &st)) {
      if (tty && !quiet) fputc('\n', stderr);
      ret = fail("run", &st);
      break;
    }
    if (res->nkernels != nk) {
      fprintf(stderr, "kex run: timed run %d ran %zu kernels, the first %zu\n", k + 1, res->nkernels, nk);
      ret = 1;
    }
    for (size_t i = 0; i < nk && !ret; i++) times[i * (size_t)repeat + (size_t)k] = res->kernels[i].run_us;
    const char *fresh[64];
    size_t nfresh = 0;
    for (size_t o = 0; o < res->noutputs; o++) {
      bool held = !res->outputs[o].handle[0];
      for (size_t j = 0; j < first->noutputs && !held; j++) held = !strcmp(res->outputs[o].handle, first->outputs[j].handle);
      if (!held) fresh[nfresh++] = res->outputs[o].handle;
      if (nfresh == sizeof fresh / sizeof *fresh || (o + 1 == res->noutputs && nfresh)) {
        if (kex_free_buffers(r->client, r->job, fresh, nfresh, NULL, &st)) ret = fail("run", &st);
        nfresh = 0;
      }
    }
    kex_result_free(res);
  }
  if (tty && !quiet) fprintf(stderr, "\r\033[K");
  for (size_t i = 0; i < nk && !ret; i++) {
    double *t = &times[i * (size_t)repeat];
    qsort(t, (size_t)repeat, sizeof *t, cmp_double);
    first->kernels[i].run_us = repeat % 2 ? t[repeat / 2] : (t[repeat / 2 - 1] + t[repeat / 2]) / 2;
  }
  kex_free(times);
  return ret;
}

/* --trace FILE: write the submission's Chrome trace-event JSON; 0, or 1 with a message. */
static int write_trace(const char *path, const char *json) {
  if (!json) {
    fprintf(stderr, "kex run: the server sent no trace (a kexd older than SubmitRequest.trace?)\n");
    return 1;
  }
  FILE *f = fopen(path, "w");
  int bad = !f || fputs(json, f) < 0;
  if (f && fclose(f)) bad = 1;
  if (bad) fprintf(stderr, "kex run: %s: %s\n", path, strerror(errno));
  return bad;
}

/* Output i of a run with its bytes: inline in the reply, or downloaded into bufs[i]. */
static kex_array output_array(const kex_result *res, const kex_array *bufs, size_t i) {
  kex_array b = bufs[i];
  b.data = res->outputs[i].has_data ? res->outputs[i].buf.data : bufs[i].data;
  return b;
}

/* `run --json`: kernels, outputs (base64) and, with check, the comparison with the case.  The exit code. */
static int report_json(const kex_result *res, const kex_array *bufs, bool check, kex_cli_case *kc) {
  int ret = 0;
  json_t *ks = json_array(), *os = json_array(), *checks = check ? json_array() : NULL;
  for (size_t i = 0; i < res->nkernels; i++)
    json_array_append_new(ks, json_pack("{s:s, s:s, s:f, s:f}", "name", res->kernels[i].kernel, "opts",
                                        res->kernel_opts[i], "us", res->kernels[i].run_us, "compile_us",
                                        res->kernels[i].compile_us));
  for (size_t i = 0; i < res->noutputs; i++) {
    kex_array out = output_array(res, bufs, i);
    const kex_array *b = &out;
    json_t *shape = json_array();
    for (int d = 0; d < b->ndim; d++) json_array_append_new(shape, json_integer(b->shape[d]));
    char *b64 = kex_base64_encode(b->data, b->nbytes);
    json_array_append_new(os, json_pack("{s:s, s:o, s:s, s:s}", "dtype", b->dtype, "shape", shape, "data",
                                        b64 ? b64 : "", "handle", res->outputs[i].handle));
    kex_free(b64);
    if (check) {
      json_t *d = NULL;
      kex_cli_case_check(kc, i, b->dtype, b->ndim, b->shape, b->data, b->nbytes, true, &d);
      json_array_append_new(checks, d);
    }
  }
  json_t *doc = json_pack("{s:o, s:o, s:f}", "kernels", ks, "outputs", os, "total_us", res->total_us);
  if (check) {
    bool all = kex_cli_case_finish(kc, res->noutputs, true);
    json_object_set_new(doc, "check", json_pack("{s:b, s:I, s:o}", "passed", all, "expected_outputs",
                                                (json_int_t)kc->nexpected, "outputs", checks));
    ret = all ? 0 : 1;
  }
  json_dumpf(doc, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(doc);
  return ret;
}

/* `run`'s text: one line per kernel, then each output (or, with check, its comparison).  The exit code. */
static int report_text(const kex_result *res, const kex_array *bufs, bool check, kex_cli_case *kc) {
  int ret = 0;
  for (size_t i = 0; i < res->nkernels; i++)
    printf("kernel %zu: %-28s %-44s %10.2f us\n", i + 1, res->kernels[i].kernel,
           res->kernel_opts[i][0] ? res->kernel_opts[i] : "(no opts)", res->kernels[i].run_us);
  for (size_t i = 0; i < res->noutputs; i++) {
    kex_array b = output_array(res, bufs, i);
    if (check) {
      kex_cli_case_check(kc, i, b.dtype, b.ndim, b.shape, b.data, b.nbytes, false, NULL);
      continue;
    }
    printf("output %zu: ", i);
    print_buffer(&b);
  }
  if (check) ret = kex_cli_case_finish(kc, res->noutputs, false) ? 0 : 1;
  return ret;
}

static int cmd_run(remote *r, int argc, char **argv) {
  const char *job = NULL, *outdir = NULL, *device = NULL, *trace_path = NULL;
  bool as_json = false, check = false;
  int c, ret = 0;
  long long beam = 0, repeat = 1;
  double timeout = 0;
  kex_status st;
  kex_result *res = NULL;
  kex_array *bufs = NULL;
  kex_cli_case kc = {0};
  char *text = NULL;
  const kex_cli_opt opts[] = {{"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"job", 0, KEX_CLI_STR, &job},
                              {"out", 'o', KEX_CLI_STR, &outdir},
                              {"beam", 'b', KEX_CLI_INT, &beam, 0, 64},
                              {"timeout", 't', KEX_CLI_NUM, &timeout, 0, 1e9},
                              {"device", 'd', KEX_CLI_STR, &device},
                              {"repeat", 'r', KEX_CLI_INT, &repeat, 1, REMOTE_REPEAT_MAX},
                              {"check", 0, KEX_CLI_FLAG, &check},
                              {"trace", 0, KEX_CLI_STR, &trace_path},
                              {"source", 's', KEX_CLI_LOCAL, NULL, 0, 0, "the Submit reply carries no source; kex cache show has a tuned kernel's"},
                              {"cache", 'c', KEX_CLI_LOCAL_ARG, NULL, 0, 0, "the server uses its own cache"},
                              {"no-cache", 'n', KEX_CLI_LOCAL, NULL, 0, 0, "the server uses its own cache"},
                              {0}};
  if ((c = kex_cli_options("run", opts, argc, argv, remote_usage)) >= 0) return c;
  const char *path = kex_cli_one_operand("run", check ? "case file" : "graph file", argc, argv, NULL);
  if (!path) return 2;
  if (check) {
    if ((ret = kex_cli_case_load("run", path, &kc))) goto out;
    if (!(text = kex_strdup(kc.graph_text))) {
      fprintf(stderr, "kex run: out of memory\n");
      ret = 1;
      goto out;
    }
  } else if (!(text = kex_cli_read_graph("run", path))) {
    return 2;
  }
  if ((ret = prepare_graph("run", path, &text, device, repeat))) goto out;
  if ((ret = kex_cli_remote_open(r, "run", job, true))) goto out;
  progress pr = {isatty(2), as_json, 0};
  kex_submit_opts so = {.return_bytes = true, .timeout_s = timeout, .beam_width = (uint32_t)beam, .trace = !!trace_path};
  int rc = kex_submit(r->client, r->job, text, &so, on_event, &pr, &res, &st);
  if (pr.tty && !pr.quiet) fprintf(stderr, "\r%80s\r", "");
  if (rc) {
    ret = fail("run", &st);
    goto out;
  }
  if (trace_path && (ret = write_trace(trace_path, res->trace_json))) goto out;
  so.trace = false; /* --repeat's timed runs are not traced */
  if (repeat > 1) {
    kex_submit_opts rso = so;
    rso.return_bytes = false;
    if ((ret = repeat_runs(r, text, &rso, repeat, pr.tty, pr.quiet, res))) goto out;
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
  if (outdir) {
    mkdir(outdir, 0777);
    for (size_t i = 0; i < res->noutputs; i++) {
      char p[4096];
      kex_array b = output_array(res, bufs, i);
      snprintf(p, sizeof p, "%s/out%zu.npy", outdir, i);
      if (kex_array_write_npy(&b, p, &st)) {
        ret = fail("run", &st);
        goto out;
      }
    }
  }
  ret = as_json ? report_json(res, bufs, check, &kc) : report_text(res, bufs, check, &kc);
out:
  if (bufs && res)
    for (size_t i = 0; i < res->noutputs; i++)
      if (!res->outputs[i].has_data) kex_array_free(&bufs[i]);
  kex_free(bufs);
  kex_result_free(res);
  kex_cli_remote_done(r);
  kex_free(text);
  kex_cli_case_free(&kc);
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
  const char *job = getenv("KEX_JOB");
  bool as_json = false;
  kex_stats *s = NULL;
  kex_status st;
  int c, ret;
  const kex_cli_opt opts[] = {{"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"job", 0, KEX_CLI_STR, &job},
                              {0}};
  if ((c = kex_cli_args("stats", opts, NULL, NULL, argc, argv, remote_usage)) >= 0) return c;
  if ((ret = kex_cli_remote_open(r, "stats", NULL, false))) return ret;
  if (kex_get_stats(r->client, job, &s, &st)) return fail("stats", &st);
  char started[KEX_CLI_ISO8601_MAX];
  kex_cli_iso8601((int64_t)(time(NULL) - s->uptime_s + 0.5), started);
  if (as_json) {
    json_t *jobs = json_array();
    for (size_t i = 0; i < s->njobs; i++) {
      const kex_job_stats *j = &s->jobs[i];
      json_array_append_new(jobs, json_pack("{s:s, s:i, s:I, s:I, s:i, s:i, s:i, s:I, s:f, s:I}", "name", j->name,
                                            "weight", (json_int_t)j->weight, "memory_limit", (json_int_t)j->memory_limit,
                                            "bytes_held", (json_int_t)j->bytes_held, "buffers", (json_int_t)j->buffers,
                                            "queued", (json_int_t)j->queued, "running", (json_int_t)j->running,
                                            "items_done", (json_int_t)j->items_done, "device_time_s", j->device_time_s,
                                            "bytes_reserved", (json_int_t)j->bytes_reserved));
      json_object_set_new(json_array_get(jobs, i), "tenant", json_string(j->tenant)); /* kexd --auth */
    }
    json_t *tenants = json_array();
    for (size_t i = 0; i < s->ntenants; i++) {
      const kex_tenant_stats *t = &s->tenants[i];
      json_array_append_new(tenants, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "name", t->name, "jobs_open",
                                               (json_int_t)t->jobs_open, "bytes_held", (json_int_t)t->bytes_held,
                                               "bytes_reserved", (json_int_t)t->bytes_reserved, "jobs_opened",
                                               (json_int_t)t->jobs_opened, "submissions", (json_int_t)t->submissions,
                                               "refused", (json_int_t)t->refused));
    }
    /* every StatsReply field under its proto name, and when the server started */
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o, s:I, s:I}", "jobs_open",
                          (json_int_t)s->jobs_open, "jobs_opened", (json_int_t)s->jobs_opened, "jobs_closed",
                          (json_int_t)s->jobs_closed, "jobs_expired", (json_int_t)s->jobs_expired, "submissions",
                          (json_int_t)s->submissions, "plans", (json_int_t)s->plans, "plan_errors",
                          (json_int_t)s->plan_errors, "kernels_planned", (json_int_t)s->kernels_planned, "calls",
                          (json_int_t)s->calls, "calls_failed", (json_int_t)s->calls_failed, "uptime_s", s->uptime_s,
                          "job_stats", jobs, "bytes_held", (json_int_t)s->bytes_held, "buffers_freed",
                          (json_int_t)s->buffers_freed);
    json_t *more = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "submissions_done",
        (json_int_t)s->submissions_done, "submissions_failed", (json_int_t)s->submissions_failed, "schedule_cache_hits",
        (json_int_t)s->schedule_cache_hits, "schedule_cache_misses", (json_int_t)s->schedule_cache_misses,
        "program_cache_memory_hits", (json_int_t)s->program_cache_memory_hits, "program_cache_sqlite_hits",
        (json_int_t)s->program_cache_sqlite_hits, "program_cache_misses", (json_int_t)s->program_cache_misses,
        "beam_cache_hits", (json_int_t)s->beam_cache_hits, "beam_cache_misses", (json_int_t)s->beam_cache_misses,
        "searches_run", (json_int_t)s->searches_run, "searches_cancelled", (json_int_t)s->searches_cancelled,
        "connections_open", (json_int_t)s->connections_open, "connections_refused",
        (json_int_t)s->connections_refused, "jobs_evicted", (json_int_t)s->jobs_evicted, "started", started);
    if (more) json_object_set_new(more, "tenant", json_string(s->tenant));
    if (more)
      json_object_set_new(more, "fleet",
                          json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "state", s->fleet.state, "hits",
                                    (json_int_t)s->fleet.hits, "published", (json_int_t)s->fleet.published,
                                    "lease_waits", (json_int_t)s->fleet.lease_waits, "takeovers",
                                    (json_int_t)s->fleet.takeovers, "rejected", (json_int_t)s->fleet.rejected,
                                    "errors", (json_int_t)s->fleet.errors, "outages", (json_int_t)s->fleet.outages));
    if (more) json_object_set_new(more, "tenant_stats", tenants);
    else json_decref(tenants);
    if (!o || !more || json_object_update(o, more)) {
      fprintf(stderr, "kex stats: out of memory\n");
      ret = 1;
    } else {
      json_dumpf(o, stdout, JSON_COMPACT);
      fputc('\n', stdout);
    }
    json_decref(more);
    json_decref(o);
  } else {
#define U(x) ((unsigned long long)(x))
    printf("uptime: %.1f s (started %s)\n", s->uptime_s, started);
    printf("jobs: %u open, %llu opened, %llu closed, %llu expired (%llu of them evicted)\n", s->jobs_open,
           U(s->jobs_opened), U(s->jobs_closed), U(s->jobs_expired), U(s->jobs_evicted));
    printf("connections: %u open, %llu refused\n", s->connections_open, U(s->connections_refused));
    printf("calls: %llu (%llu failed)\n", U(s->calls), U(s->calls_failed));
    printf("plans: %llu (%llu failed, %llu kernels)\n", U(s->plans), U(s->plan_errors), U(s->kernels_planned));
    printf("submissions: %llu (%llu done, %llu failed)\n", U(s->submissions), U(s->submissions_done),
           U(s->submissions_failed));
    printf("schedule cache: %llu hits, %llu misses\n", U(s->schedule_cache_hits), U(s->schedule_cache_misses));
    printf("program cache: %llu memory hits, %llu sqlite hits, %llu misses\n", U(s->program_cache_memory_hits),
           U(s->program_cache_sqlite_hits), U(s->program_cache_misses));
    printf("beam cache: %llu hits, %llu misses; searches: %llu run, %llu cancelled\n", U(s->beam_cache_hits),
           U(s->beam_cache_misses), U(s->searches_run), U(s->searches_cancelled));
    printf("bytes held: %llu\nbuffers freed: %llu\n", U(s->bytes_held), U(s->buffers_freed));
    if (strcmp(s->fleet.state, "off") != 0)
      printf("fleet cache: %s; %llu hits, %llu published, %llu lease waits (%llu taken over), %llu rejected, %llu "
             "errors, %llu outages\n",
             s->fleet.state, U(s->fleet.hits), U(s->fleet.published), U(s->fleet.lease_waits), U(s->fleet.takeovers),
             U(s->fleet.rejected), U(s->fleet.errors), U(s->fleet.outages));
    for (size_t i = 0; i < s->ntenants; i++) /* kexd --auth: a user sees its own tenant */
      printf("tenant %s: %u jobs open (%llu opened), %llu bytes held (%llu reserved), %llu submissions, %llu refused\n",
             s->tenants[i].name, s->tenants[i].jobs_open, U(s->tenants[i].jobs_opened), U(s->tenants[i].bytes_held),
             U(s->tenants[i].bytes_reserved), U(s->tenants[i].submissions), U(s->tenants[i].refused));
    for (size_t i = 0; i < s->njobs; i++) {
      const kex_job_stats *j = &s->jobs[i];
      char lim[48] = "no limit";
      if (j->memory_limit) snprintf(lim, sizeof lim, "limit %llu", U(j->memory_limit));
      printf("job %s: weight %u, %u buffers, %llu bytes (%llu reserved, %s), %u queued, %u running, %llu done, "
             "%.3f s device\n",
             j->name, j->weight, j->buffers, U(j->bytes_held), U(j->bytes_reserved), lim, j->queued, j->running,
             U(j->items_done), j->device_time_s);
    }
#undef U
  }
  kex_stats_free(s);
  return ret;
}

/* ---- upload, download ---- */

static int cmd_upload(remote *r, int argc, char **argv) {
  const char *job = NULL, *device = NULL;
  char handle[KEX_TOKEN_MAX];
  kex_status st;
  int c, ret;
  const kex_cli_opt opts[] = {{"job", 0, KEX_CLI_STR, &job},
                              {"device", 'd', KEX_CLI_STR, &device},
                              {0}};
  const char *path = NULL;
  if ((c = kex_cli_args("upload", opts, ".npy file", &path, argc, argv, remote_usage)) >= 0) return c;
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "kex upload: %s: cannot read\n", path);
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "upload", job, true))) goto out;
  if (r->temp_job)
    fprintf(stderr, "kex upload: no --job or KEX_JOB: the buffer lives in a temporary job that closes now "
                    "(kex job open makes one that stays)\n");
  if (kex_upload_npy(r->client, r->job, path, device, handle, &st)) {
    ret = fail("upload", &st);
    goto out;
  }
  printf("%s\n", handle);
out:
  kex_cli_remote_done(r);
  return ret;
}

static int cmd_download(remote *r, int argc, char **argv) {
  const char *job = NULL, *out = NULL;
  kex_array b = {0};
  kex_status st;
  int c, ret;
  const kex_cli_opt opts[] = {{"job", 0, KEX_CLI_STR, &job},
                              {"out", 'o', KEX_CLI_STR, &out},
                              {0}};
  const char *handle = NULL;
  if ((c = kex_cli_args("download", opts, "buffer handle", &handle, argc, argv, remote_usage)) >= 0) return c;
  if ((ret = kex_cli_remote_open(r, "download", job, true))) goto done;
  if (kex_download(r->client, r->job, handle, &b, &st)) {
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
  const kex_cli_opt opts[] = {{"name", 'n', KEX_CLI_STR, &name},
                              {"weight", 'w', KEX_CLI_INT, &weight, 0, UINT32_MAX},
                              {"memory-limit", 'm', KEX_CLI_INT, &mem, 0, 9.2e18},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"job", 0, KEX_CLI_STR, &job},
                              {0}};
  if ((c = kex_cli_options("job", opts, argc - 1, argv + 1, remote_usage)) >= 0) return c;
  if (!open && optind < argc - 1) job = argv[1 + optind];
  if (!open && (!job || !*job)) {
    fprintf(stderr, "kex job close: which job? (TOKEN, --job or KEX_JOB)\n");
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "job", NULL, false))) return ret;
  if (open) {
    uint32_t lease = 0;
    if (kex_job_open(r->client, name, (uint32_t)weight, (uint64_t)mem, r->job, &lease, &st)) return fail("job open", &st);
    if (as_json) { /* a fleet's token "HEX.NAME@ADDR" names the node that holds the job: "node", "advertise" */
      const char *dot = strlen(r->job) > 32 && r->job[32] == '.' ? r->job + 33 : NULL;
      const char *at = dot ? strchr(dot, '@') : NULL;
      json_t *o = json_pack("{s:s, s:I, s:s%, s:s}", "job", r->job, "lease_seconds", (json_int_t)lease, "node",
                            at ? dot : "", at ? (size_t)(at - dot) : (size_t)0, "advertise", at ? at + 1 : "");
      char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
      printf("%s\n", text ? text : "{}");
      free(text);
      json_decref(o);
    } else {
      printf("%s\n", r->job);
    }
    return 0;
  }
  if (kex_job_close(r->client, job, &st)) return fail("job close", &st);
  return 0;
}

/* ---- entry ---- */

static bool is_remote_only(const char *cmd) {
  return strcmp(cmd, "devices") == 0 || strcmp(cmd, "stats") == 0 || strcmp(cmd, "upload") == 0 ||
         strcmp(cmd, "download") == 0 || strcmp(cmd, "job") == 0 || strcmp(cmd, "top") == 0 ||
         strcmp(cmd, "health") == 0;
}

/*
 * The server-mode entry point, called first by kex.c's main: -1 when the
 * command line is not for a server (no --server, no KEX_SERVER, an
 * in-process command), else the exit code.  `doctor` is taken here with or
 * without a server (it checks this machine, then the server).
 */
int kex_remote_cmd_health(kex_cli_remote *r, int argc, char **argv); /* kex_auth.c */

#define CLI_TOKEN_FILE_MAX 512 /* bytes of a --token-file (kexd's limit on an authorization value) */

/*
 * The token in file `path` into buf (cap bytes): its first line, without
 * the line end and trailing blanks.  0, or 2 after printing why (cannot
 * read it, empty, longer than CLI_TOKEN_FILE_MAX, a control character).
 * A file others may read is only warned about (like ssh's keys, it should
 * be the user's alone).
 */
static int read_token_file(const char *path, char *buf, size_t cap) {
  struct stat st;
  FILE *f = fopen(path, "r");
  size_t n = 0;
  int c, rc = 2;
  if (!f) {
    fprintf(stderr, "kex: --token-file %s: %s\n", path, strerror(errno));
    return 2;
  }
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
    fprintf(stderr, "kex: warning: --token-file %s can be read by other users (chmod 600 it)\n", path);
  while ((c = fgetc(f)) != EOF && c != '\n') {
    if (n + 1 >= cap || n >= CLI_TOKEN_FILE_MAX) {
      fprintf(stderr, "kex: --token-file %s: the token is longer than %d bytes\n", path, CLI_TOKEN_FILE_MAX);
      goto out;
    }
    buf[n++] = (char)c;
  }
  while (n && (buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
  buf[n] = '\0';
  if (!n) {
    fprintf(stderr, "kex: --token-file %s: no token on its first line\n", path);
    goto out;
  }
  for (size_t k = 0; k < n; k++)
    if ((unsigned char)buf[k] < 0x20 || buf[k] == 0x7f) {
      fprintf(stderr, "kex: --token-file %s: a control character in the token\n", path);
      goto out;
    }
  rc = 0;
out:
  fclose(f);
  return rc;
}

int kex_remote_main(int argc, char **argv) {
  remote r = {0};
  int i = 1, ret;
  char addr[KEX_CLI_ADDR_MAX];
  static char file_token[CLI_TOKEN_FILE_MAX + 1]; /* lives as long as the command (r.token points here) */
  const char *token_arg = NULL, *token_file = NULL;
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
    if (strcmp(a, "--server") != 0 && strcmp(a, "--token") != 0 && strcmp(a, "--token-file") != 0 &&
        strcmp(a, "--root-certs") != 0 && strcmp(a, "--client-cert") != 0 && strcmp(a, "--client-key") != 0)
      break;
    if (i + 1 >= argc) {
      fprintf(stderr, "kex: %s needs a value\n", a);
      return 2;
    }
    if (strcmp(a, "--server") == 0) r.server = argv[i + 1], flag = true;
    else if (strcmp(a, "--token") == 0) token_arg = argv[i + 1];
    else if (strcmp(a, "--token-file") == 0) token_file = argv[i + 1];
    else if (strcmp(a, "--client-cert") == 0) r.client_cert = argv[i + 1];
    else if (strcmp(a, "--client-key") == 0) r.client_key = argv[i + 1];
    else r.root_certs = argv[i + 1];
    i += 2;
  }
  if (token_arg && token_file) {
    fprintf(stderr, "kex: --token and --token-file: give one\n");
    return 2;
  }
  if (token_file) {
    if (read_token_file(token_file, file_token, sizeof file_token)) return 2;
    r.token = file_token;
  } else if (token_arg) {
    fprintf(stderr, "kex: warning: --token puts the token on the command line, where every user of this machine "
                    "can read it (ps, /proc); use KEX_TOKEN or --token-file PATH\n");
    r.token = token_arg;
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
  if (r.server && *r.server) {
    if (kex_cli_server_addr(r.server, addr, sizeof addr)) {
      fprintf(stderr, "kex: server address '%.64s...' is too long\n", r.server);
      return 2;
    }
    r.server = cli_server = addr;
  } else {
    r.server = NULL;
  }
  if (strcmp(cmd, "doctor") == 0) return kex_cmd_doctor(&r, argc - i, argv + i); /* kex_doctor.c */
  if (!r.server) {
    if (!is_remote_only(cmd)) return -1;
    fprintf(stderr, "kex %s: needs a server: kex --server ADDR %s ... (or KEX_SERVER=ADDR)\n", cmd, cmd);
    fprintf(stderr, "kex: scripts/run.sh starts a kexd on %s (then: kex --server 127.0.0.1 %s)\n",
            KEX_CLI_DEFAULT_SERVER, cmd);
    return 2;
  }
  argc -= i;
  argv += i;
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    remote_usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("kex %s\n", kex_cli_version());
    return 0;
  }
  if (strcmp(cmd, "plan") == 0) ret = cmd_plan(&r, argc, argv);
  else if (strcmp(cmd, "run") == 0) ret = cmd_run(&r, argc, argv);
  else if (strcmp(cmd, "devices") == 0) ret = cmd_devices(&r, argc, argv);
  else if (strcmp(cmd, "stats") == 0) ret = cmd_stats(&r, argc, argv);
  else if (strcmp(cmd, "top") == 0) ret = kex_remote_cmd_top(&r, argc, argv);     /* kex_top.c */
  else if (strcmp(cmd, "upload") == 0) ret = cmd_upload(&r, argc, argv);
  else if (strcmp(cmd, "download") == 0) ret = cmd_download(&r, argc, argv);
  else if (strcmp(cmd, "job") == 0) ret = cmd_job(&r, argc, argv);
  else if (strcmp(cmd, "tune") == 0) ret = kex_remote_cmd_tune(&r, argc, argv);   /* kex_tune.c */
  else if (strcmp(cmd, "cache") == 0) ret = kex_remote_cmd_cache(&r, argc, argv); /* kex_cache.c */
  else if (strcmp(cmd, "health") == 0) ret = kex_remote_cmd_health(&r, argc, argv); /* kex_auth.c */
  else {
    fprintf(stderr, "kex: '%s' does not run against a server (plan, run, tune, cache, devices, stats, top, doctor, "
                    "upload, download, job)\n", cmd);
    remote_usage(stderr);
    ret = 2;
  }
  kex_client_close(r.client);
  return ret;
}

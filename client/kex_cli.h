/*
 * kex_cli.h - what the files of the kex command line share (not installed).
 *
 * kex.c owns main, the in-process plan and run, and the small helpers
 * below (version, ISO 8601 dates, server addresses); kex_remote.c owns the server mode: it parses --server/--token/--tls
 * and dispatches `kex --server ADDR CMD`; kex_tune.c and kex_cache.c
 * implement their command both in-process and against a server, with one
 * printer for both, and reach the server through the helpers below;
 * kex_check.c reads a case file and compares outputs with it (`run
 * --check`, both modes); kex_top.c is `kex top` (server only) and
 * kex_doctor.c `kex doctor` (this machine, and the server if one answers).
 */
#ifndef KEX_CLIENT_KEX_CLI_H
#define KEX_CLIENT_KEX_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "sched/graph.h"

#define KEX_CLI_DEFAULT_PORT "50051"  /* --server HOST without a port means HOST:50051 (kexd's default) */
#define KEX_CLI_DEFAULT_SERVER "127.0.0.1:" KEX_CLI_DEFAULT_PORT
#define KEX_CLI_ADDR_MAX 512          /* bytes of a server address, NUL included */
#define KEX_CLI_ISO8601_MAX 32        /* "2026-12-03T07:11:21Z" and its NUL, with room */

/* The project's version (meson's project version), as `kex --version` prints it. */
const char *kex_cli_version(void);

/* Write unix time t as ISO 8601 in UTC ("2026-12-03T07:11:21Z") into out; "-" when t cannot be shown. */
void kex_cli_iso8601(int64_t t, char out[KEX_CLI_ISO8601_MAX]);

/* Seconds on a monotonic clock. */
double kex_cli_now_s(void);

/*
 * The address to dial for a --server/KEX_SERVER value: "HOST" becomes
 * "HOST:50051" ("[::1]" and a bare IPv6 literal "::1" become "[::1]:50051");
 * "HOST:PORT", "unix:PATH" and other gRPC target schemes are kept; a list
 * "a,b:2" (a fleet) gets each item's port the same way.  0, or -1 when it
 * does not fit in cap bytes.
 */
int kex_cli_server_addr(const char *in, char *out, size_t cap);

/*
 * After getopt_long, the operands of "kex CMD".  kex_cli_no_operand: true
 * when none is left, else false after "kex CMD: unexpected argument 'X'".
 * kex_cli_one_operand: the one operand, or NULL after "kex CMD: expected one
 * WHAT" (and usage(stderr) when usage is not NULL).
 */
/*
 * Loads graph file `path` under the default limits for "kex CMD".  0, or the
 * exit code after saying why it did not load: 2 for a file that is missing
 * or unreadable (KEX_EIO), as for an invalid graph.
 */
int kex_cli_graph_load(const char *cmd, const char *path, kex_graph **g);

/* n bytes for people into out[cap]: "512 B", "12.3 MiB", "15.6 GiB" (up to TiB). */
void kex_cli_bytes_text(uint64_t n, char *out, size_t cap);

/* ---- a command's options ---- */

typedef enum kex_cli_opt_kind {
  KEX_CLI_FLAG,  /* no value: *(bool *)dst = true */
  KEX_CLI_STR,   /* *(const char **)dst = the value */
  KEX_CLI_INT,   /* *(long long *)dst = a whole number in [min, max] */
  KEX_CLI_NUM,   /* *(double *)dst = a number in [min, max] */
  KEX_CLI_LOCAL, /* an in-process flag a server command refuses, saying `why` */
  KEX_CLI_LOCAL_ARG, /* the same for an option with a value */
} kex_cli_opt_kind;

typedef struct kex_cli_opt {
  const char *name; /* --name */
  char short_name;  /* -c too, or 0 */
  kex_cli_opt_kind kind;
  void *dst;
  double min, max;  /* INT, NUM: the range a value must be in */
  const char *why;  /* LOCAL, LOCAL_ARG */
} kex_cli_opt;

#define KEX_CLI_OPTS_MAX 16 /* options of one command (a table ends with {0}) */

/*
 * Parse the options of "kex CMD" (argv[0] is CMD; getopt_long's rules, so
 * options and operands may mix) into their dst; --help and -h are every
 * command's (usage(stdout)).  -1 to go on, with optind at the first
 * operand; else the exit code: 0 after --help, 2 after an unknown option,
 * a missing value or one out of its range (said on stderr).
 */
int kex_cli_options(const char *cmd, const kex_cli_opt *opts, int argc, char **argv, void (*usage)(FILE *));

/*
 * kex_cli_options, then the operands: none when what is NULL, else exactly
 * one (a WHAT, into *operand).  -1 to go on, else the exit code.
 */
int kex_cli_args(const char *cmd, const kex_cli_opt *opts, const char *what, const char **operand, int argc,
                 char **argv, void (*usage)(FILE *));

bool kex_cli_no_operand(const char *cmd, int argc, char **argv);
const char *kex_cli_one_operand(const char *cmd, const char *what, int argc, char **argv, void (*usage)(FILE *));

/* Print "[v0, v1, ...]" and a newline: up to 8 leading elements of nbytes of dtype dt (a kex_dtype; -1 prints
   "[]"), numpy-like, as both `kex run` modes print outputs. */
void kex_cli_print_values(int dt, const void *data, size_t nbytes);

/* Print to f how to start a kexd to answer at addr (one line). */
void kex_cli_start_hint(FILE *f, const char *addr);

/* ---- run --check (kex_check.c) ---- */

/* A case file of ../shared/cases: its numeric graph and what the outputs must be. */
typedef struct kex_cli_case {
  char *graph_text;             /* numeric.graph as JSON text (kex_malloc'd) */
  json_t *expected;             /* numeric.expected (owned) */
  size_t nexpected;
  double rtol, atol;
  size_t npassed, nfailed;      /* kex_cli_case_check counts here */
} kex_cli_case;

/*
 * Read the case file at path into *c: 0, or the exit code after printing
 * why not ("kex CMD: PATH: ..."): 2 for a missing or unreadable file, a
 * file that is not JSON, or a case without a numeric graph.
 */
int kex_cli_case_load(const char *cmd, const char *path, kex_cli_case *c);

/*
 * Compare output i (dtype by name, shape, nbytes of data) with the case's
 * expected output i at its tolerances; print "output I: PASS ..." or
 * "output I: FAIL ..." to stdout unless quiet, count it, and return whether
 * it passed.  When details is not NULL, a JSON object describing the
 * comparison is stored there (the caller's).
 */
bool kex_cli_case_check(kex_cli_case *c, size_t i, const char *dtype, int ndim, const int64_t *shape,
                        const void *data, size_t nbytes, bool quiet, json_t **details);

/*
 * After the outputs: expected outputs the run did not produce fail too.
 * Prints "check: N of M outputs passed" unless quiet; returns true when all
 * passed.  noutputs = how many outputs the run produced.
 */
bool kex_cli_case_finish(kex_cli_case *c, size_t noutputs, bool quiet);

void kex_cli_case_free(kex_cli_case *c);

/* ---- the server mode ---- */

typedef struct kex_cli_remote kex_cli_remote;

/*
 * `kex doctor` (kex_doctor.c): this machine's OpenCL platforms and devices,
 * the cache file, and whether a kexd answers at r->server (r NULL, or
 * r->server NULL: KEX_SERVER, else the default address).
 */
int kex_cmd_doctor(kex_cli_remote *r, int argc, char **argv);

#ifdef KEX_HAVE_LIBKEX
#include "client/libkex.h"

/* One server-mode command line: where the server is, the client, the job. */
struct kex_cli_remote {
  const char *server, *token, *root_certs;
  const char *client_cert, *client_key; /* --client-cert/--client-key: mutual TLS */
  bool tls;
  kex_client *client;       /* after kex_cli_remote_open; kex_remote_main closes it */
  char job[KEX_TOKEN_MAX];
  bool temp_job;            /* job was opened for this command (kex_cli_remote_done closes it) */
};

/*
 * Connect to r->server and, when want_job, take the command's job: job_opt
 * (--job), else KEX_JOB, else a temporary job.  0, or the exit code after
 * printing why ("kex CMD: ...").
 */
int kex_cli_remote_open(kex_cli_remote *r, const char *cmd, const char *job_opt, bool want_job);

/* Close the temporary job, if the command opened one. */
void kex_cli_remote_done(kex_cli_remote *r);

/*
 * Print "kex CMD: STATUS: message" for a failed call, and for UNAVAILABLE a
 * second line on how to start kexd; returns its exit code (2 bad input, 1
 * other).
 */
int kex_cli_fail(const char *cmd, const kex_status *st);

/* Read a whole graph file (kex_malloc'd, NUL-terminated) or print why not and return NULL. */
char *kex_cli_read_graph(const char *cmd, const char *path);

/* `kex --server ADDR tune ...` (kex_tune.c), `... cache ...` (kex_cache.c), `... top ...` (kex_top.c). */
int kex_remote_cmd_tune(kex_cli_remote *r, int argc, char **argv);
int kex_remote_cmd_cache(kex_cli_remote *r, int argc, char **argv);
int kex_remote_cmd_top(kex_cli_remote *r, int argc, char **argv);
#endif

#endif

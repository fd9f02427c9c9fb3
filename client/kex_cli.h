/*
 * kex_cli.h - what the files of the kex command line share (not installed).
 *
 * kex_remote.c owns the server mode: it parses --server/--token/--tls and
 * dispatches `kex --server ADDR CMD`; kex_tune.c and kex_cache.c implement
 * their command both in-process and against a server, with one printer for
 * both, and reach the server through the helpers below.
 */
#ifndef KEX_CLIENT_KEX_CLI_H
#define KEX_CLIENT_KEX_CLI_H

#ifdef KEX_HAVE_LIBKEX
#include <stdbool.h>

#include "client/libkex.h"

/* One server-mode command line: where the server is, the client, the job. */
typedef struct kex_cli_remote {
  const char *server, *token, *root_certs;
  bool tls;
  kex_client *client;       /* after kex_cli_remote_open; kex_remote_main closes it */
  char job[KEX_TOKEN_MAX];
  bool temp_job;            /* job was opened for this command (kex_cli_remote_done closes it) */
} kex_cli_remote;

/*
 * Connect to r->server and, when want_job, take the command's job: job_opt
 * (--job), else KEX_JOB, else a temporary job.  0, or the exit code after
 * printing why ("kex CMD: ...").
 */
int kex_cli_remote_open(kex_cli_remote *r, const char *cmd, const char *job_opt, bool want_job);

/* Close the temporary job, if the command opened one. */
void kex_cli_remote_done(kex_cli_remote *r);

/* Print "kex CMD: STATUS: message" for a failed call; returns its exit code (2 bad input, 1 other). */
int kex_cli_fail(const char *cmd, const kex_status *st);

/* Read a whole graph file (kex_malloc'd, NUL-terminated) or print why not and return NULL. */
char *kex_cli_read_graph(const char *cmd, const char *path);

/* `kex --server ADDR tune ...` (kex_tune.c) and `kex --server ADDR cache ...` (kex_cache.c). */
int kex_remote_cmd_tune(kex_cli_remote *r, int argc, char **argv);
int kex_remote_cmd_cache(kex_cli_remote *r, int argc, char **argv);
#endif

#endif

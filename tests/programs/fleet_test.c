/*
 * fleet_test.c - libkex against a fleet of kexds, driven line by line
 * (tests/integration/test_fleet_clients.py starts the kexds, runs this with
 * their list as TARGET, kills a node between commands and checks where
 * every job went through each node's GetStats).
 *
 * usage: fleet_test TARGET    (then commands on stdin, one per line)
 *
 *   open N   open N jobs through the one client (round_robin places them),
 *            and run each job's round (below) once
 *   use      run the round again for every job opened so far
 *   quit     close the jobs that still answer and exit 0
 *
 * A job's round is Upload [1, 2, 3, 4] (float32), Submit a graph that adds
 * the buffer to itself on cpu, and Download the output: [2, 4, 6, 8] is
 * "ok".  Each job prints one line, "job TOKEN ok" or "job TOKEN fail
 * STATUS MESSAGE" (TOKEN "-" when OpenJob itself failed); each command
 * ends with a line "done".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/libkex.h"

#define FLEET_TEST_JOBS 256

/* Upload, Submit, Download on job: 0, or the failed call's code with *st saying why. */
static int round_trip(kex_client *c, const char *job, kex_status *st) {
  static const float in[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  char handle[KEX_TOKEN_MAX], graph[512];
  kex_result *res = NULL;
  kex_array out = {0};
  int rc;
  if ((rc = kex_upload(c, job, "float32", 1, shape, in, sizeof in, NULL, handle, st))) return rc;
  snprintf(graph, sizeof graph,
           "{\"device\":\"cpu\",\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4],\"buffer\":\"%s\"},"
           "{\"op\":\"ADD\",\"src\":[0,0]}],\"outputs\":[1]}",
           handle);
  if ((rc = kex_submit(c, job, graph, NULL, NULL, NULL, &res, st))) return rc;
  if (res->noutputs != 1) rc = KEX_ECORRUPT;
  else rc = kex_download(c, job, res->outputs[0].handle, &out, st);
  if (!rc && (out.nbytes != sizeof in || ((float *)out.data)[0] != 2 || ((float *)out.data)[3] != 8)) {
    rc = KEX_ECORRUPT;
    snprintf(st->msg, sizeof st->msg, "the output is not [2, 4, 6, 8]");
    st->grpc = 0;
  }
  kex_array_free(&out);
  kex_result_free(res);
  return rc;
}

static void report(const char *job, int rc, const kex_status *st) {
  if (!rc) printf("job %s ok\n", job);
  else printf("job %s fail %s %s\n", job, st->grpc ? kex_grpc_status_name(st->grpc) : kex_errname(rc), st->msg);
}

int main(int argc, char **argv) {
  static char jobs[FLEET_TEST_JOBS][KEX_TOKEN_MAX];
  size_t njobs = 0;
  kex_client *c = NULL;
  kex_status st;
  char line[256];
  if (argc != 2) {
    fprintf(stderr, "usage: fleet_test TARGET\n");
    return 2;
  }
  if (kex_client_connect(argv[1], NULL, &c, &st)) {
    fprintf(stderr, "fleet_test: %s\n", st.msg);
    return 1;
  }
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "open ", 5)) {
      for (long n = strtol(line + 5, NULL, 10); n > 0 && njobs < FLEET_TEST_JOBS; n--) {
        int rc = kex_job_open(c, "fleet_test", 0, 0, jobs[njobs], NULL, &st);
        if (rc) report("-", rc, &st);
        else report(jobs[njobs], round_trip(c, jobs[njobs], &st), &st), njobs++;
      }
    } else if (!strncmp(line, "use", 3)) {
      for (size_t i = 0; i < njobs; i++) report(jobs[i], round_trip(c, jobs[i], &st), &st);
    } else if (!strncmp(line, "quit", 4)) {
      break;
    }
    printf("done\n");
    fflush(stdout);
  }
  for (size_t i = 0; i < njobs; i++) kex_job_close(c, jobs[i], &st);
  kex_client_close(c);
  return 0;
}

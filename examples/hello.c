/*
 * hello.c - libkex in 60 lines: connect to kexd, open a job, plan a graph
 * (how many kernels?) and submit it (the numbers).
 *
 * Build (in the tree, meson builds it as build/client/hello):
 *   ninja -C build client/hello && build/client/hello 127.0.0.1:50051
 * Build against an installed libkex (meson install):
 *   cc hello.c $(pkg-config --cflags --libs kex) -o hello
 */
#include <stdio.h>
#include <string.h>

#include "libkex.h"

#include "hello_graph.h"

/* (a + b) * 2 over float32[4] (hello_graph.h) */
static const char *graph = KEX_HELLO_GRAPH;

static void on_event(const kex_submit_event *ev, void *ud) {
  (void)ud;
  if (ev->kind == KEX_EVENT_RUNNING) printf("running kernel %u/%u %s\n", ev->i + 1, ev->n, ev->kernel);
}

int main(int argc, char **argv) {
  const char *addr = argc > 1 ? argv[1] : "127.0.0.1:50051";
  kex_client *c = NULL;
  kex_plan *plan = NULL;
  kex_result *res = NULL;
  kex_status st;
  char job[KEX_TOKEN_MAX];
  int rc = 1;
  if (kex_client_connect(addr, NULL, &c, &st) || kex_job_open(c, "hello", 1, 0, job, NULL, &st)) goto fail;
  if (kex_plan_graph(c, job, graph, &plan, &st)) goto fail;
  printf("plan: %u kernel(s)\n", plan->kernels);
  kex_submit_opts opts = {.return_bytes = true, .timeout_s = 60};
  if (kex_submit(c, job, graph, &opts, on_event, NULL, &res, &st)) goto fail;
  float out[4] = {0};
  if (res->noutputs == 1 && res->outputs[0].has_data && res->outputs[0].buf.nbytes == sizeof out)
    memcpy(out, res->outputs[0].buf.data, sizeof out);
  printf("result: %g %g %g %g\n", out[0], out[1], out[2], out[3]);
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "hello: %s (kex %s, gRPC %s)\n", st.msg, kex_errname(st.code), kex_grpc_status_name(st.grpc));
out:
  kex_result_free(res);
  kex_plan_free(plan);
  if (c) kex_job_close(c, job, &st);
  kex_client_close(c);
  return rc;
}

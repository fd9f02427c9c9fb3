/*
 * fuzz_rpc.c - fuzz target: arbitrary bytes as a Plan or Submit request.
 * The first byte's low bit picks the method; the rest is the request.
 *
 *   Plan    kexd's own handler (daemon/plan.c kexd_rpc_plan) on an
 *           in-process kexd (fuzzkexd.c) with fakecall.c's call: decode
 *           (daemon/request.c), job, graph (daemon/pbgraph.c), replay and
 *           schedule inline or on the worker pool, the reply built and
 *           packed; the call must end exactly once, every reference back.
 *   Submit  as its handler takes it up to the device (the handler itself
 *           compiles and runs kernels, too slow to fuzz): unpacked with
 *           protobuf-c through kex_malloc, strings checked on the wire
 *           (daemon/wire.c), the job token looked up in the job table,
 *           converted by kexd_rpc_graph_from_pb under kexd's default limits
 *           (every refusal must name what was wrong), replayed with the
 *           device's target rules (codegen/target.c) and scheduled.
 *
 * No crash, leak or sanitizer report for any input.  The job's token and
 * buffer handle are fixed (FUZZ_TOKEN, FUZZ_HANDLE) so the corpus can name
 * them.  KEX_FUZZ_VERBOSE set: what became of each input, on stderr.
 * Built like fuzz_wire: with -Dfuzzer=true a libFuzzer target, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/rpc).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/target.h"
#include "core/arena.h"
#include "daemon/jobs.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"
#include "tests/fuzz/fakecall.h"
#include "tests/fuzz/fuzzkexd.h"
#include "kex/v1/kex.pb-c.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

#define CALL_SECONDS 30 /* a Plan not over by then is a handler that lost it */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int verbose;

/* The graph of a decoded request through conversion, replay and schedule. */
static void run_graph(const kexd *d, const Kex__V1__Graph *pg, kexd_job *job) {
  kex_graph *g = NULL;
  kex_replay *r = NULL;
  kex_schedule *s = NULL;
  kex_arena arena;
  kex_error err;
  int dev = kexd_rpc_device_index(d, pg->device);
  if (dev < 0) return;
  memset(&err, 0, sizeof err);
  if (kexd_rpc_graph_from_pb(d, pg, pg->device && *pg->device ? pg->device : NULL, &d->cfg.limits, job, &g, &err) < 0) {
    if (!err.msg[0]) __builtin_trap(); /* every refusal names what was wrong */
    if (verbose) fprintf(stderr, "refused: %s\n", err.msg);
    return;
  }
  kex_arena_init(&arena, 0);
  kex_replay_opts ro = kex_target_replay_opts(&d->targets[dev]);
  ro.device_name = d->cfg.devices[dev];
  if (kex_replay_graph(g, &ro, &arena, &r, &err) == 0) kex_schedule_create(r, &s, &err);
  if (verbose && s) fprintf(stderr, "scheduled: %u kernels\n", s->nkernels);
  if (verbose && !s) fprintf(stderr, "not scheduled: %s\n", err.msg);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_graph_free(g);
  kex_arena_destroy(&arena);
}

/* A Plan through kexd's own handler, to its reply. */
static void run_plan(kexd *d, const uint8_t *data, size_t size) {
  kexd_call c;
  memset(&c, 0, sizeof c);
  c.method = "/kex.v1.Kex/Plan";
  c.refs = 1;
  kexd_rpc_serve(d, c.method, &c, data, size);
  fuzz_call_wait(&c, d->loop, CALL_SECONDS);
  if (verbose) fprintf(stderr, "Plan: status %d %s\n", c.status, c.details);
}

/* A Submit as its handler takes it up to the device: decode, strings, job, graph, replay, schedule. */
static void run_submit(kexd *d, const uint8_t *data, size_t size) {
  const ProtobufCMessageDescriptor *desc = &kex__v1__submit_request__descriptor;
  Kex__V1__SubmitRequest *m;
  char why[256];
  if (size > (size_t)d->cfg.max_message) return;
  if (!(m = (Kex__V1__SubmitRequest *)protobuf_c_message_unpack(desc, &kex_pb_allocator, size, data))) return;
  if (kexd_wire_check_strings(desc, data, size, why, sizeof why) == 0) {
    kexd_job *job = m->job && *m->job ? kexd_jobs_find(&d->jobs, m->job) : NULL;
    if (job && m->graph) run_graph(d, m->graph, job);
  }
  protobuf_c_message_free_unpacked(&m->base, &kex_pb_allocator);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kexd *d = fuzz_kexd();
  verbose = getenv("KEX_FUZZ_VERBOSE") != NULL;
  if (size == 0) return 0;
  if (data[0] & 1) run_plan(d, data + 1, size - 1);
  else run_submit(d, data + 1, size - 1);
  return 0;
}

/*
 * fuzz_rpc.c - fuzz target: arbitrary bytes as a Submit or Plan request,
 * taken as far as kexd takes one before a device is involved.  The first
 * byte's low bit picks SubmitRequest or PlanRequest; the rest is unpacked
 * with protobuf-c (through kex_malloc, as daemon/request.c does), its
 * strings checked on the wire (daemon/wire.c), the job token looked up in a
 * real job table (daemon/jobs.c) holding one job with one buffer, the
 * graph's device resolved against kexd's default devices, then converted
 * by the daemon's own kexd_rpc_graph_from_pb (daemon/pbgraph.c) under
 * kexd's default limits, replayed (sched/lazy.c, with the device's target
 * rules, codegen/target.c) and scheduled (sched/schedule.c); a Plan's
 * schedule is also turned into the JSON its reply is built from.  Any input
 * must end in a clean refusal or a schedule: no crash, leak or sanitizer
 * report.
 *
 * The daemon is fuzzkexd.c's; its job's token and buffer handle are fixed
 * (FUZZ_TOKEN, FUZZ_HANDLE) so the corpus can name them.  Built like
 * fuzz_wire: with -Dfuzzer=true a libFuzzer target, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/rpc).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/target.h"
#include "core/arena.h"
#include "daemon/jobs.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"
#include "tests/fuzz/fuzzkexd.h"
#include "kex/v1/kex.pb-c.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int verbose; /* KEX_FUZZ_VERBOSE set: say what became of each input (for checking a corpus) */

/* The graph of a decoded request through conversion, replay and schedule. */
static void run_graph(const kexd *d, const Kex__V1__Graph *pg, kexd_job *job, int plan) {
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
  if (kex_replay_graph(g, &ro, &arena, &r, &err) == 0 && kex_schedule_create(r, &s, &err) == 0 && plan) {
    json_t *items = kex_schedule_to_json(s);
    json_decref(items);
  }
  if (verbose && s) fprintf(stderr, "scheduled: %u kernels\n", s->nkernels);
  if (verbose && !s) fprintf(stderr, "not scheduled: %s\n", err.msg);
  kex_schedule_free(s);
  kex_replay_free(r);
  kex_graph_free(g);
  kex_arena_destroy(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kexd *d = fuzz_kexd();
  const ProtobufCMessageDescriptor *desc;
  ProtobufCMessage *m;
  char why[256];
  int plan;
  verbose = getenv("KEX_FUZZ_VERBOSE") != NULL;
  if (size == 0) return 0;
  plan = data[0] & 1;
  desc = plan ? &kex__v1__plan_request__descriptor : &kex__v1__submit_request__descriptor;
  data++, size--;
  if (size > (size_t)d->cfg.max_message) return 0;
  if (!(m = protobuf_c_message_unpack(desc, &fuzz_pb_allocator, size, data))) return 0;
  if (kexd_wire_check_strings(desc, data, size, why, sizeof why) == 0) {
    const char *token = plan ? ((Kex__V1__PlanRequest *)m)->job : ((Kex__V1__SubmitRequest *)m)->job;
    const Kex__V1__Graph *pg = plan ? ((Kex__V1__PlanRequest *)m)->graph : ((Kex__V1__SubmitRequest *)m)->graph;
    kexd_job *job = token && *token ? kexd_jobs_find(&d->jobs, token) : NULL;
    if (job && pg) run_graph(d, pg, job, plan);
  }
  protobuf_c_message_free_unpacked(m, &fuzz_pb_allocator);
  return 0;
}

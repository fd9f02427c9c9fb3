/*
 * fuzz_graph.c - fuzz target: arbitrary bytes as a JSON graph, loaded with
 * small limits, then replayed and scheduled under the opencl and the cpu
 * rules.  Any input must end in success or a clean error: no crash, no
 * leak, no sanitizer report.
 *
 * Built two ways: with -fsanitize=fuzzer (clang) it is a libFuzzer target;
 * otherwise (the default, and in the test suite) replay.c's main() replays
 * every file given on the command line or found in the corpus folders, so
 * the corpus runs as an ordinary test under ASan+UBSan.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "sched/graph.h"
#include "sched/lazy.h"
#include "sched/schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kex_limits lim = KEX_LIMITS_DEFAULT; /* tighter where the fuzzer should not spend its time */
  lim.max_nodes = 4096;
  lim.max_elements = 1 << 24;
  lim.max_inline_bytes = 1 << 20;
  lim.max_buffer_bytes = 1 << 26;
  lim.max_outputs = 256;
  kex_error err;
  kex_graph *g = NULL;
  if (kex_graph_from_json((const char *)data, size, &lim, &g, &err)) return 0;
  for (int cpu = 0; cpu < 2; cpu++) {
    kex_arena arena;
    kex_arena_init(&arena, 0);
    kex_replay *r = NULL;
    kex_schedule *s = NULL;
    kex_replay_opts ro = {cpu, cpu ? "cpu" : "opencl", NULL};
    if (kex_replay_graph(g, &ro, &arena, &r, &err) == 0 && kex_schedule_create(r, &s, &err) == 0) {
      FILE *devnull = fopen("/dev/null", "w");
      if (devnull) {
        kex_schedule_print(s, devnull);
        fclose(devnull);
      }
    }
    kex_schedule_free(s);
    kex_replay_free(r);
    kex_arena_destroy(&arena);
  }
  kex_graph_free(g);
  return 0;
}

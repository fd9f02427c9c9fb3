/*
 * fuzz_wire.c - fuzz target: arbitrary bytes as the request of a kexd RPC.
 * The first byte picks the method's request message; the rest is unpacked
 * with protobuf-c exactly as kexd's request plumbing does, and what unpacks
 * is walked by the wire check (daemon/wire.c: no NUL, valid UTF-8 in every
 * string field, nested messages bounded).  Any input must end in a clean
 * refusal or acceptance: no crash, no leak, no sanitizer report.
 *
 * Built like fuzz_graph: a libFuzzer target with -fsanitize=fuzzer, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/wire: requests
 * made from ../shared/cases by tests/fuzz/make_wire_corpus.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "daemon/wire.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kex/v1/kex.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ProtobufCMessageDescriptor *const requests[] = {
    &kex__v1__submit_request__descriptor,       &kex__v1__plan_request__descriptor,
    &kex__v1__open_job_request__descriptor,     &kex__v1__close_job_request__descriptor,
    &kex__v1__hold_job_request__descriptor,     &kex__v1__upload_request__descriptor,
    &kex__v1__download_request__descriptor,     &kex__v1__free_request__descriptor,
    &kex__v1__tune_request__descriptor,         &kex__v1__list_cache_request__descriptor,
    &kex__v1__get_cache_entry_request__descriptor, &kex__v1__export_cache_request__descriptor,
    &kex__v1__import_cache_request__descriptor, &kex__v1__delete_cache_request__descriptor,
    &kex__v1__list_devices_request__descriptor, &kex__v1__get_stats_request__descriptor,
    &grpc__health__v1__health_check_request__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const ProtobufCMessageDescriptor *desc;
  ProtobufCMessage *m;
  char why[256];
  size_t bad;
  if (size == 0) return 0;
  desc = requests[data[0] % (sizeof requests / sizeof requests[0])];
  m = protobuf_c_message_unpack(desc, NULL, size - 1, data + 1);
  if (m) {
    why[0] = '\0';
    if (kexd_wire_check_strings(desc, data + 1, size - 1, why, sizeof why) < 0 && !why[0]) __builtin_trap();
    protobuf_c_message_free_unpacked(m, NULL);
  }
  (void)kexd_wire_text_ok(data, size, &bad);
  return 0;
}

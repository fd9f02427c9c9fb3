/*
 * fuzz_stream.c - fuzz target: arbitrary bytes as the message stream of an
 * Upload or an ImportCache call, through kexd's own handlers
 * (daemon/buffers.c kexd_rpc_upload, daemon/tune.c kexd_rpc_import_cache)
 * on an in-process kexd (fuzzkexd.c: the job table, a "cpu" device runner,
 * Tune's state and a real cache file) with fakecall.c's calls in place of
 * gRPC.
 *
 * The first byte's bit 0 picks the method, bits 1-2 how the stream ends:
 * 0 the client half-closes, 1 the stream breaks (a read completes not ok),
 * 2 the client cancels (the cancel hook, then the read breaks), 3 the
 * client cancels after half-closing (while the device or the cache works).
 * The rest is a sequence of frames, each a 2-byte little-endian length
 * then that many bytes (a short last frame takes what is left), at most
 * MAX_FRAMES, each one request message handed to the handler's
 * outstanding read.  The loop then runs until the call is over.
 *
 * Every input must end with the call finished exactly once, with a
 * message when it failed, every reference the handler took released, and
 * no crash, leak or sanitizer report; after each input the job is closed
 * (its buffers freed on the device) and opened again empty.
 *
 * Built like fuzz_wire: with -Dfuzzer=true a libFuzzer target, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/stream, from
 * tests/fuzz/make_rpc_corpus.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "daemon/rpc.h"
#include "tests/fuzz/fakecall.h"
#include "tests/fuzz/fuzzkexd.h"
#include "tests/fuzz/tmpcache.h"

#define MAX_FRAMES 256
#define CALL_SECONDS 30 /* a call not over by then is a handler that lost it */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Hand the outstanding read (msg, or the end when msg is NULL; ok 0: broken). */
static void deliver(kexd_call *c, const uint8_t *msg, size_t len, int ok) {
  kexd_read_cb cb = c->read_cb;
  c->reading = false;
  c->read_cb = NULL;
  cb(c, msg, len, ok, c->read_ud);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kexd *d;
  kexd_call c;
  size_t at = 1;
  int frames = 0, ending;
  (void)fuzz_tmpcache();
  d = fuzz_kexd_serving(fuzz_tmpcache_path());
  if (size == 0) return 0;
  memset(&c, 0, sizeof c);
  c.refs = 1;
  ending = (data[0] >> 1) & 3;
  if (data[0] & 1) {
    c.method = "/kex.v1.Kex/ImportCache";
    kexd_rpc_import_cache(&c, NULL, 0, d);
  } else {
    c.method = "/kex.v1.Kex/Upload";
    kexd_rpc_upload(&c, NULL, 0, d);
  }
  while (c.reading && at < size && frames++ < MAX_FRAMES) {
    size_t n = at + 2 <= size ? (size_t)data[at] | (size_t)data[at + 1] << 8 : 0;
    at = at + 2 <= size ? at + 2 : size;
    if (n > size - at) n = size - at;
    deliver(&c, data + at, n, 1);
    at += n;
  }
  if (c.reading) {
    if (ending == 2) fuzz_call_cancel(&c);
    if (c.reading) deliver(&c, NULL, 0, ending == 0 || ending == 3);
    if (ending == 3) fuzz_call_cancel(&c);
  }
  fuzz_call_wait(&c, d->loop, CALL_SECONDS);
  if (c.writes) __builtin_trap(); /* a client-stream handler answers with its one reply */
  fuzz_kexd_reset_job(d);
  return 0;
}

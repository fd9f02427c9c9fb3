/*
 * fuzz_stream.c - fuzz target: arbitrary bytes as the message stream of an
 * Upload or an ImportCache call.  The first byte's low bit picks the
 * method; the rest is a sequence of frames, each a 2-byte little-endian
 * length then that many bytes (a short last frame takes what is left), at
 * most MAX_FRAMES.  Each frame is one request message, handled as the
 * daemon's stream handlers handle theirs: unpacked with protobuf-c through
 * kex_malloc, its strings checked on the wire (daemon/wire.c), the job
 * token looked up in the job table of fuzzkexd.c's daemon (daemon/jobs.c)
 * on the first message and compared on the later ones, then
 *
 *   Upload       the header's dtype, shape and device resolved with the
 *                daemon's functions (kex_dtype_from_name,
 *                kexd_rpc_device_index) and the chunks counted;
 *   ImportCache  the chunks gathered up to --import-max-bytes' default and,
 *                at the end of the stream, read by kex_cache_import from a
 *                memory stream into a real cache file (tmpcache.c), as
 *                daemon/tune.c does.
 *
 * Upload's own sequence rules (header first, a second header, a chunk past
 * the total) live in static functions of daemon/buffers.c that need a live
 * call and device runner; tests/integration/test_hostile.py sends those
 * through a real kexd.  Any input must end in a clean refusal or an
 * import: no crash, leak or sanitizer report.
 *
 * Built like fuzz_wire: with -Dfuzzer=true a libFuzzer target, else
 * replay.c's main() replays the corpus (tests/fuzz/corpus/stream, from
 * tests/fuzz/make_rpc_corpus.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "daemon/jobs.h"
#include "daemon/rpc.h"
#include "daemon/wire.h"
#include "kex/v1/kex.pb-c.h"
#include "tests/fuzz/fuzzkexd.h"
#include "tests/fuzz/tmpcache.h"

#define MAX_FRAMES 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The stream's state between messages. */
typedef struct stream {
  int import;
  uint64_t job;       /* 0 until the first message named one */
  int have_header;
  char *buf;          /* ImportCache: the data so far */
  size_t len;
} stream;

/* One message as the handler takes it; -1 ends the stream (the daemon would fail the call). */
static int on_message(kexd *d, stream *st, const uint8_t *msg, size_t len) {
  const ProtobufCMessageDescriptor *desc =
      st->import ? &kex__v1__import_cache_request__descriptor : &kex__v1__upload_request__descriptor;
  ProtobufCMessage *m;
  char why[256];
  const char *token;
  int rc = -1;
  if (len > (size_t)d->cfg.max_message || !(m = protobuf_c_message_unpack(desc, &fuzz_pb_allocator, len, msg))) return -1;
  if (kexd_wire_check_strings(desc, msg, len, why, sizeof why) < 0) goto out;
  token = st->import ? ((Kex__V1__ImportCacheRequest *)m)->job : ((Kex__V1__UploadRequest *)m)->job;
  if (!st->job || (token && *token)) {
    kexd_job *job = token && *token ? kexd_jobs_find(&d->jobs, token) : NULL;
    if (!job || (st->job && job->id != st->job)) goto out;
    st->job = job->id;
  }
  if (st->import) {
    const Kex__V1__ImportCacheRequest *r = (const Kex__V1__ImportCacheRequest *)m;
    if (r->data.len > d->cfg.import_max_bytes || st->len > d->cfg.import_max_bytes - r->data.len) goto out;
    if (r->data.len) {
      char *nb = kex_realloc(st->buf, st->len + r->data.len);
      if (!nb) goto out;
      memcpy(nb + st->len, r->data.data, r->data.len);
      st->buf = nb;
      st->len += r->data.len;
    }
  } else {
    const Kex__V1__UploadRequest *r = (const Kex__V1__UploadRequest *)m;
    if (r->part_case == KEX__V1__UPLOAD_REQUEST__PART_HEADER) {
      if (st->have_header || !r->header->dtype || kex_dtype_from_name(r->header->dtype) < 0 ||
          kexd_rpc_device_index(d, r->header->device) < 0)
        goto out;
      st->have_header = 1;
    } else if (!st->have_header || r->part_case != KEX__V1__UPLOAD_REQUEST__PART_CHUNK) {
      goto out;
    }
  }
  rc = 0;
out:
  protobuf_c_message_free_unpacked(m, &fuzz_pb_allocator);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kexd *d = fuzz_kexd();
  stream st;
  size_t at = 1;
  int frames = 0, ok = 1;
  (void)fuzz_tmpcache();
  if (size == 0) return 0;
  memset(&st, 0, sizeof st);
  st.import = data[0] & 1;
  while (ok && at < size && frames++ < MAX_FRAMES) {
    size_t n = at + 2 <= size ? (size_t)data[at] | (size_t)data[at + 1] << 8 : 0;
    at += 2;
    if (at > size) at = size;
    if (n > size - at) n = size - at;
    ok = on_message(d, &st, data + at, n) == 0;
    at += n;
  }
  if (ok && st.import && st.job) { /* the end of a good stream: import what came */
    kex_cache_import_report rep;
    kex_error err;
    uint64_t deleted;
    FILE *f = st.len ? fmemopen(st.buf, st.len, "r") : fmemopen((void *)"", 1, "r");
    if (f) {
      kex_cache_import(fuzz_tmpcache(), f, &rep, &err);
      fclose(f);
      kex_cache_delete(fuzz_tmpcache(), NULL, &deleted, &err); /* each input starts from an empty cache */
    }
  }
  kex_free(st.buf);
  return 0;
}

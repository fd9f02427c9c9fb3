/*
 * buffers.c - Upload (a client stream), Download (a server stream, written
 * by stream.c's writer) and Free of a job's buffers.  The bytes go to and
 * from the device only through its runner (dispatch.c), one work item at a
 * time, and a handler's state lives until the last of its read, write or
 * device item comes back.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/rpc.h"
#include "daemon/stream.h"

/* ---- buffers: Upload, Download, Free ---- */

/* "float32 [2, 3]" into out[cap]. */
static void describe_buffer(char *out, size_t cap, kex_dtype dt, const int64_t *shape, size_t ndim) {
  size_t n = (size_t)snprintf(out, cap, "%s [", kex_dtypes[dt].name);
  for (size_t i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/*
 * One Upload stream.  Freed exactly once, by whoever sees it last: the read
 * callback or the device callback when the call is over, or the cancel hook
 * when neither is outstanding.
 */
typedef struct upload {
  kexd *d;
  kexd_call *call;
  uint64_t job;            /* 0 until the header */
  char log_id[9];
  bool have_header, reading, on_device, dead;
  kex_dtype dtype;
  uint8_t ndim;
  int64_t shape[KEX_MAX_DIMS];
  uint32_t device;
  uint64_t total, got, reserved;
  uint8_t *bytes;          /* cap bytes, grown as chunks arrive (never past total) */
  uint64_t cap;
  kexd_work work;
} upload;

static void upload_free(upload *u) {
  kexd_job *job = u->reserved ? kexd_jobs_find_id(&u->d->jobs, u->job) : NULL;
  if (job) kexd_job_unreserve(job, u->reserved);
  kex_free(u->bytes);
  kex_free(u);
}

/* End the call with an error, count it, free u. */
static void upload_fail(upload *u, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void upload_fail(upload *u, int status, const char *fmt, ...) {
  char msg[KEX_ERROR_MSG_MAX];
  KEX_VFORMAT(msg, fmt);
  u->d->upload_errors++;
  kex_log(KEX_LOG_INFO, u->job ? u->log_id : NULL, 0, "Upload refused: %s", msg);
  kexd_call_finish(u->call, status, msg, NULL);
  upload_free(u);
}

static void upload_cancelled(kexd_call *c, void *ud) {
  upload *u = ud;
  (void)c;
  u->dead = true;
  if (!u->reading && !u->on_device) upload_free(u);
}

/* The buffer is on the device (or the device refused it): hand out the handle. */
static void upload_on_device(kexd_work *w) {
  upload *u = w->ud;
  kexd *d = u->d;
  kexd_call *c = u->call;
  kexd_job *job = kexd_jobs_find_id(&d->jobs, u->job);
  kexd_buffer *b;
  int rc;
  u->on_device = false;
  if (job) kexd_job_unreserve(job, u->reserved);
  u->reserved = 0;
  kex_free(u->bytes);
  u->bytes = NULL;
  if (w->rc < 0) {
    if (u->dead) upload_free(u);
    else upload_fail(u, kex_err_grpc_status(w->rc), "Upload: %s", w->err.msg[0] ? w->err.msg : kex_strerror(w->rc));
  } else if (u->dead || !job) {
    kexd_jobs_free_device_buffer(&d->jobs, w->out_buf, u->device, u->job, w->weight);
    if (u->dead) upload_free(u);
    else upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed while its buffer was being uploaded");
  } else if ((rc = kexd_job_add_buffer(&d->jobs, job, w->out_buf, u->device, u->dtype, u->shape, u->ndim, u->total,
                                       &b)) < 0) {
    kexd_jobs_free_device_buffer(&d->jobs, w->out_buf, u->device, u->job, w->weight);
    upload_fail(u, kex_err_grpc_status(rc), "Upload: cannot record the buffer: %s", kex_strerror(rc));
  } else {
    Kex__V1__UploadReply r = KEX__V1__UPLOAD_REPLY__INIT;
    r.handle = b->handle;
    r.bytes = b->bytes;
    d->uploads++;
    kex_log(KEX_LOG_DEBUG, u->log_id, 0, "Upload: %" PRIu64 " bytes as the job's buffer %u on %s (no handle: a secret)",
            b->bytes, b->slot, d->cfg.devices[u->device]);
    kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
    upload_free(u);
  }
  kexd_call_unref(c); /* the device item's reference */
}

/* The header: check dtype, shape, device and the job's memory limit; reserve and allocate.  0 or the call is ended. */
static int upload_header(upload *u, kexd_job *job, const Kex__V1__UploadHeader *h) {
  const kex_limits *lim = &u->d->cfg.limits;
  uint32_t maxd = lim->max_dims < KEX_MAX_DIMS ? lim->max_dims : KEX_MAX_DIMS;
  uint64_t elements = 1;
  kex_error err = {0};
  int dt, dev;
  if (!h->dtype || (dt = kex_dtype_from_name(h->dtype)) < 0) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: unknown dtype \"%.64s\"", h->dtype ? h->dtype : "");
    return -1;
  }
  if (h->n_shape > maxd) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "Upload: shape has %zu dims, more than the limit of %u (--max-dims)", h->n_shape, maxd);
    return -1;
  }
  for (size_t i = 0; i < h->n_shape; i++) {
    if (h->shape[i] < 0) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: shape dim %zu is %" PRId64 ", negative", i, h->shape[i]);
      return -1;
    }
    if (h->shape[i] && elements > (uint64_t)lim->max_elements / (uint64_t)h->shape[i]) {
      upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: shape has more than the limit of %" PRId64
                  " elements (--max-elements)", lim->max_elements);
      return -1;
    }
    elements *= (uint64_t)h->shape[i];
    u->shape[i] = h->shape[i];
  }
  if ((dev = kexd_rpc_device_index(u->d, h->device)) < 0) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: device \"%.64s\" is not one of this kexd's devices",
                h->device);
    return -1;
  }
  u->dtype = (kex_dtype)dt;
  u->ndim = (uint8_t)h->n_shape;
  u->device = (uint32_t)dev;
  u->total = elements * (uint64_t)kex_dtype_size(u->dtype);
  if (u->total > (uint64_t)lim->max_buffer_bytes) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: %" PRIu64 " bytes, more than the limit of %" PRId64
                " bytes of one buffer (--max-buffer-bytes)", u->total, lim->max_buffer_bytes);
    return -1;
  }
  if (kexd_job_reserve(job, u->total, &err) < 0) {
    upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: %s", err.msg);
    return -1;
  }
  u->reserved = u->total;
  u->have_header = true;
  return 0;
}

/* All chunks are in: check the total and send the bytes to the device.  The call is ended on failure. */
static void upload_end(upload *u) {
  kexd_job *job = kexd_jobs_find_id(&u->d->jobs, u->job);
  char what[160];
  int rc;
  if (!u->have_header) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the stream ended without a header");
    return;
  }
  if (u->got != u->total) {
    describe_buffer(what, sizeof what, u->dtype, u->shape, u->ndim);
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: got %" PRIu64 " bytes, %s needs %" PRIu64, u->got, what,
                u->total);
    return;
  }
  if (!job) {
    upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed during the upload");
    return;
  }
  memset(&u->work, 0, sizeof u->work);
  u->work.kind = KEXD_WORK_UPLOAD;
  u->work.job = job->id;
  u->work.weight = job->weight;
  u->work.size = u->total;
  u->work.src = u->bytes;
  u->work.src_size = u->total;
  u->work.done = upload_on_device;
  u->work.ud = u;
  if ((rc = kexd_dispatch_post(u->d->disp, u->device, &u->work)) < 0) {
    upload_fail(u, GRPC_STATUS_UNAVAILABLE, "Upload: the device runner is not available: %s", kex_strerror(rc));
    return;
  }
  u->on_device = true;
  kexd_call_ref(u->call);
}

static void upload_on_message(kexd_call *c, const uint8_t *msg, size_t len, int ok, void *ud) {
  upload *u = ud;
  kexd *d = u->d;
  Kex__V1__UploadRequest *m = NULL;
  kexd_job *job;
  int rc;
  u->reading = false;
  if (u->dead) {
    upload_free(u);
    return;
  }
  if (!ok) {
    upload_fail(u, GRPC_STATUS_CANCELLED, "Upload: the stream broke");
    return;
  }
  if (!msg) {
    upload_end(u);
    return;
  }
  if (!(m = (Kex__V1__UploadRequest *)kexd_rpc_decode(d, c, &kex__v1__upload_request__descriptor, msg, len))) {
    d->upload_errors++;
    upload_free(u);
    return;
  }
  if (*m->job || !u->have_header) {
    if (!(job = kexd_rpc_need_job(d, c, m->job))) {
      d->upload_errors++;
      upload_free(u);
      goto out;
    }
    if (u->have_header && job->id != u->job) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the stream names two different jobs");
      goto out;
    }
  } else if (!(job = kexd_jobs_find_id(&d->jobs, u->job))) {
    upload_fail(u, GRPC_STATUS_NOT_FOUND, "Upload: the job was closed during the upload");
    goto out;
  } else {
    job->last_used_ms = uv_now(d->loop);
  }
  if (!u->have_header) {
    u->job = job->id;
    memcpy(u->log_id, job->log_id, sizeof u->log_id);
    if (m->part_case != KEX__V1__UPLOAD_REQUEST__PART_HEADER) {
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: the first message must carry the header (dtype, shape)");
      goto out;
    }
    if (upload_header(u, job, m->header) < 0) goto out;
  } else if (m->part_case == KEX__V1__UPLOAD_REQUEST__PART_HEADER) {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: a second header after %" PRIu64 " bytes", u->got);
    goto out;
  } else if (m->part_case == KEX__V1__UPLOAD_REQUEST__PART_CHUNK) {
    if (m->chunk.len > u->total - u->got) {
      char what[160];
      describe_buffer(what, sizeof what, u->dtype, u->shape, u->ndim);
      upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: more than the %" PRIu64 " bytes %s needs (got %" PRIu64
                  " so far, then a chunk of %zu)", u->total, what, u->got, m->chunk.len);
      goto out;
    }
    if (u->got + m->chunk.len > u->cap) { /* a header alone never makes kexd allocate the whole buffer */
      uint64_t cap = u->cap * 2 > u->got + m->chunk.len ? u->cap * 2 : u->got + m->chunk.len;
      uint8_t *nb;
      if (cap > u->total) cap = u->total;
      if (!(nb = kex_realloc(u->bytes, cap))) {
        upload_fail(u, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: out of memory for %" PRIu64 " bytes", cap);
        goto out;
      }
      u->bytes = nb;
      u->cap = cap;
    }
    if (m->chunk.len) memcpy(u->bytes + u->got, m->chunk.data, m->chunk.len);
    u->got += m->chunk.len;
  } else {
    upload_fail(u, GRPC_STATUS_INVALID_ARGUMENT, "Upload: a message with neither header nor chunk");
    goto out;
  }
  if ((rc = kexd_call_read(c, upload_on_message, u)) < 0) {
    upload_fail(u, GRPC_STATUS_INTERNAL, "Upload: cannot read the stream: %s", kex_strerror(rc));
    goto out;
  }
  u->reading = true;
out:
  kexd_rpc_free_msg(&m->base);
}

void kexd_rpc_upload(kexd_call *c, const uint8_t *req, size_t len, void *ud) {
  kexd *d = ud;
  upload *u;
  int rc;
  (void)req;
  (void)len;
  if (!(u = kex_calloc(1, sizeof *u))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Upload: out of memory");
    return;
  }
  u->d = d;
  u->call = c;
  if ((rc = kexd_call_read(c, upload_on_message, u)) < 0) {
    kex_free(u);
    kexd_call_failf(c, GRPC_STATUS_INTERNAL, "Upload: cannot read the stream: %s", kex_strerror(rc));
    return;
  }
  u->reading = true;
  kexd_call_set_hooks(c, upload_cancelled, NULL, u);
}

/*
 * One Download stream (its kexd_stream): copy a chunk out on the device's
 * runner (held), write it, repeat; the first chunk carries the dtype and
 * shape, an empty buffer is one empty chunk.  The buffer is referenced
 * throughout, so a Free or CloseJob meanwhile only frees it after, and its
 * bytes stay charged to its tenant until then (jobs.h: a client that stops
 * reading pins them against its own max_bytes, nobody else's).
 */
typedef struct download {
  kexd *d;
  kexd_stream st;
  kexd_buffer *buf;
  uint64_t job;
  uint64_t offset;
  size_t chunk;
  bool sent;           /* a chunk went out */
  uint8_t *data;
  size_t n;
  kexd_work work;
} download;

static void download_release(void *owner) {
  download *dl = owner;
  kexd_buffer_unref(&dl->d->jobs, dl->buf);
  kex_free(dl->data);
  kex_free(dl);
}

/* A chunk is back from the device: write it (a failure ends the call). */
static void download_on_copy(kexd_work *w) {
  download *dl = w->ud;
  Kex__V1__DownloadChunk m = KEX__V1__DOWNLOAD_CHUNK__INIT;
  int rc;
  if (kexd_stream_dead(&dl->st)) {
    /* the call is over: nothing to write */
  } else if (w->rc < 0) {
    kexd_stream_finish(&dl->st, kex_err_grpc_status(w->rc),
                       w->rc == KEX_ECANCELLED ? "Download: the job was closed during the download"
                       : w->err.msg[0]         ? w->err.msg
                                               : kex_strerror(w->rc),
                       NULL);
  } else {
    m.offset = dl->offset;
    m.data.data = dl->data;
    m.data.len = dl->n;
    if (dl->offset == 0) {
      m.dtype = (char *)kex_dtypes[dl->buf->dtype].name;
      m.n_shape = dl->buf->ndim;
      m.shape = dl->buf->shape;
      m.total_bytes = dl->buf->bytes;
    }
    if ((rc = kexd_stream_write(&dl->st, &m.base)) < 0)
      kexd_stream_failf(&dl->st, GRPC_STATUS_INTERNAL, "Download: cannot send a chunk: %s", kex_strerror(rc));
    dl->offset += dl->n;
    dl->sent = true;
  }
  kex_free(dl->data); /* packed by the write */
  dl->data = NULL;
  kexd_stream_unhold(&dl->st);
}

/* The last chunk is written: OK; else copy the next one out (kexd_stream_ops.drained). */
static void download_next(void *owner) {
  download *dl = owner;
  kexd_job *job = kexd_jobs_find_id(&dl->d->jobs, dl->job);
  int rc;
  if (dl->sent && dl->offset >= dl->buf->bytes) {
    dl->d->downloads++;
    return kexd_stream_finish(&dl->st, GRPC_STATUS_OK, NULL, NULL);
  }
  if (!job) return kexd_stream_failf(&dl->st, GRPC_STATUS_NOT_FOUND, "Download: the job was closed during the download");
  dl->n = dl->buf->bytes - dl->offset < dl->chunk ? (size_t)(dl->buf->bytes - dl->offset) : dl->chunk;
  if (!(dl->data = kex_malloc(dl->n ? dl->n : 1)))
    return kexd_stream_failf(&dl->st, GRPC_STATUS_RESOURCE_EXHAUSTED, "Download: out of memory for a %zu-byte chunk",
                             dl->n);
  memset(&dl->work, 0, sizeof dl->work);
  dl->work.kind = KEXD_WORK_COPY_OUT;
  dl->work.job = job->id;
  dl->work.weight = job->weight;
  dl->work.buf = dl->buf->dev_buf;
  dl->work.offset = dl->offset;
  dl->work.size = dl->n;
  dl->work.dst = dl->data;
  dl->work.done = download_on_copy;
  dl->work.ud = dl;
  kexd_stream_hold(&dl->st);
  if (dl->n == 0) { /* an empty buffer: one empty chunk, nothing to copy */
    dl->work.rc = 0;
    download_on_copy(&dl->work);
    return;
  }
  if ((rc = kexd_dispatch_post(dl->d->disp, dl->buf->device, &dl->work)) < 0) {
    kexd_stream_failf(&dl->st, GRPC_STATUS_UNAVAILABLE, "Download: the device runner is not available: %s",
                      kex_strerror(rc));
    kexd_stream_unhold(&dl->st);
  }
}

static const kexd_stream_ops download_ops = {"Download", NULL, download_next, NULL, download_release};

void kexd_rpc_download(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__DownloadRequest *m = rq->msg;
  kexd_job *job = rq->job;
  kexd_buffer *b;
  download *dl;
  size_t max_chunk = KEXD_DOWNLOAD_CHUNK;
  if (m->chunk_bytes && m->chunk_bytes < d->cfg.download_chunk_min) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "Download: chunk_bytes %u is under the server's minimum of %u bytes (--download-chunk-min; 0 "
                    "asks for the default)",
                    m->chunk_bytes, d->cfg.download_chunk_min);
    return;
  }
  if (!(b = kexd_job_find_buffer(job, m->handle))) {
    kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "Download: job '%s' holds no buffer \"%.40s\"", job->name, m->handle);
    return;
  }
  if (!(dl = kex_calloc(1, sizeof *dl))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Download: out of memory");
    return;
  }
  /* room for the chunk's other fields under --max-message */
  if (d->cfg.max_message > 8192 && (size_t)d->cfg.max_message - 4096 < max_chunk) max_chunk = (size_t)d->cfg.max_message - 4096;
  dl->d = d;
  dl->buf = b;
  dl->job = job->id;
  dl->chunk = m->chunk_bytes && m->chunk_bytes < max_chunk ? m->chunk_bytes : max_chunk;
  kexd_buffer_ref(b);
  kexd_stream_start(&dl->st, d->streams, c, &download_ops, dl);
  kexd_stream_pump(&dl->st);
}

void kexd_rpc_free(kexd *d, kexd_call *c, kexd_req *rq) {
  Kex__V1__FreeRequest *m = rq->msg;
  Kex__V1__FreeReply r = KEX__V1__FREE_REPLY__INIT;
  kexd_job *job = rq->job;
  if (m->n_handles > job->max_buffers) { /* it cannot hold that many: refused before any lookup */
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "Free: %zu handles, more than job '%s' may hold (%u, "
                    "--max-buffers-per-job); nothing freed", m->n_handles, job->name, job->max_buffers);
    return;
  }
  for (size_t i = 0; i < m->n_handles; i++) /* all or nothing: check every handle first */
    if (!kexd_job_find_buffer(job, m->handles[i])) {
      kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "Free: job '%s' holds no buffer \"%.40s\" (handle %zu); nothing freed",
                      job->name, m->handles[i], i);
      return;
    }
  for (size_t i = 0; i < m->n_handles; i++)
    if (kexd_job_free_buffer(&d->jobs, job, m->handles[i]) == 0) r.freed++; /* a repeated handle counts once */
  kexd_call_finish(c, GRPC_STATUS_OK, NULL, &r.base);
}

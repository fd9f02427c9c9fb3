/*
 * compile.c - Submit's programs that are not loaded: one pool job reads
 * them from the SQLite program cache, the rest are compiled on the worker
 * pool in each device's compile slots, taken in turn by the waiting
 * submissions (submit.c's opening comment).  Each device's compile probe
 * (identity, dtypes) is shared by the pool's threads behind a lock; SQLite
 * is reached through the connection of the pool thread a job runs on
 * (kexd_cache_conn, search/cache.h's policy).
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/submit.h"

/*
 * Open a compile instance of configured device `name` (wrapped by
 * --test-fault's device when asked).  0, or a negative code with msg[cap]
 * saying why.
 */
static int open_compile_device(kexd_submitter *S, const char *name, kex_device **out, char *msg, size_t cap) {
  kex_error oe = {0};
  kex_device *dev = NULL;
  int rc = kex_device_open(name, &dev, &oe);
  if (!rc && S->fault_kind >= 0) { /* --test-fault: the compile device fails on purpose */
    kex_device *f = NULL;
    rc = kex_fault_device_new(dev, (kex_fault_kind)S->fault_kind, S->fault_n, &f);
    kex_device_unref(dev);
    dev = f;
  }
  *out = rc ? NULL : dev;
  if (rc)
    snprintf(msg, cap, "device \"%.40s\" cannot be opened: %.400s", name, oe.msg[0] ? oe.msg : kex_strerror(rc));
  return rc;
}

/* cd's probe, opened at first use (caller holds cd->lock).  NULL with *err. */
static kex_device *compile_probe(compile_dev *cd, kex_error *err) {
  if (!cd->tried) {
    cd->tried = true;
    cd->open_rc = open_compile_device(cd->S, cd->S->d->cfg.devices[cd->device], &cd->probe, cd->open_msg,
                                      sizeof cd->open_msg);
  }
  if (!cd->probe) kex_err_set(err, cd->open_rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", cd->open_msg);
  return cd->probe;
}

/* P2 on a pool thread: the device's identity and dtypes, then each needed program from SQLite; the rest are misses. */
void lookup_work(uv_work_t *req) {
  submission *s = req->data;
  kexd_submitter *S = s->d->submitter;
  compile_dev *cd = &S->compilers[s->device];
  const plan *p = s->p;
  kex_error *err = &s->pool_err;
  int rc = 0;
  uint64_t t0 = SUB_TRACE_NOW(s);
  pthread_mutex_lock(&cd->lock);
  kex_device *dev = compile_probe(cd, err);
  if (!dev) rc = err->code;
  for (int dt = 0; !rc && dt < KEX_DT_COUNT; dt++) /* a dtype the device lacks (CASTs included): refused before any compile */
    if (p->rp.dtypes >> dt & 1) rc = kex_device_check_dtype(dev, (kex_dtype)dt, err);
  if (!rc) s->dev_id = *kex_device_get_identity(dev);
  pthread_mutex_unlock(&cd->lock);
  for (uint32_t k = 0; !rc && k < p->rp.nkernels; k++) {
    const kex_plan_prog *pp = &p->rp.progs[k];
    kex_cache_program hit;
    if (!s->need[k]) continue;
    if (atomic_load(&s->cancelled)) {
      rc = kex_err_set(err, KEX_ECANCELLED, "cancelled");
      break;
    }
    kex_cache *c = kexd_cache_conn_lookup(S->d, "program cache");
    int grc = c ? kex_cache_program_get(c, pp->src, strlen(pp->src), &s->dev_id, &hit, NULL) : KEX_ENOTFOUND;
    if (grc == 0) {
      s->bins[k] = hit.binary;
      s->binlens[k] = hit.binary_len;
      s->from[k] = 1;
    } else {
      s->misses[s->nmisses++] = k;
    }
  }
  sub_span(s, "worker", "compile", "program cache: SQLite lookup", NULL, t0);
  s->pool_rc = rc;
}

/* P3 on a pool thread: compile the slot's kernel, store its binary in SQLite. */
static void slot_work(uv_work_t *req) {
  compile_slot *sl = req->data;
  compile_dev *cd = sl->cd;
  kexd_submitter *S = cd->S;
  submission *s = sl->s;
  uint32_t k = sl->k;
  const kex_plan_prog *pp = &s->p->rp.progs[k];
  char m[KEX_ERROR_MSG_MAX];
  double t0 = kexd_now_us();
  kex_device *dev;
  int rc;
  if (atomic_load(&s->cancelled)) {
    sl->rc = kex_err_set(&sl->err, KEX_ECANCELLED, "cancelled");
    return;
  }
  pthread_mutex_lock(&cd->lock); /* P2 opened the probe before any compile of this device */
  dev = cd->probe && kex_device_get_info(cd->probe)->compile_thread_safe ? cd->probe : NULL;
  pthread_mutex_unlock(&cd->lock);
  if (!dev) { /* a device whose compiles must not overlap: the slot's own instance */
    if (!sl->dev && (rc = open_compile_device(S, S->d->cfg.devices[cd->device], &sl->dev, m, sizeof m)) < 0) {
      sl->rc = kex_err_set(&sl->err, rc == KEX_ENOMEM ? KEX_ENOMEM : KEX_EUNAVAILABLE, "%s", m);
      return;
    }
    dev = sl->dev;
  }
  uint64_t tc = SUB_TRACE_NOW(s);
  rc = kex_device_compile(dev, pp->src, pp->name, &s->bins[k], &s->binlens[k], &sl->err);
  if (s->trace) {
    char track[48];
    snprintf(track, sizeof track, "compile slot %u", (unsigned)(sl - cd->slots));
    sub_span(s, track, "compile", pp->name, rc < 0 ? "failed" : NULL, tc);
  }
  if (rc < 0) {
    snprintf(m, sizeof m, "%s", sl->err.msg);
    sl->rc = kex_err_set(&sl->err, rc, "compiling kernel %u (%s): %s", k, pp->name, m);
    return;
  }
  s->from[k] = 2;
  s->compile_us[k] = kexd_now_us() - t0;
  kex_cache *c = kexd_cache_conn_lookup(S->d, "program cache");
  if (c) {
    kex_error pe = {0};
    if (kex_cache_program_put(c, pp->src, strlen(pp->src), &s->dev_id, pp->name, s->bins[k], s->binlens[k], &pe) < 0)
      KEX_WARN("program cache: cannot store %s: %s", pp->name, pe.msg);
  }
}

static void slot_after(uv_work_t *req, int status);

static void wait_push(compile_dev *cd, submission *s) {
  s->wait_next = NULL;
  s->waiting = true;
  if (cd->wait_tail) cd->wait_tail->wait_next = s;
  else cd->wait_head = s;
  cd->wait_tail = s;
}

void wait_remove(compile_dev *cd, submission *s) {
  submission **pp = &cd->wait_head, *prev = NULL;
  while (*pp && *pp != s) prev = *pp, pp = &(*pp)->wait_next;
  if (!*pp) return;
  *pp = s->wait_next;
  if (cd->wait_tail == s) cd->wait_tail = prev;
  s->wait_next = NULL;
  s->waiting = false;
}

/* Every compile of s is back and no other will start: go on to the device, or fail. */
void compile_end(submission *s) {
  if (kexd_stream_dead(&s->st)) return sub_fail(s, GRPC_STATUS_CANCELLED, "Submit: cancelled");
  if (s->pool_rc < 0) return sub_fail_rc(s, s->pool_rc, &s->pool_err);
  sub_post(s);
}

/*
 * Give cd's free slots to waiting submissions: the first that holds no
 * slot, else the head of the line; one kernel each, then it goes to the
 * back.  A submission that failed or was cancelled leaves the line and
 * ends once its compiles in flight are back.
 */
static void compile_pump(compile_dev *cd) {
  kexd *d = cd->S->d;
  while (cd->busy < cd->nslots && cd->wait_head) {
    submission *s = cd->wait_head;
    compile_slot *sl = NULL;
    for (submission *t = cd->wait_head; t; t = t->wait_next)
      if (!t->compiling) {
        s = t;
        break;
      }
    wait_remove(cd, s);
    if (kexd_stream_dead(&s->st) || s->pool_rc < 0) {
      if (!s->compiling) compile_end(s);
      continue;
    }
    for (uint32_t i = 0; i < cd->nslots && !sl; i++)
      if (!cd->slots[i].s) sl = &cd->slots[i];
    if (!sl) break; /* cannot be: busy < nslots */
    sl->s = s;
    sl->k = s->misses[s->next_miss];
    sl->rc = 0;
    memset(&sl->err, 0, sizeof sl->err);
    sl->work.data = sl;
    if (uv_queue_work(d->loop, &sl->work, slot_work, slot_after) < 0) {
      sl->s = NULL;
      s->pool_rc = kex_err_set(&s->pool_err, KEX_EUNAVAILABLE, "the worker pool is not available");
      if (!s->compiling) compile_end(s);
      continue;
    }
    s->next_miss++;
    s->compiling++;
    kexd_stream_ref(&s->st); /* the compile's, dropped by slot_after */
    cd->busy++;
    if (s->next_miss < s->nmisses) wait_push(cd, s);
  }
}

static void slot_after(uv_work_t *req, int status) {
  compile_slot *sl = req->data;
  compile_dev *cd = sl->cd;
  submission *s = sl->s;
  sl->s = NULL;
  cd->busy--;
  s->compiling--;
  if (status < 0 && !sl->rc) sl->rc = kex_err_set(&sl->err, KEX_EINTERNAL, "the worker pool dropped the job");
  if (!sl->rc) cd->S->d->prog_cache_misses++;
  else if (!s->pool_rc || (s->pool_rc == KEX_ECANCELLED && sl->rc != KEX_ECANCELLED)) {
    s->pool_rc = sl->rc;
    s->pool_err = sl->err;
  }
  if (!s->compiling && (kexd_stream_dead(&s->st) || s->pool_rc < 0 || s->next_miss == s->nmisses)) {
    if (s->waiting) wait_remove(cd, s);
    compile_end(s);
  }
  compile_pump(cd);
  kexd_stream_unref(&s->st); /* the compile's: may free s */
}

void lookup_after(uv_work_t *req, int status) {
  submission *s = req->data;
  kexd *d = s->d;
  if (status < 0 && !s->pool_rc) s->pool_rc = kex_err_set(&s->pool_err, KEX_EINTERNAL, "the worker pool dropped the job");
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++)
    if (s->from[k] == 1) d->prog_cache_sqlite_hits++;
  if (kexd_stream_dead(&s->st) || s->pool_rc < 0 || !s->nmisses) {
    compile_end(s);
  } else {
    compile_dev *cd = &d->submitter->compilers[s->device];
    wait_push(cd, s);
    compile_pump(cd);
  }
  kexd_stream_unref(&s->st); /* the lookup's: may free s */
}

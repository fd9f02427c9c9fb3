/*
 * jobs.c - the job table: tokens from getrandom(2), lookup, lease expiry.
 *
 * Jobs are few (at most max_jobs), so the table is an unordered array and a
 * lookup compares the token with every job's in constant time per entry (no
 * early exit on the first differing byte).  The lease sweep runs on a uv
 * timer a few times per lease (at least every second) and closes every job
 * whose last call is older than the lease.  Loop thread only.
 */
#include "daemon/jobs.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"

#define JOBS_SWEEP_MIN_MS 100
#define JOBS_SWEEP_MAX_MS 1000

static void job_free(kexd_job *job) {
  if (!job) return;
  kex_free(job->name);
  kex_free(job);
}

/* Remove jobs[i] (order is not kept). */
static void jobs_remove(kexd_jobs *j, uint32_t i) {
  job_free(j->jobs[i]);
  j->jobs[i] = j->jobs[--j->njobs];
}

static void on_sweep(uv_timer_t *t) {
  kexd_jobs *j = t->data;
  uint64_t now = uv_now(j->loop), lease_ms = (uint64_t)(j->lease_s * 1000);
  for (uint32_t i = 0; i < j->njobs;) {
    kexd_job *job = j->jobs[i];
    if (now - job->last_used_ms >= lease_ms) {
      kex_log(KEX_LOG_INFO, job->log_id, 0, "job \"%s\" expired: idle for %.1f s (lease %.1f s)", job->name,
              (now - job->last_used_ms) / 1e3, j->lease_s);
      j->expired++;
      jobs_remove(j, i);
    } else {
      i++;
    }
  }
}

int kexd_jobs_init(kexd_jobs *j, uv_loop_t *loop, double lease_s, uint32_t max_jobs) {
  uint64_t period;
  memset(j, 0, sizeof *j);
  j->loop = loop;
  j->lease_s = lease_s;
  j->max_jobs = max_jobs ? max_jobs : KEXD_LIMIT_JOBS;
  if (uv_timer_init(loop, &j->timer) < 0) return KEX_EINTERNAL;
  j->timer.data = j;
  j->timer_open = true;
  period = (uint64_t)(lease_s * 1000 / 4);
  if (period < JOBS_SWEEP_MIN_MS) period = JOBS_SWEEP_MIN_MS;
  if (period > JOBS_SWEEP_MAX_MS) period = JOBS_SWEEP_MAX_MS;
  uv_timer_start(&j->timer, on_sweep, period, period);
  return 0;
}

void kexd_jobs_close(kexd_jobs *j) {
  while (j->njobs) jobs_remove(j, j->njobs - 1);
  kex_free(j->jobs);
  j->jobs = NULL;
  j->cap = 0;
  if (j->timer_open) {
    j->timer_open = false;
    uv_close((uv_handle_t *)&j->timer, NULL);
  }
}

/* 0 when the two tokens are equal; the time does not depend on where they differ. */
static int token_cmp(const char *a, const char *b) {
  unsigned char d = 0;
  for (size_t i = 0; i < KEXD_TOKEN_LEN; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d;
}

static int find_index(const kexd_jobs *j, const char *token) {
  int found = -1;
  if (!token || strlen(token) != KEXD_TOKEN_LEN) return -1;
  for (uint32_t i = 0; i < j->njobs; i++)
    if (token_cmp(j->jobs[i]->token, token) == 0) found = (int)i;
  return found;
}

int kexd_jobs_open(kexd_jobs *j, const char *name, uint32_t weight, uint64_t memory_limit, kexd_job **out) {
  static const char hex[] = "0123456789abcdef";
  unsigned char raw[KEXD_TOKEN_BYTES];
  kexd_job *job = NULL;
  size_t got = 0;
  int rc = 0;
  *out = NULL;
  if (!name) name = "";
  if (strlen(name) > KEXD_JOB_NAME_MAX) return KEX_EINVAL;
  if (j->njobs >= j->max_jobs) return KEX_ELIMIT;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return KEX_EIO;
    got += (size_t)n;
  }
  if (j->njobs == j->cap) {
    uint32_t cap = j->cap ? 2 * j->cap : 16;
    kexd_job **nj = kex_realloc(j->jobs, cap * sizeof *nj);
    if (!nj) return KEX_ENOMEM;
    j->jobs = nj;
    j->cap = cap;
  }
  if (!(job = kex_calloc(1, sizeof *job)) || !(job->name = kex_strdup(name))) {
    rc = KEX_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < sizeof raw; i++) {
    job->token[2 * i] = hex[raw[i] >> 4];
    job->token[2 * i + 1] = hex[raw[i] & 15];
  }
  job->token[KEXD_TOKEN_LEN] = '\0';
  memcpy(job->log_id, job->token, 8);
  job->log_id[8] = '\0';
  if (find_index(j, job->token) >= 0) { /* 2^-128: believed impossible */
    rc = KEX_EINTERNAL;
    goto out;
  }
  job->weight = weight ? weight : 1;
  job->memory_limit = memory_limit;
  job->opened_ms = job->last_used_ms = uv_now(j->loop);
  j->jobs[j->njobs++] = job;
  j->opened++;
  *out = job;
  job = NULL;
out:
  job_free(job);
  memset(raw, 0, sizeof raw);
  return rc;
}

kexd_job *kexd_jobs_find(kexd_jobs *j, const char *token) {
  int i = find_index(j, token);
  if (i < 0) return NULL;
  uv_update_time(j->loop);
  j->jobs[i]->last_used_ms = uv_now(j->loop);
  return j->jobs[i];
}

int kexd_jobs_close_job(kexd_jobs *j, const char *token) {
  int i = find_index(j, token);
  if (i < 0) return KEX_ENOTFOUND;
  kex_log(KEX_LOG_INFO, j->jobs[i]->log_id, 0, "job \"%s\" closed", j->jobs[i]->name);
  j->closed++;
  jobs_remove(j, (uint32_t)i);
  return 0;
}

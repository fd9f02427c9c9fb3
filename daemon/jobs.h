/*
 * jobs.h - jobs (tenants): tokens, leases, counters.
 *
 * A job is opened with a name, a weight and a memory limit and is named in
 * every later call by an unguessable token (128 bits from getrandom(2), as
 * 32 hex characters).  Any call that names a job renews its lease; a uv timer
 * closes jobs idle past their lease.  Loop thread only.
 */
#ifndef KEX_DAEMON_JOBS_H
#define KEX_DAEMON_JOBS_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define KEXD_TOKEN_BYTES 16                      /* random bytes per token */
#define KEXD_TOKEN_LEN (2 * KEXD_TOKEN_BYTES)    /* hex characters */
#define KEXD_JOB_NAME_MAX 256                    /* bytes of a job name */
#define KEXD_LIMIT_JOBS 4096                     /* default: jobs open at once */

typedef struct kexd_job {
  char token[KEXD_TOKEN_LEN + 1];
  char log_id[9];        /* the token's first 8 characters: logs never carry the whole token */
  char *name;
  uint32_t weight;
  uint64_t memory_limit;
  uint64_t last_used_ms; /* uv_now at the last call naming the job */
  uint64_t opened_ms;
  uint64_t plans;
} kexd_job;

typedef struct kexd_jobs {
  uv_loop_t *loop;
  uv_timer_t timer;  /* lease sweep */
  bool timer_open;
  double lease_s;
  uint32_t max_jobs;
  kexd_job **jobs;   /* unordered; small counts, linear lookup */
  uint32_t njobs, cap;
  uint64_t opened, closed, expired;
} kexd_jobs;

/* Set up (and start the lease timer).  0 or a negative code. */
int kexd_jobs_init(kexd_jobs *j, uv_loop_t *loop, double lease_s, uint32_t max_jobs);
/* Close every job and the timer (asynchronously: the loop runs its close callback). */
void kexd_jobs_close(kexd_jobs *j);
/*
 * Open a job.  name may be empty.  On success *out points to the job (owned
 * by j).  KEX_ELIMIT when max_jobs are open, KEX_EINVAL for a name over
 * KEXD_JOB_NAME_MAX, KEX_EIO when getrandom fails, KEX_ENOMEM.
 */
int kexd_jobs_open(kexd_jobs *j, const char *name, uint32_t weight, uint64_t memory_limit, kexd_job **out);
/* The job with this token, its lease renewed; NULL when unknown. */
kexd_job *kexd_jobs_find(kexd_jobs *j, const char *token);
/* Close the job with this token.  0 or KEX_ENOTFOUND. */
int kexd_jobs_close_job(kexd_jobs *j, const char *token);

#endif

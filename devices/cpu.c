/*
 * cpu.c - the C backend: C source -> the system compiler -> a shared
 * object -> dlopen, run on a thread pool.
 *
 * compile() writes the source to a file in the device's own mkdtemp
 * directory and runs `cc <flags> -x c - -o <unique>.so -lm` with
 * posix_spawnp, the source on its stdin and its stdout+stderr in a log file
 * that becomes the error message when the compiler fails; the .so bytes are
 * the binary.  load() writes a binary to a new, never reused file name
 * (dlopen caches by path), dlopens it, unlinks the file and dlsyms the
 * kernel.  Temporary files never outlive the call that made them, and the
 * directory goes with the device.
 *
 * Kernels have the signature (device.h):
 *   void name(void **bufs, const int *ints, int gidx_start, int gidx_end);
 * A launch has one helper per CPU the process may run on (no more than
 * the process's pool has workers): helpers are jobs on the process's pool
 * (core/pool.h), each pinned to its CPU while it helps, and go back to the
 * pool when no launch came for KEX_CPU_WORKER_SPIN_S.  A launch splits
 * [0, global[0]) into contiguous ranges, about KEX_CPU_CHUNKS_PER_THREAD
 * per helper, that the helpers claim from an atomic counter (the launching
 * thread too, until they have all joined: a helper queued behind other
 * pool work is never waited for, its ranges run here), and returns when
 * all ranges ran -- not when every helper has been round:
 * a worker whose CPU is busy with another process may wake a scheduler
 * slice (milliseconds) late, and then finds nothing left to claim.  The
 * counter carries the launch's tag beside the next index, so such a late
 * worker can never claim a range of a later launch with its copy of an
 * earlier one's job (kex_cpu_claim).  Its event holds the wall time.  The
 * launching thread runs the first range itself, and the rest too when they
 * would all take less than waking the helpers (a tiny kernel, judged by the
 * program's smallest time per index so far, so that one program runs one
 * way, whatever the load).  With KEX_CPU_THREADS=1 (or one CPU) there are
 * no helpers and the launching thread runs the kernel.
 * Buffers are ordinary host memory, 64-byte aligned; from 2 MiB on they
 * start on a 2 MiB boundary and ask for transparent huge pages
 * (kex_cpu_alloc).
 *
 * The flags (cpu->flags, made once at open) are KEX_CPU_FLAGS and the
 * instruction-set level of this CPU (kex_cpu_isa_flags: on x86-64 the
 * highest of -march=x86-64-v2/v3/v4 whose features /proc/cpuinfo lists),
 * so gcc vectorizes kernels with the widest vectors and FMA the CPU has.  A
 * binary built so runs only on a CPU with that level: the flags are part of
 * the device identity (compiler_version), which keys the program and beam
 * caches, so a cache file taken to another machine never loads one there.
 *
 * The kernel time limit (kex_device_set_kernel_time_limit): whoever claims a
 * range first reads the clock, and past the launch's deadline nobody claims
 * another, so a launch ends at most one range after its limit and fails
 * with KEX_EDEADLINE (without helpers the launching thread then runs the
 * kernel in the same pieces, checking the clock between them).  Code that
 * is running cannot be stopped: that is the one range's delay.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "core/alloc.h"
#include "core/log.h"
#include "core/pool.h"
#include "devices/device_impl.h"

extern char **environ;

#define KEX_CPU_CC "cc"
#define KEX_CPU_FLAGS "-O2 -shared -fPIC" /* then the ISA flags (kex_cpu_isa_flags) */
#define KEX_CPU_FLAGS_MAX 128                /* bytes of cpu->flags */
#define KEX_CPU_ARGV_MAX 24                  /* words of the compiler's command line */
#define KEX_CPU_MAX_THREADS 256
#define KEX_CPU_LOG_MAX (64 << 10) /* bytes of compiler output kept */
#define KEX_CPU_ALIGN 64
#define KEX_CPU_HUGE_PAGE ((size_t)2 << 20) /* buffers this large start on a (transparent) huge page */
#define KEX_CPU_WORKER_SPIN_S 100e-6  /* a helper spins this long for the next launch before leaving */
#define KEX_CPU_LAUNCHER_SPIN_S 20e-6 /* the launching thread spins this long for the end before sleeping */
#define KEX_CPU_CHUNKS_PER_THREAD 16 /* a launch is split into this many pieces per worker */
#define KEX_CPU_INLINE_S 5e-6 /* a launch whose ranges take less than this in all runs on the launching thread */

typedef void (*kex_cpu_kernel_fn)(void **bufs, const int *ints, int gidx_start, int gidx_end);

/* One launch: fn over indexes 0..total-1 in nranges ranges of chunk. */
typedef struct kex_cpu_job {
  kex_cpu_kernel_fn fn;
  void **bufs;
  const int *ints;
  int total, chunk, nranges;
  uint32_t tag;    /* the launch's tag in pool->claim */
  double deadline; /* monotonic seconds; 0: no time limit */
} kex_cpu_job;

typedef struct kex_cpu_pool kex_cpu_pool;

/* One helper: a job on the process's pool while active. */
typedef struct kex_cpu_helper {
  kex_pool_job job;
  kex_cpu_pool *pool;
  int cpu;            /* pinned there while helping (-1: not pinned) */
  bool active;        /* under mu: queued or running (then it sees every new generation) */
  unsigned long seen; /* under mu: the last generation it took */
} kex_cpu_helper;

struct kex_cpu_pool {
  pthread_mutex_t mu;
  pthread_cond_t left, done; /* a helper left; the launch's ranges all ran */
  kex_pool *workers;         /* the process's pool */
  kex_cpu_helper helpers[KEX_CPU_MAX_THREADS];
  int nthreads;            /* helpers (0: launches run on the launching thread) */
  atomic_ulong generation; /* bumped (under mu) once per launch that uses the helpers */
  int stop;
  kex_cpu_job job;     /* the job of the current generation (read under mu) */
  uint32_t tag;        /* the last launch's tag (the launching thread's own) */
  atomic_ullong claim; /* (tag << 32) | the first index no thread has claimed yet */
  atomic_int finished; /* ranges of the current launch that ran */
  atomic_int target;   /* the launching thread is woken when finished reaches it: nranges, or what was claimed
                          before the deadline closed the launch */
  atomic_int joined;   /* helpers that took the current generation's job */
};

#define KEX_CPU_DIR_MAX 1024 /* bytes of the temp directory path; file paths stay below PATH_MAX */

typedef struct kex_cpu_device {
  char dir[KEX_CPU_DIR_MAX];
  char flags[KEX_CPU_FLAGS_MAX]; /* the compiler flags: KEX_CPU_FLAGS and the ISA's */
  atomic_ulong counter; /* makes every temporary file name unique (compile runs on any thread) */
  kex_cpu_pool pool;
  int pool_ready;
  double time_limit_s; /* 0: none (the owner thread's, like launches) */
  double compile_limit_s; /* 0: none (set before the first compile, read by every compile) */
  bool serial;         /* serial timing (kex_device_set_serial_timing; the owner thread's) */
} kex_cpu_device;

typedef struct kex_cpu_buffer {
  unsigned char *data; /* KEX_CPU_ALIGN-aligned, inside the same allocation */
} kex_cpu_buffer;

typedef struct kex_cpu_program {
  void *handle;
  kex_cpu_kernel_fn fn;
  double item_s; /* the smallest time per index of a launch's first range so far (INFINITY before any): the
                    launch mode (kex_cpu_pool_run) */
} kex_cpu_program;

typedef struct kex_cpu_event {
  double seconds;
} kex_cpu_event;

static double kex_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- thread pool ---- */

/*
 * Claim the next range of launch j: its first index in *start, 1; or 0
 * when none is left or the counter is no longer j's (j ended, and a later
 * launch, or none, owns it).  A compare-and-swap, not a fetch-and-add: a
 * late worker must not move a later launch's counter.
 */
static int kex_cpu_claim(kex_cpu_pool *pool, const kex_cpu_job *j, int *start) {
  unsigned long long v = atomic_load_explicit(&pool->claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(v >> 32) != j->tag || (uint32_t)v >= (uint32_t)j->total) return 0;
    if (atomic_compare_exchange_weak_explicit(&pool->claim, &v, v + (uint32_t)j->chunk, memory_order_acq_rel,
                                              memory_order_acquire)) {
      *start = (int)(uint32_t)v;
      return 1;
    }
  }
}

/*
 * Claim and run ranges of launch j until none is left, `max` of them at
 * most (or, with a deadline, until it has passed).  The index space is
 * handed out in `chunk`-sized pieces from the atomic counter, so a thread
 * that wakes late or shares its core with another process simply claims
 * fewer.  Whoever finishes the range that brings pool->finished to
 * pool->target wakes the launching thread (under mu: it checks and sleeps
 * under mu).  The claim keeps j current until its range is counted, so
 * j's buffers (the launching thread's) outlive every range of it.
 */
static int kex_cpu_run_chunks(kex_cpu_pool *pool, const kex_cpu_job *j, int max) {
  int start, n;
  for (n = 0; n < max; n++) {
    if (j->deadline > 0 && kex_cpu_now() > j->deadline) break;
    if (!kex_cpu_claim(pool, j, &start)) break;
    j->fn(j->bufs, j->ints, start, start + j->chunk < j->total ? start + j->chunk : j->total);
    if (atomic_fetch_add(&pool->finished, 1) + 1 >= atomic_load(&pool->target)) {
      pthread_mutex_lock(&pool->mu);
      pthread_cond_signal(&pool->done);
      pthread_mutex_unlock(&pool->mu);
    }
  }
  return n;
}

static inline void kex_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/*
 * Spin up to `seconds` until *v differs from `from` (returns 1) or not
 * (0).  A sleeping thread takes 10-30 µs to wake in a VM; an empty launch
 * over two workers cost ~38 µs when both sides slept.
 */
static int kex_cpu_spin_ulong(atomic_ulong *v, unsigned long from, double seconds) {
  double end = kex_cpu_now() + seconds;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (atomic_load_explicit(v, memory_order_acquire) != from) return 1;
      kex_cpu_relax();
    }
    if (kex_cpu_now() > end) return 0;
    sched_yield(); /* a spinning thread may share its core with the one it waits for */
  }
}

static int kex_cpu_spin_reach(atomic_int *v, int to, double seconds) {
  double end = kex_cpu_now() + seconds;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (atomic_load_explicit(v, memory_order_acquire) >= to) return 1;
      kex_cpu_relax();
    }
    if (kex_cpu_now() > end) return 0;
    sched_yield();
  }
}

/* Pin this thread to cpu (-1: leave it), keeping its mask in *was; false when it was not pinned. */
static bool kex_cpu_pin(int cpu, cpu_set_t *was) {
  if (cpu < 0 || sched_getaffinity(0, sizeof *was, was) != 0) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

/*
 * A helper, on a worker of the process's pool: take each new launch's job
 * and claim its ranges; when no launch came for KEX_CPU_WORKER_SPIN_S,
 * leave (inactive, under mu: the next launch submits it again) and give
 * the worker back, its CPU mask as it was.  Pinned to its CPU meanwhile:
 * unpinned, a helper woken by the launching thread is placed on the
 * waker's core (wake-affine) and often stays there, so a launch on two
 * cores ran at one core's speed in about half of the processes (sum of 4M
 * floats: 1.1-1.5 ms in those, 0.64 ms in the others).
 */
static void kex_cpu_help(kex_pool_job *pj, int worker) {
  (void)worker;
  kex_cpu_helper *h = (kex_cpu_helper *)pj;
  kex_cpu_pool *pool = h->pool;
  cpu_set_t was;
  bool pinned = kex_cpu_pin(h->cpu, &was);
  pthread_mutex_lock(&pool->mu);
  unsigned long seen = h->seen;
  for (;;) {
    if (!pool->stop && pool->generation == seen) {
      /* launches often come back to back: spin a while before leaving */
      pthread_mutex_unlock(&pool->mu);
      kex_cpu_spin_ulong(&pool->generation, seen, KEX_CPU_WORKER_SPIN_S);
      pthread_mutex_lock(&pool->mu);
    }
    if (pool->stop || pool->generation == seen) break;
    seen = pool->generation;
    kex_cpu_job job = pool->job;
    atomic_fetch_add(&pool->joined, 1);
    pthread_mutex_unlock(&pool->mu);
    kex_cpu_run_chunks(pool, &job, INT_MAX);
    pthread_mutex_lock(&pool->mu);
  }
  h->seen = seen;
  h->active = false;
  pthread_cond_broadcast(&pool->left);
  pthread_mutex_unlock(&pool->mu); /* h and pool may be freed from here on */
  if (pinned) pthread_setaffinity_np(pthread_self(), sizeof was, &was);
}

/*
 * Up to `helpers` helpers on the process's pool (at most its size), helper
 * i pinned to the (i mod n)-th CPU of `cpus` (n of them; none pinned when
 * n is 0).
 */
static void kex_cpu_pool_start(kex_cpu_device *cpu, int helpers, const int *cpus, int n) {
  kex_cpu_pool *pool = &cpu->pool;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the launch's deadline is kex_cpu_now()'s */
  pthread_cond_init(&pool->left, NULL);
  pthread_cond_init(&pool->done, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&pool->claim, 0);
  atomic_init(&pool->finished, 0);
  atomic_init(&pool->target, 0);
  atomic_init(&pool->joined, 0);
  atomic_init(&pool->generation, 0);
  cpu->pool_ready = 1;
  if (helpers <= 0) return;
  pool->workers = kex_pool_process();
  if (helpers > kex_pool_size(pool->workers)) helpers = kex_pool_size(pool->workers);
  for (int i = 0; i < helpers; i++) {
    pool->helpers[i].pool = pool;
    pool->helpers[i].cpu = n > 0 ? cpus[i % n] : -1;
  }
  pool->nthreads = helpers;
}

/* Stop: no helper joins a launch any more; wait for the active ones to leave (a queued one never runs). */
static void kex_cpu_pool_stop(kex_cpu_device *cpu) {
  kex_cpu_pool *pool = &cpu->pool;
  if (!cpu->pool_ready) return;
  pthread_mutex_lock(&pool->mu);
  pool->stop = 1;
  for (int i = 0; i < pool->nthreads; i++) {
    kex_cpu_helper *h = &pool->helpers[i];
    if (h->active && kex_pool_cancel(pool->workers, &h->job)) h->active = false;
    while (h->active) pthread_cond_wait(&pool->left, &pool->mu);
  }
  pthread_mutex_unlock(&pool->mu);
  pthread_cond_destroy(&pool->done);
  pthread_cond_destroy(&pool->left);
  pthread_mutex_destroy(&pool->mu);
}

/*
 * Close launch j at its deadline: no range starts from now on.  Returns
 * the ranges claimed before (the ones the launching thread still waits
 * for).
 */
static int kex_cpu_close(kex_cpu_pool *pool, const kex_cpu_job *j) {
  unsigned long long v = atomic_load(&pool->claim), shut = ((unsigned long long)j->tag << 32) | UINT32_MAX;
  while (!atomic_compare_exchange_weak(&pool->claim, &v, shut)) {
  }
  uint32_t claimed = (uint32_t)v < (uint32_t)j->total ? (uint32_t)v : (uint32_t)j->total;
  return (int)((claimed + (uint32_t)j->chunk - 1) / (uint32_t)j->chunk);
}

static void kex_cpu_deadline_ts(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

/*
 * Run fn over [0, total) with the helpers, KEX_CPU_CHUNKS_PER_THREAD chunks per
 * helper, the launching thread claiming ranges too until every helper has
 * joined (or none is left), then sleeping; with no helpers, or one item,
 * the launching thread runs it all (in KEX_CPU_CHUNKS_PER_THREAD pieces when
 * there is a deadline).  The launching thread runs the first range itself
 * and, when the program's estimate is under KEX_CPU_INLINE_S (a few
 * microseconds: not worth waking the helpers), the others
 * too.  The estimate is *item_s (the program's: the smallest time per index
 * of the first range over its launches) x total: load only ever lengthens a
 * range, so the smallest is what the kernel costs, and after its first
 * launches a program runs one way only on a given grid.  The limit is low
 * because the two ways must time alike where they meet: a kernel just over
 * it runs mostly on the launching thread while the helpers come, so it
 * takes about what it would inline (at 20 us, 10-25 us kernels ran 1.7x
 * apart one way and the other, and two beam searches of one kernel landed
 * on either side).  It returns when every range ran, whichever threads ran
 * them; a worker that has not woken by then finds the launch closed (its
 * tag gone from pool->claim).  With a deadline (monotonic seconds, 0:
 * none) no range starts after it: the launching thread wakes at the
 * deadline, closes the launch and waits for the ranges already running.
 * Returns the ranges that ran; *nranges is how many the launch had.
 */
static int kex_cpu_pool_run(kex_cpu_pool *pool, kex_cpu_kernel_fn fn, void **bufs, const int *ints, int total,
                            double deadline, double *item_s, int *nranges) {
  if ((pool->nthreads == 0 && deadline <= 0) || total <= 1) {
    fn(bufs, ints, 0, total);
    *nranges = 1;
    return 1;
  }
  long long pieces = (long long)(pool->nthreads ? pool->nthreads : 1) * KEX_CPU_CHUNKS_PER_THREAD;
  int chunk = (int)((total + pieces - 1) / pieces);
  *nranges = (int)(((long long)total + chunk - 1) / chunk);
  kex_cpu_job job = {fn, bufs, ints, total, chunk, *nranges, ++pool->tag, deadline};
  atomic_store(&pool->finished, 0);
  atomic_store(&pool->target, *nranges);
  atomic_store(&pool->claim, (unsigned long long)job.tag << 32); /* earlier launches' late helpers: closed */
  /* the first range here: when all of them would take less than waking the helpers, the rest runs here too */
  double t0 = kex_cpu_now();
  kex_cpu_run_chunks(pool, &job, 1);
  double per = (kex_cpu_now() - t0) / (chunk < total ? chunk : total);
  if (per < *item_s) *item_s = per;
  if (pool->nthreads == 0 || *item_s * total < KEX_CPU_INLINE_S) {
    kex_cpu_run_chunks(pool, &job, INT_MAX);
    return atomic_load(&pool->finished);
  }
  kex_cpu_helper *wake[KEX_CPU_MAX_THREADS];
  int nwake = 0;
  pthread_mutex_lock(&pool->mu);
  pool->job = job;
  atomic_store(&pool->joined, 0);
  pool->generation++;
  for (int i = 0; i < pool->nthreads; i++)
    if (!pool->helpers[i].active) {
      pool->helpers[i].active = true;
      wake[nwake++] = &pool->helpers[i];
    }
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < nwake; i++) kex_pool_detach(pool->workers, &wake[i]->job, kex_cpu_help, true);
  /* while the helpers come (10-30 us from sleep, far more on a busy CPU or a busy pool), the ranges do not wait */
  while (atomic_load(&pool->joined) < pool->nthreads && kex_cpu_run_chunks(pool, &job, 1)) {
  }
  /* a short kernel is done before a sleeping launcher could wake up; a long one is not worth a spinning core */
  if (!kex_cpu_spin_reach(&pool->finished, *nranges, KEX_CPU_LAUNCHER_SPIN_S)) {
    struct timespec ts;
    int closed = 0;
    if (deadline > 0) kex_cpu_deadline_ts(deadline, &ts);
    pthread_mutex_lock(&pool->mu);
    while (atomic_load(&pool->finished) < atomic_load(&pool->target)) {
      if (deadline <= 0 || closed) {
        pthread_cond_wait(&pool->done, &pool->mu);
      } else if (pthread_cond_timedwait(&pool->done, &pool->mu, &ts) == ETIMEDOUT) {
        atomic_store(&pool->target, kex_cpu_close(pool, &job));
        closed = 1;
      }
    }
    pthread_mutex_unlock(&pool->mu);
  }
  return atomic_load(&pool->finished);
}

/*
 * Serial timing (kex_device_set_serial_timing): the ranges kex_cpu_pool_run
 * would make, one after another on this thread; *ideal_s gets what the
 * pool would take at best, max(their sum / its threads, the longest).  No
 * range starts after the deadline (monotonic seconds, 0: none).  Returns
 * the ranges that ran; *nranges is how many the launch had.
 */
static int kex_cpu_serial_run(const kex_cpu_pool *pool, kex_cpu_kernel_fn fn, void **bufs, const int *ints, int total,
                              double deadline, double *ideal_s, int *nranges) {
  int threads = pool->nthreads ? pool->nthreads : 1, ran = 0;
  long long pieces = (long long)threads * KEX_CPU_CHUNKS_PER_THREAD;
  int chunk = total <= 1 || pool->nthreads == 0 ? (total > 1 ? total : 1) : (int)((total + pieces - 1) / pieces);
  double sum = 0, longest = 0;
  *nranges = total <= 1 ? 1 : (int)(((long long)total + chunk - 1) / chunk);
  for (int start = 0; ran < *nranges; start += chunk) {
    double t0 = kex_cpu_now();
    if (deadline > 0 && t0 > deadline) break;
    fn(bufs, ints, start, total <= 1 ? total : start + chunk < total ? start + chunk : total);
    double t = kex_cpu_now() - t0;
    sum += t;
    if (t > longest) longest = t;
    ran++;
  }
  *ideal_s = sum / threads > longest ? sum / threads : longest;
  return ran;
}

/* ---- files and the compiler ---- */

/* "<dir>/<stem><counter>.<ext>" into out[PATH_MAX]. */
static void kex_cpu_path(kex_cpu_device *cpu, char *out, const char *stem, unsigned long id, const char *ext) {
  snprintf(out, PATH_MAX, "%s/%s%lu.%s", cpu->dir, stem, id, ext);
}

/* Write n bytes to a new file (O_EXCL). Errors: KEX_EIO. */
static int kex_cpu_write_file(const char *path, const void *data, size_t n, kex_error *err) {
  const unsigned char *p = data;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int rc = 0;
  if (fd < 0) return kex_err_set(err, KEX_EIO, "cpu: creating %s failed: %s", path, strerror(errno));
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      rc = kex_err_set(err, KEX_EIO, "cpu: writing %s failed: %s", path, strerror(errno));
      break;
    }
    p += w;
    n -= (size_t)w;
  }
  if (close(fd) < 0 && rc == 0) rc = kex_err_set(err, KEX_EIO, "cpu: closing %s failed: %s", path, strerror(errno));
  return rc;
}

/*
 * Read at most max bytes of path into a new kex_malloc'd, NUL-terminated
 * buffer (*out, owned by the caller; *n excludes the NUL).  Longer files
 * are cut when `cut` is set, else KEX_ELIMIT.  Errors: KEX_EIO, KEX_ENOMEM.
 */
static int kex_cpu_read_file(const char *path, size_t max, int cut, unsigned char **out, size_t *n,
                             kex_error *err) {
  unsigned char *buf = NULL;
  struct stat st;
  size_t size, got = 0;
  int fd, rc;

  *out = NULL;
  *n = 0;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kex_err_set(err, KEX_EIO, "cpu: opening %s failed: %s", path, strerror(errno));
  if (fstat(fd, &st) < 0) {
    rc = kex_err_set(err, KEX_EIO, "cpu: stat of %s failed: %s", path, strerror(errno));
    goto out;
  }
  size = (size_t)st.st_size;
  if (size > max) {
    if (!cut) {
      rc = kex_err_set(err, KEX_ELIMIT, "cpu: %s has %zu bytes, more than %zu", path, size, max);
      goto out;
    }
    size = max;
  }
  buf = kex_malloc(size + 1);
  if (!buf) {
    rc = kex_err_set(err, KEX_ENOMEM, "cpu: out of memory reading %zu bytes of %s", size, path);
    goto out;
  }
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = kex_err_set(err, KEX_EIO, "cpu: reading %s failed: %s", path, strerror(errno));
      goto out;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  buf[got] = 0;
  *out = buf;
  *n = got;
  buf = NULL;
  rc = 0;
out:
  kex_free(buf);
  close(fd);
  return rc;
}

#define KEX_CPU_CANCEL_POLL_S 0.1 /* how often a compile that can be cancelled looks at its flag */

/*
 * Run argv (looked up on PATH) with stdin from in_path (or /dev/null) and
 * stdout+stderr into log_path, in a process group of its own; *status is
 * the exit status (127 when the program could not be started, 128+signal
 * when it was killed).  Past limit_s (0: none) the group is killed and
 * *timed_out set; when *cancel (NULL: never) becomes true the group is
 * killed too (*timed_out stays false).  Errors: KEX_EIO (posix_spawn
 * itself failed).
 */
static int kex_cpu_spawn(char *const argv[], const char *in_path, const char *log_path, double limit_s,
                         const atomic_bool *cancel, int *status, bool *timed_out, kex_error *err) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  pid_t pid;
  int e, ws = 0, rc = 0;

  *timed_out = false;
  if ((e = posix_spawn_file_actions_init(&fa)) != 0)
    return kex_err_set(err, KEX_EIO, "cpu: posix_spawn_file_actions_init failed: %s", strerror(e));
  if ((e = posix_spawnattr_init(&at)) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return kex_err_set(err, KEX_EIO, "cpu: posix_spawnattr_init failed: %s", strerror(e));
  }
  /* its own process group: a timeout kills cc and what it started (cc1, as, ld) */
  e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  if (!e) e = posix_spawnattr_setpgroup(&at, 0);
  if (!e) e = posix_spawn_file_actions_addopen(&fa, 0, in_path ? in_path : "/dev/null", O_RDONLY, 0);
  if (!e) e = posix_spawn_file_actions_addopen(&fa, 2, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!e) e = posix_spawn_file_actions_adddup2(&fa, 2, 1);
  if (!e) e = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (e == ENOENT) {
    *status = 127;
    return 0;
  }
  if (e != 0) return kex_err_set(err, KEX_EIO, "cpu: starting %s failed: %s", argv[0], strerror(e));
  if (limit_s > 0 || cancel) { /* wait on a pidfd until the limit (or the cancel), then kill the group */
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    double deadline = limit_s > 0 ? kex_cpu_now() + limit_s : 0;
    for (;;) {
      double left = limit_s > 0 ? deadline - kex_cpu_now() : KEX_CPU_CANCEL_POLL_S;
      if (cancel && atomic_load(cancel)) {
        kill(-pid, SIGKILL);
        break;
      }
      if (left <= 0) {
        kill(-pid, SIGKILL);
        *timed_out = true;
        break;
      }
      if (cancel && left > KEX_CPU_CANCEL_POLL_S) left = KEX_CPU_CANCEL_POLL_S;
      if (pfd < 0) { /* no pidfd (an old kernel): poll the child */
        if (waitpid(pid, &ws, WNOHANG) == pid) goto reaped;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        continue;
      }
      struct pollfd p = {.fd = pfd, .events = POLLIN};
      int ms = (int)(left * 1e3) + 1;
      if (poll(&p, 1, ms) > 0) break;
    }
    if (pfd >= 0) close(pfd);
  }
  while (waitpid(pid, &ws, 0) < 0) {
    if (errno != EINTR) {
      rc = kex_err_set(err, KEX_EIO, "cpu: waiting for %s failed: %s", argv[0], strerror(errno));
      break;
    }
  }
reaped:
  if (rc == 0) *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
  return rc;
}

static int kex_cpu_compile(void *impl, const char *source, const char *name, const kex_prewarm_item *launch,
                           unsigned char **bin, size_t *bin_size, kex_error *err) {
  kex_cpu_device *cpu = impl;
  const atomic_bool *cancel = launch ? launch->cancel : NULL; /* a shared object has no per-launch code */
  char src_path[PATH_MAX], so_path[PATH_MAX], log_path[PATH_MAX];
  unsigned long id = atomic_fetch_add(&cpu->counter, 1) + 1;
  unsigned char *log = NULL;
  size_t log_n = 0;
  int status = 0, rc, argc = 0;
  char words[KEX_CPU_FLAGS_MAX], *argv[KEX_CPU_ARGV_MAX], *save = NULL;

  snprintf(words, sizeof words, "%s", cpu->flags);
  argv[argc++] = KEX_CPU_CC;
  for (char *w = strtok_r(words, " ", &save); w && argc < KEX_CPU_ARGV_MAX - 8; w = strtok_r(NULL, " ", &save))
    argv[argc++] = w;
  char *tail[] = {"-x", "c", "-", "-o", so_path, "-lm", NULL};
  memcpy(argv + argc, tail, sizeof tail);
  kex_cpu_path(cpu, src_path, "k", id, "c");
  kex_cpu_path(cpu, so_path, "k", id, "so");
  kex_cpu_path(cpu, log_path, "k", id, "log");
  rc = kex_cpu_write_file(src_path, source, strlen(source), err);
  if (rc < 0) goto out;
  double t0 = kex_cpu_now();
  bool timed_out;
  rc = kex_cpu_spawn(argv, src_path, log_path, cpu->compile_limit_s, cancel, &status, &timed_out, err);
  if (rc < 0) goto out;
  if (cancel && atomic_load(cancel) && status != 0) {
    rc = kex_err_set(err, KEX_ECANCELLED, "cpu: compiling kernel %s was stopped: cancelled", name);
    goto out;
  }
  if (timed_out) {
    rc = kex_err_set(err, KEX_EDEADLINE, "cpu: compiling kernel %s was stopped after %.3g s (the compile time limit)",
                     name, cpu->compile_limit_s);
    goto out;
  }
  KEX_DEBUG("cpu: cc of kernel %s took %.1f ms (exit %d)", name, (kex_cpu_now() - t0) * 1e3, status);
  if (status != 0) {
    kex_cpu_read_file(log_path, KEX_CPU_LOG_MAX, 1, &log, &log_n, NULL);
    if (status == 127 && log_n == 0)
      rc = kex_err_set(err, KEX_ECOMPILE, "cpu: compiling kernel %s failed: %s was not found", name, KEX_CPU_CC);
    else
      rc = kex_err_set(err, KEX_ECOMPILE, "cpu: compiling kernel %s failed (%s exit %d); build log: %s", name,
                       KEX_CPU_CC, status, log_n ? (char *)log : "(empty)");
    KEX_DEBUG("cpu: build log of kernel %s:\n%s", name, log ? (char *)log : "");
    goto out;
  }
  rc = kex_cpu_read_file(so_path, KEX_DEVICE_BINARY_MAX, 0, bin, bin_size, err);
out:
  kex_free(log);
  unlink(src_path);
  unlink(so_path);
  unlink(log_path);
  return rc;
}

/* ---- the device table ---- */

static void kex_cpu_destroy(void *impl) {
  kex_cpu_device *cpu = impl;
  kex_cpu_pool_stop(cpu);
  if (cpu->dir[0] && rmdir(cpu->dir) < 0) KEX_WARN("cpu: removing %s failed: %s", cpu->dir, strerror(errno));
  kex_free(cpu);
}

/*
 * A buffer of at least KEX_CPU_HUGE_PAGE bytes starts on a 2 MiB boundary and
 * its whole 2 MiB pages are madvise(MADV_HUGEPAGE)'d (Linux's transparent
 * huge pages, where the system allows them): a kernel that walks a matrix
 * down its columns (a matmul's B, one row pitch per reduction step) then
 * touches one TLB entry per 2 MiB instead of one per row (10% on the
 * beam's matmul 1024 kernel, bench/results/cpu-kernels.md).  The bytes
 * before the boundary are never touched, so they cost address space only.
 */
static int kex_cpu_alloc(void *impl, size_t size, void **out, kex_error *err) {
  kex_cpu_buffer *buf;
  uintptr_t p;
  size_t align = size >= KEX_CPU_HUGE_PAGE ? KEX_CPU_HUGE_PAGE : KEX_CPU_ALIGN;
  (void)impl;
  if (size > SIZE_MAX - sizeof *buf - align)
    return kex_err_set(err, KEX_ELIMIT, "cpu: buffer of %zu bytes is too large", size);
  buf = kex_malloc(sizeof *buf + align + size);
  if (!buf) return kex_err_set(err, KEX_ENOMEM, "cpu: out of memory allocating a buffer of %zu bytes", size);
  p = ((uintptr_t)(buf + 1) + align - 1) & ~(uintptr_t)(align - 1);
  buf->data = (unsigned char *)p;
  if (align == KEX_CPU_HUGE_PAGE && madvise(buf->data, size & ~(size_t)(KEX_CPU_HUGE_PAGE - 1), MADV_HUGEPAGE) < 0)
    KEX_DEBUG("cpu: no huge pages for a buffer of %zu bytes: %s", size, strerror(errno)); /* still a valid buffer */
  *out = buf;
  return 0;
}

static void kex_cpu_free(void *impl, void *buf) {
  (void)impl;
  kex_free(buf);
}

static int kex_cpu_copy_in(void *impl, void *buf, size_t offset, const void *src, size_t size, kex_error *err) {
  (void)impl;
  (void)err;
  memcpy(((kex_cpu_buffer *)buf)->data + offset, src, size);
  return 0;
}

static int kex_cpu_copy_out(void *impl, void *buf, size_t offset, void *dst, size_t size, kex_error *err) {
  (void)impl;
  (void)err;
  memcpy(dst, ((kex_cpu_buffer *)buf)->data + offset, size);
  return 0;
}

static int kex_cpu_load(void *impl, const unsigned char *bin, size_t bin_size, const char *name, void **out,
                        kex_error *err) {
  kex_cpu_device *cpu = impl;
  kex_cpu_program *prog = NULL;
  char path[PATH_MAX];
  void *handle = NULL;
  int rc;

  kex_cpu_path(cpu, path, "p", atomic_fetch_add(&cpu->counter, 1) + 1, "so");
  prog = kex_calloc(1, sizeof *prog);
  if (!prog) {
    rc = kex_err_set(err, KEX_ENOMEM, "cpu: out of memory loading kernel %s", name);
    goto out;
  }
  rc = kex_cpu_write_file(path, bin, bin_size, err);
  if (rc < 0) goto out;
  handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  unlink(path);
  if (!handle) {
    const char *why = dlerror();
    rc = kex_err_set(err, KEX_ECOMPILE, "cpu: loading kernel %s failed: %s", name, why ? why : "dlopen failed");
    goto out;
  }
  dlerror();
  prog->fn = (kex_cpu_kernel_fn)dlsym(handle, name);
  prog->item_s = INFINITY;
  if (!prog->fn) {
    rc = kex_err_set(err, KEX_ENOTFOUND, "cpu: the binary has no kernel %s", name);
    goto out;
  }
  prog->handle = handle;
  handle = NULL;
  *out = prog;
  prog = NULL;
  rc = 0;
out:
  if (handle) dlclose(handle);
  kex_free(prog);
  return rc;
}

static void kex_cpu_program_free(void *impl, void *p) {
  kex_cpu_program *prog = p;
  (void)impl;
  dlclose(prog->handle);
  kex_free(prog);
}

static int kex_cpu_launch(void *impl, void *p, const char *name, const size_t global[3], const size_t local[3],
                          void *const *bufs, int nbufs, const int32_t *ints, int nints, void **out, kex_error *err) {
  kex_cpu_device *cpu = impl;
  kex_cpu_program *prog = p;
  void *ptrs[KEX_DEVICE_MAX_BUFS + 1];
  int args[KEX_DEVICE_MAX_INTS + 1];
  kex_cpu_event *ev;
  double t0, limit = cpu->time_limit_s;
  int ran, nranges;

  if (local)
    return kex_err_set(err, KEX_EINVAL, "cpu: kernel %s: the cpu device has no local size (local must be NULL)",
                       name);
  if (global[1] != 1 || global[2] != 1)
    return kex_err_set(err, KEX_EINVAL, "cpu: kernel %s: global %zux%zux%zu, only global[0] may exceed 1", name,
                       global[0], global[1], global[2]);
  ev = kex_calloc(1, sizeof *ev);
  if (!ev) return kex_err_set(err, KEX_ENOMEM, "cpu: kernel %s: out of memory allocating an event", name);
  for (int i = 0; i < nbufs; i++) ptrs[i] = ((kex_cpu_buffer *)bufs[i])->data;
  ptrs[nbufs] = NULL;
  for (int i = 0; i < nints; i++) args[i] = ints[i];
  args[nints] = 0;
  t0 = kex_cpu_now();
  if (cpu->serial) { /* the event holds the pool's ideal time, not this thread's */
    ran = kex_cpu_serial_run(&cpu->pool, prog->fn, ptrs, args, (int)global[0], limit > 0 ? t0 + limit : 0, &ev->seconds,
                             &nranges);
  } else {
    ran = kex_cpu_pool_run(&cpu->pool, prog->fn, ptrs, args, (int)global[0], limit > 0 ? t0 + limit : 0,
                           &prog->item_s, &nranges);
    ev->seconds = kex_cpu_now() - t0;
  }
  if (ran < nranges) {
    kex_free(ev);
    return kex_err_set(err, KEX_EDEADLINE,
                       "cpu: kernel %s stopped after %.3f s, over the kernel time limit of %g s (%d of its %d ranges ran)",
                       name, kex_cpu_now() - t0, limit, ran, nranges);
  }
  *out = ev;
  return 0;
}

static void kex_cpu_set_kernel_time_limit(void *impl, double seconds) {
  kex_cpu_device *cpu = impl;
  cpu->time_limit_s = seconds;
}

static bool kex_cpu_set_compile_time_limit(void *impl, double seconds) {
  kex_cpu_device *cpu = impl;
  cpu->compile_limit_s = seconds;
  return true;
}

static int kex_cpu_wait(void *impl, void *event, kex_error *err) {
  (void)impl;
  (void)event;
  (void)err;
  return 0;
}

static int kex_cpu_elapsed(void *impl, void *event, double *seconds, kex_error *err) {
  (void)impl;
  (void)err;
  *seconds = ((kex_cpu_event *)event)->seconds;
  return 0;
}

static void kex_cpu_event_free(void *impl, void *event) {
  (void)impl;
  kex_free(event);
}

static bool kex_cpu_set_serial_timing(void *impl, bool on) {
  kex_cpu_device *cpu = impl;
  cpu->serial = on;
  return true;
}

static const kex_device_ops kex_cpu_ops = {
    KEX_DEVICE_OPS_COMMON(kex_cpu),
    .set_kernel_time_limit = kex_cpu_set_kernel_time_limit,
    .set_compile_time_limit = kex_cpu_set_compile_time_limit,
    .set_serial_timing = kex_cpu_set_serial_timing,
};

/*
 * The value of "key" in /proc/cpuinfo (first occurrence) into out[len]; ""
 * if absent.  A value longer than the line buffer is cut.
 */
static void kex_cpu_cpuinfo(const char *key, char *out, size_t len) {
  char line[8192];
  size_t n = strlen(key);
  FILE *f = fopen("/proc/cpuinfo", "re");
  out[0] = 0;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, key, n) != 0 || !colon) continue;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    v[strcspn(v, "\n")] = 0;
    snprintf(out, len, "%s", v);
    break;
  }
  fclose(f);
}

/* Whether every name of the space-separated list `want` is a word of `have` (the cpuinfo flags line). */
static int kex_cpu_has_all(const char *have, const char *want) {
  char words[256], *save = NULL;
  snprintf(words, sizeof words, "%s", want);
  for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
    size_t n = strlen(w);
    const char *p = have;
    while ((p = strstr(p, w)) && !((p == have || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\n' || !p[n]))) p += n;
    if (!p) return 0;
  }
  return 1;
}

/*
 * The flags that target this CPU's instruction-set level: on x86-64 the
 * highest x86-64 microarchitecture level (gcc/clang -march=x86-64-vN, the
 * psABI's feature sets, named here as Linux's /proc/cpuinfo flags) the CPU
 * has, with -mfma on a CPU that has FMA below v3 (kernels' a*b+c contracts
 * to an FMA wherever the CPU has one: the cases' numbers are tinygrad's,
 * whose CLANG device compiles with -march=native); "" elsewhere (arm64 has
 * FMA in its base ISA).  A level, not -march=native: two CPUs with the same
 * level run each other's binaries, and the flags say exactly what is needed.
 */
static const char *kex_cpu_isa_flags(void) {
#if defined(__x86_64__)
  static const char v2[] = "cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3",
                    v3[] = "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave",
                    v4[] = "avx512f avx512bw avx512cd avx512dq avx512vl";
  char have[8192]; /* a longer flags line is cut: fewer features seen, a lower level, still a safe one */
  kex_cpu_cpuinfo("flags", have, sizeof have);
  /* LZCNT (v3's "abm"): some guests' kernels leave "abm" out of the flags line on an AMD EPYC whose CPUID has it
     (leaf 0x80000001, ECX bit 5) and runs lzcnt as lzcnt, which made such a host's kernels v2 (no AVX2).  The
     instruction's own CPUID bit decides it then */
  unsigned a, b, c, d;
  size_t hl = strlen(have);
  if (!kex_cpu_has_all(have, "abm") && __get_cpuid(0x80000001, &a, &b, &c, &d) && (c >> 5 & 1) &&
      hl + 4 < sizeof have)
    memcpy(have + hl, " abm", 5);
  if (!kex_cpu_has_all(have, v2)) return kex_cpu_has_all(have, "fma") ? "-mfma" : "";
  if (!kex_cpu_has_all(have, v3)) return kex_cpu_has_all(have, "fma") ? "-march=x86-64-v2 -mfma" : "-march=x86-64-v2";
  return kex_cpu_has_all(have, v4) ? "-march=x86-64-v4" : "-march=x86-64-v3";
#else
  return "";
#endif
}

/*
 * The first line of `cc --version` into out[KEX_DEVICE_FIELD_MAX].
 * Errors: KEX_ENOTFOUND (no compiler), KEX_EIO.
 */
static int kex_cpu_compiler_version(kex_cpu_device *cpu, char *out, kex_error *err) {
  char log_path[PATH_MAX];
  char *argv[] = {KEX_CPU_CC, "--version", NULL};
  unsigned char *text = NULL;
  size_t n = 0;
  int status = 0, rc;

  kex_cpu_path(cpu, log_path, "version", atomic_fetch_add(&cpu->counter, 1) + 1, "txt");
  bool timed_out;
  rc = kex_cpu_spawn(argv, NULL, log_path, 0, NULL, &status, &timed_out, err);
  if (rc < 0) goto out;
  if (status != 0) {
    rc = kex_err_set(err, KEX_ENOTFOUND, "cpu: the system compiler %s is missing or broken (`%s --version` exit %d)",
                     KEX_CPU_CC, KEX_CPU_CC, status);
    goto out;
  }
  rc = kex_cpu_read_file(log_path, 4096, 1, &text, &n, err);
  if (rc < 0) goto out;
  text[strcspn((char *)text, "\n")] = 0;
  snprintf(out, KEX_DEVICE_FIELD_MAX, "%s [%s]", text[0] ? (char *)text : KEX_CPU_CC, cpu->flags);
out:
  kex_free(text);
  unlink(log_path);
  return rc;
}

int kex_cpu_open(kex_device **out, kex_error *err) {
  kex_cpu_device *cpu = NULL;
  kex_device_info info;
  kex_device_identity *id = &info.identity;
  char tmp[KEX_DEVICE_FIELD_MAX];
  const char *tmpdir = getenv("TMPDIR");
  struct utsname un;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const char *want = getenv("KEX_CPU_THREADS"); /* override: benchmarks compare 1 and N threads */
  int cpus[KEX_CPU_MAX_THREADS], ncpus = 0;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE && ncpus < KEX_CPU_MAX_THREADS; c++)
      if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;
    if (ncpus > 0) cores = ncpus; /* the CPUs this process may run on */
  }
  if (want && atol(want) > 0) cores = atol(want);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int rc;

  memset(&info, 0, sizeof info);
  cpu = kex_calloc(1, sizeof *cpu);
  if (!cpu) return kex_err_set(err, KEX_ENOMEM, "cpu: out of memory opening the device");
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  if (snprintf(cpu->dir, sizeof cpu->dir, "%s/kex-cpu-XXXXXX", tmpdir) >= (int)sizeof cpu->dir ||
      !mkdtemp(cpu->dir)) {
    rc = kex_err_set(err, KEX_EIO, "cpu: mkdtemp under %s failed: %s", tmpdir, strerror(errno));
    cpu->dir[0] = 0;
    goto out;
  }
  const char *isa = kex_cpu_isa_flags();
  snprintf(cpu->flags, sizeof cpu->flags, "%s%s%s", KEX_CPU_FLAGS, *isa ? " " : "", isa);
  kex_device_set_field(id->kind, "cpu");
  kex_cpu_cpuinfo("vendor_id", tmp, sizeof tmp);
  kex_device_set_field(id->vendor, tmp);
  kex_cpu_cpuinfo("model name", tmp, sizeof tmp);
  kex_device_set_field(id->name, tmp);
  if (uname(&un) == 0)
    snprintf(tmp, sizeof tmp, "%s glibc %s", un.machine, gnu_get_libc_version());
  else
    snprintf(tmp, sizeof tmp, "glibc %s", gnu_get_libc_version());
  kex_device_set_field(id->driver_version, tmp);
  rc = kex_cpu_compiler_version(cpu, tmp, err);
  if (rc < 0) goto out;
  kex_device_set_field(id->compiler_version, tmp);

  if (cores < 1) cores = 1;
  if (cores > KEX_CPU_MAX_THREADS) cores = KEX_CPU_MAX_THREADS;
  info.global_mem = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (1ull << 30);
  info.max_alloc = info.global_mem / 4;
  info.compute_units = (int)cores;
  info.supports_fp64 = true;
  info.supports_fp16 = true; /* the C renderer uses _Float16, which gcc supports on x86-64 and arm64 */
  info.compile_thread_safe = true; /* a compile touches only its own files (unique names) and its cc process */
  kex_cpu_pool_start(cpu, cores > 1 ? (int)cores : 0, cpus, ncpus);
  KEX_DEBUG("cpu: opened (%s), %d launch helpers, temp dir %s", id->compiler_version, cpu->pool.nthreads, cpu->dir);
  rc = kex_device_wrap(&kex_cpu_ops, cpu, &info, "",
                       out, err);
  cpu = NULL;
out:
  if (cpu) kex_cpu_destroy(cpu);
  return rc;
}

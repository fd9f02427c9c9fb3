/*
 * kex_top.c - `kex top`: a live view of a kexd, from GetStats.
 *
 *   kex --server ADDR top [--once] [--json] [--interval S] [--job T]
 *
 * Every S seconds (default 1) it asks the server for its counters and
 * shows the server (jobs open, connections, calls, submissions), the items
 * queued and running on its devices, the device busy share, the bytes its
 * jobs hold, the hit rates of its three caches since it started (schedule
 * structures, programs in memory or in the SQLite file, beam results), and
 * one row per open job (weight, queued, running, items done, device time,
 * busy share, bytes held and limit, buffers).
 *
 * The busy share is device time over wall time between two samples: the
 * growth of the jobs' device_time_s over the interval (a job that closed in
 * between takes its time with it, so the share is clamped at 0; with more
 * than one device it can pass 100%).  A job's own share needs its name to
 * be unique in both samples (JobStats carries no id); else it is unknown.
 *
 * On a terminal the view is redrawn in place (the alternate screen) until q
 * or Ctrl-C; otherwise a plain snapshot is printed each interval until
 * Ctrl-C.  --once takes two samples S apart and prints one view (with
 * --interval 0, one sample and no busy share); --json prints the view as
 * one JSON document per sample (with --once, exactly one).  Exit codes: 0,
 * 2 usage, 1 the server failed (printed as every server command prints it).
 */
#ifdef KEX_HAVE_LIBKEX
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/kex_cli.h"

#define TOP_INTERVAL_MAX 3600.0 /* seconds between samples */
#define TOP_NAME_COLS 20        /* columns of a job's name */

static volatile sig_atomic_t top_stop; /* set by SIGINT / SIGTERM */

static void on_stop_signal(int sig) {
  (void)sig;
  top_stop = 1;
}

/* One GetStats reply and when it arrived. */
typedef struct top_sample {
  kex_stats *stats;
  double t;        /* kex_cli_now_s() */
  time_t wall;
} top_sample;

/* hits / (hits + misses), NAN when nothing was looked up. */
static double rate(uint64_t hits, uint64_t misses) { return hits + misses ? (double)hits / (double)(hits + misses) : NAN; }

static double total_device_time(const kex_stats *s) {
  double t = 0;
  for (size_t i = 0; i < s->njobs; i++) t += s->jobs[i].device_time_s;
  return t;
}

/* Index of the only job named name in s, or -1 (none, or more than one). */
static long unique_job(const kex_stats *s, const char *name) {
  long at = -1;
  for (size_t i = 0; i < s->njobs; i++)
    if (!strcmp(s->jobs[i].name, name)) {
      if (at >= 0) return -1;
      at = (long)i;
    }
  return at;
}

/* Busy share of the whole server between prev and cur; NAN without prev. */
static double server_busy(const top_sample *prev, const top_sample *cur) {
  if (!prev || !prev->stats || cur->t <= prev->t) return NAN;
  return fmax(0, total_device_time(cur->stats) - total_device_time(prev->stats)) / (cur->t - prev->t);
}

/* Busy share of cur's job j; NAN when unknown. */
static double job_busy(const top_sample *prev, const top_sample *cur, size_t j) {
  if (!prev || !prev->stats || cur->t <= prev->t) return NAN;
  const char *name = cur->stats->jobs[j].name;
  long p = unique_job(prev->stats, name);
  if (p < 0 || unique_job(cur->stats, name) != (long)j) return NAN;
  return fmax(0, cur->stats->jobs[j].device_time_s - prev->stats->jobs[p].device_time_s) / (cur->t - prev->t);
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* The view as one JSON document (the caller's). */
static json_t *view_json(const char *server, const top_sample *prev, const top_sample *cur) {
  const kex_stats *s = cur->stats;
  char now[KEX_CLI_ISO8601_MAX], started[KEX_CLI_ISO8601_MAX];
  uint32_t queued = 0, running = 0;
  json_t *jobs = json_array();
  kex_cli_iso8601((int64_t)cur->wall, now);
  kex_cli_iso8601((int64_t)(cur->wall - s->uptime_s + 0.5), started);
  for (size_t i = 0; i < s->njobs; i++) {
    const kex_job_stats *j = &s->jobs[i];
    queued += j->queued;
    running += j->running;
    json_array_append_new(jobs, json_pack("{s:s, s:I, s:I, s:I, s:I, s:f, s:o, s:I, s:I, s:I, s:I}", "name", j->name,
                                          "weight", (json_int_t)j->weight, "queued", (json_int_t)j->queued, "running",
                                          (json_int_t)j->running, "items_done", (json_int_t)j->items_done,
                                          "device_time_s", j->device_time_s, "busy", num_or_null(job_busy(prev, cur, i)),
                                          "bytes_held", (json_int_t)j->bytes_held, "bytes_reserved",
                                          (json_int_t)j->bytes_reserved, "memory_limit", (json_int_t)j->memory_limit,
                                          "buffers", (json_int_t)j->buffers));
  }
  json_t *rates = json_pack("{s:o, s:o, s:o}", "schedule", num_or_null(rate(s->schedule_cache_hits, s->schedule_cache_misses)),
                            "program",
                            num_or_null(rate(s->program_cache_memory_hits + s->program_cache_sqlite_hits,
                                             s->program_cache_misses)),
                            "beam", num_or_null(rate(s->beam_cache_hits, s->beam_cache_misses)));
  json_t *o = json_pack("{s:s, s:s, s:s, s:f, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "server", server, "time",
                        now, "started", started, "uptime_s", s->uptime_s, "interval_s",
                        prev && prev->stats ? json_real(cur->t - prev->t) : json_null(), "jobs_open",
                        (json_int_t)s->jobs_open, "connections_open", (json_int_t)s->connections_open, "calls",
                        (json_int_t)s->calls, "calls_failed", (json_int_t)s->calls_failed, "submissions",
                        (json_int_t)s->submissions, "submissions_done", (json_int_t)s->submissions_done,
                        "submissions_failed", (json_int_t)s->submissions_failed, "queued", (json_int_t)queued,
                        "running", (json_int_t)running);
  json_t *more = json_pack("{s:o, s:I, s:o, s:I, s:o}", "device_busy", num_or_null(server_busy(prev, cur)), "bytes_held",
                           (json_int_t)s->bytes_held, "cache_hit_rates", rates, "searches_run",
                           (json_int_t)s->searches_run, "jobs", jobs);
  if (o && more) json_object_update(o, more);
  json_decref(more);
  return o;
}

static void pct(double v, char *out, size_t cap) {
  if (isfinite(v)) snprintf(out, cap, "%.1f%%", v * 100);
  else snprintf(out, cap, "-");
}

/* The view as text; eol is what ends a line ("\033[K\n" on a terminal: clear the rest of it). */
static void view_text(FILE *f, const char *server, const top_sample *prev, const top_sample *cur, bool tty);

/*
 * Print one view to stdout: a JSON line, or the text table (on a tty redrawn
 * in place; otherwise followed by a blank line when `separated`).
 */
static void show_view(const char *server, const top_sample *prev, const top_sample *cur, bool as_json, bool tty,
                      bool separated) {
  if (as_json) {
    json_t *o = view_json(server, prev, cur);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
    return;
  }
  if (tty) fputs("\033[H", stdout);
  view_text(stdout, server, prev, cur, tty);
  if (tty) fputs("\033[J", stdout); /* clear below the view */
  else if (separated) fputc('\n', stdout);
}

static void view_text(FILE *f, const char *server, const top_sample *prev, const top_sample *cur, bool tty) {
  const kex_stats *s = cur->stats;
  const char *eol = tty ? "\033[K\n" : "\n";
  char now[KEX_CLI_ISO8601_MAX], held[32], busy[16], r1[16], r2[16], r3[16];
  uint32_t queued = 0, running = 0;
  for (size_t i = 0; i < s->njobs; i++) queued += s->jobs[i].queued, running += s->jobs[i].running;
  kex_cli_iso8601((int64_t)cur->wall, now);
  kex_cli_bytes_text(s->bytes_held, held, sizeof held);
  pct(server_busy(prev, cur), busy, sizeof busy);
  pct(rate(s->schedule_cache_hits, s->schedule_cache_misses), r1, sizeof r1);
  pct(rate(s->program_cache_memory_hits + s->program_cache_sqlite_hits, s->program_cache_misses), r2, sizeof r2);
  pct(rate(s->beam_cache_hits, s->beam_cache_misses), r3, sizeof r3);
  long up = (long)s->uptime_s;
  fprintf(f, "kex top  %s  %s  up %ldd %02ld:%02ld:%02ld%s%s", server, now, up / 86400, up / 3600 % 24, up / 60 % 60,
          up % 60, tty ? "  (q quits)" : "", eol);
  fprintf(f, "jobs: %u open (%llu opened, %llu closed, %llu expired)   connections: %u   calls: %llu (%llu failed)%s",
          s->jobs_open, (unsigned long long)s->jobs_opened, (unsigned long long)s->jobs_closed,
          (unsigned long long)s->jobs_expired, s->connections_open, (unsigned long long)s->calls,
          (unsigned long long)s->calls_failed, eol);
  fprintf(f, "items: %u queued, %u running   device busy: %s   bytes held: %s%s", queued, running, busy, held, eol);
  fprintf(f, "submissions: %llu (%llu done, %llu failed)   cache hit rates: schedule %s, program %s, beam %s%s",
          (unsigned long long)s->submissions, (unsigned long long)s->submissions_done,
          (unsigned long long)s->submissions_failed, r1, r2, r3, eol);
  fprintf(f, "%s", eol);
  fprintf(f, "%-*s %6s %7s %7s %9s %7s %10s %10s %10s %6s%s", TOP_NAME_COLS, "JOB", "WEIGHT", "QUEUED", "RUNNING", "DONE",
          "BUSY", "DEVICE s", "HELD", "LIMIT", "BUFS", eol);
  for (size_t i = 0; i < s->njobs; i++) {
    const kex_job_stats *j = &s->jobs[i];
    char jb[16], jh[32], jl[32];
    pct(job_busy(prev, cur, i), jb, sizeof jb);
    kex_cli_bytes_text(j->bytes_held, jh, sizeof jh);
    if (j->memory_limit) kex_cli_bytes_text(j->memory_limit, jl, sizeof jl);
    else snprintf(jl, sizeof jl, "-");
    fprintf(f, "%-*.*s %6u %7u %7u %9llu %7s %10.3f %10s %10s %6u%s", TOP_NAME_COLS, TOP_NAME_COLS, j->name, j->weight,
            j->queued, j->running, (unsigned long long)j->items_done, jb, j->device_time_s, jh, jl, j->buffers, eol);
  }
  if (!s->njobs) fprintf(f, "(no open jobs)%s", eol);
}

/* Take a sample into *out (replacing what it held).  0, or the call's error in *st. */
static int sample(kex_cli_remote *r, const char *job, top_sample *out, kex_status *st) {
  kex_stats *s = NULL;
  int rc = kex_get_stats(r->client, job, &s, st);
  if (rc) return rc;
  kex_stats_free(out->stats);
  out->stats = s;
  out->t = kex_cli_now_s();
  out->wall = time(NULL);
  return 0;
}

/*
 * Wait until `until` (kex_cli_now_s) or a stop: a signal, or q on the
 * terminal keys (when keys).  Returns true to stop.
 */
static bool wait_until(double until, bool keys) {
  while (!top_stop) {
    double left = until - kex_cli_now_s();
    if (left <= 0) return false;
    struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
    fd_set fds;
    FD_ZERO(&fds);
    if (keys) FD_SET(0, &fds);
    int n = select(keys ? 1 : 0, keys ? &fds : NULL, NULL, NULL, &tv);
    if (n < 0 && errno != EINTR) return true;
    if (n > 0 && FD_ISSET(0, &fds)) {
      char c;
      ssize_t got = read(0, &c, 1);
      if (got <= 0 || c == 'q' || c == 'Q' || c == 3 /* Ctrl-C without ISIG */) return true;
    }
  }
  return true;
}

static void top_usage(FILE *f) {
  fputs("usage: kex --server ADDR top [--once] [--json] [--interval S] [--job T]\n"
        "  a live view of kexd (GetStats every S seconds, default 1) until q or Ctrl-C;\n"
        "  --once: two samples S apart, one view, exit (--interval 0: one sample, no busy share)\n"
        "  --json: the view as JSON (one document per sample)\n",
        f);
}

int kex_remote_cmd_top(kex_cli_remote *r, int argc, char **argv) {
  bool once = false, as_json = false, tty = false, keys = false;
  double interval = 1.0;
  const char *job = NULL;
  top_sample a = {0}, b = {0}, *prev = &a, *cur = &b;
  struct termios saved;
  struct sigaction sa, old_int, old_term;
  kex_status st;
  int c, ret = 0;
  const kex_cli_opt opts[] = {{"once", 0, KEX_CLI_FLAG, &once},
                              {"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"interval", 0, KEX_CLI_NUM, &interval, 0, TOP_INTERVAL_MAX},
                              {"job", 0, KEX_CLI_STR, &job},
                              {0}};
  if ((c = kex_cli_args("top", opts, NULL, NULL, argc, argv, top_usage)) >= 0) return c;
  if (!once && interval <= 0) {
    fprintf(stderr, "kex top: --interval must be > 0 without --once\n");
    return 2;
  }
  if ((ret = kex_cli_remote_open(r, "top", NULL, false))) return ret;
  if (sample(r, job, prev, &st)) return kex_cli_fail("top", &st);
  top_stop = 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal; /* no SA_RESTART: select returns at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  if (once) {
    /* two samples interval apart; one when --interval 0 (or a signal came first) */
    bool two = interval > 0 && !wait_until(kex_cli_now_s() + interval, false);
    if (two && sample(r, job, cur, &st)) {
      ret = kex_cli_fail("top", &st);
      goto out;
    }
    show_view(r->server, two ? prev : NULL, two ? cur : prev, as_json, false, false);
    goto out;
  }
  tty = !as_json && isatty(1);
  keys = tty && isatty(0) && tcgetattr(0, &saved) == 0;
  if (keys) {
    struct termios raw = saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(0, TCSANOW, &raw);
  }
  if (tty) fputs("\033[?1049h\033[?25l", stdout); /* the alternate screen, no cursor */
  /* the first view has one sample (no busy share); each later one the last two */
  for (bool have_prev = false;;) {
    if (have_prev && sample(r, job, cur, &st)) {
      ret = -1; /* printed below, once the terminal is back */
      break;
    }
    show_view(r->server, have_prev ? prev : NULL, have_prev ? cur : prev, as_json, tty, true);
    fflush(stdout);
    if (have_prev) {
      top_sample *t = prev;
      prev = cur;
      cur = t;
    }
    have_prev = true;
    if (wait_until(prev->t + interval, keys)) break;
  }
  if (tty) fputs("\033[?25h\033[?1049l", stdout);
  if (keys) tcsetattr(0, TCSANOW, &saved);
  fflush(stdout);
  if (ret < 0) ret = kex_cli_fail("top", &st);
out:
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  kex_stats_free(a.stats);
  kex_stats_free(b.stats);
  return ret;
}
#endif

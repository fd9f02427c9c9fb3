/*
 * log.c - human-readable log lines.
 */
#include "core/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static enum kex_log_level log_level = (enum kex_log_level)-1; /* -1: read KEX_LOG on first use */
static FILE *log_stream;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int kex_log_parse_level(const char *name) {
  for (int i = 0; i <= KEX_LOG_OFF; i++)
    if (strcmp(name, level_names[i]) == 0) return i;
  return -1;
}

void kex_log_set_level(enum kex_log_level level) { log_level = level; }

enum kex_log_level kex_log_get_level(void) {
  if ((int)log_level < 0) {
    const char *env = getenv("KEX_LOG");
    int l = env ? kex_log_parse_level(env) : -1;
    log_level = l >= 0 ? (enum kex_log_level)l : KEX_LOG_INFO;
  }
  return log_level;
}

void kex_log_set_stream(FILE *stream) { log_stream = stream; }

void kex_log(enum kex_log_level level, const char *job, unsigned long long sub, const char *fmt, ...) {
  if (level < kex_log_get_level() || level >= KEX_LOG_OFF) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  char ctx[160] = "";
  if (job && sub)
    snprintf(ctx, sizeof ctx, " job=%s sub=%llu", job, sub);
  else if (job)
    snprintf(ctx, sizeof ctx, " job=%s", job);
  else if (sub)
    snprintf(ctx, sizeof ctx, " sub=%llu", sub);
  fprintf(log_stream ? log_stream : stderr, "%s.%03ldZ %-5s%s %s\n", when, ts.tv_nsec / 1000000, level_names[level],
          ctx, msg);
}

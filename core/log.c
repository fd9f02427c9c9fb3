/*
 * log.c - log lines: human-readable text, or one JSON object per line
 * (jansson escapes the message) for log collectors.  The text form escapes
 * control bytes as JSON does (put_escaped) and quotes a kv value that could
 * pass for another field, so one event is always one line.
 */
#include "core/log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static enum kex_log_level log_level = (enum kex_log_level)-1; /* -1: read KEX_LOG on first use */
static FILE *log_stream;
static int log_json;

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

void kex_log_set_json(int json) { log_json = json; }

/* The JSON form of one line; 0, or -1 when jansson could not build it (the text form is written then). */
/* s as a JSON string; a string that is not UTF-8 (a truncated character, bytes from a client) has each non-ASCII byte as '?'. */
static json_t *json_text(const char *s) {
  char clean[1024];
  json_t *m = json_string(s);
  if (!m) {
    size_t i = 0;
    for (; s[i] && i + 1 < sizeof clean; i++) clean[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    clean[i] = '\0';
    m = json_string(clean);
  }
  return m;
}

static int log_json_line(FILE *out, const char *when, long ms, const char *level, const char *job,
                         unsigned long long sub, const char *msg, const char *const *kv) {
  char ts[48];
  json_t *o = json_object(), *m = json_text(msg);
  char *text;
  int rc = -1;
  snprintf(ts, sizeof ts, "%s.%03ldZ", when, ms);
  if (o && m && json_object_set_new(o, "ts", json_string(ts)) == 0 &&
      json_object_set_new(o, "level", json_string(level)) == 0 &&
      (!job || json_object_set_new(o, "job", json_string(job)) == 0) &&
      (!sub || json_object_set_new(o, "sub", json_integer((json_int_t)sub)) == 0)) {
    rc = json_object_set_new(o, "msg", m); /* takes m, even when it fails */
    m = NULL;
    for (size_t i = 0; rc == 0 && kv && kv[i] && kv[i + 1]; i += 2) rc = json_object_set_new(o, kv[i], json_text(kv[i + 1]));
    if (rc == 0 && (text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
      fprintf(out, "%s\n", text);
      free(text);
    } else {
      rc = -1;
    }
  }
  json_decref(m);
  json_decref(o);
  return rc;
}

static void log_line(enum kex_log_level level, const char *job, unsigned long long sub, const char *msg,
                     const char *const *kv);

void kex_log(enum kex_log_level level, const char *job, unsigned long long sub, const char *fmt, ...) {
  if (level < kex_log_get_level() || level >= KEX_LOG_OFF) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log_line(level, job, sub, msg, NULL);
}

void kex_log_kv(enum kex_log_level level, const char *job, const char *msg, const char *const *kv) {
  if (level < kex_log_get_level() || level >= KEX_LOG_OFF) return;
  log_line(level, job, 0, msg, kv);
}

/*
 * Append s to out[*n..cap) so that it cannot start a line or move a
 * terminal: a control byte (below 0x20, and DEL) becomes \n, \r, \t or
 * \xNN and a backslash \\, as a JSON string would have them; with quote,
 * '"' becomes \" too.  Messages carry client strings (job names, method
 * paths), so a client can never forge a log line.  Stops at the buffer's end.
 */
static void put_escaped(char *out, size_t cap, size_t *n, const char *s, int quote) {
  static const char hex[] = "0123456789abcdef";
  for (; *s && *n + 5 < cap; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '\\' || (quote && ch == '"')) {
      out[(*n)++] = '\\';
      out[(*n)++] = (char)ch;
    } else if (ch == '\n' || ch == '\r' || ch == '\t') {
      out[(*n)++] = '\\';
      out[(*n)++] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
    } else if (ch < 0x20 || ch == 0x7f) {
      out[(*n)++] = '\\';
      out[(*n)++] = 'x';
      out[(*n)++] = hex[ch >> 4];
      out[(*n)++] = hex[ch & 15];
    } else {
      out[(*n)++] = (char)ch;
    }
  }
  out[*n] = '\0';
}

/* A kv value goes in quotes (logfmt) when it is empty or holds a space, '"' or '=': no value forges a field. */
static int needs_quotes(const char *v) { return !*v || strpbrk(v, " \"=") != NULL; }

/* One line: JSON when asked (falling back to text if it cannot be made), else text with kv appended. */
static void log_line(enum kex_log_level level, const char *job, unsigned long long sub, const char *msg,
                     const char *const *kv) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  if (log_json && log_json_line(log_stream ? log_stream : stderr, when, ts.tv_nsec / 1000000, level_names[level], job,
                                sub, msg, kv) == 0)
    return;
  char text[2048];
  size_t n = 0;
  text[0] = '\0';
  put_escaped(text, sizeof text, &n, msg, 0);
  for (size_t i = 0; kv && kv[i] && kv[i + 1] && n + 8 < sizeof text; i += 2) {
    int q = needs_quotes(kv[i + 1]);
    text[n++] = ' ';
    put_escaped(text, sizeof text, &n, kv[i], 0);
    if (n + 3 >= sizeof text) break;
    text[n++] = '=';
    if (q) text[n++] = '"';
    put_escaped(text, sizeof text, &n, kv[i + 1], q);
    if (q && n + 1 < sizeof text) text[n++] = '"';
  }
  text[n] = '\0';
  msg = text;
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

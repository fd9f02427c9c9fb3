/*
 * log.h - one line per event: time, level, optional job/submission, message.
 *
 * Output goes to stderr (or the stream set by kex_log_set_stream).  The level
 * threshold comes from kex_log_set_level or the KEX_LOG environment variable
 * (debug, info, warn, error).  Thread-safe: each line is written with one
 * fprintf under the stream lock.  kex_log_set_json(true) (kexd --log-format
 * json) makes each line one JSON object: {"ts", "level", "job", "sub",
 * "msg"} (job and sub only when set), built with jansson.
 */
#ifndef KEX_CORE_LOG_H
#define KEX_CORE_LOG_H

#include <stdio.h>

enum kex_log_level { KEX_LOG_DEBUG, KEX_LOG_INFO, KEX_LOG_WARN, KEX_LOG_ERROR, KEX_LOG_OFF };

void kex_log_set_level(enum kex_log_level level);
enum kex_log_level kex_log_get_level(void);
void kex_log_set_stream(FILE *stream);
/* One JSON object per line (true) or the text form (false, the default). */
void kex_log_set_json(int json);
/* Parse "debug|info|warn|error|off"; returns -1 if unknown. */
int kex_log_parse_level(const char *name);

/* job and sub may be NULL / 0 when the event belongs to no job. */
void kex_log(enum kex_log_level level, const char *job, unsigned long long sub, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * One event with named fields: kv is NULL-terminated key, value pairs.  Text:
 * "msg key=value ..." on one line; JSON (--log-format json): the keys are
 * fields of the line's object beside "msg" (a value that is not UTF-8 has
 * each non-ASCII byte as '?').  kexd's access log uses it.
 */
void kex_log_kv(enum kex_log_level level, const char *job, const char *msg, const char *const *kv);

#define KEX_DEBUG(...) kex_log(KEX_LOG_DEBUG, NULL, 0, __VA_ARGS__)
#define KEX_INFO(...) kex_log(KEX_LOG_INFO, NULL, 0, __VA_ARGS__)
#define KEX_WARN(...) kex_log(KEX_LOG_WARN, NULL, 0, __VA_ARGS__)
#define KEX_ERROR(...) kex_log(KEX_LOG_ERROR, NULL, 0, __VA_ARGS__)

#endif

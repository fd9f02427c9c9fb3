/*
 * errors.h - the one table of kex error codes.
 *
 * Every fallible kex function returns an int: 0 on success, a negative
 * KEX_E* code on failure.  KEX_ERRNO_MAP is the single source of truth: it
 * generates the enum, kex_strerror(), kex_errname() and the mapping to gRPC
 * status codes used by the daemon.  Detailed, human-readable context (which
 * node, which field, which limit) travels in a struct kex_error filled by the
 * failing function.
 */
#ifndef KEX_CORE_ERRORS_H
#define KEX_CORE_ERRORS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h> /* KEX_VFORMAT */

/* gRPC status codes (grpc/status.h values), so core/ needs no gRPC header. */
enum {
  KEX_GRPC_OK = 0,
  KEX_GRPC_CANCELLED = 1,
  KEX_GRPC_UNKNOWN = 2,
  KEX_GRPC_INVALID_ARGUMENT = 3,
  KEX_GRPC_DEADLINE_EXCEEDED = 4,
  KEX_GRPC_NOT_FOUND = 5,
  KEX_GRPC_ALREADY_EXISTS = 6,
  KEX_GRPC_PERMISSION_DENIED = 7,
  KEX_GRPC_RESOURCE_EXHAUSTED = 8,
  KEX_GRPC_FAILED_PRECONDITION = 9,
  KEX_GRPC_ABORTED = 10,
  KEX_GRPC_OUT_OF_RANGE = 11,
  KEX_GRPC_UNIMPLEMENTED = 12,
  KEX_GRPC_INTERNAL = 13,
  KEX_GRPC_UNAVAILABLE = 14,
  KEX_GRPC_DATA_LOSS = 15,
  KEX_GRPC_UNAUTHENTICATED = 16,
};

/* XX(name, value, message, grpc status) */
#define KEX_ERRNO_MAP(XX)                                                        \
  XX(INVAL, -1, "invalid argument", INVALID_ARGUMENT)                            \
  XX(NOMEM, -2, "out of memory", RESOURCE_EXHAUSTED)                             \
  XX(LIMIT, -3, "limit exceeded", RESOURCE_EXHAUSTED)                            \
  XX(NOTFOUND, -4, "not found", NOT_FOUND)                                       \
  XX(CYCLE, -5, "cycle detected in graph", INTERNAL)                             \
  XX(ASSIGN, -6, "assign target must be read contiguously", INVALID_ARGUMENT)    \
  XX(IO, -7, "input/output error", INTERNAL)                                     \
  XX(PARSE, -8, "malformed input", INVALID_ARGUMENT)                             \
  XX(UNSUPPORTED, -9, "not supported", UNIMPLEMENTED)                            \
  XX(INTERNAL, -10, "internal error", INTERNAL)                                  \
  XX(DEVICE, -11, "device error", INTERNAL)                                      \
  XX(COMPILE, -12, "compile error", INTERNAL)                                    \
  XX(OPT, -13, "invalid kernel optimization", INVALID_ARGUMENT)                  \
  XX(UNAVAILABLE, -14, "unavailable", UNAVAILABLE)                               \
  XX(DEADLINE, -15, "deadline exceeded", DEADLINE_EXCEEDED)                      \
  XX(CANCELLED, -16, "cancelled", CANCELLED)                                     \
  XX(UNIMPLEMENTED, -17, "unimplemented", UNIMPLEMENTED)                         \
  XX(CORRUPT, -18, "corrupt data", DATA_LOSS)

enum kex_errno {
#define XX(name, value, msg, grpc) KEX_E##name = (value),
  KEX_ERRNO_MAP(XX)
#undef XX
};

#define KEX_ERROR_MSG_MAX 512

/* Context of a failure: the code and a message naming what was wrong. */
typedef struct kex_error {
  int code;
  char msg[KEX_ERROR_MSG_MAX];
} kex_error;

/* Static message for a code ("unknown error" for codes outside the table). */
const char *kex_strerror(int code);
/* Symbolic name without the KEX_E prefix, e.g. "INVAL". */
const char *kex_errname(int code);
/* The gRPC status code that this kex code maps to (0 for 0). */
int kex_err_grpc_status(int code);

/*
 * Fill *err (which may be NULL) with code and a printf-style message and
 * return code, so a failing function can `return kex_err_set(err, ...)`.
 */
/*
 * In a variadic function whose last named parameter is fmt: format fmt and
 * the arguments after it into the char array buf (truncated to its size).
 */
#define KEX_VFORMAT(buf, fmt)              \
  do {                                     \
    va_list kex_ap_;                       \
    va_start(kex_ap_, fmt);                \
    vsnprintf(buf, sizeof(buf), fmt, kex_ap_); \
    va_end(kex_ap_);                       \
  } while (0)

int kex_err_set(kex_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kex_err_vset(kex_error *err, int code, const char *fmt, va_list ap);

#endif

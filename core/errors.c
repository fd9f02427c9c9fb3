/*
 * errors.c - kex_strerror and friends, all generated from KEX_ERRNO_MAP.
 */
#include "core/errors.h"

#include <stddef.h>
#include <stdio.h>

/* One row a code, from KEX_ERRNO_MAP; the lookups below read it. */
typedef struct {
  int code;
  const char *name;
  const char *msg;
  int grpc;
} errno_row;

static const errno_row errno_rows[] = {
    {0, "OK", "success", KEX_GRPC_OK},
#define XX(name, value, msg, grpc) {KEX_E##name, #name, msg, KEX_GRPC_##grpc},
    KEX_ERRNO_MAP(XX)
#undef XX
};

static const errno_row *errno_find(int code) {
  for (size_t i = 0; i < sizeof errno_rows / sizeof errno_rows[0]; i++)
    if (errno_rows[i].code == code) return &errno_rows[i];
  return NULL;
}

const char *kex_strerror(int code) {
  const errno_row *r = errno_find(code);
  return r ? r->msg : "unknown error";
}

const char *kex_errname(int code) {
  const errno_row *r = errno_find(code);
  return r ? r->name : "UNKNOWN";
}

int kex_err_grpc_status(int code) {
  const errno_row *r = errno_find(code);
  return r ? r->grpc : KEX_GRPC_UNKNOWN;
}

int kex_err_vset(kex_error *err, int code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  }
  return code;
}

int kex_err_set(kex_error *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kex_err_vset(err, code, fmt, ap);
  va_end(ap);
  return code;
}

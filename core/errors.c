/*
 * errors.c - kex_strerror and friends, all generated from KEX_ERRNO_MAP.
 */
#include "core/errors.h"

#include <stdio.h>

const char *kex_strerror(int code) {
  switch (code) {
  case 0:
    return "success";
#define XX(name, value, msg, grpc) \
  case KEX_E##name:                \
    return msg;
    KEX_ERRNO_MAP(XX)
#undef XX
  }
  return "unknown error";
}

const char *kex_errname(int code) {
  switch (code) {
  case 0:
    return "OK";
#define XX(name, value, msg, grpc) \
  case KEX_E##name:                \
    return #name;
    KEX_ERRNO_MAP(XX)
#undef XX
  }
  return "UNKNOWN";
}

int kex_err_grpc_status(int code) {
  switch (code) {
  case 0:
    return KEX_GRPC_OK;
#define XX(name, value, msg, grpc) \
  case KEX_E##name:                \
    return KEX_GRPC_##grpc;
    KEX_ERRNO_MAP(XX)
#undef XX
  }
  return KEX_GRPC_UNKNOWN;
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

/*
 * strbuf.c - the growable text buffer of strbuf.h (capacity doubles from 256
 * bytes, or from what the owner preallocated).
 */
#include "core/strbuf.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

bool kex_strbuf_reserve(kex_strbuf *b, size_t extra) {
  if (b->oom) return false;
  if (b->len + extra + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = kex_realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->p = p;
  b->cap = cap;
  return true;
}

void kex_strbuf_vprintf(kex_strbuf *b, const char *fmt, va_list ap) {
  va_list ap2;
  int n;
  if (b->oom) return;
  va_copy(ap2, ap);
  n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->oom = true;
    return;
  }
  if (!kex_strbuf_reserve(b, (size_t)n)) return;
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  b->len += (size_t)n;
}

int kex_i64_text(long long v, char *out) {
  char tmp[KEX_I64_TEXT_MAX];
  unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v; /* LLONG_MIN too */
  int n = 0, k = 0;
  do {
    tmp[n++] = (char)('0' + (int)(u % 10));
    u /= 10;
  } while (u);
  if (v < 0) out[k++] = '-';
  while (n) out[k++] = tmp[--n];
  out[k] = 0;
  return k;
}

void kex_cut_put(char *buf, size_t len, size_t *pos, const char *t, size_t n) {
  size_t room = *pos < len ? len - *pos : 0;
  if (room) {
    size_t k = n < room - 1 ? n : room - 1;
    memcpy(buf + *pos, t, k);
    buf[*pos + k] = 0;
  }
  *pos += n;
}

void kex_strbuf_put(kex_strbuf *b, const char *s, size_t n) {
  if (!kex_strbuf_reserve(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void kex_strbuf_puts(kex_strbuf *b, const char *s) { kex_strbuf_put(b, s, strlen(s)); }

void kex_strbuf_i64(kex_strbuf *b, long long v) {
  char t[KEX_I64_TEXT_MAX];
  kex_strbuf_put(b, t, (size_t)kex_i64_text(v, t));
}

void kex_strbuf_printf(kex_strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kex_strbuf_vprintf(b, fmt, ap);
  va_end(ap);
}

int kex_strbuf_read(kex_strbuf *b, FILE *f, size_t max) {
  for (;;) {
    if (!kex_strbuf_reserve(b, 4096)) return -1;
    size_t got = fread(b->p + b->len, 1, b->cap - b->len - 1, f);
    b->len += got;
    b->p[b->len] = 0;
    if (b->len > max) return -1;
    if (got == 0) return ferror(f) ? -1 : 0;
  }
}

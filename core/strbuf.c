/*
 * strbuf.c - the growable text buffer of strbuf.h (capacity doubles from 256
 * bytes, or from what the owner preallocated).
 */
#include "core/strbuf.h"

#include <stdio.h>

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

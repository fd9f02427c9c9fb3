/*
 * strbuf.h - a growable, NUL-terminated text buffer on the heap.
 *
 * Appends never fail loudly: running out of memory sets `oom`, after which
 * every append is a no-op, so a writer checks once at the end.  A zeroed
 * kex_strbuf is empty; p stays NULL until the first append and is the
 * caller's to kex_free.
 */
#ifndef KEX_CORE_STRBUF_H
#define KEX_CORE_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct kex_strbuf {
  char *p;
  size_t len, cap; /* bytes used (without the NUL), bytes allocated */
  bool oom;
} kex_strbuf;

/* Room for extra more bytes and the NUL; false (and oom set) when out of memory. */
bool kex_strbuf_reserve(kex_strbuf *b, size_t extra);
void kex_strbuf_vprintf(kex_strbuf *b, const char *fmt, va_list ap);
void kex_strbuf_printf(kex_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * The cheap appends, for text built piece by piece (a Plan reply's AST
 * lines: through printf they were most of kexd's CPU for a Plan): n bytes
 * of s; a NUL-terminated s; v in decimal, as "%lld" writes it.
 */
void kex_strbuf_put(kex_strbuf *b, const char *s, size_t n);
void kex_strbuf_puts(kex_strbuf *b, const char *s);
void kex_strbuf_i64(kex_strbuf *b, long long v);
/*
 * n bytes of t appended at buf[*pos] the way snprintf appends into buf[len]: cut to what fits and
 * NUL-terminated (nothing written when *pos >= len), while *pos counts all n (a caller sizes its buffer from it).
 */
void kex_cut_put(char *buf, size_t len, size_t *pos, const char *t, size_t n);
/* v in decimal into out (at least KEX_I64_TEXT_MAX bytes), NUL-terminated; returns its length. */
#define KEX_I64_TEXT_MAX 21
int kex_i64_text(long long v, char *out);

/*
 * Appends what is left of f, and leaves p non-NULL even for an empty file.
 * 0, or -1 on a read error, when out of memory or when b would pass max
 * bytes.
 */
int kex_strbuf_read(kex_strbuf *b, FILE *f, size_t max);

#endif

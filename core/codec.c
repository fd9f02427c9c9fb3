/*
 * codec.c - SHA-256, hex and base64 over OpenSSL's libcrypto.
 *
 * base64 decoding is OpenSSL's EVP_DecodeBlock made strict: the text is
 * decoded a chunk at a time, then the bytes are encoded again with
 * EVP_EncodeBlock and compared with the text, so anything OpenSSL tolerates
 * that is not the one canonical padded form (whitespace, '=' inside the
 * text, stray bits after the last byte) is refused at the first character
 * that differs.
 */
#include "core/codec.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

#include <openssl/evp.h>

#include "core/alloc.h"
#include "core/errors.h"

/* ---- SHA-256 ---- */

int kex_sha256_init(kex_sha256 *s) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  s->ctx = ctx;
  if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(ctx);
    s->ctx = NULL;
    return KEX_ENOMEM;
  }
  return 0;
}

void kex_sha256_update(kex_sha256 *s, const void *data, size_t len) {
  if (s->ctx && len) EVP_DigestUpdate(s->ctx, data, len);
}

void kex_sha256_final(kex_sha256 *s, uint8_t out[32]) {
  unsigned int n = 0;
  if (!s->ctx || EVP_DigestFinal_ex(s->ctx, out, &n) != 1) memset(out, 0, 32);
  EVP_MD_CTX_free(s->ctx);
  s->ctx = NULL;
}

int kex_sha256_bytes(const void *data, size_t len, uint8_t out[32]) {
  unsigned int n = 0;
  if (EVP_Digest(len ? data : "", len, out, &n, EVP_sha256(), NULL) != 1) {
    memset(out, 0, 32);
    return KEX_ENOMEM;
  }
  return 0;
}

/* ---- hex ---- */

void kex_hex(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = digits[bytes[i] >> 4], out[2 * i + 1] = digits[bytes[i] & 15];
  out[2 * n] = 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int kex_unhex(const char *hex, uint8_t *bytes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(hex[2 * i]), lo = hi < 0 ? -1 : hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return KEX_EPARSE;
    bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  return hex[2 * n] ? KEX_EPARSE : 0;
}

/* ---- base64 ---- */

#define B64_CHUNK 768 /* bytes per EVP call (1,024 characters) */

char *kex_base64_encode(const void *data, size_t n) {
  const unsigned char *p = data;
  char *out = kex_malloc(4 * ((n + 2) / 3) + 1), *o = out;
  if (!out) return NULL;
  *o = 0;
  for (size_t i = 0; i < n; i += B64_CHUNK) {
    size_t k = n - i < B64_CHUNK ? n - i : B64_CHUNK;
    o += EVP_EncodeBlock((unsigned char *)o, p + i, (int)k);
  }
  return out;
}

int64_t kex_base64_decoded_len(const char *s, size_t len) {
  if (len % 4) return -1;
  if (len == 0) return 0;
  size_t pad = s[len - 1] == '=' ? (s[len - 2] == '=' ? 2 : 1) : 0;
  return (int64_t)(len / 4 * 3 - pad);
}

/* The first character of s[from..len) that cannot stand there: outside the alphabet, or a '=' that is not padding. */
static size_t first_bad(const char *s, size_t from, size_t len) {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t j = from; j < len; j++) {
    bool pad = s[j] == '=' && j + 2 >= len && (j + 1 == len || s[len - 1] == '=');
    if (!s[j] || (!strchr(alphabet, s[j]) && !pad)) return j;
  }
  return from;
}

int kex_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad) {
  size_t where = len - len % 4;
  int64_t total = kex_base64_decoded_len(s, len);
  if (total < 0) goto refuse;
  for (size_t i = 0, o = 0; i < len; i += B64_CHUNK / 3 * 4) {
    size_t chars = len - i < B64_CHUNK / 3 * 4 ? len - i : B64_CHUNK / 3 * 4;
    size_t bytes = i + chars == len ? (size_t)total - o : chars / 4 * 3;
    unsigned char raw[B64_CHUNK], again[B64_CHUNK / 3 * 4 + 1];
    if (EVP_DecodeBlock(raw, (const unsigned char *)s + i, (int)chars) < 0) {
      where = first_bad(s, i, len);
      goto refuse;
    }
    EVP_EncodeBlock(again, raw, (int)bytes);
    for (size_t j = 0; j < chars; j++) {
      if ((char)again[j] != s[i + j]) {
        where = i + j;
        goto refuse;
      }
    }
    memcpy(out + o, raw, bytes);
    o += bytes;
  }
  return 0;
refuse:
  if (bad) *bad = where;
  return KEX_EPARSE;
}

/*
 * codec.h - byte codecs every layer shares: SHA-256, hex and base64.
 *
 * SHA-256 and base64 come from OpenSSL's libcrypto (EVP); these are thin
 * wrappers so callers need no OpenSSL header and get kex error codes.  The
 * base64 decoder is strict (RFC 4648 section 4: the standard alphabet,
 * padded, no whitespace, canonical trailing bits), which is what the graph
 * format's inline "data" is; the encoder writes that same form.
 */
#ifndef KEX_CORE_CODEC_H
#define KEX_CORE_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* ---- SHA-256 ---- */

typedef struct kex_sha256 {
  void *ctx; /* EVP_MD_CTX */
} kex_sha256;

/* Start a streaming digest: 0, or KEX_ENOMEM. */
int kex_sha256_init(kex_sha256 *s);
void kex_sha256_update(kex_sha256 *s, const void *data, size_t len);
/* Write the digest and release the context. */
void kex_sha256_final(kex_sha256 *s, uint8_t out[32]);
/* One-shot digest of data[len]: 0, or KEX_ENOMEM (libcrypto could not allocate). */
int kex_sha256_bytes(const void *data, size_t len, uint8_t out[32]);

/* ---- hex ---- */

/* Lowercase hex of n bytes into out[2n+1] (NUL-terminated). */
void kex_hex(const uint8_t *bytes, size_t n, char *out);
/* Parse exactly 2n hex digits (either case) into bytes[n]: 0, or KEX_EPARSE. */
int kex_unhex(const char *hex, uint8_t *bytes, size_t n);

/* ---- base64 ---- */

/* The padded base64 text of data[n] as a NUL-terminated kex_malloc'd string (the caller frees it), or NULL when out
   of memory. */
char *kex_base64_encode(const void *data, size_t n);
/* How many bytes the base64 text s[len] decodes to, or -1 when len is not a multiple of 4. */
int64_t kex_base64_decoded_len(const char *s, size_t len);
/*
 * Decode the base64 text s[len] into out (kex_base64_decoded_len bytes).
 * Refuses any character outside the alphabet, '=' anywhere but the last one
 * or two places, and nonzero bits after the last full byte (a non-canonical
 * form).  0; KEX_EPARSE with *bad (when not NULL) set to the offset of the
 * first wrong character.
 */
int kex_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad);

#endif

/*
 * wire.c - a walk over a protobuf message's raw bytes that checks its
 * string fields (see wire.h).  Iterative over fields, recursive over nested
 * messages up to KEXD_WIRE_MAX_DEPTH.
 */
#include "daemon/wire.h"

#include <stdio.h>
#include <string.h>

#include "core/errors.h"

int kexd_wire_text_ok(const uint8_t *s, size_t n, size_t *bad_at) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    size_t k;
    uint32_t cp;
    if (c == 0) goto bad;
    if (c < 0x80) {
      i++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07;
    else goto bad;
    if (n - i <= k) goto bad;
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xc0) != 0x80) goto bad;
      cp = cp << 6 | (s[i + j] & 0x3f);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      goto bad;
    i += k + 1;
  }
  return 1;
bad:
  if (bad_at) *bad_at = i;
  return 0;
}

/* A varint at *p (< end); -1 when it runs past end or over 10 bytes. */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

/*
 * The dotted path of the fields names[0..n) into path[cap] (cut to fit).  Built only for an error message:
 * formatting it at every field was a tenth of kexd's CPU on a Plan of a few hundred nodes.
 */
static const char *path_of(const char *const *names, int n, char *path, size_t cap) {
  size_t len = 0;
  path[0] = '\0';
  for (int i = 0; i < n && len < cap - 1; i++) {
    int w = snprintf(path + len, cap - len, "%s%s", i ? "." : "", names[i]);
    len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
  }
  return path;
}

/* names[0..depth): the fields that lead to this message (names has KEXD_WIRE_MAX_DEPTH + 1 slots). */
static int walk(const ProtobufCMessageDescriptor *desc, const uint8_t *p, const uint8_t *end, const char **names,
                int depth, char *msg, size_t cap) {
  char path[256];
  while (p < end) {
    uint64_t tag, n;
    const ProtobufCFieldDescriptor *f;
    if (varint(&p, end, &tag) < 0) goto malformed;
    f = protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3));
    switch (tag & 7) {
    case 0:
      if (varint(&p, end, &n) < 0) goto malformed;
      break;
    case 1:
      if (end - p < 8) goto malformed;
      p += 8;
      break;
    case 5:
      if (end - p < 4) goto malformed;
      p += 4;
      break;
    case 2: {
      size_t bad = 0;
      if (varint(&p, end, &n) < 0 || n > (uint64_t)(end - p)) goto malformed;
      if (f) names[depth] = f->name;
      if (f && f->type == PROTOBUF_C_TYPE_STRING && !kexd_wire_text_ok(p, (size_t)n, &bad)) {
        snprintf(msg, cap, "field `%s` %s (byte %zu of %llu)", path_of(names, depth + 1, path, sizeof path),
                 memchr(p, 0, (size_t)n) && p[bad] == 0 ? "contains a NUL byte" : "is not valid UTF-8", bad,
                 (unsigned long long)n);
        return KEX_EINVAL;
      }
      if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
        int rc;
        if (depth >= KEXD_WIRE_MAX_DEPTH) {
          snprintf(msg, cap, "field `%s` nests messages more than %d deep", path_of(names, depth + 1, path, sizeof path),
                   KEXD_WIRE_MAX_DEPTH);
          return KEX_EINVAL;
        }
        if ((rc = walk(f->descriptor, p, p + n, names, depth + 1, msg, cap)) < 0) return rc;
      }
      p += n;
      break;
    }
    default: goto malformed;
    }
  }
  return 0;
malformed:
  path_of(names, depth, path, sizeof path);
  snprintf(msg, cap, "malformed bytes%s%s", *path ? " in " : "", path);
  return KEX_EINVAL;
}

int kexd_wire_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len, char *msg,
                            size_t cap) {
  const char *names[KEXD_WIRE_MAX_DEPTH + 1];
  return walk(desc, buf, buf + len, names, 0, msg, cap);
}

/*
 * wire.h - checks on a request's raw protobuf bytes that protobuf-c's
 * unpack cannot make (wire.c).
 *
 * protobuf-c hands string fields over as NUL-terminated copies and keeps no
 * length, so "TOKEN\0junk" would compare equal to TOKEN and a non-UTF-8 job
 * name would be stored and served back (breaking every client that decodes
 * it).  Before a request is used, kexd walks its bytes with the message's
 * descriptor and refuses any string field, at any depth, that holds a NUL
 * byte or is not valid UTF-8.
 */
#ifndef KEX_DAEMON_WIRE_H
#define KEX_DAEMON_WIRE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#define KEXD_WIRE_MAX_DEPTH 32 /* nested messages walked (the schema nests far less) */

/*
 * Check every string field of the message `desc` encoded in buf[0, len)
 * (which protobuf_c_message_unpack already accepted).  0, or KEX_EINVAL
 * with msg (cap bytes) naming the field path and what is wrong.
 */
int kexd_wire_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len, char *msg,
                            size_t cap);
/* True when s[0, n) is valid UTF-8 (no overlongs, no surrogates, at most U+10FFFF) with no NUL byte. */
int kexd_wire_text_ok(const uint8_t *s, size_t n, size_t *bad_at);

#endif

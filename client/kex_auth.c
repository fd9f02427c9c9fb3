/*
 * kex_auth.c - `kex auth token` (a new random token, and the entry that
 * admits it in kexd's --auth file) and `kex --server ADDR health` (the
 * grpc.health.v1 check a load balancer makes; it needs no token).
 *
 * The token is 32 bytes from OpenSSL's RAND_bytes as 64 hex digits; only
 * its SHA-256 goes into the file, so the file can be read by anyone who may
 * read kexd's configuration without giving them a token.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "client/kex_cli.h"

#define AUTH_TOKEN_BYTES 32

static void auth_usage(FILE *out) {
  fputs("usage: kex auth token [--name NAME] [--role user|admin]\n"
        "  print a new random token (give it to the tenant: kex --token TOKEN ..., KEX_TOKEN, or\n"
        "  kex.Client(token=...)) and, on the next line, the entry to put in the \"tenants\" array of\n"
        "  kexd's --auth file (only the token's SHA-256 is stored there); kill -HUP kexd reloads the file\n",
        out);
}

/* hex of n bytes into out (2n + 1 bytes). */
static void to_hex(const unsigned char *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

int kex_cmd_auth(int argc, char **argv) {
  const char *name = "NAME", *role = "user";
  unsigned char raw[AUTH_TOKEN_BYTES], h[EVP_MAX_MD_SIZE];
  char token[2 * AUTH_TOKEN_BYTES + 1], hash[2 * EVP_MAX_MD_SIZE + 1];
  unsigned int hl = 0;
  if (argc < 2 || strcmp(argv[1], "token") != 0) {
    auth_usage(argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? stdout : stderr);
    return argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? 0 : 2;
  }
  for (int i = 2; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--name") == 0) name = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--role") == 0) role = argv[++i];
    else {
      auth_usage(stderr);
      return 2;
    }
  }
  if (strcmp(role, "user") != 0 && strcmp(role, "admin") != 0) {
    fprintf(stderr, "kex auth token: --role must be user or admin\n");
    return 2;
  }
  if (strlen(name) > 64 || strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != strlen(name)) {
    fprintf(stderr, "kex auth token: --name must be 1-64 characters of A-Z a-z 0-9 . _ -\n");
    return 2;
  }
  if (RAND_bytes(raw, sizeof raw) != 1) {
    fprintf(stderr, "kex auth token: OpenSSL's random generator failed\n");
    return 1;
  }
  to_hex(raw, sizeof raw, token);
  if (!EVP_Digest(token, strlen(token), h, &hl, EVP_sha256(), NULL)) {
    fprintf(stderr, "kex auth token: SHA-256 failed\n");
    return 1;
  }
  to_hex(h, hl, hash);
  printf("%s\n{\"name\": \"%s\", \"role\": \"%s\", \"token_sha256\": \"%s\"}\n", token, name, role, hash);
  OPENSSL_cleanse(raw, sizeof raw);
  OPENSSL_cleanse(token, sizeof token);
  return 0;
}

#ifdef KEX_HAVE_LIBKEX
int kex_remote_cmd_health(kex_cli_remote *r, int argc, char **argv) {
  const char *service = "";
  kex_status st;
  bool serving = false;
  int rc;
  if (argc > 3 || (argc >= 2 && (strcmp(argv[1], "--service") != 0 || argc != 3))) {
    fprintf(stderr, "usage: kex --server ADDR health [--service NAME]\n");
    return 2;
  }
  if (argc == 3) service = argv[2];
  if ((rc = kex_cli_remote_open(r, "health", NULL, false))) return rc;
  if (kex_client_health(r->client, service, &serving, &st)) return kex_cli_fail("health", &st);
  printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
  return serving ? 0 : 1;
}
#endif

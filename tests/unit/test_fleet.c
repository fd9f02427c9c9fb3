/*
 * test_fleet.c - the fleet cache's pure parts (daemon/fleet.h): the
 * --fleet-cache URL parser on both sides of each limit, and the Redis key
 * (kex:v1:KIND:<SHA-256 of the whole SQLite key>): 64 hex digits, stable,
 * and different whenever any field of the key differs (each identity field,
 * the search options, the codegen version, the AST key, field boundaries).
 * The Redis side itself is tests/integration/test_fleet.sh (a real
 * redis-server and three kexds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/fleet.h"

static void test_url_ok(void **state) {
  (void)state;
  kexd_fleet_url u;
  assert_int_equal(kexd_fleet_parse_url("redis://127.0.0.1:6380/2", &u, NULL), 0);
  assert_string_equal(u.host, "127.0.0.1");
  assert_int_equal(u.port, 6380);
  assert_int_equal(u.db, 2);
  assert_string_equal(u.password, "");
  assert_int_equal(kexd_fleet_parse_url("redis://cache.internal", &u, NULL), 0);
  assert_string_equal(u.host, "cache.internal");
  assert_int_equal(u.port, 6379);
  assert_int_equal(u.db, 0);
  assert_int_equal(kexd_fleet_parse_url("redis://:s3cret@h:1/", &u, NULL), 0);
  assert_string_equal(u.user, "");
  assert_string_equal(u.password, "s3cret");
  assert_int_equal(u.port, 1);
  assert_int_equal(kexd_fleet_parse_url("redis://kex:pw@h:65535/15", &u, NULL), 0);
  assert_string_equal(u.user, "kex");
  assert_string_equal(u.password, "pw");
  assert_int_equal(u.port, 65535);
  assert_int_equal(u.db, 15);
}

static void test_url_bad(void **state) {
  (void)state;
  static const char *const bad[] = {
      NULL, "", "http://h", "rediss://h", "redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
      "redis://h:12x", "redis://h:", "redis://h/16", "redis://h/-1", "redis://h/x", "redis://h/1x",
      "redis://pw@h", "redis://:@h", "redis://u:@h",
  };
  kexd_fleet_url u;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kex_error err = {0};
    if (kexd_fleet_parse_url(bad[i], &u, &err) != KEX_EINVAL) fail_msg("accepted: %s", bad[i] ? bad[i] : "NULL");
    assert_true(err.msg[0] != 0);
  }
  /* the host limit, both sides; a password is never echoed */
  char url[KEXD_FLEET_HOST_MAX + 64];
  snprintf(url, sizeof url, "redis://%0*d", KEXD_FLEET_HOST_MAX - 1, 0);
  assert_int_equal(kexd_fleet_parse_url(url, &u, NULL), 0);
  snprintf(url, sizeof url, "redis://%0*d", KEXD_FLEET_HOST_MAX, 0);
  assert_int_equal(kexd_fleet_parse_url(url, &u, NULL), KEX_EINVAL);
  kex_error err = {0};
  assert_int_equal(kexd_fleet_parse_url("redis://:hunter2@:1", &u, &err), KEX_EINVAL);
  assert_null(strstr(err.msg, "hunter2"));
}

static kex_device_identity dev_a = {"cpu", "kex", "host-cc", "gcc-12", "cc -O2"};

static void key_of(const kex_device_identity *d, const char *sopts, const char *cg, uint8_t first, char *out) {
  kex_cache_beam_key k = {{0}, d, sopts, cg};
  k.ast_key[0] = first;
  assert_int_equal(kexd_fleet_key(&k, "beam", out, KEXD_FLEET_KEY_MAX), 0);
}

static void test_key(void **state) {
  (void)state;
  char a[KEXD_FLEET_KEY_MAX], b[KEXD_FLEET_KEY_MAX];
  key_of(&dev_a, "beam=1;cap=96", "kex.codegen.v1", 1, a);
  assert_int_equal(strlen(a), strlen("kex:v1:beam:") + 64);
  assert_memory_equal(a, "kex:v1:beam:", 12);
  key_of(&dev_a, "beam=1;cap=96", "kex.codegen.v1", 1, b);
  assert_string_equal(a, b); /* stable */
  key_of(&dev_a, "beam=2;cap=96", "kex.codegen.v1", 1, b);
  assert_string_not_equal(a, b);
  key_of(&dev_a, "beam=1;cap=96", "kex.codegen.v2", 1, b);
  assert_string_not_equal(a, b);
  key_of(&dev_a, "beam=1;cap=96", "kex.codegen.v1", 2, b);
  assert_string_not_equal(a, b);
  for (int f = 0; f < 5; f++) { /* each identity field */
    kex_device_identity d = dev_a;
    char *fields[] = {d.kind, d.vendor, d.name, d.driver_version, d.compiler_version};
    fields[f][0] ^= 1;
    key_of(&d, "beam=1;cap=96", "kex.codegen.v1", 1, b);
    assert_string_not_equal(a, b);
  }
  /* a field boundary moved: ("cpu", "kex") vs ("cpuk", "ex") */
  kex_device_identity d = dev_a;
  strcpy(d.kind, "cpuk");
  strcpy(d.vendor, "ex");
  key_of(&d, "beam=1;cap=96", "kex.codegen.v1", 1, b);
  assert_string_not_equal(a, b);
  /* the lease key has the same hash under its own prefix; a short buffer is KEX_ELIMIT */
  kex_cache_beam_key k = {{0}, &dev_a, "beam=1;cap=96", "kex.codegen.v1"};
  k.ast_key[0] = 1;
  assert_int_equal(kexd_fleet_key(&k, "lease", b, sizeof b), 0);
  assert_string_equal(b + strlen("kex:v1:lease:"), a + strlen("kex:v1:beam:"));
  assert_int_equal(kexd_fleet_key(&k, "beam", b, strlen(a)), KEX_ELIMIT);
  assert_int_equal(kexd_fleet_key(&k, "beam", b, strlen(a) + 1), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_url_ok),
      cmocka_unit_test(test_url_bad),
      cmocka_unit_test(test_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * tmpcache.c - the temporary cache file of tmpcache.h: a folder made with
 * mkdtemp under $TMPDIR (else /dev/shm when present, so SQLite's syncs stay
 * in memory, else /tmp), the cache opened there with kex_cache_open, and an
 * atexit hook that closes it and removes the file, its WAL and the folder.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/fuzz/tmpcache.h"

static char dir[512], path[600];
static kex_cache *cache;

static void cleanup(void) {
  static const char *const tails[] = {"", "-wal", "-shm", "-journal"};
  char p[640];
  kex_cache_close(cache);
  cache = NULL;
  for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
    snprintf(p, sizeof p, "%s%s", path, tails[i]);
    unlink(p);
  }
  rmdir(dir);
}

kex_cache *fuzz_tmpcache(void) {
  kex_error err;
  const char *base = getenv("TMPDIR");
  if (cache) return cache;
  if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(dir, sizeof dir, "%s/kex-fuzz-XXXXXX", base);
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    abort();
  }
  snprintf(path, sizeof path, "%s/cache.db", dir);
  if (kex_cache_open(path, &cache, &err) < 0) {
    fprintf(stderr, "kex_cache_open %s: %s\n", path, err.msg);
    abort();
  }
  atexit(cleanup);
  return cache;
}

const char *fuzz_tmpcache_path(void) { return path; }

/*
 * tmpcache.h - a real kex cache file (search/cache.c) in a fresh temporary
 * folder for the fuzz targets that read caches (fuzz_cache, fuzz_stream):
 * opened once per process, removed with its folder at exit.
 */
#ifndef KEX_TESTS_FUZZ_TMPCACHE_H
#define KEX_TESTS_FUZZ_TMPCACHE_H

#include "search/cache.h"

/* The open cache (created on the first call; the process aborts when it cannot be). */
kex_cache *fuzz_tmpcache(void);
/* Its file's path. */
const char *fuzz_tmpcache_path(void);

#endif

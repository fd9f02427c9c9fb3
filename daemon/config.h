/*
 * config.h - kexd's settings from flags and the environment (config.c).
 *
 * One table in config.c lists every flag with its environment variable,
 * type, range, default and help; kexd_config_parse fills a kexd_config from
 * it and kexd_config_usage prints it.  The defaults are the KEXD_* macros of
 * kexd.h and the KEX_LIMIT_* macros of core/limits.h.
 */
#ifndef KEX_DAEMON_CONFIG_H
#define KEX_DAEMON_CONFIG_H

#include <stdio.h>

#include "daemon/kexd.h"

/* Every field at its default (no flag, no environment). */
void kexd_config_defaults(kexd_config *cfg);
/*
 * Fill cfg from the defaults, the environment, then argv.  0; 1 after
 * --help was printed (exit 0); -1 after a message on stderr (exit 2).
 * cfg->cache_path is kex_malloc'd (the caller frees it); other strings
 * point into argv or the environment.
 */
int kexd_config_parse(kexd_config *cfg, int argc, char **argv);
/* The --help text: every flag, its default and its environment variable. */
void kexd_config_usage(FILE *out);

#endif

/*
 * fleet.h - the fleet cache: beam results shared between kexd nodes
 * through Redis (kexd --fleet-cache redis://HOST:PORT[/DB]), and one search
 * per kernel per fleet.
 *
 * What is shared: beam results only, as the export line of search/cache.h
 * (kex_cache_beam_line), under kex:v1:beam:<H>, where H is the SHA-256 of
 * the entry's whole SQLite key (AST key, the five device-identity fields,
 * search options, codegen version; kexd_fleet_key).  A node that misses in
 * its SQLite file GETs that key, validates the line exactly as ImportCache
 * does and only when it names this very key (kex_cache_import_line with an
 * expected key: another device's entry is never taken, even under a
 * colliding name), stores it in its own file, and the search then checks
 * its opts against the kernel like any cache entry.  Compiled binaries,
 * jobs and buffers are never shared: each node compiles from the source it
 * renders itself.
 *
 * One search per fleet: on a miss a node takes kex:v1:lease:<H> (SET NX PX
 * --fleet-lease) with a token of its own, renews it from a loop timer while
 * it searches, publishes the result and then deletes the lease only when it
 * still holds that token (a Lua compare-and-delete).  A node that finds the
 * lease taken polls the result key every KEXD_FLEET_POLL_MS and takes the
 * lease (and the search) over when the holder's lease expires, for at most
 * --fleet-wait-max.
 *
 * Threads: the Redis connection is hiredis' async API on kexd's libuv loop
 * (the loop never blocks on Redis).  Searches run on worker threads; each
 * Redis command they need is posted to the loop (uv_async) and waited for
 * at most --fleet-timeout; a command past it, a disconnected or never
 * reachable Redis, or a reply that does not validate makes the node search
 * locally (degrade, never fail).  An outage is logged once and its end once;
 * the loop reconnects with backoff (KEXD_FLEET_BACKOFF_MIN_S doubling to
 * KEXD_FLEET_BACKOFF_MAX_S), and KEXD_FLEET_SLOW_TIMEOUTS commands in a row
 * past --fleet-timeout drop the connection as down.
 */
#ifndef KEX_DAEMON_FLEET_H
#define KEX_DAEMON_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/errors.h"
#include "search/beam.h"
#include "search/cache.h"

struct kexd;

#define KEXD_FLEET_KEY_MAX 96                /* bytes of a Redis key, NUL included ("kex:v1:lease:" + 64 hex) */
#define KEXD_FLEET_HOST_MAX 256              /* bytes of the URL's host, NUL included */
#define KEXD_FLEET_SECRET_MAX 256            /* bytes of the URL's user or password, NUL included */
#define KEXD_FLEET_DB_MAX 15                 /* the largest /DB (Redis' default databases) */
#define KEXD_FLEET_VALUE_MAX (1u << 20)      /* bytes of one published beam line; larger ones are neither sent nor taken */
#define KEXD_FLEET_POLL_MS 100               /* a node waiting on a peer's lease looks for the result this often */
#define KEXD_FLEET_BACKOFF_MIN_S 0.1         /* reconnect backoff: first wait ... */
#define KEXD_FLEET_BACKOFF_MAX_S 5.0         /* ... doubling up to this */
#define KEXD_FLEET_SLOW_TIMEOUTS 3           /* commands in a row past --fleet-timeout that mark Redis down */
#define KEXD_FLEET_DEFAULT_LEASE_S 15.0      /* --fleet-lease */
#define KEXD_FLEET_LEASE_MAX_S 3600          /* --fleet-lease at most; a lease with a longer expiry (or none) is taken over */
#define KEXD_FLEET_UNSENT_MAX 256            /* results searched while Redis was down, kept to publish when it is back */
#define KEXD_FLEET_DEFAULT_TIMEOUT_S 0.5     /* --fleet-timeout */
#define KEXD_FLEET_DEFAULT_WAIT_MAX_S 600.0  /* --fleet-wait-max */

typedef struct kexd_fleet kexd_fleet;

/* A parsed redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (port 6379 and db 0 when absent). */
typedef struct kexd_fleet_url {
  char host[KEXD_FLEET_HOST_MAX];
  int port;
  int db;
  char user[KEXD_FLEET_SECRET_MAX];     /* "" unless given (Redis 6 ACL user) */
  char password[KEXD_FLEET_SECRET_MAX]; /* "" unless given */
} kexd_fleet_url;

/* Parse url into *out: 0, or KEX_EINVAL naming what is wrong (never echoing a password). */
int kexd_fleet_parse_url(const char *url, kexd_fleet_url *out, kex_error *err);
/* "kex:v1:<kind>:<64 hex of the SHA-256 of key>" into buf (kind "beam" or "lease"): 0, KEX_ELIMIT, KEX_ENOMEM. */
int kexd_fleet_key(const kex_cache_beam_key *key, const char *kind, char *buf, size_t len);

/* Start the fleet cache of d->cfg.fleet_cache on the loop thread (d->fleet; NULL when off).  0, or < 0 logged. */
int kexd_fleet_start(struct kexd *d);
/* Loop thread, at shutdown: stop timers, drop the connection (waiting searches go local), close the handles. */
void kexd_fleet_close(struct kexd *d);
/* After the loop ran out (no search is running): free d->fleet. */
void kexd_fleet_free(struct kexd *d);

typedef struct kexd_fleet_counters {
  const char *state;      /* "off", "up", "down" (searching locally, reconnecting), "connecting" */
  bool up;
  uint64_t hits;          /* beam results taken from the fleet (validated and stored in the SQLite file) */
  uint64_t published;     /* results this node published */
  uint64_t lease_waits;   /* searches that found a peer's lease and waited */
  uint64_t takeovers;     /* ... and took the lease over when it expired */
  uint64_t rejected;      /* values that did not validate or were for another key or device */
  uint64_t errors;        /* commands that failed or timed out, connection losses */
  uint64_t outages;       /* times Redis became unreachable */
} kexd_fleet_counters;
/* Any thread. */
void kexd_fleet_stats(const struct kexd *d, kexd_fleet_counters *out);

/* One search's hook (search/beam.h's kex_beam_remote): lives on the searching thread's stack. */
typedef struct kexd_fleet_search {
  kexd_fleet *f;
  kex_beam_remote hook;
  struct kexd_fleet_lease *lease; /* held while the search runs */
} kexd_fleet_search;
/* The hook for one search into s, or NULL when the fleet cache is off. */
const kex_beam_remote *kexd_fleet_hook(struct kexd *d, kexd_fleet_search *s);

#endif

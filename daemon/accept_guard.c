/*
 * accept_guard.c - accept4() for the linked gRPC: a cap on connections and
 * recovery from descriptor exhaustion (see accept_guard.h for why).
 *
 * gRPC calls accept4 on its own threads; the state is one mutex-protected
 * table.  Nothing here allocates after init, and every descriptor this file
 * opens is closed before it returns.
 */
#include "daemon/accept_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

#define GUARD_LOG_EVERY_MS 10000 /* a refusal is logged at most this often (with the count since) */
#define GUARD_PRUNE_EVERY_MS 20  /* a full table is re-checked at most this often */

typedef struct conn {
  int fd;
  dev_t dev;
  ino_t ino;
} conn;

static struct {
  pthread_mutex_t lock;
  bool on;
  int reserve;       /* a descriptor kept free for the EMFILE path; -1 when none */
  uint32_t max, n;   /* cap, entries in conns */
  conn *conns;       /* [max] */
  uint64_t accepted, refused_limit, refused_fds;
  uint64_t last_log_ms, last_prune_ms, unlogged;
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .reserve = -1};

static atomic_int G_passed_fd = -1; /* a listener that is not gRPC's (metrics.c): accepted unguarded, uncounted */

void kexd_accept_guard_pass(int listen_fd) { atomic_store(&G_passed_fd, listen_fd); }

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int sys_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

void kexd_accept_guard_init(uint32_t max_connections) {
  pthread_mutex_lock(&G.lock);
  if (!G.on && max_connections) {
    G.conns = kex_calloc(max_connections, sizeof *G.conns);
    if (G.conns) {
      G.max = max_connections;
      G.reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
      G.on = true;
    } else {
      KEX_ERROR("accept guard: out of memory for %u connections; connections are not capped", max_connections);
    }
  }
  pthread_mutex_unlock(&G.lock);
}

/* Drop the entries whose descriptor was closed (or now names another file).  Lock held. */
static void prune(void) {
  struct stat st;
  uint32_t w = 0;
  for (uint32_t i = 0; i < G.n; i++) {
    conn *c = &G.conns[i];
    if (fstat(c->fd, &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino) G.conns[w++] = *c;
  }
  G.n = w;
  G.last_prune_ms = now_ms();
}

/* Log a refusal at most every GUARD_LOG_EVERY_MS.  Lock held. */
static void log_refusal(const char *why) {
  uint64_t t = now_ms();
  G.unlogged++;
  if (G.last_log_ms && t - G.last_log_ms < GUARD_LOG_EVERY_MS) return;
  KEX_WARN("connections: closed %llu at accept (%s; %u open, --max-connections %u)", (unsigned long long)G.unlogged,
           why, G.n, G.max);
  G.last_log_ms = t;
  G.unlogged = 0;
}

/*
 * Remember descriptor fd as a connection; false when the table is full even
 * after pruning (the caller closes it).  Lock held.
 */
static bool admit(int fd) {
  struct stat st;
  if (fstat(fd, &st) < 0) return true; /* cannot happen for a fresh socket; never refuse on it */
  for (uint32_t i = 0; i < G.n; i++)
    if (G.conns[i].fd == fd) { /* that number was closed and reused: the old entry is stale */
      G.conns[i].dev = st.st_dev;
      G.conns[i].ino = st.st_ino;
      return true;
    }
  if (G.n == G.max && now_ms() - G.last_prune_ms >= GUARD_PRUNE_EVERY_MS) prune();
  if (G.n == G.max) return false;
  G.conns[G.n++] = (conn){fd, st.st_dev, st.st_ino};
  return true;
}

/*
 * No descriptor is free: take the reserved one back, accept the waiting
 * connection and close it, reserve again.  True when a connection was
 * dropped (try the next), false when none was waiting.  Lock held.
 */
static bool drop_one(int fd) {
  int c;
  if (G.reserve >= 0) close(G.reserve);
  c = sys_accept4(fd, NULL, NULL, SOCK_CLOEXEC);
  if (c >= 0) close(c);
  G.reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (c < 0) return false;
  G.refused_fds++;
  log_refusal("no descriptor free");
  return true;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  socklen_t len0 = len ? *len : 0;
  for (;;) {
    int c, e;
    if (len) *len = len0;
    c = sys_accept4(fd, addr, len, flags);
    e = errno;
    if (!G.on || fd == atomic_load(&G_passed_fd)) return c;
    pthread_mutex_lock(&G.lock);
    if (c >= 0) {
      if (admit(c)) {
        G.accepted++;
        pthread_mutex_unlock(&G.lock);
        return c;
      }
      close(c);
      G.refused_limit++;
      log_refusal("over the connection limit");
      pthread_mutex_unlock(&G.lock);
      continue; /* drain the backlog: gRPC's listener waits for an edge that may not come again */
    }
    if ((e == EMFILE || e == ENFILE) && drop_one(fd)) {
      pthread_mutex_unlock(&G.lock);
      continue;
    }
    pthread_mutex_unlock(&G.lock);
    errno = (e == EMFILE || e == ENFILE) ? EAGAIN : e; /* nothing left waiting: the listener stays armed */
    return -1;
  }
}

void kexd_accept_guard_stats(kexd_accept_stats *out) {
  pthread_mutex_lock(&G.lock);
  if (G.on) prune();
  out->open = G.n;
  out->max = G.max;
  out->accepted = G.accepted;
  out->refused_limit = G.refused_limit;
  out->refused_fds = G.refused_fds;
  pthread_mutex_unlock(&G.lock);
}

/*
 * accept_guard.h - kexd's bound on connections and its recovery from
 * descriptor exhaustion, below the linked gRPC (accept_guard.c).
 *
 * gRPC 1.51's listener (src/core/lib/iomgr/tcp_server_posix.cc, on_read)
 * stops accepting for good at the first accept4() error other than EAGAIN:
 * one burst of connections that exhausts the descriptors leaves kexd
 * refusing every later client.  kexd defines accept4() itself, so the call
 * gRPC makes lands here first (symbol interposition: the executable's
 * definition wins over libc's).  The guard:
 *
 *  - on EMFILE/ENFILE, frees a reserved descriptor, accepts the waiting
 *    connection and closes it at once, re-reserves, and repeats until the
 *    backlog is empty; then returns EAGAIN, which gRPC treats as "wait for
 *    the next connection" -- the listener never dies;
 *  - counts the connections it handed to gRPC (each remembered as its
 *    descriptor's device and inode, so a closed one is noticed with fstat
 *    when the table is full) and closes at accept any connection over the
 *    cap (--max-connections).
 *
 * Before kexd_accept_guard_init, accept4 is a plain system call.
 */
#ifndef KEX_DAEMON_ACCEPT_GUARD_H
#define KEX_DAEMON_ACCEPT_GUARD_H

#include <stdint.h>

/* Start guarding with a cap of max_connections (>= 1).  Call once, before the server starts. */
void kexd_accept_guard_init(uint32_t max_connections);

/*
 * Accept on listen_fd as a plain system call: neither counted nor capped
 * (the metrics listener, whose connections libmicrohttpd bounds itself).
 * -1 ends the exemption.  Any thread.
 */
void kexd_accept_guard_pass(int listen_fd);

typedef struct kexd_accept_stats {
  uint32_t open;           /* connections open now (closed ones pruned first) */
  uint32_t max;            /* the cap */
  uint64_t accepted;       /* handed to gRPC */
  uint64_t refused_limit;  /* closed at accept: over the cap */
  uint64_t refused_fds;    /* closed at accept: no descriptor was free */
} kexd_accept_stats;
/* The counters (any thread). */
void kexd_accept_guard_stats(kexd_accept_stats *out);

#endif

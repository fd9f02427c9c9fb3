/*
 * kexd.h - the daemon's configuration and its one state object.
 *
 * main.c fills a kexd_config from flags and environment; the kexd object
 * holds everything the loop thread owns (server, jobs, counters).  rpc.c
 * registers the method handlers on the server.
 */
#ifndef KEX_DAEMON_KEXD_H
#define KEX_DAEMON_KEXD_H

#include <stdint.h>
#include <uv.h>

#include "codegen/target.h"
#include "core/limits.h"
#include "daemon/dispatch.h"
#include "daemon/jobs.h"
#include "daemon/metrics.h"
#include "daemon/server.h"

#define KEXD_DEVICE_NAME_MAX KEXD_DISPATCH_NAME_MAX /* bytes of one device name */
#define KEXD_DEFAULT_LISTEN "127.0.0.1:50051"
#define KEXD_DEFAULT_DEVICES "opencl,cpu"
#define KEXD_DEFAULT_LEASE_S 600.0
#define KEXD_DEFAULT_GRACE_S 5.0
#define KEXD_DEFAULT_MAX_MESSAGE (64 << 20)  /* bytes of one gRPC message, either way */
#define KEXD_DEFAULT_PLAN_INLINE_NODES 1024  /* larger graphs are planned on the worker pool */
#define KEXD_DEFAULT_PLAN_WARM_BYTES (8u << 20) /* Plan: each thread's warm replay state (0 = off) */
#define KEXD_DOWNLOAD_CHUNK (1u << 20)       /* bytes per Download chunk unless the client asks for fewer */
#define KEXD_BUSY_MAX_ITEMS 100000           /* _BusyWork: items per call */
#define KEXD_BUSY_MAX_MS 1000.0              /* _BusyWork: ms per item */
#define KEXD_DEFAULT_INLINE_OUTPUT (64u << 10) /* Submit: outputs up to this many bytes come back inline */
#define KEXD_DEFAULT_SCHEDULE_CACHE 128      /* Submit: graph structures whose schedule and programs are kept */
#define KEXD_BEAM_MAX_LIMIT 65536            /* Tune/Submit: beam.max_upcast and beam.max_local at most */
#define KEXD_TUNE_SOURCES 256                /* GetCacheEntry: rendered sources remembered (cache_rpc.c) */
/* limits on what one client may take (each a flag, config.c, unless fixed here) */
#define KEXD_LIMIT_WEIGHT 1000               /* the largest job weight (fair-queueing share) */
#define KEXD_PEER_MAX 128                    /* bytes of a client address kept per job */
#define KEXD_LIMIT_JOBS_PER_PEER 64          /* jobs one client address may hold open */
#define KEXD_LIMIT_JOBS_PER_TENANT 256       /* jobs an --auth tenant without max_jobs may hold open */
#define KEXD_DEFAULT_TENANT_COMPILE_BUDGET_S 0.0 /* compile seconds per hour of a tenant without max_compile_seconds
                                                    (0: unlimited, so no tinygrad program is refused by default) */
#define KEXD_DEFAULT_JOB_MEMORY (1ull << 30) /* memory limit of a job that asks for 0 */
#define KEXD_LIMIT_JOB_MEMORY (16ull << 30)  /* the largest memory limit a job may ask for */
#define KEXD_LIMIT_IMPORT_BYTES (64ull << 20) /* ImportCache: bytes of one import stream */
#define KEXD_LIMIT_IMPORT_STREAMS 4          /* ImportCache: streams at once */
#define KEXD_LIMIT_DOWNLOAD_CHUNK_MIN (64u << 10) /* Download: the smallest chunk_bytes */
#define KEXD_LIMIT_CONNECTIONS 1024          /* default connections at once, when the descriptors allow */
#define KEXD_DESCRIPTOR_RESERVE 64           /* descriptors kept for kexd itself when sizing connections */
#define KEXD_DEFAULT_IDLE_TIMEOUT_S 300.0    /* a connection with no call this long is closed */
#define KEXD_DEFAULT_HANDSHAKE_TIMEOUT_S 10.0 /* a connection must finish the HTTP/2 handshake this fast */
#define KEXD_DEFAULT_KEEPALIVE_S 60.0        /* idle connections are pinged this often */
#define KEXD_LIMIT_STREAMS 128               /* calls at once on one connection */
#define KEXD_DEFAULT_MAX_PROGRAMS 1024       /* programs loaded per device (least recently used unloaded beyond) */
#define KEXD_DEFAULT_COMPILE_SLOTS 2         /* kernels compiled at once per device */
#define KEXD_DEFAULT_COMPILE_TIMEOUT_S 3600.0 /* one compile at most: a hang guard (a 1,000-sin kernel took over 10 min on PoCL) */
#define KEXD_DEFAULT_KERNEL_TIME_LIMIT_S 10.0 /* seconds one kernel may run (0: none) */
#define KEXD_DEFAULT_LAUNCH_QUANTUM_S 0.002  /* device time of the kernels one fair-queue item launches together */
#define KEXD_LIMIT_PEM_BYTES (1u << 20)      /* bytes of one --tls-cert, --tls-key or --tls-client-ca file */
#define KEXD_LIMIT_SUBMITS_PER_JOB 16        /* Submit calls in flight per job */
#define KEXD_LIMIT_KEPT_GRAPHS 64            /* graphs one job keeps (Submit keep_as) */
#define KEXD_LIMIT_KEPT_GRAPH_BYTES (64u << 20) /* bytes of the graphs one job keeps */
#define KEXD_LIMIT_TUNES_PER_DEVICE 4        /* searches at once per device (Tune, Submit with beam.beam_width) */
#define KEXD_LIMIT_SEARCH_QUEUE 64           /* searches waiting for a slot per device */
#define KEXD_LIMIT_SEARCH_QUEUE_PER_PAYER 16 /* ... of them one payer's (the tenant with --auth, else the job) */
#define KEXD_LIMIT_SEARCH_QUEUE_MAX 4096     /* the largest --max-search-queue (a freed slot's pick reads the line) */
#define KEXD_LIMIT_BEAM 16                   /* the widest beam a Submit or Tune may ask for */

typedef struct kexd_config {
  const char *listen;
  const char *node_name;         /* --node-name: this node's name in a fleet (default: listen) */
  const char *advertise;         /* --advertise: the address clients reach this node at (default: listen) */
  const char *tls_cert, *tls_key; /* PEM files: serve TLS (both or neither) */
  const char *tls_client_ca;     /* PEM file: require client certificates it verifies (needs tls_cert) */
  const char *metrics;           /* --metrics / KEX_METRICS: the Prometheus endpoint's HOST:PORT, or "off" */
  bool metrics_default;          /* metrics is the default address (no flag, no KEX_METRICS): taken, it is skipped */
  const char *auth;              /* --auth / KEX_AUTH: the tenants file (auth.c); NULL: no tokens checked */
  bool insecure;                 /* --insecure: allow a non-loopback --listen without --auth and TLS */
  uint32_t max_submits_per_job;  /* Submit calls in flight per job */
  uint32_t max_kept_graphs;      /* graphs one job keeps (Submit keep_as; least recently used go first) */
  uint64_t max_kept_graph_bytes; /* bytes of the graphs one job keeps */
  uint32_t max_tunes_per_device; /* searches at once per device (Tune, Submit with beam.beam_width) */
  uint32_t max_search_queue;     /* searches waiting for a slot per device (0: none wait, refused at once) */
  uint32_t max_search_queue_per_payer; /* ... of them one payer's */
  uint32_t max_beam;             /* the widest beam a Submit or Tune may ask for */
  const char *fleet_cache;       /* --fleet-cache / KEX_FLEET_CACHE: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], or NULL */
  double fleet_lease_s;          /* a search's lease on its kernel in the fleet (renewed while it runs) */
  double fleet_timeout_s;        /* one Redis command waits at most this long, then the node searches locally */
  double fleet_wait_max_s;       /* a search waits at most this long for a peer's result */
  char *cache_path;              /* the SQLite cache file: programs (Submit) and beam results (Tune, beam Submit) */
  uint32_t beam;                 /* --beam / KEX_BEAM: Submit's beam width when the request says 0 (0 = hand-coded);
                                    Tune's when the request says 0 (2 when this is 0 too) */
  char devices[KEXD_MAX_DEVICES][KEXD_DEVICE_NAME_MAX];
  uint32_t ndevices;             /* devices[0] is the default */
  uint32_t workers;              /* the process pool's threads (0: core/pool.h's default) */
  double lease_s, grace_s;
  int max_message;
  kex_limits limits;
  uint32_t max_jobs;
  uint32_t max_jobs_per_peer;    /* jobs one client address may hold */
  uint32_t tenant_max_jobs;      /* jobs an --auth tenant whose entry has no max_jobs may hold */
  double tenant_compile_budget_s; /* compile seconds per hour of an --auth tenant without max_compile_seconds (0: unlimited) */
  double job_evict_idle_s;       /* a full job table closes the job idle longest, if idle this long */
  uint64_t job_memory_default;   /* OpenJob memory_limit 0 gets this */
  uint64_t job_memory_max;       /* an OpenJob memory_limit over this is refused */
  uint32_t max_weight;           /* an OpenJob weight over this is refused */
  uint32_t max_buffers_per_job;  /* buffers one job may hold */
  uint32_t max_connections;      /* 0: sized from the descriptor limit at start */
  double idle_timeout_s, handshake_timeout_s, keepalive_s;
  uint32_t max_streams;          /* calls at once on one connection */
  uint64_t import_max_bytes;     /* ImportCache: bytes per stream */
  uint32_t import_streams;       /* ImportCache: streams at once */
  uint32_t download_chunk_min;   /* Download: smallest chunk_bytes */
  uint32_t max_programs;         /* Submit: programs loaded per device */
  uint32_t compile_slots;        /* Submit: compiles per device at once */
  double compile_timeout_s;      /* one kernel's compile at most (0: none) */
  double kernel_time_limit_s;    /* seconds one kernel may run (0: none) */
  double launch_quantum_s;       /* a job's ready kernels go to the device back to back, this much device time
                                    (estimated from the plan's last run) per fair-queue item */
  uint32_t plan_inline_nodes;
  uint64_t plan_warm_bytes;      /* Plan: each thread's warm replay state at most (0 = off) */
  bool test_busy_work;           /* registers /kex.v1.Kex/_BusyWork (tests only) */
  uint64_t inline_output_max;    /* Submit: default inline_output_max_bytes */
  uint32_t schedule_cache;       /* Submit: structure-cache entries (0 = off) */
  int test_fault_kind;           /* -1, or a kex_fault_kind the compile device fails (tests only) */
  unsigned long test_fault_n;    /* ... at its n-th call */
} kexd_config;

typedef struct kexd {
  uv_loop_t *loop;
  kexd_config cfg;
  kexd_server *server;
  kexd_jobs jobs;
  kexd_dispatch *disp;           /* the device runners */
  kex_target targets[KEXD_MAX_DEVICES]; /* each configured device as codegen sees it (main.c, at start) */
  uint64_t uploads, downloads, upload_errors;
  uint64_t started_ms;
  uint64_t submissions, plans, plan_errors, kernels_planned;
  uint32_t plans_in_flight;
  /* Submit (submit.c) */
  struct kexd_submitter *submitter;
  /* the engine of each device (realize/engine.h: compile slots, the program stage) and their SQLite connections */
  struct kex_engine *engines[KEXD_MAX_DEVICES];
  struct kex_cache_conns *conns;
  struct kexd_workq *workq;      /* the loop's pool work (work.c) */
  uint64_t submissions_done, submissions_failed;
  uint64_t sched_cache_hits, sched_cache_misses;
  uint64_t prog_cache_memory_hits;   /* SQLite hits and compiles: the engines' stats */
  kexd_histogram submit_seconds; /* arrival to done event, submissions that succeeded */
  double kernel_seconds;         /* device seconds Submit's kernels ran */
  kexd_metrics *metrics;         /* --metrics (metrics.c); NULL when off */
  /* --auth (auth.c, request.c) */
  struct kexd_auth *auth;        /* the tenants now; NULL without --auth */
  uint64_t auth_reloads, auth_reload_errors, unauthenticated, permission_denied;
  uint32_t tunes_active[KEXD_MAX_DEVICES]; /* searches holding a slot per device (--max-tunes-per-device) */
  struct kexd_searches *searches; /* the lines of searches waiting for a slot, their payers (searches.c) */
  void *rpc_routes;             /* the method table's per-method server data (rpc.c), kex_malloc'd */
  struct kexd_streams *streams;  /* the server-stream writers' hub (stream.c) */
  /* Tune and Submit's beam hook (tune.c) */
  struct kexd_tuner *tuner;
  struct kexd_fleet *fleet;      /* --fleet-cache (fleet.c); NULL when off */
  /* the beam cache RPCs (cache_rpc.c) */
  struct kexd_cache_rpc *cache_rpc;
  uint32_t imports_active;       /* ImportCache streams open now (--import-streams) */
  /* devices/ discovery (KEXD_HAVE_DEVICES), done once at the first ListDevices */
  void *device_descs;            /* kex_device_desc[], kex_malloc'd */
  size_t ndevice_descs;
  int devices_listed;            /* 0 not yet, 1 done, <0 the error it gave */
} kexd;

/* Register every kex.v1.Kex and grpc.health.v1.Health method.  0 or a negative code. */
int kexd_rpc_register(kexd *d);

#endif

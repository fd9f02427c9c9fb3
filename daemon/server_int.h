/*
 * server_int.h - the server's private types, shared by server.c (the
 * completion-queue thread, the call state machine, shutdown) and call.c
 * (what a handler reads about its call).  Nothing outside those two files
 * includes it: the rest of kexd sees only server.h.
 */
#ifndef KEXD_SERVER_INT_H
#define KEXD_SERVER_INT_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stddef.h>
#include <uv.h>

#include "daemon/bridge.h"
#include "daemon/server.h"

typedef struct tag tag;
struct tag {
  tag *next;    /* link in the cq -> loop FIFO */
  int success;  /* grpc_event.success, set by the cq thread */
  void (*fn)(tag *t);
};

typedef struct method {
  char *path;
  kexd_payload payload;
  kexd_handler fn;
  void *ud;
  void *registered; /* grpc_server_register_method handle */
  uint64_t codes[KEXD_STATUS_CODES]; /* calls finished, by status (metrics) */
} method;

struct kexd_call {
  kexd_server *srv;
  const method *m;     /* NULL for a generic request until routed */
  bool generic;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_call_details details; /* generic requests */
  grpc_byte_buffer *payload; /* the request message */
  char *method_name;   /* generic: the path the client called */
  tag t_new, t_close, t_recv, t_write, t_finish, t_read;
  grpc_byte_buffer *write_bb, *finish_bb, *read_bb;
  int close_cancelled; /* RECV_CLOSE_ON_SERVER out-param */
  int refs;
  bool active;         /* a handler owns it (between dispatch and finish) */
  bool finished, cancelled, initial_md_sent, writing, reading;
  void (*write_done)(kexd_call *, int, void *);
  void *write_ud;
  void (*finish_done)(kexd_call *, int, void *);
  void *finish_ud;
  kexd_read_cb read_done;
  void *read_ud;
  void (*on_cancel)(kexd_call *, void *);
  void (*on_stop)(kexd_call *, void *);
  void *hook_ud;
  kexd_call *prev, *next; /* the server's list of active calls */
  gpr_timespec arrived;
  max_align_t ext[];   /* opts.call_ext_size bytes for the gate and on_end hooks */
};

struct kexd_server {
  uv_loop_t *loop;
  kexd_server_opts opts;
  char *listen;
  grpc_server *server;
  grpc_completion_queue *cq;
  method *methods;
  uint32_t nmethods, capmethods;
  int port;
  /* cq thread <-> loop */
  kexd_wake wake;            /* the loop bridge (bridge.h): the cq thread wakes the loop */
  uv_prepare_t harvest; /* before the loop sleeps, when a stream write is out: its completion, run at once */
  bool harvest_due;     /* a stream message write started since the last harvest */
  pthread_t cq_thread;
  bool thread_started, thread_joined;
  pthread_mutex_t lock; /* protects head, tail and cq_done: all the cq thread touches */
  tag *head, *tail;
  bool cq_done;
  /* lifecycle (loop thread) */
  bool started, stopping, shutdown_done, server_destroyed;
  tag t_shutdown;
  uv_timer_t grace;
  int handles_open;
  uint32_t nobjects;   /* call objects alive (posted requests included) */
  uint32_t nactive;
  kexd_call *active;
  kexd_server_stats stats;
  uint64_t unknown_codes[KEXD_STATUS_CODES]; /* calls to unregistered paths, by status */
};

#endif

/*
 * stream.h - the one writer of a call whose work runs off the loop thread:
 * events queued from any thread, written to the call's server stream one
 * at a time by the loop thread, then the final status (with or without a
 * last message), and the owner freed once nothing of the call is in flight.
 *
 * An owner (Tune's call, a cache RPC, a Download, a health Watch, a
 * HoldJob, ...) embeds a
 * kexd_stream and gives it four callbacks (kexd_stream_ops).  The stream
 * "pumps" on the loop thread: while no write is outstanding and the call
 * is not over, it hands the next queued event to ops->event (which writes
 * it with kexd_stream_write, or drops it); when nothing is queued and the
 * owner holds no work in flight (kexd_stream_hold/unhold), it calls
 * ops->drained, which writes one more message, starts more work (a hold),
 * ends the call (kexd_stream_finish / _failf / _finish_last), or does
 * nothing (the owner pumps again when it has more: kexd_stream_pump).  A write that fails, or
 * a client cancel (the stream installs the call's cancel hook), makes the
 * stream dead: ops->cancelled tells the owner to stop its work, a broken
 * write ends the call CANCELLED ("<name>: the stream broke").  Work that
 * must finish before the owner is freed but must not delay the final
 * status (device items still draining after a failure) takes a reference
 * instead of a hold (kexd_stream_ref/unref).  Once the call is over
 * (finished or dead), no write is outstanding, nothing is held or
 * referenced and no pump is running, ops->release frees the owner: exactly
 * once.
 *
 * Buffered writes: an event written while another is queued behind it, or
 * while ops->more says the owner writes again soon (its end is known, or a
 * Submit's quick device chain is out), goes with kexd_call_write_more: gRPC
 * keeps it and sends it in one TCP write with the next (server.h).  Events
 * still leave in order, one message each, and a write is buffered only
 * when a next one is sure to follow (a queued event, or the owner's promise
 * through ops->more), so no event waits for one that never comes.
 *
 * Threads: kexd_stream_push may be called from any thread (it wakes the
 * loop through the hub's async handle when called off the loop); every
 * other function, and every callback, runs on the loop thread.  Work that
 * pushes events must be held (kexd_stream_hold before it starts, unhold
 * when it is back on the loop), so the owner cannot be released under it.
 *
 * A pushed event belongs to the stream: it must be kex_malloc'd with its
 * kexd_stream_ev as the first member; the stream kex_free()s it after
 * ops->event returns, or when the stream ends with events still queued.
 */
#ifndef KEX_DAEMON_STREAM_H
#define KEX_DAEMON_STREAM_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/server.h"

/* The daemon's one hub: the lock of every stream's queue and the async handle that wakes the loop. */
typedef struct kexd_streams kexd_streams;

/* Create the hub on `loop`, from the loop thread.  0 or KEX_ENOMEM / KEX_EINTERNAL. */
int kexd_streams_new(uv_loop_t *loop, kexd_streams **out);
/* Close the async handle (with the loop's other handles); later pushes wake nobody (their owner pumps). */
void kexd_streams_close(kexd_streams *h);
/* Free the hub after the loop ran out. */
void kexd_streams_free(kexd_streams *h);

typedef struct kexd_stream_ev {
  struct kexd_stream_ev *next;
} kexd_stream_ev;

typedef struct kexd_stream_ops {
  const char *name; /* the method, "Tune": what the stream's own status messages name */
  /* Write ev with kexd_stream_write, or drop it.  The stream frees ev afterwards.  Needed when events are pushed. */
  void (*event)(void *owner, kexd_stream_ev *ev);
  /* Nothing queued, held or being written: write a message, hold for more work, finish, or wait (do nothing). */
  void (*drained)(void *owner);
  /* The client cancelled or a write failed: stop the work (optional; the call is over). */
  void (*cancelled)(void *owner);
  /* The call is over and nothing is in flight: free the owner (the stream is part of it). */
  void (*release)(void *owner);
  /* kexd is stopping (optional: the call's stop hook; without it the call gets the grace period to end). */
  void (*stopping)(void *owner);
  /* Nothing is queued: true when the owner will write again (or end the call) as soon as the current write
     completes, so that write may wait in gRPC's buffer and go out with the next (optional). */
  bool (*more)(void *owner);
} kexd_stream_ops;

typedef struct kexd_stream {
  kexd_streams *hub;
  kexd_call *call;
  const kexd_stream_ops *ops;
  void *owner;
  uint32_t held;              /* owner work in flight that may still produce messages */
  uint32_t refs;              /* owner work in flight that only keeps the owner alive */
  uint32_t acts;              /* writes, holds, finishes and pushes so far (a drained that did none waits) */
  bool writing, dead, ended, pumping, repump;
  bool more;                  /* the event being handed to ops->event has a next one: its write may be buffered */
  bool delivered;             /* kexd_stream_finish_last: its batch (the last message and the status) went out */
  /* hub lock */
  kexd_stream_ev *head, *tail;
  bool dirty;                 /* on the hub's list of streams with events to write */
  struct kexd_stream *dirty_next;
} kexd_stream;

/*
 * Start the stream of call c (the handler's reference stays the
 * handler's: it is released by the finish): take the stream's own call
 * reference, install the cancel hook.  The owner usually holds work next,
 * or pumps.
 */
void kexd_stream_start(kexd_stream *st, kexd_streams *hub, kexd_call *c, const kexd_stream_ops *ops, void *owner);
/* The owner starts work that will come back to the loop (a pool job, a device item, a read). */
void kexd_stream_hold(kexd_stream *st);
/* That work is back: pump.  The owner may be released before this returns. */
void kexd_stream_unhold(kexd_stream *st);
/* Work that only keeps the owner alive (it does not delay ops->drained) starts / is back (may release). */
void kexd_stream_ref(kexd_stream *st);
void kexd_stream_unref(kexd_stream *st);
/* Any thread: queue ev for ops->event (see above for who frees it). */
void kexd_stream_push(kexd_stream *st, kexd_stream_ev *ev);
/* The owner has more to say (its own queue, a final status now ready): pump.  May release the owner. */
void kexd_stream_pump(kexd_stream *st);
/*
 * Write msg as the next stream message (packed at once: msg need not
 * outlive the call).  0; KEX_EINVAL (a write is outstanding or the call is
 * over); KEX_ELIMIT (over --max-message); KEX_EINTERNAL.  When the call was
 * cancelled the stream is dead.  The owner decides what a failure means
 * (skip a progress event; end the call).
 */
int kexd_stream_write(kexd_stream *st, const ProtobufCMessage *msg);
/* End the call (kexd_call_finish: status, details, an optional last message).  Idempotent. */
void kexd_stream_finish(kexd_stream *st, int status, const char *details, const ProtobufCMessage *msg);
void kexd_stream_failf(kexd_stream *st, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/*
 * End the call OK with msg as its last message, in one batch with the
 * status (no hop between them).  The owner is released once that batch
 * completed; kexd_stream_delivered then tells whether it went out (the
 * client has msg).  Idempotent with the other finishes.
 */
void kexd_stream_finish_last(kexd_stream *st, const ProtobufCMessage *msg);
bool kexd_stream_delivered(const kexd_stream *st);
/* The owner ended the call itself (kexd_rpc_decode or kexd_rpc_need_job failed it): the stream is over too. */
void kexd_stream_ended(kexd_stream *st);
/* The call is over for the owner: cancelled, or a write broke. */
bool kexd_stream_dead(const kexd_stream *st);

#endif

/*
 * searches.c - the search slots of each device and the line of searches
 * waiting for one (rpc.h, kexd_search_slot).  A search (a Tune call, or a
 * Submit whose request asks for a beam) holds one of the device's
 * --max-tunes-per-device slots for its whole call.  When all are held a
 * new search waits in the device's line instead of failing: its call
 * stays open, its decoded request kept (rpc.c), and no pool worker is
 * held.  A freed slot goes to the waiting search whose payer -- the tenant
 * with --auth, else the job, as for compile slots (realize/engine.c) --
 * has been charged least: weighted fair queueing between payers, each
 * charged the wall seconds its searches hold slots over their jobs'
 * weights (a search's time is the slot's time, whether it is rendering
 * candidates, waiting for the device or lowering a kernel found in the
 * beam cache: the slot is what the others wait for).  A running search is
 * charged as it runs, so a payer whose long search holds a slot now is
 * charged for it when the next slot is given.  A payer with nothing
 * running or waiting is forgotten, and one that comes back starts level
 * with the least charged payer present, not with credit for the time it
 * was away.
 *
 * The line is bounded: --max-search-queue calls per device and
 * --max-search-queue-per-payer calls of one payer (RESOURCE_EXHAUSTED
 * past either, naming the flag).  A waiting call still ends by its
 * deadline or a client cancel (the server's end hook, kexd_rpc_call_end,
 * takes it out of line) and by kexd stopping (UNAVAILABLE at once).
 *
 * A slot freed by a call that ends is given on a later turn of the loop
 * (a kexd_wake sent to the loop itself), never inside the end of the call
 * that freed it: the handler that goes on may finish its own call, and
 * must not run inside another call's finish.  Loop thread only.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/errors.h"
#include "core/log.h"
#include "daemon/bridge.h"
#include "daemon/rpc.h"
#include "proto/pballoc.h"

#define SEARCH_PAYER_MAX (KEXD_TENANT_NAME_MAX + 8) /* bytes of a payer's key, NUL included ("tenant NAME", "job ID") */

/* What one payer of a device's search slots has been charged (loop thread). */
typedef struct kexd_search_payer {
  char key[SEARCH_PAYER_MAX];
  double charged;  /* slot seconds over weight until at_us (its virtual time) */
  double rate;     /* the sum of 1/weight over its searches holding slots: charged grows by this per second */
  double at_us;    /* when charged was last brought up to date */
  uint32_t running, waiting;
  struct kexd_search_payer *next;
} kexd_search_payer;

/* One device's line and its payers. */
typedef struct search_line {
  kexd_search_place *head, *tail; /* waiting calls, in arrival order */
  uint32_t waiting;
  kexd_search_payer *payers;      /* those with a search running or waiting */
} search_line;

struct kexd_searches {
  kexd *d;
  kexd_wake wake; /* sent when a slot is freed while calls wait: on_wake gives it on a later turn */
  bool wake_open;
  search_line lines[KEXD_MAX_DEVICES];
};

/* What p has been charged by `now`, its running searches included. */
static double payer_charged(const kexd_search_payer *p, double now) {
  return p->charged + p->rate * (now - p->at_us) / 1e6;
}

/* Bring p's charge up to `now` (before its rate changes). */
static void payer_settle(kexd_search_payer *p, double now) {
  p->charged = payer_charged(p, now);
  p->at_us = now;
}

/* The payer with this key (made level with the least charged payer present when new).  NULL: out of memory. */
static kexd_search_payer *payer_get(search_line *L, const char *key, double now) {
  double least = -1;
  for (kexd_search_payer *p = L->payers; p; p = p->next) {
    if (strcmp(p->key, key) == 0) return p;
    double ch = payer_charged(p, now);
    if (least < 0 || ch < least) least = ch;
  }
  kexd_search_payer *p = kex_calloc(1, sizeof *p);
  if (!p) return NULL;
  snprintf(p->key, sizeof p->key, "%s", key);
  p->charged = least > 0 ? least : 0; /* no credit for the time it was away */
  p->at_us = now;
  p->next = L->payers;
  L->payers = p;
  return p;
}

/* A payer with nothing running and nothing waiting is forgotten (it comes back level, payer_get). */
static void payer_idle(search_line *L, kexd_search_payer *p) {
  if (p->running || p->waiting) return;
  for (kexd_search_payer **pp = &L->payers; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      kex_free(p);
      return;
    }
}

/* The payer's key and how a message names it: the tenant with --auth, else the job. */
static void payer_of(const kexd *d, const kexd_job *job, char *key, size_t keylen, char *who, size_t wholen) {
  if (d->auth && job->use) {
    snprintf(key, keylen, "tenant %s", job->use->name);
    snprintf(who, wholen, "tenant '%s'", job->use->name);
  } else {
    snprintf(key, keylen, "job %" PRIu64, job->id);
    snprintf(who, wholen, "job '%s'", job->name);
  }
}

/* The call at pl takes a slot of device dev now (out of line already). */
static void slot_take(kexd *d, uint32_t dev, kexd_search_place *pl, double now) {
  kexd_search_payer *p = pl->payer;
  payer_settle(p, now);
  p->rate += 1.0 / pl->weight;
  p->running++;
  pl->since_us = now;
  d->tunes_active[dev]++;
}

/* The job of the call at pl, if it is still open. */
static kexd_job *place_job(kexd *d, const kexd_search_place *pl) {
  return kexd_jobs_find_id(&d->jobs, ((kexd_call_info *)kexd_call_ext(pl->call))->job);
}

/* Take the waiting call at pl out of L's line (its payer's and the line's counts with it). */
static void line_remove(search_line *L, kexd_search_place *pl) {
  kexd_search_place **pp = &L->head, *prev = NULL;
  while (*pp && *pp != pl) prev = *pp, pp = &(*pp)->next;
  if (!*pp) return;
  *pp = pl->next;
  if (L->tail == pl) L->tail = prev;
  pl->next = NULL;
  pl->waiting = false;
  pl->payer->waiting--;
  L->waiting--;
}

/* The waiting call a free slot goes to: its payer charged least, the first in line among equals. */
static kexd_search_place *pick(search_line *L, double now) {
  kexd_search_place *best = NULL;
  double least = 0;
  for (kexd_search_place *pl = L->head; pl; pl = pl->next) {
    double ch = payer_charged(pl->payer, now);
    if (!best || ch < least) best = pl, least = ch;
  }
  return best;
}

/* Give device dev's free slots to waiting calls; each goes on (resume), which may end it at once. */
static void serve_line(kexd *d, uint32_t dev) {
  search_line *L = &d->searches->lines[dev];
  while (L->head && d->tunes_active[dev] < d->cfg.max_tunes_per_device) {
    double now = kexd_now_us();
    kexd_search_place *pl = pick(L, now);
    kexd_call *c = pl->call;
    KEX_DEBUG("search slot on %s after %.3f s in line (%u still wait)", d->cfg.devices[dev], (now - pl->since_us) / 1e6,
              L->waiting - 1);
    if (pl->use) pl->use->search_wait_us += (uint64_t)(now - pl->since_us); /* kex_tenant_search_wait_seconds_total */
    line_remove(L, pl);
    slot_take(d, dev, pl, now);
    kexd_call_set_hooks(c, NULL, NULL, NULL); /* the handler sets its own */
    pl->resume(d, c); /* may finish c: kexd_search_slot_end then gives the slot back */
  }
}

/* A slot was freed while calls waited (a later turn of the loop than the call end that freed it). */
static void on_wake(kexd_wake *w) {
  kexd *d = w->data;
  for (uint32_t dev = 0; dev < d->cfg.ndevices && dev < KEXD_MAX_DEVICES; dev++) serve_line(d, dev);
}

/* kexd is stopping: a call still waiting for a slot ends now instead of waiting out the grace period. */
static void on_stop_waiting(kexd_call *c, void *ud) {
  kexd *d = ud;
  kexd_call_info *ci = kexd_call_ext(c);
  kexd_call_failf(c, GRPC_STATUS_UNAVAILABLE, "%s: kexd is stopping; the search waited for a slot on device %s",
                  kexd_call_name(c), ci->tune_device ? d->cfg.devices[ci->tune_device - 1] : "?");
}

int kexd_search_slot(kexd *d, kexd_call *c, kexd_job *job, uint32_t dev, kexd_search_resume resume) {
  kexd_call_info *ci = kexd_call_ext(c);
  kexd_search_place *pl = &ci->search;
  search_line *L = &d->searches->lines[dev];
  const char *m = kexd_call_name(c);
  char key[SEARCH_PAYER_MAX], who[KEXD_JOB_NAME_MAX + 16];
  double now = kexd_now_us();
  kexd_search_payer *p;
  payer_of(d, job, key, sizeof key, who, sizeof who);
  if (!(p = payer_get(L, key, now))) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", m);
    return -1;
  }
  memset(pl, 0, sizeof *pl);
  pl->call = c;
  pl->payer = p;
  pl->use = job->use;
  pl->weight = job->weight ? job->weight : 1;
  if (!L->head && d->tunes_active[dev] < d->cfg.max_tunes_per_device) {
    slot_take(d, dev, pl, now);
    ci->tune_device = dev + 1;
    job->searches++;
    return 0;
  }
  if (!resume || L->waiting >= d->cfg.max_search_queue) {
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "%s: device %s runs %u searches (Tune calls and Submits with beam.beam_width), the limit "
                    "(--max-tunes-per-device), and %u wait for a slot, the limit (--max-search-queue)",
                    m, d->cfg.devices[dev], d->tunes_active[dev], L->waiting);
    goto refused;
  }
  if (p->waiting >= d->cfg.max_search_queue_per_payer) {
    if (job->use) job->use->refused++;
    kexd_call_failf(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "%s: %s has %u searches waiting for a slot on device %s, the limit (--max-search-queue-per-payer)",
                    m, who, p->waiting, d->cfg.devices[dev]);
    goto refused;
  }
  pl->waiting = true;
  pl->resume = resume;
  pl->since_us = now;
  if (L->tail) L->tail->next = pl;
  else L->head = pl;
  L->tail = pl;
  L->waiting++;
  p->waiting++;
  job->searches++; /* neither the lease nor a full table's eviction ends a job while its search waits or runs */
  ci->tune_device = dev + 1;
  kexd_call_set_hooks(c, NULL, on_stop_waiting, d);
  KEX_DEBUG("%s: %s waits for a search slot on %s (%u running, %u waiting)", m, who, d->cfg.devices[dev],
            d->tunes_active[dev], L->waiting);
  return KEXD_SEARCH_WAITING;
refused:
  memset(pl, 0, sizeof *pl);
  payer_idle(L, p);
  return -1;
}

void kexd_search_slot_end(kexd *d, kexd_call *c) {
  kexd_call_info *ci = kexd_call_ext(c);
  kexd_search_place *pl = &ci->search;
  uint32_t dev;
  search_line *L;
  kexd_search_payer *p;
  if (!ci->tune_device) return;
  kexd_job *job = place_job(d, pl);
  if (job && job->searches) job->searches--;
  dev = ci->tune_device - 1;
  ci->tune_device = 0;
  L = &d->searches->lines[dev];
  p = pl->payer;
  if (pl->waiting) {
    line_remove(L, pl);
    if (pl->msg) protobuf_c_message_free_unpacked(pl->msg, &kex_pb_allocator); /* the kept request */
  } else {
    payer_settle(p, kexd_now_us());
    p->running--;
    p->rate = p->running ? p->rate - 1.0 / pl->weight : 0; /* exactly 0 when idle: no rounding left over */
    if (d->tunes_active[dev]) d->tunes_active[dev]--;
    if (L->head && d->searches->wake_open) kexd_wake_send(&d->searches->wake); /* given on a later turn */
  }
  payer_idle(L, p);
  memset(pl, 0, sizeof *pl);
}

void kexd_search_counts(const kexd *d, uint32_t dev, uint32_t *running, uint32_t *waiting) {
  *running = dev < KEXD_MAX_DEVICES ? d->tunes_active[dev] : 0;
  *waiting = d->searches && dev < KEXD_MAX_DEVICES ? d->searches->lines[dev].waiting : 0;
}

void kexd_search_job_removed(void *ud, uint64_t id) {
  kexd *d = ud;
  for (uint32_t dev = 0; d->searches && dev < KEXD_MAX_DEVICES; dev++) {
    kexd_search_place *pl = d->searches->lines[dev].head;
    while (pl) {
      kexd_call *c = pl->call;
      pl = pl->next; /* failing c takes its place out of the line (kexd_search_slot_end) */
      if (((kexd_call_info *)kexd_call_ext(c))->job != id) continue;
      kexd_call_failf(c, GRPC_STATUS_NOT_FOUND, "%s: the job was closed while its search waited for a slot",
                      kexd_call_name(c));
    }
  }
}

int kexd_searches_init(kexd *d) {
  struct kexd_searches *S = kex_calloc(1, sizeof *S);
  if (!S) return KEX_ENOMEM;
  S->d = d;
  if (kexd_wake_init(d->loop, &S->wake, on_wake, d) < 0) {
    kex_free(S);
    return KEX_EINTERNAL;
  }
  S->wake_open = true;
  d->searches = S;
  return 0;
}

void kexd_searches_close(kexd *d) {
  if (!d->searches || !d->searches->wake_open) return;
  d->searches->wake_open = false;
  kexd_wake_close(&d->searches->wake, NULL);
}

void kexd_searches_free(kexd *d) {
  struct kexd_searches *S = d->searches;
  if (!S) return;
  for (uint32_t dev = 0; dev < KEXD_MAX_DEVICES; dev++)
    while (S->lines[dev].payers) {
      kexd_search_payer *p = S->lines[dev].payers;
      S->lines[dev].payers = p->next;
      kex_free(p);
    }
  kex_free(S);
  d->searches = NULL;
}

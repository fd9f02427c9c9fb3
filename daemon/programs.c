/*
 * programs.c - Submit's loaded programs: per device, the index from a
 * program's source hash to the program its runner holds (a core/dict
 * table), pinned by the submissions that use it, the least recently used
 * unpinned ones unloaded past --max-programs (submit.c's opening comment).
 * Loop thread; only the runner dereferences a program.
 */
#include <grpc/status.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/submit.h"

/* ---- the index of one device: loaded_prog pointers keyed by their source hash (core/dict) ---- */

static bool lp_eq(const void *entry, const void *probe) {
  return memcmp((*(loaded_prog *const *)entry)->hash, probe, SUB_HASH) == 0;
}

static const kex_dict_type loaded_type = {sizeof(loaded_prog *), lp_eq, 64};

/* A SHA-256 is already uniform: its first 8 bytes are the table's hash. */
static uint64_t lp_hash(const uint8_t *hash) {
  uint64_t h;
  memcpy(&h, hash, sizeof h);
  return h;
}

void loaded_index_init(kex_dict *m) { *m = kex_dict_make(&loaded_type); }

loaded_prog *loaded_find(const kex_dict *m, const uint8_t *hash) {
  loaded_prog **e = kex_dict_find(m, lp_hash(hash), hash);
  return e ? *e : NULL;
}

/* A loaded_prog's program and record, on this thread (only once the runners have exited). */
void free_loaded_now(void *v) {
  loaded_prog *lp = v;
  kex_program_free(lp->prog);
  kex_free(lp);
}

void loaded_index_free(kex_dict *m) {
  uint32_t pos = 0;
  for (loaded_prog **e; (e = kex_dict_next(m, &pos));) free_loaded_now(*e);
  kex_dict_free(m);
}

/* The runner frees the program (the unload item's closure). */
static int unload_run(kex_device *dev, void *arg, double *device_s, kex_error *err) {
  (void)dev, (void)device_s, (void)err;
  kex_program_free(arg);
  return 0;
}

static void unload_done(kexd_work *w) {
  loaded_prog *lp = w->ud;
  kex_free(lp);
}

/* Free lp's program on its runner, then lp (lp is in no index).  A record that never loaded goes at once. */
static void loaded_unload(loaded_prog *lp) {
  kexd_submitter *S = lp->S;
  if (!lp->prog) {
    kex_free(lp);
    return;
  }
  memset(&lp->unload, 0, sizeof lp->unload);
  lp->unload.kind = KEXD_WORK_RUN;
  lp->unload.job = 0; /* the daemon's own flow */
  lp->unload.weight = 1;
  lp->unload.must_run = true;
  lp->unload.fn = unload_run;
  lp->unload.arg = lp->prog;
  lp->unload.done = unload_done;
  lp->unload.ud = lp;
  if (kexd_dispatch_post(S->d->disp, lp->device, &lp->unload) < 0) { /* stopping: freed after the runners exit */
    lp->next = S->orphans;
    S->orphans = lp;
  }
}

/*
 * Bring device's index down to max_programs: unload the least recently
 * used records no submission has pinned (while there are such).
 */
static void loaded_evict(kexd_submitter *S, uint32_t device) {
  kex_dict *m = &S->loaded[device];
  while (m->len > S->max_programs) {
    loaded_prog **lru = NULL, **e;
    uint32_t pos = 0;
    while ((e = kex_dict_next(m, &pos)))
      if (!(*e)->pins && (!lru || (*e)->last_used < (*lru)->last_used)) lru = e;
    if (!lru) break; /* every loaded program is in use: over the limit until they are released */
    loaded_prog *lp = *lru;
    kex_dict_remove(m, lru); /* never allocates */
    S->programs_unloaded++;
    kex_log(KEX_LOG_DEBUG, NULL, 0, "programs: device \"%s\": unloading %s: %u loaded (limit %u), %" PRIu64 " unloaded",
            S->d->cfg.devices[device], lp->name, m->len, S->max_programs, S->programs_unloaded);
    loaded_unload(lp);
  }
}

/*
 * The submission is done with its programs (every item is back, or none
 * was posted): unpin its index records, unload its own programs, and bring
 * the device's index back under the limit.  Idempotent.
 */
void sub_release_programs(submission *s) {
  kexd_submitter *S = s->d->submitter;
  if (!s->lps) return;
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++) {
    loaded_prog *lp = s->lps[k];
    if (!lp) continue;
    s->lps[k] = NULL;
    if (s->pinned[k]) {
      lp->pins--;
      lp->last_used = ++S->clock;
    } else {
      loaded_unload(lp);
    }
  }
  loaded_evict(S, s->device);
}

/*
 * SETUP is back: offer the programs it loaded to the device's index (a
 * program that is there already stays the submission's own, unloaded at
 * its end), then bring the index back under the limit.
 */
void sub_adopt_programs(submission *s) {
  kexd_submitter *S = s->d->submitter;
  kex_dict *m = &S->loaded[s->device];
  uint32_t n = 0;
  if (s->adopted || !s->lps) return;
  s->adopted = true;
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++) {
    loaded_prog *lp = s->lps[k], **e;
    bool found;
    if (!lp || s->pinned[k] || !s->progs[k]) continue;
    lp->prog = s->progs[k]; /* written by SETUP before its done was handed back */
    if (!(e = kex_dict_insert(m, lp_hash(lp->hash), lp->hash, &found)) || found) continue;
    *e = lp;
    s->pinned[k] = true;
    lp->pins = 1;
    lp->last_used = ++S->clock;
    n++;
  }
  if (n)
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "programs: device \"%s\": %u loaded (limit %u) after Submit %" PRIu64 " loaded %u",
            s->d->cfg.devices[s->device], m->len, S->max_programs, s->id, n);
  loaded_evict(S, s->device);
}

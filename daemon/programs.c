/*
 * programs.c - Submit's loaded programs: per device, the index from a
 * program's source hash to the program its runner holds (a hash map kept
 * here), pinned by the submissions that use it, the least recently used
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

static uint32_t hm_slot(const hashmap *m, const uint8_t *key) {
  uint64_t h;
  memcpy(&h, key, sizeof h);
  uint32_t i = (uint32_t)h & (m->cap - 1);
  while (m->used[i] && memcmp(m->keys[i], key, SUB_HASH) != 0) i = (i + 1) & (m->cap - 1);
  return i;
}

/* The value stored under key, or NULL. */
void *hm_get(const hashmap *m, const uint8_t *key, bool *found) {
  *found = false;
  if (!m->cap) return NULL;
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) return NULL;
  *found = true;
  return m->vals[i];
}

/* Store (or replace) key -> val.  0 or KEX_ENOMEM. */
static int hm_put(hashmap *m, const uint8_t *key, void *val) {
  if (2 * (m->n + 1) > m->cap) {
    hashmap g = {0, m->cap ? 2 * m->cap : 64, NULL, NULL, NULL};
    g.keys = kex_calloc(g.cap, sizeof *g.keys);
    g.vals = kex_calloc(g.cap, sizeof *g.vals);
    g.used = kex_calloc(g.cap, sizeof *g.used);
    if (!g.keys || !g.vals || !g.used) {
      kex_free(g.keys), kex_free(g.vals), kex_free(g.used);
      return KEX_ENOMEM;
    }
    for (uint32_t i = 0; i < m->cap; i++)
      if (m->used[i]) {
        uint32_t j = hm_slot(&g, m->keys[i]);
        g.used[j] = true;
        memcpy(g.keys[j], m->keys[i], SUB_HASH);
        g.vals[j] = m->vals[i];
        g.n++;
      }
    kex_free(m->keys), kex_free(m->vals), kex_free(m->used);
    *m = g;
  }
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) {
    m->used[i] = true;
    memcpy(m->keys[i], key, SUB_HASH);
    m->n++;
  }
  m->vals[i] = val;
  return 0;
}

/* Remove key (if present) and return its value; the later entries of its probe run shift back. */
static void *hm_del(hashmap *m, const uint8_t *key) {
  if (!m->cap) return NULL;
  uint32_t i = hm_slot(m, key);
  if (!m->used[i]) return NULL;
  void *val = m->vals[i];
  for (uint32_t j = (i + 1) & (m->cap - 1); m->used[j]; j = (j + 1) & (m->cap - 1)) {
    uint64_t h;
    memcpy(&h, m->keys[j], sizeof h);
    uint32_t home = (uint32_t)h & (m->cap - 1);
    /* j's entry may fill the hole at i when its home is not in (i, j] (cyclically) */
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      memcpy(m->keys[i], m->keys[j], SUB_HASH);
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->used[i] = false;
  m->n--;
  return val;
}

void hm_free(hashmap *m, void (*free_val)(void *)) {
  for (uint32_t i = 0; free_val && i < m->cap; i++)
    if (m->used[i]) free_val(m->vals[i]);
  kex_free(m->keys), kex_free(m->vals), kex_free(m->used);
  memset(m, 0, sizeof *m);
}

/* A loaded_prog's program and record, on this thread (only once the runners have exited). */
void free_loaded_now(void *v) {
  loaded_prog *lp = v;
  kex_program_free(lp->prog);
  kex_free(lp);
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
  hashmap *m = &S->loaded[device];
  while (m->n > S->max_programs) {
    loaded_prog *lru = NULL;
    for (uint32_t i = 0; i < m->cap; i++) {
      loaded_prog *lp = m->used[i] ? m->vals[i] : NULL;
      if (lp && !lp->pins && (!lru || lp->last_used < lru->last_used)) lru = lp;
    }
    if (!lru) break; /* every loaded program is in use: over the limit until they are released */
    hm_del(m, lru->hash);
    S->programs_unloaded++;
    kex_log(KEX_LOG_DEBUG, NULL, 0, "programs: device \"%s\": unloading %s: %u loaded (limit %u), %" PRIu64 " unloaded",
            S->d->cfg.devices[device], lru->name, m->n, S->max_programs, S->programs_unloaded);
    loaded_unload(lru);
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
  hashmap *m = &S->loaded[s->device];
  uint32_t n = 0;
  if (s->adopted || !s->lps) return;
  s->adopted = true;
  for (uint32_t k = 0; k < s->p->rp.nkernels; k++) {
    loaded_prog *lp = s->lps[k];
    bool found;
    if (!lp || s->pinned[k] || !s->progs[k]) continue;
    lp->prog = s->progs[k]; /* written by SETUP before its done was handed back */
    hm_get(m, lp->hash, &found);
    if (found || hm_put(m, lp->hash, lp) < 0) continue;
    s->pinned[k] = true;
    lp->pins = 1;
    lp->last_used = ++S->clock;
    n++;
  }
  if (n)
    kex_log(KEX_LOG_DEBUG, s->log_id, 0, "programs: device \"%s\": %u loaded (limit %u) after Submit %" PRIu64 " loaded %u",
            s->d->cfg.devices[s->device], m->n, S->max_programs, s->id, n);
  loaded_evict(S, s->device);
}

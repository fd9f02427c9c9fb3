/*
 * libkex_test.c - libkex against a real kexd (tests/integration/test_libkex.sh
 * starts one and passes its address).
 *
 * usage: libkex_test ADDR CASES_DIR
 *
 * Each check prints "ok - ...", "FAIL - ..." or "skip - ... (reason)"; the
 * last line is "N passed, N failed" and the exit status is 1 if any failed.
 * The checks: jobs, Plan kernel counts against tinygrad's for every case in
 * CASES_DIR, Upload/Download bytes intact (memory and .npy, chunked), Free,
 * ListDevices, GetStats, the status codes and messages of bad input, an
 * unreachable server, Submit, and Tune with the cache API (list filters and
 * paging, get, export to a file and a callback, delete, import in several
 * messages, refused lines; skipped with the server's message while kexd
 * answers UNIMPLEMENTED).
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/libkex.h"
#include "core/alloc.h"
#include "core/strbuf.h"
#include "examples/hello_graph.h"

static int passed, failed;

static void check(int cond, const char *what, const kex_status *st) {
  if (cond) {
    passed++;
    printf("ok - %s\n", what);
  } else {
    failed++;
    printf("FAIL - %s", what);
    if (st) printf(" (code %d %s, grpc %d: %s)", st->code, kex_errname(st->code), st->grpc, st->msg);
    printf("\n");
  }
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  kex_strbuf b = {0};
  if (!f) return NULL;
  if (kex_strbuf_read(&b, f, SIZE_MAX - 1)) {
    kex_free(b.p);
    b.p = NULL;
  }
  fclose(f);
  return b.p;
}

/* Plan every case of INDEX.json; count the ones whose kernel count differs from tinygrad's (opencl). */
static void test_plan_cases(kex_client *c, const char *job, const char *cases) {
  char path[4096], what[256];
  json_t *index, *name;
  json_error_t jerr;
  size_t i, n = 0, wrong = 0, errors = 0;
  snprintf(path, sizeof path, "%s/INDEX.json", cases);
  if (!(index = json_load_file(path, 0, &jerr))) {
    check(0, "plan: the cases index loads", NULL);
    return;
  }
  json_array_foreach(index, i, name) {
    snprintf(path, sizeof path, "%s/%s.json", cases, json_string_value(name));
    char *text = read_text(path);
    json_t *doc = text ? json_loads(text, 0, &jerr) : NULL;
    json_t *k = doc ? json_object_get(json_object_get(doc, "kernels"), "opencl") : NULL;
    if (k && json_is_integer(k)) {
      kex_plan *p = NULL;
      kex_status st;
      n++;
      if (kex_plan_graph(c, job, text, &p, &st)) {
        errors++;
        printf("# %s: %s\n", json_string_value(name), st.msg);
      } else if ((json_int_t)p->kernels != json_integer_value(k)) {
        wrong++;
        printf("# %s: %u kernels, tinygrad %lld\n", json_string_value(name), p->kernels,
               (long long)json_integer_value(k));
      }
      kex_plan_free(p);
    }
    json_decref(doc);
    free(text);
  }
  json_decref(index);
  snprintf(what, sizeof what, "plan: %zu cases planned through kexd, kernel counts equal tinygrad's (%zu differ, %zu errors)",
           n, wrong, errors);
  check(n > 50 && wrong == 0 && errors == 0, what, NULL);
}

static void test_plan_one(kex_client *c, const char *job) {
  /* softmax of (4,12,64,64) as tinygrad builds it: max, sub, exp, sum, div -> 3 kernels */
  const char *g =
      "{\"nodes\":["
      "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4,12,64,64],\"fill\":{\"random\":1}},"
      "{\"op\":\"REDUCE_MAX\",\"src\":[0],\"axis\":[3]},"
      "{\"op\":\"EXPAND\",\"src\":[1],\"arg\":[4,12,64,64]},"
      "{\"op\":\"SUB\",\"src\":[0,2]},"
      "{\"op\":\"CONST\",\"dtype\":\"float32\",\"shape\":[],\"value\":1.4426950408889634},"
      "{\"op\":\"RESHAPE\",\"src\":[4],\"arg\":[1,1,1,1]},"
      "{\"op\":\"EXPAND\",\"src\":[5],\"arg\":[4,12,64,64]},"
      "{\"op\":\"MUL\",\"src\":[3,6]},"
      "{\"op\":\"EXP2\",\"src\":[7]},"
      "{\"op\":\"REDUCE_SUM\",\"src\":[8],\"axis\":[3]},"
      "{\"op\":\"EXPAND\",\"src\":[9],\"arg\":[4,12,64,64]},"
      "{\"op\":\"DIV\",\"src\":[8,10]}],\"outputs\":[11]}";
  kex_plan *p = NULL;
  kex_status st;
  int rc = kex_plan_graph(c, job, g, &p, &st);
  check(rc == 0 && p && p->kernels == 3, "plan: softmax of (4,12,64,64) is 3 kernels", &st);
  if (p) {
    size_t kernels = 0, ast = 0;
    for (size_t i = 0; i < p->nitems; i++) {
      if (strcmp(p->items[i].kind, "kernel") == 0) kernels++;
      ast += p->items[i].nast;
    }
    check(kernels == 3 && ast > 0 && p->items[p->nitems - 1].noutputs == 1,
          "plan: the reply's items carry 3 kernel items with AST lines", NULL);
  }
  kex_plan_free(p);
}

static void test_buffers(kex_client *c, const char *job) {
  kex_status st;
  char h1[KEX_TOKEN_MAX], h2[KEX_TOKEN_MAX], h3[KEX_TOKEN_MAX];
  int64_t shape1[2] = {10, 25};
  float small[250];
  for (int i = 0; i < 250; i++) small[i] = (float)i * 0.5f - 7.25f;
  int rc = kex_upload(c, job, "float32", 2, shape1, small, sizeof small, NULL, h1, &st);
  check(rc == 0 && strlen(h1) > 0, "upload: 1000 bytes of float32 give a handle", &st);
  kex_array b;
  rc = kex_download(c, job, h1, &b, &st);
  check(rc == 0 && b.nbytes == sizeof small && memcmp(b.data, small, sizeof small) == 0 &&
            strcmp(b.dtype, "float32") == 0 && b.ndim == 2 && b.shape[0] == 10 && b.shape[1] == 25,
        "download: the 1000 bytes, dtype and shape come back intact", &st);

  /* 3.5 MiB: several upload chunks and download chunks */
  size_t big_n = (size_t)7 << 17; /* int32 elements: 3.5 MiB */
  int32_t *big = kex_malloc(big_n * sizeof *big);
  for (size_t i = 0; i < big_n; i++) big[i] = (int32_t)(i * 2654435761u);
  int64_t shape2[1] = {(int64_t)big_n};
  rc = kex_upload(c, job, "int32", 1, shape2, big, big_n * sizeof *big, "", h2, &st);
  check(rc == 0, "upload: 3.5 MiB int32 in chunks", &st);
  kex_array b2;
  rc = kex_download(c, job, h2, &b2, &st);
  check(rc == 0 && b2.nbytes == big_n * sizeof *big && memcmp(b2.data, big, b2.nbytes) == 0,
        "download: 3.5 MiB intact", &st);

  /* .npy round trip through a file */
  char path[] = "/tmp/libkex_test_XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  rc = kex_array_write_npy(&b, path, &st);
  check(rc == 0, "npy: a downloaded buffer writes as .npy", &st);
  rc = kex_upload_npy(c, job, path, NULL, h3, &st);
  check(rc == 0, "upload: a .npy file streams from disk", &st);
  kex_array b3;
  rc = kex_download(c, job, h3, &b3, &st);
  check(rc == 0 && b3.nbytes == b.nbytes && memcmp(b3.data, b.data, b.nbytes) == 0 && b3.ndim == 2 &&
            b3.shape[1] == 25,
        "download: the .npy upload is the same bytes and shape", &st);
  unlink(path);
  kex_array_free(&b3);
  kex_array_free(&b2);
  kex_array_free(&b);
  kex_free(big);

  /* stats: our job holds 3 buffers */
  kex_stats *s = NULL;
  rc = kex_get_stats(c, job, &s, &st);
  check(rc == 0 && s && s->njobs == 1 && s->jobs[0].buffers == 3 && strcmp(s->jobs[0].name, "libkex_test") == 0 &&
            s->calls > 0 && s->jobs_open >= 1,
        "stats: the job holds its 3 buffers", &st);
  kex_stats_free(s);

  const char *hs[2] = {h1, h2};
  uint32_t freed = 0;
  rc = kex_free_buffers(c, job, hs, 2, &freed, &st);
  check(rc == 0 && freed == 2, "free: 2 buffers freed", &st);
  rc = kex_download(c, job, h1, &b, &st);
  check(rc == KEX_ENOTFOUND && st.grpc == 5 && strstr(st.msg, h1) != NULL,
        "download of a freed handle: NOT_FOUND naming the handle", &st);
  printf("# %s\n", st.msg);

  /* client-side refusal: the bytes do not fill the shape */
  rc = kex_upload(c, job, "float32", 2, shape1, small, 12, NULL, h1, &st);
  check(rc == KEX_EINVAL && st.grpc == 0 && strstr(st.msg, "12 bytes"), "upload: a short buffer is refused in the client",
        &st);
  rc = kex_upload(c, job, "float99", 2, shape1, small, 12, NULL, h1, &st);
  check(rc == KEX_EINVAL && strstr(st.msg, "float99"), "upload: an unknown dtype is refused", &st);
}

static void test_errors(kex_client *c, const char *job) {
  kex_status st;
  kex_plan *p = NULL;
  int rc = kex_job_close(c, "0123456789abcdef0123456789abcdef", &st);
  check(rc == KEX_ENOTFOUND && st.grpc == 5 && strstr(st.msg, "unknown job token"),
        "close of an unknown job: NOT_FOUND with the server's message", &st);
  printf("# %s\n", st.msg);
  rc = kex_plan_graph(c, job, "{\"nodes\":[{\"op\":\"FROB\"}],\"outputs\":[0]}", &p, &st);
  check(rc == KEX_EINVAL && st.grpc == 3 && strstr(st.msg, "node 0") && strstr(st.msg, "FROB"),
        "plan of an unknown op: INVALID_ARGUMENT naming node 0", &st);
  printf("# %s\n", st.msg);
  rc = kex_plan_graph(c, job,
                      "{\"nodes\":[{\"op\":\"EMPTY\",\"dtype\":\"float32\",\"shape\":[4]},"
                      "{\"op\":\"RESHAPE\",\"src\":[0],\"arg\":[3]}],\"outputs\":[1]}",
                      &p, &st);
  check(rc == KEX_EINVAL && st.grpc == 3 && strstr(st.msg, "node 1"),
        "plan of a reshape that changes the element count: INVALID_ARGUMENT naming node 1", &st);
  printf("# %s\n", st.msg);
  rc = kex_plan_graph(c, "", "{\"nodes\":[],\"outputs\":[]}", &p, &st);
  check(rc == KEX_EINVAL && st.grpc == 3 && strstr(st.msg, "job"), "plan without a job: INVALID_ARGUMENT", &st);
  rc = kex_plan_graph(c, job, "{\"nodes\": [", &p, &st);
  check(rc == KEX_EPARSE && st.grpc == 0 && strstr(st.msg, "JSON"), "plan of broken JSON: refused in the client", &st);
  rc = kex_plan_graph(c, job, "{\"nodes\":[{\"op\":\"EMPTY\",\"shape\":\"x\"}]}", &p, &st);
  check(rc == KEX_EPARSE && strstr(st.msg, "node 0"), "plan of a wrongly typed field: refused naming the node", &st);
  kex_array b;
  rc = kex_download(c, job, "nosuchhandle", &b, &st);
  check(rc == KEX_ENOTFOUND && st.grpc == 5, "download of an unknown handle: NOT_FOUND", &st);
  check(kex_code_from_grpc(3) == KEX_EINVAL && kex_code_from_grpc(5) == KEX_ENOTFOUND &&
            kex_code_from_grpc(8) == KEX_ELIMIT && kex_code_from_grpc(12) == KEX_EUNIMPLEMENTED &&
            kex_code_from_grpc(14) == KEX_EUNAVAILABLE && kex_code_from_grpc(4) == KEX_EDEADLINE &&
            kex_code_from_grpc(0) == 0 && kex_code_from_grpc(16) == KEX_EINTERNAL,
        "gRPC statuses map back to kex codes", NULL);
}

static void on_event(const kex_submit_event *ev, void *ud) {
  int *seen = ud;
  seen[ev->kind]++;
}

static void test_submit(kex_client *c, const char *job) {
  /* (a + b) * 2 on float32[4], inline data: the graph of examples/hello.c */
  const char *g = KEX_HELLO_GRAPH;
  kex_submit_opts o = {.return_bytes = true, .timeout_s = 120};
  kex_result *r = NULL;
  kex_status st;
  int seen[4] = {0};
  int rc = kex_submit(c, job, g, &o, on_event, seen, &r, &st);
  if (rc == KEX_EUNIMPLEMENTED) {
    printf("skip - submit: (a+b)*2 (kexd answers UNIMPLEMENTED: %s)\n", st.msg);
    return;
  }
  check(rc == 0 && r && r->noutputs == 1, "submit: (a+b)*2 finishes with one output", &st);
  if (rc || !r) return;
  const kex_output *out = &r->outputs[0];
  float want[4] = {22, 44, 66, 88}, got[4] = {0};
  kex_array b = {0};
  if (out->has_data && out->buf.nbytes == sizeof got) {
    memcpy(got, out->buf.data, sizeof got);
  } else if (kex_download(c, job, out->handle, &b, &st) == 0 && b.nbytes == sizeof got) {
    memcpy(got, b.data, sizeof got);
  }
  kex_array_free(&b);
  check(memcmp(got, want, sizeof got) == 0 && strcmp(out->buf.dtype, "float32") == 0,
        "submit: the output is [22, 44, 66, 88] float32", &st);
  check(seen[KEX_EVENT_ACCEPTED] == 1 && seen[KEX_EVENT_SCHEDULED] == 1, "submit: accepted and scheduled events arrive",
        NULL);
  kex_result_free(r);
  /* cached and quick: kexd sends the whole stream as one batched message; every event still reaches the callback */
  bool all = true;
  for (int k = 0; k < 3; k++) {
    int again[4] = {0};
    r = NULL;
    rc = kex_submit(c, job, g, &o, on_event, again, &r, &st);
    all = all && rc == 0 && r && r->noutputs == 1 && r->outputs[0].has_data &&
          memcmp(r->outputs[0].buf.data, want, sizeof want) == 0 && again[KEX_EVENT_ACCEPTED] == 1 &&
          again[KEX_EVENT_SCHEDULED] == 1 && again[KEX_EVENT_RUNNING] == 1 && again[KEX_EVENT_COMPILING] == 0;
    kex_result_free(r);
  }
  check(all, "submit, cached (batched events): each of 3 sees accepted, scheduled, running once and the output", &st);
  /* a 768x768x768 matmul (with its compile) takes far longer than 2 ms on any device here */
  const char *slow =
      "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[768,1,768],\"fill\":{\"random\":11}},"
      "{\"op\":\"EXPAND\",\"src\":[0],\"arg\":[768,768,768]},"
      "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[1,768,768],\"fill\":{\"random\":12}},"
      "{\"op\":\"EXPAND\",\"src\":[2],\"arg\":[768,768,768]},{\"op\":\"MUL\",\"src\":[1,3]},"
      "{\"op\":\"REDUCE_SUM\",\"src\":[4],\"axis\":[2]}],\"outputs\":[5]}";
  o.timeout_s = 0.002;
  rc = kex_submit(c, job, slow, &o, NULL, NULL, &r, &st);
  check(rc == KEX_EDEADLINE && !r, "submit: a deadline that passes is KEX_EDEADLINE", &st);
}

/* ---- Tune and the cache API ---- */

typedef struct tune_seen {
  int progress, finished, order_ok;
  uint32_t last_i;
} tune_seen;

static void on_tune(const kex_tune_event *ev, void *ud) {
  tune_seen *t = ud;
  if (ev->finished) t->finished++;
  else t->progress++;
  if (ev->i < t->last_i || ev->i < 1 || ev->i > ev->n || (ev->finished && !ev->entry)) t->order_ok = 0;
  t->last_i = ev->i;
}

static int is_hex64(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (!strchr("0123456789abcdef", s[n])) return 0;
  return n == 64;
}

static int page_has(const kex_cache_page *p, const char *key) {
  for (size_t i = 0; p && i < p->nentries; i++)
    if (!strcmp(p->entries[i].key, key)) return 1;
  return 0;
}

static int count_bytes(const void *data, size_t len, void *ud) {
  (void)data;
  *(size_t *)ud += len;
  return 0;
}

static void test_tune_cache(kex_client *c, const char *job) {
  /* (a + b) * 2 and a sum over 64, both tiny, on the cpu device, beam 1 */
  const char *g1 =
      "{\"device\":\"cpu\",\"nodes\":["
      "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4],\"data\":\"AACAPwAAAEAAAEBAAACAQA==\"},"
      "{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[4],\"data\":\"AAAgQQAAoEEAAPBBAAAgQg==\"},"
      "{\"op\":\"ADD\",\"src\":[0,1]},"
      "{\"op\":\"CONST\",\"dtype\":\"float32\",\"shape\":[4],\"value\":2.0},"
      "{\"op\":\"MUL\",\"src\":[2,3]}],\"outputs\":[4]}";
  const char *g2 =
      "{\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[8,64],\"fill\":{\"random\":5}},"
      "{\"op\":\"REDUCE_SUM\",\"src\":[0],\"axis\":[1]}],\"outputs\":[1]}";
  kex_tune_opts o = {.beam_width = 1, .timeout_s = 120};
  kex_tune_result *t1 = NULL, *t1b = NULL, *t2 = NULL;
  kex_status st;
  tune_seen seen = {0, 0, 1, 0};
  char key[80] = "", key2[80] = "", opts[256] = "", path[] = "/tmp/libkex_cache_XXXXXX";
  int rc = kex_client_tune(c, job, g1, &o, on_tune, &seen, &t1, &st);
  if (rc == KEX_EUNIMPLEMENTED) {
    printf("skip - tune and the cache API (kexd answers UNIMPLEMENTED: %s)\n", st.msg);
    return;
  }
  check(rc == 0 && t1 && t1->nkernels == 1 && t1->kernels[0].kernel[0] && is_hex64(t1->kernels[0].entry.key) &&
            t1->kernels[0].entry.best_us > 0 && t1->kernels[0].entry.hand_us > 0 && !t1->kernels[0].from_cache,
        "tune: (a+b)*2 on cpu gives 1 searched kernel with its AST key and times", &st);
  check(seen.finished == 1 && seen.order_ok, "tune: one finished event (with its entry), kernels in order", NULL);
  if (rc || !t1 || t1->nkernels != 1) goto out;
  snprintf(key, sizeof key, "%s", t1->kernels[0].entry.key);
  snprintf(opts, sizeof opts, "%s", t1->kernels[0].entry.opts);
  printf("# tune: %s %s %.2f us (hand-coded %.2f us), %d progress events, %.2f s\n", t1->kernels[0].entry.kernel_name,
         opts, t1->kernels[0].entry.best_us, t1->kernels[0].entry.hand_us, seen.progress, t1->kernels[0].search_s);
  rc = kex_client_tune(c, job, g1, &o, NULL, NULL, &t1b, &st);
  check(rc == 0 && t1b && t1b->nkernels == 1 && t1b->kernels[0].from_cache && !strcmp(t1b->kernels[0].entry.key, key) &&
            !strcmp(t1b->kernels[0].entry.opts, opts),
        "tune again: the kernel comes from the cache with the same key and opts", &st);
  o.device = "cpu"; /* g2 names no device: the option picks it */
  rc = kex_client_tune(c, job, g2, &o, NULL, NULL, &t2, &st);
  check(rc == 0 && t2 && t2->nkernels == 1 && strcmp(t2->kernels[0].entry.key, key) != 0 &&
            strstr(t2->kernels[0].entry.device, "kind=cpu"),
        "tune of a reduction with device \"cpu\" from the options: another key, on cpu", &st);
  if (!rc && t2 && t2->nkernels == 1) snprintf(key2, sizeof key2, "%s", t2->kernels[0].entry.key);

  /* list: filters and paging */
  kex_cache_page *p = NULL, *p2 = NULL;
  char prefix[9];
  snprintf(prefix, sizeof prefix, "%.8s", key);
  kex_remote_cache_filter f = {.key_prefix = prefix};
  rc = kex_client_cache_list(c, job, &f, 0, NULL, &p, &st);
  check(rc == 0 && p && p->nentries == 1 && !strcmp(p->entries[0].key, key) && !strcmp(p->entries[0].opts, opts) &&
            !strcmp(p->entries[0].kind, "cpu") && p->entries[0].search_opts[0] && p->entries[0].codegen[0] &&
            p->entries[0].created_unix > 0 && !p->next_page_token[0],
        "list by key prefix: the tuned entry with its opts, identity, search options and codegen", &st);
  kex_cache_page_free(p);
  p = NULL;
  f = (kex_remote_cache_filter){.kernel_name = "no-such-kernel"};
  rc = kex_client_cache_list(c, job, &f, 0, NULL, &p, &st);
  check(rc == 0 && p && p->nentries == 0, "list by a kernel name nothing has: empty", &st);
  kex_cache_page_free(p);
  p = NULL;
  f = (kex_remote_cache_filter){.device = "kind=cpu", .max_age_s = 3600};
  rc = kex_client_cache_list(c, job, &f, 1, NULL, &p, &st);
  check(rc == 0 && p && p->nentries == 1 && p->next_page_token[0], "list with limit 1: one entry and a page token",
        &st);
  if (rc == 0 && p && p->next_page_token[0]) {
    rc = kex_client_cache_list(c, job, &f, 1, p->next_page_token, &p2, &st);
    check(rc == 0 && p2 && p2->nentries == 1 && strcmp(p2->entries[0].key, p->entries[0].key) != 0 &&
              (page_has(p, key) || page_has(p2, key)) && (page_has(p, key2) || page_has(p2, key2)),
          "list: the next page holds the other entry; the two pages hold both keys", &st);
  }
  kex_cache_page_free(p);
  kex_cache_page_free(p2);
  p = NULL;
  f = (kex_remote_cache_filter){.key_prefix = "xyz"};
  rc = kex_client_cache_list(c, job, &f, 0, NULL, &p, &st);
  check(rc == KEX_EINVAL && st.grpc == 3, "list by a key prefix that is not hex: INVALID_ARGUMENT", &st);
  kex_cache_page_free(p);
  p = NULL;

  /* get */
  kex_remote_cache_entry *e = NULL;
  rc = kex_client_cache_get(c, job, key, NULL, &e, &st);
  check(rc == 0 && e && !strcmp(e->key, key) && e->ast_text[0] && e->source[0] && !strcmp(e->opts, opts),
        "get: the entry with its AST text and source", &st);
  kex_remote_cache_entry_free(e);
  e = NULL;
  rc = kex_client_cache_get(c, job, "0000000000000000000000000000000000000000000000000000000000000000", NULL, &e, &st);
  check(rc == KEX_ENOTFOUND && st.grpc == 5 && !e, "get of an unknown key: NOT_FOUND", &st);

  /* export to a file and through a callback */
  int fd = mkstemp(path);
  FILE *ef = fd >= 0 ? fdopen(fd, "w+") : NULL;
  uint64_t exported = 0;
  size_t cb_bytes = 0;
  long file_bytes = -1;
  char header[256] = "";
  rc = ef ? kex_client_cache_export(c, job, NULL, ef, NULL, NULL, &exported, &st) : KEX_EIO;
  if (ef) {
    fflush(ef);
    file_bytes = ftell(ef);
    rewind(ef);
    if (!fgets(header, sizeof header, ef)) header[0] = 0;
  }
  check(rc == 0 && exported >= 2 && strstr(header, "\"kex.cache.export.v1\""),
        "export to a file: the kex.cache.export.v1 header and every entry", &st);
  rc = kex_client_cache_export(c, job, NULL, NULL, count_bytes, &cb_bytes, NULL, &st);
  check(rc == 0 && (long)cb_bytes == file_bytes, "export through a callback: the same bytes", &st);

  /* delete, then import the export back */
  uint32_t deleted = 0;
  f = (kex_remote_cache_filter){.key_prefix = key};
  rc = kex_client_cache_delete(c, job, &f, &deleted, &st);
  check(rc == 0 && deleted == 1, "delete by key: 1 entry", &st);
  rc = kex_client_cache_get(c, job, key, NULL, &e, &st);
  check(rc == KEX_ENOTFOUND, "get after delete: NOT_FOUND", &st);
  kex_import_report rep;
  if (ef) rewind(ef);
  rc = ef ? kex_client_cache_import(c, job, ef, &rep, &st) : KEX_EIO;
  check(rc == 0 && rep.imported == exported && rep.rejected == 0, "import of the export: every entry back", &st);
  rc = kex_client_cache_get(c, job, key, NULL, &e, &st);
  check(rc == 0 && e && !strcmp(e->opts, opts), "get after import: the entry with its opts", &st);
  kex_remote_cache_entry_free(e);
  e = NULL;

  /* a file of more than 2 MiB goes in several messages: the header, then one beam line many times */
  char *line = NULL;
  size_t cap = 0;
  char bpath[] = "/tmp/libkex_cache_XXXXXX";
  int bfd = mkstemp(bpath);
  FILE *bf = bfd >= 0 ? fdopen(bfd, "w+") : NULL;
  uint32_t copies = 0;
  if (ef && bf) {
    rewind(ef);
    while (getline(&line, &cap, ef) > 0)
      if (strstr(line, "\"type\":\"beam\"") && strstr(line, key)) break;
    fputs(header, bf);
    size_t len = strlen(line ? line : "");
    while (len && ftell(bf) < (3l << 20)) {
      fputs(line, bf);
      copies++;
    }
    rewind(bf);
  }
  rc = bf && copies ? kex_client_cache_import(c, job, bf, &rep, &st) : KEX_EIO;
  check(rc == 0 && rep.imported == copies && rep.rejected == 0, "import of 3 MiB in 1 MiB messages: every line stored",
        &st);
  printf("# %u copies of one line imported\n", copies);
  /* a good line and a bad one: the good one is stored, the bad one refused with its line number */
  if (bf) {
    fclose(bf);
    bf = fopen(bpath, "w+");
  }
  if (bf) {
    fputs(header, bf);
    fputs(line ? line : "", bf);
    fputs("{\"type\":\"beam\",\"ast_key\":\"xyz\"}\n", bf);
    rewind(bf);
  }
  rc = bf ? kex_client_cache_import(c, job, bf, &rep, &st) : KEX_EIO;
  check(rc == 0 && rep.imported == 1 && rep.rejected == 1 && rep.nerrors == 1 && strstr(rep.errors[0], "line 3"),
        "import of a good and a bad line: 1 stored, 1 refused, the message names line 3", &st);
  printf("# %s\n", rc == 0 && rep.nerrors ? rep.errors[0] : "(no message)");
  /* nothing valid: the call fails naming the line */
  if (bf) {
    fclose(bf);
    bf = fopen(bpath, "w+");
  }
  if (bf) {
    fputs(header, bf);
    fputs("{\"type\":\"beam\",\"ast_key\":\"xyz\"}\n", bf);
    rewind(bf);
  }
  rc = bf ? kex_client_cache_import(c, job, bf, &rep, &st) : KEX_EIO;
  check(rc == KEX_EINVAL && st.grpc == 3 && strstr(st.msg, "line 2"),
        "import of nothing but a bad line: INVALID_ARGUMENT naming line 2", &st);
  if (bf) {
    fclose(bf);
    bf = fopen(bpath, "w+");
  }
  if (bf) {
    fputs("this is not an export\n", bf);
    rewind(bf);
  }
  rc = bf ? kex_client_cache_import(c, job, bf, &rep, &st) : KEX_EIO;
  check(rc == KEX_EINVAL && st.grpc == 3, "import without the header: INVALID_ARGUMENT", &st);
  printf("# %s\n", st.msg);
  free(line);
  if (bf) fclose(bf);
  unlink(bpath);
  if (ef) fclose(ef);
  unlink(path);

  /* a deadline shorter than one compile */
  kex_tune_result *t3 = NULL;
  const char *g3 =
      "{\"device\":\"cpu\",\"nodes\":[{\"op\":\"BUFFER\",\"dtype\":\"float32\",\"shape\":[16,16],\"fill\":{\"random\":7}},"
      "{\"op\":\"REDUCE_MAX\",\"src\":[0],\"axis\":[0]}],\"outputs\":[1]}";
  o.timeout_s = 0.002;
  rc = kex_client_tune(c, job, g3, &o, NULL, NULL, &t3, &st);
  check(rc == KEX_EDEADLINE && !t3, "tune: a deadline that passes is KEX_EDEADLINE", &st);
  rc = kex_client_tune(c, job, "{\"device\":\"cpu\",\"nodes\":[{\"op\":\"FROB\"}],\"outputs\":[0]}", NULL, NULL, NULL,
                       &t3, &st);
  check(rc == KEX_EINVAL && st.grpc == 3 && strstr(st.msg, "node 0") && !t3,
        "tune of an unknown op: INVALID_ARGUMENT naming node 0", &st);
out:
  kex_tune_result_free(t1);
  kex_tune_result_free(t1b);
  kex_tune_result_free(t2);
}

int main(int argc, char **argv) {
  kex_client *c = NULL, *dead = NULL;
  kex_status st;
  char job[KEX_TOKEN_MAX];
  uint32_t lease = 0;
  if (argc != 3) {
    fprintf(stderr, "usage: libkex_test ADDR CASES_DIR\n");
    return 2;
  }
  int rc = kex_client_connect(argv[1], &(kex_client_opts){.token = "test-token"}, &c, &st);
  check(rc == 0 && c, "connect", &st);
  if (rc) goto out;
  rc = kex_job_open(c, "libkex_test", 2, 0, job, &lease, &st);
  check(rc == 0 && strlen(job) >= 32 && lease > 0, "job open: a token and a lease", &st);
  if (rc) goto out;

  kex_remote_device *devs = NULL;
  size_t ndev = 0, ndefault = 0;
  rc = kex_list_devices(c, &devs, &ndev, &st);
  for (size_t i = 0; i < ndev; i++) {
    ndefault += devs[i].is_default;
    printf("# device %s (%s, %s) %s%s\n", devs[i].name, devs[i].kind, devs[i].device_name,
           devs[i].available ? "available" : "unavailable", devs[i].is_default ? ", default" : "");
  }
  check(rc == 0 && ndev >= 1 && ndefault == 1 && devs[0].name[0], "devices: at least one, exactly one default", &st);
  kex_remote_devices_free(devs, ndev);

  test_plan_one(c, job);
  test_plan_cases(c, job, argv[2]);
  test_buffers(c, job);
  test_errors(c, job);
  test_submit(c, job);
  test_tune_cache(c, job);

  rc = kex_job_close(c, job, &st);
  check(rc == 0, "job close", &st);
  kex_plan *p = NULL;
  rc = kex_plan_graph(c, job, "{\"nodes\":[],\"outputs\":[]}", &p, &st);
  check(rc == KEX_ENOTFOUND, "a closed job's token is NOT_FOUND", &st);

  rc = kex_client_connect("127.0.0.1:1", NULL, &dead, &st);
  if (rc == 0) rc = kex_job_open(dead, "x", 0, 0, job, NULL, &st);
  check(rc == KEX_EUNAVAILABLE && st.grpc == 14, "an unreachable server is UNAVAILABLE", &st);
  kex_client_close(dead);
  dead = NULL;
  rc = kex_client_connect("127.0.0.1:1", &(kex_client_opts){.root_certs = "/nonexistent/ca.pem"}, &dead, &st);
  check(rc == KEX_EINVAL && !dead && strstr(st.msg, "/nonexistent/ca.pem"), "TLS with an unreadable root cert file",
        &st);
  rc = kex_client_connect("127.0.0.1:1", &(kex_client_opts){.client_cert = "/nonexistent/me.pem"}, &dead, &st);
  check(rc == KEX_EINVAL && !dead && strstr(st.msg, "client_key missing"), "a client certificate without its key",
        &st);
  rc = kex_client_connect("127.0.0.1:1",
                          &(kex_client_opts){.client_cert = "/nonexistent/me.pem", .client_key = "/nonexistent/me.key"},
                          &dead, &st);
  check(rc == KEX_EINVAL && !dead && strstr(st.msg, "/nonexistent/me.pem"), "an unreadable client certificate file",
        &st);
out:
  kex_client_close(c);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

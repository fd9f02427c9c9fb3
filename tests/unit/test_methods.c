/*
 * test_methods.c - kexd's method table (daemon/rpc.c) as the server sees
 * it: what kexd_rpc_register hands the server (fakecall.c records it), and
 * calls through those registrations.
 *
 * Every RPC of the contract (kex.v1.Kex and grpc.health.v1.Health, from the
 * protobuf-c service descriptors) has exactly one row, with a handler; the
 * client streams (Upload, ImportCache) read their own messages; _BusyWork
 * only with --test-busy-work.  Each unary row decodes the contract's
 * request type (a missing or undecodable request is INVALID_ARGUMENT naming
 * that type), each row whose request names a job looks it up before its
 * handler (missing, unknown, another node's: each its own status), the
 * rows whose request carries BeamOptions check it before theirs, and a
 * path with no row is UNIMPLEMENTED.  Who may call each row is
 * test_tenants.c's.
 *
 * The daemon's own objects on an in-process kexd with a device runner
 * (tests/fuzz/fuzzkexd.c) and fakecall.c's calls in place of gRPC.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <grpc/status.h>

#include "core/alloc.h"
#include "core/log.h"
#include "daemon/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "kex/v1/kex.pb-c.h"
#include "tests/fuzz/fakecall.h"
#include "tests/fuzz/fuzzkexd.h"
#include "tests/fuzz/tmpcache.h"

#define UNKNOWN_TOKEN "00000000000000000000000000000000"
#define OTHER_NODE_TOKEN UNKNOWN_TOKEN ".node-b@127.0.0.2:50051"

static const ProtobufCServiceDescriptor *const services[] = {&kex__v1__kex__descriptor,
                                                             &grpc__health__v1__health__descriptor};

static kexd *serving(void) {
  (void)fuzz_tmpcache();
  return fuzz_kexd_serving(fuzz_tmpcache_path());
}

/* Register the table (with or without the test-only rows): the rows the server was given, into *m. */
static uint32_t register_table(kexd *d, bool test_busy_work, const fuzz_method **m) {
  d->cfg.test_busy_work = test_busy_work;
  fuzz_server_forget();
  assert_int_equal(kexd_rpc_register(d), 0);
  d->cfg.test_busy_work = false;
  return fuzz_server_methods(m);
}

static const fuzz_method *row(const fuzz_method *m, uint32_t n, const char *path) {
  const fuzz_method *found = NULL;
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(m[i].path, path) == 0) {
      if (found) fail_msg("%s is registered twice", path);
      found = &m[i];
    }
  return found;
}

/* The request type of path in the contract; NULL when the contract has no such RPC. */
static const ProtobufCMessageDescriptor *contract_input(const char *path) {
  for (size_t s = 0; s < sizeof services / sizeof *services; s++)
    for (unsigned i = 0; i < services[s]->n_methods; i++) {
      char p[128];
      snprintf(p, sizeof p, "/%s/%s", services[s]->name, services[s]->methods[i].name);
      if (strcmp(p, path) == 0) return services[s]->methods[i].input;
    }
  if (strcmp(path, "/kex.v1.Kex/_BusyWork") == 0) return &kex__v1__busy_work_request__descriptor;
  return NULL;
}

static bool client_stream(const char *path) {
  return !strcmp(path, "/kex.v1.Kex/Upload") || !strcmp(path, "/kex.v1.Kex/ImportCache");
}

static void test_every_rpc_has_a_row(void **state) {
  (void)state;
  kexd *d = serving();
  const fuzz_method *m;
  unsigned rpcs = 0;
  uint32_t n = register_table(d, false, &m);
  for (size_t s = 0; s < sizeof services / sizeof *services; s++)
    for (unsigned i = 0; i < services[s]->n_methods; i++, rpcs++) {
      char p[128];
      snprintf(p, sizeof p, "/%s/%s", services[s]->name, services[s]->methods[i].name);
      const fuzz_method *r = row(m, n, p);
      if (!r || !r->fn) fail_msg("%s has no handler", p);
      assert_int_equal(r->payload, client_stream(p) ? KEXD_PAYLOAD_STREAM : KEXD_PAYLOAD_ONE);
    }
  assert_int_equal(rpcs, 18);
  assert_int_equal(n, rpcs); /* and no row the contract does not have */
  assert_null(row(m, n, "/kex.v1.Kex/_BusyWork"));
  /* --test-busy-work adds its one row */
  n = register_table(d, true, &m);
  assert_int_equal(n, rpcs + 1);
  const fuzz_method *busy = row(m, n, "/kex.v1.Kex/_BusyWork");
  assert_non_null(busy);
  assert_non_null(busy->fn);
  assert_int_equal(busy->payload, KEXD_PAYLOAD_ONE);
}

/* A call through row r as the server makes it (its handler with its data), to its end. */
static int call_row(kexd *d, const fuzz_method *r, const uint8_t *req, size_t len, kexd_call *c) {
  memset(c, 0, sizeof *c);
  c->method = r->path;
  c->refs = 1;
  r->fn(c, req, len, r->ud);
  fuzz_call_wait(c, d->loop, 30);
  kexd_rpc_call_end(c, c->status, d);
  return c->status;
}

/* A request of type desc at its defaults but `job` (when the type has it) and beam.beam_width, packed. */
static size_t request(const ProtobufCMessageDescriptor *desc, const char *job, uint32_t beam_width, uint8_t *buf,
                      size_t cap) {
  ProtobufCMessage *msg = kex_calloc(1, desc->sizeof_message);
  Kex__V1__BeamOptions beam = KEX__V1__BEAM_OPTIONS__INIT;
  const ProtobufCFieldDescriptor *f;
  assert_non_null(msg);
  protobuf_c_message_init(desc, msg);
  if (job && (f = protobuf_c_message_descriptor_get_field_by_name(desc, "job")))
    *(const char **)((char *)msg + f->offset) = job;
  beam.beam_width = beam_width;
  if (beam_width && (f = protobuf_c_message_descriptor_get_field_by_name(desc, "beam")))
    *(ProtobufCMessage **)((char *)msg + f->offset) = &beam.base;
  size_t n = protobuf_c_message_get_packed_size(msg);
  assert_true(n <= cap);
  assert_int_equal(protobuf_c_message_pack(msg, buf), n);
  kex_free(msg);
  return n;
}

static void test_request_type_column(void **state) {
  (void)state;
  kexd *d = serving();
  const fuzz_method *m;
  uint32_t n = register_table(d, true, &m), unary = 0;
  for (uint32_t i = 0; i < n; i++) {
    const ProtobufCMessageDescriptor *in = contract_input(m[i].path);
    kexd_call c;
    char want[256];
    assert_non_null(in);
    if (m[i].payload != KEXD_PAYLOAD_ONE) continue;
    unary++;
    assert_int_equal(call_row(d, &m[i], NULL, 0, &c), GRPC_STATUS_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "the request carries no %s message", in->name);
    if (!strstr(c.details, want)) fail_msg("%s: \"%s\" (want \"%s\")", m[i].path, c.details, want);
    static const uint8_t garbage[] = {0xff, 0xff, 0xff};
    assert_int_equal(call_row(d, &m[i], garbage, sizeof garbage, &c), GRPC_STATUS_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "the request is not a valid %s message (3 bytes)", in->name);
    if (!strstr(c.details, want)) fail_msg("%s: \"%s\" (want \"%s\")", m[i].path, c.details, want);
  }
  assert_int_equal(unary, 17);
  kex_free(d->rpc_routes);
  d->rpc_routes = NULL;
}

/* The rows whose job field may be "" (the request is about the server, or about the one job named). */
static bool job_optional(const char *path) {
  return !strcmp(path, "/kex.v1.Kex/ListDevices") || !strcmp(path, "/kex.v1.Kex/GetStats");
}

/* A call through row r with req[0..len) ends with `status` and details holding `needle`. */
static void expect(kexd *d, const fuzz_method *r, const uint8_t *req, size_t len, int status, const char *needle) {
  kexd_call c;
  if (call_row(d, r, req, len, &c) != status || !strstr(c.details, needle))
    fail_msg("%s: status %d \"%s\" (want %d \"%s\")", r->path, c.status, c.details, status, needle);
}

/*
 * The job column of row r (request type in): a job token that is unknown, another node's, or missing (where the
 * row requires one) each ends the call before the handler.  A row whose request names no job (OpenJob, the health
 * checks) goes straight to its handler: Watch's answers a service it does not know at once (a known one it watches
 * until kexd stops), the others OK.  Returns whether the request names a job.
 */
static bool check_job_column(kexd *d, const fuzz_method *r, const ProtobufCMessageDescriptor *in) {
  uint8_t buf[512];
  if (!protobuf_c_message_descriptor_get_field_by_name(in, "job")) {
    assert_true(!strcmp(r->path, "/kex.v1.Kex/OpenJob") || !strncmp(r->path, "/grpc.health.v1.Health/", 23));
    if (!strcmp(r->path, "/grpc.health.v1.Health/Watch")) {
      Grpc__Health__V1__HealthCheckRequest h = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
      h.service = "nope";
      expect(d, r, buf, protobuf_c_message_pack(&h.base, buf), GRPC_STATUS_NOT_FOUND, "unknown service \"nope\"");
    } else {
      expect(d, r, buf, request(in, NULL, 0, buf, sizeof buf), GRPC_STATUS_OK, "");
    }
    return false;
  }
  expect(d, r, buf, request(in, UNKNOWN_TOKEN, 0, buf, sizeof buf), GRPC_STATUS_NOT_FOUND, "unknown job token");
  expect(d, r, buf, request(in, OTHER_NODE_TOKEN, 0, buf, sizeof buf), GRPC_STATUS_FAILED_PRECONDITION,
         "the job belongs to node node-b at 127.0.0.2:50051");
  if (job_optional(r->path)) expect(d, r, buf, request(in, "", 0, buf, sizeof buf), GRPC_STATUS_OK, "");
  else expect(d, r, buf, request(in, "", 0, buf, sizeof buf), GRPC_STATUS_INVALID_ARGUMENT, "missing job token");
  return true;
}

/* The search column of row r: a request carrying BeamOptions has them checked before its handler. */
static bool check_search_column(kexd *d, const fuzz_method *r, const ProtobufCMessageDescriptor *in) {
  uint8_t buf[512];
  if (!protobuf_c_message_descriptor_get_field_by_name(in, "beam")) return false;
  expect(d, r, buf, request(in, FUZZ_TOKEN, 65, buf, sizeof buf), GRPC_STATUS_INVALID_ARGUMENT,
         "beam.beam_width must be at most 64");
  expect(d, r, buf, request(in, FUZZ_TOKEN, d->cfg.max_beam + 1, buf, sizeof buf), GRPC_STATUS_RESOURCE_EXHAUSTED,
         "(--max-beam)");
  assert_int_equal(d->tunes_active[0], 0);
  return true;
}

static void test_job_and_search_columns(void **state) {
  (void)state;
  kexd *d = serving();
  const fuzz_method *m;
  uint32_t n = register_table(d, true, &m), named = 0, searched = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (m[i].payload != KEXD_PAYLOAD_ONE) continue;
    named += check_job_column(d, &m[i], contract_input(m[i].path));
    searched += check_search_column(d, &m[i], contract_input(m[i].path));
  }
  assert_int_equal(named, 14); /* every unary RPC but OpenJob and the two health ones */
  assert_int_equal(searched, 2); /* Submit and Tune */
  /* OpenJob opened jobs above: the table holds the fuzz job and those */
  while (d->jobs.njobs > 1) kexd_jobs_close_id(&d->jobs, d->jobs.jobs[d->jobs.njobs - 1]->id, "test");
  assert_non_null(kexd_jobs_find(&d->jobs, FUZZ_TOKEN));
  kex_free(d->rpc_routes);
  d->rpc_routes = NULL;
}

static void test_unknown_method(void **state) {
  (void)state;
  kexd *d = serving();
  static const char *const unknown[] = {"/kex.v1.Kex/Nope", "/kex.v1.Kex/openjob", "/kex.v1.Kex/OpenJob/",
                                        "/kex.v2.Kex/OpenJob", "OpenJob", ""};
  for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
    kexd_call c;
    assert_int_equal(fuzz_call_unary(d, &c, unknown[i], NULL, NULL), GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(c.details, "no such method"));
  }
}

int main(void) {
  (void)serving();
  kex_log_set_level(KEX_LOG_ERROR); /* after fuzzkexd's own level: the refusals here are expected */
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_rpc_has_a_row), cmocka_unit_test(test_request_type_column),
                                     cmocka_unit_test(test_job_and_search_columns), cmocka_unit_test(test_unknown_method)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

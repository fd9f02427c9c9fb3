/*
 * kex_doctor.c - `kex doctor`: what a newcomer needs to know before the
 * first run, in one report.
 *
 *   kex doctor [--json] [--cache PATH]
 *   kex --server ADDR doctor ...          (or KEX_SERVER=ADDR)
 *
 * 1. The OpenCL platforms and their devices, as kex_device_list finds them
 *    (devices/device.h), each opened to report its capabilities (identity,
 *    memory, compute units, work-groups, __local memory, float4, fp16,
 *    fp64), then the cpu backend; and which device "opencl" and "default"
 *    pick.
 * 2. The beam/program cache file kex tune and kexd use ($KEX_CACHE,
 *    $XDG_CACHE_HOME/kex/cache.db, ~/.cache/kex/cache.db; --cache PATH):
 *    whether it exists, its size (and its WAL's), when it last changed.
 *    Nothing is created or opened for writing.
 * 3. Whether a kexd answers at --server / KEX_SERVER (else at the default
 *    127.0.0.1:50051): its uptime, open jobs and devices, or the error and
 *    how to start one.
 *
 * Exit codes: 0 when every check passed, 1 when one failed (no device could
 * be opened; a server named by --server or KEX_SERVER does not answer; a
 * kexd at the default address that does not answer is only reported),
 * 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "client/kex_cli.h"
#include "core/alloc.h"

#ifdef KEX_HAVE_RUN
#include "realize/engine.h" /* the devices an engine runs on (devices/device.h through it) */
#include "realize/plan.h"   /* the cache file's default path (search/beam.h through it) */
#endif

#define DOCTOR_SERVER_TIMEOUT_S 3.0 /* deadline of each call to the server */

static void usage(FILE *f) {
  fputs("usage: kex [--server ADDR] doctor [--json] [--cache PATH]\n"
        "  this machine's OpenCL platforms and devices with their capabilities, the cache file\n"
        "  and its size, and whether a kexd answers at --server / KEX_SERVER (else " KEX_CLI_DEFAULT_SERVER ")\n",
        f);
}

/* ---- devices ---- */

#ifdef KEX_HAVE_RUN
/* One device's report; *opened tells whether it could be opened. */
static json_t *device_report(const kex_device_desc *d, bool as_json, bool *opened) {
  kex_device *dev = NULL;
  kex_error err = {0};
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:b}", "open_name", d->open_name, "kind", d->kind, "name", d->name,
                        "platform", d->platform, "is_gpu", d->is_gpu);
  int rc = kex_device_open(d->open_name, &dev, &err);
  *opened = rc == 0;
  bool quote = strpbrk(d->open_name, " \t'\"()&;|<>$`\\") != NULL; /* as a shell would need it */
  if (!as_json)
    printf("    %s%s\n      open as: --device %s%s%s\n", d->name, d->is_gpu ? " (GPU)" : "", quote ? "'" : "",
           d->open_name, quote ? "'" : "");
  if (rc) {
    const char *m = err.msg[0] ? err.msg : kex_strerror(rc);
    if (!as_json) printf("      cannot open: %s\n", m);
    json_object_set_new(o, "error", json_string(m));
    return o;
  }
  const kex_device_info *in = kex_device_get_info(dev);
  const kex_device_identity *id = &in->identity;
  char gm[32], ma[32], sm[32];
  kex_cli_bytes_text(in->global_mem, gm, sizeof gm);
  kex_cli_bytes_text(in->max_alloc, ma, sizeof ma);
  kex_cli_bytes_text(in->shared_max, sm, sizeof sm);
  if (!as_json) {
    printf("      vendor %s; driver %s\n      compiler %s\n", id->vendor, id->driver_version, id->compiler_version);
    printf("      memory %s (largest buffer %s); %d compute units\n", gm, ma, in->compute_units);
    if (in->has_local)
      printf("      work-groups up to %zu (%zu x %zu x %zu); __local memory %s\n", in->max_work_group_size,
             in->max_work_item_sizes[0], in->max_work_item_sizes[1], in->max_work_item_sizes[2],
             in->has_shared ? sm : "none");
    else
      printf("      no work-groups (kernels loop over their range)\n");
    printf("      float4 %s, float16 %s, float64 %s\n", in->supports_float4 ? "yes" : "no",
           in->supports_fp16 ? "yes" : "no", in->supports_fp64 ? "yes" : "no");
  }
  json_t *items = json_pack("[I, I, I]", (json_int_t)in->max_work_item_sizes[0], (json_int_t)in->max_work_item_sizes[1],
                            (json_int_t)in->max_work_item_sizes[2]);
  json_t *caps = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:b, s:b, s:I, s:I, s:o, s:b, s:b, s:b}", "vendor",
                           id->vendor, "device_name", id->name, "driver_version", id->driver_version,
                           "compiler_version", id->compiler_version, "global_mem", (json_int_t)in->global_mem,
                           "max_alloc", (json_int_t)in->max_alloc, "compute_units", in->compute_units, "has_local",
                           in->has_local, "has_shared", in->has_shared, "shared_max", (json_int_t)in->shared_max,
                           "max_work_group_size", (json_int_t)in->max_work_group_size, "max_work_item_sizes", items,
                           "supports_float4", in->supports_float4, "supports_fp16", in->supports_fp16,
                           "supports_fp64", in->supports_fp64);
  if (caps) json_object_update(o, caps);
  json_decref(caps);
  kex_device_unref(dev);
  return o;
}

/* The device kex_device_open(name) picks, as its identity's name ("" when none). */
static void picked(const char *name, char *out, size_t cap) {
  kex_device *dev = NULL;
  kex_error err = {0};
  out[0] = 0;
  if (kex_device_open(name, &dev, &err)) return;
  const kex_device_identity *id = kex_device_get_identity(dev);
  snprintf(out, cap, "%s (%s)", id->name, id->kind);
  kex_device_unref(dev);
}

/* Section 1 into doc["platforms"], doc["cpu"], doc["picks"]; returns false when no device opened. */
static bool check_devices(json_t *doc, bool as_json) {
  kex_device_desc *descs = NULL;
  size_t n = 0, nopened = 0, ncl = 0;
  kex_error err = {0};
  json_t *platforms = json_array(), *cpu = json_null();
  int rc = kex_device_list(&descs, &n, &err);
  if (!as_json) printf("OpenCL platforms and devices:\n");
  if (rc) {
    if (!as_json) printf("  cannot list devices: %s\n", err.msg[0] ? err.msg : kex_strerror(rc));
    json_object_set_new(doc, "devices_error", json_string(err.msg[0] ? err.msg : kex_strerror(rc)));
  }
  for (size_t i = 0; i < n; i++) {
    bool opened = false;
    if (strcmp(descs[i].kind, "opencl") != 0) continue;
    ncl++;
    /* a platform is the run of devices that name it */
    json_t *plat = NULL;
    size_t np = json_array_size(platforms);
    if (np && !strcmp(json_string_value(json_object_get(json_array_get(platforms, np - 1), "name")), descs[i].platform))
      plat = json_array_get(platforms, np - 1);
    if (!plat) {
      plat = json_pack("{s:s, s:[]}", "name", descs[i].platform, "devices");
      json_array_append_new(platforms, plat);
      if (!as_json) printf("  platform %s\n", descs[i].platform);
    }
    json_array_append_new(json_object_get(plat, "devices"), device_report(&descs[i], as_json, &opened));
    nopened += opened;
  }
  if (!ncl && !as_json)
    printf("  none (no OpenCL ICD or platform: install one, e.g. PoCL for CPUs, or use --device cpu)\n");
  for (size_t i = 0; i < n; i++) {
    bool opened = false;
    if (strcmp(descs[i].kind, "opencl") == 0) continue;
    if (!as_json) printf("cpu backend (C source -> cc -> dlopen):\n");
    json_decref(cpu);
    cpu = device_report(&descs[i], as_json, &opened);
    nopened += opened;
  }
  char cl[2 * KEX_DEVICE_FIELD_MAX + 8], def[2 * KEX_DEVICE_FIELD_MAX + 8];
  picked("opencl", cl, sizeof cl);
  picked("default", def, sizeof def);
  if (!as_json) {
    printf("--device opencl picks: %s\n", cl[0] ? cl : "nothing (no OpenCL device)");
    printf("--device default (kexd's first choice) picks: %s\n", def[0] ? def : "nothing");
  }
  json_object_set_new(doc, "platforms", platforms);
  json_object_set_new(doc, "cpu", cpu);
  json_object_set_new(doc, "picks", json_pack("{s:s?, s:s?}", "opencl", cl[0] ? cl : NULL, "default", def[0] ? def : NULL));
  kex_free(descs);
  if (!nopened && !as_json) printf("problem: no device could be opened\n");
  return nopened > 0;
}
#endif

/* ---- the cache file ---- */

static void check_cache(json_t *doc, const char *cache_opt, bool as_json) {
  char path[4096] = "";
  if (cache_opt) {
    snprintf(path, sizeof path, "%s", cache_opt);
  } else {
#ifdef KEX_HAVE_RUN
    kex_error err = {0};
    if (kex_beam_default_cache_path(path, sizeof path, &err)) {
      if (!as_json) printf("cache: no default path: %s\n", err.msg);
      json_object_set_new(doc, "cache", json_pack("{s:n, s:s}", "path", "error", err.msg));
      return;
    }
#else
    if (!as_json) printf("cache: this build has no search/ layer (no cache)\n");
    json_object_set_new(doc, "cache", json_null());
    return;
#endif
  }
  struct stat sb, wb;
  char wal[4200], sz[32], wsz[32], when[KEX_CLI_ISO8601_MAX];
  snprintf(wal, sizeof wal, "%s-wal", path);
  bool exists = stat(path, &sb) == 0;
  int why = errno;
  bool has_wal = stat(wal, &wb) == 0;
  json_t *c = json_pack("{s:s, s:b, s:s}", "path", path, "exists", exists, "from",
                        cache_opt ? "--cache" : getenv("KEX_CACHE") ? "KEX_CACHE" : "default");
  if (!as_json) printf("cache: %s%s\n", path, cache_opt ? " (--cache)" : getenv("KEX_CACHE") ? " (KEX_CACHE)" : "");
  if (exists) {
    kex_cli_iso8601((int64_t)(has_wal && wb.st_mtime > sb.st_mtime ? wb.st_mtime : sb.st_mtime), when);
    kex_cli_bytes_text((uint64_t)sb.st_size, sz, sizeof sz);
    kex_cli_bytes_text(has_wal ? (uint64_t)wb.st_size : 0, wsz, sizeof wsz);
    if (!as_json) printf("  %s (%lld bytes), write-ahead log %s; last changed %s\n", sz, (long long)sb.st_size, wsz, when);
    json_object_set_new(c, "bytes", json_integer((json_int_t)sb.st_size));
    json_object_set_new(c, "wal_bytes", json_integer(has_wal ? (json_int_t)wb.st_size : 0));
    json_object_set_new(c, "modified", json_string(when));
  } else if (!as_json) {
    printf("  not there yet (%s; kex tune, kex run --beam and kexd create it)\n", strerror(why));
  }
  json_object_set_new(doc, "cache", c);
}

/* ---- the server ---- */

/* Section 3 into doc["server"]; returns false when the server does not answer. */
static bool check_server(json_t *doc, kex_cli_remote *r, bool as_json) {
#ifdef KEX_HAVE_LIBKEX
  const char *addr = r && r->server ? r->server : KEX_CLI_DEFAULT_SERVER;
  const char *from = r && r->server ? "--server or KEX_SERVER" : "the default; set KEX_SERVER or --server";
  kex_client_opts o = {.token = r ? r->token : NULL, .tls = r && r->tls, .root_certs = r ? r->root_certs : NULL,
                       .client_cert = r ? r->client_cert : NULL, .client_key = r ? r->client_key : NULL,
                       .timeout_s = DOCTOR_SERVER_TIMEOUT_S};
  kex_client *c = NULL;
  kex_stats *s = NULL;
  kex_remote_device *d = NULL;
  size_t nd = 0;
  kex_status st = {0};
  json_t *srv = json_pack("{s:s, s:s}", "address", addr, "from", r && r->server ? "server" : "default");
  bool ok = !kex_client_connect(addr, &o, &c, &st) && !kex_get_stats(c, NULL, &s, &st) &&
            !kex_list_devices(c, &d, &nd, &st);
  if (!as_json) printf("kexd at %s (%s):\n", addr, from);
  json_object_set_new(srv, "answers", json_boolean(ok));
  if (ok) {
    char started[KEX_CLI_ISO8601_MAX];
    kex_cli_iso8601((int64_t)(time(NULL) - s->uptime_s + 0.5), started);
    json_t *devs = json_array();
    if (!as_json) printf("  answers: up %.0f s (since %s), %u jobs open\n  devices:", s->uptime_s, started, s->jobs_open);
    for (size_t i = 0; i < nd; i++) {
      json_array_append_new(devs, json_pack("{s:s, s:s, s:s, s:b, s:b}", "name", d[i].name, "kind", d[i].kind,
                                            "device_name", d[i].device_name, "is_default", d[i].is_default,
                                            "available", d[i].available));
      if (!as_json)
        printf("%s %s%s%s", i ? "," : "", d[i].name, d[i].is_default ? " (default)" : "",
               d[i].available ? "" : " (unavailable)");
    }
    if (!as_json) printf("\n");
    json_object_set_new(srv, "uptime_s", json_real(s->uptime_s));
    json_object_set_new(srv, "started", json_string(started));
    json_object_set_new(srv, "jobs_open", json_integer(s->jobs_open));
    json_object_set_new(srv, "devices", devs);
  } else {
    const char *m = st.msg[0] ? st.msg : kex_strerror(st.code);
    if (!as_json) {
      printf("  no answer: %s%s%s\n  ", st.grpc ? kex_grpc_status_name(st.grpc) : "", st.grpc ? ": " : "", m);
      kex_cli_start_hint(stdout, addr);
    }
    json_object_set_new(srv, "error", json_string(m));
  }
  json_object_set_new(doc, "server", srv);
  kex_remote_devices_free(d, nd);
  kex_stats_free(s);
  kex_client_close(c);
  return ok;
#else
  (void)r; /* always NULL: without libkex there is no server mode */
  if (!as_json) printf("kexd: this build has no client library (libkex) to ask one\n");
  json_object_set_new(doc, "server", json_pack("{s:n}", "answers"));
  return true;
#endif
}

int kex_cmd_doctor(kex_cli_remote *r, int argc, char **argv) {
  const char *cache_opt = NULL;
  bool as_json = false, ok = true;
  int c;
  const kex_cli_opt opts[] = {{"json", 'j', KEX_CLI_FLAG, &as_json},
                              {"cache", 'c', KEX_CLI_STR, &cache_opt},
                              {0}};
  if ((c = kex_cli_args("doctor", opts, NULL, NULL, argc, argv, usage)) >= 0) return c;
  json_t *doc = json_pack("{s:s}", "version", kex_cli_version());
  if (!as_json) printf("kex %s\n\n", kex_cli_version());
#ifdef KEX_HAVE_RUN
  ok &= check_devices(doc, as_json);
#else
  if (!as_json) printf("devices: this build has no devices/ layer (kex plan only)\n");
#endif
  if (!as_json) printf("\n");
  check_cache(doc, cache_opt, as_json);
  if (!as_json) printf("\n");
  bool answered = check_server(doc, r, as_json);
#ifdef KEX_HAVE_LIBKEX
  if (r && r->server) ok &= answered; /* a server the user named must answer */
#else
  (void)answered;
#endif
  json_object_set_new(doc, "ok", json_boolean(ok));
  if (as_json) {
    json_dumpf(doc, stdout, JSON_COMPACT);
    fputc('\n', stdout);
  }
  json_decref(doc);
  return ok ? 0 : 1;
}

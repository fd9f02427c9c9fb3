/*
 * rpc.c - the method table: every kex.v1.Kex and grpc.health.v1.Health
 * path and the handler that serves it.  The handlers live one concept per
 * file: request.c (decode, job check, failure), info.c (health, devices,
 * stats), job_rpc.c (jobs), pbgraph.c (Graph conversion), plan.c,
 * buffers.c (Upload, Download, Free), submit.c, tune.c (Tune),
 * cache_rpc.c (the cache methods); the streaming ones write through
 * stream.c.  Each handler runs on the loop thread; nothing a client sends
 * can make the daemon exit: every failure becomes a status.
 */
#include "core/errors.h"
#include "core/log.h"
#include "daemon/rpc.h"

int kexd_rpc_register(kexd *d) {
  static const struct {
    const char *path;
    kexd_payload payload;
    kexd_handler fn;
  } table[] = {
      {"/grpc.health.v1.Health/Check", KEXD_PAYLOAD_ONE, kexd_rpc_health_check},
      {"/grpc.health.v1.Health/Watch", KEXD_PAYLOAD_ONE, kexd_rpc_health_watch},
      {"/kex.v1.Kex/OpenJob", KEXD_PAYLOAD_ONE, kexd_rpc_open_job},
      {"/kex.v1.Kex/CloseJob", KEXD_PAYLOAD_ONE, kexd_rpc_close_job},
      {"/kex.v1.Kex/HoldJob", KEXD_PAYLOAD_ONE, kexd_rpc_hold_job},
      {"/kex.v1.Kex/Plan", KEXD_PAYLOAD_ONE, kexd_rpc_plan},
      {"/kex.v1.Kex/ListDevices", KEXD_PAYLOAD_ONE, kexd_rpc_list_devices},
      {"/kex.v1.Kex/GetStats", KEXD_PAYLOAD_ONE, kexd_rpc_get_stats},
      {"/kex.v1.Kex/Submit", KEXD_PAYLOAD_ONE, kexd_rpc_submit},
      {"/kex.v1.Kex/Upload", KEXD_PAYLOAD_STREAM, kexd_rpc_upload},
      {"/kex.v1.Kex/Download", KEXD_PAYLOAD_ONE, kexd_rpc_download},
      {"/kex.v1.Kex/Free", KEXD_PAYLOAD_ONE, kexd_rpc_free},
      {"/kex.v1.Kex/Tune", KEXD_PAYLOAD_ONE, kexd_rpc_tune},
      {"/kex.v1.Kex/ListCache", KEXD_PAYLOAD_ONE, kexd_rpc_list_cache},
      {"/kex.v1.Kex/GetCacheEntry", KEXD_PAYLOAD_ONE, kexd_rpc_get_cache_entry},
      {"/kex.v1.Kex/ExportCache", KEXD_PAYLOAD_ONE, kexd_rpc_export_cache},
      {"/kex.v1.Kex/ImportCache", KEXD_PAYLOAD_STREAM, kexd_rpc_import_cache},
      {"/kex.v1.Kex/DeleteCache", KEXD_PAYLOAD_ONE, kexd_rpc_delete_cache},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    int rc = kexd_server_add_method(d->server, table[i].path, table[i].payload, table[i].fn, d);
    if (rc < 0) {
      KEX_ERROR("cannot register %s: %s", table[i].path, kex_strerror(rc));
      return rc;
    }
  }
  if (d->cfg.test_busy_work) {
    int rc = kexd_server_add_method(d->server, "/kex.v1.Kex/_BusyWork", KEXD_PAYLOAD_ONE, kexd_rpc_busy_work, d);
    if (rc < 0) return rc;
    KEX_WARN("--test-busy-work: serving /kex.v1.Kex/_BusyWork (a test facility; never use it in production)");
  }
  return 0;
}

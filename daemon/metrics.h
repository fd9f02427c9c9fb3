/*
 * metrics.h - kexd's Prometheus endpoint: GET /metrics on --metrics ADDR
 * (DESIGN.md: 127.0.0.1:9464), served by libmicrohttpd on its own thread.
 *
 * The loop thread owns every counter.  A scrape asks the loop (the loop bridge)
 * for a fresh snapshot and waits for it at most KEXD_METRICS_WAIT_MS; the
 * loop copies the counters under a mutex held only for the copy, and the
 * HTTP thread formats from the copy.  So the loop never waits on HTTP, and
 * a busy loop makes a scrape a little stale, never a hang.
 */
#ifndef KEX_DAEMON_METRICS_H
#define KEX_DAEMON_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/histogram.h"

#define KEXD_DEFAULT_METRICS "127.0.0.1:9464"
#define KEXD_METRICS_WAIT_MS 1000        /* a scrape waits this long for the loop's snapshot */
#define KEXD_METRICS_CONNECTIONS 64      /* HTTP connections at once */
#define KEXD_METRICS_PER_IP 4            /* of them from one client address: slow clients cannot take them all */
#define KEXD_METRICS_TIMEOUT_S 3         /* an HTTP connection idle this long (a stalled request) is closed */
#define KEXD_METRICS_MAX_METHODS 64      /* gRPC methods counted by name (kex_rpcs_total) */
#define KEXD_METRICS_MAX_TENANTS 64      /* tenants with their own series (kex_tenant_*); the rest are tenant="_other" */

struct kexd;
typedef struct kexd_metrics kexd_metrics;

/*
 * Listen on addr ("HOST:PORT", "[V6]:PORT"; port 0 picks one) and serve
 * /metrics for d, on the loop thread before the loop runs.  On success
 * *out is the endpoint, which kexd_metrics_stop ends.  KEX_EINVAL (not
 * HOST:PORT), KEX_EUNAVAILABLE (cannot bind or listen: the port is in use),
 * KEX_ENOMEM, KEX_EINTERNAL; each logged naming the address (optional: a
 * port in use is a warning that kexd runs without metrics, the default
 * address's case, and the caller goes on).
 */
int kexd_metrics_start(struct kexd *d, const char *addr, bool optional, kexd_metrics **out);
/*
 * Stop serving (joins the HTTP thread; a scrape in flight is answered
 * from the last snapshot) and close the loop handle; the endpoint is freed
 * by the loop once the handle is closed.  Loop thread.  NULL is a no-op.
 */
void kexd_metrics_stop(kexd_metrics *m);

#endif

/*
 * fuzzkexd.h - kexd as main.c makes it, minus the gRPC server and the
 * device runners, for the fuzz targets that run the daemon's own request
 * code (fuzz_rpc, fuzz_stream): the default configuration, each configured
 * device's codegen target by name, a job table on a libuv loop holding one
 * job whose token is FUZZ_TOKEN with one float32 [4] buffer record whose
 * handle is FUZZ_HANDLE (no device memory behind it), and the protobuf-c
 * allocator every side decodes with (proto/pballoc.h).  Made on the first call,
 * torn down at exit so LeakSanitizer sees only what an input leaked.  Logs
 * at warn and above unless KEX_LOG says otherwise.
 */
#ifndef KEX_TESTS_FUZZ_FUZZKEXD_H
#define KEX_TESTS_FUZZ_FUZZKEXD_H

#include <protobuf-c/protobuf-c.h>

#include "daemon/kexd.h"
#include "proto/pballoc.h"

#define FUZZ_TOKEN "0123456789abcdef0123456789abcdef"  /* tests/fuzz/make_wire_corpus.py's TOKEN */
#define FUZZ_HANDLE "fedcba9876543210fedcba9876543210" /* tests/fuzz/make_rpc_corpus.py's HANDLE */

kexd *fuzz_kexd(void);
/*
 * The same kexd serving calls (for fakecall.c's calls): on the first call
 * its one device is "cpu" with a device runner (daemon/dispatch.c), Tune's
 * state is made and the cache file is cache_path; torn down at exit as
 * main.c does (jobs closed, runners stopped, handles closed).
 */
kexd *fuzz_kexd_serving(const char *cache_path);
/* Close the job (its buffers' frees go to the runner) and open it again, empty, with the same token. */
void fuzz_kexd_reset_job(kexd *d);
/* Run the loop once (blocking until something happens; the job table's timer bounds the wait). */
void fuzz_kexd_run_once(kexd *d);


#endif

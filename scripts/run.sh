#!/usr/bin/env bash
# run.sh [kexd OPTIONS...] - set up, build, and run the daemon with its embedded defaults.
#
# kexd listens on 127.0.0.1:50051 (gRPC), keeps its cache file under
# $XDG_CACHE_HOME/kex/ (else ~/.cache/kex/), and uses the first OpenCL GPU,
# else the first OpenCL device, else the cpu backend.  Options are passed to
# kexd (`scripts/run.sh --help` lists them).  Stop it with Ctrl-C (SIGINT) or
# SIGTERM: in-flight calls get the grace period, then it exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/configure.sh build >/dev/null
ninja -C build >/dev/null
exec ./build/daemon/kexd "$@"

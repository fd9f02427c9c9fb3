#!/usr/bin/env bash
# run.sh [kex plan ARGS...] - set up, build, and plan a graph with `kex plan`.
#
# kexd (the daemon) does not exist yet; until it does, "running kex" means
# scheduling a graph in-process: with no arguments this plans
# examples/graphs/softmax.json, otherwise it passes its arguments to
# `build/kex plan` (e.g. `scripts/run.sh --json examples/graphs/add.json`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/configure.sh build >/dev/null
ninja -C build
if [ ! -x build/kex ]; then
  echo "run: build/kex was not built (client/kex.c is not there yet); nothing to plan" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  set -- examples/graphs/softmax.json
fi
exec ./build/kex plan "$@"

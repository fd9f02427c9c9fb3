#!/usr/bin/env bash
# gen_stubs.sh - generate the Python gRPC stubs of proto/kex/v1/kex.proto into
# client/python/kex/_pb/ (git-ignored).  Uses Debian's python (grpc_tools).
# The stubs are generated flat (-I proto/kex/v1) and their one import is made
# package-relative, so they never clash with this package's own name `kex`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=${KEX_PROTO_DIR:-$here/../../proto}
out=$here/kex/_pb
PY=${KEX_PYTHON:-/usr/bin/python3}
mkdir -p "$out"
"$PY" -m grpc_tools.protoc -I "$proto/kex/v1" --python_out="$out" --grpc_python_out="$out" kex.proto
sed -i 's/^import kex_pb2 as/from . import kex_pb2 as/' "$out/kex_pb2_grpc.py"
touch "$out/__init__.py"

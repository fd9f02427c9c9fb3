#!/usr/bin/env bash
# test_metrics.sh - kexd's Prometheus endpoint (--metrics): the families and
# their counts after known calls (parsed with prometheus_client), --metrics
# off, KEX_METRICS, a taken or malformed metrics address.  test_metrics.py
# starts each kexd it needs.
#
# Env: KEX_BUILD_DIR (default build), KEX_CASES_DIR (unused here).
# Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
if ! $PY -c 'import prometheus_client.parser' 2>/dev/null; then
  bad "python3-prometheus-client is installed (scripts/setup.sh)"
  finish
fi
run_py test_metrics.py KEXD="$kexd" KEXD_TMP="$tmp"
finish

#!/usr/bin/env bash
# configure.sh DIR [MESON_OPTION...] - configure the meson build folder DIR.
#
# A fresh DIR gets `meson setup`; an existing one `meson setup --reconfigure`
# (meson.build picks up optional sources and tests with fs.exists() at
# configure time, so a new file only joins the build after a reconfigure).
set -euo pipefail
dir=$1
shift
cd "$(dirname "$0")/.."
if [ -f "$dir/meson-private/coredata.dat" ]; then
  meson setup --reconfigure "$@" "$dir"
else
  meson setup "$@" "$dir"
fi

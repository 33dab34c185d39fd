#!/usr/bin/env bash
# run-test.sh COMMAND ARGS... - one test of a tokshard bundle (CTestTestfile.cmake
# beside it runs every test through here): fills in the placeholders bundle.sh
# left for this machine's paths (@BIN@ the bundle's bin/, @TESTS@ its tests/,
# @WORK@ the scratch folder TKS_BUNDLE_WORK, default tests/work) and runs the
# command with the bundle's environment (../env).
set -uo pipefail
T=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
P=$(dirname "$T")
W=${TKS_BUNDLE_WORK:-$T/work}
mkdir -p "$W"
args=()
for a in "$@"; do
  a=${a//@BIN@/$P/bin}
  a=${a//@TESTS@/$T}
  a=${a//@WORK@/$W}
  args+=("$a")
done
export TKS_TEST_GCIDE=$T/gcide-head.gz
exec "$P/env" "${args[@]}"

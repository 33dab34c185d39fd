#!/usr/bin/env bash
# Installs dependencies, builds and runs every test with ctest.
#   scripts/test.sh             Release-with-debug-info build in build/
#   scripts/test.sh --sanitize  AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
# Where nvcc exists the normal build also compiles the CUDA backend (with the
# cuDNN frontend, fetched by install-deps --cuda); the sanitizer build leaves
# it out (no GPU code runs under ASan, and it is compiled once already).
# Extra arguments after -- go to ctest (e.g. -- -R dataset).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKS_WERROR=ON)
if [[ "${1:-}" == "--sanitize" ]]; then
  dir=build-asan
  cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DTKS_SANITIZE=ON -DTKS_WERROR=ON -DTKS_CUDA=OFF)
  shift
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
[[ "${1:-}" == "--" ]] && shift

# A full run leaves about 2.6 GiB in build/ (2.0 GiB in build-asan/), most of
# it the tests' work files under test-work/, plus 0.5 GiB of venvs on the first
# run. Refuse to start without that room rather than fail half-way with ENOSPC.
# TKS_MIN_FREE_GIB overrides the estimate (0 skips the check).
need_gib=${TKS_MIN_FREE_GIB:-4}
if (( need_gib > 0 )); then
  have_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
  used_kib=0
  [[ -d "$dir" ]] && used_kib=$(du -sk "$dir" | cut -f1)
  # what the existing build directory holds is overwritten, not added to
  if (( have_kib + used_kib < need_gib * 1024 * 1024 )); then
    echo "scripts/test.sh: only $((have_kib / 1024)) MiB free on the filesystem of $PWD;" \
         "a full test run needs about ${need_gib} GiB there (build directory $dir/ with the" \
         "tests' work files, and the venvs). Free some space, or set TKS_MIN_FREE_GIB to" \
         "another estimate (0 skips this check)." >&2
    exit 1
  fi
fi
scripts/install-deps.sh --cuda
cmake -S . -B "$dir" "${cmake_args[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" "$@"

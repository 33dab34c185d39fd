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
scripts/install-deps.sh --cuda
cmake -S . -B "$dir" "${cmake_args[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" "$@"

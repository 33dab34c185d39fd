#!/usr/bin/env bash
# Builds every configuration users and CI get, with warnings as errors, so the
# next warning cannot land: Release (what samples/main.sh builds, -O3) with
# gcc and with clang. Tests run in scripts/test.sh; this only compiles. The CUDA
# sources are compiled (with -Werror for their host code) by scripts/test.sh's
# build; here they are left out to keep CI's time.
# Usage: scripts/build-check.sh   (build trees in build-check-{gcc,clang}/)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --ci
for cc in gcc clang; do
  cxx=$([[ $cc == gcc ]] && echo g++ || echo clang++)
  echo "build-check: Release with $cc, -Werror"
  CC=$cc CXX=$cxx cmake -S . -B "build-check-$cc" -DCMAKE_BUILD_TYPE=Release -DTKS_WERROR=ON -DTKS_CUDA=OFF >/dev/null
  cmake --build "build-check-$cc" -j"$(nproc)" >"build-check-$cc/build.log" 2>&1 ||
    { tail -40 "build-check-$cc/build.log"; echo "build-check: $cc Release build failed"; exit 1; }
done
echo "build-check: gcc and clang Release builds are warning-free"

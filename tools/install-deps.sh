#!/usr/bin/env bash
# Installs every Debian package tokshard needs to build, test, run the main job
# and the benchmarks. Idempotent: packages already present are left alone and
# apt-get is skipped entirely when nothing is missing.
#
# Usage: tools/install-deps.sh [--bench | --ci]
#   --bench   also install what bench/ needs (python3-sentencepiece, numpy, time)
#   --ci      also install clang (tools/build-check.sh builds with gcc and clang)
set -euo pipefail

pkgs=(
  # build
  build-essential cmake pkg-config
  # libraries (OpenMP ships with gcc as libgomp)
  libsentencepiece-dev sentencepiece
  libarchive-dev zlib1g-dev
  libxxhash-dev xxhash
  libjansson-dev
  libopenblas-openmp-dev
  openmpi-bin libopenmpi-dev
  # real corpus used by the main job and the tests
  dict-gcide python3.11-doc
  # tools the tests use to make archives and compressed streams
  gzip xz-utils zstd bzip2 zip dictzip tar
  # plots of the training loss
  gnuplot-nox
  # the independent PyTorch reference of the trainer parity test (and numpy for
  # the tests that read safetensors files from Python)
  python3-torch python3-numpy
  # the project venv of the interop peers (tools/install-venv.sh)
  python3-venv python3-pip
  # transformers' slow LlamaTokenizer (use_fast=False) runs sentencepiece from Python
  python3-sentencepiece
)
if [[ "${1:-}" == "--bench" || "${TOKSHARD_BENCH:-0}" == 1 ]]; then
  pkgs+=(python3-sentencepiece python3-numpy time)
fi
if [[ "${1:-}" == "--ci" ]]; then
  pkgs+=(clang)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# The venv needs PyPI; without it the build, the main job and every other test
# still work, and the interop tests say what to run.
venv() {
  "$(dirname "$0")/install-venv.sh" || echo "install-deps: WARNING: could not make the project venv" \
    ".venv (no access to PyPI?): the interop peer tests fail until tools/install-venv.sh succeeds" >&2
}
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  venv
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
venv

#!/usr/bin/env bash
# Installs every Debian package tokshard needs to build, test, run the main job
# and the benchmarks. Idempotent: packages already present are left alone and
# apt-get is skipped entirely when nothing is missing.
#
# Usage: scripts/install-deps.sh [--bench] [--linux-source] [--ci] [--cuda]
#   --bench   also install what bench/ needs (python3-sentencepiece, numpy, time)
#   --linux-source  also install linux-source-6.1 (140 MB: the 1.36 GB tarball
#             that bench/bench_encode.sh --linux and bench_build.sh --large build)
#   --ci      also install clang (scripts/build-check.sh builds with gcc and clang)
#   --cuda    also fetch the cuDNN frontend headers (PyPI nvidia-cudnn-frontend,
#             header-only C++) into third_party/cudnn-frontend, for the CUDA
#             backend's flash attention; only when nvcc exists (else nothing to do)
set -euo pipefail

pkgs=(
  # build
  build-essential cmake pkg-config
  # libraries (OpenMP ships with gcc as libgomp)
  libsentencepiece-dev sentencepiece
  libarchive-dev zlib1g-dev
  libxxhash-dev xxhash
  libjansson-dev rapidjson-dev
  libpcre2-dev libutf8proc-dev
  libopenblas-openmp-dev
  openmpi-bin libopenmpi-dev
  # real corpus used by the main job and the tests
  dict-gcide python3.11-doc
  # multilingual real text for the encoder tests (CJK, Cyrillic, accented Latin)
  manpages-ja manpages-zh manpages-de manpages-ru manpages-es
  # tools the tests use to make archives and compressed streams
  gzip xz-utils zstd bzip2 zip dictzip tar
  # plots of the training loss
  gnuplot-nox
  # tests/test_slurm.sh runs build, audit and the trainer under srun on a
  # one-node Slurm cluster it starts itself (its own key, config and ports)
  slurm-wlm munge
  # the independent PyTorch reference of the trainer parity test (and numpy for
  # the tests that read safetensors files from Python)
  python3-torch python3-numpy
  # the project venv of the interop peers (scripts/install-venv.sh)
  python3-venv python3-pip
  # transformers' slow LlamaTokenizer (use_fast=False) runs sentencepiece from Python
  python3-sentencepiece
)
if [[ " $* " == *" --bench "* || "${TOKSHARD_BENCH:-0}" == 1 ]]; then
  pkgs+=(python3-sentencepiece python3-numpy time)
fi
if [[ " $* " == *" --linux-source "* ]]; then
  pkgs+=(linux-source-6.1 time)
fi
if [[ " $* " == *" --ci "* ]]; then
  pkgs+=(clang)
fi

want_cuda=0
for a in "$@"; do [[ "$a" == --cuda ]] && want_cuda=1; done
if ((want_cuda)); then
  here=$(cd "$(dirname "$0")/.." && pwd)
  fe=$here/third_party/cudnn-frontend
  if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    echo "install-deps: no nvcc: the CUDA backend is not built, cuDNN frontend not fetched"
  elif [[ -f $fe/include/cudnn_frontend.h ]]; then
    echo "install-deps: cuDNN frontend present ($fe)"
  else
    CUDNN_FE_VERSION=${CUDNN_FE_VERSION:-1.32.0}
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" -d "$tmp" &&
       mkdir -p "$fe.tmp" && unzip -q -o "$tmp"/nvidia_cudnn_frontend-*.whl 'include/*' -d "$fe.tmp"; then
      rm -rf "$fe" && mv "$fe.tmp" "$fe"
      echo "install-deps: cuDNN frontend $CUDNN_FE_VERSION headers in $fe"
    else
      rm -rf "$fe.tmp"
      echo "install-deps: could not fetch nvidia-cudnn-frontend from PyPI; the CUDA backend builds without cuDNN flash attention" >&2
    fi
    rm -rf "$tmp"
  fi
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
    ".venv (no access to PyPI?): the interop peer tests fail until scripts/install-venv.sh succeeds" >&2
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

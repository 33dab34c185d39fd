#!/usr/bin/env bash
# fetch-debs.sh - run on a Debian machine with apt and network, before a GPU run:
# downloads the Debian packages the GPU machine lacks (its image has nvcc,
# PyTorch and the NCCL/cuDNN wheels, but no Debian -dev libraries and no
# network) into .debs/ at the repository root, and the cuDNN frontend headers
# into third_party/cudnn-frontend (tools/install-deps.sh --cuda). Both paths
# are git-ignored: copy them with the working tree to the GPU machine (about 37 MB).
# bench/gpu/run.sh unpacks them there with dpkg -x (never into /).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
pkgs=(
  # build tools
  pkgconf pkgconf-bin libpkgconf3
  # sentencepiece, libarchive (and the libraries they link), xxhash, jansson
  libsentencepiece-dev libsentencepiece0 libarchive-dev libarchive13 libxml2 libicu72 libnettle8
  liblz4-1 libzstd1 libbz2-1.0 liblzma5 libacl1 zlib1g zlib1g-dev libxxhash-dev libxxhash0
  libjansson-dev libjansson4
  # OpenBLAS (OpenMP build) for the CPU reference the GPU tests compare with
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgfortran5 libquadmath0
  # Open MPI (launch and control; mpirun for the NCCL tests) and what it links
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libhwloc-plugins
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1
  libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1 libmunge2 libltdl7 libudev1
  libpciaccess0 ibverbs-providers libatomic1
)
mkdir -p .debs
(cd .debs && apt-get download "${pkgs[@]}")
# the train tests' text (dict-gcide is not on the GPU image): the 1.5 MB they read
{ zcat /usr/share/dictd/gcide.dict.dz || true; } | head -c 1500000 | gzip -9 >.debs/gcide-head.gz.tmp &&
  mv .debs/gcide-head.gz.tmp .debs/gcide-head.gz
tools/install-deps.sh --cuda >/dev/null
echo "fetch-debs: $(ls .debs | wc -l) packages in .debs ($(du -sh .debs | cut -f1)), cuDNN frontend in third_party/cudnn-frontend"

#!/usr/bin/env bash
# bundle.sh - one self-contained tarball of tokshard's CUDA-enabled programs,
# GPU tests and benchmark, for a GPU machine that has an NVIDIA driver, the
# CUDA runtime and NVIDIA's Python wheels (cuBLAS, cuDNN, NCCL) but none of
# our Debian packages and no network. Built here, where the toolkit is; run
# there without compiling:
#
#   bench/gpu/bundle.sh                      # -> build-bundle/tokshard-gpu-<commit>.tar.xz
#   # on the GPU machine:
#   tar -xJf tokshard-gpu-*.tar.xz && cd tokshard-gpu-* && OUT=results ./first_call.sh
#
# What it holds (docs/GPU.md, "The bundle"):
#   bin/      the programs (tokshard, tokshard-full, tokshard-train,
#             tokshard-generate, tokshard-bench-gpu) and the test executables,
#             debug info stripped; they find lib/ through DT_RPATH $ORIGIN/../lib
#   lib/      libtks_cuda.so (every kernel, once) and every shared library the
#             programs need that such a machine lacks: Open MPI, OpenBLAS,
#             sentencepiece, libarchive and what it links, jansson, xxhash, ...
#             The C library, libstdc++, libgcc_s and NVIDIA's own libraries are
#             not carried: the machine's are used.
#   openmpi/  Open MPI's launcher, daemon, components and help files, found
#             through OPAL_PREFIX (set by ./env)
#   tests/    a CTestTestfile.cmake with the GPU tests, the train fixture and
#             the CPU checks the GPU tests compare with, taken from the build's
#             own test list, so `./env ctest --test-dir tests -L gpu` runs them
#   bench/    the PyTorch anchor (torch_anchor.py); run.sh: the GPU runbook;
#             first_call.sh: every test and the benchmark in one command
#             under one deadline; README.md: how to run them
#   env       runs a command with the bundle's PATH, libraries and Open MPI
#   BUNDLE    what was built: commit, compiler, architectures, each library
#             carried and the Debian package it came from
#
# Usage: bench/gpu/bundle.sh [--build DIR] [--out FILE.tar.xz] [--archs "80;90"] [--jobs N]
#   --build DIR  pack an existing build directory instead of configuring and
#                building build-bundle/ (Release, -DTKS_CUDA=ON); a build
#                without CUDA gives a CPU-only bundle (its test uses that)
#   --out FILE   where to write the tarball (default: the build directory)
#   --archs L    CUDA architectures for build-bundle/ (default "80;90": A100, H100/H200)
# Needs: cmake, a C/C++ compiler, nvcc (/usr/local/cuda), python3, strip, xz,
# and the cuDNN frontend headers (scripts/install-deps.sh --cuda).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
build="" out="" archs="80;90" jobs=$(nproc)
while (($#)); do
  case $1 in
  --build) build=$(cd "$2" && pwd); shift 2 ;;
  --out) out=$2; shift 2 ;;
  --archs) archs=$2; shift 2 ;;
  --jobs) jobs=$2; shift 2 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "bundle.sh: unknown argument '$1' (--build DIR, --out FILE, --archs LIST, --jobs N)" >&2; exit 2 ;;
  esac
done
die() { echo "bundle.sh: $*" >&2; exit 1; }
for t in cmake python3 strip strings xz ldd objdump readelf; do command -v $t >/dev/null || die "needs '$t' on the PATH"; done

TARGETS=(tokshard tokshard_full tokshard-train tokshard-generate tokshard-bench-gpu forge_token
  test_ops test_model test_comm test_cuda_ops test_cuda_model test_cuda_memory test_cuda_comm)
if [[ -z $build ]]; then
  [[ -f $SRC/third_party/cudnn-frontend/include/cudnn_frontend.h ]] ||
    die "no cuDNN frontend in third_party/cudnn-frontend: run scripts/install-deps.sh --cuda first" \
      "(without it the bundle's attention would not be cuDNN's)"
  build=$SRC/build-bundle
  cmake -S "$SRC" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTKS_CUDA=ON -DTKS_WERROR=OFF \
    "-DCMAKE_CUDA_ARCHITECTURES=$archs" >"$SRC/build-bundle.log" 2>&1 ||
    die "configure failed: $(tail -5 "$SRC/build-bundle.log")"
  cmake --build "$build" -j"$jobs" --target "${TARGETS[@]}" >>"$SRC/build-bundle.log" 2>&1 ||
    die "build failed: $(grep -m3 -i error "$SRC/build-bundle.log")"
fi
B=$build/bin
[[ -x $B/tokshard-train && -x $B/tokshard-full ]] || die "$build has no bin/tokshard-train: build it first or leave out --build"
cuda=0
[[ -f $build/lib/libtks_cuda.so ]] && cuda=1
commit=$(git -C "$SRC" rev-parse --short=10 HEAD 2>/dev/null || echo unknown)
git -C "$SRC" diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
name=tokshard-gpu-$commit
((cuda)) || name=tokshard-cpu-$commit
out=${out:-$build/$name.tar.xz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
P=$work/$name
mkdir -p "$P"/{bin,lib,tests,bench}

# ---- programs and test executables, without debug info ----------------------
for f in tokshard tokshard-full tokshard-train tokshard-generate tokshard-bench-gpu tokshard-sample-plan \
  forge_token test_ops test_model test_comm test_cuda_ops test_cuda_model test_cuda_memory test_cuda_comm; do
  [[ -x $B/$f ]] || continue
  strip --strip-debug -o "$P/bin/$f" "$B/$f"
done
((cuda)) && strip --strip-debug -o "$P/lib/libtks_cuda.so" "$build/lib/libtks_cuda.so"

# ---- Open MPI: launcher, daemon, components, help files ----------------------
# Debian's layout under a prefix of its own, which OPAL_PREFIX relocates.
ompi_pkglib=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
ompi_pkglib=${ompi_pkglib:-/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3}
[[ -d $ompi_pkglib ]] || die "no Open MPI components at $ompi_pkglib (libopenmpi3)"
O=$P/openmpi
ompi_data=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
ompi_data=${ompi_data:-/usr/share/openmpi}
[[ $ompi_pkglib == /usr/* && $ompi_data == /usr/* ]] || die "Open MPI is not under /usr ($ompi_pkglib)"
mkdir -p "$O/bin" "$O/${ompi_pkglib#/usr/}" "$O/$(dirname "${ompi_data#/usr/}")"
cp "$(readlink -f "$(command -v mpirun)")" "$O/bin/orterun"
cp "$(readlink -f "$(command -v orted)")" "$O/bin/orted"
ln -s orterun "$O/bin/mpirun"
ln -s ../openmpi/bin/orterun "$P/bin/mpirun"
cp -r "$ompi_data" "$O/${ompi_data#/usr/}"
# Components that need a fabric library (InfiniBand verbs, UCX, libfabric, PSM)
# are left out: one node's processes talk through shared memory and TCP.
fabric='libibverbs|libucp|libucs|libuct|libfabric|libpsm|librdmacm|libnl-|libjvm'
for c in "$ompi_pkglib"/*.so; do
  ldd "$c" 2>/dev/null | grep -Eq "$fabric|not found" && continue
  cp "$c" "$O/${ompi_pkglib#/usr/}/"
done
# PMIx (Open MPI's process manager interface) with its plugins, under
# PMIX_PKGLIBDIR and PMIX_PKGDATADIR (set by ./env)
pmix=/usr/lib/x86_64-linux-gnu/pmix2
if [[ -d $pmix/lib/pmix ]]; then
  mkdir -p "$P/pmix/lib"
  cp -r "$pmix/lib/pmix" "$P/pmix/lib/"
  [[ -d $pmix/share ]] && cp -r "$pmix/share" "$P/pmix/"
fi

# ---- every shared library they need that a bare GPU machine lacks -----------
# The machine's own: the C library, libstdc++, libgcc_s; NVIDIA's: the driver,
# the CUDA runtime, cuBLAS(Lt), cuDNN, NCCL, NVRTC (wheels or the toolkit).
system='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libgcc_s|libstdc\+\+)\.so'
nvidia='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z-]*|libnvJitLink|libnvidia-[a-z-]*)\.so'
: >"$work/libs"
while IFS= read -r elf; do
  ldd "$elf" | awk -v f="$elf" '/=>/ {print $1, $3, f} /not found/ {print $1, "NOTFOUND", f}' >>"$work/libs"
done < <(find "$P/bin" "$P/lib" "$O" "$P/pmix" -type f \( -perm -u+x -o -name '*.so*' \) 2>/dev/null |
  while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
missing=""
declare -A seen
while read -r so path from; do
  [[ $so =~ $system || $so =~ $nvidia || -n ${seen[$so]:-} ]] && continue
  seen[$so]=1
  [[ $so == libtks_cuda.so ]] && continue
  if [[ $path == NOTFOUND ]]; then missing+=" $so (needed by ${from#"$P"/})"; continue; fi
  cp -L "$path" "$P/lib/$so"
  real=$(readlink -f "$path")
  # Debian registers some files under /lib, some under /usr/lib (merged /usr)
  pkg=$({ dpkg -S "$real" || dpkg -S "${real#/usr}"; } 2>/dev/null | head -1 | sed 's/: .*//' || true)
  ver=""
  [[ -n $pkg ]] && ver=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
  echo "$so $real ${pkg:-?} $ver" >>"$work/carried"
done <"$work/libs"
[[ -z $missing ]] || die "libraries not found here:$missing"
# The OpenMP build of OpenBLAS, whatever the alternatives point at here
[[ -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 ]] &&
  cp -L /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 "$P/lib/libopenblas.so.0"
chmod -R u+w,a+rX "$P"

# ---- what the GPU machine must provide ----------------------------------------
# The C library and libstdc++ are the machine's: the newest symbol version any
# carried file asks for must be met by glibc GLIBC_MAX (2.36, Debian 12's; a
# GPU image is as new or newer), else the program stops at load time there.
elves=$(find "$P" -type f | while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
GLIBC_MAX=${TKS_BUNDLE_GLIBC_MAX:-2.36}
newest() { sort -t_ -k2 -V | tail -1; }
glibc_need=$(for f in $elves; do objdump -T "$f" 2>/dev/null | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' || true; done |
  sort -u | newest)
cxx_need=$(for f in $elves; do objdump -T "$f" 2>/dev/null | grep -oE 'GLIBCXX_[0-9]+(\.[0-9]+)+' || true; done |
  sort -u | newest)
if [[ -n $glibc_need ]] && [[ $(printf '%s\n' "${glibc_need#GLIBC_}" "$GLIBC_MAX" | sort -V | tail -1) != "$GLIBC_MAX" ]]; then
  die "a carried file needs $glibc_need, newer than glibc $GLIBC_MAX:" \
    "$(for f in $elves; do objdump -T "$f" 2>/dev/null | grep -q "$glibc_need" && echo "${f#"$P"/}"; done | head -5)"
fi
# NVIDIA's libraries by soname: those of the CUDA 13 wheels and toolkit (a
# PyTorch cu130 image), nothing else
nv_want='libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcudnn.so.9 libnccl.so.2'
nv_need=$(for f in $elves; do readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done |
  { grep -E "$nvidia" || true; } | sort -u | tr '\n' ' ')
for so in $nv_need; do
  [[ " $nv_want " == *" $so "* ]] || die "a program links $so; a CUDA 13 machine provides $nv_want"
done

# ---- the tests: the build's own list, paths made relative to the bundle -----
for f in lib.sh test_train.sh test_parallel.sh test_cuda_train.sh test_cuda_parallel.sh layout_losses.py mpirun.sh cuda_mpirun.sh; do
  cp "$SRC/tests/$f" "$P/tests/"
done
# the train fixture's text (the first 1.5 MB of GCIDE, as tests/test_train.sh reads it)
{ zcat "${TKS_TEST_GCIDE:-/usr/share/dictd/gcide.dict.dz}" || true; } | head -c 1500000 | gzip -9 >"$P/tests/gcide-head.gz"
python3 "$SRC/bench/gpu/bundle_tests.py" "$build/tests/CTestTestfile.cmake" "$SRC" "$build" >"$P/tests/CTestTestfile.cmake"
cp "$SRC/bench/gpu/bundle_test_run.sh" "$P/tests/run-test.sh"
cp "$SRC/bench/gpu/torch_anchor.py" "$P/bench/"
cp "$SRC/bench/gpu/run.sh" "$P/run.sh"
cp "$SRC/bench/gpu/first_call.sh" "$P/first_call.sh"
cp "$SRC/bench/gpu/bundle_readme.md" "$P/README.md"
cp "$SRC/bench/gpu/bundle_env.sh" "$P/env"
chmod +x "$P/env" "$P/run.sh" "$P/first_call.sh" "$P/tests/run-test.sh"

{
  echo "tokshard bundle $name"
  echo "commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "build: $(grep -m1 '^CMAKE_BUILD_TYPE:' "$build/CMakeCache.txt" | cut -d= -f2)"
  if ((cuda)); then
    nvcc=$(grep -m1 '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)
    sms=$(strings -a "$P/lib/libtks_cuda.so" | sed -n 's/^\.target \(sm_[0-9a-z]*\).*/\1/p' | sort -u | tr '\n' ' ')
    echo "cuda: $("$nvcc" --version | tail -1); kernels for ${sms:-?}"
    echo "cudnn attention: $(grep -q '^TKS_CUDNN_FE_INCLUDE:PATH=/' "$build/CMakeCache.txt" && echo yes || echo no)"
  else
    echo "cuda: none (a CPU-only bundle)"
  fi
  echo "needs from the machine: glibc >= ${glibc_need#GLIBC_} (built with $(ldd --version | head -1 | awk '{print $NF}'))," \
    "libstdc++ with ${cxx_need:-no GLIBCXX symbol}, libgcc_s"
  echo "needs from NVIDIA (sonames the programs link): ${nv_need:-none (a CPU-only bundle)}"
  echo "carried libraries (soname, source, Debian package, version):"
  sort "$work/carried" | sed 's/^/  /'
} >"$P/BUNDLE"

mkdir -p "$(dirname "$out")"
tar -C "$work" -cf - "$name" | xz -T"$jobs" -6 >"$out.tmp"
mv "$out.tmp" "$out"
echo "bundle.sh: $out ($(du -k "$out" | cut -f1) KiB packed, $(du -sk "$P" | cut -f1) KiB unpacked," \
  "$(ls "$P/lib" | wc -l) libraries, $(grep -c '^add_test' "$P/tests/CTestTestfile.cmake") tests)"

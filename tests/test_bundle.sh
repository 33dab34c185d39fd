#!/usr/bin/env bash
# test_bundle.sh - the GPU bundle (bench/gpu/bundle.sh) runs where our Debian
# packages are not: the build is packed (debug info stripped), the tarball is
# unpacked into an empty prefix, and then, in a private mount namespace where
# every system copy of a library the bundle carries reads as an empty file and
# Open MPI's, PMIx's and OpenBLAS's folders are empty, the bundle's own tests
# run from it: the CPU ones (the train fixture's tokenizer and dataset, the
# ops and model checks, a 4-process MPI run of every collective, CPU training
# in one process and in every dp_replicate x dp_shard x tp layout under
# mpirun) must pass, the GPU ones must pass or report skipped (no GPU here).
# A library the bundle forgot would be loaded from the hidden system copy and
# fail ("file too short"), so this cannot pass by finding the machine's.
# Exits 77 where a mount namespace cannot be made (not root, no unshare).
# Usage: test_bundle.sh SRC_DIR BUILD_DIR WORKDIR
set -uo pipefail
SRC=$1
BUILD=$2
W=$3
CASE=bundle
source "$SRC/tests/lib.sh"
rm -rf "$W" && mkdir -p "$W"
if ! unshare -m true 2>/dev/null; then
  echo "skipped: cannot make a mount namespace here (unshare -m: needs root or user namespaces)"
  exit 77
fi

expect 0 "pack the build" -- bash "$SRC/bench/gpu/bundle.sh" --build "$BUILD" --out "$W/bundle.tar.xz"
cat "$W/out"
size=$(stat -c %s "$W/bundle.tar.xz")
((size < 40 * 1024 * 1024)) && ok "bundle is $((size / 1024)) KiB, under 40 MiB" || fail "bundle is $size bytes (over 40 MiB)"
mkdir -p "$W/prefix"
tar -C "$W/prefix" -xJf "$W/bundle.tar.xz" || fail "unpack"
P=$(echo "$W"/prefix/tokshard-*)
[[ -x $P/env && -x $P/bin/tokshard-train && -f $P/tests/CTestTestfile.cmake ]] && ok "unpacked into $P" ||
  fail "unpacked bundle lacks env, bin/tokshard-train or tests/"
# tar kept the programs' DT_RPATH relative: nothing points back into the build
if readelf -d "$P/bin/tokshard-train" | grep -q 'RPATH.*\$ORIGIN/\.\./lib'; then ok "programs find ../lib (DT_RPATH)"; else
  fail "tokshard-train has no \$ORIGIN/../lib RPATH: $(readelf -d "$P/bin/tokshard-train" | grep -i path)"
fi

# every system copy of what the bundle carries, and the folders it relocates
hide=$W/hide.list
sed -n 's/^  [^ ]* \(\/[^ ]*\) .*/\1/p' "$P/BUNDLE" >"$hide"
[[ -s $hide ]] && ok "$(wc -l <"$hide") carried libraries to hide" || fail "BUNDLE lists no carried library"
# mount(8) itself may need a library the bundle carries (libpcre2 through
# libselinux): it runs on private copies of its own libraries
mkdir -p "$W/mountlibs"
ldd "$(command -v mount)" | awk '/=> \// {print $3}' | xargs -r cp -L -t "$W/mountlibs"
cat >"$W/hidden.sh" <<'EOF'
set -u
mount() { LD_LIBRARY_PATH=$MOUNTLIBS command mount "$@"; }
while read -r f; do mount --bind /dev/null "$f" || exit 3; done <"$1"
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
  /usr/lib/x86_64-linux-gnu/openblas-openmp; do
  [[ -d $d ]] && { mount -t tmpfs none "$d" || exit 3; }
done
for f in /usr/bin/orterun /usr/bin/orted; do [[ -e $f ]] && { mount --bind /dev/null "$f" || exit 3; }; done
# no ssh or rsh, as on many GPU images: Open MPI must start its local ranks
# without them (./env picks the isolated launcher)
for t in ssh rsh; do f=$(command -v $t) && { mount --bind /dev/null "$f" || exit 3; }; done
shift
exec "$@"
EOF
hidden() { MOUNTLIBS=$W/mountlibs unshare -m bash "$W/hidden.sh" "$hide" "$@"; }

# the hiding works: the build's own programs no longer start
hidden "$BUILD/bin/tokshard" --version >"$W/out" 2>"$W/err"
code=$?
[[ $code -ne 0 ]] && grep -q "error while loading shared libraries" "$W/err" &&
  ok "with the system copies hidden, the build's tokshard cannot start (exit $code)" ||
  fail "hiding failed: the build's tokshard ran (exit $code): $(head -c 300 "$W/err")"

expect 0 "the bundle's tokshard-train starts" -- hidden "$P/env" tokshard-train --help
# ./env run from a hostile directory: its nvidia/ package is never imported
# (python3 -I from /), and no relative folder goes onto the loader's path
mkdir -p "$W/hostile/nvidia/cu13/lib"
printf 'open("%s", "w").write("imported")\n' "$W/hostile/ran" >"$W/hostile/nvidia/__init__.py"
: >"$W/hostile/nvidia/cu13/lib/libcudart.so.13"
(cd "$W/hostile" && "$P/env" bash -c 'echo "$LD_LIBRARY_PATH"') >"$W/ldpath" 2>&1
[[ ! -e $W/hostile/ran ]] && ! grep -q "hostile" "$W/ldpath" && ! tr ':' '\n' <"$W/ldpath" | grep -q '^[^/]' &&
  ok "./env from a directory holding nvidia/: not imported, nothing relative on the loader's path" ||
  fail "./env took the caller's nvidia/: $(ls "$W/hostile") $(cat "$W/ldpath")"
# CPU tests from the bundle (parallel_layouts trains in 8 layouts: the longest)
hidden "$P/env" ctest --test-dir "$P/tests" -LE gpu -V --timeout 600 >"$W/ctest-cpu.log" 2>&1
code=$?
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed" "$W/ctest-cpu.log"
n=$(grep -Ec "^ *[0-9]+/[0-9]+ Test" "$W/ctest-cpu.log")
[[ $code -eq 0 ]] && grep -q "100% tests passed" "$W/ctest-cpu.log" && ((n >= 7)) &&
  ok "the bundle's $n CPU tests pass with the system copies hidden" ||
  fail "the bundle's CPU tests (exit $code): $(grep -E 'Failed|\*\*\*' "$W/ctest-cpu.log" | head -5)"
# Open MPI and PMIx found their components and help files inside the bundle
if grep -Eq "supposed to get help|component .* not found|unable to open mca_" "$W/ctest-cpu.log"; then
  fail "Open MPI or PMIx looked outside the bundle: $(grep -Em2 -A3 'supposed to get help|not found|unable to open' "$W/ctest-cpu.log")"
else
  ok "Open MPI and PMIx ran from the bundle without a missing component or help file"
fi
# ---- bench/gpu/first_call.sh rehearsed: the script a GPU machine runs first, here
# against this bundle's tarball, with xz, ssh and rsh hidden (unpacked by
# Python's tarfile, ranks started without a remote shell); its GPU tests and
# benchmarks skip or fail for want of a GPU, and the script must still run
# every part within its deadline and leave at most 8 files, the summary first
rehearse() { # DEADLINE_S LABEL: OUT=$W/fc-LABEL; prints the seconds it took
  local t0
  t0=$(date +%s)
  unshare -m bash -c 'for t in xz ssh rsh; do f=$(command -v $t) && mount --bind /dev/null "$f"; done; exec "$@"' \
    _ env OUT="$W/fc-$2" TKS_DEADLINE_S="$1" TKS_WORK="$W/fc-work-$2" \
    bash "$SRC/bench/gpu/first_call.sh" "$W/bundle.tar.xz" >"$W/fc-$2.out" 2>&1
  echo "$? $(($(date +%s) - t0))"
}
read -r code took <<<"$(rehearse 450 full)"
F=$W/fc-full
[[ $code -eq 0 ]] && ok "first_call.sh ran to its end in ${took}s (deadline 450 s)" ||
  fail "first_call.sh exit $code: $(tail -5 "$W/fc-full.out")"
((took <= 455)) || fail "first_call.sh took ${took}s, past its 450 s deadline"
n=$(find "$F" -type f | wc -l)
first=$(ls "$F" | head -1)
((n <= 8)) && [[ $first == 0-summary.md ]] && ok "first_call.sh left $n files, the summary first" ||
  fail "first_call.sh left $n files (at most 8), first '$first': $(ls "$F" | tr '\n' ' ')"
grep -q "unpack | ok .*Python tarfile" "$F/0-summary.md" && ok "unpacked without xz (Python's tarfile)" ||
  fail "unpack without xz: $(grep -m1 unpack "$F/0-summary.md")"
grep -q "^mpirun exit 0" "$F/1-probe.txt" && grep -q "rank 1 of 2" "$F/1-probe.txt" &&
  ok "the probe's 2-rank mpirun ran without ssh or rsh" ||
  fail "2-rank mpirun without ssh/rsh: $(grep -A4 -- '--- 2-rank' "$F/1-probe.txt" | head -6)"
for part in probe tests nccl "small tokshard" "small torch eager" "1b tokshard" "1b torch.compile" \
  "small torch.compile"; do
  grep -q "^| $part | " "$F/0-summary.md" || fail "the summary has no row for '$part'"
done
ok "the summary has a row for every part"
if grep -q 'LABELS "gpu"' "$P/tests/CTestTestfile.cmake"; then
  # no GPU here: every GPU test skips, none fails
  sk=$(grep -Ec "^\| cuda_[a-z0-9_]+ \| Skipped" "$F/0-summary.md")
  ((sk >= 6)) && ! grep -Eq "^\| cuda_[a-z0-9_]+ \| (Failed|Timeout)" "$F/0-summary.md" &&
    ok "first_call.sh: $sk GPU tests reported skipped, none failed" ||
    fail "first_call.sh's tests: $(grep -E '^\| cuda_' "$F/0-summary.md" | head -8)"
fi
# a short deadline: the script stops itself in time and says what it skipped
read -r code took <<<"$(rehearse 45 short)"
[[ $code -eq 0 ]] && ((took <= 50)) && grep -q "skipped | 0 | deadline" "$W/fc-short/0-summary.md" &&
  ok "first_call.sh with a 45 s deadline: done in ${took}s, the parts it had no time for named" ||
  fail "first_call.sh with a 45 s deadline: exit $code in ${took}s: $(cat "$W/fc-short/0-summary.md" 2>&1 | head -20)"

# GPU tests: they load libtks_cuda.so and NVIDIA's libraries, then pass or skip
if ! grep -q 'LABELS "gpu"' "$P/tests/CTestTestfile.cmake"; then
  ok "a CPU-only build: the bundle has no GPU tests"
  finish bundle
fi
# through the runbook's test phase, which writes the summary table
# (inside ./env: run.sh's own mkdir and sed then find the bundle's copies
# of what the hiding took from them; a real GPU machine hides nothing)
hidden "$P/env" "$P/run.sh" "$W/gpu-out" test >"$W/ctest-gpu.log" 2>&1
code=$?
cat "$W/gpu-out/test.log" >>"$W/ctest-gpu.log" 2>/dev/null
tail -14 "$W/ctest-gpu.log"
if grep -Eq "^[0-9]+ tests: [0-9]+ passed, 0 failed" "$W/gpu-out/test-summary.md" 2>/dev/null; then
  ok "run.sh test: $(tail -1 "$W/gpu-out/test-summary.md")"
else
  fail "run.sh test wrote no summary without failures: $(cat "$W/gpu-out/test-summary.md" 2>&1 | tail -3)"
fi
# (the tests' own log: run.sh itself uses the machine's sed and grep, which the
# hiding breaks here and a real GPU machine has)
if grep -q "error while loading shared libraries" "$W/gpu-out/test.log"; then
  fail "a GPU test could not load a library: $(grep -m1 'error while loading' "$W/gpu-out/test.log")"
elif [[ $code -eq 0 ]] && grep -q "tests passed, 0 tests failed" "$W/ctest-gpu.log"; then
  ok "GPU tests: $(grep -E 'tests passed' "$W/ctest-gpu.log" | tail -1), $(grep -c '(Skipped)' "$W/ctest-gpu.log") skipped"
else
  fail "GPU tests (run.sh exit $code): $(grep -E 'Failed|\*\*\*' "$W/ctest-gpu.log" | head -5)"
fi
finish bundle

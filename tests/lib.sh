# lib.sh - helpers shared by the shell tests (sourced; needs CASE and W set).
# A check that fails increments $fails; finish() turns that into the exit code.
fails=0
# tests/fault_inject.c is loaded with LD_PRELOAD; under AddressSanitizer that
# needs ASan's library-order check off (ASan still instruments everything)
if [[ -n ${ASAN_OPTIONS:-} && $ASAN_OPTIONS != *verify_asan_link_order* ]]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0"
fi
fail() { echo "FAIL [$CASE]: $*" >&2; fails=$((fails + 1)); }
ok() { echo "ok   [$CASE]: $*"; }
# expect CODE DESCRIPTION -- command...: runs, checks the exit code; stdout in
# $W/out, stderr in $W/err
expect() {
  local want=$1 what=$2
  shift 3
  "$@" >"$W/out" 2>"$W/err"
  local got=$?
  if [[ $got -ne $want ]]; then
    fail "$what: exit $got, expected $want; stderr: $(tail -c 600 "$W/err")"
    return 1
  fi
  ok "$what (exit $got)"
}
# expect_msg PATTERN: the last expect's stderr matches the extended regex
expect_msg() {
  if grep -Eq -- "$1" "$W/err"; then ok "message matches '$1'"; else
    fail "message does not match '$1': $(tail -c 600 "$W/err")"
  fi
}
# finish NAME: the exit status of the test
finish() {
  if [[ $fails -ne 0 ]]; then
    echo "$1 [$CASE]: $fails check(s) failed" >&2
    exit 1
  fi
  echo "$1 [$CASE]: all checks passed"
  exit 0
}
# mpi_env: what the tests' multi-process runs need: OpenMPI as root,
# oversubscribed, over shared memory; no leak checking in MPI processes under
# the sanitizers (OpenMPI's dlopen'ed components show up as leaks no
# suppression can name; ASan still checks every access)
mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  [[ -z ${ASAN_OPTIONS:-} || $ASAN_OPTIONS == *detect_leaks=0* ]] || export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
}

#!/usr/bin/env bash
# mpirun.sh NP PROGRAM [ARGS...]: a C test on NP local processes, as
# test_parallel.sh runs them (oversubscribed, shared-memory transport, leak
# checking off for MPI processes under the sanitizers: OpenMPI's dlopen'ed
# components show up as leaks no suppression can name).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
[[ -n ${ASAN_OPTIONS:-} ]] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
np=$1
shift
exec mpirun --oversubscribe -x TOKSHARD_TEST_COMM_CHUNK -np "$np" "$@"

#!/usr/bin/env bash
# cuda_mpirun.sh NP SECONDS PROGRAM [ARGS...]: PROGRAM on NP local processes that
# share the machine's one GPU, as the NCCL tests run them (cuda_comm_*,
# cuda_parallel), stopped after SECONDS with a message that says so.
#
# Several ranks on one GPU without MPS time-slice its kernels, and NCCL 2.28
# refuses two ranks on one GPU unless each has its own NCCL_HOSTID; with one
# each, NCCL treats the ranks as separate hosts and connects them over
# sockets (loopback here). What would make such a run crawl or hang is kept
# off: InfiniBand (NCCL_IB_DISABLE), the multi-node NVLink probe
# (NCCL_MNNVL_ENABLE), NVLink SHARP (NCCL_NVLS_ENABLE), cuMem-based buffers
# (NCCL_CUMEM_ENABLE); Open MPI's shared-memory transport copies through its
# own buffers (btl_vader_single_copy_mechanism=none: containers often lack
# cross-memory attach). NCCL_DEBUG (default WARN) and anything else the
# caller sets pass through; NCCL_DEBUG=INFO shows NCCL's transport choices.
set -uo pipefail
(($# >= 3)) || { echo "usage: cuda_mpirun.sh NP SECONDS PROGRAM [ARGS...]" >&2; exit 2; }
np=$1 secs=$2
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export NCCL_IB_DISABLE=1 NCCL_MNNVL_ENABLE=0 NCCL_NVLS_ENABLE=0 NCCL_CUMEM_ENABLE=0
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
timeout -k 5 "$secs" mpirun --oversubscribe -np "$np" sh -c \
  'NCCL_HOSTID=tks-rank-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' "$@"
rc=$?
if ((rc == 124 || rc == 137)); then
  echo "cuda_mpirun.sh: $np ranks of $(basename "$1") did not finish in ${secs}s and were stopped" \
    "(a hang in NCCL's setup or a collective: rerun with NCCL_DEBUG=INFO to see where)" >&2
fi
exit $rc

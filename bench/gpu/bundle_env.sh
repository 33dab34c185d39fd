#!/usr/bin/env bash
# env COMMAND [ARGS...] - runs COMMAND with a tokshard bundle's environment:
# its bin/ first on the PATH, its lib/ and NVIDIA's libraries on the loader's
# path, Open MPI and PMIx relocated into it (OPAL_PREFIX, PMIX_PKGLIBDIR),
# and Open MPI's isolated launcher where the machine has no ssh or rsh.
#   ./env tokshard-train --device cuda ...      ./env mpirun -np 2 tokshard-train ...
#   ./env ctest --test-dir tests -L gpu         ./env bash    (a shell inside it)
# NVIDIA's libraries (CUDA runtime, cuBLAS(Lt), cuDNN, NCCL, NVRTC) are the
# machine's: every lib/ folder of the Python wheels under the first python3's
# `nvidia` package (TKS_NVIDIA_ROOT overrides), then /usr/local/cuda/lib64.
set -uo pipefail
P=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
(($#)) || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
export PATH=$P/bin:$PATH
nv=""
# python3 -I from / : nothing in the caller's directory (a ./nvidia/) is
# imported, and only absolute folders go onto the loader's path
root=${TKS_NVIDIA_ROOT:-$(cd / && python3 -I -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)}
if [[ $root == /* && -d $root ]]; then
  while IFS= read -r d; do nv+=:$d; done < <(find "$root" -maxdepth 3 -name 'lib*.so*' -printf '%h\n' | sort -u)
fi
[[ -d /usr/local/cuda/lib64 ]] && nv+=:/usr/local/cuda/lib64
export LD_LIBRARY_PATH=$P/lib$nv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$P/openmpi
# PMIx's plugins and help files (PMIX_PREFIX alone does not move these two)
[[ -d $P/pmix ]] && export PMIX_PKGLIBDIR=$P/pmix/lib/pmix PMIX_PKGDATADIR=$P/pmix/share/pmix
# Open MPI 4.1 aborts at start when neither ssh nor rsh is on the PATH, even
# for ranks of one node ("plm_rsh_agent: ssh : rsh ... could not be found");
# GPU images and containers often have neither. The isolated launcher starts
# local ranks only, which is all one machine needs.
# (an executable regular file on the PATH, as Open MPI looks for one: bash's
# `command -v` also names a file it could not run)
on_path() {
  local d IFS=:
  for d in $PATH; do [[ -f $d/$1 && -x $d/$1 ]] && return 0; done
  return 1
}
if [[ -z ${OMPI_MCA_plm:-} ]] && ! on_path ssh && ! on_path rsh; then
  export OMPI_MCA_plm=isolated
fi
exec "$@"

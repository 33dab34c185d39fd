# lib.sh - what the bench scripts share; sourced (bash), it runs nothing itself.

# Exits 2 unless BIN is an executable tokshard.
need_tokshard() {
  [[ -x $1 ]] || { echo "no tokshard at $1: build first (cmake --build build) or pass --bin" >&2; exit 2; }
}

# Exits 2 unless mpirun is on PATH (NAME: the script, for the message).
need_mpirun() {
  command -v mpirun >/dev/null || { echo "$1: no mpirun (scripts/install-deps.sh)" >&2; exit 2; }
}

# Open MPI as these benchmarks run it: as root if need be, oversubscribed, shared
# memory copied through its own buffers (containers often lack cross-memory attach).
mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
}

# Makes FILE (once): GCIDE, then the Python docs, one document per line, at
# most MB million bytes, its last (maybe cut) line dropped.
make_corpus() {
  local mb=$1 text=$2
  [[ -s $text ]] && return 0
  # (head ends the producers early: SIGPIPE is expected there, hence +o pipefail)
  set +o pipefail
  { zcat /usr/share/dictd/gcide.dict.dz; find /usr/share/doc/python3.11/html/_sources -type f | sort | xargs cat; } 2>/dev/null |
    tr -d '\r' | grep '[^[:space:]]' | head -c $((mb * 1000000)) | sed '$d' >"$text.tmp"
  set -o pipefail
  mv "$text.tmp" "$text"
}

# The machine, its load and the commit of the tree at ROOT, on one line.
machine_line() {
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
    "load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git -C "$1" rev-parse --short HEAD)"
}

#!/usr/bin/env bash
# tokshard under Slurm's srun, on a one-node Slurm cluster this test starts for
# itself: munged, slurmctld and slurmd with a private key, configuration,
# ports, spool and logs under WORKDIR (nothing of the host's Slurm or munge
# setup is read or changed), MpiDefault=pmix, one node of max(4, nproc) CPUs
# with oversubscription. On every exit path the jobs are cancelled and their
# step processes waited for (killed after 15 s) before the daemons stop.
#   - `srun -n 2` and `srun -n 3 tokshard build` write datasets byte-identical
#     to the build without a launcher, and rank 0 reports that many ranks;
#   - `srun -n 2 tokshard audit --json` reports what one process reports;
#   - `srun -n 2 tokshard-train --tp 2` gives the single process's losses
#     (tests/layout_losses.py) and `--dp-shard 2` as well;
#   - `srun -n 2 --mpi=none` (tasks MPI does not connect) is refused by build,
#     audit and the trainer, naming the fix, before anything is written.
# Reports skipped (77), with the reason, where Slurm or munge is not installed
# (scripts/install-deps.sh installs them) or the daemons cannot start here
# (they need root to launch tasks).
# Usage: test_slurm.sh BIN_DIR WORKDIR   (needs the build_setup and train_setup data)
set -uo pipefail
CASE=slurm
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "$1" && pwd)
TW=$(cd "$2" && pwd)
W=$TW/slurm
TKS=$BIN/tokshard
TRAIN=$BIN/tokshard-train
T=$TW/build/setup
D=$TW/train/setup/data
skip() {
  echo "SKIPPED [$CASE]: $*"
  exit 77
}
for p in srun sinfo slurmctld slurmd munged munge; do
  command -v "$p" >/dev/null || [[ -x /usr/sbin/$p ]] ||
    skip "$p is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done
export PATH=$PATH:/usr/sbin
[[ $(id -u) -eq 0 ]] || skip "slurmd launches tasks only as root; this test runs as $(id -un)"
[[ -d $T/ref && -d $D ]] || { echo "no data at $T/ref or $D (build_setup, train_setup)"; exit 2; }
mpi_env
# the one Slurm variable this test sets; a surrounding job's would mislead srun
while read -r v; do unset "$v"; done < <(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p')
rm -rf "$W" && mkdir -p "$W"
chmod 700 "$W"
cd "$W" || exit 2
S=$W/cluster
mkdir -p "$S/munge" "$S/state" "$S/spool" "$S/log"
chmod 700 "$S/munge"

pids=()
# The processes of this test's cluster other than its daemons: srun, the
# slurmstepd of each step and the tasks they run (each has this cluster's
# slurm.conf in the environment it was started with; the test's own shell
# was started before SLURM_CONF was set).
cluster_procs() {
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}
    p=${p%/environ}
    [[ " ${pids[*]} " == *" $p "* ]] && continue
    grep -qzx "SLURM_CONF=$S/slurm.conf" "$e" 2>/dev/null && echo "$p"
  done
}
# Stops the cluster: its jobs cancelled and their step processes gone while
# the daemons and munge still run (a slurmstepd that outlives them waits on
# them and keeps the test's output open, so ctest waits for it), whatever
# is left killed, then slurmctld and slurmd, then munged.
stop() {
  local p procs="" jobs
  if [[ -n ${SLURM_CONF:-} ]]; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
    # shellcheck disable=SC2086 # job ids, one word each
    [[ -n $jobs ]] && timeout 10 scancel $jobs 2>/dev/null
  fi
  for _ in $(seq 60); do
    procs=$(cluster_procs)
    [[ -z $procs ]] && break
    sleep 0.25
  done
  # shellcheck disable=SC2086 # pids
  [[ -n $procs ]] && kill -KILL $procs 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 40); do
    procs=""
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && procs+=" $p"; done
    [[ -z $procs ]] && break
    sleep 0.25
  done
  # shellcheck disable=SC2086 # pids
  [[ -n $procs ]] && kill -KILL $procs 2>/dev/null
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [[ -f $S/munge/pid ]] && kill "$(cat "$S/munge/pid")" 2>/dev/null
}
trap stop EXIT
trap 'exit 130' INT TERM

# munge: a fresh key; its socket is named in slurm.conf (AuthInfo)
head -c 1024 /dev/urandom >"$S/munge/key" && chmod 400 "$S/munge/key"
munged -f --key-file="$S/munge/key" --socket="$S/munge/sock" --pid-file="$S/munge/pid" \
  --log-file="$S/munge/log" --seed-file="$S/munge/seed" </dev/null >"$S/munge/out" 2>&1 ||
  skip "munged does not start: $(tail -n 3 "$S/munge/out" "$S/munge/log" 2>/dev/null)"

# two free TCP ports for slurmctld and slurmd
read -r p_ctld p_d < <(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
cpus=$(nproc)
((cpus < 4)) && cpus=4
host=$(hostname -s)
cat >"$S/slurm.conf" <<EOF
ClusterName=tokshard-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p_ctld
SlurmdPort=$p_d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$S/munge/sock
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
PlugStackConfig=/dev/null
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=tokshard-test NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=tokshard-test Default=YES MaxTime=30 State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$S/slurm.conf
# the daemons (and the step processes slurmd starts) hold none of the test's
# descriptors: its output stays ctest's alone
slurmctld -D -i </dev/null >"$S/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N tokshard-test </dev/null >"$S/log/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null)
  [[ $state == idle ]] && break
  sleep 0.5
done
[[ $state == idle ]] || skip "the one-node Slurm cluster did not come up (node state '${state}'): $(tail -n 3 "$S"/log/*.out | tr '\n' ' ')"
ok "slurm $(srun --version | cut -d' ' -f2) with munge $(munged -V | head -1 | cut -d' ' -f1 | sed 's/munge-//') and PMIx $(dpkg-query -W -f='${Version}' libpmix2 2>/dev/null) up: node $(sinfo -h -o '%N %c CPUs')"

# SRUN: every step is bounded: a hang is a failure, not a stuck test
SRUN=(timeout 300 srun -t 5 --mpi=pmix)
same_dataset() { # A B WHAT: every file byte-identical
  if diff -r "$1" "$2" >/dev/null; then ok "$3: byte-identical"; else
    fail "$3: $1 and $2 differ: $(diff -rq "$1" "$2" | head -3)"
  fi
}

# --- build -------------------------------------------------------------------
B=(--tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
  --chunk-bytes 4K --unit-bytes 300K "$T/gcide.txt" "$T/pydoc")
expect 0 "build without a launcher" -- "$TKS" build "${B[@]}" --output single
for np in 2 3; do
  expect 0 "srun -n $np tokshard build" -- "${SRUN[@]}" -n "$np" "$TKS" build "${B[@]}" --output "srun$np"
  grep -q "rank $((np - 1)):" "$W/err" && ok "srun -n $np: rank 0 reports $np ranks" ||
    fail "srun -n $np: no line of rank $((np - 1)) in the progress: $(tail -c 300 "$W/err")"
  [[ -d srun$np ]] && same_dataset single "srun$np" "srun -n $np build vs no launcher"
done

# --- audit -------------------------------------------------------------------
audit_json() { # OUT.json then the command: the report without its timings
  local out=$1
  shift
  "$@" audit --json single >"$out.raw" 2>"$out.err"
  echo $? >"$out.rc"
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); r.pop("seconds"); r.pop("gb_per_s")
print(json.dumps(r, indent=1, sort_keys=True))' "$out.raw" >"$out" 2>>"$out.err"
}
audit_json audit-1.json "$TKS"
audit_json audit-2.json "${SRUN[@]}" -n 2 "$TKS"
if [[ -s audit-1.json ]] && cmp -s audit-1.json audit-2.json && cmp -s audit-1.json.rc audit-2.json.rc; then
  ok "srun -n 2 tokshard audit: the single process's report and exit code ($(cat audit-1.json.rc))"
else
  fail "srun -n 2 audit differs from one process: $(diff audit-1.json audit-2.json | head -4) $(tail -c 300 audit-2.json.err)"
fi

# --- training ----------------------------------------------------------------
M=(--dataset "$D" --dim 32 --n-layers 2 --n-heads 8 --n-kv-heads 4 --seq-len 32 --global-batch 8
  --micro-batch 2 --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 5 --steps 10 --threads 1
  --quiet --no-plot --device cpu)
expect 0 "tokshard-train without a launcher" -- "$TRAIN" "${M[@]}" --out run-single
for L in "tp 2:--tp 2" "dp_shard 2:--dp-shard 2"; do
  name=${L%%:*}
  flags=${L#*:}
  label=${name// /}
  # shellcheck disable=SC2086 # flags is two words
  expect 0 "srun -n 2 tokshard-train $flags" -- "${SRUN[@]}" -n 2 "$TRAIN" "${M[@]}" $flags --out "run-$label" || continue
  if out=$(python3 "$HERE/layout_losses.py" run-single/metrics.jsonl "run-$label/metrics.jsonl" 1 10 \
    run-single/checkpoints 32); then
    ok "srun -n 2 ($name): the single process's losses: $out"
  else
    fail "srun -n 2 ($name): $out"
  fi
done

# --- tasks MPI does not connect -------------------------------------------------
NOMPI=(timeout 120 srun -t 2 --mpi=none -n 2)
msg='srun started 2 tasks .*--mpi=pmix'
expect 2 "srun --mpi=none tokshard build is refused" -- "${NOMPI[@]}" "$TKS" build "${B[@]}" --output nompi
expect_msg "$msg"
[[ ! -e nompi && ! -e nompi.partial ]] && ok "nothing written for the refused build" ||
  fail "the refused build left $(ls -d nompi* 2>/dev/null)"
expect 2 "srun --mpi=none tokshard audit is refused" -- "${NOMPI[@]}" "$TKS" audit single
expect_msg "$msg"
expect 2 "srun --mpi=none tokshard-train --tp 2 is refused" -- "${NOMPI[@]}" "$TRAIN" "${M[@]}" --tp 2 --out run-nompi
expect_msg "$msg"
[[ ! -e run-nompi ]] && ok "nothing written for the refused run" || fail "the refused run left run-nompi"

finish test_slurm

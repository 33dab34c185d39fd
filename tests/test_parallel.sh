#!/usr/bin/env bash
# Multi-process tests (mpirun --oversubscribe, tiny models, 2 cores): the same
# losses, samples and checkpoints whatever the dp_replicate x dp_shard x tp
# layout, the mesh check, invalid layouts, and bad ids refused alike.
# Usage: test_parallel.sh BIN_DIR WORKDIR CASE   (needs the train_setup dataset)
#   CASE: layouts | mix | tp3 | mesh | checkpoint | packing | staged | refuse | failures | overlap | bf16 | memory
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
W=$2
CASE=$3
TKS=$BIN/tokshard
TRAIN=$BIN/tokshard-train
FORGE=$BIN/forge_token
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# In the sanitizer build, leak checking is off for MPI processes only: OpenMPI's
# components are dlopen'ed and unloaded at MPI_Finalize, so what they keep shows
# up as leaks from "<unknown module>" that no suppression can name. ASan still
# checks every memory access, and the single-process tests still check leaks.
[[ -n ${ASAN_OPTIONS:-} ]] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
# keep OpenMPI quiet and local in containers
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
D=$W/train/setup/data
W=$W/parallel-$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
[[ -d $D ]] || { echo "no dataset at $D (train_setup)"; exit 2; }
MPI=(mpirun --oversubscribe)
# 8 heads / 4 kv heads (GQA) so that tp 4 splits both
M=(--dim 32 --n-layers 2 --n-heads 8 --n-kv-heads 4 --seq-len 32 --global-batch 8 --micro-batch 2
  --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 10 --threads 1 --quiet --no-plot --device cpu)
# run LABEL NP [flags...]: trains into run-LABEL; NP 0 = without mpirun
DATA=(--dataset "$D") # what run() trains on
run() {
  local label=$1 np=$2
  shift 2
  if [[ $np -eq 0 ]]; then
    "$TRAIN" "${DATA[@]}" --out "run-$label" "$@" >"log-$label" 2>&1
  else
    "${MPI[@]}" -np "$np" "$TRAIN" "${DATA[@]}" --out "run-$label" "$@" >"log-$label" 2>&1
  fi
  local rc=$?
  [[ $rc -eq 0 ]] || fail "$label: exit $rc: $(grep -v '^ ' "log-$label" | tail -3)"
  return $rc
}
# same_losses A B FROM TO: steps FROM..TO of A and B agree within a tolerance
# derived from the computation (tests/layout_losses.py says how)
same_losses() {
  python3 "$HERE/layout_losses.py" "run-$1/metrics.jsonl" "run-$2/metrics.jsonl" \
    "$3" "$4" "run-$1/checkpoints" 32
}

case $CASE in
layouts)
  # reference: one process; then every layout the issue names, 20 steps each
  run ref 0 "${M[@]}" --steps 20 || exit 1
  for L in "1 1 2" "1 1 4" "1 2 1" "2 1 1" "1 2 2" "2 2 1" "2 2 2"; do
    read -r rep sh tp <<<"$L"
    np=$((rep * sh * tp))
    label="r${rep}s${sh}t${tp}"
    run "$label" $np "${M[@]}" --steps 20 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same_losses ref "$label" 1 20); then ok "($rep,$sh,$tp) on $np processes: $out"; else
      fail "($rep,$sh,$tp): $out"; fi
    # the samples of every step are the same set as with one process
    "$TKS" sample-plan "$D" --seq-len 32 --global-batch 8 --dp $((rep * sh)) --tp "$tp" --steps 1:20 \
      --val-tokens 4096 --seed 1337 --json >"plan-$label.json"
    [[ -f plan-ref.json ]] || "$TKS" sample-plan "$D" --seq-len 32 --global-batch 8 --steps 1:20 \
      --val-tokens 4096 --seed 1337 --json >plan-ref.json
    python3 - plan-ref.json "plan-$label.json" <<'EOF' && ok "($rep,$sh,$tp): per-step sample sets equal" || fail "($rep,$sh,$tp): sample sets differ"
import json, sys, collections
def steps(p):
    d = json.load(open(p))
    out = collections.defaultdict(set)
    for st in d["steps"]:
        for rk in st["ranks"]:
            for smp in rk["samples"]:
                out[st["step"]].add(smp["window"])
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a == b and len(a) == 20, "differ"
EOF
  done
  ;;

mix)
  # a mixture with a schedule and --doc-mask: every layout the layouts case
  # runs (and a micro-batch of 1) trains the same samples and the same losses,
  # and a checkpoint of one layout resumes under another to the same curve
  cp -r "$D" src-b
  X=(--dataset a="$D":0.6 --dataset b=src-b:0.4 --mix-at 7:a=0.2,b=0.8 --doc-mask)
  DATA=()
  run ref 0 "${X[@]}" "${M[@]}" --steps 12 || exit 1
  for L in "1 1 2" "1 1 4" "1 2 1" "2 1 1" "1 2 2" "2 2 1" "2 2 2" "1 4 1"; do
    read -r rep sh tp <<<"$L"
    np=$((rep * sh * tp))
    label="r${rep}s${sh}t${tp}"
    extra=()
    [[ $L == "1 4 1" ]] && extra=(--micro-batch 1)
    run "$label" $np "${X[@]}" "${M[@]}" "${extra[@]}" --steps 12 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same_losses ref "$label" 1 12); then ok "mixture, --doc-mask, ($rep,$sh,$tp)${extra[*]:+ ${extra[*]}}: $out"; else
      fail "mixture ($rep,$sh,$tp): $out"; fi
    "$TKS" sample-plan "${X[@]:0:6}" --seq-len 32 --global-batch 8 --dp $((rep * sh)) --tp "$tp" --steps 1:12 \
      --val-tokens 4096 --json >"plan-$label.json"
    [[ -f plan-ref.json ]] || "$TKS" sample-plan "${X[@]:0:6}" --seq-len 32 --global-batch 8 --steps 1:12 \
      --val-tokens 4096 --json >plan-ref.json
    python3 - plan-ref.json "plan-$label.json" <<'EOF' && ok "($rep,$sh,$tp): per-step (source, window) sets equal" || fail "($rep,$sh,$tp): sample sets differ"
import json, sys, collections
def steps(p):
    d = json.load(open(p))
    out = collections.defaultdict(set)
    for st in d["steps"]:
        for rk in st["ranks"]:
            for smp in rk["samples"]:
                out[st["step"]].add((smp["source"], smp["window"]))
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a == b and len(a) == 12 and any(s == "b" for v in a.values() for s, _ in v), "differ"
EOF
  done
  # saved at step 6 (before the change) under (1,2,2), resumed under (2,1,1) and (1,1,1)
  run part 4 "${X[@]}" "${M[@]}" --steps 12 --stop-at 6 --dp-shard 2 --tp 2 || exit 1
  run part 2 "${X[@]}" "${M[@]}" --steps 12 --dp-replicate 2 --resume latest || exit 1
  if out=$(same_losses ref part 7 12); then ok "(1,2,2) -> (2,1,1) across the change at step 7: $out"; else
    fail "resume across layouts: $out"; fi
  ;;

tp3)
  # tp = 3 over a vocabulary 3 does not divide (1000 -> padded 1152), heads 6 / kv 3
  M3=(--dim 48 --n-layers 2 --n-heads 6 --n-kv-heads 3 --ffn-dim 96 --seq-len 32 --global-batch 6
    --micro-batch 3 --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 10 --threads 1 --quiet --no-plot)
  run ref3 0 "${M3[@]}" --steps 20 || exit 1
  run t3 3 "${M3[@]}" --steps 20 --tp 3 || exit 1
  if out=$(same_losses ref3 t3 1 20); then ok "tp 3, vocab 1000: $out"; else fail "tp 3: $out"; fi
  run t3d 6 "${M3[@]}" --steps 20 --tp 3 --dp-shard 2 || exit 1
  if out=$(same_losses ref3 t3d 1 20); then ok "tp 3 x dp_shard 2: $out"; else fail "tp 3 x dp_shard 2: $out"; fi
  for r in t3 t3d; do
    python3 - "run-$r/checkpoints/step-00000020/model.safetensors" <<'EOF' && ok "$r: embeddings saved as [1000, 48], not the padded 1152" || fail "$r: checkpoint shapes"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert h["model.embed_tokens.weight"]["shape"] == [1000, 48], h["model.embed_tokens.weight"]
assert h["lm_head.weight"]["shape"] == [1000, 48]
assert h["model.layers.0.mlp.down_proj.weight"]["shape"] == [48, 96]
EOF
  done
  ;;

mesh)
  "${MPI[@]}" -np 16 "$TRAIN" --check-mesh --dp-replicate 2 --dp-shard 8 >out 2>err
  code=$?
  [[ $code -eq 0 ]] && ok "16 processes, dp_replicate 2 x dp_shard 8: verified" || fail "check-mesh: exit $code $(tail -3 err)"
  grep -q "dp_shard      \[0 1 2 3 4 5 6 7\] \[8 9 10 11 12 13 14 15\]  -> 2 group(s) of 8" out &&
    ok "built: 2 dp_shard groups of 8" || fail "dp_shard groups: $(grep dp_shard out)"
  grep -q "dp_replicate  \[0 8\] \[1 9\].*-> 8 group(s) of 2" out && ok "built: 8 dp_replicate groups of 2" ||
    fail "dp_replicate groups: $(grep dp_replicate out)"
  # a bug that builds one 16-way shard group (docs/MOTIVATION.md, failure 3) is refused
  TOKSHARD_TEST_MESH_FAULT=merge-dp "${MPI[@]}" -x TOKSHARD_TEST_MESH_FAULT -np 16 "$TRAIN" --check-mesh \
    --dp-replicate 2 --dp-shard 8 >out 2>err
  code=$?
  [[ $code -ne 0 ]] && grep -q "the dp_shard group that was built has 16 members" err &&
    grep -q "refusing to run a layout other than the one asked for" err &&
    ok "a 16-way shard group is refused (exit $code)" || fail "merged dp groups not caught: $(tail -3 err)"
  # invalid layouts: each refused before anything runs, naming the numbers and the fix
  check_refused() { # NP MESSAGE flags...
    local np=$1 msg=$2
    shift 2
    "${MPI[@]}" -np "$np" "$TRAIN" --dataset "$D" --out x "${M[@]}" --steps 2 "$@" >out 2>err
    local code=$?
    if [[ $code -eq 2 ]] && grep -q -- "$msg" err; then ok "np $np $*: refused"; else
      fail "np $np $*: exit $code, stderr $(grep -v '^ ' err | head -2)"
    fi
  }
  check_refused 4 "must equal the number of processes" --dp-shard 3 --dp-replicate 2
  check_refused 4 "launch a multiple of 3" --tp 3
  check_refused 8 "--tp 8 does not divide --n-kv-heads 4" --tp 8
  check_refused 3 "global batch 8 is not divisible" --dp-shard 3
  check_refused 2 "divisible" --dp-shard 2 --micro-batch 3
  "$TRAIN" --dataset "$D" --out x "${M[@]}" --steps 2 --tp 2 >out 2>err
  [[ $? -eq 2 ]] && grep -q "the world has 1 processes.*launch a multiple of 2 processes (mpirun -np N)" err &&
    ok "tp 2 without mpirun: refused" || fail "tp 2 without mpirun: $(cat err)"
  "$TRAIN" --dataset "$D" --dry-run --world 16 --dp-replicate 2 --tp 2 "${M[@]}" --global-batch 16 \
    --micro-batch 1 >out 2>err
  grep -q "world 16 = dp_replicate 2 x dp_shard 4 x tp 2" out && grep -q "tp            8 group(s) of 2" out &&
    ok "--dry-run --world 16 shows the mesh" || fail "dry run: $(head -c 400 out) $(cat err)"
  ;;

checkpoint)
  # train under (1,2,2) with checkpoints at 4 and 8
  run a 4 "${M[@]}" --steps 8 --save-every 4 --dp-shard 2 --tp 2 || exit 1
  C4=run-a/checkpoints/step-00000004
  # the same weights saved from any layout give byte-identical files
  for L in "1 4 1" "1 1 4" "2 1 2" "1 1 1"; do
    read -r rep sh tp <<<"$L"
    np=$((rep * sh * tp))
    label="save-r${rep}s${sh}t${tp}"
    if [[ $np -eq 1 ]]; then run "$label" 0 "${M[@]}" --steps 4 --resume $C4 || continue; else
      run "$label" $np "${M[@]}" --steps 4 --resume $C4 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue; fi
    for f in model.safetensors optimizer.safetensors config.json; do
      cmp -s "$C4/$f" "run-$label/checkpoints/step-00000004/$f" && ok "($rep,$sh,$tp): $f byte-identical" ||
        fail "($rep,$sh,$tp): $f differs"
    done
  done
  # a checkpoint saved under (1,2,2) resumes under other layouts and continues the same curve
  for L in "1 4 1" "1 1 4" "2 1 2"; do
    read -r rep sh tp <<<"$L"
    label="resume-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${M[@]}" --steps 8 --resume $C4 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same_losses a "$label" 5 8); then ok "(1,2,2) -> ($rep,$sh,$tp), steps 5..8: $out"; else
      fail "resume under ($rep,$sh,$tp): $out"; fi
  done
  ;;

packing)
  # best-fit packing (docs/SAMPLING.md section 10) with --doc-mask: the same
  # losses and validation loss under every layout (the loss is the mean over
  # the step's real targets, counted from the whole step's windows on every
  # rank; test_ops checks that an ignored target gives no loss and no
  # gradient); a resume from a checkpoint saved under (1,2,2) continues
  # under other layouts; a resume with the other packing is refused
  P=("${M[@]}" --packing best-fit --doc-mask)
  run ref 0 "${P[@]}" --steps 12 --save-every 6 || exit 1
  grep -q '"packing": "best-fit"' run-ref/metrics.jsonl && ok "metrics name the packing" ||
    fail "metrics.jsonl does not name the packing"
  for L in "2 1 2" "1 2 2" "1 1 4" "2 1 1"; do
    read -r rep sh tp <<<"$L"
    label="pk-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${P[@]}" --steps 12 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same_losses ref "$label" 1 12); then ok "packed ($rep,$sh,$tp): $out"; else fail "packed ($rep,$sh,$tp): $out"; fi
    python3 - run-ref/metrics.jsonl "run-$label/metrics.jsonl" <<'EOF2' && ok "packed ($rep,$sh,$tp): validation loss agrees" || fail "packed ($rep,$sh,$tp): validation loss differs"
import json, sys
v = [[json.loads(l)["val_loss"] for l in open(p) if '"val_loss"' in l] for p in sys.argv[1:3]]
sys.exit(0 if len(v[0]) == len(v[1]) > 0 and all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(*v)) else 1)
EOF2
  done
  # padding never reaches the loss: other padding ids (a test hook) give the
  # same losses bit for bit, and the same hook letting the padding predict
  # itself, the mistake, changes them
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skipped [packing]: padding ids (a Release build has no test hooks)"
  else
    losses() { python3 -c 'import json,sys; print(" ".join(l.split(",")[1] for l in open(sys.argv[1]) if "\"loss\"" in l))' "$1"; }
    TOKSHARD_TEST_PAD_ID=7 run pk-pad7 0 "${P[@]}" --steps 12 || exit 1
    TOKSHARD_TEST_PAD_ID=7 TOKSHARD_TEST_PAD_TARGETS=1 run pk-padtg 0 "${P[@]}" --steps 12 || exit 1
    [[ $(losses run-ref/metrics.jsonl) == "$(losses run-pk-pad7/metrics.jsonl)" ]] &&
      ok "padding ids 0 and 7: the same 12 losses bit for bit" || fail "padding ids change the losses"
    [[ $(losses run-ref/metrics.jsonl) != "$(losses run-pk-padtg/metrics.jsonl)" ]] &&
      ok "padding that predicts itself changes the losses (the check can fail)" ||
      fail "padding targets counted but the losses did not change: the check cannot see it"
  fi
  # the plan files (RUN/plans, one per sampler) that 1, 2 and 4 ranks made together are the same bytes
  n=0
  for f in run-ref/plans/best-fit-*.plan; do
    for o in run-pk-*/plans; do
      cmp -s "$f" "$o/${f##*/}" || fail "$o/${f##*/} differs from $f (or is missing)"
    done
    n=$((n + 1))
  done
  [[ $n -eq 2 ]] && ok "plan files: the same bytes from 1, 2 and 4 ranks ($n per run)" || fail "$n plan files in run-ref/plans"
  C6=run-ref/checkpoints/step-00000006
  # kill -9 of every rank under (1,2,2) just after the step-6 checkpoint
  # (a test hook stops rank 0 there), then a resume under (2,1,1): the
  # losses of the uninterrupted run
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skipped [packing]: kill -9 under packing (a Release build has no test hooks)"
  else
    TOKSHARD_TEST_CKPT_STOP=renamed:2 setsid "${MPI[@]}" -x TOKSHARD_TEST_CKPT_STOP -np 4 "$TRAIN" "${DATA[@]}" \
      --out run-pk-kill "${P[@]}" --steps 12 --save-every 3 --dp-shard 2 --tp 2 >log-pk-kill 2>&1 &
    pid=$!
    stopped=0
    # the ranks are mpirun's children (OpenMPI gives each its own process group)
    for _ in $(seq 1200); do
      ps -eo ppid=,stat= | awk -v p=$pid '$1 == p && $2 ~ /^T/ {f = 1} END {exit !f}' && { stopped=1; break; }
      sleep 0.05
    done
    kids=$(ps -eo pid=,ppid= | awk -v p=$pid '$2 == p {print $1}')
    kill -9 -- -$pid $kids 2>/dev/null
    wait $pid 2>/dev/null
    if [[ $stopped -eq 1 ]]; then
      run pk-kill 2 "${P[@]}" --steps 12 --save-every 3 --dp-replicate 2 --resume latest || exit 1
      if out=$(same_losses ref pk-kill 1 12); then ok "packed: kill -9 under (1,2,2) after step 6, resumed under (2,1,1): $out"
      else fail "packed kill -9 and resume: $out"; fi
    else
      fail "packed kill -9: rank 0 never stopped after the step-6 checkpoint: $(tail -3 log-pk-kill)"
    fi
  fi
  # a packed mixture with a --mix-at change at step 7: every source packs its
  # own windows; the same losses under (1,2,2) and after a resume at step 6
  # under (2,1,1)
  cp -r "$D" src-b
  X=(--dataset a="$D":0.6 --dataset b=src-b:0.4 --mix-at 7:a=0.2,b=0.8)
  DATA=()
  run pk-mix 0 "${X[@]}" "${P[@]}" --steps 12 --save-every 6 || exit 1
  run pk-mix4 4 "${X[@]}" "${P[@]}" --steps 12 --dp-shard 2 --tp 2 || exit 1
  if out=$(same_losses pk-mix pk-mix4 1 12); then ok "packed mixture (1,2,2): $out"; else fail "packed mixture (1,2,2): $out"; fi
  # the sources are copies of one dataset: their plans are named by content, so they share 2 (train, validation)
  [[ $(ls run-pk-mix/plans | wc -l) -eq 2 ]] && cmp -s <(cat run-pk-mix/plans/*) <(cat run-ref/plans/*) &&
    ok "packed mixture: two copies of a dataset share the plain run's 2 plan files" ||
    fail "packed mixture plans: $(ls run-pk-mix/plans | tr '\n' ' ')"
  run pk-mixr 2 "${X[@]}" "${P[@]}" --steps 12 --dp-replicate 2 --resume run-pk-mix/checkpoints/step-00000006 || exit 1
  if out=$(same_losses pk-mix pk-mixr 7 12); then ok "packed mixture: resumed at step 6 under (2,1,1) across the change: $out"
  else fail "packed mixture resume: $out"; fi
  DATA=(--dataset "$D")
  run pk-resume 4 "${P[@]}" --steps 12 --resume $C6 --dp-shard 2 --tp 2 || exit 1
  if out=$(same_losses ref pk-resume 7 12); then ok "packed: resumed under (1,2,2) at step 6: $out"; else fail "packed resume: $out"; fi
  "$TRAIN" "${DATA[@]}" --out run-pk-concat "${M[@]}" --steps 12 --resume $C6 >log-pk-concat 2>&1
  code=$?
  [[ $code -eq 2 ]] && grep -q -- "--packing best-fit" log-pk-concat && ok "resume without --packing refused (exit 2)" ||
    fail "resume without --packing: exit $code: $(tail -2 log-pk-concat)"
  ;;

staged)
  # the staged comm (a device collective moved through host memory: --comm mpi
  # under --device cuda) on the CPU backend, through its test hook, so that a
  # machine without a GPU checks it: the same losses as one process
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skipped [staged]: a Release build has no test hooks"
    exit 77
  fi
  export TOKSHARD_TEST_STAGED_COMM=1
  MPI+=(-x TOKSHARD_TEST_STAGED_COMM)
  "$TRAIN" --dataset "$D" --dry-run --world 4 --tp 2 "${M[@]}" >out 2>err
  grep -q "comm: mpi (staged through host memory)" out && ok "dry run: the staged comm is the rule" ||
    fail "dry run comm line: $(grep comm: out) $(cat err)"
  run ref 0 "${M[@]}" --steps 12 || exit 1
  for L in "1 1 2" "1 2 1" "2 1 2"; do
    read -r rep sh tp <<<"$L"
    label="staged-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${M[@]}" --steps 12 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    if out=$(same_losses ref "$label" 1 12); then ok "staged ($rep,$sh,$tp): $out"; else fail "staged ($rep,$sh,$tp): $out"; fi
  done
  unset TOKSHARD_TEST_STAGED_COMM
  # --comm nccl needs the CUDA backend; a bad value names the choices
  "${MPI[@]}" -np 2 "$TRAIN" --dataset "$D" --out x "${M[@]}" --steps 2 --tp 2 --device cpu --comm nccl >out 2>err
  [[ $? -eq 2 ]] && grep -q -- "--comm nccl needs the CUDA backend" err && ok "--comm nccl on the CPU: refused" ||
    fail "--comm nccl on the CPU: $(grep -v '^ ' err | tail -2)"
  "$TRAIN" --dataset "$D" --out x "${M[@]}" --steps 2 --comm gloo >out 2>err
  [[ $? -eq 2 ]] && grep -q -- "--comm gloo: use auto" err && ok "--comm gloo: refused" || fail "--comm gloo: $(cat err)"
  ;;

refuse)
  # an out-of-range id is refused with the same message at tp 1 and tp 2
  read -r sh off < <("$TKS" sample-plan "$D" --seq-len 32 --global-batch 8 --steps 1 \
    --val-tokens 4096 --seed 1337 | awk '/ sample 1 / {print $(NF-3), $(NF-1)}')
  cp -r "$D" bad
  "$FORGE" bad "$sh" $((off + 10)) 1000 >/dev/null || fail "forge"
  "$TRAIN" --dataset bad --out x1 "${M[@]}" --steps 4 >out1 2>err1
  c1=$?
  "${MPI[@]}" -np 2 "$TRAIN" --dataset bad --out x2 "${M[@]}" --steps 4 --tp 2 >out2 2>err2
  c2=$?
  "${MPI[@]}" -np 4 "$TRAIN" --dataset bad --out x4 "${M[@]}" --steps 4 --tp 2 --dp-shard 2 >out4 2>err4
  c4=$?
  m1=$(grep "^tokshard-train: error" err1)
  m2=$(grep "^tokshard-train: error" err2)
  m4=$(grep "^tokshard-train: error" err4)
  [[ $c1 -eq 2 && $c2 -eq 2 && $c4 -eq 2 ]] && ok "exit 2 at tp 1, tp 2 and tp 2 x dp_shard 2" ||
    fail "exit codes $c1 $c2 $c4"
  [[ -n $m1 && "$m1" == "$m2" && "$m1" == "$m4" ]] && ok "the same message everywhere: $m1" ||
    fail "messages differ: [$m1] [$m2] [$m4]"
  grep -q "token offset $((off + 10))" <<<"$m1" && ok "it names shard $sh and token offset $((off + 10))" ||
    fail "message lacks the offset: $m1"
  [[ $(grep -c "^tokshard-train: error" err2) -eq 1 ]] && ok "printed once, by rank 0" || fail "printed $(grep -c error err2) times"
  ;;
failures)
  # every failure path ends the job with the failing rank's message within a
  # timeout, instead of leaving the other ranks in a collective (a hang)
  # ends NAME CODE PATTERN -- command...: exit CODE (not the timeout's 124) and stderr matches
  ends() {
    local name=$1 want=$2 pat=$3
    shift 4
    timeout -k 5 120 "$@" >"out-$name" 2>"err-$name"
    local code=$?
    if [[ $code -eq $want ]] && grep -Eq -- "$pat" "err-$name"; then ok "$name: exit $code: $(grep -m1 error "err-$name")"; else
      fail "$name: exit $code (124 = hung), stderr: $(grep -v '^ ' "err-$name" | tail -3)"
    fi
  }
  run a 2 "${M[@]}" --steps 8 --save-every 4 --tp 2 || exit 1
  # the hang of the issue: resuming step 4 into the same --out meets step-00000008 at the save
  ends existing-step 2 "step-00000008 is newer than the checkpoint this run resumes from" -- "${MPI[@]}" -np 2 "$TRAIN" --dataset "$D" \
    --out run-a "${M[@]}" --steps 8 --save-every 4 --tp 2 --resume run-a/checkpoints/step-00000004
  touch afile
  ends unwritable-out 2 "cannot create afile/run" -- "${MPI[@]}" -np 2 "$TRAIN" --dataset "$D" --out afile/run "${M[@]}" \
    --steps 2 --tp 2
  # a corrupt checkpoint on rank 1 only (each rank is given its own copy)
  cp -r run-a/checkpoints/step-00000004 good && cp -r good corrupt
  printf '\x01' | dd of=corrupt/model.safetensors bs=1 seek=5000 conv=notrunc 2>/dev/null
  ends corrupt-on-rank-1 2 "corrupt is not a usable checkpoint: model.safetensors is corrupt" -- \
    "${MPI[@]}" -np 1 "$TRAIN" --dataset "$D" --out r-c "${M[@]}" --steps 8 --tp 2 --resume good : \
    -np 1 "$TRAIN" --dataset "$D" --out r-c "${M[@]}" --steps 8 --tp 2 --resume corrupt
  # an allocation failing on rank 1 only, during the checkpoint's gather (a test
  # hook: not compiled into Release builds)
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skip [failures]: allocation failure (a Release build has no test hooks)"
  else
  ends nomem-on-rank-1 2 "out of memory gathering .* for the checkpoint" -- \
    "${MPI[@]}" -np 1 "$TRAIN" --dataset "$D" --out r-m "${M[@]}" --steps 2 --tp 2 : \
    -np 1 env TOKSHARD_TEST_CKPT_NOMEM=3 "$TRAIN" --dataset "$D" --out r-m "${M[@]}" --steps 2 --tp 2
  [[ -z $(ls r-m/checkpoints 2>/dev/null | grep -v lock) ]] && ok "nothing half-written left in r-m/checkpoints" ||
    fail "left in r-m/checkpoints: $(ls r-m/checkpoints)"
  fi
  # an out-of-range id read by one rank only (dp_shard 2: sample 1 is rank 0's, tp 1)
  read -r sh off < <("$TKS" sample-plan "$D" --seq-len 32 --global-batch 8 --steps 1 \
    --val-tokens 4096 --seed 1337 | awk '/ sample 1 / {print $(NF-3), $(NF-1)}')
  cp -r "$D" bad
  "$FORGE" bad "$sh" $((off + 7)) 1000 >/dev/null || fail "forge"
  for sh2 in 2 4; do
    ends "bad-id-dp_shard-$sh2" 2 "token offset $((off + 7))" -- "${MPI[@]}" -np $sh2 "$TRAIN" --dataset bad --out "r-b$sh2" \
      "${M[@]}" --steps 4 --dp-shard $sh2 --eval-every 0
  done
  ;;
bf16)
  # --dtype bf16: the data-parallel layouts against one process, within the
  # same rule with bf16's unit roundoff (BF16=1, tests/layout_losses.py)
  run ref16 0 "${M[@]}" --steps 20 --dtype bf16 || exit 1
  for L in "1 2 1" "2 1 1" "2 2 1"; do
    read -r rep sh tp <<<"$L"
    label="bf16-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${M[@]}" --steps 20 --dtype bf16 --dp-replicate "$rep" --dp-shard "$sh" || continue
    if out=$(BF16=1 same_losses ref16 "$label" 1 20); then ok "bf16 ($rep,$sh,$tp): $out"; else
      fail "bf16 ($rep,$sh,$tp): $out"; fi
  done
  # tensor parallel in bf16: the tp all-reduces add bf16 partial sums (one
  # more rounding per all-reduce than tp = 1), so the losses follow a looser
  # rule (BF16_TP=1, tests/layout_losses.py); and, as in train_bf16, the bf16
  # validation loss ends within 2% of the same layout's fp32 run
  val() { grep '"val_loss"' "run-$1/metrics.jsonl" | tail -1 | sed 's/.*"val_loss": \([0-9.]*\).*/\1/'; }
  for L in "1 1 2" "1 2 2"; do
    read -r rep sh tp <<<"$L"
    label="bf16-r${rep}s${sh}t${tp}"
    run "$label" $((rep * sh * tp)) "${M[@]}" --steps 20 --dtype bf16 --dp-replicate "$rep" \
      --dp-shard "$sh" --tp "$tp" || continue
    if out=$(BF16_TP=1 same_losses ref16 "$label" 1 20); then ok "bf16 ($rep,$sh,$tp): $out"; else
      fail "bf16 ($rep,$sh,$tp): $out"; fi
    run "f32-$label" $((rep * sh * tp)) "${M[@]}" --steps 20 --dp-replicate "$rep" --dp-shard "$sh" \
      --tp "$tp" || continue
    v16=$(val "$label") v32=$(val "f32-$label")
    awk -v a="$v32" -v b="$v16" 'BEGIN {d = (b - a) / a; if (d < 0) d = -d; exit !(a > 0 && d <= 0.02)}' &&
      ok "bf16 ($rep,$sh,$tp): val loss $v16 within 2% of fp32 $v32" ||
      fail "bf16 ($rep,$sh,$tp): val loss $v16 vs fp32 $v32"
  done
  ;;

overlap)
  # overlap_metrics OVERLAP.jsonl SEQUENTIAL.jsonl: the same losses and norms,
  # to the last printed digit; buckets started early with overlap only
  overlap_metrics() {
    python3 - "$1" "$2" <<'EOF2'
import json, sys
def rows(p):
    return [json.loads(x) for x in open(p) if '"loss"' in x]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
if len(a) != 6 or len(b) != 6:
    print("steps logged: %d and %d" % (len(a), len(b))); sys.exit(1)
for x, y in zip(a, b):
    if (x["loss"], x["grad_norm"]) != (y["loss"], y["grad_norm"]):
        print("step %d differs: %s vs %s" % (x["step"], x, y)); sys.exit(1)
early = [x["grad_buckets_early"] for x in a]
if not all(e > 0 for e in early):
    print("no bucket started during the backward: %s" % early); sys.exit(1)
if any(y["grad_buckets_early"] for y in b):
    print("buckets started early without overlap"); sys.exit(1)
print("losses and norms equal; buckets started during the backward per step %s" % early)
EOF2
  }
  # the gradient buckets start during the last micro-batch's backward
  # (tks_grad_sync_hook); starting them all after it must give the same bits
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skipped [overlap]: a Release build has no test hooks (TOKSHARD_TEST_NO_OVERLAP)"
    exit 77
  fi
  {
  for L in "1 2 1" "2 1 1" "2 2 1" "1 2 2"; do
    read -r rep sh tp <<<"$L"
    np=$((rep * sh * tp))
    label="r${rep}s${sh}t${tp}"
    # --micro-batch 2: two micro-batches per rank (gradient accumulation)
    run "ov-$label" $np "${M[@]}" --steps 6 --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    TOKSHARD_TEST_NO_OVERLAP=1 run "seq-$label" $np "${M[@]}" --steps 6 \
      --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" || continue
    for f in model.safetensors optimizer.safetensors; do
      cmp -s "run-ov-$label/checkpoints/step-00000006/$f" "run-seq-$label/checkpoints/step-00000006/$f" &&
        ok "($rep,$sh,$tp): $f bit-identical with and without overlap" ||
        fail "($rep,$sh,$tp): $f differs with and without overlap"
    done
    if out=$(overlap_metrics "run-ov-$label/metrics.jsonl" "run-seq-$label/metrics.jsonl"); then
      ok "($rep,$sh,$tp): $out"; else fail "($rep,$sh,$tp): $out"; fi
  done
  }
  ;;
memory)
  # the memory plan (--dry-run's figure) against what rank 0 of the trainer
  # really holds through the backend's alloc (metrics.jsonl: device_bytes, the
  # CPU backend's count), one process and sharded layouts, fp32 and bf16. The
  # CPU backend rounds every buffer up to 64 bytes (and an empty one to 64);
  # the plan rounds the activations and the workspace as the model allocates
  # them, the other buffers not: the master weights, gradients, bf16 copy,
  # two AdamW moments, the gradient staging buffer, the step scalars and an
  # empty workspace, 8 buffers each held at most 63 or 64 bytes beyond it.
  for L in "1 1 1 fp32" "1 2 1 fp32" "2 1 1 fp32" "1 2 2 fp32" "1 2 1 bf16" "2 2 1 bf16"; do
    read -r rep sh tp dt <<<"$L"
    np=$((rep * sh * tp))
    label="mem-r${rep}s${sh}t${tp}-$dt"
    run "$label" $np "${M[@]}" --steps 2 --dtype "$dt" --dp-replicate "$rep" --dp-shard "$sh" --tp "$tp" \
      || continue
    if out=$(python3 - "run-$label/metrics.jsonl" <<'EOF2'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if '"loss"' in x]
if not rows or "device_bytes" not in rows[0]:
    print("no device_bytes in metrics.jsonl"); sys.exit(1)
held, plan = rows[-1]["device_bytes"], rows[-1]["plan_bytes"]
if not 0 <= held - plan < 8 * 64:
    print("held %d bytes, planned %d (%+d)" % (held, plan, held - plan)); sys.exit(1)
print("held %d bytes, planned %d (rounding %d)" % (held, plan, held - plan))
EOF2
    ); then ok "($rep,$sh,$tp) $dt: $out"; else fail "($rep,$sh,$tp) $dt: $out"; fi
  done
  ;;

*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac
finish test_parallel

#!/usr/bin/env bash
# End-to-end tests of tokshard-train / tokshard-generate on real text (dict-gcide).
# Usage: test_train.sh BIN_DIR WORKDIR CASE
#   CASE: setup | train | resume | safety | checkpoint | plan | generate | lock | bf16 | faults | cli | profile | stepmodel | mix | eval
# `setup` builds the small dataset the other cases share (a ctest fixture).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
BIN=$1
W=$2
CASE=$3
TKS=$BIN/tokshard
TRAIN=$BIN/tokshard-train
GEN=$BIN/tokshard-generate
FORGE=$BIN/forge_token
FORGE_CKPT=$BIN/forge_ckpt
S=$W/setup
W=$W/$CASE-run
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
# a tiny model that trains in seconds on 2 cores
M=(--dim 32 --n-layers 2 --n-heads 4 --n-kv-heads 2 --seq-len 32 --global-batch 8 --micro-batch 4
  --lr 1e-2 --warmup 3 --val-tokens 4096 --eval-every 4 --threads 2 --quiet --no-plot)

case $CASE in
setup)
  rm -rf "$S" && mkdir -p "$S"
  # TKS_TEST_GCIDE: another copy of the text (the GPU machine has no dict-gcide:
  # the GPU bundle carries the first 1.5 MB of it, bench/gpu/bundle.sh)
  zcat "${TKS_TEST_GCIDE:-/usr/share/dictd/gcide.dict.dz}" | head -c 1500000 >"$S/gcide.txt"
  expect 0 "train tokenizer" -- "$TKS" train-tokenizer --output "$S/tok" --vocab-size 1000 \
    --byte-fallback --doc-split blank-line "$S/gcide.txt"
  expect 0 "build dataset" -- "$TKS" build -q --tokenizer "$S/tok.model" --output "$S/data" \
    --doc-split blank-line --append-eos --shard-tokens 64K "$S/gcide.txt"
  expect 0 "train a second tokenizer" -- "$TKS" train-tokenizer --output "$S/tok2" --vocab-size 900 \
    --doc-split blank-line "$S/gcide.txt"
  expect 0 "build a dataset with the second tokenizer" -- "$TKS" build -q --tokenizer "$S/tok2.model" \
    --output "$S/data2" --doc-split blank-line --shard-tokens 64K "$S/gcide.txt"
  ;;

train)
  expect 0 "train 24 steps" -- "$TRAIN" --dataset "$S/data" --out run --steps 24 --save-every 8 "${M[@]}"
  n=$(grep -c '"loss"' run/metrics.jsonl)
  [[ $n -eq 24 ]] && ok "24 metric lines" || fail "$n metric lines"
  grep -q '"val_loss"' run/metrics.jsonl && ok "validation evaluated" || fail "no validation loss"
  first=$(grep '"loss"' run/metrics.jsonl | head -3 | sed 's/.*"loss": \([0-9.]*\).*/\1/' | awk '{s+=$1} END {print s/NR}')
  last=$(grep '"loss"' run/metrics.jsonl | tail -3 | sed 's/.*"loss": \([0-9.]*\).*/\1/' | awk '{s+=$1} END {print s/NR}')
  awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a - 0.5)}' && ok "loss falls: $first -> $last" ||
    fail "loss does not fall enough: $first -> $last"
  [[ -d run/checkpoints/step-00000024 ]] && ok "final checkpoint" || fail "no final checkpoint"
  [[ $(ls run/checkpoints | wc -l) -eq 3 ]] && ok "3 checkpoints kept" || fail "checkpoints: $(ls run/checkpoints)"
  # the embedding is saved unpadded: exactly [vocab_size, dim] although the process pads to 1024
  /usr/bin/python3 - run/checkpoints/step-00000024/model.safetensors <<'EOF' && ok "model.safetensors holds [1000, 32] embeddings" || fail "bad shapes in model.safetensors"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert h["model.embed_tokens.weight"]["shape"] == [1000, 32], h["model.embed_tokens.weight"]
assert h["lm_head.weight"]["shape"] == [1000, 32]
assert h["model.layers.1.self_attn.k_proj.weight"]["shape"] == [16, 32]
EOF
  grep -q '"vocab_size": 1000' run/checkpoints/step-00000024/config.json && ok "config.json vocab 1000" ||
    fail "config.json: $(cat run/checkpoints/step-00000024/config.json)"
  expect 0 "generate" -- "$GEN" --checkpoint run --prompt "A dog" --max-tokens 12 --seed 5
  [[ $(wc -c <"$W/out") -gt 8 ]] && ok "generated: $(head -c 80 "$W/out")" || fail "no text generated"
  expect 0 "generate greedy twice" -- "$GEN" --checkpoint run --prompt "A dog" --max-tokens 12 --temperature 0
  cp "$W/out" g1
  "$GEN" --checkpoint run --prompt "A dog" --max-tokens 12 --temperature 0 >g2
  cmp -s g1 g2 && ok "greedy generation is deterministic" || fail "greedy generation differs"
  expect 0 "plot on demand" -- "$TRAIN" --plot run
  grep -q "<svg" run/loss.svg && ok "loss.svg is an SVG" || fail "loss.svg missing"
  ;;

resume)
  expect 0 "uninterrupted run" -- "$TRAIN" --dataset "$S/data" --out full --steps 16 --save-every 8 "${M[@]}"
  expect 0 "run to step 8" -- "$TRAIN" --dataset "$S/data" --out part --steps 16 --save-every 8 "${M[@]}" --stop-at 8
  expect 0 "resume from step 8" -- "$TRAIN" --dataset "$S/data" --out part --steps 16 --save-every 8 "${M[@]}" \
    --resume latest
  grep '"loss"' full/metrics.jsonl | cut -d, -f1,2 >a
  grep '"loss"' part/metrics.jsonl | cut -d, -f1,2 >b
  cmp -s a b && ok "losses of all 16 steps bit-identical after resume" || fail "losses differ: $(diff a b | head -4)"
  cmp -s full/checkpoints/step-00000016/model.safetensors part/checkpoints/step-00000016/model.safetensors &&
    ok "final model.safetensors byte-identical" || fail "final weights differ"
  cmp -s full/checkpoints/step-00000016/optimizer.safetensors part/checkpoints/step-00000016/optimizer.safetensors &&
    ok "final optimizer.safetensors byte-identical" || fail "final optimizer state differs"
  # a sampling flag given with another value than the checkpoint's is refused,
  # naming both (it was silently replaced by the checkpoint's)
  for f in "--seq-len 16:32" "--global-batch 4:8" "--seed 7:1337" "--val-tokens 2048:4096"; do
    read -r flag v was <<<"${f/:/ }"
    expect 2 "resume with $flag $v" -- "$TRAIN" --dataset "$S/data" --out part --steps 16 --save-every 8 \
      "${M[@]}" "$flag" "$v" --resume part/checkpoints/step-00000008
    expect_msg "$flag $v differs from the checkpoint .*step-00000008's $was.*resume with $flag $was"
  done
  # Ctrl-C saves a checkpoint and exits 130; resuming finishes the run identically
  "$TRAIN" --dataset "$S/data" --out int --steps 1000000 "${M[@]}" --eval-every 0 &
  pid=$!
  sleep 2
  kill -INT $pid
  wait $pid
  code=$?
  [[ $code -eq 130 ]] && ok "SIGINT: exit 130" || fail "SIGINT: exit $code"
  ls int/checkpoints/step-* >/dev/null 2>&1 && ok "SIGINT saved a checkpoint: $(ls int/checkpoints)" ||
    fail "no checkpoint after SIGINT"
  ;;

safety)
  expect 2 "model vocab below the dataset's" -- "$TRAIN" --dataset "$S/data" --out r --steps 2 "${M[@]}" --vocab-size 500
  expect_msg "vocab_size 1000.*vocab_size 500"
  expect 0 "larger model vocab is fine" -- "$TRAIN" --dataset "$S/data" --out r2 --steps 2 "${M[@]}" --vocab-size 1100
  expect 0 "train 4 steps" -- "$TRAIN" --dataset "$S/data" --out r3 --steps 4 "${M[@]}"
  expect 2 "resume on a dataset of another tokenizer" -- "$TRAIN" --dataset "$S/data2" --out r4 --steps 8 \
    "${M[@]}" --resume r3/checkpoints/step-00000004
  expect_msg "tokenizer"
  # an id >= vocab_size smuggled in with valid checksums: audit catches it, training stops on it.
  # sample-plan says where step 1 reads (sample 1 of the batch), so the forged id is met at once.
  read -r sh off < <("$TKS" sample-plan "$S/data" --seq-len 32 --global-batch 8 --steps 1 \
    --val-tokens 4096 --seed 1337 | awk '/ sample 1 / {print $(NF-3), $(NF-1)}')
  bad_at=$((off + 10))
  cp -r "$S/data" bad
  expect 0 "forge id 1000 at shard $sh token $bad_at" -- "$FORGE" bad "$sh" "$bad_at" 1000
  expect 1 "audit finds the forged id" -- "$TKS" audit bad
  grep -Eq "shard $sh chunk [0-9]+ token $bad_at" "$W/out" && ok "audit names shard $sh, token $bad_at" ||
    fail "audit: $(cat "$W/out")"
  expect 2 "training stops at the forged id" -- "$TRAIN" --dataset bad --out r5 --steps 4 "${M[@]}" --eval-every 0
  expect_msg "token id 1000 at token offset $bad_at .*not below the vocabulary size 1000"
  expect_msg "shard-0000$sh.tks"
  grep -q '"loss"' r5/metrics.jsonl 2>/dev/null && fail "a step ran on the bad batch" || ok "no step ran"
  expect 2 "with a larger model vocab the shard's own vocab still refuses it" -- "$TRAIN" --dataset bad \
    --out r6 --steps 4 "${M[@]}" --eval-every 0 --vocab-size 1100
  expect_msg "token offset $bad_at"
  ;;

checkpoint)
  expect 0 "train 4 steps" -- "$TRAIN" --dataset "$S/data" --out r --steps 4 "${M[@]}"
  C=r/checkpoints/step-00000004
  cp -r $C c1 && printf '\x01' | dd of=c1/model.safetensors bs=1 seek=5000 conv=notrunc 2>/dev/null
  expect 2 "a flipped byte in model.safetensors" -- "$TRAIN" --dataset "$S/data" --out x1 --steps 8 "${M[@]}" --resume c1
  expect_msg "model.safetensors is corrupt"
  cp -r $C c2 && rm c2/trainer_state.json
  expect 2 "no trainer_state.json" -- "$TRAIN" --dataset "$S/data" --out x2 --steps 8 "${M[@]}" --resume c2
  expect_msg "trainer_state.json"
  cp -r $C c3 && rm c3/optimizer.safetensors
  expect 2 "no optimizer.safetensors" -- "$TRAIN" --dataset "$S/data" --out x3 --steps 8 "${M[@]}" --resume c3
  expect_msg "optimizer.safetensors is missing"
  cp -r $C c4 && truncate -s -4 c4/config.json
  expect 2 "truncated config.json" -- "$TRAIN" --dataset "$S/data" --out x4 --steps 8 "${M[@]}" --resume c4
  expect_msg "config.json is corrupt"
  # NaN and infinities with consistent checksums (a checkpoint rewritten by
  # another tool): generation, export and a resume refuse them, naming the
  # file, the tensor and the element (generation printed only the prompt,
  # export wrote the model, a resume trained a step and then said to resume
  # from the same checkpoint)
  cp -r $C n1 && "$FORGE_CKPT" n1 model.safetensors model.layers.1.mlp.up_proj.weight 70 nan ||
    fail "forge_ckpt n1"
  NAN_MSG="n1 is not a usable checkpoint: model.safetensors holds NaN in model.layers.1.mlp.up_proj.weight at element 70 \\(index \\[2, 6\\] of shape \\[96, 32\\]\\).*earlier checkpoint"
  expect 2 "generate from a NaN weight" -- "$GEN" --checkpoint n1 --prompt "A dog" --max-tokens 4 --temperature 0
  expect_msg "$NAN_MSG"
  [[ ! -s $W/out ]] && ok "generate printed nothing on stdout" || fail "generate printed: $(cat "$W/out")"
  expect 2 "export-hf of a NaN weight" -- "$TKS" export-hf n1 hf1
  expect_msg "$NAN_MSG"
  [[ ! -e hf1 ]] && ok "nothing exported" || fail "hf1 exported"
  expect 2 "resume from a NaN weight" -- "$TRAIN" --dataset "$S/data" --out x5 --steps 8 "${M[@]}" --change-schedule --resume n1
  expect_msg "$NAN_MSG"
  grep -qs '"loss"' x5/metrics.jsonl && fail "a step ran from the NaN checkpoint" || ok "no step ran"
  cp -r $C n2 && "$FORGE_CKPT" n2 optimizer.safetensors model.norm.weight.exp_avg_sq 3 inf || fail "forge_ckpt n2"
  expect 2 "resume from an infinite AdamW moment" -- "$TRAIN" --dataset "$S/data" --out x6 --steps 8 "${M[@]}" --change-schedule --resume n2
  expect_msg "n2 is not a usable checkpoint: optimizer.safetensors holds \\+inf in model.norm.weight.exp_avg_sq at element 3 \\(index \\[3\\] of shape \\[32\\]\\)"
  grep -qs '"loss"' x6/metrics.jsonl && fail "a step ran from the inf moment" || ok "no step ran"
  cp -r $C n3 && "$FORGE_CKPT" n3 model.safetensors model.embed_tokens.weight 33 -inf || fail "forge_ckpt n3"
  expect 2 "export-hf of a -inf embedding" -- "$TKS" export-hf n3 hf3
  expect_msg "model.safetensors holds -inf in model.embed_tokens.weight at element 33 \\(index \\[1, 1\\] of shape \\[1000, 32\\]\\)"
  expect 0 "the untouched checkpoint still exports" -- "$TKS" export-hf $C hf0
  mkdir -p r/checkpoints/step-00000009.tmp
  expect 0 "a half-written checkpoint dir is ignored by --resume latest" -- "$TRAIN" --dataset "$S/data" \
    --out r --steps 6 "${M[@]}" --resume latest --change-schedule
  grep -q '"step": 5' r/metrics.jsonl && ok "resumed at step 5" || fail "did not resume from step 4"
  ;;

plan)
  # sample-plan with no data-order flags plans what tokshard-train with its
  # defaults reads: forge a bad id where the plan says step 1 reads; a default
  # run must stop on it at step 1 (different seed, split or step numbering
  # would send the trainer elsewhere).
  read -r sh off < <("$TKS" sample-plan "$S/data" --seq-len 32 --global-batch 8 |
    awk '/ sample 1 / {print $(NF-3), $(NF-1)}')
  [[ -n ${off:-} ]] || fail "no sample 1 in the default plan"
  D=(--dim 32 --n-layers 2 --n-heads 4 --n-kv-heads 2 --seq-len 32 --global-batch 8 --micro-batch 4
    --lr 1e-2 --warmup 3 --eval-every 0 --threads 2 --quiet --no-plot)
  cp -r "$S/data" bad
  expect 0 "forge id 1000 at shard $sh token $((off + 3))" -- "$FORGE" bad "$sh" $((off + 3)) 1000
  expect 2 "a default run meets it at step 1" -- "$TRAIN" --dataset bad --out d1 --steps 1 "${D[@]}"
  expect_msg "token offset $((off + 3)) "
  # --run: the plan of an existing run, from its checkpoint's own settings
  expect 0 "train 4 steps" -- "$TRAIN" --dataset "$S/data" --out r --steps 4 "${M[@]}" --seed 99
  expect 0 "sample-plan --run" -- "$TKS" sample-plan --run r --json
  cp "$W/out" run.json
  expect 0 "the same plan from flags" -- "$TKS" sample-plan "$S/data" --seq-len 32 --global-batch 8 \
    --micro-batch 4 --val-tokens 4096 --seed 99 --steps 5 --json
  cp "$W/out" flags.json
  python3 - run.json flags.json <<'EOF2' && ok "--run plans step 5 as the flags do" || fail "--run plan differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["checkpoint"]["step"] == 4 and a["checkpoint"]["cursor"] == 32, a["checkpoint"]
assert [s["step"] for s in a["steps"]] == [5], a["steps"]
assert a["steps"] == b["steps"] and a["seed"] == 99 and a["micro_batch"] == 4
EOF2
  # after a resume the plan continues from the newest checkpoint
  expect 0 "resume to step 6" -- "$TRAIN" --dataset "$S/data" --out r --steps 6 "${M[@]}" --seed 99 \
    --resume latest --change-schedule
  expect 0 "sample-plan --run after the resume" -- "$TKS" sample-plan --run r --json
  python3 - "$W/out" <<'EOF2' && ok "step 7 starts at sample 48 = 6 x 8" || fail "cursor not followed"
import json, sys
a = json.load(open(sys.argv[1]))
assert a["checkpoint"]["step"] == 6 and a["checkpoint"]["cursor"] == 48, a["checkpoint"]
assert a["steps"][0]["step"] == 7 and a["steps"][0]["ranks"][0]["samples"][0]["sample"] == 48, a["steps"][0]
EOF2
  expect 0 "a checkpoint directory works as --run too" -- "$TKS" sample-plan --run r/checkpoints/step-00000004
  grep -q "^step 5 rank 0" "$W/out" && ok "plans step 5 from step-00000004" || fail "$(head -5 "$W/out")"
  expect 2 "--seed with --run" -- "$TKS" sample-plan --run r --seed 3
  expect_msg "--seed cannot be combined with --run"
  expect 2 "--run on a directory with no checkpoint" -- "$TKS" sample-plan --run "$S"
  expect_msg "neither a checkpoint"
  expect 2 "step 0" -- "$TKS" sample-plan "$S/data" --seq-len 32 --global-batch 8 --steps 0
  expect_msg "steps count from 1"
  ;;

generate)
  # an empty prompt: BOS starts the context when the tokenizer has one, else
  # EOS; a tokenizer with neither is refused (it read ctx[-1] before)
  expect 0 "train 2 steps (tokenizer with BOS)" -- "$TRAIN" --dataset "$S/data" --out bos --steps 2 "${M[@]}"
  expect 0 "empty prompt, BOS tokenizer" -- "$GEN" --checkpoint bos --prompt "" --max-tokens 8 --seed 3
  head -c 600000 "$S/gcide.txt" >small.txt
  for kind in noBOS noBOSnoEOS; do
    ex=(--bos_id=-1)
    [[ $kind == noBOSnoEOS ]] && ex+=(--eos_id=-1)
    spm_train --input=small.txt --model_prefix="$kind" --vocab_size=600 --model_type=bpe \
      --byte_fallback=true "${ex[@]}" >spm-$kind.log 2>&1 || fail "spm_train $kind: $(tail -2 spm-$kind.log)"
    expect 0 "dataset with the $kind tokenizer" -- "$TKS" build -q --tokenizer "$kind.model" --output "d-$kind" \
      --doc-split blank-line --shard-tokens 64K small.txt
    expect 0 "train 2 steps ($kind)" -- "$TRAIN" --dataset "d-$kind" --out "r-$kind" --steps 2 "${M[@]}"
  done
  expect 0 "empty prompt, tokenizer without BOS: starts after EOS" -- "$GEN" --checkpoint r-noBOS --prompt "" \
    --max-tokens 8 --seed 3
  expect 0 "a prompt, tokenizer without BOS" -- "$GEN" --checkpoint r-noBOS --prompt "A dog" --max-tokens 4
  expect 2 "empty prompt, tokenizer with neither BOS nor EOS" -- "$GEN" --checkpoint r-noBOSnoEOS --prompt "" \
    --max-tokens 8
  expect_msg "the prompt is empty and .*tokenizer.model has neither a BOS nor an EOS.*--prompt TEXT"
  expect 0 "a prompt, tokenizer with neither" -- "$GEN" --checkpoint r-noBOSnoEOS --prompt "A dog" --max-tokens 4
  # divergence is its own error, naming the step and what to do
  expect 2 "a learning rate that diverges" -- "$TRAIN" --dataset "$S/data" --out div --steps 6 "${M[@]}" \
    --lr 1e30 --warmup 0 --grad-clip 0 --eval-every 0
  expect_msg "step [0-9]+: the gradient norm is -?(nan|inf).*training diverged.*lower --lr"
  ;;

lock)
  # one writer at a time, with two real processes. wait_for FILE PATTERN: until FILE matches (20 s)
  wait_for() { for _ in $(seq 400); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
  # a training run holds RUN/run.lock: a second trainer on the same --out is refused with the pid
  "$TRAIN" --dataset "$S/data" --out run --steps 1000000 "${M[@]}" --eval-every 0 --save-every 2 &
  pid=$!
  wait_for run/metrics.jsonl '"step": 3,' || fail "the first trainer did not start"
  expect 2 "a second trainer on the same --out" -- "$TRAIN" --dataset "$S/data" --out run --steps 4 "${M[@]}"
  expect_msg "run/run.lock is locked by process $pid \\(pid $pid: tokshard-train\\).*wait for it to finish or stop it \\(kill -INT $pid\\)"
  expect 2 "a second trainer resuming into the same --out" -- "$TRAIN" --dataset "$S/data" --out run --steps 1000000 \
    "${M[@]}" --eval-every 0 --save-every 2 --resume latest
  expect_msg "locked by process $pid"
  kill -INT $pid
  wait $pid
  code=$?
  [[ $code -eq 130 ]] && ok "the first trainer stopped and saved" || fail "the first trainer: exit $code"
  [[ ! -e run/run.lock ]] && ok "run.lock removed at the end" || fail "run.lock left behind"
  last=$(ls run/checkpoints | tail -1 | sed 's/step-0*//')
  expect 0 "after it ends, the run resumes (on a shorter schedule)" -- "$TRAIN" --dataset "$S/data" --out run \
    --steps $((last + 1)) "${M[@]}" --eval-every 0 --resume latest --change-schedule
  # a build holds OUT.lock: `build --resume` of the same output while it runs is refused and
  # deletes nothing (it removed the running build's files before). The first build is stopped
  # (SIGSTOP) while it holds the lock so that the check does not race its end.
  zcat /usr/share/dictd/gcide.dict.dz | head -c 10000000 >big.txt
  B=(build -q --tokenizer "$S/tok.model" --output big --doc-split blank-line --shard-tokens 64K big.txt)
  "$TKS" "${B[@]}" 2>build1.err &
  pid=$!
  wait_for big.lock "pid $pid" && kill -STOP $pid || fail "the first build did not take big.lock"
  ls big.partial >before 2>&1
  expect 2 "a second build of the same output" -- "$TKS" "${B[@]}" --resume
  expect_msg "big.lock is locked by process $pid \\(pid $pid: tokshard build\\)"
  ls big.partial >after 2>&1
  cmp -s before after && ok "the refused build touched nothing in big.partial" || fail "big.partial changed: $(diff before after)"
  kill -CONT $pid
  kill -INT $pid
  wait $pid
  code=$?
  if [[ $code -eq 130 ]]; then
    expect 0 "the interrupted build resumes once the lock is free" -- "$TKS" "${B[@]}" --resume
  else
    [[ $code -eq 0 ]] || fail "first build: exit $code $(tail -2 build1.err)"
  fi
  expect 0 "the dataset audits clean" -- "$TKS" audit big
  [[ ! -e big.lock ]] && ok "big.lock removed at the end" || fail "big.lock left behind"
  rm -f big.txt
  ;;

bf16)
  # mixed precision: the same run in fp32 and bf16 (bf16 weights and
  # activations, fp32 masters, gradients and moments); both learn, and the
  # bf16 validation loss ends within 2% of fp32's
  expect 0 "train 24 steps fp32" -- "$TRAIN" --dataset "$S/data" --out r32 --steps 24 "${M[@]}" --eval-every 24
  expect 0 "train 24 steps bf16" -- "$TRAIN" --dataset "$S/data" --out r16 --steps 24 "${M[@]}" --eval-every 24 --dtype bf16
  v32=$(grep '"val_loss"' r32/metrics.jsonl | tail -1 | sed 's/.*"val_loss": \([0-9.]*\).*/\1/')
  v16=$(grep '"val_loss"' r16/metrics.jsonl | tail -1 | sed 's/.*"val_loss": \([0-9.]*\).*/\1/')
  first=$(grep '"loss"' r16/metrics.jsonl | head -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
  awk -v a="$first" -v b="$v16" 'BEGIN {exit !(b < a - 0.5)}' && ok "bf16 learns: loss $first -> val $v16" ||
    fail "bf16 does not learn: $first -> $v16"
  awk -v a="$v32" -v b="$v16" 'BEGIN {d = (b - a) / a; if (d < 0) d = -d; exit !(d <= 0.02)}' &&
    ok "bf16 val loss $v16 within 2% of fp32 $v32" || fail "bf16 val loss $v16 vs fp32 $v32"
  grep -q '"host_wait_s"' r16/metrics.jsonl && ok "metrics record host_wait_s" || fail "no host_wait_s"
  # a bf16 checkpoint holds fp32 masters: it resumes, in either dtype
  expect 0 "resume the bf16 run in fp32 for 2 more steps" -- "$TRAIN" --dataset "$S/data" --out r16 \
    --resume latest --steps 26 "${M[@]}" --eval-every 0 --change-schedule
  expect 2 "unknown dtype" -- "$TRAIN" --dataset "$S/data" --out x --dtype fp8 --dry-run
  expect_msg "--dtype fp8"
  # refused when not built with CUDA or without an NVIDIA driver (with a GPU it runs: cuda_train)
  if [[ ! -e /dev/nvidiactl && ! -e /proc/driver/nvidia/version ]]; then
    expect 2 "cuda refused" -- "$TRAIN" --dataset "$S/data" --out x --device cuda --steps 1 "${M[@]}"
    expect_msg "no CUDA backend|no CUDA device"
  fi
  expect 2 "unknown device" -- "$TRAIN" --dataset "$S/data" --out x --device tpu --dry-run
  expect_msg "--device tpu"
  expect 0 "bf16 dry run names the dtype" -- "$TRAIN" --dataset "$S/data" --out x --steps 1 "${M[@]}" --dtype bf16 --dry-run
  grep -q "memory estimate (bf16" "$W/out" && ok "dry run: bf16 memory estimate" || fail "$(grep memory "$W/out")"
  expect 0 "bf16 with tp 2: dry run" -- "$TRAIN" --dataset "$S/data" --out x --steps 1 "${M[@]}" --dtype bf16 \
    --world 2 --tp 2 --dry-run
  ;;

faults)
  # checkpoint saves under faults: kill -9 at each point of a save, and a disk
  # that fills during one. Reference: 8 steps, a checkpoint every 2, keep 2.
  F=(--steps 8 --save-every 2 --keep 2 --eval-every 0)
  expect 0 "reference run" -- "$TRAIN" --dataset "$S/data" --out ref "${M[@]}" "${F[@]}"
  # same_run RUN: the last loss logged for each step equals the reference's, bit for bit
  same_run() {
    python3 - "$1/metrics.jsonl" ref/metrics.jsonl <<'EOF'
import json, sys
def last(p):
    d = {}
    for line in open(p):
        j = json.loads(line)
        if "loss" in j: d[j["step"]] = line.split(",")[1]
    return d
a, b = last(sys.argv[1]), last(sys.argv[2])
sys.exit(0 if a == b and len(a) == 8 else 1)
EOF
  }
  # whole RUN: every step-N under RUN/checkpoints verifies (checksums, config, state)
  whole() {
    local c
    for c in "$1"/checkpoints/step-????????; do
      [[ -e $c ]] || continue
      "$TRAIN" --dataset "$S/data" --out x --dry-run --resume "$c" "${M[@]}" --steps 8 >/dev/null 2>err-whole ||
        { fail "$c is taken for whole but does not verify: $(tail -1 err-whole)"; return 1; }
    done
  }
  # the stop points are test hooks, not compiled into Release builds
  points=(model:2 optimizer:2 config:2 tokenizer:2 state:2 renamed:2 pruning:1)
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skip [faults]: kill -9 points (a Release build has no test hooks)"
    points=()
  fi
  for point in "${points[@]}"; do
    name=${point%%:*}
    TOKSHARD_TEST_CKPT_STOP=$point "$TRAIN" --dataset "$S/data" --out "k-$name" "${M[@]}" "${F[@]}" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 600); do [[ $(ps -o stat= -p $pid) == T* ]] && break; sleep 0.05; done
    if [[ $(ps -o stat= -p $pid) != T* ]]; then
      fail "$name: the save never reached the stop point (test hooks compiled in?)"
      kill -9 $pid 2>/dev/null
      wait $pid 2>/dev/null
      continue
    fi
    kill -9 $pid
    wait $pid 2>/dev/null
    have=$(ls "k-$name/checkpoints" | grep -E '^step-[0-9]+$' | tr '\n' ' ')
    whole "k-$name" && ok "killed at $point: the step dirs left verify: $have"
    case $name in
    renamed) [[ $have == *step-00000004* ]] || fail "$name: step 4 missing after its rename: $have" ;;
    pruning) [[ $have == *step-00000006* && $have == *step-00000004* ]] || fail "$name: pruning lost a whole one: $have" ;;
    *) [[ $have == "step-00000002 " ]] || fail "$name: expected only step 2 whole, found: $have" ;;
    esac
    expect 0 "killed at $point: resume from the newest whole checkpoint" -- "$TRAIN" --dataset "$S/data" \
      --out "k-$name" "${M[@]}" "${F[@]}" --resume latest
    same_run "k-$name" && ok "killed at $point: all 8 losses identical to the uninterrupted run" ||
      fail "killed at $point: losses differ from the reference"
    n=$(ls "k-$name/checkpoints" | grep -cE '^step-[0-9]+$')
    left=$(ls "k-$name/checkpoints" | grep -vE '^step-[0-9]+$' | tr '\n' ' ')
    [[ $n -eq 2 && -z $left ]] && ok "killed at $point: --keep 2 kept 2, no leftovers" ||
      fail "killed at $point: $(ls "k-$name/checkpoints" | tr '\n' ' ')"
  done
  # disk full during a save: a file size limit (SIGXFSZ ignored, so writes fail with EFBIG)
  expect 0 "run to step 4" -- "$TRAIN" --dataset "$S/data" --out full "${M[@]}" "${F[@]}" --stop-at 4
  (ulimit -f 400; trap '' XFSZ; exec "$TRAIN" --dataset "$S/data" --out full "${M[@]}" "${F[@]}" --resume latest) \
    >out-full 2>err-full
  code=$?
  [[ $code -eq 2 ]] && grep -Eq "cannot write .*step-00000006.tmp/.*safetensors.*(File too large|No space).*free some space" err-full &&
    ok "a full disk during the step-6 save: exit 2, names the file and what to do" ||
    fail "disk full: exit $code: $(tail -2 err-full)"
  [[ ! -e full/checkpoints/step-00000006 && ! -e full/checkpoints/step-00000006.tmp ]] &&
    ok "nothing half-written left" || fail "left: $(ls full/checkpoints)"
  whole full && ok "step 4 still verifies"
  expect 0 "resume with space again" -- "$TRAIN" --dataset "$S/data" --out full "${M[@]}" "${F[@]}" --resume latest
  same_run full && ok "after the full disk: all 8 losses identical to the uninterrupted run" ||
    fail "after the full disk: losses differ"
  ;;

cli)
  expect 0 "--help" -- "$TRAIN" --help
  for f in --dataset --out --resume --steps --seq-len --global-batch --micro-batch --seed --dim \
    --n-layers --n-heads --n-kv-heads --ffn-dim --lr --warmup --weight-decay --grad-clip --val-tokens \
    --eval-every --save-every --dry-run --eval-only --tie-embeddings --vocab-divisible-by; do
    grep -q -- "$f" "$W/out" || fail "--help does not list $f"
  done
  ok "--help lists every flag"
  expect 0 "--dry-run" -- "$TRAIN" --dataset "$S/data" --out dry --steps 10 "${M[@]}" --dry-run
  grep -q "parameters" "$W/out" && grep -q "memory estimate" "$W/out" && grep -q "step 1:" "$W/out" &&
    ok "dry run shows size, memory and samples" || fail "dry run output: $(head -20 "$W/out")"
  [[ ! -e dry ]] && ok "dry run writes nothing" || fail "dry run created the run dir"
  expect 2 "missing --dataset" -- "$TRAIN" --out x
  expect_msg "--dataset"
  expect 2 "unknown flag" -- "$TRAIN" --dataset "$S/data" --out x --speed 9
  expect_msg "unknown option --speed"
  expect 2 "bad number" -- "$TRAIN" --dataset "$S/data" --out x --steps many
  expect_msg "--steps many"
  expect 2 "heads not dividing dim" -- "$TRAIN" --dataset "$S/data" --out x --dim 30 --n-heads 4 --dry-run
  expect_msg "--dim 30 is not divisible by --n-heads 4"
  expect 2 "batch not divisible by micro-batch" -- "$TRAIN" --dataset "$S/data" --out x --global-batch 8 \
    --micro-batch 3 --dry-run
  expect 2 "not a dataset" -- "$TRAIN" --dataset /tmp --out x --dry-run
  expect_msg "manifest"
  expect 2 "generate without checkpoint" -- "$GEN" --prompt hi
  ;;
profile)
  # --profile N: a table of every backend op over the first N steps; each
  # step runs the same ops, so 2 profiled steps count exactly twice the
  # calls of 1, and profiling changes no result (the losses are the same bits)
  expect 0 "train 3 steps, profile 1" -- "$TRAIN" --dataset "$S/data" --out p1 --steps 3 --profile 1 "${M[@]}"
  cp "$W/out" p1.txt
  expect 0 "train 3 steps, profile 2" -- "$TRAIN" --dataset "$S/data" --out p2 --steps 3 --profile 2 "${M[@]}"
  cp "$W/out" p2.txt
  expect 0 "train 3 steps unprofiled" -- "$TRAIN" --dataset "$S/data" --out p0 --steps 3 "${M[@]}"
  python3 - p1.txt p2.txt <<'PY' && ok "the table lists the ops; 2 steps count twice the calls of 1; shares sum to 100%" ||
import sys
def table(path):
    rows, on = {}, False
    for line in open(path):
        if line.startswith("backend ops over the profiled steps"): on = True; continue
        if on and line.startswith("op "): continue
        if on and line.strip():
            f = line.split()
            if f[0] == "all": break
            rows[f[0]] = (int(f[1]), float(f[2]), float(f[4].rstrip("%")))
    return rows
a, b = table(sys.argv[1]), table(sys.argv[2])
for op in ("gemm", "attention_fwd", "attention_bwd", "rmsnorm_fwd", "xent_fused", "adamw"):
    assert op in a and op in b, (op, sorted(a))
assert set(a) == set(b), (sorted(a), sorted(b))
for op in a:
    assert b[op][0] == 2 * a[op][0], (op, a[op], b[op])
for t in (a, b):  # shares are printed to 0.1%: the sum is 100 within half of that per row
    assert abs(sum(r[2] for r in t.values()) - 100.0) <= 0.05 * len(t) + 1e-9, t
PY
    fail "profile tables: $(cat p1.txt p2.txt | tail -c 1500)"
  if [[ "$(grep -o '"loss": [^,]*' p2/metrics.jsonl)" == "$(grep -o '"loss": [^,]*' p0/metrics.jsonl)" ]]; then
    ok "the profiled run's losses are the unprofiled run's"
  else
    fail "losses differ: $(grep -o '"loss": [^,]*' p2/metrics.jsonl p0/metrics.jsonl | tr '\n' ' ')"
  fi
  ;;
stepmodel)
  # --step-model enumerates the ops of one step without running it; priced on
  # the same roofline, a profiled real step must show the same calls of every
  # op and the same predicted time (the two share each op's cost function, so
  # only the printing's 0.001 ms rounding may differ). A slow made-up roofline
  # (1 GFLOP/s, 1 MB/s) makes every op's time large enough to compare.
  R=(--roofline 0.001,0.001,0.001,0.001)
  for dt in fp32 bf16; do
    expect 0 "$dt: one profiled step priced on the roofline" -- "$TRAIN" --dataset "$S/data" --out sm-$dt \
      --steps 1 --profile 1 --dtype $dt "${R[@]}" "${M[@]}"
    cp "$W/out" prof-$dt.txt
    expect 0 "$dt: --step-model of the same run" -- "$TRAIN" --step-model --dataset "$S/data" --dtype $dt \
      "${R[@]}" "${M[@]}"
    cp "$W/out" model-$dt.txt
    python3 - prof-$dt.txt model-$dt.txt <<'PY' && ok "$dt: the step model's calls and times are the profiled step's, op for op" ||
import sys
prof, model, on = {}, {}, False
for line in open(sys.argv[1]):
    if line.startswith("backend ops over the profiled steps"): on = True; continue
    f = line.split()
    if on and f and f[0] not in ("op", "all", "model:"):
        prof[f[0]] = (int(f[1]), float(f[-2]))
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) == 7 and f[0] not in ("op", "all") and f[1].isdigit():
        model[f[0]] = (int(f[1]), float(f[4]))
assert prof and set(prof) == set(model), (sorted(prof), sorted(model))
for op in prof:
    (pc, pt), (mc, mt) = prof[op], model[op]
    assert pc == mc, (op, "calls", pc, mc)
    assert abs(pt - mt) <= 0.0011, (op, "model ms", pt, mt)
assert prof["gemm"][1] > 1000, prof["gemm"]  # the prices are not all zero
PY
      fail "$dt: profile and step model differ: $(tail -c 1500 prof-$dt.txt) $(cat model-$dt.txt)"
  done
  grep -Eq "^predicted MFU: [0-9.]+% of 0.001 TFLOP/s" model-fp32.txt && ok "the model predicts an MFU" ||
    fail "no predicted MFU: $(tail -4 model-fp32.txt)"
  expect 0 "the Llama-3.2-1B shape on the H100 preset" -- "$TRAIN" --step-model --vocab-size 128256 --dim 2048 \
    --n-layers 16 --n-heads 32 --n-kv-heads 8 --ffn-dim 8192 --seq-len 2048 --global-batch 16 --micro-batch 2 \
    --dtype bf16
  grep -q "roofline h100: 989 TFLOP/s bf16" "$W/out" && grep -q "8 micro-batch(es) of 2 x 2048" "$W/out" &&
    ok "1B: $(grep '^predicted MFU' "$W/out")" || fail "1B step model: $(cat "$W/out")"
  expect 2 "a bad --roofline is refused" -- "$TRAIN" --step-model --vocab-size 1000 --roofline v100 "${M[@]}"
  expect_msg "--roofline v100: use h100, h200, a100, or four positive numbers"
  expect 2 "--step-model without a vocabulary is refused" -- "$TRAIN" --step-model "${M[@]}"
  expect_msg "--step-model needs --vocab-size N or --dataset DIR"
  # --deterministic: the CPU always is, so the run is the default run's bits,
  # and the plan names the attention and the flag
  expect 0 "--deterministic dry run" -- "$TRAIN" --dataset "$S/data" --dry-run --deterministic "${M[@]}"
  grep -q "attention: tokshard's own; --deterministic" "$W/out" && ok "the plan names the attention and --deterministic" ||
    fail "plan: $(grep -i attention "$W/out")"
  expect 0 "3 steps --deterministic" -- "$TRAIN" --dataset "$S/data" --out det1 --steps 3 --deterministic "${M[@]}"
  expect 0 "3 steps" -- "$TRAIN" --dataset "$S/data" --out det0 --steps 3 "${M[@]}"
  [[ "$(grep -o '"loss": [^,]*' det1/metrics.jsonl)" == "$(grep -o '"loss": [^,]*' det0/metrics.jsonl)" ]] &&
    ok "--deterministic on the CPU: the default run's losses" || fail "--deterministic changed the CPU losses"
  ;;
mix)
  # mixtures (docs/SAMPLING.md §9): three copies of the dataset as sources
  # (copies: a forged id must land in one source only), a schedule, and
  # --doc-mask; a tiny fourth source for epochs
  for s in a b c; do cp -r "$S/data" "src-$s"; done
  head -c 1500 "$S/gcide.txt" >tiny.txt
  expect 0 "tiny dataset with the same tokenizer" -- "$TKS" build -q --tokenizer "$S/tok.model" --output tiny \
    --doc-split blank-line --append-eos tiny.txt
  X=(--dataset a=src-a:0.5 --dataset b=src-b:0.3 --dataset c=src-c:0.2 --mix-at 6:a=1,c=3)
  P=(--seq-len 32 --global-batch 8 --val-tokens 4096)
  Mp=() Mv=() # M with the plot; M with the progress lines
  for f in "${M[@]}"; do [[ $f == --no-plot ]] || Mp+=("$f"); [[ $f == --quiet ]] || Mv+=("$f"); done
  # refusals before step 1, each naming the sources; nothing is written
  refuse() { # MESSAGE-REGEX flags...
    local msg=$1
    shift
    expect 2 "refused: $*" -- "$TRAIN" --out refused --steps 10 "${M[@]}" "$@"
    expect_msg "$msg"
    [[ ! -e refused ]] && ok "nothing written for: $*" || { fail "refused run wrote refused/"; rm -rf refused; }
  }
  refuse "sources a \\(src-a\\) and z \\(.*data2\\) were built with different tokenizers" \
    --dataset a=src-a:1 --dataset z="$S/data2":1
  refuse "source b \\(src-b\\): weight nan is not a finite number > 0" --dataset a=src-a:1 --dataset b=src-b:nan
  refuse "source b \\(src-b\\): weight inf is not a finite number > 0" --dataset a=src-a:1 --dataset b=src-b:inf
  refuse "source b \\(src-b\\): weight 0 is not a finite number > 0" --dataset a=src-a:1 --dataset b=src-b:0
  refuse "source b \\(src-b\\): weight -2 is not a finite number > 0" --dataset a=src-a:1 --dataset b=src-b:-2
  refuse "the source name a is used twice \\(src-a and src-b\\)" --dataset a=src-a:1 --dataset a=src-b:1
  refuse "--mix-at 11:a=1: step 11 is beyond --steps 10" --dataset a=src-a:1 --dataset b=src-b:1 --mix-at 11:a=1
  refuse "--mix-at 5: weights for an unknown source 'q' \\(the sources are a, b\\)" --dataset a=src-a:1 \
    --dataset b=src-b:1 --mix-at 5:q=1
  refuse "--mix-at 5: source b: weight '-1' is not a finite number > 0" --dataset a=src-a:1 --dataset b=src-b:1 \
    --mix-at 5:a=1,b=-1
  refuse "--mix-at 1: a change takes effect from step 2 on" --dataset a=src-a:1 --dataset b=src-b:1 --mix-at 1:a=1
  refuse "source b: dataset src-b was built for vocab_size 1000.*model has vocab_size 500" --dataset b=src-b:1 \
    --dataset a=src-a:1 --vocab-size 500
  refuse "--val-dataset .*a mixture holds out --val-tokens of each source" --dataset a=src-a:1 \
    --dataset b=src-b:1 --val-dataset src-c
  refuse "several datasets make a mixture, and each needs a name and a weight" --dataset src-a --dataset src-b
  # a source whose validation split is smaller than one micro-batch per
  # data-parallel rank would have no loss (NaN, which is not JSON) and drop
  # out of the mixture's mean: refused, naming the source and the numbers
  refuse "source a \(src-a\): its validation split holds 2 windows of --seq-len 33, fewer than one micro-batch.*\(4 x dp 1 = 4\).*raise --val-tokens \(68 now\) to at least 136" \
    --dataset a=src-a:1 --dataset b=src-b:1 --val-tokens 68 --seq-len 33 --global-batch 4
  # --mix FILE.json: an unknown key anywhere is an error naming it (a misspelt
  # "Schedule" would otherwise train without the schedule)
  printf '{"sources": [{"name": "a", "path": "src-a", "weight": 1}, {"name": "b", "path": "src-b", "weight": 1}],
  "Schedule": [{"step": 6, "weights": {"a": 1}}]}\n' >typo-top.json
  refuse 'typo-top.json: unknown key "Schedule" in the file.s object \(allowed: "sources", "schedule"\)' \
    --mix typo-top.json
  printf '{"sources": [{"name": "a", "path": "src-a", "weight": 1}, {"name": "b", "path": "src-b", "wieght": 1}]}\n' \
    >typo-src.json
  refuse 'unknown key "wieght" in sources\[1\] \(allowed: "name", "path", "weight"\)' --mix typo-src.json
  printf '{"sources": [{"name": "a", "path": "src-a", "weight": 1}, {"name": "b", "path": "src-b", "weight": 1}],
  "schedule": [{"step": 6, "weight": {"a": 1}}]}\n' >typo-sch.json
  refuse 'unknown key "weight" in schedule\[0\] \(allowed: "step", "weights"\)' --mix typo-sch.json
  # the trainer reads what sample-plan says, source by source: an id forged
  # where the plan puts step 1's sample 1 stops step 1, naming that source's shard
  read -r src sh off < <("$TKS" sample-plan "${X[@]}" "${P[@]}" --steps 1 | \
    awk '/ sample 1 / {print $14, $(NF-3), $(NF-1)}')
  [[ -n ${off:-} ]] || fail "no sample 1 in the mixture's plan"
  cp -r "src-$src" "bad-$src"
  expect 0 "forge id 1000 in source $src, shard $sh token $((off + 3))" -- "$FORGE" "bad-$src" "$sh" $((off + 3)) 1000
  Xb=("${X[@]/$src=src-$src/$src=bad-$src}")
  expect 2 "the mixture meets it at step 1" -- "$TRAIN" "${Xb[@]}" --out forged --steps 8 "${M[@]}" --eval-every 0
  expect_msg "bad-$src/shard-0000$sh.tks.*token offset $((off + 3)) "
  # per-source validation: each source's loss and the weighted mean, in
  # metrics.jsonl, on the progress line and in loss.svg
  expect 0 "train the mixture 8 steps with --doc-mask" -- "$TRAIN" "${X[@]}" --out run --steps 8 "${Mp[@]}" \
    --doc-mask --eval-every 4
  python3 - run/metrics.jsonl <<'EOF' && ok "val_loss is the mean of the sources' losses under the weights in force" ||
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l]
assert [e["step"] for e in ev] == [4, 8], ev
for e in ev:
    by = e["val_loss_by_source"]
    assert sorted(by) == ["a", "b", "c"], by
    w = {"a": 0.5, "b": 0.3, "c": 0.2} if e["step"] < 6 else {"a": 0.25, "b": 0.0, "c": 0.75}
    mean = sum(w[k] * by[k] for k in by) / sum(w.values())
    assert abs(mean - e["val_loss"]) <= 2e-6, (mean, e)  # printed to 6 decimals
EOF
    fail "per-source validation: $(grep val_loss run/metrics.jsonl)"
  grep -q "validation: a" run/loss.svg && grep -q "validation: c" run/loss.svg &&
    ok "loss.svg has a curve per source" || fail "loss.svg lacks the per-source curves"
  "$TRAIN" "${X[@]:0:6}" --out run2 --steps 4 "${Mv[@]}" --doc-mask --eval-every 4 >prog 2>&1
  grep -Eq "step +4: validation loss [0-9.]+ \(weighted mean; a [0-9.]+, b [0-9.]+, c [0-9.]+\)" prog &&
    ok "the progress line shows each source's validation loss" || fail "progress: $(grep valid prog)"
  # epochs: the tiny source runs out and starts again, logged; past --warn-repeats a warning
  "$TRAIN" --dataset a=src-a:1 --dataset t=tiny:1 --out ep --steps 14 "${Mv[@]}" --val-tokens 0 \
    --eval-every 0 --warn-repeats 1 >ep.out 2>ep.err
  grep -Eq "^source t starts epoch 2 at step [0-9]+ " ep.out && grep -Eq "^source t starts epoch 3 " ep.out &&
    ok "the log says when the tiny source starts epochs 2 and 3" || fail "epochs: $(head -c 600 ep.out)"
  grep -q "warning: t is now repeated 2 times, more than --warn-repeats 1" ep.err &&
    ! grep -q "warning: t is now repeated 1 times" ep.err && ok "a warning once it is repeated more than 1 time" ||
    fail "warning: $(cat ep.err)"
  # kill -9 before, at and after the schedule change (step 6), and inside the
  # save of step 6: resuming from the newest whole checkpoint gives the
  # uninterrupted run's losses bit for bit
  F=(--steps 10 --save-every 1 --keep 0 --eval-every 0 --doc-mask)
  expect 0 "uninterrupted mixture, 10 steps" -- "$TRAIN" "${X[@]}" --out ref "${M[@]}" "${F[@]}"
  points=(renamed:4 renamed:5 renamed:7 model:6)
  if grep -qx 'CMAKE_BUILD_TYPE:STRING=Release' "$BIN/../CMakeCache.txt" 2>/dev/null; then
    echo "skip [mix]: kill -9 points (a Release build has no test hooks)"
    points=()
  fi
  for point in "${points[@]}"; do
    d=k-${point/:/-}
    TOKSHARD_TEST_CKPT_STOP=$point "$TRAIN" "${X[@]}" --out "$d" "${M[@]}" "${F[@]}" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 600); do [[ $(ps -o stat= -p $pid) == T* ]] && break; sleep 0.05; done
    [[ $(ps -o stat= -p $pid) == T* ]] || { fail "$point: never stopped"; kill -9 $pid; wait $pid; continue; }
    kill -9 $pid
    wait $pid 2>/dev/null
    expect 0 "killed -9 at $point: resume latest ($(ls "$d/checkpoints" | grep -E '^step-[0-9]+$' | tail -1))" -- \
      "$TRAIN" "${X[@]}" --out "$d" "${M[@]}" "${F[@]}" --resume latest
    if [[ "$(grep -o '"step": [0-9]*, "loss": [^,]*' ref/metrics.jsonl)" == \
          "$(grep -o '"step": [0-9]*, "loss": [^,]*' "$d/metrics.jsonl")" ]]; then
      ok "killed at $point: the 10 losses are the uninterrupted run's"
    else
      fail "killed at $point: losses differ"
    fi
    cmp -s ref/checkpoints/step-00000010/model.safetensors "$d/checkpoints/step-00000010/model.safetensors" &&
      ok "killed at $point: final weights byte-identical" || fail "killed at $point: final weights differ"
  done
  python3 - ref/checkpoints/step-00000005/trainer_state.json <<'EOF' && ok "trainer_state.json holds the cursor per source and the blend position" ||
import json, sys
m = json.load(open(sys.argv[1]))["mix"]
c = m["cursor"]
assert c["sample"] == 40 and sum(c["count"]) == 40 and c["count"] == c["phase_count"], c
assert [s["name"] for s in m["sources"]] == ["a", "b", "c"] and m["schedule"][0]["step"] == 6, m
EOF
    fail "trainer_state.json: $(grep -A12 '"mix"' ref/checkpoints/step-00000005/trainer_state.json)"
  # a resume that changes the mixture: sources refused; the schedule only with
  # --change-schedule, and only for steps not yet trained
  expect 2 "resume with another source list" -- "$TRAIN" --dataset a=src-a:0.5 --dataset b=src-b:0.5 \
    --out ref --steps 10 "${M[@]}" --doc-mask --resume ref/checkpoints/step-00000005
  expect_msg "trained on the sources a, b, c"
  expect 2 "resume with another schedule" -- "$TRAIN" "${X[@]:0:6}" --mix-at 7:a=1,c=3 --out ref --steps 10 \
    "${M[@]}" --doc-mask --resume ref/checkpoints/step-00000005
  expect_msg "schedule differ from the checkpoint .*--change-schedule"
  expect 2 "resume changing a step already trained" -- "$TRAIN" "${X[@]:0:6}" --mix-at 3:a=1 --out ref --steps 10 \
    "${M[@]}" --doc-mask --change-schedule --resume ref/checkpoints/step-00000005
  expect_msg "steps already trained cannot change their mixture"
  expect 2 "resume without --doc-mask" -- "$TRAIN" "${X[@]}" --out ref --steps 10 "${M[@]}" \
    --resume ref/checkpoints/step-00000005
  expect_msg "was trained with --doc-mask: resume with it"
  mkdir -p moved && expect 0 "a future change with --change-schedule" -- "$TRAIN" "${X[@]}" --mix-at 8:b=1 \
    --out moved --steps 10 "${M[@]}" --doc-mask --change-schedule --resume ref/checkpoints/step-00000005
  expect 0 "sample-plan --run follows the new schedule" -- "$TKS" sample-plan --run moved --steps 7:9
  [[ $(grep -c "^step 9 .* source b " "$W/out") -eq 8 && $(grep -c "^step 7 .* source b " "$W/out") -eq 0 ]] &&
    ok "step 7 reads no b, step 9 only b, as the changed schedule says" || fail "plan: $(grep '^step [79] ' "$W/out" | head -4)"
  ;;
eval)
  # --eval-only: a checkpoint's loss on validation windows without training.
  # With the training's own flags it is the training's final validation
  # line, bit for bit; other packings and document flags give their own.
  # val_of FILE KEY: the last evaluation's KEY (a number, or a JSON object) in FILE
  val_of() { python3 -c 'import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][-1][sys.argv[2]]))' "$1" "$2"; }
  expect 0 "train 6 steps" -- "$TRAIN" --dataset "$S/data" --out run --steps 6 "${M[@]}" --eval-every 3
  C=run/checkpoints/step-00000006
  want=$(val_of run/metrics.jsonl val_loss)
  expect 0 "--eval-only with the training's flags" -- "$TRAIN" --dataset "$S/data" --eval-only --resume $C "${M[@]}"
  grep '^{' "$W/out" >ev.json
  [[ $(val_of ev.json val_loss) == "$want" ]] && ok "the training's final validation loss: $want" ||
    fail "--eval-only gives $(val_of ev.json val_loss), the training $want"
  grep -Eq "^checkpoint $C \(step 6\): validation loss $want; packing concat, --doc-mask off" "$W/out" &&
    grep -Eq "^  data: $want on 32 of its 127 validation windows \(1024 targets\)" "$W/out" &&
    ok "the summary names the settings and the windows" || fail "summary: $(cat "$W/out")"
  [[ $(ls | grep -vx -e err -e out | tr '\n' ' ') == "ev.json run " ]] && ok "nothing written" ||
    fail "written: $(ls | tr '\n' ' ')"
  # the checkpoint's settings are taken: without the sampling flags, the same loss
  expect 0 "--eval-only with the model flags only" -- "$TRAIN" --dataset "$S/data" --eval-only --resume $C \
    --micro-batch 4 --threads 2
  [[ $(grep '^{' "$W/out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["val_loss"]))') == "$want" ]] &&
    ok "seq-len, global batch and val-tokens from the checkpoint" || fail "$(cat "$W/out")"
  # each packing and document setting its own number, each finite (with the
  # mask, --reset-positions changes only rounding: RoPE scores depend on
  # distances inside a document, docs/SAMPLING.md section 3)
  declare -A got
  for mode in "concat" "concat --doc-mask" "best-fit" "best-fit --doc-mask" "best-fit --doc-mask --reset-positions"; do
    read -r -a f <<<"--packing $mode"
    expect 0 "--eval-only $mode" -- "$TRAIN" --dataset "$S/data" --eval-only --resume $C "${M[@]}" "${f[@]}"
    got[$mode]=$(grep '^{' "$W/out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["val_loss"]))')
  done
  [[ ${got[concat]} == "$want" ]] && ok "--packing concat is the default" || fail "concat ${got[concat]} vs $want"
  n=$(printf '%s\n' "${got[concat]}" "${got[concat --doc-mask]}" "${got[best-fit]}" "${got[best-fit --doc-mask]}" |
    sort -u | grep -c '^[0-9]')
  [[ $n -eq 4 ]] && ok "4 settings, 4 losses: ${got[concat]} ${got[concat --doc-mask]} ${got[best-fit]} ${got[best-fit --doc-mask]}" ||
    fail "losses: $(for k in "${!got[@]}"; do printf '%s=%s ' "$k" "${got[$k]}"; done)"
  awk -v a="${got[best-fit --doc-mask]}" -v b="${got[best-fit --doc-mask --reset-positions]}" \
    'BEGIN {d = a - b; exit !(d < 1e-4 && d > -1e-4)}' && ok "--reset-positions under the mask: the same loss to rounding" ||
    fail "--reset-positions under the mask: ${got[best-fit --doc-mask --reset-positions]} vs ${got[best-fit --doc-mask]}"
  # the windows an evaluation reads are spread over the split, not its first
  # ones: a best-fit plan numbers its windows longest documents first, so its
  # first 32 are full windows of one long document each (1024 targets, and
  # --doc-mask changes nothing there); spread, they hold short documents too
  expect 0 "--eval-only best-fit: which windows" -- "$TRAIN" --dataset "$S/data" --eval-only --resume $C "${M[@]}" \
    --packing best-fit
  t=$(grep '^{' "$W/out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["targets"]["data"])')
  [[ $t -lt 1000 ]] && ok "best-fit: the 32 windows evaluated hold $t targets (padding after whole documents)" ||
    fail "best-fit: the 32 windows evaluated hold $t targets: only full windows"
  # a run trained with best-fit and --doc-mask: its own flags give its final line
  expect 0 "train 4 steps best-fit --doc-mask" -- "$TRAIN" --dataset "$S/data" --out bf --steps 4 "${M[@]}" \
    --packing best-fit --doc-mask
  expect 0 "--eval-only of it, its flags" -- "$TRAIN" --dataset "$S/data" --eval-only --resume bf/checkpoints/step-00000004 \
    "${M[@]}" --packing best-fit --doc-mask
  [[ $(grep '^{' "$W/out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["val_loss"]))') == \
     "$(val_of bf/metrics.jsonl val_loss)" ]] && ok "best-fit: the training's final validation loss" ||
    fail "best-fit: $(grep '^{' "$W/out") vs $(val_of bf/metrics.jsonl val_loss)"
  # a mixture: the loss per source and the weighted mean, as the training's last line
  head -c 900000 "$S/gcide.txt" | tail -c 300000 >b.txt
  expect 0 "a second source with the same tokenizer" -- "$TKS" build -q --tokenizer "$S/tok.model" --output src-b \
    --doc-split blank-line --append-eos b.txt
  X=(--dataset a="$S/data":0.7 --dataset b=src-b:0.3)
  expect 0 "train a mixture 4 steps" -- "$TRAIN" "${X[@]}" --out mix --steps 4 "${M[@]}" --doc-mask
  expect 0 "--eval-only of the mixture" -- "$TRAIN" "${X[@]}" --eval-only --resume mix/checkpoints/step-00000004 \
    "${M[@]}" --doc-mask
  grep '^{' "$W/out" >evm.json
  [[ $(val_of evm.json val_loss) == "$(val_of mix/metrics.jsonl val_loss)" &&
     $(val_of evm.json val_loss_by_source) == "$(val_of mix/metrics.jsonl val_loss_by_source)" ]] &&
    ok "the mixture's mean and per-source losses: $(val_of evm.json val_loss_by_source)" ||
    fail "mixture: $(cat evm.json) vs $(grep val_loss mix/metrics.jsonl | tail -1)"
  grep -q "validation loss .* (weighted mean)" "$W/out" && grep -q "^  a: " "$W/out" && grep -q "^  b: " "$W/out" &&
    ok "a line per source" || fail "$(cat "$W/out")"
  # refusals
  expect 2 "--eval-only without --resume" -- "$TRAIN" --dataset "$S/data" --eval-only "${M[@]}"
  expect_msg "--eval-only needs --resume CHECKPOINT"
  expect 2 "--eval-only on a dataset of another tokenizer" -- "$TRAIN" --dataset "$S/data2" --eval-only --resume $C "${M[@]}"
  expect_msg "trained with tokenizer"
  expect 2 "--eval-only without validation windows" -- "$TRAIN" --dataset "$S/data" --eval-only --resume $C \
    "${M[@]}" --val-tokens 0
  expect_msg "--eval-only: there are no validation windows"
  ;;
*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac
finish test_train

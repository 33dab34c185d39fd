#!/usr/bin/env bash
# Hostile input and misuse (each case fails when its fix is reverted):
#   plot      a run directory with shell metacharacters: gnuplot runs without a shell
#   output    --output inside an input (or an input inside it) is refused before any write
#   truncate  an input cut while the build reads it fails the build, naming it
#   promise   x.gz / x.zst whose bytes are not compressed: refused, or skipped and listed
#   fifo      a FIFO input without a writer ends on SIGTERM; a FIFO shard or tokenizer is refused at once
#   ranks     mpirun ranks launched with different flags or datasets stop before step 1
#   resume    a later checkpoint in the way, metrics.jsonl after resumes, --steps and the schedule
#   generate  a prompt longer than the context, and generation past it; --min-tokens above --max-tokens
#   paths     sample-plan --run from another directory; a missing --dataset names no .partial
#   messages  numeric flags out of range; inputs without text; a file given twice; empty files
#   notok     a dataset imported without a tokenizer: train, export-hf (beside a user's DIR.tmp),
#             cat, inspect, generate
#   stop      SIGTERM (timeout -s TERM 1) while the reader is inside one document (/dev/zero, a sparse file of
#             64 GB, JSON Lines from /dev/zero): exit 130 within seconds, --resume named, nothing published;
#             the same TERM delivered twice: the clean stop with its message, not a silent exit
#   publish   a kill at each step of publishing (manifest written, units cleaned, the state
#             removed, the rename) and an OUT made while the build ran: --resume publishes the
#             complete dataset, byte-identical; the same for import; a build that finds no text
#             leaves no OUT.partial behind
#   unicode   code points the byte-level encoder's Unicode leaves unassigned: counted in the
#             manifest (also across a kill and --resume), shown by inspect and audit, a warning
#             on stderr under --quiet
#   smaller   --help after a command; cat escapes control characters; a generate prompt not UTF-8; Megatron/llm.c files named; a Megatron header's huge
#             counts and negative pointers as they are; llm.c export over --append-eos warns
#   links     links planted at predictable names (OUT.lock, RUN/run.lock, RUN/metrics.jsonl, the plot's temporary
#             file) are never written through: refused naming the file, or not used; their targets unchanged
#   cache     a tokenizer cache directory others may write (or another user's) is left unused and the build says
#             why once; a cached and a parsed tokenizer give the same manifest, which records the tables' digest
# Usage: test_hostile.sh BIN_DIR WORKDIR CASE (WORKDIR/setup from test_build.sh setup)
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
TKS=$BIN/tokshard
TRAIN=$BIN/tokshard-train
CASE=$3
T=$2/setup
W=$2/hostile-$CASE
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2
[[ -r $T/bpe.model ]] || { fail "no $T/bpe.model (run through ctest: build_setup)"; finish test_hostile; }
B=(--tokenizer "$T/bpe.model" --doc-split blank-line --shard-tokens 100K)
TINY=(--dim 32 --n-layers 1 --n-heads 2 --n-kv-heads 1 --seq-len 32 --global-batch 4 --eval-every 0 --no-plot --quiet)

case $CASE in
plot)
  # a run directory whose name closes a shell quote and runs a command
  d="tr/a';touch INJECTED;'"
  mkdir -p "$d" && cd tr || exit 2
  d="a';touch INJECTED;'"
  printf '%s\n' '{"step": 1, "loss": 7.0, "lr": 1e-3}' '{"step": 2, "loss": 6.5, "lr": 1e-3}' \
    '{"step": 2, "val_loss": 6.6}' '{"step": 3, "loss": 6.1, "lr": 1e-3}' '{"step": 4, "lo' >"$d/metrics.jsonl"
  expect 0 "--plot on a quoted run directory" -- "$TRAIN" --plot "$d"
  [[ ! -e INJECTED ]] && ok "no command ran from the path" || fail "the path's command ran (INJECTED exists)"
  grep -q '<svg' "$d/loss.svg" 2>/dev/null && ok "loss.svg drawn" || fail "no loss.svg in $d"
  [[ ! -e $d/loss.svg.tmp ]] && ok "no temporary left" || fail "loss.svg.tmp left"
  mkdir -p "carol's run" && cp "$d/metrics.jsonl" "carol's run/"
  expect 0 "--plot on \"carol's run\"" -- "$TRAIN" --plot "carol's run"
  mkdir -p empty
  expect 2 "--plot without metrics.jsonl" -- "$TRAIN" --plot empty
  expect_msg "empty/metrics.jsonl"
  ;;

output)
  mkdir in && cp "$T/gcide.txt" in/
  expect 2 "output inside the input directory" -- "$TKS" build "${B[@]}" --output in/ds in
  expect_msg "inside the input in"
  [[ ! -e in/ds.lock && ! -e in/ds.partial && ! -e in/ds ]] && ok "nothing written inside the input" ||
    fail "left in the input: $(ls in)"
  expect 2 "output given through another spelling of the input" -- "$TKS" build "${B[@]}" --output ./in/../in/ds "$PWD/in"
  expect 2 "an input inside OUT.partial" -- "$TKS" build "${B[@]}" --output in in/gcide.txt
  expect_msg "around the input"
  expect 0 "output beside the input" -- "$TKS" build -q "${B[@]}" --output ds in
  ;;

truncate)
  [[ -n ${TKS_FAULT_LIB:-} && -r $TKS_FAULT_LIB ]] || { fail "TKS_FAULT_LIB not set (run through ctest)"; finish test_hostile; }
  cp "$T/gcide.txt" big.txt
  size=$(stat -c %s big.txt)
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_TRUNCATE=/big.txt:$((size / 3)) \
    expect 2 "an input cut to a third when it is opened" -- "$TKS" build -q "${B[@]}" --output ds "$PWD/big.txt"
  expect_msg "big.txt changed while it was read: $size bytes when listed, $((size / 3)) read"
  [[ ! -e ds ]] && ok "no dataset published" || fail "a dataset was published from a cut input"
  # the same through gzip (the compressed bytes are cut)
  cp "$T/gcide.txt" big2.txt && gzip -f big2.txt
  size=$(stat -c %s big2.txt.gz)
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_TRUNCATE=/big2.txt.gz:$((size / 2)) \
    expect 2 "a gzip input cut when it is opened" -- "$TKS" build -q "${B[@]}" --output ds2 "$PWD/big2.txt.gz"
  expect_msg "big2.txt.gz"
  [[ ! -e ds2 ]] && ok "no dataset published" || fail "a dataset was published from a cut gzip"
  ;;

promise)
  head -c 200000 "$T/gcide.txt" >text.txt
  cp text.txt notgz.gz && cp text.txt text.zst && gzip -c text.txt >real.gz
  printf 'BZh91AY&SY' >bz.gz
  expect 2 "text named .gz" -- "$TKS" build -q "${B[@]}" --output a notgz.gz real.gz
  expect_msg "notgz.gz is named .gz \(gzip\) but starts with text"
  expect 2 "text named .zst" -- "$TKS" build -q "${B[@]}" --output a real.gz text.zst
  expect_msg "text.zst is named .zst \(zstd\)"
  expect 2 "bzip2 named .gz" -- "$TKS" build -q "${B[@]}" --output a bz.gz
  expect_msg "bz.gz is named .gz \(gzip\) but starts with bzip2 data"
  [[ ! -e a && ! -e a.partial ]] && ok "nothing written" || fail "a or a.partial exists"
  expect 0 "--on-bad-input skip" -- "$TKS" build "${B[@]}" --on-bad-input skip --output a notgz.gz real.gz text.zst
  grep -q "bad inputs    2 files left out" "$W/out" && grep -q "^notgz.gz: named .gz" "$W/out" &&
    grep -q "^text.zst: named .zst" "$W/out" && ok "the summary names both skipped files" ||
    fail "summary: $(grep -A3 'bad inputs' "$W/out")"
  python3 -c "import json,sys; p=json.load(open('a/manifest.json'))['provenance']; sys.exit(len(p['skipped_inputs'])!=2)" &&
    ok "the manifest lists the skipped files" || fail "manifest provenance.skipped_inputs"
  expect 0 "the good file alone" -- "$TKS" build -q "${B[@]}" --output b real.gz
  cmp -s a/shard-00000.tks b/shard-00000.tks && ok "skipping leaves the good file's shards as they are" ||
    fail "shards differ from a build of the good file alone"
  # a file that starts with Parquet's magic under another name (never read
  # as text) is decided with the listing, like the names above: refused before
  # any unit is written wherever it is in the inputs (named, or found in a
  # directory, after files of earlier units), and left out under skip
  mkdir -p tree && cp text.txt tree/a-first.txt && printf 'PAR1 and then no Parquet at all\n' >tree/b-table.dat
  cp text.txt tree/c-last.txt
  for args in "tree" "text.txt tree/b-table.dat"; do
    rm -rf pq pq.partial
    # shellcheck disable=SC2086 # two ways to give the inputs
    expect 2 "a Parquet magic in $args (units of 64K)" -- "$TKS" build -q "${B[@]}" --unit-bytes 64K --output pq $args
    expect_msg "tree/b-table.dat: starts with PAR1, the magic of a Parquet file.*--on-bad-input skip"
    [[ ! -e pq && ! -e pq.partial ]] && ok "refused before any unit was written" || fail "left: $(ls -d pq* 2>/dev/null)"
  done
  expect 0 "the same with --on-bad-input skip" -- "$TKS" build "${B[@]}" --unit-bytes 64K --on-bad-input skip --output pq tree
  grep -q "bad inputs    1 files left out" "$W/out" && grep -q "^tree/b-table.dat: starts with PAR1" "$W/out" &&
    ok "skip leaves it out and lists it" || fail "summary: $(grep -A2 'bad inputs' "$W/out")"
  python3 -c "import json,sys; p=json.load(open('pq/manifest.json'))['provenance']; sys.exit(p['skipped_inputs'] != ['tree/b-table.dat: starts with PAR1, the magic of a Parquet file, and only files named *.parquet are read as Parquet (never as text): rename it to *.parquet, or remove it from the inputs'])" &&
    ok "the manifest lists it" || fail "manifest skipped_inputs: $(grep -o '"skipped_inputs[^]]*' pq/manifest.json)"
  ;;

fifo)
  mkfifo never
  "$TKS" build -q "${B[@]}" --output f never "$T/gcide.txt" >/dev/null 2>"$W/err" &
  pid=$!
  sleep 1
  kill -TERM $pid
  for _ in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then
    fail "the build waiting on a FIFO ignored SIGTERM for 5 s"
    kill -9 $pid
  fi
  wait $pid
  code=$?
  [[ $code -eq 130 ]] && ok "SIGTERM ends a build waiting on a FIFO (exit 130)" || fail "exit $code after SIGTERM"
  expect_msg "interrupted while waiting for never"
  # a FIFO with a writer is read as before
  mkfifo piped
  (timeout 60 cat "$T/gcide.txt" >piped &)
  expect 0 "a FIFO with a writer" -- "$TKS" build -q "${B[@]}" --output p piped
  # a FIFO in place of a shard: every reader refuses it at once
  expect 0 "reference dataset" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  rm ds/shard-00001.tks && mkfifo ds/shard-00001.tks
  for cmd in audit cat inspect; do
    timeout 20 "$TKS" $cmd ds >"$W/out" 2>"$W/err"
    code=$?
    [[ $code -eq 1 || $code -eq 2 ]] && cat "$W/out" "$W/err" | grep -q "shard-00001.tks is a FIFO, not a regular file" &&
      ok "$cmd refuses a FIFO shard (exit $code)" || fail "$cmd on a FIFO shard: exit $code: $(tail -c 300 "$W/err")"
  done
  timeout 60 "$TRAIN" --dataset ds --out run "${TINY[@]}" --steps 2 >/dev/null 2>"$W/err"
  code=$?
  [[ $code -eq 2 ]] && grep -q "is a FIFO" "$W/err" && ok "tokshard-train refuses a FIFO shard" ||
    fail "tokshard-train on a FIFO shard: exit $code: $(tail -c 300 "$W/err")"
  # a FIFO (no writer) given as the tokenizer: refused at once, never waited on
  mkfifo tok.fifo
  for cmd in build verify-tokenizer; do
    args=(--tokenizer tok.fifo --output t "$T/gcide.txt")
    [[ $cmd == verify-tokenizer ]] && args=(tok.fifo "$T/gcide.txt")
    timeout 20 "$TKS" $cmd "${args[@]}" >"$W/out" 2>"$W/err"
    code=$?
    [[ $code -eq 1 || $code -eq 2 ]] && grep -q "tokenizer tok.fifo is a FIFO, not a regular file" "$W/err" &&
      ok "$cmd refuses a FIFO tokenizer at once (exit $code)" ||
      fail "$cmd on a FIFO tokenizer: exit $code (124: it waited): $(tail -c 300 "$W/err")"
  done
  ;;

ranks)
  expect 0 "dataset A" -- "$TKS" build -q "${B[@]}" --output A "$T/gcide.txt"
  expect 0 "dataset B (same text, with EOS)" -- "$TKS" build -q "${B[@]}" --append-eos --output B "$T/gcide.txt"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  [[ -n ${ASAN_OPTIONS:-} ]] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
  MPI=(timeout 300 mpirun --oversubscribe)
  expect 2 "ranks with different --lr" -- "${MPI[@]}" -np 1 "$TRAIN" --dataset A --out r1 "${TINY[@]}" --steps 2 --lr 1e-3 \
    : -np 1 "$TRAIN" --dataset A --out r1 "${TINY[@]}" --steps 2 --lr 2e-3
  expect_msg "different settings: --lr is 0.001 on rank 0 but 0.002 on rank 1"
  [[ ! -d r1/checkpoints/step-00000001 && ! -d r1/checkpoints/step-00000002 ]] && ok "no step trained" ||
    fail "a checkpoint was written"
  expect 2 "ranks with different datasets" -- "${MPI[@]}" -np 1 "$TRAIN" --dataset A --out r2 "${TINY[@]}" --steps 2 \
    : -np 1 "$TRAIN" --dataset B --out r2 "${TINY[@]}" --steps 2
  expect_msg "--dataset \(manifest XXH3\) is [0-9a-f]{16} on rank 0 but [0-9a-f]{16} on rank 1"
  expect 0 "ranks with the same settings" -- "${MPI[@]}" -np 2 "$TRAIN" --dataset A --out r3 "${TINY[@]}" --steps 2
  ;;
resume)
  expect 0 "dataset" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  R=(--dataset ds "${TINY[@]}" --steps 8 --save-every 2)
  expect 0 "8 steps, a checkpoint every 2" -- "$TRAIN" --out run "${R[@]}"
  # item 10: after a resume from step 4, each step appears once in metrics.jsonl
  cp -r run r2 && rm -r r2/checkpoints/step-0000000{6,8}
  expect 0 "resume from step 4 (steps 5..8 again)" -- "$TRAIN" --out r2 "${R[@]}" --resume latest
  n=$(grep -c '"loss"' r2/metrics.jsonl)
  dup=$(grep -o '"step": [0-9]*, "loss"' r2/metrics.jsonl | sort | uniq -d | head -1)
  [[ $n -eq 8 && -z $dup ]] && ok "metrics.jsonl: 8 training lines, no step twice" ||
    fail "metrics.jsonl: $n training lines, duplicate: $dup"
  cmp -s <(grep '"loss"' run/metrics.jsonl | sed 's/"tokens_per_s.*//') <(grep '"loss"' r2/metrics.jsonl | sed 's/"tokens_per_s.*//') &&
    ok "the resumed curve equals the uninterrupted one" || fail "the resumed metrics differ"
  printf '{"step": 9, "lo' >>r2/metrics.jsonl   # a line cut by kill -9
  # item 9: resuming step 4 while step 6 (damaged) is still there
  cp -r run r3
  printf 'x' | dd of=r3/checkpoints/step-00000006/model.safetensors bs=1 seek=100 conv=notrunc 2>/dev/null
  expect 2 "resume from step 4 with step 6 in the way" -- "$TRAIN" --out r3 "${R[@]}" --resume r3/checkpoints/step-00000004
  expect_msg "step-00000006 is newer than the checkpoint this run resumes from .*step 4.*move it"
  [[ $(grep -c '"loss"' r3/metrics.jsonl) -eq 8 ]] && ok "nothing trained, metrics untouched" || fail "r3 metrics changed"
  expect 2 "a new run into a directory with checkpoints" -- "$TRAIN" --out run "${R[@]}"
  expect_msg "run/checkpoints/step-[0-9]{8} exists: .*--resume latest"
  # item 11: --steps below the checkpoint, and a changed schedule
  expect 2 "--steps 6 on a run at step 8" -- "$TRAIN" --out run "${R[@]}" --steps 6 --resume latest
  expect_msg "is at step 8, past --steps 6"
  expect 2 "--steps 12 changes the schedule" -- "$TRAIN" --out run "${R[@]}" --steps 12 --resume latest
  expect_msg "trained with --steps 8 .*asks for --steps 12.*--change-schedule"
  # inside the warmup (20 steps) a longer --steps changes no rate: said so,
  # not "would be 0.00135 instead of 0.00135"
  expect_msg "gives each step from 9 on the learning rate the checkpoint's schedule gives it"
  expect 2 "--lr changes the schedule" -- "$TRAIN" --out run "${R[@]}" --lr 1e-2 --resume latest --steps 10
  expect_msg "asks for --steps 10 --lr 0.01.*the learning rate would change from step 9 on \(0.0045 instead of 0.00135\)"
  # a rate that differs in the 7th digit is printed to the digits that tell
  # the two apart
  expect 0 "4 steps of a 1000-step schedule" -- "$TRAIN" --dataset ds --out long "${TINY[@]}" --steps 1000 \
    --warmup 2 --stop-at 4
  expect 2 "--steps 1001" -- "$TRAIN" --dataset ds --out long "${TINY[@]}" --steps 1001 --warmup 2 --resume latest
  expect_msg "the learning rate would change from step 5 on \(0.0029999[0-9]* instead of 0.0029999[0-9]*\)"
  read -r a b < <(sed -n 's/.*from step 5 on (\([0-9.e-]*\) instead of \([0-9.e-]*\)).*/\1 \2/p' "$W/err")
  [[ -n $a && $a != "$b" ]] && ok "the two rates differ as printed: $a and $b" || fail "rates printed alike: '$a' '$b'"
  expect 0 "--change-schedule extends the run" -- "$TRAIN" --out run "${R[@]}" --steps 10 --resume latest --change-schedule
  [[ $(grep -c '"loss"' run/metrics.jsonl) -eq 10 ]] && ok "10 steps in metrics.jsonl" || fail "$(grep -c loss run/metrics.jsonl) lines"
  ;;

generate)
  GEN=$BIN/tokshard-generate
  expect 0 "dataset" -- "$TKS" build -q "${B[@]}" --append-eos --output ds "$T/gcide.txt"
  expect 0 "a model with a 32-token context" -- "$TRAIN" --dataset ds --out run "${TINY[@]}" --max-seq-len 32 --steps 2
  long=$(head -c 3000 "$T/gcide.txt" | tr '\n' ' ')
  expect 0 "a prompt of ~3000 bytes" -- "$GEN" --checkpoint run --prompt "$long" --max-tokens 5 --temperature 0 --seed 3
  expect_msg "the prompt is [0-9]+ tokens and the model's context 32: its first [0-9]+ tokens were left out"
  gen=$(tail -c +$((${#long} + 1)) "$W/out" | tr -d '\n')
  [[ -n $gen ]] && ok "text generated after the long prompt: '$gen'" || fail "nothing generated after a long prompt"
  expect 0 "100 tokens from a 32-token context" -- "$GEN" --checkpoint run --prompt "Abandon" --max-tokens 100 --temperature 1 --top-p 1 --seed 5
  if grep -q "filled" "$W/err"; then
    expect_msg "the context \(32 tokens\) filled [0-9]+ time\(s\)"
    [[ $(wc -c <"$W/out") -gt 60 ]] && ok "generation went past the context" || fail "output: $(cat "$W/out")"
  else
    ok "generation ended at an EOS before the context filled: $(wc -c <"$W/out") bytes"
  fi
  # --min-tokens above --max-tokens can never be met: refused, naming both
  expect 2 "--min-tokens above --max-tokens" -- "$GEN" --checkpoint run --prompt "Abandon" --min-tokens 50 \
    --max-tokens 10
  expect_msg "--min-tokens 50 is above --max-tokens 10: .*give --min-tokens at most 10"
  [[ ! -s $W/out ]] && ok "nothing generated" || fail "stdout: $(cat "$W/out")"
  mkdir bad && cp -r run/checkpoints/step-00000002 bad/ && rm bad/step-00000002/model.safetensors
  expect 2 "a damaged checkpoint prints nothing on stdout" -- "$GEN" --checkpoint bad/step-00000002 --prompt "Abandon"
  [[ ! -s $W/out ]] && ok "stdout empty" || fail "stdout: $(cat "$W/out")"
  ;;

paths)
  mkdir -p a/b && cd a/b || exit 2
  expect 0 "dataset" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  expect 0 "a run" -- "$TRAIN" --dataset ds --out run "${TINY[@]}" --steps 2
  cd "$W" || exit 2
  expect 0 "sample-plan --run from another directory" -- "$TKS" sample-plan --run a/b/run --steps 3
  expect 2 "tokshard-train with a missing --dataset" -- "$TRAIN" --dataset nowhere --out x "${TINY[@]}" --steps 2
  expect_msg "dataset nowhere does not exist"
  grep -q partial "$W/err" && fail "the message mentions a .partial that does not exist" || ok "no .partial mentioned"
  expect 2 "a missing --val-dataset" -- "$TRAIN" --dataset a/b/ds --val-dataset nowhere --out x "${TINY[@]}" --steps 2
  expect_msg "dataset nowhere does not exist"
  mkdir -p inprog.partial
  expect 2 "a dataset whose build is in progress" -- "$TRAIN" --dataset inprog --out x "${TINY[@]}" --steps 2
  expect_msg "inprog.partial.*--resume"
  ;;
messages)
  expect 2 "--lr -1" -- "$TRAIN" --dataset x --out y --lr -1
  expect_msg "--lr -1: expected a number in range \(0 < F <= 1e\+30\)"
  expect 2 "--beta2 1" -- "$TRAIN" --dataset x --out y --beta2 1
  expect_msg "\(0 <= F < 1\)"
  expect 2 "--steps 0" -- "$TRAIN" --dataset x --out y --steps 0
  expect_msg "--steps 0: expected a whole number in range \(N >= 1\)"
  expect 0 "--help" -- "$TRAIN" --help
  grep -q -- "--lr F .*(0 < F <= 1e+30)" "$W/out" && grep -q -- "--device NAME" "$W/out" &&
    grep -q -- "--dataset DIR" "$W/out" && ok "--help shows ranges and metavariables" ||
    fail "--help: $(grep -E -- '--(lr|device|dataset) ' "$W/out")"
  : >empty.txt
  expect 2 "train-tokenizer on an empty file" -- "$TKS" train-tokenizer --output e --vocab-size 100 empty.txt
  expect_msg "no non-empty line to train on: 1 files"
  grep -q trainer_interface "$W/err" && fail "sentencepiece's assertion shown" || ok "no sentencepiece assertion"
  printf '\xff\xfe one\n\xc3 two\n\xe2\x82 three\n' >invalid.txt
  expect 2 "build with every document invalid under --invalid-utf8 skip" -- "$TKS" build "${B[@]}" --doc-split line \
    --invalid-utf8 skip --output inv invalid.txt
  expect_msg "no document with text: 1 files, 1 entries, 0 documents kept; left out: 0 empty, 3 invalid UTF-8"
  expect 2 "train-tokenizer, the same" -- "$TKS" train-tokenizer --output e --vocab-size 100 --doc-split line \
    --invalid-utf8 skip invalid.txt
  expect_msg "3 invalid UTF-8"
  head -c 100000 "$T/gcide.txt" >g.txt
  expect 2 "the same file twice" -- "$TKS" build "${B[@]}" --output twice g.txt g.txt
  expect_msg "g.txt is the same file as g.txt, listed earlier"
  mkdir -p d && cp g.txt d/ && ln d/g.txt hard.txt
  expect 2 "a directory and a hard link to a file in it" -- "$TKS" build "${B[@]}" --output twice d hard.txt
  expect_msg "hard.txt is the same file as d/g.txt"
  # directories that overlap: named twice, with a subdirectory, with a link to
  # it; every file reached counts, not only the named ones
  mkdir -p d/sub && cp g.txt d/sub/h.txt && ln -sfn d dlink
  expect 2 "a directory named twice" -- "$TKS" build "${B[@]}" --output twice d d
  expect_msg "d/g.txt is the same file as d/g.txt, listed earlier.*overlap"
  expect 2 "a directory and its subdirectory" -- "$TKS" build "${B[@]}" --output twice d d/sub
  expect_msg "d/sub/h.txt is the same file as d/sub/h.txt"
  expect 2 "a directory and a symlink to it" -- "$TKS" build "${B[@]}" --output twice d dlink
  expect_msg "dlink/g.txt is the same file as d/g.txt"
  # the overlap named is the first file in input order that repeats one, not
  # the one whose inode sorts first: two files whose names sort opposite to
  # their inode numbers
  mkdir -p ord && cp g.txt ord/one && cp g.txt ord/two
  if [[ $(stat -c %i ord/one) -gt $(stat -c %i ord/two) ]]; then mv ord/one ord/a.txt && mv ord/two ord/b.txt
  else mv ord/two ord/a.txt && mv ord/one ord/b.txt; fi
  expect 2 "a directory named twice, its names against its inode order" -- "$TKS" build "${B[@]}" --output twice ord ord
  expect_msg "ord/a.txt is the same file as ord/a.txt, listed earlier"
  expect 2 "a file, then its directory" -- "$TKS" build "${B[@]}" --output twice ord/b.txt ord
  expect_msg "ord/b.txt is the same file as ord/b.txt, listed earlier"
  # inside one directory, hard links are the tree's own layout: read as they are
  ln d/g.txt d/g-again.txt
  expect 0 "a directory holding two hard links to one file" -- "$TKS" build -q "${B[@]}" --output once d
  rm -f d/g-again.txt
  [[ ! -e twice && ! -e twice.partial ]] && ok "nothing written for the overlapping inputs" || fail "twice written"
  # a file whose name is not UTF-8 (Latin-1 "café.txt") in an input tree: the
  # build records the name losslessly (\xNN) and the dataset audits clean
  mkdir -p lat && cp g.txt "lat/$(printf 'caf\xe9.txt')" && cp g.txt lat/plain.txt
  expect 0 "a tree holding a Latin-1 file name" -- "$TKS" build -q "${B[@]}" --output latds lat
  grep -qF '"path": "lat/caf\\xe9.txt"' latds/manifest.json && ok "the manifest names it lat/caf\\xe9.txt" ||
    fail "manifest inputs: $(grep -o '"path": "[^"]*"' latds/manifest.json | head -3)"
  expect 0 "its audit" -- "$TKS" audit latds
  # a symlink in an input tree that leads outside the named paths is followed
  # (useful) but counted in the summary and the manifest; --no-follow-links
  # leaves every link found in a tree out
  mkdir -p lnk/t lnk/elsewhere && cp g.txt lnk/elsewhere/out.txt && cp g.txt lnk/t/in.txt
  ln -sfn ../elsewhere/out.txt lnk/t/to-outside.txt
  expect 0 "a tree with a link leading outside it" -- "$TKS" build "${B[@]}" --output lk1 lnk/t
  grep -q "links         1 files read through a symbolic link that leaves the named paths" "$W/out" &&
    grep -q '"links_outside": 1' lk1/manifest.json && ok "the link leading outside is counted (summary, manifest)" ||
    fail "links_outside: $(grep -i link "$W/out") $(grep -o '"links_[a-z]*": [0-9]*' lk1/manifest.json)"
  expect 0 "the same tree with --no-follow-links" -- "$TKS" build "${B[@]}" --no-follow-links --output lk2 lnk/t
  grep -q '"links_skipped": 1' lk2/manifest.json && grep -q '"no_follow_links": true' lk2/manifest.json &&
    ok "--no-follow-links left the link out and says so" || fail "lk2: $(grep -o '"links_[a-z]*": [0-9]*' lk2/manifest.json)"
  # a dangling symlink in an input tree: named as such; --on-bad-input skip
  # leaves it out and lists it (summary and manifest) instead of failing
  mkdir -p dang && cp g.txt dang/ && ln -sfn nowhere.txt dang/broken.txt
  expect 2 "a tree with a dangling symlink" -- "$TKS" build "${B[@]}" --output dg dang
  expect_msg "dang/broken.txt is a symbolic link to a missing file: remove it, or pass --on-bad-input skip"
  expect 0 "the same with --on-bad-input skip" -- "$TKS" build "${B[@]}" --on-bad-input skip --output dg dang
  cat "$W/out" "$W/err" | grep -q "dang/broken.txt: a symbolic link to a missing file" &&
    ok "the summary lists the skipped link" || fail "summary: $(grep -A2 'bad inputs' "$W/out")"
  grep -q "dang/broken.txt: a symbolic link to a missing file" dg/manifest.json &&
    ok "the manifest lists the skipped link" || fail "manifest: $(grep -o '"skipped_inputs[^]]*' dg/manifest.json)"
  # --unit-bytes below the least unit (64K) is refused at once, naming it: a
  # unit per few bytes made a build of units nearly all empty (30,000 for
  # 300 KB at 10 bytes; 1 byte never ended)
  head -c 300000 "$T/gcide.txt" >u.txt
  for ub in 1 10 65535; do
    rm -rf tiny tiny.partial
    expect 2 "--unit-bytes $ub" -- timeout 30 "$TKS" build -q "${B[@]}" --doc-split line --unit-bytes $ub --output tiny u.txt
    expect_msg "--unit-bytes $ub is below the least work unit, 64K \(65536 bytes\)"
    [[ ! -e tiny && ! -e tiny.partial ]] && ok "--unit-bytes $ub: nothing written" || fail "--unit-bytes $ub left $(ls -d tiny*)"
  done
  expect 0 "--unit-bytes 64K" -- "$TKS" build "${B[@]}" --doc-split line --unit-bytes 64K --output tiny u.txt
  units=$(sed -n 's/^ *units *\([0-9]*\).*/\1/p' "$W/out")
  [[ ${units:-0} -ge 4 && ${units:-0} -le 5 ]] && ok "64K: $units units for 300 KB" || fail "64K: ${units:-?} units"
  mkdir -p e && for i in 1 2 3 4 5; do : >"e/$i.txt"; done && cp g.txt e/
  expect 0 "five empty files and one with text" -- "$TKS" build "${B[@]}" --doc-split file --output emp e
  grep -q "skipped       5 empty" "$W/out" && ok "5 empty files counted" || fail "summary: $(grep skipped "$W/out")"
  ;;
stop)
  # SIGTERM (timeout's) reaches the build while its reader is inside one
  # document that never ends or takes long: the stop flag is seen at the
  # next block read, a window looked at for a cut, a Parquet row
  truncate -s 64G sparse.txt
  runs=("/dev/zero:--doc-split file" "/dev/zero:--doc-split line" "/dev/zero:--format jsonl"
    "sparse.txt:--doc-split file" "sparse.txt:--doc-split line")
  for r in "${runs[@]}"; do
    in=${r%%:*} opt=${r#*:}
    rm -rf z z.partial
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # opt is two words
    # (-k: a build deaf to the TERM is killed 8 s later, and fails the check)
    timeout --preserve-status -k 8 -s TERM 1 "$TKS" build -q "${B[@]}" $opt --output z "$in" >"$W/out" 2>"$W/err"
    code=$?
    dt=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)")
    [[ $code -eq 130 ]] && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 8)" "$dt" &&
      ok "$in $opt: SIGTERM after 1 s ends the build (exit 130) in ${dt} s" ||
      fail "$in $opt: exit $code after ${dt} s (130 within 8 s expected): $(tail -c 300 "$W/err")"
    expect_msg "interrupted while .*$in.*run the same command with --resume"
    [[ ! -e z ]] && ok "$in $opt: nothing published" || fail "$in $opt: z published"
  done
  # the same stop delivered twice (timeout(1) signals the command, then its
  # whole process group): two TERMs back to back, three times, each the
  # clean stop with its message, not a silent exit; a second TERM 1.5 s after
  # the first still ends the build (at once, or the stop was already done)
  for gap in 0 0 0 1.5; do
    rm -rf z z.partial
    "$TKS" build -q "${B[@]}" --doc-split line --output z /dev/zero >"$W/out" 2>"$W/err" &
    pid=$!
    sleep 1
    kill -TERM $pid
    [[ $gap == 0 ]] || sleep $gap
    kill -TERM $pid 2>/dev/null
    wait $pid
    code=$?
    if [[ $gap == 0 ]]; then
      [[ $code -eq 130 ]] && grep -q "interrupted while .*/dev/zero.*--resume" "$W/err" &&
        ok "TERM twice, back to back: the clean stop (exit 130, where it stopped named)" ||
        fail "TERM twice, back to back: exit $code, stderr: $(tail -c 300 "$W/err")"
    else
      [[ $code -eq 130 ]] && grep -q "interrupted" "$W/err" &&
        ok "TERM twice, 1.5 s apart: exit 130 with a message" ||
        fail "TERM twice, 1.5 s apart: exit $code, stderr: $(tail -c 300 "$W/err")"
    fi
    [[ ! -e z ]] && ok "TERM twice ($gap s apart): nothing published" || fail "TERM twice ($gap s apart): z published"
  done
  ;;
publish)
  # a kill at each step between the manifest and the end of publishing: the
  # dataset is then either published, or complete in OUT.partial, which
  # --resume publishes as it is; the state file goes after the rename (one
  # left inside OUT by a kill there is no part of the dataset: audit and
  # readers ignore it)
  [[ -n ${TKS_FAULT_LIB:-} && -r $TKS_FAULT_LIB ]] || { fail "TKS_FAULT_LIB not set (run through ctest)"; finish test_hostile; }
  head -c 400000 "$T/gcide.txt" >g.txt
  P=("${B[@]}" --unit-bytes 128K)
  expect 0 "reference build" -- "$TKS" build -q "${P[@]}" --output ref g.txt
  same_as_ref() { # DIR WHAT: ref's files, byte for byte (a stray state file aside)
    local d=$1 f bad=0
    for f in ref/*; do cmp -s "$f" "$d/${f#ref/}" || bad=$((bad + 1)); done
    local extra
    extra=$(cd "$d" && ls | grep -v -x -F -f <(cd ../ref && ls) | grep -v -x build-state.json)
    [[ $bad -eq 0 && -z $extra ]] && ok "$2: the reference's files, byte for byte" ||
      fail "$2: $bad files differ from the reference, extra: $extra"
  }
  for point in rename:manifest.json:1 unlink:unit.json:2 unlink:build-state.json:1 rename:r:1; do
    rm -rf r r.partial
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=$point "$TKS" build -q "${P[@]}" --output r g.txt >/dev/null 2>"$W/err"
    code=$?
    [[ $code -eq 137 ]] && ok "killed at $point" || fail "kill at $point: exit $code: $(tail -c 300 "$W/err")"
    if [[ -e r.partial ]]; then
      expect 0 "resume after the kill at $point" -- "$TKS" build "${P[@]}" --output r --resume g.txt
      grep -q "published as it was" "$W/out" && ok "$point: the complete dataset published, nothing built" ||
        fail "$point: summary: $(head -3 "$W/out")"
    fi
    [[ -d r && ! -e r.partial ]] && ok "$point: r published" || fail "$point: $(ls -d r* 2>&1)"
    same_as_ref r "$point"
    expect 0 "$point: audit" -- "$TKS" audit r
    grep -q "^OK: r:" "$W/out" && ok "$point: the audit is clean" || fail "$point: audit: $(cat "$W/out")"
  done
  # OUT made while the build ran: the rename is refused, the error names OUT,
  # the complete dataset stays in OUT.partial with its state; --resume
  # publishes it once OUT is moved away
  rm -rf r r.partial
  expect 2 "an r made while the build ran" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_OCCUPY=r \
    "$TKS" build -q "${P[@]}" --output r g.txt
  expect_msg "cannot publish r: r appeared while the build ran .*kept in r.partial: move r away, then run the same command with --resume"
  [[ -e r.partial/manifest.json && -e r.partial/build-state.json ]] && ok "r.partial kept, with its state" ||
    fail "r.partial: $(ls r.partial 2>&1)"
  expect 2 "--resume while r is still there" -- "$TKS" build -q "${P[@]}" --output r --resume g.txt
  expect_msg "r already exists"
  rm -rf r
  expect 0 "--resume once r is moved away" -- "$TKS" build -q "${P[@]}" --output r --resume g.txt
  same_as_ref r "published after the refused rename"
  # a complete OUT.partial resumed under mpirun: rank 0 publishes it
  rm -rf r r.partial
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:manifest.json:1 "$TKS" build -q "${P[@]}" --output r g.txt >/dev/null 2>&1
  mpi_env
  expect 0 "mpirun -np 2 --resume of a complete r.partial" -- timeout 300 mpirun -np 2 "$TKS" build "${P[@]}" --output r \
    --resume g.txt
  grep -q "published as it was" "$W/out" && ok "mpirun: the complete dataset published, nothing built" ||
    fail "mpirun: summary: $(head -3 "$W/out")"
  same_as_ref r "mpirun -np 2 --resume of a complete r.partial"
  # the same for import
  expect 0 "Megatron export" -- "$TKS" export --format megatron --copy ref mg
  I=(import --format megatron mg_00000 --tokenizer "$T/bpe.model" --shard-tokens 20K)
  expect 0 "reference import" -- "$TKS" "${I[@]}" --output iref
  n=$(ls iref/shard-*.tks | wc -l)
  for point in unlink:import-state.json:1 rename:ir:1 rename:manifest.json:1; do
    rm -rf ir ir.partial
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=$point "$TKS" "${I[@]}" --output ir >/dev/null 2>"$W/err"
    code=$?
    [[ $code -eq 137 ]] && ok "import killed at $point" || fail "import kill at $point: exit $code"
    if [[ -e ir.partial ]]; then
      expect 0 "import --resume after $point" -- "$TKS" "${I[@]}" --output ir --resume
      grep -q "($n kept from the interrupted run)" "$W/out" && ok "$point: all $n shards kept" ||
        fail "$point: $(grep -i kept "$W/out")"
    fi
    diff -rq iref ir -x import-state.json >/dev/null && ok "import $point: the reference's files" || fail "import $point: $(diff -rq iref ir)"
  done
  rm -rf ir ir.partial
  expect 2 "an ir made while the import ran" -- env LD_PRELOAD="$TKS_FAULT_LIB" TKS_FAULT_OCCUPY=ir "$TKS" "${I[@]}" --output ir
  expect_msg "cannot publish ir: ir appeared while the import ran"
  rm -rf ir
  expect 0 "import --resume once ir is moved away" -- "$TKS" "${I[@]}" --output ir --resume
  diff -rq iref ir >/dev/null && ok "import published after the refused rename" || fail "import: $(diff -rq iref ir)"
  # inputs with no text: nothing is left behind (the next run starts afresh,
  # not told to resume a build that never started)
  printf '\n\n   \n\n' >blank.txt
  for k in 1 2; do
    expect 2 "a build of blank lines only (run $k)" -- "$TKS" build -q "${B[@]}" --output nt blank.txt
    expect_msg "the inputs hold no document with text"
    [[ ! -e nt.partial && ! -e nt && ! -e nt.lock ]] && ok "run $k: nothing left behind" || fail "run $k left $(ls -d nt* 2>&1)"
  done
  expect 2 "the same under --resume" -- "$TKS" build -q "${B[@]}" --output nt --resume blank.txt
  expect_msg "the inputs hold no document with text"
  [[ ! -e nt.partial ]] && ok "--resume: nothing left behind" || fail "--resume left nt.partial"
  ;;
unicode)
  # code points the byte-level encoder's Unicode (PCRE2's tables) leaves
  # unassigned: U+50000 (plane 5, unassigned in every Unicode to date) in 2
  # documents, 3 times; the counts are the dataset's, in its manifest, also
  # when the documents are in a unit kept from an interrupted run
  python3 -c "import base64; [print(base64.b64encode(bytes([i])).decode(), i) for i in range(256)]" >bytes.tiktoken
  python3 - "$T/gcide.txt" <<'PY'
import sys
t = open(sys.argv[1], encoding="utf-8", errors="replace").read()[:400000].split("\n\n")
t[3] += " \U00050000 and \U00050000 again"
t[-5] += " one more \U00050000"
open("u.txt", "w", encoding="utf-8").write("\n\n".join(t))
PY
  U=(--tokenizer bytes.tiktoken --pattern gpt2 --doc-split blank-line --shard-tokens 100K --unit-bytes 128K)
  expect 0 "build -q" -- "$TKS" build -q "${U[@]}" --output u u.txt
  expect_msg "warning: 3 code points in 2 documents of the dataset are unassigned in Unicode [0-9.]+"
  cnt() { python3 -c "import json, sys; u = json.load(open(sys.argv[1]))['tokenizer'].get('unicode'); print(u and '%d %d %s' % (u['unassigned_code_points'], u['unassigned_docs'], u['version']))" "$1"; }
  [[ $(cnt u/manifest.json) == "3 2 "* ]] && ok "the manifest records 3 code points in 2 documents ($(cnt u/manifest.json))" ||
    fail "manifest: $(cnt u/manifest.json)"
  expect 0 "inspect" -- "$TKS" inspect u
  grep -q "unicode       3 code points in 2 documents unassigned in Unicode" "$W/out" && grep -q "^note: 3 code points" "$W/out" &&
    ok "inspect shows them" || fail "inspect: $(grep -i unicode "$W/out")"
  expect 0 "inspect --json" -- "$TKS" inspect u --json
  python3 -c "import json, sys; u = json.load(open(sys.argv[1]))['unicode']; sys.exit(u['unassigned_code_points'] != 3 or u['unassigned_docs'] != 2)" "$W/out" &&
    ok "inspect --json: unicode" || fail "inspect --json: $(grep -A4 unicode "$W/out")"
  expect 0 "audit" -- "$TKS" audit u
  grep -q "^OK: u:" "$W/out" && grep -q "^note: 3 code points in 2 documents of the dataset are unassigned" "$W/out" &&
    ok "audit: OK, with the note" || fail "audit: $(cat "$W/out")"
  expect 0 "audit --json" -- "$TKS" audit u --json
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(not r['ok'] or r['unicode']['unassigned_docs'] != 2)" "$W/out" &&
    ok "audit --json: unicode" || fail "audit --json: $(grep -A4 unicode "$W/out")"
  # killed once the first unit (which holds 2 of the code points) is complete, then resumed
  [[ -n ${TKS_FAULT_LIB:-} ]] || fail "TKS_FAULT_LIB not set (run through ctest)"
  LD_PRELOAD=${TKS_FAULT_LIB:-} TKS_FAULT_KILL=rename:unit.json:1 "$TKS" build -q "${U[@]}" --output k u.txt >/dev/null 2>&1
  expect 0 "resume" -- "$TKS" build -q "${U[@]}" --output k --resume u.txt
  [[ $(cnt k/manifest.json) == "$(cnt u/manifest.json)" ]] && cmp -s u/manifest.json k/manifest.json &&
    ok "killed and resumed: the same manifest, counts included" || fail "resumed: $(cnt k/manifest.json)"
  # a sentencepiece dataset records none (null), and older manifests read as before
  expect 0 "a sentencepiece build" -- "$TKS" build -q "${B[@]}" --output s u.txt
  [[ -z $(grep -i "warning" "$W/err") && $(cnt s/manifest.json) == None ]] && ok "sentencepiece: no count, no warning" ||
    fail "sentencepiece: $(cnt s/manifest.json) $(cat "$W/err")"
  ;;
notok)
  expect 0 "dataset" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  expect 0 "export to Megatron" -- "$TKS" export --format megatron --copy ds mg
  vocab=$(python3 -c "import json; print(json.load(open('ds/manifest.json'))['tokenizer']['vocab_size'])")
  expect 0 "import with --vocab-size and no tokenizer" -- "$TKS" import --format megatron mg_00000 --output nt --vocab-size "$vocab"
  expect 0 "train on it" -- "$TRAIN" --dataset nt --out run "${TINY[@]}" --steps 2
  c=run/checkpoints/step-00000002
  [[ ! -e $c/tokenizer.model && -e $c/tokenizer.none ]] && ok "the checkpoint has tokenizer.none, no tokenizer.model" ||
    fail "checkpoint files: $(ls "$c")"
  # a user's own hf.tmp beside the target is neither used nor removed
  mkdir -p hf.tmp && echo mine >hf.tmp/notes.txt
  expect 0 "export-hf exports the model" -- "$TKS" export-hf run hf
  expect_msg "no tokenizer exported"
  [[ $(cat hf.tmp/notes.txt 2>/dev/null) == mine && $(ls hf.tmp) == notes.txt ]] &&
    ok "export-hf left the user's hf.tmp as it was" || fail "hf.tmp after export-hf: $(ls -la hf.tmp 2>&1)"
  [[ -z $(ls -d hf.tmp-* 2>/dev/null) ]] && ok "no temporary folder left" || fail "left: $(ls -d hf.tmp-*)"
  [[ -s hf/model.safetensors && -s hf/config.json && ! -e hf/tokenizer.model ]] && ok "model.safetensors and config.json, no tokenizer" ||
    fail "hf: $(ls hf)"
  expect 2 "cat without --ids" -- "$TKS" cat nt
  expect_msg "has no tokenizer .*use --ids"
  expect 0 "cat --ids" -- "$TKS" cat nt --ids
  expect 0 "inspect" -- "$TKS" inspect nt
  expect 2 "generate" -- "$BIN/tokshard-generate" --checkpoint run --prompt "Abandon"
  expect_msg "imported without a tokenizer"
  ;;
smaller)
  for cmd in build audit cat; do
    expect 0 "tokshard $cmd --help" -- "$TKS" $cmd --help
    grep -q "tokshard sample-plan --run" "$W/out" && grep -q -- "--model-type bpe|unigram|word|char" "$W/out" &&
      ok "$cmd --help prints the help (word/char models, sample-plan --run)" || fail "$cmd --help: $(head -3 "$W/out")"
  done
  # cat shows a document's control characters escaped (ESC, OSC's BEL, CR, a
  # C1 CSI), so they never reach the terminal; --raw writes the bytes
  # (a byte-level tokenizer of the 256 bytes keeps every byte; sentencepiece's
  # normalization drops control characters)
  printf 'plain \033[31mred\033]0;title\007 cr\r c1 \302\233 end\n' >ctl.txt
  python3 -c "import base64; [print(base64.b64encode(bytes([i])).decode(), i) for i in range(256)]" >bytes.tiktoken
  expect 0 "a document with control characters" -- "$TKS" build -q --tokenizer bytes.tiktoken --pattern gpt2 \
    --output ctl ctl.txt
  "$TKS" cat ctl --raw >raw.out && "$TKS" cat ctl >esc.out
  grep -q $'\033\\[31mred' raw.out && ok "cat --raw writes the bytes (the tokenizer keeps them)" ||
    fail "cat --raw: $(od -c raw.out | head -3)"
  ! grep -q $'[\033\007\r]' esc.out && ! grep -q $'\302\233' esc.out &&
    grep -qF '\x1b[31mred\x1b]0;title\x07 cr\x0d c1 \u009b end' esc.out &&
    ok "cat escapes ESC, BEL, CR and C1 controls" || fail "cat: $(od -c esc.out | head -4)"
  # cat --limit 0 prints nothing; --doc past the end names the real count
  expect 0 "cat --doc 0 --limit 0" -- "$TKS" cat ctl --doc 0 --limit 0
  [[ ! -s $W/out ]] && ok "cat --limit 0 printed nothing" || fail "cat --limit 0: $(head -c 200 "$W/out")"
  expect 2 "cat --doc 5 of a 1-document dataset" -- "$TKS" cat ctl --doc 5
  expect_msg "--doc 5: the dataset has 1 documents \(0 to 0\)"
  # tokshard-generate writes UTF-8 whatever byte tokens it samples (a byte-level
  # model of the 256 bytes at temperature 2 samples broken sequences)
  head -c 200000 "$T/gcide.txt" >g2.txt
  expect 0 "byte-level dataset" -- "$TKS" build -q --tokenizer bytes.tiktoken --pattern gpt2 --output bytes g2.txt
  expect 0 "a tiny byte-level model" -- "$TRAIN" --dataset bytes --out brun "${TINY[@]}" --steps 2 --val-tokens 4096
  # (ids in the tokenizer's gaps, 256-50255 here, are never sampled: nothing decodes them)
  "$BIN/tokshard-generate" --checkpoint brun --prompt "A" --max-tokens 400 --temperature 2 --seed 3 >gen.txt 2>"$W/err"
  code=$?
  python3 -c "import sys; t = open('gen.txt', 'rb').read(); t.decode('utf-8'); assert len(t) > 100; print(len(t), 'bytes')" \
    >"$W/out" 2>&1 && [[ $code -eq 0 ]] && ok "generate: $(cat "$W/out") of valid UTF-8" ||
    fail "generate (exit $code): $(tail -c 300 "$W/err") $(tail -1 "$W/out")"
  # a prompt that is not UTF-8 (which a byte-level tokenizer cannot take) is
  # refused as the prompt's fault, suggesting no option of the build
  expect 2 "a prompt that is not UTF-8" -- "$BIN/tokshard-generate" --checkpoint brun --prompt $'ab\xff\xfecd' \
    --max-tokens 3
  expect_msg "the prompt is not valid UTF-8 \(at byte 2\): give --prompt as UTF-8 text"
  ! grep -q -- "--invalid-utf8" "$W/err" && ok "no --invalid-utf8 (tokshard-generate has no such option)" ||
    fail "suggests --invalid-utf8: $(cat "$W/err")"
  # import --tokenizer refuses an id that is no token of it (a tiktoken file's
  # gap between its ranks and its special ids), as the audit reports it
  python3 -c "import struct, sys; sys.stdout.buffer.write(struct.pack('<6H', 104, 105, 300, 104, 270, 300))" >gap.bin
  expect 2 "import of an id in the tokenizer's gap" -- "$TKS" import --format raw --dtype u16 --eot 300 gap.bin \
    --output gapds --tokenizer bytes.tiktoken --pattern gpt2 --special-tokens '<|endoftext|>=300'
  expect_msg "token id 270 .* is no token of bytes.tiktoken \(ids 256-299 lie between its ranks and its special tokens\)"
  [[ ! -e gapds ]] && ok "nothing published for the refused import" || fail "gapds published"
  expect 0 "dataset" -- "$TKS" build -q "${B[@]}" --append-eos --output ds "$T/gcide.txt"
  expect 0 "Megatron export" -- "$TKS" export --format megatron --copy ds mg
  expect 2 "a Megatron index given as a shard" -- "$TKS" cat mg_00000.idx --ids
  expect_msg "mg_00000.idx is a Megatron index \(.idx\); audit it with .tokshard audit --format megatron PREFIX."
  eos=$(python3 -c "import json; print(json.load(open('ds/manifest.json'))['tokenizer']['eos_id'])")
  expect 0 "llm.c export with --eot = the dataset's EOS" -- "$TKS" export --format llmc ds lc --eot "$eos"
  expect_msg "warning: [0-9]+ of [0-9]+ documents already end with --eot $eos"
  expect 2 "an llm.c file given as a shard" -- "$TKS" cat lc_00000.bin --ids
  expect_msg "lc_00000.bin is an llm.c token file"
  # a header claiming 2^62 sequences, and a negative pointer (int64 -8)
  cp mg_00000.bin big.bin && cp mg_00000.idx big.idx && cp mg_00000.bin neg.bin && cp mg_00000.idx neg.idx
  python3 - <<'PYEOF'
import struct
with open("big.idx", "r+b") as f:
    f.seek(18); f.write(struct.pack("<Q", 1 << 62))
with open("neg.idx", "r+b") as f:
    f.seek(18); S = struct.unpack("<Q", f.read(8))[0]
    f.seek(34 + 4 * S + 8); f.write(struct.pack("<q", -8))   # the second sequence's pointer
PYEOF
  expect 1 "a Megatron header claiming 2^62 sequences" -- "$TKS" audit --format megatron big --model-vocab 100000
  grep -q "4611686018427387904 sequences .* more than any file can hold" "$W/out" && ok "named as a corrupt header" ||
    fail "audit: $(grep -m1 -i big "$W/out")"
  expect 1 "a negative Megatron pointer" -- "$TKS" audit --format megatron neg --model-vocab 100000
  grep -q "sequence 1 points at byte -8 of the .bin" "$W/out" && ok "the pointer printed signed" ||
    fail "audit: $(grep -m1 -i point "$W/out")"
  ;;
links)
  printf "the victim's own file\n" >victim && cp victim victim.orig
  intact() { cmp -s victim victim.orig && ok "$1: the link's target is unchanged" || fail "$1: written through into victim"; }
  # OUT.lock beside the output: a symbolic link, a dangling one, a hard link
  ln -s "$W/victim" ds.lock
  expect 2 "build with a symbolic link planted at OUT.lock" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  expect_msg "lock file ds.lock is a symbolic link: tokshard does not write through a link it did not make.*rm ds.lock"
  intact "OUT.lock a symbolic link"
  [[ ! -e ds && ! -e ds.partial ]] && ok "nothing built" || fail "built through a refused lock"
  rm ds.lock && ln -s "$W/nowhere" ds.lock
  expect 2 "build with a dangling link at OUT.lock" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  [[ ! -e nowhere ]] && ok "nothing created through the dangling link" || fail "nowhere was created through ds.lock"
  rm ds.lock && ln victim ds.lock
  expect 2 "build with a hard link at OUT.lock" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  expect_msg "lock file ds.lock has 2 links"
  intact "OUT.lock a hard link"
  rm ds.lock
  expect 0 "the build once the link is gone" -- "$TKS" build -q "${B[@]}" --output ds "$T/gcide.txt"
  # a run directory: RUN/run.lock, then RUN/metrics.jsonl (whose lines are kept: appended to, before)
  mkdir run && ln -s "$W/victim" run/run.lock
  expect 2 "train with a link at RUN/run.lock" -- "$TRAIN" --dataset ds --out run "${TINY[@]}" --steps 2
  expect_msg "lock file run/run.lock is a symbolic link"
  intact "RUN/run.lock"
  rm run/run.lock
  printf '{"step": 0, "note": "the victim'"'"'s"}\n' >victim && cp victim victim.orig
  ln -s "$W/victim" run/metrics.jsonl
  expect 2 "train with a link at RUN/metrics.jsonl" -- "$TRAIN" --dataset ds --out run "${TINY[@]}" --steps 2
  expect_msg "metrics file run/metrics.jsonl is a symbolic link"
  intact "RUN/metrics.jsonl"
  rm run/metrics.jsonl
  expect 0 "train once the link is gone" -- "$TRAIN" --dataset ds --out run "${TINY[@]}" --steps 2
  # --plot's temporary file, once RUN/loss.svg.tmp (gnuplot's output went through a link there)
  if command -v gnuplot >/dev/null; then
    ln -s "$W/victim" run/loss.svg.tmp
    expect 0 "--plot with a link at the old temporary name" -- "$TRAIN" --plot run
    intact "RUN/loss.svg.tmp"
    grep -q '<svg' run/loss.svg && [[ ! -L run/loss.svg ]] && ok "loss.svg drawn as a file of its own" ||
      fail "loss.svg: $(ls -l run/loss.svg)"
    [[ -z $(ls run | grep 'loss.svg.tmp-') ]] && ok "no temporary left" || fail "left: $(ls run)"
  else
    echo "note: no gnuplot: --plot's temporary file not checked"
  fi
  ;;

cache)
  # a byte-level tokenizer.json made here (a token for every byte, four merges)
  mkdir tok && python3 "$HERE/tiny_bytelevel.py" tok/tokenizer.json "t h" "i n" "e r" "a n"
  BT=(--tokenizer "$W/tok/tokenizer.json" --doc-split blank-line --shard-tokens 100K)
  head -c 200000 "$T/gcide.txt" >text.txt
  # a directory others may write: not used, said once, nothing written in it
  mkdir shared && chmod 0777 shared
  export TOKSHARD_CACHE_DIR=$W/shared
  expect 0 "build with a cache directory of mode 0777" -- "$TKS" build "${BT[@]}" --output d0 text.txt
  [[ $(grep -c "tokenizer cache" "$W/out") -eq 1 ]] &&
    grep -q "note .*the tokenizer cache $W/shared is not used: others may write it (mode 0777).*chmod go-w" "$W/out" &&
    ok "the summary says why, once" || fail "summary: $(grep -i cache "$W/out")"
  [[ -z $(ls shared) ]] && ok "nothing written in the shared directory" || fail "written: $(ls shared)"
  expect 0 "the same with --quiet" -- "$TKS" build -q "${BT[@]}" --output d1 text.txt
  [[ $(grep -c "tokenizer cache" "$W/err") -eq 1 ]] && expect_msg "note: the tokenizer cache .*shared is not used" ||
    fail "--quiet: $(cat "$W/err")"
  chmod 0770 shared
  expect 0 "a group-writable cache directory" -- "$TKS" build -q "${BT[@]}" --output d2 text.txt
  expect_msg "shared is not used: others may write it \(mode 0770\)"
  # XDG_CACHE_HOME whose tokshard/ another user made first (root can make one)
  if [[ $(id -u) -eq 0 ]]; then
    unset TOKSHARD_CACHE_DIR
    mkdir -p xdg/tokshard && chown 65534:65534 xdg/tokshard && chmod 0755 xdg/tokshard
    XDG_CACHE_HOME=$W/xdg expect 0 "\$XDG_CACHE_HOME/tokshard of another user" -- "$TKS" build -q "${BT[@]}" --output d3 text.txt
    expect_msg "xdg/tokshard is not used: it belongs to user 65534"
    [[ -z $(ls xdg/tokshard) ]] && ok "nothing written in another user's directory" || fail "written: $(ls xdg/tokshard)"
  fi
  # a cache of one's own: the first build parses and writes it, the second maps it;
  # both manifests (and one without the cache) are identical and record the tables' digest
  export TOKSHARD_CACHE_DIR=$W/mine
  expect 0 "build with a new cache (parse)" -- "$TKS" build "${BT[@]}" --output c1 text.txt
  ! grep -q "tokenizer cache" "$W/out" && ok "no note for a cache of one's own" || fail "note: $(grep cache "$W/out")"
  [[ -n $(ls mine/bpe-*.tkc 2>/dev/null) && $(stat -c %a mine) == 700 && $(stat -c %a mine/cache.key) == 600 ]] &&
    ok "the cache made private: an entry and its key" || fail "mine: $(ls -la mine)"
  expect 0 "build again (from the cache)" -- "$TKS" build -q "${BT[@]}" --output c2 text.txt
  TOKSHARD_CACHE_DIR=off expect 0 "build without the cache" -- "$TKS" build -q "${BT[@]}" --output c3 text.txt
  grep -Eq '"tables_xxh3": "[0-9a-f]{32}"' c1/manifest.json && ok "the manifest records tables_xxh3" ||
    fail "no tables_xxh3: $(grep -A3 tokenizer c1/manifest.json)"
  cmp -s c1/manifest.json c2/manifest.json && cmp -s c1/manifest.json c3/manifest.json &&
    ok "parsed, cached and uncached: the same manifest" || fail "manifests differ: $(diff c1/manifest.json c2/manifest.json | head -5)"
  expect 0 "audit of the cached build" -- "$TKS" audit c2
  unset TOKSHARD_CACHE_DIR
  ;;
*)
  fail "unknown case $CASE"
  ;;
esac
finish test_hostile

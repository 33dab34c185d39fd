#!/usr/bin/env bash
# Byte-level BPE training (tokshard train-tokenizer --model-type byte-bpe),
# tests/bpe_train.cmake.
# Usage: test_bpe_train.sh STEP SRC TOKSHARD WORKDIR [CASE]
#   peer        Hugging Face tokenizers 0.23.3 (SRC/.venv-train, made by
#               scripts/install-venv.sh --train-peers when missing) trains the
#               reference tokenizers (tests/bpe_train_peer.py); 77 when the
#               venv cannot be made
#   hf CASE     tokshard trains CASE: vocabulary and merges equal tokenizers'
#   ref         the main job's corpus (dict-gcide, the Python docs), read as
#               build reads it, trained with one thread: the reference below
#   threads     2 and 3 threads: every output file identical to the reference
#   spill       a --memory that fills the threads' tables many times: several
#               runs merged, identical files
#   resume      killed (-9) in the middle of counting, then --resume:
#               identical files; and SIGINT: exit 130, then --resume
#   refuse      a --memory too small for the merge phase: refused with its
#               size, the counts kept; --resume with enough memory finishes
#   build       tokshard build with the trained tokenizer: the dataset's ids
#               are tokenizers' ids of each document; transformers loads it
#   prune       --min-word-count: the words left out counted and recorded
#               in training.json (the default records no pruning); progress
#               lines on a terminal's stderr (under script(1))
#   links       links planted at OUT.partial, OUT.partial/publish and
#               OUT.lock: never followed (their targets' files intact), the
#               run refused naming the link or finishing without it
set -uo pipefail
STEP=$1 SRC=$2 TKS=$3 W=$4 CASE=${5:-}
HERE=$(cd "$(dirname "$0")" && pwd)
PYT=$SRC/.venv-train/bin/python
fails=0
fail() { echo "FAIL [$STEP${CASE:+ $CASE}]: $*" >&2; fails=$((fails + 1)); }
ok() { echo "ok   [$STEP${CASE:+ $CASE}]: $*"; }
# the main job's corpus (samples/corpus.sh), as the main job reads it, and
# one long record (the Python docs' library/ pages joined, 5 MB: counted in
# parts on every thread)
CORPUS=(/usr/share/dictd/gcide.dict.dz /usr/share/doc/python3.11/html/_sources "$W/long.jsonl")
COMMON=(train-tokenizer --model-type byte-bpe --vocab-size 8000 --pattern llama3 --doc-split blank-line
  --special-tokens '<|begin_of_text|>,<|end_of_text|>' --eos-token '<|end_of_text|>')
need_corpus() {
  for p in "${CORPUS[@]:0:2}"; do
    [[ -e $p ]] || { echo "skip: $p is missing (scripts/install-deps.sh installs it)" >&2; exit 77; }
  done
}
need_ref() {
  [[ -f $W/ref/tokenizer.json ]] || { echo "FAIL: $W/ref missing: the bpe_train_ref test did not run" >&2; exit 1; }
}
# identical output directories (every file, byte for byte)
same_as_ref() {
  if diff -r "$W/ref" "$1" >"$W/$STEP.diff" 2>&1; then
    ok "$2: every file identical to the 1-thread reference ($(ls "$1" | xargs))"
  else
    fail "$2: differs from the reference: $(head -c 400 "$W/$STEP.diff")"
  fi
}
runs_of() { sed -n 's/.* \([0-9][0-9]*\) runs$/\1/p' "$1" | head -1; }

case $STEP in
peer)
  rm -rf "$W" && mkdir -p "$W" || exit 2
  if ! "$PYT" -c "import tokenizers, sys; sys.exit(tokenizers.__version__ != '0.23.3')" 2>/dev/null; then
    echo "making $SRC/.venv-train (tokenizers 0.23.3) ..."
    "$SRC/scripts/install-venv.sh" --train-peers >"$W/venv.log" 2>&1 ||
      { echo "skip: $SRC/.venv-train cannot be made ($(tail -2 "$W/venv.log"))" >&2; exit 77; }
  fi
  "$PYT" "$HERE/bpe_train_peer.py" "$W"
  exit $?
  ;;
hf)
  A=$W/$CASE.args
  [[ -f $A ]] || { echo "FAIL: $A missing: the bpe_train_peer test did not run or failed" >&2; exit 1; }
  read -r corpus vocab pattern specials minf < <(python3 -c "
import json; a = json.load(open('$A'))
print(a['corpus'], a['vocab'], a['pattern'], ','.join(a['specials']) or '-', a['min_frequency'])")
  sp=()
  [[ $specials != - ]] && sp=(--special-tokens "$specials")
  rm -rf "$W/out-$CASE"
  if "$TKS" train-tokenizer --model-type byte-bpe -q --vocab-size "$vocab" --pattern "$pattern" \
    ${sp[@]+"${sp[@]}"} --min-frequency "$minf" --threads 2 --output "$W/out-$CASE" "$W/$corpus" 2>"$W/$CASE.err"; then
    python3 "$HERE/bpe_train_check.py" "$W/out-$CASE/tokenizer.json" "$W/$CASE.ref.json" "$A" || fails=1
  else
    fail "train-tokenizer: $(cat "$W/$CASE.err")"
  fi
  ;;
ref)
  need_corpus
  rm -rf "$W" && mkdir -p "$W" || exit 2
  python3 - "$W/long.jsonl" <<'PY' || exit 2
import glob, json, sys
parts = [open(p, encoding="utf-8", errors="replace").read()
         for p in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/library/*.txt"))]
open(sys.argv[1], "w").write(json.dumps({"text": "\n".join(parts)}) + "\n")
PY
  if "$TKS" "${COMMON[@]}" --threads 1 --output "$W/ref" "${CORPUS[@]}" >"$W/ref.out" 2>"$W/ref.err"; then
    ok "$(head -1 "$W/ref.out"); $(sed -n 2p "$W/ref.out" | xargs)"
    grep "merge phase:" "$W/ref.err" >"$W/ref.phase" || fail "no merge phase line on stderr: $(cat "$W/ref.err")"
  else
    fail "$(cat "$W/ref.err")"
  fi
  ;;
threads)
  need_ref
  for t in 2 3; do
    rm -rf "$W/t$t"
    "$TKS" "${COMMON[@]}" -q --threads "$t" --output "$W/t$t" "${CORPUS[@]}" 2>"$W/t$t.err" ||
      { fail "$t threads: $(cat "$W/t$t.err")"; continue; }
    same_as_ref "$W/t$t" "$t threads"
  done
  ;;
spill)
  need_ref
  # a --memory far below the threads' share of the words: counting spills
  # its tables many times, the merge phase (which then does not fit) is
  # refused, and --resume with the memory it asks for merges the runs:
  # the reference's files
  rm -rf "$W/spill" "$W/spill.partial"
  "$TKS" "${COMMON[@]}" -q --threads 3 --memory 12M --output "$W/spill" "${CORPUS[@]}" 2>"$W/spill.err"
  rc=$?
  runs=$(python3 -c "
import glob, json
print(sum(len(json.load(open(p))['runs']) for p in glob.glob('$W/spill.partial/unit-*.json')))" 2>/dev/null)
  [[ $rc == 2 && ${runs:-0} -ge 9 ]] && ok "--memory 12M, 3 threads: ${runs} runs spilled and merged, the merge phase refused" ||
    fail "--memory 12M: exit $rc, ${runs:-no} runs: $(cat "$W/spill.err")"
  want=$(sed -n 's/.*--memory \([0-9]*\) or more.*/\1/p' "$W/spill.err")
  if "$TKS" "${COMMON[@]}" -q --threads 3 --memory "${want:-1G}" --resume --output "$W/spill" "${CORPUS[@]}" \
    2>"$W/spill.err"; then
    same_as_ref "$W/spill" "runs of --memory 12M merged, then --resume --memory ${want:-1G}"
  else
    fail "--resume: $(cat "$W/spill.err")"
  fi
  ;;
resume)
  need_ref
  # killed while counting: work units of 4 MiB (dict-gcide's compressed
  # file is one, the Python docs three), stopped after the 12th batch
  # (TOKSHARD_TEST_TRAIN_STOP, a test hook: in the second or third unit)
  # and killed there
  R=(--threads 2 --unit-bytes 4M --output "$W/res")
  I=(--threads 2 --unit-bytes 4M --output "$W/int")
  rm -rf "$W/res" "$W/res.partial"
  TOKSHARD_TEST_TRAIN_STOP=12 "$TKS" "${COMMON[@]}" -q "${R[@]}" "${CORPUS[@]}" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == T ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  units=$(ls "$W/res.partial" 2>/dev/null | grep -c '^unit-')
  runs=$(ls "$W/res.partial" 2>/dev/null | grep -c '^run-')
  [[ $units -ge 1 && ! -e $W/res ]] && ok "killed -9 while counting: $units units recorded, $runs runs on disk" ||
    fail "after kill -9: $units unit records, $W/res $( [[ -e $W/res ]] && echo exists || echo absent)"
  if "$TKS" "${COMMON[@]}" "${R[@]}" --resume "${CORPUS[@]}" >"$W/res.out" 2>"$W/res.err"; then
    grep -q "([1-9][0-9]* kept from an interrupted run)" "$W/res.out" && ok "$(grep counting "$W/res.out" | xargs)" ||
      fail "no unit kept: $(cat "$W/res.out")"
    [[ ! -e $W/res.partial && ! -e $W/res.lock ]] && ok "res.partial and res.lock removed once published" ||
      fail "res.partial or res.lock left behind"
    same_as_ref "$W/res" "resumed"
  else
    fail "--resume: $(cat "$W/res.err")"
  fi
  # Ctrl-C: exit 130, the counted units kept; again without --resume: refused
  rm -rf "$W/int" "$W/int.partial"
  TOKSHARD_TEST_TRAIN_STOP=5 "$TKS" "${COMMON[@]}" -q "${I[@]}" "${CORPUS[@]}" >/dev/null 2>"$W/int.err" &
  pid=$!
  for _ in $(seq 600); do
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == T ]] && break
    sleep 0.05
  done
  kill -INT "$pid"
  kill -CONT "$pid"
  wait "$pid"
  rc=$?
  [[ $rc == 130 ]] && grep -q -- "--resume" "$W/int.err" && ok "SIGINT: exit 130, $(tail -1 "$W/int.err" | cut -c1-90)" ||
    fail "SIGINT: exit $rc, $(cat "$W/int.err")"
  "$TKS" "${COMMON[@]}" -q "${I[@]}" "${CORPUS[@]}" >/dev/null 2>"$W/int.err"
  rc=$?
  [[ $rc != 0 ]] && grep -q "re-run with --resume" "$W/int.err" && ok "again without --resume: refused (exit $rc)" ||
    fail "again without --resume: exit $rc, $(cat "$W/int.err")"
  "$TKS" "${COMMON[@]}" -q "${I[@]}" --resume "${CORPUS[@]}" 2>"$W/int.err" ||
    fail "--resume after SIGINT: $(cat "$W/int.err")"
  same_as_ref "$W/int" "resumed after SIGINT"
  ;;
refuse)
  need_ref
  rm -rf "$W/small" "$W/small.partial"
  "$TKS" "${COMMON[@]}" -q --memory 100M --output "$W/small" "${CORPUS[@]}" >/dev/null 2>"$W/small.err"
  rc=$?
  msg=$(grep "merge phase would hold" "$W/small.err")
  [[ $rc == 2 && -n $msg && ! -e $W/small ]] && ok "--memory 100M: exit 2: $(echo "$msg" | cut -c1-160)" ||
    fail "--memory 100M: exit $rc, $(cat "$W/small.err")"
  echo "$msg" | grep -Eq "hold [0-9.]+ MiB \([0-9]+ distinct words.*--memory [0-9]+ or more" ||
    fail "the refusal does not give the size and the memory to ask for: $msg"
  want=$(echo "$msg" | sed -n 's/.*--memory \([0-9]*\) or more.*/\1/p')
  "$TKS" "${COMMON[@]}" -q --memory "$want" --resume --output "$W/small" "${CORPUS[@]}" 2>"$W/small.err" ||
    fail "--resume --memory $want: $(cat "$W/small.err")"
  same_as_ref "$W/small" "--resume with the memory asked for"
  ;;
build)
  need_ref
  if ! "$PYT" -c "import tokenizers" 2>/dev/null; then
    echo "skip: $PYT has no tokenizers (the bpe_train_peer test makes it)" >&2
    exit 77
  fi
  D=$W/build
  rm -rf "$D" && mkdir -p "$D" || exit 2
  # documents of the main job's text and manual pages in several languages
  "$PYT" - "$W" "$D" <<'PY' || exit 1
import glob, gzip, json, os, sys
from tokenizers import Tokenizer
W, D = sys.argv[1:3]
docs = []
for p in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/library/*.txt"))[:60]:
    docs.append(open(p, encoding="utf-8", errors="replace").read())
for lang in ("ja", "ru", "de", "zh_CN"):
    for p in sorted(glob.glob(f"/usr/share/man/{lang}/man1/*.gz"))[:15]:
        try:
            docs.append(gzip.open(p).read().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            pass
docs = [d for d in docs if d and "\0" not in d]
tok = Tokenizer.from_file(os.path.join(W, "ref", "tokenizer.json"))
eos = tok.token_to_id("<|end_of_text|>")
with open(os.path.join(D, "docs.jsonl"), "w") as j, open(os.path.join(D, "want.ids"), "w") as w:
    for d in docs:
        j.write(json.dumps({"text": d}) + "\n")
        w.write(" ".join(map(str, tok.encode(d, add_special_tokens=False).ids + [eos])) + "\n")
PY
  if "$TKS" build --tokenizer "$W/ref/tokenizer.json" --output "$D/data" --append-eos --threads 2 \
    "$D/docs.jsonl" >"$D/out" 2>"$D/err"; then
    "$TKS" cat "$D/data" --ids >"$D/got.ids" 2>"$D/err" || fail "cat --ids: $(cat "$D/err")"
    cmp -s "$D/got.ids" "$D/want.ids" && ok "$(wc -l <"$D/want.ids") documents built: ids identical to tokenizers'" ||
      fail "ids differ from tokenizers': $(diff "$D/got.ids" "$D/want.ids" | head -c 300)"
  else
    fail "build: $(cat "$D/err")"
  fi
  # transformers (the project venv's 4.45.2) loads the directory as it is
  VPY=$SRC/.venv/bin/python
  if "$VPY" -c "import transformers" 2>/dev/null; then
    "$VPY" - "$W/ref" "$D" <<'PY' && ok "transformers AutoTokenizer loads it: same ids, EOS named" || fail "transformers"
import json, os, sys
from transformers import AutoTokenizer
ref, D = sys.argv[1:3]
t = AutoTokenizer.from_pretrained(ref)
want = [l.split() for l in open(os.path.join(D, "want.ids"))]
docs = [json.loads(l)["text"] for l in open(os.path.join(D, "docs.jsonl"))]
for d, w in list(zip(docs, want))[:40]:
    got = t(d, add_special_tokens=False)["input_ids"] + [t.eos_token_id]
    assert list(map(str, got)) == w, (d[:60], got[:10], w[:10])
assert t.eos_token == "<|end_of_text|>" and len(t) == 8000, (t.eos_token, len(t))
PY
  else
    echo "note: $VPY has no transformers: the transformers check is left out"
  fi
  # a tiktoken ranks file of it loads in tokshard (the ids of its ranks are
  # the tokenizer.json's less the special tokens)
  rm -rf "$D/tt"
  if "$TKS" "${COMMON[@]}" -q --tiktoken --output "$D/tt" "${CORPUS[@]}" 2>"$D/err"; then
    "$TKS" build --tokenizer "$D/tt/tiktoken.json" --output "$D/ttdata" --threads 2 "$D/docs.jsonl" >/dev/null \
      2>"$D/err" && "$TKS" cat "$D/ttdata" --ids >"$D/tt.ids" 2>>"$D/err" || fail "tiktoken build: $(cat "$D/err")"
    python3 - "$D" <<'PY' && ok "tiktoken.json: ids = tokenizer.json's - 2 (its special tokens come after the ranks)" || fail "tiktoken ids"
import sys
D = sys.argv[1]
for g, w in zip(open(D + "/tt.ids"), open(D + "/want.ids")):
    assert [int(x) for x in g.split()] == [int(x) - 2 for x in w.split()[:-1]]
PY
  else
    fail "--tiktoken: $(cat "$D/err")"
  fi
  ;;
prune)
  need_ref
  P=$W/prune
  rm -rf "$P" "$P.partial"
  python3 -c "
import json, sys; p = json.load(open('$W/ref/training.json'))['pruning']
sys.exit(p is not None)" && ok "by default training.json records no pruning" ||
    fail "the default records pruning: $(grep -A3 pruning "$W/ref/training.json")"
  if "$TKS" "${COMMON[@]}" --min-word-count 3 --output "$P" "${CORPUS[@]}" >"$P.out" 2>"$P.err"; then
    ref_words=$(sed -n 's/^merge phase: \([0-9]*\) distinct.*/\1/p' "$W/ref.phase")
    got=$(python3 -c "
import json; d = json.load(open('$P/training.json')); p = d['pruning']
print(p['min_word_count'], p['words_left_out'], d['corpus']['words'])")
    read -r mwc left words <<<"$got"
    [[ $mwc == 3 && $left -gt 0 && $((words + left)) == "$ref_words" ]] &&
      ok "--min-word-count 3: $left of $ref_words words left out, recorded in training.json" ||
      fail "--min-word-count 3: training.json says '$got', the reference had $ref_words words"
  else
    fail "--min-word-count 3: $(cat "$P.err")"
  fi
  # progress on a terminal: counting and merges lines on stderr
  if command -v script >/dev/null; then
    rm -rf "$P-tty"
    script -qec "'$TKS' ${COMMON[*]@Q} --threads 2 --output '$P-tty' ${CORPUS[*]@Q}" /dev/null >"$P-tty.log" 2>&1
    tr '\r' '\n' <"$P-tty.log" >"$P-tty.lines"
    grep -q "^counting: .* read, .* docs, .* pieces, unit " "$P-tty.lines" && grep -q "^merges: [0-9]* of at most" "$P-tty.lines" &&
      grep -q "^merge phase: " "$P-tty.lines" && [[ -f $P-tty/tokenizer.json ]] &&
      ok "on a terminal: $(grep -c . "$P-tty.lines") progress and summary lines ($(grep -m1 '^counting' "$P-tty.lines" | cut -c1-60) ...)" ||
      fail "no progress lines on a terminal: $(head -c 400 "$P-tty.lines")"
  else
    echo "note: no script(1): the terminal's progress lines are not checked"
  fi
  ;;
links)
  need_ref
  L=$W/links
  rm -rf "$L" && mkdir -p "$L/victim" || exit 2
  echo keep >"$L/victim/keep.txt"
  victim_ok() { # the victim directory holds its one file, unchanged
    [[ $(ls -A "$L/victim") == keep.txt && $(cat "$L/victim/keep.txt") == keep ]]
  }
  # OUT.partial a link to another directory: without --resume refused as
  # existing, with --resume refused as a link; nothing in it removed
  ln -s "$L/victim" "$L/a.partial"
  "$TKS" "${COMMON[@]}" -q --output "$L/a" "${CORPUS[@]}" >/dev/null 2>"$L/a.err"
  rc1=$?
  "$TKS" "${COMMON[@]}" -q --resume --output "$L/a" "${CORPUS[@]}" >/dev/null 2>"$L/a2.err"
  rc2=$?
  [[ $rc1 != 0 && $rc2 != 0 && ! -e $L/a ]] && grep -q "symbolic link" "$L/a2.err" && victim_ok &&
    ok "OUT.partial a link: refused (exit $rc1, then --resume exit $rc2: $(cut -c1-100 "$L/a2.err"))" ||
    fail "OUT.partial a link: exit $rc1 / $rc2, victim: $(ls -A "$L/victim" | xargs), $(cat "$L/a.err" "$L/a2.err")"
  # OUT.lock a link to a file: refused, the file not truncated
  ln -s "$L/victim/keep.txt" "$L/b.lock"
  "$TKS" "${COMMON[@]}" -q --output "$L/b" "${CORPUS[@]}" >/dev/null 2>"$L/b.err"
  rc=$?
  [[ $rc != 0 && ! -e $L/b && ! -e $L/b.partial ]] && victim_ok && ok "OUT.lock a link: refused (exit $rc)" ||
    fail "OUT.lock a link: exit $rc, victim: $(ls -A "$L/victim" | xargs), $(cat "$L/b.err")"
  # OUT.partial/publish a link to another directory (planted in the counts
  # that a refused merge phase keeps): --resume writes its files in a new
  # directory of its own and publishes the reference's files
  "$TKS" "${COMMON[@]}" -q --memory 100M --output "$L/c" "${CORPUS[@]}" >/dev/null 2>"$L/c.err"
  want=$(sed -n 's/.*--memory \([0-9]*\) or more.*/\1/p' "$L/c.err")
  if [[ -n $want && -d $L/c.partial ]]; then
    ln -s "$L/victim" "$L/c.partial/publish"
    if "$TKS" "${COMMON[@]}" -q --resume --memory "$want" --output "$L/c" "${CORPUS[@]}" 2>"$L/c.err"; then
      victim_ok && ok "OUT.partial/publish a link: not followed, the victim's files intact" ||
        fail "OUT.partial/publish a link was followed: victim holds $(ls -A "$L/victim" | xargs)"
      [[ -d $L/c && ! -L $L/c ]] && same_as_ref "$L/c" "published past a link at publish/" ||
        fail "OUT is not a directory of its own"
    else
      fail "--resume past a link at publish/: $(cat "$L/c.err")"
    fi
  else
    fail "--memory 100M did not keep the counts: $(cat "$L/c.err")"
  fi
  ;;
*)
  echo "unknown step $STEP" >&2
  exit 2
  ;;
esac
[[ $fails == 0 ]]

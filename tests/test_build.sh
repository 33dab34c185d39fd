#!/usr/bin/env bash
# End-to-end tests of `tokshard` on real text (dict-gcide, python3.11-doc).
# Usage: test_build.sh TOKSHARD WORKDIR CASE   (WORKDIR shared by all cases)
#   CASE: setup | threads | resume | units | parity | containers | errors | cli
# `setup` trains the tokenizers the other cases share (a ctest fixture).
# Every check compares real output or exit codes; any failure exits 1.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
TKS=$1
W=$2
CASE=$3
GCIDE=/usr/share/dictd/gcide.dict.dz
PYDOC=/usr/share/doc/python3.11/html/_sources
same_dataset() { # A B: every file byte-identical
  if diff -r "$1" "$2" >/dev/null; then ok "$3: byte-identical"; else
    fail "$3: $1 and $2 differ: $(diff -rq "$1" "$2" | head -3)"
  fi
}

T=$W/setup          # shared by all cases (written by `setup`)
W=$W/$CASE-run      # this case's scratch space
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 2

case $CASE in
setup)
  rm -rf "$T" && mkdir -p "$T"
  # ~4 MB of the dictionary, one entry per paragraph; and 40 real documentation files
  zcat "$GCIDE" | head -c 4000000 >"$T/gcide.txt"
  mkdir -p "$T/pydoc"
  find "$PYDOC/library" -name '*.rst.txt' | sort | head -40 | xargs -I{} cp {} "$T/pydoc/"
  expect 0 "train BPE tokenizer" -- "$TKS" train-tokenizer --output "$T/bpe" --vocab-size 2000 \
    --byte-fallback --doc-split blank-line --input-sentence-size 60000 "$T/gcide.txt" "$T/pydoc"
  expect 0 "train unigram tokenizer" -- "$TKS" train-tokenizer --output "$T/uni" --model-type unigram \
    --vocab-size 2000 --doc-split blank-line --input-sentence-size 60000 "$T/gcide.txt"
  # reference build used by several cases
  expect 0 "reference build" -- "$TKS" build -q --tokenizer "$T/bpe.model" --output "$T/ref" \
    --doc-split blank-line --append-eos --shard-tokens 100K --chunk-bytes 4K "$T/gcide.txt" "$T/pydoc"
  n=$(ls "$T/ref"/shard-*.tks | wc -l)
  [[ $n -ge 5 ]] && ok "reference has $n shards" || fail "reference has only $n shards"
  ;;

threads)
  for t in 1 2 3; do
    rm -rf "t$t"
    expect 0 "build with $t threads" -- "$TKS" build -q --threads $t --tokenizer "$T/bpe.model" \
      --output "t$t" --doc-split blank-line --append-eos --shard-tokens 100K --chunk-bytes 4K \
      "$T/gcide.txt" "$T/pydoc"
  done
  same_dataset t1 "$T/ref" "1 thread vs reference"
  same_dataset t2 t1 "2 threads vs 1"
  same_dataset t3 t1 "3 threads vs 1"
  # small batches change the parallel schedule, not the output
  rm -rf tb
  expect 0 "build with tiny batches" -- "$TKS" build -q --threads 2 --batch-bytes 10K \
    --tokenizer "$T/bpe.model" --output tb --doc-split blank-line --append-eos \
    --shard-tokens 100K --chunk-bytes 4K "$T/gcide.txt" "$T/pydoc"
  same_dataset tb t1 "tiny batches vs default"
  # whole files as documents: two are over 64 KiB, so batches go longest first
  for t in 1 2; do
    rm -rf "f$t"
    expect 0 "file documents, $t threads" -- "$TKS" build -q --threads $t --tokenizer "$T/bpe.model" \
      --output "f$t" --doc-split file --shard-tokens 100K --chunk-bytes 4K "$T/pydoc"
  done
  same_dataset f2 f1 "file documents: 2 threads vs 1"
  ;;

resume)
  # 1M work units (gcide.txt, 4 MB, is cut in four near each MiB; the docs are
  # grouped) and small batches (which do not change the output: see
  # `threads`) give many kill points
  args=(-q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
    --chunk-bytes 4K --batch-bytes 128K --unit-bytes 1M "$T/gcide.txt" "$T/pydoc")
  expect 0 "reference by 1M units" -- "$TKS" build "${args[@]}" --output rref
  # kill -9 injected from outside (tests/fault_inject.c): after a unit's shard
  # is published, after a unit's record (the unit is complete), and at fsyncs
  # (a temporary file written, not yet durable or renamed)
  [[ -n ${TKS_FAULT_LIB:-} && -r $TKS_FAULT_LIB ]] || { fail "TKS_FAULT_LIB not set (run through ctest)"; finish test_build; }
  for point in shard:0 shard:2 rename:unit.json:2 fsync:3 fsync:10; do
    rm -rf r r.partial
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=$point "$TKS" build "${args[@]}" --output r >/dev/null 2>&1
    code=$?
    [[ $code -eq 137 ]] && ok "killed at $point (exit 137)" || fail "kill at $point: exit $code"
    [[ ! -e r ]] && ok "nothing published under the final name after kill at $point" ||
      fail "r exists after kill at $point"
    # every shard file left under a final name is complete and valid
    for s in r.partial/unit-*/shard-*.tks; do
      [[ -e $s ]] || continue
      "$TKS" audit "$s" >/dev/null 2>&1 || fail "$s left after kill at $point does not audit clean"
    done
    expect 2 "build again without --resume refuses" -- "$TKS" build "${args[@]}" --output r
    expect_msg "--resume"
    expect 0 "resume after kill at $point" -- "$TKS" build "${args[@]:1}" --output r --resume
    if [[ $point == rename:unit.json:2 ]]; then
      grep -Eq "units +[0-9]+ \(2 kept from the interrupted run" "$W/out" && ok "2 complete units kept" ||
        fail "kept units: $(grep units "$W/out")"
    fi
    same_dataset r rref "resumed after kill at $point"
  done
  # a real kill -9 at an arbitrary moment, and Ctrl-C (SIGINT)
  for sig in KILL INT; do
    rm -rf r r.partial
    "$TKS" build "${args[@]}" --threads 1 --output r >/dev/null 2>&1 &
    pid=$!
    sleep 0.6
    kill -s $sig $pid 2>/dev/null
    wait $pid
    code=$?
    echo "SIG$sig: build exited $code"
    if [[ -e r ]]; then
      ok "SIG$sig came after the build finished; nothing to resume"
    else
      [[ $sig == INT && $code -ne 130 ]] && fail "SIGINT: exit $code, expected 130"
      expect 0 "resume after SIG$sig" -- "$TKS" build "${args[@]}" --output r --resume
    fi
    same_dataset r rref "after SIG$sig and resume"
  done
  # each input is read once (its XXH3-128 for the manifest is taken while it
  # is read): gcide.txt, one unit at the default --unit-bytes, is opened for
  # its first 16 bytes by the listing's checks, then once to be read
  rm -rf r r.partial
  LD_PRELOAD=$TKS_FAULT_LIB TKS_COUNT_OPEN=/gcide.txt "$TKS" build "${args[@]:0:10}" "$T/gcide.txt" "$T/pydoc" \
    --output r >/dev/null 2>"$W/err"
  grep -q "fault_inject: 2 open(s) of /gcide.txt" "$W/err" && ok "gcide.txt opened by the listing's check, then read once" ||
    fail "input opens: $(grep fault_inject "$W/err")"
  same_dataset r "$T/ref" "build with hashing while reading"
  # an input edited after the kill, size and mtime kept: the resume hashes the
  # ranges of the units it keeps again, and refuses
  rm -rf r r.partial pyfirst && mkdir pyfirst && cp -p "$T"/pydoc/* pyfirst/
  edited=$(ls pyfirst/* | head -1)
  eargs=(-q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 20K
    --chunk-bytes 4K --batch-bytes 16K --unit-bytes 1M pyfirst "$T/gcide.txt")
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:unit.json:1 "$TKS" build "${eargs[@]}" --output r >/dev/null 2>&1
  [[ -e r.partial/unit-00000/unit.json ]] && ok "unit 0 (pyfirst) complete when killed" || fail "unit 0 not complete"
  python3 - "$edited" <<'EOF2'
import os, sys
p = sys.argv[1]; st = os.stat(p); b = bytearray(open(p, "rb").read())
i = b.index(b"e"); b[i] = ord("a"); open(p, "wb").write(b)
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
EOF2
  expect 2 "resume after an input changed under the same size and mtime" -- "$TKS" build "${eargs[@]}" --output r --resume
  expect_msg "cannot resume: .*$(basename "$edited") changed since the interrupted build"
  # inside a unit: a compressed input is one unit whatever its size; each shard
  # it seals is recorded (unit-N/progress.json), and a resume keeps those
  # shards, reads past what they hold without encoding and goes on
  gzip -9 -c "$T/gcide.txt" >gcide.txt.gz
  gargs=(-q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 100K
    --chunk-bytes 4K --batch-bytes 128K gcide.txt.gz)
  rm -rf gref && expect 0 "reference: gcide.txt.gz, one unit" -- "$TKS" build "${gargs[@]}" --output gref
  ng=$(ls gref/shard-*.tks | wc -l)
  ((ng >= 6)) && ok "the one unit has $ng shards" || fail "gref has $ng shards (want >= 6)"
  for t in 1 2; do
    rm -rf r r.partial
    LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:progress.json:3 "$TKS" build "${gargs[@]}" --threads $t \
      --output r >/dev/null 2>&1
    code=$?
    [[ $code -eq 137 && -e r.partial/unit-00000/progress.json ]] &&
      ok "killed after the unit's 3rd sealed shard was recorded ($t threads)" || fail "kill at progress 3: exit $code"
    expect 0 "resume inside the unit" -- "$TKS" build "${gargs[@]:1}" --threads $((3 - t)) --output r --resume
    grep -Eq "\(3 shards kept from the interrupted run" "$W/out" && ok "3 shards kept, the unit not restarted" ||
      fail "kept shards: $(grep -i kept "$W/out")"
    same_dataset r gref "resumed inside a unit, $t then $((3 - t)) threads"
  done
  # killed between a shard's rename and its record: the shard is built again
  rm -rf r r.partial
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=shards:4 "$TKS" build "${gargs[@]}" --output r >/dev/null 2>&1
  expect 0 "resume after a kill between a shard and its record" -- "$TKS" build "${gargs[@]:1}" --output r --resume
  grep -Eq "\(3 shards kept" "$W/out" && ok "the unrecorded 4th shard was rebuilt" || fail "$(grep -i kept "$W/out")"
  same_dataset r gref "resumed after a kill between shard and record"
  # the records a resume reads past must be those the kept shards came from:
  # a plain input edited in place (size and time kept) after the kill
  rm -rf r r.partial && cp -p "$T/gcide.txt" ged.txt
  pargs=(-q --tokenizer "$T/bpe.model" --doc-split blank-line --shard-tokens 100K --chunk-bytes 4K ged.txt)
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:progress.json:3 "$TKS" build "${pargs[@]}" --output r >/dev/null 2>&1
  python3 - ged.txt <<'EOF2'
import os, sys
p = sys.argv[1]; st = os.stat(p); b = bytearray(open(p, "rb").read())
i = b.index(b"e", 1000); b[i] = ord("a"); open(p, "wb").write(b)
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
EOF2
  expect 2 "resume inside a unit after its input changed in place" -- "$TKS" build "${pargs[@]}" --output r --resume
  expect_msg "cannot resume unit 0: its first [0-9]+ records are not the ones its 3 kept shards were made from"
  # kill -9 at random moments within the first 60% of an uninterrupted build's
  # time, resuming each time: a build that restarted its unit would never end.
  # All of GCIDE, compressed (dict-gcide's 13.5 MB dictzip file): one unit.
  gcide_dz=${TKS_TEST_GCIDE:-/usr/share/dictd/gcide.dict.dz}
  gargs=(-q --tokenizer "$T/bpe.model" --doc-split blank-line --append-eos --shard-tokens 200K "$gcide_dz")
  rm -rf gref && expect 0 "reference: all of GCIDE, one unit" -- "$TKS" build "${gargs[@]}" --threads 1 --output gref
  t0=$(date +%s%N)
  "$TKS" build "${gargs[@]}" --threads 1 --output tref >/dev/null 2>&1
  ms=$((($(date +%s%N) - t0) / 1000000))
  rm -rf r r.partial
  kills=0 kept=0 grew=0 done=0
  for try in $(seq 1 20); do
    resume=()
    ((try > 1)) && resume=(--resume)
    "$TKS" build "${gargs[@]:1}" --threads 1 --output r "${resume[@]}" >"$W/out" 2>&1 &
    pid=$!
    sleep "$(python3 -c "import random; print(round(random.uniform(0.2, 0.6) * $ms / 1000, 3))")"
    if kill -9 $pid 2>/dev/null; then
      wait $pid 2>/dev/null
      # (a build that ended just before the signal is a zombie the kill "hits")
      [[ -e r ]] && { done=1; break; }
      kills=$((kills + 1))
      now=$(python3 -c "import json; print(len(json.load(open('r.partial/unit-00000/progress.json'))['shards']))" \
        2>/dev/null || echo 0)
      ((now > kept)) && grew=$((grew + 1))
      kept=$now
    else
      wait $pid && done=1
      break
    fi
  done
  ((done && kills >= 1 && grew >= 1)) &&
    ok "random kill -9 within 60% of the build's ${ms} ms: finished after $kills kills ($grew made progress)" ||
    fail "random kills: finished $done after $kills kills ($grew made progress, $kept shards kept; want a kill and an end)"
  ((done)) && same_dataset r gref "after $kills random kills"
  # resume refuses other options
  rm -rf r r.partial
  LD_PRELOAD=$TKS_FAULT_LIB TKS_FAULT_KILL=rename:unit.json:1 "$TKS" build "${args[@]}" --output r >/dev/null 2>&1
  expect 2 "resume with another --shard-tokens refuses" -- "$TKS" build "${args[@]}" \
    --shard-tokens 50K --output r --resume
  expect_msg "other inputs, tokenizer or options"
  # a full disk (file size limit) fails cleanly and resumes to the same bytes
  rm -rf r r.partial
  (trap '' XFSZ; ulimit -f 150; exec "$TKS" build "${args[@]}" --output r) >/dev/null 2>"$W/err"
  code=$?
  [[ $code -eq 2 ]] && ok "file size limit: exit 2" || fail "file size limit: exit $code"
  expect_msg "(no space|File too large|file size limit).*--resume|--resume.*(space|limit)"
  [[ ! -e r ]] && ok "nothing published after the write failure" || fail "r published after write failure"
  expect 0 "resume after the write failure" -- "$TKS" build "${args[@]}" --output r --resume
  same_dataset r rref "resumed after a write failure"
  ;;

units)
  # Work units cut plain files at document boundaries (docs/SCALE.md): the
  # documents, and so the ids of the whole dataset, are the same for any
  # --unit-bytes. Text made to catch a cut in the wrong place: paragraphs and
  # lines longer than the 64 KiB window read around a cut, a whitespace-only
  # line longer than it (a blank line whose start is far before the cut),
  # "\r\n" line ends and blank lines of spaces, tabs and "\r", JSON Lines
  # with a byte order mark and a record longer than the window, a file
  # without a last line end, gzip data under a plain name, and a line of
  # text whose 200,000 trailing spaces hold every nominal cut.
  python3 - "$T/gcide.txt" <<'EOF2'
import gzip, json, random, sys
random.seed(11)
words = open(sys.argv[1], encoding="utf-8", errors="replace").read().split()[:50000]
def text(n): return " ".join(random.choice(words) for _ in range(n))
seps = ["\n\n", "\n \n", "\n\t\r\n", "\n\n\n", "\n\r\n", "\n" + " " * 70000 + "\n", "\n \t"]
out = []
for i in range(160):
    r = random.random()
    if r < 0.04: out.append(text(12000))                               # one line > 64 KiB
    elif r < 0.08: out.append("\n".join(text(25) for _ in range(400)))  # a paragraph > 64 KiB
    else: out.append("\n".join(text(random.randint(1, 30)) for _ in range(random.randint(1, 4))))
    out.append(random.choice(seps))
t = "".join(out)
open("mix.txt", "w").write(t)
open("crlf.txt", "w", newline="").write(t.replace("\n", "\r\n")[:900000])
with open("d.jsonl", "w", encoding="utf-8") as f:
    f.write("\ufeff")
    for i in range(1500):
        f.write(json.dumps({"text": text(12000 if i == 700 else random.randint(1, 40))}) + ("\n" if i % 9 else "\n \n"))
open("nonl.txt", "w").write(text(20000))
with gzip.open("packed.txt", "wt") as f: f.write(t[:2000000])
# a paragraph whose first line ends in 200,000 spaces: every multiple of
# 65537 and 100000 in it falls in them, and only a look back to the line's
# start shows that the line is not blank (no cut before "delta epsilon")
open("tail.txt", "w").write("alpha beta\n\ngamma" + " " * 200000 + "\ndelta epsilon\n\nzeta\n")
EOF2
  U=(mix.txt crlf.txt d.jsonl nonl.txt packed.txt tail.txt)
  for split in blank-line line; do
    rm -rf u0 && expect 0 "$split: one unit" -- "$TKS" build -q --threads 2 --tokenizer "$T/bpe.model" \
      --doc-split $split --shard-tokens 200K --output u0 "${U[@]}"
    "$TKS" cat u0 --ids >u0.ids
    for ub in 65537 100000 250K; do
      rm -rf u1 && expect 0 "$split: --unit-bytes $ub" -- "$TKS" build -q --threads 2 --tokenizer "$T/bpe.model" \
        --doc-split $split --shard-tokens 200K --unit-bytes $ub --output u1 "${U[@]}"
      "$TKS" cat u1 --ids >u1.ids
      units=$(grep -o '"start"' u1/manifest.json | wc -l)
      if [[ $units -ge 10 ]] && cmp -s u0.ids u1.ids; then
        ok "$split, --unit-bytes $ub: $units pieces, the same $(wc -l <u0.ids) documents' ids as one unit"
      else fail "$split, --unit-bytes $ub: $units pieces, ids differ: $(cmp u0.ids u1.ids)"; fi
      python3 - u0/manifest.json u1/manifest.json <<'EOF2' && ok "$split, --unit-bytes $ub: same counters" || fail "$split, $ub: counters differ"
import json, sys
a, b = (json.load(open(p))["provenance"]["stats"] for p in sys.argv[1:])
sys.exit(a != b)
EOF2
    done
  done
  # each piece's XXH3-128 in the provenance is that of its bytes
  python3 -c 'import json, sys
for f in json.load(open(sys.argv[1]))["provenance"]["inputs"]:
    for p in f.get("pieces", []): print(f["path"], p["start"], p["end"], p["xxh3_128"])' u1/manifest.json >pieces
  bad=0
  while read -r f a b h; do
    [[ $(tail -c +$((a + 1)) "$f" | head -c $((b - a)) | xxh128sum | cut -d' ' -f1) == "$h" ]] || bad=$((bad + 1))
  done <pieces
  [[ -s pieces && $bad -eq 0 ]] && ok "$(wc -l <pieces) pieces: XXH3-128 of their byte ranges" || fail "$bad pieces hash wrong"
  python3 - u1/manifest.json <<'EOF2' && ok "gzip data under a plain name, larger than a unit, is read whole" ||
import json, os, sys
f = [i for i in json.load(open(sys.argv[1]))["provenance"]["inputs"] if i["path"] == "packed.txt"][0]
sys.exit(not (f["bytes"] > 250 * 1024 and "xxh3_128" in f and "pieces" not in f))
EOF2
    fail "packed.txt was cut"
  ;;

parity)
  # ids equal Debian's spm_encode, per line, for BPE and unigram models
  zcat "$GCIDE" | sed -n '1,200000p' | grep -v '^[[:space:]]*$' | head -20000 >lines.txt
  for m in bpe uni; do
    rm -rf "p$m"
    expect 0 "build $m line documents" -- "$TKS" build -q --tokenizer "$T/$m.model" --output "p$m" \
      --doc-split line lines.txt
    "$TKS" cat "p$m" --ids >"ours.$m"
    spm_encode --model "$T/$m.model" --output_format=id <lines.txt | grep -v '^$' >"theirs.$m"
    n=$(wc -l <"ours.$m")
    if [[ $n -ge 19000 ]] && cmp -s "ours.$m" "theirs.$m"; then
      ok "$m: $n documents, ids identical to spm_encode"
    else
      fail "$m: ids differ from spm_encode ($n docs): $(diff "ours.$m" "theirs.$m" | head -4)"
    fi
  done
  # decoding gives the text back (sentencepiece normalizes whitespace; lines are plain here)
  "$TKS" cat pbpe --raw --limit 200 >decoded.txt
  head -200 lines.txt | sed 's/^[[:space:]]*//; s/[[:space:]]*$//; s/[[:space:]]\+/ /g' >expected.txt
  cmp -s decoded.txt expected.txt && ok "decode(encode(line)) == line for 200 lines" ||
    fail "decoded text differs: $(diff decoded.txt expected.txt | head -4)"
  ;;

containers)
  mkdir -p c && cd c || exit 2
  head -c 500000 "$T/gcide.txt" >g.txt
  cp "$T/pydoc/"*.rst.txt . 2>/dev/null
  ls *.rst.txt | head -5 >members
  rm -rf plain && expect 0 "plain build" -- "$TKS" build -q --tokenizer "$T/bpe.model" --output plain \
    --doc-split line g.txt $(cat members)
  "$TKS" cat plain --ids >plain.ids
  gzip -kf g.txt; xz -kf g.txt; zstd -qf g.txt; bzip2 -kf g.txt; cp g.txt gd.txt && dictzip -f gd.txt
  for f in $(cat members); do gzip -kf "$f"; done
  tar -cf m.tar $(cat members); tar -czf m.tgz $(cat members); tar -cJf m.tar.xz $(cat members)
  tar --zstd -cf m.tar.zst $(cat members); tar -cjf m.tar.bz2 $(cat members); zip -q m.zip $(cat members)
  for comp in g.txt.gz g.txt.xz g.txt.zst g.txt.bz2 gd.txt.dz; do
    for arch in m.tar m.tgz m.tar.xz m.tar.zst m.tar.bz2 m.zip; do
      [[ $comp == g.txt.gz || $arch == m.tar ]] || continue # every type once, not every pair
      rm -rf o && expect 0 "build $comp + $arch" -- "$TKS" build -q --tokenizer "$T/bpe.model" \
        --output o --doc-split line "$comp" "$arch"
      "$TKS" cat o --ids >o.ids
      cmp -s o.ids plain.ids && ok "$comp + $arch: same ids as plain files" ||
        fail "$comp + $arch: ids differ from the plain build"
    done
  done
  # a directory is walked in name order: same as listing its files sorted
  mkdir -p d/sub && cp g.txt d/a.txt && cp $(cat members) d/sub/
  rm -rf od && expect 0 "build a directory" -- "$TKS" build -q --tokenizer "$T/bpe.model" --output od \
    --doc-split line d
  rm -rf ol && expect 0 "build the files listed" -- "$TKS" build -q --tokenizer "$T/bpe.model" --output ol \
    --doc-split line d/a.txt $(ls d/sub/* | sort)
  same_dataset od ol "directory vs sorted file list"
  # JSONL, plain and compressed, with a custom key
  python3 -c '
import json, sys
with open("g.txt", encoding="utf-8", errors="replace") as f:
    for line in f:
        if line.strip(): print(json.dumps({"id": 1, "body": line.rstrip("\n")}))' >docs.jsonl
  gzip -kf docs.jsonl
  for f in docs.jsonl docs.jsonl.gz; do
    rm -rf oj && expect 0 "build $f" -- "$TKS" build -q --tokenizer "$T/bpe.model" --output oj \
      --jsonl-key body "$f"
    rm -rf ot && "$TKS" build -q --tokenizer "$T/bpe.model" --output ot --doc-split line g.txt
    "$TKS" cat oj --ids >oj.ids; "$TKS" cat ot --ids >ot.ids
    cmp -s oj.ids ot.ids && ok "$f: same ids as the text lines" || fail "$f: ids differ from text lines"
  done
  ;;

errors)
  B=(-q --tokenizer "$T/bpe.model")
  printf '{"text": "good one"}\n{"text": "good two"}\n{"text": broken\n{"other": "x"}\n' >bad.jsonl
  rm -rf o o.partial
  expect 2 "JSONL line that does not parse" -- "$TKS" build "${B[@]}" --output o bad.jsonl
  expect_msg "bad.jsonl:3"
  [[ ! -e o ]] && ok "no dataset published on failure" || fail "o published after a JSONL error"
  rm -rf o o.partial
  expect 0 "JSONL bad records skipped by policy" -- "$TKS" build --tokenizer "$T/bpe.model" --output o \
    --on-bad-record skip bad.jsonl
  grep -q "2 bad records" "$W/out" && ok "summary counts 2 bad records" || fail "summary: $(cat "$W/out")"
  # bad records deep in a batch that two threads encode: the shards are
  # written while the batch is still being encoded, and the error is still
  # the first bad record in input order, with nothing published
  python3 -c '
import json, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1], encoding="utf-8", errors="replace") if l.strip()][:40000]
for i, l in enumerate(lines):
    print("{\"text\": broken" if i in (30000, 30001, 35000) else json.dumps({"text": l}))' "$T/gcide.txt" >deep.jsonl
  for t in 1 2; do
    rm -rf o o.partial
    expect 2 "bad record deep in a batch, $t threads" -- "$TKS" build "${B[@]}" --threads $t --output o \
      deep.jsonl
    expect_msg "deep.jsonl:30001:"
    [[ ! -e o ]] && ok "nothing published ($t threads)" || fail "o published after a deep JSONL error"
  done
  rm -rf o o.partial
  printf 'fine line\nbad \xff\xfe byte\nlast \xc3\x28 one\n' >bad8.txt
  rm -rf o o.partial
  expect 2 "invalid UTF-8 under fail" -- "$TKS" build "${B[@]}" --output o --doc-split line \
    --invalid-utf8 fail bad8.txt
  expect_msg "bad8.txt:2"
  rm -rf o o.partial
  expect 0 "invalid UTF-8 skipped" -- "$TKS" build --tokenizer "$T/bpe.model" --output o --doc-split line \
    --invalid-utf8 skip bad8.txt
  [[ $("$TKS" cat o --ids | wc -l) -eq 1 ]] && ok "only the valid line kept" || fail "skip kept wrong docs"
  rm -rf o o.partial
  expect 0 "invalid UTF-8 replaced" -- "$TKS" build --tokenizer "$T/bpe.model" --output o --doc-split line bad8.txt
  grep -q "2 documents, 3 sequences replaced" "$W/out" && ok "replacement counted" ||
    fail "replacement summary: $(grep invalid "$W/out")"
  head -c 300000 "$T/gcide.txt" | gzip >trunc.gz.full && head -c 20000 trunc.gz.full >trunc.gz
  rm -rf o o.partial
  expect 2 "truncated gzip stream" -- "$TKS" build "${B[@]}" --output o trunc.gz
  expect_msg "trunc.gz"
  head -c 100000 "$T/gcide.txt" >long.txt
  rm -rf o o.partial
  expect 2 "document over --max-doc-bytes under fail" -- "$TKS" build "${B[@]}" --output o \
    --max-doc-bytes 50K --on-long-doc fail long.txt
  expect_msg "max-doc-bytes"
  rm -rf o o.partial
  printf '\n\n   \n' >empty.txt
  expect 2 "input without any text" -- "$TKS" build "${B[@]}" --output o --doc-split line empty.txt
  expect_msg "no document"
  rm -rf o o.partial
  expect 2 "missing input" -- "$TKS" build "${B[@]}" --output o /nonexistent/file.txt
  expect_msg "/nonexistent/file.txt"
  expect 2 "not a tokenizer" -- "$TKS" build -q --tokenizer "$T/gcide.txt" --output o "$T/gcide.txt"
  expect_msg "gcide.txt"
  expect 2 "output exists" -- "$TKS" build "${B[@]}" --output "$T/ref" "$T/gcide.txt"
  expect_msg "already exists"
  # corruption found by audit: exit 1, names shard, chunk and offset
  rm -rf bad && cp -r "$T/ref" bad
  printf '\x01' | dd of=bad/shard-00002.tks bs=1 seek=9000 conv=notrunc 2>/dev/null
  expect 1 "audit finds a flipped byte" -- "$TKS" audit bad
  grep -Eq "shard 2 chunk [0-9]+ token [0-9]+" "$W/out" && ok "audit names shard, chunk and token" ||
    fail "audit output: $(head -3 "$W/out")"
  rm -rf bad && cp -r "$T/ref" bad && truncate -s -1 bad/shard-00001.tks
  expect 2 "open refuses a truncated shard" -- "$TKS" cat bad --ids
  expect_msg "shard-00001.tks.*truncated"
  expect 1 "audit reports the truncation" -- "$TKS" audit bad
  expect 1 "audit --model-vocab below the ids" -- "$TKS" audit "$T/ref" --model-vocab 1000
  grep -q "model-vocab 1000" "$W/out" && ok "model vocab named" || fail "model vocab not named"
  expect 1 "audit --tokenizer of another model" -- "$TKS" audit "$T/ref" --tokenizer "$T/uni.model"
  expect 0 "audit --tokenizer of the right model" -- "$TKS" audit "$T/ref" --tokenizer "$T/bpe.model"
  rm -rf bad && cp -r "$T/ref" bad && rm bad/manifest.json
  expect 1 "audit of an unfinished dataset" -- "$TKS" audit bad
  expect 2 "open of a dataset without its manifest" -- "$TKS" inspect bad
  expect_msg "bad is not a tokshard dataset: .*bad/manifest.json"
  mkdir bad.partial
  expect 2 "open of an unfinished dataset" -- "$TKS" inspect bad
  expect_msg "bad.partial.*--resume"
  expect 1 "audit of an unfinished dataset names the build" -- "$TKS" audit bad
  grep -q "bad.partial" "$W/out" && ok "audit names bad.partial" || fail "audit: $(cat "$W/out")"
  rmdir bad.partial
  ;;

cli)
  expect 2 "no arguments" -- "$TKS"
  expect 2 "unknown command" -- "$TKS" frobnicate
  expect_msg "unknown command"
  expect 0 "help" -- "$TKS" help
  expect 0 "--version" -- "$TKS" --version
  expect 2 "build without --tokenizer" -- "$TKS" build --output x "$T/gcide.txt"
  expect_msg "--tokenizer"
  expect 2 "bad --doc-split" -- "$TKS" build --tokenizer "$T/bpe.model" --output x --doc-split words "$T/gcide.txt"
  expect_msg "--doc-split words"
  expect 2 "bad --shard-tokens" -- "$TKS" build --tokenizer "$T/bpe.model" --output x --shard-tokens lots "$T/gcide.txt"
  expect_msg "--shard-tokens lots"
  expect 2 "bad --chunk-bytes" -- "$TKS" build --tokenizer "$T/bpe.model" --output x --chunk-bytes 10 "$T/gcide.txt"
  expect 2 "unknown build flag" -- "$TKS" build --tokenizer "$T/bpe.model" --output x --fast "$T/gcide.txt"
  expect_msg "unknown option --fast"
  expect 0 "audit clean dataset" -- "$TKS" audit "$T/ref"
  grep -q "^OK: " "$W/out" && ok "audit says OK" || fail "audit output: $(cat "$W/out")"
  expect 0 "audit --json" -- "$TKS" audit "$T/ref" --json
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and d["shards"]>=5, d' "$W/out" &&
    ok "audit --json parses" || fail "audit --json"
  expect 0 "audit one shard" -- "$TKS" audit "$T/ref/shard-00000.tks"
  expect 2 "audit a missing path" -- "$TKS" audit /nonexistent
  expect 0 "inspect" -- "$TKS" inspect "$T/ref"
  grep -q "most frequent tokens" "$W/out" && grep -q "document length" "$W/out" && ok "inspect sections" ||
    fail "inspect output"
  expect 0 "inspect --json" -- "$TKS" inspect "$T/ref" --json --top 5
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["top_tokens"])==5 and d["n_tokens"]>0' "$W/out" &&
    ok "inspect --json parses" || fail "inspect --json"
  expect 0 "cat --doc 3 --ids" -- "$TKS" cat "$T/ref" --doc 3 --ids
  [[ $(wc -l <"$W/out") -eq 1 ]] && ok "one document printed" || fail "cat --doc printed $(wc -l <"$W/out") lines"
  expect 0 "cat --text" -- "$TKS" cat "$T/ref" --doc 0
  grep -q '[A-Za-z]' "$W/out" && ok "decoded text" || fail "cat text: $(head -c 200 "$W/out")"
  expect 2 "cat --doc out of range" -- "$TKS" cat "$T/ref" --doc 99999999
  expect_msg "has [0-9]+ documents"
  expect 2 "cat --text of a lone shard" -- "$TKS" cat "$T/ref/shard-00000.tks"
  ;;
*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac

finish test_build

#!/usr/bin/env bash
# bench_audit_source.sh - tokshard audit --against-source on the Linux 6.1
# sources, built three ways with cl100k (a byte-level tokenizer):
#   jsonl    the unpacked tree as JSON Lines, one record per regular file
#            without NUL bytes (1.38 GB; a plain file: one read per document)
#   parquet  the same records as Parquet, zstd, row groups of 2,000 rows
#            (needs .venv-arrow: scripts/install-venv.sh)
#   tarxz    /usr/src/linux-source-6.1.tar.xz as built, one document per file
# For each: the build's wall time, then --sample N with seeds 1..ROUNDS
# (wall time, and the audit's own split into reading, hashing the inputs
# and encoding), and --all on the JSON Lines dataset.
# usage: bench/bench_audit_source.sh [--bin build/bin] [--work DIR] [--tree DIR]
#          [--ranks FILE.tiktoken] [--sample N] [--rounds N] [--kinds jsonl,parquet,tarxz]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
BIN=build/bin WORK=/tmp/bench-audit-source TREE=/usr/src/linux-source-6.1 SAMPLE=1000 ROUNDS=3
TAR=/usr/src/linux-source-6.1.tar.xz RANKS="" KINDS=jsonl,parquet,tarxz
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --tree) TREE=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --sample) SAMPLE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    *) echo "bench_audit_source.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
TKS=$(cd "$BIN" && pwd)/tokshard
need_tokshard "$TKS"
[[ -d $TREE ]] || { echo "bench_audit_source.sh: no tree at $TREE: unpack $TAR there (tar -xJf), or give --tree" >&2; exit 2; }
[[ -n $RANKS && -s $RANKS ]] || {
  echo "bench_audit_source.sh: give --ranks cl100k_base.tiktoken (tiktoken's ranks file)" >&2; exit 2; }
mkdir -p "$WORK"
RANKS=$(cd "$(dirname "$RANKS")" && pwd)/$(basename "$RANKS")
cd "$WORK"
export TOKSHARD_CACHE_DIR=off
B=(--threads 2 --tokenizer "$RANKS" --pattern cl100k --append-eos)
wall() { /usr/bin/time -f %e -o .wall "$@" >.out 2>&1; cat .wall; }
load() { cut -d' ' -f1 /proc/loadavg; }

if [[ ! -s linux.jsonl ]]; then
  python3 - "$TREE" linux.jsonl <<'EOF'
import json, os, sys
root, out = sys.argv[1], sys.argv[2]
with open(out, "w", encoding="utf-8") as f:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(d, name)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            b = open(p, "rb").read()
            if b and b"\0" not in b:
                f.write(json.dumps({"path": os.path.relpath(p, root), "text": b.decode("utf-8", "replace")},
                                   ensure_ascii=False) + "\n")
EOF
fi
for kind in ${KINDS//,/ }; do
  case $kind in
    jsonl) in=(linux.jsonl) ;;
    parquet)
      if [[ ! -s linux.parquet ]]; then
        "$OLDPWD/.venv-arrow/bin/python" - linux.jsonl linux.parquet <<'EOF'
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
rows = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
pq.write_table(pa.table({"text": rows}), sys.argv[2], row_group_size=2000, compression="zstd")
EOF
      fi
      in=(linux.parquet) ;;
    tarxz) in=(--doc-split file --format text "$TAR") ;;
    *) echo "bench_audit_source.sh: unknown kind $kind" >&2; exit 2 ;;
  esac
  rm -rf "ds-$kind"
  echo "$kind: build $(wall "$TKS" build -q "${B[@]}" --output "ds-$kind" "${in[@]}") s (load $(load))"
  for ((s = 1; s <= ROUNDS; s++)); do
    l=$(load)
    w=$(wall "$TKS" audit "ds-$kind" --against-source --sample "$SAMPLE" --seed "$s")
    echo "$kind: --sample $SAMPLE --seed $s: wall $w s (load $l): $(grep -o '[0-9.]* s (reading.*' .out)"
  done
done
if [[ $KINDS == *jsonl* ]]; then
  l=$(load)
  w=$(wall "$TKS" audit ds-jsonl --against-source --all)
  echo "jsonl: --all: wall $w s (load $l): $(grep -o '[0-9]* compared.*' .out)"
fi

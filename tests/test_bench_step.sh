#!/usr/bin/env bash
# tokshard-bench-gpu on the CPU backend: the benchmark's step (tks_step_bench)
# runs the trainer's step and reports what it measured.
# The loss bound: with init_std 0.02 the logits of the tiny config have a
# standard deviation of about 0.02 * sqrt(dim 128) = 0.23, so the first loss is
# ln(1000) + 0.23^2 / 2 = 6.93 nats; 3 AdamW steps at a warm-up learning rate
# (3e-4 * t / 10) move it by far less than the 0.5 allowed here.
# Usage: test_bench_step.sh BENCH_BINARY
set -uo pipefail
BIN=$1
CASE=bench_step
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "$0")/lib.sh"
if "$BIN" tiny 2 64 3 1 fp32 cpu >"$W/out" 2>"$W/err"; then
  ok "tokshard-bench-gpu runs on the cpu backend"
else
  fail "tokshard-bench-gpu failed: $(cat "$W/err")"
fi
python3 - "$W/out" <<'PY' && ok "its JSON has the run's fields, a finite loss near ln(V) and a step time" || fail "bad JSON: $(cat "$W/out")"
import json, math, sys
r = json.load(open(sys.argv[1]))
assert r["backend"] == "cpu" and r["config"] == "tiny" and r["B"] == 2 and r["T"] == 64, r
assert abs(r["loss"] - math.log(1000)) < 0.5, r["loss"]
assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["params"] > 0, r
PY
# two micro-batches a step: twice the tokens a step, the same loss bound
if TKS_LOSS_CHUNK_ROWS=48 "$BIN" --accum 2 tiny 2 64 3 1 bf16 cpu >"$W/out2" 2>"$W/err"; then
  ok "--accum 2 (bf16, chunked loss head) runs on the cpu backend"
else
  fail "--accum 2 failed: $(cat "$W/err")"
fi
python3 - "$W/out2" <<'PY' && ok "--accum 2: accum 2 in the JSON, tokens/s over both micro-batches, the opt-in flag named" ||
import json, math, sys
r = json.load(open(sys.argv[1]))
assert r["accum"] == 2 and r["dtype"] == "bf16", r
assert abs(r["tokens_per_s"] * r["step_s"] - 2 * 2 * 64) < 1e-2 * 256, r
assert abs(r["loss"] - math.log(1000)) < 0.5, r["loss"]
assert r["opt_in"] == "TKS_LOSS_CHUNK_ROWS=48", r
PY
  fail "bad --accum JSON: $(cat "$W/out2")"
"$BIN" tiny 2 300 3 1 fp32 cpu >/dev/null 2>"$W/err"
[[ $? == 2 ]] && grep -q "T <= 256" "$W/err" && ok "a sequence longer than the config's is refused" ||
  fail "T 300 was not refused: $(cat "$W/err")"
finish test_bench_step

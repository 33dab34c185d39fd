#!/usr/bin/env python3
"""layout_losses.py A_METRICS B_METRICS FROM TO CKPT_DIR SEQ_LEN: steps FROM..TO
of two runs of the same model under different parallel layouts (or comms) agree
within a tolerance derived from the computation; exit 1 when they do not.

The layouts compute the same sums in other orders (tp splits the matmuls and
the vocabulary, dp the batch), so step s's loss differs by rounding only. A sum
of K float32 terms is within lam sqrt(K) u of the exact sum (relative to its
terms' magnitudes) with probability >= 1 - 2 exp(-lam^2 / 2) (Higham and Mary,
"A new approach to probabilistic rounding error analysis", SIAM J. Sci.
Comput. 41(5), 2019, Thm. 2.4); lam = 6 makes that 3e-8 per sum. K is the
longest chain of sums of one forward (config.json of A's newest checkpoint; the
vocabulary padded for tp <= 4), and each earlier step adds at most its own
rounding to first order (Adam passes a relative gradient error on to the
update at most 1:1), so the tolerance at step s is (s + 1) lam sqrt(K) u."""
import glob, json, math, os, sys


def losses(p):
    d = {}
    for line in open(p):
        j = json.loads(line)
        if "loss" in j:
            d[j["step"]] = j["loss"]
    return d


a, b = losses(sys.argv[1]), losses(sys.argv[2])
lo, hi, T = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[6])
cfg = json.load(open(sorted(glob.glob(os.path.join(sys.argv[5], "step-*", "config.json")))[-1]))
C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
F, VP = cfg["intermediate_size"], cfg["vocab_size"] + 64 * 4
K = L * (4 * C + C // NH + 2 * T + C + F) + 2 * C + VP + 8 * T
per_step = 6 * math.sqrt(K) * 2.0 ** -24
# BF16=1 (environment): the model computes on bf16 copies of the fp32 master
# weights. A micro-batch's computation is the same on every layout (same
# shapes, same weights); the layouts differ in the fp32 order of the gradient
# sums, so the masters differ by about per_step relative. A bf16 copy then
# differs only where that moved a master across a bf16 rounding boundary:
# with probability per_step / u16 an element changes by u16 = 2^-8 relative,
# an RMS perturbation of sqrt(per_step u16) of the weights, which the loss
# passes on at most 1:1 to first order (as above).
if os.environ.get("BF16") == "1":
    per_step = math.sqrt(per_step * 2.0 ** -8)
# BF16_TP=1: bf16 with tp > 1 against tp = 1. A row-parallel GEMM's output
# (attention out, MLP down) is rounded to bf16 on each tp rank and the
# all-reduce rounds the sum once more; the activation gradients reduced over
# tp in the backward likewise. That is one extra bf16 rounding (relative
# error <= u16 = 2^-8 of the terms) at 2L points of the forward and 2L + 1 of
# the backward; to first order each moves the loss by at most u16 relative,
# so per step at most (4L + 1) u16 (a worst case: the roundings of different
# elements are independent and mostly cancel in the loss). This bound is
# loose: it catches a tp all-reduce that mangles bf16 data, but a bf16 tp
# all-reduce left out of the model moved the losses by 1.2e-2 (measured),
# inside it; the fp32 layouts (parallel_layouts) check the tp algebra tightly.
if os.environ.get("BF16_TP") == "1":
    per_step = (4 * L + 1) * 2.0 ** -8
worst, worst_ratio = 0.0, 0.0
for s in range(lo, hi + 1):
    if s not in a or s not in b:
        print(f"step {s} missing")
        sys.exit(1)
    d = abs(a[s] - b[s]) / abs(a[s])
    worst = max(worst, d)
    worst_ratio = max(worst_ratio, d / ((s + 1) * per_step))
print(f"max relative loss difference over steps {lo}..{hi}: {worst:.2e} "
      f"({worst_ratio:.1e} of the bound, {per_step:.1e} per step, K {K})")
sys.exit(0 if worst_ratio <= 1 else 1)

#!/usr/bin/env python3
"""A tokshard checkpoint exported for Hugging Face, checked with transformers
4.45.2 (the project venv): the model's logits on real text against tokshard's
own forward pass, and AutoTokenizer's ids against spm_encode's on every
non-empty line of the Python documentation.

Usage: test_hf.py HF_DIR CHECKPOINT HF_LOGITS_DUMP BPE_MODEL UNI_DIR UNI_MODEL WORK
"""
import glob
import json
import math
import os
import subprocess
import sys

import numpy
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HF, CKPT, DUMP, BPE, UNI_DIR, UNI, WORK = sys.argv[1:8]
PYDOC = "/usr/share/doc/python3.11/html/_sources"
fails = 0


def check(cond, what):
    global fails
    print(("ok   [hf]: " if cond else "FAIL [hf]: ") + what, file=sys.stdout if cond else sys.stderr)
    fails += not cond


os.makedirs(WORK, exist_ok=True)
cfg = json.load(open(os.path.join(HF, "config.json")))
tok = AutoTokenizer.from_pretrained(HF)
check(type(tok).__name__ == "LlamaTokenizerFast", f"AutoTokenizer gives {type(tok).__name__}")
check((cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) ==
      (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id),
      f"config.json bos/eos/pad ids {cfg['bos_token_id']}, {cfg['eos_token_id']}, {cfg['pad_token_id']} "
      f"are the tokenizer's")

# 1. logits on real text: transformers' LlamaForCausalLM vs tokshard's forward
text = open(os.path.join(PYDOC, "tutorial", "introduction.rst.txt")).read()
ids = tok(text)["input_ids"][:cfg["max_position_embeddings"]]
check(ids[0] == tok.bos_token_id and len(ids) == cfg["max_position_embeddings"],
      f"{len(ids)} ids of tutorial/introduction.rst.txt, BOS first")
ids_path, out_path = os.path.join(WORK, "ids.txt"), os.path.join(WORK, "logits.f32")
open(ids_path, "w").write(" ".join(map(str, ids)) + "\n")
subprocess.run([DUMP, CKPT, ids_path, out_path], check=True)
V = cfg["vocab_size"]
ours = numpy.fromfile(out_path, dtype="<f4").reshape(len(ids), V).astype(numpy.float64)
model = AutoModelForCausalLM.from_pretrained(HF, torch_dtype=torch.float32).eval()
x = torch.tensor([ids])
with torch.no_grad():
    hf32 = model(x).logits[0].double().numpy()
    ref = model.double()(x).logits[0].numpy()
# Tolerance from the computation: every logit is the end of a chain of float32
# inner products (per layer: the q/k/v projections, the scores, the weighted
# sum of values, the output projection, gate/up, down, and two RMSNorm sums;
# then the final norm and lm_head). With the probabilistic rounding-error bound
# of Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019), an inner product of
# length K carries a relative error of about sqrt(K) u (u = 2^-24) of the sum
# of the magnitudes of its terms; along the chain the errors add. Each
# implementation gets that bound against float64; the two against each other
# twice it.
u = 2.0 ** -24
L, dim, ffn, T = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], len(ids)
chain = 8 * L + 2
kmax = max(dim, ffn, T)
scale = numpy.abs(ref).max()
bound = chain * math.sqrt(kmax) * u * scale
e_ours, e_hf = numpy.abs(ours - ref).max(), numpy.abs(hf32 - ref).max()
e_pair = numpy.abs(ours - hf32).max()
check(e_ours <= bound, f"tokshard float32 logits vs float64: max |diff| {e_ours:.3g} <= bound {bound:.3g} "
                       f"({chain} chained sums, K <= {kmax}, max |logit| {scale:.3g})")
check(e_hf <= bound, f"transformers float32 logits vs float64: max |diff| {e_hf:.3g} <= {bound:.3g}")
check(e_pair <= 2 * bound, f"tokshard vs transformers logits: max |diff| {e_pair:.3g} <= {2 * bound:.3g} "
                           f"({'within' if e_pair <= 1e-5 else 'NOT within'} 1e-5)")
check(int(numpy.argmax(ours[-1])) == int(numpy.argmax(hf32[-1])), "same greedy next token")

# 2. tokenizers against spm_encode on every non-empty line of the Python docs
lines = []
for f in sorted(glob.glob(os.path.join(PYDOC, "**", "*.txt"), recursive=True)):
    lines += [l for l in open(f, encoding="utf-8", errors="replace").read().split("\n") if l.strip()]
lines_path = os.path.join(WORK, "lines.txt")
open(lines_path, "w").write("\n".join(lines) + "\n")


def spm_ids(model):
    out = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id", f"--input={lines_path}"],
                         check=True, capture_output=True, text=True).stdout.split("\n")
    return [[int(t) for t in o.split()] for o in out[:len(lines)]]


def mismatches(t, want, batch):
    got = t(lines, add_special_tokens=False)["input_ids"] if batch else \
        [t.encode(l, add_special_tokens=False) for l in lines]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    for i in bad[:3]:
        print(f"     line {i}: {lines[i][:60]!r}: {got[i][:10]} vs spm {want[i][:10]}")
    return len(bad)


n = mismatches(tok, spm_ids(BPE), True)
check(n == 0, f"BPE: AutoTokenizer (fast) ids equal spm_encode's on all {len(lines)} lines: {n} mismatches")
check(tok.decode(tok(lines[100])["input_ids"], skip_special_tokens=True) == " ".join(lines[100].split()),
      "decode(encode(line)) gives the line back (whitespace runs collapsed, as sentencepiece does)")
want = spm_ids(UNI)
fast = AutoTokenizer.from_pretrained(UNI_DIR)
n_fast = mismatches(fast, want, True)
print(f"     unigram, fast tokenizer: {n_fast} of {len(lines)} lines differ from spm_encode")
slow = AutoTokenizer.from_pretrained(UNI_DIR, use_fast=False)
n_slow = mismatches(slow, want, False)
check(type(slow).__name__ == "LlamaTokenizer" and n_slow == 0,
      f"unigram: AutoTokenizer(use_fast=False) ids equal spm_encode's on all lines: {n_slow} mismatches "
      f"(the fast one: {n_fast})")
sys.exit(1 if fails else 0)

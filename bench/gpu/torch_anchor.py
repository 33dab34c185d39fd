#!/usr/bin/env python3
"""PyTorch anchor of the GPU benchmark: a LLaMA training step on one GPU in
eager mode and under torch.compile, the numbers tokshard's CUDA backend is
compared with (bench/gpu/run.sh). Usable on its own:

  python3 bench/gpu/torch_anchor.py --config 1b --batch 2 --seq 2048 --mode compile

Model (written here, nothing imported from tokshard or transformers):
embedding; per layer x += o(sdpa(rope(q), rope(k), v)) on RMSNorm(x) and
x += down(silu(gate(h)) * up(h)) on h = RMSNorm(x); RoPE rotate_half (Hugging
Face layout, fp32 angles); GQA through F.scaled_dot_product_attention
(enable_gqa, causal: PyTorch's flash attention); final RMSNorm; untied head
unless the config ties; cross-entropy (mean). One step = zero_grad + forward +
backward + clip_grad_norm_(1.0) + AdamW(fused=True) step; with --accum K,
zero_grad + K x (forward + backward of loss / K) + clip + AdamW step, the
gradient accumulation tokshard-bench-gpu --accum K runs. --accum 1,8 runs
both in one process, one JSON line each (the compiled graph, a micro-batch's
forward and backward, is the same, so torch.compile compiles once).

Precision: --dtype bf16 is torchtitan's single-GPU mixed precision: fp32
parameters and AdamW state, forward/backward under
torch.autocast(bfloat16); --dtype fp32 is plain fp32 with TF32 off (the
match for tokshard's fp32 reference mode).

MFU: torchtitan's formula (torchtitan/tools/utils.py get_num_flop_per_token):
flops/token = 6 * (params - token embedding) + 12 * L * H * Q * T, against
989e12 FLOP/s (H100 SXM / H200 dense bf16; --peak to change).

Data: uniform random token ids from a fixed seed (the throughput does not
depend on the ids), the same generator as tokshard-bench-gpu's stream is not
needed since no values are compared.

Prints one JSON object per --accum value (tokens/s is the median over timed steps; peak memory
from torch.cuda.max_memory_allocated).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # Llama-3.2-1B shape, untied head
    "1b": dict(vocab=128256, dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, theta=500000.0,
               tie=False, max_seq=2048),
    # GPT-2-small class with LLaMA blocks, tied as in llm.c
    "124m": dict(vocab=50257, dim=768, layers=12, heads=12, kv_heads=12, ffn=2048, theta=10000.0,
                 tie=True, max_seq=1024),
    "tiny": dict(vocab=1000, dim=128, layers=2, heads=4, kv_heads=2, ffn=256, theta=10000.0,
                 tie=False, max_seq=256),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).type_as(x)


def rope_tables(T, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv = c["dim"], c["heads"], c["kv_heads"]
        self.h, self.kv, self.hd = h, kv, d // h
        self.attn_norm = RMSNorm(d)
        self.q = nn.Linear(d, h * self.hd, bias=False)
        self.k = nn.Linear(d, kv * self.hd, bias=False)
        self.v = nn.Linear(d, kv * self.hd, bias=False)
        self.o = nn.Linear(h * self.hd, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.gate = nn.Linear(d, c["ffn"], bias=False)
        self.up = nn.Linear(d, c["ffn"], bias=False)
        self.down = nn.Linear(c["ffn"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q = (q.float() * cos + rotate_half(q.float()) * sin).type_as(v)
        k = (k.float() * cos + rotate_half(k.float()) * sin).type_as(v)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"])
        self.head = nn.Linear(c["dim"], c["vocab"], bias=False)
        if c["tie"]:
            self.head.weight = self.embed.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets, cos, sin):
        x = self.embed(ids)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def no_tf32():
    """fp32 matrix products and convolutions in IEEE fp32, TF32 off. PyTorch
    2.9 added per-backend `fp32_precision` settings and deprecated
    `allow_tf32`; mixing the two APIs raises, so the new one is used where it
    exists and the old one only before it."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        m.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        m.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=0, help="default: the config's max_seq")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--peak", type=float, default=989e12)
    ap.add_argument("--accum", default="1", help="micro-batches a step, or a comma-separated list to run in turn")
    a = ap.parse_args()
    accums = [int(x) for x in a.accum.split(",")]
    if not accums or min(accums) < 1:
        ap.error("--accum: positive integers, e.g. 1 or 1,8")
    if not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch", "error": "no CUDA device"}))
        return 77
    c = CONFIGS[a.config]
    T = a.seq or c["max_seq"]
    dev = torch.device("cuda")
    no_tf32()
    torch.manual_seed(0)
    model = Llama(c).to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    cos, sin = rope_tables(T, c["dim"] // c["heads"], c["theta"], dev)
    fwd = torch.compile(model) if a.mode == "compile" else model
    g = torch.Generator(device=dev).manual_seed(42)
    n_params = sum(p.numel() for p in model.parameters())
    nonemb = n_params - model.embed.weight.numel()
    hd = c["dim"] // c["heads"]
    flop_tok = 6 * nonemb + 12 * c["layers"] * c["heads"] * hd * T

    def step(accum=1):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            ids = torch.randint(0, c["vocab"], (a.batch, T), device=dev, generator=g)
            tg = torch.randint(0, c["vocab"], (a.batch, T), device=dev, generator=g)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = fwd(ids, tg, cos, sin)
            (loss / accum).backward()
            total = total + loss.detach() / accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    # warm-up (under compile: tracing and compiling the forward and the
    # backward happen here), timed apart from the steps that are measured
    t_compile = time.perf_counter()
    for _ in range(max(a.warmup, 1 if a.mode == "compile" else 0)):
        loss = step()
    torch.cuda.synchronize()
    t_compile = time.perf_counter() - t_compile
    for accum in accums:
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(a.steps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step(accum)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        report(a, T, accum, times, flop_tok, loss, t_compile, n_params)
    return 0


def report(a, T, accum, times, flop_tok, loss, t_compile, n_params):
    med = statistics.median(times)
    tps = a.batch * T * accum / med
    print(json.dumps({
        "impl": "pytorch-" + a.mode, "dtype": a.dtype, "config": a.config, "B": a.batch, "T": T,
        "accum": accum, "steps": a.steps, "step_s": round(med, 5), "step_s_all": [round(t, 5) for t in times],
        "tokens_per_s": round(tps, 1), "flop_per_token": flop_tok, "mfu": round(tps * flop_tok / a.peak, 4),
        "peak_bytes": torch.cuda.max_memory_allocated(), "params": n_params, "loss": round(loss.item(), 4),
        "warmup_s": round(t_compile, 1), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())

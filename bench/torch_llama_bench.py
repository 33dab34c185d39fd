#!/usr/bin/python3
"""Training throughput of a PyTorch LLaMA with the tokshard-train architecture.

Run with Debian's /usr/bin/python3 (python3-torch). Nothing is imported from
the project; the model is written from the architecture (the same one that
tests/test_torch_parity.py checks the C trainer against, here in float32 and
in the Hugging Face LlamaForCausalLM eager style of torch 1.13):

  embedding; per layer x += o(attn(RMSNorm(x))), x += down(silu(gate(h)) * up(h))
  with h = RMSNorm(x); RoPE rotate_half (HF layout); GQA by repeating k/v heads;
  causal softmax attention with an additive mask; final RMSNorm; untied
  lm_head; cross-entropy (mean over B*T tokens).

One training step = zero_grad + forward + backward + clip_grad_norm_ +
AdamW step (decay on 2-d tensors only, lr from the trainer's warmup/cosine
schedule), on windows of seq_len + 1 tokens of a tokshard dataset read with
numpy (docs/FORMAT.md: token section at offset 4096, uint16/uint32 ids).

Prints one JSON object: per-step seconds and tokens/s, the median over the
timed steps, and the configuration.
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

import numpy as np


def load_tokens(dataset, need):
    """The first `need` tokens of the dataset's shards, in shard order."""
    out, have = [], 0
    for path in sorted(glob.glob(os.path.join(dataset, "shard-*.tks"))):
        with open(path, "rb") as f:
            head = f.read(256)
        if head[:8] != b"TKSHARD\x1a":
            raise SystemExit("%s: not a tokshard shard" % path)
        tb = int.from_bytes(head[16:20], "little")
        n = int.from_bytes(head[64:72], "little")
        off = int.from_bytes(head[80:88], "little")
        arr = np.memmap(path, dtype=np.uint16 if tb == 2 else np.uint32, mode="r",
                        offset=off, shape=(n,))
        take = min(n, need - have)
        out.append(np.asarray(arr[:take], dtype=np.int64))
        have += take
        if have >= need:
            break
    return np.concatenate(out)


def add_shape_args(ap):
    """The model's, the batch's and the threads' options (torch_train_ops.py takes the same)."""
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=2)
    ap.add_argument("--ffn-dim", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)


def shape_of(a):
    """V, C, L, NH, NKV, FF, HD, T, B of add_shape_args's options (FF: the trainer's default when 0)."""
    V, C, L, NH = a.vocab, a.dim, a.n_layers, a.n_heads
    NKV = a.n_kv_heads or NH
    FF = a.ffn_dim or (8 * C // 3 + 31) // 32 * 32
    return V, C, L, NH, NKV, FF, C // NH, a.seq_len, a.batch


def lr_at(a, s):
    if a.warmup and s < a.warmup:
        return a.lr * (s + 1) / a.warmup
    total = a.total_steps
    if s >= total or total <= a.warmup:
        return a.min_lr
    p = (s - a.warmup) / (total - a.warmup)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", required=True)
    add_shape_args(ap)
    ap.add_argument("--warmup-steps", type=int, default=3, help="untimed steps")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=20, help="lr warmup steps")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: the forward under torch.autocast('cpu', bfloat16) "
                    "(bf16 matmuls, fp32 parameters, gradients and AdamW state)")
    ap.add_argument("--profile", action="store_true",
                    help="also print a torch.profiler table of one step (to stderr; the profiler "
                    "roughly doubles the step time here: for a breakdown use torch_train_ops.py)")
    a = ap.parse_args()
    a.total_steps = a.warmup_steps + a.steps

    # the BLAS threads too: torch.set_num_threads sets OpenMP only, and Debian's
    # torch calls OpenBLAS (pthread build), which otherwise takes every core
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    V, C, L, NH, NKV, FF, HD, T, B = shape_of(a)
    eps, theta, std = 1e-5, 10000.0, 0.02

    def mat(r, c):
        return torch.nn.Parameter(torch.randn(r, c) * std)

    def vec(n):
        return torch.nn.Parameter(torch.ones(n))

    P = {"embed": mat(V, C), "norm": vec(C), "lm_head": mat(V, C)}
    for l in range(L):
        P.update({"%d.attn_norm" % l: vec(C), "%d.q" % l: mat(NH * HD, C),
                  "%d.k" % l: mat(NKV * HD, C), "%d.v" % l: mat(NKV * HD, C),
                  "%d.o" % l: mat(C, NH * HD), "%d.mlp_norm" % l: vec(C),
                  "%d.gate" % l: mat(FF, C), "%d.up" % l: mat(FF, C), "%d.down" % l: mat(C, FF)})
    params = list(P.values())

    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (T, HD)
    mask = torch.full((T, T), float("-inf")).triu(1)

    def rmsnorm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def forward(ids, targets):
        x = F.embedding(ids, P["embed"])
        for l in range(L):
            h = rmsnorm(x, P["%d.attn_norm" % l])
            q = F.linear(h, P["%d.q" % l]).view(B, T, NH, HD).transpose(1, 2)
            k = F.linear(h, P["%d.k" % l]).view(B, T, NKV, HD).transpose(1, 2)
            v = F.linear(h, P["%d.v" % l]).view(B, T, NKV, HD).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if NKV != NH:  # HF repeat_kv: expand + reshape
                k = k[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
                v = v[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
            s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HD) + mask
            p = torch.softmax(s, dim=-1)
            att = torch.matmul(p, v).transpose(1, 2).reshape(B, T, NH * HD)
            x = x + F.linear(att, P["%d.o" % l])
            h = rmsnorm(x, P["%d.mlp_norm" % l])
            x = x + F.linear(F.silu(F.linear(h, P["%d.gate" % l])) * F.linear(h, P["%d.up" % l]),
                             P["%d.down" % l])
        x = rmsnorm(x, P["norm"])
        logits = F.linear(x, P["lm_head"])
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() == 2], "weight_decay": a.weight_decay},
         {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)

    n_windows = (a.total_steps + 2) * B
    toks = load_tokens(a.dataset, n_windows * (T + 1) + 1)
    if toks.max() >= V:
        raise SystemExit("token id %d >= vocab %d" % (toks.max(), V))
    rng = np.random.default_rng(a.seed)
    n_avail = (len(toks) - 1) // (T + 1)
    order = rng.permutation(n_avail)

    def batch(s):
        w = order[(s * B + np.arange(B)) % n_avail]
        idx = w[:, None] * (T + 1) + np.arange(T + 1)[None, :]
        win = torch.from_numpy(toks[idx])
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def step(s):
        ids, tg = batch(s)
        opt.zero_grad(set_to_none=True)
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(ids, tg)
        else:
            loss = forward(ids, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(a, s)
        opt.step()
        return float(loss)

    secs, losses = [], []
    for s in range(a.total_steps):
        t0 = time.perf_counter()
        losses.append(step(s))
        dt = time.perf_counter() - t0
        if s >= a.warmup_steps:
            secs.append(dt)
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(a.total_steps)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
              file=sys.stderr)
    tps = [B * T / d for d in secs]
    print(json.dumps({
        "impl": "pytorch", "torch": torch.__version__, "threads": a.threads, "bf16": a.bf16,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "config": {"vocab": V, "dim": C, "n_layers": L, "n_heads": NH, "n_kv_heads": NKV,
                   "ffn_dim": FF, "seq_len": T, "batch": B},
        "n_params": sum(p.numel() for p in params),
        "warmup_steps": a.warmup_steps, "timed_steps": len(secs),
        "step_s": [round(d, 5) for d in secs], "tokens_per_s": [round(x, 1) for x in tps],
        "median_tokens_per_s": round(statistics.median(tps), 1),
        "loss_first": losses[0], "loss_last": losses[-1]}))


if __name__ == "__main__":
    main()

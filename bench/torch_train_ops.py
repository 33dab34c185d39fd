#!/usr/bin/python3
"""PyTorch's time per step by component, for comparison with tokshard-train's
per-op timers (bench/train_op_profile.py), without torch.profiler (which in
Debian's torch 1.13 roughly doubles the step time and so cannot be trusted for
absolute figures).

Each component of one training step of the LLaMA of bench/torch_llama_bench.py
is timed alone, eager, forward + backward, with the same shapes, threads and
dtype as the full step, and multiplied by the number of times a step runs it:

  gemm       every F.linear of the model (q, k, v, o, gate, up, down per layer,
             lm_head): forward, input gradient and weight gradient
  attention  from rotated q, k, v to the (B, T, C) output: GQA repeat, QK^T,
             scale, causal mask, softmax, PV; forward + backward   (x layers)
  xent       F.cross_entropy on (N, V) logits, forward + backward
  rmsnorm    forward + backward                                 (x 2 layers + 1)
  rope       rotate_half RoPE of q and k, forward + backward         (x layers)
  swiglu     silu(gate) * up, forward + backward                      (x layers)
  optimizer  clip_grad_norm_ + AdamW.step on tensors of the model's shapes

The median of --reps repetitions of each, after 2 untimed ones. Prints JSON:
seconds per step per component and their sum; the full step's median comes
from torch_llama_bench.py, and the difference is what the components leave
out (embedding, residual adds, zero_grad, autograd and allocator overhead).
"""
import argparse
import json
import math
import os
import statistics
import time

from torch_llama_bench import add_shape_args, shape_of


def main():
    ap = argparse.ArgumentParser()
    add_shape_args(ap)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V, C, L, NH, NKV, FF, HD, T, B = shape_of(a)
    N = B * T

    def timeit(fn):
        for _ in range(2):
            fn()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).requires_grad_(True)

    # gemm: each linear y = x W^T with dx and dW
    def linear_fn(M, out, inp):
        x, w, g = leaf(M, inp), leaf(out, inp, scale=0.02), torch.randn(M, out)

        def fn():
            x.grad = w.grad = None
            F.linear(x, w).backward(g)
        return fn
    shapes = [(NH * HD, C), (NKV * HD, C), (NKV * HD, C), (C, NH * HD), (FF, C), (FF, C), (C, FF)]
    gemm = L * sum(timeit(linear_fn(N, o, i)) for o, i in shapes) + timeit(linear_fn(N, V, C))

    mask = torch.full((T, T), float("-inf")).triu(1)

    def attn_fn():
        q, k, v = leaf(B, NH, T, HD), leaf(B, NKV, T, HD), leaf(B, NKV, T, HD)
        g = torch.randn(B, T, NH * HD)

        def fn():
            q.grad = k.grad = v.grad = None
            kk, vv = k, v
            if NKV != NH:
                kk = k[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
                vv = v[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
            s = torch.matmul(q, kk.transpose(2, 3)) / math.sqrt(HD) + mask
            p = torch.softmax(s, dim=-1)
            o = torch.matmul(p, vv).transpose(1, 2).reshape(B, T, NH * HD)
            o.backward(g)
        return fn
    attention = L * timeit(attn_fn())

    logits, tg = leaf(N, V), torch.randint(0, V, (N,))

    def xent_fn():
        logits.grad = None
        F.cross_entropy(logits, tg).backward()
    xent = timeit(xent_fn)

    x, w, gx = leaf(B, T, C), leaf(C), torch.randn(B, T, C)

    def rms_fn():
        x.grad = w.grad = None
        (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))).backward(gx)
    rmsnorm = (2 * L + 1) * timeit(rms_fn)

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q0, k0 = leaf(B, T, NH * HD), leaf(B, T, NKV * HD)
    gq, gk = torch.randn(B, NH, T, HD), torch.randn(B, NKV, T, HD)

    def rot(t):
        return torch.cat((-t[..., HD // 2:], t[..., :HD // 2]), dim=-1)

    def rope_fn():
        q0.grad = k0.grad = None
        q = q0.view(B, T, NH, HD).transpose(1, 2)
        k = k0.view(B, T, NKV, HD).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        torch.autograd.backward([q, k], [gq, gk])
    rope = L * timeit(rope_fn)

    gt, up, gs = leaf(B, T, FF), leaf(B, T, FF), torch.randn(B, T, FF)

    def swiglu_fn():
        gt.grad = up.grad = None
        (F.silu(gt) * up).backward(gs)
    swiglu = L * timeit(swiglu_fn)

    params = [leaf(V, C, scale=0.02), leaf(C), leaf(V, C, scale=0.02)]
    for _ in range(L):
        params += [leaf(C), leaf(NH * HD, C, scale=0.02), leaf(NKV * HD, C, scale=0.02),
                   leaf(NKV * HD, C, scale=0.02), leaf(C, NH * HD, scale=0.02), leaf(C),
                   leaf(FF, C, scale=0.02), leaf(FF, C, scale=0.02), leaf(C, FF, scale=0.02)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    clip = timeit(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))
    adamw = timeit(opt.step)

    comp = {"gemm": gemm, "attention": attention, "xent": xent, "rmsnorm": rmsnorm, "rope": rope,
            "swiglu": swiglu, "clip": clip, "adamw": adamw}
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "threads": a.threads,
                      "config": {"vocab": V, "dim": C, "n_layers": L, "n_heads": NH,
                                 "n_kv_heads": NKV, "ffn_dim": FF, "seq_len": T, "batch": B},
                      "s_per_step": comp, "sum_s": sum(comp.values())}))


if __name__ == "__main__":
    main()

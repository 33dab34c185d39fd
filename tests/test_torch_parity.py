#!/usr/bin/python3
"""Parity of the tokshard trainer with an independent PyTorch LLaMA.

Usage: test_torch_parity.py DIR   (DIR: what `parity_dump DIR` wrote)
Exit 0 when everything agrees, 1 on any disagreement or missing file.

Nothing is imported from the project. The reference is written from the
architecture (Touvron et al. 2023, "LLaMA"; Hugging Face LlamaForCausalLM
semantics) and runs in float64, so it is essentially exact and the measured
differences are the C trainer's float32 rounding:

  token embedding; per layer h = x + o(attn(RMSNorm(x))), x' = h + mlp(RMSNorm(h));
  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w            (Zhang & Sennrich 2019)
  RoPE "rotate_half" (Su et al. 2021, HF layout): pairs (j, j + HD/2),
    inv_freq = 1 / theta^(arange(0, HD, 2) / HD), angle = position * inv_freq
  causal softmax(q k^T / sqrt(HD)) v, GQA: query head h uses kv head h // (NH/NKV)
    (k, v repeat_interleave'd over the heads)
  SwiGLU MLP down(silu(gate(x)) * up(x))                  (Shazeer 2020)
  final RMSNorm, lm_head (or the embedding when tie_word_embeddings)
  cross-entropy over the real vocabulary, mean over all B*T tokens
  torch.optim.AdamW (decay only on 2-d tensors), clip_grad_norm_, and the
  schedule lr*(s+1)/warmup, then cosine to min_lr over [warmup, total), then min_lr.

Per config the test compares: the checkpoint's names and unpadded shapes;
logits, loss and every parameter gradient at the checkpoint's weights; per
step the loss, every gradient, the gradient norm, the learning rate and the
clipping decision; after 3 AdamW steps every weight and both AdamW moments;
and that the vocabulary padding rows' gradients and weights stay exactly zero.
Tolerance 1e-4 relative, relative error = max|c - ref| / max(max|ref|, 1e-30)
per tensor, the worst tensor reported.

The end-to-end weights after 3 steps carry the largest differences (~3e-5):
Adam's first update is g / (|g| + eps), whose sensitivity to g peaks where
|g| ~ eps, so the float32 rounding of an element whose gradient is ~1e-8
becomes a visible weight difference (the table names that element and its
gradient). The optimizer is therefore also checked alone: torch AdamW fed the
C trainer's own gradients of each step must agree within 1e-5 (measured
~3e-7).

Packed documents (configs docs, docpos and packed, whose batch.safetensors
holds "doc", each token's document start): the reference builds the explicit
[B, T, T] mask "key u visible to query t iff doc[b,t] <= u <= t" and, with
reset_positions, RoPE positions t - doc[b,t]. Config packed holds best-fit
windows with padding (ids 0, a block of its own, targets -1): the reference's
loss is the mean over the real targets only (ignore_index=-1).

Negative controls: the same comparisons against deliberately wrong references
(interleaved RoPE pairs, GQA heads tiled instead of grouped, the padding
columns left in the softmax, weight decay on the RMSNorm weights, the
document mask left out, the positions not restarted, the padding's targets
counted in the loss) must FAIL, which shows
the comparisons can see those mistakes. Without the mask every query of a
row's second and later documents attends across documents, so the outputs
must differ there.
"""
import json
import math
import os
import struct
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("FAIL: cannot import torch with %s; run scripts/install-deps.sh "
          "(apt-get install python3-torch python3-numpy)" % sys.executable)
    sys.exit(1)

# Tolerances derived from the computation (the same rule as tests/tolerance.h):
# a float32 result is within gamma(K) = K u / (1 - K u), u = 2^-24, of the exact
# value relative to the magnitudes it sums (Higham, "Accuracy and Stability of
# Numerical Algorithms", 2nd ed., eq. (3.5)), K being the terms summed along the
# longest dependency path of the forward and backward (chain_tol below); the
# float64 reference adds nothing measurable. That gives ~1e-4 for these
# configs; a wrong RoPE layout, GQA grouping, padding mask or decay mask moves
# some tensor by 1e-2 or more (the negative controls).
U32 = 2.0 ** -24


def gamma32(k):
    return k * U32 / (1 - k * U32)


def chain_tol(cfg, T, N, VP):
    """gamma(K) over the forward and backward of one step of this config."""
    C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    HD, F = C // NH, cfg["intermediate_size"]
    layer = C + C + HD + 2 * T + NH * HD + C + C + F  # norm, qkv, scores, softmax, pv, o, ffn
    return gamma32(2 * (L * layer + 2 * C + VP + N))


TOL = 1e-4  # printed; each config uses chain_tol, which is about this
# AdamW fed the C trainer's own gradients: only the float32 rounding of the
# update remains: per element and step about 12 operations (moments, bias
# corrections, sqrt, division, decay, the step), each within u of its result's
# scale, over 3 steps 36 u = 2.1e-6 of the tensor's scale; 1e-5 leaves room for
# Adam's division by sqrt(v) + eps where |g| is near eps
TOL_OPT = 1e-5
TINY = 1e-30

# ---- safetensors, from the public format description -------------------------
# 8 bytes little-endian u64 N, N bytes of JSON header {name: {dtype, shape,
# data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data buffer;
# offsets are relative to the start of the data buffer.
DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "F16": "<f2",
          "U8": "u1", "I8": "i1"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: shorter than 8 bytes" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError("%s: header length %d runs past the end" % (path, n))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    covered = 0
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = np.dtype(DTYPES[e["dtype"]])
        shape = tuple(e["shape"])
        if not (0 <= b <= end <= len(data)) or end - b != dt.itemsize * int(np.prod(shape)):
            raise ValueError("%s: %s has bad data_offsets" % (path, name))
        covered += end - b
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(shape).copy()
    if covered != len(data):
        raise ValueError("%s: tensors do not cover the data buffer" % path)
    return out, meta


# ---- the reference model --------------------------------------------------------

class Llama:
    """LlamaForCausalLM from a config.json dict and HF-named float64 tensors."""

    def __init__(self, cfg, weights, mutation=None, doc=None, doc_mask=False, reset_positions=False):
        self.V = cfg["vocab_size"]
        self.C = cfg["hidden_size"]
        self.L = cfg["num_hidden_layers"]
        self.NH = cfg["num_attention_heads"]
        self.NKV = cfg["num_key_value_heads"]
        self.HD = self.C // self.NH
        self.eps = float(cfg["rms_norm_eps"])
        self.theta = float(cfg["rope_theta"])
        self.tie = bool(cfg.get("tie_word_embeddings", False))
        self.mutation = mutation
        # packed documents: doc (B, T) LongTensor of each token's document start
        self.doc = doc
        self.doc_mask = doc_mask and mutation != "no_doc_mask"
        self.reset_positions = reset_positions and mutation != "no_reset_positions"
        self.p = {}
        for name in expected_names(cfg):
            t = torch.tensor(weights[name], dtype=torch.float64)
            self.p[name] = t.requires_grad_(True)
        self.lm_head = self.p["model.embed_tokens.weight"] if self.tie else self.p["lm_head.weight"]

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):  # x (B, H, T, HD)
        T, HD = x.shape[2], x.shape[3]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
        pos = torch.arange(T, dtype=torch.float64).expand(x.shape[0], T)  # (B, T)
        if self.reset_positions:  # positions restart at each document
            pos = pos - self.doc.to(torch.float64)
        freqs = (pos[:, :, None] * inv_freq)[:, None]  # (B, 1, T, HD/2)
        if self.mutation == "rope_interleaved":  # GPT-J / Meta-checkpoint pairs (2j, 2j+1)
            x1, x2 = x[..., 0::2], x[..., 1::2]
            c, s = freqs.cos(), freqs.sin()
            return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, HD)
        x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half
        return x * emb.cos() + rotated * emb.sin()

    def forward(self, ids):
        """ids LongTensor (B, T) -> logits (B, T, V)."""
        B, T = ids.shape
        P, NH, NKV, HD = self.p, self.NH, self.NKV, self.HD
        x = P["model.embed_tokens.weight"][ids]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)[None, None]  # (1, 1, T, T)
        if self.doc_mask:  # the explicit block-causal mask: key u < doc[b, t] is hidden too
            u = torch.arange(T)
            mask = mask | (u[None, None, :] < self.doc[:, :, None])[:, None]  # (B, 1, T, T)
        for l in range(self.L):
            pre = "model.layers.%d." % l
            h = self.rmsnorm(x, P[pre + "input_layernorm.weight"])
            q = (h @ P[pre + "self_attn.q_proj.weight"].T).view(B, T, NH, HD).transpose(1, 2)
            k = (h @ P[pre + "self_attn.k_proj.weight"].T).view(B, T, NKV, HD).transpose(1, 2)
            v = (h @ P[pre + "self_attn.v_proj.weight"].T).view(B, T, NKV, HD).transpose(1, 2)
            q, k = self.rope(q), self.rope(k)
            if self.mutation == "gqa_tiled":  # query head h -> kv head h % NKV
                k, v = k.repeat(1, NH // NKV, 1, 1), v.repeat(1, NH // NKV, 1, 1)
            else:
                k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
            s = s.masked_fill(mask, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v  # (B, NH, T, HD)
            a = a.transpose(1, 2).reshape(B, T, NH * HD)
            x = x + a @ P[pre + "self_attn.o_proj.weight"].T
            h = self.rmsnorm(x, P[pre + "post_attention_layernorm.weight"])
            g = h @ P[pre + "mlp.gate_proj.weight"].T
            u = h @ P[pre + "mlp.up_proj.weight"].T
            x = x + (F.silu(g) * u) @ P[pre + "mlp.down_proj.weight"].T
        x = self.rmsnorm(x, P["model.norm.weight"])
        return x @ self.lm_head.T

    def loss(self, logits, targets, padded_vocab):
        lg = logits.reshape(-1, self.V)
        if self.mutation == "padding_in_softmax":  # zero logits of padding rows not masked
            lg = torch.cat((lg, torch.zeros(lg.shape[0], padded_vocab - self.V)), dim=1)
        tg = targets.reshape(-1)
        if self.mutation == "padding_in_loss":  # padding targets counted (as id 0) instead of ignored
            tg = torch.where(tg < 0, torch.zeros_like(tg), tg)
        # packed windows: targets -1 are padding, out of the loss and the mean
        return F.cross_entropy(lg, tg, ignore_index=-1, reduction="mean")


def expected_names(cfg):
    n = ["model.embed_tokens.weight"]
    for l in range(cfg["num_hidden_layers"]):
        for s in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                  "mlp.down_proj"):
            n.append("model.layers.%d.%s.weight" % (l, s))
    n.append("model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        n.append("lm_head.weight")
    return n


def expected_shape(cfg, name):
    C, V, Fd = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    HD = C // cfg["num_attention_heads"]
    if "layernorm" in name or name == "model.norm.weight":
        return (C,)
    for key, shape in (("embed_tokens", (V, C)), ("lm_head", (V, C)),
                       ("q_proj", (cfg["num_attention_heads"] * HD, C)),
                       ("k_proj", (cfg["num_key_value_heads"] * HD, C)),
                       ("v_proj", (cfg["num_key_value_heads"] * HD, C)),
                       ("o_proj", (C, cfg["num_attention_heads"] * HD)),
                       ("gate_proj", (Fd, C)), ("up_proj", (Fd, C)), ("down_proj", (C, Fd))):
        if key in name:
            return shape
    raise KeyError(name)


def lr_at(o, s):
    """The schedule, from its definition: linear warmup, cosine to min_lr (SGDR)."""
    if o["warmup"] and s < o["warmup"]:
        return o["lr"] * (s + 1) / o["warmup"]
    if s >= o["total"] or o["total"] <= o["warmup"]:
        return o["min_lr"]
    p = (s - o["warmup"]) / (o["total"] - o["warmup"])
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * p))


def adamw_run(m, names, o, n_steps, grads, mutation):
    """n_steps of torch.optim.AdamW on m's parameters; grads(s) fills .grad."""
    params = [m.p[n] for n in names]
    decay_all = mutation == "decay_on_norms"
    groups = [{"params": [p for p in params if p.dim() == 2 or decay_all],
               "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.dim() != 2 and not decay_all],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    norms, lrs, clipped, g0 = [], [], [], None
    for s in range(n_steps):
        opt.zero_grad(set_to_none=True)
        grads(s)
        if o["grad_clip"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, o["grad_clip"]))
        else:
            norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        if s == 0:
            g0 = {n: m.p[n].grad.detach().clone().numpy() for n in names}
        clipped.append(norm > o["grad_clip"] > 0)
        lr = lr_at(o, s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        norms.append(norm)
        lrs.append(lr)
    return opt, norms, lrs, clipped, g0


def rel(c, ref):
    c = np.asarray(c, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if c.shape != ref.shape:
        return float("inf"), float("inf"), None
    if not c.size:
        return 0.0, 0.0, None
    diff = np.abs(c - ref)
    i = int(np.argmax(diff)) if not np.isnan(diff).any() else int(np.argmax(np.isnan(diff)))
    d = float(diff.flat[i])
    return d / max(float(np.max(np.abs(ref))), TINY), d, np.unravel_index(i, diff.shape)


# ---- one config --------------------------------------------------------------------

class Report:
    def __init__(self):
        self.rows = []  # (config, check, rel, abs, worst, ok)

    def add(self, config, check, pairs, tol=TOL):
        """pairs: [(label, c, ref)]; one row with the worst relative error."""
        worst = (-1.0, 0.0, "", None)
        for label, c, ref in pairs:
            r, a, idx = rel(c, ref)
            if not (r <= worst[0]) or worst[0] < 0:  # NaN propagates as worst
                worst = (r, a, label, idx if np.ndim(ref) > 0 else None)
        ok = worst[0] <= tol
        self.rows.append((config, check, worst[0], worst[1], worst[2], ok, worst[3]))
        return ok

    def add_exact(self, config, check, arrays):
        m = max([float(np.max(np.abs(a))) if a.size else 0.0 for a in arrays] or [0.0])
        self.rows.append((config, check, m, m, "%d padding tensors" % len(arrays), m == 0.0, None))

    def add_flag(self, config, check, ok, note):
        self.rows.append((config, check, None, None, note, ok, None))

    def worst(self):
        return max([r[2] for r in self.rows if r[2] is not None] or [0.0])

    def ok(self):
        return all(r[5] for r in self.rows)


def run_config(d, rep, name, mutation=None):
    """Compares config directory d (parity_dump's) with the reference, rows into rep."""
    cfg = json.load(open(os.path.join(d, "ckpt", "config.json")))
    assert cfg.get("model_type") == "llama" and cfg.get("hidden_act") == "silu", cfg
    assert not cfg.get("attention_bias") and not cfg.get("mlp_bias"), cfg
    w0, _ = read_safetensors(os.path.join(d, "ckpt", "model.safetensors"))
    names = expected_names(cfg)
    if sorted(w0) != sorted(names):
        rep.add_flag(name, "checkpoint tensor names", False,
                     "extra %s, missing %s" % (sorted(set(w0) - set(names)),
                                               sorted(set(names) - set(w0))))
        return
    bad = [n for n in names if w0[n].shape != expected_shape(cfg, n) or w0[n].dtype != np.float32]
    rep.add_flag(name, "checkpoint names/shapes (HF, unpadded)", not bad,
                 "%d tensors, tie=%s" % (len(names), cfg.get("tie_word_embeddings")) if not bad
                 else "wrong: %s" % bad)
    batch, bmeta = read_safetensors(os.path.join(d, "batch.safetensors"))
    docs = {}
    if "doc" in batch:
        docs = {"doc": torch.tensor(batch["doc"].astype(np.int64)),
                "doc_mask": bmeta.get("doc_mask") == "1", "reset_positions": bmeta.get("reset_positions") == "1"}
    ids = torch.tensor(batch["ids"].astype(np.int64))
    targets = torch.tensor(batch["targets"].astype(np.int64))
    step0, _ = read_safetensors(os.path.join(d, "step0.safetensors"))
    steps, meta = read_safetensors(os.path.join(d, "steps.safetensors"))
    o = {k: float(meta[k]) for k in ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay",
                                     "grad_clip")}
    o["warmup"], o["total"] = int(meta["warmup"]), int(meta["total"])
    B, T = ids.shape
    V = cfg["vocab_size"]
    pads = [v for k, v in step0.items() if k.startswith("pad.grad.")]
    VP = V + (pads[0].shape[0] if pads else 0)

    # forward + backward at the checkpoint's weights
    tol0 = chain_tol(cfg, T, B * T, VP)
    m = Llama(cfg, w0, mutation, **docs)
    logits = m.forward(ids)
    loss = m.loss(logits, targets, VP)
    loss.backward()
    rep.add(name, "logits [%d, %d]" % (B * T, V),
            [("logits", step0["logits"], logits.detach().reshape(B * T, V).numpy())], tol0)
    rep.add(name, "loss (mean over %d targets)" % int((targets >= 0).sum()), [("loss", step0["loss"], loss.item())],
            tol0)
    rep.add(name, "gradients (%d tensors)" % len(names),
            [(n, step0["grad." + n], m.p[n].grad.numpy()) for n in names], tol0)
    rep.add_exact(name, "padding rows' gradient == 0", pads)
    if docs.get("doc_mask") and mutation is None:
        # the mask matters exactly where a window spans documents: without it
        # every position of a row's second and later documents gets other
        # logits (by far more than the tolerance), the first document's the same
        plain = Llama(cfg, w0, "no_doc_mask", **docs).forward(ids).detach()
        diff = (plain - logits.detach()).abs().amax(-1) / logits.detach().abs().amax()
        later = docs["doc"] > 0
        ok = bool((diff[later] > 100 * tol0).all()) and bool((diff[~later] <= tol0).all())
        rep.add_flag(name, "unmasked reference differs on later documents", ok,
                     "%d of %d later-document positions differ (min %.1e), first documents max %.1e" % (
                         int((diff[later] > 100 * tol0).sum()), int(later.sum()), float(diff[later].min()),
                         float(diff[~later].max())))

    # 3 AdamW steps on the same batch, end to end: the reference computes its own
    # gradients along its own trajectory. Each step adds at most one step's
    # rounding (tol0) and Adam passes a relative error of g on to the update at
    # most 1:1 (d/dg of g / (|g| + eps) <= 1 / (|g| + eps)), so to first order
    # step s is within (s + 1) tol0
    n_steps = len(steps["loss"])
    tol_traj = (n_steps + 1) * tol0
    m = Llama(cfg, w0, mutation, **docs)
    losses, raw = [], []

    def own_grads(s):
        l = m.loss(m.forward(ids), targets, VP)
        l.backward()
        losses.append(l.item())
        raw.append({n: m.p[n].grad.detach().clone().numpy() for n in names})

    opt, norms, lrs, clipped, g0 = adamw_run(m, names, o, n_steps, own_grads, mutation)
    rep.add(name, "loss per step (%d steps)" % n_steps, [("loss", steps["loss"], losses)],
            tol_traj)
    rep.add(name, "gradients of steps 1..%d (own trajectory)" % (n_steps - 1),
            [("step%d %s" % (s, n), steps["step%d.grad.%s" % (s, n)], raw[s][n])
             for s in range(1, n_steps) for n in names], tol_traj)
    rep.add(name, "grad norm per step", [("grad_norm", steps["grad_norm"], norms)], tol_traj)
    # the schedule in float32: a cosine and a few products, each within u
    rep.add(name, "lr schedule (tks_lr_at)", [("lr", steps["lr"], lrs)], tol=gamma32(8))
    c_clipped = [float(x) < 1.0 for x in steps["clip_scale"]]
    rep.add(name, "clip scale (tks_clip_scale)",
            [("clip_scale", steps["clip_scale"], [min(1.0, o["grad_clip"] / n) if c else 1.0
                                                  for n, c in zip(norms, clipped)])], tol_traj)
    rep.add_flag(name, "clipping decisions", c_clipped == clipped,
                 "C clipped steps %s, torch %s" % ([i for i, c in enumerate(c_clipped) if c],
                                                   [i for i, c in enumerate(clipped) if c]))
    w3, _ = read_safetensors(os.path.join(d, "after3", "model.safetensors"))
    mom, _ = read_safetensors(os.path.join(d, "after3", "optimizer.safetensors"))

    def after(label, m, opt, g0, tol):
        r = rep.add(name, "weights after %d steps%s" % (n_steps, label),
                    [(n, w3[n], m.p[n].detach().numpy()) for n in names], tol)
        # Adam's update g/(|g| + eps) is ill-conditioned where |g| ~ eps: name
        # the worst element's first clipped gradient so a failure is readable
        t, idx = rep.rows[-1][4], rep.rows[-1][6]
        if t and idx is not None:
            rep.rows[-1] = rep.rows[-1][:4] + ("%s%s, its clipped step-0 grad %.1e (eps %.0e)" % (
                t, list(idx), g0[t][idx], o["eps"]),) + rep.rows[-1][5:]
        rep.add(name, "AdamW exp_avg after %d steps%s" % (n_steps, label),
                [(n, mom[n + ".exp_avg"], opt.state[m.p[n]]["exp_avg"].numpy()) for n in names],
                tol)
        # exp_avg_sq averages g^2: a relative difference e in the gradients
        # (bounded by tol above) is 2e in g^2 (d(g^2)/g^2 = 2 dg/g)
        rep.add(name, "AdamW exp_avg_sq after %d steps%s" % (n_steps, label),
                [(n, mom[n + ".exp_avg_sq"], opt.state[m.p[n]]["exp_avg_sq"].numpy())
                 for n in names], 2 * tol)
        return r

    after("", m, opt, g0, tol_traj)
    # the optimizer alone: torch AdamW fed the C trainer's own gradients of each
    # step, so the comparison does not inherit Adam's amplification of the
    # float32 gradient rounding where |g| ~ eps
    mt = Llama(cfg, w0, mutation, **docs)

    def c_grads(s):
        for n in names:
            mt.p[n].grad = torch.tensor(steps["step%d.grad.%s" % (s, n)], dtype=torch.float64)

    opt_t, norms_t, _, _, g0t = adamw_run(mt, names, o, n_steps, c_grads, mutation)
    # the same float32 gradients: the C side sums their squares in float64 and
    # hands the sum over as one float32 device scalar (the backend's loss scalar), a
    # single rounding (u relative); the square root halves it
    rep.add(name, "grad norm per step (C's gradients)", [("grad_norm", steps["grad_norm"], norms_t)],
            tol=U32)
    after(" (C's gradients)", mt, opt_t, g0t, TOL_OPT)
    rep.add_exact(name, "padding rows' weights == 0 after steps",
                  [v for k, v in steps.items() if k.startswith("pad.after3.")])


def fmt(x):
    return "-" if x is None else "%.2e" % x


def main():
    if len(sys.argv) != 2:
        print("usage: test_torch_parity.py DIR (written by parity_dump DIR)")
        return 2
    top = sys.argv[1]
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    configs = sorted(c for c in os.listdir(top) if os.path.isdir(os.path.join(top, c, "ckpt")))
    if not configs:
        print("FAIL: no config directories with a ckpt/ under %s (run parity_dump %s)" % (top, top))
        return 1
    rep = Report()
    for c in configs:
        try:
            run_config(os.path.join(top, c), rep, c)
        except Exception as e:  # a missing or malformed file is a failure, not a crash
            rep.add_flag(c, "files", False, "%s: %s" % (type(e).__name__, e))
    print("torch %s, reference in float64; tolerance gamma(K) of each config's longest chain of "
          "sums (about %.0e) relative, (max|c - ref| / max|ref| per tensor)" % (torch.__version__, TOL))
    print("%-5s %-47s %-9s %-9s %-4s %s" % ("cfg", "check", "max rel", "max abs", "ok", "worst tensor / note"))
    for cf, check, r, a, worst, ok, _ in rep.rows:
        print("%-5s %-47s %-9s %-9s %-4s %s" % (cf, check, fmt(r), fmt(a), "ok" if ok else "FAIL", worst))
    print("worst relative difference over all checks: %.2e" % rep.worst())

    # negative controls on the first config that exercises GQA (NKV < NH < ... )
    controls_ok = True
    print("negative controls (each wrong reference must FAIL the comparison):")
    for mutation in ("rope_interleaved", "gqa_tiled", "padding_in_softmax", "decay_on_norms",
                     "no_doc_mask", "no_reset_positions", "padding_in_loss"):
        target = None
        for c in configs:
            cfg = json.load(open(os.path.join(top, c, "ckpt", "config.json")))
            _, meta = read_safetensors(os.path.join(top, c, "batch.safetensors"))
            mask, reset = meta.get("doc_mask") == "1", meta.get("reset_positions") == "1"
            if mutation == "padding_in_loss":  # a batch of packed windows with padding
                b, _ = read_safetensors(os.path.join(top, c, "batch.safetensors"))
                fits = bool((b["targets"] < 0).any())
            elif mutation == "no_doc_mask":
                fits = mask
            elif mutation == "no_reset_positions":  # with the mask RoPE cannot tell (relative positions)
                fits = reset and not mask
            else:
                fits = not mask and not reset and (
                    mutation != "gqa_tiled" or 1 < cfg["num_key_value_heads"] < cfg["num_attention_heads"])
            if fits:
                target = c
                break
        if target is None:
            print("  %-20s no config exercises it: FAIL" % mutation)
            controls_ok = False
            continue
        bad = Report()
        try:
            run_config(os.path.join(top, target), bad, target, mutation)
        except Exception as e:
            bad.add_flag(target, "files", False, str(e))
        failed = [r for r in bad.rows if not r[5]]
        caught = bool(failed)
        controls_ok &= caught
        print("  %-20s on %-5s %s (worst rel %.2e; %d checks failed, first: %s)" % (
            mutation, target, "detected" if caught else "NOT DETECTED: FAIL", bad.worst(),
            len(failed), failed[0][1] if failed else "-"))
    ok = rep.ok() and controls_ok
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

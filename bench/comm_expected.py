#!/usr/bin/env python3
"""Expected communication of one tokshard-train step, from the config and the layout.

Derived independently from the algorithm (docs/PARALLELISM.md, trainer/model/model.c,
trainer/run/train.c), not from the trainer's counters, so that the measured
"comm_bytes" of metrics.jsonl can be checked against it.

Payload bytes per step, as counted for world rank 0 (trainer/comm/mesh.c counts the
input bytes of an all-reduce, the input (size x n) bytes of a reduce-scatter and
the output (size x n) bytes of an all-gather):

  tp > 1, per micro-batch (N = micro_batch x seq_len tokens, C = dim, L = layers):
    forward   all-reduce N*C after the embedding, after o_proj and after
              down_proj in every layer                 -> N*C*(1 + 2L) floats
    xent      all-reduce max, sum of exps, target      -> 3N floats
    backward  all-reduce of the input gradient of q/k/v and of gate/up in
              every layer and of lm_head               -> N*C*(2L + 1) floats
  dp_shard > 1: reduce-scatter of the flat gradient (n_flat floats in) and
              all-gather of the updated slices (n_flat floats out)
  dp_replicate > 1: all-reduce of the n_flat/dp_shard slice
  scalars:    one world all-reduce (world > 1) of 3 floats: gradient sum of
              squares, loss, stop count

n_flat: every tp-local tensor padded to 16 floats (64 bytes), in build_params
order, the sum padded to a multiple of dp_shard; the vocabulary is padded to
round_up(V, vocab_divisible_by x tp) and split in rows across tp.

Wire bytes (per rank, sent; ring algorithms, p = group size): all-reduce
2(p-1)/p x payload, reduce-scatter and all-gather (p-1)/p x payload.

Usage:
  comm_expected.py --vocab 8000 --dim 64 --n-layers 2 --n-heads 4 --n-kv-heads 2 \
      --ffn-dim 0 --seq-len 32 --global-batch 8 --layout 2,2,2 [--micro-batch 0] [--json]
  comm_expected.py ... --layout 1,2,1 --metrics RUN/metrics.jsonl   (compare)
"""
import argparse
import json
import sys

F32 = 4


def round_up(x, m):
    return (x + m - 1) // m * m


def default_ffn(dim):
    # trainer/model/model.c tks_model_config_defaults: round_up(8/3 dim, 32)
    return (8 * dim // 3 + 31) // 32 * 32


def local_tensor_sizes(cfg, tp):
    """(name, local elements) of every parameter tensor on one tp rank, in
    build_params order."""
    V, C, L = cfg["vocab"], cfg["dim"], cfg["n_layers"]
    NH, NKV = cfg["n_heads"], cfg["n_kv_heads"] or cfg["n_heads"]
    F = cfg["ffn_dim"] or default_ffn(C)
    HD = C // NH
    VP = round_up(V, cfg["vocab_divisible_by"] * tp)
    out = [("embed_tokens", VP // tp * C)]
    for l in range(L):
        out += [("l%d.input_layernorm" % l, C),
                ("l%d.q_proj" % l, NH * HD // tp * C),
                ("l%d.k_proj" % l, NKV * HD // tp * C),
                ("l%d.v_proj" % l, NKV * HD // tp * C),
                ("l%d.o_proj" % l, C * (NH * HD // tp)),
                ("l%d.post_attention_layernorm" % l, C),
                ("l%d.gate_proj" % l, F // tp * C),
                ("l%d.up_proj" % l, F // tp * C),
                ("l%d.down_proj" % l, C * (F // tp))]
    out.append(("norm", C))
    if not cfg.get("tie_embeddings"):
        out.append(("lm_head", VP // tp * C))
    return out


def n_flat(cfg, tp, dp_shard):
    n_local = sum(round_up(n, 16) for _, n in local_tensor_sizes(cfg, tp))
    return round_up(n_local, dp_shard)


def n_params_real(cfg):
    V, C, L = cfg["vocab"], cfg["dim"], cfg["n_layers"]
    NH, NKV = cfg["n_heads"], cfg["n_kv_heads"] or cfg["n_heads"]
    F = cfg["ffn_dim"] or default_ffn(C)
    HD = C // NH
    per = 2 * C + C * NH * HD + 2 * C * NKV * HD + NH * HD * C + 3 * C * F
    return V * C * (1 if cfg.get("tie_embeddings") else 2) + L * per + C


def expected(cfg, rep, shard, tp):
    """Expected payload and ring wire bytes per step on world rank 0."""
    dp = rep * shard
    world = dp * tp
    gb, T = cfg["global_batch"], cfg["seq_len"]
    per_rank = gb // dp
    mb = cfg.get("micro_batch") or per_rank
    n_micro = per_rank // mb
    N = mb * T
    C, L = cfg["dim"], cfg["n_layers"]
    nf = n_flat(cfg, tp, shard)
    n_slice = nf // shard
    # payload floats per (kind, group size)
    items = []  # (kind, group, group_size, floats)
    if tp > 1:
        items.append(("allreduce", "tp activations (fwd)", tp, n_micro * N * C * (1 + 2 * L)))
        items.append(("allreduce", "tp xent max/sum/target", tp, n_micro * 3 * N))
        items.append(("allreduce", "tp input grads (bwd)", tp, n_micro * N * C * (2 * L + 1)))
    if shard > 1:
        items.append(("reduce_scatter", "dp_shard gradients", shard, nf))
        items.append(("allgather", "dp_shard parameters", shard, nf))
    if rep > 1:
        items.append(("allreduce", "dp_replicate gradient slice", rep, n_slice))
    if world > 1:  # [grad sum of squares, loss, stop count] in one call
        items.append(("allreduce", "world step scalars", world, 3))
    payload = {"allreduce": 0, "reduce_scatter": 0, "allgather": 0}
    wire = {"allreduce": 0.0, "reduce_scatter": 0.0, "allgather": 0.0}
    detail = []
    for kind, what, p, floats in items:
        b = floats * F32
        w = b * (2.0 * (p - 1) / p if kind == "allreduce" else (p - 1) / p)
        payload[kind] += b
        wire[kind] += w
        detail.append({"kind": kind, "what": what, "group_size": p, "payload_bytes": b,
                       "ring_wire_bytes": w})
    return {"layout": [rep, shard, tp], "world": world, "n_flat": nf, "n_slice": n_slice,
            "micro_batch": mb, "n_micro": n_micro, "tokens_per_micro": N,
            "payload_bytes": payload, "ring_wire_bytes": wire, "detail": detail,
            "optimizer_state_bytes_per_rank": 2 * F32 * n_slice}


def measured_from_metrics(path):
    """comm_bytes of the training-step lines of metrics.jsonl (eval lines have none)."""
    rows = []
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "comm_bytes" in j:
                rows.append((j["step"], j["comm_bytes"]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--vocab-divisible-by", type=int, default=64)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--n-layers", type=int, required=True)
    ap.add_argument("--n-heads", type=int, required=True)
    ap.add_argument("--n-kv-heads", type=int, default=0)
    ap.add_argument("--ffn-dim", type=int, default=0)
    ap.add_argument("--tie-embeddings", action="store_true")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=0)
    ap.add_argument("--layout", required=True, help="dp_replicate,dp_shard,tp")
    ap.add_argument("--metrics", help="metrics.jsonl to compare with")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cfg = {"vocab": a.vocab, "vocab_divisible_by": a.vocab_divisible_by, "dim": a.dim,
           "n_layers": a.n_layers, "n_heads": a.n_heads, "n_kv_heads": a.n_kv_heads,
           "ffn_dim": a.ffn_dim, "tie_embeddings": a.tie_embeddings, "seq_len": a.seq_len,
           "global_batch": a.global_batch, "micro_batch": a.micro_batch}
    rep, shard, tp = (int(x) for x in a.layout.split(","))
    e = expected(cfg, rep, shard, tp)
    ok = True
    if a.metrics:
        rows = measured_from_metrics(a.metrics)
        e["measured"] = [{"step": s, **cb} for s, cb in rows]
        e["match"] = bool(rows) and all(cb == e["payload_bytes"] for _, cb in rows)
        ok = e["match"]
    if a.json:
        print(json.dumps(e, indent=1))
    else:
        print("layout (dp_replicate, dp_shard, tp) = (%d, %d, %d): n_flat %d, slice %d"
              % (rep, shard, tp, e["n_flat"], e["n_slice"]))
        for d in e["detail"]:
            print("  %-14s %-30s p=%d payload %12d B  ring wire %14.1f B"
                  % (d["kind"], d["what"], d["group_size"], d["payload_bytes"],
                     d["ring_wire_bytes"]))
        print("  total payload", e["payload_bytes"])
        if a.metrics:
            print("  measured     ", e["measured"][:1], "...", "MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

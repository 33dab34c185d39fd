#!/usr/bin/env python3
"""Markdown tables from a bench_train.sh result (bench/results/train-TAG.json).

usage: train_report.py RESULT.json  > RESULT.md
Profile files RESULT-profile-t*.json next to it (bench_train.sh --profile) are
included when present.
"""
import json
import os
import sys


def kb(b):
    if b < 1024:
        return "%d B" % b
    return "%.1f KiB" % (b / 1024) if b < 2 ** 20 else "%.2f MiB" % (b / 2 ** 20)


CATS = [("gemm", "GEMM: every linear layer and lm_head, fwd + both grads (OpenBLAS sgemm in both)"),
        ("attention", "attention core: QK^T, scale, mask, softmax, PV, fwd + bwd"),
        ("xent", "cross-entropy over the vocabulary, fwd + bwd"),
        ("rmsnorm", "RMSNorm fwd (with the residual add before it) + bwd"), ("rope", "RoPE fwd + bwd"), ("swiglu", "SwiGLU fwd + bwd"),
        ("clip", "grad-norm clip"), ("adamw", "AdamW update"),
        ("other", "everything else: embedding, zeroing; PyTorch: autograd/allocator overhead")]
OURS = {"gemm": "gemm", "attention_fwd": "attention", "attention_bwd": "attention",
        "xent_max": "xent", "xent_sumexp": "xent", "xent_target": "xent", "xent_loss": "xent",
        "xent_bwd": "xent", "rmsnorm_fwd": "rmsnorm", "rmsnorm_bwd": "rmsnorm",
        "add_rmsnorm_fwd": "rmsnorm", "rope": "rope",
        "swiglu_fwd": "swiglu", "swiglu_bwd": "swiglu", "sumsq": "clip", "adamw": "adamw"}


def categories(ours, torch_):
    """seconds per step per category: ours from train_op_profile.py (timers in
    the backend), PyTorch from torch_train_ops.py (components timed alone; "other"
    is the full step minus their sum)"""
    a = {}
    for k, v in ours["op_s_per_step"].items():
        c = OURS.get(k, "other")
        a[c] = a.get(c, 0) + v
    a["other"] = a.get("other", 0) + max(0.0, ours["untimed_s_per_step"])
    b = dict(torch_["s_per_step"])
    b["other"] = torch_["full_step_s"] - torch_["sum_s"]
    return a, b


def table_head(title, columns, *notes):
    """A section's title, its notes, and its table's header row and rule."""
    print("#### " + title)
    print("")
    for note in notes:
        print(note)
        print("")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def main():
    path = sys.argv[1]
    r = json.load(open(path))
    m = r["machine"]
    p = print
    p("Machine: %s (%s), %d cores, no GPU; OpenBLAS %s (BLAS alternative %s); OpenMPI %s; "
      "python3-torch %s; gcc %s; %s."
      % (m["cpu"], m.get("cpu_flags", "").strip(), m["cores"], m["openblas"].strip(),
         m.get("blas_alternative", "?"), m["openmpi"], m["torch_pkg"], m["gcc"], m["date"]))
    p("Command: `%s`; %d warm-up steps, median of %d timed steps per run."
      % ("bench/bench_train.sh", r["warmup_steps"], r["timed_steps"]))
    p("")
    if "part1" in r:
        table_head("Part 1: training tokens/s, tokshard-train vs PyTorch (same config, data, threads)",
                   ["config", "threads", "tokshard-train tok/s", "PyTorch tok/s", "ours / PyTorch",
                    "at least as fast?", "CPU s used by other processes during (ours, torch)"])
        for x in r["part1"]:
            o, t = x["ours"], x["torch"]
            if not t:
                continue
            p("| %s | %d%s | %.0f | %.0f | **%.2f** | %s | %.1f, %.1f |" % (
                x["config"], x["threads"], " (OMP_WAIT_POLICY=%s, both)" % x["omp_wait_policy"] if x.get("omp_wait_policy") else "",
                o["median_tokens_per_s"], t["median_tokens_per_s"],
                x["ratio"], "yes" if x["ratio"] >= 1 else "**no**", o["foreign_cpu_s"], t["foreign_cpu_s"]))
        p("")
        p("Configs: main = vocab 8000, dim 128, 4 layers, 4 heads, 2 kv heads, ffn 352, seq 128, "
          "batch 16 (2048 tokens/step); large = vocab 8000, dim 256, 6 layers, 8 heads, 4 kv heads, "
          "ffn 704, seq 256, batch 8 (2048 tokens/step).")
        p("")
    if "part2a" in r:
        table_head("Part 2a: tokens/s at 1 and 2 processes (main config)",
                   ["run", "tok/s", "vs 1 process x 1 thread", "comm bytes/step = expected",
                    "CPU s used by other processes during"])
        for x in r["part2a"]:
            cm = "-" if "comm_match" not in x else ("yes" if x["comm_match"] else "**NO**")
            p("| %s | %.0f | %.2fx | %s | %.1f |" % (x["run"], x["median_tokens_per_s"],
                                                     x["speedup_vs_1x1"], cm, x["foreign_cpu_s"]))
        p("")
    if "part2b" in r:
        table_head("Part 2b: bytes per step per collective (rank 0), measured vs expected",
                   ["layout (rep, shard, tp)", "n_flat", "all-reduce measured / expected",
                    "reduce-scatter measured / expected", "all-gather measured / expected", "match",
                    "ring wire bytes AR / RS / AG"],
                   "Tiny model: vocab 8000, dim 64, 2 layers, 4 heads, 2 kv heads, ffn 192, seq 32, "
                   "global batch 8, `--eval-every 0`, 3 steps, every step compared.")
        for x in r["part2b"]:
            me, ex, w = x["measured_per_step"][0], x["expected"], x["ring_wire_bytes"]
            lay = "(%d, %d, %d)" % tuple(x["layout"]) + (" micro-batch %d" % x["micro_batch"] if x["micro_batch"] else "")
            p("| %s | %d | %d / %d | %d / %d | %d / %d | %s | %s / %s / %s |" % (
                lay, x["n_flat"], me["allreduce"], ex["allreduce"], me["reduce_scatter"],
                ex["reduce_scatter"], me["allgather"], ex["allgather"],
                "MATCH" if x["match"] else "**MISMATCH**", kb(w["allreduce"]),
                kb(w["reduce_scatter"]), kb(w["allgather"])))
        p("")
    if "part2c" in r:
        table_head("Part 2c: optimizer state per rank (`--dry-run`, main config)",
                   ["layout (rep, shard, tp)", "dry-run \"optimizer state\"",
                    "AdamW moments allocated per rank (8 B x n_flat / dp_shard)",
                    "allocated / (allocated at (1,1,1) / (dp_shard x tp))"])
        for x in r["part2c"]:
            p("| (%d, %d, %d) | %.1f MiB | %.3f MiB | %.4f |" % (
                *x["layout"], x["dry_run_mib"], x["allocated_mib"], x["allocated_ratio_to_ideal"]))
        p("")
    for prof in r.get("profiles", []):
        f, tf, th = prof["ours"], prof["torch"], "%d" % prof["threads"]
        pr = json.load(open(f))
        if os.path.exists(tf):
            tp = json.load(open(tf))
            a, b = categories(pr, tp)
            ta, tb = sum(a.values()), sum(b.values())
            table_head("Where a training step's time goes, %s config, --threads %s%s: tokshard-train vs PyTorch"
                       % (prof["config"], th,
                          ", OMP_WAIT_POLICY=%s" % prof["omp_wait_policy"] if prof.get("omp_wait_policy") else ""),
                       ["component", "tokshard-train s/step", "%", "PyTorch s/step", "%", "ours / PyTorch"])
            for c, label in CATS:
                x, y = a.get(c, 0), b.get(c, 0)
                p("| %s | %.4f | %.1f%% | %.4f | %.1f%% | %s |" % (label, x, 100 * x / ta, y, 100 * y / tb,
                                                                   "%.2f" % (x / y) if y > 0 else "-"))
            p("| **step** | %.4f | | %.4f | | %.2f |" % (ta, tb, ta / tb))
            p("")
            p("(ours: wall-clock timers around every backend op in a scratch build "
              "(bench/train_op_profile.py), %.3f s/step; PyTorch: each component timed alone with the "
              "same shapes and threads (bench/torch_train_ops.py), \"other\" = the full step's median "
              "(%.3f s) minus their sum.)" % (pr["wall_s_per_step"], tp["full_step_s"]))
            p("")
    q = r.get("others_cpus_before", {})
    if q:
        p("Other processes' CPU use measured before the parts (CPUs, over 5 s): %s; load average "
          "at the end %.2f." % (", ".join("%s %.2f" % kv for kv in q.items()), r["load1_end"]))
    else:
        p("Load average at the end: %.2f." % r["load1_end"])


if __name__ == "__main__":
    main()

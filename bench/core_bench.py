#!/usr/bin/env python3
"""core_bench.py - the trainer-core benchmarks (backend contract 2), run by
bench/bench_core.sh: one run measures the code before the change (--before-bin)
and after it (--after-bin) against PyTorch eager on the same machine, so the
figures are ratios taken under the same load.

  tps     training tokens/s, main config (dim 128, 4 layers, seq 128, batch 16),
          --threads N: before fp32, after fp32, after bf16, PyTorch fp32, PyTorch
          bf16 autocast; ROUNDS interleaved rounds, median of the timed steps of
          each run, then the median over rounds.
  mem     peak RSS (/usr/bin/time %M) of 2 training steps of a 2-layer, 8-head,
          dim-64 model at batch 1, T = 2048 and 4096: before and after (fp32,
          bf16), with the --dry-run activation figure of the after build.
  wait    the fraction of step time the host waited on the backend (after,
          metrics.jsonl host_wait_s / elapsed_s).

Nothing is asserted: a benchmark, not a test. Prints JSON on the last line.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = {"vocab": 8000, "dim": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 352,
        "seq_len": 128, "batch": 16}
HYPER = ["--lr", "3e-3", "--min-lr", "3e-4", "--warmup", "20", "--beta1", "0.9", "--beta2",
         "0.95", "--adam-eps", "1e-8", "--weight-decay", "0.1", "--grad-clip", "1.0", "--seed",
         "1337", "--eval-every", "0", "--save-every", "0", "--keep", "1", "--quiet", "--no-plot"]


def load():
    return float(open("/proc/loadavg").read().split()[0])


def model_flags(c):
    return ["--vocab-size", str(c["vocab"]), "--dim", str(c["dim"]), "--n-layers", str(c["n_layers"]),
            "--n-heads", str(c["n_heads"]), "--n-kv-heads", str(c["n_kv_heads"]), "--ffn-dim",
            str(c["ffn_dim"]), "--seq-len", str(c["seq_len"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before-bin", required=True)
    ap.add_argument("--after-bin", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--timed-steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", default="tps,mem,wait")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    W, S = a.warmup_steps, a.timed_steps
    res = {"threads": a.threads, "warmup_steps": W, "timed_steps": S, "rounds": a.rounds,
           "load_start": load()}

    def ours(bindir, name, extra=(), cfg=MAIN, steps=None):
        out = os.path.join(a.work, "run-" + name)
        shutil.rmtree(out, ignore_errors=True)
        cmd = [os.path.join(bindir, "tokshard-train"), "--dataset", a.dataset, "--out", out,
               "--threads", str(a.threads), "--global-batch", str(cfg["batch"]),
               "--steps", str(steps or W + S)] + model_flags(cfg) + HYPER + list(extra)
        l0 = load()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        m = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in x]
        shutil.rmtree(out, ignore_errors=True)
        tps = [x["tokens_per_s"] for x in m[W:]]
        return {"median_tokens_per_s": statistics.median(tps), "load": [l0, load()],
                "host_wait_s": m[-1].get("host_wait_s"), "elapsed_s": m[-1]["elapsed_s"],
                "loss_last": m[-1]["loss"]}

    def torch(name, bf16):
        cmd = [a.torch_python, os.path.join(HERE, "torch_llama_bench.py"), "--dataset", a.dataset,
               "--threads", str(a.threads), "--warmup-steps", str(W), "--steps", str(S)]
        for k in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "seq_len", "batch"):
            cmd += ["--" + k.replace("_", "-"), str(MAIN[k])]
        if bf16:
            cmd.append("--bf16")
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        l0 = load()
        p = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        j = json.loads(p.stdout.strip().splitlines()[-1])
        return {"median_tokens_per_s": j["median_tokens_per_s"], "load": [l0, load()],
                "loss_last": j["loss_last"]}

    if "tps" in parts:
        runs = {"before fp32": lambda: ours(a.before_bin, "before"),
                "after fp32": lambda: ours(a.after_bin, "after32"),
                "after bf16": lambda: ours(a.after_bin, "after16", ["--dtype", "bf16"]),
                "pytorch fp32": lambda: torch("torch32", False),
                "pytorch bf16 autocast": lambda: torch("torch16", True)}
        got = {k: [] for k in runs}
        for r in range(a.rounds):
            for k, f in runs.items():
                got[k].append(f())
                print("round %d %-22s %8.0f tok/s  load %.1f -> %.1f" % (
                    r + 1, k, got[k][-1]["median_tokens_per_s"], *got[k][-1]["load"]), flush=True)
        res["tps"] = {k: {"runs": v, "median_tokens_per_s":
                          statistics.median([x["median_tokens_per_s"] for x in v])}
                      for k, v in got.items()}

    if "mem" in parts:
        res["mem"] = []
        cfg = {"vocab": 8000, "dim": 64, "n_layers": 2, "n_heads": 8, "n_kv_heads": 8,
               "ffn_dim": 0, "batch": 1}
        for T in (2048, 4096):
            c = dict(cfg, seq_len=T)
            for label, bindir, extra in (("before fp32", a.before_bin, []),
                                         ("after fp32", a.after_bin, []),
                                         ("after bf16", a.after_bin, ["--dtype", "bf16"])):
                out = os.path.join(a.work, "run-mem")
                shutil.rmtree(out, ignore_errors=True)
                cmd = ["/usr/bin/time", "-f", "%M", os.path.join(bindir, "tokshard-train"),
                       "--dataset", a.dataset, "--out", out, "--threads", str(a.threads),
                       "--global-batch", "1", "--steps", "2", "--max-seq-len", str(T)] + \
                    model_flags(c) + HYPER + extra
                p = subprocess.run(cmd, check=True, capture_output=True, text=True)
                rss_kib = int(p.stderr.strip().splitlines()[-1])
                row = {"T": T, "run": label, "peak_rss_mib": rss_kib / 1024.0}
                if bindir == a.after_bin:
                    d = subprocess.run(cmd[3:] + ["--dry-run"], check=True, capture_output=True,
                                       text=True).stdout
                    mm = re.search(r"\((\d+) bytes\)", d)
                    row["dry_run_activation_mib"] = int(mm.group(1)) / 2**20 if mm else None
                shutil.rmtree(out, ignore_errors=True)
                res["mem"].append(row)
                print("T=%d %-12s peak RSS %7.1f MiB%s" % (
                    T, label, row["peak_rss_mib"],
                    "  (dry-run activations %.1f MiB)" % row["dry_run_activation_mib"]
                    if row.get("dry_run_activation_mib") else ""), flush=True)

    if "wait" in parts:
        r = ours(a.after_bin, "wait", steps=W + S)
        res["wait"] = {"host_wait_s": r["host_wait_s"], "elapsed_s": r["elapsed_s"],
                       "fraction": r["host_wait_s"] / r["elapsed_s"] if r["elapsed_s"] else None}
        print("host waited on the backend %.6f s of %.3f s (%.2e of step time)" % (
            r["host_wait_s"], r["elapsed_s"], res["wait"]["fraction"]), flush=True)
    res["load_end"] = load()
    print(json.dumps(res))


if __name__ == "__main__":
    main()

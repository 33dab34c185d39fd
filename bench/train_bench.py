#!/usr/bin/env python3
"""Driver of bench/bench_train.sh (run that script, not this file directly).

Part 1  training tokens/s: tokshard-train (CPU backend) against a PyTorch LLaMA of
        the same configuration (bench/torch_llama_bench.py), same data, same
        threads, same batch; 2 configs x threads {N, 1}.
Part 2a tokens/s at 1 and 2 processes: --threads 1, --threads 2, mpirun -np 2
        --dp-shard 2 --threads 1, mpirun -np 2 --tp 2 --threads 1 (main config).
Part 2b communicated bytes per step per collective kind (metrics.jsonl
        "comm_bytes", rank 0) against bench/comm_expected.py, for the layouts
        (dp_replicate, dp_shard, tp) of a tiny model, plus the ring-algorithm
        wire-byte estimate.
Part 2c optimizer-state memory per rank (--dry-run) against 1/dp_shard.
prof    (--profile) per-component time of a step: ours from op timers in a scratch
        build (train_op_profile.py), PyTorch's from components timed alone
        (torch_train_ops.py).

Every timed run records the 1-minute load average before it and the CPU time
that other processes used while it ran ("foreign" CPU, from /proc/stat minus
the run's own rusage), so figures taken on a busy machine say so.
"""
import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import comm_expected  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def proc_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / HZ


def load1():
    return float(open("/proc/loadavg").read().split()[0])


def run(cmd, env=None, log=None):
    """Runs cmd; returns wall seconds, own CPU seconds, foreign CPU seconds, load before."""
    la = load1()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, t0 = proc_busy(), time.perf_counter()
    with open(log or os.devnull, "w") as lf:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE if log is None else lf,
                           stderr=subprocess.STDOUT if log else subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    b1 = proc_busy()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if p.returncode != 0:
        tail = open(log).read()[-3000:] if log else (p.stdout or "")[-2000:] + (p.stderr or "")[-2000:]
        raise SystemExit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), tail))
    return {"wall_s": round(wall, 3), "own_cpu_s": round(own, 2),
            "foreign_cpu_s": round(max(0.0, (b1 - b0) - own), 2), "load1_before": la,
            "stdout": p.stdout if log is None else None}


def others_busy(window=5.0):
    """CPUs' worth of work other processes do now (we run nothing meanwhile)."""
    b0 = proc_busy()
    time.sleep(window)
    return (proc_busy() - b0) / window


def wait_quiet(threshold, max_wait, say):
    """Waits until other processes use less than `threshold` CPUs (measured over
    5 s; the load average would count this benchmark's own previous runs)."""
    t0 = time.time()
    while True:
        busy = others_busy()
        if busy < threshold:
            return busy, time.time() - t0
        if time.time() - t0 >= max_wait:
            say("  machine still busy after %.0f s (other processes use %.2f CPUs): measuring anyway"
                % (max_wait, busy))
            return busy, time.time() - t0
        say("  waiting for a quiet machine: other processes use %.2f CPUs (load %.2f)" % (busy, load1()))
        time.sleep(25)


CONFIGS = {
    "main": {"vocab": 8000, "dim": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
             "ffn_dim": 352, "seq_len": 128, "batch": 16},
    "large": {"vocab": 8000, "dim": 256, "n_layers": 6, "n_heads": 8, "n_kv_heads": 4,
              "ffn_dim": 704, "seq_len": 256, "batch": 8},
}
TINY = {"vocab": 8000, "vocab_divisible_by": 64, "dim": 64, "n_layers": 2, "n_heads": 4,
        "n_kv_heads": 2, "ffn_dim": 0, "tie_embeddings": False, "seq_len": 32,
        "global_batch": 8, "micro_batch": 0}
LAYOUTS = [(1, 1, 2), (1, 2, 1), (2, 1, 1), (1, 2, 2), (2, 2, 1), (2, 2, 2)]
HYPER = {"lr": 3e-3, "min_lr": 3e-4, "warmup": 20, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
         "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1337}


def model_flags(c):
    return ["--vocab-size", str(c["vocab"]), "--dim", str(c["dim"]), "--n-layers",
            str(c["n_layers"]), "--n-heads", str(c["n_heads"]), "--n-kv-heads",
            str(c["n_kv_heads"]), "--ffn-dim", str(c["ffn_dim"]), "--seq-len", str(c["seq_len"])]


def train_flags(steps):
    h = HYPER
    return ["--steps", str(steps), "--lr", str(h["lr"]), "--min-lr", str(h["min_lr"]),
            "--warmup", str(h["warmup"]), "--beta1", str(h["beta1"]), "--beta2", str(h["beta2"]),
            "--adam-eps", str(h["eps"]), "--weight-decay", str(h["weight_decay"]),
            "--grad-clip", str(h["grad_clip"]), "--seed", str(h["seed"]), "--eval-every", "0",
            "--save-every", "0", "--keep", "1", "--quiet", "--no-plot"]


def metrics(out):
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]


def mpirun(np_):
    return ["mpirun", "-np", str(np_), "--oversubscribe", "-x", "OMP_NUM_THREADS=1"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="build directory bin/ with tokshard-train")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--work", required=True, help="scratch directory for run outputs")
    ap.add_argument("--results", required=True, help="results directory")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--timed-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quiet-load", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=0, help="seconds to wait before each part for other "
                    "processes to use less than --quiet-load CPUs")
    ap.add_argument("--parts", default="1,2a,2b,2c", help="1,2a,2b,2c,prof")
    ap.add_argument("--configs", default="main,large")
    ap.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"))
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    train = os.path.join(a.bin, "tokshard-train")
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.results, exist_ok=True)
    logdir = os.path.join(a.results, "train-%s-logs" % a.tag)
    os.makedirs(logdir, exist_ok=True)
    W, S = a.warmup_steps, a.timed_steps
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")

    def say(s):
        print(s, flush=True)

    res = {"tag": a.tag, "machine": machine_info(), "dataset": os.path.abspath(a.dataset),
           "warmup_steps": W, "timed_steps": S, "hyper": HYPER, "command": " ".join(sys.argv)}

    def ours(cfg, threads, name, extra=(), np_=1, xenv=None):
        out = os.path.join(a.work, name)
        shutil.rmtree(out, ignore_errors=True)
        cmd = (mpirun(np_) if np_ > 1 else []) + [train, "--dataset", a.dataset, "--out", out,
               "--threads", str(threads), "--global-batch", str(cfg["batch"])] + \
            model_flags(cfg) + train_flags(W + S) + list(extra)
        r = run(cmd, env=dict(env, **(xenv or {})), log=os.path.join(logdir, name + ".log"))
        m = metrics(out)
        tps = [x["tokens_per_s"] for x in m[W:]]
        r.update({"cmd": " ".join(cmd), "tokens_per_s": tps,
                  "median_tokens_per_s": statistics.median(tps),
                  "loss_first": m[0]["loss"], "loss_last": m[-1]["loss"],
                  "comm_bytes": [x.get("comm_bytes") for x in m]})
        shutil.copy(os.path.join(out, "metrics.jsonl"), os.path.join(logdir, name + ".metrics.jsonl"))
        shutil.rmtree(out, ignore_errors=True)
        return r

    def torch_run(cfg, threads, name, xenv=None):
        cmd = [a.torch_python, os.path.join(HERE, "torch_llama_bench.py"), "--dataset", a.dataset,
               "--threads", str(threads), "--warmup-steps", str(W), "--steps", str(S),
               "--lr", str(HYPER["lr"]), "--min-lr", str(HYPER["min_lr"]), "--warmup",
               str(HYPER["warmup"]), "--beta1", str(HYPER["beta1"]), "--beta2", str(HYPER["beta2"]),
               "--eps", str(HYPER["eps"]), "--weight-decay", str(HYPER["weight_decay"]),
               "--grad-clip", str(HYPER["grad_clip"]), "--seed", str(HYPER["seed"])]
        for k in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "seq_len", "batch"):
            cmd += ["--" + k.replace("_", "-"), str(cfg[k])]
        e = dict(env, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), **(xenv or {}))
        r = run(cmd, env=e)
        j = json.loads(r.pop("stdout").strip().splitlines()[-1])
        r.update({"cmd": " ".join(cmd), "tokens_per_s": j["tokens_per_s"],
                  "median_tokens_per_s": j["median_tokens_per_s"], "loss_first": j["loss_first"],
                  "loss_last": j["loss_last"], "torch": j["torch"], "n_params": j["n_params"]})
        return r

    # ---- part 1 ----------------------------------------------------------------
    res["others_cpus_before"] = {}
    if "1" in parts or "2a" in parts:
        la, waited = wait_quiet(a.quiet_load, a.max_wait, say)
        res["others_cpus_before"]["part1"] = la
        say("part 1: tokens/s, tokshard-train vs PyTorch (other processes: %.2f CPUs)" % la)
        p1 = []
        cfgs = a.configs.split(",") if "1" in parts else ["main"]
        # the "all cores" runs once more with OMP_WAIT_POLICY=passive for both:
        # libgomp's spinning idle threads otherwise compete with OpenBLAS's
        # pthreads for the same cores (both programs use both runtimes)
        variants = [(th, None) for th in sorted({a.threads, 1}, reverse=True)]
        if a.threads > 1:
            variants.append((a.threads, "passive"))
        for cname in cfgs:
            cfg = CONFIGS[cname]
            for th, wp in variants:
                xenv = {"OMP_WAIT_POLICY": wp} if wp else {}
                tag = "p1-%s-t%d%s" % (cname, th, "-" + wp if wp else "")
                o = ours(cfg, th, tag + "-ours", xenv=xenv)
                t = torch_run(cfg, th, tag + "-torch", xenv=xenv) if "1" in parts else None
                row = {"config": cname, "threads": th, "omp_wait_policy": wp, "ours": o, "torch": t,
                       "ratio": o["median_tokens_per_s"] / t["median_tokens_per_s"] if t else None}
                p1.append(row)
                say("  %-5s threads %d%-24s: ours %6.0f tok/s, pytorch %6s tok/s, ratio %s  (foreign CPU %.1f s)"
                    % (cname, th, " OMP_WAIT_POLICY=" + wp if wp else "", o["median_tokens_per_s"],
                       "%.0f" % t["median_tokens_per_s"] if t else "-",
                       "%.2f" % row["ratio"] if t else "-",
                       o["foreign_cpu_s"] + (t["foreign_cpu_s"] if t else 0)))
        res["part1"] = p1

    # ---- part 2a ---------------------------------------------------------------
    if "2a" in parts:
        la, waited = wait_quiet(a.quiet_load, a.max_wait, say)
        res["others_cpus_before"]["part2a"] = la
        say("part 2a: tokens/s at 1 and 2 processes, main config (other processes: %.2f CPUs)" % la)
        cfg = CONFIGS["main"]
        rows = []
        for r1 in res["part1"]:
            if r1["config"] == "main":
                rows.append({"run": "1 process, --threads %d%s" % (r1["threads"], ", OMP_WAIT_POLICY=" + r1["omp_wait_policy"] if r1["omp_wait_policy"] else ""), "procs": 1,
                             "threads_per_proc": r1["threads"], "layout": [1, 1, 1], **strip(r1["ours"])})
        for lay, label, extra in (((1, 2, 1), "2 processes, --dp-shard 2 --threads 1", ["--dp-shard", "2"]),
                                  ((1, 1, 2), "2 processes, --tp 2 --threads 1", ["--tp", "2", "--dp-shard", "1"])):
            o = ours(cfg, 1, "p2a-%d%d%d" % lay, extra=extra, np_=2)
            ccfg = dict(TINY, vocab=cfg["vocab"], dim=cfg["dim"], n_layers=cfg["n_layers"],
                        n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"], ffn_dim=cfg["ffn_dim"],
                        seq_len=cfg["seq_len"], global_batch=cfg["batch"], micro_batch=0)
            e = comm_expected.expected(ccfg, *lay)
            o["comm_expected"] = e["payload_bytes"]
            o["comm_match"] = all(c == e["payload_bytes"] for c in o["comm_bytes"])
            rows.append({"run": label, "procs": 2, "threads_per_proc": 1, "layout": list(lay), **strip(o)})
        base = next(r for r in rows if r["procs"] == 1 and r["threads_per_proc"] == 1)
        for r in rows:
            r["speedup_vs_1x1"] = r["median_tokens_per_s"] / base["median_tokens_per_s"]
            say("  %-58s %6.0f tok/s  x%.2f  (foreign CPU %.1f s)%s"
                % (r["run"], r["median_tokens_per_s"], r["speedup_vs_1x1"],
                   r["foreign_cpu_s"], "" if "comm_match" not in r else
                   "  comm bytes %s expected" % ("==" if r["comm_match"] else "!=")))
        res["part2a"] = rows

    # ---- part 2b ---------------------------------------------------------------
    if "2b" in parts:
        say("part 2b: bytes per step per collective, tiny model (dim 64, 2 layers, vocab 8000, "
            "seq 32, global batch 8), measured (rank 0) vs expected")
        rows = []
        layouts = [(l, 0) for l in LAYOUTS] + [((1, 2, 2), 2)]
        for lay, mb in layouts:
            rep, sh, tp = lay
            cfg = dict(TINY, micro_batch=mb)
            name = "p2b-%d%d%d%s" % (rep, sh, tp, "-mb%d" % mb if mb else "")
            out = os.path.join(a.work, name)
            shutil.rmtree(out, ignore_errors=True)
            cmd = mpirun(rep * sh * tp) + [train, "--dataset", a.dataset, "--out", out,
                   "--threads", "1", "--global-batch", str(cfg["global_batch"]),
                   "--dp-replicate", str(rep), "--dp-shard", str(sh), "--tp", str(tp),
                   "--micro-batch", str(mb), "--vocab-size", str(cfg["vocab"]), "--dim",
                   str(cfg["dim"]), "--n-layers", str(cfg["n_layers"]), "--n-heads",
                   str(cfg["n_heads"]), "--n-kv-heads", str(cfg["n_kv_heads"]), "--seq-len",
                   str(cfg["seq_len"])] + train_flags(3)
            r = run(cmd, env=env, log=os.path.join(logdir, name + ".log"))
            m = metrics(out)
            meas = [x["comm_bytes"] for x in m]
            e = comm_expected.expected(cfg, rep, sh, tp)
            match = all(c == e["payload_bytes"] for c in meas)
            rows.append({"layout": list(lay), "micro_batch": mb or None, "world": rep * sh * tp,
                         "n_flat": e["n_flat"], "n_slice": e["n_slice"],
                         "measured_per_step": meas, "expected": e["payload_bytes"],
                         "ring_wire_bytes": e["ring_wire_bytes"], "detail": e["detail"],
                         "match": match, "cmd": " ".join(cmd), "wall_s": r["wall_s"]})
            shutil.copy(os.path.join(out, "metrics.jsonl"), os.path.join(logdir, name + ".metrics.jsonl"))
            shutil.rmtree(out, ignore_errors=True)
            say("  (%d,%d,%d)%s: measured %s  expected %s  %s" % (
                rep, sh, tp, " micro-batch %d" % mb if mb else "", fmt_cb(meas[0]),
                fmt_cb(e["payload_bytes"]), "MATCH (all %d steps)" % len(meas) if match else "MISMATCH"))
        res["part2b"] = rows

    # ---- part 2c ---------------------------------------------------------------
    if "2c" in parts:
        say("part 2c: optimizer state per rank (--dry-run), main config")
        cfg = CONFIGS["main"]
        rows = []
        for rep, sh, tp in [(1, 1, 1), (1, 2, 1), (1, 4, 1), (1, 8, 1), (1, 4, 2), (2, 4, 1)]:
            world = rep * sh * tp
            cmd = [train, "--dataset", a.dataset, "--dry-run", "--world", str(world),
                   "--dp-replicate", str(rep), "--dp-shard", str(sh), "--tp", str(tp),
                   "--global-batch", "16"] + model_flags(cfg)
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            mm = re.search(r"optimizer state ([0-9.]+) MiB", out.stdout)
            if not mm:
                raise SystemExit("no 'optimizer state' in dry-run output:\n" + out.stdout[-2000:])
            ccfg = dict(TINY, vocab=cfg["vocab"], dim=cfg["dim"], n_layers=cfg["n_layers"],
                        n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"], ffn_dim=cfg["ffn_dim"],
                        seq_len=cfg["seq_len"], global_batch=16)
            e = comm_expected.expected(ccfg, rep, sh, tp)
            rows.append({"layout": [rep, sh, tp], "dry_run_mib": float(mm.group(1)),
                         "allocated_mib": e["optimizer_state_bytes_per_rank"] / 2 ** 20})
        base, abase = rows[0]["dry_run_mib"], rows[0]["allocated_mib"]
        for r in rows:
            k = r["layout"][1] * r["layout"][2]
            r["ideal_mib"] = base / k
            r["ratio_to_ideal"] = r["dry_run_mib"] / r["ideal_mib"]
            r["allocated_ratio_to_ideal"] = r["allocated_mib"] / (abase / k)
            say("  (%d,%d,%d): dry-run %.1f MiB, ideal %.3f MiB (1/(dp_shard x tp) of (1,1,1)); "
                "AdamW moments allocated %.3f MiB = %.4f x ideal" % (
                    *r["layout"], r["dry_run_mib"], r["ideal_mib"], r["allocated_mib"],
                    r["allocated_ratio_to_ideal"]))
        res["part2c"] = rows

    # ---- per-op profiles ------------------------------------------------------------
    if "prof" in parts:
        la, waited = wait_quiet(a.quiet_load, a.max_wait, say)
        res["others_cpus_before"]["prof"] = la
        say("profiles: per-op time of a step, ours (scratch build with op timers) and PyTorch "
            "(components timed alone) (other processes: %.2f CPUs)" % la)
        res["profiles"] = []
        variants = [(th, None) for th in sorted({a.threads, 1}, reverse=True)]
        if a.threads > 1:
            variants.append((a.threads, "passive"))
        for cname in a.configs.split(","):
            cfg = CONFIGS[cname]
            for th, wp in variants:
                xenv = {"OMP_WAIT_POLICY": wp} if wp else {}
                base = os.path.join(a.results, "train-%s-%%s-%s-t%d%s.json" % (a.tag, cname, th, "-" + wp if wp else ""))
                out = os.path.join(a.work, "prof-run")
                cmd = [sys.executable, os.path.join(HERE, "train_op_profile.py"), "--repo",
                       os.path.dirname(HERE), "--scratch", os.path.join(a.work, "prof"),
                       "--skip", str(W), "--out", base % "profile", "--", "--dataset", a.dataset,
                       "--out", out, "--threads", str(th), "--global-batch", str(cfg["batch"])] + \
                    model_flags(cfg) + train_flags(W + 5)
                run(cmd, env=dict(env, **xenv), log=os.path.join(logdir, "prof-%s-t%d%s.log" % (cname, th, "-" + wp if wp else "")))
                cmd = [a.torch_python, os.path.join(HERE, "torch_train_ops.py"), "--threads", str(th)]
                for k in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "seq_len", "batch"):
                    cmd += ["--" + k.replace("_", "-"), str(cfg[k])]
                r = run(cmd, env=dict(env, OPENBLAS_NUM_THREADS=str(th), OMP_NUM_THREADS=str(th), **xenv))
                tops = json.loads(r["stdout"].strip().splitlines()[-1])
                # the full PyTorch step: part 1's median when it ran, else a short run
                full = [x["torch"]["median_tokens_per_s"] for x in res.get("part1", [])
                        if x["config"] == cname and x["threads"] == th and x["torch"]
                        and x["omp_wait_policy"] == wp]
                if not full:
                    full = [torch_run(dict(cfg), th, "prof-torch", xenv=xenv)["median_tokens_per_s"]]
                tops["full_step_s"] = cfg["batch"] * cfg["seq_len"] / full[0]
                json.dump(tops, open(base % "torchops", "w"), indent=1)
                ours_p = json.load(open(base % "profile"))
                say("  %-5s threads %d%s: ours %.3f s/step (profiled build), PyTorch components "
                    "%.3f of a %.3f s step" % (cname, th, " OMP_WAIT_POLICY=" + wp if wp else "",
                                               ours_p["wall_s_per_step"], tops["sum_s"], tops["full_step_s"]))
                res["profiles"].append({"config": cname, "threads": th, "omp_wait_policy": wp,
                                        "ours": base % "profile",
                                        "torch": base % "torchops"})

    res["load1_end"] = load1()
    path = os.path.join(a.results, "train-%s.json" % a.tag)
    json.dump(res, open(path, "w"), indent=1)
    shutil.copy(path, os.path.join(a.results, "train-latest.json"))
    say("results: %s" % path)


def strip(r):
    return {k: v for k, v in r.items() if k not in ("stdout",)}


def fmt_cb(c):
    return "AR %d RS %d AG %d" % (c["allreduce"], c["reduce_scatter"], c["allgather"])


def machine_info():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True).stdout.strip()
        except Exception:
            return ""
    return {"cpu": sh("lscpu | sed -n 's/^Model name: *//p'"), "cores": os.cpu_count(),
            "kernel": platform.release(),
            "cpu_flags": sh("grep -m1 -o -w 'avx2\\|avx512f\\|avx512_bf16\\|amx_tile' /proc/cpuinfo | sort -u | tr '\\n' ' '"),
            "openblas": sh("dpkg-query -W -f '${db:Status-Abbrev}${Package} ${Version}\\n' 'libopenblas0*' | sed -n 's/^ii *//p' | tr '\\n' ' '"),
            "openmpi": sh("dpkg-query -W -f '${Version}' openmpi-bin"),
            "torch_pkg": sh("dpkg-query -W -f '${Version}' python3-torch"),
            "blas_alternative": sh("readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3"),
            "gcc": sh("gcc -dumpfullversion"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


if __name__ == "__main__":
    main()

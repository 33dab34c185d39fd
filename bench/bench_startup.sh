#!/usr/bin/env bash
# Start-up cost of the CLIs, two builds side by side in one run: CPU time
# (user + system, from getrusage of the children) per invocation and the
# largest RSS, for `tokshard --version`, `tokshard audit DATASET` (the lean
# front end's own audit), `tokshard-full --version` and
# `tokshard-train --help`. Rounds alternate the builds; the least CPU of
# the rounds is reported (the figure sharing the machine distorts least).
# Usage: bench/bench_startup.sh BEFORE_BIN_DIR AFTER_BIN_DIR DATASET [ROUNDS] [RUNS]
#   e.g. a worktree of the older commit built into /tmp/before/build/bin.
set -euo pipefail
before=$1 after=$2 ds=$3 rounds=${4:-5} runs=${5:-40}
python3 - "$before" "$after" "$ds" "$rounds" "$runs" <<'PY'
import os, resource, subprocess, sys
before, after, ds, rounds, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cases = [("tokshard --version", "tokshard", ["--version"]),
         ("tokshard audit", "tokshard", ["audit", ds]),
         ("tokshard-full --version", "tokshard-full", ["--version"]),
         ("tokshard-train --help", "tokshard-train", ["--help"])]
def cpu_ms(argv):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000.0 * ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / runs
def rss_mb(argv):
    out = subprocess.run(["/usr/bin/time", "-f", "%M"] + argv, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, check=True).stderr.strip().splitlines()[-1]
    return int(out) / 1024.0
print(f"load average {os.getloadavg()[0]:.1f}; {rounds} rounds x {runs} runs, least CPU per run")
print("| command | before CPU ms | after CPU ms | after/before | before RSS MB | after RSS MB |")
print("|---|---|---|---|---|---|")
for name, binary, args in cases:
    best = {"b": 1e9, "a": 1e9}
    for _ in range(rounds):
        for k, d in (("b", before), ("a", after)):
            best[k] = min(best[k], cpu_ms([os.path.join(d, binary)] + args))
    rb, ra = rss_mb([os.path.join(before, binary)] + args), rss_mb([os.path.join(after, binary)] + args)
    print(f"| `{name}` | {best['b']:.2f} | {best['a']:.2f} | {best['a'] / best['b']:.2f}x | {rb:.1f} | {ra:.1f} |")
PY

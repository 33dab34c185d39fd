#!/usr/bin/python3
"""Turns bench_build.sh's raw runs into a table, the targets and a JSON file.

usage: summarize.py RAW.tsv META.tsv OUT.json
"""
import json
import statistics
import sys


def load_meta(path):
    meta, warnings = {}, []
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("\t")
            if k == "warning":
                warnings.append(v)
            else:
                meta[k] = v
    meta["warnings"] = warnings
    return meta


def load_runs(path):
    runs = {}
    with open(path) as f:
        cols = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(cols, line.rstrip("\n").split("\t")))
            for k in ("wall_s", "user_s", "sys_s", "foreign_cpu_s", "load1_before"):
                r[k] = float(r[k])
            r.setdefault("disturbed", "0")
            for k in ("rss_kb", "bytes", "run", "disturbed"):
                r[k] = int(r[k])
            runs.setdefault(r["name"], []).append(r)
    return runs


def summarize(runs, nproc):
    out = {}
    for name, all_rs in runs.items():
        rs = [r for r in all_rs if not r["disturbed"]] or all_rs
        wall = statistics.median(r["wall_s"] for r in rs)
        b = rs[0]["bytes"]
        cpu = statistics.median(r["user_s"] + r["sys_s"] for r in rs)
        out[name] = {
            "runs": len(rs),
            "runs_disturbed_discarded": len(all_rs) - len(rs) if len(rs) < len(all_rs) else 0,
            "all_runs_disturbed": all(r["disturbed"] for r in all_rs),
            "wall_s_median": wall,
            "wall_s_all": [r["wall_s"] for r in rs],
            "bytes": b,
            "mb_per_s": b / 1e6 / max(wall, 0.01),
            "gb_per_s": b / 1e9 / max(wall, 0.01),
            "cpu_s_median": cpu,
            "cores_used": cpu / wall if wall else 0.0,
            "peak_rss_mib_max": max(r["rss_kb"] for r in rs) / 1024,
            "foreign_cpu_frac_max": max(r["foreign_cpu_s"] / (r["wall_s"] * nproc) if r["wall_s"] else 0
                                        for r in rs),
            "load1_before_max": max(r["load1_before"] for r in rs),
        }
    return out


def main():
    raw, metap, outp = sys.argv[1:4]
    meta = load_meta(metap)
    nproc = int(meta.get("nproc", 1))
    N = int(meta.get("threads", nproc))
    s = summarize(load_runs(raw), nproc)
    g = lambda n, k="mb_per_s": s[n][k] if n in s else None

    ratios, targets = {}, []

    def ratio(key, a, b):
        if a is not None and b:
            ratios[key] = a / b
        return ratios.get(key)

    spm = g("spm_encode_1")
    t1, tN, py = g("tokshard_build_t1"), g("tokshard_build_tN"), g("megatron_py_wN")
    ratio("build_t1_vs_spm_encode", t1, spm)
    ratio("build_tN_vs_spm_encode", tN, spm)
    ratio("build_tN_vs_t1", tN, t1)
    ratio("build_tN_vs_megatron_py", tN, py)
    ratio("megatron_py_vs_spm_encode", py, spm)
    r = ratio("build_tN_vs_N_x_spm_encode", tN, N * spm if spm else None)
    targets.append({"target": f"build --threads {N} >= 0.9 x {N} x spm_encode (1 thread)",
                    "value": r, "need": 0.9, "met": r is not None and r >= 0.9})
    r = ratios.get("build_tN_vs_megatron_py")
    targets.append({"target": f"build --threads {N} >= 1.5 x Megatron-style Python ({N} workers)",
                    "value": r, "need": 1.5, "met": r is not None and r >= 1.5})

    a1, aN = g("tokshard_audit_t1", "gb_per_s"), g("tokshard_audit_tN", "gb_per_s")
    x1, xN = g("xxhsum_H3_1", "gb_per_s"), g("xxhsum_H3_pN", "gb_per_s")
    r1 = ratio("audit_t1_vs_xxhsum_1", a1, x1)
    rN = ratio("audit_tN_vs_N_x_xxhsum_1", aN, N * x1 if x1 else None)
    ratio("audit_tN_vs_t1", aN, a1)
    ratio("audit_tN_vs_xxhsum_pN", aN, xN)
    ratio("xxhsum_pN_vs_1", xN, x1)
    targets.append({"target": "audit --threads 1 >= 0.5 x xxhsum -H3 (per core)",
                    "value": r1, "need": 0.5, "met": r1 is not None and r1 >= 0.5})
    targets.append({"target": f"audit --threads {N} >= 0.5 x {N} x xxhsum -H3 (scales with threads)",
                    "value": rN, "need": 0.5, "met": rN is not None and rN >= 0.5})

    rss1 = g("tokshard_build_tN", "peak_rss_mib_max")
    rss7 = g("tokshard_build_tN_x7", "peak_rss_mib_max")
    rssL = g("tokshard_build_tN_linux", "peak_rss_mib_max")
    ratio("rss_x7_vs_1x", rss7, rss1)
    ratio("rss_linux_vs_1x", rssL, rss1)
    if rssL is not None and rss1 is not None:
        ok = rssL < 512 and rssL <= 1.25 * rss1 + 32
        targets.append({"target": "build peak RSS independent of input size, < 512 MiB for ~1 GB",
                        "value": rssL, "need": 512, "met": ok,
                        "note": f"{rss1:.0f} MiB on {s['tokshard_build_tN']['bytes'] / 1e6:.0f} MB of text, "
                                f"{rss7:.0f} MiB on {s['tokshard_build_tN_x7']['bytes'] / 1e6:.0f} MB, "
                                f"{rssL:.0f} MiB on {s['tokshard_build_tN_linux']['bytes'] / 1e6:.0f} MB (linux tarball)"})
    elif rss7 is not None and rss1 is not None:
        targets.append({"target": "build peak RSS independent of input size (1 GB point needs --large)",
                        "value": rss7, "need": 512, "met": rss7 <= 1.25 * rss1 + 32,
                        "note": f"{rss1:.0f} MiB on 1x, {rss7:.0f} MiB on 7x the text"})
    ratio("audit_tN_vs_t1_linux", g("tokshard_audit_tN_linux", "gb_per_s"), g("tokshard_audit_t1_linux", "gb_per_s"))
    ratio("audit_t1_vs_xxhsum_1_linux", g("tokshard_audit_t1_linux", "gb_per_s"), g("xxhsum_H3_1_linux", "gb_per_s"))
    if g("tokshard_build_t1_hugedoc_lines") and g("tokshard_build_t1_hugedoc"):
        ratio("hugedoc_one_doc_vs_lines", g("tokshard_build_t1_hugedoc"), g("tokshard_build_t1_hugedoc_lines"))

    # ------------------------------------------------------------- table
    def row(label, name, unit="mb_per_s", base=None, base_label=""):
        if name not in s:
            return
        e = s[name]
        v = e[unit]
        rel = f"{v / base:6.2f}x {base_label}" if base else ""
        flag = " *" if e["all_runs_disturbed"] else ""
        u = "MB/s" if unit == "mb_per_s" else "GB/s"
        print(f"  {label:<44} {e['wall_s_median']:8.2f} s {v:8.2f} {u}  {e['cores_used']:4.2f} cores "
              f"{e['peak_rss_mib_max']:7.0f} MiB  {rel}{flag}")

    print()
    print(f"tokshard bench, {meta.get('date')}, {meta.get('cpu')}, {nproc} cores, N = {N}")
    print(f"text: {int(meta.get('corpus_bytes', 0)) / 1e6:.1f} MB, {meta.get('corpus_lines')} lines; "
          f"tokenizer bpe 8000; medians of {meta.get('runs')} (build) / {meta.get('audit_runs')} (audit) runs")
    print(f"  {'tool':<44} {'wall':>10} {'speed':>13}  {'CPU':>10} {'peak RSS':>11}  ratio")
    row("spm_encode (1 thread)", "spm_encode_1", base=spm, base_label="spm_encode")
    row("tokshard build --threads 1", "tokshard_build_t1", base=spm, base_label="spm_encode")
    row(f"tokshard build --threads {N}", "tokshard_build_tN", base=spm, base_label="spm_encode")
    row(f"megatron_style.py ({N} workers)", "megatron_py_wN", base=spm, base_label="spm_encode")
    row(f"tokshard build --threads {N}, 7x text", "tokshard_build_tN_x7", base=spm, base_label="spm_encode")
    row("xxhsum -H3 (1 process)", "xxhsum_H3_1", "gb_per_s", base=x1, base_label="xxhsum")
    row(f"xxhsum -H3 ({N} processes)", "xxhsum_H3_pN", "gb_per_s", base=x1, base_label="xxhsum")
    row("tokshard audit --threads 1", "tokshard_audit_t1", "gb_per_s", base=x1, base_label="xxhsum")
    row(f"tokshard audit --threads {N}", "tokshard_audit_tN", "gb_per_s", base=x1, base_label="xxhsum")
    if "tokshard_build_tN_linux" in s:
        print("  large (linux-source-6.1.tar.xz; MB/s of uncompressed tar bytes):")
        row("xz -dc linux-source-6.1.tar.xz", "xz_decompress")
        row(f"tokshard build --threads {N} linux tarball", "tokshard_build_tN_linux")
        xl = g("xxhsum_H3_1_linux", "gb_per_s")
        row("xxhsum -H3 (linux shards)", "xxhsum_H3_1_linux", "gb_per_s", base=xl, base_label="xxhsum")
        row("tokshard audit --threads 1 (linux shards)", "tokshard_audit_t1_linux", "gb_per_s", base=xl, base_label="xxhsum")
        row(f"tokshard audit --threads {N} (linux shards)", "tokshard_audit_tN_linux", "gb_per_s", base=xl, base_label="xxhsum")
    if "tokshard_build_t1_hugedoc" in s:
        hl = g("tokshard_build_t1_hugedoc_lines")
        print("  the largest file of the tarball, one thread (ratio: against the same bytes as lines):")
        row("tokshard build --threads 1, its lines", "tokshard_build_t1_hugedoc_lines", base=hl, base_label="lines")
        row("tokshard build --threads 1, one document", "tokshard_build_t1_hugedoc", base=hl, base_label="lines")
        row("python sentencepiece, one document", "spm_python_hugedoc", base=hl, base_label="lines")
    print("  (* = every run of this line was disturbed by other processes: > 5% of the machine)")
    print()
    if "ids_identical" in meta:
        print(f"ids identical: {meta.get('ids_identical')} ({meta.get('ids_documents')} documents, "
              f"{meta.get('ids_tokens')} tokens); shards identical for 1 and {N} threads: "
              f"{meta.get('ids_shards_identical_t1_tN')}")
    print("ratios:")
    for k, v in ratios.items():
        print(f"  {k:<32} {v:7.3f}")
    print("targets:")
    for t in targets:
        v = t["value"]
        vs = "n/a" if v is None else (f"{v:.0f} MiB" if "RSS" in t["target"] else f"{v:.2f}x")
        status = "n/a" if v is None else ("met" if t["met"] else "NOT met")
        print(f"  [{status}] {t['target']}: {vs}" + (f" ({t['note']})" if t.get("note") else ""))
    for w in meta["warnings"]:
        print(f"warning: {w}")

    with open(outp, "w") as f:
        json.dump({"meta": meta, "results": s, "ratios": ratios, "targets": targets}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

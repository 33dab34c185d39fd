#!/usr/bin/env python3
"""Where tokshard-train's step time goes, per backend op.

Copies the tracked sources to a scratch directory (never touches the
checkout), inserts a wall-clock timer at the top of every cpu_* function of
trainer/cpu/cpu_backend.c (gemm keyed by its shape and transposes as well),
builds that copy, runs one training job, and prints per-op totals per timed
step. The timers are omp_get_wtime() pairs around whole ops (a few hundred
calls per step), so their overhead is negligible.

usage: train_op_profile.py --repo . --scratch /tmp/tks-prof \
           --out RESULT.json -- TRAIN_ARGS...   (tokshard-train flags; give
           --steps S; the first --skip steps (default 3) are left out)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HOOK = r'''
/* ---- op timers inserted by bench/train_op_profile.py (scratch copy only) ---- */
#include <stdio.h>
#define TKP_MAX 128
static double tkp_t[TKP_MAX]; static long tkp_n[TKP_MAX]; static const char *tkp_name[TKP_MAX];
static int tkp_on = 0, tkp_pending = 0;
typedef struct { int id; double t0; } tkp_tok;
static void tkp_end(tkp_tok *t) {
    if (t->id >= 0) { tkp_t[t->id] += omp_get_wtime() - t->t0; tkp_n[t->id]++; }
}
#define TKP(name) tkp_tok _tkp __attribute__((cleanup(tkp_end))) = {tkp_on ? __COUNTER__ : -1, omp_get_wtime()}; \
    if (_tkp.id >= 0) tkp_name[_tkp.id] = name;
/* gemm keyed by shape */
#define TKG_MAX 64
static struct { int ta, tb, M, N, K; float beta; double t; long n; } tkg[TKG_MAX];
static int tkg_used;
static void tkp_dump(void) {
    const char *p = getenv("TKP_OUT");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (!f) return;
    fprintf(f, "{\"ops\": {");
    int first = 1;
    for (int i = 0; i < TKP_MAX; i++) if (tkp_name[i]) {
        fprintf(f, "%s\"%s\": [%.6f, %ld]", first ? "" : ", ", tkp_name[i], tkp_t[i], tkp_n[i]);
        first = 0;
    }
    fprintf(f, "}, \"gemm\": [");
    for (int i = 0; i < tkg_used; i++)
        fprintf(f, "%s[%d, %d, %d, %d, %d, %g, %.6f, %ld]", i ? ", " : "", tkg[i].ta, tkg[i].tb,
                tkg[i].M, tkg[i].N, tkg[i].K, tkg[i].beta, tkg[i].t, tkg[i].n);
    fprintf(f, "]}\n");
    fclose(f);
}
'''


def patch_backend(src):
    # timers for every cpu_* function except trivial memory management
    skip = {"cpu_alloc", "cpu_free", "cpu_sync", "cpu_destroy", "cpu_upload", "cpu_download",
            "tks_cpu_backend_create"}
    out, pos = [], 0
    for m in re.finditer(r"^static [^;{]*?\b(cpu_\w+)\s*\([^;{]*?\)\s*\{", src, re.S | re.M):
        name = m.group(1)
        out.append(src[pos:m.end()])
        pos = m.end()
        if name in skip:
            continue
        if name == "cpu_gemm":
            out.append(r'''
    double tkg_t0 = omp_get_wtime();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (tkp_on) {
        double dt = omp_get_wtime() - tkg_t0; int i;
        for (i = 0; i < tkg_used; i++)
            if (tkg[i].ta == ta && tkg[i].tb == tb && tkg[i].M == M && tkg[i].N == N && tkg[i].K == K && tkg[i].beta == beta) break;
        if (i == tkg_used && tkg_used < TKG_MAX) { tkg_used++; tkg[i].ta = ta; tkg[i].tb = tb; tkg[i].M = M; tkg[i].N = N; tkg[i].K = K; tkg[i].beta = beta; }
        if (i < TKG_MAX) { tkg[i].t += dt; tkg[i].n++; }
    }
    return;
''')
            continue
        out.append("\n    TKP(\"%s\")\n" % name[4:])
    out.append(src[pos:])
    s = "".join(out)
    s = s.replace('#include "../backend.h"\n', '#include "../backend.h"\n' + HOOK, 1)
    s = s.replace("static void cpu_destroy(tks_backend *be) {",
                  "static void cpu_destroy(tks_backend *be) {\n    tkp_dump();", 1)
    # timers switch on after TKP_SKIP optimizer steps: AdamW's step counter t
    # reaching TKP_SKIP arms them, the next step's zero_grad starts them
    s = s.replace("static void cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t n,\n"
                  "                      float lr, float b1, float b2, float eps, float wd, int64_t t,\n"
                  "                      float grad_scale) {",
                  "static void cpu_adamw(tks_backend *be, float *p, const float *grad, float *m, float *v, size_t n,\n"
                  "                      float lr, float b1, float b2, float eps, float wd, int64_t t,\n"
                  "                      float grad_scale) {\n"
                  "    { const char *sk = getenv(\"TKP_SKIP\");\n"
                  "      if (!tkp_on && t == (sk ? atoi(sk) : 3)) tkp_pending = 1; }", 1)
    if "tkp_pending = 1" not in s:
        raise SystemExit("could not patch cpu_adamw (the signature changed?)")
    # timing starts with the next step's zero_grad (a memzero of the gradients)
    s = s.replace('    TKP("memzero")', '    if (tkp_pending) { tkp_on = 1; tkp_pending = 0; }\n    TKP("memzero")', 1)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--mpirun", default="", help="prefix, e.g. 'mpirun -np 2 --oversubscribe'")
    ap.add_argument("--cflags", default="", help="extra CMAKE_C_FLAGS for the scratch build "
                    "(what-if experiments, e.g. '-march=native')")
    ap.add_argument("--build-type", default="Release")
    ap.add_argument("--diff", help="unified diff (git diff format) to apply to the scratch copy "
                    "first (what-if experiments)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    targs = [x for x in a.train_args if x != "--"]
    src_dir = os.path.join(a.scratch, "src")
    bld = os.path.join(a.scratch, "build")
    files = subprocess.check_output(["git", "-C", a.repo, "ls-files", "-z"]).split(b"\0")
    for f in files:
        f = f.decode()
        if not f or f.startswith("tests/fuzz/corpus"):
            continue
        s, d = os.path.join(a.repo, f), os.path.join(src_dir, f)
        if not os.path.isfile(s):
            continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if not os.path.exists(d) or open(s, "rb").read() != open(d, "rb").read():
            shutil.copy2(s, d)
    # what-if experiments: a unified diff (paths relative to the repository,
    # `git diff` style) applied to the pristine sources before the timers go in
    diffed = {}
    if a.diff:
        pristine = os.path.join(a.scratch, "pristine")
        shutil.rmtree(pristine, ignore_errors=True)
        targets = re.findall(r"^\+\+\+ b/(\S+)", open(a.diff).read(), re.M)
        for f in targets:
            os.makedirs(os.path.dirname(os.path.join(pristine, f)), exist_ok=True)
            shutil.copy2(os.path.join(a.repo, f), os.path.join(pristine, f))
        subprocess.check_call(["patch", "-s", "-p1", "-d", pristine, "-i", os.path.abspath(a.diff)])
        for f in targets:
            diffed[f] = open(os.path.join(pristine, f)).read()
    for f, text in diffed.items():
        if f != "trainer/cpu/cpu_backend.c":
            d = os.path.join(src_dir, f)
            if not os.path.exists(d) or open(d).read() != text:
                open(d, "w").write(text)
    be = os.path.join(src_dir, "trainer/cpu/cpu_backend.c")
    patched = patch_backend(diffed.get("trainer/cpu/cpu_backend.c") or
                            open(os.path.join(a.repo, "trainer/cpu/cpu_backend.c")).read())
    if not os.path.exists(be) or open(be).read() != patched:
        open(be, "w").write(patched)
    subprocess.check_call(["cmake", "-S", src_dir, "-B", bld, "-DCMAKE_BUILD_TYPE=" + a.build_type,
                           "-DCMAKE_C_FLAGS=" + a.cflags], stdout=subprocess.DEVNULL)
    subprocess.check_call(["cmake", "--build", bld, "-j2", "--target", "tokshard-train"],
                          stdout=subprocess.DEVNULL)
    steps = int(targs[targs.index("--steps") + 1])
    outdir = targs[targs.index("--out") + 1]
    shutil.rmtree(outdir, ignore_errors=True)
    env = dict(os.environ, TKP_OUT=a.out + ".raw", TKP_SKIP=str(a.skip))
    cmd = a.mpirun.split() + [os.path.join(bld, "bin/tokshard-train")] + targs
    subprocess.check_call(cmd, env=env, stdout=subprocess.DEVNULL)
    raw = json.load(open(a.out + ".raw"))
    os.remove(a.out + ".raw")
    n = steps - a.skip
    metrics = [json.loads(l) for l in open(os.path.join(outdir, "metrics.jsonl"))]
    # wall time of the timed steps from elapsed_s (includes everything)
    el = [m["elapsed_s"] for m in metrics if "loss" in m]
    wall = (el[-1] - el[a.skip - 1]) / n if a.skip >= 1 else el[-1] / n
    ops = {k: v[0] / n for k, v in raw["ops"].items()}
    gem = {}
    for ta, tb, M, N, K, beta, t, c in raw["gemm"]:
        gem["%s%s M%d N%d K%d%s" % ("T" if ta else "N", "T" if tb else "N", M, N, K,
                                    " +=" if beta else "")] = {
            "s_per_step": t / n, "calls_per_step": c / n,
            "gflops": 2.0 * M * N * K * c / t / 1e9 if t > 0 else 0}
    ops["gemm"] = sum(g["s_per_step"] for g in gem.values())
    res = {"steps_timed": n, "wall_s_per_step": wall, "op_s_per_step": ops, "gemm_by_shape": gem,
           "untimed_s_per_step": wall - sum(ops.values())}
    json.dump(res, open(a.out, "w"), indent=1)
    print("wall %.3f s/step; per op (s/step, %% of wall):" % wall)
    for k, v in sorted(ops.items(), key=lambda kv: -kv[1]):
        print("  %-16s %8.4f  %5.1f%%" % (k, v, 100 * v / wall))
    print("  %-16s %8.4f  %5.1f%%" % ("(outside ops)", res["untimed_s_per_step"],
                                      100 * res["untimed_s_per_step"] / wall))
    print("gemm by shape:")
    for k, g in sorted(gem.items(), key=lambda kv: -kv[1]["s_per_step"]):
        print("  %-30s %8.4f s/step  %5.1f calls  %6.1f GFLOP/s" % (k, g["s_per_step"],
                                                                  g["calls_per_step"], g["gflops"]))


if __name__ == "__main__":
    main()

"""Byte-level BPE training: tokshard train-tokenizer --model-type byte-bpe
against Hugging Face tokenizers' BpeTrainer and gigatoken's train_bpe.

Usage (bench/bench_bpe_train.sh makes .venv-bench and a Release build):
  .venv-bench/bin/python bench/bench_bpe_train.py --bin build-release/bin
      [--linux-jsonl PATH | --linux SRC] [--slice-mb N] [--texts linux,main,docs]
      [--vocabs 32000,128000] [--patterns llama3,gpt2] [--threads 1,2] [--peer-threads 1]
      [--tools tokshard,tokenizers,gigatoken] [--work DIR] [--out FILE.md]

Texts, each as one JSON Lines file that every tool reads (same documents):
  linux  the Linux 6.1 tree's text: every regular UTF-8 file of an unpacked
         linux-source-6.1, one record a file (1,298 MB as bench_bpe.py's
         linux-all). --linux-jsonl takes one already written; --linux SRC
         writes it to WORK/linux-all.jsonl. --slice-mb N keeps its first N MB of
         records (WORK/linux-all-<N>mb.jsonl).
  main   the main job's corpus: dict-gcide's entries (blank-line
         paragraphs) and the Python 3.11 documentation's sources.
  docs   the tree's Documentation/ alone (--linux SRC): its .rst and .txt
         files, one record a file (28.6 MB of text).
Rows: every text x vocabulary x pattern x tool x thread count. gigatoken's
train_bpe has no pattern argument (GPT-2's pre-tokenizer): its rows are
gpt2 only. tokenizers and gigatoken get their threads from rayon
(RAYON_NUM_THREADS); tokshard from --threads, the peers from
--peer-threads (default: the same). Each run is a process of its
own: CPU seconds (user + system) and peak RSS from wait4, wall time around
it (for tokenizers and gigatoken, the seconds of their training call
alone, measured in the process: Python's start and imports left out; for
tokshard the whole command, its output files written). tokshard runs with
OMP_WAIT_POLICY=PASSIVE (as ctest runs the tests): on a machine whose cores
other jobs share, spinning threads burn CPU at every barrier. "= HF"
compares the merges, in order, with tokenizers' at 1 thread of
the same row (as bytes). Targets are reported, never asserted.
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

from bpe_peers import LLAMA3, byte_unicode, tree_utf8  # bench/, this script's directory

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--bin", default="build-release/bin")
p.add_argument("--linux-jsonl", default=None)
p.add_argument("--linux", default=None, help="an unpacked linux-source tree to write the linux text from")
p.add_argument("--slice-mb", type=float, default=None)
p.add_argument("--texts", default="linux,main")
p.add_argument("--vocabs", default="32000,128000")
p.add_argument("--patterns", default="llama3,gpt2")
p.add_argument("--threads", default="1,2")
p.add_argument("--peer-threads", default=None, help="thread counts of tokenizers and gigatoken (default: --threads)")
p.add_argument("--tools", default="tokshard,tokenizers,gigatoken")
p.add_argument("--work", default="/tmp/tokshard-bench-bpe-train")
p.add_argument("--out", default=None, help="also write the table here (markdown)")
p.add_argument("--run", nargs="+", help=argparse.SUPPRESS)  # child: TOOL JSONL VOCAB PATTERN MERGES_OUT
a = p.parse_args()


def json_merges(path):
    back = {c: b for b, c in byte_unicode().items()}
    m = json.load(open(path, encoding="utf-8"))["model"]["merges"]
    m = [x if isinstance(x, list) else x.split(" ", 1) for x in m]
    return [[bytes(back[c] for c in x).hex() for x in pair] for pair in m]


def child(tool, jsonl, vocab, pattern, out):
    """One training run in this process; the merges (hex bytes) to `out`, and
    the CPU and wall seconds of the training call alone (the documents read
    included, the interpreter's start and imports not) to out.time."""
    import resource
    vocab = int(vocab)
    if tool == "tokenizers":
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    else:
        import gigatoken
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if tool == "tokenizers":
        tok = Tokenizer(models.BPE())
        if pattern == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tr = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
        tok.train_from_iterator((json.loads(l)["text"] for l in open(jsonl, encoding="utf-8")), trainer=tr)
    else:
        _, m = gigatoken.train_bpe(gigatoken.JsonlFileSource([jsonl]), vocab, [], tie_breaking="huggingface")
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if tool == "tokenizers":
        tok.save(out + ".json")
        merges = json_merges(out + ".json")
    else:
        merges = [[x.hex(), y.hex()] for x, y in m]
    json.dump(merges, open(out, "w"))
    json.dump({"cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "wall": t1 - t0}, open(out + ".time", "w"))


if a.run:
    child(*a.run)
    sys.exit(0)


def make_linux(work):
    src = a.linux_jsonl
    if not src:
        if not a.linux:
            sys.exit("the linux text needs --linux-jsonl PATH or --linux SRC (an unpacked linux-source-6.1)")
        src = os.path.join(work, "linux-all.jsonl")
        if not os.path.exists(src):
            write_tree(a.linux, src)
    if not a.slice_mb:
        return src
    cut = os.path.join(work, f"linux-all-{a.slice_mb:g}mb.jsonl")
    if not os.path.exists(cut):
        n = 0
        with open(src, encoding="ascii") as f, open(cut + ".tmp", "w", encoding="ascii") as out:
            for line in f:
                out.write(line)
                n += len(line)
                if n >= a.slice_mb * 1e6:
                    break
        os.replace(cut + ".tmp", cut)
    return cut


def write_tree(root, path, exts=None):
    """Every regular UTF-8 file under root (with exts: of those endings),
    one JSON Lines record a file."""
    with open(path + ".tmp", "w", encoding="ascii") as out:
        for text in tree_utf8(root, exts):
            if text is not None:
                out.write(json.dumps({"text": text}) + "\n")
    os.replace(path + ".tmp", path)


def make_docs(work):
    if not a.linux:
        sys.exit("the docs text needs --linux SRC (an unpacked linux-source-6.1)")
    path = os.path.join(work, "linux-docs.jsonl")
    if not os.path.exists(path):
        write_tree(os.path.join(a.linux, "Documentation"), path, (".rst", ".txt"))
    return path


def make_main(work):
    path = os.path.join(work, "main.jsonl")
    if not os.path.exists(path):
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            text = gzip.open("/usr/share/dictd/gcide.dict.dz").read().decode("utf-8", errors="replace")
            for para in text.split("\n\n"):
                if para.strip():
                    out.write(json.dumps({"text": para}) + "\n")
            for f in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True)):
                t = open(f, "rb").read().decode("utf-8", errors="replace")
                if t:
                    out.write(json.dumps({"text": t}) + "\n")
        os.replace(path + ".tmp", path)
    return path


def measure(cmd, env=None):
    """(cpu seconds, wall seconds, peak RSS MB, exit code) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        print(f"  {' '.join(cmd[:4])} ... failed ({rc}): {err[-400:]}", file=sys.stderr)
    return ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024, rc


def run_row(tool, jsonl, vocab, pattern, threads, work):
    out = os.path.join(work, f"out-{tool}-{os.path.basename(jsonl)}-{vocab}-{pattern}-{threads}")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    if tool == "tokshard":
        cmd = [os.path.join(a.bin, "tokshard"), "train-tokenizer", "--model-type", "byte-bpe", "-q", "--vocab-size",
               str(vocab), "--pattern", pattern, "--threads", str(threads), "--output", out, jsonl]
        r = measure(cmd, env)
        merges = json_merges(os.path.join(out, "tokenizer.json")) if not r[3] else None
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--run", tool, jsonl, str(vocab), pattern, out + ".merges"]
        r = measure(cmd, env)
        merges = json.load(open(out + ".merges")) if not r[3] else None
        if not r[3]:  # the training call's own seconds; the process's peak RSS
            tm = json.load(open(out + ".merges.time"))
            r = (tm["cpu"], tm["wall"], r[2], r[3])
    shutil.rmtree(out, ignore_errors=True)
    return r, merges


def main():
    os.makedirs(a.work, exist_ok=True)
    texts = {}
    for t in a.texts.split(","):
        texts[t] = make_linux(a.work) if t == "linux" else make_docs(a.work) if t == "docs" else make_main(a.work)
    rows, results = [], {}
    for tname, jsonl in texts.items():
        mb = os.path.getsize(jsonl) / 1e6
        for vocab in map(int, a.vocabs.split(",")):
            for pattern in a.patterns.split(","):
                ref = None
                for tool in ("tokenizers", "tokshard", "gigatoken"):
                    if tool not in a.tools.split(",") or (tool == "gigatoken" and pattern != "gpt2"):
                        continue
                    ths = a.threads if tool == "tokshard" or not a.peer_threads else a.peer_threads
                    for th in map(int, ths.split(",")):
                        (cpu, wall, rss, rc), merges = run_row(tool, jsonl, vocab, pattern, th, a.work)
                        if tool == "tokenizers" and th == 1:
                            ref = merges
                        same = "-" if ref is None or merges is None else ("yes" if merges == ref else "NO")
                        results[(tname, vocab, pattern, tool, th)] = (cpu, wall, rss)
                        row = (f"| {tname} ({mb:.0f} MB) | {vocab} | {pattern} | {tool} | {th} | "
                               f"{cpu:.1f} | {wall:.1f} | {rss:.0f} | {same if not rc else 'failed'} |")
                        rows.append(row)
                        print(row, flush=True)
    head = ["| text | vocab | pattern | tool | threads | CPU s | wall s | peak RSS MB | merges = HF |",
            "|---|---|---|---|---|---|---|---|---|"]
    notes = targets(results)
    table = "\n".join(head + rows + [""] + notes)
    print("\n" + table)
    if a.out:
        open(a.out, "w").write(table + "\n")


def targets(r):
    """The targets, met or not, per row where both sides ran."""
    out = []
    for (t, v, pat, tool, th), (cpu, wall, rss) in sorted(r.items()):
        if tool != "tokshard":
            continue
        if th == 1:
            for peer, want in (("gigatoken", 1.0), ("tokenizers", 5.0)):
                o = r.get((t, v, pat, peer, 1))
                if o:
                    x = o[0] / cpu
                    out.append(f"- {t} {v} {pat}: {x:.1f}x {peer} per CPU-second at 1 thread "
                               f"(target {want:g}x{', stretch 2x' if peer == 'gigatoken' else ''}): "
                               f"{'met' if x >= want else 'not met'}")
        if th == 2 and (t, v, pat, tool, 1) in r:
            x = r[(t, v, pat, tool, 1)][1] / wall
            out.append(f"- {t} {v} {pat}: 2 threads {x:.2f}x 1 thread in wall time (target 1.8x): "
                       f"{'met' if x >= 1.8 else 'not met'}")
        if t == "linux" and v == 128000 and not a.slice_mb:
            out.append(f"- linux {v} {pat} {th} thread(s): peak RSS {rss:.0f} MB (target under 1,000 MB): "
                       f"{'met' if rss < 1000 else 'not met'}")
    return out


main()

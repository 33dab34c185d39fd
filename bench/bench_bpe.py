#!/usr/bin/env python3
"""bench_bpe.py - tokshard build with byte-level BPE tokenizers against the
peers, in the same run on the same text: Hugging Face tokenizers, tiktoken,
fastokens and bpe-openai (whichever are installed; bench/bench_bpe.sh makes
.venv-bench with the pinned versions).

Usage: .venv-bench/bin/python bench/bench_bpe.py --bin build-release/bin
           [--mb 40] [--multi-mb 10] [--vocab 32000] [--work DIR] [--memory]

Texts (real, from Debian packages), each written once as JSON Lines:
  english  paragraphs of GCIDE (dict-gcide) and the Python docs' reST sources
           (python3.11-doc), --mb MB
  multi    manual pages in 12 languages (manpages-*), one document a page,
           and Python's own sources, --multi-mb MB
Tokenizers:
  gpt2-style, llama3-style  tokenizer.json files trained here with
           tokenizers on the English text (--vocab ids; GPT-2's ByteLevel
           regex; Llama 3's Split regex then ByteLevel, ignore_merges)
  cl100k, o200k  OpenAI's ranks files as the bpe-openai wheel carries them,
           with tiktoken's patterns
For each: `tokshard build` (the whole build: reading, encoding, checksummed
shards) with --threads 1 and 2, MB of text per second of wall time; each peer
on one thread (RAYON_NUM_THREADS=1), MB/s of its encode call over all
documents (documents already in memory); and whether each peer's ids equal
tokshard's on every document. tokenizer.json peers: tokenizers
(encode_batch, special tokens as text) and fastokens (encode_batch_flat,
split_special_tokens); ranks peers: tiktoken (encode_ordinary per document),
fastokens (from_tiktoken) and bpe-openai (its own cl100k_base/o200k_base).
--memory: also a 40 MB document of base64 and a 40 MB single word through
tokshard build (peak RSS, time) and through tiktoken and tokenizers on 1, 2
and 4 MB of the single word (their growth).
Prints a markdown table and writes WORK/bench-bpe.json.
"""
import argparse, base64, glob, gzip, json, os, random, re, resource, subprocess, sys, time

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mb", type=float, default=40)
p.add_argument("--multi-mb", type=float, default=10)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--work", default="/tmp/tks-bench-bpe")
p.add_argument("--memory", action="store_true")
a = p.parse_args()
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.makedirs(a.work, exist_ok=True)
TKS = os.path.join(a.bin, "tokshard")


def peer(name):
    try:
        return __import__(name)
    except ImportError:
        return None


tokenizers, tiktoken, fastokens, bpe_openai = (peer(n) for n in ("tokenizers", "tiktoken", "fastokens", "bpe_openai"))
versions = {}
for n in ("tokenizers", "tiktoken", "fastokens", "bpe-openai"):
    try:
        import importlib.metadata as md
        versions[n] = md.version(n)
    except Exception:
        versions[n] = None
print("peers:", ", ".join(f"{k} {v or 'absent'}" for k, v in versions.items()))


def write_jsonl(name, docs):
    path = os.path.join(a.work, name + ".jsonl")
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return path


def english(limit):
    docs, size = [], 0
    src = [gzip.open("/usr/share/dictd/gcide.dict.dz", "rt", errors="replace").read()]
    for root, _, files in sorted(os.walk("/usr/share/doc/python3.11/html/_sources")):
        src += [open(os.path.join(root, f), errors="replace").read() for f in sorted(files) if f.endswith(".txt")]
    for t in src:
        for para in re.split(r"\n\s*\n", t):
            if para.strip() and "\0" not in para:
                docs.append(para)
                size += len(para.encode())
                if size >= limit:
                    return docs
    return docs


def multilingual(limit):
    langs = ("ja", "zh_CN", "ko", "ru", "de", "fr", "es", "it", "pl", "pt_BR", "cs", "tr")
    pages = {l: sorted(glob.glob(f"/usr/share/man/{l}/man*/*.gz")) for l in langs}
    pages["py"] = sorted(glob.glob("/usr/lib/python3.11/**/*.py", recursive=True))
    docs, size, i = [], 0, 0
    while size < limit and any(i < len(v) for v in pages.values()):
        for l, v in pages.items():
            if i < len(v):
                op = gzip.open if v[i].endswith(".gz") else open
                with op(v[i], "rb") as f:
                    t = f.read().decode("utf-8", errors="replace")
                if t.strip() and "\0" not in t:
                    docs.append(t)
                    size += len(t.encode())
        i += 1
    return docs


texts = {"english": english(a.mb * 1e6), "multi": multilingual(a.multi_mb * 1e6)}
paths = {k: write_jsonl(k, v) for k, v in texts.items()}
mbs = {k: sum(len(d.encode()) for d in v) / 1e6 for k, v in texts.items()}
for k in texts:
    print(f"text {k}: {len(texts[k])} documents, {mbs[k]:.1f} MB")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(kind):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    if kind == "gpt2-style":
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        t = Tokenizer(models.BPE(ignore_merges=True))
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(texts["english"][:20000], tr)
    d = os.path.join(a.work, kind)
    os.makedirs(d, exist_ok=True)
    t.save(os.path.join(d, "tokenizer.json"))
    return os.path.join(d, "tokenizer.json")


def ranks_file(stem):
    import importlib.resources
    data = gzip.open(importlib.resources.files("bpe_openai.data") / (stem + "_base.tiktoken.gz")).read()
    path = os.path.join(a.work, stem + ".tiktoken")
    open(path, "wb").write(data)
    return path


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tokshard_build(tok_args, text, threads):
    """(wall s, CPU s, ids per document) of a whole tokshard build."""
    out = os.path.join(a.work, "data")
    subprocess.run(["rm", "-rf", out], check=True)
    c0, t0 = cpu_children(), time.perf_counter()
    r = subprocess.run([TKS, "build", *tok_args, "--output", out, "--format", "jsonl", "--threads", str(threads),
                        "--quiet", paths[text]], capture_output=True, text=True)
    dt, dc = time.perf_counter() - t0, cpu_children() - c0
    if r.returncode:
        sys.exit("tokshard build failed: " + r.stderr)
    ids = subprocess.run([TKS, "cat", out, "--ids"], capture_output=True, text=True, check=True).stdout.splitlines()
    return dt, dc, ids


def timed(fn):
    """(wall s, CPU s of this process, ids per document as text)"""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, [" ".join(map(str, e)) for e in out]


def flat(ids_offsets):
    import numpy as np
    ids, off = ids_offsets
    ids, off = np.frombuffer(ids, np.uint32), np.frombuffer(off, np.uint64)
    return [ids[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]


def peers_json(path, docs):
    out = {}
    if tokenizers:
        t = tokenizers.Tokenizer.from_file(path)
        t.encode_special_tokens = True
        out["tokenizers"] = timed(lambda: [e.ids for e in t.encode_batch(docs, add_special_tokens=False)])
    if fastokens:
        f = fastokens.Tokenizer.from_file(path)
        c0, t0 = time.process_time(), time.perf_counter()
        r = f.encode_batch_flat(docs, add_special_tokens=False, split_special_tokens=True)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        out["fastokens"] = (dt, dc, [" ".join(map(str, e)) for e in flat(r)])
    return out


def tt_encoding(stem, path):
    """tiktoken's own definition of cl100k_base/o200k_base over the local ranks file."""
    import tiktoken.load as tload
    import tiktoken_ext.openai_public as op
    op.load_tiktoken_bpe = lambda url, expected_hash=None: tload.load_tiktoken_bpe(path, expected_hash)
    return tiktoken.Encoding(**getattr(op, stem + "_base")())


def peers_ranks(stem, path, docs):
    out = {}
    name = stem + "_base"
    if tiktoken:
        enc = tt_encoding(stem, path)
        out["tiktoken"] = timed(lambda: [enc.encode_ordinary(d) for d in docs])
    if fastokens:
        f = fastokens.Tokenizer.from_tiktoken(path, encoding=name)
        c0, t0 = time.process_time(), time.perf_counter()
        r = f.encode_batch_flat(docs, add_special_tokens=False, split_special_tokens=True)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        out["fastokens"] = (dt, dc, [" ".join(map(str, e)) for e in flat(r)])
    if bpe_openai:
        enc = bpe_openai.get_encoding(name)
        out["bpe-openai"] = timed(lambda: [enc.encode_ordinary(d) for d in docs])
    return out


rows = []
tokenizers_ = []
if tokenizers:
    tokenizers_ += [(k, ["--tokenizer", train(k)], "json") for k in ("gpt2-style", "llama3-style")]
if bpe_openai:
    tokenizers_ += [(s, ["--tokenizer", ranks_file(s), "--pattern", s], "ranks") for s in ("cl100k", "o200k")]
for name, targs, kind in tokenizers_:
    for text in ("english", "multi"):
        docs, mb = texts[text], mbs[text]
        t1, c1, ids = tokshard_build(targs, text, 1)
        t2, c2, _ = tokshard_build(targs, text, 2)
        ps = peers_json(targs[1], docs) if kind == "json" else peers_ranks(name, targs[1], docs)
        row = {"tokenizer": name, "text": text, "mb": round(mb, 2), "tokshard_1t": round(mb / t1, 2),
               "tokshard_2t": round(mb / t2, 2), "tokshard_1t_cpu": round(mb / c1, 2),
               "tokshard_2t_cpu": round(mb / c2, 2), "load": os.getloadavg()[0], "peers": {}}
        for pn, (dt, dc, pids) in ps.items():
            row["peers"][pn] = {"mb_s": round(mb / dt, 2), "mb_cpu_s": round(mb / dc, 2), "identical": pids == ids,
                                "differing_docs": sum(x != y for x, y in zip(pids, ids)) + abs(len(pids) - len(ids))}
        rows.append(row)
        print(json.dumps(row))

print("\nMB/s of wall time (MB per CPU-second in brackets; the build's CPU counts every thread)")
print("\n| tokenizer | text | MB | tokshard build 1 thread | tokshard build 2 threads | peers, 1 thread (ids identical?) |")
print("|---|---|---:|---:|---:|---|")
for r in rows:
    ps = "; ".join(f"{k} {v['mb_s']:.2f} ({v['mb_cpu_s']:.2f}) "
                   f"({'yes' if v['identical'] else 'no: %d docs differ' % v['differing_docs']})"
                   for k, v in r["peers"].items())
    best = max([v["mb_s"] for v in r["peers"].values() if v["identical"]] or [0])
    ratio = f" = {r['tokshard_2t'] / best:.2f}x the fastest exact peer" if best else ""
    print(f"| {r['tokenizer']} | {r['text']} | {r['mb']} | {r['tokshard_1t']:.2f} ({r['tokshard_1t_cpu']:.2f}) | "
          f"{r['tokshard_2t']:.2f} ({r['tokshard_2t_cpu']:.2f}){ratio} | {ps} |")


def memory():
    """tokshard build on 40 MB without whitespace; peers on a growing single word."""
    random.seed(1)
    res = {}
    docs = {"base64": base64.b64encode(random.randbytes(30_000_000)).decode(),
            "word": "".join(random.choice("etaoinshrdlucmfwypvbgkqjxz") for _ in range(40_000_000))}
    tok = [t for t in tokenizers_ if t[0] == "llama3-style"] or tokenizers_[:1]
    for k, d in docs.items():
        path = write_jsonl("mem-" + k, [d])
        out = os.path.join(a.work, "mem-data")
        subprocess.run(["rm", "-rf", out], check=True)
        r = subprocess.run(["/usr/bin/time", "-f", "%e %M", TKS, "build", *tok[0][1], "--output", out, "--threads", "1",
                            "--quiet", "--max-doc-bytes", "64M", path], capture_output=True, text=True)
        wall, rss = r.stderr.strip().split("\n")[-1].split()
        res["tokshard_" + k] = {"mb": len(d) / 1e6, "seconds": float(wall), "max_rss_mb": int(rss) / 1024}
        print(f"tokshard build, 40 MB {k} ({tok[0][0]}): {float(wall):.1f} s, peak RSS {int(rss) / 1024:.0f} MB "
              f"({int(rss) * 1024 / len(d):.1f}x the document)")
    for n in (1, 2, 4):
        w = docs["word"][:n * 1_000_000]
        cl = [t for t in tokenizers_ if t[0] == "cl100k"]
        if tiktoken and cl:
            enc = tt_encoding("cl100k", cl[0][1][1])
            t0 = time.perf_counter()
            enc.encode_ordinary(w)
            res[f"tiktoken_{n}mb"] = time.perf_counter() - t0
            print(f"tiktoken cl100k, a {n} MB single word: {res[f'tiktoken_{n}mb']:.2f} s")
        if tokenizers:
            t = tokenizers.Tokenizer.from_file(tok[0][1][1])
            t0 = time.perf_counter()
            t.encode(w, add_special_tokens=False)
            res[f"tokenizers_{n}mb"] = time.perf_counter() - t0
            print(f"tokenizers {tok[0][0]}, a {n} MB single word: {res[f'tokenizers_{n}mb']:.2f} s")
    return res


mem = memory() if a.memory else None
json.dump({"versions": versions, "texts": {k: {"docs": len(v), "mb": mbs[k]} for k, v in texts.items()},
           "rows": rows, "memory": mem}, open(os.path.join(a.work, "bench-bpe.json"), "w"), indent=1)

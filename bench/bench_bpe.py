#!/usr/bin/env python3
"""bench_bpe.py - tokshard build with byte-level BPE tokenizers against the
peers, in the same run on the same text: Hugging Face tokenizers, tiktoken,
fastokens, gigatoken and bpe-openai (whichever are installed;
bench/bench_bpe.sh makes .venv-bench with the pinned versions).

Usage: .venv-bench/bin/python bench/bench_bpe.py --bin build-release/bin
           [--mb 40] [--multi-mb 10] [--vocab 32000] [--reps 3] [--work DIR] [--memory]
           [--linux SRC] [--texts LIST] [--tokenizer-json NAME=PATH] [--only LIST] [--no-slow]

Texts (real, from Debian packages), each written once as JSON Lines:
  english  paragraphs of GCIDE (dict-gcide) and the Python docs' reST sources
           (python3.11-doc), --mb MB
  multi    manual pages in 12 languages (manpages-*), one document a page,
           and Python's own sources, --multi-mb MB
  linux-docs, linux-net  with --linux SRC (an unpacked linux-source tree):
           Documentation/'s .rst and .txt files, drivers/net/'s .c and .h
           files, one document a file, whole
--texts picks the texts of the table (default: all of the above);
--tokenizer-json NAME=PATH adds a tokenizer.json, --only keeps the named
tokenizers, --no-slow leaves out tokenizers, tiktoken and bpe-openai.
Tokenizers:
  gpt2-style, llama3-style  tokenizer.json files trained here with
           tokenizers on the English text (--vocab ids; GPT-2's ByteLevel
           regex; Llama 3's Split regex then ByteLevel, ignore_merges)
  cl100k, o200k  OpenAI's ranks files as the bpe-openai wheel carries them,
           with tiktoken's patterns
Every contender runs in a fresh process per repetition (the median of
--reps is reported; the slow peers, tokenizers, tiktoken and bpe-openai,
run once). tokshard: the whole build (reading, decoding JSONL, encoding,
checksummed shards) with --threads 1 and 2, MB of text per second of wall
time and per CPU-second (every thread's), and the tokenizer load apart (a
build of a one-line file). Peers (bench/bpe_contender.py): the load apart,
then their encode call over all documents already in memory, on one
core (RAYON_NUM_THREADS=1 and taskset -c 0), MB per wall second and per
CPU-second; and
how many documents' ids differ from tokshard's. tokenizer.json peers:
tokenizers (encode_batch, special tokens as text), fastokens
(encode_batch_flat, split_special_tokens), gigatoken (encode_batch_list);
ranks peers: tiktoken (encode_ordinary per document), fastokens
(from_tiktoken), gigatoken (from_tiktoken, no special tokens) and
bpe-openai (its own cl100k_base/o200k_base). The last column states the
targets of docs/BENCHMARKS.md: tokshard's 1-thread build per CPU-second
against the fastest exact peer's encode per CPU-second (1x), and its
2-thread build per wall second against twice that peer's one-core rate.
--memory: also a 40 MB document of base64 and a 40 MB single word through
tokshard build (peak RSS, time) and through tiktoken and tokenizers on 1, 2
and 4 MB of the single word (their growth).
Prints a markdown table and writes WORK/bench-bpe.json.
"""
import argparse, base64, glob, gzip, json, os, random, re, resource, subprocess, sys, time

from bpe_peers import tt_encoding  # bench/, this script's directory

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mb", type=float, default=40)
p.add_argument("--multi-mb", type=float, default=10)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--work", default="/tmp/tks-bench-bpe")
p.add_argument("--memory", action="store_true")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--long", action="store_true",
               help="only the long-document rows: one 40 MB document, 1 and 2 threads, and the tokenizer cache")
p.add_argument("--linux", default=None,
               help="an unpacked linux-source tree: adds the texts linux-docs (Documentation/, its .rst and .txt "
                    "files) and linux-net (drivers/net/, its .c and .h files), one document per file")
p.add_argument("--texts", default=None, help="only these texts in the main table (comma-separated)")
p.add_argument("--tokenizer-json", action="append", default=[], metavar="NAME=PATH",
               help="another tokenizer.json for the main table")
p.add_argument("--only", default=None, help="only these tokenizers in the main table (comma-separated names)")
p.add_argument("--no-slow", action="store_true", help="leave out tokenizers, tiktoken and bpe-openai (minutes each on "
               "large texts)")
p.add_argument("--load-tokenizer", action="append", default=[],
               help="with --long: another tokenizer.json whose load (parsed, then cached) is timed")
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
for n in ("tokenizers", "tiktoken", "fastokens", "gigatoken", "bpe-openai"):
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


def tree(root, exts):
    docs = []
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(exts) and os.path.isfile(os.path.join(d, f)):
                t = open(os.path.join(d, f), "rb").read().decode("utf-8", errors="replace")
                if t.strip() and "\0" not in t:
                    docs.append(t)
    return docs


want_texts = a.texts.split(",") if a.texts else ["english", "multi"] + (["linux-docs", "linux-net"] if a.linux else [])
texts = {}
texts["english"] = english(a.mb * 1e6)  # the tokenizers are trained on it
if "multi" in want_texts:
    texts["multi"] = multilingual(a.multi_mb * 1e6)
if a.linux and "linux-docs" in want_texts:
    texts["linux-docs"] = tree(os.path.join(a.linux, "Documentation"), (".rst", ".txt"))
if a.linux and "linux-net" in want_texts:
    texts["linux-net"] = tree(os.path.join(a.linux, "drivers", "net"), (".c", ".h"))
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


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def tokshard_build(tok_args, path, threads, ids=False):
    """(wall s, CPU s, ids per document or None) of a whole tokshard build in a fresh process."""
    out = os.path.join(a.work, "data")
    subprocess.run(["rm", "-rf", out], check=True)
    c0, t0 = cpu_children(), time.perf_counter()
    r = subprocess.run([TKS, "build", *tok_args, "--output", out, "--format", "jsonl", "--threads", str(threads),
                        "--quiet", path], capture_output=True, text=True)
    dt, dc = time.perf_counter() - t0, cpu_children() - c0
    if r.returncode:
        sys.exit("tokshard build failed: " + r.stderr)
    got = None
    if ids:
        got = subprocess.run([TKS, "cat", out, "--ids"], capture_output=True, text=True, check=True).stdout.splitlines()
    return dt, dc, got


HERE = os.path.dirname(os.path.abspath(__file__))
SLOW = {"tokenizers", "tiktoken", "bpe-openai"}  # one repetition: minutes each


def contender(peer, tok_path, stem, text):
    """The peer in a fresh process per repetition: median figures, and its ids."""
    runs = []
    ids_path = os.path.join(a.work, f"ids-{peer}")
    for _ in range(1 if peer in SLOW else a.reps):
        # one core: taskset keeps a peer that starts threads of its own anyway (fastokens
        # does, whatever RAYON_NUM_THREADS says) from using the second one
        cmd = ["taskset", "-c", "0", sys.executable, os.path.join(HERE, "bpe_contender.py"), peer, tok_path,
               paths[text], ids_path]
        if stem:
            cmd += ["--ranks", stem]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(f"  {peer}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            return None
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    res = {k: median([x[k] for x in runs]) for k in ("load_s", "load_cpu_s", "encode_s", "encode_cpu_s")}
    res["version"] = runs[0]["version"]
    res["ids"] = open(ids_path).read().splitlines()
    return res


ONE = write_jsonl("one-line", ["hello world"])
rows = []
tokenizers_ = []
if tokenizers:
    tokenizers_ += [(k, ["--tokenizer", train(k)], None) for k in ("gpt2-style", "llama3-style")]
if bpe_openai:
    tokenizers_ += [(s, ["--tokenizer", ranks_file(s), "--pattern", s], s) for s in ("cl100k", "o200k")]
tokenizers_ += [(x.split("=", 1)[0], ["--tokenizer", x.split("=", 1)[1]], None) for x in a.tokenizer_json]
if a.only:
    tokenizers_ = [t for t in tokenizers_ if t[0] in a.only.split(",")]
def long_docs():
    """One 40 MB document (a text without newlines; a base64 blob of gzip data), whole builds at 1 and 2
    threads, fresh processes, median of reps; then each tokenizer.json's load, parsed and cached."""
    import hashlib
    eng = " ".join(d.replace("\n", " ") for d in texts["english"]).encode()
    blob = b""
    while len(blob) < 40_000_000:
        blob += base64.b64encode(gzip.compress(eng[:30_000_000], 6))
    docs = {"novel": eng[:40_000_000].decode("utf-8", "ignore"), "base64": blob[:40_000_000].decode()}
    spm = os.path.join(a.work, "spm")
    if not os.path.exists(spm + ".model"):
        src = os.path.join(a.work, "spm-train.txt")
        open(src, "w").write("\n".join(texts["english"][:60000]))
        subprocess.run([TKS, "train-tokenizer", "--output", spm, "--model-type", "bpe", "--vocab-size", "8000",
                        src], check=True, capture_output=True)
    toks = [(n, t) for n, t, _ in tokenizers_] + [("sentencepiece-bpe-8k", ["--tokenizer", spm + ".model"])]
    res = []
    for dn, d in docs.items():
        path = os.path.join(a.work, "long-" + dn + ".txt")
        open(path, "w").write(d)
        mb = len(d.encode()) / 1e6
        for tn, targs in toks:
            r = {"doc": dn, "tokenizer": tn, "mb": round(mb, 1)}
            for th in (1, 2):
                walls, cpus, digest, parts = [], [], None, ""
                for i in range(a.reps):
                    out = os.path.join(a.work, "long-data")
                    subprocess.run(["rm", "-rf", out], check=True)
                    c0, t0 = cpu_children(), time.perf_counter()
                    b = subprocess.run([TKS, "build", *targs, "--output", out, "--threads", str(th), path],
                                       capture_output=True, text=True)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(cpu_children() - c0)
                    if b.returncode:
                        sys.exit("tokshard build failed: " + b.stderr)
                    m = re.search(r"long docs +(\d+) documents cut into (\d+) parts", b.stdout)
                    parts = m.group(2) if m else "0"
                    if i == 0:
                        ids = subprocess.run([TKS, "cat", out, "--ids"], capture_output=True, check=True).stdout
                        digest = hashlib.sha1(ids).hexdigest()
                r[f"t{th}_s"] = round(median(walls), 3)
                r[f"t{th}_cpu_s"] = round(median(cpus), 3)
                r[f"t{th}_parts"] = int(parts)
                r[f"t{th}_ids_sha1"] = digest
            r["ratio"] = round(r["t2_s"] / r["t1_s"], 3)
            r["same_ids"] = r["t1_ids_sha1"] == r["t2_ids_sha1"]
            r["load"] = os.getloadavg()[0]
            res.append(r)
            print(json.dumps(r), flush=True)
    print("\n| document | tokenizer | 1 thread s | 2 threads s | 2 threads / 1 | parts | ids equal |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in res:
        print(f"| {r['doc']} {r['mb']} MB | {r['tokenizer']} | {r['t1_s']:.2f} | {r['t2_s']:.2f} | "
              f"**{r['ratio']:.2f}** | {r['t2_parts']} | {'yes' if r['same_ids'] else 'NO'} |")
    # the tokenizer cache: a fresh cache directory, the first load parses (and writes the cache), later ones map it
    cache = os.path.join(a.work, "tkc")
    loads = []
    cpu_bin = os.path.join(a.bin, "tokshard-bpe-cpu")
    for tn, path, st in [(n, t[1], st) for n, t, st in tokenizers_] + [(os.path.basename(x), x, None) for x in a.load_tokenizer]:
        def load_ms(cache_dir):  # the first load of a fresh process
            r = subprocess.run([cpu_bin, path, *(["--pattern", st] if st else []), "--load-only"],
                               env=dict(os.environ, TOKSHARD_CACHE_DIR=cache_dir),
                               capture_output=True, text=True, check=True)
            return float(r.stdout.split()[1])
        subprocess.run(["rm", "-rf", cache], check=True)
        first = load_ms(cache)
        again = [load_ms(cache) for _ in range(a.reps)]
        row = {"tokenizer": tn, "bytes": os.path.getsize(path), "parsed_ms": load_ms("off"), "parse_and_store_ms": first,
               "cached_ms": median(again),
               "cache_bytes": sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))}
        loads.append(row)
        print(json.dumps(row), flush=True)
    print("\n| tokenizer | size | parsed | parsed and cached | from the cache | cache file |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in loads:
        print(f"| {r['tokenizer']} | {r['bytes'] / 1e6:.1f} MB | {r['parsed_ms']:.0f} ms | {r['parse_and_store_ms']:.0f} ms"
              f" | **{r['cached_ms']:.1f} ms** | {r['cache_bytes'] / 1e6:.1f} MB |")
    json.dump({"long": res, "loads": loads}, open(os.path.join(a.work, "bench-long.json"), "w"), indent=1)


for name, targs, stem in ([] if a.long else tokenizers_):
    peers = ["tiktoken", "fastokens", "gigatoken", "bpe-openai"] if stem else ["tokenizers", "fastokens", "gigatoken"]
    peers = [x for x in peers if versions.get(x) and not (a.no_slow and x in SLOW)]
    load = [tokshard_build(targs, ONE, 1) for _ in range(a.reps)]
    for text in [t for t in want_texts if t in texts]:
        mb = mbs[text]
        b1 = [tokshard_build(targs, paths[text], 1, ids=(i == 0)) for i in range(a.reps)]
        b2 = [tokshard_build(targs, paths[text], 2) for _ in range(a.reps)]
        ids = b1[0][2]
        row = {"tokenizer": name, "text": text, "mb": round(mb, 2), "load_s": round(median([x[0] for x in load]), 4),
               "load_cpu_s": round(median([x[1] for x in load]), 4),
               "tokshard_1t": round(mb / median([x[0] for x in b1]), 2),
               "tokshard_1t_cpu": round(mb / median([x[1] for x in b1]), 2),
               "tokshard_2t": round(mb / median([x[0] for x in b2]), 2),
               "tokshard_2t_cpu": round(mb / median([x[1] for x in b2]), 2),
               "load": os.getloadavg()[0], "peers": {}}
        for pn in peers:
            r = contender(pn, targs[1], stem, text)
            if not r:
                continue
            row["peers"][pn] = {"load_s": round(r["load_s"], 4), "mb_s": round(mb / r["encode_s"], 2),
                                "mb_cpu_s": round(mb / r["encode_cpu_s"], 2),
                                "differing_docs": sum(x != y for x, y in zip(r["ids"], ids)) + abs(len(r["ids"]) - len(ids))}
        rows.append(row)
        print(json.dumps(row), flush=True)

print("\nMB of text per second of wall time, MB per CPU-second in brackets (a build's CPU counts all its threads);")
print("tokshard: the whole build (load, read, decode JSONL, encode, checksum, write), a fresh process each, median of "
      f"{a.reps}; load: a build of a one-line file; peers: their encode call alone, one thread, a fresh process each "
      "(load apart), median of %d (tokenizers, tiktoken, bpe-openai: 1)." % a.reps)
print("\n| tokenizer | text | MB | tokshard load s | tokshard 1 thread | tokshard 2 threads | peers: load s, encode MB/s (MB/CPU-s), documents differing | targets |")
print("|---|---|---:|---:|---:|---:|---|---|")
for r in rows:
    ps = "; ".join(f"{k} {v['load_s']:.3f} s, {v['mb_s']:.2f} ({v['mb_cpu_s']:.2f}), {v['differing_docs']}"
                   for k, v in r["peers"].items())
    exact = [v for v in r["peers"].values() if v["differing_docs"] == 0]
    best_cpu = max([v["mb_cpu_s"] for v in exact] or [0])
    t1 = f"1t: {r['tokshard_1t_cpu'] / best_cpu:.2f}x" if best_cpu else "1t: -"
    t2 = f"2t: {r['tokshard_2t'] / (2 * best_cpu):.2f}x of 2x" if best_cpu else "2t: -"
    print(f"| {r['tokenizer']} | {r['text']} | {r['mb']} | {r['load_s']:.3f} | {r['tokshard_1t']:.2f} "
          f"({r['tokshard_1t_cpu']:.2f}) | {r['tokshard_2t']:.2f} ({r['tokshard_2t_cpu']:.2f}) | {ps} | {t1}; {t2} |")


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


if a.long:
    long_docs()
    sys.exit(0)
mem = memory() if a.memory else None
json.dump({"versions": versions, "texts": {k: {"docs": len(v), "mb": mbs[k]} for k, v in texts.items()},
           "rows": rows, "memory": mem}, open(os.path.join(a.work, "bench-bpe.json"), "w"), indent=1)

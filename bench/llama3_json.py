#!/usr/bin/env python3
"""llama3_json.py - Meta's Llama 3 tokenizer (a tiktoken ranks file of 128,000
byte sequences, shipped in the PyPI wheel llama-models 0.3.0 as
llama_models/llama3/tokenizer.model) as a Hugging Face tokenizer.json, checked
against tiktoken before it is written.

Usage: llama3_json.py OUT.json [--model tokenizer.model] [--linux SRC] [--check-mb 4] [--merges-only]

The tokenizer.json:
  model    BPE; vocab: each rank's bytes as GPT-2's byte-level unicode string
           (bytes_to_unicode), id = rank; merges: for each token, in rank
           order, every split into a left and a right part that are both
           tokens, ordered by (the token's rank, the left part's rank, the
           right part's rank). A merge's priority is then its token's rank,
           which is tiktoken's rule (merge the adjacent pair whose
           concatenation has the lowest rank), whichever split a word's BPE
           reaches. The Llama 3 file gives 280,147 merges (a single split per
           token, the one BPE of the token's own bytes over the lower ranks
           reaches, leaves 678 tokens that end in three parts or more).
           ignore_merges: true, as in Meta's own tokenizer.json: tiktoken
           takes a piece that is a token whole, and 588 tokens are not what
           BPE over their bytes gives (" jeho", "mektedir", ...).
           --merges-only writes ignore_merges: false instead: every piece
           goes through the merges (the rule of tokenizer.json files made
           before tokenizers had the flag, and the harder case for an
           encoder: a piece that is a token is that token only when its
           merges make it); its ids then differ from tiktoken's on those
           588 tokens, and the check reports how many documents differ
           instead of refusing.
  pre_tokenizer  Sequence[Split(Llama 3's pattern, isolated),
           ByteLevel(add_prefix_space false, use_regex false)]
  decoder  ByteLevel
  added_tokens   the 256 special tokens of llama_models/llama3/tokenizer.py
           (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, ...,
           <|reserved_special_token_247|> = 128255), special
No post-processor: encoding adds no BOS.

The check: Hugging Face tokenizers loading the written json against
tiktoken.Encoding over the same ranks and pattern (encode_ordinary), document
by document, on --check-mb MB of Linux's Documentation/ (with --linux) and
manual pages in 12 languages; any difference exits 1 and writes nothing.
When llama_models is importable, its Tokenizer's pattern and special tokens
are checked against the ones here too.
"""
import argparse
import base64
import glob
import gzip
import json
import os
import sys

from bpe_peers import LLAMA3, byte_unicode  # bench/, this script's directory

N_SPECIAL = 256


def special_tokens():
    """Llama 3's 256 special tokens, in id order (llama_models/llama3/tokenizer.py)."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    return named + [f"<|reserved_special_token_{2 + i}|>" for i in range(N_SPECIAL - len(named))]


def load_ranks(path):
    """{bytes: rank} of a tiktoken ranks file (base64 token, space, rank, a line each)."""
    ranks = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        sys.exit(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once: not a tiktoken ranks file")
    return ranks


def merges_of(ranks):
    """Every (left, right) split of every token with both parts tokens, by
    (token rank, left rank, right rank)."""
    out = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        splits = [(ranks[tok[:i]], ranks[tok[i:]], tok[:i], tok[i:]) for i in range(1, len(tok))
                  if tok[:i] in ranks and tok[i:] in ranks]
        out += [(l, r) for _, _, l, r in sorted(splits)]
    return out


def convert(ranks, ignore_merges=True):
    """The tokenizer.json as a dict."""
    bu = byte_unicode()
    s = lambda b: "".join(bu[x] for x in b)
    vocab = {s(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    if len(vocab) != len(ranks):
        sys.exit("two ranks map to the same byte-level string: bytes_to_unicode is not one-to-one here")
    merges = [[s(l), s(r)] for l, r in merges_of(ranks)]
    added = [{"id": len(ranks) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(special_tokens())]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": merges},
    }


def check_texts(linux, limit):
    """Documents for the check, about limit bytes: Linux's Documentation/ files
    (.rst, .txt) and manual pages in 12 languages, taken in turn."""
    srcs = []
    if linux:
        srcs.append(sorted(glob.glob(os.path.join(linux, "Documentation", "**", "*.rst"), recursive=True) +
                           glob.glob(os.path.join(linux, "Documentation", "**", "*.txt"), recursive=True)))
    for lang in ("ja", "zh_CN", "ko", "ru", "de", "fr", "es", "it", "pl", "pt_BR", "cs", "tr"):
        srcs.append(sorted(glob.glob(f"/usr/share/man/{lang}/man*/*.gz")))
    srcs.append(sorted(glob.glob("/usr/share/man/man*/*.gz")))
    docs, size, i = [], 0, 0
    while size < limit and any(i < len(s) for s in srcs):
        for s in srcs:
            if i < len(s) and size < limit:
                with (gzip.open if s[i].endswith(".gz") else open)(s[i], "rb") as f:
                    t = f.read().decode("utf-8", errors="replace")
                if t.strip():
                    docs.append(t)
                    size += len(t.encode())
        i += 1
    return docs, size


def check(json_text, ranks, docs):
    """Number of documents whose ids differ between tokenizers (the json) and
    tiktoken (the ranks, Llama 3's pattern); prints the first difference."""
    import tiktoken
    import tokenizers
    ref = tiktoken.Encoding(name="llama3", pat_str=LLAMA3, mergeable_ranks=ranks,
                            special_tokens={c: len(ranks) + i for i, c in enumerate(special_tokens())})
    hf = tokenizers.Tokenizer.from_str(json_text)
    hf.encode_special_tokens = True  # special tokens' text as text, as encode_ordinary does
    bad = 0
    for d, e in zip(docs, hf.encode_batch(docs, add_special_tokens=False)):
        want = ref.encode_ordinary(d)
        if e.ids != want:
            if not bad:
                i = next((k for k, (x, y) in enumerate(zip(e.ids, want)) if x != y), min(len(e.ids), len(want)))
                print(f"differs at token {i}: tokenizers {e.ids[i:i + 5]}, tiktoken {want[i:i + 5]} "
                      f"({ref.decode(want[max(0, i - 5):i + 5])!r})", file=sys.stderr)
            bad += 1
    return bad


def check_meta(model_path, ranks):
    """Meta's own definition (llama_models), when importable: same pattern, same specials."""
    try:
        from pathlib import Path
        from llama_models.llama3.tokenizer import Tokenizer
    except ImportError:
        return "llama_models not importable: pattern and special tokens not cross-checked"
    t = Tokenizer(Path(model_path))
    want = {c: len(ranks) + i for i, c in enumerate(special_tokens())}
    if t.pat_str != LLAMA3 or t.special_tokens != want or t.model.n_vocab != len(ranks) + N_SPECIAL:
        sys.exit("llama_models' Llama 3 tokenizer has another pattern or other special tokens than "
                 "bench/llama3_json.py: update the script")
    return "pattern and special tokens as llama_models' Tokenizer"


def default_model():
    import importlib.util
    spec = importlib.util.find_spec("llama_models")
    if not spec:
        sys.exit("no --model and llama_models is not installed: pip install --no-deps llama-models==0.3.0")
    return os.path.join(os.path.dirname(spec.origin), "llama3", "tokenizer.model")


def main():
    p = argparse.ArgumentParser(description="Llama 3's tiktoken model as a tokenizer.json, checked against tiktoken")
    p.add_argument("out")
    p.add_argument("--model", default=None, help="the tiktoken ranks file [llama_models/llama3/tokenizer.model]")
    p.add_argument("--linux", default=None, help="an unpacked linux-source tree: its Documentation/ joins the check")
    p.add_argument("--check-mb", type=float, default=4, help="MB of text the check encodes [4]")
    p.add_argument("--merges-only", action="store_true",
                   help="ignore_merges false: every piece through the merges (its ids differ from tiktoken's)")
    a = p.parse_args()
    model = a.model or default_model()
    ranks = load_ranks(model)
    print(f"{model}: {len(ranks)} ranks; {check_meta(model, ranks)}")
    tj = convert(ranks, ignore_merges=not a.merges_only)
    text = json.dumps(tj, ensure_ascii=False)
    print(f"vocab {len(tj['model']['vocab'])}, merges {len(tj['model']['merges'])}, "
          f"special tokens {len(tj['added_tokens'])}")
    docs, size = check_texts(a.linux, a.check_mb * 1e6)
    if not docs:
        sys.exit("no text for the check: give --linux SRC or install manual pages")
    bad = check(text, ranks, docs)
    if a.merges_only:
        print(f"check (ignore_merges false): {bad} of {len(docs)} documents encode otherwise than with tiktoken "
              "(the tokens BPE over their bytes does not give)")
    elif bad:
        sys.exit(f"{bad} of {len(docs)} documents encode differently with tokenizers and tiktoken: "
                 f"the conversion is wrong; {a.out} not written")
    else:
        print(f"check: {len(docs)} documents, {size / 1e6:.1f} MB, ids equal to tiktoken's in every one")
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

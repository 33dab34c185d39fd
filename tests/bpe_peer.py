"""The Hugging Face `tokenizers` side of the byte-level BPE test (test_bpe.sh).

Usage: bpe_peer.py WORKDIR
Trains small byte-level BPE tokenizers on real text from Debian packages
(python3.11-doc, dict-gcide) and writes, into WORKDIR:
  docs.bin            the held-out documents and the edge cases, each as an
                      8-byte little-endian length and the UTF-8 bytes
  NAME.json           each tokenizer
  NAME.ids            tokenizers' ids of every document, one line each
  NAME.dec            tokenizers' decode of those ids, in docs.bin's format
  NAME.special        "id content" of each special token
  peer-speed.txt      NAME MB/s of one thread of tokenizers on the real documents
  NAME.ids-allow      where the tokenizer has special tokens: the ids with them
                      matched in the text (tokenizers' default; tiktoken's
                      encode with allowed_special="all")
Special tokens are not matched in the text (encode_special_tokens = True),
and none is added (add_special_tokens=False); added tokens that are not
special are matched, as tokenizers always does.
tiktoken files (tiktoken 0.14 is their reference; tiktoken_ext's own
definitions of cl100k_base and o200k_base give the pattern and the special
tokens):
  cl100k.tiktoken, o200k.tiktoken   OpenAI's ranks files, as the bpe-openai
                      wheel carries them (checked against the SHA-256 that
                      tiktoken_ext expects)
  llama3-tt.tiktoken  the llama3-im tokenizer's vocab as a ranks file, with
                      Llama 3's pattern
  NAME.pattern, NAME.specials   what tokshard is given (--pattern,
                      --special-tokens)
  docs.newer          the documents (indices) made of code points the Unicode
                      version of Python's unicodedata does not assign
  NAME.skip           why NAME could not be made (tiktoken or bpe-openai
                      absent): its tests report skipped
Exit 77 when the interpreter has no `tokenizers` (the test is then skipped).
"""
import base64
import glob
import gzip
import hashlib
import json
import os
import struct
import sys
import time
import unicodedata

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:
    print(f"skip: {sys.executable} cannot import tokenizers ({e}): run scripts/install-deps.sh", file=sys.stderr)
    sys.exit(77)

W = sys.argv[1]
NEWER = []  # indices of the documents of code points that Unicode 14 does not assign
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def real_text():
    """(training text, held-out documents) from the Python docs and GCIDE."""
    files = sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True))
    gcide = "/usr/share/dictd/gcide.dict.dz"
    if not files or not os.path.exists(gcide):
        print("cannot read /usr/share/doc/python3.11/html/_sources or " + gcide +
              ": run scripts/install-deps.sh (python3.11-doc, dict-gcide)", file=sys.stderr)
        sys.exit(1)
    train, held = [], []
    for i, f in enumerate(files):
        with open(f, encoding="utf-8", errors="replace") as fh:
            t = fh.read()
        (held if i % 6 == 0 else train).append(t)
    with gzip.open(gcide, "rb") as fh:  # dictzip is gzip
        g = fh.read(4_000_000).decode("utf-8", errors="replace")
    paras = [p for p in g.split("\n\n") if p.strip()]
    for i, p in enumerate(paras):
        (held if i % 6 == 0 else train).append(p)
    # held out only: manual pages in Japanese, Chinese, German, Russian and
    # Spanish (manpages-ja, -zh, -de, -ru, -es), and Python's own sources
    for lang in ("ja", "zh_CN", "de", "ru", "es"):
        pages = sorted(glob.glob(f"/usr/share/man/{lang}/man1/*.gz"))
        if len(pages) < 20:
            print(f"too few manual pages in /usr/share/man/{lang}: run scripts/install-deps.sh", file=sys.stderr)
            sys.exit(1)
        for f in pages[:30]:
            with gzip.open(f, "rb") as fh:
                held.append(fh.read().decode("utf-8", errors="replace"))
    for f in sorted(glob.glob("/usr/lib/python3.11/*.py"))[:40]:
        with open(f, encoding="utf-8", errors="replace") as fh:
            held.append(fh.read())
    return train, held


def edge_cases():
    """Whitespace and newline runs of every length, \\r\\n mixes, digit runs,
    contractions in every case, combining marks, emoji with ZWJ, right-to-left
    text, special tokens' strings, long words."""
    d = []
    ws = [" ", "\n", "\r\n", "\t", "\r", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85"]
    for w in ws:
        for n in range(1, 18):
            for pre, post in (("", ""), ("a", "b"), ("x ", " y"), ("1", "."), ("", "z"), ("z", "")):
                d.append(pre + w * n + post)
    for n in range(1, 12):
        d.append("a" + " \n" * n + "b")
        d.append("a" + "\r\n " * n + "b")
        d.append("a" + "\n\r" * n + " " * n + "b")
        d.append(" " * n + "\n" * n + " " * n)
    for n in range(1, 25):
        d.append("7" * n)
        d.append("x" + "0123456789" * n + " 12 345,678.9")
        d.append("\u0663" * n + " ٣٤٥")  # Arabic-Indic digits
    for c in ["s", "t", "re", "ve", "m", "ll", "d"]:
        for v in (c, c.upper(), c.capitalize(), c[::-1]):
            for q in ("'", "\u2019", "''"):
                d.append(f"I{q}{v} she{q}{v} {q}{v}{q}{v} X{q}{v}x")
    d.append("It'S a DON'T WE'LL they'Re I'M 'ſ 'ẞ 'K")
    d.append("e\u0301 n\u0303 a\u0308\u0304 \u1e9b\u0323 Å Å \ufb01 \u0958 한국어 \u1100\u1161\u11a8")
    d.append("👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 ❤️ 🇫🇷🇩🇪 👍🏿 a👍b 1👍2")
    d.append("שלום עולם! مرحبا بالعالم ١٢٣ \u200fRTL\u200e mixed עברית and English")
    d.append("<|endoftext|> a<|endoftext|>b <|begin_of_text|><|end_of_text|> <s></s>")
    d.append("Day day DAY Days <custom><custom>x e\u0301te\u0301 \u00e9t\u00e9 <|endoftext|>endoftext end<|fim|>oftext "
             "tab\ttab\t\t <|fim|>[SEP] x<|fim|>y <|endofprompt|><|fim_prefix|> <|begin_of_text|>Day")
    d.append("Привет, мир! Grüße aus Köln. ¿Qué tal? 日本語のテキスト。中文文本，标点。")
    d.append("\x00\x01\x7f tab\tand\x1b[0m ctrl ￿ \U0010ffff \ue000")
    # code points in the contexts where the regexes' classes decide (\s,
    # \p{L}, \p{N}, case-insensitive contractions): every one of planes 0
    # and 1 and of the tags and variation selectors, and every 101st
    # of the rest (CJK extensions, unassigned, private use), in documents of
    # 4096; the code points Unicode 14 leaves unassigned (Python 3.11's
    # unicodedata, and PCRE2 10.42's tables) in documents of their own, whose
    # indices go to docs.newer: a peer on a later Unicode may classify them
    # otherwise (tiktoken's Rust regex reads Unicode 16)
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF and
           (c < 0x20000 or 0xE0000 <= c < 0xE0200 or c % 101 == 0)]
    for unassigned in (False, True):
        group = [c for c in cps if (unicodedata.category(chr(c)) == "Cn") == unassigned]
        for i in range(0, len(group), 4096):
            if unassigned:
                NEWER.append(len(d))
            d.append("".join(f"a{chr(c)}b {chr(c)}{chr(c)} '{chr(c)} 1{chr(c)}2\n" for c in group[i:i + 4096]))
    d.append("")
    d.append("a")
    d.append("ab" * 50_000)
    d.append("The " * 20_000)
    d.append(" " * 30_000 + "x" + "\n" * 30_000)
    return d


def write_docs(path, docs):
    with open(path, "wb") as f:
        for t in docs:
            b = t if isinstance(t, bytes) else t.encode("utf-8")
            f.write(struct.pack("<Q", len(b)))
            f.write(b)


def bytelevel_tokenizer(pre, ignore_merges=False, nfc=False, alphabet=True, specials=(), added_after=()):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=list(specials),
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if alphabet else [],
                             show_progress=False)
    return tok, tr, added_after


def write_ids(path, ids):
    with open(path, "w") as f:
        for e in ids:
            f.write(" ".join(map(str, e)) + "\n")


def byte_decoder():
    """GPT-2's byte-to-unicode table, reversed (openai/gpt-2 encoder.py)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_models(docs):
    """tiktoken's ids of every document with OpenAI's cl100k_base and
    o200k_base and with llama3-im's vocab as ranks (see the top)."""
    names = ("cl100k", "o200k", "llama3-tt")
    try:
        import importlib.resources
        import tiktoken
        import tiktoken.load
        import tiktoken_ext.openai_public as op
        importlib.resources.files("bpe_openai.data")
    except ImportError as e:
        for n in names:
            with open(os.path.join(W, n + ".skip"), "w") as f:
                f.write(f"{sys.executable} cannot import tiktoken or bpe_openai ({e}): run scripts/install-venv.sh\n")
        return

    def local_ranks(url, expected_hash=None):
        name = url.rsplit("/", 1)[1]  # cl100k_base.tiktoken
        data = gzip.open(importlib.resources.files("bpe_openai.data") / (name + ".gz")).read()
        if hashlib.sha256(data).hexdigest() != expected_hash:
            sys.exit(f"bpe-openai's {name} is not the file tiktoken_ext expects (SHA-256 differs)")
        path = os.path.join(W, name.split("_")[0] + ".tiktoken")
        with open(path, "wb") as f:
            f.write(data)
        return tiktoken.load.load_tiktoken_bpe(path, expected_hash)

    op.load_tiktoken_bpe = local_ranks  # tiktoken_ext would download the same file
    encs = {"cl100k": tiktoken.Encoding(**op.cl100k_base()), "o200k": tiktoken.Encoding(**op.o200k_base())}
    for n in ("cl100k", "o200k"):
        with open(os.path.join(W, n + ".pattern"), "w") as f:
            f.write(n + "\n")
    # llama3-im: ids 0 .. n-1 are its merges' tokens (as bytes), its specials after them
    j = json.load(open(os.path.join(W, "llama3-im.json"), encoding="utf-8"))
    dec = byte_decoder()
    ranks = {bytes(dec[c] for c in tok): i for tok, i in j["model"]["vocab"].items()}
    specials = {a["content"]: a["id"] for a in j["added_tokens"] if a["id"] >= len(ranks)}
    with open(os.path.join(W, "llama3-tt.tiktoken"), "w") as f:
        for tok, i in sorted(ranks.items(), key=lambda x: x[1]):
            f.write(base64.b64encode(tok).decode() + " " + str(i) + "\n")
    with open(os.path.join(W, "llama3-tt.pattern"), "w") as f:
        f.write("llama3\n")
    with open(os.path.join(W, "llama3-tt.specials"), "w") as f:
        f.write(",".join(f"{c}={i}" for c, i in specials.items()) + "\n")
    encs["llama3-tt"] = tiktoken.Encoding("llama3-tt", pat_str=LLAMA3, mergeable_ranks=ranks,
                                          special_tokens=specials)
    for n, enc in encs.items():
        ids = [enc.encode_ordinary(t) for t in docs]
        write_ids(os.path.join(W, n + ".ids"), ids)
        write_ids(os.path.join(W, n + ".ids-allow"), [enc.encode(t, allowed_special="all") for t in docs])
        write_docs(os.path.join(W, n + ".dec"), [enc.decode_bytes(e) for e in ids])
        with open(os.path.join(W, n + ".special"), "w") as f:
            for c, i in sorted(enc._special_tokens.items(), key=lambda x: x[1]):
                f.write(f"{i} {c}\n")
        print(f"{n}: tiktoken {tiktoken.__version__}, {enc.n_vocab} ids, {len(docs)} documents encoded")


def main():
    os.makedirs(W, exist_ok=True)
    train, held = real_text()
    edge = edge_cases()
    docs = held + edge
    write_docs(os.path.join(W, "docs.bin"), docs)
    with open(os.path.join(W, "docs.count"), "w") as f:
        f.write(f"{len(docs)} {len(held)}\n")
    with open(os.path.join(W, "docs.newer"), "w") as f:
        f.write(f"Unicode {unicodedata.unidata_version}: " + " ".join(str(len(held) + i) for i in NEWER) + "\n")
    split_l3 = pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False)
    bl_noregex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    configs = {
        # GPT-2: ByteLevel with its own regex
        "gpt2": bytelevel_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                                    specials=["<|endoftext|>"]),
        # Llama 3: Split with its regex, then ByteLevel without one; specials after the vocab
        "llama3-im": bytelevel_tokenizer(pre_tokenizers.Sequence([split_l3, bl_noregex]), ignore_merges=True,
                                         added_after=["<|begin_of_text|>", "<|end_of_text|>"]),
        "llama3": bytelevel_tokenizer(pre_tokenizers.Sequence([split_l3, bl_noregex]), ignore_merges=False,
                                      specials=["<|begin_of_text|>", "<|end_of_text|>"]),
        # Qwen 2 normalizes to NFC
        "nfc": bytelevel_tokenizer(pre_tokenizers.Sequence([split_l3, bl_noregex]), nfc=True,
                                   specials=["<|endoftext|>"]),
        # no byte alphabet: bytes never seen in training have no token and are dropped
        "noalpha": bytelevel_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                                       alphabet=False),
        # added tokens: not special (matched in the raw text, or in the NFC text
        # when normalized), special (matched only when allowed), one inside another
        "added": bytelevel_tokenizer(pre_tokenizers.Sequence([split_l3, bl_noregex]), ignore_merges=True, nfc=True,
                                     specials=["<|endoftext|>"]),
        # every Split behavior, invert, a String pattern, then ByteLevel's own regex
        "behaviors": bytelevel_tokenizer(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next", invert=False),
            pre_tokenizers.Split(Regex(r"\p{P}"), behavior="merged_with_previous", invert=False),
            pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous", invert=False),
            pre_tokenizers.Split("q", behavior="removed", invert=False),
            pre_tokenizers.Split(Regex(r"[aeiou]+"), behavior="isolated", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])),
    }
    speed = []
    for name, (tok, tr, added_after) in configs.items():
        tok.train_from_iterator(train, trainer=tr)
        if added_after:
            tok.add_special_tokens(list(added_after))
        if name == "added":
            tok.add_tokens([AddedToken("<custom>", normalized=False), AddedToken("Day", normalized=True),
                            AddedToken("e\u0301t\u00e9", normalized=True), AddedToken("endoftext", normalized=False),
                            AddedToken("tab\t", normalized=False)])
            tok.add_special_tokens([AddedToken("<|fim|>", normalized=False), AddedToken("[SEP]", normalized=True)])
        path = os.path.join(W, name + ".json")
        tok.save(path)
        tok = Tokenizer.from_file(path)  # what tokshard reads
        tok.encode_special_tokens = True
        ids, dec = [], []
        for t in docs:
            e = tok.encode(t, add_special_tokens=False).ids
            ids.append(e)
            dec.append(tok.decode(e, skip_special_tokens=False))
        write_ids(os.path.join(W, name + ".ids"), ids)
        write_docs(os.path.join(W, name + ".dec"), dec)
        if any(a.special for a in tok.get_added_tokens_decoder().values()):
            tok.encode_special_tokens = False
            write_ids(os.path.join(W, name + ".ids-allow"), [tok.encode(t, add_special_tokens=False).ids for t in docs])
            tok.encode_special_tokens = True
        with open(os.path.join(W, name + ".special"), "w") as f:
            for a in tok.get_added_tokens_decoder().items():
                if a[1].special:
                    f.write(f"{a[0]} {a[1].content}\n")
        if name in ("gpt2", "llama3-im"):
            nbytes = sum(len(t.encode("utf-8")) for t in held)
            t0 = time.perf_counter()
            for t in held:
                tok.encode(t, add_special_tokens=False)
            dt = time.perf_counter() - t0
            speed.append(f"{name} {nbytes / dt / 1e6:.2f}\n")
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(docs)} documents encoded")
    # the merges of one model in the older "a b" string form (tokenizers 0.20
    # writes [a, b] pairs and reads both)
    with open(os.path.join(W, "llama3.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(x) if isinstance(x, list) else x for x in j["model"]["merges"]]
    with open(os.path.join(W, "llama3-legacy.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    legacy = Tokenizer.from_file(os.path.join(W, "llama3-legacy.json"))
    legacy.encode_special_tokens = True
    with open(os.path.join(W, "llama3.ids")) as f:
        want = f.read().splitlines()
    for t, w in zip(docs, want):
        if " ".join(map(str, legacy.encode(t, add_special_tokens=False).ids)) != w:
            sys.exit("tokenizers gives other ids for the \"a b\" merges of llama3.json")
    for ext in ("ids", "ids-allow", "dec", "special"):
        with open(os.path.join(W, "llama3." + ext), "rb") as a, open(os.path.join(W, "llama3-legacy." + ext), "wb") as b:
            b.write(a.read())
    with open(os.path.join(W, "peer-speed.txt"), "w") as f:
        f.writelines(speed)
    tiktoken_models(docs)


main()

"""The reference side of `tokshard verify-tokenizer` for byte-level BPE.

tokshard runs this text as `PYTHON -c TEXT KIND ARGS...` (compiled into the
binary from tools/verify_peer.py) and talks to it over stdin/stdout:
  KIND tokenizers PATH              Hugging Face tokenizers reads the
                                    tokenizer.json at PATH
  KIND tiktoken RANKS DESCRIPTOR    tiktoken with the ranks file RANKS and
                                    the pattern and special tokens of the
                                    descriptor (tokshard's tiktoken.json,
                                    given as JSON text)
It first writes one line: "ok NAME VERSION" when the library loaded the
tokenizer, or "no REASON" (then exits). Then, for each document tokshard
writes (an 8-byte little-endian byte count and the UTF-8 bytes), it writes
the ids (a 4-byte little-endian count and as many 4-byte little-endian ids),
or the count 0xFFFFFFFF alone for bytes that are not UTF-8. It exits at the
end of its input.

Special tokens are encoded as text, as tokshard build does by default:
tokenizers with encode_special_tokens = True and no post-processor
additions (add_special_tokens=False), tiktoken with encode_ordinary.
"""
import base64
import json
import struct
import sys
from array import array

out = sys.stdout.buffer


def say(line):
    out.write((line + "\n").encode("utf-8"))
    out.flush()


def no(reason):
    say("no " + reason.replace("\n", " "))
    sys.exit(0)


def load(kind, args):
    """(peer name, encode(str) -> list of ids)"""
    if kind == "tokenizers":
        try:
            import tokenizers
        except ImportError as e:
            no(f"{sys.executable} cannot import tokenizers ({e})")
        try:
            tok = tokenizers.Tokenizer.from_file(args[0])
        except Exception as e:  # tokenizers raises its own Exception type
            no(f"tokenizers {tokenizers.__version__} cannot read {args[0]}: {e}")
        if not hasattr(tok, "encode_special_tokens"):
            no(f"tokenizers {tokenizers.__version__} has no encode_special_tokens (0.19 or later has it)")
        tok.encode_special_tokens = True
        return "tokenizers " + tokenizers.__version__, lambda s: tok.encode(s, add_special_tokens=False).ids
    if kind == "tiktoken":
        try:
            import tiktoken
        except ImportError as e:
            no(f"{sys.executable} cannot import tiktoken ({e})")
        ranks = {}
        with open(args[0], "rb") as f:
            for line in f:
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
        d = json.loads(args[1])
        try:
            enc = tiktoken.Encoding(name="tokshard-verify", pat_str=d["pattern"], mergeable_ranks=ranks,
                                    special_tokens={text: i for text, i in d["special_tokens"]})
        except Exception as e:  # the pattern, or ranks tiktoken refuses
            no(f"tiktoken {tiktoken.__version__} refuses {args[0]} with this pattern: {e}")
        return "tiktoken " + tiktoken.__version__, enc.encode_ordinary
    no(f"unknown kind {kind!r}")


def main():
    name, encode = load(sys.argv[1], sys.argv[2:])
    say("ok " + name)
    inp = sys.stdin.buffer
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        try:
            text = inp.read(n).decode("utf-8")
        except UnicodeDecodeError:
            out.write(struct.pack("<I", 0xFFFFFFFF))
            out.flush()
            continue
        ids = array("I", encode(text))
        if sys.byteorder != "little":
            ids.byteswap()
        out.write(struct.pack("<I", len(ids)))
        out.write(ids.tobytes())
        out.flush()


main()

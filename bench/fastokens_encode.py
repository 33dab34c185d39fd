"""fastokens_encode.py - encodes a text file, one document per line, with
fastokens (PyPI) from a tokenizer.json; prints MB/s (wall, encode_batch only,
after reading the file) and how many lines differ from a reference ids file
(spm_encode --output_format=id output, one line per document).
Threads: set RAYON_NUM_THREADS.

usage: fastokens_encode.py TOKENIZER.json TEXT IDS
"""
import sys
import time

from fastokens import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], encoding="utf-8", newline="\n") as f:
    lines = f.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
with open(sys.argv[3]) as f:
    ref = f.read().split("\n")
t0 = time.perf_counter()
enc = tok.encode_batch(lines)
dt = time.perf_counter() - t0
bad = 0
for i, e in enumerate(enc):
    if " ".join(map(str, e.ids)) != ref[i]:
        bad += 1
        if bad <= 3:
            print(f"differs on line {i + 1}: {lines[i][:80]!r}", file=sys.stderr)
nbytes = sum(len(l.encode("utf-8")) + 1 for l in lines)
print(f"fastokens\t{nbytes}\t{dt:.3f}\t{bad}")

#!/usr/bin/env python3
"""The Python package (python/tokshard) against the C tools on real data:
every document equals `tokshard cat --ids`; for several layouts and steps
the sampler's windows equal `tokshard sample-plan --json`, rank by rank;
checksum verification catches a flipped byte; the IterableDataset yields the
planned windows, also through DataLoader workers; a Mixture's every
sample (source, index, epoch, window) equals sample-plan --json's, with a
schedule; a corrupt tokenizer copy or
manifest is a FormatError naming the file. Usage: test_python.py TOKSHARD DATASET WORKDIR
(runs in the project venv; python/ is put first on sys.path so the source
tree is what is tested)."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import numpy  # noqa: E402

import tokshard  # noqa: E402

TKS, DATA, WORK = sys.argv[1:4]
fails = 0


def check(cond, what):
    global fails
    if cond:
        print(f"ok   [python]: {what}")
    else:
        print(f"FAIL [python]: {what}", file=sys.stderr)
        fails += 1


ds = tokshard.Dataset(DATA, verify=True)
check(len(ds.shards) >= 3, f"dataset opens and verifies: {len(ds.shards)} shards, {ds.n_docs} documents")

# 1. every document, zero copy
out = subprocess.run([TKS, "cat", DATA, "--ids"], check=True, capture_output=True, text=True).stdout
lines = out.splitlines()
same = len(lines) == ds.n_docs and all(
    numpy.array_equal(ds.doc(g), numpy.array(l.split(), dtype=numpy.int64)) for g, l in enumerate(lines))
check(same, f"all {len(lines)} documents equal tokshard cat --ids")
check(ds.doc(5).base is not None and not ds.doc(5).flags.owndata, "documents are views, not copies")
check(sum(len(d) for d in ds.docs()) == ds.n_tokens, "documents cover every token")

# 2. the sampler against sample-plan, several layouts and steps
all_epochs = set()
layouts = [  # seq_len, global_batch, dp, tp, seed, val_tokens, steps
    (64, 8, 2, 1, None, None, "1:3"),
    (32, 12, 3, 2, 7, 4096, "5:6"),
    (128, 6, 1, 1, 123456789012345, 0, "1:2"),
    (16, 16, 4, 1, 0, 1000, "860:863"),      # across the first epoch boundary
]
for L, B, D, T, seed, val, steps in layouts:
    cmd = [TKS, "sample-plan", DATA, "--seq-len", str(L), "--global-batch", str(B), "--dp", str(D),
           "--tp", str(T), "--steps", steps, "--json"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if val is not None:
        cmd += ["--val-tokens", str(val)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        check(False, f"sample-plan {' '.join(cmd[3:])}: {r.stderr}")
        continue
    import json
    plan = json.loads(r.stdout)
    s = tokshard.Sampler(ds, L, seed=plan["seed"], val_tokens=65536 if val is None else val)
    ok = list(s.range) == plan["range"] and list(s.val_range) == plan["val_range"] and \
        s.n_windows == plan["n_windows"]
    n_samples = 0
    epochs = set()
    for st in plan["steps"]:
        for rk in st["ranks"]:
            got = list(s.rank_samples(st["step"], B, rk["dp_rank"], D))
            ok &= got == [x["sample"] for x in rk["samples"]]
            for x in rk["samples"]:
                e, w = s.window(x["sample"])
                epochs.add(e)
                all_epochs.add(e)
                ok &= (e, w) == (x["epoch"], x["window"]) and list(s.window_tokens(w)) == x["tokens"]
                want = numpy.concatenate([ds.shards[p["shard"]].tokens[p["offset"]:p["offset"] + p["n_tokens"]]
                                          for p in x["pieces"]]).astype(numpy.int64)
                ok &= numpy.array_equal(s.read(w), want)
                n_samples += 1
    check(ok and n_samples > 0, f"L={L} B={B} dp={D} tp={T} seed={plan['seed']} val={val} steps {steps}: "
                                f"{n_samples} samples (epochs {sorted(epochs)}) equal sample-plan --json")

check(all_epochs >= {0, 1}, f"the layouts reach a second epoch (epochs {sorted(all_epochs)})")

# 2b. a mixture against sample-plan --json: three named sources (the same
# dataset under three names: each name its own permutations), a schedule
# that drops one source and reweights the others, dp 2; once with --dataset
# flags, once from a --mix file; every sample's source, index in it, epoch,
# window and tokens
import json  # noqa: E402
mix_file = os.path.join(WORK, "mix.json")
os.makedirs(WORK, exist_ok=True)
srcs = [("web", 0.5), ("code", 0.3), ("books", 0.2)]
sched = [(4, {"web": 0.25, "books": 0.75}), (7, {"code": 2.0, "web": 1.0, "books": 1.0})]
with open(mix_file, "w") as f:
    json.dump({"sources": [{"name": n, "path": os.path.abspath(DATA), "weight": w} for n, w in srcs],
               "schedule": [{"step": s, "weights": ws} for s, ws in sched]}, f)
L, B, D = 32, 12, 2
flags = [x for n, w in srcs for x in ("--dataset", f"{n}={DATA}:{w}")] + \
    [x for s, ws in sched for x in ("--mix-at", f"{s}:" + ",".join(f"{k}={v}" for k, v in ws.items()))]
for how, data in (("--dataset flags", flags), ("--mix file", ["--mix", mix_file])):
    cmd = [TKS, "sample-plan", *data, "--seq-len", str(L), "--global-batch", str(B), "--dp", str(D),
           "--steps", "1:9", "--val-tokens", "4096", "--seed", "11", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        check(False, f"sample-plan of a mixture ({how}): {r.stderr}")
        continue
    plan = json.loads(r.stdout)
    m = tokshard.Mixture([(n, ds, w) for n, w in srcs], L, B, seed=11, val_tokens=4096, schedule=sched)
    ok = [x["name"] for x in plan["sources"]] == m.names and \
        [x["n_windows"] for x in plan["sources"]] == [s.n_windows for s in m.samplers] and \
        [(x["step"], x["sample"]) for x in plan["schedule"]] == [(s, (s - 1) * B) for s, _ in sched]
    seen, per_phase = 0, {}
    for st in plan["steps"]:
        for rk in st["ranks"]:
            for x in rk["samples"]:
                name, idx, e, w = m.sample(x["sample"])
                s = m.samplers[m.names.index(name)]
                ok &= (name, idx, e, w) == (x["source"], x["source_sample"], x["epoch"], x["window"])
                ok &= list(s.window_tokens(w)) == x["tokens"]
                phase = 0 if st["step"] < 4 else 1 if st["step"] < 7 else 2
                per_phase.setdefault(phase, set()).add(name)
                seen += 1
    check(ok and seen == 9 * B, f"mixture ({how}): {seen} samples' source, index, epoch and window equal "
                                f"sample-plan --json")
    check(per_phase == {0: {"web", "code", "books"}, 1: {"web", "books"}, 2: {"web", "code", "books"}},
          f"mixture ({how}): the schedule drops code in steps 4..6 only ({per_phase})")

# 2c. best-fit packing (docs/SAMPLING.md section 10) against sample-plan
# --packing best-fit --json: the Python sampler, written from the spec,
# packs the same windows (every piece of every sampled window), reads the
# same tokens then padding, and its epoch holds every document once
for L, B, D, steps in [(64, 8, 2, "1:6"), (200, 6, 3, "3:5")]:
    r = subprocess.run([TKS, "sample-plan", DATA, "--seq-len", str(L), "--global-batch", str(B), "--dp", str(D),
                        "--steps", steps, "--packing", "best-fit", "--json"], capture_output=True, text=True)
    if r.returncode:
        check(False, f"sample-plan --packing best-fit: {r.stderr}")
        continue
    plan = json.loads(r.stdout)
    s = tokshard.Sampler(ds, L, seed=plan["seed"], packing="best-fit")
    st = plan["packing_stats"][0]["best_fit"]
    ok = plan["packing"] == "best-fit" and s.n_windows == plan["n_windows"] == st["windows"]
    n_samples = 0
    for step in plan["steps"]:
        for rk in step["ranks"]:
            ok &= list(s.rank_samples(step["step"], B, rk["dp_rank"], D)) == [x["sample"] for x in rk["samples"]]
            for x in rk["samples"]:
                e, w = s.window(x["sample"])
                pieces = [(ds.token_cum[p["shard"]] + p["offset"], p["n_tokens"]) for p in x["pieces"]]
                ok &= (e, w) == (x["epoch"], x["window"]) and s.window_pieces(w) == pieces
                got = s.read(w)
                ok &= x["n_real"] == sum(n for _, n in pieces) and not got[x["n_real"]:].any()
                ok &= numpy.array_equal(got[:x["n_real"]], numpy.concatenate(
                    [numpy.asarray(ds.tokens(b, b + n), dtype=numpy.int64) for b, n in pieces]))
                n_samples += 1
    real = sum(n for w in range(s.n_windows) for _, n in s.window_pieces(w))
    ok &= real == st["tokens"] and s.n_windows * (L + 1) - real == st["pad_tokens"]
    check(ok and n_samples > 0, f"best-fit L={L} B={B} dp={D} steps {steps}: {n_samples} samples and "
                                f"{s.n_windows} windows equal sample-plan --json (padding "
                                f"{100 * st['pad_tokens'] / st['capacity']:.2f}%)")

# 3. the IterableDataset yields the planned windows; the union over dp ranks
# of a step does not depend on dp
it = tokshard.TokshardIterable(DATA, seq_len=64, global_batch=8, dp_rank=1, dp=2, first_step=2, steps=1)
xs = list(it)
s = tokshard.Sampler(ds, 64)
want = [s.read(s.window(g)[1]) for g in range(12, 16)]
check(len(xs) == 4 and all(numpy.array_equal(numpy.concatenate([x.numpy(), y.numpy()[-1:]]), w)
                           for (x, y), w in zip(xs, want)), "IterableDataset rank 1 of 2, step 2 = samples 12..15")
one = [x for x, _ in tokshard.TokshardIterable(ds, 64, 8, 0, 1, first_step=2, steps=1)]
four = [x for r in range(4) for x, _ in tokshard.TokshardIterable(ds, 64, 8, r, 4, first_step=2, steps=1)]
check(all(numpy.array_equal(a.numpy(), b.numpy()) for a, b in zip(one, four)) and len(one) == 8,
      "step 2 over dp=4 equals step 2 over dp=1")

# 3b. DataLoader workers: each sample once, in the same order as one process
import torch  # noqa: E402
it = tokshard.TokshardIterable(ds, 64, 8, 1, 2, first_step=3, steps=5)
base = [x for x, _ in torch.utils.data.DataLoader(it, batch_size=4, num_workers=0)]
for k in (2, 3):
    got = [x for x, _ in torch.utils.data.DataLoader(it, batch_size=4, num_workers=k)]
    check(len(got) == len(base) == 5 and all(torch.equal(a, b) for a, b in zip(got, base)),
          f"DataLoader(num_workers={k}) yields the 5 steps of num_workers=0, in order, once each")

# 4. verification catches a flipped byte and names the chunk
os.makedirs(WORK, exist_ok=True)
bad = os.path.join(WORK, "flipped")
shutil.rmtree(bad, ignore_errors=True)
shutil.copytree(DATA, bad)
p = os.path.join(bad, "shard-00001.tks")
with open(p, "r+b") as f:
    f.seek(4096 + 5000)
    b = f.read(1)
    f.seek(4096 + 5000)
    f.write(bytes([b[0] ^ 0x10]))
tokshard.Dataset(bad)  # structure is intact: opens without verify
try:
    tokshard.Dataset(bad, verify=True)
    check(False, "flipped byte not caught")
except tokshard.FormatError as e:
    check("chunk 1 " in str(e) and "shard-00001.tks" in str(e), f"flipped byte caught: {e}")
with open(p, "r+b") as f:
    f.truncate(os.path.getsize(p) - 8)
try:
    tokshard.Shard(p)
    check(False, "truncated shard opened")
except tokshard.FormatError as e:
    check("truncated" in str(e) or "bytes but the header" in str(e), f"truncated shard refused: {e}")

# 5. the tokenizer copy and the manifest: every corruption is a FormatError
# naming the file (never JSONDecodeError, UnicodeDecodeError or KeyError)
def fresh(name):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(DATA, d)
    return d


def refused(d, verify, want, what):
    try:
        tokshard.Dataset(d, verify=verify)
        check(False, f"{what}: opened")
    except tokshard.FormatError as e:
        check(want in str(e), f"{what}: {e}")
    except Exception as e:  # noqa: BLE001 - any other exception is the defect
        check(False, f"{what}: {type(e).__name__} instead of FormatError: {e}")


d = fresh("tok")
tp = os.path.join(d, "tokenizer.model")
with open(tp, "rb") as f:
    tok = f.read()
rng = numpy.random.default_rng(7)
caught = 0
for i in range(150):  # byte flips anywhere, and cuts
    b = bytearray(tok)
    if i % 10 == 9:
        b = b[:int(rng.integers(0, len(b)))]
    else:
        b[int(rng.integers(0, len(b)))] ^= 1 << int(rng.integers(0, 8))
    with open(tp, "wb") as f:
        f.write(b)
    try:
        tokshard.Dataset(d, verify=True)
    except tokshard.FormatError as e:
        caught += "tokenizer.model" in str(e)
check(caught == 150, f"verify=True refuses {caught} of 150 corrupted tokenizer copies")

mp = os.path.join(DATA, "manifest.json")
with open(mp, "rb") as f:
    man = f.read()
edits = [
    (man.replace(b'"format"', b'"f\xffrmat"', 1), "not UTF-8", False),
    (man[:len(man) // 2], "not valid JSON", False),
    (man.replace(b'"shards"', b'"shardz"', 1), "invalid tokenizer/shards/totals", False),
    (man.replace(b'"vocab_size"', b'"vocab_sise"', 1), "invalid tokenizer record", False),
    (man.replace(b'"header_xxh3"', b'"header_xxh4"', 1), "shard entry 0 is invalid", False),
    (man.replace(b'"n_docs"', b'"n_dogs"', 1), "shard entry 0 is invalid", False),
    (man.replace(b'"tool": "tokshard', b'"tool": "edited', 1), "self_xxh3", True),
    (man.replace(b'"self_xxh3"', b'"self_xxh4"', 1), "does not end with", True),
]
tot = man.rindex(b'"max_token_id": ')
end = man.index(b"\n", tot)
edits.append((man[:tot] + b'"max_token_id": 9000' + man[end:], "totals.max_token_id", False))
tot = man.rindex(b'"min_token_id": ')
end = man.index(b",", tot)
edits.append((man[:tot] + b'"min_token_id": -3' + man[end:], "totals.min_token_id", False))
for i, (text, want, verify) in enumerate(edits):
    d = fresh("man")
    check(text != man, f"manifest edit {i} changes the file")
    with open(os.path.join(d, "manifest.json"), "wb") as f:
        f.write(text)
    refused(d, verify, want, f"manifest edit {i} ({want})")
    r = subprocess.run([TKS, "audit", d], capture_output=True, text=True)
    check(r.returncode != 0, f"tokshard audit also refuses manifest edit {i} (exit {r.returncode})")
tokshard.Dataset(fresh("ok"), verify=True)  # the copy itself is fine

# 6. refusals that match tokshard-train's and sample-plan's: a weight that is
# not a finite number > 0, a schedule change at step 1; token ranges outside
# the stream; an empty shard file; a FIFO in place of the tokenizer copy
ds0 = tokshard.Dataset(DATA)
for srcs_bad, sched_bad, want in (([("a", ds0, -0.5)], (), "weight -0.5 is not a finite number > 0"),
                                  ([("a", ds0, float("nan"))], (), "is not a finite number > 0"),
                                  ([("a", ds0, 1), ("b", ds0, 1)], ((1, {"a": 1}),), "from step 2 on"),
                                  ([("a", ds0, 1), ("b", ds0, 1)], ((3, {"a": 0}),), "weight 0 is not")):
    try:
        tokshard.Mixture(srcs_bad, 32, 8, val_tokens=4096, schedule=sched_bad)
        check(False, f"Mixture accepted {srcs_bad[0][2]}, {sched_bad}")
    except ValueError as e:
        check(want in str(e), f"Mixture refuses: {e}")
for b, e in ((-5, 3), (3, 2), (0, ds0.token_cum[-1] + 1)):
    try:
        ds0.tokens(b, e)
        check(False, f"tokens({b}, {e}) returned data")
    except IndexError as x:
        check("tokens(" in str(x), f"tokens({b}, {e}) refused: {x}")
d = fresh("empty-shard")
open(os.path.join(d, tokshard.Dataset(DATA).manifest["shards"][0]["file"]), "wb").close()
refused(d, False, "less than the 256-byte header", "a 0-byte shard")
d = fresh("fifo-tok")
os.remove(os.path.join(d, "tokenizer.model"))
os.mkfifo(os.path.join(d, "tokenizer.model"))
refused(d, True, "not a regular file", "a FIFO tokenizer copy (verify=True, never waits)")

sys.exit(1 if fails else 0)

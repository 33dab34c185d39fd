"""The trainer's sampler (docs/SAMPLING.md), reimplemented in Python: the
same windows, the same keyed permutation per epoch, the same rank slices, so
a PyTorch loop reads exactly what `tokshard-train` and `tokshard sample-plan`
say. All arithmetic is on Python integers reduced mod 2^64, as uint64 in C."""
import math

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd (Steele, Lea, Flood, OOPSLA 2014)
ROUNDS = 6


def mix64(z):
    """splitmix64's output function (S. Vigna, https://prng.di.unimi.it/splitmix64.c)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def epoch_key(seed, epoch):
    return mix64((mix64(seed & M64) + GOLDEN * (epoch + 1)) & M64)


def perm_index(i, n, key):
    """Position i of the keyed permutation of [0, n): a 6-round Feistel network
    on [0, 2^k) with cycle walking (Black and Rogaway, CT-RSA 2002)."""
    if i >= n:
        raise IndexError(f"perm_index: {i} >= {n}")
    if n == 1:
        return 0
    k = (n - 1).bit_length()
    k += k & 1
    k = max(k, 2)
    h = k // 2
    mask = (1 << h) - 1
    rk = [mix64((key + GOLDEN * (r + 1)) & M64) for r in range(ROUNDS)]
    v = i
    while True:
        l, r = v >> h, v & mask
        for j in range(ROUNDS):
            l, r = r, l ^ (mix64(r ^ rk[j]) >> (64 - h))
        v = (l << h) | r
        if v < n:
            return v


def split_tokens(n_tokens, val_tokens, seq_len):
    """(train, val) token ranges: the last whole windows held out (§2)."""
    if seq_len == 0:
        raise ValueError("seq_len is 0: a window needs seq_len >= 1")
    if val_tokens == 0:
        train, val = (0, n_tokens), (n_tokens, n_tokens)
    else:
        if val_tokens <= seq_len:
            raise ValueError(f"val_tokens {val_tokens} <= seq_len {seq_len}: no validation window fits; "
                             f"ask for at least {seq_len + 1}, or 0 for none")
        v = (val_tokens - 1) // seq_len * seq_len + 1
        if v > n_tokens or n_tokens - v < seq_len + 1:
            raise ValueError(f"{n_tokens} tokens minus {v} for validation leave fewer than seq_len + 1 = "
                             f"{seq_len + 1} for training: a smaller val_tokens or seq_len, or more data")
        train, val = (0, n_tokens - v), (n_tokens - v, n_tokens)
    if train[1] - train[0] < seq_len + 1:
        raise ValueError(f"{n_tokens} tokens: fewer than seq_len + 1 = {seq_len + 1}")
    return train, val


PACK_GROUP_WINDOWS = 1024  # TKS_PACK_GROUP_WINDOWS: windows' tokens per packing group


def doc_starts_of(dataset, begin, end):
    """The first tokens of the documents of [begin, end), and end: the
    shards' document starts (a shard boundary is one too), clipped."""
    import numpy
    starts = [numpy.asarray(s.index[:-1], dtype=numpy.int64) + c
              for s, c in zip(dataset.shards, dataset.token_cum)]
    a = numpy.unique(numpy.concatenate(starts + [numpy.array([begin, end], dtype=numpy.int64)]))
    return [int(x) for x in a[(a >= begin) & (a <= end)]]


def best_fit(items, capacity):
    """Best-fit decreasing (docs/SAMPLING.md §10): items (begin, length), the
    longest first (ties: stream order), each into the open bin with the least
    room that holds it (ties: the bin that reached that room last), else a new
    bin. Returns the bins' items in stream order, bins in the order opened."""
    import bisect
    bins, stacks, rooms = [], {}, []  # rooms: sorted rooms with a non-empty stack
    for b, n in sorted(items, key=lambda it: (-it[1], it[0])):
        i = bisect.bisect_left(rooms, n)
        if i == len(rooms):
            k, room = len(bins), capacity
            bins.append([])
        else:
            room = rooms[i]
            k = stacks[room].pop()
            if not stacks[room]:
                del stacks[room]
                rooms.pop(i)
        bins[k].append((b, n))
        left = room - n
        if left > 0:
            if left not in stacks:
                stacks[left] = []
                bisect.insort(rooms, left)
            stacks[left].append(k)
    return [sorted(x) for x in bins]


def pack_windows(dataset, begin, end, seq_len):
    """The best-fit windows of [begin, end) (docs/SAMPLING.md §10), each a
    list of (global begin, length) in stream order, windows in order."""
    C, L = seq_len + 1, seq_len
    G = PACK_GROUP_WINDOWS * C
    starts = doc_starts_of(dataset, begin, end)
    windows, d = [], 0
    for g0 in range(begin, end, G):
        items = []
        while d + 1 < len(starts) and starts[d] < g0 + G:
            a, n = starts[d], starts[d + 1] - starts[d]
            if n <= C:
                items.append((a, n))
            else:
                k = 0
                while k * L + C <= n:
                    items.append((a + k * L, C))
                    k += 1
                if n - k * L >= 2:
                    items.append((a + k * L, n - k * L))
            d += 1
        windows += best_fit(items, C)
    return windows


class Sampler:
    """Windows of seq_len + 1 tokens over one token range of a Dataset,
    served in the trainer's order. part: "train" (default) or "val" of the
    split made by val_tokens (the trainer's default 65536), or "all".
    packing: "concat" (the stream cut every seq_len tokens) or "best-fit"
    (whole documents packed into windows, docs/SAMPLING.md §10: window_pieces
    gives a window's documents, read pads it with id 0)."""

    def __init__(self, dataset, seq_len, seed=1337, val_tokens=65536, part="train", packing="concat"):
        if packing not in ("concat", "best-fit"):
            raise ValueError(f"packing {packing!r}: use 'concat' or 'best-fit'")
        self.ds = dataset
        self.seq_len = seq_len
        self.seed = seed
        self.packing = packing
        train, val = split_tokens(dataset.n_tokens, val_tokens, seq_len)
        self.range = {"train": train, "val": val, "all": (0, dataset.n_tokens)}[part]
        self.train_range, self.val_range = train, val
        self.packed = pack_windows(dataset, *self.range, seq_len) if packing == "best-fit" else None
        self.n_windows = len(self.packed) if self.packed is not None else \
            (self.range[1] - self.range[0] - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"range {self.range} holds no window of {seq_len + 1} tokens")

    def window_pieces(self, w):
        """Window w's (global begin, length) pieces in stream order: its
        documents (best-fit), or its one range of seq_len + 1 tokens."""
        if self.packed is not None:
            return list(self.packed[w])
        b, e = self.window_tokens(w)
        return [(b, e - b)]

    def window(self, g):
        """(epoch, window) of global sample g."""
        n = self.n_windows
        return g // n, perm_index(g % n, n, epoch_key(self.seed, g // n))

    def window_tokens(self, w):
        """Global token range [begin, end) of concat window w."""
        if self.packed is not None:
            raise ValueError("a best-fit window is not one token range: use window_pieces")
        b = self.range[0] + w * self.seq_len
        return b, b + self.seq_len + 1

    def read(self, w, vocab=None):
        """The seq_len + 1 ids of window w (int64), each checked against vocab
        (default: the dataset's), as tokshard_shard_read checks them; a
        best-fit window's documents, then padding (id 0) to seq_len + 1."""
        import numpy
        limit = self.ds.vocab_size if vocab is None else vocab
        x = numpy.zeros(self.seq_len + 1, dtype=numpy.int64)  # padding past the pieces: id 0
        at = 0
        for b, n in self.window_pieces(w):
            x[at:at + n] = self.ds.tokens(b, b + n)
            bad = numpy.nonzero(x[at:at + n] >= limit)[0]
            if len(bad):
                raise ValueError(f"window {w}: token id {int(x[at + bad[0]])} at global token {b + int(bad[0])} "
                                 f"is outside the vocabulary [0, {limit})")
            at += n
        return x

    @staticmethod
    def rank_slice(step, global_batch, dp_rank, dp):
        """Global samples [first, last) of data-parallel rank dp_rank at step
        (counted from 1, as tokshard-train counts)."""
        if step < 1:
            raise ValueError("steps count from 1")
        if global_batch % dp:
            raise ValueError(f"global batch {global_batch} is not divisible by dp {dp}")
        per = global_batch // dp
        first = (step - 1) * global_batch + dp_rank * per
        return first, first + per

    def rank_samples(self, step, global_batch, dp_rank, dp):
        return range(*self.rank_slice(step, global_batch, dp_rank, dp))


# ---- mixtures of datasets (docs/SAMPLING.md §9) --------------------------------

FNV_OFFSET, FNV_PRIME = 0xcbf29ce484222325, 0x100000001b3


def source_seed(seed, name):
    """The seed of a mixture's source: the run's seed XOR the 64-bit FNV-1a
    hash of the name's UTF-8 bytes (Fowler, Noll, Vo)."""
    h = FNV_OFFSET
    for b in name.encode("utf-8"):
        h = ((h ^ b) * FNV_PRIME) & M64
    return (seed ^ h) & M64


def integer_weights(weights):
    """A phase's integer weights: W_k = floor(2^32 * w_k / total), total the sum
    of the weights in source order (IEEE doubles, as the C code adds them);
    0 for a source not drawn. Returns (W, S = sum W)."""
    import math
    total = 0.0
    for w in weights:
        total += w
    W = [math.floor(math.ldexp(w / total, 32)) if w > 0 else 0 for w in weights]
    return W, sum(W)


class Blend:
    """Which source each global sample comes from: phases (start sample,
    weights per source) of the largest-deficit rule W_k (j + 1) - S c_k, ties
    to the first source, counts restarting at each phase (Megatron-LM's
    blending index in exact integers). State: (sample, counts, phase counts)."""

    def __init__(self, phases):
        self.phases = [(start, *integer_weights(ws)) for start, ws in phases]
        self.K = len(phases[0][1])
        self.reset()

    def reset(self, sample=0, counts=None, phase_counts=None):
        self.sample = sample
        self.counts = list(counts) if counts else [0] * self.K
        self.phase_counts = list(phase_counts) if phase_counts else [0] * self.K

    def next(self):
        """(source, its sample index) of global sample self.sample; advances."""
        n = self.sample
        p = max(i for i, ph in enumerate(self.phases) if ph[0] <= n)
        start, W, S = self.phases[p]
        if n == start:
            self.phase_counts = [0] * self.K
        best, best_d = None, None
        for k in range(self.K):
            if W[k] == 0:
                continue
            d = W[k] * (n - start + 1) - S * self.phase_counts[k]
            if best is None or d > best_d:
                best, best_d = k, d
        idx = self.counts[best]
        self.counts[best] += 1
        self.phase_counts[best] += 1
        self.sample += 1
        return best, idx

    def pick(self, g):
        """(source, index) of global sample g, replaying from the start when g
        is behind the state (sequential use is O(K) per sample)."""
        if g < self.sample:
            self.reset()
        while self.sample < g:
            self.next()
        return self.next()


class Mixture:
    """A mixture of datasets served as tokshard-train serves it: sources
    [(name, Dataset, weight)], each with its own Sampler (its own split and
    seed), blended by weights that a schedule [(step, {name: weight})] changes
    from a step on (a source not named there has weight 0)."""

    def __init__(self, sources, seq_len, global_batch, seed=1337, val_tokens=65536, schedule=()):
        self.names = [n for n, _, _ in sources]

        def weight(w, where):
            # as tokshard-train refuses them: a weight is a finite number > 0
            try:
                v = float(w)
            except (TypeError, ValueError):
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{where}: weight {w!r} is not a finite number > 0")
            return v

        initial = [weight(w, f"source {n}") for n, _, w in sources]
        self.samplers = [Sampler(ds, seq_len, seed=source_seed(seed, n), val_tokens=val_tokens)
                         for n, ds, _ in sources]
        phases = [(0, initial)]
        for step, ws in sorted(schedule):
            if not isinstance(step, int) or step < 2:
                raise ValueError(f"schedule step {step!r}: a change takes effect from step 2 on")
            unknown = set(ws) - set(self.names)
            if unknown:
                raise ValueError(f"schedule step {step}: unknown sources {sorted(unknown)}")
            phases.append(((step - 1) * global_batch,
                           [weight(ws[n], f"schedule step {step}, source {n}") if n in ws else 0.0
                            for n in self.names]))
        self.blend = Blend(phases)

    def sample(self, g):
        """(name, index in the source, epoch, window) of global sample g."""
        k, idx = self.blend.pick(g)
        s = self.samplers[k]
        epoch, w = idx // s.n_windows, perm_index(idx % s.n_windows, s.n_windows, epoch_key(s.seed, idx // s.n_windows))
        return self.names[k], idx, epoch, w

    def read(self, g, vocab=None):
        """The seq_len + 1 ids of global sample g."""
        name, _, _, w = self.sample(g)
        return self.samplers[self.names.index(name)].read(w, vocab)

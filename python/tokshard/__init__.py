"""tokshard datasets from Python.

    import tokshard
    ds = tokshard.Dataset("data")                 # manifest + every shard checked on open
    ds.doc(42)                                    # numpy view of document 42 (no copy)
    s = tokshard.Sampler(ds, seq_len=256, seed=1337, val_tokens=65536)
    for g in s.rank_samples(step=1, global_batch=16, dp_rank=0, dp=4):
        s.read(s.window(g)[1])                    # the L + 1 ids tokshard-train reads
    m = tokshard.Mixture([("web", ds, 0.7), ("code", ds2, 0.3)], seq_len=256, global_batch=16,
                         schedule=[(900, {"code": 1.0})])
    m.sample(0)                                   # ("web", 0, epoch, window): as sample-plan says

The format is docs/FORMAT.md, the sampler docs/SAMPLING.md; both are
reimplemented here in Python (numpy only) and tested against `tokshard cat
--ids` and `tokshard sample-plan --json` (tests/interop.cmake).
"""
from .format import Dataset, FormatError, Shard
from .sampler import Blend, Mixture, Sampler, epoch_key, perm_index, source_seed, split_tokens

__all__ = ["Dataset", "Shard", "FormatError", "Sampler", "Mixture", "Blend", "epoch_key", "perm_index",
           "source_seed", "split_tokens",
           "TokshardIterable"]
__version__ = "0.1.0"


def __getattr__(name):
    # torch is optional: the IterableDataset is imported on first use
    if name == "TokshardIterable":
        from .torch_data import TokshardIterable
        return TokshardIterable
    raise AttributeError(name)

"""A torch.utils.data.IterableDataset over the trainer's samples: a PyTorch
loop on data-parallel rank dp_rank of dp gets, step after step, the windows
tokshard-train would give that rank (docs/SAMPLING.md)."""
import numpy
import torch

from .format import Dataset
from .sampler import Sampler


class TokshardIterable(torch.utils.data.IterableDataset):
    """Yields (inputs, targets), each a LongTensor of seq_len ids, for
    data-parallel rank `dp_rank` of `dp`, steps first_step, first_step + 1, ...
    (count from 1; `steps` limits how many, None = forever). The samples of a
    step depend only on the dataset, seq_len, global_batch, seed and the step,
    never on dp. Tensor-parallel ranks of one data-parallel group pass the
    same dp_rank. Use with DataLoader(batch_size=global_batch // dp): each
    batch is then one step of this rank. With num_workers=k each worker
    yields whole steps (worker w: first_step + w, first_step + w + k, ...), and
    DataLoader's in-order round robin over the workers' batches gives the
    steps in order, each sample once: the same batches as num_workers=0,
    provided batch_size is global_batch // dp."""

    def __init__(self, dataset, seq_len, global_batch, dp_rank=0, dp=1, seed=1337, val_tokens=65536,
                 first_step=1, steps=None, verify=False):
        super().__init__()
        self.ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset, verify=verify)
        self.sampler = Sampler(self.ds, seq_len, seed=seed, val_tokens=val_tokens)
        self.global_batch, self.dp_rank, self.dp = global_batch, dp_rank, dp
        self.first_step, self.steps = first_step, steps
        Sampler.rank_slice(first_step, global_batch, dp_rank, dp)  # validates the layout

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, me = (1, 0) if info is None else (info.num_workers, info.id)
        step = self.first_step + me
        while self.steps is None or step < self.first_step + self.steps:
            for g in self.sampler.rank_samples(step, self.global_batch, self.dp_rank, self.dp):
                x = torch.from_numpy(self.sampler.read(self.sampler.window(g)[1]))
                yield x[:-1], x[1:]
            step += workers

"""PyTorch datasets over cistern packs (docs/pack_format.md).

    from cistern.torch import PackIterableDataset
    ds = PackIterableDataset("/packs/train", seed=0, transform=decode)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in loader: ...

PackIterableDataset reads each epoch in a deterministic permutation (seed,
epoch), split across ranks and DataLoader workers so that every sample is
read exactly once per epoch, and reads ahead *in that order* with C++
threads holding at most `prefetch_bytes`: nothing read ahead is wasted.
PackDataset is the map-style one (any sampler, DistributedSampler too).
Samples come as (bytes, label) — label None when the pack has none — or
whatever `transform(bytes, label)` makes of them; decoding stays in user code.
Connections are opened per process (DataLoader workers fork, and a client
does not survive a fork).
"""
import os

import numpy as np
import torch.utils.data as _data

import cistern
from ._cistern import Pack

__all__ = ["PackDataset", "PackIterableDataset", "epoch_order"]


_inherited = []


class _Opened:
    """The pack, opened once per process."""

    def __init__(self, path, cluster):
        self.path, self.cluster = path, cluster
        self._pid, self._pack, self._conn = None, None, None

    def get(self):
        if self._pid != os.getpid():
            if self._pid is not None:
                # Objects made before a fork: their threads are the parent's.
                # Destroying them here would wait for threads this process
                # does not have, so they are kept, unused, until it exits.
                _inherited.append((self._pack, self._conn))
            self._conn = cistern.connect(self.cluster)
            self._pack = Pack(self._conn, self.path)
            self._pid = os.getpid()
        return self._pack

    def __getstate__(self):  # to workers without the parent's connection
        return {"path": self.path, "cluster": self.cluster}

    def __setstate__(self, state):
        self.__init__(state["path"], state["cluster"])


def epoch_order(size, seed, epoch, shuffle=True):
    """The epoch's order of sample indices: a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(size)


class PackDataset(_data.Dataset):
    """Map-style: dataset[i] is the i-th sample (in name order)."""

    def __init__(self, path, cluster=None, transform=None):
        self._opened = _Opened(path, cluster)
        self._len = len(self._opened.get())
        self.transform = transform

    def __len__(self):
        return self._len

    def __getitem__(self, i):
        pack = self._opened.get()
        data = pack.read(i)
        label = pack.info(i)[2]
        return self.transform(data, label) if self.transform else (data, label)

    def name(self, i):
        return self._opened.get().name(i)


class PackIterableDataset(_data.IterableDataset):
    """Each epoch a permutation of the pack by (seed, epoch); this rank reads
    order[rank::world_size], split again across DataLoader workers
    (worker w of W reads every W-th of the rank's samples from w on), read
    ahead in that order. state_dict()/load_state_dict() resume an epoch
    after the samples already consumed (counted over this rank's sequence
    as a loader without workers consumes it; with workers the rest of the
    epoch is split among them again, each sample still read once)."""

    def __init__(self, path, cluster=None, seed=0, shuffle=True, rank=None, world_size=None,
                 transform=None, prefetch_threads=4, prefetch_bytes=256 << 20):
        self._opened = _Opened(path, cluster)
        self._len = len(self._opened.get())
        self.seed, self.shuffle, self.transform = seed, shuffle, transform
        if rank is None or world_size is None:
            import torch.distributed as dist
            ready = dist.is_available() and dist.is_initialized()
            rank = dist.get_rank() if ready else 0
            world_size = dist.get_world_size() if ready else 1
        if not 0 <= rank < world_size:
            raise ValueError("rank %d outside world_size %d" % (rank, world_size))
        self.rank, self.world_size = rank, world_size
        self.prefetch_threads, self.prefetch_bytes = prefetch_threads, prefetch_bytes
        self.epoch, self._skip, self._consumed = 0, 0, 0

    def set_epoch(self, epoch):
        self.epoch, self._skip, self._consumed = epoch, 0, 0

    def rank_order(self):
        """This rank's samples this epoch, in order."""
        order = epoch_order(self._len, self.seed, self.epoch, self.shuffle)
        return order[self.rank::self.world_size]

    def __len__(self):
        return len(range(self.rank, self._len, self.world_size))

    def __iter__(self):
        mine = self.rank_order()[self._skip:]
        info = _data.get_worker_info()
        if info is not None:
            mine = mine[info.id::info.num_workers]
        pack = self._opened.get()
        for index, name, label, data in pack.prefetch(
                [int(i) for i in mine], threads=self.prefetch_threads,
                max_bytes=self.prefetch_bytes):
            self._consumed += 1
            yield self.transform(data, label) if self.transform else (data, label)

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "position": self._skip + self._consumed}

    def load_state_dict(self, state):
        self.seed, self.epoch = state["seed"], state["epoch"]
        self._skip, self._consumed = state["position"], 0

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
With `webdataset=True` (a pack made from WebDataset .tar shards) a sample is
all the files of one key, as WebDataset yields it: a dict
{"__key__": "d/s001", "jpg": b"...", "cls": b"3"}, or `transform(dict)`.

Mid-epoch resume with DataLoader workers: PackLoader (a DataLoader) hands
each worker whole batches in turn, so it yields the rank's order exactly,
and its state_dict() counts what it has yielded:

    loader = PackLoader(ds, batch_size=64, num_workers=2)
    ... state = loader.state_dict()      # save with the checkpoint
    ds.load_state_dict(state)            # later: the rest of the epoch
Connections are opened per process (DataLoader workers fork, and a client
does not survive a fork).
"""
import os

import numpy as np
import torch.utils.data as _data

import cistern
from ._cistern import Pack

__all__ = ["PackDataset", "PackIterableDataset", "PackLoader", "epoch_order"]


class _Opened:
    """The pack, opened once per process."""

    def __init__(self, path, cluster):
        self.path, self.cluster = path, cluster
        self._pid, self._pack, self._conn = None, None, None

    def get(self):
        if self._pid != os.getpid():
            # After a fork the parent's objects are dropped: the module
            # leaks, rather than destroys, native objects of another process.
            self._conn = cistern.connect(self.cluster)
            self._pack = Pack(self._conn, self.path)
            self._pid = os.getpid()
        return self._pack

    def __getstate__(self):  # to workers without the parent's connection
        return {"path": self.path, "cluster": self.cluster}

    def __setstate__(self, state):
        self.__init__(state["path"], state["cluster"])


def _webdataset_sample(items):
    """WebDataset's dict of one key's (name, bytes) items: fields lower-cased,
    a field twice is an error (as in WebDataset's group_by_keys)."""
    sample = {}
    for name, data in items:
        key, field = cistern.webdataset_name(name)
        field = field.lower()
        if field in sample:
            raise ValueError("%s: field %r twice in one sample" % (name, field))
        sample["__key__"] = key
        sample[field] = data
    return sample


def epoch_order(size, seed, epoch, shuffle=True):
    """The epoch's order of sample indices: a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(size)


class PackDataset(_data.Dataset):
    """Map-style: dataset[i] is the i-th sample (in name order); with
    webdataset=True, the i-th WebDataset sample (a dict of its fields)."""

    def __init__(self, path, cluster=None, transform=None, webdataset=False):
        self._opened = _Opened(path, cluster)
        self._groups = self._opened.get().webdataset_groups() if webdataset else None
        self._len = len(self._groups) if webdataset else len(self._opened.get())
        self.transform = transform

    def __len__(self):
        return self._len

    def __getitem__(self, i):
        pack = self._opened.get()
        if self._groups is not None:
            begin, end = (int(x) for x in self._groups[i])
            sample = _webdataset_sample((pack.name(j), pack.read(j)) for j in range(begin, end))
            return self.transform(sample) if self.transform else sample
        data = pack.read(i)
        label = pack.info(i)[2]
        return self.transform(data, label) if self.transform else (data, label)

    def name(self, i):
        return self._opened.get().name(i)


class PackIterableDataset(_data.IterableDataset):
    """Each epoch a permutation of the pack by (seed, epoch); this rank reads
    order[rank::world_size], split again across DataLoader workers in
    blocks of `batch_size` (worker w of W reads blocks w, w+W, ...: a
    DataLoader with that batch size then yields the rank's order exactly),
    read ahead in that order. state_dict()/load_state_dict() resume an
    epoch after the samples already consumed: counted here when iterated
    in this process, by PackLoader when DataLoader workers iterate it.
    With webdataset=True the permutation is of WebDataset samples (keys),
    each a dict of its fields."""

    def __init__(self, path, cluster=None, seed=0, shuffle=True, rank=None, world_size=None,
                 transform=None, prefetch_threads=4, prefetch_bytes=256 << 20, batch_size=1,
                 webdataset=False):
        self._opened = _Opened(path, cluster)
        self._groups = self._opened.get().webdataset_groups() if webdataset else None
        self._len = len(self._groups) if webdataset else len(self._opened.get())
        self.batch_size = batch_size
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
        if info is not None and info.num_workers > 1:
            b, w = max(1, self.batch_size or 1), info.num_workers
            blocks = [mine[i:i + b] for i in range(info.id * b, len(mine), w * b)]
            mine = np.concatenate(blocks) if blocks else mine[:0]
        pack = self._opened.get()
        if self._groups is None:
            for index, name, label, data in pack.prefetch(
                    [int(i) for i in mine], threads=self.prefetch_threads,
                    max_bytes=self.prefetch_bytes):
                self._consumed += 1
                yield self.transform(data, label) if self.transform else (data, label)
            return
        # WebDataset samples: their entries read ahead back to back, then
        # gathered again, one key at a time.
        spans = [(int(self._groups[g][0]), int(self._groups[g][1])) for g in mine]
        entries = [i for begin, end in spans for i in range(begin, end)]
        it = pack.prefetch(entries, threads=self.prefetch_threads, max_bytes=self.prefetch_bytes)
        for begin, end in spans:
            items = []
            for _ in range(end - begin):
                _, name, _, data = next(it)
                items.append((name, data))
            self._consumed += 1
            sample = _webdataset_sample(items)
            yield self.transform(sample) if self.transform else sample

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "position": self._skip + self._consumed}

    def load_state_dict(self, state):
        self.seed, self.epoch = state["seed"], state["epoch"]
        self._skip, self._consumed = state["position"], 0


class PackLoader(_data.DataLoader):
    """A DataLoader over a PackIterableDataset that can be resumed mid-epoch
    with any num_workers. It gives the dataset its batch size, so that the
    workers take whole batches in turn and the loader yields the rank's
    order exactly; state_dict() is the dataset's with the position of the
    batches yielded so far (save it with the checkpoint; the dataset's
    load_state_dict() then resumes after them)."""

    def __init__(self, dataset, batch_size=1, **kwargs):
        if not isinstance(dataset, PackIterableDataset):
            raise TypeError("PackLoader takes a PackIterableDataset")
        dataset.batch_size = batch_size or 1
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._from, self._yielded = dataset._skip, 0

    def __iter__(self):
        self._from, self._yielded = self.dataset._skip, 0
        for batch in super().__iter__():
            self._yielded += 1
            yield batch

    def state_dict(self):
        state = self.dataset.state_dict()
        per_batch = self.batch_size or 1
        state["position"] = min(len(self.dataset), self._from + self._yielded * per_batch)
        return state

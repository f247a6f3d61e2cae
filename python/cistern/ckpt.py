"""Checkpoints on cistern (docs/checkpoint_format.md, docs/python.md).

    import cistern.ckpt as ckpt
    h = ckpt.save(model.state_dict(), "/ckpt/step-100", async_=True)
    ...                                   # training goes on while it persists
    h.wait()
    state = ckpt.load(ckpt.latest("/ckpt"))

A state is a nested dict (or list/tuple) of torch tensors, numpy arrays and
small picklable objects (an optimizer's step counts, hyperparameters).
Tensors and arrays go to a safetensors data file; the rest of the structure
is pickled into one more tensor. The checkpoint is listed only once its
manifest is committed, last: a crash leaves the previous one intact and
this one unlisted. save() first copies every tensor into a staging pool in
host memory (bounded: StagingPool(max_bytes); a save waits for room and
counts the wait), then, with async_=True, returns while a thread persists
it with the GIL released.
"""
import json as _json
import logging as _logging
import pickle as _pickle
import threading as _threading
import time as _time

import numpy as _np

try:
    import torch as _torch
except ImportError:  # numpy-only use
    _torch = None

_list = list  # the builtin: this module defines its own list()
_log = _logging.getLogger("cistern.ckpt")

__all__ = ["save", "load", "latest", "list", "delete", "verify", "Handle", "StagingPool"]

_TREE = "__cistern__.tree"  # + ".<rank>": each rank's pickled structure
_SHARD = "@shard."  # name + _SHARD + rank: a rank's dim-0 slice of a tensor


def _is_sharded(name, sharded):
    if sharded is True:
        return True
    if isinstance(sharded, str):
        sharded = [sharded]
    return any(name == p or name.startswith(p + ".") for p in sharded or ())

_TORCH_DTYPES = {}
if _torch is not None:
    _TORCH_DTYPES = {
        _torch.float64: "F64", _torch.float32: "F32", _torch.float16: "F16",
        _torch.bfloat16: "BF16", _torch.int64: "I64", _torch.int32: "I32",
        _torch.int16: "I16", _torch.int8: "I8", _torch.uint8: "U8", _torch.bool: "BOOL",
    }
_TORCH_BY_NAME = {v: k for k, v in _TORCH_DTYPES.items()}
_NUMPY_DTYPES = {
    _np.dtype("float64"): "F64", _np.dtype("float32"): "F32", _np.dtype("float16"): "F16",
    _np.dtype("int64"): "I64", _np.dtype("int32"): "I32", _np.dtype("int16"): "I16",
    _np.dtype("int8"): "I8", _np.dtype("uint8"): "U8", _np.dtype("uint16"): "U16",
    _np.dtype("uint32"): "U32", _np.dtype("uint64"): "U64", _np.dtype("bool"): "BOOL",
}
_NUMPY_BY_NAME = {v: k for k, v in _NUMPY_DTYPES.items()}


class _Ref:
    """A tensor's place in the pickled structure."""

    __slots__ = ("name", "kind")

    def __init__(self, name, kind):
        self.name = name
        self.kind = kind  # "torch" or "numpy"

    def __reduce__(self):
        return (_Ref, (self.name, self.kind))


def _connection(connection):
    if connection is not None:
        return connection
    import cistern
    return cistern.connect()


def _is_tensor(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def _same_kind(x, items):
    """A container like `x` (dict, OrderedDict, list, tuple, namedtuple)
    holding `items`."""
    if isinstance(x, dict):
        try:
            return type(x)(items)
        except TypeError:
            return dict(items)
    if hasattr(x, "_fields"):
        return type(x)(*items)
    try:
        return type(x)(items)
    except TypeError:
        return _list(items)


def _flatten(state):
    """(skeleton, [(name, value)]): tensors and arrays replaced by _Refs
    named by their path ("model.layer.0.weight"; a repeated name gets a
    suffix)."""
    leaves = []
    names = set()

    def name_of(path):
        base = ".".join(str(p) for p in path) or "tensor"
        name, i = base, 1
        while name in names or name.startswith(_TREE):
            name, i = "%s#%d" % (base, i), i + 1
        names.add(name)
        return name

    def walk(x, path):
        if _is_tensor(x):
            if x.dtype not in _TORCH_DTYPES:
                raise TypeError("cistern.ckpt: tensor %s has dtype %s" % (".".join(map(str, path)), x.dtype))
            name = name_of(path)
            leaves.append((name, x))
            return _Ref(name, "torch")
        if isinstance(x, _np.ndarray):
            if x.dtype not in _NUMPY_DTYPES:
                raise TypeError("cistern.ckpt: array %s has dtype %s" % (".".join(map(str, path)), x.dtype))
            name = name_of(path)
            leaves.append((name, x))
            return _Ref(name, "numpy")
        if isinstance(x, dict):
            return _same_kind(x, [(k, walk(v, path + [k])) for k, v in x.items()])
        if isinstance(x, (_list, tuple)):
            return _same_kind(x, [walk(v, path + [i]) for i, v in enumerate(x)])
        return x

    return walk(state, []), leaves


def _note_staging_wait():
    """Counts a wait in this process's metrics (cistern.metrics():
    ckpt_staging_pool_waits_total)."""
    try:
        from cistern._cistern import note_staging_wait
    except ImportError:  # the module alone, without the native client
        return
    note_staging_wait()


class StagingPool:
    """Host memory the tensors of a save are copied into before it returns:
    at most max_bytes allocated at once, in use or kept for the next save
    (pinned when CUDA is available). A save that finds no room waits for an
    earlier one to finish persisting; `waits` counts those waits (and the
    process's metric ckpt_staging_pool_waits_total, cistern.metrics())."""

    def __init__(self, max_bytes=4 << 30):
        self.max_bytes = max_bytes
        self.waits = 0
        self._held = 0   # bytes allocated (in use or free)
        self._free = []  # uint8 arrays to reuse
        self._cv = _threading.Condition()

    def take(self, n):
        """A uint8 array of n bytes (a view of a pooled buffer)."""
        with self._cv:
            if n > self.max_bytes:
                raise ValueError("cistern.ckpt: a save of %d bytes is larger than the staging "
                                 "pool (%d bytes)" % (n, self.max_bytes))
            waited = False
            while True:
                fits = [i for i, b in enumerate(self._free) if b.nbytes >= n]
                if fits:
                    i = min(fits, key=lambda i: self._free[i].nbytes)
                    return self._free.pop(i)[:n]
                if self._held + n <= self.max_bytes:
                    self._held += n
                    return self._alloc(n)[:n]
                if self._free:  # too small to use: make room for a larger one
                    self._held -= self._free.pop().nbytes
                    continue
                if not waited:
                    self.waits += 1
                    waited = True
                    _note_staging_wait()
                    _log.warning("cistern.ckpt: the staging pool (%d MiB) is full; this save "
                                 "waits for earlier ones to persist (%d waits so far)",
                                 self.max_bytes >> 20, self.waits)
                self._cv.wait()

    def _alloc(self, n):
        if _torch is not None:
            pin = _torch.cuda.is_available()
            return _torch.empty(max(n, 1), dtype=_torch.uint8, pin_memory=pin).numpy()
        return _np.empty(max(n, 1), dtype=_np.uint8)

    def give(self, view):
        """Returns what take() gave."""
        with self._cv:
            self._free.append(view.base)
            self._cv.notify_all()


_default_pool = StagingPool()


def _bytes_of(x):
    """A contiguous uint8 numpy view of a tensor's or array's bytes."""
    if _is_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.contiguous().reshape(-1).view(_torch.uint8).numpy()
    a = _np.ascontiguousarray(x)
    return a.reshape(-1).view(_np.uint8)


def _dtype_shape(x):
    if _is_tensor(x):
        return _TORCH_DTYPES[x.dtype], [int(d) for d in x.shape]
    return _NUMPY_DTYPES[x.dtype], [int(d) for d in x.shape]


_COPY_PIECE = 64 << 20
_copier = None
_copier_lock = _threading.Lock()


def _copy_all(pieces):
    """Copies (dst, src) pieces on a few threads (numpy releases the GIL
    for the copy): one core copies ~12 GB/s here, two ~20 GB/s."""
    global _copier
    if len(pieces) <= 1:
        for dst, src in pieces:
            dst[...] = src
        return
    with _copier_lock:
        if _copier is None:
            from concurrent.futures import ThreadPoolExecutor
            _copier = ThreadPoolExecutor(max(1, min(4, _os_cpus())), "cistern-ckpt-copy")
    for f in [_copier.submit(_copy_one, d, s) for d, s in pieces]:
        f.result()


def _copy_one(dst, src):
    if isinstance(dst, _np.ndarray):
        dst[...] = src
    else:
        dst.copy_(src)  # a torch tensor: converting to its dtype


def _downcast_to(v, downcast):
    """The dtype name `v` is stored as when downcast, or None."""
    if downcast is None:
        return None
    if _is_tensor(v):
        if v.dtype not in (_torch.float32, _torch.float64):
            return None
        return "BF16" if downcast == "bf16" else "F16"
    if downcast == "fp16" and v.dtype in (_np.dtype("float32"), _np.dtype("float64")):
        return "F16"
    return None


def _typed_view(dst, dtype, shape, value):
    """The staging bytes `dst` as an array or tensor of `dtype` and `shape`,
    for a converting copy of `value`."""
    if _is_tensor(value):
        t = _torch.from_numpy(dst).view(_TORCH_BY_NAME[dtype])
        return t.view(shape)
    return dst.view(_NUMPY_BY_NAME[dtype]).reshape(shape)


def _os_cpus():
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Handle:
    """A save: wait() returns its stats (or raises its error), done() says
    whether it finished. A synchronous save's handle is finished (its error
    was raised by save())."""

    def __init__(self, fn, run_here=False, finish=None):
        self._result = None
        self._error = None
        self._thread = None
        self._finish = finish  # run by wait() in the caller's thread (the ranks' commit)
        if run_here:
            self._result = fn()
            self._finished()
        else:
            self._thread = _threading.Thread(target=self._run, args=(fn,), daemon=True)
            self._thread.start()

    def _finished(self):
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()

    def _run(self, fn):
        try:
            self._result = fn()
        except BaseException as e:  # re-raised by wait()
            self._error = e

    def done(self):
        """Whether this rank's part persisted (with several ranks, the
        checkpoint commits in wait())."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout=None):
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("cistern.ckpt: the save is still persisting")
        if self._error is not None:
            raise self._error
        self._finished()
        return self._result


def _root_of(path):
    path = path.rstrip("/")
    return path.rsplit("/", 1)[0] or "/"


def _dist():
    return getattr(_torch, "distributed", None) if _torch is not None else None


def _rank_world(rank, world_size, group):
    """(rank, world size): from the arguments, else from torch.distributed
    when it is initialized, else (0, 1)."""
    dist = _dist()
    if rank is None and dist is not None and dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if rank is None:
        return 0, 1
    if world_size is None or not 0 <= rank < world_size:
        raise ValueError("cistern.ckpt: rank %r of %r" % (rank, world_size))
    return rank, world_size


def _ranks(rank, world_size, group):
    """(rank, world size, barrier) as _rank_world says."""
    dist = _dist()
    rank, world_size = _rank_world(rank, world_size, group)
    barrier = None
    if world_size > 1:
        if dist is None or not dist.is_initialized():
            raise ValueError("cistern.ckpt: several ranks need torch.distributed initialized")
        barrier = lambda: dist.barrier(group=group)
    return rank, world_size, barrier


def save(state, path, async_=False, base="auto", keep_last=None, metadata=None,
         connection=None, pool=None, block_bytes=0, rank=None, world_size=None, group=None,
         downcast=None, compression=None, sharded=None):
    """Saves `state` as checkpoint `path` (a new directory of the cluster).

    base: "auto" reuses unchanged tensors of the newest checkpoint next to
    `path` (None: write everything; a path: that one). keep_last=N removes
    the oldest checkpoints next to it beyond N once this one is committed.
    With torch.distributed initialized (or rank= and world_size=), every
    rank saves its own part (a dict; tensor names unique across ranks) and
    rank 0 commits the checkpoint once all have persisted: every rank calls
    save() (and wait(), which holds the ranks' barrier).
    downcast="bf16" or "fp16" stores float32/float64 tensors in that type
    (numpy arrays: "fp16" only), recorded in the manifest and cast back by
    load(). compression="zstd" or "lz4" compresses each tensor on its own
    (the data file is then not a safetensors file; load() reads it).
    sharded: names (prefixes, or True for all) of tensors that each rank
    holds a dim-0 slice of, in rank order; load() joins them and gives each
    rank of any world size its even share.
    Returns a Handle (already finished unless async_)."""
    if compression not in (None, "zstd", "lz4"):
        raise ValueError("cistern.ckpt: compression is None, 'zstd' or 'lz4', not %r"
                         % (compression,))
    if downcast not in (None, "bf16", "fp16"):
        raise ValueError("cistern.ckpt: downcast is None, 'bf16' or 'fp16', not %r" % (downcast,))
    fs = _connection(connection)
    pool = pool or _default_pool
    rank, world, barrier = _ranks(rank, world_size, group)
    if world > 1 and not isinstance(state, dict):
        raise TypeError("cistern.ckpt: with several ranks each saves a dict")
    tree_name = "%s.%d" % (_TREE, rank)
    skeleton, leaves = _flatten(state)
    stored_as = {}  # a sharded tensor's name -> its shard's name
    for name, v in leaves:
        if _is_sharded(name, sharded):
            if len(v.shape) == 0:
                raise ValueError("cistern.ckpt: %s is 0-d and cannot be a shard" % name)
            stored_as[name] = "%s%s%d" % (name, _SHARD, rank)
    tree = _np.frombuffer(_pickle.dumps(skeleton, protocol=_pickle.HIGHEST_PROTOCOL), dtype=_np.uint8)
    # Stage: every tensor's bytes copied into the pool (the blocking part);
    # a downcast one converted on the way.
    casts = {}
    sources = []
    for name, v in leaves:
        dtype, shape = _dtype_shape(v)
        name = stored_as.get(name, name)
        stored = _downcast_to(v, downcast)
        if stored is not None:
            casts[name] = dtype
            n = v.numel() * 2 if _is_tensor(v) else v.size * 2
            sources.append((name, stored, shape, n, v))
        elif _is_tensor(v) and (v.device.type != "cpu" or not v.is_contiguous()):
            # One copy_ into the staging bytes: from a GPU a DMA into the
            # pinned pool, no pageable copy on the way.
            sources.append((name, dtype, shape, v.numel() * v.element_size(), v.detach()))
        else:
            sources.append((name, dtype, shape, _bytes_of(v), None))
    sources.append((tree_name, "U8", [tree.nbytes], tree, None))
    nbytes = lambda src: src if isinstance(src, int) else src.nbytes
    # Each tensor starts 8-byte aligned in the staging buffer (typed views).
    padded = lambda n: (n + 7) & ~7
    staged = pool.take(sum(padded(nbytes(src)) for _, _, _, src, _ in sources))
    try:
        at = 0
        tensors, pieces = [], []
        for name, dtype, shape, src, value in sources:
            n = nbytes(src)
            dst = staged[at:at + n]
            tensors.append((name, dtype, shape, dst))
            if value is not None:  # a converting copy, whole
                pieces.append((_typed_view(dst, dtype, shape, value), value))
            else:
                for off in range(0, n, _COPY_PIECE):
                    pieces.append((dst[off:off + _COPY_PIECE], src[off:off + _COPY_PIECE]))
            at += padded(n)
        _copy_all(pieces)
    except BaseException:
        pool.give(staged)
        raise
    del sources
    root = _root_of(path)
    if base == "auto":
        own = path.rstrip("/").rsplit("/", 1)[-1]
        try:
            names = [n for n in fs.ckpt_list(root) if n != own]
        except FileNotFoundError:  # the first checkpoint under root
            names = []
        base = root.rstrip("/") + "/" + names[-1] if names else None
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    meta["cistern.saved_at"] = "%.3f" % _time.time()
    if casts:  # per rank: commit keeps rank 0's value of a key the ranks share
        meta["cistern.downcast.%d" % rank] = _json.dumps(casts)

    def persist():
        try:  # (the save makes the directory and its parents)
            stats = fs.ckpt_save(path, tensors, base or "", meta, block_bytes, rank, world,
                                 compression or "")
        finally:
            pool.give(staged)
        # Counted without the pickled structure.
        stats["tensors"] -= 1
        if tree_name in stats["reused"]:
            stats["reused"].remove(tree_name)
            stats["tensors_reused"] -= 1
            stats["bytes_reused"] -= tree.nbytes
        else:
            stats["bytes_written"] -= tree.nbytes
        if world == 1:
            retain()
        return stats

    def retain():
        if keep_last:
            for old in fs.ckpt_list(root)[:-keep_last]:
                fs.ckpt_remove(root.rstrip("/") + "/" + old)

    def commit():
        barrier()  # every rank's part persisted
        if rank == 0:
            fs.ckpt_commit(path, world)
            retain()
        barrier()  # committed before any rank goes on

    return Handle(persist, run_here=not async_, finish=commit if world > 1 else None)


def _merge(a, b):
    """The ranks' dicts as one (a's value where both hold a non-dict)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = _same_kind(a, _list(a.items()))
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    return a


class _Shards:
    """A checkpoint's sharded tensors: parts (name -> its shards' stored
    names in rank order) and stored (every shard's stored name)."""

    def __init__(self):
        self.parts = {}
        self.stored = set()


def _shards_of(path, info):
    found = {}
    for stored in info:
        name, sep, index = stored.rpartition(_SHARD)
        if sep and index.isdigit():
            found.setdefault(name, {})[int(index)] = stored
    out = _Shards()
    for name, by_rank in found.items():
        parts = [by_rank.get(i) for i in range(len(by_rank))]
        if None in parts:
            raise ValueError("cistern.ckpt: %s: tensor %s has shards of ranks %s, not 0..%d"
                             % (path, name, sorted(by_rank), len(by_rank) - 1))
        dtype, shape = info[parts[0]][0], info[parts[0]][1]
        for p in parts:
            if info[p][0] != dtype or info[p][1][1:] != shape[1:]:
                raise ValueError("cistern.ckpt: %s: shard %s is %s %s, shard %s %s %s" % (
                    path, p, info[p][0], info[p][1], parts[0], dtype, shape))
        out.parts[name] = parts
        out.stored.update(parts)
    return out


def _flat_targets(into):
    """name -> tensor/array of `into`, named as _flatten names them."""
    if into is None:
        return {}
    _, leaves = _flatten(into)
    return dict(leaves)


def load(path, keys=None, into=None, connection=None, rank=None, world_size=None, group=None):
    """The state saved at `path`. keys: only tensors whose names start with
    one of these (the rest come back as None). into: a state of the same
    structure whose tensors are filled in place (and returned). A tensor
    saved sharded comes back as this rank's even share of the whole (rank,
    world size from the arguments or torch.distributed; alone: all of it)."""
    fs = _connection(connection)
    m = fs.ckpt_manifest(path)
    info = {name: (dtype, shape, n) for name, dtype, shape, n in m["tensors"]}
    trees = sorted((n for n in info if n.startswith(_TREE + ".")),
                   key=lambda n: int(n.rsplit(".", 1)[1]))
    if not trees:
        raise ValueError("cistern.ckpt: %s was not written by cistern.ckpt.save" % path)
    bufs = [_np.empty(info[n][2], dtype=_np.uint8) for n in trees]
    fs.ckpt_read(path, trees, bufs)
    skeleton = _pickle.loads(bufs[0].tobytes())
    for b in bufs[1:]:  # the other ranks' parts
        skeleton = _merge(skeleton, _pickle.loads(b.tobytes()))
    targets = _flat_targets(into)
    casts = {}  # stored name -> the dtype it was saved from (downcast)
    for k, v in m["metadata"].items():
        if k.startswith("cistern.downcast."):
            casts.update(_json.loads(v))
    wanted = lambda name: keys is None or any(name.startswith(k) for k in keys)
    shards = _shards_of(path, info)
    rank, world = _rank_world(rank, world_size, group)
    loaded = {}
    names, buffers = [], []

    def read_into(name):
        dtype, shape, n = info[name]
        if _torch is not None and dtype in _TORCH_BY_NAME:
            t = _torch.empty(shape, dtype=_TORCH_BY_NAME[dtype])
        else:
            t = _np.empty(shape, dtype=_NUMPY_BY_NAME[dtype])
        names.append(name)
        buffers.append(_bytes_of(t) if n else _np.empty(0, dtype=_np.uint8))
        return t

    joins = []  # (logical name, [(tensor, first row to take, rows)])
    for name in info:
        if name.startswith(_TREE) or name in shards.stored or not wanted(name):
            continue
        loaded[name] = read_into(name)
    for name, parts in shards.parts.items():
        if not wanted(name):
            continue
        total = sum(info[p][1][0] for p in parts)
        q, r = divmod(total, world)
        first, rows = rank * q + min(rank, r), q + (1 if rank < r else 0)
        target = targets.get(name)
        want_shape = [rows] + info[parts[0]][1][1:]
        if target is not None and [int(d) for d in target.shape] != want_shape:
            raise ValueError("cistern.ckpt: %s holds %d rows in %d shards; rank %d of %d takes "
                             "rows %d..%d, shape %s, not %s" % (name, total, len(parts), rank, world,
                                                               first, first + rows, want_shape,
                                                               _list(target.shape)))
        pieces, at = [], 0
        for p in parts:
            n = info[p][1][0]
            lo, hi = max(first, at), min(first + rows, at + n)
            if lo < hi or (rows == 0 and not pieces):
                pieces.append((read_into(p), lo - at, max(hi - lo, 0)))
            at += n
        joins.append((name, parts[0], pieces))
    fs.ckpt_read(path, names, buffers)
    for name, stored, pieces in joins:
        parts = [t[lo:lo + n] for t, lo, n in pieces]
        if len(parts) == 1 and parts[0].shape[0] == pieces[0][0].shape[0]:
            loaded[name] = parts[0]  # one whole shard
        else:
            loaded[name] = _torch.cat(parts) if _is_tensor(parts[0]) else _np.concatenate(parts)
        casts.setdefault(name, casts.get(stored))
    for name in loaded:
        if casts.get(name):
            t = loaded[name]
            loaded[name] = (t.to(_TORCH_BY_NAME[casts[name]]) if _is_tensor(t)
                            else t.astype(_NUMPY_BY_NAME[casts[name]]))
    for name, src in loaded.items():
        target = targets.get(name)
        if target is None:
            continue
        if _is_tensor(target):
            target.copy_(src if _is_tensor(src) else _torch.from_numpy(src))
        else:
            target[...] = src.numpy() if _is_tensor(src) else src

    def build(x):
        if isinstance(x, _Ref):
            if x.name not in loaded:
                return None
            if x.name in targets:
                return targets[x.name]
            v = loaded[x.name]
            if x.kind == "numpy" and _is_tensor(v):
                return v.numpy()
            return v
        if isinstance(x, dict):
            return _same_kind(x, [(k, build(v)) for k, v in x.items()])
        if isinstance(x, (_list, tuple)):
            return _same_kind(x, [build(v) for v in x])
        return x

    state = build(skeleton)
    return into if into is not None else state


def list(root, connection=None):  # noqa: A001 (the API's name)
    """Paths of the committed checkpoints under `root`, oldest first."""
    fs = _connection(connection)
    return [root.rstrip("/") + "/" + n for n in fs.ckpt_list(root)]


def latest(root, connection=None):
    """The newest committed checkpoint under `root`, or None."""
    names = list(root, connection)
    return names[-1] if names else None


def delete(path, connection=None):
    """Removes a checkpoint; newer ones that reuse its files keep them."""
    _connection(connection).ckpt_remove(path)


def verify(path, connection=None):
    """Reads every tensor and checks its CRC32C (raises OSError naming the
    first bad one)."""
    _connection(connection).ckpt_verify(path)

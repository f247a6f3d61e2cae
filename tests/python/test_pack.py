"""Packs from Python: reading, lookups, the prefetching iterable dataset's
exactly-once coverage across ranks and DataLoader workers, determinism,
resume, and a flipped byte named."""
import os
import subprocess

import numpy as np
import pytest

import cistern

torch = pytest.importorskip("torch")
from cistern.torch import PackDataset, PackIterableDataset  # noqa: E402

N = 240


@pytest.fixture(scope="module")
def packed(cluster, tmp_path_factory):
    """A pack of N files with distinct random contents, made by `cistern pack`."""
    src = tmp_path_factory.mktemp("src")
    contents = {}
    for i in range(N):
        name = "c%d/s%03d.bin" % (i % 4, i)
        data = os.urandom(100 + (i * 37) % 3000)
        os.makedirs(src / os.path.dirname(name), exist_ok=True)
        (src / name).write_bytes(data)
        contents[name] = data
    env = dict(os.environ, CISTERN_CLUSTER=cluster)
    subprocess.run([os.environ["CISTERN_BIN"], "pack", "--shard-mib", "1", str(src), "/packs/t"],
                   check=True, env=env, capture_output=True)
    return "/packs/t", contents


def test_pack_reads_finds_and_reads_into_buffers(fs, packed):
    path, contents = packed
    p = cistern.Pack(fs, path)
    assert len(p) == N
    names = sorted(contents)
    for i in (0, 17, N - 1):
        assert p.name(i) == names[i]
        assert p.read(i) == contents[names[i]]
        name, length, label, mtime = p.info(i)
        assert (name, length, label) == (names[i], len(contents[names[i]]), None)
        buf = np.zeros(length, dtype=np.uint8)
        assert p.readinto(i, buf) == length
        assert buf.tobytes() == contents[names[i]]
    assert p.find(names[5]) == 5
    assert p.find("absent") is None
    assert p.name(-1) == names[-1]
    with pytest.raises(IndexError):
        p.read(N)
    with pytest.raises(FileNotFoundError):
        cistern.Pack(fs, "/packs/none")
    p.verify()


def samples_of(ds, workers):
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    return [bytes(x) for x, _ in loader]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_every_sample_exactly_once_per_epoch(cluster, packed, world, workers):
    _, contents = packed
    seen = []
    for rank in range(world):
        ds = PackIterableDataset("/packs/t", cluster=cluster, seed=3, rank=rank, world_size=world,
                                 prefetch_bytes=64 << 10)
        ds.set_epoch(1)
        got = samples_of(ds, workers)
        assert len(got) == len(ds)
        seen += got
    assert sorted(seen) == sorted(contents.values())


def test_order_is_fixed_by_seed_and_epoch(cluster, packed):
    def run(seed, epoch):
        ds = PackIterableDataset("/packs/t", cluster=cluster, seed=seed, rank=0, world_size=1)
        ds.set_epoch(epoch)
        return [x for x, _ in ds]

    a = run(7, 0)
    assert a == run(7, 0)
    assert a != run(7, 1)
    assert a != run(8, 0)
    assert sorted(a) == sorted(run(7, 1))


def test_resume_mid_epoch_equals_an_uninterrupted_run(cluster, packed):
    full = PackIterableDataset("/packs/t", cluster=cluster, seed=5, rank=1, world_size=2)
    full.set_epoch(2)
    whole = [x for x, _ in full]
    first = PackIterableDataset("/packs/t", cluster=cluster, seed=5, rank=1, world_size=2)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it)[0] for _ in range(37)]
    state = first.state_dict()
    assert state == {"seed": 5, "epoch": 2, "position": 37}
    second = PackIterableDataset("/packs/t", cluster=cluster, seed=0, rank=1, world_size=2)
    second.load_state_dict(state)
    assert head + [x for x, _ in second] == whole


def test_map_style_dataset_with_a_distributed_sampler(cluster, packed):
    _, contents = packed
    seen = []
    for rank in range(2):
        ds = PackDataset("/packs/t", cluster=cluster, transform=lambda data, label: data)
        sampler = torch.utils.data.distributed.DistributedSampler(
            ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2)
        seen += [bytes(x) for x in loader]
    assert sorted(seen) == sorted(contents.values())


def test_a_flipped_byte_is_detected_and_named(fs, packed, cluster, tmp_path):
    # A copy of the pack with one byte of a shard flipped.
    path, _ = packed
    fs.makedirs("/packs/bad", exist_ok=True)
    for name in fs.listdir(path):
        with fs.open(path + "/" + name) as src, fs.open("/packs/bad/" + name, "wb") as dst:
            dst.write(src.read())
    p = cistern.Pack(fs, "/packs/bad")
    name, length, _, _ = p.info(3)
    with fs.open("/packs/bad/shard-00000.dat", "r+b") as f:
        data = bytearray(f.read())
        at = data.find(p.read(3))
        data[at + length // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    p = cistern.Pack(fs, "/packs/bad")
    with pytest.raises(OSError) as e:
        p.read(3)
    assert name in str(e.value) and "checksum" in str(e.value)
    with pytest.raises(OSError) as e:
        p.verify()
    assert name in str(e.value)
    ds = PackIterableDataset("/packs/bad", cluster=cluster, shuffle=False, rank=0, world_size=1)
    with pytest.raises(OSError):
        list(ds)

"""Packs from Python: reading, lookups, the prefetching iterable dataset's
exactly-once coverage across ranks and DataLoader workers, determinism,
resume (with and without workers), a flipped byte named, and packs made
from WebDataset tar shards."""
import io
import os
import re
import subprocess
import tarfile

import numpy as np
import pytest

import cistern

torch = pytest.importorskip("torch")
from cistern.torch import PackDataset, PackIterableDataset, PackLoader  # noqa: E402

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


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_resume_with_workers_equals_an_uninterrupted_run(cluster, packed, workers):
    def loader_of(ds):
        return PackLoader(ds, batch_size=8, num_workers=workers,
                          collate_fn=lambda batch: [bytes(x) for x, _ in batch])

    full = PackIterableDataset("/packs/t", cluster=cluster, seed=9, rank=0, world_size=2)
    full.set_epoch(4)
    whole = [x for batch in loader_of(full) for x in batch]
    # The loader yields the rank's order exactly, whatever the worker count.
    reference = PackIterableDataset("/packs/t", cluster=cluster, seed=9, rank=0, world_size=2)
    reference.set_epoch(4)
    assert whole == [bytes(x) for x, _ in reference]
    first = PackIterableDataset("/packs/t", cluster=cluster, seed=9, rank=0, world_size=2)
    first.set_epoch(4)
    loader = loader_of(first)
    head = []
    for batch in loader:
        head += batch
        if len(head) == 5 * 8:
            break
    state = loader.state_dict()
    assert state == {"seed": 9, "epoch": 4, "position": 40}
    del loader
    second = PackIterableDataset("/packs/t", cluster=cluster, seed=0, rank=0, world_size=2)
    second.load_state_dict(state)
    rest = [x for batch in loader_of(second) for x in batch]
    assert head + rest == whole


# WebDataset's reading of tar shards, written here from its definition (the
# webdataset package is not in Debian): regular members in archive order,
# top-level "__*__" files skipped, the key and field split by its regex,
# consecutive members of one key grouped, fields lower-cased.
WDS_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def webdataset_samples_of_tars(paths):
    samples = []
    for path in paths:
        current = None
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isreg():
                    continue
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue
                m = WDS_NAME.match(name)
                if not m:
                    continue
                key, field = m.group(1), m.group(2).lower()
                if current is None or current["__key__"] != key:
                    current = {"__key__": key}
                    samples.append(current)
                current[field] = tar.extractfile(member).read()
    return samples


@pytest.fixture(scope="module")
def webdataset(cluster, tmp_path_factory):
    """Three WebDataset shards (one gzipped) packed by `cistern pack`."""
    d = tmp_path_factory.mktemp("wds")
    paths = []
    for shard in range(3):
        path = d / ("train-%06d.tar%s" % (shard, ".gz" if shard == 2 else ""))
        with tarfile.open(path, "w:gz" if shard == 2 else "w") as tar:
            def add(name, data):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            add("__info%d__" % shard, b"not a sample")
            for i in range(40):
                key = "./part%d/s%04d" % (shard, i)
                add(key + ".jpg", os.urandom(50 + i * 13))
                add(key + ".cls", b"%d" % (i % 7))
                if i % 3 == 0:
                    add(key + ".seg.PNG", os.urandom(20))
            add("part%d/README" % shard, b"no key: skipped")
        paths.append(str(path))
    env = dict(os.environ, CISTERN_CLUSTER=cluster)
    subprocess.run([os.environ["CISTERN_BIN"], "pack", *paths, "/packs/wds"],
                   check=True, env=env, capture_output=True)
    return "/packs/wds", paths


def test_a_webdataset_pack_gives_the_samples_the_tars_give(cluster, webdataset):
    path, tars = webdataset
    expected = sorted(webdataset_samples_of_tars(tars), key=lambda s: s["__key__"])
    assert len(expected) == 120 and "seg.png" in expected[0]
    ds = PackDataset(path, cluster=cluster, webdataset=True)
    assert [ds[i] for i in range(len(ds))] == expected
    # The iterable dataset: each sample once per epoch over ranks and workers.
    seen = []
    for rank in range(2):
        it = PackIterableDataset(path, cluster=cluster, seed=1, rank=rank, world_size=2,
                                 webdataset=True)
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
        seen += list(loader)
    assert sorted(seen, key=lambda s: s["__key__"]) == expected


def test_bad_tar_input_is_refused_with_a_clear_error(cluster, tmp_path):
    env = dict(os.environ, CISTERN_CLUSTER=cluster)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive" * 100)
    r = subprocess.run([os.environ["CISTERN_BIN"], "pack", str(bad), "/packs/bad-tar"],
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "bad.tar" in r.stderr and "archive" in r.stderr
    # The same member in two shards: refused, naming it, no pack written.
    for n in ("a.tar", "b.tar"):
        with tarfile.open(tmp_path / n, "w") as tar:
            info = tarfile.TarInfo("s1.jpg")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    r = subprocess.run([os.environ["CISTERN_BIN"], "pack", str(tmp_path / "a.tar"),
                        str(tmp_path / "b.tar"), "/packs/dup"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0 and '"s1.jpg" added twice' in r.stderr
    with pytest.raises(FileNotFoundError):
        cistern.Pack(cistern.connect(cluster), "/packs/dup")

"""The mount's directory view of a pack (`<pack>/.view`): the same tree as
the packed directory through os.walk, stat and reads (a sample over 1 MiB
read by range included), torchvision's ImageFolder and a DataLoader over
it, every change refused with EROFS, and a new generation shown after an
append."""
import errno
import os
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("torchvision.datasets")


def pack(cluster, src, dst, *extra):
    env = dict(os.environ, CISTERN_CLUSTER=cluster)
    subprocess.run([os.environ["CISTERN_BIN"], "pack", *extra, str(src), dst], check=True,
                   env=env, capture_output=True)


@pytest.fixture(scope="module")
def tree(cluster, mnt, tmp_path_factory):
    """An ImageFolder-style tree (4 classes, a nested directory, a 9 MiB
    sample) packed at /views/t; returns (local source, the view)."""
    src = tmp_path_factory.mktemp("tree")
    for c in range(4):
        for i in range(60):
            d = src / ("class%d" % c) / ("nested" if i % 10 == 0 else "")
            d.mkdir(parents=True, exist_ok=True)
            (d / ("img %03d.jpg" % i)).write_bytes(os.urandom(200 + (c * 97 + i * 31) % 5000))
    (src / "class1" / "large.jpg").write_bytes(os.urandom(9 << 20))
    os.utime(src / "class0" / "img 001.jpg", ns=(1_600_000_000_123_456_789,) * 2)
    pack(cluster, src, "/views/t", "--shard-mib", "4")
    return src, os.path.join(mnt, "views", "t", ".view")


def walk(root):
    out = {}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        out[rel] = (sorted(dirs), sorted(files))
    return out


def test_the_view_is_the_packed_tree(tree, mnt):
    src, view = tree
    assert walk(view) == walk(src)
    for rel in ("class0/img 001.jpg", "class3/nested/img 050.jpg", "class1/large.jpg"):
        a, b = os.stat(os.path.join(src, rel)), os.stat(os.path.join(view, rel))
        assert b.st_size == a.st_size
        assert b.st_mode & 0o777 == 0o444
        with open(os.path.join(view, rel), "rb") as f:
            assert f.read() == open(os.path.join(src, rel), "rb").read()
    assert os.stat(os.path.join(view, "class0/img 001.jpg")).st_mtime_ns == 1_600_000_000_123_456_789
    assert os.path.isdir(os.path.join(view, "class2/nested"))
    # A large sample read by range, out of order too.
    want = open(os.path.join(src, "class1/large.jpg"), "rb").read()
    with open(os.path.join(view, "class1/large.jpg"), "rb", buffering=0) as f:
        f.seek(5 << 20)
        assert f.read(1 << 20) == want[5 << 20:6 << 20]
        f.seek(123)
        assert f.read(4567) == want[123:123 + 4567]
    # Hidden from the pack directory's listing; absent names are ENOENT.
    assert ".view" not in os.listdir(os.path.join(mnt, "views", "t"))
    for absent in ("class0/none.jpg", "class9", "class9/x.jpg", "class0/nested/none"):
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(view, absent))
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mnt, "views", ".view"))  # not a pack
    with pytest.raises(NotADirectoryError):
        os.listdir(os.path.join(view, "class0/img 001.jpg"))


def test_every_change_is_refused_with_erofs(tree):
    _, view = tree
    f = os.path.join(view, "class0/img 002.jpg")
    attempts = [
        lambda: open(f, "r+b"),
        lambda: open(os.path.join(view, "new.jpg"), "wb"),
        lambda: os.mkdir(os.path.join(view, "d")),
        lambda: os.remove(f),
        lambda: os.rmdir(os.path.join(view, "class0/nested")),
        lambda: os.rename(f, os.path.join(view, "class0/moved.jpg")),
        lambda: os.chmod(f, 0o644),
        lambda: os.truncate(f, 0),
        lambda: os.symlink("x", os.path.join(view, "link")),
        lambda: os.setxattr(f, "user.k", b"v"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert os.listxattr(f) == []
    assert os.path.getsize(f) > 0


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_imagefolder_and_a_dataloader_over_the_view(tree):
    src, view = tree
    local = datasets.ImageFolder(str(src), loader=read_bytes)
    packed = datasets.ImageFolder(view, loader=read_bytes)
    assert packed.classes == local.classes
    assert [(os.path.relpath(p, view), t) for p, t in packed.samples] == \
        [(os.path.relpath(p, str(src)), t) for p, t in local.samples]
    loader = torch.utils.data.DataLoader(packed, batch_size=None, num_workers=2)
    got = [(bytes(x), int(t)) for x, t in loader]
    assert got == [(local[i][0], local[i][1]) for i in range(len(local))]


def test_an_append_shows_after_the_entry_timeout(cluster, mnt, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    (one / "a.txt").write_bytes(b"first")
    pack(cluster, one, "/views/g")
    view = os.path.join(mnt, "views", "g", ".view")
    assert os.listdir(view) == ["a.txt"]
    two = tmp_path / "two"
    two.mkdir()
    (two / "b.txt").write_bytes(b"second")
    (two / "a.txt").write_bytes(b"replaced")
    pack(cluster, two, "/views/g", "--append")
    time.sleep(1.5)  # the mount's entry_timeout for `.view`
    assert sorted(os.listdir(view)) == ["a.txt", "b.txt"]
    assert read_bytes(os.path.join(view, "a.txt")) == b"replaced"

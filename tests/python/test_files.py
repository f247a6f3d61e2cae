"""The cistern module's file and directory calls against a real `cistern up`."""
import errno
import os
import stat
import threading

import numpy as np
import pytest

import cistern


def test_import_and_connect_errors():
    with pytest.raises(OSError) as e:
        cistern.connect("127.0.0.1:1", retry_ms=200)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNREFUSED, errno.ETIMEDOUT)


def test_write_read_seek_tell_round_trip(fs):
    fs.makedirs("/t/rw", exist_ok=True)
    data = os.urandom(3 << 20) + b"tail"
    with fs.open("/t/rw/a.bin", "wb") as f:
        assert f.write(data[:1000]) == 1000
        assert f.tell() == 1000
        assert f.write(memoryview(data)[1000:]) == len(data) - 1000
    with fs.open("/t/rw/a.bin") as f:
        assert f.read() == data
        assert f.read() == b""
        assert f.seek(10) == 10
        assert f.read(5) == data[10:15]
        assert f.seek(-4, 2) == len(data) - 4
        assert f.read() == b"tail"
        assert f.seek(-2, 1) == len(data) - 2
        assert f.pread(3, 7) == data[7:10]
        assert f.tell() == len(data) - 2, "pread does not move the position"
    assert fs.stat("/t/rw/a.bin").st_size == len(data)


def test_append_and_read_write_modes(fs):
    fs.makedirs("/t/modes", exist_ok=True)
    with fs.open("/t/modes/a", "wb") as f:
        f.write(b"one")
    with fs.open("/t/modes/a", "ab") as f:
        f.write(b"two")
    with fs.open("/t/modes/a", "r+b") as f:
        f.seek(1)
        f.write(b"X")
        f.seek(0)
        assert f.read() == b"oXetwo"
    with pytest.raises(FileExistsError):
        fs.open("/t/modes/a", "xb")
    with fs.open("/t/modes/a", "wb") as f:  # truncates
        pass
    assert fs.stat("/t/modes/a").st_size == 0
    with pytest.raises(ValueError):
        fs.open("/t/modes/a", "r")  # text mode: refused with a clear message
    with pytest.raises(ValueError):
        fs.open("/t/modes/a", "q")


def test_readinto_numpy_bytearray_memoryview_without_copy(fs):
    fs.makedirs("/t/into", exist_ok=True)
    data = np.arange(1 << 18, dtype=np.uint32)  # 1 MiB
    with fs.open("/t/into/arr", "wb") as f:
        f.write(data)  # any buffer, no tobytes()
    out = np.zeros_like(data)
    with fs.open("/t/into/arr") as f:
        assert f.readinto(out) == data.nbytes
    assert np.array_equal(out, data)
    ba = bytearray(100)
    with fs.open("/t/into/arr") as f:
        assert f.preadinto(ba, 4) == 100
        assert f.tell() == 0
    assert bytes(ba) == data.tobytes()[4:104]
    mv = memoryview(bytearray(8))
    with fs.open("/t/into/arr") as f:
        f.seek(8)
        assert f.readinto(mv) == 8
    assert bytes(mv) == data.tobytes()[8:16]
    with fs.open("/t/into/arr") as f:
        with pytest.raises(ValueError):
            f.readinto(np.zeros((4, 4), dtype=np.uint8)[:, ::2])  # not contiguous
        with pytest.raises(TypeError):
            f.readinto(b"read-only bytes")


def test_readinto_torch_tensor(fs):
    torch = pytest.importorskip("torch")
    fs.makedirs("/t/torch", exist_ok=True)
    data = torch.arange(1 << 16, dtype=torch.float32)
    with fs.open("/t/torch/t", "wb") as f:
        f.write(data.numpy())
    out = torch.empty(1 << 16, dtype=torch.float32)
    with fs.open("/t/torch/t") as f:
        assert f.readinto(out.numpy()) == 4 << 16  # the tensor's own memory
    assert torch.equal(out, data)


def test_errors_are_the_right_oserror_subclasses(fs):
    with pytest.raises(FileNotFoundError) as e:
        fs.open("/t/none/such", "rb")
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == "/t/none/such"
    with pytest.raises(FileNotFoundError):
        fs.stat("/t/missing")
    with pytest.raises(FileNotFoundError):
        fs.remove("/t/missing")
    fs.makedirs("/t/err/d", exist_ok=True)
    with pytest.raises(IsADirectoryError):
        fs.open("/t/err/d", "wb")
    with pytest.raises(FileExistsError):
        fs.makedirs("/t/err/d")
    with fs.open("/t/err/f", "wb") as f:
        f.write(b"x")
    with pytest.raises(NotADirectoryError):
        fs.listdir("/t/err/f")
    with fs.open("/t/err/d/x", "wb"):
        pass
    with pytest.raises(OSError) as e:
        fs.rmdir("/t/err/d")
    assert e.value.errno == errno.ENOTEMPTY
    f = fs.open("/t/err/f", "rb")
    with pytest.raises(OSError) as e:
        f.write(b"no")
    assert e.value.errno == errno.EBADF
    f.close()
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    f.close()  # twice: as Python's files


def test_permission_error_for_another_user(fs, cluster):
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    fs.makedirs("/t/perm", exist_ok=True)
    with fs.open("/t/perm/secret", "wb", perms=0o600) as f:
        f.write(b"s")
    pid = os.fork()
    if pid == 0:  # another user's process: the client acts as its uid
        os.setgid(65534)
        os.setuid(65534)
        try:
            cistern.connect(cluster).open("/t/perm/secret", "rb")
            os._exit(1)
        except PermissionError:
            os._exit(0)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_directories_listdir_scandir_walk_rename_remove(fs):
    fs.makedirs("/t/tree/a/b", exist_ok=True)
    for p in ["/t/tree/x", "/t/tree/a/y", "/t/tree/a/b/z"]:
        with fs.open(p, "wb") as f:
            f.write(p.encode())
    assert fs.listdir("/t/tree") == ["a", "x"]
    entries = {e.name: e for e in fs.scandir("/t/tree")}
    assert entries["a"].is_dir() and not entries["a"].is_file()
    assert entries["x"].is_file() and entries["x"].stat().st_size == len("/t/tree/x")
    assert entries["x"].path == "/t/tree/x"
    walked = list(fs.walk("/t/tree"))
    assert walked == [("/t/tree", ["a"], ["x"]), ("/t/tree/a", ["b"], ["y"]),
                      ("/t/tree/a/b", [], ["z"])]
    fs.rename("/t/tree/x", "/t/tree/a/x2")
    assert fs.exists("/t/tree/a/x2") and not fs.exists("/t/tree/x")
    fs.remove("/t/tree/a/x2")
    assert not fs.exists("/t/tree/a/x2")
    st = fs.stat("/t/tree/a")
    assert stat.S_ISDIR(st.st_mode)
    assert fs.isdir("/t/tree/a") and fs.isfile("/t/tree/a/y")
    fs.truncate("/t/tree/a/y", 2)
    assert fs.stat("/t/tree/a/y").st_size == 2


def test_the_gil_is_released_during_io(fs):
    fs.makedirs("/t/gil", exist_ok=True)
    data = os.urandom(8 << 20)
    with fs.open("/t/gil/big", "wb") as f:
        f.write(data)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for _ in range(5):
            with fs.open("/t/gil/big") as f:
                assert len(f.read()) == len(data)
    finally:
        stop.set()
        t.join()
    assert len(ticks) > 1000, "a Python thread ran while reads were under way"

"""cistern.ckpt against the `cistern up` of conftest.py: exact round trips of
every dtype (0-d, empty and non-contiguous tensors too), nested states with
objects, the data file read by a safetensors reader written here from the
format's description, asynchronous saves, incremental saves, retention,
removal that keeps newer checkpoints, corruption named, a SIGKILL during an
asynchronous persist."""
import json
import os
import signal
import struct
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

import cistern
import cistern.ckpt as ckpt


@pytest.fixture()
def root(fs):
    path = "/ckpt-" + uuid.uuid4().hex[:8]
    fs.mkdir(path)
    return path


def state_of_every_kind():
    g = torch.Generator().manual_seed(7)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "f16": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(4, 2, generator=g).bfloat16(),
        "i64": torch.arange(10, dtype=torch.int64),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2],
        "transposed": torch.randn(3, 4, generator=g).t(),
        "np": np.arange(12, dtype=np.int32).reshape(3, 4),
        "nested": {"lr": 0.1, "name": "adam", "blob": b"\x00\x01bytes", 3: torch.ones(2)},
        "list": [torch.zeros(1), (1, 2), None],
    }


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        assert np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def read_safetensors(raw):
    """A safetensors reader from the format's description: u64 header
    length, JSON header, tensors by data_offsets in the buffer."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    buf = raw[8 + n:]
    types = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
             "I8": np.int8, "BOOL": np.bool_, "U8": np.uint8}
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] not in types:
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(buf[b:e], dtype=types[t["dtype"]]).reshape(t["shape"])
    return out


def test_every_kind_of_state_round_trips_exactly(fs, root):
    state = state_of_every_kind()
    h = ckpt.save(state, root + "/step-1", connection=fs)
    assert h.done()
    stats = h.wait()
    assert stats["tensors_reused"] == 0
    assert_same(state, ckpt.load(root + "/step-1", connection=fs))
    assert ckpt.list(root, connection=fs) == [root + "/step-1"]
    assert ckpt.latest(root, connection=fs) == root + "/step-1"
    ckpt.verify(root + "/step-1", connection=fs)


def test_the_data_file_is_plain_safetensors(fs, root):
    state = {"w": torch.randn(8, 3), "n": np.arange(5, dtype=np.int64), "q": torch.tensor([1, -2], dtype=torch.int8)}
    ckpt.save(state, root + "/s", connection=fs)
    with fs.open(root + "/s/rank-00000.safetensors") as f:
        tensors = read_safetensors(f.read())
    assert np.array_equal(tensors["w"], state["w"].numpy())
    assert np.array_equal(tensors["n"], state["n"])
    assert np.array_equal(tensors["q"], state["q"].numpy())


def test_an_async_save_returns_before_it_persists_and_load_fills_in_place(fs, root):
    state = {"model": {"w%d" % i: torch.randn(256, 256) for i in range(8)}}
    saved = {k: v.clone() for k, v in state["model"].items()}
    h = ckpt.save(state, root + "/a", async_=True, connection=fs)
    # The state may change at once: the save copied it.
    for t in state["model"].values():
        t.add_(1)
    h.wait()
    assert h.done()
    into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    out = ckpt.load(root + "/a", into=into, connection=fs)
    assert out is into
    for k, v in saved.items():
        assert torch.equal(into["model"][k], v)
    part = ckpt.load(root + "/a", keys=["model.w3"], connection=fs)
    assert torch.equal(part["model"]["w3"], saved["w3"])
    assert part["model"]["w2"] is None


def test_incremental_saves_write_only_what_changed_and_removal_keeps_newer_ones(fs, root):
    state = {"w%d" % i: torch.randn(128, 1024) for i in range(10)}
    ckpt.save(state, root + "/s1", connection=fs)
    state["w3"][0, 0] += 1
    stats = ckpt.save(state, root + "/s2", connection=fs).wait()  # base="auto": s1
    one = state["w3"].numel() * 4
    assert stats["tensors_reused"] == 9
    assert stats["bytes_written"] == one
    assert stats["bytes_written"] <= 0.15 * (stats["bytes_written"] + stats["bytes_reused"])
    ckpt.delete(root + "/s1", connection=fs)
    assert ckpt.list(root, connection=fs) == [root + "/s2"]
    assert_same(state, ckpt.load(root + "/s2", connection=fs))
    full = ckpt.save(state, root + "/s3", base=None, connection=fs).wait()
    assert full["tensors_reused"] == 0


def test_keep_last_removes_the_oldest(fs, root):
    for i in range(5):
        ckpt.save({"step": torch.tensor(i), "w": torch.full((100,), float(i))},
                  root + "/step-%d" % i, keep_last=2, connection=fs)
    assert ckpt.list(root, connection=fs) == [root + "/step-3", root + "/step-4"]
    assert ckpt.load(root + "/step-4", connection=fs)["step"].item() == 4
    assert ckpt.load(root + "/step-3", connection=fs)["w"][0].item() == 3.0


def test_a_flipped_byte_is_named_and_bad_input_refused(fs, root):
    ckpt.save({"weights": torch.randn(64)}, root + "/c", connection=fs)
    with fs.open(root + "/c/rank-00000.safetensors", "r+b") as f:
        raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        f.seek(8 + n + 10)
        f.write(bytes([raw[8 + n + 10] ^ 0x20]))
    with pytest.raises(OSError, match="weights"):
        ckpt.load(root + "/c", connection=fs)
    with pytest.raises(OSError, match="weights"):
        ckpt.verify(root + "/c", connection=fs)
    with pytest.raises(FileExistsError):
        ckpt.save({"x": torch.zeros(1)}, root + "/c", connection=fs)
    with pytest.raises(TypeError, match="complex"):
        ckpt.save({"z": torch.zeros(2, dtype=torch.complex64)}, root + "/z", connection=fs)
    with pytest.raises(FileNotFoundError):
        ckpt.load(root + "/none", connection=fs)
    pool = ckpt.StagingPool(max_bytes=1024)
    with pytest.raises(ValueError, match="staging pool"):
        ckpt.save({"big": torch.zeros(4096)}, root + "/big", pool=pool, connection=fs)


CHILD = r"""
import os, sys, torch, cistern, cistern.ckpt as ckpt
fs = cistern.connect(sys.argv[1])
root = sys.argv[2]
h = ckpt.save({"w": torch.full((64 << 20,), 2.0)}, root + "/new", async_=True, base=None, connection=fs)
print("staged", flush=True)
h.wait()
print("persisted", flush=True)
"""


def test_a_sigkill_during_an_async_persist_leaves_the_previous_checkpoint(fs, cluster, root):
    old = {"w": torch.full((1000,), 1.0)}
    ckpt.save(old, root + "/old", connection=fs)
    p = subprocess.Popen([sys.executable, "-c", CHILD, cluster, root], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "staged"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert ckpt.list(root, connection=fs) == [root + "/old"]
    assert_same(old, ckpt.load(root + "/old", connection=fs))
    # The next save of that name clears what the killed one left.
    ckpt.save({"w": torch.ones(3)}, root + "/new", connection=fs)
    assert ckpt.latest(root, connection=fs) == root + "/new"


RANK = r"""
import json, sys, torch, torch.distributed as dist, cistern, cistern.ckpt as ckpt
cluster, root, port, rank, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=world)
fs = cistern.connect(cluster)
layers = {str(2 * rank + i): torch.full((1000,), float(10 * rank + i)) for i in range(2)}
h = ckpt.save({"layers": layers}, root + "/step-1", async_=True, connection=fs)
first = h.wait()
if rank == 1:
    layers["2"] += 1
second = ckpt.save({"layers": layers}, root + "/step-2", connection=fs).wait()
print(json.dumps([first["tensors_reused"], second["tensors_reused"]]), flush=True)
# A dim-0 sharded tensor: rank r holds rows of the whole (2, 3, 4 rows).
rows = torch.arange(sum(range(2, 2 + rank)), sum(range(2, 3 + rank)), dtype=torch.float32)
w = (rows[:, None] * 10 + torch.arange(4)).t().contiguous().t()  # non-contiguous
ckpt.save({"w": w, "step": 7}, root + "/step-3", sharded=["w"], downcast="bf16",
          connection=fs).wait()
dist.destroy_process_group()
"""


def test_ranks_save_their_parts_and_any_world_size_loads_them(fs, cluster, root):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    world = 3
    procs = [subprocess.Popen([sys.executable, "-c", RANK, cluster, root, port, str(r), str(world)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    reused = [json.loads(out) for out, _ in outs]
    assert [r[0] for r in reused] == [0, 0, 0]
    assert [r[1] for r in reused] == [2, 1, 2]  # rank 1 changed one of its two
    assert ckpt.list(root, connection=fs) == [root + "/step-1", root + "/step-2",
                                               root + "/step-3"]
    # One process (a world of 1) loads all of it; a part by keys.
    state = ckpt.load(root + "/step-2", connection=fs)
    assert sorted(state["layers"], key=int) == [str(i) for i in range(6)]
    for i in range(6):
        r, k = divmod(i, 2)
        want = float(10 * r + k) + (1 if i == 2 else 0)
        assert torch.equal(state["layers"][str(i)], torch.full((1000,), want))
    part = ckpt.load(root + "/step-2", keys=["layers.4", "layers.5"], connection=fs)
    assert part["layers"]["3"] is None and part["layers"]["4"][0].item() == 20.0
    # The sharded tensor re-sharded: 9 rows saved by 3 ranks; alone, all of
    # them; rank r of 2 its even share (5 + 4 rows), filled in place.
    whole = torch.arange(9, dtype=torch.float32)[:, None] * 10 + torch.arange(4)
    alone = ckpt.load(root + "/step-3", connection=fs)
    assert alone["step"] == 7 and alone["w"].dtype == torch.float32
    assert torch.equal(alone["w"], whole)
    for r, (lo, hi) in enumerate([(0, 5), (5, 9)]):
        mine = {"w": torch.zeros(hi - lo, 4), "step": 0}
        got = ckpt.load(root + "/step-3", into=mine, rank=r, world_size=2, connection=fs)
        assert got is mine and torch.equal(mine["w"], whole[lo:hi])
    four = [ckpt.load(root + "/step-3", rank=r, world_size=4, connection=fs)["w"] for r in range(4)]
    assert [len(t) for t in four] == [3, 2, 2, 2] and torch.equal(torch.cat(four), whole)
    with pytest.raises(ValueError, match="w holds 9 rows in 3 shards; rank 1 of 2"):
        ckpt.load(root + "/step-3", into={"w": torch.zeros(5, 4)}, rank=1, world_size=2,
                  connection=fs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_gpu_tensors_stage_into_pinned_memory_and_load_into_gpu_tensors(fs, root):
    state = {"w": torch.randn(1000, 100, device="cuda"), "t": torch.randn(50, device="cuda").t()}
    pool = ckpt.StagingPool(64 << 20)
    ckpt.save(state, root + "/gpu", pool=pool, connection=fs)
    into = {"w": torch.zeros(1000, 100, device="cuda"), "t": torch.zeros(50, device="cuda")}
    ckpt.load(root + "/gpu", into=into, connection=fs)
    assert torch.equal(into["w"], state["w"]) and torch.equal(into["t"], state["t"])
    back = ckpt.load(root + "/gpu", connection=fs)
    assert torch.equal(back["w"], state["w"].cpu())


def test_the_cli_lists_shows_verifies_and_removes(fs, cluster, root):
    cli = [os.environ["CISTERN_BIN"], "ckpt"]
    run = lambda *a: subprocess.run(cli + list(a) + ["--cluster", cluster], capture_output=True,
                                    text=True)
    ckpt.save({"w": torch.ones(1000), "b": torch.zeros(3, dtype=torch.int64)}, root + "/s1",
              metadata={"step": 1}, connection=fs)
    ckpt.save({"w": torch.ones(1000), "b": torch.ones(3, dtype=torch.int64)}, root + "/s2",
              connection=fs)
    out = run("ls", root)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and " s1 " in lines[0] and "(base s1)" in lines[1]
    show = run("show", root + "/s2")
    assert show.returncode == 0, show.stderr
    assert "w  F32  [1000]" in show.stdout and " in s1" in show.stdout
    assert "metadata step = 1" in run("show", root + "/s1").stdout
    ok = run("verify", root + "/s2")
    assert ok.returncode == 0 and "ok, 3 tensors" in ok.stdout, ok.stdout + ok.stderr
    assert run("rm", root + "/s1").returncode == 0
    assert run("verify", root + "/s2").returncode == 0
    missing = run("show", root + "/nope")
    assert missing.returncode == 1 and "no checkpoint" in missing.stderr
    assert run("show").returncode == 2  # PATH required


def test_a_downcast_is_recorded_and_undone_on_load(fs, root):
    g = torch.Generator().manual_seed(3)
    state = {"mask": torch.tensor([True, False, True]),  # odd bytes before the downcast ones
             "w": torch.randn(256, 64, generator=g), "d": torch.randn(7, generator=g).double(),
             "i": torch.arange(5), "a": np.linspace(0, 1, 33, dtype=np.float32),
             "t": torch.randn(8, 4, generator=g).t()}
    stats = ckpt.save(state, root + "/bf", downcast="bf16", connection=fs).wait()
    full = sum(v.numel() * v.element_size() if isinstance(v, torch.Tensor) else v.nbytes
               for v in state.values())
    assert stats["bytes_written"] < full * 0.6
    out = ckpt.load(root + "/bf", connection=fs)
    assert out["w"].dtype == torch.float32 and out["d"].dtype == torch.float64
    assert torch.equal(out["w"], state["w"].bfloat16().float())
    assert torch.equal(out["d"], state["d"].bfloat16().double())
    assert torch.equal(out["t"], state["t"].bfloat16().float())
    assert torch.equal(out["i"], state["i"]) and torch.equal(out["mask"], state["mask"])
    assert np.array_equal(out["a"], state["a"])  # numpy has no bf16: kept
    ckpt.save(state, root + "/fp", downcast="fp16", base=None, connection=fs)
    into = {k: (v.clone() * 0 if isinstance(v, torch.Tensor) else v.copy() * 0) for k, v in state.items()}
    ckpt.load(root + "/fp", into=into, connection=fs)
    assert torch.equal(into["w"], state["w"].half().float())
    assert np.array_equal(into["a"], state["a"].astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="downcast"):
        ckpt.save(state, root + "/x", downcast="int4", connection=fs)


def test_compressed_checkpoints_round_trip_and_are_smaller(fs, root):
    state = state_of_every_kind()
    state["zeros"] = torch.zeros(1 << 20)
    for codec in ("zstd", "lz4"):
        stats = ckpt.save(state, root + "/" + codec, compression=codec, base=None,
                          connection=fs).wait()
        assert stats["bytes_written"] < (1 << 20)  # 4 MiB of zeros among them
        assert_same(state, ckpt.load(root + "/" + codec, connection=fs))
        ckpt.verify(root + "/" + codec, connection=fs)
    with pytest.raises(ValueError, match="compression"):
        ckpt.save(state, root + "/x", compression="gzip", connection=fs)


def test_a_full_staging_pool_makes_the_next_save_wait_and_says_so(fs, root, caplog):
    import threading
    import time
    def counted():
        for line in cistern.metrics().splitlines():
            if line.startswith("ckpt_staging_pool_waits_total "):
                return int(line.split()[1])
        return 0

    before = counted()
    pool = ckpt.StagingPool(max_bytes=3 << 20)
    held = pool.take(2 << 20)  # an earlier save still persisting
    big = {"w": torch.randn(512 << 10)}  # 2 MiB: does not fit beside it
    done = threading.Event()
    with caplog.at_level("WARNING", logger="cistern.ckpt"):
        t = threading.Thread(target=lambda: (ckpt.save(big, root + "/p", base=None, pool=pool,
                                                       connection=fs), done.set()))
        t.start()
        time.sleep(0.3)
        assert not done.is_set()  # waiting, not growing
        assert pool.waits == 1 and counted() == before + 1
        pool.give(held)
        t.join(timeout=30)
    assert done.is_set()
    assert "staging pool (3 MiB) is full" in caplog.text
    assert_same(big, ckpt.load(root + "/p", connection=fs))

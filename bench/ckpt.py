"""One round of `bench/run ckpt` (bench/ckpt.sh), in one process:

    ckpt.py LOCAL_DIR CKPT_ROOT MIB ORDER

A state of 64 float32 tensors of MIB in all. Prints `name value` lines:
torchsave_s (torch.save to LOCAL_DIR, page cache, as training sees it),
block_s (cistern.ckpt.save with async_=True until it returns: the copy into
the staging pool, warm: a first save of the same size filled the pool),
persist_s (until wait() returns: written, synced, committed), persist_gbs,
torchload_s and load_s (cold: caches dropped before each), incr_frac (the
bytes an incremental save wrote over the state's bytes, 10% of the tensors
changed) and block_cold_s (the first save's blocking time, fresh memory).
ORDER: "local" or "cistern", which goes first in each pair."""
import os
import subprocess
import sys
import time

import torch

import cistern
import cistern.ckpt as ckpt


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def main():
    local, root, mib, order = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fs = cistern.connect()
    n = 64
    per = (mib << 20) // n // 4
    g = torch.Generator().manual_seed(1)
    state = {"layer%02d" % i: torch.rand(per, generator=g) for i in range(n)}
    total = n * per * 4
    pool = ckpt.StagingPool(max_bytes=total + (64 << 20))
    out = {}

    t = time.perf_counter()
    ckpt.save(state, root + "/warm", async_=True, base=None, pool=pool, connection=fs).wait()
    out["block_cold_s"] = time.perf_counter() - t  # includes the persist; see below
    ckpt.delete(root + "/warm", connection=fs)

    def torch_side():
        path = os.path.join(local, "state.pt")
        t = time.perf_counter()
        torch.save(state, path)
        out["torchsave_s"] = time.perf_counter() - t

    def cistern_side():
        t = time.perf_counter()
        h = ckpt.save(state, root + "/full", async_=True, base=None, pool=pool, connection=fs)
        out["block_s"] = time.perf_counter() - t
        h.wait()
        out["persist_s"] = time.perf_counter() - t
        out["persist_gbs"] = total / out["persist_s"] / 1e9

    sides = [torch_side, cistern_side] if order == "local" else [cistern_side, torch_side]
    for side in sides:
        side()

    def torch_load():
        drop_caches()
        t = time.perf_counter()
        torch.load(os.path.join(local, "state.pt"))
        out["torchload_s"] = time.perf_counter() - t

    def cistern_load():
        drop_caches()
        t = time.perf_counter()
        ckpt.load(root + "/full", connection=fs)
        out["load_s"] = time.perf_counter() - t

    loads = [torch_load, cistern_load] if order == "local" else [cistern_load, torch_load]
    for side in loads:
        side()

    for i in range(0, n, 10):  # 7 of 64 (~10%)
        state["layer%02d" % i].add_(1)
    stats = ckpt.save(state, root + "/incr", base=root + "/full", pool=pool, connection=fs).wait()
    out["incr_frac"] = stats["bytes_written"] / total
    for k, v in sorted(out.items()):
        print(k, "%.4f" % v)


if __name__ == "__main__":
    main()

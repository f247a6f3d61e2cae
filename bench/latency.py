"""One side of `bench/run latency` (bench/latency.sh): single-threaded file
operations in DIR, as ordinary Python code does them, one at a time.

    latency.py ops DIR N [METRICS_URL]   the per-operation phases below
    latency.py torchsave DIR MIB         writes DIR/ckpt.pt (MIB of tensors)
    latency.py torchload DIR             reads it back, prints GiB/s

Phases of `ops` (N files of 4 KiB in DIR/ops): create (open, write, close),
stat, lookup of absent names, smallread (open, read, close), rename,
unlink, and readdir (os.listdir of a directory of 10,000 names, 5 times).
For each phase it prints `phase NAME ops_per_s P50_US P99_US`, and with
METRICS_URL (a mount's /metrics) the FUSE requests per operation and the
mount's own time in them (`fuse NAME REQS_PER_OP DAEMON_US_PER_OP`; what
the kernel and Python add is the rest), and the budget: per operation,
each FUSE request, meta RPC, KV commit and KV log write, as calls and
microseconds (`budget NAME series:calls:us ...`)."""
import os
import re
import sys
import time
import urllib.request


# The mount's latency series: FUSE requests by op, RPC handlers by method
# (the meta service's), KV commits and their log writes.
SERIES = re.compile(r'^(fuse_request|rpc_server|kv_commit|kv_log)_latency_us_(sum|count)'
                    r'(?:\{(?:op|method)="([A-Za-z_.]+)"\})? (\S+)$', re.M)


def counters(url):
    """{series: (count, latency sum in us)} from the mount's metrics."""
    if not url:
        return {}
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for m in SERIES.finditer(text):
        family, kind, label, value = m.group(1), m.group(2), m.group(3), float(m.group(4))
        if family == "rpc_server":
            family = "rpc"
            label = label.rsplit(".", 1)[-1]
        name = family + ("." + label if label else "")
        count, total = out.get(name, (0, 0))
        out[name] = (value, total) if kind == "count" else (count, value)
    return out


def timed(fn, items):
    lat = []
    for x in items:
        t = time.perf_counter_ns()
        fn(x)
        lat.append(time.perf_counter_ns() - t)
    return lat


def report(name, lat, before, after):
    lat_sorted = sorted(lat)
    n = len(lat_sorted)
    total_s = sum(lat) / 1e9
    p50 = lat_sorted[n // 2] / 1e3
    p99 = lat_sorted[min(n - 1, n * 99 // 100)] / 1e3
    print("phase %s %.0f %.1f %.1f" % (name, n / total_s, p50, p99))
    if not (before or after):
        return
    # Per operation: each series' calls and microseconds ("fuse_request.create
    # 1.00x 233us"); FUSE requests in total and the mount's time in them.
    reqs, daemon_us, parts = 0, 0.0, []
    for series, (count, total) in sorted(after.items()):
        c0, t0 = before.get(series, (0, 0))
        if count - c0 <= 0:
            continue
        if series.startswith("fuse_request."):
            reqs += count - c0
            daemon_us += total - t0
        parts.append("%s:%.2fx:%.0fus" % (series.replace("fuse_request.", "fuse."),
                                         (count - c0) / n, (total - t0) / n))
    print("fuse %s %.2f %.1f" % (name, reqs / n, daemon_us / n))
    print("budget %s %s" % (name, " ".join(parts)))


def ops(root, n, url):
    d = os.path.join(root, "ops")
    os.makedirs(d)
    names = [os.path.join(d, "f%06d" % i) for i in range(n)]
    data = os.urandom(4096)

    def create(p):
        with open(p, "wb") as f:
            f.write(data)

    def smallread(p):
        with open(p, "rb") as f:
            f.read()

    def absent(p):
        os.path.exists(p + ".missing")

    phases = [("create", create, names), ("stat", os.stat, names), ("lookup", absent, names),
              ("smallread", smallread, names)]
    for name, fn, items in phases:
        before = counters(url)
        lat = timed(fn, items)
        report(name, lat, before, counters(url))
    moved = [p + ".r" for p in names]
    before = counters(url)
    lat = timed(lambda i: os.rename(names[i], moved[i]), range(n))
    report("rename", lat, before, counters(url))
    before = counters(url)
    lat = timed(os.unlink, moved)
    report("unlink", lat, before, counters(url))
    big = os.path.join(root, "dir10k")
    os.makedirs(big)
    for i in range(10000):
        open(os.path.join(big, "e%05d" % i), "wb").close()
    before = counters(url)
    lat = timed(lambda _: os.listdir(big), range(5))
    report("readdir", lat, before, counters(url))


def main():
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "ops":
        ops(root, int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    elif mode == "torchsave":
        import torch
        mib = int(sys.argv[3])
        tensors = {"w%d" % i: torch.rand(16 << 20 >> 2) for i in range(mib // 16)}
        torch.save(tensors, os.path.join(root, "ckpt.pt"))
        os.sync()
    elif mode == "torchload":
        import torch
        path = os.path.join(root, "ckpt.pt")
        t = time.perf_counter()
        state = torch.load(path, map_location="cpu")
        secs = time.perf_counter() - t
        print("torchload %.3f GiB/s" % (os.path.getsize(path) / secs / (1 << 30)))
        del state
    else:
        sys.exit("latency.py: unknown mode %r" % mode)


if __name__ == "__main__":
    main()

"""One epoch of one side of `bench/run loader` (bench/loader.sh):

    loader.py local|mount|view DIR          torchvision ImageFolder over DIR
    loader.py pack PACK CLUSTER             cistern.torch.PackIterableDataset

DataLoader with num_workers=2 and batches of 256 (the collate only counts:
decoding is the user's and the same on every side); ImageFolder's samples
shuffled, the pack's in its seed's permutation. The time runs from building
the dataset (ImageFolder's listing included) to the end of the epoch.
Prints `samples N`, `seconds S`, `samples_per_s R`, and the peak RSS of
this process and of its largest worker."""
import resource
import sys
import time

import torch.utils.data as data

BATCH = 256
PREFETCH_BYTES = 64 << 20  # per worker: PackIterableDataset's bound


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def count(batch):
    return len(batch), sum(len(x) for x, _ in batch)


def main():
    side, path = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()
    if side in ("local", "mount", "view"):
        from torchvision.datasets import ImageFolder
        ds = ImageFolder(path, loader=read_bytes)
        loader = data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                 collate_fn=count)
    elif side == "pack":
        from cistern.torch import PackIterableDataset, PackLoader
        ds = PackIterableDataset(path, cluster=sys.argv[3], seed=0, rank=0, world_size=1,
                                 prefetch_bytes=PREFETCH_BYTES)
        loader = PackLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=count)
    else:
        sys.exit("loader.py: unknown side %r" % side)
    samples = nbytes = 0
    for n, b in loader:
        samples += n
        nbytes += b
    seconds = time.monotonic() - t0
    print("samples", samples)
    print("bytes", nbytes)
    print("seconds %.3f" % seconds)
    print("samples_per_s %.1f" % (samples / seconds))
    print("rss_main_mib %d" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
    print("rss_worker_mib %d" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# bench/run loader: a PyTorch DataLoader epoch (num_workers=2) over two
# datasets — LOADER_BENCH_SMALL (default 100,000) samples of 4 KiB and
# LOADER_BENCH_LARGE (default 20,000) of 110 KiB, ImageFolder-style
# (class directories of 1,000) — read four ways from one `cistern up
# --mount` (one target) on a directory of the local disk:
#   local  loose files on the local disk, ImageFolder, read cold
#   mount  the same loose files on the mount, ImageFolder, cold
#   pack   the same samples packed (`cistern pack`), PackIterableDataset
#   view   the pack's directory view (<pack>/.view), ImageFolder, cold
# Every side reads cold (the kernel's caches dropped first; the mount's
# views reopen their index). LOADER_BENCH_ROUNDS rounds (default 3), the
# order of the sides rotating by round. Prints each side's samples/s,
# then the medians of the per-round ratios as `figure` lines, and the peak
# RSS of the loader processes (main, largest worker) and of `cistern up`.
#   BENCH_DIR   the disk (default: a fresh directory under /var/tmp)
#   CISTERN_BIN the cistern binary (default build/cistern)
set -euo pipefail
root=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cistern-bench-loader.XXXXXX")
rounds=${LOADER_BENCH_ROUNDS:-3}
small=${LOADER_BENCH_SMALL:-100000}
large=${LOADER_BENCH_LARGE:-20000}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/loader.sh: LOADER_BENCH_ROUNDS must be a positive number" >&2; exit 2; }
. bench/mount_lib.sh
start_mount

# The datasets: local tree, its copy on the mount, its pack.
for set in small large; do
  n=${!set}
  size=$([[ $set == small ]] && echo 4096 || echo 112640)
  t0=$(date +%s.%N)
  $py - "$root/local/$set" "$n" "$size" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = os.urandom(size + 4096)
for i in range(n):
    d = "%s/class%03d" % (root, i // 1000)
    if i % 1000 == 0:
        os.makedirs(d)
    with open("%s/%06d.jpg" % (d, i), "wb") as f:
        f.write(block[i % 4096:i % 4096 + size])
PY
  cp -r "$root/local/$set" "$root/mnt/$set"
  "$bin" pack "$root/local/$set" "/packs/$set" 2>/dev/null
  echo "dataset $set: $n x $size B (local, mount, pack) made in $($py -c "import time; print(round(time.time() - $t0))") s"
done

per_round="$root/per_round"
: >"$per_round"
rss="$root/rss"  # `main worker` MiB of each run (run is called in a subshell)
: >"$rss"
# run SIDE SET: one epoch, cold; prints samples/s and records the RSS.
run() {
  local side=$1 set=$2 out
  drop_caches
  case $side in
    local) out=$($py bench/loader.py local "$root/local/$set") ;;
    mount) out=$($py bench/loader.py mount "$root/mnt/$set") ;;
    pack) out=$($py bench/loader.py pack "/packs/$set" "$CISTERN_CLUSTER") ;;
    view) out=$($py bench/loader.py view "$root/mnt/packs/$set/.view") ;;
  esac
  local n want=${!set}
  n=$(awk '/^samples /{print $2}' <<<"$out")
  [[ $n == "$want" ]] || { echo "bench/loader.sh: $side $set read $n samples of $want" >&2; exit 1; }
  awk '/^rss_main_mib/{m=$2} /^rss_worker_mib/{w=$2} END{print m, w}' <<<"$out" >>"$rss"
  awk '/^samples_per_s/{print $2}' <<<"$out"
}
sides=(local mount pack view)
for round in $(seq "$rounds"); do
  echo "-- round $round of $rounds"
  for set in small large; do
    declare -A rate=()
    for k in 0 1 2 3; do
      side=${sides[$(( (k + round) % 4 ))]}
      rate[$side]=$(run "$side" "$set")
    done
    echo "$set: local ${rate[local]}/s, mount ${rate[mount]}/s, pack ${rate[pack]}/s, view ${rate[view]}/s"
    tag=$([[ $set == small ]] && echo 4k || echo 110k)
    echo "loader_pack_vs_local_$tag $(ratio "${rate[pack]}" "${rate[local]}") x" >>"$per_round"
    echo "loader_view_vs_mount_loose_$tag $(ratio "${rate[view]}" "${rate[mount]}") x" >>"$per_round"
    echo "loader_mount_vs_local_$tag $(ratio "${rate[mount]}" "${rate[local]}") x" >>"$per_round"
  done
done
up_rss=$(mount_rss_mib)
peak_main=$(awk '$1 > m {m=$1} END{print m+0}' "$rss")
peak_worker=$(awk '$2 > w {w=$2} END{print w+0}' "$rss")
echo "-- $rounds rounds; peak_rss loader main $peak_main MiB, largest worker $peak_worker MiB (prefetch bound 64 MiB per worker); cistern up --mount $up_rss MiB"
$py - "$per_round" <<'PY'
import statistics, sys
values = {}
for line in open(sys.argv[1]):
    name, value, _ = line.split()
    values.setdefault(name, []).append(float(value))
for name in values:
    print(f"rounds {name}: " + " / ".join(f"{v:.2f}" for v in values[name]))
# The issue's view figure is over the 4 KiB set (many small files).
values["loader_view_vs_mount_loose"] = values["loader_view_vs_mount_loose_4k"]
for name in ["loader_pack_vs_local_4k", "loader_pack_vs_local_110k", "loader_view_vs_mount_loose",
             "loader_view_vs_mount_loose_110k", "loader_mount_vs_local_4k",
             "loader_mount_vs_local_110k"]:
    print(f"figure {name} {statistics.median(values[name]):.2f} x")
PY

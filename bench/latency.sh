#!/usr/bin/env bash
# bench/run latency: what one Python process doing one thing at a time sees
# on `cistern up --mount` (one target) and on a local directory of the same
# disk, in the same run (bench/latency.py):
#   - N (LATENCY_BENCH_FILES, default 2,000) files of 4 KiB, one thread:
#     create, stat, lookup of absent names, open+read+close, rename, unlink,
#     and os.listdir of a directory of 10,000 names: ops/s, p50 and p99;
#     on the mount also the FUSE requests and the mount's own time per
#     operation (the rest is the kernel and Python);
#   - a DataLoader epoch (2 workers) over an ImageFolder tree of 10,000
#     ~7 KiB files, cold (bench/loader.py);
#   - torch.load of a 1 GiB checkpoint (LATENCY_BENCH_MIB), cold.
# LATENCY_BENCH_ROUNDS rounds (default 3), each on a fresh mount, the side
# that goes first alternating by round. Figures: medians of the per-round
# speed ratios mount/local (higher is better), and the peak RSS of
# `cistern up --mount`.
#   BENCH_DIR   the disk (default: a fresh directory under /var/tmp)
#   CISTERN_BIN the cistern binary (default build/cistern)
set -euo pipefail
root=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cistern-bench-latency.XXXXXX")
rounds=${LATENCY_BENCH_ROUNDS:-3}
files=${LATENCY_BENCH_FILES:-2000}
mib=${LATENCY_BENCH_MIB:-1024}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/latency.sh: LATENCY_BENCH_ROUNDS must be a positive number" >&2; exit 2; }
. bench/mount_lib.sh
imagefolder() {  # DIR: 10,000 files of ~7 KiB in 10 class directories
  $py - "$1" <<'PY'
import os, sys
root = sys.argv[1]
block = os.urandom(12 << 10)
for i in range(10000):
    d = "%s/class%d" % (root, i % 10)
    if i < 10:
        os.makedirs(d)
    with open("%s/%05d.jpg" % (d, i), "wb") as f:
        f.write(block[i % 4096:i % 4096 + 6144 + (i * 37) % 2048])
PY
}

# The value of one cold run in side directory $1.
epoch_of() { $py bench/loader.py local "$1/images" | awk '/^samples_per_s/{print $2}'; }
load_of() { $py bench/latency.py torchload "$1" | awk '{print $2}'; }
# compare LABEL FIGURE UNIT FN: FN run cold on each side in this round's
# order; prints both values and records the ratio mount/local.
compare() {
  local label=$1 figure=$2 unit=$3 fn=$4 side r
  declare -A value=()
  for side in "${sides[@]}"; do
    drop_caches
    value[$side]=$($fn "$root/$side")
  done
  r=$(ratio "${value[mnt]}" "${value[local]}")
  echo "$label: mount ${value[mnt]} $unit, local ${value[local]} $unit: $r x"
  echo "$figure $r" >>"$per_round"
}
per_round="$root/per_round"
: >"$per_round"
peak_rss=0
for round in $(seq "$rounds"); do
  echo "-- round $round of $rounds (fresh mount)"
  start_mount
  sides=(local mnt)
  (( round % 2 == 0 )) && sides=(mnt local)
  declare -A out=()
  for side in "${sides[@]}"; do
    out[$side]=$($py bench/latency.py ops "$root/$side" "$files" \
                   "$([[ $side == mnt ]] && echo "$metrics")")
  done
  echo "${out[mnt]}" | grep -E "^(fuse|budget) " | sed 's/^/mount: /'
  for phase in create stat lookup smallread rename unlink readdir; do
    m=$(awk -v p="$phase" '$1 == "phase" && $2 == p {print $3, $4, $5}' <<<"${out[mnt]}")
    l=$(awk -v p="$phase" '$1 == "phase" && $2 == p {print $3, $4, $5}' <<<"${out[local]}")
    read -r m_ops m_p50 m_p99 <<<"$m"
    read -r l_ops l_p50 l_p99 <<<"$l"
    r=$(ratio "$m_ops" "$l_ops")
    echo "$phase: mount $m_ops/s (p50 $m_p50 us, p99 $m_p99 us), local $l_ops/s (p50 $l_p50 us, p99 $l_p99 us): $r x"
    echo "lat_${phase}_vs_local $r" >>"$per_round"
  done
  for side in "${sides[@]}"; do imagefolder "$root/$side/images"; done
  compare "imagefolder epoch" epoch_imagefolder_vs_local samples/s epoch_of
  for side in "${sides[@]}"; do $py bench/latency.py torchsave "$root/$side" "$mib"; done
  compare "torch.load of $mib MiB" torchload_vs_local GiB/s load_of
  rss=$(mount_rss_mib)
  (( rss > peak_rss )) && peak_rss=$rss
  stop_mount
done
echo "-- $rounds rounds; peak_rss cistern up --mount $peak_rss MiB"
medians "$per_round"

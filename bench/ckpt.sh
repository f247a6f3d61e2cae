#!/usr/bin/env bash
# bench/run ckpt: checkpoints (issue 43) against torch.save and fio on the
# same disk, CKPT_BENCH_ROUNDS rounds (default 3), each on a fresh
# `cistern up` (one target, synced) with the side that goes first
# alternating. Each round (bench/ckpt.py): a state of 64 float32 tensors
# (CKPT_BENCH_MIB, default 4096): torch.save to a local directory;
# cistern.ckpt.save(async_=True) until it returns (the copy into a warm
# staging pool) and until it is persisted; fio's sequential 1 MiB direct
# writes of the same size, 8 in flight, with a final fsync (the disk's
# speed); cold loads (caches dropped) with
# torch.load and cistern.ckpt.load; an incremental save with 7 of the 64
# tensors changed. Figures (medians): ckpt_block_vs_torchsave (blocking
# time over torch.save's, lower is better), ckpt_persist_vs_fio (speed,
# higher is better), ckpt_load_vs_torchload (speed), ckpt_incremental_bytes_frac
# (bytes written over the state's), and the peak RSS of `cistern up`.
#   BENCH_DIR   the disk (default: a fresh directory under /var/tmp)
set -euo pipefail
root=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cistern-bench-ckpt.XXXXXX")
rounds=${CKPT_BENCH_ROUNDS:-3}
mib=${CKPT_BENCH_MIB:-4096}
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/ckpt.sh: CKPT_BENCH_ROUNDS must be a positive number" >&2; exit 2; }
. bench/mount_lib.sh
per_round="$root/per_round"
: >"$per_round"
peak_rss=0
for round in $(seq "$rounds"); do
  echo "-- round $round of $rounds (fresh cluster)"
  start_mount
  order=local
  (( round % 2 == 0 )) && order=cistern
  fio_gbs() {
    rm -f "$root/local/fio.data"
    fio --name=seq --filename="$root/local/fio.data" --rw=write --bs=1M --size="${mib}M" \
        --direct=1 --ioengine=libaio --iodepth=8 --end_fsync=1 --output-format=terse 2>/dev/null |
      awk -F';' '{printf "%.3f\n", $48 * 1024 / 1e9}'
    rm -f "$root/local/fio.data"
  }
  [[ $order == local ]] && fio=$(fio_gbs)
  out=$($py bench/ckpt.py "$root/local" /ckpt "$mib" "$order")
  [[ $order == cistern ]] && fio=$(fio_gbs)
  echo "$out" | sed 's/^/  /'
  get() { awk -v k="$1" '$1 == k {print $2}' <<<"$out"; }
  echo "  fio_write_gbs $fio"
  block=$(get block_s); tsave=$(get torchsave_s); pgbs=$(get persist_gbs)
  load=$(get load_s); tload=$(get torchload_s); frac=$(get incr_frac)
  echo "ckpt_block_vs_torchsave $(ratio "$block" "$tsave")" >>"$per_round"
  echo "ckpt_persist_vs_fio $(ratio "$pgbs" "$fio")" >>"$per_round"
  echo "ckpt_load_vs_torchload $(ratio "$tload" "$load")" >>"$per_round"
  echo "ckpt_incremental_bytes_frac $(printf '%.3f' "$frac")" >>"$per_round"
  rss=$(mount_rss_mib)
  (( rss > peak_rss )) && peak_rss=$rss
  stop_mount
done
echo "-- $rounds rounds; peak_rss cistern up $peak_rss MiB"
medians "$per_round"
echo "figure ckpt_peak_rss_mib $peak_rss MiB"

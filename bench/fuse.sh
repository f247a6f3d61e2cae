#!/usr/bin/env bash
# bench/run fuse: FUSE_BENCH_ROUNDS rounds (default 3), each on a fresh
# `cistern up --mount` (one target, sync on) on a directory of the local disk:
# the same fio jobs and small-file test on the mount and on a local directory
# of the same disk, the side that goes first alternating by job and by round.
# Prints each round's figures, then as `figure` lines the median over the
# rounds of each round's ratio mount/local (both sides measured in the same
# minutes) and of the small-file rates on the mount: single runs swing with
# the host (bench/RESULTS.md), as chunk and client do. The mount's
# direct writes, like the local disk's, are acknowledged in the device's
# cache and made durable by fsync/close (docs/client.md, "Durability"; the
# servers also sync every 5 s); fuse_seqwrite_direct_vs_local_dsync
# compares them with local direct writes that are durable each (O_DSYNC), as
# the mount's are with client.sync_each_write = true.
#   BENCH_DIR   the disk (default: a fresh directory under /var/tmp)
#   FUSE_BENCH_ROUNDS rounds, each on a fresh mount (default 3)
#   FUSE_BENCH_MIB   size of the sequential files (default 1024)
#   FUSE_BENCH_FILES number of small files (default 10000)
#   CISTERN_BIN      the cistern binary (default build/cistern; another build for A/B runs)
#   SMALLFILE_BIN    the small-file harness (default build/bench/smallfile_bench)
#   FUSE_BENCH_OPTIONS mount options (-o), e.g. socket_calls: reach the servers over
#                    loopback TCP as a mount in another process does (docs/fuse.md)
set -euo pipefail
root=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cistern-bench-fuse.XXXXXX")
rounds=${FUSE_BENCH_ROUNDS:-3}
mib=${FUSE_BENCH_MIB:-1024}
files=${FUSE_BENCH_FILES:-10000}
smallfile_bin=${SMALLFILE_BIN:-build/bench/smallfile_bench}
[[ -x $smallfile_bin ]] || { echo "bench/fuse.sh: no $smallfile_bin (cmake --build build --target smallfile_bench)" >&2; exit 1; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/fuse.sh: FUSE_BENCH_ROUNDS must be a positive number, not '$rounds'" >&2; exit 2; }
. bench/mount_lib.sh

# fio JOB DIR: prints MB/s (sequential) or IOPS (random) of one job.
fio_job() {
  local job=$1 dir=$2 args
  case $job in
    seqwrite_direct) args="--rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=8" ;;
    # The same writes, each durable when it completes (O_DSYNC), as the
    # mount's are with client.sync_each_write = true.
    seqwrite_direct_dsync) args="--rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=8 --sync=dsync" ;;
    seqread_direct) args="--rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=8" ;;
    seqwrite_buffered) args="--rw=write --bs=1M --direct=0 --ioengine=psync --end_fsync=1" ;;
    randread) args="--rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --runtime=10 --time_based" ;;
  esac
  [[ $job == seqread_direct || $job == randread ]] && drop_caches
  # shellcheck disable=SC2086
  fio --name=bench --directory="$dir" --filename=fio.data --size="${mib}M" $args \
      --output-format=json 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
job = json.load(sys.stdin)["jobs"][0]
kind = sys.argv[1]
if kind == "randread":
    print(round(job["read"]["iops"]))
else:
    side = job["read"] if "read" in kind else job["write"]
    print(round(side["bw_bytes"] / 1e6, 1))' "$job"
}

# Small files: create (write 4 KiB + close), cold read, delete; 16 threads
# (bench/smallfile_bench.cc: a C++ harness, so that the 2 cores go to the
# file system rather than to the harness's own threads).
small() { "$smallfile_bin" "$1" "$files" "$2" 16; }

# Each round appends `NAME VALUE UNIT` lines here; the figures are their medians.
per_round="$root/per_round"
: >"$per_round"
peak_rss_mib=0
# Whether the mount goes first for job number $1 of this round: by job, and
# swapped every other round, so that drift on a shared machine hits both.
mount_first() { [[ $(( ($1 + round) % 2 )) == 0 ]]; }
for round in $(seq "$rounds"); do
  echo "-- round $round of $rounds (fresh mount)"
  start_mount ${FUSE_BENCH_OPTIONS:+-o "$FUSE_BENCH_OPTIONS"}
  declare -A mount_v=() local_v=()
  n=0
  for job in seqwrite_direct seqread_direct seqwrite_buffered randread; do
    n=$((n + 1))
    if mount_first "$n"; then
      mount_v[$job]=$(fio_job "$job" "$root/mnt")
      local_v[$job]=$(fio_job "$job" "$root/local")
    else
      local_v[$job]=$(fio_job "$job" "$root/local")
      mount_v[$job]=$(fio_job "$job" "$root/mnt")
    fi
    unit=MB/s
    [[ $job == randread ]] && unit=IOPS
    r=$(ratio "${mount_v[$job]}" "${local_v[$job]}")
    echo "$job: mount ${mount_v[$job]} $unit, local ${local_v[$job]} $unit ($r x)"
    [[ $job == seqwrite_buffered ]] && rm -f "$root/mnt/fio.data" "$root/local/fio.data"
    case $job in
      seqwrite_direct) echo "fuse_seqwrite_direct_vs_local $r x" >>"$per_round" ;;
      seqread_direct) echo "fuse_seqread_direct_vs_local $r x" >>"$per_round" ;;
      seqwrite_buffered) echo "fuse_seqwrite_buffered_vs_local $r x" >>"$per_round" ;;
      randread) echo "fuse_randread_vs_local $r x" >>"$per_round" ;;
    esac
    if [[ $job == seqwrite_direct ]]; then
      rm -f "$root/local/fio.data"
      local_dsync=$(fio_job seqwrite_direct_dsync "$root/local")
      echo "seqwrite_direct_dsync: local $local_dsync MB/s"
      echo "fuse_seqwrite_direct_vs_local_dsync $(ratio "${mount_v[$job]}" "$local_dsync") x" >>"$per_round"
    fi
  done
  rm -f "$root/mnt/fio.data" "$root/local/fio.data"

  declare -A small_mount=() small_local=()
  for phase in create read delete; do
    [[ $phase == read ]] && drop_caches
    small_mount[$phase]=$(small "$root/mnt/small" "$phase")
    [[ $phase == read ]] && drop_caches
    small_local[$phase]=$(small "$root/local/small" "$phase")
    echo "smallfile $phase: mount ${small_mount[$phase]}/s, local ${small_local[$phase]}/s"
    echo "fuse_smallfile_${phase}_per_s ${small_mount[$phase]} files/s" >>"$per_round"
  done

  rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$up_pid/status")
  echo "peak_rss cistern up --mount $((rss_kib / 1024)) MiB"
  (( rss_kib / 1024 > peak_rss_mib )) && peak_rss_mib=$((rss_kib / 1024))
  stop_mount
done

echo "-- $rounds rounds; peak_rss cistern up --mount (all rounds) $peak_rss_mib MiB"
# One line per figure with every round's value, then the medians.
/usr/bin/python3 - "$per_round" <<'PY'
import statistics, sys
values, units = {}, {}
for line in open(sys.argv[1]):
    name, value, unit = line.split()
    values.setdefault(name, []).append(float(value))
    units[name] = unit
order = ["fuse_seqwrite_direct_vs_local", "fuse_seqwrite_direct_vs_local_dsync",
         "fuse_seqread_direct_vs_local", "fuse_seqwrite_buffered_vs_local",
         "fuse_randread_vs_local", "fuse_smallfile_create_per_s",
         "fuse_smallfile_read_per_s", "fuse_smallfile_delete_per_s"]
def show(v, unit):
    return f"{v:.2f}" if unit == "x" else f"{round(v)}"
for name in order:
    print(f"rounds {name}: " + " / ".join(show(v, units[name]) for v in values[name]))
for name in order:
    print(f"figure {name} {show(statistics.median(values[name]), units[name])} {units[name]}")
PY

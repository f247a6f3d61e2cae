# Sourced by the benchmarks that compare a `cistern up --mount` with a
# local directory of the same disk (fuse.sh, loader.sh, latency.sh, ckpt.sh). The
# caller sets $root (a fresh directory); this sets the EXIT trap that stops
# the mount and removes $root.
bin=${CISTERN_BIN:-build/cistern}
py=/usr/bin/python3
up_pid=
# start_mount [-o OPTIONS]: a fresh `cistern up` (one target) with its data
# in $root/data, mounted at $root/mnt, and an empty $root/local; sets
# up_pid, metrics (its /metrics URL) and CISTERN_CLUSTER.
start_mount() {
  rm -rf "$root/data" "$root/mnt" "$root/local"
  mkdir -p "$root/local" "$root/mnt"
  "$bin" up --data "$root/data" --listen 127.0.0.1:0 --mount "$root/mnt" "$@" >"$root/up.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 300); do grep -q "mounted at" "$root/up.log" && break; sleep 0.1; done
  grep -q "mounted at" "$root/up.log" || { cat "$root/up.log" >&2; exit 1; }
  metrics=$(grep -o "http://[0-9.:]*/metrics" "$root/up.log" | head -1)
  CISTERN_CLUSTER=$(awk '/cistern up: cluster /{print $4; exit}' "$root/up.log")
  export CISTERN_CLUSTER
}
stop_mount() {
  if [[ -n $up_pid ]]; then
    kill "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
    up_pid=
  fi
  umount -l "$root/mnt" 2>/dev/null || true
}
cleanup() { stop_mount; rm -rf "$root"; }
trap cleanup EXIT
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
ratio() { $py -c "print(round($1 / $2, 2) if $2 else 0)"; }
# medians FILE: FILE holds "FIGURE VALUE" lines, one per round; prints each
# figure's rounds, then its median as a ratio.
medians() {
  $py - "$1" <<'PY'
import statistics, sys
values = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    values.setdefault(name, []).append(float(value))
for name in values:
    print(f"rounds {name}: " + " / ".join(f"{v:.3g}" for v in values[name]))
for name in values:
    print(f"figure {name} {statistics.median(values[name]):.3g} x")
PY
}
# The peak RSS of `cistern up --mount`, MiB.
mount_rss_mib() { awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$up_pid/status"; }

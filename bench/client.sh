#!/usr/bin/env bash
# bench/run client: `cistern up` (one target, sync on) on a directory of the
# local disk, then `cistern bench` against it with --baseline on the same
# disk, alternating rounds. Extra arguments go to `cistern bench`.
# BENCH_DIR picks the disk (default: a fresh directory under /var/tmp);
# CISTERN_BIN the cistern binary (default build/cistern; another build for A/B runs).
set -euo pipefail
bin=${CISTERN_BIN:-build/cistern}
root=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cistern-bench-client.XXXXXX")
mkdir -p "$root/local"
up_log="$root/up.log"
"$bin" up --data "$root/data" --listen 127.0.0.1:0 >"$up_log" 2>&1 &
up_pid=$!
cleanup() { kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT
for _ in $(seq 100); do grep -q ready "$up_log" && break; sleep 0.1; done
cluster=$(sed -n 's/^cistern up: cluster \([^ ]*\) .*/\1/p' "$up_log")
[[ -n "$cluster" ]] || { cat "$up_log" >&2; exit 1; }
out=$("$bin" bench --cluster "$cluster" --baseline "$root/local" --gib 2 --threads 4 \
        --files 4000 --seconds 5 --rounds 3 "$@")
rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$up_pid/status")
echo "$out" | grep -v '^figure'
echo "peak_rss server $((rss_kib / 1024)) MiB"
echo "$out" | grep '^figure'

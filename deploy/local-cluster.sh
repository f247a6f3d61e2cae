#!/usr/bin/env bash
# A 3-node cistern cluster on this one machine, as deploy/node{1,2,3} lay
# one out on three: 3 etcd members, 2 mgmtd (primary and standby), 3 meta
# servers and 3 storage servers (one target each), replication 3. Every
# process listens on 127.0.0.1 from $BASE_PORT (17000) on; data and logs
# go under DIR (./cistern-cluster). Runs until Ctrl-C, then stops them all.
#
#   deploy/local-cluster.sh [DIR]          start, print `cistern status`, wait
#   deploy/local-cluster.sh --check [DIR]  start, check it works, stop (a test)
#
# Then, in another terminal:
#   export CISTERN_CLUSTER=127.0.0.1:17020,127.0.0.1:17021
#   build/cistern status ; build/cistern put FILE / ; build/cistern mount ./mnt
set -euo pipefail

check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
fi
dir=$(realpath -m "${1:-./cistern-cluster}")
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${CISTERN_BIN:-$here/build/cistern}
base=${BASE_PORT:-17000}
etcd_bin=${ETCD_BIN:-etcd}

[[ -x "$bin" ]] || { echo "local-cluster: $bin not built (make build)" >&2; exit 2; }
command -v "$etcd_bin" >/dev/null || { echo "local-cluster: no etcd (apt-get install etcd-server)" >&2; exit 2; }
mkdir -p "$dir"
pids=()
stop() {
  # Clients first, then meta and storage, mgmtd, etcd last.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

# Waits until FILE has a line matching PATTERN (the process's "ready").
wait_for() {
  local file=$1 pattern=$2
  for _ in $(seq 300); do
    grep -q "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "local-cluster: $file never said '$pattern':" >&2
  tail -20 "$file" >&2
  exit 1
}

cluster="node1=http://127.0.0.1:$((base + 11)),node2=http://127.0.0.1:$((base + 12)),node3=http://127.0.0.1:$((base + 13))"
etcd_eps="\"127.0.0.1:$((base + 1))\", \"127.0.0.1:$((base + 2))\", \"127.0.0.1:$((base + 3))\""
mgmtd_eps="\"127.0.0.1:$((base + 20))\", \"127.0.0.1:$((base + 21))\""
kv="kv.backend = \"etcd\"
kv.etcd.endpoints = [$etcd_eps]
kv.etcd.prefix = \"cistern/\""

for n in 1 2 3; do
  mkdir -p "$dir/node$n"
  state=new
  [[ -d "$dir/node$n/etcd/member" ]] && state=existing
  "$etcd_bin" --name "node$n" --data-dir "$dir/node$n/etcd" \
    --listen-client-urls "http://127.0.0.1:$((base + n))" \
    --advertise-client-urls "http://127.0.0.1:$((base + n))" \
    --listen-peer-urls "http://127.0.0.1:$((base + 10 + n))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((base + 10 + n))" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" \
    --initial-cluster-token cistern-local >"$dir/node$n/etcd.log" 2>&1 &
  pids+=($!)
done
for n in 1 2 3; do wait_for "$dir/node$n/etcd.log" "ready to serve client requests"; done

for n in 1 2; do
  cat >"$dir/node$n/mgmtd.toml" <<EOF
mgmtd.listen = "127.0.0.1:$((base + 19 + n))"
mgmtd.heartbeat_timeout_ms = 3000
mgmtd.lease_ms = 3000
$kv
EOF
  "$bin" serve --role mgmtd --config "$dir/node$n/mgmtd.toml" >"$dir/node$n/mgmtd.log" 2>&1 &
  pids+=($!)
done
for n in 1 2 3; do
  cat >"$dir/node$n/storage.toml" <<EOF
storage.listen = "127.0.0.1:$((base + 29 + n))"
storage.node = "node$n"
storage.rack = "rack$n"
storage.target = "$dir/node$n/target0"
storage.mgmtd = [$mgmtd_eps]
EOF
  cat >"$dir/node$n/meta.toml" <<EOF
meta.listen = "127.0.0.1:$((base + 39 + n))"
$kv
EOF
  "$bin" serve --role storage --config "$dir/node$n/storage.toml" >"$dir/node$n/storage.log" 2>&1 &
  pids+=($!)
  "$bin" serve --role meta --config "$dir/node$n/meta.toml" >"$dir/node$n/meta.log" 2>&1 &
  pids+=($!)
done
for n in 1 2; do wait_for "$dir/node$n/mgmtd.log" "ready"; done
for n in 1 2 3; do
  wait_for "$dir/node$n/storage.log" "registered"
  wait_for "$dir/node$n/meta.log" "ready"
done

export CISTERN_CLUSTER="127.0.0.1:$((base + 20)),127.0.0.1:$((base + 21))"
# Once: the chain table (a restart finds it in etcd).
if ! "$bin" status --json 2>/dev/null | grep -q '"chains": \[\s*{'; then
  "$bin" chains create --replication 3 --count 6
fi
for _ in $(seq 100); do
  "$bin" status >/dev/null 2>&1 && break
  sleep 0.1
done
"$bin" status

if ((check)); then
  head -c 3000000 /dev/urandom >"$dir/sample"
  "$bin" put "$dir/sample" /sample
  "$bin" get /sample "$dir/sample.back"
  cmp "$dir/sample" "$dir/sample.back"
  "$bin" status --json | grep -q '"healthy": true'
  "$bin" df | grep -q Avail  # capacity from the targets, through a meta server
  echo "local-cluster: check passed"
  exit 0
fi
echo
echo "cluster up: export CISTERN_CLUSTER=$CISTERN_CLUSTER (Ctrl-C stops it; data in $dir)"
wait

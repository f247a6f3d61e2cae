#!/usr/bin/env bash
# deploy/local-cluster.sh --check: the README's 3-node cluster on one machine
# starts, `cistern status` says healthy, a file round-trips, and it stops.
# Ports from a random base (tried again on another if one is taken).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export CISTERN_BIN=${1:?usage: local_cluster_test.sh CISTERN_BIN}
for attempt in 1 2 3; do
  dir=$(mktemp -d /tmp/cistern-local-cluster-XXXXXX)
  export BASE_PORT=$((20000 + RANDOM % 30000))
  if timeout 180 "$here/deploy/local-cluster.sh" --check "$dir" >"$dir.log" 2>&1; then
    tail -3 "$dir.log"
    rm -rf "$dir" "$dir.log"
    exit 0
  fi
  echo "attempt $attempt (ports from $BASE_PORT) failed:" >&2
  tail -40 "$dir.log" >&2
  for f in "$dir"/node*/*.log; do echo "== $f" >&2; tail -5 "$f" >&2; done
  rm -rf "$dir" "$dir.log"
done
exit 1

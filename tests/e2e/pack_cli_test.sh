#!/usr/bin/env bash
# cistern pack / --list / --verify / unpack against a `cistern up` started
# here on free ports: a tree of 2,000 small files (and a few large ones)
# round-trips byte-exact with its mtimes, and one of 100,000 small files,
# through unpack and through the mount's directory view (`<pack>/.view`:
# ls -l, find, stat, cat); a flipped byte in a shard is named by --verify
# and fails the view's read; bad arguments get a clear error.
set -euo pipefail
bin=${1:?usage: pack_cli_test.sh CISTERN_BIN}
work=$(mktemp -d /tmp/cistern-pack-cli-XXXXXX)
up=""
cleanup() {
  [[ -n $up ]] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# A failing step says which, with what the commands wrote to their logs.
trap 'echo "pack_cli_test: line $LINENO failed: $BASH_COMMAND" >&2
      for f in "$work"/*.err "$work"/err "$work"/up.log; do
        [[ -f $f ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
      done' ERR
# (No `| grep -q` under pipefail: grep leaves at its first match and the
# writer may die of SIGPIPE, failing the pipeline. `| grep ... >/dev/null`
# reads everything.)
# `! cmd` does not stop a `set -e` script: this does.
fails() {
  if "$@"; then
    echo "unexpected success: $*"
    exit 1
  fi
}
mkdir "$work/mnt"
"$bin" up --data "$work/data" --listen 127.0.0.1:0 --mount "$work/mnt" >"$work/up.log" 2>&1 &
up=$!
for _ in $(seq 300); do grep -q "cistern up: ready" "$work/up.log" && break; sleep 0.1; done
export CISTERN_CLUSTER=$(awk '/cistern up: cluster /{print $4; exit}' "$work/up.log")
[[ -n $CISTERN_CLUSTER ]] || { cat "$work/up.log"; exit 1; }

mkdir -p "$work/src"
for d in 0 1 2 3; do
  mkdir -p "$work/src/class$d/sub"
  for i in $(seq 500); do head -c $((i * 13 % 9000 + 1)) /dev/urandom >"$work/src/class$d/$i.bin"; done
  head -c 3000000 /dev/urandom >"$work/src/class$d/sub/big.bin"
done
touch -d '2020-01-02 03:04:05' "$work/src/class0/1.bin"

"$bin" pack --shard-mib 1 "$work/src" /packs/p 2>"$work/pack.err"
grep -q "2004/2004 files" "$work/pack.err"
"$bin" pack --list /packs/p >"$work/list" 2>"$work/list.err"
[[ $(wc -l <"$work/list") -eq 2004 ]]
grep -q " class0/1.bin$" "$work/list"
grep -q "2004 samples in" "$work/list.err"
"$bin" pack --verify /packs/p | grep "ok, 2004 samples" >/dev/null
"$bin" unpack /packs/p "$work/out" 2>/dev/null
diff -r "$work/src" "$work/out"
[[ $(stat -c %Y "$work/out/class0/1.bin") == $(stat -c %Y "$work/src/class0/1.bin") ]]

# The directory view: the same tree, read-only, with sizes and mtimes;
# hidden from the pack directory's listing; absent names are ENOENT.
view="$work/mnt/packs/p/.view"
diff -r "$work/src" "$view"
[[ $(find "$view" -type f | wc -l) -eq 2004 ]]
[[ $(find "$view" -type d | wc -l) -eq 9 ]]
[[ $(stat -c %Y "$view/class0/1.bin") == $(stat -c %Y "$work/src/class0/1.bin") ]]
[[ $(stat -c %s "$view/class1/sub/big.bin") -eq 3000000 ]]
ls -l "$view/class2" | grep "^-r--r--r-- .* 1.bin$" >/dev/null
cmp <(cat "$view/class3/sub/big.bin") "$work/src/class3/sub/big.bin"
[[ $(ls -a "$work/mnt/packs/p" | grep -c "view") -eq 0 ]]
[[ $(ls -a "$work/mnt/packs/p" | wc -l) -eq 15 ]]  # ., .., the index, 12 shards
fails stat "$view/class0/absent.bin" 2>/dev/null
fails stat "$view/absent-dir/x" 2>/dev/null
fails touch "$view/new" 2>"$work/err"
grep -q "Read-only file system" "$work/err"
fails rm "$view/class0/1.bin" 2>"$work/err"
grep -q "Read-only file system" "$work/err"
fails stat "$work/mnt/packs/.view" 2>/dev/null

# An append: new files in new shards, a new index generation.
mkdir -p "$work/more"
echo extra >"$work/more/new.txt"
"$bin" pack --append "$work/more" /packs/p 2>/dev/null
"$bin" pack --list /packs/p 2>&1 >/dev/null | grep "2005 samples in .* (index generation 2)" >/dev/null

# A flipped byte in a shard: --verify fails and names the sample.
"$bin" get /packs/p/shard-00000.dat "$work/shard0"
printf '\xff' | dd of="$work/shard0" bs=1 seek=5000 conv=notrunc status=none
"$bin" rm /packs/p/shard-00000.dat
"$bin" put "$work/shard0" /packs/p/shard-00000.dat
if "$bin" pack --verify /packs/p >"$work/verify.out" 2>&1; then
  echo "verify passed a flipped byte"; exit 1
fi
grep -q "does not match its checksum" "$work/verify.out"
grep -q "class0/" "$work/verify.out"
# The view opened after the flip reads the flipped sample as an I/O error
# (the view of an earlier generation showed the old shard: a fresh pack).
"$bin" mkdir /packs/q
for f in $("$bin" ls /packs/p); do
  "$bin" get "/packs/p/$f" "$work/q-$f" && "$bin" put "$work/q-$f" "/packs/q/$f"
done
bad=$(grep -o "sample [^ ]*" "$work/verify.out" | head -1 | cut -d' ' -f2)
fails cat "$work/mnt/packs/q/.view/$bad" >/dev/null 2>"$work/err"
grep -q "Input/output error" "$work/err"

# 100,000 small files round-trip byte-exact (the issue's scale check).
/usr/bin/python3 - "$work/many" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(100):
    os.makedirs("%s/d%02d" % (root, d))
    for i in range(1000):
        with open("%s/d%02d/%04d.bin" % (root, d, i), "wb") as f:
            f.write(os.urandom(1 + (d * 1000 + i) * 37 % 4000))
PY
"$bin" pack --shard-mib 64 "$work/many" /packs/many 2>"$work/many.err"
grep -q "100000/100000 files" "$work/many.err"
"$bin" pack --verify /packs/many | grep "ok, 100000 samples" >/dev/null
"$bin" unpack /packs/many "$work/many.out" 2>/dev/null
diff -r "$work/many" "$work/many.out"
diff -r "$work/many" "$work/mnt/packs/many/.view"

# Bad arguments.
if "$bin" pack "$work/src" 2>"$work/err"; then exit 1; fi
grep -q "SRC... DST expected" "$work/err"
if "$bin" pack "$work/src" /packs/p 2>"$work/err"; then exit 1; fi
grep -q "holds a pack already" "$work/err"
if "$bin" pack --verify /packs/none 2>"$work/err"; then exit 1; fi
grep -q "No such file or directory" "$work/err"
"$bin" mkdir /notapack
if "$bin" pack --list /notapack 2>"$work/err"; then exit 1; fi
grep -q "no pack index" "$work/err"
echo "pack cli: ok"

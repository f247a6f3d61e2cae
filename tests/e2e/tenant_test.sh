#!/usr/bin/env bash
# Tenants and tokens end to end (docs/security.md), on a `cistern up` with a
# key file started here on free ports: a call without a token, with a
# forged or read-only one, is refused with its own error; an admin makes
# two tenants; each tenant's token (through the CLI and through a mount of
# its own) sees only its subtree as /, with root squashed to its uid; the
# admin's mv across tenants copies (EXDEV); a revoked token stops working.
set -euo pipefail
bin=${1:?usage: tenant_test.sh CISTERN_BIN}
work=$(mktemp -d /tmp/cistern-tenant-XXXXXX)
up=""
mnt_a=""
cleanup() {
  [[ -n $mnt_a ]] && kill "$mnt_a" 2>/dev/null && wait "$mnt_a" 2>/dev/null
  umount -l "$work/mnt-alpha" 2>/dev/null || true
  [[ -n $up ]] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "tenant_test: line $LINENO failed: $BASH_COMMAND" >&2
      for f in "$work"/out "$work"/up.log "$work"/mount-alpha.log; do
        [[ -f $f ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
      done' ERR
fails() {  # the command must fail and print $1 (stdout or stderr)
  local text=$1 rc=0
  shift
  "$@" >"$work/out" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]] || ! grep -F -- "$text" "$work/out" >/dev/null; then
    echo "expected a failure saying '$text' from: $* (got $rc):" >&2
    cat "$work/out" >&2
    exit 1
  fi
}
as() {  # as TOKEN-FILE cistern-args...: a CLI call carrying that token
  local tok=$1
  shift
  CISTERN_TOKEN=$(cat "$tok") "$bin" "$@"
}

"$bin" token keygen --id 1 >"$work/keys"
chmod 600 "$work/keys"
printf 'auth.keys_file = "%s"\nauth.capability_ttl_s = 30\n' "$work/keys" >"$work/up.toml"
mkdir "$work/mnt" "$work/mnt-alpha"
"$bin" up --data "$work/data" --listen 127.0.0.1:0 --config "$work/up.toml" --mount "$work/mnt" \
  >"$work/up.log" 2>&1 &
up=$!
for _ in $(seq 300); do grep -q "cistern up: ready" "$work/up.log" && break; sleep 0.1; done
export CISTERN_CLUSTER=$(awk '/cistern up: cluster /{print $4; exit}' "$work/up.log")
[[ -n $CISTERN_CLUSTER ]] || { cat "$work/up.log"; exit 1; }
unset CISTERN_TOKEN

issue() { "$bin" token issue --keys "$work/keys" "$@"; }
issue --tenant cluster --rights rwa >"$work/admin.tok"
issue --tenant alpha --uid 1000 --gid 1000 --rights rw >"$work/alpha.tok"
issue --tenant beta --uid 2000 --gid 2000 --rights rw >"$work/beta.tok"
issue --tenant alpha --uid 1000 --gid 1000 --rights r >"$work/alpha-ro.tok"
issue --tenant alpha --uid 1000 --gid 1000 --rights rwa >"$work/alpha-admin.tok"

# No token, a forged one, a tenant that does not exist yet.
fails "this cluster checks tokens and the call carried none" "$bin" ls /
tok=$(cat "$work/alpha.tok")
admin=$(cat "$work/admin.tok")
echo "${admin%.*}.${tok##*.}" >"$work/forged.tok"
fails "MAC is wrong" as "$work/forged.tok" ls /
fails "which does not exist" as "$work/alpha.tok" ls /

as "$work/admin.tok" tenant create alpha --uid 1000 --gid 1000 | grep "tenant alpha (id 1): root /alpha" >/dev/null
as "$work/admin.tok" tenant create beta --dir /teams-beta --uid 2000 --gid 2000 --mode 750 >/dev/null
fails "tenant alpha: File exists" as "$work/admin.tok" tenant create alpha --dir /other
# mgmtd too: no token reads no routing; a tenant reads it but runs no fsck.
fails "carried none" "$bin" status
as "$work/admin.tok" status >/dev/null
as "$work/alpha.tok" status >/dev/null
fails "needs a token of tenant cluster with right a" as "$work/alpha.tok" fsck
# Tenants are the cluster admin's: not a tenant's, even with right a.
fails "only a token of tenant cluster" as "$work/alpha-admin.tok" tenant create gamma
as "$work/admin.tok" tenant ls >"$work/tenants"
grep -E "^alpha +1 " "$work/tenants" >/dev/null
grep -E "^beta +2 " "$work/tenants" >/dev/null
as "$work/alpha.tok" token whoami | grep "^tenant alpha: uid 1000 gid 1000, rights rw" >/dev/null

# Each tenant's / is its own root.
head -c 300000 /dev/urandom >"$work/a.bin"
head -c 5000 /dev/urandom >"$work/b.bin"
as "$work/alpha.tok" put "$work/a.bin" /a.bin
as "$work/beta.tok" put "$work/b.bin" /b.bin
[[ $(as "$work/alpha.tok" ls /) == "a.bin" ]]
[[ $(as "$work/beta.tok" ls /) == "b.bin" ]]
as "$work/alpha.tok" cat /a.bin | cmp - "$work/a.bin"
fails "No such file" as "$work/beta.tok" cat /a.bin
fails "No such file" as "$work/beta.tok" cat /alpha/a.bin
fails "No such file" as "$work/alpha.tok" ls /teams-beta
# The admin's mount sees both where they are.
cmp "$work/mnt/alpha/a.bin" "$work/a.bin"
cmp "$work/mnt/teams-beta/b.bin" "$work/b.bin"
[[ $(stat -c %u "$work/mnt/alpha/a.bin") == 1000 ]]  # root (this test) squashed to 1000
# A read-only token reads and does not write.
as "$work/alpha-ro.tok" cat /a.bin | cmp - "$work/a.bin"
fails "Read-only file system (token" as "$work/alpha-ro.tok" put "$work/b.bin" /nope.bin

# alpha's own mount: its subtree as /, writes land in it, owned by 1000.
"$bin" mount --token-file "$work/alpha.tok" "$work/mnt-alpha" >"$work/mount-alpha.log" 2>&1 &
mnt_a=$!
for _ in $(seq 100); do grep -q "mounted at" "$work/mount-alpha.log" && break; sleep 0.1; done
[[ $(ls "$work/mnt-alpha") == "a.bin" ]]
cmp "$work/mnt-alpha/a.bin" "$work/a.bin"
echo "from the mount" >"$work/mnt-alpha/note.txt"
mkdir "$work/mnt-alpha/dir"
mv "$work/mnt-alpha/note.txt" "$work/mnt-alpha/dir/note.txt"
[[ $(cat "$work/mnt/alpha/dir/note.txt") == "from the mount" ]]
[[ $(stat -c %u "$work/mnt/alpha/dir/note.txt") == 1000 ]]
[[ $(stat -c %i "$work/mnt-alpha") == 1 ]]  # its root is inode 1 to it
[[ $(ls -a "$work/mnt-alpha/.." | wc -l) -gt 0 ]]  # the mount's parent: the host's, not the cluster's

# Quotas: the admin bounds alpha; alpha's df shows it, a put past it is
# EDQUOT, and alpha sets quotas inside its own subtree but not on its root.
as "$work/admin.tok" tenant set alpha --bytes 2M --inodes 100 >"$work/q"
grep -E "^tenant alpha .* 2.0 MiB .* 100$" "$work/q" >/dev/null
[[ $(df -B1 --output=size "$work/mnt-alpha" | tail -1 | tr -d ' ') == 2097152 ]]
head -c 3000000 /dev/urandom >"$work/big.bin"
fails "Disk quota exceeded" as "$work/alpha.tok" put "$work/big.bin" /big.bin
issue --tenant alpha --uid 1000 --gid 1000 --rights rwa >"$work/alpha-admin2.tok"
as "$work/alpha-admin2.tok" quota set /dir --inodes 1 >/dev/null
fails "Disk quota exceeded" touch "$work/mnt-alpha/dir/second"
as "$work/alpha-admin2.tok" quota get /dir | grep -E "^/dir .* 1 +1$" >/dev/null
fails "root is the cluster admin's to set" as "$work/alpha-admin2.tok" quota set / --bytes 1G
fails "not a" as "$work/alpha.tok" quota set /dir --inodes 5
[[ $(as "$work/alpha.tok" quota ls | wc -l) -eq 3 ]]  # header, alpha's root, /dir
[[ $(as "$work/beta.tok" quota ls | wc -l) -eq 1 ]]   # none of alpha's
as "$work/admin.tok" quota rm /alpha/dir
fails "--bytes: '12Q' is not a size" as "$work/admin.tok" quota set /alpha --bytes 12Q

# The admin moves a file across tenants: a copy (EXDEV), which beta then reads.
mv "$work/mnt/alpha/a.bin" "$work/mnt/teams-beta/from-alpha.bin"
as "$work/beta.tok" cat /from-alpha.bin | cmp - "$work/a.bin"
[[ ! -e $work/mnt-alpha/a.bin ]]

# Revoked: refused within a second or two (meta re-reads the list each second).
as "$work/admin.tok" token revoke "$(cat "$work/alpha.tok")" | grep "^revoked token" >/dev/null
for _ in $(seq 50); do
  as "$work/alpha.tok" ls / >/dev/null 2>&1 || break
  sleep 0.1
done
fails "was revoked" as "$work/alpha.tok" ls /
fails "Key has been revoked" ls "$work/mnt-alpha/dir"
# Another alpha token still works; removing the tenant ends that too.
as "$work/alpha-ro.tok" ls / >/dev/null
as "$work/admin.tok" tenant rm alpha
for _ in $(seq 50); do
  as "$work/alpha-ro.tok" ls / >/dev/null 2>&1 || break
  sleep 0.1
done
fails "which does not exist" as "$work/alpha-ro.tok" ls /
[[ -d $work/mnt/alpha/dir ]]  # its files stay for the operator
echo "tenant test: ok"

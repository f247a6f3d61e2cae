#!/usr/bin/env bash
# cistern token keygen / issue / inspect: a key file of two keys (rotation)
# signs a token that inspect accepts with its fields; a key file readable by
# others, a forged token, one signed by a key the file lacks and bad
# arguments are refused with a clear reason.
set -euo pipefail
bin=${1:?usage: token_cli_test.sh CISTERN_BIN}
work=$(mktemp -d /tmp/cistern-token-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
trap 'echo "token_cli_test: line $LINENO failed: $BASH_COMMAND" >&2' ERR
fails() {  # the command must fail with exit status $1 and print $2 (stdout or stderr)
  local want=$1 text=$2 rc=0
  shift 2
  "$@" >"$work/out" 2>&1 || rc=$?
  if [[ $rc -ne $want ]] || ! grep -F -- "$text" "$work/out" >/dev/null; then
    echo "expected exit $want and '$text' from: $* (got $rc):" >&2
    cat "$work/out" >&2
    exit 1
  fi
}

"$bin" token keygen --id 2 >"$work/keys"
"$bin" token keygen --id 1 >>"$work/keys"
chmod 600 "$work/keys"
[[ $(wc -l <"$work/keys") -eq 2 ]]
tok=$("$bin" token issue --keys "$work/keys" --tenant team-a --uid 1000 --gid 100 --rights rw --ttl 600)
[[ $tok == cst1.* ]]
"$bin" token inspect "$tok" --keys "$work/keys" >"$work/said"
grep -E "^token [0-9a-f]{16} of tenant team-a: uid 1000 gid 100, rights rw, key 2, expires in (599|600) s$" \
  "$work/said" >/dev/null

# The old key alone (rotation's other side) does not know key 2.
sed -n 2p "$work/keys" >"$work/old"
chmod 600 "$work/old"
fails 1 "kTokenInvalid" "$bin" token inspect "$tok" --keys "$work/old"
fails 1 "lacks" "$bin" token inspect "$tok" --keys "$work/old"
# Forged: another token's body (more rights) under this one's MAC.
admin=$("$bin" token issue --keys "$work/keys" --tenant team-a --rights rwa)
forged="${admin%.*}.${tok##*.}"
fails 1 "MAC is wrong" "$bin" token inspect "$forged" --keys "$work/keys"
fails 1 "kTokenInvalid" "$bin" token inspect "not-a-token" --keys "$work/keys"
# Bad arguments and key files.
chmod 644 "$work/keys"
fails 2 "chmod 600" "$bin" token issue --keys "$work/keys" --tenant team-a
chmod 600 "$work/keys"
fails 2 "rights" "$bin" token issue --keys "$work/keys" --tenant team-a --rights rx
fails 2 "tenant name" "$bin" token issue --keys "$work/keys" --tenant "Team A"
fails 2 "--ttl" "$bin" token issue --keys "$work/keys" --tenant team-a --ttl 0
fails 2 "No such file" "$bin" token issue --keys "$work/none" --tenant team-a
echo "token cli: ok"

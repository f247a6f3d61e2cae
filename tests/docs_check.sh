#!/usr/bin/env bash
# Docs true to the code: every fault point in src/ is listed in
# docs/fault_points.md, and every docs/*.md that the code, the docs or the
# README name, and every relative link in them, exists.
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0

# Fault points named in the code (tests enable them by these names).
while read -r point; do
  if ! grep -q "\`${point}\`" docs/fault_points.md; then
    echo "docs/fault_points.md does not list the fault point ${point}"
    fail=1
  fi
done < <(grep -rhoE 'CISTERN_FAULT\("[a-z_.]+"\)' src --include='*.cc' --include='*.h' \
           --exclude='*_test.cc' --exclude='fault.h' |
         sed -E 's/CISTERN_FAULT\("([^"]+)"\)/\1/' | sort -u)

# docs/NAME.md named anywhere in the tree.
while read -r doc; do
  [[ -f $doc ]] || { echo "${doc} is named but does not exist"; fail=1; }
done < <(grep -rhoE 'docs/[A-Za-z0-9_-]+\.md' --exclude=docs_check.sh src include tests bench docs README.md Makefile \
           scripts 2>/dev/null | sort -u)

# Relative links in the markdown files.
for md in README.md docs/*.md bench/RESULTS.md; do
  [[ -f $md ]] || continue
  dir=$(dirname "$md")
  while read -r target; do
    [[ $target == http* || $target == mailto:* ]] && continue
    [[ $target == ../* ]] && continue  # outside the repository (../shared/)
    [[ -e $dir/$target ]] || { echo "${md} links to ${target}, which does not exist"; fail=1; }
  done < <(grep -oE '\]\([^)#]+' "$md" | sed -E 's/^\]\(//' | sort -u)
done

if [[ $fail == 0 ]]; then echo "docs_check: fault points and doc links agree with the tree"; fi
exit $fail

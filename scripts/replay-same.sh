#!/usr/bin/env bash
# Every committed recording replayed by two builds of linger, output compared byte for byte:
# how a refactor shows that it changed no answer. Replays each trace under tests/data as text
# and as JSON, and names every recording whose output differs (exit 1 if any does).
#
# usage: bash scripts/replay-same.sh OLD_LINGER NEW_LINGER
#        e.g. build the commit before the change, copy target/release/linger aside, build the
#        change, and compare the two.
set -u
cd "$(dirname "$0")/.."
old=$1 new=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0 n=0
while read -r t; do
  n=$((n + 1))
  for how in text json; do
    flags=()
    [ "$how" = json ] && flags=(--json)
    "$old" replay "${flags[@]}" "$t" >"$work/old" 2>"$work/old.err"
    o=$?
    "$new" replay "${flags[@]}" "$t" >"$work/new" 2>"$work/new.err"
    w=$?
    if [ $o != $w ] || ! cmp -s "$work/old" "$work/new"; then
      echo "differs ($how, exit $o -> $w): $t"
      diff "$work/old" "$work/new" | head -5
      differ=$((differ + 1))
    fi
  done
done < <(git ls-files tests/data | grep -E '\.(trace|lgr)$')
echo "$n recordings replayed as text and JSON by both builds: $differ outputs differ"
[ $differ = 0 ]

#!/usr/bin/env bash
# H200: the whole tool on the final build: doctor and demo, then the two kills of kills.sh.
# Writes under $OUT.
set -u
L=${L:-target/release/linger}
{ echo "== doctor"; $L doctor; echo "== doctor --json"; $L doctor --json; echo "== demo"; $L demo; } \
  > "$OUT/doctor-demo.txt" 2>&1
L=$L bash "$(dirname "$0")/kills.sh"

#!/usr/bin/env bash
# H200: the scenario suite beside `linger live --record` in each mode of MODES (default: the
# default mode, then --lean), with `linger doctor` first. Everything lands in $OUT/suite.tgz
# (plus the logs).
# usage: L=path/to/linger [MODES="default lean"] bash scripts/h200/suite/run.sh [SCENARIO...]
set -u
L=${L:-target/release/linger}
MODES=${MODES:-default lean}
S=$(dirname "$0")
W=$(mktemp -d)
{ uname -a; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv;
  $L doctor; } > "$W/doctor.txt" 2>&1
for mode in $MODES; do
  flags=""
  [ "$mode" = lean ] && flags="--lean"
  LINGER_FLAGS="$flags" PYTHONUNBUFFERED=1 timeout 290 python3 "$S/run.py" "$L" "$W/$mode" "$@" \
    2>&1 | tee "$W/$mode.log"
done
tar czf "$OUT/suite.tgz" -C "$W" .
cp "$W"/*.log "$W/doctor.txt" "$OUT/"

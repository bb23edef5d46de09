#!/usr/bin/env bash
# H200: the scenario suite, twice (timing varies from run to run), beside `linger live
# --record`; doctor first. Everything lands in $OUT/suite.tgz (plus the logs).
# usage: L=path/to/linger bash scripts/h200/suite/run.sh [SCENARIO...]
set -u
L=${L:-target/release/linger}
S=$(dirname "$0")
W=$(mktemp -d)
{ uname -a; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv;
  $L doctor; } > "$W/doctor.txt" 2>&1
for pass in 1 2; do
  PYTHONUNBUFFERED=1 timeout 290 python3 "$S/run.py" "$L" "$W/pass$pass" "$@" 2>&1 | tee "$W/pass$pass.log"
done
tar czf "$OUT/suite.tgz" -C "$W" .
cp "$W"/*.log "$W/doctor.txt" "$OUT/"

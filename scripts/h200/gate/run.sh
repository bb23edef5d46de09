#!/usr/bin/env bash
# H200: the gate (`linger wait`) after a plain 32 GiB kill and around DataLoader-style forked
# workers, against the suite's 1 ms NVML poll (gate.py says what each case checks). Writes
# $OUT/gate.json and $OUT/gate.log; about a minute (each victim imports PyTorch).
# usage: L=path/to/linger [ROUNDS=2] bash scripts/h200/gate/run.sh
set -u
L=${L:-target/release/linger}
PYTHONUNBUFFERED=1 timeout 110 python3 "$(dirname "$0")/gate.py" "$L" "$OUT" "${ROUNDS:-2}" \
  2>&1 | tee "$OUT/gate.log"

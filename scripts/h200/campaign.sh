#!/usr/bin/env bash
# H200: the termination campaign (campaign.py) beside one `linger live --record`; everything
# lands in $OUT/campaign.tgz, the progress log in $OUT/campaign.log. LIMIT (seconds, default
# 540) stops it cleanly so that one device call holds it.
# usage: L=path/to/linger [RUNS=10] [LIMIT=540] bash scripts/h200/campaign.sh [MODE...]
set -u
L=${L:-target/release/linger}
W=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > "$W/gpu.txt"
PYTHONUNBUFFERED=1 timeout "${LIMIT:-540}" python3 "$(dirname "$0")/campaign.py" "$L" "$W" "$@" \
    > "$W/campaign.log" 2>&1
echo "campaign exit $?" >> "$W/campaign.log"
tail -n 100 "$W/campaign.log" > "$OUT/campaign.log"
tar czf "$OUT/campaign.tgz" -C "$W" .

#!/usr/bin/env bash
# H200: doctor, demo, and one traced SIGKILL of a 16 GiB PyTorch process.
set -u
L=${L:-target/release/linger}
OUT=${OUT:-/tmp/out}
{
  echo "== doctor"; $L doctor
  echo "== doctor --json"; $L doctor --json
  echo "== demo"; $L demo
  echo "== demo --json --threads 8"; $L demo --json --threads 8
} > "$OUT/doctor-demo.txt" 2>&1

python3 scripts/h200/gpu_hold.py --gib 16 > /tmp/hold.out 2>&1 &
HOLD=$!
for _ in $(seq 600); do grep -q READY /tmp/hold.out && break; sleep 0.1; done
$L live --json --pid "$HOLD" --count 1 --duration 30s > "$OUT/live-16g.jsonl" 2> "$OUT/live-16g.err" &
LIVE=$!
sleep 2
{
  echo "== /proc/devices"; cat /proc/devices
  echo "== /dev/nvidia*"; ls -l /dev/nvidia* /dev/nvidia-caps 2>&1
  echo "== fds of $HOLD"; ls -l /proc/$HOLD/fd | grep -E 'nvidia|dri' 
  echo "== fdinfo of first nvidia fds"; for fd in $(ls -l /proc/$HOLD/fd | awk '/nvidia/ {print $9}' | head -3); do cat /proc/$HOLD/fdinfo/$fd; done
  echo "== btf"; ls /sys/kernel/btf | grep -i nv
  echo "== driver"; cat /proc/driver/nvidia/version
  echo "== nvidia-smi"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv
  echo "== threads"; ls /proc/$HOLD/task | wc -l
} > "$OUT/gpu-facts.txt" 2>&1
python3 scripts/h200/nvml_poll.py "$HOLD" 8 > "$OUT/kill-poll.txt" 2>&1
wait "$HOLD" 2>/dev/null
wait "$LIVE"
echo "live rc=$?" >> "$OUT/live-16g.err"

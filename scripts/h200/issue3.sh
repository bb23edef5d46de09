#!/usr/bin/env bash
# H200: GPU holders, ledger and NVML. Writes under $OUT.
set -u
L=${L:-target/release/linger}
H=scripts/h200
wait_ready() { for _ in $(seq 900); do grep -q READY "$1" && return 0; sleep 0.1; done; return 1; }
ready_pid() { awk '/READY/ {print $2; exit}' "$1"; }

$L live --json --record "$OUT/plain-kill-16g.trace" --linger-after 10s --duration 40s \
  > "$OUT/live.jsonl" 2> "$OUT/live.err" &
LIVE=$!
sleep 3

# 1. Plain SIGKILL of a 16 GiB process, timed by an independent NVML poll.
python3 $H/gpu_hold.py --gib 16 > /tmp/p.out 2>&1 &
wait_ready /tmp/p.out; P=$(ready_pid /tmp/p.out); sleep 1.5
python3 $H/nvml_poll.py "$P" 8 > "$OUT/poll.txt" 2>&1
wait

# 2. A process forks after CUDA init, the parent is killed, the child keeps the memory.
python3 $H/gpu_hold.py --gib 4 --fork > /tmp/f.out 2>&1 &
wait_ready /tmp/f.out; P=$(ready_pid /tmp/f.out); C=$(pgrep -P "$P" | head -1); sleep 1.5
kill -9 "$P"; sleep 2
{ echo "== parent $P child $C"; $L holders; $L holders --json; nvidia-smi; } > "$OUT/forked.txt" 2>&1
python3 $H/nvml_poll.py "$C" 3 >> "$OUT/poll.txt" 2>&1
sleep 1

# 3. An allocation larger than the free memory.
python3 $H/oom_alloc.py > "$OUT/oom.txt" 2>&1
sleep 12
kill -INT $LIVE; wait $LIVE
echo "live rc=$?" >> "$OUT/live.err"

# 4. Cost per decoded GPU ioctl: cudaMalloc/cudaFree of 64 MiB, untraced vs traced, ABAB.
{
  for round in 1 2 3; do
    echo "untraced $(python3 $H/malloc_loop.py 400)"
    $L live --json --duration 60s > /dev/null 2>&1 & T=$!; sleep 2
    echo "traced $(python3 $H/malloc_loop.py 400)"
    kill -INT $T; wait $T
  done
} > "$OUT/malloc-bench.txt" 2>&1
ls -la "$OUT"

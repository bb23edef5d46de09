#!/usr/bin/env bash
# H200: the two kills recorded as fixtures (tests/data/h200/issue4 and final): a plain SIGKILL of
# 16 GiB and a forked holder of 4 GiB, each beside an independent NVML poll. Writes under $OUT.
set -u
L=${L:-target/release/linger}
H=scripts/h200
wait_ready() { for _ in $(seq 900); do grep -q READY "$1" && return 0; sleep 0.1; done; return 1; }
ready_pid() { awk '/READY/ {print $2; exit}' "$1"; }
wait_tracing() { for _ in $(seq 100); do grep -q tracing "$1" && return 0; sleep 0.1; done; }

# 1. Plain SIGKILL of a 16 GiB process, beside an independent NVML poll; linger starts first
#    so the ledger sees every allocation.
$L live --json --record "$OUT/plain-kill-16g.trace" --count 1 --duration 90s \
  > "$OUT/plain-kill-16g.jsonl" 2> /tmp/plain.err &
LIVE=$!; wait_tracing /tmp/plain.err
python3 $H/gpu_hold.py --gib 16 > /tmp/p.out 2>&1 &
wait_ready /tmp/p.out; P=$(ready_pid /tmp/p.out); sleep 1.2
python3 $H/nvml_poll.py "$P" 8 > "$OUT/poll.txt" 2>&1
wait $LIVE; wait

# 2. Forked holder: the parent dies, the child keeps 4 GiB; a refused allocation meanwhile;
#    then the child is killed and the memory comes back.
$L live --json --record "$OUT/forked-holder-4g.trace" --linger-after 3s --count 3 --duration 90s \
  > "$OUT/forked-holder-4g.jsonl" 2> /tmp/forked.err &
LIVE=$!; wait_tracing /tmp/forked.err
python3 $H/gpu_hold.py --gib 4 --fork > /tmp/f.out 2>&1 &
wait_ready /tmp/f.out; P=$(ready_pid /tmp/f.out); C=$(pgrep -P "$P" | head -1); sleep 1.2
kill -9 "$P"; sleep 1
python3 $H/oom_alloc.py > /tmp/oom.txt 2>&1
sleep 2
$L holders > /tmp/holders.txt 2>&1
python3 $H/nvml_poll.py "$C" 3 >> "$OUT/poll.txt" 2>&1
wait $LIVE; wait
{
  for f in /tmp/plain.err /tmp/forked.err /tmp/oom.txt /tmp/holders.txt; do echo "== $f"; cat "$f"; done
  echo "== replay plain"; $L replay "$OUT/plain-kill-16g.trace"
  echo "== replay forked"; $L replay "$OUT/forked-holder-4g.trace"
} > "$OUT/summary.txt" 2>&1

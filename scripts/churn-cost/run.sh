#!/bin/bash
# The agent's CPU per kill, by part of its work, under a churn of stand-in GPU jobs on a
# machine without a GPU (as root): each job opens a stand-in device (/dev/full's numbers,
# declared with --gpu-device) 60 times and keeps 24, makes 300 ioctls on it, starts 8 threads
# and fills MB of memory, whose freeing at the kill gives its teardown CPU time to sample.
# Builds side by side, interleaved for ROUNDS rounds:
#   BUILDS="/tmp/linger-base target/release/linger" ROUNDS=2 SECONDS_EACH=60 WORKERS=8 MB=768 \
#     bash scripts/churn-cost/run.sh
# Prints, per run, CPU ms per kill by part (linger_collector_cpu_seconds_total / kills) and in
# all (/proc ticks of 10 ms), the incidents by verdict and the stacks the kernel lost.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=${WORK:-/tmp/linger-churn-cost}
mkdir -p "$work"
gcc -O2 -pthread -o "$work/job" "$here/job.c"
[ -c "$work/gpu0" ] || mknod "$work/gpu0" c 1 7
port=19481
for r in $(seq "${ROUNDS:-2}"); do
  for b in ${BUILDS:-target/release/linger}; do
    state="$work/state"; rm -rf "$state"
    "$b" agent --gpu-device "$work/gpu0" --no-nvml --state-dir "$state" \
      --metrics-listen 127.0.0.1:$port --duration $(( ${SECONDS_EACH:-60} + 20 ))s --force \
      > /dev/null 2> "$work/agent.err" &
    agent=$!
    for _ in $(seq 100); do grep -qs tracing "$work/agent.err" && break; sleep 0.1; done
    sleep 2
    before=$(awk '{print $14+$15}' /proc/$agent/stat)
    kills=$(python3 "$here/churn.py" "$work/job" "$work/gpu0" "${SECONDS_EACH:-60}" "${WORKERS:-8}" "${MB:-768}")
    sleep 3
    after=$(awk '{print $14+$15}' /proc/$agent/stat)
    metrics=$(curl -s 127.0.0.1:$port/metrics)
    echo "round $r $b: $kills kills, agent CPU $(( (after - before) * 10000 / kills )) us a kill"
    echo "$metrics" | grep '^linger_collector_cpu_seconds_total' | sort |
      awk -v k="$kills" -F'[{}"]' '{ split($0, v, " "); printf "  %s %.2f", $3, v[2] * 1000 / k } END { print " (ms a kill)" }'
    echo "$metrics" | grep -E '^linger_(incidents_total|lost_records_total)' | sort | tr '\n' ' '
    echo
    kill -INT $agent; wait $agent || true
  done
done

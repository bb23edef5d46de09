#!/bin/bash
# linger's CPU time per thread over a storm of 5000 kills of processes that never touch a GPU
# (kill-storm.c: fork, exec /bin/sleep, SIGKILL, waitpid). Built here
# (`gcc -O2 -o target/h200/kill-storm scripts/h200/kill-storm.c`) and carried with the stripped
# builds. Every round runs each configuration with each build, interleaved:
#   BUILDS   linger binaries (default /tmp/linger)
#   CONFIGS  `linger live` options, configurations separated by ';' (default ";--sample-hz 0;--no-nvml")
#   ROUNDS   default 2
# Two builds side by side (tests/data/h200/storms/collector-cost-readings.txt):
#   BUILDS="/tmp/linger-base /tmp/linger-new" CONFIGS=";--no-nvml" ROUNDS=3
# Ticks of 10 ms: the figures are rough.
BUILDS=${BUILDS:-/tmp/linger}
IFS=';' read -r -a configs <<< "${CONFIGS-;--sample-hz 0;--no-nvml}"
snap() { for t in /proc/$1/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done; }
for r in $(seq "${ROUNDS:-2}"); do
 for args in "${configs[@]}"; do
  for b in $BUILDS; do
   rm -f /tmp/c.err; $b live --json $args > /tmp/c.json 2> /tmp/c.err & LP=$!
   for i in $(seq 100); do grep -qs tracing /tmp/c.err && break; sleep 0.1; done
   sleep 0.5
   snap $LP > /tmp/a.txt; S=$(date +%s%N)
   taskset -c 2 target/h200/kill-storm 5000; E=$(date +%s%N); sleep 2.5
   snap $LP > /tmp/b.txt
   echo "$(basename $b) args='$args' round $r storm $(( (E-S)/1000000 )) ms: $(join /tmp/a.txt /tmp/b.txt | awk '{printf "%s=%d ", $2, ($5-$3)*10}') (ms CPU) incidents $(grep -c '"type":"incident"' /tmp/c.json)"
   kill -INT $LP; wait $LP
  done
 done
done

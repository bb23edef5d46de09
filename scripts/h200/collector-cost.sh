#!/bin/bash
# linger's CPU time per thread over a storm of 5000 kills of processes that never touch a GPU
# (kill-storm.c: fork, exec /bin/sleep, SIGKILL, waitpid), twice in each configuration. Built
# here (`gcc -O2 -o target/h200/kill-storm scripts/h200/kill-storm.c`), carried with the
# stripped linger, which this expects at /tmp/linger. Ticks of 10 ms: the figures are rough.
for args in "" "--sample-hz 0" "--no-nvml"; do
 for r in 1 2; do
  rm -f /tmp/c.err; /tmp/linger live --json $args > /tmp/c.json 2> /tmp/c.err & LP=$!
  for i in $(seq 100); do grep -qs tracing /tmp/c.err && break; sleep 0.1; done
  sleep 0.5
  snap() { for t in /proc/$LP/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done; }
  snap > /tmp/a.txt; S=$(date +%s%N)
  taskset -c 2 target/h200/kill-storm 5000; E=$(date +%s%N); sleep 2.5
  snap > /tmp/b.txt
  echo "args='$args' round $r storm $(( (E-S)/1000000 )) ms: $(join /tmp/a.txt /tmp/b.txt | awk '{printf "%s=%d ", $2, ($5-$3)*10}') (ms CPU)"
  kill -INT $LP; wait $LP
 done
done

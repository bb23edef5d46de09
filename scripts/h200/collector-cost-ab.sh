#!/bin/bash
# Two builds side by side: linger's CPU time per thread over a storm of 5000 kills of processes
# that never touch a GPU (kill-storm.c), default mode and --no-nvml, builds interleaved, three
# rounds. Expects the stripped builds xz-compressed at target/h200/linger-base.xz and
# target/h200/linger-new.xz and kill-storm at target/h200/kill-storm, all carried.
xz -dc target/h200/linger-base.xz > /tmp/linger-base && xz -dc target/h200/linger-new.xz > /tmp/linger-new
chmod +x /tmp/linger-base /tmp/linger-new
for r in 1 2 3; do
 for args in "" "--no-nvml"; do
  for b in base new; do
   rm -f /tmp/c.err; /tmp/linger-$b live --json $args > /tmp/c-$b.json 2> /tmp/c.err & LP=$!
   for i in $(seq 100); do grep -qs tracing /tmp/c.err && break; sleep 0.1; done
   sleep 0.5
   snap() { for t in /proc/$LP/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done; }
   snap > /tmp/a.txt; S=$(date +%s%N)
   taskset -c 2 target/h200/kill-storm 5000; E=$(date +%s%N); sleep 2.5
   snap > /tmp/b.txt
   echo "$b args='$args' round $r storm $(( (E-S)/1000000 )) ms: $(join /tmp/a.txt /tmp/b.txt | awk '{printf "%s=%d ", $2, ($5-$3)*10}') (ms CPU) incidents $(grep -c '"type":"incident"' /tmp/c-$b.json)"
   kill -INT $LP; wait $LP
  done
 done
done

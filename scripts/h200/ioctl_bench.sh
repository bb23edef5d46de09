#!/usr/bin/env bash
# H200: what tracing costs a cudaMalloc/cudaFree loop, by tracer feature, interleaved rounds.
set -u
L=${L:-target/release/linger}
H=scripts/h200
wait_tracing() { for _ in $(seq 100); do grep -q tracing "$1" && return 0; sleep 0.1; done; }

# How many GPU ioctls one round trip costs, by command.
if [ "${COUNT:-1}" = 1 ]; then
$L live --json --events --no-nvml --duration 120s > /tmp/ev.jsonl 2> /tmp/ev.err & T=$!
wait_tracing /tmp/ev.err
python3 $H/malloc_loop.py 100 > /tmp/ml.out
kill -INT $T; wait $T
python3 - > "$OUT/ioctl-counts.txt" <<'PY'
import collections, json
pid_of = None
c = collections.Counter(); per = collections.Counter()
for l in open("/tmp/ev.jsonl"):
    d = json.loads(l)
    if d.get("type") != "event" or d["event"]["data"]["kind"] != "gpu_ioctl":
        continue
    per[d["event"]["pid"]] += 1
pid, n = per.most_common(1)[0]
for l in open("/tmp/ev.jsonl"):
    d = json.loads(l)
    if d.get("type") == "event" and d["event"]["pid"] == pid and d["event"]["data"]["kind"] == "gpu_ioctl":
        c[hex(d["event"]["data"]["cmd"])] += 1
print("ioctls of the loop process", pid, n, "for 100 round trips plus CUDA init")
for k, v in c.most_common(20):
    print(k, v)
PY
cat /tmp/ev.err >> "$OUT/ioctl-counts.txt"
fi

run() {  # variant, linger flags...
  local v=$1; shift
  if [ "$v" = untraced ]; then echo "$v $(python3 $H/malloc_loop.py 3000)"; return; fi
  $L live --json "$@" --duration 120s > /dev/null 2> /tmp/b.err & local T=$!
  wait_tracing /tmp/b.err
  echo "$v $(python3 $H/malloc_loop.py 3000) linger_cpu=$(ps -o %cpu= -p $T)"
  kill -INT $T; wait $T
  grep -i dropped /tmp/b.err
}
{
  for round in 1 2 3 4 5 6; do
    run untraced
    run traced
  done
} > "$OUT/malloc-bench.txt" 2>&1

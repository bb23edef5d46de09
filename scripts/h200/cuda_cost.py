"""What tracing costs CUDA calls, by mode and hook family, interleaved: one warm process runs a
64 MiB cudaMalloc+cudaFree loop in phases, and CUDA start-ups (a fresh process's first
cudaFree(0): the driver's initialization and a context) are timed in children, with no tracer
and under `linger live` in each mode, the modes' order rotated every round. Prints one line per
phase, then the table BENCHMARKS-H200.md keeps: per mode the median over rounds of the phase's
median round trip and of the start-ups, and each against the untraced phase of its own round.

usage: cuda_cost.py LINGER [ROUNDS] [ROUND_TRIPS] [STARTUPS]     (in under 5 minutes with 5 2000 3)
"""
import ctypes, signal, statistics, subprocess, sys, time

import torch

linger = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
startups = int(sys.argv[4]) if len(sys.argv) > 4 else 3
MODES = {
    "untraced": None,
    # The noise band: a second untraced phase in every round.
    "untraced again": None,
    "default": [],
    "--no-ioctls": ["--no-ioctls"],
    "--syscall-hooks": ["--syscall-hooks"],
    "--lean": ["--lean"],
}

torch.cuda.init()
maps = open("/proc/self/maps").read().split()
cudart = next((p for p in maps if "libcudart" in p), "libcudart.so")
rt = ctypes.CDLL(cudart)
ptr = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(ptr), 1 << 20) == 0
rt.cudaFree(ptr)

# A child's start-up alone: loading the runtime, then its first call, which initializes the
# driver and makes the context (about 600 ioctls).
STARTUP = f"""
import ctypes, time
rt = ctypes.CDLL({cudart!r})
t = time.perf_counter_ns()
assert rt.cudaFree(ctypes.c_void_p(0)) == 0
print((time.perf_counter_ns() - t) / 1e6)
"""


def malloc_phase():
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        assert rt.cudaMalloc(ctypes.byref(ptr), 64 << 20) == 0
        assert rt.cudaFree(ptr) == 0
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def startup_phase():
    ms = [float(subprocess.run([sys.executable, "-c", STARTUP], capture_output=True,
                               text=True, check=True).stdout) for _ in range(startups)]
    return statistics.median(ms)


def traced(args):
    tracer = subprocess.Popen([linger, "live", "--json", "--duration", "300s", *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while "tracing" not in tracer.stderr.readline():
        if tracer.poll() is not None:
            sys.exit(f"linger {' '.join(args)} ended before tracing")
    return tracer


results = {m: [] for m in MODES}  # mode -> [(malloc us, startup ms, round)]
names = list(MODES)
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for mode in order:
        tracer = traced(MODES[mode]) if MODES[mode] is not None else None
        malloc, start = malloc_phase(), startup_phase()
        if tracer:
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
        results[mode].append((malloc, start))
        print(f"round {r + 1} {mode}: malloc+free {malloc:.1f} us, start-up {start:.1f} ms",
              flush=True)

base = results["untraced"]
print(f"\n{rounds} rounds of {n} round trips and {startups} start-ups per mode "
      f"(`python3 scripts/h200/cuda_cost.py LINGER {rounds} {n} {startups}`)\n")
print("| mode | malloc+free, us (median) | against untraced (median of rounds; range) "
      "| start-up, ms (median) | against untraced (median of rounds; range) |")
print("|---|---|---|---|---|")
for mode, got in results.items():
    m_ratio = [g[0] / b[0] for g, b in zip(got, base)]
    s_ratio = [g[1] / b[1] for g, b in zip(got, base)]
    print(f"| {mode} | {statistics.median(g[0] for g in got):.1f} "
          f"| {statistics.median(m_ratio):.3f} ({min(m_ratio):.2f} - {max(m_ratio):.2f}) "
          f"| {statistics.median(g[1] for g in got):.1f} "
          f"| {statistics.median(s_ratio):.3f} ({min(s_ratio):.2f} - {max(s_ratio):.2f}) |")

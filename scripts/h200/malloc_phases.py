"""cudaMalloc/cudaFree of 64 MiB in ONE process, in phases that alternate untraced and traced
(a `linger live` started before the phase and stopped after it), so the driver's per-process
timing (bimodal between processes) cancels. Prints one line per phase: its mode and the median
and 10th percentile microseconds of a round trip.

usage: malloc_phases.py LINGER [PHASES] [ROUND_TRIPS] [LINGER ARGS...]"""
import ctypes, signal, subprocess, sys, time

import torch

linger = sys.argv[1]
phases = int(sys.argv[2]) if len(sys.argv) > 2 else 8
n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
extra = sys.argv[4:]
torch.cuda.init()
maps = open("/proc/self/maps").read().split()
rt = ctypes.CDLL(next((p for p in maps if "libcudart" in p), "libcudart.so"))
ptr = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(ptr), 1 << 20) == 0
rt.cudaFree(ptr)


def phase():
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        assert rt.cudaMalloc(ctypes.byref(ptr), 64 << 20) == 0
        assert rt.cudaFree(ptr) == 0
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return times[n // 2] / 1e3, times[n // 10] / 1e3


for k in range(phases):
    traced = k % 2 == 1
    tracer = None
    if traced:
        tracer = subprocess.Popen([linger, "live", "--json", "--duration", "300s", *extra],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while "tracing" not in tracer.stderr.readline():
            pass
    median, p10 = phase()
    if tracer:
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
    print(f"{'traced' if traced else 'untraced'} {median:.2f} p10={p10:.2f}", flush=True)

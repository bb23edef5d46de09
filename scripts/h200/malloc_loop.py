"""cudaMalloc/cudaFree of 64 MiB in a loop through the CUDA runtime: prints the median and
10th percentile microseconds of one round trip."""
import ctypes, sys, time

import torch

torch.cuda.init()
# The CUDA runtime torch loaded, wherever its wheel keeps it.
maps = open("/proc/self/maps").read().split()
lib = next((p for p in maps if "libcudart" in p), None)
rt = ctypes.CDLL(lib or "libcudart.so")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
ptr = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(ptr), 1 << 20) == 0
rt.cudaFree(ptr)
times = []
for _ in range(n):
    t = time.perf_counter_ns()
    assert rt.cudaMalloc(ctypes.byref(ptr), 64 << 20) == 0
    assert rt.cudaFree(ptr) == 0
    times.append(time.perf_counter_ns() - t)
times.sort()
# The median resists the driver's own bimodal timing (seen: 87-200 us between processes).
print(f"{times[n // 2] / 1e3:.2f} p10={times[n // 10] / 1e3:.2f}")

"""cudaMalloc/cudaFree of 64 MiB in a loop through the CUDA runtime: prints seconds per round."""
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
t = time.perf_counter()
for _ in range(n):
    assert rt.cudaMalloc(ctypes.byref(ptr), 64 << 20) == 0
    assert rt.cudaFree(ptr) == 0
print(f"{(time.perf_counter() - t) / n * 1e6:.2f}")

"""Independent NVML poll: kills PID and reports when GPU0's used memory drops by MIN_GIB."""
import os, sys, time

import pynvml

pid, min_gib = int(sys.argv[1]), float(sys.argv[2])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
used0 = pynvml.nvmlDeviceGetMemoryInfo(h).used
t0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
os.kill(pid, 9)
while True:
    used = pynvml.nvmlDeviceGetMemoryInfo(h).used
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    if used < used0 - min_gib * (1 << 30) or t - t0 > 20e9:
        break
print(f"pid={pid} kill_boot_ns={t0} back_boot_ns={t} kill_to_back_ms={(t - t0) / 1e6:.3f} used_before={used0} used_after={used}")

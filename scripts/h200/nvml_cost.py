"""What each NVML call linger's readings make costs in CPU, on a busy node: run it beside a churn
(the soak) and it times, every PERIOD seconds, the calls of one reading on its own thread's CPU
clock: memory_info, the compute and the graphics process lists, each as nvml-wrapper makes them
(a call for the count, then one for the list) and as one call into a buffer of 64.

usage: python3 nvml_cost.py SECONDS [PERIOD] > out.json   (prints one summary line per call)
"""
import ctypes, json, statistics, sys, time

import pynvml

seconds = float(sys.argv[1])
period = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25

pynvml.nvmlInit()
dev = pynvml.nvmlDeviceGetHandleByIndex(0)


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def raw(name):
    return pynvml._nvmlGetFunctionPointer(name)


compute = raw("nvmlDeviceGetComputeRunningProcesses_v3")
graphics = raw("nvmlDeviceGetGraphicsRunningProcesses_v3")
buf = (ProcessInfo * 64)()


def count_call(fn):
    n = ctypes.c_uint(0)
    fn(dev, ctypes.byref(n), None)
    return n.value


def two_calls(fn):
    n = count_call(fn)
    if n == 0:
        return 0
    m = ctypes.c_uint(n + 5)
    fn(dev, ctypes.byref(m), buf)
    return m.value


def one_call(fn):
    m = ctypes.c_uint(64)
    fn(dev, ctypes.byref(m), buf)
    return m.value


calls = {
    "memory_info": lambda: pynvml.nvmlDeviceGetMemoryInfo(dev),
    "compute_two_calls": lambda: two_calls(compute),
    "compute_one_call": lambda: one_call(compute),
    "graphics_two_calls": lambda: two_calls(graphics),
    "graphics_one_call": lambda: one_call(graphics),
}
cpu = {k: [] for k in calls}
listed = {k: [] for k in calls}
end = time.monotonic() + seconds
while time.monotonic() < end:
    for name, call in calls.items():
        t0 = time.thread_time_ns()
        try:
            r = call()
        except pynvml.NVMLError as e:
            r = str(e)
        cpu[name].append(time.thread_time_ns() - t0)
        listed[name].append(r if isinstance(r, (int, str)) else None)
    time.sleep(period)

for name, xs in cpu.items():
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))] / 1e6
    answers = [a for a in listed[name] if a is not None]
    print(json.dumps({"call": name, "n": len(xs), "cpu_ms_median": q(0.5), "p90": q(0.9),
                      "max": xs[-1] / 1e6, "mean": statistics.mean(xs) / 1e6,
                      "listed_max": max(answers, key=lambda a: a if isinstance(a, int) else -1)
                      if answers else None}))

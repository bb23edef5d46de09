"""The suite's own ground truth: an NVML poll every millisecond on a thread, independent of
linger. Keeps only readings where something changed (device used, the process list or a
process's figure), each as (boot_ns, used, {pid: bytes}), so a whole scenario stays small."""
import threading, time

import pynvml


def boot_ns():
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Poll:
    def __init__(self, index=0, period_s=0.001):
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period = period_s
        self.changes = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        while not self.changes:
            time.sleep(0.001)

    def read(self):
        used = pynvml.nvmlDeviceGetMemoryInfo(self.h).used
        procs = {p.pid: (p.usedGpuMemory or 0)
                 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self.h)}
        return boot_ns(), used, procs

    def _run(self):
        last = None
        while not self._stop.is_set():
            t, used, procs = self.read()
            self.reads += 1
            if last is None or used != last[1] or procs != last[2]:
                self.changes.append((t, used, procs))
            last = (t, used, procs)
            time.sleep(self.period)

    def stop(self):
        self._stop.set()
        self._thread.join()

    def now(self):
        """The latest reading."""
        return self.changes[-1]

    def window(self, t0, t1):
        """Change points in [t0, t1], JSON-ready."""
        return [[t, u, {str(k): v for k, v in p.items()}]
                for t, u, p in self.changes if t0 <= t <= t1]

    def at(self, t):
        """The reading in force at t."""
        cur = self.changes[0]
        for c in self.changes:
            if c[0] > t:
                break
            cur = c
        return cur

    def share(self, pid, t):
        """NVML's figure for pid in the reading in force at t (None: not listed)."""
        return self.at(t)[2].get(pid)

    def first(self, t0, pred, timeout_s=60):
        """When pred((t, used, procs)) first holds at or after t0 (t0 itself if it already
        held then), waiting for it; None after timeout_s."""
        deadline = time.monotonic() + timeout_s
        checked = 0
        while time.monotonic() < deadline:
            changes = self.changes
            for i in range(checked, len(changes)):
                c = changes[i]
                later = changes[i + 1][0] if i + 1 < len(changes) else None
                if later is not None and later <= t0:
                    continue  # superseded before t0
                if pred(c):
                    return max(c[0], t0)
            checked = max(checked, len(changes) - 1)
            time.sleep(0.005)
        return None

    def back_to(self, t0, level, timeout_s=60):
        """When used came down to level after being above it at or after t0 (a reading in force
        at t0 may predate an allocation made just before)."""
        held = self.first(t0, lambda c: c[1] > level, timeout_s)
        return None if held is None else self.first(held, lambda c: c[1] <= level, timeout_s)

    def unlisted(self, pid, t0, timeout_s=60):
        return self.first(t0, lambda c: pid not in c[2], timeout_s)

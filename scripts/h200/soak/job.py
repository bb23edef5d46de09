"""One GPU job of the soak (soak.py), on the CUDA driver API through ctypes: it starts in about
a tenth of a second, so a few workers keep a steady churn. It allocates, prints
`READY {json}` (its pid, bytes, and the pids of processes that hold its memory too), then waits
to be killed or does what its options say.

--gib G          video memory to allocate (cuMemAlloc)
--fork-hold S    fork a child after the allocation that keeps the inherited GPU files for S
                 seconds, never touching CUDA, then exits
--export-hold S  share the allocation with a spawned importer (legacy CUDA IPC,
                 cuIpcOpenMemHandle) that keeps it for S seconds after the exporter's death
                 (it polls for it), then exits
--cupy           allocate through CuPy (its memory pool) instead of the driver API
--exit-after S   exit normally (status 0) S seconds after READY
--children PLANS fork children after the allocation, one per comma-separated plan, none touching
                 CUDA: `eS` exits normally S seconds after READY (while the job lives, if it is
                 killed later), `pS` keeps the files until the job is dead, then S seconds more,
                 `w` waits for the harness's SIGKILL; `X/Y` is a child of plan X that first forks
                 a grandchild of plan Y. Each child says when it exits on the inherited stdout
                 (`EXIT {"pid": P, "t_ns": CLOCK_BOOTTIME}`), so the harness knows who held the
                 files at each death.
--import HANDLE  (the importer itself) open HANDLE, print IMPORTED, hold it as above
--pgroup         lead a process group of its own (its children join it): killed by killpg
"""
import argparse, ctypes, json, os, subprocess, sys, time, warnings

# CUDA's own threads make Python warn about fork; the forked child never touches CUDA.
warnings.filterwarnings("ignore", category=DeprecationWarning)

cuda = ctypes.CDLL("libcuda.so.1")


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
cuda.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_uint64]
cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcHandle, ctypes.c_uint]


def check(result, what):
    if result != 0:
        print("FAILED", json.dumps({"pid": os.getpid(), "what": what, "cuda_error": result}),
              flush=True)
        os._exit(3)


def context():
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def hold_past(pid, seconds):
    """Keeps going until `pid` is dead (a zombie or gone), then `seconds` more."""
    while alive(pid):
        time.sleep(0.01)
    time.sleep(seconds)


def boot_ns():
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def run_plan(plan, job, told):
    """A forked child's life (module docstring, --children), then its exit, said first. It
    tells its parent, through `told`, the pid of the grandchild it forks (or 0)."""
    grandchild = 0
    if "/" in plan:
        plan, grand = plan.split("/", 1)
        grandchild = spawn(grand, job, os.getpid())
    os.write(told, str(grandchild).encode() + b"\n")
    os.close(told)
    if plan.startswith("e"):
        time.sleep(float(plan[1:]))
    elif plan.startswith("p"):
        hold_past(job, float(plan[1:]))
    else:
        while True:
            time.sleep(1)
    print("EXIT", json.dumps({"pid": os.getpid(), "t_ns": boot_ns()}), flush=True)
    os._exit(0)


def spawn(plan, job, parent):
    """Forks a child of `plan` and notes it and its grandchild in SPAWNED; returns its pid."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        run_plan(plan, job, w)
    os.close(w)
    with os.fdopen(r) as told:
        grandchild = int(told.readline() or 0)
    SPAWNED.append({"pid": child, "how": "fork", "plan": plan.split("/")[0], "parent": parent})
    if grandchild:
        SPAWNED[-1:-1] = [{"pid": grandchild, "how": "fork", "plan": plan.split("/", 1)[1],
                           "parent": child}]
    return child


# The descendants forked so far (of this process): pid, plan, parent.
SPAWNED = []


def importer(handle_hex, exporter, seconds):
    context()
    handle = IpcHandle()
    ctypes.memmove(ctypes.byref(handle), bytes.fromhex(handle_hex), ctypes.sizeof(handle))
    ptr = ctypes.c_uint64()
    check(cuda.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, 1), "cuIpcOpenMemHandle")
    print("IMPORTED", flush=True)
    hold_past(exporter, seconds)
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1)
    p.add_argument("--fork-hold", type=float)
    p.add_argument("--export-hold", type=float)
    p.add_argument("--exit-after", type=float)
    p.add_argument("--children", default="")
    p.add_argument("--cupy", action="store_true", help="allocate through CuPy (its pool)")
    p.add_argument("--import", dest="handle")
    p.add_argument("--exporter", type=int)
    p.add_argument("--pgroup", action="store_true")
    a = p.parse_args()
    if a.pgroup:
        os.setpgid(0, 0)
    if a.handle:
        importer(a.handle, a.exporter, a.export_hold)
    size = int(a.gib * (1 << 30))
    ptr = ctypes.c_uint64()
    if a.cupy:
        import cupy
        kept = cupy.empty(size, dtype=cupy.uint8)
        kept.fill(1)
        cupy.cuda.runtime.deviceSynchronize()
        ptr.value = kept.data.ptr
    else:
        context()
        check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), size), "cuMemAlloc")
        check(cuda.cuMemsetD8_v2(ptr, 1, size), "cuMemsetD8")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    info = {"pid": os.getpid(), "bytes": size, "holders": []}
    if a.export_hold is not None:
        handle = IpcHandle()
        check(cuda.cuIpcGetMemHandle(ctypes.byref(handle), ptr), "cuIpcGetMemHandle")
        proc = subprocess.Popen(
            [sys.executable, __file__, "--import",
             ctypes.string_at(ctypes.byref(handle), ctypes.sizeof(handle)).hex(),
             "--exporter", str(os.getpid()), "--export-hold", str(a.export_hold)],
            stdout=subprocess.PIPE, text=True)
        said = proc.stdout.readline().strip()
        if said != "IMPORTED":
            print("FAILED", json.dumps({"pid": os.getpid(), "what": "import", "importer": said}),
                  flush=True)
            os._exit(3)
        info["holders"].append({"pid": proc.pid, "how": "import"})
    if a.fork_hold is not None:
        child = os.fork()
        if child == 0:
            hold_past(os.getppid(), a.fork_hold)
            os._exit(0)
        info["holders"].append({"pid": child, "how": "fork", "plan": f"p{a.fork_hold}",
                                "parent": os.getpid()})
    for plan in filter(None, a.children.split(",")):
        spawn(plan, os.getpid(), os.getpid())
    info["holders"] += SPAWNED
    print("READY", json.dumps(info), flush=True)
    if a.exit_after is not None:
        time.sleep(a.exit_after)
        print("EXIT", json.dumps({"pid": os.getpid(), "t_ns": boot_ns()}), flush=True)
        os._exit(0)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()

"""A GPU process for the scenario suite: allocates, prints `READY {json}`, then waits to be
killed or does what its options say.

--gib G            video memory to allocate with PyTorch (cudaMalloc underneath)
--pin G            pinned host memory to allocate as well
--fork N           fork N children after CUDA init that keep the inherited GPU files
--term MODE        SIGTERM: default | ignore | free-exit (free the memory, exit 0)
--exit-after S     exit normally (status 0) S seconds after READY
--crash-after S    dereference a null pointer S seconds after READY (SIGSEGV)
--export           share the tensor with a spawned importer (torch.multiprocessing, CUDA IPC)
--hog-on-usr1      on SIGUSR1, take host memory until the OOM killer stops it
--send-fds         send every /dev/nvidia* descriptor over a unix socket to a spawned receiver
                   (SCM_RIGHTS) that never touches CUDA and only keeps them
--fault-after S    S seconds after READY, run a CUDA kernel that writes through an invalid
                   pointer (an ordinary programming error: the driver reports an Xid and kills
                   the context), then exit with status 1 as a program whose CUDA call failed
--survive-fault    with --fault-after: catch the error and stay alive (holding the memory)
--wait-alloc G     a next job: after READY, try to allocate G GiB every 20 ms until it fits,
                   then print `GOT {json}` (refused attempts, when) and exit 0
"""
import argparse, ctypes, json, os, signal, socket, subprocess, sys, time

import torch
import torch.multiprocessing as mp


def options():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1)
    p.add_argument("--pin", type=float, default=0)
    p.add_argument("--fork", type=int, default=0)
    p.add_argument("--term", default="default")
    p.add_argument("--exit-after", type=float)
    p.add_argument("--crash-after", type=float)
    p.add_argument("--export", action="store_true")
    p.add_argument("--hog-on-usr1", action="store_true")
    p.add_argument("--send-fds", action="store_true")
    p.add_argument("--fault-after", type=float)
    p.add_argument("--wait-alloc", type=float)
    p.add_argument("--survive-fault", action="store_true")
    return p.parse_args()


POKE = r"""
extern "C" __global__ void poke(int *p) { *p = 42; }
"""


def fault(survive=False):
    import cupy
    kernel = cupy.RawKernel(POKE, "poke")
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    try:
        # Address 0x10: nothing is mapped there in any context.
        kernel((1,), (1,), (cupy.uint64(0x10),))
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as e:  # cudaErrorIllegalAddress, as the program would see it
        print("FAULT", json.dumps({"t_fault_ns": t, "error": repr(e)}), flush=True)
        if survive:
            while True:
                time.sleep(1)
        os._exit(1)
    print("FAULT", json.dumps({"t_fault_ns": t, "error": None}), flush=True)
    os._exit(2)


def wait_alloc(gib):
    refused, t0 = 0, time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    while True:
        try:
            y = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
            break
        except torch.cuda.OutOfMemoryError:
            refused += 1
            time.sleep(0.02)
    torch.cuda.synchronize()
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    print("GOT", json.dumps({"refused": refused, "t_first_try_ns": t0, "t_got_ns": t,
                             "bytes": y.numel()}), flush=True)
    sys.exit(0)


RECEIVER = r"""
import socket, sys, time
s = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(s, 16, 1024)
print(len(fds), flush=True)
while True:
    time.sleep(1)
"""


def send_gpu_fds():
    """Passes this process's GPU descriptors to a fresh process (which inherits none of them:
    only the socket is passed down) and returns (its pid, how many it got)."""
    fds = [int(fd) for fd in os.listdir("/proc/self/fd")
           if os.path.realpath(f"/proc/self/fd/{fd}").startswith("/dev/nvidia")]
    mine, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE, text=True)
    theirs.close()
    socket.send_fds(mine, [b"fds"], fds)
    got = int(proc.stdout.readline())
    return proc.pid, got, len(fds)


def hog(_sig, _frm):
    chunks = []
    while True:
        b = bytearray(256 << 20)
        b[::4096] = b"x" * len(b[::4096])
        chunks.append(b)


def importer(q, ready):
    t = q.get()
    torch.cuda.synchronize()
    ready.put((os.getpid(), t.numel()))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    a = options()
    if a.term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.wait_alloc is not None:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        print("READY", json.dumps({"pid": os.getpid(), "children": []}), flush=True)
        sys.stdin.readline()
        wait_alloc(a.wait_alloc)
    x = torch.empty(int(a.gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    pinned = torch.empty(int(a.pin * (1 << 30)), dtype=torch.uint8).pin_memory() if a.pin else None
    torch.cuda.synchronize()
    info = {"pid": os.getpid(), "children": []}
    if a.export:
        ctx = mp.get_context("spawn")
        q, ready = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=importer, args=(q, ready), daemon=False)
        proc.start()
        q.put(x)
        pid, n = ready.get(timeout=120)
        info["importer"] = pid
    if a.send_fds:
        info["receiver"], info["received"], info["sent"] = send_gpu_fds()
    for _ in range(a.fork):
        child = os.fork()
        if child == 0:
            # Never touches CUDA: only keeps the inherited /dev/nvidia* descriptors.
            while True:
                time.sleep(1)
        info["children"].append(child)
    if a.hog_on_usr1:
        signal.signal(signal.SIGUSR1, hog)
    if a.term == "free-exit":
        def free_exit(_sig, _frm):
            global x
            del x
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            os._exit(0)
        signal.signal(signal.SIGTERM, free_exit)
    print("READY", json.dumps(info), flush=True)
    if a.exit_after is not None:
        time.sleep(a.exit_after)
        sys.exit(0)
    if a.crash_after is not None:
        time.sleep(a.crash_after)
        ctypes.string_at(0)
    if a.fault_after is not None:
        time.sleep(a.fault_after)
        fault(a.survive_fault)
    while True:
        time.sleep(1)

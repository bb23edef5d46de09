"""The H200 scenario suite: real kill situations, each beside `linger live --record` and an
independent 1 ms NVML poll of its own (truth.py). For every scenario it writes, under OUTDIR:
NAME.trace (linger's recording), NAME.jsonl (what linger printed), NAME.err, and one line of
truth.jsonl: what the poll and the suite's own wait() calls saw.

usage: run.py LINGER OUTDIR [SCENARIO...]   (default: all, in order)
"""
import ctypes, json, os, signal, subprocess, sys, threading, time

from truth import Poll, boot_ns

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
# Device memory counted as "back to idle": the idle level plus this.
IDLE_SLACK = 64 << 20

PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Linger:
    """`linger live --json --record` for one scenario."""

    def __init__(self, exe, out, name, extra=()):
        self.err_path = os.path.join(out, name + ".err")
        self.proc = subprocess.Popen(
            [exe, "live", "--json", "--record", os.path.join(out, name + ".trace"),
             "--linger-after", "8s", *extra],
            stdout=open(os.path.join(out, name + ".jsonl"), "w"),
            stderr=open(self.err_path, "w"))
        deadline = time.monotonic() + 60
        while "tracing" not in open(self.err_path).read():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"linger did not start: {open(self.err_path).read()}")
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


class Victim:
    """victim.py started with args; `ready()` waits for its READY line."""

    def __init__(self, *args, wrap=(), wait=True):
        self.args = args
        self.proc = subprocess.Popen([*wrap, sys.executable, os.path.join(HERE, "victim.py"), *args],
                                     stdout=subprocess.PIPE, text=True)
        if wait:
            self.ready()

    def ready(self):
        line = ""
        while not line.startswith("READY"):
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"victim {self.args} died before READY")
        self.info = json.loads(line.split(" ", 1)[1])
        self.t_ready = boot_ns()
        self.pid = self.info["pid"]
        return self


def kill(pid, sig=signal.SIGKILL):
    t = boot_ns()
    os.kill(pid, sig)
    return t


def reap(pid):
    """Waits for pid (a child, or an orphan reparented to us) and returns when."""
    os.waitpid(pid, 0)
    return boot_ns()


def reap_all(pids):
    """Reaps every pid in pids as it dies: {pid: boot_ns}."""
    left, when = set(pids), {}
    while left:
        pid, _ = os.wait()
        when[pid] = boot_ns()
        left.discard(pid)
    return when


def settle(poll, level, t0, timeout_s=60):
    return poll.back_to(t0, level + IDLE_SLACK, timeout_s)


# Each scenario: (poll, idle used) -> truth dict. Times are CLOCK_BOOTTIME ns.

def early_kill(gib, pin=0):
    def run(poll, idle):
        v = Victim("--gib", str(gib), *(["--pin", str(pin)] if pin else []))
        time.sleep(0.2)
        t_kill = kill(v.pid)
        share = poll.share(v.pid, t_kill)
        t_reaped = reap(v.pid)
        back = settle(poll, idle, t_kill)
        return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                             "nvml_share": share, "t_back_ns": back}],
                "expect": {"verdict": "released", "mode": "kill"}}
    return run


def forked_holder(poll, idle):
    v = Victim("--gib", "4", "--fork", "1")
    child = v.info["children"][0]
    time.sleep(1)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    time.sleep(3)
    held = poll.now()[1] - idle
    t_kill_child = kill(child)
    t_child_reaped = reap(child)
    back = settle(poll, idle, t_kill_child)
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                         "held_after_3s": held, "t_back_ns": back}],
            "holders": [{"pid": child, "t_kill_ns": t_kill_child, "t_reaped_ns": t_child_reaped}],
            "expect": {"verdict": "shared_fd", "mode": "kill", "holders": [child]}}


def workers(poll, idle):
    v = Victim("--gib", "4", "--fork", "3")
    kids = v.info["children"]
    time.sleep(0.5)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    gone = []
    for k in kids:
        time.sleep(1)
        held = poll.now()[1] - idle
        tk = kill(k)
        gone.append({"pid": k, "held_before_ns": held, "t_kill_ns": tk, "t_reaped_ns": reap(k)})
    back = settle(poll, idle, gone[-1]["t_kill_ns"])
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                         "t_back_ns": back}],
            "holders": gone,
            "expect": {"verdict": "shared_fd", "mode": "kill", "holders": kids}}


def ipc_import(poll, idle):
    v = Victim("--gib", "4.5", "--export")
    imp = v.info["importer"]
    time.sleep(1)
    before = poll.now()
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    time.sleep(3)
    after = poll.now()
    t_kill_imp = kill(imp)
    t_imp_reaped = reap(imp)
    back = settle(poll, idle, t_kill_imp)
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                         "nvml_before": before[2].get(v.pid), "t_back_ns": back,
                         "held_after_3s": after[1] - idle}],
            "importers": [{"pid": imp, "t_kill_ns": t_kill_imp, "t_reaped_ns": t_imp_reaped,
                           "nvml_before": before[2].get(imp), "nvml_after": after[2].get(imp)}],
            "expect": {"verdict": "imported", "mode": "kill", "holders": [imp]}}


def fd_passed(poll, idle):
    # The victim's GPU descriptors went to another process over a unix socket (SCM_RIGHTS):
    # no fork, no open, no dup that a syscall hook could see.
    v = Victim("--gib", "4", "--send-fds")
    rcv = v.info["receiver"]
    time.sleep(1)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    time.sleep(3)
    held = poll.now()[1] - idle
    t_kill_rcv = kill(rcv)
    t_rcv_reaped = reap(rcv)
    back = settle(poll, idle, t_kill_rcv)
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                         "held_after_3s": held, "t_back_ns": back,
                         "sent": v.info["sent"], "received": v.info["received"]}],
            "holders": [{"pid": rcv, "t_kill_ns": t_kill_rcv, "t_reaped_ns": t_rcv_reaped}],
            "expect": {"verdict": "shared_fd", "mode": "kill", "holders": [rcv]}}


def kill_storm(poll, idle):
    vs = [Victim("--gib", "1", wait=False) for _ in range(12)]
    for v in vs:
        v.ready()
    time.sleep(0.5)
    kills = {}
    for v in vs:
        kills[v.pid] = kill(v.pid)
    t0 = min(kills.values())
    reaped = reap_all([v.pid for v in vs])
    back = settle(poll, idle, t0)
    return {"victims": [{"pid": v.pid, "t_kill_ns": kills[v.pid], "t_reaped_ns": reaped[v.pid]}
                        for v in vs],
            "t_back_ns": back,
            "expect": {"verdict": "released", "mode": "kill"}}


def term_then_kill(poll, idle):
    # timeout: SIGTERM after 12 s (ignored), SIGKILL 2 s later; both also to timeout itself.
    v = Victim("--gib", "2", "--term", "ignore", wrap=("timeout", "-k", "2", "12"))
    t_start = v.t_ready
    reaped = reap_all([v.proc.pid, v.pid])
    back = settle(poll, idle, t_start)
    return {"victims": [{"pid": v.pid, "t_ready_ns": t_start, "t_reaped_ns": reaped[v.pid],
                         "t_back_ns": back}],
            "timeout_pid": v.proc.pid,
            "expect": {"verdict": "released", "mode": "escalated", "grace_ms": 2000}}


def term_handled(poll, idle):
    v = Victim("--gib", "2", "--term", "free-exit")
    time.sleep(0.5)
    t_term = kill(v.pid, signal.SIGTERM)
    t_reaped = reap(v.pid)
    back = settle(poll, idle, t_term)
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_term, "t_reaped_ns": t_reaped,
                         "t_back_ns": back}],
            "expect": {"verdict": "released", "mode": "term", "status": 0}}


def normal_exit(poll, idle):
    v = Victim("--gib", "2", "--exit-after", "1")
    t_reaped = reap(v.pid)
    back = settle(poll, idle, v.t_ready)
    return {"victims": [{"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped,
                         "t_back_ns": back}],
            "expect": {"verdict": "released", "mode": "exit", "status": 0}}


def crash(poll, idle):
    v = Victim("--gib", "2", "--crash-after", "0.3")
    t_reaped = reap(v.pid)
    back = settle(poll, idle, v.t_ready)
    return {"victims": [{"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped,
                         "t_back_ns": back}],
            "expect": {"verdict": "released", "mode": "fault"}}


def oom_cgroup(pid, name):
    """A cgroup of pid's own with a memory limit 1 GiB above what it uses and no swap: host
    memory it then takes is cut short by the kernel's OOM killer, scoped to that cgroup."""
    cg = f"/sys/fs/cgroup/{name}"
    os.makedirs(cg, exist_ok=True)
    rss = int(open(f"/proc/{pid}/statm").read().split()[1]) * 4096
    open(f"{cg}/memory.max", "w").write(str(rss + (1 << 30)))
    if os.path.exists(f"{cg}/memory.swap.max"):
        open(f"{cg}/memory.swap.max", "w").write("0")
    open(f"{cg}/cgroup.procs", "w").write(str(pid))
    return cg


def oom(poll, idle):
    v = Victim("--gib", "2", "--hog-on-usr1")
    cg = oom_cgroup(v.pid, "linger-oom")
    time.sleep(0.3)
    t_hog = kill(v.pid, signal.SIGUSR1)
    t_reaped = reap(v.pid)
    back = settle(poll, idle, t_hog)
    events = open(f"{cg}/memory.events").read()
    os.rmdir(cg)
    return {"victims": [{"pid": v.pid, "t_hog_ns": t_hog, "t_reaped_ns": t_reaped,
                         "t_back_ns": back}],
            "memory_events": events,
            "expect": {"verdict": "released", "mode": "oom"}}


def xid_fault(poll, idle):
    # A CUDA kernel writes through an invalid pointer: the driver reports an Xid naming the
    # process and kills its context; the program sees the error and exits with status 1.
    v = Victim("--gib", "2", "--fault-after", "0.5")
    line = v.proc.stdout.readline()
    fault = json.loads(line.split(" ", 1)[1]) if line.startswith("FAULT") else {"line": line}
    t_reaped = reap(v.pid)
    back = settle(poll, idle, v.t_ready)
    xids = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return {"victims": [{"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped,
                         "t_back_ns": back, **fault}],
            "dmesg_xid": [l for l in xids.splitlines() if "Xid" in l][-8:],
            "expect": {"verdict": "released", "mode": "exit", "status": 1, "xid": True}}


def xid_survivor(poll, idle):
    # The program survives its CUDA error (it catches it and stays, holding its memory): the
    # Xid is reported on its own; its SIGKILL 7 s later is an incident that cites it.
    v = Victim("--gib", "2", "--fault-after", "0.5", "--survive-fault")
    line = v.proc.stdout.readline()
    fault = json.loads(line.split(" ", 1)[1]) if line.startswith("FAULT") else {"line": line}
    time.sleep(7)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    back = settle(poll, idle, t_kill)
    return {"victims": [{"pid": v.pid, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
                         "t_back_ns": back, **fault}],
            "expect": {"verdict": "released", "mode": "kill", "xid": True, "gpu_error": True}}


def stopped(poll, idle):
    # A job that lives on idle past linger's --stuck-after (10 s), is then stopped (SIGSTOP,
    # as a shell's ^Z or a debugger) past it again, and killed while stopped: its threads sleep
    # in the driver only briefly (S, then T), never in D, so no `stuck` record may appear.
    v = Victim("--gib", "2")
    time.sleep(12)
    t_stop = kill(v.pid, signal.SIGSTOP)
    time.sleep(12)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    back = settle(poll, idle, t_kill)
    return {"victims": [{"pid": v.pid, "t_stop_ns": t_stop, "t_kill_ns": t_kill,
                         "t_reaped_ns": t_reaped, "t_back_ns": back}],
            "expect": {"verdict": "released", "mode": "kill", "stuck": False}}


SCENARIOS = {
    "early-kill-1g": early_kill(1),
    "early-kill-16g": early_kill(16),
    "early-kill-64g": early_kill(64),
    "early-kill-pinned-4g": early_kill(4, pin=4),
    "forked-holder": forked_holder,
    "workers": workers,
    "ipc-import": ipc_import,
    "fd-passed": fd_passed,
    "kill-storm": kill_storm,
    "term-then-kill": term_then_kill,
    "term-handled": term_handled,
    "normal-exit": normal_exit,
    "crash": crash,
    "oom": oom,
    "xid-fault": xid_fault,
    "xid-survivor": xid_survivor,
    "stopped": stopped,
}


def main():
    exe, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(SCENARIOS)
    extra = os.environ.get("LINGER_FLAGS", "").split()
    os.makedirs(out, exist_ok=True)
    poll = Poll()
    truth = open(os.path.join(out, "truth.jsonl"), "a")
    for name in names:
        time.sleep(0.5)
        idle = poll.now()[1]
        t_begin = boot_ns()
        linger = Linger(exe, out, name, extra)
        try:
            result = SCENARIOS[name](poll, idle)
        except BaseException as e:  # keep the rest of the suite going
            result = {"error": repr(e)}
        time.sleep(1)
        linger.stop()
        result.update(scenario=name, idle_used=idle, t_begin_ns=t_begin,
                      poll=poll.window(t_begin, boot_ns()), poll_reads=poll.reads)
        truth.write(json.dumps(result) + "\n")
        truth.flush()
        print(name, json.dumps({k: v for k, v in result.items() if k != "poll"}), flush=True)
    poll.stop()


if __name__ == "__main__":
    main()

"""The termination campaign behind `linger stats` (docs/article-table.md): RUNS runs of each
termination mode, sizes 1-64 GiB, one after the other beside one `linger live --json --record`,
each with the suite's own 1 ms NVML poll (suite/truth.py) as ground truth.

Modes: normal-exit, term-handled (SIGTERM, the handler frees and exits 0), sigkill (after
0.2-2 s), term-ignored-kill (SIGTERM ignored, SIGKILL after a 1 s grace), forked-holder (the
parent is SIGKILLed, the child it forked keeps the GPU files until it is SIGKILLed 1 s later),
next-job-waits (a next job retries a W GiB allocation every 20 ms while the victim holds all but
W/2 of the free memory; the victim is SIGKILLed), crash (SIGSEGV), oom (the kernel's OOM killer,
in a cgroup of the victim's own), cuda-fault (a kernel writes through a bad pointer: an Xid,
then the program exits with status 1).

usage: campaign.py LINGER OUTDIR [MODE...] (env RUNS, default 10). Writes OUTDIR/campaign.trace,
OUTDIR/incidents.jsonl (what linger printed), OUTDIR/linger.err and OUTDIR/truth.jsonl (one
line per run, written as it ends).
"""
import json, os, signal, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite"))
from run import HERE, IDLE_SLACK, Victim, kill, oom_cgroup, reap, settle  # noqa: E402
from truth import Poll, boot_ns  # noqa: E402

GIB = 1 << 30
SIZES = [1, 2, 4, 8, 16, 32, 64, 1, 4, 16]
DELAYS = [0.2, 0.5, 1.0, 2.0, 0.2, 0.5, 1.0, 2.0, 0.2, 0.5]


def normal_exit(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--exit-after", "0.5")
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped,
            "t_back_ns": settle(poll, idle, v.t_ready), "expect": "exit"}


def term_handled(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--term", "free-exit")
    time.sleep(DELAYS[i % len(DELAYS)])
    t = kill(v.pid, signal.SIGTERM)
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_signal_ns": t, "t_reaped_ns": t_reaped,
            "t_back_ns": settle(poll, idle, t), "expect": "term"}


def sigkill(poll, idle, gib, i):
    v = Victim("--gib", str(gib))
    time.sleep(DELAYS[i % len(DELAYS)])
    t = kill(v.pid)
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_signal_ns": t, "t_reaped_ns": t_reaped,
            "t_back_ns": settle(poll, idle, t), "expect": "kill"}


def term_ignored_kill(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--term", "ignore")
    time.sleep(0.3)
    t_term = kill(v.pid, signal.SIGTERM)
    time.sleep(1.0)
    t = kill(v.pid)
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_first_signal_ns": t_term, "t_signal_ns": t,
            "t_reaped_ns": t_reaped, "t_back_ns": settle(poll, idle, t),
            "expect": "escalated"}


def forked_holder(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--fork", "1")
    child = v.info["children"][0]
    time.sleep(0.3)
    t = kill(v.pid)
    t_reaped = reap(v.pid)
    time.sleep(1.0)
    held = poll.now()[1] - idle
    t_child = kill(child)
    reap(child)
    return {"pid": v.pid, "t_signal_ns": t, "t_reaped_ns": t_reaped, "holder": child,
            "held_while_child_lived": held, "t_holder_kill_ns": t_child,
            "t_back_ns": settle(poll, idle, t_child), "expect": "kill"}


def crash(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--crash-after", str(DELAYS[i % len(DELAYS)]))
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped,
            "t_back_ns": settle(poll, idle, v.t_ready), "expect": "fault"}


def oom(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--hog-on-usr1")
    cg = oom_cgroup(v.pid, "linger-campaign-oom")
    time.sleep(0.2)
    t = kill(v.pid, signal.SIGUSR1)
    t_reaped = reap(v.pid)
    back = settle(poll, idle, t)
    os.rmdir(cg)
    return {"pid": v.pid, "t_hog_ns": t, "t_reaped_ns": t_reaped, "t_back_ns": back,
            "expect": "oom"}


def cuda_fault(poll, idle, gib, i):
    v = Victim("--gib", str(gib), "--fault-after", str(DELAYS[i % len(DELAYS)]))
    line = v.proc.stdout.readline()
    fault = json.loads(line.split(" ", 1)[1]) if line.startswith("FAULT") else {"line": line}
    t_reaped = reap(v.pid)
    return {"pid": v.pid, "t_ready_ns": v.t_ready, "t_reaped_ns": t_reaped, **fault,
            "t_back_ns": settle(poll, idle, v.t_ready), "expect": "exit"}


def next_job_waits(poll, idle, gib, i):
    want = max(gib, 2)
    waiter = subprocess.Popen([sys.executable, os.path.join(HERE, "victim.py"),
                               "--wait-alloc", str(want)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = waiter.stdout.readline()
    if not line.startswith("READY"):
        raise SystemExit("the next job died before READY")
    w_pid = json.loads(line.split(" ", 1)[1])["pid"]
    free = poll.now()
    free_gib = (total_bytes(poll) - free[1]) / GIB
    # All but want/2 of what is free (less the victim's own context): the next job cannot fit.
    v = Victim("--gib", f"{free_gib - 1.0 - want / 2:.2f}")
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    time.sleep(DELAYS[i % len(DELAYS)])
    before = poll.now()
    t = kill(v.pid)
    t_reaped = reap(v.pid)
    # The next job takes its share as soon as it fits: the victim's memory is back when the
    # device's figure fell by the victim's share less what the next job took since.
    share = before[2].get(v.pid, 0)
    back = poll.first(t, lambda c: c[1] <= before[1] - share + want * GIB + IDLE_SLACK)
    got = waiter.stdout.readline()
    got = json.loads(got.split(" ", 1)[1]) if got.startswith("GOT") else {"line": got}
    reap(w_pid)
    return {"pid": v.pid, "victim_gib": round(free_gib - 1.0 - want / 2, 2),
            "t_signal_ns": t, "t_reaped_ns": t_reaped, "next_job": w_pid, "want_gib": want,
            **{f"next_{k}": x for k, x in got.items()},
            "t_back_ns": back, "victim_share": share, "expect": "kill"}


_TOTAL = []


def total_bytes(poll):
    if not _TOTAL:
        import pynvml
        _TOTAL.append(pynvml.nvmlDeviceGetMemoryInfo(poll.h).total)
    return _TOTAL[0]


MODES = {
    "normal-exit": normal_exit,
    "term-handled": term_handled,
    "sigkill": sigkill,
    "term-ignored-kill": term_ignored_kill,
    "forked-holder": forked_holder,
    "next-job-waits": next_job_waits,
    "crash": crash,
    "oom": oom,
    "cuda-fault": cuda_fault,
}


def stop(_sig, _frm):
    raise KeyboardInterrupt  # out of the run in progress, into main's finally


def main():
    signal.signal(signal.SIGTERM, stop)
    exe, out = sys.argv[1], sys.argv[2]
    modes = sys.argv[3:] or list(MODES)
    runs = int(os.environ.get("RUNS", "10"))
    os.makedirs(out, exist_ok=True)
    err_path = os.path.join(out, "linger.err")
    linger = subprocess.Popen(
        [exe, "live", "--json", "--record", os.path.join(out, "campaign.trace"),
         "--linger-after", "8s"],
        stdout=open(os.path.join(out, "incidents.jsonl"), "w"), stderr=open(err_path, "w"))
    deadline = time.monotonic() + 60
    while "tracing" not in open(err_path).read():
        if time.monotonic() > deadline or linger.poll() is not None:
            raise SystemExit(f"linger did not start: {open(err_path).read()}")
        time.sleep(0.05)
    poll = Poll()
    truth = open(os.path.join(out, "truth.jsonl"), "a")
    try:
        for i in range(runs):
            for mode in modes:
                time.sleep(0.3)
                idle = poll.now()[1]
                gib = SIZES[i % len(SIZES)]
                t0 = boot_ns()
                try:
                    r = MODES[mode](poll, idle, gib, i)
                except KeyboardInterrupt:
                    raise
                except BaseException as e:  # keep the campaign going
                    r = {"error": repr(e)}
                r.update(mode=mode, run=i, gib=gib, idle_used=idle, t_begin_ns=t0)
                truth.write(json.dumps(r) + "\n")
                truth.flush()
                print(mode, i, json.dumps(r), flush=True)
    finally:
        time.sleep(1)
        linger.send_signal(signal.SIGINT)
        linger.wait(timeout=60)
        poll.stop()


if __name__ == "__main__":
    main()

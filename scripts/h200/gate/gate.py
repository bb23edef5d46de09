"""The gate (`linger wait`) on the H200, against the suite's own 1 ms NVML poll (truth.py):

- plain-after:  a 32 GiB victim is SIGKILLed, then `linger wait --pid` starts (a framework's
                kill-then-wait); the gate must exit 0, and not before the poll saw the memory back.
- plain-before: the same with the gate already waiting when the kill comes.
- fork-workers: a DataLoader-style victim (8 GiB, 2 workers forked after CUDA init that keep the
                inherited GPU files) with the gate waiting on it; the victim is killed, the
                workers 2 s later: the gate must still wait after the victim's death and exit
                only after the workers are gone and the memory is back.
- fork-after:   the victim killed first, its workers left alive; the gate with --timeout 2s must
                exit 1 and name them.
- pod-group:    a pod deleted as the kubelet does it: the same victim with 2 workers in a
                kubepods-style cgroup, `linger agent` running, the gate waiting with --pod; the
                whole cgroup killed at once (cgroup.kill). The gate must exit 0, not before the
                poll saw the memory back, and any incident it cites must not be `shared_fd`
                naming a worker killed with the victim (issue 57).

Every case's record (times CLOCK_BOOTTIME ns, the gate's JSON answer) goes to OUT/gate.json.

usage: gate.py LINGER OUT [ROUNDS]
"""
import ctypes, json, os, signal, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suite"))
from truth import Poll, boot_ns  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VICTIM = os.path.join(HERE, "..", "suite", "victim.py")
GIB = 1 << 30
IDLE_SLACK = 64 << 20

PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Victim:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, VICTIM, *args], stdout=subprocess.PIPE,
                                     text=True)
        line = ""
        while not line.startswith("READY"):
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"victim {args} died before READY")
        self.info = json.loads(line.split(" ", 1)[1])
        self.pid = self.info["pid"]


class Gate:
    """`linger wait` running, its exit time taken by a thread that waits for it."""

    def __init__(self, linger, state, *args):
        self.t_start = boot_ns()
        self.proc = subprocess.Popen([linger, "wait", "--json", "--state-dir", state, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.t_exit = None
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self):
        self.proc.wait()
        self.t_exit = boot_ns()

    def running(self):
        return self.t_exit is None

    def result(self, timeout_s=60):
        self._thread.join(timeout_s)
        out, err = self.proc.communicate()
        try:
            answer = json.loads(out)
        except ValueError:
            answer = {"unparsed": out}
        return {"rc": self.proc.returncode, "t_start_ns": self.t_start, "t_exit_ns": self.t_exit,
                "answer": answer, "stderr": err[-2000:]}


def kill(pid):
    t = boot_ns()
    os.kill(pid, signal.SIGKILL)
    return t


def reap(pid):
    os.waitpid(pid, 0)
    return boot_ns()


def ms(a, b):
    return None if a is None or b is None else round((a - b) / 1e6, 3)


def plain(linger, state, poll, idle, before):
    v = Victim("--gib", "32")
    share = poll.share(v.pid, boot_ns())
    gate = Gate(linger, state, "--pid", str(v.pid), "--timeout", "30s") if before else None
    if before:
        time.sleep(0.5)
    t_kill = kill(v.pid)
    if not before:
        gate = Gate(linger, state, "--pid", str(v.pid), "--timeout", "30s")
    t_reaped = reap(v.pid)
    unlisted = poll.unlisted(v.pid, t_kill)
    back = poll.back_to(t_kill, idle + IDLE_SLACK)
    g = gate.result()
    return {"pid": v.pid, "nvml_share": share, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
            "t_unlisted_ns": unlisted, "t_back_ns": back, "gate": g,
            "gate_exit_after_back_ms": ms(g["t_exit_ns"], back),
            "gate_exit_after_kill_ms": ms(g["t_exit_ns"], t_kill),
            "ok": g["rc"] == 0 and back is not None and g["t_exit_ns"] >= back}


def fork_workers(linger, state, poll, idle):
    v = Victim("--gib", "8", "--fork", "2")
    kids = v.info["children"]
    gate = Gate(linger, state, "--pid", str(v.pid), "--timeout", "30s")
    time.sleep(0.5)
    t_kill = kill(v.pid)
    t_reaped = reap(v.pid)
    time.sleep(2)
    waiting_after_death = gate.running()
    held = poll.now()[1] - idle
    t_workers = boot_ns()
    for k in kids:
        os.kill(k, signal.SIGKILL)
    reaped = {k: reap(k) for k in kids}
    back = poll.back_to(t_workers, idle + IDLE_SLACK)
    g = gate.result()
    last_reaped = max(reaped.values())
    return {"pid": v.pid, "workers": kids, "t_kill_ns": t_kill, "t_reaped_ns": t_reaped,
            "held_2s_after_death": held, "gate_waiting_2s_after_death": waiting_after_death,
            "t_workers_killed_ns": t_workers, "t_workers_reaped_ns": reaped, "t_back_ns": back,
            "gate": g, "gate_exit_after_back_ms": ms(g["t_exit_ns"], back),
            "gate_exit_after_workers_killed_ms": ms(g["t_exit_ns"], t_workers),
            "ok": waiting_after_death and g["rc"] == 0 and back is not None
            and g["t_exit_ns"] >= back and g["t_exit_ns"] >= t_workers}


def fork_after(linger, state, poll, idle):
    v = Victim("--gib", "4", "--fork", "2")
    kids = v.info["children"]
    t_kill = kill(v.pid)
    reap(v.pid)
    g = Gate(linger, state, "--pid", str(v.pid), "--timeout", "2s").result()
    named = {h.get("pid") for h in g["answer"].get("holders", [])}
    named |= {c.get("pid") for c in g["answer"].get("candidates", [])}
    for d in g["answer"].get("dead", []):
        named |= {h.get("pid") for h in (d.get("incident") or {}).get("holders", [])}
    for k in kids:
        os.kill(k, signal.SIGKILL)
    for k in kids:
        reap(k)
    poll.back_to(t_kill, idle + IDLE_SLACK)
    return {"pid": v.pid, "workers": kids, "t_kill_ns": t_kill, "gate": g,
            "workers_named": sorted(k for k in kids if k in named),
            "ok": g["rc"] == 1 and all(k in named for k in kids)}


def pod_group(linger, state, poll, idle):
    uid = "0d1e2f3a-5757-4757-8757-445566778899"
    cg = ("/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/"
          f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice/cri-containerd-57.scope")
    try:
        os.makedirs(cg, exist_ok=True)
    except OSError as e:
        return {"skipped": f"no writable cgroup v2 hierarchy: {e}", "ok": True}
    if not os.path.exists(os.path.join(cg, "cgroup.kill")):
        return {"skipped": "no cgroup.kill", "ok": True}
    agent_state = tempfile.mkdtemp(prefix="gate-agent-")
    err = open(os.path.join(agent_state, "agent.err"), "w")
    agent = subprocess.Popen([linger, "agent", "--state-dir", agent_state, "--metrics-listen",
                              "127.0.0.1:9479"], stdout=subprocess.DEVNULL, stderr=err)
    while "tracing" not in open(os.path.join(agent_state, "agent.err")).read():
        time.sleep(0.05)

    def join():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("0")

    proc = subprocess.Popen([sys.executable, VICTIM, "--gib", "8", "--fork", "2"],
                            stdout=subprocess.PIPE, text=True, preexec_fn=join)
    line = ""
    while not line.startswith("READY"):
        line = proc.stdout.readline()
    info = json.loads(line.split(" ", 1)[1])
    kids = info["children"]
    gate = Gate(linger, agent_state, "--pod", uid, "--timeout", "30s")
    time.sleep(0.5)
    t_kill = boot_ns()
    with open(os.path.join(cg, "cgroup.kill"), "w") as f:
        f.write("1")
    reaped = {p: reap(p) for p in [proc.pid] + kids}
    back = poll.back_to(t_kill, idle + IDLE_SLACK)
    g = gate.result()
    time.sleep(1)
    agent.send_signal(signal.SIGINT)
    agent.wait()
    incidents = [json.loads(l) for l in open(os.path.join(agent_state, "incidents.jsonl"))]
    cited = [d.get("incident") for d in g["answer"].get("dead", []) if d.get("incident")]
    wrong = [c for c in cited if c.get("verdict") == "shared_fd"
             and any(h.get("pid") in kids for h in c.get("holders", []))]
    last = {}
    for i in incidents:
        last[i["id"]] = i
    victim = [i for i in last.values() if i["target"]["pid"] == proc.pid]
    try:
        os.rmdir(cg)
    except OSError:
        pass
    return {"pid": proc.pid, "workers": kids, "t_kill_ns": t_kill, "t_reaped_ns": reaped,
            "t_back_ns": back, "gate": g, "gate_exit_after_back_ms": ms(g["t_exit_ns"], back),
            "victim_incidents": [{"verdict": (i.get("verdict") or {}).get("kind"),
                                  "hint": (i.get("verdict") or {}).get("hint"),
                                  "holders": i.get("holders")} for i in victim],
            "cited_wrong": wrong,
            "ok": g["rc"] == 0 and back is not None and g["t_exit_ns"] >= back and not wrong
            and len(victim) == 1 and (victim[0].get("verdict") or {}).get("kind") == "released"}


def main():
    linger, out = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    state = tempfile.mkdtemp(prefix="gate-state-")  # no agent's log: the gate's own look
    poll = Poll()
    time.sleep(0.2)
    idle = poll.now()[1]
    records = []
    cases = [("plain-after", lambda: plain(linger, state, poll, idle, before=False)),
             ("plain-before", lambda: plain(linger, state, poll, idle, before=True)),
             ("fork-workers", lambda: fork_workers(linger, state, poll, idle)),
             ("fork-after", lambda: fork_after(linger, state, poll, idle)),
             ("pod-group", lambda: pod_group(linger, state, poll, idle))]
    for name, case in cases:
        for r in range(rounds if name.startswith("plain") else 1):
            t0 = time.monotonic()
            rec = case()
            rec.update({"case": name, "round": r, "seconds": round(time.monotonic() - t0, 1)})
            records.append(rec)
            print(name, r, "ok" if rec["ok"] else "NOT OK",
                  {k: v for k, v in rec.items() if k.endswith("_ms")}, flush=True)
    poll.stop()
    with open(os.path.join(out, "gate.json"), "w") as f:
        json.dump({"idle_used": idle, "poll_reads": poll.reads, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()

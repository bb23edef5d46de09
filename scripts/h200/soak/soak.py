"""The soak: a busy GPU node's steady churn of jobs beside `linger agent`, with a truth of its
own for every victim.

Workers start GPU jobs (job.py: 1-16 GiB, a fifth through CuPy's pool; some share it with a
CUDA IPC importer that keeps it a second longer, some exit normally, some fork children that
never touch CUDA: one that keeps the memory a second past the job's death, one that leaves
before the job's kill (exiting, or SIGKILLed by the harness), one killed with the job, one that
leaves early having forked a grandchild that outlives the job, or a pool of three workers of
which two leave before the kill) and SIGKILL the rest at a steady rate (KINDS). The harness is
every job's reaper (a subreaper, so orphaned holders come back to it too) and times each reap
on CLOCK_BOOTTIME: a victim's memory is back when the last process holding it has been reaped
(the driver frees it in that process's exit, before its zombie transition). Each child says
when it exits (its EXIT line), so the truth knows who held the files at each death
(`t_end_ns`). Its own NVML poll stamps each reading at its start and its end and says when
each pid left NVML's list (`nvml_left`: the start of the last reading that listed it, the end
of the first that did not). Meanwhile it scrapes the agent's /metrics and reads the agent's CPU
time and memory every second. check.py judges the run.

usage: soak.py LINGER OUTDIR [--lean] [--beside-lean] [--duration S] [--workers N] [--rate KILLS_PER_S]
       [--nvml-poll-ms MS] [--groups]
writes OUTDIR/truth.jsonl (a line per job, then a summary), OUTDIR/metrics.jsonl (a line a
second), OUTDIR/state/incidents.jsonl (the agent's log), OUTDIR/soak.trace, OUTDIR/agent.err.
--beside-lean runs a second agent, in --lean, beside the first on the same churn: its files
are under OUTDIR/lean/ (check.py DIR --agent lean), so one run judges both modes.
"""
import argparse, ctypes, json, os, random, signal, subprocess, sys, threading, time, urllib.request

import pynvml

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
PR_SET_CHILD_SUBREAPER = 36
TICK = os.sysconf("SC_CLK_TCK")


def boot_ns():
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Reaper(threading.Thread):
    """Reaps every child and orphan, and says when."""

    def __init__(self):
        super().__init__(daemon=True)
        self.reaped = {}
        self.cond = threading.Condition()

    def run(self):
        while True:
            try:
                pid, status, _ = os.wait4(-1, 0)
            except ChildProcessError:
                time.sleep(0.005)
                continue
            t = boot_ns()
            with self.cond:
                self.reaped[pid] = (t, status)
                self.cond.notify_all()

    def wait_for(self, pids, timeout):
        """Waits until every pid in `pids` is reaped and takes their reaps (time, status) out,
        so that a later process with a reused pid waits for its own; None for those that were
        not reaped in time."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(p in self.reaped for p in pids):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return {p: self.reaped.pop(p, None) for p in pids}


class Poll(threading.Thread):
    """NVML every `period` s: when each pid was first and last listed, when it left the list
    (the start of the last reading that listed it and the end of the first that did not: NVML's
    calls queue behind the driver during teardowns, so a reading describes some moment between
    its start and its end), the share NVML last gave each pid, and the device's used memory:
    every step it took, between the start of the last reading before it and the end of the
    first after (teardowns serialize on the driver's lock, so victims' shares come off in
    turn), and one reading every 100 ms."""

    def __init__(self, period):
        super().__init__(daemon=True)
        self.period = period
        pynvml.nvmlInit()
        self.dev = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.listed = {}
        self.left = {}
        self.used = []
        self.steps = []
        self.share = {}
        self.stop = False

    def reading(self):
        start = boot_ns()
        used = pynvml.nvmlDeviceGetMemoryInfo(self.dev).used
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self.dev)
        return start, boot_ns(), used, procs

    def run(self):
        last_kept, before, last = 0, {}, None
        while not self.stop:
            try:
                start, end, used, procs = self.reading()
            except pynvml.NVMLError:
                time.sleep(self.period)
                continue
            now = {}
            for p in procs:
                first, _ = self.listed.get(p.pid, (start, start))
                self.listed[p.pid] = (first, start)
                self.share[p.pid] = p.usedGpuMemory
                now[p.pid] = start
            for pid, listed_at in before.items():
                if pid not in now:
                    self.left.setdefault(pid, []).append((listed_at, end))
            before = now
            if last is not None and used != last[1]:
                self.steps.append((last[0], end, last[1], used))
            last = (start, used)
            if start - last_kept >= 100_000_000:
                self.used.append((start, used))
                last_kept = start
            time.sleep(self.period)


class Scraper(threading.Thread):
    """The agent's /metrics and its CPU time and memory, every second."""

    def __init__(self, agent_pid, out, listen):
        super().__init__(daemon=True)
        self.pid = agent_pid
        self.out = out
        self.listen = listen
        self.stop = False
        self.kills = 0

    def sample(self):
        stat = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
        cpu_s = (int(stat[11]) + int(stat[12])) / TICK
        rss = next(int(l.split()[1]) * 1024 for l in open(f"/proc/{self.pid}/status")
                   if l.startswith("VmRSS:"))
        threads = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                comm, rest = open(f"/proc/{self.pid}/task/{tid}/stat").read().rsplit(")", 1)
            except OSError:
                continue
            t = rest.split()
            name = comm.split("(", 1)[1]
            threads[name] = threads.get(name, 0) + (int(t[11]) + int(t[12])) / TICK
        row = {"t_ns": boot_ns(), "kills": self.kills, "cpu_s": cpu_s, "rss": rss,
               "threads": threads}
        try:
            text = urllib.request.urlopen(f"http://{self.listen}/metrics", timeout=2).read().decode()
        except OSError as e:
            row["scrape_error"] = repr(e)
            return row
        lingering, lost, parts = 0.0, {}, {}
        for line in text.splitlines():
            if line.startswith("linger_collector_cpu_seconds_total{"):
                part = line.split('part="', 1)[1].split('"', 1)[0]
                parts[part] = float(line.rsplit(" ", 1)[1])
            if line.startswith("linger_gpu_memory_lingering_bytes"):
                lingering += float(line.rsplit(" ", 1)[1])
            elif line.startswith("linger_lost_records_total{"):
                what = line.split('what="', 1)[1].split('"', 1)[0]
                lost[what] = lost.get(what, 0) + float(line.rsplit(" ", 1)[1])
        row.update(lingering=lingering, lost=lost, parts=parts)
        return row

    def run(self):
        while not self.stop:
            try:
                self.out.write(json.dumps(self.sample()) + "\n")
                self.out.flush()
            except (OSError, StopIteration, IndexError):
                pass
            time.sleep(1)


class Pace:
    """Kills at `rate` a second at most, evenly."""

    def __init__(self, rate):
        self.gap = 1.0 / rate
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def wait(self):
        with self.lock:
            now = time.monotonic()
            at = max(self.next, now)
            self.next = at + self.gap
        time.sleep(max(0.0, at - now))


def job_kind(rng, kinds):
    r = rng.random()
    for kind, p in kinds:
        if r < p:
            return kind
        r -= p
    return "kill"


# Each kind's share of the jobs; the rest are plain kills. Forked children (none touching CUDA)
# end before the job's kill (normally or by the harness's SIGKILL), with it, or after it;
# "grand": a child that leaves before the kill, having forked a grandchild that outlives the
# job; "pool": two workers that leave before the kill and one that outlives it.
KINDS = [("fork", 0.06), ("before", 0.05), ("killed-before", 0.05), ("with", 0.04),
         ("grand", 0.04), ("pool", 0.04), ("ipc", 0.08), ("exit", 0.10)]
# With --groups, whole groups killed at once, as the field kills them: a process group
# (killpg), a cgroup (cgroup.kill: a pod, a Slurm step, a systemd unit) and a pid namespace
# whose init is killed from the host (a container's main process), each with 1-3 children
# holding the job's files.
GROUP_KINDS = [("killpg", 0.15), ("cgroup", 0.15), ("pidns", 0.15)]
# Where the cgroup kind's cgroups go (a pure cgroup v2 hierarchy, as GPU nodes run).
CGROUPS = "/sys/fs/cgroup/linger-soak"


def children_of(kind, life, rng):
    """The --children plans of a job of `kind` that lives `life` s after READY, and when the
    harness kills each `w` child (s after READY; None: with the job)."""
    early = lambda: f"{life * rng.uniform(0.2, 0.7):.3f}"
    if kind == "before":
        return [f"e{early()}"], []
    if kind == "killed-before":
        return ["w"], [float(early())]
    if kind == "with":
        return ["w"], [None]
    if kind == "grand":
        return [f"e{early()}/p1"], []
    if kind == "pool":
        return [f"e{early()}", f"e{early()}", "p1"], []
    return [], []


def exits_said(out):
    """The EXIT lines the job and its children wrote (pid -> CLOCK_BOOTTIME), read once every
    writer is gone."""
    said = {}
    for line in out:
        if line.startswith("EXIT "):
            e = json.loads(line.split(" ", 1)[1])
            said[str(e["pid"])] = e["t_ns"]
    return said


def group_job(kind, cmd, n):
    """How a group kind's job starts (the command, what Popen runs first in the child) and
    is killed (a function of the pid Popen gave)."""
    if kind == "killpg":
        return cmd + ["--pgroup"], None, lambda pid: os.killpg(pid, signal.SIGKILL)
    if kind == "pidns":
        # Its own /proc too: CUDA in a pid namespace with the host's fails to start
        # (cudaErrorOperatingSystem, H100, 2026-12-07).
        return (["unshare", "--pid", "--fork", "--mount-proc"] + cmd, None, lambda pid: None)
    cg = os.path.join(CGROUPS, f"job-{n}")
    os.makedirs(cg, exist_ok=True)

    def join():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("0")

    def kill(_pid):
        with open(os.path.join(cg, "cgroup.kill"), "w") as f:
            f.write("1")

    return cmd, join, kill


def to_host(root, info):
    """The job's and its holders' pids in the host's namespace: the READY line of a job that
    is pid 1 of its own namespace gives that namespace's pids. The host's /proc lists each
    process's children (host pids) and ends each one's NSpid line with its pid there."""
    mapping, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            continue
        for kid in map(int, kids):
            try:
                for line in open(f"/proc/{kid}/status"):
                    if line.startswith("NSpid:"):
                        mapping.setdefault(int(line.split()[-1]), kid)
            except OSError:
                pass
            todo.append(kid)
    info["pid"] = mapping.get(info["pid"], info["pid"])
    for h in info["holders"]:
        h["pid"] = mapping.get(h["pid"], h["pid"])


def worker(n, reaper, pace, stop, truth, lock, scrapers, max_gib, kinds):
    rng = random.Random(n)
    sizes = [g for g in (1, 2, 4, 8, 16) if g <= max_gib]
    count = 0
    while not stop.is_set():
        kind = job_kind(rng, kinds)
        gib = rng.choice(sizes)
        life = rng.uniform(0.2, 2.0)
        cmd = [sys.executable, os.path.join(HERE, "job.py"), "--gib", str(gib)]
        plans, kill_at = children_of(kind, life, rng)
        count += 1
        preexec, group_kill = None, None
        if kind in dict(GROUP_KINDS):
            plans = ["w"] * rng.randint(1, 3)
            kill_at = [None] * len(plans)
            cmd, preexec, group_kill = group_job(kind, cmd, f"{n}-{count}")
        if kind == "fork":
            cmd += ["--fork-hold", "1"]
        elif kind == "ipc":
            cmd += ["--export-hold", "1"]
        elif kind == "exit":
            cmd += ["--exit-after", f"{life:.3f}"]
        if plans:
            cmd += ["--children", ",".join(plans)]
        # A fifth of the jobs other than IPC exporters allocate through CuPy's pool.
        if kind != "ipc" and rng.random() < 0.2:
            cmd += ["--cupy"]
        t_start = boot_ns()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
        line = proc.stdout.readline()
        rec = {"worker": n, "kind": kind, "gib": gib, "pid": proc.pid, "t_start_ns": t_start}
        if not line.startswith("READY"):
            rec["failed"] = line.strip() or "no READY"
            rec["reaped"] = {str(proc.pid): reaper.wait_for([proc.pid], 30)[proc.pid]}
            with lock:
                truth.append(rec)
            continue
        info = json.loads(line.split(" ", 1)[1])
        if kind == "pidns":
            to_host(proc.pid, info)
        t_ready = boot_ns()
        rec["t_ready_ns"] = t_ready
        rec["holders"] = info["holders"]
        # A pid namespace's job is `unshare`'s child, its children reaped by the namespace's
        # teardown: the harness reaps `unshare`, after all of them.
        rec["pid"] = info["pid"]
        everyone = [proc.pid] + [h["pid"] for h in info["holders"]]
        if kind == "pidns":
            everyone = [proc.pid]
        waiting = [h["pid"] for h in info["holders"] if h.get("plan") == "w"]
        killed = {}
        if kind != "exit":
            for pid, at in zip(waiting, kill_at):
                if at is not None:
                    time.sleep(max(0.0, t_ready / 1e9 + at - boot_ns() / 1e9))
                    killed[str(pid)] = boot_ns()
                    os.kill(pid, signal.SIGKILL)
            time.sleep(max(0.0, t_ready / 1e9 + life - boot_ns() / 1e9))
            pace.wait()
            rec["t_kill_ns"] = boot_ns()
            if group_kill is not None:
                # One call kills the whole group (the kernel kills a pid namespace's rest).
                group_kill(proc.pid)
                if kind == "pidns":
                    os.kill(info["pid"], signal.SIGKILL)
                for pid in waiting:
                    killed[str(pid)] = rec["t_kill_ns"]
            else:
                os.kill(proc.pid, signal.SIGKILL)
            for pid, at in zip(waiting, kill_at):
                if at is None and group_kill is None:
                    killed[str(pid)] = boot_ns()
                    os.kill(pid, signal.SIGKILL)
            with lock:
                for scraper in scrapers:
                    scraper.kills += 1
        reaps = reaper.wait_for(everyone, 60)
        if kind == "pidns":
            # Every process of the namespace was reaped before `unshare` was.
            done = reaps[proc.pid]
            reaps = {p: done for p in [info["pid"]] + [h["pid"] for h in info["holders"]]}
        rec["reaped"] = {str(p): r and r[0] for p, r in reaps.items()}
        rec["status"] = {str(p): r and r[1] for p, r in reaps.items()}
        if kind == "cgroup":
            try:
                os.rmdir(os.path.join(CGROUPS, f"job-{n}-{count}"))
            except OSError:
                pass
        # When each child's life ended: its own word, or the harness's SIGKILL.
        rec["t_end_ns"] = {**exits_said(proc.stdout), **killed}
        with lock:
            truth.append(rec)
        proc.stdout.close()


def start_agent(linger, out, listen, lean):
    """`linger agent --record` with its files under `out`, once it says it is tracing, and the
    scraper of its /metrics and CPU time."""
    # The agent refuses a state directory that does not exist (yet).
    os.makedirs(os.path.join(out, "state"), mode=0o700, exist_ok=True)
    err = open(os.path.join(out, "agent.err"), "w")
    agent = subprocess.Popen(
        [linger, "agent", "--metrics-listen", listen, "--state-dir",
         os.path.join(out, "state"), "--record", os.path.join(out, "soak.trace")]
        + (["--lean"] if lean else []),
        stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while "tracing" not in open(os.path.join(out, "agent.err")).read():
        if time.monotonic() > deadline or agent.poll() is not None:
            raise SystemExit("the agent did not start: " + open(os.path.join(out, "agent.err")).read())
        time.sleep(0.05)
    scraper = Scraper(agent.pid, open(os.path.join(out, "metrics.jsonl"), "w"), listen)
    scraper.start()
    return agent, scraper


def main():
    p = argparse.ArgumentParser()
    p.add_argument("linger")
    p.add_argument("out")
    p.add_argument("--lean", action="store_true")
    p.add_argument("--beside-lean", action="store_true")
    p.add_argument("--duration", type=float, default=480)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rate", type=float, default=6)
    # Every 2 ms or 20 ms, linger's NVML calls cost the same CPU (H100, 2026-12-05:
    # BENCHMARKS-H200.md).
    p.add_argument("--nvml-poll-ms", type=float, default=2)
    p.add_argument("--groups", action="store_true", help="whole groups killed at once too")
    a = p.parse_args()
    kinds = KINDS
    if a.groups:
        # Group kills take the place of part of the plain ones; cgroups only where the
        # hierarchy is v2 and writable.
        try:
            os.makedirs(CGROUPS, exist_ok=True)
            have_cgroups = os.path.exists(os.path.join(CGROUPS, "cgroup.kill"))
        except OSError:
            have_cgroups = False
        if not have_cgroups:
            print("no writable cgroup v2 hierarchy with cgroup.kill: no cgroup kills", flush=True)
        kinds = [k for k in GROUP_KINDS if have_cgroups or k[0] != "cgroup"] + KINDS
    os.makedirs(a.out, exist_ok=True)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    reaper = Reaper()
    reaper.start()
    poll = Poll(a.nvml_poll_ms / 1000)
    idle = poll.reading()[2]
    poll.start()
    agents = [start_agent(a.linger, a.out, "127.0.0.1:9477", a.lean)]
    if a.beside_lean:
        agents.append(start_agent(a.linger, os.path.join(a.out, "lean"), "127.0.0.1:9478", True))
    scrapers = [s for _, s in agents]
    truth, lock, stop = [], threading.Lock(), threading.Event()
    pace = Pace(a.rate)
    # Every worker's largest job fits beside the others': 128 GiB on an H200, on a smaller GPU
    # its memory less 12 GiB (CUDA contexts, and the H200's 140 GiB gave 128 too).
    total_gib = pynvml.nvmlDeviceGetMemoryInfo(poll.dev).total / GIB
    max_gib = max(1, int(min(128, total_gib - 12)) // a.workers)
    t0 = boot_ns()
    threads = [threading.Thread(target=worker, args=(n, reaper, pace, stop, truth, lock,
                                                     scrapers, max_gib, kinds), daemon=True)
               for n in range(a.workers)]
    for t in threads:
        t.start()
    time.sleep(a.duration)
    stop.set()
    for t in threads:
        t.join(120)
    t_end = boot_ns()
    # The last releases, then a few seconds of the agent's gauges after them.
    time.sleep(5)
    for _, scraper in agents:
        scraper.stop = True
    poll.stop = True
    time.sleep(1.2)
    for agent, _ in agents:
        agent.send_signal(signal.SIGINT)
    # The reaper collects the agents too, with their exit status.
    statuses = reaper.wait_for([agent.pid for agent, _ in agents], 120)
    agent_status = (statuses[agents[0][0].pid] or (None, None))[1]
    with open(os.path.join(a.out, "truth.jsonl"), "w") as f:
        for rec in truth:
            for pid in [rec["pid"]] + [h["pid"] for h in rec.get("holders", [])]:
                # NVML's listing of a pid over the whole run: a reused pid's is ambiguous.
                rec.setdefault("nvml_listed", {})[str(pid)] = poll.listed.get(pid)
                # Every time the pid left NVML's list: [last reading listing it began, first
                # reading without it ended].
                rec.setdefault("nvml_left", {})[str(pid)] = poll.left.get(pid, [])
                rec.setdefault("nvml_share", {})[str(pid)] = poll.share.get(pid)
            f.write(json.dumps(rec) + "\n")
        # harness 2: each job's reaps taken when they came (1 kept one per pid for the run);
        # 4: every step of the used memory, and each pid's last NVML share.
        f.write(json.dumps({"summary": True, "harness": 4, "t_begin_ns": t0, "t_end_ns": t_end, "idle_used": idle,
                            "used_after": poll.reading()[2], "workers": a.workers,
                            "rate": a.rate, "lean": a.lean, "groups": a.groups,
                            "agent_status": agent_status,
                            "beside_lean_status": a.beside_lean and (statuses[agents[1][0].pid] or (None, None))[1],
                            "used": poll.used, "used_steps": poll.steps}) + "\n")


if __name__ == "__main__":
    main()

"""linger's answers in a soak against the soak's own truth (soak.py): for every process of every
job that ended (the job, its forked children and grandchildren, its IPC importer), its incident's
verdict, holders and release time; every incident settled; the lingering gauge back to 0 within
2 s of the last release; and per minute the agent's CPU per kill, its memory and the records
lost. Exits 1 when any answer is wrong, an incident a death needs is missing, an incident is
left open, the gauge stays up, or too many moments are late (below); 0 otherwise.

usage: check.py DIR [--agent lean] [--incidents FILE] [--until NS] [--lean]
    DIR holds truth.jsonl (or truth.jsonl.zst's contents), metrics.jsonl (optional) and
    state/incidents.jsonl, or an incident log given with --incidents (e.g. a replay's output);
    --agent lean: the agent run beside the first (soak.py --beside-lean), whose metrics and log
    are under DIR/lean/; --until: judge only the jobs that ended 5 s before this CLOCK_BOOTTIME
    (a recording's cut); --lean: the answers of a --lean agent (given with --incidents).

Who held a job's memory when each of its processes died comes from when each one's life ended:
the child's own EXIT line (its last act before _exit), the harness's SIGKILL, or its reap. Ends
within AMBIGUOUS_NS of each other cannot be ordered from outside, and either answer is right.
A job's memory is back, by the GPU's own account, between the start of the last reading of the
soak's NVML poll that still listed the last process holding it and the end of the first that
did not. The moment an incident reports (t_memory_back_ns) is right within MOMENT_NS of that
interval, whatever else it states; a window it states (t_memory_held_until_ns to
t_memory_back_ns) must hold part of the interval. A moment early beyond MOMENT_NS, or late
without such a window, is a wrong answer; late ones in such a window may be at most
MOMENT_MISS_SHARE of the moments judged, or the check fails. Only a job no reading brackets is
held to the harness's clocks: within WITHIN_NS of the reap of its last holder (the driver frees
in that process's exit, before its zombie transition), or for a job that exited normally,
between its EXIT line and its reap.
"""
import argparse, json, os, statistics, sys

import steps

SLOW_NS = 1_000_000_000
WITHIN_NS = 5_000_000
AMBIGUOUS_NS = 5_000_000
MARGIN_NS = 5_000_000_000
GAUGE_LAG_NS = 1_000_000_000
GAUGE_ZERO_BY_NS = 2_000_000_000
# The reported moment against the GPU's interval: off by more than MOMENT_NS is a wrong
# moment, whatever window the incident states. Early ones are wrong answers; late ones in a
# window that holds the interval may be at most MOMENT_MISS_SHARE of the moments judged (the
# target: 99 % within MOMENT_NS).
MOMENT_NS = 2_000_000
MOMENT_MISS_SHARE = 0.01
# A SIGKILL from the same sender this soon after the job's is of the same kill (linger's rule,
# tracer-user/src/analysis/correlate/group.rs): such holders are victims, not holders to kill.
SAME_KILL_NS = 50_000_000
# Jobs killed as a whole group at once (soak.py --groups): their children are victims killed
# with them, never holders to kill.
GROUP_KINDS = {"killpg", "cgroup", "pidns"}


def last_records(path):
    """The last record of each incident, by target pid (a list: pids are reused), and the ids of
    incidents without a verdict in any record."""
    last = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type", "").startswith("incident"):
            last[r["id"]] = r
    by_pid = {}
    for r in last.values():
        by_pid.setdefault(r["target"]["pid"], []).append(r)
    return by_pid


def incident_of(pid, start, end, incidents):
    """The incident of `pid` whose death (or signal) lies in [start, end]."""
    for inc in incidents.get(pid, []):
        dead = inc.get("t_group_dead_ns") or inc.get("t_signal_ns") or 0
        if start <= dead <= end:
            return inc
    return None


def one_death_complaints(pid, job, incidents):
    """One termination, one incident: a second one about the same death (the kernel's own
    kill of a pid namespace's dying init, a kill of a zombie) is wrong, and so is any
    `not_delivered` for a process that died."""
    start, end = job.row["t_start_ns"], job.last_end + AMBIGUOUS_NS
    mine = [i for i in incidents.get(pid, [])
            if start <= (i.get("t_group_dead_ns") or i.get("t_signal_ns") or 0) <= end]
    wrong = []
    if len(mine) > 1:
        wrong.append(f"{len(mine)} incidents for one death")
    if any((i.get("verdict") or {}).get("kind") == "not_delivered" for i in mine):
        wrong.append("not_delivered for a process that died")
    return wrong


def names_group_member(job, inc):
    """For a job killed as a group: the members of the group its hint says to kill (all of
    them were killed with it)."""
    if job.kind not in GROUP_KINDS or inc is None:
        return []
    hint = (inc.get("verdict") or {}).get("hint", "")
    return [f"hint names {p}, killed with it" for p in [job.pid] + list(job.holders)
            if f"kill {p}" in hint]


class Job:
    """One job of the truth: its processes and when each one's life ended."""

    def __init__(self, row):
        self.row = row
        self.pid = row["pid"]
        self.kind = row["kind"]
        self.holders = {h["pid"]: h for h in row.get("holders", [])}
        reaped = {int(p): t for p, t in row["reaped"].items()}
        said = {int(p): t for p, t in row.get("t_end_ns", {}).items()}
        self.end = {}
        for pid in [self.pid] + list(self.holders):
            if pid == self.pid and "t_kill_ns" in row:
                self.end[pid] = row["t_kill_ns"]
            else:
                self.end[pid] = said.get(pid) or reaped.get(pid) or 0
        self.reaped = reaped
        self.last_end = max(t or 0 for t in reaped.values())

    def alive_at(self, pid, t):
        """The other processes of the job that surely held its files at `t` (required), and
        those whose end lies too close to tell (either way is right)."""
        sure, either = set(), set()
        for other, end in self.end.items():
            if other == pid:
                continue
            if end > t + AMBIGUOUS_NS:
                sure.add(other)
            elif end >= t - AMBIGUOUS_NS:
                either.add(other)
        return sure, either

    def t_back(self):
        """When the job's memory was back, by the harness: the reap of the last process that
        held it at the job's death (children that left before are reaped only once the job
        is gone, after its memory)."""
        sure, either = self.alive_at(self.pid, self.end[self.pid])
        return max(self.reaped.get(p) or 0 for p in {self.pid} | sure | either)


    def nvml_interval(self):
        """When NVML's own poll says the job's memory came back: between the start of the
        last reading that still listed the last of its holders and the end of the first that
        did not (the last to leave the list among the job and the processes that held its
        files at its death). None where the soak's truth has no such reading."""
        sure, either = self.alive_at(self.pid, self.end[self.pid])
        spans = [(a, b) for p in {self.pid} | sure | either
                 for a, b in self.row.get("nvml_left", {}).get(str(p), [])
                 if b >= self.end[self.pid] and a <= self.last_end]
        return max(spans, key=lambda s: s[1], default=None)


def holders_of(inc):
    return {h["pid"] for h in inc.get("holders", [])}


def names_risers(inc):
    """An `incomplete` verdict naming the processes whose NVML figures rose as the victim left
    NVML's list: the one ambiguity --lean documents."""
    return any("NVML's figures rose for" in e and "without driver calls" in e
               for e in (inc.get("verdict") or {}).get("evidence", []))


def judge_job(job, incidents, lean):
    """What is wrong with the answer for the job's own death: a list of complaints."""
    inc = incident_of(job.pid, job.row["t_start_ns"], job.last_end, incidents)
    if inc is None:
        return ["no incident"], None
    sure, either = job.alive_at(job.pid, job.end[job.pid])
    t_back = job.t_back()
    dead = inc.get("t_group_dead_ns") or job.row.get("t_kill_ns") or t_back
    got = holders_of(inc)
    how = {job.holders[p]["how"] for p in got & sure if p in job.holders}
    if "import" in how:
        allowed = {"imported"}
    elif how:
        allowed = {"shared_fd"}
    elif t_back - dead > SLOW_NS + WITHIN_NS:
        allowed = {"slow_teardown"}
    elif t_back - dead > SLOW_NS - WITHIN_NS:
        allowed = {"released", "slow_teardown"}
    else:
        allowed = {"released"}
    if got & either and not how and job.kind not in GROUP_KINDS:
        # A process killed with it, alive or already dying at its death: held until then.
        allowed.add("shared_fd")
    killed = job.row.get("t_kill_ns")
    ends = job.row.get("t_end_ns", {})
    if how and killed and all(job.holders.get(p, {}).get("plan") == "w" and str(p) in ends
                              and ends[str(p)] - killed <= SAME_KILL_NS for p in got & sure):
        # Its holders killed by the harness right after it (a supervisor's loop over a unit's
        # processes): linger's one kill, victims letting go with their exits.
        allowed.add("released")
    verdict = (inc.get("verdict") or {}).get("kind")
    if lean and verdict == "incomplete" and names_risers(inc):
        return [], inc
    wrong = []
    if verdict not in allowed:
        wrong.append(f"verdict {verdict} (want {sorted(allowed)})")
    if not sure <= got <= sure | either:
        wrong.append(f"holders {sorted(got)} (want {sorted(sure)} and maybe {sorted(either)})")
    complaint = release_complaint(job, inc, t_back)
    if complaint:
        wrong.append(complaint)
    wrong += one_death_complaints(job.pid, job, incidents) + names_group_member(job, inc)
    return wrong, inc


def placement(job, inc):
    """Where the incident's moment (t_memory_back_ns) falls against the GPU's own interval,
    whatever window it states: "inside" it (or within MOMENT_NS of it), "early" or "late"; and
    whether the window it states (t_memory_held_until_ns to t_memory_back_ns) holds part of the
    interval (None where it states none). None without an interval."""
    gpu = (inc or {}).get("gpu") or {}
    back, held = gpu.get("t_memory_back_ns"), gpu.get("t_memory_held_until_ns")
    interval = job.nvml_interval()
    if back is None or interval is None:
        return None
    window = None if held is None else held <= interval[1] and back >= interval[0]
    if back < interval[0] - MOMENT_NS:
        return "early", window
    if back > interval[1] + MOMENT_NS:
        return "late", window
    return "inside", window


def release_complaint(job, inc, t_back):
    """What is wrong with a job's reported release: judged against the GPU's interval where
    the soak's poll gives one, else against the harness's clocks (the reap, or for a job that
    exited normally its EXIT line to its reap). A moment late beyond MOMENT_NS in a window that
    holds the interval is not wrong here: such moments are counted (`late_moments`), and more
    than MOMENT_MISS_SHARE of them fail the check."""
    back = (inc.get("gpu") or {}).get("t_memory_back_ns")
    if back is None:
        return "no release"
    placed = placement(job, inc)
    if placed is not None:
        where, window = placed
        if window is False and where != "early":
            return (f"window {interval_text((inc['gpu']['t_memory_held_until_ns'], back), t_back)}"
                    f" misses NVML's {interval_text(job.nvml_interval(), t_back)}")
        if where == "inside" or (where == "late" and window):
            return None
        return (f"release {(back - t_back) / 1e6:+.1f} ms off the reap, {where}: outside NVML's "
                f"{interval_text(job.nvml_interval(), t_back)} by more than "
                f"{MOMENT_NS / 1e6:.0f} ms{'' if window else ', and no window stated'}")
    exited = job.row.get("t_end_ns", {}).get(str(job.pid))
    if abs(back - t_back) <= WITHIN_NS or (exited is not None and exited <= back <= t_back):
        return None
    return f"release {(back - t_back) / 1e6:+.1f} ms off the reap (no NVML interval)"


def interval_text(interval, t_back):
    if interval is None:
        return "(none)"
    return f"[{(interval[0] - t_back) / 1e6:+.1f}, {(interval[1] - t_back) / 1e6:+.1f}] ms"


def judge_member(job, pid, incidents, job_inc):
    """What is wrong with the answer for the death of one of the job's other processes. A
    child that died while the job lived gave back nothing of its own: if killed, its incident
    names who still held the files and is back when the job's memory is; a child that exited
    normally then needs no incident (its memory was not its own), but one it has is judged the
    same. Children that died after the job or with it need none; one they have must name only
    processes that held the files then."""
    t = job.end[pid]
    inc = incident_of(pid, job.row["t_start_ns"], job.last_end, incidents)
    killed_before = (str(pid) in job.row.get("t_end_ns", {})
                     and job.holders[pid].get("plan") == "w"
                     and t < job.end[job.pid] - AMBIGUOUS_NS)
    if inc is None:
        return (["no incident"] if killed_before else []), None
    sure, either = job.alive_at(pid, t)
    got = holders_of(inc)
    wrong = one_death_complaints(pid, job, incidents) + names_group_member(job, inc)
    if not sure <= got <= sure | either:
        wrong.append(f"holders {sorted(got)} (want {sorted(sure)} and maybe {sorted(either)})")
    if t < job.end[job.pid] - AMBIGUOUS_NS:
        verdict = (inc.get("verdict") or {}).get("kind")
        if verdict != "shared_fd":
            wrong.append(f"verdict {verdict} (want shared_fd: its parent held the memory)")
        back = (inc.get("gpu") or {}).get("t_memory_back_ns")
        job_back = ((job_inc or {}).get("gpu") or {}).get("t_memory_back_ns")
        if back is None or back != job_back:
            wrong.append(f"back {back} (want the job's, {job_back})")
        if (inc.get("gpu") or {}).get("share_bytes"):
            wrong.append("a share of its own")
    return wrong, inc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--incidents")
    p.add_argument("--agent", help="the subdirectory of an agent run beside the first")
    p.add_argument("--until", type=int, help="judge jobs ended 5 s before this (a cut)")
    p.add_argument("--lean", action="store_true")
    p.add_argument("--show", type=int, default=5, help="wrong answers shown per kind")
    p.add_argument("--late-moments", type=float, default=MOMENT_MISS_SHARE,
                   help="the share of moments that may be late beyond MOMENT_NS in a window")
    a = p.parse_args()
    rows = [json.loads(l) for l in open(os.path.join(a.dir, "truth.jsonl"))]
    summary = rows.pop()
    lean = a.lean or a.agent == "lean" or summary.get("lean")
    agent_dir = os.path.join(a.dir, a.agent or "")
    log = a.incidents or os.path.join(agent_dir, "state/incidents.jsonl")
    incidents = last_records(log)
    jobs = [Job(r) for r in rows if "failed" not in r and "t_start_ns" in r]
    if a.until:
        jobs = [j for j in jobs if j.last_end + MARGIN_NS < a.until]
    failed = sum(1 for r in rows if "failed" in r)
    wrong, judged, errors, deaths = {}, set(), [], 0
    for job in jobs:
        complaints, job_inc = judge_job(job, incidents, lean)
        deaths += 1
        if job_inc:
            judged.add(job_inc["id"])
            back = (job_inc.get("gpu") or {}).get("t_memory_back_ns")
            if back is not None:
                errors.append(back - job.t_back())
        if complaints:
            wrong.setdefault((job.kind, "job"), []).append((job.pid, complaints))
        for pid, h in job.holders.items():
            complaints, inc = judge_member(job, pid, incidents, job_inc)
            deaths += 1
            if inc:
                judged.add(inc["id"])
            if complaints:
                wrong.setdefault((job.kind, h.get("plan", h["how"])[:1]), []).append((pid, complaints))
    kills = sum(1 for j in jobs if "t_kill_ns" in j.row)
    print(f"jobs {len(jobs)} ({kills} killed, {failed} failed to start), {deaths} deaths judged, "
          f"{summary['workers']} workers, rate {summary['rate']}/s, lean {bool(lean)}")
    bad = sum(len(v) for v in wrong.values())
    print(f"right (verdict, holders, release placed): {deaths - bad} of {deaths}")
    for (kind, who), cases in sorted(wrong.items(), key=lambda kv: -len(kv[1])):
        print(f"  {kind} {who}: {len(cases)} wrong")
        for pid, complaints in cases[:a.show]:
            print(f"    pid {pid}: {'; '.join(complaints)}")
    every = [i for each in incidents.values() for i in each]
    if a.until:
        every = [i for i in every if (i.get("t_group_dead_ns") or i.get("t_signal_ns") or 0)
                 + MARGIN_NS < a.until]
    unsettled = [i for i in every if i.get("t_group_dead_ns") and not i.get("settled")]
    verdictless = [i for i in every if i.get("t_group_dead_ns") and not i.get("verdict")]
    print(f"incidents: {len(every)}, left open: {len(unsettled)}, without a verdict: {len(verdictless)}")
    for i in (unsettled + verdictless)[:a.show]:
        print(f"    pid {i['target']['pid']} ({i['termination']['mode']}): "
              f"{(i.get('verdict') or {}).get('kind')}, settled {i.get('settled')}")
    if errors:
        abs_ms = sorted(abs(e) / 1e6 for e in errors)
        print(f"release error: median {statistics.median(abs_ms):.2f} ms, p99 "
              f"{abs_ms[int(len(abs_ms) * 0.99)]:.2f} ms, max {abs_ms[-1]:.2f} ms ({len(abs_ms)} releases)")
    moments_ok = interval_report(jobs, incidents, a.late_moments)
    steps.report(jobs, incidents, summary.get("used_steps", []), incident_of)
    gauge_ok = True
    metrics_path = os.path.join(agent_dir, "metrics.jsonl")
    if not a.incidents and os.path.exists(metrics_path):
        gauge_ok = metrics_report(metrics_path, incidents, jobs)
    ok = bad == 0 and not unsettled and not verdictless and gauge_ok and moments_ok
    print("check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def interval_report(jobs, incidents, allowed):
    """Where each job's reported moment falls against NVML's own interval for it (soak.py's
    poll, each reading stamped at its start and end: back after the start of the last reading
    that listed the last holder, before the end of the first that did not), by the source the
    incident gives (`placement`), with the interval's median width and that of the windows
    the incidents state for the late ones. Whether the late moments pass: at most
    MOMENT_MISS_SHARE of those judged."""
    by_source, judged, late = {}, 0, 0
    for job in jobs:
        inc = incident_of(job.pid, job.row["t_start_ns"], job.last_end, incidents)
        placed = placement(job, inc)
        if placed is None:
            continue
        where, window = placed
        gpu, interval = inc["gpu"], job.nvml_interval()
        row = by_source.setdefault(gpu.get("memory_back_by") or "none", {
            "inside": 0, "window": [], "early": [], "late": [], "width": []})
        row["width"].append(interval[1] - interval[0])
        back = gpu["t_memory_back_ns"]
        judged += 1
        if where == "inside":
            row["inside"] += 1
        elif where == "early":
            row["early"].append(interval[0] - back)
        else:
            row["late"].append(back - interval[1])
            late += 1
            if window:
                row["window"].append(back - gpu["t_memory_held_until_ns"])
    if not by_source:
        return True
    print(f"moments against NVML's interval (source: within {MOMENT_NS / 1e6:.0f} ms of it / "
          "early / late, of them in a window the incident states, the interval's median width)")
    for source, row in sorted(by_source.items()):
        n = row["inside"] + len(row["early"]) + len(row["late"])
        worst = lambda v: f" (max {max(v) / 1e6:.1f} ms)" if v else ""
        window = (f" (its width: median {statistics.median(row['window']) / 1e6:.1f} ms, "
                  f"max {max(row['window']) / 1e6:.1f} ms)" if row["window"] else "")
        print(f"  {source}: {n} moments, {row['inside']} within, {len(row['early'])} early"
              f"{worst(row['early'])}, {len(row['late'])} late{worst(row['late'])}, "
              f"{len(row['window'])} of them in a stated window{window}; width "
              f"{statistics.median(row['width']) / 1e6:.1f} ms")
    ok = late <= allowed * judged
    print(f"late moments: {late} of {judged} ({'within' if ok else 'over'} the "
          f"{allowed * 100:g} % allowed)")
    return ok


def metrics_report(path, incidents, jobs):
    """Per minute: kills, the agent's CPU per kill, its memory, records lost, the gauge; and
    whether the gauge was 0 by GAUGE_ZERO_BY_NS after the last release."""
    metrics = [json.loads(l) for l in open(path)]
    metrics = [m for m in metrics if "cpu_s" in m]
    if not metrics:
        return True
    print("minute  kills  agent CPU s  CPU per kill ms  without --record  RSS MB  lost records  lingering GB")
    t0 = metrics[0]["t_ns"]
    minute = {}
    for m in metrics:
        minute.setdefault(int((m["t_ns"] - t0) / 60e9), []).append(m)
    prev = metrics[0]
    for n, ms in sorted(minute.items()):
        end = ms[-1]
        k = end["kills"] - prev["kills"]
        cpu = end["cpu_s"] - prev["cpu_s"]
        per = f"{cpu / k * 1e3:.1f}" if k else "-"
        rec = end.get("parts", {}).get("record", 0) - prev.get("parts", {}).get("record", 0)
        bare = f"{(cpu - rec) / k * 1e3:.1f}" if k else "-"
        lost = sum(end.get("lost", {}).values())
        print(f"{n:6d} {k:6d} {cpu:12.1f} {per:>16} {bare:>17} {end['rss'] / 1e6:7.0f}  {lost:12.0f}  "
              f"{end.get('lingering', 0) / 1e9:12.2f}")
        prev = end
    print(f"at the end: lost {metrics[-1].get('lost')}, lingering {metrics[-1].get('lingering', 0) / 1e9:.2f} GB")
    ok = gauge_against_incidents(metrics, incidents, jobs)
    cost_by_part(metrics, minute, "parts", "the agent's CPU ms per kill, by part of its work")
    cost_by_part(metrics, minute, "threads", "the agent's CPU ms per kill, by thread (/proc)")
    return ok


def gauge_against_incidents(metrics, incidents, jobs):
    """The lingering gauge at each scrape against the shares of the incidents open then or in
    the second before (a release is confirmed by an NVML reading, about one a second under the
    agent's NVML budget); it must be 0 at the first scrape GAUGE_ZERO_BY_NS after the soak's
    last release, and never above those shares."""
    windows = []
    for inc in (i for each in incidents.values() for i in each):
        gpu = inc.get("gpu") or {}
        start = inc.get("t_group_dead_ns") or inc.get("t_signal_ns")
        if start and gpu.get("share_bytes"):
            windows.append((start, gpu.get("t_memory_back_ns") or float("inf"), gpu["share_bytes"]))
    above = [m for m in metrics if m.get("lingering", 0) > 1e6 + sum(
        b for start, back, b in windows if start <= m["t_ns"] and back > m["t_ns"] - GAUGE_LAG_NS)]
    print(f"lingering gauge: at most {max(m.get('lingering', 0) for m in metrics) / 1e9:.2f} GB; above "
          f"the shares of the incidents open within {GAUGE_LAG_NS / 1e9:.0f} s before at {len(above)} of "
          f"{len(metrics)} scrapes")
    last = max((t or 0 for j in jobs for t in j.reaped.values()), default=0)
    after = [m for m in metrics if m["t_ns"] > last + GAUGE_ZERO_BY_NS]
    if not after:
        print("  no scrape 2 s after the last release")
        return not above
    zero = after[0].get("lingering", 0) == 0
    print(f"  at the first scrape {GAUGE_ZERO_BY_NS / 1e9:.0f} s after the last release "
          f"({(after[0]['t_ns'] - last) / 1e9:.2f} s after it): {after[0].get('lingering', 0) / 1e9:.2f} GB"
          + ("" if zero else " (must be 0)"))
    return zero and not above


def cost_by_part(metrics, minute, key, title):
    """Per minute, each part's CPU time per kill (from the agent's own counters or /proc)."""
    names = sorted({p for m in metrics for p in m.get(key, {})})
    if not names:
        return
    print(title)
    print("minute " + " ".join(f"{n[:12]:>12}" for n in names))
    prev = metrics[0]
    for n, ms in sorted(minute.items()):
        end = ms[-1]
        k = end["kills"] - prev["kills"]
        cells = []
        for p in names:
            spent = end.get(key, {}).get(p, 0) - prev.get(key, {}).get(p, 0)
            cells.append(f"{spent / k * 1e3:12.1f}" if k else f"{'-':>12}")
        print(f"{n:6d} " + " ".join(cells))
        prev = end


if __name__ == "__main__":
    sys.exit(main())

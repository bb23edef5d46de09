"""linger's answers in a soak against the soak's own truth (soak.py): for every job killed or
exited, its incident's verdict, holders and release time, and per minute the agent's CPU per
kill, its memory, the records lost and the lingering gauge.

usage: check.py DIR [--agent lean]   (DIR holds truth.jsonl, metrics.jsonl and
        state/incidents.jsonl, or an `incidents` file given with --incidents, e.g. a replay's
        output; --agent lean: the agent run beside the first (soak.py --beside-lean), whose
        metrics and log are under DIR/lean/)
"""
import argparse, json, os, statistics, sys

SLOW_NS = 1_000_000_000
WITHIN_NS = 5_000_000
GAUGE_LAG_NS = 1_000_000_000
EXPECT = {"kill": "released", "exit": "released", "fork": "shared_fd", "ipc": "imported"}


def last_records(path):
    """The last record of each incident, by target pid: a list, since pids are reused."""
    last = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type", "").startswith("incident"):
            last[r["id"]] = r
    by_pid = {}
    for r in last.values():
        by_pid.setdefault(r["target"]["pid"], []).append(r)
    return by_pid


def incident_of(job, incidents):
    """The incident of this job's death: of its pid, the one whose death lies in its life."""
    end = max(t or 0 for t in job["reaped"].values())
    for inc in incidents.get(job["pid"], []):
        dead = inc.get("t_group_dead_ns") or inc.get("t_signal_ns") or 0
        if job["t_start_ns"] <= dead <= end:
            return inc
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--incidents")
    p.add_argument("--agent", help="the subdirectory of an agent run beside the first")
    p.add_argument("--show", type=int, default=5, help="wrong answers shown per kind")
    a = p.parse_args()
    rows = [json.loads(l) for l in open(os.path.join(a.dir, "truth.jsonl"))]
    summary = rows.pop()
    agent_dir = os.path.join(a.dir, a.agent or "")
    if a.agent == "lean":
        summary["lean"] = True
    incidents = last_records(a.incidents or os.path.join(agent_dir, "state/incidents.jsonl"))
    # A harness of an earlier version kept one reap per pid for the whole run: a reused pid's
    # truth is ambiguous there, and such jobs are set aside.
    seen = {}
    for r in rows:
        for pid in [r["pid"]] + [h["pid"] for h in r.get("holders", [])]:
            seen[pid] = seen.get(pid, 0) + 1
    ambiguous = [] if summary.get("harness", 1) >= 2 else [
        r for r in rows if "t_start_ns" in r
        and any(seen[p] > 1 for p in [r["pid"]] + [h["pid"] for h in r.get("holders", [])])]
    jobs = [r for r in rows if "failed" not in r and r not in ambiguous]
    missing, wrong, errors = [], {}, []
    for r in jobs:
        inc = incident_of(r, incidents)
        if inc is None:
            missing.append(r)
            continue
        holders = [h["pid"] for h in r["holders"]]
        t_back = max(r["reaped"][str(p)] or 0 for p in [r["pid"]] + holders)
        dead = inc.get("t_group_dead_ns") or r.get("t_kill_ns") or t_back
        want = EXPECT[r["kind"]]
        allowed = {want}
        if want == "released" and t_back - dead > SLOW_NS - WITHIN_NS:
            allowed = {"released", "slow_teardown"} if t_back - dead < SLOW_NS + WITHIN_NS else {"slow_teardown"}
        verdict = (inc.get("verdict") or {}).get("kind")
        got_holders = sorted(h["pid"] for h in inc.get("holders", []))
        back = (inc.get("gpu") or {}).get("t_memory_back_ns")
        err = None if back is None else back - t_back
        ok = verdict in allowed and got_holders == sorted(holders) and err is not None and abs(err) <= WITHIN_NS
        if err is not None:
            errors.append(err)
        if not ok:
            wrong.setdefault((r["kind"], verdict), []).append((r, inc, err))
    kills = sum(1 for r in jobs if "t_kill_ns" in r)
    failed = sum(1 for r in rows if "failed" in r)
    print(f"jobs {len(jobs)} ({kills} killed, {failed} failed to start), "
          f"{summary['workers']} workers, rate {summary['rate']}/s, lean {summary['lean']}")
    if ambiguous:
        print(f"set aside: {len(ambiguous)} jobs whose pids the run reused (one reap kept per pid)")
    print(f"without an incident: {len(missing)}")
    right = len(jobs) - len(missing) - sum(len(v) for v in wrong.values())
    print(f"right (verdict, holders, release within {WITHIN_NS / 1e6:.0f} ms): {right} of {len(jobs)}")
    # `incomplete` says the sources could not be reconciled: not right, but not a wrong answer.
    honest = sum(len(v) for (_, verdict), v in wrong.items() if verdict == "incomplete")
    print(f"said incomplete (sources not reconciled): {honest}; wrong: {len(jobs) - len(missing) - right - honest}")
    for (kind, verdict), cases in sorted(wrong.items(), key=lambda kv: -len(kv[1])):
        print(f"  {kind} said {verdict}: {len(cases)}")
        for r, inc, err in cases[:a.show]:
            e = "no release" if err is None else f"{err / 1e6:+.1f} ms"
            ev = (inc.get("verdict") or {}).get("evidence", [""])[:1]
            print(f"    pid {r['pid']} {r['gib']} GiB: {e}; {ev}")
    if errors:
        abs_ms = sorted(abs(e) / 1e6 for e in errors)
        print(f"release error: median {statistics.median(abs_ms):.2f} ms, p99 "
              f"{abs_ms[int(len(abs_ms) * 0.99)]:.2f} ms, max {abs_ms[-1]:.2f} ms ({len(abs_ms)} releases)")
    metrics = [json.loads(l) for l in open(os.path.join(agent_dir, "metrics.jsonl"))]
    metrics = [m for m in metrics if "cpu_s" in m]
    if metrics:
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
        gauge_against_incidents(metrics, incidents, jobs)
        cost_by_part(metrics, minute, "parts", "the agent's CPU ms per kill, by part of its work")
        cost_by_part(metrics, minute, "threads", "the agent's CPU ms per kill, by thread (/proc)")


def gauge_against_incidents(metrics, incidents, jobs):
    """The lingering gauge at each scrape against the shares of the incidents open then or in
    the second before (a release is confirmed by an NVML reading, about one a second under the
    agent's NVML budget), and at the first scrape after the soak's last release."""
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
    last = max(t or 0 for r in jobs for t in r["reaped"].values())
    after = [m for m in metrics if m["t_ns"] > last]
    if after:
        print(f"  at the first scrape after the last release ({(after[0]['t_ns'] - last) / 1e9:.2f} s "
              f"after it): {after[0].get('lingering', 0) / 1e9:.2f} GB")


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

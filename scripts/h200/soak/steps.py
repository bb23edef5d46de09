"""The second account of when each victim's memory came back, from the device's used memory
(soak.py harness 4): teardowns serialize on the driver's lock, so the used memory steps down
by each victim's share in turn. A step lies between the start of the last reading before it
and the end of the first after it. Matched in the order of the victims' deaths to the first
step after each death large enough for its NVML share; steps that carried several shares
(victims released within one reading) are shared out. An allocation in the same reading
hides a step (the net change is smaller): such victims stay unmatched and are counted."""

import statistics

MIB = 1 << 20
# The share NVML lists and the step the used memory takes differ by the allocator's rounding.
TOLERANCE = 64 * MIB
# How long after the last process of a job left a step may still be its own.
SLACK_NS = 2_000_000_000


def used_intervals(jobs, steps):
    """pid of each matched job -> (start, end): when the used memory took its share off."""
    downs = sorted([a, b, before - after] for a, b, before, after in steps if after < before)
    found = {}
    for job in sorted(jobs, key=lambda j: j.end[j.pid]):
        share = (job.row.get("nvml_share") or {}).get(str(job.pid))
        if not share:
            continue
        dead = job.end[job.pid]
        for step in downs:
            start, end, left = step
            if end < dead:
                continue
            if start > job.last_end + SLACK_NS:
                break
            if left >= share - TOLERANCE:
                step[2] = left - share
                found[job.pid] = (start, end)
                break
    return found


def report(jobs, incidents, steps, incident_of):
    """How many victims the used memory accounts for, whether that account agrees with
    NVML's process list (the two intervals overlap), and where linger's releases fall
    against it."""
    used = used_intervals(jobs, steps)
    agree, places, widths = 0, {"inside": 0, "early": [], "late": []}, []
    for job in jobs:
        interval = used.get(job.pid)
        if interval is None:
            continue
        widths.append(interval[1] - interval[0])
        listed = job.nvml_interval()
        if listed and listed[0] <= interval[1] and interval[0] <= listed[1]:
            agree += 1
        inc = incident_of(job.pid, job.row["t_start_ns"], job.last_end, incidents)
        back = ((inc or {}).get("gpu") or {}).get("t_memory_back_ns")
        if back is None:
            continue
        if interval[0] <= back <= interval[1]:
            places["inside"] += 1
        elif back < interval[0]:
            places["early"].append(interval[0] - back)
        else:
            places["late"].append(back - interval[1])
    if not widths:
        return
    worst = lambda v: f" (max {max(v) / 1e6:.1f} ms)" if v else ""
    print(f"used-memory steps: {len(used)} of {len(jobs)} jobs matched (median width "
          f"{statistics.median(widths) / 1e6:.1f} ms), {agree} overlapping NVML's list "
          f"interval; releases {places['inside']} inside, {len(places['early'])} early"
          f"{worst(places['early'])}, {len(places['late'])} late{worst(places['late'])}")

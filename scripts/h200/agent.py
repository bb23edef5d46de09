"""The agent on the H200, with a forked holder: `linger agent` serves metrics while a 4 GiB
PyTorch process is SIGKILLed and the child it forked keeps its GPU files; the script polls
/metrics every 100 ms (a scrape interval is 15 s or more) and `linger wait`, beside its own
1 ms NVML poll, then kills the holder and watches the series go.

usage: agent.py LINGER OUTDIR      (writes OUTDIR/agent.json and the agent's files)
"""
import json, os, signal, subprocess, sys, time, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite"))
from run import Victim, kill, reap, settle  # noqa: E402
from truth import Poll, boot_ns  # noqa: E402

L, OUT = sys.argv[1], sys.argv[2]
PORT = 19477
os.makedirs(os.path.join(OUT, "state"), mode=0o700, exist_ok=True)


LATENCY_MS = []


def metrics():
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as r:
        text = r.read().decode()
    LATENCY_MS.append(round((time.monotonic() - t0) * 1000, 2))
    return text


def series(text, name):
    return [l for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " ")]


def until(pred, timeout_s=30):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        text = metrics()
        if pred(text):
            return boot_ns(), text
        time.sleep(0.1)
    return None, metrics()


def wait_cmd(*args):
    t0 = time.monotonic()
    p = subprocess.run([L, "wait", "--json", "--state-dir", os.path.join(OUT, "state"), *args],
                       capture_output=True, text=True)
    return {"rc": p.returncode, "s": round(time.monotonic() - t0, 3),
            "out": p.stdout.strip(), "err": p.stderr.strip()}


poll = Poll()
time.sleep(0.5)
idle = poll.now()[1]
err = open(os.path.join(OUT, "agent.err"), "w")
agent = subprocess.Popen([L, "agent", "--metrics-listen", f"127.0.0.1:{PORT}",
                          "--state-dir", os.path.join(OUT, "state"),
                          "--record", os.path.join(OUT, "agent.trace"), "--linger-after", "8s"],
                         stdout=subprocess.DEVNULL, stderr=err)
deadline = time.monotonic() + 60
while "tracing" not in open(os.path.join(OUT, "agent.err")).read():
    if time.monotonic() > deadline or agent.poll() is not None:
        raise SystemExit("agent did not start: " + open(os.path.join(OUT, "agent.err")).read())
    time.sleep(0.05)
r = {"idle_used": idle, "before": metrics()}
r["wait_clean_before"] = wait_cmd("--timeout", "5s")

v = Victim("--gib", "4", "--fork", "1")
child = v.info["children"][0]
time.sleep(1)
t_kill = kill(v.pid)
t_reaped = reap(v.pid)
unattributed = []


def held(t):
    unattributed.extend(l.rsplit(" ", 1)[1] for l in
                        series(t, "linger_gpu_memory_unattributed_bytes"))
    return any('verdict="shared_fd"' in l and not l.endswith(" 0")
               for l in series(t, "linger_gpu_memory_lingering_bytes"))


t_seen, held_text = until(held)
r.update(victim=v.pid, child=child, t_kill_ns=t_kill, t_reaped_ns=t_reaped,
         t_lingering_seen_ns=t_seen, held=held_text)
time.sleep(2)
r["held_3s"] = metrics()
r["unattributed_while_polling"] = unattributed
r["nvml_held_bytes"] = poll.now()[1] - idle
r["wait_while_held"] = wait_cmd("--timeout", "2s")

t_kill_child = kill(child)
r["t_child_reaped_ns"] = reap(child)
r["t_kill_child_ns"] = t_kill_child
r["t_back_ns"] = settle(poll, idle, t_kill_child)
t_gone, gone_text = until(lambda t: not series(t, "linger_gpu_memory_lingering_bytes"))
r.update(t_series_gone_ns=t_gone, after=gone_text)
r["wait_after"] = wait_cmd("--timeout", "10s")
agent.send_signal(signal.SIGTERM)
r["agent_rc"] = agent.wait(timeout=60)
r["scrape_ms"] = {"n": len(LATENCY_MS), "max": max(LATENCY_MS),
                  "median": sorted(LATENCY_MS)[len(LATENCY_MS) // 2]}
poll.stop()
# The flight recorder's trace of the held incident, replayed.
flight = os.path.join(OUT, "state", "flight")
r["flight_files"] = sorted(os.listdir(flight)) if os.path.isdir(flight) else []
mine = [f for f in r["flight_files"] if f.startswith("incident-") and f.endswith(f"-{v.pid}.trace")]
if mine:
    p = subprocess.run([L, "replay", "--json", os.path.join(flight, mine[0])],
                       capture_output=True, text=True)
    r["flight_replay"] = {"rc": p.returncode, "err": p.stderr[-2000:],
                          "records": [json.loads(l) for l in p.stdout.splitlines()]}
json.dump(r, open(os.path.join(OUT, "agent.json"), "w"), indent=1)
print(json.dumps({k: r[k] for k in r if k.startswith("t_") or k.startswith("wait") or k in
                  ("victim", "child", "agent_rc", "nvml_held_bytes", "scrape_ms",
                   "flight_files")}, indent=1))

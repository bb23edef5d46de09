#!/usr/bin/env bash
# H200: the soak (soak.py) beside `linger agent --record` in each mode of MODES, after a 20 s
# smoke run that must start its jobs. Results in $OUT: soak-MODE.tgz (truth, metrics, the
# agent's incident log and stderr) and the recording without the driver controls no rule reads,
# in parts of at most 15 MiB (soak-MODE.lgr.part-aa, ...: `cat` them back together).
# usage: L=linger T=linger-trace-trim [MODES="default lean"] [DURATION=420] [WORKERS=16] [RATE=6] \
#        [SMOKE=0] [BESIDE_LEAN=1] [NVML_POLL_MS=2] [GROUP_KILLS=1] bash scripts/h200/soak/run.sh
# UNTIL=S: only the recordings' first S seconds come back (an opening to commit).
# GROUP_KILLS=1: whole groups killed at once too (killpg, cgroup.kill, a pid namespace's init).
# Exits 1 when a check failed (check.py's own status), after every mode ran.
# SMOKE=0: no smoke run, for a call's full 10 min. BESIDE_LEAN=1 (with MODES=default): a --lean
# agent runs beside the default one on the same churn (soak-lean.tgz, soak-lean.lgr.part-*).
# TRACES: the modes whose recordings come back (default: all; a call brings back 64 MiB at most).
set -u
L=${L:-target/release/linger}
T=${T:-target/release/linger-trace-trim}
MODES=${MODES:-default lean}
S=$(dirname "$0")
if [ "${SMOKE:-1}" != 0 ]; then
  smoke=$(mktemp -d)
  PYTHONUNBUFFERED=1 python3 "$S/soak.py" "$L" "$smoke" --duration 20 --workers 4 --rate 2
  if ! grep -q t_kill_ns "$smoke/truth.jsonl" || grep -q '"failed"' "$smoke/truth.jsonl"; then
    echo "smoke run failed:"; head -c 3000 "$smoke/truth.jsonl"; cat "$smoke/agent.err"; exit 1
  fi
  echo "smoke: $(grep -c t_kill_ns "$smoke/truth.jsonl") kills"
fi
status=0
# check.py's report without its per-release table, and its own exit status.
judge() {
  python3 "$S/check.py" "$@" --show 3 > "$1/check.out"; local s=$?
  grep -v "^ *[0-9]\+ \+[0-9.-]\+ " "$1/check.out"
  return $s
}
keep() { case " ${TRACES:-default lean} " in *" $1 "*) return 0 ;; esac; return 1; }
for mode in $MODES; do
  W=$(mktemp -d)
  flags=""
  [ "$mode" = lean ] && flags="--lean"
  [ "${BESIDE_LEAN:-0}" = 1 ] && flags="$flags --beside-lean"
  [ "${GROUP_KILLS:-0}" = 1 ] && flags="$flags --groups"
  PYTHONUNBUFFERED=1 python3 "$S/soak.py" "$L" "$W" $flags --duration "${DURATION:-420}" \
    --workers "${WORKERS:-16}" --rate "${RATE:-6}" --nvml-poll-ms "${NVML_POLL_MS:-2}"
  echo "$mode: $(grep -c t_kill_ns "$W/truth.jsonl") kills, trace $(du -h "$W/soak.trace" | cut -f1)," \
    "flight recorder $(du -sh "$W/state/flight" 2>/dev/null | cut -f1)"
  # Judged at once (check.py exits 1 on a wrong answer, an open incident or a gauge left up).
  judge "$W" || { echo "$mode: check FAILED"; status=1; }
  if [ -d "$W/lean" ]; then
    judge "$W" --agent lean || { echo "lean: check FAILED"; status=1; }
  fi
  # The answers first: trimming the recordings can outlast what is left of a call.
  tar czf "$OUT/soak-$mode.tgz" -C "$W" truth.jsonl metrics.jsonl state/incidents.jsonl agent.err
  [ -d "$W/lean" ] && tar czf "$OUT/soak-lean.tgz" -C "$W" truth.jsonl lean/metrics.jsonl \
    lean/state/incidents.jsonl lean/agent.err
  if keep "$mode"; then
    "$T" "$W/soak.trace" "$W/soak.lgr" --drop-unread-controls ${UNTIL:+--until $UNTIL}
    split -b 15m "$W/soak.lgr" "$OUT/soak-$mode.lgr.part-"
  fi
  if [ -d "$W/lean" ] && keep lean; then
    "$T" "$W/lean/soak.trace" "$W/lean/soak.lgr" --drop-unread-controls ${UNTIL:+--until $UNTIL}
    split -b 15m "$W/lean/soak.lgr" "$OUT/soak-lean.lgr.part-"
  fi
done
exit $status

# Shared by linger-epilog, linger-unkillable and linger-undrain (sourced, not run).
#
# Settings, from the environment or from /etc/default/linger-slurm (LINGER_SLURM_DEFAULTS
# names another file):
#   LINGER            the linger binary (default: linger, on PATH)
#   LINGER_TIMEOUT    how long the epilog waits for the job's GPUs to be clean (default 60s)
#   LINGER_WAIT_ARGS  more options for `linger wait`, e.g. `--state-dir /var/lib/linger`
#   LINGER_ANY_PROCESS  1 (default): after a job, no process at all may hold its GPUs (Slurm
#                     gives a GPU to one job at a time); 0 where jobs share GPUs (shards, MPS):
#                     then only the job's own processes and those that got its GPU files count

defaults=${LINGER_SLURM_DEFAULTS:-/etc/default/linger-slurm}
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"
: "${LINGER:=linger}"
: "${LINGER_WAIT_ARGS:=}"

# This node's name as Slurm knows it.
node_name() {
    printf '%s\n' "${SLURMD_NODENAME:-$(hostname -s)}"
}

# gate_job TIMEOUT: `linger wait` on the job ($SLURM_JOB_ID) and its GPUs ($SLURM_JOB_GPUS, if any);
# prints the first line of its answer (the verdict and the holder: a drain reason) and
# returns its exit code (0 clean, 1 timed out, 2 no permission, 3 cannot tell).
gate_job() {
    set -- wait --slurm-job "$SLURM_JOB_ID" --timeout "$1"
    if [ -n "${SLURM_JOB_GPUS:-}" ]; then
        set -- "$@" --job-gpus
        [ "${LINGER_ANY_PROCESS:-1}" = 1 ] && set -- "$@" --any-process
    fi
    # LINGER_WAIT_ARGS is a list of options: split on purpose.
    # shellcheck disable=SC2086
    answer=$("$LINGER" "$@" $LINGER_WAIT_ARGS 2>&1)
    code=$?
    printf '%s\n' "$answer" | head -n 1
    return $code
}

# drain_for JOB_DESCRIPTION GATE_CODE SUMMARY: drains this node with a one-line reason.
drain_for() {
    case $2 in
    1) reason="$3 ($1)" ;;
    *) reason="linger: cannot tell whether the GPUs are clean, drained to be safe: $3 ($1)" ;;
    esac
    # One line: Slurm shows the reason in sinfo's and scontrol's one-line listings.
    reason=$(printf '%s' "$reason" | tr '\n\r\t' '   ')
    scontrol update nodename="$(node_name)" state=drain reason="$reason"
}

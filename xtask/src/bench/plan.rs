//! What the benchmarks run, and the targets they must meet.

use super::fuzz;

/// What to run: sized so that the whole benchmark takes about three and a half minutes here,
/// most of it starting `linger live` (about 1.4 s each) for the traced runs.
pub struct Plan {
    pub storm: Vec<(&'static str, u32)>,
    /// Storms run again with `--pin` (the workload on CPU 0, the tracer on the others).
    pub storm_pinned: Vec<(&'static str, u32)>,
    pub storm_threads: u32,
    pub storm_rounds: u32,
    /// Niceness of every benchmark process (and of the `linger live` the storm starts), ahead
    /// of unrelated work on a shared machine.
    pub nice: i32,
    pub ring_sizes: Vec<u32>,
    pub rates: &'static str,
    pub ring_seconds: f64,
    pub ring_rounds: u32,
    pub syscall_rounds: u32,
    pub decode_rounds: u32,
    /// ioctl() calls per part of a run, on a pipe and on the stand-in GPU device.
    pub ioctls: u32,
    pub gpu_ioctls: u32,
    pub ioctl_rounds: u32,
    /// `spin` iterations (1000 arithmetic steps each) per run.
    pub spin: u32,
    pub idle_rounds: u32,
    pub dying_kills: u32,
    pub dying_threads: u32,
    pub dying_rounds: u32,
    pub trace_events: u64,
    pub trace_rounds: u32,
    pub replay_ioctls: u32,
    pub replay_kills: u32,
    pub replay_rounds: u32,
    /// Calls per part of a syscall-tax run, and rounds.
    pub tax_calls: u32,
    pub tax_rounds: u32,
    /// Plain processes the agent soak kills.
    pub soak_kills: u32,
    /// The gate: seconds of waiting measured, holder kills timed, idle processes added.
    pub gate_seconds: f64,
    pub gate_rounds: u32,
    pub gate_extra: u32,
    /// Executions of the whole-replay fuzz campaign, over one job per CPU.
    pub fuzz_runs: u64,
}

impl Plan {
    pub fn full() -> Self {
        Self {
            // Iterations per run: each run lasts roughly 0.3 s on an idle machine here. Short runs
            // keep the runs of a round close together in time.
            storm: vec![
                ("kill-threads", 1000),
                ("kill-exec", 3000),
                ("spawn-true", 1000),
            ],
            storm_pinned: vec![("kill-exec", 3000)],
            storm_threads: 4,
            storm_rounds: 10,
            nice: -19,
            ring_sizes: vec![1 << 16, 1 << 18, 1 << 20, DEFAULT_RING],
            rates: "0.5,1,2,2@2,max,max@2",
            ring_seconds: 0.4,
            ring_rounds: 3,
            syscall_rounds: 4,
            decode_rounds: 5,
            ioctls: 1_000_000,
            gpu_ioctls: 500_000,
            ioctl_rounds: 8,
            spin: 100_000,
            idle_rounds: 6,
            dying_kills: 10,
            dying_threads: 64,
            dying_rounds: 6,
            trace_events: 2_000_000,
            trace_rounds: 3,
            replay_ioctls: 2_000_000,
            replay_kills: 20,
            replay_rounds: 3,
            tax_calls: 2_000_000,
            tax_rounds: 10,
            soak_kills: 100_000,
            gate_seconds: 5.0,
            gate_rounds: 20,
            gate_extra: 1000,
            fuzz_runs: fuzz::RUNS_TARGET,
        }
    }

    pub fn quick() -> Self {
        Self {
            storm: vec![
                ("kill-threads", 200),
                ("kill-exec", 600),
                ("spawn-true", 200),
            ],
            storm_pinned: vec![("kill-exec", 600)],
            storm_rounds: 2,
            ring_sizes: vec![1 << 18, DEFAULT_RING],
            rates: "1,2,max",
            ring_seconds: 0.2,
            ring_rounds: 1,
            syscall_rounds: 2,
            decode_rounds: 2,
            ioctls: 200_000,
            gpu_ioctls: 100_000,
            ioctl_rounds: 2,
            spin: 20_000,
            idle_rounds: 2,
            dying_kills: 3,
            dying_rounds: 2,
            trace_events: 200_000,
            trace_rounds: 1,
            replay_ioctls: 100_000,
            replay_kills: 4,
            replay_rounds: 1,
            tax_calls: 50_000,
            tax_rounds: 2,
            soak_kills: 10_000,
            gate_seconds: 1.0,
            gate_rounds: 3,
            fuzz_runs: 20_000,
            ..Self::full()
        }
    }
}

/// The ring size `linger live` uses unless told otherwise (ProbeConfig's default).
pub const DEFAULT_RING: u32 = 1 << 22;
pub const STORM_TARGET: f64 = 1.05;
pub const IOCTL_TARGET: f64 = 1.05;
pub const RING_TARGET_PER_S: f64 = 2e6;
pub const REPLAY_TARGET_PER_S: f64 = 20e6;
/// The stand-in GPU device (a node for /dev/full) the benchmarks make and use.
pub const GPU_DEVICE: &str = "target/bench/gpu0";
/// The benchmark programs, built by `cargo xtask bench`.
pub const BINARIES: [&str; 7] = [
    "linger-bench-storm",
    "linger-bench-dying",
    "linger-bench-ring",
    "linger-bench-trace",
    "linger-bench-replay",
    "linger-bench-soak",
    "linger-bench-gate",
];

//! The event stream every source produces and the analysis consumes.

use serde::{Deserialize, Serialize};

/// One event: a kernel record, or something the collector itself observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// CLOCK_BOOTTIME nanoseconds.
    pub ts_ns: u64,
    pub cpu: u32,
    /// Thread group (process) id of the task that was running.
    pub pid: u32,
    pub tid: u32,
    pub data: EventData,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventData {
    SignalGenerate {
        sig: u32,
        code: i32,
        result: i32,
        group: bool,
        target_pid: u32,
        target_tid: u32,
        target_threads: u32,
        sender_comm: String,
        target_comm: String,
    },
    SignalDeliver {
        sig: u32,
        code: i32,
        handler: u64,
        sa_flags: u64,
    },
    Fork {
        child_pid: u32,
        comm: String,
    },
    Exec {
        comm: String,
    },
    TaskExit {
        exit_code: u32,
        group_dead: bool,
        comm: String,
    },
    Reap {
        reaped_pid: u32,
        /// The reaper waited for it (`true`), or the kernel freed it and the reaper is unknown.
        by_wait: bool,
        comm: String,
    },
    BenchTick,
    /// The kernel dropped this many records because the ring buffer was full.
    Loss {
        count: u64,
    },
    /// The collector's clock advanced: lets time-based decisions replay exactly.
    Tick,
}

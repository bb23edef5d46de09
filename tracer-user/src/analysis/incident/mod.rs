//! An incident: one process's death (and every fatal signal that led to it), followed until
//! its GPU memory is back. Serialized as JSON lines (schema: docs/incident-json.md).
//!
//! The record and its parts are plain data here, importing none of the rules that fill them
//! (`analysis/termination.rs`, `verdict.rs`, `ledger.rs`, `gpu_errors.rs`).

mod gpu_error;
mod ledger_part;
mod process;
pub(in crate::analysis) mod source;
mod termination_part;
mod verdict_part;

use std::sync::Arc;

use serde::Serialize;

pub use self::{
    gpu_error::GpuError,
    ledger_part::{Bytes, ClassTotal, FailedAlloc},
    process::{Action, Delivery, ExitStatus, Outcome, ReapHow, Reaper, Sender, Target, ThreadExit},
    source::Source,
    termination_part::{Mode, SignalSent, Termination},
    verdict_part::{Verdict, VerdictKind},
};
use super::{
    holding::{HeldFile, Holder},
    signals::Origin,
    teardown::{DriverRelease, PhaseTime},
};
use crate::event::LossKind;

/// Version of the JSON records; bumped when a field's meaning changes.
pub const SCHEMA: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Incident {
    /// "incident", or "incident_update" when an incident already reported changed.
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub schema: u32,
    /// One per process death, in this run; updates carry the same id.
    pub id: u64,
    /// The machine and boot it happened on: with `id` and `wall_time`, incidents from many
    /// nodes, boots and runs merge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Node>,
    /// `t_signal_ns` as wall-clock time, RFC 3339 in UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_time: Option<String>,
    /// Every fatal signal that led to the death, and the mode they add up to.
    pub termination: Termination,
    /// The signal that ended it (the SIGKILL of an escalation); 0 for `exit`.
    pub signal: u32,
    /// `SIGKILL`, ...; `exit` when no signal did.
    pub signal_name: String,
    pub origin: Origin,
    pub si_code: i32,
    /// Who sent that signal; null for `exit`.
    pub sender: Option<Sender>,
    pub target: Target,
    /// When that signal was generated; for `exit`, when the group died. Every delay in the
    /// report counts from here.
    pub t_signal_ns: u64,
    /// Each thread that dequeued a signal.
    pub deliveries: Vec<Delivery>,
    /// Each thread's exit, the group-dead one last.
    pub exits: Vec<ThreadExit>,
    pub t_group_dead_ns: Option<u64>,
    /// How the process ended: `signal` when killed by one, else `status` of exit().
    pub exit: Option<ExitStatus>,
    /// When the process told its parent it is a zombie (SIGCHLD generated).
    pub t_zombie_ns: Option<u64>,
    pub t_reaped_ns: Option<u64>,
    pub reaper: Option<Reaper>,
    pub outcome: Outcome,
    /// The GPU side, when the target held GPU files.
    pub gpu: Option<GpuImpact>,
    /// Processes holding the target's GPU memory: through its files (when its group died,
    /// as far as still known) or through objects they imported from it.
    pub holders: Vec<Holder>,
    /// Where the time from the group's death to the target's own release of its GPU files
    /// went (largest first); the phases partition that interval.
    pub phases: Vec<PhaseTime>,
    /// Share of that interval the phases account for (0..1).
    pub phases_coverage: Option<f64>,
    /// The driver's release timed exactly by fentry/kprobe hooks, where the kernel allows
    /// them (`phases` then come from these calls when no stacks were sampled).
    pub release: Option<DriverRelease>,
    /// Why the memory lingered, or that it did not.
    pub verdict: Option<Verdict>,
    /// Allocations of other processes the driver refused while this one's memory was held.
    pub collateral: Vec<FailedAlloc>,
    /// Other GPU incidents whose teardowns overlapped this one on the same GPU.
    pub storm: Option<Storm>,
    /// GPU errors (Xids) naming the process, or on its GPU shortly before or during it
    /// (and, for a teardown stuck in the driver, every Xid on its GPU).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_errors: Vec<GpuError>,
    /// What the kernel side lost while the incident was traced; its facts may be incomplete.
    pub losses: Vec<LossCount>,
    /// Still held `--linger-after` after the death.
    pub lingering: bool,
    /// The last record of this incident: the process is dead and its memory back (or it had
    /// none of its own); nothing about it will change.
    pub settled: bool,
    /// For updates: what changed since the last record of this incident.
    pub changes: Vec<String>,
    /// With `--lean` or the driver's hooks in place of the system call tracepoints: what
    /// linger could not see for this incident, and how it still knows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unseen: Vec<String>,
    /// The teardown's kernel stacks (innermost frame first, shared with the analysis) with
    /// the time each accounts for: the flamegraph `linger export --format folded|svg` draws.
    /// Not in the JSON lines.
    #[serde(skip)]
    pub teardown_stacks: Vec<(Arc<[String]>, u64)>,
}

impl Incident {
    /// A new incident of `target`, counting from `t_ns`, with nothing known yet.
    pub fn new(id: u64, target: Target, t_ns: u64) -> Self {
        Self {
            record_type: "incident",
            schema: SCHEMA,
            id,
            node: None,
            wall_time: None,
            termination: Termination {
                mode: Mode::Exit,
                signals: Vec::new(),
                grace_ns: None,
            },
            signal: 0,
            signal_name: "exit".into(),
            origin: Origin::User,
            si_code: 0,
            sender: None,
            target,
            t_signal_ns: t_ns,
            deliveries: Vec::new(),
            exits: Vec::new(),
            t_group_dead_ns: None,
            exit: None,
            t_zombie_ns: None,
            t_reaped_ns: None,
            reaper: None,
            outcome: Outcome::Pending,
            gpu: None,
            holders: Vec::new(),
            phases: Vec::new(),
            phases_coverage: None,
            release: None,
            verdict: None,
            collateral: Vec::new(),
            storm: None,
            gpu_errors: Vec::new(),
            losses: Vec::new(),
            lingering: false,
            settled: false,
            changes: Vec::new(),
            unseen: Vec::new(),
            teardown_stacks: Vec::new(),
        }
    }
}

/// What each record beside incidents starts with: its type, the schema, and the machine and
/// boot it is about with its wall-clock time (both filled in by the live report's stamp).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Head {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub schema: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Node>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_time: Option<String>,
}

impl Head {
    pub fn new(record_type: &'static str) -> Self {
        Self {
            record_type,
            schema: SCHEMA,
            node: None,
            wall_time: None,
        }
    }

    /// The machine and boot the record is about, and its wall-clock time.
    pub fn stamp(&mut self, node: &Node, wall_time: Option<String>) {
        self.node = Some(node.clone());
        self.wall_time = wall_time;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Node {
    pub host: String,
    /// /proc/sys/kernel/random/boot_id; null for recordings made before it was kept.
    pub boot_id: Option<String>,
    /// The NVIDIA driver's version (/sys/module/nvidia/version); null without the driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

/// `share_from` of a death that gave back nothing of its own while its files stay open in
/// live processes that own the memory (a child dying beside its parent): nothing lingers
/// because of it until they die.
pub const HELD_BY_OWNERS: &str = "owners";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuImpact {
    /// NVML's index of the GPU its memory was on, once NVML listed it.
    pub index: Option<u32>,
    /// The GPU memory this death was to give back: NVML's largest figure for the pid while
    /// it was watched, else its ledger's video bytes (`share_from`).
    pub share_bytes: u64,
    /// `nvml`, `ledger`, or `none` (no memory of its own: NVML never listed it and its files
    /// carry no allocation, or other processes' memory), or [`HELD_BY_OWNERS`].
    pub share_from: &'static str,
    /// Physical video memory the driver gave the target's clients (decoded RM ioctls seen
    /// while tracing; allocations made before tracing began are not counted).
    pub bytes_ledger: u64,
    /// The ledger by kind of memory.
    pub ledger: Bytes,
    /// The ledger by memory class.
    pub classes: Vec<ClassTotal>,
    /// NVML's largest figure for the pid while watched; null without NVML or when NVML never
    /// listed it.
    pub bytes_nvml: Option<u64>,
    /// NVML's `used` on its GPU when the watch began (the reading before the signal or death).
    pub nvml_used_before: Option<u64>,
    /// When its memory was back on the device; null while held or when unknown.
    pub t_memory_back_ns: Option<u64>,
    /// What decided `t_memory_back_ns`.
    pub memory_back_by: Option<Source>,
    /// The last moment linger saw the memory still held: the group's death, or later a
    /// sampled thread of it inside the driver's free of its RM clients. The memory came back
    /// between this and `t_memory_back_ns`, an upper bound (the rest of an exit, or the next
    /// NVML reading, can come tens of milliseconds after the device's own return).
    pub t_memory_held_until_ns: Option<u64>,
    /// How closely `t_memory_back_ns` is the driver's own free, where the kernel's release
    /// decided: 0 where the driver hooks timed the end of its release, the time since the
    /// last sight inside the driver where the dying threads' leaving placed it; None where
    /// the moment is a bound (a zombie transition, a final switch, NVML's reading), the return
    /// then somewhere from `t_memory_held_until_ns` on.
    pub memory_back_known_to_ns: Option<u64>,
    /// Bytes of its share seen back so far (less than the share while importers hold some).
    pub released_bytes: u64,
    /// When the target's own last reference to its GPU files went (its exit path's release).
    pub t_files_released_ns: Option<u64>,
    /// `fput` (driver hooks) or `zombie` (upper bound).
    pub files_released_by: Option<Source>,
    /// When the last other holder of its files let go.
    pub t_holders_gone_ns: Option<u64>,
    /// Time the memory stayed held by others after the target's own release.
    pub held_elsewhere_ns: Option<u64>,
    /// GPU descriptors the target held when its group died, with each file's references.
    pub files: Vec<HeldFile>,
    /// References to its GPU files at its death that no process linger knew of accounted for
    /// (descriptors received over a unix socket or taken with pidfd_getfd); less as the search
    /// of the processes holding GPU files finds their holders.
    pub unaccounted_references: u64,
    /// Which evidence decided, and where the sources disagreed, in words.
    pub evidence: Vec<String>,
    /// Each GPU its memory was on, with that GPU's part (the figures above are their sums).
    pub gpus: Vec<GpuPart>,
}

/// How close to the driver's own free a reported moment must be known for the figures (the
/// agent's release histogram, `linger stats`) to use it; the others are bounds, counted apart.
pub const MOMENT_KNOWN_NS: u64 = 2_000_000;

impl GpuImpact {
    /// When the memory was back, where that is known to [`MOMENT_KNOWN_NS`].
    pub fn known_moment(&self) -> Option<u64> {
        let back = self.t_memory_back_ns?;
        moment_known(
            back,
            self.memory_back_known_to_ns,
            self.t_memory_held_until_ns,
        )
        .then_some(back)
    }
}

/// Whether a moment the memory was back (`back`) is known to [`MOMENT_KNOWN_NS`]: the kernel's
/// release placed that closely (`known_to`), or the window from the last moment it was seen
/// held (`held_until`) that narrow.
pub fn moment_known(back: u64, known_to: Option<u64>, held_until: Option<u64>) -> bool {
    known_to.is_some_and(|k| k <= MOMENT_KNOWN_NS)
        || held_until.is_some_and(|h| back.saturating_sub(h) <= MOMENT_KNOWN_NS)
}

/// One GPU's part of a death's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuPart {
    /// NVML's index; null where NVML does not read (or gave no minor numbers).
    pub index: Option<u32>,
    /// NVML's UUID, when NVML named the GPU at the start.
    pub uuid: Option<String>,
    /// The minor number of its device file, `/dev/nvidiaN`.
    pub minor: Option<u32>,
    /// The driver's device instance of this GPU (NV01_DEVICE_0), where the ledger saw the
    /// target's objects below one.
    pub device_instance: Option<u32>,
    /// Video memory the ledger saw the target's clients hold on this GPU at its death.
    pub bytes_ledger: Option<u64>,
    /// What the death was to give back on this GPU (0 when the memory is another's).
    pub share_bytes: u64,
    pub share_from: &'static str,
    /// NVML's figure for the pid on this GPU.
    pub bytes_nvml: Option<u64>,
    /// This GPU's `used` when its watch began.
    pub nvml_used_before: Option<u64>,
    /// When this GPU's part was back; null while held.
    pub t_memory_back_ns: Option<u64>,
    pub released_bytes: u64,
    /// The target's descriptors on this GPU's device file (`/dev/nvidiaN`), where NVML gave
    /// its minor number.
    pub fds: Vec<i32>,
}

/// Teardowns on one GPU that overlapped: the device's level before the first and when it was
/// back to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Storm {
    pub gpu: u32,
    /// GPU incidents in the storm, this one included.
    pub incidents: u32,
    pub t_first_ns: u64,
    /// The device's used memory before the first of them.
    pub used_before: u64,
    /// When the device's used memory was back to that level; null while not.
    pub t_device_back_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LossCount {
    pub what: LossKind,
    pub count: u64,
}

impl Incident {
    /// Milliseconds from the signal to `t`.
    pub fn ms_after_signal(&self, t: u64) -> f64 {
        t.saturating_sub(self.t_signal_ns) as f64 / 1e6
    }
}

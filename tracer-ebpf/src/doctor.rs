//! Empty programs, one per hook type: `linger doctor` loads and attaches each to learn what the
//! running kernel allows.

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe, perf_event, raw_tracepoint, tracepoint, uprobe},
    programs::{
        BtfTracePointContext, FEntryContext, PerfEventContext, ProbeContext, RawTracePointContext,
        TracePointContext,
    },
};

#[tracepoint]
pub fn doctor_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn doctor_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn doctor_raw_tracepoint(_ctx: RawTracePointContext) -> i32 {
    0
}

#[perf_event]
pub fn doctor_perf_event(_ctx: PerfEventContext) -> u32 {
    0
}

#[uprobe]
pub fn doctor_uprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[fentry(function = "do_exit")]
pub fn doctor_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[kprobe]
pub fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

//! Ring buffer throughput benchmark: one record per getppid() of the benchmark process.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::BenchTick;

use crate::emit::{current_ids, emit};

/// The benchmark's pid; 0 keeps the program silent.
#[unsafe(no_mangle)]
static BENCH_PID: u32 = 0;

#[tracepoint(category = "syscalls", name = "sys_enter_getppid")]
pub fn bench_tick(_ctx: TracePointContext) -> i32 {
    // SAFETY: read-only global filled before load.
    let bench_pid = unsafe { core::ptr::read_volatile(&BENCH_PID) };
    if bench_pid == 0 || current_ids().0 != bench_pid {
        return 0;
    }
    emit::<BenchTick>(|e| e.seq = 0);
    0
}

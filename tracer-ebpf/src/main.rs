//! linger's kernel side: signal, process and benchmark programs feeding one ring buffer.
#![no_std]
#![no_main]

mod asleep;
mod bench;
mod doctor;
mod driver_files;
mod driver_hooks;
mod driver_text;
mod dying;
mod emit;
mod files;
mod gpu_errors;
mod holders;
mod ioctl;
mod library;
mod process;
mod regs;
mod search;
mod signal;
mod task;
mod teardown;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

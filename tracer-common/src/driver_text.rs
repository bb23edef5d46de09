//! The NVIDIA driver modules' code in kernel memory: the value of the programs' `DRIVER_TEXT`
//! map, filled by user space from /proc/kallsyms. A kernel stack with a return address in one
//! of these ranges is a thread inside the driver.

/// The most ranges the programs test (the RM module and UVM, with room for a split text).
pub const DRIVER_TEXT_RANGES: u32 = 4;

/// The return addresses of a stack the programs test against the ranges.
pub const DRIVER_STACK_FRAMES: usize = 48;

/// One module's code: addresses in `[start, end)`. An empty range (`start == end`) is unused.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextRange {
    pub start: u64,
    pub end: u64,
}

#[cfg(feature = "user")]
// SAFETY: two integers, no padding.
unsafe impl aya::Pod for TextRange {}

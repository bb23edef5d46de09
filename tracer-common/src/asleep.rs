//! A GPU holder's thread asleep uninterruptibly: the value of the programs' `HOLDERS_ASLEEP`
//! map (by thread id), written each time such a thread switches out in that state and read by
//! user space once a second to find the ones that stay asleep (stuck in the driver).

/// One thread's latest uninterruptible sleep.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asleep {
    /// When it switched out (CLOCK_BOOTTIME, ns): a later sleep of the thread replaces it, so
    /// a thread still asleep now has slept since then.
    pub since_ns: u64,
    /// Its process.
    pub tgid: u32,
    /// Id in the `ASLEEP_STACKS` map; negative when the kernel could not keep the stack.
    pub stack_id: i32,
    /// The thread's voluntary context switches with this sleep counted: a thread that ran
    /// since and slept again where no program saw it (its process no longer a GPU holder)
    /// shows more in /proc.
    pub switches: u64,
}

#[cfg(feature = "user")]
// SAFETY: integers only, no padding (8 + 4 + 4 + 8 bytes).
unsafe impl aya::Pod for Asleep {}

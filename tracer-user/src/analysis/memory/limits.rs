//! How far NVML is trusted and how closely it is read: the slack of a comparison, the lags
//! of its figures, and how often it is wanted.

/// Slack when comparing a drop with a share: the larger of 32 MiB and 1 % of the share (the
/// device's `used` fell by the NVML figure plus about 6 MB for every release seen on the H200).
pub fn tolerance(bytes: u64) -> u64 {
    (32 << 20u64).max(bytes / 100)
}

/// How closely NVML should be read now, least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NvmlNeed {
    /// Nothing awaited.
    Quiet,
    /// Teardowns under way whose moment the kernel's release will tell: NVML's account is a
    /// cross-check, read every few tens of milliseconds.
    Await,
    /// A kernel release, at the time given, awaits NVML's word that the pid is gone: closely
    /// at first, less so as the word is late (the youngest such release, which wants the
    /// closest readings, is the greatest).
    Confirm(u64),
    /// A release whose moment only NVML can tell (no ioctl evidence, an import, a process not
    /// known to hold GPU files): every millisecond.
    Fast,
}

/// How long after something that may release memory NVML is read fast.
pub(super) const ACTIVE_NS: u64 = 2_000_000_000;
/// How long a process not known to hold GPU files is looked for in NVML's list after its
/// signal (`--lean`): its teardown, if it had memory, takes over 100 ms.
pub(super) const PROBE_NS: u64 = 300_000_000;

/// An allocation may show in NVML's figures this long after its driver call began: the call
/// waits for the driver's lock while other processes' teardowns hold it.
pub(super) const ALLOC_LAG_NS: u64 = 300_000_000;
/// The records of driver calls can arrive this long after an NVML reading taken later: until
/// then a rise not yet explained by its process's own calls is only a suspicion.
pub(super) const VERIFY_NS: u64 = 500_000_000;
/// A reading confirms an importer's release when taken at least this long after it (NVML's
/// readings queue behind the driver during teardowns).
pub(super) const CONFIRM_AFTER_NS: u64 = 2_000_000;

//! The compiled eBPF object, on its own: the loader and the doctor take it from below them.

/// The compiled eBPF object, built by build.rs.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/linger-probes"));

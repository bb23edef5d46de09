// The one place the eBPF programs' nightly is pinned, included (`include!`) by tracer-user's
// build.rs, which hands it to aya-build (`rustup run TOOLCHAIN cargo build` of tracer-ebpf), and
// by xtask/src/setup.rs, which installs it with rust-src and builds bpf-linker against its own
// libLLVM. Its LLVM major must be the one bpf-linker is built for (LLVM_MAJOR in setup.rs);
// `rustc +TOOLCHAIN -vV` says it.

/// rustc 1.97.0-nightly (e50aa6fba 2026-05-19), LLVM 22.1.4.
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

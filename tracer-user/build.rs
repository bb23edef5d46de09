//! Builds the eBPF programs (tracer-ebpf) with nightly and bpf-linker; `cargo xtask setup`
//! installs both.

fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "tracer-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}

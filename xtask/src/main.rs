//! Project tasks: `cargo xtask <setup|build|run|lint|test|vm|bench>`.

mod apt;
mod bench;
mod budget;
mod build;
mod cross;
mod debian;
mod dist;
mod fuzz;
mod image;
mod kubectl;
mod lint;
mod python;
mod setup;
mod test;
mod vm;
mod workspace;

use build::Arch;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install or check the pinned nightly (tracer-user/ebpf-toolchain.rs) with rust-src and a
    /// bpf-linker built against its LLVM.
    Setup,
    /// Build the `linger` binary (release), for this machine or cross-built for `aarch64`.
    Build {
        #[arg(long, value_enum, default_value_t = Arch::Host)]
        arch: Arch,
    },
    /// Build, then run linger with the given arguments, e.g. `cargo xtask run -- demo`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check formatting (cargo fmt) and lint the host workspace with clippy, warnings as errors.
    Lint,
    /// Check the tracked tree's size budget, then run every test: unit tests and the
    /// integration tests that load real programs (as root).
    Test {
        /// Extra arguments for `cargo test`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Boot Debian's stock kernels (5.10, 6.1, 6.12) under qemu and test the hooks and the
    /// driver hooks there (part of `test`).
    Vm {
        /// Check this saved console log (target/vm/KERNEL/console.log) instead of booting.
        #[arg(long, value_name = "FILE")]
        console: Option<std::path::PathBuf>,
        /// Only this kernel of the matrix: 5.10, 6.1 or 6.12 (arm64: 6.1 or 6.12).
        #[arg(long, value_name = "VERSION")]
        kernel: Option<String>,
        /// The guests' architecture: this machine's (x86-64), or arm64 under emulation.
        #[arg(long, value_enum, default_value_t = Arch::Host)]
        arch: Arch,
    },
    /// Run the benchmarks and rewrite BENCHMARKS.md.
    Bench(bench::Args),
    /// Write what operators install into target/dist/, for x86-64 and arm64: the stripped
    /// binary, a Debian package (binary, systemd unit, Slurm kit, docs, default configuration)
    /// and the agent's container image, with their SHA-256 sums.
    Dist,
    /// Fuzz a target of fuzz/ (default whole_replay: any bytes through the reader, the
    /// analysis and every sink), seeded with the committed recordings; 60 s unless libFuzzer
    /// options follow `--`.
    Fuzz {
        /// The target, then libFuzzer's options, e.g. `whole_replay -- -runs=10000000`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run().map(|_| ()),
        Command::Build { arch } => build::linger(arch).map(|_| ()),
        Command::Run { args } => build::run(&args),
        Command::Lint => lint::run(),
        Command::Dist => dist::run().map(|_| ()),
        Command::Fuzz { args } => fuzz::run(&args),
        Command::Test { args } => {
            budget::check()?;
            test::run(&args)
        }
        Command::Vm {
            console,
            kernel,
            arch,
        } => {
            let (passed, failed) = match console {
                Some(path) => vm::check_saved(&path)?,
                None => vm::run(kernel.as_deref(), arch)?,
            };
            eprintln!("xtask vm: {passed} passed, {failed} failed");
            if failed > 0 {
                anyhow::bail!("{failed} VM check(s) failed");
            }
            Ok(())
        }
        Command::Bench(args) => bench::run(args),
    }
}

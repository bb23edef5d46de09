//! `cargo xtask bench`: see BENCHMARKS.md.

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    anyhow::bail!("benchmarks are not written yet")
}

//! `cargo xtask test`: every test, against a freshly built linger, then the driver hooks on a
//! stock kernel in a VM.

use anyhow::{Context, Result};

use crate::{build, setup, vm};

pub fn run(args: &[String]) -> Result<()> {
    let bin = build::linger()?;
    let tests = setup::status(
        build::cargo()?
            .args(["test", "--release", "--workspace"])
            .args(args)
            .env("LINGER_BIN", bin),
    );
    // A filtered run (`cargo xtask test NAME`) is for iterating on cargo tests only.
    if !args.is_empty() {
        eprintln!("xtask test: the VM test does not run with a filter (cargo xtask vm runs it)");
        return tests;
    }
    // The VM runs even when a cargo test failed: both results are wanted.
    let vm = vm::run().context("the VM test (cargo xtask vm) failed");
    if let (Err(_), Err(e)) = (&tests, &vm) {
        eprintln!("xtask test: {e:#}");
    }
    tests?;
    vm
}

//! `cargo xtask test`: every test, against a freshly built linger.

use anyhow::Result;

use crate::{build, setup};

pub fn run(args: &[String]) -> Result<()> {
    let bin = build::linger()?;
    setup::status(
        build::cargo()?
            .args(["test", "--release", "--workspace"])
            .args(args)
            .env("LINGER_BIN", bin),
    )
}

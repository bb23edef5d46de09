//! `linger doctor`.

use tracer_user::{error::Error, privileges, probe::doctor, sink::json};

#[derive(clap::Args)]
pub struct Args {
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    privileges::require("loading eBPF programs to test them", privileges::PROBE)
        .map_err(Error::from)?;
    let report = doctor::run();
    if args.json {
        json::write_line(&mut std::io::stdout().lock(), &report)?;
    } else {
        print!("{}", doctor::render(&report));
    }
    Ok(())
}

//! `linger holders`: every process holding GPU files now, and what NVML says about them.

use std::path::PathBuf;

use tracer_user::{
    error::Error,
    privileges,
    probe::devices::GpuDevices,
    sink::{holders, json},
};

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Treat this char device as a GPU file too (repeatable).
    #[arg(long = "gpu-device", value_name = "PATH")]
    gpu_devices: Vec<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    privileges::require("reading every process's descriptors", privileges::PROC)
        .map_err(Error::from)?;
    let devices = GpuDevices::discover(&args.gpu_devices)?;
    let report = holders::now(&devices);
    if args.json {
        json::write_line(&mut std::io::stdout().lock(), &report)?;
    } else {
        print!("{}", holders::render(&report));
    }
    Ok(())
}

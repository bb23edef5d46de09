//! `linger doctor`.

use tracer_user::{error::Error, probe::doctor, sink::json};

#[derive(clap::Args)]
pub struct Args {
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            Error::Permission("loading eBPF programs to test them needs root".into()).into(),
        );
    }
    let report = doctor::run();
    if args.json {
        json::write_line(&mut std::io::stdout().lock(), &report)?;
    } else {
        print!("{}", doctor::render(&report));
    }
    Ok(())
}

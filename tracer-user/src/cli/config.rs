//! `--config FILE` of `linger agent`: a TOML file whose keys are the command's long options,
//! turned into those options ahead of the command line's own, so that flags win.

use std::{ffi::OsString, fs};

use anyhow::{bail, Context};
use clap::ArgAction;
use toml::Value;

const COMMAND: &str = "agent";

/// `argv` with the options of the agent's `--config` file inserted right after `agent`;
/// `cli` is the whole command line's parser, which knows the agent's options.
pub fn expand(cli: &clap::Command, argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(at) = argv.iter().position(|a| a == COMMAND) else {
        return Ok(argv);
    };
    let Some(path) = config_path(&argv[at + 1..]) else {
        return Ok(argv);
    };
    let text = fs::read_to_string(&path)
        .with_context(|| format!("reading the config file {}", path.to_string_lossy()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing the config file {}", path.to_string_lossy()))?;
    let given: Vec<String> = argv[at + 1..]
        .iter()
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    let options = options(cli, &table, &given)
        .with_context(|| format!("in the config file {}", path.to_string_lossy()))?;
    let mut out = argv[..=at].to_vec();
    out.extend(options.into_iter().map(OsString::from));
    out.extend(argv[at + 1..].iter().cloned());
    Ok(out)
}

fn config_path(args: &[OsString]) -> Option<OsString> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(p) = a.to_str().and_then(|a| a.strip_prefix("--config=")) {
            return Some(p.into());
        }
    }
    None
}

/// The file's keys as options; repeatable options the command line gives are left to it.
fn options(
    cli: &clap::Command,
    table: &toml::Table,
    given: &[String],
) -> anyhow::Result<Vec<String>> {
    let Some(cmd) = cli.find_subcommand(COMMAND) else {
        unreachable!("the agent command exists");
    };
    let mut out = Vec::new();
    for (key, value) in table {
        let long = key.replace('_', "-");
        if long == "config" {
            bail!("`config` cannot name another config file");
        }
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            bail!("unknown option `{key}` (keys are `linger agent --help`'s long options)");
        };
        let flag = format!("--{long}");
        match (arg.get_action(), value) {
            (ArgAction::SetTrue, Value::Boolean(on)) => {
                if *on {
                    out.push(flag);
                }
            }
            (ArgAction::SetTrue, _) => bail!("`{key}` is a switch: true or false"),
            (ArgAction::Append, _) if given.contains(&long) => {}
            (ArgAction::Append, Value::Array(items)) => {
                for item in items {
                    out.extend([flag.clone(), scalar(key, item)?]);
                }
            }
            (_, Value::Array(_)) => bail!("`{key}` takes one value, not a list"),
            (_, v) => out.extend([flag, scalar(key, v)?]),
        }
    }
    Ok(out)
}

fn scalar(key: &str, v: &Value) -> anyhow::Result<String> {
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        _ => bail!("`{key}`: a string, number or boolean"),
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::{Cli, Command};

    fn agent(argv: &[&str], config: &str) -> anyhow::Result<super::super::agent::Args> {
        parse(argv, config)
    }

    fn refused(config: &str) -> String {
        match parse(&[], config) {
            Ok(_) => panic!("{config:?} was accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    fn parse(argv: &[&str], config: &str) -> anyhow::Result<super::super::agent::Args> {
        let dir = std::env::temp_dir().join(format!("linger-config-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        // Tests run at once: one file each.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{n}.toml"));
        fs::write(&path, config)?;
        let mut full: Vec<OsString> = ["linger", "agent", "--config"]
            .iter()
            .map(OsString::from)
            .collect();
        full.push(path.into_os_string());
        full.extend(argv.iter().map(OsString::from));
        let cli = Cli::try_parse_from(expand(&Cli::command(), full)?)?;
        match cli.command {
            Command::Agent(a) => Ok(a),
            _ => bail!("not the agent"),
        }
    }

    #[test]
    fn the_file_sets_options_and_flags_win() {
        let config = r#"
metrics_listen = "0.0.0.0:9500"
lean = true
linger_after = "5s"
gpu_device = ["/dev/a", "/dev/b"]
"#;
        let a = agent(&[], config).expect("parsed");
        assert_eq!(a.metrics_listen.to_string(), "0.0.0.0:9500");
        assert!(a.live.lean);
        assert_eq!(a.live.linger_after.as_secs(), 5);
        assert_eq!(a.live.gpu_devices.len(), 2);
        let a = agent(
            &[
                "--metrics-listen",
                "127.0.0.1:9600",
                "--gpu-device",
                "/dev/c",
            ],
            config,
        )
        .expect("parsed");
        assert_eq!(a.metrics_listen.to_string(), "127.0.0.1:9600");
        assert_eq!(a.live.gpu_devices, vec![std::path::PathBuf::from("/dev/c")]);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused_with_the_key() {
        let e = refused("metrics_port = 1\n");
        assert!(e.contains("metrics_port"), "{e}");
        let e = refused("lean = \"yes\"\n");
        assert!(e.contains("lean"), "{e}");
        let e = refused("lean = [");
        assert!(e.contains("parsing"), "{e}");
    }
}

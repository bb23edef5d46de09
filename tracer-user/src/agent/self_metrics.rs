//! The agent's own cost, read at each scrape, so a fleet can check BENCHMARKS.md's figures on
//! its own nodes: the process's CPU time, resident memory and open descriptors under
//! Prometheus's standard `process_*` names, and the eBPF programs' run time and runs as the
//! kernel counts them. The kernel counts those only while `kernel.bpf_stats_enabled` is on (off
//! by default: counting costs every program run two clock reads); while it is off the agent
//! says so and serves no figure for them, rather than a count that stands still.

use std::{
    fmt, fs,
    os::fd::{AsRawFd, OwnedFd},
};

use nix::time::{clock_gettime, ClockId};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProgramLabel {
    program: String,
}

/// The collector of the agent's own cost; `programs` are its eBPF programs by name.
#[derive(Debug)]
pub struct SelfMetrics {
    programs: Vec<(String, OwnedFd)>,
}

impl SelfMetrics {
    pub fn new(programs: Vec<(String, OwnedFd)>) -> Self {
        Self { programs }
    }
}

impl Collector for SelfMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        // A figure the kernel did not give is left out, never served as 0.
        if let Some(s) = cpu_seconds() {
            let help = "CPU time the agent used, all its threads, user and system";
            one(
                &mut encoder,
                "process_cpu_seconds",
                help,
                ConstCounter::new(s),
            )?;
        }
        if let Some(b) = resident_bytes() {
            let help = "The agent's resident memory";
            one(
                &mut encoder,
                "process_resident_memory_bytes",
                help,
                gauge(b),
            )?;
        }
        if let Some(n) = open_fds() {
            let help = "The agent's open file descriptors";
            one(&mut encoder, "process_open_fds", help, gauge(n))?;
        }
        let Some(enabled) = bpf_stats_enabled() else {
            return Ok(());
        };
        let help = "Whether the kernel counts the eBPF programs' runs (kernel.bpf_stats_enabled); \
                    without it linger_bpf_program_* are not served";
        one(
            &mut encoder,
            "linger_bpf_stats_enabled",
            help,
            gauge(enabled.into()),
        )?;
        if !enabled {
            return Ok(());
        }
        let stats: Vec<(&str, Runs)> = self
            .programs
            .iter()
            .filter_map(|(name, fd)| Some((name.as_str(), program_runs(fd)?)))
            .collect();
        if stats.is_empty() {
            return Ok(());
        }
        let mut time = encoder.encode_descriptor(
            "linger_bpf_program_run_seconds",
            "Time the agent's eBPF programs ran, by program, while kernel.bpf_stats_enabled was on",
            None,
            MetricType::Counter,
        )?;
        for (name, runs) in &stats {
            ConstCounter::new(runs.ns as f64 / 1e9).encode(time.encode_family(&label(name))?)?;
        }
        let mut count = encoder.encode_descriptor(
            "linger_bpf_program_runs",
            "Runs of the agent's eBPF programs, by program, while kernel.bpf_stats_enabled was on",
            None,
            MetricType::Counter,
        )?;
        for (name, runs) in &stats {
            ConstCounter::new(runs.count).encode(count.encode_family(&label(name))?)?;
        }
        Ok(())
    }
}

fn one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

fn label(name: &str) -> ProgramLabel {
    ProgramLabel {
        program: name.into(),
    }
}

fn cpu_seconds() -> Option<f64> {
    let ts = clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID).ok()?;
    Some(ts.tv_sec() as f64 + ts.tv_nsec() as f64 / 1e9)
}

fn resident_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let kib = field(&status, "VmRSS:")?.strip_suffix(" kB")?.trim();
    Some(kib.parse::<u64>().ok()? * 1024)
}

fn open_fds() -> Option<u64> {
    // The listing's own descriptor is among them, as in every Prometheus client.
    Some(fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn bpf_stats_enabled() -> Option<bool> {
    let v = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    Some(v.trim() != "0")
}

/// What the kernel counted of one program's runs.
#[derive(Debug, PartialEq)]
struct Runs {
    ns: u64,
    count: u64,
}

/// The program's counts, from its descriptor's fdinfo (which needs no privilege, where asking
/// the kernel by program id needs CAP_SYS_ADMIN, dropped once the programs are attached).
fn program_runs(fd: &OwnedFd) -> Option<Runs> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    runs(&info)
}

/// `run_time_ns` and `run_cnt` of a BPF program's fdinfo (Linux 5.1 on).
fn runs(fdinfo: &str) -> Option<Runs> {
    Some(Runs {
        ns: field(fdinfo, "run_time_ns:")?.parse().ok()?,
        count: field(fdinfo, "run_cnt:")?.parse().ok()?,
    })
}

/// The value of the line starting with `key`, trimmed.
fn field<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    text.lines().find_map(|l| Some(l.strip_prefix(key)?.trim()))
}

#[cfg(test)]
mod tests {
    use prometheus_client::{encoding::text, registry::Registry};

    use super::*;

    #[test]
    fn a_programs_runs_come_from_its_fdinfo() {
        let info = "pos:\t0\nflags:\t02000002\nprog_type:\t26\nprog_jited:\t1\n\
                    run_time_ns:\t123456\nrun_cnt:\t42\nrecursion_misses:\t0\n";
        assert_eq!(
            runs(info),
            Some(Runs {
                ns: 123456,
                count: 42
            })
        );
        // Before Linux 5.1: nothing to tell, not zero.
        assert_eq!(runs("pos:\t0\nprog_type:\t26\n"), None);
    }

    #[test]
    fn the_process_figures_are_served() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SelfMetrics::new(Vec::new())));
        let mut out = String::new();
        text::encode(&mut out, &registry).expect("encode");
        let value = |name: &str| -> f64 {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {out}"))
        };
        assert!(value("process_cpu_seconds_total") > 0.0);
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0);
        assert!(out.contains("# TYPE process_cpu_seconds counter"), "{out}");
    }
}

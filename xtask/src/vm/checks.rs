//! What the guest must have printed: doctor finds kprobes usable, and fentry where the kernel
//! allows it (every x86-64 kernel of the matrix; arm64 from 6.4, `fentry_allowed`); each forced
//! strategy times `__fput` of the stand-in GPU file on the close path and on the exit path of
//! the killed holder: entry after the close (or the kill), exit after the entry on the same
//! thread, both naming the `struct file` its GpuFd records name; and the default strategy
//! needs no system call tracepoint (by_driver.rs), nor before or after a driver registers
//! late (late_driver.rs); a close stuck in the driver is reported and cleared (stuck.rs), also
//! one stuck before linger started; and the host's integration tests of `HOST_TESTS` pass there.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::suite::{HOST_TESTS, STANDIN_TESTS, STRATEGIES};

mod by_driver;
mod compat;
mod console;
mod driver;
mod late_driver;
mod stuck;
mod timeline;
mod trace;

use console::Guest;
use trace::Trace;

/// /tmp/gpu0, a node of /dev/full's number (char 1:7), in the kernel's dev_t encoding.
const GPU0: u64 = 1 << 20 | 7;

/// Every check, each on its own: (passed, failed).
pub fn run(console: &str) -> Result<(u64, u64)> {
    let guest = Guest::parse(console);
    let release = guest.one("kernel")?;
    eprintln!("xtask vm: guest kernel {release}");
    let fentry = fentry_allowed(release)?;
    let results = [
        ("doctor", doctor(&guest, fentry)),
        (
            "fentry",
            if fentry {
                scenario(&guest, "fentry")
            } else {
                refused(&guest, "fentry", "fentry/__fput")
            },
        ),
        ("kprobe", scenario(&guest, "kprobe")),
        ("by-driver", by_driver::check(&guest)),
        ("late-driver", late_driver::check(&guest)),
        ("stuck", stuck::check(&guest)),
        ("stuck-before-start", stuck::before_start(&guest)),
    ]
    .map(|(name, result)| (name.to_string(), result));
    let host_tests = HOST_TESTS.iter().map(|name| {
        (
            format!("tests/{name}.rs"),
            guest.succeeded(&format!("test-{name}")),
        )
    });
    let standin_tests = STANDIN_TESTS.iter().flat_map(|name| {
        STRATEGIES.map(|strategy| {
            (
                format!("tests/{name}.rs ({strategy})"),
                guest.succeeded(&format!("test-{name}-{strategy}")),
            )
        })
    });
    let mut counts = (0, 0);
    for (name, result) in results.into_iter().chain(host_tests).chain(standin_tests) {
        match result {
            Ok(()) => {
                eprintln!("xtask vm: {name} ... ok");
                counts.0 += 1;
            }
            Err(e) => {
                eprintln!("xtask vm: {name} ... FAILED: {e:#}");
                counts.1 += 1;
            }
        }
    }
    Ok(counts)
}

/// The kernel series of release `kernel` (6.1.0-57-arm64: 6.1).
fn series(kernel: &str) -> Result<(u32, u32)> {
    let mut numbers = kernel.split(['.', '-', ' ']).map(|n| n.parse::<u32>());
    let (Some(Ok(major)), Some(Ok(minor))) = (numbers.next(), numbers.next()) else {
        bail!("no kernel version in {kernel:?}");
    };
    Ok((major, minor))
}

/// Whether kernel `release` lets fentry programs attach. arm64 has the BPF trampoline from 6.0
/// but ftrace's direct calls, which attaching one needs, only from 6.4 (commit 2aa6ac03516d,
/// "arm64: ftrace: Add direct call support"); before, the attach fails with ENOTSUPP (524).
fn fentry_allowed(release: &str) -> Result<bool> {
    Ok(!release.ends_with("-arm64") || series(release)? >= (6, 4))
}

/// A forced strategy the kernel refuses: linger stops with an error naming the hook, before
/// tracing.
fn refused(guest: &Guest, mode: &str, hook: &str) -> Result<()> {
    if guest.succeeded(mode).is_ok() {
        bail!("{mode} ran on a kernel that refuses {hook}");
    }
    let said = guest
        .all(&format!("{mode}-err"))
        .collect::<Vec<_>>()
        .join("\n");
    if !said.contains(hook) || !said.contains("unavailable") || said.contains("panicked") {
        bail!("{mode}: no clear refusal of {hook}: {said}");
    }
    eprintln!("xtask vm: {mode}: refused as this kernel must: {said}");
    Ok(())
}

fn doctor(guest: &Guest, fentry: bool) -> Result<()> {
    guest.succeeded("doctor")?;
    let report = guest
        .json("doctor")?
        .into_iter()
        .next()
        .context("doctor printed nothing")?;
    for (hook, allowed) in [
        ("tracepoint", true),
        ("tp_btf", true),
        ("fentry", fentry),
        ("kprobe", true),
    ] {
        let ok = report["hooks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|h| h["name"] == hook && h["ok"] == true);
        if ok != allowed {
            bail!("doctor on the stock kernel: {hook} usable {ok}, expected {allowed}: {report}");
        }
    }
    let fput = if fentry { "fentry" } else { "kprobe" };
    if report["driver_hooks"]["fput"] != fput {
        bail!("doctor on the stock kernel did not choose {fput} for __fput: {report}");
    }
    let holders = report["questions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|q| q["question"] == "who holds GPU files");
    let by_open = holders.is_some_and(|q| {
        q["default"]
            .as_str()
            .is_some_and(|d| d.starts_with("kprobes on nvidia_open"))
    });
    if report["driver_hooks"]["by_driver"] != true || !by_open {
        bail!("doctor on the stock kernel does not answer through the driver's hooks: {report}");
    }
    layouts(&report)?;
    eprintln!("xtask vm: doctor: {}", report["strategy"]);
    Ok(())
}

/// The layouts and prototypes doctor resolved from BTF are the ones this kernel version has.
fn layouts(report: &Value) -> Result<()> {
    let kernel = report["kernel"].as_str().unwrap_or_default();
    let version = series(kernel).context("doctor's kernel line")?;
    let (major, minor) = version;
    let detail = |name: &str| -> Result<String> {
        report["kernel_layout"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == name)
            .and_then(|l| l["detail"].as_str())
            .map(str::to_string)
            .with_context(|| format!("doctor's kernel_layout has no {name}: {report}"))
    };
    let expect = [
        ("file_refcount", version >= (6, 13), "file.f_ref"),
        (
            "sched_process_exit",
            version >= (6, 16),
            "(task, group_dead)",
        ),
        (
            "sched_switch",
            version >= (5, 18),
            "(preempt, prev, next, prev_state)",
        ),
        ("syscall_arguments", version >= (5, 15), "bpf_task_pt_regs"),
    ];
    for (name, newer, newer_detail) in expect {
        let detail = detail(name)?;
        if detail.starts_with(newer_detail) != newer {
            bail!("kernel {major}.{minor}: doctor says {name} is {detail:?}");
        }
        eprintln!("xtask vm: layout {name}: {detail}");
    }
    Ok(())
}

fn scenario(guest: &Guest, mode: &str) -> Result<()> {
    guest.succeeded(mode)?;
    if let Some(bad) = guest
        .all(&format!("{mode}-err"))
        .find(|l| l.contains("undecodable"))
    {
        bail!("{bad}");
    }
    let holder: u64 = guest.one(&format!("{mode}-holder"))?.parse()?;
    let out = guest.json(&format!("{mode}-out"))?;
    let t = Trace {
        events: out
            .iter()
            .filter(|l| l["type"] == "event")
            .map(|l| &l["event"])
            .collect(),
        holder,
        mode,
    };
    let strategy = &t.find("strategy", |e| e["data"]["kind"] == "strategy")?["data"];
    if strategy["fput"] != mode || strategy["requested"] != mode {
        bail!("the strategy event does not say {mode}: {strategy}");
    }
    let timeline = timeline::Timeline::read(guest, mode);
    eprintln!("xtask vm: {mode}: {timeline}");
    t.find("group-dead exit of the holder", |e| {
        e["pid"] == holder && e["data"]["kind"] == "task_exit" && e["data"]["group_dead"] == true
    })
    .with_context(|| timeline.to_string())?;
    // /tmp/gpu0: closed as fd 3, held as fd 4 when killed.
    let closed = t.closed(3, GPU0)?;
    let on_close = t.fput(&closed, "close path of /tmp/gpu0")?;
    let held = t.fd("held_at_exit", 4, GPU0)?;
    let on_exit = t.fput_after(t.kill()?, held, "exit path of /tmp/gpu0")?;
    eprintln!(
        "xtask vm: {mode}: __fput of /tmp/gpu0 on close {} µs, after SIGKILL {} µs",
        on_close / 1000,
        on_exit / 1000
    );
    driver::check(&t, strategy)?;
    replayed(guest, mode, &t)?;
    let incident = out
        .iter()
        .find(|l| l["type"] == "incident" && l["target"]["pid"] == holder)
        .with_context(|| format!("no incident for the holder {holder}"))?;
    if incident["signal"] != 9 || incident["outcome"] != "exited" {
        bail!("unexpected incident: {incident}");
    }
    // Its own release of its GPU files is the hooks' last __fput, not the zombie bound.
    let gpu = &incident["gpu"];
    let (fput_end, zombie) = (
        gpu["t_files_released_ns"].as_u64(),
        incident["t_zombie_ns"].as_u64(),
    );
    match (gpu["files_released_by"].as_str(), fput_end, zombie) {
        (Some("fput"), Some(f), Some(z)) if f <= z => {}
        _ => bail!("{mode}: the holder's own release is not the hooked __fput: {gpu}"),
    }
    // The analysis times the release from the hooks: exact start and end, UVM's share.
    let release = &incident["release"];
    let (start, end) = (release["start_ns"].as_u64(), release["end_ns"].as_u64());
    let uvm = release["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["function"] == "uvm_release_entry")
        .and_then(|f| f["ns"].as_u64());
    match (start, end, uvm) {
        (Some(s), Some(e), Some(u)) if e > s && u >= driver::SLEPT_NS && u <= e - s => {}
        _ => bail!("{mode}: the incident's hooked release is wrong: {release}"),
    }
    if incident["phases"][0]["name"] != "uvm_teardown" {
        let losses: Vec<&Value> = out.iter().filter(|l| l["type"] == "loss").collect();
        bail!(
            "{mode}: the slow UVM release should dominate the phases: {} (losses: {losses:?})",
            incident["phases"]
        );
    }
    Ok(())
}

/// The recording of the run replays to the same strategy and driver calls.
fn replayed(guest: &Guest, mode: &str, live: &Trace) -> Result<()> {
    let what = format!("{mode}-replay");
    guest.succeeded(&what)?;
    let out = guest.json(&format!("{what}-out"))?;
    let ours = |events: &mut dyn Iterator<Item = &Value>| -> Vec<Value> {
        events
            .filter(|e| matches!(e["data"]["kind"].as_str(), Some("strategy" | "driver_call")))
            .cloned()
            .collect()
    };
    let replay = ours(
        &mut out
            .iter()
            .filter(|l| l["type"] == "event")
            .map(|l| &l["event"]),
    );
    if replay != ours(&mut live.events.iter().copied()) {
        bail!("the replay's strategy and driver calls differ from live's");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fentry_is_expected_on_x86_64_and_on_arm64_from_6_4() {
        let allowed = ["5.10.0-46-amd64", "6.1.0-57-arm64", "6.12.95+deb12-arm64"]
            .map(|release| fentry_allowed(release).ok());
        assert_eq!(allowed, [Some(true), Some(false), Some(true)]);
        assert!(fentry_allowed("unknown-arm64").is_err());
    }
}

//! Figures across incidents, the article's table from evidence: per group, how long GPU memory
//! took to come back after the kill, how often it had not after 1 s and 30 s, and how often
//! other processes' allocations failed meanwhile. Input: incident records as JSON (incident
//! logs, live output, replays), one sample per incident.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::incident::moment_known;

const GIB: u64 = 1 << 30;

/// Boot id, incident id, t_signal_ns, target pid: one incident however many files repeat it,
/// and incidents of different boots and nodes apart.
pub type Key = (Option<String>, u64, u64, u64);

/// One GPU incident, as its last record says.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub key: Key,
    pub termination: String,
    pub verdict: String,
    pub comm: String,
    pub gpu: Option<u64>,
    pub pod: Option<String>,
    /// The NVIDIA driver's version where the incident says.
    pub driver: Option<String>,
    pub wall_time: Option<String>,
    pub share_bytes: u64,
    /// From the final signal (or the exit) to the memory back.
    pub release_ns: Option<u64>,
    /// That moment is known to 2 ms; else it is a bound (the end of the window the memory
    /// came back in), left out of the release figures.
    pub release_known: bool,
    /// `escalated`: from the first signal to the group's death.
    pub stop_ns: Option<u64>,
    /// Held `--linger-after` (30 s by default) when the record was written.
    pub lingering: bool,
    pub refused: u64,
    pub top_phase: Option<String>,
    /// The kernel lost records while it was traced (lost stacks only blur the phases: they
    /// do not count).
    pub losses: bool,
    pub settled: bool,
}

impl Sample {
    /// The sample of an incident record of a process that held GPU memory; None for other
    /// records and incidents without GPU memory of their own.
    pub fn from_record(v: &Value) -> Option<Self> {
        let kind = v["type"].as_str()?;
        if kind != "incident" && kind != "incident_update" {
            return None;
        }
        let gpu = v.get("gpu").filter(|g| !g.is_null())?;
        let share_bytes = gpu["share_bytes"].as_u64()?;
        if share_bytes == 0 {
            return None;
        }
        let t_signal = v["t_signal_ns"].as_u64()?;
        let back = gpu["t_memory_back_ns"].as_u64();
        let release_ns = back.map(|t| t.saturating_sub(t_signal));
        let release_known = back.is_some_and(|b| {
            moment_known(
                b,
                gpu["memory_back_known_to_ns"].as_u64(),
                gpu["t_memory_held_until_ns"].as_u64(),
            )
        });
        let termination = v["termination"]["mode"].as_str()?.to_string();
        let first = v["termination"]["signals"][0]["t_ns"].as_u64();
        let stop_ns = match (termination.as_str(), first, v["t_group_dead_ns"].as_u64()) {
            ("escalated", Some(f), Some(d)) => Some(d.saturating_sub(f)),
            _ => None,
        };
        Some(Self {
            key: (
                v["node"]["boot_id"].as_str().map(String::from),
                v["id"].as_u64()?,
                t_signal,
                v["target"]["pid"].as_u64()?,
            ),
            termination,
            verdict: v["verdict"]["kind"].as_str().unwrap_or("none").to_string(),
            comm: v["target"]["comm"].as_str().unwrap_or_default().to_string(),
            gpu: gpu["index"].as_u64(),
            pod: v["target"]["workload"]["pod"].as_str().map(String::from),
            driver: v["node"]["driver"].as_str().map(String::from),
            wall_time: v["wall_time"].as_str().map(String::from),
            share_bytes,
            release_ns,
            release_known,
            stop_ns,
            lingering: v["lingering"].as_bool().unwrap_or(false),
            refused: v["collateral"].as_array().map_or(0, |c| c.len() as u64),
            top_phase: v["phases"][0]["name"].as_str().map(String::from),
            losses: v["losses"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x["what"] != "stacks")),
            settled: v["settled"].as_bool().unwrap_or(false),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Termination,
    Verdict,
    Comm,
    Gpu,
    /// Power-of-two GiB buckets of the memory the death was to give back.
    Size,
    /// The NVIDIA driver's version.
    Driver,
}

impl By {
    fn of(self, s: &Sample) -> String {
        match self {
            Self::Termination => s.termination.clone(),
            Self::Verdict => s.verdict.clone(),
            Self::Comm => s.comm.clone(),
            Self::Gpu => s.gpu.map_or("?".into(), |g| g.to_string()),
            Self::Size => size_bucket(s.share_bytes),
            Self::Driver => s.driver.clone().unwrap_or_else(|| "?".into()),
        }
    }
}

/// `<1 GiB`, `1-2 GiB`, `2-4 GiB`, ...
pub fn size_bucket(bytes: u64) -> String {
    if bytes < GIB {
        return "<1 GiB".into();
    }
    let low = 1u64 << (63 - (bytes / GIB).leading_zeros());
    format!("{low}-{} GiB", low * 2)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub sd: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Summary {
    /// Of values in ms; None when there are none. Percentiles by nearest rank.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let rank = |p: f64| values[((p * n).ceil() as usize).clamp(1, values.len()) - 1];
        Some(Self {
            mean,
            sd: var.sqrt(),
            p50: rank(0.5),
            p95: rank(0.95),
            max: values[values.len() - 1],
        })
    }
}

/// Incidents whose memory was not back after some time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residue {
    pub share: f64,
    pub incidents: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    pub group: String,
    /// Incidents in the figures: a release time, or held 30 s and more (residue), and no
    /// kernel losses.
    pub count: u64,
    pub release_ms: Option<Summary>,
    /// `escalated` only: from the first signal to the death.
    pub stop_ms: Option<Summary>,
    pub residue_1s: Residue,
    pub residue_30s: Residue,
    /// Share of incidents during which other processes' allocations were refused.
    pub collateral_share: f64,
    pub refused_allocations: u64,
    /// The teardown phase that most often took the longest.
    pub dominant_phase: Option<String>,
    /// Counted apart, never in the figures: no release time yet (tracing stopped first)...
    pub without_release: u64,
    /// ... or records the kernel lost while it was traced.
    pub with_losses: u64,
    /// In the count, but not in the release figures: the moment is a bound, not known to
    /// 2 ms (a zombie transition, a final switch, an NVML reading).
    pub release_bounded: u64,
    /// Every release time in the figures, ascending, for charts.
    #[serde(skip)]
    pub release_values_ms: Vec<f64>,
}

/// The groups of `samples` by `by`, in key order (size buckets smallest first).
pub fn groups<'a>(samples: impl Iterator<Item = &'a Sample>, by: By) -> Vec<Group> {
    let mut split: BTreeMap<(u64, String), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        let rank = match by {
            By::Size => s.share_bytes.checked_ilog2().unwrap_or(0).into(),
            _ => 0,
        };
        split.entry((rank, by.of(s))).or_default().push(s);
    }
    split
        .into_iter()
        .map(|((_, group), all)| summarize(group, &all))
        .collect()
}

fn summarize(group: String, all: &[&Sample]) -> Group {
    let with_losses = all.iter().filter(|s| s.losses).count() as u64;
    let clean: Vec<&&Sample> = all.iter().filter(|s| !s.losses).collect();
    let without_release = clean
        .iter()
        .filter(|s| s.release_ns.is_none() && !s.lingering)
        .count() as u64;
    let counted: Vec<&&&Sample> = clean
        .iter()
        .filter(|s| s.release_ns.is_some() || s.lingering)
        .collect();
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut release_values_ms: Vec<f64> = counted
        .iter()
        .filter(|s| s.release_known)
        .filter_map(|s| s.release_ns.map(ms))
        .collect();
    let release_bounded = counted
        .iter()
        .filter(|s| s.release_ns.is_some() && !s.release_known)
        .count() as u64;
    release_values_ms.sort_by(f64::total_cmp);
    let release_ms = Summary::of(release_values_ms.clone());
    let stop_ms = Summary::of(counted.iter().filter_map(|s| s.stop_ns.map(ms)).collect());
    let n = counted.len() as u64;
    let residue = |after_ns: u64| {
        let held: Vec<&&&&Sample> = counted
            .iter()
            .filter(|s| s.release_ns.is_none_or(|r| r > after_ns))
            .collect();
        Residue {
            share: share(held.len() as u64, n),
            incidents: held.len() as u64,
            bytes: held.iter().map(|s| s.share_bytes).sum(),
        }
    };
    let mut phases: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &counted {
        if let Some(p) = &s.top_phase {
            *phases.entry(p.as_str()).or_default() += 1;
        }
    }
    Group {
        group,
        count: n,
        release_ms,
        stop_ms,
        residue_1s: residue(1_000_000_000),
        residue_30s: residue(30_000_000_000),
        collateral_share: share(counted.iter().filter(|s| s.refused > 0).count() as u64, n),
        refused_allocations: counted.iter().map(|s| s.refused).sum(),
        dominant_phase: phases
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(p, _)| p.to_string()),
        without_release,
        with_losses,
        release_bounded,
        release_values_ms,
    }
}

fn share(part: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        part as f64 / of as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(id: u64, release_ms: Option<u64>, lingering: bool) -> Sample {
        Sample {
            key: (None, id, id, id),
            termination: "kill".into(),
            verdict: "released".into(),
            comm: "python3".into(),
            gpu: Some(0),
            pod: None,
            driver: None,
            wall_time: None,
            share_bytes: 4 * GIB,
            release_ns: release_ms.map(|m| m * 1_000_000),
            release_known: true,
            stop_ns: None,
            lingering,
            refused: u64::from(id == 3),
            top_phase: Some("rm_client".into()),
            losses: false,
            settled: true,
        }
    }

    #[test]
    fn figures_of_a_small_group() {
        let s = [
            sample(1, Some(100), false),
            sample(2, Some(300), false),
            sample(3, Some(2000), false),
            sample(4, None, true),
            sample(5, None, false),
        ];
        let g = &groups(s.iter(), By::Termination)[0];
        assert_eq!(g.count, 4, "the one without release nor lingering is apart");
        assert_eq!(g.without_release, 1);
        let r = g.release_ms.as_ref().expect("release");
        assert!((r.mean - 800.0).abs() < 1e-9);
        assert_eq!((r.p50, r.max), (300.0, 2000.0));
        assert_eq!(g.residue_1s.incidents, 2, "2000 ms and the lingering one");
        assert_eq!(g.residue_30s.incidents, 1);
        assert_eq!(g.residue_30s.bytes, 4 * GIB);
        assert!((g.collateral_share - 0.25).abs() < 1e-9);
        assert_eq!(g.dominant_phase.as_deref(), Some("rm_client"));
    }

    /// A moment known only as a bound (a window 30 ms wide) counts, but its bound is not a
    /// release time; one that narrow or placed by the driver's release is.
    #[test]
    fn a_bound_is_counted_apart_from_the_release_figures() {
        let record = |back: u64, known_to: Option<u64>| {
            serde_json::json!({
                "type": "incident", "id": back, "t_signal_ns": 0,
                "target": {"pid": 7, "comm": "python3"},
                "termination": {"mode": "kill", "signals": []},
                "gpu": {"share_bytes": GIB, "t_memory_back_ns": back,
                        "t_memory_held_until_ns": 10_000_000,
                        "memory_back_known_to_ns": known_to},
            })
        };
        let s: Vec<Sample> = [
            record(40_000_000, None),
            record(11_000_000, None),
            record(40_000_000, Some(150_000)),
        ]
        .iter()
        .filter_map(Sample::from_record)
        .collect();
        assert_eq!(
            s.iter().map(|s| s.release_known).collect::<Vec<_>>(),
            [false, true, true]
        );
        let g = &groups(s.iter(), By::Termination)[0];
        assert_eq!((g.count, g.release_bounded), (3, 1));
        assert_eq!(g.release_values_ms, [11.0, 40.0]);
    }

    #[test]
    fn size_buckets_are_powers_of_two() {
        assert_eq!(size_bucket(GIB / 2), "<1 GiB");
        assert_eq!(size_bucket(GIB), "1-2 GiB");
        assert_eq!(size_bucket(5 * GIB), "4-8 GiB");
        assert_eq!(size_bucket(64 * GIB + 1), "64-128 GiB");
    }
}

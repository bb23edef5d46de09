//! "Since the previous report": the report being written against the one it replaces, both
//! read off their own text (the header's commit, date, machine and kernel, and the Targets
//! table), so that nothing in it is kept by hand.

use std::fmt::Write;

/// What a report says of itself: its header's rows, and its targets as
/// (target, measured, result).
#[derive(Debug, Default, PartialEq)]
struct Said<'a> {
    header: Vec<(&'a str, &'a str)>,
    targets: Vec<(&'a str, &'a str, &'a str)>,
}

impl<'a> Said<'a> {
    fn read(report: &'a str) -> Self {
        let mut said = Self::default();
        // The header's table stands before the first section; the targets under theirs.
        let mut section = None;
        for line in report.lines() {
            if line.starts_with("## ") {
                section = Some(line);
                continue;
            }
            let in_targets = section == Some("## Targets");
            let cells: Vec<&str> = match line.strip_prefix("| ").and_then(|l| l.strip_suffix(" |"))
            {
                Some(row) => row.split(" | ").collect(),
                None => continue,
            };
            match cells[..] {
                [what, measured, result] if in_targets && what != "Target" => {
                    said.targets.push((what, measured, result));
                }
                [name, value] if section.is_none() => said.header.push((name, value)),
                _ => {}
            }
        }
        said
    }

    fn header(&self, name: &str) -> &'a str {
        self.header
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("unknown", |(_, v)| v)
    }

    fn target(&self, what: &str) -> Option<(&'a str, &'a str)> {
        self.targets
            .iter()
            .find(|t| t.0 == what)
            .map(|t| (t.1, t.2))
    }
}

/// The section comparing `current` (the new report, its header and Targets table written)
/// with `previous`, the report it replaces, if there was one.
pub fn section(previous: Option<&str>, current: &str) -> String {
    let mut md = String::from("\n## Since the previous report\n\n");
    let Some(before) = previous.map(Said::read).filter(|s| !s.targets.is_empty()) else {
        md.push_str("No previous report to compare with.\n");
        return md;
    };
    let now = Said::read(current);
    let _ = writeln!(
        md,
        "The previous report was measured at {} ({}); this one at {} ({}). Figures tied to \
         the machine (rates of system calls, ns per call) move with it: only the ratios \
         measured side by side compare across machines.\n",
        before.header("Commit"),
        before.header("Date"),
        now.header("Commit"),
        now.header("Date")
    );
    for name in ["Machine", "Kernel"] {
        let (was, is) = (before.header(name), now.header(name));
        let _ = if was == is {
            writeln!(md, "- **{name}**: the same, {is}")
        } else {
            writeln!(md, "- **{name}**: {was} → {is}")
        };
    }
    md.push_str("\n| Target | Previous report | This report |\n|---|---|---|\n");
    for &(what, measured, result) in &now.targets {
        let was = before
            .target(what)
            .map_or("new".to_string(), |(m, r)| format!("{m} ({r})"));
        let _ = writeln!(md, "| {what} | {was} | {measured} ({result}) |");
    }
    for &(what, measured, result) in &before.targets {
        if now.target(what).is_none() {
            let _ = writeln!(
                md,
                "| {what} | {measured} ({result}) | no longer measured |"
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREVIOUS: &str = "# Benchmarks

| | |
|---|---|
| Date | 2026-12-05 13:38 UTC |
| Machine | 2 CPUs (`nproc`), AMD EPYC, virtual machine |
| Kernel | 6.1.0 (`uname -r`) |
| Commit | 84b2858 |

## Targets

| Target | Measured | Result |
|---|---|---|
| `kill-exec` storm: slowdown ≤ 1.05 | 1.066 (median of 10 pairs; 0.98 – 1.2) | **missed** |
| Ring buffer: ≥ 2 M records/s | 2.00 M/s | met |

## Since the previous report

| Target | Previous report | This report |
|---|---|---|
| stale | stale | stale |

## 1. Process storms

| Workload | Slowdown |
|---|---|
";

    const CURRENT: &str = "# Benchmarks

| | |
|---|---|
| Date | 2026-12-07 00:03 UTC |
| Machine | 2 CPUs (`nproc`), AMD EPYC, virtual machine |
| Kernel | 6.18.44 (`uname -r`) |
| Commit | f270d2d |

## Targets

| Target | Measured | Result |
|---|---|---|
| `kill-exec` storm: slowdown ≤ 1.05 | 1.018 (median of 10 pairs; 0.97 – 1.1) | met |
| The whole replay under libFuzzer | 10000000 executions | met |
";

    #[test]
    fn each_target_is_set_beside_its_previous_figure() {
        let md = section(Some(PREVIOUS), CURRENT);
        assert!(md.contains("measured at 84b2858 (2026-12-05 13:38 UTC); this one at f270d2d (2026-12-07 00:03 UTC)"), "{md}");
        assert!(
            md.contains("- **Machine**: the same, 2 CPUs (`nproc`), AMD EPYC, virtual machine\n"),
            "{md}"
        );
        assert!(
            md.contains("- **Kernel**: 6.1.0 (`uname -r`) → 6.18.44 (`uname -r`)\n"),
            "{md}"
        );
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).skip(1).collect();
        assert_eq!(
            rows,
            [
                "| `kill-exec` storm: slowdown ≤ 1.05 | 1.066 (median of 10 pairs; 0.98 – 1.2) \
                 (**missed**) | 1.018 (median of 10 pairs; 0.97 – 1.1) (met) |",
                "| The whole replay under libFuzzer | new | 10000000 executions (met) |",
                "| Ring buffer: ≥ 2 M records/s | 2.00 M/s (met) | no longer measured |",
            ]
        );
    }

    #[test]
    fn without_a_previous_report_it_says_so() {
        assert!(section(None, CURRENT).ends_with("No previous report to compare with.\n"));
        assert!(section(Some("not a report"), CURRENT).contains("No previous report"));
    }
}

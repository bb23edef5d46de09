//! The table as text and as CSV.

use std::fmt::Write as _;

use tracer_user::analysis::stats::{By, Group, Summary};

fn ms(s: &Option<Summary>, f: fn(&Summary) -> f64) -> String {
    s.as_ref().map_or("-".into(), |s| fmt_ms(f(s)))
}

fn fmt_ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else {
        format!("{v:.0} ms")
    }
}

fn pct(share: f64) -> String {
    format!("{:.0} %", share * 100.0)
}

pub fn text(rows: &[Group], by: By, files: usize) -> String {
    let head = [
        format!("{by:?}").to_lowercase(),
        "n".into(),
        "release mean ± sd".into(),
        "p50".into(),
        "p95".into(),
        "max".into(),
        "residue 1s".into(),
        "residue 30s".into(),
        "collateral".into(),
        "phase".into(),
        "apart".into(),
    ];
    let mut cells: Vec<Vec<String>> = vec![head.to_vec()];
    for g in rows {
        let r = &g.release_ms;
        cells.push(vec![
            g.group.clone(),
            g.count.to_string(),
            r.as_ref().map_or("-".into(), |s| {
                format!("{} ± {}", fmt_ms(s.mean), fmt_ms(s.sd))
            }),
            ms(r, |s| s.p50),
            ms(r, |s| s.p95),
            ms(r, |s| s.max),
            pct(g.residue_1s.share),
            pct(g.residue_30s.share),
            format!("{} ({})", pct(g.collateral_share), g.refused_allocations),
            g.dominant_phase.clone().unwrap_or_else(|| "-".into()),
            (g.without_release + g.with_losses).to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 || i == 9 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
    }
    let apart: u64 = rows.iter().map(|g| g.without_release + g.with_losses).sum();
    let bounded: u64 = rows.iter().map(|g| g.release_bounded).sum();
    let _ = writeln!(
        s,
        "{} GPU incident(s) from {files} file(s); release: from the final fatal signal (or the \
         exit) to the memory back; residue: not back after 1 s / 30 s; collateral: incidents \
         during which other allocations were refused (how many){}{}",
        rows.iter().map(|g| g.count).sum::<u64>(),
        if bounded > 0 {
            format!(
                "; the release figures leave out {bounded} whose moment is only a bound, not \
                 known to 2 ms"
            )
        } else {
            String::new()
        },
        if apart > 0 {
            format!("; {apart} apart, not in the figures (no release time yet, or kernel losses)")
        } else {
            String::new()
        }
    );
    s
}

pub fn csv(rows: &[Group]) -> String {
    let mut s = String::from(
        "group,count,release_mean_ms,release_sd_ms,release_p50_ms,release_p95_ms,\
         release_max_ms,residue_1s,residue_30s,residue_30s_bytes,collateral_share,\
         refused_allocations,dominant_phase,without_release,with_losses,release_bounded\n",
    );
    for g in rows {
        let r = |f: fn(&Summary) -> f64| {
            g.release_ms
                .as_ref()
                .map_or(String::new(), |s| format!("{:.3}", f(s)))
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{:.4},{:.4},{},{:.4},{},{},{},{},{}",
            csv_field(&g.group),
            g.count,
            r(|s| s.mean),
            r(|s| s.sd),
            r(|s| s.p50),
            r(|s| s.p95),
            r(|s| s.max),
            g.residue_1s.share,
            g.residue_30s.share,
            g.residue_30s.bytes,
            g.collateral_share,
            g.refused_allocations,
            g.dominant_phase.clone().unwrap_or_default(),
            g.without_release,
            g.with_losses,
            g.release_bounded
        );
    }
    s
}

/// A group name (a command name chosen by its process) as one CSV field.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

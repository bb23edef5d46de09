//! `linger stats --svg`: each group's release times as dots on a logarithmic time axis, with
//! its median and 95th percentile marked, for people who would rather look than read.

use std::fmt::Write;

use crate::analysis::stats::Group;

const LEFT: f64 = 170.0;
const WIDTH: f64 = 720.0;
const ROW: f64 = 46.0;
const TOP: f64 = 40.0;

/// The SVG of `groups`; `title` names what a row is.
pub fn render(groups: &[Group], title: &str) -> String {
    let values = || {
        groups
            .iter()
            .flat_map(|g| g.release_values_ms.iter().copied())
    };
    // The axis spans whole decades around every value, 10 ms at least.
    let lo = values().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = values().fold(0.0, f64::max);
    let (d0, d1) = if hi > 0.0 {
        (lo.log10().floor().min(1.0), hi.log10().ceil().max(2.0))
    } else {
        (1.0, 2.0)
    };
    let x = |ms: f64| LEFT + (ms.max(1.0).log10() - d0) / (d1 - d0) * WIDTH;
    let height = TOP + ROW * groups.len() as f64 + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        LEFT + WIDTH + 40.0
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="14">GPU memory back after the kill, by {}: each dot an incident; | median, ¦ p95</text>"#,
        xml(title)
    );
    let bottom = TOP + ROW * groups.len() as f64;
    for d in (d0 as i32)..=(d1 as i32) {
        let ms = 10f64.powi(d);
        let label = if ms >= 1000.0 {
            format!("{} s", ms / 1000.0)
        } else {
            format!("{ms} ms")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{bottom}" stroke="#ddd"/><text x="{0:.1}" y="{1}" text-anchor="middle">{label}</text>"##,
            x(ms),
            bottom + 18.0
        );
    }
    for (i, g) in groups.iter().enumerate() {
        let y = TOP + ROW * i as f64 + ROW / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{} (n={})</text>"#,
            LEFT - 10.0,
            y + 4.0,
            xml(&g.group),
            g.count
        );
        let n = g.release_values_ms.len();
        for (k, v) in g.release_values_ms.iter().enumerate() {
            // Spread the dots of one row a little so that equal times stay visible.
            let jitter = (k % 5) as f64 * 3.0 - 6.0;
            let _ = writeln!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#3366aa" fill-opacity="0.5"/>"##,
                x(*v),
                y + jitter
            );
        }
        if let Some(r) = &g.release_ms {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#cc3311" stroke-width="2"/><line x1="{3:.1}" y1="{1:.1}" x2="{3:.1}" y2="{2:.1}" stroke="#cc3311" stroke-dasharray="3,2"/>"##,
                x(r.p50),
                y - 14.0,
                y + 14.0,
                x(r.p95)
            );
        }
        if n == 0 {
            let _ = writeln!(
                s,
                r#"<text x="{LEFT}" y="{}">no release time</text>"#,
                y + 4.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Text for XML: group names are command names other users chose.
fn xml(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .map(|c| match c {
            '&' => "&amp;".into(),
            '<' => "&lt;".into(),
            '>' => "&gt;".into(),
            '"' => "&quot;".into(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::stats::{groups, By, Sample};

    #[test]
    fn names_are_escaped_and_every_incident_is_a_dot() {
        let s = |id, ms: u64, comm: &str| Sample {
            key: (None, id, id, id),
            termination: "kill".into(),
            verdict: "released".into(),
            comm: comm.into(),
            gpu: None,
            pod: None,
            driver: None,
            wall_time: None,
            share_bytes: 1 << 30,
            release_ns: Some(ms * 1_000_000),
            release_known: true,
            stop_ns: None,
            lingering: false,
            refused: 0,
            top_phase: None,
            losses: false,
            settled: true,
        };
        let all = [
            s(1, 120, "<x>&\u{1b}"),
            s(2, 3100, "<x>&\u{1b}"),
            s(3, 90, "ok"),
        ];
        let svg = render(&groups(all.iter(), By::Comm), "comm");
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("&lt;x&gt;&amp; (n=2)"), "{svg}");
        assert!(!svg.contains('\u{1b}'));
        assert!(svg.contains(">1 s<") && svg.contains(">10 ms<"), "{svg}");
    }
}

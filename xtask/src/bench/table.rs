//! What every section of BENCHMARKS.md writes with: its rows of the Targets table, and a
//! result's figures read and written. Below the sections and the report alike.

use anyhow::{Context, Result};
use serde_json::Value;

use super::stats::{summarize, Summary};

/// One row of the Targets table: what is asked, what was measured, and whether it was met.
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

pub fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("benchmark result without a number `{key}`"))
}

pub fn summary(items: &[Value], key: &str) -> Result<Summary> {
    let v: Vec<f64> = items.iter().map(|i| num(i, key)).collect::<Result<_>>()?;
    summarize(&v).with_context(|| format!("no samples of `{key}`"))
}

/// `n`, or `lo – hi` when the samples differ.
pub fn range_int(s: &Summary) -> String {
    if s.min == s.max {
        format!("{:.0}", s.min)
    } else {
        format!("{:.0} – {:.0}", s.min, s.max)
    }
}

//! The rounds of a `linger-bench-storm` result: one run per variant per round, the first
//! variant the baseline; each run times one or more parts.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    results::Measured,
    stats::{summarize, Summary},
    table::num,
};

pub struct Rounds<'a> {
    pub data: &'a Value,
    variants: Vec<String>,
    rounds: &'a [Value],
}

impl<'a> Rounds<'a> {
    pub fn new(m: &'a Measured) -> Result<Self> {
        let data = &m.data;
        let strings = |key: &str| -> Result<Vec<String>> {
            data[key]
                .as_array()
                .with_context(|| format!("storm result without `{key}`"))?
                .iter()
                .map(|v| v.as_str().map(str::to_string).context(key.to_string()))
                .collect()
        };
        let rounds = data["rounds"]
            .as_array()
            .context("storm result without rounds")?;
        if rounds.is_empty() {
            bail!("storm result with no rounds");
        }
        Ok(Self {
            data,
            variants: strings("variants")?,
            rounds,
        })
    }

    pub fn workload(&self) -> &str {
        self.data["workload"].as_str().unwrap_or("?")
    }

    /// Whether the storm ran with `--pin` (workload on CPU 0, tracer on the others).
    pub fn pinned(&self) -> bool {
        self.data["pinned"].as_bool().unwrap_or(false)
    }

    /// The workload's name, and `pinned` when it was.
    pub fn label(&self) -> String {
        if self.pinned() {
            format!("{}, pinned", self.workload())
        } else {
            self.workload().to_string()
        }
    }

    pub fn len(&self) -> usize {
        self.rounds.len()
    }

    /// Checks that the variants are these, in this order (`base`, `live ARGS`...).
    pub fn variants(&self) -> &[String] {
        &self.variants
    }

    pub fn expect(self, variants: &[&str]) -> Result<Self> {
        if self.variants != variants {
            bail!(
                "{}: variants {:?}, the report expects {variants:?}",
                self.workload(),
                self.variants
            );
        }
        Ok(self)
    }

    /// The run of `variant` in each round.
    pub fn runs(&self, variant: usize) -> impl Iterator<Item = &'a Value> + '_ {
        self.rounds.iter().map(move |r| &r["runs"][variant])
    }

    /// `key` of each run of `variant`.
    pub fn field(&self, variant: usize, key: &str) -> Result<Vec<f64>> {
        self.runs(variant).map(|r| num(r, key)).collect()
    }

    /// Seconds of `part` in each run of `variant`.
    pub fn part(&self, variant: usize, part: usize) -> Result<Vec<f64>> {
        self.runs(variant)
            .map(|r| r["parts_s"][part].as_f64().context("run without its parts"))
            .collect()
    }

    /// `variant` / baseline of `part`, round by round.
    pub fn ratios(&self, variant: usize, part: usize) -> Result<Vec<f64>> {
        let base = self.part(0, part)?;
        let v = self.part(variant, part)?;
        Ok(v.iter().zip(&base).map(|(v, b)| v / b).collect())
    }

    /// `key` of `variant` / the baseline's, round by round.
    pub fn field_ratio_summary(&self, variant: usize, key: &str) -> Result<Summary> {
        let base = self.field(0, key)?;
        let v = self.field(variant, key)?;
        let ratios: Vec<f64> = v.iter().zip(&base).map(|(v, b)| v / b).collect();
        summarize(&ratios).context("no rounds")
    }

    pub fn ratio_summary(&self, variant: usize, part: usize) -> Result<Summary> {
        summarize(&self.ratios(variant, part)?).context("no rounds")
    }

    pub fn part_summary(&self, variant: usize, part: usize) -> Result<Summary> {
        summarize(&self.part(variant, part)?).context("no rounds")
    }

    pub fn field_summary(&self, variant: usize, key: &str) -> Result<Summary> {
        summarize(&self.field(variant, key)?).context("no rounds")
    }

    /// The order each round ran its variants in (A = the baseline).
    pub fn orders(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.rounds
            .iter()
            .map(|r| r["order"].as_str().unwrap_or("?"))
    }

    /// Rounds during which another `linger live` ran on the machine.
    pub fn disturbed(&self) -> usize {
        self.rounds
            .iter()
            .filter(|r| r["other_lingers"].as_u64().unwrap_or(0) > 0)
            .count()
    }

    /// The untimed check run's result (GPU and ioctl workloads), or null.
    pub fn check(&self) -> &'a Value {
        &self.data["check"]
    }
}

/// Time per run of a program during a check run, in ns, and how often it ran, by name.
pub fn program(check: &Value, name: &str) -> Option<(f64, u64)> {
    check["programs"].as_array()?.iter().find_map(|p| {
        (p["name"] == name).then(|| {
            let runs = p["runs"].as_u64().unwrap_or(0);
            let ns = p["ns"].as_f64().unwrap_or(0.0);
            (ns / runs.max(1) as f64, runs)
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn measured() -> Measured {
        let run = |parts: [f64; 2]| json!({ "parts_s": parts, "wall_s": parts[0] + parts[1] });
        Measured {
            command: "bench".into(),
            data: json!({
                "workload": "ioctl",
                "variants": ["base", "live"],
                "rounds": [
                    { "order": "AB", "runs": [run([1.0, 2.0]), run([1.5, 2.0])] },
                    { "order": "BA", "runs": [run([2.0, 2.0]), run([2.0, 3.0])] },
                ],
            }),
        }
    }

    #[test]
    fn ratios_are_taken_within_each_round() {
        let m = measured();
        let r = Rounds::new(&m).and_then(|r| r.expect(&["base", "live"]));
        let r = r.expect("rounds");
        assert_eq!(r.ratios(1, 0).expect("part 0"), vec![1.5, 1.0]);
        assert_eq!(r.ratios(1, 1).expect("part 1"), vec![1.0, 1.5]);
        assert_eq!(r.ratio_summary(1, 0).expect("summary").median, 1.25);
        assert_eq!(r.orders().collect::<Vec<_>>(), vec!["AB", "BA"]);
        assert_eq!(r.field(1, "wall_s").expect("field"), vec![3.5, 5.0]);
    }

    #[test]
    fn other_variants_are_refused() {
        let m = measured();
        let r = Rounds::new(&m).expect("rounds");
        assert!(r.expect(&["base", "live", "live --sample-hz 0"]).is_err());
    }
}

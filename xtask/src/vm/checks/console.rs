//! One guest's console as the checks read it: the result lines it marked, by tag.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::vm::suite::MARK;

/// The result lines the guest printed, by tag.
pub struct Guest<'a> {
    lines: Vec<(&'a str, &'a str)>,
}

impl<'a> Guest<'a> {
    pub fn parse(console: &'a str) -> Self {
        let lines = console
            .lines()
            .filter_map(|l| {
                let rest = &l[l.find(MARK)? + MARK.len()..];
                Some(rest.split_once(' ').unwrap_or((rest, "")))
            })
            .collect();
        Self { lines }
    }

    pub fn all(&self, tag: &str) -> impl Iterator<Item = &'a str> + '_ {
        let tag = tag.to_string();
        self.lines
            .iter()
            .filter(move |(t, _)| *t == tag)
            .map(|(_, text)| *text)
    }

    pub fn one(&self, tag: &str) -> Result<&'a str> {
        self.all(tag)
            .next()
            .with_context(|| format!("the guest printed no '{tag}' line"))
    }

    /// The exit status the guest reported for `what`; its stderr when not 0.
    pub fn succeeded(&self, what: &str) -> Result<()> {
        let status = self.one(&format!("{what}-exit"))?;
        if status != "0" {
            let stderr: Vec<_> = self.all(&format!("{what}-err")).collect();
            bail!("{what} exited with {status}: {}", stderr.join("\n"));
        }
        Ok(())
    }

    pub fn json(&self, tag: &str) -> Result<Vec<Value>> {
        self.all(tag)
            .map(|l| serde_json::from_str(l).with_context(|| format!("{tag}: not JSON: {l}")))
            .collect()
    }
}

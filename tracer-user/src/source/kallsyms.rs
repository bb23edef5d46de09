//! Kernel addresses to names, from /proc/kallsyms (module functions carry `[module]`).

use std::{collections::HashMap, fs};

use crate::escape;

pub struct Kallsyms {
    /// Function start addresses, sorted, apart from their names: the search touches only
    /// these.
    addrs: Vec<u64>,
    /// "name" or "name[module]", by the index of its address.
    names: Vec<String>,
    /// Frames already looked up: a teardown's stacks repeat the same return addresses.
    found: HashMap<u64, usize>,
}

/// The most frames remembered; past it the memory starts over, so it stays bounded however
/// many places on-CPU samples land.
const FOUND_MAX: usize = 1 << 16;

impl Kallsyms {
    /// Reads /proc/kallsyms; as root the addresses are real (otherwise all zero, and every
    /// frame stays an address).
    pub fn load() -> Self {
        // A module's symbol names are its author's choice: no UTF-8 guarantee.
        let raw = fs::read("/proc/kallsyms").unwrap_or_default();
        Self::parse(&escape::bytes(&raw))
    }

    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
                let kind = parts.next()?;
                if !matches!(kind, "t" | "T" | "w" | "W") || addr == 0 {
                    return None;
                }
                let name = parts.next()?;
                Some(match parts.next() {
                    Some(module) => (addr, format!("{name}{module}")),
                    None => (addr, name.to_string()),
                })
            })
            .collect();
        symbols.sort_unstable_by_key(|(a, _)| *a);
        let (addrs, names) = symbols.into_iter().unzip();
        Self {
            addrs,
            names,
            found: HashMap::new(),
        }
    }

    /// Whether no function's address could be read: /proc/kallsyms shows zeros without
    /// CAP_SYSLOG, or to everyone under kernel.kptr_restrict=2.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The function containing `addr`.
    pub fn name(&mut self, addr: u64) -> String {
        if self.found.len() >= FOUND_MAX {
            self.found.clear();
        }
        let addrs = &self.addrs;
        let i = *self
            .found
            .entry(addr)
            .or_insert_with(|| addrs.partition_point(|a| *a <= addr));
        match i {
            0 => format!("{addr:#x}"),
            i => self.names[i - 1].clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_fall_in_the_preceding_function() {
        let mut k = Kallsyms::load();
        if k.addrs.is_empty() {
            return; // not root: kallsyms hides addresses
        }
        let i = k.addrs.len() / 2;
        let (addr, name) = (k.addrs[i], k.names[i].clone());
        assert_eq!(k.name(addr), name);
        assert_eq!(k.name(addr + 1), name);
        // Looked up again, from what was found.
        assert_eq!(k.name(addr + 1), name);
    }
}

//! Kernel addresses to names, from /proc/kallsyms (module functions carry `[module]`).

use std::fs;

use crate::escape;

pub struct Kallsyms {
    /// (address, "name" or "name[module]"), sorted by address.
    symbols: Vec<(u64, String)>,
}

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
        Self { symbols }
    }

    /// The function containing `addr`.
    pub fn name(&self, addr: u64) -> String {
        match self.symbols.partition_point(|(a, _)| *a <= addr) {
            0 => format!("{addr:#x}"),
            i => self.symbols[i - 1].1.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_fall_in_the_preceding_function() {
        let k = Kallsyms::load();
        if k.symbols.is_empty() {
            return; // not root: kallsyms hides addresses
        }
        let (addr, name) = k.symbols[k.symbols.len() / 2].clone();
        assert_eq!(k.name(addr), name);
        assert_eq!(k.name(addr + 1), k.name(addr));
    }
}

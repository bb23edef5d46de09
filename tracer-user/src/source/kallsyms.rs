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

/// The NVIDIA driver's modules: the RM and UVM.
pub const DRIVER_MODULES: [&str; 2] = ["nvidia", "nvidia_uvm"];

/// How far past its last function a module listed last in /proc/kallsyms is taken to reach
/// (its last function's length is not listed).
const LAST_RUN_SLACK: u64 = 1 << 20;

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

    /// The code of the named modules as address ranges, each from a run's first function to
    /// the first function after it of another module or the kernel: the addresses
    /// [`Kallsyms::name`] names `func[module]` for. The last listed run (no function after
    /// it) is given `LAST_RUN_SLACK`.
    pub fn module_text(&self, modules: &[&str]) -> Vec<(u64, u64)> {
        let ours = |name: &str| {
            modules.iter().any(|m| {
                name.strip_suffix(']')
                    .and_then(|n| n.strip_suffix(m))
                    .is_some_and(|n| n.ends_with('['))
            })
        };
        let mut ranges = Vec::new();
        let mut start = None;
        for (&addr, name) in self.addrs.iter().zip(&self.names) {
            match (ours(name), start) {
                (true, None) => start = Some(addr),
                (false, Some(s)) if addr > s => {
                    ranges.push((s, addr));
                    start = None;
                }
                _ => {}
            }
        }
        if let (Some(s), Some(&last)) = (start, self.addrs.last()) {
            ranges.push((s, last + LAST_RUN_SLACK));
        }
        ranges
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

    #[test]
    fn a_module_s_code_reaches_the_next_function_of_another() {
        // Lines as /proc/kallsyms prints them: the kernel's, then modules' (one of them a
        // prefix of another's name), out of order.
        let k = Kallsyms::parse(
            "ffffffffc0a01000 t rm_cleanup_file_private\t[nvidia]\n\
             ffffffff8a369b80 T __fput\n\
             ffffffffc0a00000 T nvidia_close\t[nvidia]\n\
             ffffffffc0a02000 t e1000_probe\t[e1000]\n\
             ffffffffc0b00000 t uvm_release_entry\t[nvidia_uvm]\n\
             ffffffffc0b00100 t nvkm_init\t[nouveau_nvidia]\n\
             ffffffffc0c00000 t uvm_va_space_destroy\t[nvidia_uvm]\n\
             ffffffffc0c00000 d uvm_data\t[nvidia_uvm]\n",
        );
        assert_eq!(
            k.module_text(&DRIVER_MODULES),
            [
                (0xffffffffc0a00000, 0xffffffffc0a02000),
                (0xffffffffc0b00000, 0xffffffffc0b00100),
                (0xffffffffc0c00000, 0xffffffffc0c00000 + LAST_RUN_SLACK),
            ]
        );
        assert!(k.module_text(&["i915"]).is_empty());
    }
}

//! No import circle between the files of the product's crates: a file that another imports
//! from imports nothing, straight or round about, that leads back to it. Shared small types
//! belong in a module below both sides.
//!
//! An arrow runs from a file to the file that defines a module its paths reach
//! (`use super::watch::Rise` reaches `watch.rs`, `super::Role` the parent's `mod.rs`); a
//! `mod` declaration is no arrow, nor is a file's own `#[cfg(test)]` code.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::{Context, Result};

use super::rust_paths::{self, Reference};

/// The crates whose files must import one another as a tree.
const PRODUCT_CRATES: [&str; 3] = ["tracer-common", "tracer-ebpf", "tracer-user"];

/// Files that import one another in a loop, and the arrows between them.
#[derive(Debug, PartialEq, Eq)]
pub struct Circle {
    pub files: Vec<String>,
    pub arrows: Vec<(String, String)>,
}

/// Fails naming every circle in the product's crates.
pub fn check(root: &Path) -> Result<()> {
    let mut found = Vec::new();
    for krate in PRODUCT_CRATES {
        let src = root.join(krate).join("src");
        let mut files = BTreeMap::new();
        read_sources(&src, "", &mut files)?;
        for circle in circles(&files) {
            let mut text = format!("{krate}/src: {}", circle.files.join(", "));
            for (from, to) in &circle.arrows {
                text.push_str(&format!("\n    {from} -> {to}"));
            }
            found.push(text);
        }
    }
    if !found.is_empty() {
        anyhow::bail!(
            "import circles between files (move what both sides take into a module below \
             them):\n  {}",
            found.join("\n  ")
        );
    }
    Ok(())
}

/// Every `.rs` file under `dir`, by its path from the crate's `src/`.
fn read_sources(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            read_sources(&path, &format!("{prefix}{name}/"), out)?;
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            out.insert(format!("{prefix}{name}"), text);
        }
    }
    Ok(())
}

/// The circles among `files` (path from the crate's `src/` → text), each sorted.
pub fn circles(files: &BTreeMap<String, String>) -> Vec<Circle> {
    let read: BTreeMap<&str, (Vec<String>, rust_paths::FileReferences)> = files
        .iter()
        .map(|(path, text)| {
            let module = module_of(path);
            let references = rust_paths::read(&module, text);
            (path.as_str(), (module, references))
        })
        .collect();
    let tests: Vec<&Vec<String>> = read.values().flat_map(|(_, r)| &r.test_modules).collect();
    let is_test = |module: &[String]| tests.iter().any(|t| module.starts_with(t));
    // A module → the file that defines it; a crate with lib.rs and main.rs has its root in lib.rs.
    let mut modules: BTreeMap<Vec<String>, &str> = BTreeMap::new();
    for (path, (module, references)) in read.iter().rev() {
        if is_test(module) {
            continue;
        }
        modules.entry(module.clone()).or_insert(path);
        for inline in references.inline_modules.iter().filter(|m| !is_test(m)) {
            modules.insert(inline.clone(), path);
        }
    }
    let mut arrows: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (path, (module, references)) in &read {
        if !is_test(module) {
            for to in targets(&references.references, &modules) {
                if to != *path {
                    arrows.insert((path, to));
                }
            }
        }
    }
    strongly_connected(&arrows)
        .into_iter()
        .filter(|files| files.len() > 1)
        .map(|files| Circle {
            arrows: arrows
                .iter()
                .filter(|(from, to)| files.contains(from) && files.contains(to))
                .map(|(from, to)| (from.to_string(), to.to_string()))
                .collect(),
            files: files.into_iter().map(str::to_string).collect(),
        })
        .collect()
}

/// `analysis/memory/mod.rs` → `["analysis", "memory"]`; `lib.rs` and `main.rs` → the root.
fn module_of(path: &str) -> Vec<String> {
    let mut module: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if module.last().is_some_and(|m| m == "mod") || module == ["lib"] || module == ["main"] {
        module.pop();
    }
    module
}

/// The files that `references` (one file's, in order) lead to. A `use` of a module names it
/// for the paths after it (`use super::memory;` then `memory::tolerance`), and is no arrow
/// by itself.
fn targets<'m>(
    references: &[Reference],
    modules: &BTreeMap<Vec<String>, &'m str>,
) -> BTreeSet<&'m str> {
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for reference in references {
        let Some(mut path) = resolve(reference, &aliases, modules) else {
            continue;
        };
        if path.last().is_some_and(|s| s == "*") {
            path.pop();
        } else if let Some(name) = &reference.used_as {
            if modules.contains_key(&path) {
                aliases.insert(name.clone(), path);
                continue;
            }
        }
        let defined_in = (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]));
        out.extend(defined_in.copied());
    }
    out
}

/// The path from the crate's root, where it starts at a module of the crate.
fn resolve(
    reference: &Reference,
    aliases: &BTreeMap<String, Vec<String>>,
    modules: &BTreeMap<Vec<String>, &str>,
) -> Option<Vec<String>> {
    let (first, rest) = reference.path.split_first()?;
    let here = &reference.module;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.clone(),
        "super" => {
            let up = 1 + rest.iter().take_while(|s| *s == "super").count();
            let mut base = here.get(..here.len().checked_sub(up)?)?.to_vec();
            base.extend(rest[up - 1..].iter().cloned());
            return Some(base);
        }
        name if aliases.contains_key(name) => aliases[name].clone(),
        name => {
            let mut child = here.clone();
            child.push(name.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
            here.clone()
        }
    };
    if matches!(first.as_str(), "crate" | "self") || aliases.contains_key(first) {
        base.extend(rest.iter().cloned());
    } else {
        base.extend(reference.path.iter().cloned());
    }
    Some(base)
}

/// Tarjan's strongly connected components of the graph `arrows` draws.
fn strongly_connected<'a>(arrows: &BTreeSet<(&'a str, &'a str)>) -> Vec<Vec<&'a str>> {
    let nodes: BTreeSet<&str> = arrows.iter().flat_map(|(a, b)| [*a, *b]).collect();
    let mut tarjan = Tarjan {
        arrows,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for node in nodes {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    tarjan.components
}

struct Tarjan<'g, 'a> {
    arrows: &'g BTreeSet<(&'a str, &'a str)>,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    components: Vec<Vec<&'a str>>,
}

impl<'a> Tarjan<'_, 'a> {
    fn visit(&mut self, node: &'a str) {
        let index = self.index.len();
        self.index.insert(node, index);
        self.low.insert(node, index);
        self.stack.push(node);
        self.on_stack.insert(node);
        let next: Vec<&'a str> = self
            .arrows
            .range((node, "")..)
            .take_while(|(from, _)| *from == node)
            .map(|(_, to)| *to)
            .collect();
        for to in next {
            if !self.index.contains_key(to) {
                self.visit(to);
                self.low.insert(node, self.low[node].min(self.low[to]));
            } else if self.on_stack.contains(to) {
                self.low.insert(node, self.low[node].min(self.index[to]));
            }
        }
        if self.low[node] == index {
            let mut component = Vec::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            self.components.push(component);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect()
    }

    /// holders → memory → incident → holders, as `analysis/` had it.
    const PLANTED: [(&str, &str); 5] = [
        ("lib.rs", "pub mod analysis;"),
        (
            "analysis/mod.rs",
            "pub mod holders; pub mod incident; pub mod memory;",
        ),
        (
            "analysis/holders.rs",
            "use super::memory::ImportVia; pub struct Holder;",
        ),
        (
            "analysis/memory/mod.rs",
            "use crate::analysis::incident::Source; pub enum ImportVia {}",
        ),
        (
            "analysis/incident/mod.rs",
            "#[cfg(test)]\nmod tests;\npub struct Incident { h: super::holders::Holder }",
        ),
    ];

    #[test]
    fn a_planted_circle_is_named_with_its_arrows() {
        let mut files = crate_of(&PLANTED);
        // The incident's tests import the analysis' whole: no arrow of the product.
        files.insert(
            "analysis/incident/tests.rs".into(),
            "use crate::analysis::*;".into(),
        );
        assert_eq!(
            circles(&files),
            [Circle {
                files: vec![
                    "analysis/holders.rs".into(),
                    "analysis/incident/mod.rs".into(),
                    "analysis/memory/mod.rs".into(),
                ],
                arrows: vec![
                    (
                        "analysis/holders.rs".into(),
                        "analysis/memory/mod.rs".into()
                    ),
                    (
                        "analysis/incident/mod.rs".into(),
                        "analysis/holders.rs".into()
                    ),
                    (
                        "analysis/memory/mod.rs".into(),
                        "analysis/incident/mod.rs".into()
                    ),
                ],
            }]
        );
    }

    #[test]
    fn a_leaf_module_below_both_sides_leaves_no_circle() {
        let mut files = crate_of(&PLANTED);
        files.insert(
            "analysis/incident/mod.rs".into(),
            "pub mod source; pub struct Incident { h: super::holders::Holder }".into(),
        );
        files.insert(
            "analysis/incident/source.rs".into(),
            "pub enum Source {}".into(),
        );
        files.insert(
            "analysis/memory/mod.rs".into(),
            "use crate::analysis::incident::source::Source; pub enum ImportVia {}".into(),
        );
        assert_eq!(circles(&files), []);
    }

    #[test]
    fn a_module_named_by_use_leads_where_its_paths_go() {
        let files = crate_of(&[
            ("lib.rs", "mod a; mod b;"),
            ("a/mod.rs", "pub mod leaf; use crate::b::B;"),
            ("a/leaf.rs", "pub struct Leaf;"),
            // Only `a::leaf` is reached: no arrow to a/mod.rs, so no circle.
            ("b.rs", "use crate::a; pub struct B(a::leaf::Leaf);"),
        ]);
        assert_eq!(circles(&files), []);
    }

    #[test]
    fn a_child_and_its_parent_importing_each_other_are_a_circle() {
        let files = crate_of(&[
            ("main.rs", "mod m;"),
            (
                "m/mod.rs",
                "mod pool; use pool::Pool; pub struct Book { p: Pool }",
            ),
            ("m/pool.rs", "pub struct Pool; impl super::Book {}"),
        ]);
        assert_eq!(circles(&files)[0].files, ["m/mod.rs", "m/pool.rs"]);
    }
}

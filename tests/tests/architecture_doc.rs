//! docs/ARCHITECTURE.md names files and folders: each must exist, so the picture follows the
//! code when a file moves. A path from the repository's root (`tracer-user/src/sink/`) is
//! checked there; a shorter one (`correlate/death.rs`) must end some path under
//! tracer-user/src.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every path under `dir`, relative to it, with `/` after folders.
fn tree(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read a source folder") {
        let entry = entry.expect("read a folder entry");
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.path().is_dir() {
            out.push(format!("{name}/"));
            tree(&entry.path(), &format!("{name}/"), out);
        } else {
            out.push(name);
        }
    }
}

/// The backquoted spans of `doc` that name a file or folder.
fn paths(doc: &str) -> Vec<&str> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs") || s.ends_with(".md") || s.ends_with('/'))
        .collect()
}

#[test]
fn every_path_the_architecture_names_exists() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("read the doc");
    let mut sources = Vec::new();
    tree(&root.join("tracer-user/src"), "", &mut sources);
    let named = paths(&doc);
    assert!(
        named.len() > 20,
        "too few paths found in the doc: {named:?}"
    );
    let missing: Vec<&str> = named
        .into_iter()
        .filter(|p| {
            let from_root = ["tracer-", "docs/", "tests/"]
                .iter()
                .any(|r| p.starts_with(r));
            if from_root {
                !root.join(p).exists()
            } else {
                !sources
                    .iter()
                    .any(|s| s == p || s.ends_with(&format!("/{p}")))
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

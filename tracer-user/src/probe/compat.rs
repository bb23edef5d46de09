//! CUDA's forward-compatibility libraries (the `cuda-compat` packages): a newer libcuda than
//! the driver's, installed in `/usr/local/cuda-X.Y/compat` (and `/usr/local/cuda/compat`
//! through the toolkit's link), which a program loads instead of the driver's through
//! `LD_LIBRARY_PATH`. It is a different file from the driver's libcuda, so its calls are
//! hooked only if it is found too. A copy anywhere else (or only inside a container's image)
//! is not found: the library mode's `unseen` says what that costs.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// The compat directories under `root` (the machine's root or a driver root): `usr/local/cuda`
/// and every `usr/local/cuda-*`, each with `compat` appended, in name order.
pub fn dirs(root: &Path) -> Vec<PathBuf> {
    let local = root.join("usr/local");
    let mut found: Vec<PathBuf> = fs::read_dir(&local)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == "cuda" || name.starts_with("cuda-")
        })
        .map(|e| e.path().join("compat"))
        .filter(|d| d.is_dir())
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolkits_compat_directories_are_found_and_nothing_else() {
        let root = std::env::temp_dir().join(format!("linger-compat-{}", std::process::id()));
        let local = root.join("usr/local");
        for dir in [
            "cuda-12.8/compat",
            "cuda/compat",
            "cuda-13.0",
            "cudnn/compat",
        ] {
            fs::create_dir_all(local.join(dir)).expect("a directory");
        }
        let found = dirs(&root);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            found,
            vec![local.join("cuda/compat"), local.join("cuda-12.8/compat")]
        );
        assert!(dirs(Path::new("/nonexistent")).is_empty());
    }
}

//! The directory a long-running linger (the agent) keeps its state and logs in: whoever can
//! write to it, or to a directory above it, can plant links and files there or swap it whole.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::Path,
};

use nix::unistd::geteuid;
use thiserror::Error;

use crate::escape;

#[derive(Debug, Error)]
pub enum StateDirError {
    // The cause is in the message, not also the error's source: printed once.
    #[error("state directory {path}: {cause}")]
    Unreadable { path: String, cause: io::Error },
    #[error("creating the state directory {path}: {cause}")]
    Create { path: String, cause: io::Error },
    #[error("state directory {path} is a symbolic link: it must be the directory itself")]
    Symlink { path: String },
    #[error("state directory {path} is not a directory")]
    NotDirectory { path: String },
    #[error("{path} belongs to uid {owner}: {role} must belong to root{}", or_caller(*.caller))]
    Owner {
        path: String,
        role: &'static str,
        owner: u32,
        caller: u32,
    },
    #[error(
        "{path} is writable by {by} (mode {mode:o}): {role} must be writable by its owner only"
    )]
    Writable {
        path: String,
        role: &'static str,
        by: &'static str,
        mode: u32,
    },
}

/// The user linger runs as is accepted too: a service user's agent keeps its own state.
fn or_caller(caller: u32) -> String {
    match caller {
        0 => String::new(),
        uid => format!(" or to uid {uid}, which linger runs as"),
    }
}

const ROLE_DIR: &str = "a state directory";
const ROLE_ABOVE: &str = "a directory above the state directory";

/// Creates `path` where it does not exist (mode 0700, as any missing directory above it), then
/// accepts it or says why not, as [`check_state_dir`].
pub fn create_state_dir(path: &Path) -> Result<(), StateDirError> {
    if let Err(e) = fs::symlink_metadata(path) {
        if e.kind() == io::ErrorKind::NotFound {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|cause| StateDirError::Create {
                    path: escape::path(path),
                    cause,
                })?;
        }
    }
    check_state_dir(path)
}

/// Accepts `path` as a state directory, or says why not: it must be a directory, not a
/// symbolic link, owned by root or by the user linger runs as, and writable by that owner
/// only; each directory above it must be owned likewise and, unless it is sticky (as /tmp
/// is: nobody renames what others own there), not writable by group or others.
pub fn check_state_dir(path: &Path) -> Result<(), StateDirError> {
    let shown = || escape::path(path);
    let unreadable = |cause| StateDirError::Unreadable {
        path: shown(),
        cause,
    };
    let meta = fs::symlink_metadata(path).map_err(unreadable)?;
    if meta.file_type().is_symlink() {
        return Err(StateDirError::Symlink { path: shown() });
    }
    if !meta.is_dir() {
        return Err(StateDirError::NotDirectory { path: shown() });
    }
    check(path, &meta, ROLE_DIR, false)?;
    // The real directories above, links resolved: those are what could be swapped.
    let real = fs::canonicalize(path).map_err(unreadable)?;
    for above in real.ancestors().skip(1) {
        let meta = fs::metadata(above).map_err(|cause| StateDirError::Unreadable {
            path: escape::path(above),
            cause,
        })?;
        check(above, &meta, ROLE_ABOVE, true)?;
    }
    Ok(())
}

fn check(
    path: &Path,
    meta: &fs::Metadata,
    role: &'static str,
    sticky_allowed: bool,
) -> Result<(), StateDirError> {
    let caller = geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != caller {
        return Err(StateDirError::Owner {
            path: escape::path(path),
            role,
            owner: meta.uid(),
            caller,
        });
    }
    let mode = meta.permissions().mode();
    let sticky = mode & 0o1000 != 0;
    let by = match mode & 0o022 {
        _ if sticky_allowed && sticky => return Ok(()),
        0 => return Ok(()),
        0o020 => "its group",
        0o002 => "others",
        _ => "its group and others",
    };
    Err(StateDirError::Writable {
        path: escape::path(path),
        role,
        by,
        mode: mode & 0o7777,
    })
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, path::PathBuf};

    use super::*;

    /// A fresh directory under the system's temporary one (sticky, root's), removed at the end.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("linger-state-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir(&dir).expect("scratch dir");
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod");
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn dir_with_mode(parent: &Path, name: &str, mode: u32) -> PathBuf {
        let dir = parent.join(name);
        fs::create_dir(&dir).expect("mkdir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).expect("chmod");
        dir
    }

    #[test]
    fn a_private_directory_of_linger_s_user_is_accepted() {
        let scratch = Scratch::new("good");
        let state = dir_with_mode(&scratch.0, "state", 0o700);
        check_state_dir(&state).expect("a good state directory");
        // Readable by others is fine: nobody else can change it.
        let public = dir_with_mode(&scratch.0, "public", 0o755);
        check_state_dir(&public).expect("read-only for others");
    }

    #[test]
    fn a_directory_others_can_write_is_refused_with_the_reason() {
        let scratch = Scratch::new("writable");
        for (mode, by) in [
            (0o777, "its group and others"),
            (0o707, "others"),
            (0o770, "its group"),
            (0o1777, "its group and others"),
        ] {
            let state = dir_with_mode(&scratch.0, &format!("state-{mode:o}"), mode);
            let err = check_state_dir(&state).expect_err("writable by others");
            let text = err.to_string();
            assert!(
                text.contains(&format!("writable by {by} (mode {mode:o})")),
                "{text}"
            );
            assert!(text.contains("a state directory"), "{text}");
        }
    }

    #[test]
    fn links_and_files_are_refused() {
        let scratch = Scratch::new("links");
        let real = dir_with_mode(&scratch.0, "real", 0o700);
        let link = scratch.0.join("link");
        symlink(&real, &link).expect("symlink");
        let err = check_state_dir(&link).expect_err("a link");
        assert!(matches!(err, StateDirError::Symlink { .. }), "{err}");
        let file = scratch.0.join("file");
        fs::write(&file, "").expect("file");
        let err = check_state_dir(&file).expect_err("a file");
        assert!(matches!(err, StateDirError::NotDirectory { .. }), "{err}");
        let err = check_state_dir(&scratch.0.join("missing")).expect_err("missing");
        assert!(err.to_string().contains("No such file"), "{err}");
    }

    #[test]
    fn a_directory_above_that_others_can_write_is_refused() {
        let scratch = Scratch::new("above");
        let open = dir_with_mode(&scratch.0, "open", 0o777);
        let state = dir_with_mode(&open, "state", 0o700);
        let err = check_state_dir(&state).expect_err("swappable");
        let text = err.to_string();
        assert!(
            text.contains("open is writable by its group and others"),
            "{text}"
        );
        assert!(
            text.contains("a directory above the state directory"),
            "{text}"
        );
        // Sticky, as /tmp: others cannot rename what is not theirs.
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).expect("chmod");
        check_state_dir(&state).expect("under a sticky directory");
    }
}

//! One output file: created new, or written under a temporary name beside the file it
//! replaces and renamed over it. Every step is relative to the directory opened once, so
//! the checks and the writes are about the same entries.

use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io::{self, Write},
    os::fd::OwnedFd,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use nix::{
    errno::Errno,
    fcntl::{open, openat, renameat, AtFlags, OFlag},
    sys::stat::{fstatat, FileStat, Mode, SFlag},
    unistd::{geteuid, unlinkat, UnlinkatFlags},
};
use thiserror::Error;

use crate::escape;

/// What to do when the output path names something already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Fail, saying so.
    Refuse,
    /// Replace it, if it is a regular file of linger's own user (`--force`).
    Replace,
}

impl Existing {
    /// `--force` given or not.
    pub fn replace_if(force: bool) -> Self {
        if force {
            Self::Replace
        } else {
            Self::Refuse
        }
    }
}

#[derive(Debug, Error)]
pub enum OutputError {
    #[error("{path} exists: pass --force to replace it")]
    Exists { path: String },
    #[error(
        "{path} is a symbolic link: linger never writes through one (remove it, or write elsewhere)"
    )]
    Symlink { path: String },
    #[error("{path} is a {kind}: linger writes only regular files")]
    NotRegular { path: String, kind: &'static str },
    #[error(
        "{path} belongs to uid {owner} and linger runs as uid {caller}: it replaces only its own files"
    )]
    NotOwned {
        path: String,
        owner: u32,
        caller: u32,
    },
    #[error("{path} names no file")]
    NoName { path: String },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A file being written; see [`OutputFile::create`] and [`OutputFile::commit`].
pub struct OutputFile {
    file: File,
    /// Set while a replacement is written under a temporary name.
    pending: Option<Pending>,
    /// A new file's directory and name, for [`OutputFile::discard`].
    created: Option<(OwnedFd, OsString)>,
}

struct Pending {
    dir: OwnedFd,
    temp: OsString,
    name: OsString,
    shown: String,
}

/// Attempts at a temporary name before giving up: another user may have taken the first ones.
const TEMP_ATTEMPTS: u32 = 16;

impl OutputFile {
    /// Creates `path` new, mode 0600; a symbolic link there is never followed. When something
    /// exists there already, [`Existing::Refuse`] fails, and [`Existing::Replace`] writes a
    /// new file beside it that takes its place at [`OutputFile::commit`], provided it is a
    /// regular file of the user linger runs as.
    pub fn create(path: &Path, existing: Existing) -> Result<Self, OutputError> {
        let shown = escape::path(path);
        let name = path.file_name().ok_or_else(|| OutputError::NoName {
            path: shown.clone(),
        })?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let io = |action| {
            let path = shown.clone();
            move |e: Errno| OutputError::Io {
                action,
                path,
                source: e.into(),
            }
        };
        let dir = open(
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io("opening the directory of"))?;
        match create_new(&dir, name) {
            Ok(fd) => {
                return Ok(Self {
                    file: fd.into(),
                    pending: None,
                    created: Some((dir, name.to_owned())),
                })
            }
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(io("creating")(e)),
        }
        let found = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io("checking"))?;
        check_replaceable(&found, existing, &shown)?;
        let (temp, fd) = create_temp(&dir).map_err(io("creating a file to replace"))?;
        Ok(Self {
            file: fd.into(),
            pending: Some(Pending {
                dir,
                temp,
                name: name.to_owned(),
                shown,
            }),
            created: None,
        })
    }

    /// What failed half way leaves nothing: a new file is removed, a replacement's temporary
    /// file too (the old file stays as it was).
    pub fn discard(mut self) {
        if let Some((dir, name)) = self.created.take() {
            let _ = unlinkat(&dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }

    /// Gives the file its name: a new file has it already; a replacement, written so far under
    /// a temporary name, takes the old file's place in one rename, so the old file is never
    /// written to and nobody sees it half replaced. Writing may go on afterwards.
    pub fn commit(&mut self) -> Result<(), OutputError> {
        let Some(p) = &self.pending else {
            return Ok(());
        };
        let failed = |action| {
            let path = p.shown.clone();
            move |source| OutputError::Io {
                action,
                path,
                source,
            }
        };
        self.file.sync_all().map_err(failed("writing"))?;
        renameat(&p.dir, p.temp.as_os_str(), &p.dir, p.name.as_os_str())
            .map_err(|e| failed("replacing")(e.into()))?;
        self.pending = None;
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for OutputFile {
    /// An uncommitted replacement is removed: the old file stays as it was.
    fn drop(&mut self) {
        if let Some(p) = &self.pending {
            let _ = unlinkat(&p.dir, p.temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

fn create_new(dir: &OwnedFd, name: &OsStr) -> nix::Result<OwnedFd> {
    // O_EXCL fails on any existing entry, a symbolic link included, dangling or not.
    openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
}

fn check_replaceable(found: &FileStat, existing: Existing, shown: &str) -> Result<(), OutputError> {
    let path = shown.to_string();
    let kind = match SFlag::from_bits_truncate(found.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => None,
        SFlag::S_IFLNK => return Err(OutputError::Symlink { path }),
        SFlag::S_IFDIR => Some("directory"),
        SFlag::S_IFCHR => Some("character device"),
        SFlag::S_IFBLK => Some("block device"),
        SFlag::S_IFIFO => Some("named pipe"),
        SFlag::S_IFSOCK => Some("socket"),
        _ => Some("special file"),
    };
    if let Some(kind) = kind {
        return Err(OutputError::NotRegular { path, kind });
    }
    if existing == Existing::Refuse {
        return Err(OutputError::Exists { path });
    }
    let caller = geteuid().as_raw();
    if found.st_uid != caller {
        return Err(OutputError::NotOwned {
            path,
            owner: found.st_uid,
            caller,
        });
    }
    Ok(())
}

/// A new hidden file in `dir` whose name others cannot have guessed ahead.
fn create_temp(dir: &OwnedFd) -> nix::Result<(OsString, OwnedFd)> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = Errno::EEXIST;
    for attempt in 0..TEMP_ATTEMPTS {
        let name = OsString::from(format!(
            ".linger-{}-{:x}.tmp",
            std::process::id(),
            nanos.wrapping_add(attempt.wrapping_mul(0x9e37_79b9))
        ));
        match create_new(dir, &name) {
            Ok(fd) => return Ok((name, fd)),
            Err(e) => last = e,
        }
        if last != Errno::EEXIST {
            break;
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::fs::{symlink, MetadataExt, PermissionsExt},
        path::PathBuf,
    };

    use super::*;

    /// A fresh directory, removed at the end.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("linger-output-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }

        /// Everything in it, sorted: no temporary file may be left behind.
        fn entries(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(&self.0)
                .expect("scratch dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn write(path: &Path, existing: Existing, text: &str) -> Result<(), OutputError> {
        let mut out = OutputFile::create(path, existing)?;
        out.write_all(text.as_bytes()).expect("writing");
        out.commit()
    }

    #[test]
    fn a_new_file_is_created_private() {
        let dir = Scratch::new("new");
        let path = dir.0.join("trace.lgr");
        write(&path, Existing::Refuse, "data").expect("a new file");
        assert_eq!(fs::read_to_string(&path).expect("written"), "data");
        let meta = fs::metadata(&path).expect("written");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(dir.entries(), ["trace.lgr"]);
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        let dir = Scratch::new("symlink");
        let victim = dir.0.join("target.txt");
        fs::write(&victim, "precious").expect("victim");
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).expect("chmod");
        let link = dir.0.join("evil.lgr");
        symlink("target.txt", &link).expect("symlink");
        let dangling = dir.0.join("dangling.lgr");
        symlink("nothing-here", &dangling).expect("symlink");
        for path in [&link, &dangling] {
            for existing in [Existing::Refuse, Existing::Replace] {
                let err = write(path, existing, "trace").expect_err("a link");
                assert!(matches!(err, OutputError::Symlink { .. }), "{err}");
                assert!(err.to_string().contains("symbolic link"), "{err}");
            }
        }
        assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious");
        let mode = fs::metadata(&victim).expect("victim").permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "its mode is untouched");
        assert_eq!(dir.entries(), ["dangling.lgr", "evil.lgr", "target.txt"]);
    }

    #[test]
    fn an_existing_file_is_kept_without_force() {
        let dir = Scratch::new("exists");
        let path = dir.0.join("run.lgr");
        fs::write(&path, "old").expect("old file");
        let err = write(&path, Existing::Refuse, "new").expect_err("exists");
        assert!(err.to_string().contains("pass --force"), "{err}");
        assert_eq!(fs::read_to_string(&path).expect("old file"), "old");
    }

    #[test]
    fn force_replaces_by_rename_and_never_writes_the_old_file() {
        let dir = Scratch::new("force");
        let path = dir.0.join("run.lgr");
        fs::write(&path, "old").expect("old file");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        // A second name for the old file shows what happened to it.
        let other_name = dir.0.join("hardlink");
        fs::hard_link(&path, &other_name).expect("hard link");
        let old_inode = fs::metadata(&path).expect("old").ino();

        let mut out = OutputFile::create(&path, Existing::Replace).expect("replaceable");
        out.write_all(b"new").expect("writing");
        assert_eq!(
            fs::read_to_string(&path).expect("old"),
            "old",
            "until commit"
        );
        out.commit().expect("rename");
        out.write_all(b" and more").expect("writing on");
        drop(out);

        assert_eq!(fs::read_to_string(&path).expect("new"), "new and more");
        let meta = fs::metadata(&path).expect("new");
        assert_ne!(meta.ino(), old_inode, "a new file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_to_string(&other_name).expect("old"), "old");
        let mode = fs::metadata(&other_name).expect("old").permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "nothing that existed was chmod'ed");
        assert_eq!(dir.entries(), ["hardlink", "run.lgr"]);
    }

    #[test]
    fn a_replacement_never_committed_leaves_the_old_file_and_no_temporary() {
        let dir = Scratch::new("abandoned");
        let path = dir.0.join("out.json");
        fs::write(&path, "old").expect("old file");
        let mut out = OutputFile::create(&path, Existing::Replace).expect("replaceable");
        out.write_all(b"half").expect("writing");
        assert_eq!(dir.entries().len(), 2, "the replacement is beside it");
        drop(out);
        assert_eq!(fs::read_to_string(&path).expect("old"), "old");
        assert_eq!(dir.entries(), ["out.json"]);
    }

    #[test]
    fn only_regular_files_are_replaced() {
        let dir = Scratch::new("special");
        let sub = dir.0.join("sub");
        fs::create_dir(&sub).expect("dir");
        let err = write(&sub, Existing::Replace, "x").expect_err("a directory");
        assert!(err.to_string().contains("is a directory"), "{err}");
        let err = write(Path::new("/dev/null"), Existing::Replace, "x").expect_err("a device");
        assert!(err.to_string().contains("character device"), "{err}");
        let err = write(&dir.0.join(".."), Existing::Replace, "x").expect_err("no name");
        assert!(matches!(err, OutputError::NoName { .. }), "{err}");
    }
}

//! Output files as a local attacker would try them: a symbolic link planted under the name an
//! operator records to, an existing file, one of another user; and state directories others
//! could write to. linger, running as root, must refuse with a clear message and leave every
//! existing file as it was.

use std::{
    fs,
    os::unix::fs::{symlink, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Output,
};

use linger_tests::{linger, require_root, TempDir};
use nix::unistd::{Gid, Uid};
use tracer_user::output::{check_state_dir, create_state_dir, StateDirError};

const NOBODY: u32 = 65534;

/// A file in `dir` with `text`, mode 0644, as a job's checkpoint would be.
fn precious(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).expect("writing a file");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    path
}

/// The names in `dir`, sorted.
fn names(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .expect("scratch dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `linger ARGS` run inside `dir`, as an operator in a shared directory would.
fn linger_in(dir: &Path, args: &[&str]) -> Output {
    linger()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running linger")
}

fn assert_refused(out: &Output, mentions: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(
        stderr.contains(mentions),
        "{what}: stderr lacks {mentions:?}:\n{stderr}"
    );
}

fn assert_untouched(path: &Path, text: &str) {
    assert_eq!(fs::read_to_string(path).expect("the file"), text);
    let meta = fs::metadata(path).expect("the file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o644, "its mode changed");
}

fn chown(path: &Path, uid: u32) {
    nix::unistd::chown(path, Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid))).expect("chown");
}

fn is_trace(path: &Path) -> bool {
    fs::read(path).is_ok_and(|b| b.starts_with(b"\x89LINGER"))
}

#[test]
fn a_planted_symlink_is_never_followed() {
    require_root();
    let dir = TempDir::new("out-symlink");
    let victim = precious(&dir, "target.txt", "checkpoint");
    symlink("target.txt", dir.join("evil.lgr")).expect("planting the link");
    symlink("/nonexistent/new-file", dir.join("dangling.lgr")).expect("planting the link");
    for args in [
        &["record", "-o", "evil.lgr", "--duration", "200ms"][..],
        &["record", "-o", "evil.lgr", "--duration", "200ms", "--force"],
        &["live", "--record", "evil.lgr", "--duration", "200ms"],
        &["record", "-o", "dangling.lgr", "--duration", "200ms"],
    ] {
        let out = linger_in(dir.path(), args);
        assert_refused(
            &out,
            &format!("{} is a symbolic link", args[2]),
            &args.join(" "),
        );
        assert_untouched(&victim, "checkpoint");
    }
    assert_eq!(names(&dir), ["dangling.lgr", "evil.lgr", "target.txt"]);
}

#[test]
fn an_existing_file_is_replaced_only_with_force_and_only_whole() {
    require_root();
    let dir = TempDir::new("out-exists");
    let old = precious(&dir, "run.lgr", "yesterday's trace");
    // A second name for the old file: what linger does to that file shows through it.
    let keep = dir.join("keep");
    fs::hard_link(&old, &keep).expect("hard link");
    let record = ["record", "-o", "run.lgr", "--duration", "200ms"];
    let out = linger_in(dir.path(), &record);
    assert_refused(&out, "run.lgr exists: pass --force to replace it", "record");
    assert_untouched(&old, "yesterday's trace");

    let out = linger_in(dir.path(), &[&record[..], &["--force"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_trace(&old), "run.lgr is the new trace");
    let meta = fs::metadata(&old).expect("run.lgr");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_ne!(
        meta.ino(),
        fs::metadata(&keep).expect("keep").ino(),
        "a new file"
    );
    assert_untouched(&keep, "yesterday's trace");
    assert_eq!(names(&dir), ["keep", "run.lgr"], "no temporary file left");

    // Exports follow the same rules, and replace only once complete.
    let export = |extra: &[&str]| {
        let args = [
            &["export", "run.lgr", "--format", "folded", "-o", "out.txt"],
            extra,
        ]
        .concat();
        linger_in(dir.path(), &args)
    };
    let previous = precious(&dir, "out.txt", "last export");
    assert_refused(&export(&[]), "out.txt exists: pass --force", "export");
    assert_untouched(&previous, "last export");
    let out = export(&["--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = fs::metadata(&previous).expect("out.txt");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    symlink("keep", dir.join("link.txt")).expect("planting a link");
    let args = [
        "export", "run.lgr", "--format", "svg", "-o", "link.txt", "--force",
    ];
    assert_refused(
        &linger_in(dir.path(), &args),
        "link.txt is a symbolic link",
        "export",
    );
    assert_untouched(&keep, "yesterday's trace");
    assert_eq!(names(&dir), ["keep", "link.txt", "out.txt", "run.lgr"]);
}

#[test]
fn force_replaces_only_linger_s_own_regular_files() {
    require_root();
    let dir = TempDir::new("out-owner");
    let theirs = precious(&dir, "theirs.lgr", "another user's trace");
    chown(&theirs, NOBODY);
    let args = [
        "record",
        "-o",
        "theirs.lgr",
        "--duration",
        "200ms",
        "--force",
    ];
    assert_refused(
        &linger_in(dir.path(), &args),
        "theirs.lgr belongs to uid 65534 and linger runs as uid 0",
        "another user's file",
    );
    assert_untouched(&theirs, "another user's trace");
    fs::create_dir(dir.join("sub")).expect("mkdir");
    let args = ["record", "-o", "sub", "--duration", "200ms", "--force"];
    assert_refused(
        &linger_in(dir.path(), &args),
        "sub is a directory",
        "a directory",
    );
}

#[test]
fn hostile_state_directories_are_refused_with_the_reason() {
    require_root();
    let dir = TempDir::new("out-state");
    let mkdir = |name: &str, mode: u32, owner: u32| {
        let path = dir.join(name);
        fs::create_dir(&path).expect("mkdir");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod");
        chown(&path, owner);
        path
    };
    check_state_dir(&mkdir("good", 0o700, 0)).expect("root's private directory");

    let err = check_state_dir(&mkdir("nobodys", 0o700, NOBODY)).expect_err("not root's");
    assert!(
        matches!(err, StateDirError::Owner { owner: NOBODY, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("belongs to uid 65534"), "{err}");

    let err = check_state_dir(&mkdir("open", 0o777, 0)).expect_err("world-writable");
    assert!(
        err.to_string().contains("writable by its group and others"),
        "{err}"
    );

    // Root's own directory, inside one its owner (nobody) could rename or replace.
    let above = mkdir("above", 0o755, NOBODY);
    let inner = above.join("state");
    fs::create_dir(&inner).expect("mkdir");
    fs::set_permissions(&inner, fs::Permissions::from_mode(0o700)).expect("chmod");
    let err = check_state_dir(&inner).expect_err("swappable from above");
    assert!(
        err.to_string()
            .contains("a directory above the state directory must belong to root"),
        "{err}"
    );

    let link = dir.join("link");
    symlink(dir.join("good"), &link).expect("symlink");
    let err = check_state_dir(&link).expect_err("a link");
    assert!(err.to_string().contains("is a symbolic link"), "{err}");
    // Creating refuses what it finds there just the same.
    let err = create_state_dir(&link).expect_err("a link");
    assert!(err.to_string().contains("is a symbolic link"), "{err}");
    let err = create_state_dir(&inner.join("new")).expect_err("swappable from above");
    assert!(err.to_string().contains("must belong to root"), "{err}");
}

#[test]
fn a_missing_state_directory_is_created_private_and_a_failure_says_why_once() {
    require_root();
    let dir = TempDir::new("out-state-new");
    let state = dir.join("var/lib/linger");
    create_state_dir(&state).expect("created");
    for d in [dir.join("var"), dir.join("var/lib"), state.clone()] {
        let mode = fs::metadata(&d).expect("made").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    check_state_dir(&state).expect("what was made passes the checks");
    create_state_dir(&state).expect("an existing one is taken as it is");

    fs::write(dir.join("file"), b"").expect("a file");
    let err = create_state_dir(&dir.join("file/linger")).expect_err("under a file");
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(chain.matches("Not a directory").count(), 1, "{chain}");
}

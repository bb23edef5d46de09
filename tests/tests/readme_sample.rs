//! The README's sample output is what `linger replay` prints of the recording it names
//! (its teardown bars cut), so the first thing a reader sees stays true.

use linger_tests::{fixtures::h200, linger};

#[test]
fn the_readmes_sample_is_the_replay_of_its_recording() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let start = readme.find("$ sudo linger live\n").expect("the sample") + 19;
    let sample = &readme[start..start + readme[start..].find("```").expect("its end")];
    let out = linger()
        .args(["replay"])
        .arg(h200().join("suite/pass15/ipc-import.trace"))
        .env("TZ", "UTC")
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    let printed: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        // A teardown phase's bar: its name, its time, its share and the bar.
        .filter(|l| !(l.starts_with("                ") && l.trim_end().ends_with(['█', '%'])))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(sample, printed);
}

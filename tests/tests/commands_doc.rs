//! docs/commands.md lists every command with its options: each option a row names is one its
//! command takes (`linger COMMAND --help` lists it), so the table follows the binary.

use std::process::Command;

use linger_tests::linger_bin;

/// The `--options` in a backquoted span.
fn options(span: &str) -> impl Iterator<Item = &str> {
    span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
}

#[test]
fn every_option_the_commands_table_names_is_one_its_command_takes() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/commands.md"))
        .expect("docs/commands.md");
    let mut checked = 0;
    for row in doc.lines().filter(|l| l.starts_with("| `linger ")) {
        let spans: Vec<&str> = row.split('`').skip(1).step_by(2).collect();
        let command = spans[0].split_whitespace().nth(1).expect("a command");
        let help = Command::new(linger_bin())
            .args([command, "--help"])
            .output()
            .expect("linger --help");
        assert!(help.status.success(), "linger {command} --help: {help:?}");
        let help = String::from_utf8_lossy(&help.stdout);
        // A span naming another command (`linger live --record FILE`) is that command's.
        let own = spans
            .iter()
            .enumerate()
            .filter(|(i, s)| *i == 0 || !s.starts_with("linger "));
        for (_, span) in own {
            for option in options(span) {
                assert!(
                    help.contains(&format!("{option} ")) || help.contains(&format!("{option}\n"))
                        || help.contains(&format!("{option}=")) || help.contains(&format!("{option},")),
                    "docs/commands.md names {option} for `linger {command}`, which does not take it"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} options found: is the table still there?"
    );
}

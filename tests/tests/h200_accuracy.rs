//! BENCHMARKS-H200.md's accuracy table is what the committed fixtures say: regenerate it with
//! the command in its first line when a pass is added.

use linger_tests::accuracy::{table, BEGIN, END};

#[test]
fn the_documents_accuracy_table_is_made_from_the_committed_fixtures() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../BENCHMARKS-H200.md"
    ))
    .expect("BENCHMARKS-H200.md");
    let start = doc.find(BEGIN).expect("the table's first line") + BEGIN.len() + 1;
    let len = doc[start..].find(END).expect("the table's last line");
    assert!(
        doc[start..start + len] == table(),
        "BENCHMARKS-H200.md's accuracy table is not what the fixtures say: \
         cargo run --release -p linger-tests --bin linger-h200-accuracy"
    );
}

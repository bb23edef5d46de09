//! BENCHMARKS-H200.md's table of CUDA calls by mode is what `scripts/h200/cuda_cost.py` printed
//! on the GPU (tests/data/h200/cuda-cost-h100.txt), not a copy that drifted.

use std::fs;

#[test]
fn the_cuda_cost_table_is_the_measured_one() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let printed = fs::read_to_string(format!("{root}/tests/data/h200/cuda-cost-h100.txt"))
        .expect("the measurement");
    let doc = fs::read_to_string(format!("{root}/BENCHMARKS-H200.md")).expect("the benchmarks");
    let table: Vec<&str> = printed.lines().filter(|l| l.starts_with('|')).collect();
    assert!(
        table.len() >= 8,
        "a header, a rule and six modes: {table:?}"
    );
    assert!(
        doc.contains(&table.join("\n")),
        "BENCHMARKS-H200.md does not show the measured table:\n{}",
        table.join("\n")
    );
}

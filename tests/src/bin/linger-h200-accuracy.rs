//! Prints the H200 suite's accuracy table for BENCHMARKS-H200.md, made from the committed
//! fixtures (`linger_tests::accuracy`), between the lines that mark it there.

fn main() {
    println!("{}", linger_tests::accuracy::BEGIN);
    print!("{}", linger_tests::accuracy::table());
    println!("{}", linger_tests::accuracy::END);
}

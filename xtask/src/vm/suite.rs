//! What the guest runs beside the kill scenarios, and how its console marks the results:
//! the image that carries the tests and the checks that read their lines both take it.

/// The host's integration tests (tests/tests/NAME.rs) that need no GPU and no tool the guest's
/// busybox lacks: run in the guest too, so that what they assert holds on kernels that allow
/// fentry and kprobes, not only on the build machine's.
pub const HOST_TESTS: &[&str] = &["doctor", "cli_errors", "gpu_errors"];

/// Integration tests the guest runs on the stand-in driver (its closes sleep, as a GPU's
/// teardown does), once for each strategy: the stock kernel's driver hooks (`hooks`) and the
/// GPU machines' kernel's, without kprobes or fentry (`locked`). init.sh runs each as
/// /standin-test-NAME.
pub const STANDIN_TESTS: &[&str] = &["group_kills"];
/// The strategies STANDIN_TESTS run with, as init.sh names them.
pub const STRATEGIES: [&str; 2] = ["hooks", "locked"];

/// What marks the guest's result lines on the console.
pub const MARK: &str = "LINGER-VM ";

//! What every line of the text report is made of, below both its incident lines (`text.rs`)
//! and its other records' (`text_records.rs`).

/// Where a record's lines after its first begin.
pub(super) const INDENT: &str = "              ";

/// Untrusted text (names any process can choose, and sentences built from them) for a line of
/// the report.
pub(super) fn e(s: &str) -> std::borrow::Cow<'_, str> {
    crate::escape::terminal(s)
}

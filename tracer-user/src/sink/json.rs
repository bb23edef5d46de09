//! One JSON object per line (schema: docs/incident-json.md).

use std::io::Write;

use serde::Serialize;

pub fn write_line(out: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    out.flush()
}

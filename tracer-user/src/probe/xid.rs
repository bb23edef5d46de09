//! The driver's GPU-error tracepoint, nvidia/nvidia_dev_xid: where its fields sit, from its
//! format file. The driver defines the event, so its layout is read, never assumed.

use std::fs;

use tracer_common::XidLayout;

const FORMATS: [&str; 2] = [
    "/sys/kernel/tracing/events/nvidia/nvidia_dev_xid/format",
    "/sys/kernel/debug/tracing/events/nvidia/nvidia_dev_xid/format",
];

/// How the strategy's reasons about GPU errors begin, for whoever prints them.
pub const REASONS: &str = "GPU errors: ";

/// What the kernel log gives, or why it gives nothing: `kmsg` is the result of opening it.
pub fn kmsg_reason(kmsg: Result<(), &std::io::Error>, tracepoint: bool) -> String {
    match (kmsg, tracepoint) {
        (Ok(()), true) => format!("{REASONS}the kernel log (/dev/kmsg): the process of each"),
        (Ok(()), false) => {
            format!("{REASONS}the kernel log (/dev/kmsg): each error and its process")
        }
        (Err(e), true) => {
            format!("{REASONS}not the kernel log (/dev/kmsg: {e}): no error names its process")
        }
        (Err(e), false) => {
            format!("{REASONS}none: no tracepoint, and not the kernel log (/dev/kmsg: {e})")
        }
    }
}

/// The layout of this kernel's nvidia_dev_xid, or why it cannot be traced.
pub fn layout() -> Result<XidLayout, String> {
    let Some(text) = FORMATS.iter().find_map(|p| fs::read_to_string(p).ok()) else {
        return Err("no tracepoint nvidia/nvidia_dev_xid (NVIDIA driver not loaded)".into());
    };
    parse(&text)
}

/// The offsets of `dev`, `msg` (both `__data_loc char[]`) and `error_code` (a 4-byte integer).
fn parse(format: &str) -> Result<XidLayout, String> {
    let field = |name: &str, data_loc: bool| -> Result<u32, String> {
        format
            .lines()
            .filter_map(|l| l.trim().strip_prefix("field:"))
            .find_map(|l| {
                let mut parts = l.split(';').map(str::trim);
                let decl = parts.next()?;
                if decl.rsplit(' ').next() != Some(name)
                    || decl.starts_with("__data_loc") != data_loc
                {
                    return None;
                }
                let value = |key: &str| {
                    l.split(';')
                        .map(str::trim)
                        .find_map(|p| p.strip_prefix(key)?.parse::<u32>().ok())
                };
                (value("size:")? == 4).then(|| value("offset:")).flatten()
            })
            .ok_or_else(|| format!("nvidia_dev_xid's format has no 4-byte field `{name}`"))
    };
    Ok(XidLayout {
        dev: field("dev", true)?,
        msg: field("msg", true)?,
        error_code: field("error_code", false)?,
        _pad: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The H200's, driver 580.159.04 (tests/data/h200/suite/xid, 2026-12-01).
    const FORMAT: &str = "name: nvidia_dev_xid
ID: 2430
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:u32 error_code;\toffset:12;\tsize:4;\tsigned:0;
\tfield:__data_loc char[] msg;\toffset:16;\tsize:4;\tsigned:0;

print fmt: \"Xid (PCI:%s): %u, %s\", __get_str(dev), REC->error_code, __get_str(msg)
";

    #[test]
    fn reads_the_offsets_from_the_format() {
        let l = parse(FORMAT).expect("the H200's format");
        assert_eq!((l.dev, l.error_code, l.msg), (8, 12, 16));
    }

    #[test]
    fn the_kernel_logs_absence_says_what_is_lost() {
        let refused = std::io::Error::from_raw_os_error(1);
        let without = kmsg_reason(Err(&refused), true);
        assert!(without.starts_with(REASONS), "{without}");
        assert!(
            without.contains("/dev/kmsg: Operation not permitted"),
            "{without}"
        );
        assert!(without.contains("no error names its process"), "{without}");
        assert!(kmsg_reason(Err(&refused), false).contains("none"));
        assert!(kmsg_reason(Ok(()), true).contains("the process of each"));
    }

    #[test]
    fn a_format_without_the_message_is_refused() {
        let cut = FORMAT.replace("__data_loc char[] msg", "u64 other");
        assert!(parse(&cut).expect_err("no msg").contains("`msg`"));
    }
}

//! Raw ring buffer records to [`Event`]s.
//!
//! Fields are read one by one with `bytes::Buf` in the kernel's layout (`tracer_common`), so
//! decoding needs no unsafe code and never trusts a record's size beyond its bytes.

use bytes::Buf;
use tracer_common::{
    FdOp, Header, Kind, ReapHow, SampleKind, COMM_LEN, FD_CLOEXEC, FD_WALK_TRUNCATED,
    FORK_FILES_SHARED,
};

use crate::{
    escape,
    event::{Event, EventData, HookKind},
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("record kind {kind} needs {need} bytes, has {have}")]
    Truncated { kind: u16, need: usize, have: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u16),
    #[error("{0} has the invalid value {1}")]
    BadField(&'static str, u32),
}

pub fn decode(mut buf: &[u8]) -> Result<Event, DecodeError> {
    let total = buf.len();
    let header_len = std::mem::size_of::<Header>();
    if total < header_len {
        return Err(DecodeError::Short(total));
    }
    let kind_id = buf.get_u16_le();
    let _size = buf.get_u16_le();
    let cpu = buf.get_u32_le();
    let ts_ns = buf.get_u64_le();
    let pid = buf.get_u32_le();
    let tid = buf.get_u32_le();
    let kind = Kind::from_u16(kind_id).ok_or(DecodeError::UnknownKind(kind_id))?;
    let need = payload_len(kind);
    if buf.remaining() < need {
        return Err(DecodeError::Truncated {
            kind: kind_id,
            need: header_len + need,
            have: total,
        });
    }
    let data = match kind {
        Kind::SignalGenerate => {
            let sig = buf.get_u32_le();
            let code = buf.get_i32_le();
            let result = buf.get_i32_le();
            let group = buf.get_u32_le() != 0;
            let target_pid = buf.get_u32_le();
            let target_tid = buf.get_u32_le();
            let target_threads = buf.get_u32_le();
            buf.advance(4);
            EventData::SignalGenerate {
                sig,
                code,
                result,
                group,
                target_pid,
                target_tid,
                target_threads,
                sender_comm: comm(&mut buf),
                target_comm: comm(&mut buf),
            }
        }
        Kind::SignalDeliver => EventData::SignalDeliver {
            sig: buf.get_u32_le(),
            code: buf.get_i32_le(),
            handler: buf.get_u64_le(),
            sa_flags: buf.get_u64_le(),
        },
        Kind::ProcessFork => EventData::Fork {
            child_pid: buf.get_u32_le(),
            files_shared: buf.get_u32_le() & FORK_FILES_SHARED != 0,
            comm: comm(&mut buf),
        },
        Kind::ProcessExec => EventData::Exec {
            comm: comm(&mut buf),
        },
        Kind::TaskExit => EventData::TaskExit {
            exit_code: buf.get_u32_le(),
            group_dead: buf.get_u32_le() != 0,
            comm: comm(&mut buf),
        },
        Kind::Reap => EventData::Reap {
            reaped_pid: buf.get_u32_le(),
            by_wait: buf.get_u32_le() == ReapHow::Wait as u32,
            comm: comm(&mut buf),
        },
        Kind::GpuFd => {
            let op = buf.get_u32_le();
            let op = FdOp::from_u32(op).ok_or(DecodeError::BadField("GpuFd.op", op))?;
            let fd = buf.get_i32_le();
            let dev = buf.get_u32_le();
            let flags = buf.get_u32_le();
            EventData::GpuFd {
                op: op.into(),
                fd,
                dev,
                cloexec: flags & FD_CLOEXEC != 0,
                truncated: flags & FD_WALK_TRUNCATED != 0,
                file: buf.get_u64_le(),
                refcount: buf.get_u64_le(),
            }
        }
        Kind::GpuCloseRange => EventData::GpuCloseRange {
            first: buf.get_u32_le(),
            last: buf.get_u32_le(),
            flags: buf.get_u32_le(),
        },
        Kind::GpuIoctl => EventData::GpuIoctl {
            fd: buf.get_i32_le(),
            cmd: buf.get_u32_le(),
            dev: buf.get_u32_le(),
            ret: buf.get_i32_le(),
            duration_ns: buf.get_u64_le(),
            file: buf.get_u64_le(),
            h_root: buf.get_u32_le(),
            h_parent: buf.get_u32_le(),
            h_object: buf.get_u32_le(),
            h_class: buf.get_u32_le(),
            status: buf.get_u32_le(),
            ctrl_cmd: buf.get_u32_le(),
            size: buf.get_u64_le(),
        },
        Kind::TeardownSample => {
            let kind = buf.get_u32_le();
            let sample = SampleKind::from_u32(kind)
                .ok_or(DecodeError::BadField("TeardownSample.kind", kind))?;
            EventData::TeardownSample {
                sample: sample.into(),
                stack_id: buf.get_i32_le(),
                owner: buf.get_u32_le(),
                tid: buf.get_u32_le(),
                blocked_ns: buf.get_u64_le(),
            }
        }
        Kind::KthreadWakeup => EventData::KthreadWakeup {
            kthread_tid: buf.get_u32_le(),
            owner: buf.get_u32_le(),
            comm: comm(&mut buf),
        },
        Kind::DriverCall => driver_call(&mut buf)?,
        Kind::OomVictim => EventData::OomVictim {
            pid: buf.get_u32_le(),
        },
        Kind::BenchTick => EventData::BenchTick,
    };
    Ok(Event {
        ts_ns,
        cpu,
        pid,
        tid,
        data,
    })
}

fn payload_len(kind: Kind) -> usize {
    use std::mem::size_of;
    use tracer_common as c;
    match kind {
        Kind::SignalGenerate => size_of::<c::SignalGenerate>(),
        Kind::SignalDeliver => size_of::<c::SignalDeliver>(),
        Kind::ProcessFork => size_of::<c::ProcessFork>(),
        Kind::ProcessExec => size_of::<c::ProcessExec>(),
        Kind::TaskExit => size_of::<c::TaskExit>(),
        Kind::Reap => size_of::<c::Reap>(),
        Kind::GpuFd => size_of::<c::GpuFd>(),
        Kind::GpuCloseRange => size_of::<c::GpuCloseRange>(),
        Kind::GpuIoctl => size_of::<c::GpuIoctl>(),
        Kind::TeardownSample => size_of::<c::TeardownSample>(),
        Kind::KthreadWakeup => size_of::<c::KthreadWakeup>(),
        Kind::DriverCall => size_of::<c::DriverCall>(),
        Kind::OomVictim => size_of::<c::OomVictim>(),
        Kind::BenchTick => size_of::<c::BenchTick>(),
    }
}

fn driver_call(buf: &mut &[u8]) -> Result<EventData, DecodeError> {
    use tracer_common::{DriverFunc, CALL_EXIT, HOOK_FENTRY, HOOK_KPROBE};
    let func = buf.get_u32_le();
    let func = DriverFunc::from_u32(func).ok_or(DecodeError::BadField("DriverCall.func", func))?;
    let exit = buf.get_u16_le() == CALL_EXIT;
    let hook = match buf.get_u16_le() {
        HOOK_FENTRY => HookKind::Fentry,
        HOOK_KPROBE => HookKind::Kprobe,
        other => return Err(DecodeError::BadField("DriverCall.hook", other.into())),
    };
    let file = buf.get_u64_le();
    let dev = buf.get_u32_le();
    buf.advance(4);
    Ok(EventData::DriverCall {
        func: func.into(),
        exit,
        hook,
        file,
        dev,
        value: buf.get_i64_le(),
        duration_ns: buf.get_u64_le(),
    })
}

/// A kernel comm: up to 16 bytes, NUL-terminated when shorter; any process sets its own, so
/// bytes that are not UTF-8 are kept as `\xNN`.
fn comm(buf: &mut &[u8]) -> String {
    let raw = &buf[..COMM_LEN];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    let s = escape::bytes(&raw[..end]).into_owned();
    buf.advance(COMM_LEN);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: Kind, payload: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(kind as u16).to_le_bytes());
        v.extend_from_slice(&((24 + payload) as u16).to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&42u64.to_le_bytes());
        v.extend_from_slice(&7u32.to_le_bytes());
        v.extend_from_slice(&8u32.to_le_bytes());
        v
    }

    #[test]
    fn task_exit_round_trips_its_fields() {
        let mut v = header(Kind::TaskExit, 24);
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(b"python3\0\0\0\0\0\0\0\0\0");
        let e = decode(&v).expect("valid record");
        assert_eq!((e.ts_ns, e.cpu, e.pid, e.tid), (42, 1, 7, 8));
        assert_eq!(
            e.data,
            EventData::TaskExit {
                exit_code: 9,
                group_dead: true,
                comm: "python3".into()
            }
        );
    }

    #[test]
    fn a_comm_that_is_not_utf8_keeps_its_bytes_as_escapes() {
        let mut v = header(Kind::TaskExit, 24);
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(b"\x1b]0;pwn\x07\x1b[2J\xff\xc2\x9b\0");
        let e = decode(&v).expect("valid record");
        let EventData::TaskExit { comm, .. } = e.data else {
            panic!("not an exit: {e:?}");
        };
        assert_eq!(comm, "\x1b]0;pwn\x07\x1b[2J\\xff\u{9b}");
    }

    #[test]
    fn truncated_and_unknown_records_are_errors() {
        let v = header(Kind::TaskExit, 24);
        assert!(matches!(
            decode(&v),
            Err(DecodeError::Truncated { kind: 5, .. })
        ));
        assert_eq!(decode(&v[..10]), Err(DecodeError::Short(10)));
        let mut u = header(Kind::TaskExit, 0);
        u[0] = 0xff;
        assert_eq!(decode(&u), Err(DecodeError::UnknownKind(0xff)));
    }

    fn driver_call(func: u32, hook: u16) -> Vec<u8> {
        let mut v = header(Kind::DriverCall, 40);
        v.extend_from_slice(&func.to_le_bytes());
        v.extend_from_slice(&tracer_common::CALL_EXIT.to_le_bytes());
        v.extend_from_slice(&hook.to_le_bytes());
        v.extend_from_slice(&0xffff_8880_0123_4500u64.to_le_bytes());
        v.extend_from_slice(&(195u32 << 20).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(-25i64).to_le_bytes());
        v.extend_from_slice(&1_500u64.to_le_bytes());
        v
    }

    #[test]
    fn driver_call_decodes_and_rejects_unknown_functions_and_hooks() {
        let e = decode(&driver_call(2, tracer_common::HOOK_KPROBE)).expect("valid record");
        assert_eq!(
            e.data,
            EventData::DriverCall {
                func: crate::event::DriverFunc::NvidiaClose,
                exit: true,
                hook: HookKind::Kprobe,
                file: 0xffff_8880_0123_4500,
                dev: 195 << 20,
                value: -25,
                duration_ns: 1_500,
            }
        );
        assert_eq!(
            decode(&driver_call(99, tracer_common::HOOK_FENTRY)),
            Err(DecodeError::BadField("DriverCall.func", 99))
        );
        assert_eq!(
            decode(&driver_call(1, 7)),
            Err(DecodeError::BadField("DriverCall.hook", 7))
        );
    }
}

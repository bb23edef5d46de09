//! Raw ring buffer records to [`Event`]s.
//!
//! Each record is read as its `tracer_common` struct (the one definition of the layout, pinned
//! there field by field) after its length is checked against its kind; fields are then taken
//! by name, never by offset.

use std::mem::size_of;

use tracer_common::{
    self as c, DriverFunc, FdOp, Header, Kind, Payload, ReapHow, SampleKind, Wire, CALL_EXIT,
    COMM_LEN, FD_CLOEXEC, FD_WALK_TRUNCATED, FORK_FILES_SHARED, HOOK_FENTRY, HOOK_KPROBE,
    SIGNAL_TARGET_EXITING, SIGNAL_TO_GROUP,
};

// Trace files hold the kernel's records as written on little-endian machines.
#[cfg(not(target_endian = "little"))]
compile_error!("linger reads records in the byte order of the little-endian kernels it traces");

use crate::{
    escape,
    event::{Event, EventData, HookKind, XidSource},
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

pub fn decode(buf: &[u8]) -> Result<Event, DecodeError> {
    let total = buf.len();
    let header: Header = read(buf).ok_or(DecodeError::Short(total))?;
    let kind = Kind::from_raw(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    let payload = &buf[size_of::<Header>()..];
    if payload.len() < kind.payload_size() {
        return Err(DecodeError::Truncated {
            kind: header.kind,
            need: size_of::<Header>() + kind.payload_size(),
            have: total,
        });
    }
    let data = match kind {
        Kind::SignalGenerate => signal_generate(get(payload)),
        Kind::SignalDeliver => {
            let p: c::SignalDeliver = get(payload);
            EventData::SignalDeliver {
                sig: p.sig,
                code: p.code,
                handler: p.handler,
                sa_flags: p.sa_flags,
            }
        }
        Kind::ProcessFork => {
            let p: c::ProcessFork = get(payload);
            EventData::Fork {
                child_pid: p.child_pid,
                files_shared: p.flags & FORK_FILES_SHARED != 0,
                comm: comm(&p.comm),
            }
        }
        Kind::ProcessExec => EventData::Exec {
            comm: comm(&get::<c::ProcessExec>(payload).comm),
        },
        Kind::TaskExit => {
            let p: c::TaskExit = get(payload);
            EventData::TaskExit {
                exit_code: p.exit_code,
                group_dead: p.group_dead != 0,
                comm: comm(&p.comm),
            }
        }
        Kind::Reap => {
            let p: c::Reap = get(payload);
            EventData::Reap {
                reaped_pid: p.reaped_pid,
                by_wait: p.how == ReapHow::Wait as u32,
                comm: comm(&p.comm),
            }
        }
        Kind::GpuFd => gpu_fd(get(payload))?,
        Kind::GpuCloseRange => {
            let p: c::GpuCloseRange = get(payload);
            EventData::GpuCloseRange {
                first: p.first,
                last: p.last,
                flags: p.flags,
            }
        }
        Kind::GpuIoctl => gpu_ioctl(get(payload)),
        Kind::TeardownSample => teardown_sample(get(payload))?,
        Kind::KthreadWakeup => {
            let p: c::KthreadWakeup = get(payload);
            EventData::KthreadWakeup {
                kthread_tid: p.kthread_tid,
                owner: p.owner,
                comm: comm(&p.comm),
            }
        }
        Kind::DriverCall => driver_call(get(payload))?,
        Kind::OomVictim => EventData::OomVictim {
            pid: get::<c::OomVictim>(payload).pid,
        },
        Kind::GpuXid => gpu_xid(get(payload)),
        Kind::BenchTick => EventData::BenchTick,
    };
    Ok(Event {
        ts_ns: header.ts_ns,
        cpu: header.cpu,
        pid: header.pid,
        tid: header.tid,
        data,
    })
}

fn signal_generate(p: c::SignalGenerate) -> EventData {
    EventData::SignalGenerate {
        sig: p.sig,
        code: p.code,
        result: p.result,
        group: p.flags & SIGNAL_TO_GROUP != 0,
        target_exiting: p.flags & SIGNAL_TARGET_EXITING != 0,
        target_pid: p.target_pid,
        target_tid: p.target_tid,
        target_threads: p.target_threads,
        sender_threads: p.sender_threads,
        sender_comm: comm(&p.sender_comm),
        target_comm: comm(&p.target_comm),
    }
}

fn gpu_fd(p: c::GpuFd) -> Result<EventData, DecodeError> {
    let op = FdOp::from_raw(p.op).ok_or(DecodeError::BadField("GpuFd.op", p.op))?;
    Ok(EventData::GpuFd {
        op: op.into(),
        fd: p.fd,
        dev: p.dev,
        cloexec: p.flags & FD_CLOEXEC != 0,
        truncated: p.flags & FD_WALK_TRUNCATED != 0,
        file: p.file,
        refcount: p.refcount,
    })
}

fn gpu_ioctl(p: c::GpuIoctl) -> EventData {
    EventData::GpuIoctl {
        fd: p.fd,
        cmd: p.cmd,
        dev: p.dev,
        ret: p.ret,
        duration_ns: p.duration_ns,
        file: p.file,
        h_root: p.h_root,
        h_parent: p.h_parent,
        h_object: p.h_object,
        h_class: p.h_class,
        status: p.status,
        ctrl_cmd: p.ctrl_cmd,
        size: p.size,
    }
}

fn teardown_sample(p: c::TeardownSample) -> Result<EventData, DecodeError> {
    let sample =
        SampleKind::from_raw(p.kind).ok_or(DecodeError::BadField("TeardownSample.kind", p.kind))?;
    Ok(EventData::TeardownSample {
        sample: sample.into(),
        stack_id: p.stack_id,
        owner: p.owner,
        tid: p.tid,
        blocked_ns: p.blocked_ns,
    })
}

fn gpu_xid(p: c::GpuXid) -> EventData {
    let message = text(&p.msg.0);
    EventData::GpuXid {
        xid: p.xid,
        pci: text(&p.pci),
        truncated: p.msg_len as usize > message.len() + 1,
        message,
        source: XidSource::Tracepoint,
    }
}

/// The bytes as `T`, or `None` when there are too few: the one place records are read raw.
fn read<T: Wire>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `Wire` types are repr(C) structs of integers and byte arrays, valid for any
    // bytes; the length is checked, and read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A payload whose length was checked against its kind.
fn get<T: Payload>(payload: &[u8]) -> T {
    read(payload).unwrap_or_default()
}

fn driver_call(p: c::DriverCall) -> Result<EventData, DecodeError> {
    let func =
        DriverFunc::from_raw(p.func).ok_or(DecodeError::BadField("DriverCall.func", p.func))?;
    let hook = match p.hook {
        HOOK_FENTRY => HookKind::Fentry,
        HOOK_KPROBE => HookKind::Kprobe,
        other => return Err(DecodeError::BadField("DriverCall.hook", other.into())),
    };
    Ok(EventData::DriverCall {
        func: func.into(),
        exit: p.phase == CALL_EXIT,
        hook,
        file: p.file,
        dev: p.dev,
        value: p.value,
        duration_ns: p.duration_ns,
    })
}

/// A kernel comm: up to 16 bytes, NUL-terminated when shorter; any process sets its own, so
/// bytes that are not UTF-8 are kept as `\xNN`.
fn comm(raw: &[u8; COMM_LEN]) -> String {
    text(raw)
}

/// A NUL-padded string field, its odd bytes escaped.
fn text(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    escape::bytes(&raw[..end]).into_owned()
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

    /// The table's encoder and the decoder agree (the hand-made bytes above pin the layout).
    #[test]
    fn a_record_made_from_its_struct_decodes_to_its_fields() {
        let ioctl = c::GpuIoctl {
            fd: 7,
            cmd: 0xc020_462b,
            h_class: 0x40,
            size: 1 << 30,
            ..Default::default()
        };
        let e = decode(c::Record::new(3, 99, 10, 11, ioctl).as_bytes()).expect("valid record");
        assert_eq!((e.ts_ns, e.cpu, e.pid, e.tid), (99, 3, 10, 11));
        let EventData::GpuIoctl {
            fd,
            cmd,
            h_class,
            size,
            ..
        } = e.data
        else {
            panic!("not an ioctl: {e:?}");
        };
        assert_eq!((fd, cmd, h_class, size), (7, 0xc020_462b, 0x40, 1 << 30));
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

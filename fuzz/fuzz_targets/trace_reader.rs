//! Any bytes through the whole replay path: header, chunk scan and resync, zstd, record
//! framing, the kernel decoder and the event JSON. It may return errors; it must not panic.
#![no_main]

use std::ops::ControlFlow;

use libfuzzer_sys::fuzz_target;
use tracer_user::source::replay::Replay;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut replay) = Replay::new(data) {
        let _ = replay.run(|_| ControlFlow::Continue(()), |_| {});
    }
});

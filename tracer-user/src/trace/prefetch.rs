//! Reads, checks and decompresses chunks on a second thread while the caller decodes the
//! previous ones: zstd and decoding cost about the same per event, so a compressed trace
//! replays about twice as fast on two cores.

use std::{
    io::{self, Read},
    sync::mpsc::{sync_channel, Receiver, SyncSender},
    thread::JoinHandle,
};

use super::reader::{ReadStats, TraceReader};

/// Chunks in flight between the threads.
const DEPTH: usize = 4;

/// A chunk body and the file offset after it.
type Body = io::Result<(Vec<u8>, u64)>;

pub struct Prefetch {
    bodies: Receiver<Body>,
    /// Spent bodies go back for reuse.
    spent: SyncSender<Vec<u8>>,
    reader: Option<JoinHandle<ReadStats>>,
    current: Vec<u8>,
}

impl Prefetch {
    pub fn start<R: Read + Send + 'static>(mut reader: TraceReader<R>) -> Self {
        let (send, bodies) = sync_channel::<Body>(DEPTH);
        let (spent, recycled) = sync_channel::<Vec<u8>>(DEPTH + 2);
        let thread = std::thread::spawn(move || {
            loop {
                let next = match reader.next_chunk() {
                    Ok(Some(chunk)) => {
                        let mut body = recycled.try_recv().unwrap_or_default();
                        body.clear();
                        body.extend_from_slice(chunk.body);
                        Ok((body, chunk.end_offset))
                    }
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                let failed = next.is_err();
                // The receiver is gone when the caller stopped early.
                if send.send(next).is_err() || failed {
                    break;
                }
            }
            reader.stats().clone()
        });
        Self {
            bodies,
            spent,
            reader: Some(thread),
            current: Vec::new(),
        }
    }

    /// The next good chunk's body and the file offset after it; None at the end.
    pub fn next_body(&mut self) -> io::Result<Option<(&[u8], u64)>> {
        let previous = std::mem::take(&mut self.current);
        let _ = self.spent.try_send(previous);
        match self.bodies.recv() {
            Ok(Ok((body, offset))) => {
                self.current = body;
                Ok(Some((&self.current, offset)))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// Stops the reading thread and returns what it met; None after the first call.
    pub fn finish(&mut self) -> Option<ReadStats> {
        // Dropping the receiver unblocks a thread waiting to send.
        let (_, closed) = sync_channel(1);
        self.bodies = closed;
        // A reader that panicked met damage we cannot describe: none reported.
        Some(self.reader.take()?.join().unwrap_or_default())
    }
}

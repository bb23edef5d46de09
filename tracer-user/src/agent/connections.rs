//! The metrics endpoint's open connections, at most a fixed number: a new one past the limit
//! takes the place of the one that has waited longest for a request (as nginx drops idle
//! keep-alive connections when it runs out), so clients that connect and send nothing, or
//! send their headers a byte at a time, never keep out a scraper that asks at once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::task::AbortHandle;

/// What a connection is doing; waiting ones go first when room is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// The TLS handshake, or a request's headers, not complete yet; or idle between requests.
    Waiting,
    /// A request being answered (a client that does not read its answer stays here).
    Answering,
}

struct Slot {
    /// When the current phase began, in the order of `Table::clock`.
    phase: (Phase, u64),
    abort: Option<AbortHandle>,
}

#[derive(Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    next_id: u64,
    clock: u64,
}

impl Table {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

/// The open connections, shared by the accept loop and the connections' tasks.
#[derive(Clone)]
pub struct Connections {
    table: Arc<Mutex<Table>>,
    limit: usize,
}

impl Connections {
    pub fn new(limit: usize) -> Self {
        Self {
            table: Arc::default(),
            limit: limit.max(1),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding it; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for a new connection (closing the one that has waited longest, or else the
    /// one that has been answered longest), counts it in and starts it: `start` spawns its
    /// task, which keeps the ticket (dropped, it counts the connection out).
    pub fn admit(&self, start: impl FnOnce(Ticket) -> AbortHandle) {
        let id = {
            let mut t = self.table();
            while t.slots.len() >= self.limit {
                let Some(oldest) = t
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| s.phase)
                    .map(|(id, _)| *id)
                else {
                    break;
                };
                if let Some(abort) = t.slots.remove(&oldest).and_then(|s| s.abort) {
                    abort.abort();
                }
            }
            let id = t.next_id;
            t.next_id += 1;
            let now = t.tick();
            t.slots.insert(
                id,
                Slot {
                    phase: (Phase::Waiting, now),
                    abort: None,
                },
            );
            id
        };
        let abort = start(Ticket {
            id,
            connections: self.clone(),
        });
        match self.table().slots.get_mut(&id) {
            Some(slot) => slot.abort = Some(abort),
            // Gone already.
            None => abort.abort(),
        }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.table().slots.len()
    }
}

/// One connection's place in the table.
pub struct Ticket {
    id: u64,
    connections: Connections,
}

impl Ticket {
    /// A request's headers are in: answering it until [`Ticket::waiting`].
    pub fn answering(&self) {
        self.set(Phase::Answering);
    }

    /// The answer is written: waiting for the next request.
    pub fn waiting(&self) {
        self.set(Phase::Waiting);
    }

    fn set(&self, phase: Phase) {
        let mut t = self.connections.table();
        let now = t.tick();
        if let Some(slot) = t.slots.get_mut(&self.id) {
            slot.phase = (phase, now);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.connections.table().slots.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::Connections;

    #[tokio::test]
    async fn the_longest_waiting_connection_makes_room_and_an_answered_one_goes_last() {
        let c = Connections::new(3);
        let spawn = |c: &Connections| {
            let mut started = None;
            c.admit(|ticket| {
                let task = tokio::spawn(std::future::pending::<()>());
                let abort = task.abort_handle();
                started = Some((ticket, task));
                abort
            });
            started.expect("started")
        };
        let (answered, answered_task) = spawn(&c);
        answered.answering();
        let (_idle, idle_task) = spawn(&c);
        let (_newer, newer_task) = spawn(&c);
        assert_eq!(c.open(), 3);
        // Full: the oldest waiting one goes, not the one being answered (older still).
        let (_next, _next_task) = spawn(&c);
        assert_eq!(c.open(), 3);
        assert!(idle_task.await.expect_err("closed").is_cancelled());
        assert!(!answered_task.is_finished());
        // Once the answered one waits again, its wait is the newest.
        answered.waiting();
        let (_last, _last_task) = spawn(&c);
        assert!(newer_task.await.expect_err("closed").is_cancelled());
        assert!(!answered_task.is_finished());
        drop(answered);
        assert_eq!(c.open(), 2, "a connection's end frees its place");
    }
}

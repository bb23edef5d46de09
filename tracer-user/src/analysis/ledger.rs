//! What each open GPU file has allocated through the driver, from decoded RM ioctls.
//!
//! RM objects live in a client (hRoot); freeing an object frees its descendants, and all of a
//! client's objects go when the file that created the client is released. The ledger follows
//! that tree and attributes each allocation to the file that created its client.

use std::collections::HashMap;

use serde::Serialize;
use tracer_common::driver::{
    self, NV01_MEMORY_LOCAL_PHYSICAL, NV01_MEMORY_LOCAL_PRIVILEGED, NV01_MEMORY_LOCAL_USER,
    NV01_MEMORY_SYSTEM, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, NV01_ROOT, NV01_ROOT_CLIENT,
    NV01_ROOT_NON_PRIV, NV50_MEMORY_VIRTUAL, NV_MEMORY_FABRIC,
};

use super::holders::FileId;
use crate::event::{Event, EventData};

#[derive(Clone, Debug)]
struct Object {
    parent: u32,
    class: u32,
    size: u64,
}

/// Bytes by kind of memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bytes {
    /// Physical video memory (classes 0x40 and kin).
    pub video: u64,
    /// System memory mapped for the GPU (0x3E).
    pub system: u64,
    /// GPU virtual address reservations (0x50A0): not physical memory.
    pub virtual_reserved: u64,
}

/// One class's live allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClassTotal {
    pub class: String,
    pub name: &'static str,
    pub count: u64,
    pub bytes: u64,
    pub largest: u64,
}

/// An allocation the driver refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedAlloc {
    pub pid: u32,
    pub t_ns: u64,
    pub class: String,
    pub size: u64,
    pub status: String,
}

#[derive(Default)]
pub struct Ledger {
    /// Live objects by client, then handle: a client goes (or is scanned) as a whole.
    objects: HashMap<u32, HashMap<u32, Object>>,
    /// Client handle → the file whose ioctl created it.
    clients: HashMap<u32, FileId>,
    failed: Vec<FailedAlloc>,
}

impl Ledger {
    pub fn on_event(&mut self, e: &Event) {
        let EventData::GpuIoctl {
            cmd,
            file,
            h_root,
            h_parent,
            h_object,
            h_class,
            status,
            size,
            ..
        } = &e.data
        else {
            return;
        };
        let nr = if *cmd <= 0xff {
            *cmd
        } else {
            driver::ioc_nr(*cmd)
        };
        match nr {
            driver::RM_ALLOC | driver::RM_ALLOC_MEMORY => {
                if *status != 0 {
                    if *size > 0 {
                        self.failed.push(FailedAlloc {
                            pid: e.pid,
                            t_ns: e.ts_ns,
                            class: format!("{h_class:#x}"),
                            size: *size,
                            status: status_name(*status),
                        });
                    }
                    return;
                }
                if matches!(*h_class, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT) {
                    self.clients.insert(*h_object, *file);
                }
                self.clients.entry(*h_root).or_insert(*file);
                self.objects.entry(*h_root).or_default().insert(
                    *h_object,
                    Object {
                        parent: *h_parent,
                        class: *h_class,
                        size: *size,
                    },
                );
            }
            driver::RM_FREE if *status == 0 => self.free(*h_root, *h_object),
            _ => {}
        }
    }

    /// Frees `handle` of `client` and everything below it (the whole client when it is the
    /// client handle itself).
    fn free(&mut self, client: u32, handle: u32) {
        if handle == client {
            self.objects.remove(&client);
            self.clients.remove(&client);
            return;
        }
        let Some(objects) = self.objects.get_mut(&client) else {
            return;
        };
        let mut doomed = vec![handle];
        while let Some(h) = doomed.pop() {
            objects.remove(&h);
            doomed.extend(
                objects
                    .iter()
                    .filter(|(_, o)| o.parent == h)
                    .map(|(child, _)| *child),
            );
        }
    }

    /// The files' last references are gone: the driver frees their clients.
    pub fn release_files(&mut self, files: &[FileId]) {
        let gone: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, f)| files.contains(f))
            .map(|(c, _)| *c)
            .collect();
        for client in gone {
            self.free(client, client);
        }
    }

    fn live_of<'a>(&'a self, files: &'a [FileId]) -> impl Iterator<Item = &'a Object> + 'a {
        self.objects
            .iter()
            .filter(move |(c, _)| self.clients.get(c).is_some_and(|f| files.contains(f)))
            .flat_map(|(_, objects)| objects.values())
    }

    /// Live allocations of the clients created through `files`.
    pub fn bytes(&self, files: &[FileId]) -> Bytes {
        let mut b = Bytes::default();
        for o in self.live_of(files) {
            match o.class {
                NV01_MEMORY_LOCAL_USER
                | NV01_MEMORY_LOCAL_PRIVILEGED
                | NV01_MEMORY_LOCAL_PHYSICAL
                | NV_MEMORY_FABRIC => b.video += o.size,
                NV01_MEMORY_SYSTEM | NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => b.system += o.size,
                NV50_MEMORY_VIRTUAL => b.virtual_reserved += o.size,
                _ => {}
            }
        }
        b
    }

    /// Per memory class totals for `files`, largest first.
    pub fn classes(&self, files: &[FileId]) -> Vec<ClassTotal> {
        let mut by: HashMap<u32, ClassTotal> = HashMap::new();
        for o in self.live_of(files).filter(|o| o.size > 0) {
            let t = by.entry(o.class).or_insert_with(|| ClassTotal {
                class: format!("{:#x}", o.class),
                name: class_name(o.class),
                count: 0,
                bytes: 0,
                largest: 0,
            });
            t.count += 1;
            t.bytes += o.size;
            t.largest = t.largest.max(o.size);
        }
        let mut v: Vec<_> = by.into_values().collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.class.cmp(&b.class)));
        v
    }

    /// Allocations of processes other than `pid` refused in `[from, to]`: the collateral of
    /// `pid`'s memory being held then.
    pub fn refused_others(&self, pid: u32, from: u64, to: u64) -> Vec<FailedAlloc> {
        self.failed
            .iter()
            .filter(|f| f.pid != pid && (from..=to).contains(&f.t_ns))
            .cloned()
            .collect()
    }
}

pub fn class_name(class: u32) -> &'static str {
    match class {
        NV01_MEMORY_LOCAL_USER => "NV01_MEMORY_LOCAL_USER",
        NV01_MEMORY_SYSTEM => "NV01_MEMORY_SYSTEM",
        NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
        NV01_MEMORY_LOCAL_PRIVILEGED => "NV01_MEMORY_LOCAL_PRIVILEGED",
        NV01_MEMORY_LOCAL_PHYSICAL => "NV01_MEMORY_LOCAL_PHYSICAL",
        NV_MEMORY_FABRIC => "NV_MEMORY_FABRIC",
        NV50_MEMORY_VIRTUAL => "NV50_MEMORY_VIRTUAL",
        driver::NV01_MEMORY_DEVICELESS => "NV01_MEMORY_DEVICELESS",
        _ => "",
    }
}

pub fn status_name(status: u32) -> String {
    match status {
        driver::NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY".into(),
        s => format!("{s:#x}"),
    }
}

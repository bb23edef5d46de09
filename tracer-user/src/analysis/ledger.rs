//! What each open GPU file has allocated through the driver, from decoded RM ioctls.
//!
//! RM objects live in a client (hRoot); freeing an object frees its descendants, and all of a
//! client's objects go when the file that created the client is released. The ledger follows
//! that tree and attributes each allocation to the file that created its client.
//!
//! It also keeps what crosses processes: objects another client duplicated (RM_DUP_OBJECT,
//! legacy CUDA IPC handles) and objects exported to and imported from file descriptors
//! (cuMem shareable handles, NCCL, PyTorch's expandable segments): memory such an importer
//! holds outlives its exporter's files.

use std::collections::{BTreeMap, VecDeque};

use tracer_common::driver::{
    self, gpu_id_pci, id_info_of, CTRL_GPU_GET_ID_INFO, NV01_DEVICE_0, NV01_MEMORY_LOCAL_PHYSICAL,
    NV01_MEMORY_LOCAL_PRIVILEGED, NV01_MEMORY_LOCAL_USER, NV01_MEMORY_SYSTEM,
    NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, NV01_ROOT, NV01_ROOT_CLIENT, NV01_ROOT_NON_PRIV,
    NV50_MEMORY_VIRTUAL, NV_MEMORY_FABRIC,
};

pub use super::incident::{Bytes, ClassTotal, FailedAlloc};
use super::{gpu_errors, holders::FileId, id_map::IdMap, memory::ImportVia};
use crate::event::{Event, EventData, GpuInfo};

/// NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD and the batch form EXPORT_OBJECTS_TO_FD.
const CTRL_EXPORT_TO_FD: [u32; 2] = [0x3d05, 0x3d0b];
/// NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD and IMPORT_OBJECTS_FROM_FD.
const CTRL_IMPORT_FROM_FD: [u32; 2] = [0x3d06, 0x3d0c];
/// The RM controls the ledger has a rule for.
enum Control {
    GpuIdInfo,
    ExportToFd,
    ImportFromFd,
}

fn control(ctrl_cmd: u32) -> Option<Control> {
    let ctrl = ctrl_cmd & 0xffff;
    if CTRL_GPU_GET_ID_INFO.contains(&ctrl_cmd) {
        Some(Control::GpuIdInfo)
    } else if CTRL_EXPORT_TO_FD.contains(&ctrl) {
        Some(Control::ExportToFd)
    } else if CTRL_IMPORT_FROM_FD.contains(&ctrl) {
        Some(Control::ImportFromFd)
    } else {
        None
    }
}

/// The escape code of an ioctl command (the UVM's are plain numbers).
pub fn escape_nr(cmd: u32) -> u32 {
    if cmd <= 0xff {
        cmd
    } else {
        driver::ioc_nr(cmd)
    }
}

/// A successful RM control that no rule of the analysis reads: most of a CUDA program's
/// driver calls. Fixture traces may leave these out (`linger-trace-trim`).
pub fn is_unread_control(data: &EventData) -> bool {
    matches!(data, EventData::GpuIoctl { cmd, status: 0, ctrl_cmd, .. }
        if escape_nr(*cmd) == driver::RM_CONTROL && control(*ctrl_cmd).is_none())
}

/// Allocations kept for telling an allocation from an import in NVML's figures.
const RECENT_NS: u64 = 30_000_000_000;

/// An object of one client duplicated into another's.
#[derive(Clone, Debug)]
struct Dup {
    pid: u32,
    client: u32,
    handle: u32,
    src_client: u32,
    src_handle: u32,
}

/// A process that imported another's objects, as the ledger saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportSeen {
    pub importer: u32,
    /// The imported objects' size, when the ledger knows it.
    pub bytes: Option<u64>,
    pub via: ImportVia,
    pub t_ns: u64,
    /// The importer's duplicates of the victim's objects, (client, handle): while one lives,
    /// it holds the memory.
    pub dups: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
struct Object {
    parent: u32,
    class: u32,
    size: u64,
    /// The device instance of the NV01_DEVICE_0 it is below (or is), where the ledger saw it.
    device: Option<u32>,
}

/// Video memory the ledger saw on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerPart {
    /// The driver's device instance (NV01_DEVICE_0) it is below; None where the ledger did
    /// not see that object made.
    pub device_instance: Option<u32>,
    /// NVML's index of that GPU, where known (see [`Ledger::parts`]).
    pub gpu: Option<u32>,
    /// Its PCI address, where the driver named the instance.
    pub pci_bus_id: Option<String>,
    pub bytes: u64,
}

#[derive(Default)]
pub struct Ledger {
    /// Live objects by client, then handle: a client goes (or is scanned) as a whole.
    objects: IdMap<u32, IdMap<u32, Object>>,
    /// Client handle → the file whose ioctl created it.
    clients: IdMap<u32, FileId>,
    /// Client handle → the process that created it.
    creators: IdMap<u32, u32>,
    failed: Vec<FailedAlloc>,
    /// Duplicates of other clients' objects still alive, with when they were made.
    dups: Vec<(Dup, u64)>,
    /// (pid, client, when) of exports to and imports from file descriptors.
    fd_exports: Vec<(u32, u32, u64)>,
    fd_imports: Vec<(u32, u32, u64)>,
    /// Recent video memory taken on, by allocation or duplication: (when, pid, bytes).
    recent: VecDeque<(u64, u32, u64)>,
    /// Device instance → the RM's gpu id (PCI domain, bus, device), from GET_ID_INFO
    /// controls: instances are the driver's, numbered as GPUs were initialised.
    gpu_ids: IdMap<u32, u32>,
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
            ctrl_cmd,
            size,
            ..
        } = &e.data
        else {
            return;
        };
        match escape_nr(*cmd) {
            driver::RM_ALLOC | driver::RM_ALLOC_MEMORY => {
                if *status != 0 {
                    if *size > 0 && *h_class != NV01_DEVICE_0 {
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
                // A device object's `size` is its device instance.
                let (size, device) = if *h_class == NV01_DEVICE_0 {
                    (0, Some(*size as u32))
                } else {
                    let parent = self.objects.get(h_root).and_then(|o| o.get(h_parent));
                    (*size, parent.and_then(|p| p.device))
                };
                if matches!(*h_class, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT) {
                    self.clients.insert(*h_object, *file);
                    self.creators.insert(*h_object, e.pid);
                }
                if is_video(*h_class) {
                    self.took(e.ts_ns, e.pid, size);
                }
                self.clients.entry(*h_root).or_insert(*file);
                self.objects.entry(*h_root).or_default().insert(
                    *h_object,
                    Object {
                        parent: *h_parent,
                        class: *h_class,
                        size,
                        device,
                    },
                );
            }
            driver::RM_FREE if *status == 0 => self.free(*h_root, *h_object),
            driver::RM_DUP_OBJECT if *status == 0 => {
                self.clients.entry(*h_root).or_insert(*file);
                // NVML charges a duplicate of video memory to the process that made it.
                let size = self.video_size(*ctrl_cmd, *h_class).unwrap_or(0);
                self.took(e.ts_ns, e.pid, size);
                let dup = Dup {
                    pid: e.pid,
                    client: *h_root,
                    handle: *h_object,
                    src_client: *ctrl_cmd,
                    src_handle: *h_class,
                };
                self.dups.push((dup, e.ts_ns));
            }
            driver::RM_CONTROL if *status == 0 => match control(*ctrl_cmd) {
                Some(Control::GpuIdInfo) => {
                    // Traces recorded before the decode carry 0: no GPU's id.
                    let (gpu_id, instance) = id_info_of(*size);
                    if gpu_id != 0 {
                        self.gpu_ids.insert(instance, gpu_id);
                    }
                }
                Some(Control::ExportToFd) => self.fd_exports.push((e.pid, *h_root, e.ts_ns)),
                Some(Control::ImportFromFd) => self.fd_imports.push((e.pid, *h_root, e.ts_ns)),
                None => {}
            },
            _ => {}
        }
    }

    /// `pid` took on `bytes` of video memory at `t_ns`.
    fn took(&mut self, t_ns: u64, pid: u32, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.recent.push_back((t_ns, pid, bytes));
        while self.recent.front().is_some_and(|r| r.0 + RECENT_NS < t_ns) {
            self.recent.pop_front();
        }
    }

    /// The size of video memory object `handle` of `client`, where the ledger knows it.
    fn video_size(&self, client: u32, handle: u32) -> Option<u64> {
        self.objects
            .get(&client)
            .and_then(|o| o.get(&handle))
            .filter(|o| is_video(o.class))
            .map(|o| o.size)
    }

    /// Whether one of these duplicates, (client, handle), is still alive.
    pub fn holds_dups(&self, dups: &[(u32, u32)]) -> bool {
        self.dups
            .iter()
            .any(|(d, _)| dups.contains(&(d.client, d.handle)))
    }

    /// Who imported objects of the clients created through `files` (the victim's), and how
    /// much where known. An fd import counts when it came after one of the victim's exports.
    pub fn imports_from(&self, files: &[FileId]) -> Vec<ImportSeen> {
        let mine = |client: &u32| self.clients.get(client).is_some_and(|f| files.contains(f));
        let mut out: Vec<ImportSeen> = Vec::new();
        for (d, t_ns) in &self.dups {
            if !mine(&d.src_client) || mine(&d.client) {
                continue;
            }
            let size = self.video_size(d.src_client, d.src_handle);
            let dup = (d.client, d.handle);
            match out
                .iter_mut()
                .find(|i| i.importer == d.pid && i.via == ImportVia::DupObject)
            {
                Some(i) => {
                    i.bytes = Some(i.bytes.unwrap_or(0) + size.unwrap_or(0));
                    i.dups.push(dup);
                }
                None => out.push(ImportSeen {
                    importer: d.pid,
                    bytes: size,
                    via: ImportVia::DupObject,
                    t_ns: *t_ns,
                    dups: vec![dup],
                }),
            }
        }
        let exported = self
            .fd_exports
            .iter()
            .filter(|(_, client, _)| mine(client))
            .map(|(_, _, t)| *t)
            .min();
        if let Some(first_export) = exported {
            for (pid, client, t_ns) in &self.fd_imports {
                if *t_ns >= first_export && !mine(client) && !out.iter().any(|i| i.importer == *pid)
                {
                    out.push(ImportSeen {
                        importer: *pid,
                        bytes: None,
                        via: ImportVia::FdImport,
                        t_ns: *t_ns,
                        dups: Vec::new(),
                    });
                }
            }
        }
        out
    }

    /// Whether the ledger sees `pid`'s driver calls: it created a client that is still live.
    pub fn traces(&self, pid: u32) -> bool {
        self.creators.values().any(|p| *p == pid)
    }

    /// Processes that created the clients of `files` (the owners of their memory).
    pub fn allocators(&self, files: &[FileId]) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, f)| files.contains(f))
            .filter_map(|(c, _)| self.creators.get(c).copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Video memory `pid` took on in `[from, to]`, by allocating or duplicating it.
    pub fn taken_on(&self, pid: u32, from: u64, to: u64) -> u64 {
        self.recent
            .iter()
            .filter(|(t, p, _)| *p == pid && (from..=to).contains(t))
            .map(|(_, _, b)| b)
            .sum()
    }

    /// Frees `handle` of `client` and everything below it (the whole client when it is the
    /// client handle itself).
    fn free(&mut self, client: u32, handle: u32) {
        if handle == client {
            self.objects.remove(&client);
            self.clients.remove(&client);
            self.creators.remove(&client);
            self.dups.retain(|(d, _)| d.client != client);
            self.fd_imports.retain(|(_, c, _)| *c != client);
            self.fd_exports.retain(|(_, c, _)| *c != client);
            return;
        }
        self.dups
            .retain(|(d, _)| !(d.client == client && d.handle == handle));
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
                c if is_video(c) => b.video += o.size,
                NV01_MEMORY_SYSTEM | NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => b.system += o.size,
                NV50_MEMORY_VIRTUAL => b.virtual_reserved += o.size,
                _ => {}
            }
        }
        b
    }

    /// Live video memory of the clients created through `files`, by the device instance it
    /// is on (None: below no device object the ledger saw).
    fn video_by_device(&self, files: &[FileId]) -> BTreeMap<Option<u32>, u64> {
        let mut by: BTreeMap<Option<u32>, u64> = BTreeMap::new();
        for o in self
            .live_of(files)
            .filter(|o| is_video(o.class) && o.size > 0)
        {
            *by.entry(o.device).or_default() += o.size;
        }
        by
    }

    /// Live video memory of the clients created through `files`, on each GPU. A device
    /// instance is the GPU whose PCI address the driver gave as its gpu id in a GET_ID_INFO
    /// control (CUDA asks at initialisation); without one, `only`, the only GPU there is.
    /// Instances follow the order GPUs were initialised in, not NVML's order or the minor
    /// numbers, so nothing else places them.
    pub fn parts(&self, files: &[FileId], gpus: &[GpuInfo], only: Option<u32>) -> Vec<LedgerPart> {
        self.video_by_device(files)
            .into_iter()
            .map(|(instance, bytes)| {
                let pci = instance.and_then(|i| self.gpu_ids.get(&i)).map(|id| {
                    let (domain, bus, device) = gpu_id_pci(*id);
                    format!("{domain:04x}:{bus:02x}:{device:02x}.0")
                });
                let gpu = match &pci {
                    Some(pci) if !gpus.is_empty() => gpu_errors::device(gpus, pci).map(|g| g.index),
                    _ => only,
                };
                LedgerPart {
                    device_instance: instance,
                    gpu,
                    pci_bus_id: pci,
                    bytes,
                }
            })
            .collect()
    }

    /// Per memory class totals for `files`, largest first.
    pub fn classes(&self, files: &[FileId]) -> Vec<ClassTotal> {
        let mut by: IdMap<u32, ClassTotal> = IdMap::default();
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

/// Physical video memory classes.
fn is_video(class: u32) -> bool {
    matches!(
        class,
        NV01_MEMORY_LOCAL_USER
            | NV01_MEMORY_LOCAL_PRIVILEGED
            | NV01_MEMORY_LOCAL_PHYSICAL
            | NV_MEMORY_FABRIC
    )
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

#[cfg(test)]
pub(super) mod tests {
    use tracer_common::driver::{id_info_size, NV20_SUBDEVICE_0};

    use super::*;

    const GIB: u64 = 1 << 30;
    pub const FILE: FileId = 0xffff_8880_0000_1000;
    pub const CLIENT: u32 = 0xc1d0_0001;

    /// A successful RM escape of client CLIENT through FILE (for RM_CONTROL, `class` is the
    /// control's command).
    pub fn rm_event(cmd: u32, parent: u32, object: u32, class: u32, size: u64) -> EventData {
        EventData::GpuIoctl {
            fd: 3,
            cmd,
            dev: 195 << 20 | 255,
            ret: 0,
            duration_ns: 0,
            file: FILE,
            h_root: CLIENT,
            h_parent: parent,
            h_object: object,
            h_class: class,
            status: 0,
            ctrl_cmd: if cmd == driver::RM_CONTROL { class } else { 0 },
            size,
        }
    }

    fn rm(ledger: &mut Ledger, cmd: u32, parent: u32, object: u32, class: u32, size: u64) {
        ledger.on_event(&Event {
            ts_ns: 1,
            cpu: 0,
            pid: 10,
            tid: 10,
            data: rm_event(cmd, parent, object, class, size),
        });
    }

    fn gpu(index: u32, pci: &str) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            model: "H200".into(),
            pci_bus_id: pci.into(),
            minor: Some(index),
        }
    }

    /// Device instances follow the order GPUs were initialised in: here NVML's GPU1 is
    /// instance 0. Memory below a device, or below its subdevice, is that GPU's.
    #[test]
    fn video_memory_is_placed_on_the_gpu_the_driver_named_its_device_instance_for() {
        let mut l = Ledger::default();
        let alloc = driver::RM_ALLOC;
        rm(&mut l, alloc, 0, CLIENT, NV01_ROOT_CLIENT, 0);
        // GET_ID_INFO: bus 0x3b is instance 0, bus 0x1b instance 1.
        rm(
            &mut l,
            driver::RM_CONTROL,
            0,
            CLIENT,
            0x202,
            id_info_size(0x3b00, 0),
        );
        rm(
            &mut l,
            driver::RM_CONTROL,
            0,
            CLIENT,
            0x205,
            id_info_size(0x1b00, 1),
        );
        rm(&mut l, alloc, CLIENT, 0xd0, NV01_DEVICE_0, 1);
        rm(&mut l, alloc, CLIENT, 0xd1, NV01_DEVICE_0, 0);
        rm(&mut l, alloc, 0xd1, 0xe1, NV20_SUBDEVICE_0, 0);
        rm(&mut l, alloc, 0xd0, 0x100, NV01_MEMORY_LOCAL_USER, 8 * GIB);
        rm(&mut l, alloc, 0xe1, 0x101, NV01_MEMORY_LOCAL_USER, 4 * GIB);
        // Below an object made before tracing began: no device known.
        rm(&mut l, alloc, 0xbeef, 0x102, NV01_MEMORY_LOCAL_USER, GIB);
        let gpus = [gpu(0, "00000000:1B:00.0"), gpu(1, "00000000:3B:00.0")];
        let parts = l.parts(&[FILE], &gpus, None);
        let part = |instance| parts.iter().find(|p| p.device_instance == instance);
        let on = |instance| part(instance).map(|p| (p.gpu, p.bytes));
        assert_eq!(on(Some(0)), Some((Some(1), 4 * GIB)));
        assert_eq!(on(Some(1)), Some((Some(0), 8 * GIB)));
        assert_eq!(on(None), Some((None, GIB)), "two GPUs: not guessed");
        assert_eq!(
            part(Some(0)).and_then(|p| p.pci_bus_id.as_deref()),
            Some("0000:3b:00.0")
        );
        // The device objects are not memory: the sums are the allocations'.
        assert_eq!(l.bytes(&[FILE]).video, 13 * GIB);
        assert!(l.classes(&[FILE]).iter().all(|c| c.class != "0x80"));
        // A trace recorded before linger named GPUs, with NVML reading one: all of it is there.
        let one = l.parts(&[FILE], &[], Some(0));
        assert!(one.iter().all(|p| p.gpu == Some(0)), "{one:?}");
    }

    /// A device instance the driver never named, without NVML's names: nothing to place it by.
    #[test]
    fn an_unnamed_device_instance_on_several_gpus_is_left_unplaced() {
        let mut l = Ledger::default();
        rm(&mut l, driver::RM_ALLOC, 0, CLIENT, NV01_ROOT_CLIENT, 0);
        rm(&mut l, driver::RM_ALLOC, CLIENT, 0xd0, NV01_DEVICE_0, 1);
        rm(
            &mut l,
            driver::RM_ALLOC,
            0xd0,
            0x100,
            NV01_MEMORY_LOCAL_USER,
            2 * GIB,
        );
        let gpus = [gpu(0, "00000000:1B:00.0"), gpu(1, "00000000:3B:00.0")];
        let parts = l.parts(&[FILE], &gpus, None);
        assert_eq!(parts.len(), 1);
        assert_eq!((parts[0].device_instance, parts[0].gpu), (Some(1), None));
    }
}

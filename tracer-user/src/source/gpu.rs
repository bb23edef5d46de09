//! The live GPU-side inputs: what is held when tracing starts, NVML readings, and /proc facts
//! about GPU holders captured while they are alive. All of them become events, so a recording
//! replays without the machine.

use std::{collections::HashSet, sync::Arc};

use log::{info, warn};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{
    cost::{Cost, Part, Stopwatch},
    kmsg::{KernelLog, KmsgReader},
    nvml::{self, NvmlSampler},
    pace::Pace,
    procfs,
    stacks::StackResolver,
};
use crate::{
    analysis::{memory::NvmlNeed, Demands},
    clock::boottime_ns,
    event::{Event, EventData, FdOp},
    probe::{devices::GpuDevices, Probes},
};

pub struct GpuSources {
    startup: Vec<Event>,
    nvml: Option<(NvmlSampler, UnboundedReceiver<Event>)>,
    /// GPU errors from the kernel log, where the driver's tracepoint is missing.
    kmsg: Option<(KmsgReader, UnboundedReceiver<Event>)>,
    how: procfs::Describe,
    /// Processes whose /proc facts are in the stream already.
    described: HashSet<u32>,
    stacks: Option<StackResolver>,
    /// Set while an incident awaits GPU memory: NVML reads every millisecond and the stack
    /// sampler runs. Shared with the NVML sampler's thread.
    awaited: Arc<Pace>,
    /// No incident is open: the stacks resolved so far can go.
    idle: bool,
    /// `--lean`: no open is traced, so a pid NVML lists for the first time gets a /proc look.
    lean: bool,
    devices: GpuDevices,
    /// Processes whose GPU descriptors were looked up in /proc already.
    looked_up: HashSet<u32>,
    /// The last snapshot group id handed out.
    last_group: u64,
    /// The analysis wants the holders of GPU files searched: a dead holder's files have holders
    /// it does not know.
    search: bool,
    /// The collector's CPU time by part, and the collector thread's clock of it.
    cost: Cost,
    watch: Stopwatch,
}

impl GpuSources {
    /// Snapshots the current holders (and tells the programs about them), starts NVML
    /// unless `nvml` is false or the library is missing, and reads GPU errors from `kmsg`
    /// (the kernel log, opened) when given.
    pub fn start(
        probes: &mut Probes,
        devices: &GpuDevices,
        nvml: bool,
        how: procfs::Describe,
        lean: bool,
        kmsg: Option<KernelLog>,
    ) -> Self {
        let now = boottime_ns();
        let mut data = vec![EventData::GpuDevices {
            majors: devices.majors.clone(),
            devs: devices.devs.clone(),
        }];
        let snapshot = procfs::snapshot(devices, &how);
        let mut described = HashSet::new();
        let mut holders = Vec::new();
        let mut last_group = 0;
        for d in &snapshot {
            match d {
                EventData::SnapshotFd { holder, group, .. } => {
                    holders.push(*holder);
                    last_group = last_group.max(*group);
                }
                EventData::ProcInfo(p) => {
                    described.insert(p.pid);
                }
                _ => {}
            }
        }
        let looked_up: HashSet<u32> = holders.iter().copied().collect();
        if let Err(e) = probes.add_holders(holders) {
            warn!("could not mark the current GPU holders: {e}");
        }
        let stacks = match probes.take_stacks() {
            Ok(map) => Some(StackResolver::new(map)),
            Err(e) => {
                warn!("teardown stacks unavailable: {e}");
                None
            }
        };
        data.extend(snapshot);
        let mut startup: Vec<Event> = data
            .into_iter()
            .map(|data| Event::collector(now, data))
            .collect();
        let awaited = Arc::new(Pace::default());
        let cost = Cost::default();
        let nvml = nvml
            .then(|| {
                let (tx, rx) = unbounded_channel();
                let quiet = if lean {
                    nvml::LEAN_QUIET_PERIOD
                } else {
                    nvml::QUIET_PERIOD
                };
                match NvmlSampler::start(tx, Arc::clone(&awaited), quiet, cost.clone()) {
                    Ok(s) => {
                        info!("{}", s.description);
                        Some((s, rx))
                    }
                    Err(e) => {
                        eprintln!("linger: {e}");
                        None
                    }
                }
            })
            .flatten();
        if let Some((s, _)) = &nvml {
            let gpus = s.identities.clone();
            startup.push(Event::collector(now, EventData::Gpus { gpus }));
        }
        let kmsg = kmsg.and_then(|log| {
            let (tx, rx) = unbounded_channel();
            match KmsgReader::start(log, tx) {
                Ok(r) => Some((r, rx)),
                Err(e) => {
                    warn!("GPU errors will not be seen: reading the kernel log failed: {e}");
                    None
                }
            }
        });
        Self {
            startup,
            nvml,
            kmsg,
            how,
            described,
            stacks,
            awaited,
            idle: true,
            lean,
            devices: devices.clone(),
            looked_up,
            last_group,
            search: false,
            watch: cost.watch(Part::Housekeeping),
            cost,
        }
    }

    /// The collector's CPU time by part so far.
    pub fn cost(&self) -> Cost {
        self.cost.clone()
    }

    /// The collector thread's clock: whoever does a part of the work switches it there.
    pub fn watch(&self) -> Stopwatch {
        self.watch.clone()
    }

    /// What a /proc snapshot found: its holders (sorted, once each), whose groups and
    /// descriptions are now known.
    fn note_snapshot(&mut self, found: &[EventData]) -> Vec<u32> {
        let mut holders = Vec::new();
        for d in found {
            match d {
                EventData::SnapshotFd { holder, group, .. } => {
                    holders.push(*holder);
                    self.last_group = self.last_group.max(*group);
                }
                EventData::ProcInfo(p) => {
                    self.described.insert(p.pid);
                }
                _ => {}
            }
        }
        holders.sort_unstable();
        holders.dedup();
        holders
    }

    /// The NVIDIA driver registered after tracing began: its devices are GPU files from now on.
    /// Who opened them before the system call tracepoints came, from /proc, as snapshot
    /// events after the devices; and those pids, for the kernel's holder set.
    pub fn driver_registered(
        &mut self,
        devices: GpuDevices,
        now_ns: u64,
    ) -> (Vec<Event>, Vec<u32>) {
        let found = procfs::snapshot_of(procfs::others(), &devices, &self.how, self.last_group);
        let holders = self.note_snapshot(&found);
        self.looked_up.extend(holders.iter().copied());
        let mut events = vec![Event::collector(
            now_ns,
            EventData::GpuDevices {
                majors: devices.majors.clone(),
                devs: devices.devs.clone(),
            },
        )];
        events.extend(found.into_iter().map(|d| Event::collector(now_ns, d)));
        self.devices = devices;
        (events, holders)
    }

    /// With `--lean`: the GPU descriptors of pids an NVML reading lists for the first time,
    /// from /proc, as snapshot events; and those pids, for the kernel's holder set.
    pub fn discover(&mut self, reading: &Event) -> (Vec<Event>, Vec<u32>) {
        let EventData::Nvml { gpus } = &reading.data else {
            return (Vec::new(), Vec::new());
        };
        if !self.lean {
            return (Vec::new(), Vec::new());
        }
        let new: Vec<u32> = gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .filter(|pid| self.looked_up.insert(*pid))
            .collect();
        if new.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let found = procfs::snapshot_of(
            new.iter().copied(),
            &self.devices,
            &self.how,
            self.last_group,
        );
        let holders = self.note_snapshot(&found);
        let events = found
            .into_iter()
            .map(|data| Event::collector(reading.ts_ns, data))
            .collect();
        (events, holders)
    }

    /// Events describing the state at start, to go first in the stream.
    pub fn take_startup(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.startup)
    }

    /// The next NVML reading or GPU error from the kernel log (never resolves without
    /// either).
    pub async fn next_side_event(&mut self) -> Option<Event> {
        async fn next(rx: Option<&mut UnboundedReceiver<Event>>) -> Option<Event> {
            match rx {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        }
        let nvml = self.nvml.as_mut().map(|(_, rx)| rx);
        let kmsg = self.kmsg.as_mut().map(|(_, rx)| rx);
        tokio::select! {
            Some(e) = next(nvml) => Some(e),
            Some(e) = next(kmsg) => Some(e),
            else => None,
        }
    }

    /// NVML's driver version and the GPUs it sees, with what the sampler tells of its health
    /// (failed calls, each GPU's last reading); None without NVML.
    pub fn nvml_devices(&self) -> Option<(&str, &[crate::event::GpuInfo], nvml::Health)> {
        self.nvml
            .as_ref()
            .map(|(s, _)| (s.driver.as_str(), s.identities.as_slice(), s.health.clone()))
    }

    /// A reader of the processes holding GPU files now, as at start (for checkpoints).
    pub fn snapshotter(&self) -> procfs::Snapshot {
        let (devices, how) = (self.devices.clone(), self.how.clone());
        Box::new(move || procfs::snapshot(&devices, &how))
    }

    /// Follows what the analysis wants after a batch: how often NVML is read (the answer
    /// walks every watch, thousands in a kill storm, so it is asked once per batch, which
    /// takes a millisecond or two against teardowns of over 100 ms), whether resolved stacks
    /// can go, whether to search.
    pub fn steer(&mut self, demands: Demands) {
        let period = match demands.nvml {
            NvmlNeed::Quiet => None,
            NvmlNeed::Await => Some(nvml::AWAIT_PERIOD),
            NvmlNeed::Confirm(released) => {
                Some(nvml::confirm_period(boottime_ns().saturating_sub(released)))
            }
            NvmlNeed::Fast => Some(nvml::FAST_PERIOD),
        };
        self.awaited.set_period(period);
        self.idle = demands.idle;
        self.search |= demands.search;
    }

    /// When a search is wanted: every process holding GPU files now (from /proc), for the
    /// programs to walk. Who got the files unseen is among them.
    pub fn take_search(&mut self) -> Option<Vec<u32>> {
        if !std::mem::take(&mut self.search) {
            return None;
        }
        let pids = procfs::holding_gpu_files(&self.devices);
        info!(
            "searching {} process(es) holding GPU files for the holders of a dead process's files",
            pids.len()
        );
        Some(pids)
    }

    /// See [`StackResolver::forget_all`], done while the analysis has no open incident, and
    /// [`StackResolver::forget_stale`] otherwise.
    pub fn forget_stacks(&mut self, now_ns: u64) {
        let Some(stacks) = &mut self.stacks else {
            return;
        };
        if self.idle {
            stacks.forget_all();
        } else {
            stacks.forget_stale(now_ns);
        }
    }

    /// /proc facts about a process that just became (or was born) a GPU holder, read now
    /// while it is alive; the symbolized stack of a teardown sample seen for the first time.
    pub fn enrich(&mut self, e: &Event) -> Option<Event> {
        let pid = match &e.data {
            EventData::TeardownSample { .. } => {
                let stacks = self.stacks.as_mut()?;
                return self.watch.within(Part::Stacks, || stacks.resolve(e));
            }
            EventData::GpuFd {
                op: FdOp::Open | FdOp::Dup,
                ..
            } => e.pid,
            EventData::Fork { child_pid, .. } if self.described.contains(&e.pid) => *child_pid,
            EventData::Exec { .. } if self.described.contains(&e.pid) => {
                // A new image: a new command line.
                self.described.remove(&e.pid);
                e.pid
            }
            EventData::TaskExit {
                group_dead: true, ..
            } => {
                self.described.remove(&e.pid);
                return None;
            }
            _ => return None,
        };
        if !self.described.insert(pid) {
            return None;
        }
        procfs::proc_info(pid, &self.how).map(|info| Event {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            pid,
            tid: pid,
            data: EventData::ProcInfo(info),
        })
    }
}

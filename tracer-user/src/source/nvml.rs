//! The NVML sampler: GPU memory and the processes NVML accounts it to, on a thread of its own.
//!
//! Quiet machines are read about once a second; while a killed process's GPU memory is awaited
//! the analysis asks for the pace its moment needs: every few tens of milliseconds where the
//! kernel's release will tell it and NVML only confirms, every millisecond where NVML alone can;
//! and within a CPU budget ([`Budget`]): on a busy node a reading costs milliseconds of CPU.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use log::warn;
use nvml_wrapper::{
    enums::device::UsedGpuMemory, error::NvmlError, struct_wrappers::device::ProcessInfo, Device,
    Nvml,
};
use tokio::sync::mpsc::UnboundedSender;

use super::{
    cost::{thread_cpu_ns, Cost, Part},
    nvml_budget::Budget,
    pace::Pace,
};
use crate::{
    analysis::unheld,
    clock::boottime_ns,
    event::{Event, EventData, GpuInfo, NvmlGpu, NvmlProcess},
};

pub const QUIET_PERIOD: Duration = Duration::from_secs(1);
/// Quiet period with `--lean`: NVML's process list is how new GPU holders are found then.
pub const LEAN_QUIET_PERIOD: Duration = Duration::from_millis(100);
/// While NVML alone can tell when memory comes back.
pub const FAST_PERIOD: Duration = Duration::from_millis(1);
/// While a kernel release awaits NVML's confirmation, at first: NVML's own account of the
/// return counts when it comes within 2 ms of the kernel's release (`NVML_LATE_NS`).
pub const CONFIRM_PERIOD: Duration = Duration::from_millis(2);
/// How long after the release NVML is read every `CONFIRM_PERIOD`; after that, every eighth
/// of the wait so far, up to `AWAIT_PERIOD`. Under a busy node's load NVML stops listing a
/// dead pid up to 700 ms late (FACTS); reading every 2 ms for all that time was most of the
/// collector's NVML work (some release always awaits its word), while only the first readings
/// can time the return.
const CONFIRM_CLOSELY_NS: u64 = 16_000_000;
/// While teardowns the kernel will time are under way.
pub const AWAIT_PERIOD: Duration = Duration::from_millis(20);

/// How often NVML is read for a kernel release `waited_ns` ago that awaits its confirmation.
pub fn confirm_period(waited_ns: u64) -> Duration {
    if waited_ns < CONFIRM_CLOSELY_NS {
        return CONFIRM_PERIOD;
    }
    Duration::from_nanos(waited_ns / 8).clamp(CONFIRM_PERIOD, AWAIT_PERIOD)
}

/// Handle to the sampler thread; dropping it stops the thread.
pub struct NvmlSampler {
    pace: Arc<Pace>,
    thread: Option<thread::JoinHandle<()>>,
    /// Driver version and device names, for the trace header and doctor.
    pub description: String,
    pub driver: String,
    /// Who each GPU is, in the terms dcgm-exporter labels its series with.
    pub identities: Vec<GpuInfo>,
    pub health: Health,
}

/// What the sampler tells of NVML's health as it goes.
#[derive(Clone)]
pub struct Health {
    /// NVML calls that failed while sampling.
    pub errors: Arc<AtomicU64>,
    /// Whether each GPU's last reading succeeded, by NVML index (none yet reads as failed).
    pub up: Arc<[AtomicBool]>,
}

impl NvmlSampler {
    /// Starts sampling into `out`, every `quiet` period or as `pace` asks, charging its thread's CPU time to `cost`; or says why NVML is not available.
    pub fn start(
        out: UnboundedSender<Event>,
        pace: Arc<Pace>,
        quiet: Duration,
        cost: Cost,
    ) -> Result<Self, String> {
        let nvml = open_nvml().map_err(|e| {
            format!("NVML unavailable ({e}); GPU memory comes from kernel data only")
        })?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        let version = nvml.sys_driver_version().unwrap_or_default();
        let description = format!("NVML driver {version}, {count} device(s)");
        let identities = (0..count)
            .filter_map(|index| {
                let d = nvml.device_by_index(index).ok()?;
                Some(GpuInfo {
                    index,
                    uuid: d.uuid().unwrap_or_default(),
                    model: d.name().unwrap_or_default(),
                    pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                    minor: d.minor_number().ok(),
                })
            })
            .collect();
        let health = Health {
            errors: Arc::new(AtomicU64::new(0)),
            up: (0..count).map(|_| AtomicBool::new(false)).collect(),
        };
        let (p, h) = (Arc::clone(&pace), health.clone());
        let thread = thread::Builder::new()
            .name("linger-nvml".into())
            .spawn(move || sample_loop(&nvml, count, quiet, &p, &out, &h, &cost))
            .map_err(|e| format!("starting the NVML thread: {e}"))?;
        Ok(Self {
            pace,
            thread: Some(thread),
            description,
            driver: version,
            identities,
            health,
        })
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.pace.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// NVML from the library the dynamic linker finds, else from a driver root linger searches
/// (the GPU operator's, where no toolkit put the library in this container).
pub fn open_nvml() -> Result<Nvml, nvml_wrapper::error::NvmlError> {
    Nvml::init().or_else(
        |e| match crate::probe::library::find_one("libnvidia-ml.so.1") {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Err(e),
        },
    )
}

/// NVML opened once, for commands that read it without tracing.
pub struct Reader {
    nvml: Nvml,
    count: u32,
}

impl Reader {
    pub fn open() -> Result<Self, String> {
        let nvml = open_nvml().map_err(|e| format!("NVML unavailable: {e}"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        Ok(Self { nvml, count })
    }

    /// The GPUs NVML sees.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// One reading of every GPU NVML could read (a failed one is left out).
    pub fn read(&self) -> Vec<NvmlGpu> {
        self.read_some(|_| true).0
    }

    /// One reading of the GPUs `wanted` picks (by index), and how many of NVML's answers
    /// failed: a GPU with a failed answer is left out, never read as empty.
    pub fn read_some(&self, wanted: impl Fn(u32) -> bool) -> (Vec<NvmlGpu>, u64) {
        let errors = AtomicU64::new(0);
        let gpus = (0..self.count)
            .filter(|&i| wanted(i))
            .filter_map(|i| match self.nvml.device_by_index(i) {
                Ok(d) => read(i, &d, &errors, &Cost::default()),
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    None
                }
            })
            .collect();
        (gpus, errors.into_inner())
    }

    /// Each GPU's UUID and device file minor (`/dev/nvidiaN`), by index; None where NVML
    /// could not say.
    pub fn identities(&self) -> Vec<(u32, Option<String>, Option<u32>)> {
        (0..self.count)
            .map(|i| match self.nvml.device_by_index(i) {
                Ok(d) => (i, d.uuid().ok(), d.minor_number().ok()),
                Err(_) => (i, None, None),
            })
            .collect()
    }
}

/// The NVML library's version; None when it does not load.
pub fn library_version() -> Option<String> {
    open_nvml().ok().and_then(|n| n.sys_nvml_version().ok())
}

fn sample_loop(
    nvml: &Nvml,
    count: u32,
    quiet: Duration,
    pace: &Pace,
    out: &UnboundedSender<Event>,
    health: &Health,
    cost: &Cost,
) {
    let mut spent = thread_cpu_ns();
    let devices: Vec<(u32, Device)> = (0..count)
        .filter_map(|i| match nvml.device_by_index(i) {
            Ok(d) => Some((i, d)),
            Err(e) => {
                warn!("NVML device {i}: {e}; not sampled");
                None
            }
        })
        .collect();
    let mut last = Instant::now() - quiet;
    let mut budget = Budget::new(Instant::now());
    while !pace.is_stopped() {
        let asked = pace.period().map_or(quiet, |p| p.min(quiet));
        let left = asked
            .saturating_sub(last.elapsed())
            .max(budget.wait(Instant::now()));
        if !left.is_zero() {
            pace.sleep(left);
            continue;
        }
        last = Instant::now();
        let before = thread_cpu_ns();
        let gpus: Vec<NvmlGpu> = devices
            .iter()
            .filter_map(|(i, d)| {
                let gpu = read(*i, d, &health.errors, cost);
                if let Some(up) = health.up.get(*i as usize) {
                    up.store(gpu.is_some(), Ordering::Relaxed);
                }
                gpu
            })
            .collect();
        // A GPU NVML failed to read is left out: whatever it holds stays as last read.
        if !gpus.is_empty() {
            let event = Event::collector(boottime_ns(), EventData::Nvml { gpus });
            if out.send(event).is_err() {
                return;
            }
        }
        let now = thread_cpu_ns();
        budget.spend(now.saturating_sub(before), Instant::now());
        cost.add(Part::Nvml, now.saturating_sub(spent));
        spent = now;
    }
}

/// One device's memory and processes; None when NVML failed to say (each failed call counts
/// in `errors`): a failed reading is no reading, never an empty GPU, which would read as every
/// process's memory given back. The process lists' CPU time is charged to `cost` apart.
fn read(index: u32, device: &Device, errors: &AtomicU64, cost: &Cost) -> Option<NvmlGpu> {
    let memory = device.memory_info().map(|m| (m.used, m.total));
    let before = thread_cpu_ns();
    let compute = device.running_compute_processes();
    let graphics = device.running_graphics_processes();
    // The sampler's own total includes this; the part says how much of it the lists are.
    cost.add(Part::NvmlProcesses, thread_cpu_ns().saturating_sub(before));
    let (mut gpu, failures) = answers(index, memory, compute, graphics);
    errors.fetch_add(failures, Ordering::Relaxed);
    if let Some(g) = gpu.as_mut().filter(|g| unheld::looks_idle(g)) {
        // Not every GPU samples it (a MIG instance does not): no figure, no wedge of that kind.
        g.utilization = device.utilization_rates().ok().map(|u| u.gpu);
    }
    gpu
}

type Answer<T> = Result<T, NvmlError>;

/// A GPU's reading from NVML's three answers, and how many of them failed: none if any did
/// (a GPU without graphics contexts may not support listing them: that is an empty list).
fn answers(
    index: u32,
    memory: Answer<(u64, u64)>,
    compute: Answer<Vec<ProcessInfo>>,
    graphics: Answer<Vec<ProcessInfo>>,
) -> (Option<NvmlGpu>, u64) {
    let graphics = match graphics {
        Err(NvmlError::NotSupported) => Ok(Vec::new()),
        other => other,
    };
    let failures = [memory.is_err(), compute.is_err(), graphics.is_err()]
        .iter()
        .filter(|f| **f)
        .count() as u64;
    match (memory, compute, graphics) {
        (Ok((used, total)), Ok(compute), Ok(graphics)) => (
            Some(gpu(index, used, total, compute.into_iter().chain(graphics))),
            0,
        ),
        _ => (None, failures),
    }
}

/// A GPU's reading from NVML's answers: each process once.
fn gpu(index: u32, used: u64, total: u64, listed: impl Iterator<Item = ProcessInfo>) -> NvmlGpu {
    let mut processes: Vec<NvmlProcess> = listed
        .map(|p| NvmlProcess {
            pid: p.pid,
            used: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect();
    processes.sort_by_key(|p| p.pid);
    processes.dedup_by_key(|p| p.pid);
    NvmlGpu {
        utilization: None,
        index,
        used,
        total,
        processes,
    }
}

#[cfg(test)]
mod tests {
    use nvml_wrapper::{enums::device::UsedGpuMemory, error::NvmlError};

    use std::time::Duration;

    use super::{answers, confirm_period, ProcessInfo, AWAIT_PERIOD, CONFIRM_PERIOD};

    #[test]
    fn a_confirmation_is_read_closely_at_first_then_less_as_it_is_late() {
        let ms = |n: u64| n * 1_000_000;
        assert_eq!(confirm_period(0), CONFIRM_PERIOD);
        assert_eq!(confirm_period(ms(15)), CONFIRM_PERIOD);
        assert_eq!(confirm_period(ms(40)), Duration::from_millis(5));
        assert_eq!(confirm_period(ms(700)), AWAIT_PERIOD);
        // 55 readings over NVML's 700 ms lag under load, where every 2 ms took 350.
        let (mut t, mut readings) = (0, 0);
        while t < ms(700) {
            t += confirm_period(t).as_nanos() as u64;
            readings += 1;
        }
        assert_eq!(readings, 55);
    }

    fn process(pid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(1 << 30),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn a_failed_answer_is_no_reading_never_an_empty_gpu() {
        let memory = || Ok((2 << 30, 80 << 30));
        let (gpu, failed) = answers(0, memory(), Ok(vec![process(7)]), Ok(Vec::new()));
        let gpu = gpu.expect("a reading");
        assert_eq!((gpu.used, gpu.processes.len(), failed), (2 << 30, 1, 0));
        // Each way NVML can fail mid-teardown: nothing reads as the memory given back.
        for (m, c, g, n) in [
            (
                Err(NvmlError::Unknown),
                Ok(vec![process(7)]),
                Ok(Vec::new()),
                1,
            ),
            (memory(), Err(NvmlError::Timeout), Ok(Vec::new()), 1),
            (memory(), Ok(vec![process(7)]), Err(NvmlError::GpuLost), 1),
            (
                Err(NvmlError::GpuLost),
                Err(NvmlError::GpuLost),
                Err(NvmlError::GpuLost),
                3,
            ),
        ] {
            let (gpu, failed) = answers(0, m, c, g);
            assert!(gpu.is_none());
            assert_eq!(failed, n);
        }
        let (gpu, failed) = answers(
            0,
            memory(),
            Ok(vec![process(7)]),
            Err(NvmlError::NotSupported),
        );
        assert_eq!((gpu.map(|g| g.processes.len()), failed), (Some(1), 0));
    }
}

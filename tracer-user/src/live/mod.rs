//! The live pipeline: the loaded programs, the GPU-side sources and the collector loop feed
//! the analysis, whose incidents are written out as they come; a recording and a companion
//! (the agent) see the same stream. `linger live`, `record`, `agent` and `demo` are this
//! with different [`Config`]s.

mod companion;
mod config;
mod loss_notice;
mod recording;
pub mod report;

use std::io::Write;

use anyhow::Context;
use log::{debug, info, warn};

pub use self::{
    companion::Companion,
    config::{Config, Recording},
};
use self::{companion::LiveSink, report::Report};
use crate::{
    analysis::{incident::Node, CorrelatorConfig},
    clock::{boottime_ns, WallAnchor},
    event::{Event, EventData, Strategy},
    privileges,
    probe::{strategy, xid, Probes},
    source::{collect, cost::Part, gpu::GpuSources, kernel::KernelSource, kmsg},
    stream::Tap,
};

/// A live run, its programs loaded and attached.
pub struct Live {
    probes: Probes,
    config: Config,
}

impl Live {
    /// Loads and attaches the programs: from here on every death is seen whole.
    pub fn load(config: Config) -> crate::error::Result<Self> {
        let probes = Probes::load(&config.probes)?;
        Ok(Self { probes, config })
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Which deaths make incidents: the demo learns its child's pid only once attached.
    pub fn analysis_mut(&mut self) -> &mut CorrelatorConfig {
        &mut self.config.analysis
    }

    /// Traces until the configured end, writing incidents to `out` and showing the stream to
    /// `companion`; `ready` runs once Ctrl-C would stop it cleanly. Returns how many
    /// incidents were written.
    pub fn run(
        self,
        ready: impl FnOnce(),
        out: &mut impl Write,
        companion: &mut impl Companion,
    ) -> anyhow::Result<usize> {
        let Self { probes, config } = self;
        let anchor = WallAnchor::now();
        let mut recorder = recording::start(&config, &anchor)?;
        let (kmsg, kmsg_reason) = open_kernel_log(&probes);
        // Attached, and the trace file open: from here on only what the collector uses.
        privileges::drop_after_attach(config.probes.sample_hz > 0)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let meta = recording::meta(&config, &anchor);
        let mut report = Report::new(
            out,
            config.output,
            anchor,
            config.analysis.clone(),
            this_node(&config),
        );
        report.keep_written();
        let mut chosen = probes.strategy().clone();
        chosen.reasons.push(kmsg_reason);
        let firsts = first_events(&chosen);
        for e in &firsts {
            recorder.event(e);
            let _ = report.on_event(e);
        }
        let mut probes = probes;
        let mut gpu = GpuSources::start(
            &mut probes,
            &config.probes.gpu_devices,
            config.nvml,
            config.describe.clone(),
            // Opens made outside what is hooked: NVML's list names GPU processes too.
            chosen.mode().holders_from_nvml(),
            kmsg,
        );
        let watch = gpu.watch();
        let source = runtime.block_on(async {
            watch.within(Part::Companion, || {
                companion.start(&gpu, &chosen, &meta);
                // Who traces and how: the stream's first events, which the companion sees too.
                firsts.iter().for_each(|e| companion.event(e));
            });
            // The companion's recording is its own cost, not the trace file's.
            let mut side = companion
                .tap()
                .map(|t| collect::Timed::new(t, watch.clone(), Part::Companion));
            firsts.iter().for_each(|e| side.event(e));
            let mut tap = (&mut recorder, side);
            let source = KernelSource::new(probes)?;
            let sink = LiveSink {
                report: &mut report,
                companion,
                watch,
            };
            // Once everything is attached, the holders at start are known and a Ctrl-C
            // would end the run cleanly.
            let source = collect::run_tapped(
                source,
                Some(&mut gpu),
                config.duration,
                &mut tap,
                ready,
                sink,
            )
            .await?;
            anyhow::Ok(source)
        })?;
        companion.finish();
        recording::finish(recorder, &config, source.drops_total())?;
        let all = report.finish()?;
        if source.drops_total() > 0 {
            eprintln!(
                "linger: the kernel dropped {} record(s) because the ring buffer was full; \
                 incidents may be incomplete (raise --ring-size)",
                source.drops_total()
            );
        }
        Ok(all)
    }
}

/// The kernel log names the process of a GPU error (the driver's tracepoint does not), and
/// has the errors where the tracepoint is missing; opening it may take CAP_SYSLOG: before the
/// capabilities go. The log, if it opened, and the strategy's reason for what it gives.
fn open_kernel_log(probes: &Probes) -> (Option<kmsg::KernelLog>, String) {
    let kmsg = kmsg::open();
    let reason = xid::kmsg_reason(kmsg.as_ref().map(|_| ()), probes.strategy().xid_tracepoint);
    if kmsg.is_err() {
        warn!("{reason}");
    }
    (kmsg.ok(), reason)
}

/// Where the events happen, stamped on every incident record.
fn this_node(config: &Config) -> Node {
    let machine = recording::machine(config);
    Node {
        host: machine.host,
        boot_id: machine.boot_id,
        driver: machine.driver,
    }
}

/// Who traces and how: first in the stream, so replays know it too.
fn first_events(strategy: &Strategy) -> [Event; 2] {
    let me = Event::collector(
        boottime_ns(),
        EventData::Collector {
            pid: std::process::id(),
            partial_pid_view: crate::source::procfs::partial_pid_view().is_some(),
        },
    );
    info!("driver hooks: {}", strategy::describe(strategy));
    for reason in &strategy.reasons {
        debug!("driver hooks: {reason}");
    }
    [
        me,
        Event::collector(boottime_ns(), EventData::Strategy(strategy.clone())),
    ]
}

//! Ring buffer throughput benchmark: how many records per second the kernel ring buffer
//! carries into the collector (`KernelSource::drain`: ring read + decode) without drops.
//!
//! ```text
//! linger-bench-ring --phase sweep --ring-sizes 262144,4194304 --rates 0.5,1,2,max,max@2 \
//!     --seconds 0.4 --rounds 3
//! linger-bench-ring --phase syscall --rounds 4      # kernel-side cost per record
//! linger-bench-ring --phase decode --rounds 5       # decode() alone
//! ```
//!
//! Generator threads of this process call getppid() in a loop, flat out or paced to a target
//! rate; the eBPF program `bench_tick` (attached with `bench_pid` = this process) writes one
//! 56-byte record per call. The main thread drains the ring as the live collector does
//! (`readable()`, `drain()`, `poll_losses()` every `TICK`) and counts the records. A rate is
//! `M[@THREADS]`: millions of records per second in all (or `max`, flat out), from THREADS
//! generator threads (default 1). `--nice` renices the process first, ahead of unrelated work on
//! a shared machine. Prints one JSON object on stdout; `cargo xtask bench` turns it
//! into tables. Needs root.

use std::{
    hint::black_box,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use linger_tests::bench::Nice;
use nix::{
    time::{clock_gettime, ClockId},
    unistd::getppid,
};
use serde_json::{json, Value};
use tokio::{
    runtime::Runtime,
    time::{interval, MissedTickBehavior},
};
use tracer_common as c;
use tracer_user::{
    clock::boottime_ns,
    event::{Event, EventData},
    probe::{ProbeConfig, Probes},
    source::{
        collect::{LOSS_PERIOD, TICK},
        decode::decode,
        kernel::KernelSource,
    },
};

/// getppid() calls between two looks at the clock.
const CHUNK: u64 = 32;
/// Ring of the syscall phase: large enough that a flat-out run never fills it.
const SYSCALL_RING: u32 = 1 << 26;

/// Ring buffer throughput benchmark; prints one JSON object on stdout.
#[derive(Parser)]
#[command(args_override_self = true)]
struct Config {
    /// decode, syscall or sweep.
    #[arg(long, default_value = "sweep")]
    phase: String,
    /// Ring sizes in bytes, comma-separated (the sweep).
    #[arg(long, value_parser = parse_ring_sizes, default_value = "262144,4194304")]
    ring_sizes: RingSizes,
    /// Rates, comma-separated: `M[@THREADS]`, M in millions of records per second or `max`.
    #[arg(long, value_parser = parse_rates, default_value = "0.5,1,2,max")]
    rates: Rates,
    /// Seconds of one run.
    #[arg(long, default_value_t = 0.4)]
    seconds: f64,
    /// Rounds of the phase (the sweep: of every ring size and rate).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    rounds: u32,
    #[command(flatten)]
    nice: Nice,
}

/// A list in one flag value (an alias, so that clap takes it as one value, not a repeat).
type RingSizes = Vec<u32>;
type Rates = Vec<Rate>;

fn parse_args() -> Result<Config> {
    let config = Config::parse();
    ensure!(config.seconds > 0.0, "--seconds must be positive");
    for &size in &config.ring_sizes {
        ensure!(
            size >= 4096 && size.is_power_of_two(),
            "ring size {size}: a power of two >= 4096"
        );
    }
    Ok(config)
}

fn parse_ring_sizes(list: &str) -> Result<RingSizes> {
    Ok(list.split(',').map(str::parse).collect::<Result<_, _>>()?)
}

fn parse_rates(list: &str) -> Result<Rates> {
    list.split(',').map(Rate::parse).collect()
}

/// What the generators offer: a total rate, shared by `threads` generator threads.
#[derive(Clone, Copy)]
struct Rate {
    /// Records per second in all; `None` is flat out.
    per_s: Option<f64>,
    threads: u32,
}

impl Rate {
    const FLAT_OUT: Rate = Rate {
        per_s: None,
        threads: 1,
    };

    /// `M[@THREADS]`: millions of records per second, or `max`, from one thread or several.
    fn parse(s: &str) -> Result<Self> {
        let (rate, threads) = s.split_once('@').unwrap_or((s, "1"));
        let threads: u32 = threads
            .parse()
            .with_context(|| format!("rate {s:?}: thread count"))?;
        ensure!(threads > 0, "rate {s}: at least one thread");
        let per_s = if rate == "max" {
            None
        } else {
            let m: f64 = rate
                .parse()
                .with_context(|| format!("rate {s:?}: M records/s or max"))?;
            ensure!(m > 0.0, "rate {s} must be positive");
            Some(m * 1e6)
        };
        Ok(Self { per_s, threads })
    }

    fn label(self) -> String {
        let rate = self
            .per_s
            .map_or("max".to_string(), |r| format!("{}", r / 1e6));
        match self.threads {
            1 => rate,
            n => format!("{rate}@{n}"),
        }
    }
}

fn main() -> Result<()> {
    let config = parse_args()?;
    // Per thread on Linux: the generator threads started later inherit it.
    config.nice.apply()?;
    let out = match config.phase.as_str() {
        "decode" => decode_phase(&config)?,
        "syscall" => syscall_phase(&config)?,
        "sweep" => sweep_phase(&config)?,
        other => bail!("unknown phase {other:?} (decode, syscall, sweep)"),
    };
    println!("{out}");
    Ok(())
}

/// `decode()` alone over in-memory records: a BenchTick (the ring benchmark's record) and a
/// SignalGenerate (the largest real record, two comm strings to allocate).
fn decode_phase(config: &Config) -> Result<Value> {
    let tick = record(c::BenchTick::default());
    let generate = record(c::SignalGenerate {
        sig: 9,
        sender_comm: c::comm(b"supervisor"),
        target_comm: c::comm(b"python3"),
        ..Default::default()
    });
    ensure!(
        decode(&tick).is_ok_and(|e| e.data == EventData::BenchTick),
        "BenchTick record layout"
    );
    ensure!(
        decode(&generate).is_ok_and(|e| matches!(e.data, EventData::SignalGenerate { sig: 9, .. })),
        "SignalGenerate record layout"
    );
    let n = (config.seconds * 20e6) as u64;
    let mut bench_tick = Vec::new();
    let mut signal_generate = Vec::new();
    for _ in 0..config.rounds {
        bench_tick.push(decode_rate(&tick, n));
        signal_generate.push(decode_rate(&generate, n / 4));
    }
    eprintln!("decode: BenchTick {bench_tick:.3?}/s, SignalGenerate {signal_generate:.3?}/s");
    Ok(json!({
        "phase": "decode",
        "record_bytes": { "bench_tick": tick.len(), "signal_generate": generate.len() },
        "bench_tick_per_s": bench_tick,
        "signal_generate_per_s": signal_generate,
    }))
}

/// A record as the kernel lays it out.
fn record<T: c::Payload>(payload: T) -> Vec<u8> {
    c::Record::new(1, 123_456_789, 4242, 4243, payload)
        .as_bytes()
        .to_vec()
}

fn decode_rate(rec: &[u8], n: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        let _ = black_box(decode(black_box(rec)));
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// getppid() flat out with no program attached vs with `bench_tick` writing every call to a
/// ring that the collector drains, alternating: the kernel-side cost of one record.
fn syscall_phase(config: &Config) -> Result<Value> {
    let runtime = runtime()?;
    let mut rounds = Vec::new();
    for round in 0..config.rounds {
        let mut base = 0.0;
        let mut traced = None;
        let traced_first = round % 2 == 1;
        for traced_turn in [traced_first, !traced_first] {
            if traced_turn {
                let mut source = load(&runtime, SYSCALL_RING)?;
                traced = Some(measure(
                    &runtime,
                    &mut source,
                    Rate::FLAT_OUT,
                    config.seconds,
                )?);
            } else {
                base = generate(None, config.seconds).calls_per_s();
            }
        }
        let traced = traced.context("traced run")?;
        eprintln!(
            "syscall round {round}: untraced {base:.3e}/s traced {:.3e}/s drops {}",
            traced.offered_per_s(),
            traced.drops
        );
        rounds.push(json!({
            "untraced_per_s": base,
            "traced_per_s": traced.offered_per_s(),
            "drops": traced.drops,
            "wakeups": traced.wakeups,
            "irq_works": traced.irq_works,
            "events": traced.events,
        }));
    }
    Ok(json!({
        "phase": "syscall",
        "ring_size": SYSCALL_RING,
        "seconds": config.seconds,
        "rounds": rounds,
    }))
}

/// Every ring size, each rate in turn, `rounds` times over.
fn sweep_phase(config: &Config) -> Result<Value> {
    let runtime = runtime()?;
    let mut runs = Vec::new();
    for &ring_size in &config.ring_sizes {
        let mut source = load(&runtime, ring_size)?;
        for round in 0..config.rounds {
            for &rate in &config.rates {
                let run = measure(&runtime, &mut source, rate, config.seconds)?;
                eprintln!(
                    "ring {ring_size} rate {} round {round}: offered {:.3e}/s delivered {:.3e}/s \
                     drops {} lag {:.1}ms collector {:.0}% cpu, {} wake-ups, drain {:.0}ns/record",
                    rate.label(),
                    run.offered_per_s(),
                    run.delivered_per_s(),
                    run.drops,
                    run.lag_s() * 1e3,
                    100.0 * run.consumer_cpu_s / run.gen_wall_s(),
                    run.wakeups,
                    run.drain_s * 1e9 / run.events.max(1) as f64,
                );
                runs.push(run.to_json(ring_size, rate, round));
            }
        }
    }
    Ok(json!({ "phase": "sweep", "seconds": config.seconds, "runs": runs }))
}

fn runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn load(runtime: &Runtime, ring_size: u32) -> Result<KernelSource> {
    let probes = Probes::load(&ProbeConfig {
        ring_size,
        bench_pid: Some(std::process::id()),
        ..Default::default()
    })
    .context("loading the probes (as root)")?;
    let _guard = runtime.enter();
    Ok(KernelSource::new(probes)?)
}

struct Generated {
    calls: u64,
    start: Instant,
    end: Instant,
    cpu_s: f64,
}

impl Generated {
    fn calls_per_s(&self) -> f64 {
        self.calls as f64 / (self.end - self.start).as_secs_f64()
    }

    /// Several generators as one: all their calls, from the first start to the last end.
    fn combine(all: &[Generated]) -> Option<Generated> {
        Some(Generated {
            calls: all.iter().map(|g| g.calls).sum(),
            start: all.iter().map(|g| g.start).min()?,
            end: all.iter().map(|g| g.end).max()?,
            cpu_s: all.iter().map(|g| g.cpu_s).sum(),
        })
    }
}

/// Calls getppid() for `seconds`, flat out or at `rate` per second (checked every CHUNK calls;
/// ahead of schedule it yields the CPU until due).
fn generate(rate: Option<f64>, seconds: f64) -> Generated {
    let cpu0 = thread_cpu_s();
    let start = Instant::now();
    let limit = Duration::from_secs_f64(seconds);
    let mut calls = 0u64;
    loop {
        for _ in 0..CHUNK {
            black_box(getppid());
        }
        calls += CHUNK;
        if start.elapsed() >= limit {
            break;
        }
        if let Some(rate) = rate {
            // Ahead: wait yielding the CPU, so that the collector runs whenever it wants one
            // (two generators spinning would hold both of this machine's CPUs); a sleep would
            // miss the rate by its late wake-ups.
            let due = Duration::from_secs_f64(calls as f64 / rate).min(limit);
            while start.elapsed() < due {
                thread::yield_now();
            }
        }
    }
    Generated {
        calls,
        start,
        end: Instant::now(),
        cpu_s: thread_cpu_s() - cpu0,
    }
}

fn thread_cpu_s() -> f64 {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

struct Run {
    generated: Generated,
    counts: Counts,
    /// CPU time of the collector thread during the run.
    consumer_cpu_s: f64,
    /// IRQ work interrupts on the machine during the run.
    irq_works: u64,
}

impl std::ops::Deref for Run {
    type Target = Counts;
    fn deref(&self) -> &Counts {
        &self.counts
    }
}

impl Run {
    fn gen_wall_s(&self) -> f64 {
        (self.generated.end - self.generated.start).as_secs_f64()
    }

    fn offered_per_s(&self) -> f64 {
        self.generated.calls_per_s()
    }

    /// Records delivered per second, from the generators' start to the collector's last drain.
    fn delivered_per_s(&self) -> f64 {
        let end = self.last_drain.max(self.generated.end);
        self.events as f64 / (end - self.generated.start).as_secs_f64()
    }

    /// How long after the generators stopped the collector still had records to drain.
    fn lag_s(&self) -> f64 {
        self.last_drain
            .saturating_duration_since(self.generated.end)
            .as_secs_f64()
    }

    fn to_json(&self, ring_size: u32, rate: Rate, round: u32) -> Value {
        json!({
            "ring_size": ring_size,
            "rate": rate.label(),
            "target_per_s": rate.per_s,
            "generators": rate.threads,
            "round": round,
            "calls": self.generated.calls,
            "events": self.events,
            "other_events": self.other,
            "drops": self.drops,
            "offered_per_s": self.offered_per_s(),
            "delivered_per_s": self.delivered_per_s(),
            "lag_s": self.lag_s(),
            "gen_wall_s": self.gen_wall_s(),
            "gen_cpu_s": self.generated.cpu_s,
            "consumer_cpu_s": self.consumer_cpu_s,
            "drain_s": self.drain_s,
            "wakeups": self.wakeups,
            "irq_works": self.irq_works,
        })
    }
}

/// One generator run while this thread drains the ring as the live collector does.
fn measure(runtime: &Runtime, source: &mut KernelSource, rate: Rate, seconds: f64) -> Result<Run> {
    // Start clean: nothing left in the ring, drops counted so far are not this run's.
    let mut batch = Vec::with_capacity(1024);
    source.drain(&mut batch);
    batch.clear();
    let _ = source.poll_losses(boottime_ns(), LOSS_PERIOD);
    let irq_work0 = irq_work_interrupts();
    let running = Arc::new(AtomicUsize::new(rate.threads as usize));
    let per_thread = rate.per_s.map(|r| r / f64::from(rate.threads));
    let generators: Vec<_> = (0..rate.threads)
        .map(|_| {
            let running = Arc::clone(&running);
            thread::spawn(move || {
                let g = generate(per_thread, seconds);
                running.fetch_sub(1, Ordering::Release);
                g
            })
        })
        .collect();
    let cpu0 = thread_cpu_s();
    let counts = runtime.block_on(consume(source, &running, batch))?;
    let consumer_cpu_s = thread_cpu_s() - cpu0;
    let irq_works = irq_work_interrupts().saturating_sub(irq_work0);
    let mut all = Vec::new();
    for generator in generators {
        match generator.join() {
            Ok(g) => all.push(g),
            Err(_) => bail!("a generator thread panicked"),
        }
    }
    let generated = Generated::combine(&all).context("no generator ran")?;
    ensure!(
        counts.events + counts.drops >= generated.calls,
        "{} getppid() calls but only {} records and {} drops: is bench_tick attached?",
        generated.calls,
        counts.events,
        counts.drops
    );
    Ok(Run {
        generated,
        counts,
        consumer_cpu_s,
        irq_works,
    })
}

/// IRQ work interrupts so far, all CPUs (/proc/interrupts `IWI`): a ring buffer record
/// submitted with a wake-up for the reader queues one.
fn irq_work_interrupts() -> u64 {
    std::fs::read_to_string("/proc/interrupts")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.trim_start().starts_with("IWI:"))?;
            Some(
                line.split_whitespace()
                    .skip(1)
                    .map_while(|f| f.parse::<u64>().ok())
                    .sum(),
            )
        })
        .unwrap_or(0)
}

struct Counts {
    /// BenchTick records of this process that reached the collector.
    events: u64,
    /// Other records (the tracer's normal programs see the rest of the machine).
    other: u64,
    drops: u64,
    /// When the collector last took records of this process out of the ring.
    last_drain: Instant,
    /// Wall time spent inside `drain()` (ring read and decode).
    drain_s: f64,
    /// Loop turns that found records: the collector's wake-ups, plus its drains on a tick.
    wakeups: u64,
}

/// The collector loop of `source::collect::run`, counting instead of analysing: drain on
/// readiness, read the drop counter every TICK; stops once the generators are done and the
/// ring is empty.
async fn consume(
    source: &mut KernelSource,
    running: &AtomicUsize,
    mut batch: Vec<Event>,
) -> Result<Counts> {
    let me = std::process::id();
    let mut ticker = interval(TICK);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut counts = Counts {
        events: 0,
        other: 0,
        drops: 0,
        last_drain: Instant::now(),
        drain_s: 0.0,
        wakeups: 0,
    };
    let mut finished = false;
    while !finished {
        let start = tokio::select! {
            ready = source.readable() => {
                ready?;
                let start = Instant::now();
                source.drain(&mut batch);
                start
            }
            _ = ticker.tick() => {
                // Records of finished generators are all committed: one last drain gets them.
                finished = running.load(Ordering::Acquire) == 0;
                let start = Instant::now();
                source.drain(&mut batch);
                batch.extend(source.poll_losses(boottime_ns(), LOSS_PERIOD));
                start
            }
        };
        let drained = Instant::now();
        counts.drain_s += (drained - start).as_secs_f64();
        let before = counts.events;
        for event in batch.drain(..) {
            match event.data {
                EventData::BenchTick if event.pid == me => counts.events += 1,
                EventData::Loss { count, .. } => counts.drops += count,
                _ => counts.other += 1,
            }
        }
        if counts.events > before {
            counts.last_drain = drained;
            counts.wakeups += 1;
        }
    }
    Ok(counts)
}

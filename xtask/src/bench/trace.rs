//! Section 5: trace files: bytes per event, the recorder's cost, the replay decode rate, and
//! `linger replay` over a real recording.

use std::fmt::Write;

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    plan::{Plan, REPLAY_TARGET_PER_S},
    results::Measured,
    stats::{summarize, Summary},
    table::{num, Target},
};

pub fn section(
    md: &mut String,
    plan: &Plan,
    trace: &Measured,
    replay: &Measured,
    targets: &mut Vec<Target>,
) -> Result<()> {
    md.push_str("\n## 5. Trace files\n\n### 5a. Writing and replaying, format alone\n\n");
    let d = &trace.data;
    let _ = writeln!(
        md,
        "{} kernel records ({:.1} bytes each on average in the ring buffer) in the kernel's \
         layout, mixed like a GPU job's teardown (per 10: 6 GPU ioctls, a thread exit, a signal \
         delivery, a fork and an exec; a collector tick every {}), go through the real trace \
         writer, reader and decoder, in memory and the page cache (no disk wait: the file was \
         just written). Each of {} rounds writes the file and reads it back three ways: the \
         chunks alone (`TraceReader`: read, CRC, decompress), a replay on one thread \
         (`Replay::new`: the same and every record decoded into an event) and a replay as \
         `linger replay` runs one (`Replay::open`: chunks read and decompressed on a second \
         thread while the first decodes).\n",
        d["records"],
        num(d, "ring_bytes_per_record")?,
        d["tick_every"],
        plan.trace_rounds
    );
    md.push_str(
        "| Chunks | Bytes per event in the file | Record, ns per event | Chunks alone, M \
         events/s | Replay on one thread, M events/s | Replay (two threads), M events/s \
         (median, min – max) |\n|---|---|---|---|---|---|\n",
    );
    let formats = d["formats"].as_array().context("trace result")?;
    let mut notes = Vec::new();
    for f in formats {
        let name = f["name"].as_str().unwrap_or("?");
        let rounds = f["rounds"].as_array().context("trace rounds")?;
        let events = num(&rounds[0], "events")?;
        let per_s = |key: &str| -> Result<Summary> {
            let v: Vec<f64> = rounds
                .iter()
                .map(|r| Ok(events / num(r, key)?))
                .collect::<Result<_>>()?;
            summarize(&v).context("no rounds")
        };
        let write = per_s("write_s")?;
        let chunks = per_s("chunks_s")?;
        let one = per_s("replay_one_thread_s")?;
        let two = per_s("replay_s")?;
        let bytes = num(&rounds[0], "file_bytes")? / events;
        let label = if name == "plain" {
            "plain (`--uncompressed`)"
        } else {
            "zstd level 1 (the default)"
        };
        let _ = writeln!(
            md,
            "| {label} | {bytes:.2} | {:.0} | {:.1} | {:.1} | **{:.1}** ({:.1} – {:.1}) |",
            1e9 / write.median,
            chunks.median / 1e6,
            one.median / 1e6,
            two.median / 1e6,
            two.min / 1e6,
            two.max / 1e6,
        );
        let decode_ns = 1e9 / one.median - 1e9 / chunks.median;
        notes.push(format!(
            "{label}: the chunks cost {:.0} ns per event and decoding {decode_ns:.0} ns, so two \
             threads could reach {:.1} M/s; they reached {:.1}",
            1e9 / chunks.median,
            1e3 / (1e9 / chunks.median).max(decode_ns),
            two.median / 1e6
        ));
        targets.push(Target {
            what: format!(
                "Replay decode rate from the page cache, {label}: ≥ {} M events/s",
                REPLAY_TARGET_PER_S / 1e6
            ),
            measured: format!(
                "{:.1} M events/s (median of {}; {:.1} – {:.1})",
                two.median / 1e6,
                two.n,
                two.min / 1e6,
                two.max / 1e6
            ),
            met: two.median >= REPLAY_TARGET_PER_S,
        });
    }
    let _ = writeln!(
        md,
        "\n*Record*: the writer's CPU cost per event (framing, CRC, compression, write), the \
         recorder's share of the collector's work. Where the replay time goes: {}.",
        notes.join("; ")
    );
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", trace.command);
    real_replay(md, replay)
}

fn real_replay(md: &mut String, replay: &Measured) -> Result<()> {
    let d = &replay.data;
    md.push_str("\n### 5b. Recording and replaying for real\n\n");
    let _ = writeln!(
        md,
        "`linger record` (64 MiB ring: nothing dropped) traces a process that holds the \
         stand-in GPU device and makes {} ioctls on it, and between them starts and SIGKILLs {} \
         children of {} threads holding the device too; then `linger replay FILE --json > \
         /dev/null` runs over the file, once untimed (its incidents checked: one per kill) and \
         then timed, wall clock, from the page cache. The replay is the whole program: start, \
         read, decode, the analysis and its JSON.\n",
        d["ioctls"], d["kills"], d["threads"]
    );
    md.push_str(
        "| Chunks | Records | File, bytes per record | Recorder CPU, ns per record | \
         `linger replay`, ms (median, min – max) | Records replayed per second |\n\
         |---|---|---|---|---|---|\n",
    );
    let formats = d["formats"].as_array().context("replay result")?;
    let mut commands = vec![replay.command.clone()];
    for f in formats {
        let rec = &f["recording"];
        let records = num(rec, "records")?;
        let times: Vec<f64> = f["replay_s"]
            .as_array()
            .context("replay times")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let t = summarize(&times).context("no replays")?;
        let label = if f["name"] == "plain" {
            "plain (`--uncompressed`)"
        } else {
            "zstd level 1 (the default)"
        };
        let _ = writeln!(
            md,
            "| {label} | {records:.0} | {:.2} | {:.0} | {:.0} ({:.0} – {:.0}) | **{:.1} M** |",
            num(rec, "file_bytes")? / records,
            num(rec, "recorder_ns_per_record")?,
            t.median * 1e3,
            t.min * 1e3,
            t.max * 1e3,
            records / t.median / 1e6,
        );
        for key in ["record_command", "replay_command"] {
            commands.push(format!("# {}", f[key].as_str().unwrap_or("?")));
        }
    }
    md.push_str(
        "\n*Recorder CPU*: the CPU time of `linger record` while the workload ran, per record \
         it wrote: draining, decoding, the analysis and writing the file. These ioctls are all \
         alike, so they compress far better than a real job's (5a's mix is closer to one).\n",
    );
    let _ = writeln!(
        md,
        "\nCommand (and, commented, the recordings and replays it runs):\n\n```sh\n{}\n```",
        commands.join("\n")
    );
    Ok(())
}

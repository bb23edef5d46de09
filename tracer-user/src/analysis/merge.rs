//! One record per incident across many files, and which file's it was. The same incident is
//! often in several: a trace and the live output recorded beside it, a log and a copy of it.
//! The record used is, in this order of preference: from a replayed trace (what this linger's
//! analysis says) over a saved log; settled over unsettled; within one file the later (an
//! update); across files the one whose path sorts first. So the choice does not depend on the
//! order the files are read in.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::stats::{Key, Sample};

/// Where a file's records come from, in order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Records saved as they were written (incident log, `--json` output).
    Log,
    /// A trace replayed through this linger's analysis.
    Trace,
}

/// What one file gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contribution {
    /// Incidents whose record from this file is the one used.
    pub counted: u64,
    /// Incidents of this file whose record from another file was used...
    pub duplicates: u64,
    /// ... by that file's index, how many.
    pub taken_from: BTreeMap<usize, u64>,
}

struct Entry {
    sample: Sample,
    file: usize,
    /// Order of arrival: within one file, a later record is an update.
    seq: u64,
    seen_in: BTreeSet<usize>,
}

#[derive(Default)]
pub struct Incidents {
    files: Vec<(PathBuf, Source)>,
    by_key: BTreeMap<Key, Entry>,
    added: u64,
}

impl Incidents {
    /// Declares a file whose samples follow; returns its index for `add`.
    pub fn file(&mut self, path: &Path, source: Source) -> usize {
        self.files.push((path.to_path_buf(), source));
        self.files.len() - 1
    }

    /// A sample of file `file` (an index from `file`).
    pub fn add(&mut self, file: usize, sample: Sample) {
        self.added += 1;
        let seq = self.added;
        match self.by_key.get_mut(&sample.key) {
            Some(e) => {
                e.seen_in.insert(file);
                let files = &self.files;
                if rank(files, file, seq, &sample) > rank(files, e.file, e.seq, &e.sample) {
                    (e.sample, e.file, e.seq) = (sample, file, seq);
                }
            }
            None => {
                let entry = Entry {
                    sample: sample.clone(),
                    file,
                    seq,
                    seen_in: BTreeSet::from([file]),
                };
                self.by_key.insert(sample.key, entry);
            }
        }
    }

    /// One sample per incident, in key order.
    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.by_key.values().map(|e| &e.sample)
    }

    /// What each file gave, by file index.
    pub fn contributions(&self) -> Vec<Contribution> {
        let mut out = vec![Contribution::default(); self.files.len()];
        for e in self.by_key.values() {
            for &f in &e.seen_in {
                if f == e.file {
                    out[f].counted += 1;
                } else {
                    out[f].duplicates += 1;
                    *out[f].taken_from.entry(e.file).or_default() += 1;
                }
            }
        }
        out
    }
}

/// The preference of the module's doc, greatest best.
fn rank<'a>(
    files: &'a [(PathBuf, Source)],
    file: usize,
    seq: u64,
    s: &Sample,
) -> (Source, bool, Reverse<&'a Path>, u64) {
    let (path, source) = &files[file];
    (*source, s.settled, Reverse(path.as_path()), seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(id: u64, release_ms: u64, settled: bool) -> Sample {
        Sample {
            key: (None, id, id, id),
            termination: "kill".into(),
            verdict: "released".into(),
            comm: "python3".into(),
            gpu: Some(0),
            pod: None,
            driver: None,
            wall_time: None,
            share_bytes: 1 << 30,
            release_ns: Some(release_ms * 1_000_000),
            release_known: true,
            stop_ns: None,
            lingering: false,
            refused: 0,
            top_phase: None,
            losses: false,
            settled,
        }
    }

    fn releases(all: &Incidents) -> Vec<u64> {
        all.samples().filter_map(|s| s.release_ns).collect()
    }

    #[test]
    fn a_settled_record_wins_over_a_later_unsettled_one() {
        let mut all = Incidents::default();
        let f = all.file(Path::new("a.jsonl"), Source::Log);
        all.add(f, sample(1, 100, true));
        all.add(f, sample(1, 200, false));
        all.add(f, sample(2, 300, false));
        all.add(f, sample(2, 400, false));
        assert_eq!(releases(&all), [100_000_000, 400_000_000]);
    }

    #[test]
    fn the_trace_wins_over_a_log_in_either_order() {
        for trace_first in [true, false] {
            let mut all = Incidents::default();
            let (trace, log) = if trace_first {
                let t = all.file(Path::new("z/run.lgr"), Source::Trace);
                (t, all.file(Path::new("a/incidents.jsonl"), Source::Log))
            } else {
                let l = all.file(Path::new("a/incidents.jsonl"), Source::Log);
                (all.file(Path::new("z/run.lgr"), Source::Trace), l)
            };
            let mut order = [(trace, 100), (log, 900)];
            if !trace_first {
                order.reverse();
            }
            for (f, ms) in order {
                all.add(f, sample(1, ms, true));
                all.add(f, sample(2, ms, true));
            }
            // Only in the log: counted from it.
            all.add(log, sample(3, 900, true));
            assert_eq!(releases(&all), [100_000_000, 100_000_000, 900_000_000]);
            let c = all.contributions();
            assert_eq!((c[trace].counted, c[trace].duplicates), (2, 0));
            assert_eq!((c[log].counted, c[log].duplicates), (1, 2));
            assert_eq!(c[log].taken_from, BTreeMap::from([(trace, 2)]));
        }
    }

    #[test]
    fn between_logs_the_first_path_wins_whatever_the_order() {
        for names in [["a.jsonl", "b.jsonl"], ["b.jsonl", "a.jsonl"]] {
            let mut all = Incidents::default();
            for name in names {
                let f = all.file(Path::new(name), Source::Log);
                all.add(
                    f,
                    sample(1, if name == "a.jsonl" { 100 } else { 900 }, true),
                );
            }
            assert_eq!(releases(&all), [100_000_000], "{names:?}");
        }
    }
}

//! Which node the agent's series name. In a DaemonSet the pod has a host name of its own, so
//! the node's name comes from `NODE_NAME` (the downward API's `spec.nodeName`, as every GPU
//! exporter takes it); elsewhere it is the host's own name: this process's where it shares
//! the host's UTS namespace (systemd), else the one of PID 1's namespace (a container with
//! the host's pids), else this namespace's, with the reason.

use std::{fs::File, os::fd::AsFd, path::Path};

use nix::sched::CloneFlags;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};

/// The node's name and where it came from, for the start-up line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeName {
    pub name: String,
    pub from: String,
}

/// `NODE_NAME` when set and not blank, else the host's name.
pub fn resolve(node_name_env: Option<&str>) -> NodeName {
    if let Some(name) = node_name_env.map(str::trim).filter(|n| !n.is_empty()) {
        return NodeName {
            name: name.into(),
            from: "NODE_NAME".into(),
        };
    }
    match host_uts_name(Path::new("/proc/1/ns/uts")) {
        Ok(HostName::Shared(name)) => NodeName {
            name,
            from: "the host's name".into(),
        },
        Ok(HostName::Joined(name)) => NodeName {
            name,
            from: "the host's name, read in PID 1's UTS namespace".into(),
        },
        Err(why) => NodeName {
            name: own_name().unwrap_or_default(),
            from: format!("this UTS namespace's name, not the host's ({why}): set NODE_NAME"),
        },
    }
}

enum HostName {
    /// This process is in the host's UTS namespace.
    Shared(String),
    /// Read by a thread that joined the host's.
    Joined(String),
}

fn own_name() -> Result<String, String> {
    nix::sys::utsname::uname()
        .map(|u| u.nodename().to_string_lossy().into_owned())
        .map_err(|e| format!("uname: {e}"))
}

/// The name in the UTS namespace of `ns` (PID 1's: the host's where the pids are the host's).
fn host_uts_name(ns: &Path) -> Result<HostName, String> {
    let link = |p: &Path| std::fs::read_link(p).map_err(|e| format!("{}: {e}", p.display()));
    if link(ns)? == link(Path::new("/proc/self/ns/uts"))? {
        return own_name().map(HostName::Shared);
    }
    let file = File::open(ns).map_err(|e| format!("{}: {e}", ns.display()))?;
    // A namespace joined by one thread is that thread's only: the rest of linger keeps its own.
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(file.as_fd(), CloneFlags::CLONE_NEWUTS)
                .map_err(|e| format!("joining {}: {e}", ns.display()))?;
            own_name()
        })
        .join()
        .map_err(|_| "the thread reading the host's name failed".to_string())?
    })
    .map(HostName::Joined)
}

/// The label naming the node: dcgm-exporter's `hostname` (its release after PR #655), or
/// `Hostname` (the releases before) where dashboards still join on that.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Host {
    pub label: HostLabel,
    pub name: String,
}

#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostLabel {
    #[default]
    Hostname,
    /// dcgm-exporter's name before its PR #655.
    LegacyHostname,
}

impl HostLabel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Hostname => "hostname",
            Self::LegacyHostname => "Hostname",
        }
    }
}

impl EncodeLabelSet for Host {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        (self.label.name(), self.name.as_str()).encode(encoder.encode_label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_name_wins_unless_blank() {
        let n = resolve(Some(" gpu-node-7 "));
        assert_eq!(n.name, "gpu-node-7");
        assert_eq!(n.from, "NODE_NAME");
        assert_ne!(resolve(Some("  ")).from, "NODE_NAME");
    }

    #[test]
    fn the_own_namespace_gives_this_hosts_name() {
        let name = host_uts_name(Path::new("/proc/self/ns/uts")).expect("own namespace");
        let own = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
        assert!(matches!(name, HostName::Shared(n) if n == own.trim()));
    }

    #[test]
    fn an_unreadable_namespace_is_a_reason_not_a_panic() {
        let why = host_uts_name(Path::new("/nonexistent/ns/uts"))
            .err()
            .expect("refused");
        assert!(why.contains("/nonexistent/ns/uts"), "{why}");
    }
}

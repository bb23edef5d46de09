//! What NVIDIA's Xid catalog says to do about each Xid (`xid-catalog.tsv` beside this file,
//! its source named at its top): the immediate action's bucket as NVIDIA names it, and in
//! plain words.

use std::{collections::HashMap, sync::OnceLock};

const CATALOG: &str = include_str!("xid-catalog.tsv");

/// One Xid's row of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub mnemonic: &'static str,
    /// "Resolution Bucket (Immediate Action)": `RESTART_APP`, `RESET_GPU`, `RESTART_BM`, ...;
    /// None where the catalog gives none.
    pub action: Option<&'static str>,
    pub description: &'static str,
}

fn table() -> &'static HashMap<u32, Entry> {
    static TABLE: OnceLock<HashMap<u32, Entry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        CATALOG
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let mut cells = l.split('\t');
                let xid = cells.next()?.parse().ok()?;
                let mnemonic = cells.next()?;
                let action = cells.next().filter(|a| !a.is_empty());
                let description = cells.nth(1).unwrap_or("");
                Some((
                    xid,
                    Entry {
                        mnemonic,
                        action,
                        description,
                    },
                ))
            })
            .collect()
    })
}

/// The catalog's row for `xid`.
pub fn entry(xid: u32) -> Option<Entry> {
    table().get(&xid).copied()
}

/// Xid 154, "GPU recovery action changed": its message names the action the driver now
/// requires, which is the immediate action (the catalog's bucket for it, `XID_154`, says so).
const RECOVERY_ACTION_CHANGED: u32 = 154;

/// The immediate action for `xid` as its report states it: for Xid 154 the action its message
/// names ("... changed from 0x0 (None) to 0x1 (GPU Reset Required)"), else the catalog's.
pub fn action(xid: u32, message: &str) -> Option<&'static str> {
    if xid == RECOVERY_ACTION_CHANGED {
        if let Some(named) = recovery_action(message) {
            return Some(named);
        }
    }
    entry(xid)?.action
}

/// The action Xid 154's message changes to: by the driver's code for it
/// (NV2080_CTRL_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P), or,
/// for a code this table predates, by its words ("OS Reboot", "PF FLR", "Drain and Reset").
fn recovery_action(message: &str) -> Option<&'static str> {
    let to = message.rsplit_once(" to 0x")?.1;
    let (code, words) = to.split_once(' ').unwrap_or((to, ""));
    match u32::from_str_radix(code, 16).ok()? {
        0 => Some("IGNORE"),
        1 => Some("RESET_GPU"),
        2 => Some("RESTART_BM"),
        3 => Some("DRAIN_P2P"),
        _ if words.contains("Reboot") => Some("RESTART_BM"),
        _ if words.contains("Reset") || words.contains("FLR") => Some("RESET_GPU"),
        _ => None,
    }
}

/// NVIDIA's immediate action for `xid` (as its `message` states it) in plain words (the
/// catalog's definitions of its buckets, shortened); None where the catalog gives none.
pub fn recommended(xid: u32, message: &str) -> Option<&'static str> {
    Some(match action(xid, message)? {
        "RESTART_APP" => "restart the application",
        "RESET_GPU" => "reset the GPU",
        "RESTART_BM" => "reboot the node",
        "RESTART_VM" => "restart the VM that owns the GPU",
        "CONTACT_SUPPORT" => "contact NVIDIA support",
        "IGNORE" => "no action needed",
        "CHECK_MECHANICALS" => "check the board's seating and power connections",
        "UPDATE_SWFW" => "update the driver and the firmware",
        "CHECK_UVM" => "reset the GPU if UVM or vGPU is in use, otherwise none",
        "WORKFLOW_XID_45" => "follow the action of the Xid that came with it",
        "WORKFLOW_XID_48" => "reset the GPU; with Xid 63 or 64, drain the node and reset it",
        "WORKFLOW_NVLINK_ERR" => "follow NVIDIA's NVLink error workflow for its hex codes",
        "WORKFLOW_NVLINK5_ERR" => "depends on the NVLink5 sub-code (NVIDIA's catalog decodes it)",
        "XID_154" => "take the recovery action the Xid 154 message names",
        "DRAIN_P2P" => "stop peer-to-peer work on the GPU (drain P2P)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogued_xid_and_bucket_reads_back() {
        assert_eq!(table().len(), 172, "Xid 1-172, one row each");
        let mmu = entry(31).expect("Xid 31");
        assert_eq!(mmu.mnemonic, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT");
        assert_eq!(mmu.action, Some("RESTART_APP"));
        assert_eq!(recommended(79, ""), Some("reboot the node"));
        assert_eq!(entry(119).and_then(|e| e.action), Some("RESET_GPU"));
        assert_eq!(entry(171).and_then(|e| e.action), None);
        assert_eq!(entry(999), None);
        // Every bucket the catalog uses has words: a new one fails here.
        for (xid, e) in table() {
            if e.action.is_some() {
                assert!(recommended(*xid, "").is_some(), "Xid {xid}: {e:?}");
            }
        }
    }

    /// Xid 154 takes the action its message names (lines the field reports); a message that
    /// names none keeps the catalog's bucket.
    #[test]
    fn xid_154_takes_the_action_its_message_names() {
        let changed = |to: &str| format!("GPU recovery action changed from 0x0 (None) to {to}");
        for (to, want) in [
            ("0x1 (GPU Reset Required)", "RESET_GPU"),
            ("0x1 (PF FLR)", "RESET_GPU"),
            ("0x2 (Node Reboot Required)", "RESTART_BM"),
            ("0x2 (OS Reboot)", "RESTART_BM"),
            ("0x3 (Drain P2P)", "DRAIN_P2P"),
            ("0x4 (Drain and Reset)", "RESET_GPU"),
            ("0x0 (None)", "IGNORE"),
        ] {
            assert_eq!(action(154, &changed(to)), Some(want), "{to}");
        }
        assert_eq!(
            recommended(154, &changed("0x2 (OS Reboot)")),
            Some("reboot the node")
        );
        assert_eq!(action(154, "something else"), Some("XID_154"));
        assert_eq!(action(31, &changed("0x2 (OS Reboot)")), Some("RESTART_APP"));
    }
}

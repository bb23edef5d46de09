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

/// NVIDIA's immediate action for `xid` in plain words (the catalog's definitions of its
/// buckets, shortened); None where the catalog gives none.
pub fn recommended(xid: u32) -> Option<&'static str> {
    Some(match entry(xid)?.action? {
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
        assert_eq!(recommended(79), Some("reboot the node"));
        assert_eq!(entry(119).and_then(|e| e.action), Some("RESET_GPU"));
        assert_eq!(entry(171).and_then(|e| e.action), None);
        assert_eq!(entry(999), None);
        // Every bucket the catalog uses has words: a new one fails here.
        for (xid, e) in table() {
            if e.action.is_some() {
                assert!(recommended(*xid).is_some(), "Xid {xid}: {e:?}");
            }
        }
    }
}

//! What a victim's death is to give back, and where the figure of its share comes from.

use serde::Serialize;

/// What a victim's death is to give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not dead yet: NVML figures are collected.
    Alive,
    /// Its own share: NVML's largest figure for it, else its ledger's video bytes.
    Own { ledger: u64 },
    /// Its files' memory is another watched victim's (incident id; a forked holder of a dead
    /// parent's files): back when that one's is.
    AliasOf(u64),
    /// No memory of its own: its files stay open in live processes that own the memory.
    Nothing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareFrom {
    Nvml,
    Ledger,
    /// Neither NVML nor the ledger knows of any memory.
    None,
}

impl ShareFrom {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::Ledger => "ledger",
            Self::None => "none",
        }
    }
}

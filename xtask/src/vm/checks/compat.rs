//! cuda-compat: beside the driver's libcuda, a second copy in /usr/local/cuda-12.8/compat,
//! which the GPU process loads through LD_LIBRARY_PATH. linger must hook that copy too (its
//! calls are the process's only way to the driver in the library mode), and the incident's
//! `unseen` must say what a copy it does not find would cost.

use anyhow::{bail, Result};
use serde_json::Value;

use super::{
    by_driver::{events_of, incident_of, last_incidents},
    console::Guest,
};

const COMPAT_LIBCUDA: &str = "/usr/local/cuda-12.8/compat/libcuda.so.1";

/// The late-compat scenario, after late_driver.rs checked its holder and ledger.
pub fn check(guest: &Guest) -> Result<()> {
    let loaded = guest.one("late-compat-libcuda")?;
    if loaded != COMPAT_LIBCUDA {
        bail!("the GPU process did not load the compat libcuda but {loaded:?}");
    }
    let out = guest.json("late-compat-out")?;
    let hooked = events_of(&out)
        .into_iter()
        .map(|e| &e["data"])
        .filter(|d| d["kind"] == "strategy")
        .flat_map(|d| d["libraries"].as_array().into_iter().flatten())
        .any(|l| l == COMPAT_LIBCUDA);
    if !hooked {
        bail!("{COMPAT_LIBCUDA} is not among the libraries hooked");
    }
    let holder: u64 = guest.one("late-compat-holder")?.parse()?;
    let incidents = last_incidents(&out);
    let incident = incident_of(&incidents, holder)?;
    let said = incident["unseen"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|u| u.contains("cuda-compat libcuda outside /usr/local/cuda*/compat"));
    if !said {
        bail!(
            "the incident's unseen does not name a cuda-compat libcuda linger did not find: {}",
            incident["unseen"]
        );
    }
    eprintln!(
        "xtask vm:   cuda-compat: the GPU process loaded {COMPAT_LIBCUDA} through \
         LD_LIBRARY_PATH; linger hooked it, holder and 1 GiB ledger right"
    );
    Ok(())
}

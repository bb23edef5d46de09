//! What this machine allows, asked the way linger asks it: `linger doctor --json` tries each
//! hook type for real and checks the GPU side. Tests read it to assert what linger must do on
//! the machine they run on, never one kernel's answers.

use serde_json::Value;

use crate::{linger, list, text};

/// One run of `linger doctor --json`.
pub struct Doctor(pub Value);

impl Doctor {
    /// Runs the doctor (as root, like linger) and fails the test if it cannot.
    pub fn run() -> Self {
        let out = linger()
            .args(["doctor", "--json"])
            .output()
            .expect("running linger doctor");
        assert!(out.status.success(), "doctor failed: {out:?}");
        Self(serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON"))
    }

    /// The check `name` of the list at `pointer` (`/hooks` or `/gpu`).
    fn check(&self, pointer: &str, name: &str) -> &Value {
        list(&self.0, pointer)
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check in {pointer} of {:#}", self.0))
    }

    /// The hook type `name` (`fentry`, `kprobe`, ...) as the kernel answered it.
    pub fn hook(&self, name: &str) -> &Value {
        self.check("/hooks", name)
    }

    /// The GPU-side check `name` (`nvidia_driver`, `nvml`, `xid_tracepoint`, `kmsg`).
    pub fn gpu(&self, name: &str) -> &Value {
        self.check("/gpu", name)
    }

    /// Whether the kernel loaded and attached the doctor's program of hook type `name`.
    pub fn allows(&self, name: &str) -> bool {
        self.hook(name)["ok"] == true
    }

    /// Whether the GPU-side check `name` passed.
    pub fn has(&self, name: &str) -> bool {
        self.gpu(name)["ok"] == true
    }

    /// The one line saying how linger watches driver teardown here.
    pub fn strategy(&self) -> &str {
        text(&self.0, "/strategy")
    }
}

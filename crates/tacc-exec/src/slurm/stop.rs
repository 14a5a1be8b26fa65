//! How a Slurm job is stopped on cancel and at the time limit, as the process and Docker
//! executors stop theirs: the task's stop signal (its `checkpoint.signal`) first, to every
//! process of the job's steps on every node, then — only if the job is still there once
//! the grace has run out — `scancel` for good (SIGTERM, then Slurm's `KillWait`).
//!
//! The signal goes with `scancel --signal=NAME` and neither `--batch` nor `--full`: that
//! reaches every process of every step (our `node.sh`, the task's script and its
//! children) and leaves out the batch step, which is only the `srun` that started them
//! and has nothing to save. `node.sh` traps the signal (see `script::write_gang`) so that
//! it outlives it and still records the task's exit code.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde::{Deserialize, Deserializer, Serializer};

/// The grace a manifest written before grace was recorded gets: the compiler's default
/// for a task without a `checkpoint` section.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// What stopping one job means: which signal first, and how long before the kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopPolicy {
    pub signal: Signal,
    pub grace: Duration,
}

impl StopPolicy {
    /// Whether the task can act on the signal at all; SIGKILL and SIGSTOP cannot be
    /// trapped, so for them the job is cancelled straight away.
    pub fn catchable(&self) -> bool {
        !matches!(self.signal, Signal::SIGKILL | Signal::SIGSTOP)
    }

    /// The `scancel` arguments that deliver the signal to the job's step processes.
    pub fn scancel_signal_args(&self, job_id: u64) -> Vec<String> {
        vec![
            format!("--signal={}", signal_word(self.signal)),
            job_id.to_string(),
        ]
    }

    /// The line in `node.sh` that keeps it alive through the signal. A handler (not an
    /// ignore) is set on purpose: the task's script then starts with the signal's
    /// default disposition and can trap it itself, which an ignored signal forbids.
    pub fn node_trap_line(&self) -> String {
        if self.catchable() {
            format!("trap : {}\n", signal_word(self.signal))
        } else {
            String::new()
        }
    }
}

/// The signal's name without `SIG`, as `scancel --signal` and bash's `trap` take it on
/// every architecture (numbers differ between them).
fn signal_word(signal: Signal) -> &'static str {
    let name = signal.as_str();
    name.strip_prefix("SIG").unwrap_or(name)
}

/// Serde for a [`Signal`] as its name (`"SIGUSR1"`), for the gang manifest.
pub mod signal_name {
    use super::*;

    pub fn serialize<S: Serializer>(signal: &Signal, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(signal.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Signal, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(|_| {
            serde::de::Error::custom(format!(
                "`{name}` is no signal name; expected one like SIGTERM or SIGUSR1"
            ))
        })
    }

    pub fn default() -> Signal {
        Signal::SIGTERM
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_is_named_without_sig_for_scancel_and_trap() {
        let stop = StopPolicy {
            signal: Signal::SIGUSR1,
            grace: Duration::from_secs(3),
        };
        assert_eq!(stop.scancel_signal_args(42), ["--signal=USR1", "42"]);
        assert_eq!(stop.node_trap_line(), "trap : USR1\n");
    }

    #[test]
    fn an_uncatchable_signal_gets_no_trap_and_no_grace_to_use() {
        let stop = StopPolicy {
            signal: Signal::SIGKILL,
            grace: Duration::from_secs(3),
        };
        assert!(!stop.catchable());
        assert_eq!(stop.node_trap_line(), "");
    }
}

//! The classifier's contract: recent signals in, a verdict with its evidence out.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Signals;

/// What holds an attempt back, in the order a person would want to hear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    /// Too few samples yet to say.
    NotEnoughData,
    /// Near its memory limit and reclaiming: more memory, or it may be killed.
    MemoryPressure,
    /// Its GPUs wait while its CPU quota is used up: the data loader needs CPUs.
    InputBound,
    /// No GPU, and the CPU quota is used up: it would go faster with more CPUs.
    CpuBound,
    /// Its GPUs are busy: more CPU or memory would not help.
    GpuBound,
    /// It uses far less CPU or memory than it holds, for a sustained window.
    OverProvisioned,
    /// None of the above.
    Balanced,
}

impl Bottleneck {
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::NotEnoughData => "not_enough_data",
            Bottleneck::MemoryPressure => "memory_pressure",
            Bottleneck::InputBound => "input_bound",
            Bottleneck::CpuBound => "cpu_bound",
            Bottleneck::GpuBound => "gpu_bound",
            Bottleneck::OverProvisioned => "over_provisioned",
            Bottleneck::Balanced => "balanced",
        }
    }
}

impl fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one resource's allocation fits what the attempt does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fit {
    /// Not measured (no quota, no samples).
    Unknown,
    /// Used up: it would use more.
    Short,
    Fit,
    /// Used far below the allocation over the whole window.
    Idle,
}

/// A classifier's judgement of one attempt, with the figures it rests on (shown by
/// `tcloud why` and written into the task's history with every change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub bottleneck: Bottleneck,
    pub cpu: Fit,
    pub memory: Fit,
    /// One line per figure, e.g. `CPU 1.96 of 2.00 cores used, throttled 34% of the time`.
    pub evidence: Vec<String>,
    /// The CPU the attempt used at its busiest in the window (thousandths of a CPU), and
    /// the memory at its highest: what a shrink must leave room for.
    pub cpu_peak_millis: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
}

impl Verdict {
    pub fn not_enough_data(why: impl Into<String>) -> Verdict {
        Verdict {
            bottleneck: Bottleneck::NotEnoughData,
            cpu: Fit::Unknown,
            memory: Fit::Unknown,
            evidence: vec![why.into()],
            cpu_peak_millis: None,
            memory_peak_bytes: None,
        }
    }

    /// `input_bound: GPU 23% busy; CPU 1.96 of 2.00 cores used, throttled 34% of the time`.
    pub fn summary(&self) -> String {
        format!("{}: {}", self.bottleneck, self.evidence.join("; "))
    }
}

/// Decides what holds an attempt back. Implementations are pure: the same signals give
/// the same verdict.
pub trait Classifier: Send + Sync + fmt::Debug {
    /// A short name for logs and `--json` (`rules`).
    fn name(&self) -> &'static str;
    fn classify(&self, signals: &Signals) -> Verdict;
}

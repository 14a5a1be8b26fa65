//! Adaptive resource allocation, as pure decisions: what holds a running attempt back
//! (a [`Classifier`] over its recent [`Signals`]) and how its CPU and memory allocation
//! should change within the bounds its owner allows (a [`Reallocator`]).
//!
//! Layer 3 (scheduling), beside `tacc-scheduler`, and pure like it: no I/O, no clock of
//! its own (time comes in with every call), no async. The server feeds it the samples
//! agents report and applies its decisions; the simulator feeds it samples synthesised
//! from a speed model — the same code in both. It depends on `tacc-core` only.
//!
//! Both decisions sit behind a trait, with one implementation per file (`rules.rs`,
//! `step_policy.rs`), so a researcher replaces one in one file, as with the scheduling
//! policies.

mod classifier;
mod policy;
#[cfg(test)]
mod recorded;
mod rules;
mod signals;
mod step_policy;

pub use classifier::{Bottleneck, Classifier, Fit, Verdict};
pub use policy::{
    Allocation, Bounds, Change, ChangeHistory, Direction, Reallocator, Room, Situation,
};
pub use rules::{RuleClassifier, Rules};
pub use signals::{Sample, Signals};
pub use step_policy::{StepPolicy, StepPolicyConfig};

/// The classifier and policy a cluster uses unless configured otherwise.
pub fn default_classifier() -> Box<dyn Classifier> {
    Box::new(RuleClassifier::new(Rules::default()))
}

/// See [`default_classifier`].
pub fn default_reallocator() -> Box<dyn Reallocator> {
    Box::new(StepPolicy::new(StepPolicyConfig::default()))
}

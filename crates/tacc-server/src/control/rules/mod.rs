//! The lifecycle rules of the control plane as plain functions over state: an event and
//! the state it meets go in, with the time passed in; a decision comes out (store changes,
//! nodes lost, attempts to stop, a retry and when). No lock, store, clock or network is
//! reached from here — `crates/taccd/tests/architecture.rs` checks — so every rule is
//! unit-tested on its own, and the async shell around it (`control/*.rs`) only reads what
//! a rule needs, applies what it decides, and wakes who must hear of it.

pub(super) mod admission;
pub(super) mod cancel;
pub(super) mod claims;
pub(super) mod ending;
pub(super) mod liveness;
pub(super) mod polls;

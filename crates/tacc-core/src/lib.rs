//! `tacc-core`: the vocabulary every other TACC crate shares — newtype ids, resource
//! vectors, human-friendly durations and byte sizes, task states and priorities, runtime
//! kinds.
//!
//! It sits below all four layers (schema, compiler, scheduling, execution) and must not
//! depend on any other crate of ours, nor on anything that does I/O (no tokio, no network,
//! no file system, no clock). Everything here is plain data with parsing and formatting.

mod gpu_count;
mod identity;
mod ids;
pub mod labels;
mod quantity;
mod resources;
mod runtime;
mod state;
mod time;

pub use gpu_count::{GPU_HUNDREDTHS, GpuCount, GpuCountError};
pub use identity::Role;
pub use ids::{AttemptNo, GroupId, NodeId, SnapshotId, TaskId, UserName};
pub use quantity::{ByteSize, HumanDuration};
pub use resources::Resources;
pub use runtime::RuntimeKind;
pub use state::{Priority, TaskState};
pub use time::Timestamp;

/// Errors raised while parsing the core value types from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error("invalid duration `{input}`: {why} (write e.g. `90s`, `30m`, `4h`, `1h30m` or `2d`)")]
    InvalidDuration { input: String, why: String },
    #[error("invalid size `{input}`: {why} (write e.g. `512MiB`, `64GiB` or `2TB`)")]
    InvalidSize { input: String, why: String },
    #[error("invalid {kind} `{input}`: {why}")]
    InvalidId {
        kind: &'static str,
        input: String,
        why: String,
    },
    #[error("unknown {kind} `{input}` (expected one of: {expected})")]
    UnknownName {
        kind: &'static str,
        input: String,
        expected: &'static str,
    },
}

//! `tacc-store`: durable state of the control plane behind the [`Store`] trait — tasks and
//! every state transition with its timestamp, nodes, code snapshots and task outputs.
//!
//! It is a side-effect crate beside the four layers: [`SqliteStore`] is the embedded
//! default (sqlx, migrations, WAL, synchronous commits) and [`MemoryStore`] the fake for
//! tests of the layers above; one contract suite ([`contract`]) runs against both, and
//! against PostgreSQL once it is added. It depends on `tacc-core` only: no scheduler, no
//! HTTP, no wire types. Callers pass time in; the store never reads a clock.

mod memory;
mod records;
mod sqlite;

pub mod contract;

pub use memory::MemoryStore;
pub use records::{
    NewNode, NewTask, NodeRecord, OutputRecord, StoredPlacement, TaskChange, TaskEvent, TaskFilter,
    TaskRecord, Transition,
};
pub use sqlite::SqliteStore;

use tacc_core::{SnapshotId, TaskId};

/// The crate's errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("task {0} does not exist")]
    TaskNotFound(TaskId),
    #[error("task {task} is {actual}, not {expected}: it changed concurrently")]
    Conflict {
        task: TaskId,
        expected: String,
        actual: String,
    },
    #[error(
        "cannot open the database at {path}: {source} (check the directory exists and is writable)"
    )]
    Open {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "database migration failed: {0} (the data directory may belong to a newer TACC version)"
    )]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Durable control-plane state. Every method is one transaction: when it returns `Ok`, the
/// change survives a crash of the process.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Insert a queued task (attempt 1) and its first event; assigns the id.
    async fn create_task(&self, task: NewTask) -> Result<TaskRecord>;
    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>>;
    /// Tasks matching the filter, newest first.
    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>>;
    async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>>;
    /// Apply all changes atomically, or none.
    async fn apply(&self, changes: &[TaskChange]) -> Result<()>;

    /// Insert the node or, when its name is known, update it and keep its id.
    async fn register_node(&self, node: NewNode) -> Result<NodeRecord>;
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>>;

    /// Record a committed snapshot's manifest (idempotent).
    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        total_bytes: u64,
        at: tacc_core::Timestamp,
    ) -> Result<()>;
    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>>;
    /// Every committed snapshot's id (what the chunk garbage collector must keep).
    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>>;

    async fn add_output(&self, output: OutputRecord) -> Result<()>;
    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>>;
}

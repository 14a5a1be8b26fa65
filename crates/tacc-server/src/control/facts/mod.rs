//! Facts: what the control plane reads of the durable state before (or around) a turn,
//! so its handlers decide on plain values. A read never changes anything; changes go
//! through a turn (`shell.rs`). The shell, the services beside it and the API's handlers
//! ask these questions of one [`Facts`], which holds the store and the placed tasks'
//! records kept in memory (`records.rs`), and nothing else of `Control`.
//!
//! Each file under `facts/` answers one family of questions: a task's record, its
//! attempt's ranks and inputs (`attempts.rs`), its adaptive allocation (`adaptive.rs`), pipelines' stages, sweeps' trials and
//! groups' elements.

use std::sync::Arc;

use tacc_core::{GroupId, TaskId};
use tacc_store::{Store, StoreError, TaskRecord};

use super::records::PlacedRecords;
pub(crate) use group_shapes::GroupShape;

mod adaptive;
mod attempts;
mod group_shapes;
mod groups;
mod pipelines;
mod sweeps;

/// Reads of the durable state for the control plane; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub(super) store: Arc<dyn Store>,
    placed: Arc<PlacedRecords>,
    shapes: Arc<group_shapes::GroupShapes>,
}

impl Facts {
    pub(crate) fn new(store: Arc<dyn Store>, placed: Arc<PlacedRecords>) -> Facts {
        Facts {
            store,
            placed,
            shapes: Arc::default(),
        }
    }

    /// What `group` was made with (`group_shapes.rs`): read once per group.
    pub(crate) async fn group_shape(
        &self,
        group: GroupId,
    ) -> Result<Option<GroupShape>, StoreError> {
        self.shapes.shape(&*self.store, group).await
    }

    /// A task's record as the store holds it: from memory while the task is placed, with
    /// what the turn under way staged for it and has not committed yet (read your own
    /// writes).
    pub(crate) async fn task_record(&self, task: TaskId) -> Result<Option<TaskRecord>, StoreError> {
        self.placed.read(&*self.store, task).await
    }
}

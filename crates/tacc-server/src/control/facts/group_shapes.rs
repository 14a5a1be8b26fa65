//! What a group was made with, kept per group: its kind, whether it asks for a
//! notification, and the pipeline stage it runs as. None of it changes once the group
//! exists — a stage's row is written in the transaction that makes the stage's group, and
//! a group's spec is never rewritten — so it is read once, not at every start and end of
//! its elements (an array of 10,000 trivial tasks asked it 40,000 times).

use std::collections::HashMap;
use std::sync::Mutex;

use tacc_core::GroupId;
use tacc_store::{GroupKind, StageRecord, StageSource, Store, StoreError};

/// A group's unchanging facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupShape {
    pub(crate) kind: GroupKind,
    /// Its spec has a `notify:` the platform can use.
    pub(crate) notifies: bool,
    /// The stage it runs as, when it is an array or sweep stage of a pipeline.
    pub(crate) stage: Option<StageRecord>,
}

/// Groups' shapes as read, bounded.
#[derive(Debug, Default)]
pub(crate) struct GroupShapes {
    known: Mutex<HashMap<GroupId, GroupShape>>,
}

/// Shapes kept at most; past it they are forgotten all at once (a miss costs two reads).
const KEPT: usize = 4096;

impl GroupShapes {
    /// `group`'s shape, read from `store` the first time it is asked (`None`: no such
    /// group).
    pub(crate) async fn shape(
        &self,
        store: &dyn Store,
        group: GroupId,
    ) -> Result<Option<GroupShape>, StoreError> {
        if let Some(known) = self.known.lock().unwrap().get(&group) {
            return Ok(Some(known.clone()));
        }
        let Some(record) = store.get_group(group).await? else {
            return Ok(None);
        };
        // A pipeline is no stage; its single-task stages are its own elements.
        let stage = match record.kind {
            GroupKind::Pipeline => None,
            _ => store.stage_of(StageSource::Group(group)).await?,
        };
        let shape = GroupShape {
            kind: record.kind,
            notifies: crate::notify::asks_to_notify(&record.spec),
            stage,
        };
        let mut known = self.known.lock().unwrap();
        if known.len() >= KEPT {
            known.clear();
        }
        known.insert(group, shape.clone());
        Ok(Some(shape))
    }
}

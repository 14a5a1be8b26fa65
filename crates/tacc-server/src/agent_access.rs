//! What a node's credential lets it do (registration: see `enrolment`): report on and
//! upload outputs of its own current attempts only, and read the code snapshots (and
//! their chunks) of those attempts only. The per-user submission gate is
//! `limits::SubmissionGate`; the secrets an attempt's assignment carries,
//! `secrets::SecretBox::task_secrets`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tacc_compiler::{ChunkHash, Manifest};
use tacc_core::{NodeId, SnapshotId};
use tacc_proto::AttemptRef;
use tacc_store::{Store, TaskRecord};

use crate::{Control, ServerError};

/// Chunk sets of recently read snapshots, so a node fetching a snapshot's chunks does not
/// make the server parse the manifest once per chunk.
#[derive(Debug, Default)]
struct ChunkSets {
    sets: Mutex<HashMap<SnapshotId, Arc<HashSet<String>>>>,
}

/// Snapshots whose chunk sets are kept at most.
const CHUNK_SETS_KEPT: usize = 64;

/// Whether `attempt` is the current attempt of its task (`record`, as the control plane
/// has it) and placed on `node`; with `ended_ok` false it must also still be starting or
/// running.
pub(crate) fn attempt_is_on_node(
    record: Option<&TaskRecord>,
    node: NodeId,
    attempt: AttemptRef,
    ended_ok: bool,
) -> bool {
    record.is_some_and(|record| {
        record.attempt == attempt.attempt
            && record.placements.iter().any(|p| p.node == node)
            && (ended_ok || record.state.is_active())
    })
}

/// Which chunks a node may read: those of the snapshots of its assigned attempts.
#[derive(Debug, Clone)]
pub(crate) struct ChunkAccess {
    store: Arc<dyn Store>,
    sets: Arc<ChunkSets>,
}

impl ChunkAccess {
    pub(crate) fn of(control: &Control) -> ChunkAccess {
        ChunkAccess {
            store: control.store.clone(),
            sets: Arc::default(),
        }
    }

    /// Whether a chunk belongs to one of `snapshots` (those of a node's assigned
    /// attempts: `Control::snapshots_of_node`).
    pub(crate) async fn may_read_chunk(
        &self,
        snapshots: HashSet<SnapshotId>,
        hash: &ChunkHash,
    ) -> Result<bool, ServerError> {
        let wanted = hash.to_string();
        for snapshot in snapshots {
            if self.chunk_set(&snapshot).await?.contains(&wanted) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn chunk_set(&self, snapshot: &SnapshotId) -> Result<Arc<HashSet<String>>, ServerError> {
        if let Some(set) = self.sets.sets.lock().unwrap().get(snapshot) {
            return Ok(set.clone());
        }
        let Some(value) = self.store.get_snapshot(snapshot).await? else {
            return Ok(Arc::default());
        };
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| {
            ServerError::Internal(format!(
                "stored manifest of snapshot {snapshot} is unreadable: {e}"
            ))
        })?;
        let set: Arc<HashSet<String>> =
            Arc::new(manifest.chunk_set().iter().map(|h| h.to_string()).collect());
        let mut sets = self.sets.sets.lock().unwrap();
        if sets.len() >= CHUNK_SETS_KEPT {
            sets.clear();
        }
        sets.insert(snapshot.clone(), set.clone());
        Ok(set)
    }
}

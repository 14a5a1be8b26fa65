//! What a node's credential lets it do (registration: see `enrolment`): report on and
//! upload outputs of its own current attempts only, and read the code snapshots (and
//! their chunks) of those attempts only. Also the submission gate that applies per-user
//! limits, and the secrets an attempt's assignment carries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tacc_compiler::{ChunkHash, Manifest};
use tacc_core::{NodeId, SnapshotId, TaskState};
use tacc_proto::AttemptRef;
use tacc_schema::TaskSpec;
use tacc_store::{TaskFilter, TaskRecord};

use crate::auth::UserCaller;
use crate::{Control, ServerError};

/// Chunk sets of recently read snapshots, so a node fetching a snapshot's chunks does not
/// make the server parse the manifest once per chunk.
#[derive(Debug, Default)]
pub struct ChunkSets {
    sets: Mutex<HashMap<SnapshotId, Arc<HashSet<String>>>>,
}

/// Snapshots whose chunk sets are kept at most.
const CHUNK_SETS_KEPT: usize = 64;

impl Control {
    /// Whether `attempt` is the current attempt of its task and placed on `node`; with
    /// `ended_ok` false it must also still be starting or running.
    pub(crate) async fn attempt_is_on_node(
        &self,
        node: NodeId,
        attempt: AttemptRef,
        ended_ok: bool,
    ) -> Result<bool, ServerError> {
        let Some(record) = self.task_record(attempt.task).await? else {
            return Ok(false);
        };
        Ok(record.attempt == attempt.attempt
            && record.placements.iter().any(|p| p.node == node)
            && (ended_ok || record.state.is_active()))
    }

    /// Whether `node` has an attempt assigned whose code is `snapshot`.
    pub(crate) async fn node_runs_snapshot(&self, node: NodeId, snapshot: &SnapshotId) -> bool {
        self.snapshots_of_node(node).await.contains(snapshot)
    }

    async fn snapshots_of_node(&self, node: NodeId) -> HashSet<SnapshotId> {
        let inner = self.inner.lock().await;
        inner
            .nodes
            .get(&node)
            .map(|live| {
                live.assignments
                    .values()
                    .filter_map(|a| a.instruction.get("snapshot"))
                    .filter_map(|v| serde_json::from_value::<SnapshotId>(v.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a chunk belongs to a snapshot of one of `node`'s assigned attempts.
    pub(crate) async fn node_may_read_chunk(
        &self,
        node: NodeId,
        hash: &ChunkHash,
    ) -> Result<bool, ServerError> {
        let wanted = hash.to_string();
        for snapshot in self.snapshots_of_node(node).await {
            if self.chunk_set(&snapshot).await?.contains(&wanted) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn chunk_set(&self, snapshot: &SnapshotId) -> Result<Arc<HashSet<String>>, ServerError> {
        if let Some(set) = self.chunk_sets.sets.lock().unwrap().get(snapshot) {
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
        let mut sets = self.chunk_sets.sets.lock().unwrap();
        if sets.len() >= CHUNK_SETS_KEPT {
            sets.clear();
        }
        sets.insert(snapshot.clone(), set.clone());
        Ok(set)
    }

    /// The per-user gate in front of every submission: the rate limit, then the cap on
    /// queued tasks.
    pub(crate) async fn admit_submission(&self, user: &UserCaller) -> Result<(), ServerError> {
        self.admit_tasks(user, 1).await
    }

    /// Admit one submission of `tasks` tasks (an array is one submission of many).
    pub(crate) async fn admit_tasks(
        &self,
        user: &UserCaller,
        tasks: u64,
    ) -> Result<(), ServerError> {
        let limits = &self.config.limits;
        self.submit_buckets
            .take(&user.name, limits, Instant::now())?;
        let queued = self
            .store
            .count_tasks(&TaskFilter {
                states: vec![TaskState::Queued],
                user: Some(user.name.clone()),
                ..Default::default()
            })
            .await?;
        if queued + tasks > u64::from(limits.max_queued) {
            let message = if tasks > 1 {
                format!(
                    "user {} has {queued} queued tasks; {tasks} more would pass the {} this \
                     cluster allows: submit a smaller array, or wait for some to start",
                    user.name, limits.max_queued
                )
            } else {
                format!(
                    "user {} already has {queued} queued tasks, the most this cluster allows; \
                     wait for some to start or cancel some",
                    user.name
                )
            };
            return Err(ServerError::TooManyRequests {
                message,
                retry_after_secs: 30,
            });
        }
        Ok(())
    }

    /// The values of the secrets a task names, for its assignments. A secret deleted
    /// since the submission is left out, and the task's log says so.
    pub(crate) async fn task_secrets(
        &self,
        record: &TaskRecord,
        spec: &TaskSpec,
    ) -> BTreeMap<String, String> {
        let mut values = BTreeMap::new();
        for name in &spec.environment.secrets {
            let opened = match self.store.get_secret(&record.user, name).await {
                Ok(Some(sealed)) => self.secret_box.open_value(&sealed),
                Ok(None) => Err(ServerError::NotFound(format!(
                    "secret {name} no longer exists (set it again with `tcloud secret set {name}`)"
                ))),
                Err(e) => Err(e.into()),
            };
            match opened {
                Ok(value) => {
                    values.insert(name.clone(), value);
                }
                Err(e) => {
                    let line =
                        format!("[tacc] secret {name} is not available to this attempt: {e}\n");
                    if let Err(io) = self.logs.append(record.id, &line) {
                        tracing::error!("cannot write the log of task {}: {io}", record.id);
                    }
                }
            }
        }
        values
    }
}

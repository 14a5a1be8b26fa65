//! The compiler layer's share of the server: garbage collection of unreferenced chunks
//! ([`Artifacts`]), the registry of datasets an administrator named, and re-running a
//! task.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tacc_compiler::{ChunkHash, DirChunkStore, GcStats, Manifest};
use tacc_core::TaskId;
use tacc_schema::TaskSpec;
use tacc_store::{Store, TaskRecord};
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

use crate::{Control, ServerError};

/// Commits hold it shared, a garbage-collection pass exclusively: a pass never deletes a
/// chunk between a commit's "every chunk is here" check and the snapshot becoming visible.
pub(crate) static COMMIT_OR_COLLECT: RwLock<()> = RwLock::const_new(());

/// The chunk store and the snapshots that reference its chunks.
#[derive(Debug, Clone)]
pub(crate) struct Artifacts {
    store: Arc<dyn Store>,
    chunks: DirChunkStore,
    /// Unreferenced chunks unused for this long are deleted.
    retention: Duration,
}

impl Artifacts {
    /// The artifacts of `control`'s store and chunk store, kept as configured.
    pub(crate) fn of(control: &Control) -> Artifacts {
        Artifacts {
            store: control.store.clone(),
            chunks: control.chunks.clone(),
            retention: control.config.chunk_retention,
        }
    }

    /// One garbage-collection pass: removes chunks no committed snapshot references that
    /// were not written or offered within the retention period.
    pub async fn collect_garbage(&self) -> Result<GcStats, ServerError> {
        let _exclusive = COMMIT_OR_COLLECT.write().await;
        let mut referenced: BTreeSet<ChunkHash> = BTreeSet::new();
        for id in self.store.list_snapshots().await? {
            let Some(value) = self.store.get_snapshot(&id).await? else {
                continue;
            };
            let manifest: Manifest = serde_json::from_value(value).map_err(|e| {
                // Refuse to collect at all rather than delete chunks of a snapshot we
                // cannot read.
                ServerError::Internal(format!(
                    "stored snapshot {id} is unreadable ({e}); garbage collection skipped"
                ))
            })?;
            referenced.extend(manifest.chunk_set());
        }
        let unused_since = SystemTime::now()
            .checked_sub(self.retention)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let store = self.chunks.clone();
        let stats =
            tokio::task::spawn_blocking(move || store.collect_garbage(&referenced, unused_since))
                .await
                .map_err(|e| ServerError::Internal(e.to_string()))?
                .map_err(|e| ServerError::Internal(format!("garbage collection failed: {e}")))?;
        if stats.chunks_removed > 0 || stats.temp_files_removed > 0 {
            tracing::info!(
                "chunk garbage collection removed {} chunk(s), {} byte(s), {} temporary file(s); kept {}",
                stats.chunks_removed,
                stats.bytes_removed,
                stats.temp_files_removed,
                stats.chunks_kept
            );
        }
        Ok(stats)
    }
}

/// The task spec with every dataset source that names a registered dataset (of
/// `registered`: name → path or URL) replaced by the registered path or URL. Done once at
/// submission, so the task (and every rerun of it) keeps the data it was submitted with
/// even if the registry changes.
pub(crate) fn resolve_registered_datasets(
    mut spec: TaskSpec,
    registered: &BTreeMap<String, String>,
) -> Result<TaskSpec, ServerError> {
    let resolved = tacc_compiler::resolve_datasets(&spec.datasets, registered)
        .map_err(|e| ServerError::InvalidTask(e.to_string()))?;
    for (dataset, mount) in spec.datasets.iter_mut().zip(resolved) {
        dataset.source = mount.source;
    }
    Ok(spec)
}

/// Submit task `id` again to `control` as a new task: same spec (environment and
/// datasets included), same snapshot, same source directory.
pub(crate) async fn rerun(
    control: &Control,
    id: TaskId,
    user: &str,
    keyed: Option<tacc_store::Keyed>,
) -> Result<TaskRecord, ServerError> {
    let record = control
        .query()
        .task(id)
        .await?
        .ok_or(ServerError::TaskNotFound(id))?;
    let spec: TaskSpec = serde_json::from_value(record.spec.clone()).map_err(|e| {
        ServerError::Internal(format!("stored spec of task {id} is unreadable: {e}"))
    })?;
    // A rerun waits for capacity if the run before it did.
    let wait_for_capacity = crate::control::Submission::of(&record).wait_for_capacity;
    let options = crate::control::SubmitOptions {
        source: record.source,
        wait_for_capacity,
        ..Default::default()
    };
    control
        .submit(user, spec, record.snapshot, options, keyed)
        .await
}

/// How often garbage collection runs for a given retention: often enough that chunks do
/// not linger much past it, at most hourly, at least every second.
pub(crate) fn gc_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Collect garbage every [`gc_interval`] until shut down.
pub(crate) async fn run_gc(artifacts: Artifacts, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(gc_interval(artifacts.retention));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {
                if let Err(e) = artifacts.collect_garbage().await {
                    tracing::error!("{e}");
                }
            }
        }
    }
}

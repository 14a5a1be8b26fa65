//! The records of placed tasks (starting or running), kept in memory beside the store, so
//! the hot path — every agent report, every plan — does not read the database for the
//! task it is about. The store stays the truth: every change is committed first and only
//! then applied to the copy, by the store's own transition rule
//! ([`tacc_store::apply_transition`]), so the copy is always what the store holds. A
//! failed commit drops the tasks it touched (they are read afresh); a task that is no
//! longer placed leaves, so the copy is bounded by what runs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use tacc_core::TaskId;
use tacc_store::{Store, StoreError, TaskChange, TaskRecord};

use super::Control;

tokio::task_local! {
    /// Changes of the agent report batch being applied that are not committed yet: they
    /// go into the batch's next commit, or its last (see [`Control::staging_starts`]).
    static STAGED: std::cell::RefCell<Vec<TaskChange>>;
    /// Set when a commit of the turn (or batch) being applied failed.
    static FAILED: std::cell::Cell<bool>;
}

#[derive(Debug, Default)]
pub(crate) struct PlacedRecords {
    records: Mutex<HashMap<TaskId, TaskRecord>>,
    /// Orders commits and cache fills: a record read from the store can never overwrite a
    /// newer one a concurrent commit applied.
    order: tokio::sync::Mutex<()>,
}

impl PlacedRecords {
    fn get(&self, task: TaskId) -> Option<TaskRecord> {
        self.records.lock().unwrap().get(&task).cloned()
    }

    /// Keep `record` while it is placed.
    fn admit(&self, record: &TaskRecord) {
        if record.state.is_active() {
            self.records
                .lock()
                .unwrap()
                .insert(record.id, record.clone());
        }
    }

    fn applied(&self, changes: &[TaskChange]) {
        let mut records = self.records.lock().unwrap();
        for change in changes {
            let Some(task) = change.task() else {
                continue;
            };
            let Some(record) = records.get_mut(&task) else {
                continue;
            };
            let still_placed =
                tacc_store::apply_transition(record, change).is_ok() && record.state.is_active();
            if !still_placed {
                records.remove(&task);
            }
        }
    }

    /// Drop every copy (they are read afresh from the store).
    pub(crate) fn clear(&self) {
        self.records.lock().unwrap().clear();
    }

    /// Whether no placed task's copy is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.records.lock().unwrap().is_empty()
    }

    /// `task`'s record: the copy while it is placed, else read from `store` (with what
    /// the turn under way staged for it applied) and kept if it is placed.
    pub(crate) async fn read(
        &self,
        store: &dyn Store,
        task: TaskId,
    ) -> Result<Option<TaskRecord>, StoreError> {
        if let Some(record) = self.get(task) {
            return Ok(Some(record));
        }
        let _order = self.order.lock().await;
        if let Some(record) = self.get(task) {
            return Ok(Some(record));
        }
        let mut record = store.get_task(task).await?;
        // Read your own writes: what the turn staged for the task and has not committed.
        if let Some(record) = record.as_mut() {
            let _ = STAGED.try_with(|staged| {
                for change in staged.borrow().iter().filter(|c| c.task() == Some(task)) {
                    let _ = tacc_store::apply_transition(record, change);
                }
            });
        }
        if let Some(record) = &record {
            self.admit(record);
        }
        Ok(record)
    }

    fn forget(&self, changes: &[TaskChange]) {
        let mut records = self.records.lock().unwrap();
        for task in changes.iter().filter_map(TaskChange::task) {
            records.remove(&task);
        }
    }
}

/// Drops what a batch staged and never committed from the copies (the batch's request
/// was dropped midway): they are read afresh from the store, which never saw them.
struct StagedGuard<'a>(&'a PlacedRecords);

impl Drop for StagedGuard<'_> {
    fn drop(&mut self) {
        let left = STAGED
            .try_with(|staged| std::mem::take(&mut *staged.borrow_mut()))
            .unwrap_or_default();
        if !left.is_empty() {
            self.0.forget(&left);
        }
    }
}

impl Control {
    /// Apply one agent report batch with its `starting → running` transitions staged:
    /// each is applied to the placed copy at once and committed, in order, with the
    /// batch's next commit — typically the same attempt's end, so a short task's start
    /// and end cost one transaction — or by `batch`'s own [`Control::flush_staged`]
    /// before it is acknowledged. Nothing is acknowledged before it is durable; a failed
    /// commit fails the batch (the agent sends it again).
    pub(crate) async fn staging_starts<T>(
        &self,
        batch: impl std::future::Future<Output = Result<T, crate::ServerError>>,
    ) -> Result<T, crate::ServerError> {
        STAGED
            .scope(
                std::cell::RefCell::new(Vec::new()),
                FAILED.scope(std::cell::Cell::new(false), async {
                    let _guard = StagedGuard(&self.placed);
                    batch.await
                }),
            )
            .await
    }

    /// Commit what the report batch being applied staged and no commit took yet.
    pub(crate) async fn flush_staged(&self) -> Result<(), StoreError> {
        self.commit(&[]).await
    }

    /// Commit `changes` with the turn's (or report batch's) next commit, or its last, when
    /// one is under way ([`Control::staging_starts`]), applied to the placed copies at
    /// once; together at once otherwise.
    pub(crate) async fn stage_all(&self, changes: Vec<TaskChange>) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let staged = STAGED.try_with(|staged| {
            self.placed.applied(&changes);
            staged.borrow_mut().extend(changes.iter().cloned());
        });
        match staged {
            Ok(()) => Ok(()),
            Err(_) => self.commit(&changes).await,
        }
    }

    /// Commit `changes` in one store transaction, timing it, then bring the placed
    /// tasks' copies up to date.
    pub(crate) async fn commit(&self, changes: &[TaskChange]) -> Result<(), StoreError> {
        self.commit_placing(changes, &[]).await
    }

    /// [`Control::commit`], keeping the records of the tasks `changes` place (each as the
    /// store holds it once `changes` are applied).
    pub(crate) async fn commit_placing(
        &self,
        changes: &[TaskChange],
        placed: &[TaskRecord],
    ) -> Result<(), StoreError> {
        // What the report batch being applied staged goes first, in order, in this
        // transaction; if it fails they are staged again, for the batch's last commit to
        // try (and fail the batch with) — a caller that swallows its own failure cannot
        // lose them.
        let staged = STAGED
            .try_with(|staged| std::mem::take(&mut *staged.borrow_mut()))
            .unwrap_or_default();
        let with_staged;
        let changes = if staged.is_empty() {
            changes
        } else {
            with_staged = [&staged[..], changes].concat();
            &with_staged[..]
        };
        if changes.is_empty() {
            return Ok(());
        }
        let result = self.commit_now(changes, placed).await;
        if result.is_err() && !staged.is_empty() {
            let _ = STAGED.try_with(|left| {
                let mut left = left.borrow_mut();
                let later = std::mem::take(&mut *left);
                *left = staged;
                left.extend(later);
            });
        }
        result
    }

    async fn commit_now(
        &self,
        changes: &[TaskChange],
        placed: &[TaskRecord],
    ) -> Result<(), StoreError> {
        // The notifications that ended tasks and groups call for go in the same transaction.
        let notifications = match crate::notify::notifications_for(self, changes).await {
            Ok(notifications) => notifications,
            Err(crate::ServerError::Store(e)) => return Err(e),
            Err(e) => {
                tracing::error!("cannot work out the notifications of a change: {e}");
                Vec::new()
            }
        };
        let with_notifications;
        let changes = if notifications.is_empty() {
            changes
        } else {
            with_notifications = [changes, &notifications[..]].concat();
            &with_notifications[..]
        };
        let _order = self.placed.order.lock().await;
        let started = Instant::now();
        let result = self.store.apply(changes).await;
        self.metrics.committed("apply", started.elapsed());
        match &result {
            Ok(()) => {
                #[cfg(test)]
                self.committed
                    .lock()
                    .unwrap()
                    .extend(changes.iter().cloned());
                self.placed.applied(changes);
                for record in placed {
                    self.placed.admit(record);
                }
            }
            Err(_) => {
                self.placed.forget(changes);
                let _ = FAILED.try_with(|failed| failed.set(true));
            }
        }
        result
    }

    /// Whether a commit of the turn being applied failed; if so, what it staged is dropped
    /// (never to be committed: the turn failed and the core is rebuilt from the store).
    pub(crate) fn discard_if_failed(&self) -> bool {
        let failed = FAILED.try_with(std::cell::Cell::get).unwrap_or(false);
        if failed {
            let left = STAGED
                .try_with(|staged| std::mem::take(&mut *staged.borrow_mut()))
                .unwrap_or_default();
            self.placed.forget(&left);
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use tacc_core::{AttemptNo, TaskState, Timestamp};
    use tacc_store::Transition;

    use super::*;

    fn record(state: TaskState) -> TaskRecord {
        crate::control::rules::test_record(7, state, 1, &[1])
    }

    fn transition(from: TaskState, to: TaskState) -> TaskChange {
        TaskChange::Transition(Transition::new(
            TaskId(7),
            from,
            to,
            AttemptNo(1),
            Timestamp::from_millis(5),
        ))
    }

    #[test]
    fn only_placed_tasks_are_kept_and_they_follow_the_store_rule() {
        let placed = PlacedRecords::default();
        placed.admit(&record(TaskState::Queued));
        assert!(placed.get(TaskId(7)).is_none());
        placed.admit(&record(TaskState::Starting));
        placed.applied(&[transition(TaskState::Starting, TaskState::Running)]);
        let running = placed.get(TaskId(7)).unwrap();
        assert_eq!(running.state, TaskState::Running);
        assert_eq!(running.started_at, Some(Timestamp::from_millis(5)));
        placed.applied(&[transition(TaskState::Running, TaskState::Succeeded)]);
        assert!(placed.get(TaskId(7)).is_none(), "an ended task leaves");
    }

    #[test]
    fn a_change_the_copy_cannot_follow_or_a_failed_commit_drops_the_copy() {
        let placed = PlacedRecords::default();
        placed.admit(&record(TaskState::Running));
        placed.applied(&[transition(TaskState::Starting, TaskState::Running)]);
        assert!(placed.get(TaskId(7)).is_none());
        placed.admit(&record(TaskState::Running));
        placed.forget(&[TaskChange::CancelRequested { task: TaskId(7) }]);
        assert!(placed.get(TaskId(7)).is_none());
    }
}

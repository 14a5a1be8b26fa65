//! The records of placed tasks (starting or running), kept in memory beside the store, so
//! the hot path — every agent report, every plan — does not read the database for the
//! task it is about. The store stays the truth: every change is committed first and only
//! then applied to the copy, by the store's own transition rule
//! ([`tacc_store::apply_transition`]), so the copy is always what the store holds. A
//! failed commit drops the tasks it touched (they are read afresh); a task that is no
//! longer placed leaves, so the copy is bounded by what runs.
//!
//! A report batch stages its changes before it commits them (`STAGED`): they are applied
//! to the copies when staged, and only the changes the copies have not seen yet are
//! applied after the commit (applying a transition twice is a conflict, which dropped
//! the copy and cost a read of every reported task after each batch). A task a staged
//! change ends stays readable until that change is committed — the commit's own
//! notifications read it — and leaves then.

use std::collections::HashMap;
use std::sync::Mutex;

use tacc_core::TaskId;
use tacc_store::{Store, StoreError, TaskChange, TaskRecord};

tokio::task_local! {
    /// Changes of the agent report batch being applied that are not committed yet: they
    /// go into the batch's next commit, or its last (see `Control::staging_starts` (`shell.rs`)).
    pub(super) static STAGED: std::cell::RefCell<Vec<TaskChange>>;
    /// Set when a commit of the turn (or batch) being applied failed.
    pub(super) static FAILED: std::cell::Cell<bool>;
    /// Tasks whose log followers the turn being applied wakes once its changes are
    /// committed: a follower woken sooner reads the task from the store, finds it still
    /// running, and waits out its poll period (a second) for an end already decided.
    pub(super) static LOG_WAKES: std::cell::RefCell<std::collections::BTreeSet<TaskId>>;
}

#[derive(Debug, Default)]
pub(crate) struct PlacedRecords {
    records: Mutex<Copies>,
    /// Orders commits and cache fills: a record read from the store can never overwrite a
    /// newer one a concurrent commit applied.
    pub(super) order: tokio::sync::Mutex<()>,
}

/// The copies: placed tasks, and tasks that a staged, not yet committed change ended.
#[derive(Debug, Default)]
struct Copies {
    placed: HashMap<TaskId, TaskRecord>,
    ending: HashMap<TaskId, TaskRecord>,
}

impl Copies {
    fn get(&self, task: TaskId) -> Option<&TaskRecord> {
        self.placed.get(&task).or_else(|| self.ending.get(&task))
    }

    fn remove(&mut self, task: TaskId) {
        self.placed.remove(&task);
        self.ending.remove(&task);
    }

    /// Apply `changes` to the copies; a copy that cannot follow one is dropped, and one
    /// no longer placed leaves — into `ending` when the change is only staged.
    fn apply(&mut self, changes: &[TaskChange], staged: bool) {
        for change in changes {
            let Some(task) = change.task() else {
                continue;
            };
            let Some(record) = self
                .placed
                .get_mut(&task)
                .or_else(|| self.ending.get_mut(&task))
            else {
                continue;
            };
            let followed = tacc_store::apply_transition(record, change).is_ok();
            if followed && record.state.is_active() {
                // Placed again (a requeued task started anew in the same batch).
                if let Some(record) = self.ending.remove(&task) {
                    self.placed.insert(task, record);
                }
                continue;
            }
            let placed = self.placed.remove(&task);
            if !followed || !staged {
                self.ending.remove(&task);
            } else if let Some(record) = placed {
                self.ending.insert(task, record);
            }
        }
    }
}

impl PlacedRecords {
    fn get(&self, task: TaskId) -> Option<TaskRecord> {
        self.records.lock().unwrap().get(task).cloned()
    }

    /// Keep `record` while it is placed.
    pub(super) fn admit(&self, record: &TaskRecord) {
        if record.state.is_active() {
            let mut copies = self.records.lock().unwrap();
            copies.ending.remove(&record.id);
            copies.placed.insert(record.id, record.clone());
        }
    }

    /// `changes` were committed (none of them staged before): the copies follow them.
    pub(super) fn applied(&self, changes: &[TaskChange]) {
        self.records.lock().unwrap().apply(changes, false);
    }

    /// `changes` are staged for the batch's next commit: the copies follow them now (read
    /// your own writes); a task one of them ends stays readable until it is committed.
    pub(super) fn staged(&self, changes: &[TaskChange]) {
        self.records.lock().unwrap().apply(changes, true);
    }

    /// Staged `changes` were committed: the tasks they ended leave.
    pub(super) fn settled(&self, changes: &[TaskChange]) {
        let mut copies = self.records.lock().unwrap();
        for task in changes.iter().filter_map(TaskChange::task) {
            copies.ending.remove(&task);
        }
    }

    /// Drop every copy (they are read afresh from the store).
    pub(crate) fn clear(&self) {
        let mut copies = self.records.lock().unwrap();
        copies.placed.clear();
        copies.ending.clear();
    }

    /// Whether no task's copy is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        let copies = self.records.lock().unwrap();
        copies.placed.is_empty() && copies.ending.is_empty()
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

    pub(super) fn forget(&self, changes: &[TaskChange]) {
        let mut copies = self.records.lock().unwrap();
        for task in changes.iter().filter_map(TaskChange::task) {
            copies.remove(task);
        }
    }
}

/// Drops what a batch staged and never committed from the copies (the batch's request
/// was dropped midway): they are read afresh from the store, which never saw them.
pub(super) struct StagedGuard<'a>(pub(super) &'a PlacedRecords);

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

    #[test]
    fn a_staged_end_keeps_the_copy_readable_until_it_is_committed() {
        let placed = PlacedRecords::default();
        placed.admit(&record(TaskState::Starting));
        let staged = [
            transition(TaskState::Starting, TaskState::Running),
            transition(TaskState::Running, TaskState::Succeeded),
        ];
        placed.staged(&staged);
        let ending = placed.get(TaskId(7)).expect("read until committed");
        assert_eq!(ending.state, TaskState::Succeeded);
        placed.settled(&staged);
        assert!(
            placed.get(TaskId(7)).is_none(),
            "an ended task leaves once committed"
        );
        assert!(placed.is_empty());
    }

    #[test]
    fn a_staged_change_that_is_committed_is_not_applied_again() {
        let placed = PlacedRecords::default();
        placed.admit(&record(TaskState::Starting));
        let staged = [transition(TaskState::Starting, TaskState::Running)];
        placed.staged(&staged);
        placed.settled(&staged);
        let running = placed.get(TaskId(7)).expect("still placed, still kept");
        assert_eq!(running.state, TaskState::Running);
    }

    #[test]
    fn a_staged_end_that_is_dropped_leaves_nothing() {
        let placed = PlacedRecords::default();
        placed.admit(&record(TaskState::Running));
        let staged = [transition(TaskState::Running, TaskState::Failed)];
        placed.staged(&staged);
        placed.forget(&staged);
        assert!(placed.is_empty());
    }
}

//! Task groups in the control plane: an array is accepted as one group and all its
//! elements in one store transaction, handed to the scheduler as one batch; a group is
//! cancelled in one transaction and one scheduling decision; a rerun of its failed
//! elements is a new group with the same indices. Sweeps and pipelines build their
//! groups on the same calls.

use tacc_core::{GroupId, SnapshotId, TaskState};
use tacc_schema::{ArraySpec, TaskSpec};
use tacc_store::{GroupKind, GroupRecord, NewGroup, NewTask, TaskFilter, TaskRecord};

use super::{Control, Core, request_of};
use crate::ServerError;

/// The states a rerun of "failed" elements starts again.
pub(crate) const RERUN_STATES: [TaskState; 3] =
    [TaskState::Failed, TaskState::Cancelled, TaskState::Lost];

impl Control {
    /// Accept an array: the group and every element durable in one transaction, then
    /// one scheduling decision for all of them. `indices` overrides `spec.array` (a
    /// rerun); `rerun_of` is recorded in the group's spec.
    pub async fn submit_array(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        options: super::SubmitOptions,
        rerun_of: Option<GroupId>,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>), ServerError> {
        let super::SubmitOptions {
            source,
            wait_for_capacity,
            translated,
        } = options;
        let (spec, mut submission) = self
            .prepare(user, spec, &snapshot, wait_for_capacity)
            .await?;
        submission.overrides.splice(0..0, translated);
        let submission = submission.to_json();
        let Some(array) = spec.array.clone() else {
            return Err(ServerError::InvalidTask(
                "the task has no `array:`; submit it as a single task".into(),
            ));
        };
        let mut group_spec =
            serde_json::to_value(&spec).map_err(|e| ServerError::Internal(e.to_string()))?;
        if let (Some(of), Some(object)) = (rerun_of, group_spec.as_object_mut()) {
            object.insert("rerun_of".into(), serde_json::json!(of.0));
        }
        // An element is the task without the array, and notifies nothing itself: the
        // group reports once, when every element has ended.
        let element = TaskSpec {
            array: None,
            notify: None,
            ..spec
        };
        let element_json =
            serde_json::to_value(&element).map_err(|e| ServerError::Internal(e.to_string()))?;
        let at = self.clock.now();
        let elements: Vec<(u32, NewTask)> = array
            .indices()
            .iter()
            .map(|index| {
                (
                    *index,
                    NewTask {
                        name: element.name.clone(),
                        user: user.to_string(),
                        spec: element_json.clone(),
                        snapshot: snapshot.clone(),
                        source: source.clone(),
                        submitted_at: at,
                        submission: submission.clone(),
                    },
                )
            })
            .collect();
        let committing = std::time::Instant::now();
        let new_group = NewGroup {
            kind: GroupKind::Array,
            name: element.name.clone(),
            user: user.to_string(),
            spec: group_spec,
            created_at: at,
        };
        let (group, records) = match keyed {
            Some(keyed) => {
                self.store
                    .create_group_keyed(new_group, elements, keyed)
                    .await?
            }
            None => self.store.create_group(new_group, elements).await?,
        };
        self.metrics.committed("create_group", committing.elapsed());
        for _ in &records {
            self.metrics.submitted();
        }
        let identity_group = self.auth.group_of(user).await?;
        let mut inner = self.inner.lock().await;
        inner
            .identity_groups
            .insert(user.to_string(), identity_group);
        let owner_group = inner.group_for(&self.config, user);
        for record in &records {
            inner.specs.insert(record.id, element.clone());
        }
        let submitted = records
            .iter()
            .map(|record| {
                let request = request_of(&element, record, at, owner_group.clone());
                (record.id, request)
            })
            .collect();
        self.queue_new(&mut inner, submitted).await?;
        Ok((group, records))
    }

    /// Cancel every unfinished element: the queued ones in one transaction and one
    /// scheduling decision, the placed ones as single tasks are. Returns how many were
    /// asked to stop.
    pub async fn cancel_group(&self, group: GroupId) -> Result<u64, ServerError> {
        // A cancelled sweep launches no more trials.
        self.close_sweep(group);
        // A pipeline's single stages are its own elements; its array stages are groups.
        let count = self.cancel_group_elements(group).await?;
        let count = count + self.cancel_pipeline_arrays(group).await?;
        // A cancelled sweep stage ends the stages after it.
        self.sweep_stage_ended(group).await?;
        Ok(count)
    }

    /// Cancel the unfinished elements of one group (see [`Control::cancel_group`]).
    pub(super) async fn cancel_group_elements(&self, group: GroupId) -> Result<u64, ServerError> {
        self.turn(async |core: &mut Core| {
            // Read the elements in the turn: a queued one may start at any moment outside it.
            let open = self
                .store
                .list_tasks(&TaskFilter {
                    group: Some(group),
                    states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                    ..Default::default()
                })
                .await?;
            // The placed elements' records as the turn knows them (their copies).
            let mut records = Vec::with_capacity(open.len());
            for record in open {
                if record.state == TaskState::Queued {
                    records.push(record);
                } else if let Some(placed) = self.facts.task_record(record.id).await? {
                    records.push(placed);
                }
            }
            let mut fx = super::effects::Effects::default();
            let count = super::handlers::cancel::on_cancel_group(
                core,
                &mut fx,
                records,
                self.clock.now(),
                &self.config,
            );
            self.carry(core, fx).await?;
            Ok(count)
        })
        .await
    }

    /// Submit again, as a new group, the elements of `group` that failed, were cancelled
    /// or were lost, each with its index; `None` when none did.
    pub async fn rerun_failed(
        &self,
        group: &GroupRecord,
        user: &str,
    ) -> Result<Option<(GroupRecord, Vec<TaskRecord>)>, ServerError> {
        if group.kind == GroupKind::Sweep {
            return Err(ServerError::InvalidTask(format!(
                "{} is a sweep: its stopped trials are its search, not failures; submit the \
                 task file again to run a new sweep",
                group.id
            )));
        }
        let ended = self
            .store
            .list_tasks(&TaskFilter {
                group: Some(group.id),
                states: RERUN_STATES.to_vec(),
                ..Default::default()
            })
            .await?;
        let Some(first) = ended.first() else {
            return Ok(None);
        };
        let mut indices: Vec<u32> = ended.iter().filter_map(|t| t.group_index).collect();
        indices.sort_unstable();
        let array = ArraySpec::of_indices(&indices)
            .map_err(|e| ServerError::Internal(format!("rerun of {}: {e}", group.id)))?;
        let mut spec: TaskSpec = serde_json::from_value(strip_rerun_of(group.spec.clone()))
            .map_err(|e| {
                ServerError::Internal(format!(
                    "stored spec of group {} is unreadable: {e}",
                    group.id
                ))
            })?;
        spec.array = Some(array);
        let source = first.source.clone();
        let snapshot = first.snapshot.clone();
        // A rerun waits for capacity if the run before it did.
        let wait_for_capacity = super::Submission::of(first).wait_for_capacity;
        let options = super::SubmitOptions {
            source,
            wait_for_capacity,
            ..Default::default()
        };
        self.submit_array(user, spec, snapshot, options, Some(group.id), None)
            .await
            .map(Some)
    }

    /// The elements of a group, by index.
    pub(crate) async fn group_elements(
        &self,
        group: GroupId,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        let mut elements = self
            .store
            .list_tasks(&TaskFilter {
                group: Some(group),
                ..Default::default()
            })
            .await?;
        elements.sort_by_key(|t| (t.group_index, t.id));
        Ok(elements)
    }
}

/// A group's stored spec without the rerun mark, which is no task field.
fn strip_rerun_of(mut spec: serde_json::Value) -> serde_json::Value {
    if let Some(object) = spec.as_object_mut() {
        object.remove("rerun_of");
    }
    spec
}

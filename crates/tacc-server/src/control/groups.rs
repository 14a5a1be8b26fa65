//! Task arrays, a workflow of their own beside the control plane: an array is accepted
//! as one group and all its elements in one store transaction, handed to the scheduler
//! as one batch; a group is cancelled in one transaction and one scheduling decision; a
//! rerun of its failed elements is a new group with the same indices. What is decided
//! about them is in `rules/arrays.rs`; what must run in a turn of the control plane
//! goes through its entry points (`Control::accept`, `Control::cancel_group_elements`).

use std::sync::Arc;

use tacc_core::{GroupId, SnapshotId};
use tacc_schema::TaskSpec;
use tacc_store::{GroupRecord, StageSource, TaskRecord};

use super::handlers::accepted::Accepted;
use super::rules::arrays::{ArraySubmitted, new_array, rerun};
use super::workflow_parts::WorkflowParts;
use super::{Control, SubmitOptions};
use crate::ServerError;

/// Submits, cancels and reruns groups.
#[derive(Debug, Clone)]
pub(crate) struct Arrays {
    parts: WorkflowParts,
}

impl Arrays {
    /// The arrays of `control`'s cluster.
    pub(crate) fn of(control: &Arc<Control>) -> Arrays {
        Arrays {
            parts: WorkflowParts::of(control),
        }
    }

    /// Accept an array: the group and every element durable in one transaction, then
    /// one scheduling decision for all of them. `rerun_of` is recorded in the group's
    /// spec.
    pub(crate) async fn submit(
        &self,
        user: &str,
        spec: TaskSpec,
        snapshot: SnapshotId,
        options: SubmitOptions,
        rerun_of: Option<GroupId>,
        keyed: Option<tacc_store::Keyed>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>), ServerError> {
        let SubmitOptions {
            source,
            wait_for_capacity,
            translated,
        } = options;
        let (spec, mut submission) = self
            .parts
            .control
            .prepare(user, spec, &snapshot, wait_for_capacity)
            .await?;
        submission.overrides.splice(0..0, translated);
        let submission = submission.to_json();
        let array = new_array(
            spec,
            &ArraySubmitted {
                user,
                snapshot: &snapshot,
                source: &source,
                at: self.parts.clock.now(),
                submission: &submission,
                rerun_of,
            },
        )?;
        let committing = std::time::Instant::now();
        let (group, records) = match keyed {
            Some(keyed) => {
                self.parts
                    .store
                    .create_group_keyed(array.group, array.elements, keyed)
                    .await?
            }
            None => {
                self.parts
                    .store
                    .create_group(array.group, array.elements)
                    .await?
            }
        };
        self.parts
            .metrics
            .committed("create_group", committing.elapsed());
        for _ in &records {
            self.parts.metrics.submitted();
        }
        let accepted = Accepted {
            tasks: records
                .iter()
                .map(|record| (record.clone(), array.element.clone()))
                .collect(),
            ..Default::default()
        };
        self.parts.control.accept(user, accepted).await?;
        Ok((group, records))
    }

    /// Cancel every unfinished element: the queued ones in one transaction and one
    /// scheduling decision, the placed ones as single tasks are. A pipeline's single
    /// stages are its own elements; its array and sweep stages are groups of their own,
    /// cancelled with it. Returns how many were asked to stop.
    pub(crate) async fn cancel(&self, group: GroupId) -> Result<u64, ServerError> {
        // A cancelled sweep launches no more trials.
        self.parts.sweeps.remove(group);
        let mut count = self.parts.control.cancel_group_elements(group).await?;
        for stage in self.parts.facts.pipeline_stages(group).await? {
            if let (StageSource::Group(stage_group), false) = (stage.source, stage.cached) {
                self.parts.sweeps.remove(stage_group);
                count += self
                    .parts
                    .control
                    .cancel_group_elements(stage_group)
                    .await?;
            }
        }
        // A cancelled sweep stage ends the stages after it.
        self.parts.control.sweep_stage_ended(group).await?;
        Ok(count)
    }

    /// Submit again, as a new group, the elements of `group` that failed, were cancelled
    /// or were lost, each with its index; `None` when none did.
    pub(crate) async fn rerun_failed(
        &self,
        group: &GroupRecord,
        user: &str,
    ) -> Result<Option<(GroupRecord, Vec<TaskRecord>)>, ServerError> {
        let ended = self.parts.facts.rerun_elements(group.id).await?;
        let Some(rerun) = rerun(group, &ended)? else {
            return Ok(None);
        };
        self.submit(
            user,
            rerun.spec,
            rerun.snapshot,
            rerun.options,
            Some(group.id),
            None,
        )
        .await
        .map(Some)
    }
}

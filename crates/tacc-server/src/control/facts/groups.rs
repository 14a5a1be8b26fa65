//! Groups' elements: every element of a group by index, the unfinished ones a cancel
//! stops, and the failed ones a rerun starts again.

use tacc_core::{GroupId, TaskState};
use tacc_store::{GroupRecord, TaskFilter, TaskRecord};

use super::Facts;
use crate::ServerError;
use crate::control::rules::arrays::RERUN_STATES;

impl Facts {
    /// A group's record.
    pub(crate) async fn group(&self, group: GroupId) -> Result<Option<GroupRecord>, ServerError> {
        Ok(self.store.get_group(group).await?)
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

    /// The unfinished elements of a group: the queued ones as the store holds them, the
    /// placed ones as the turn under way knows them (their copies). Read in the turn that
    /// cancels them: a queued one may start at any moment outside it.
    pub(crate) async fn unfinished_elements(
        &self,
        group: GroupId,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        let open = self
            .store
            .list_tasks(&TaskFilter {
                group: Some(group),
                states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        let mut records = Vec::with_capacity(open.len());
        for record in open {
            if record.state == TaskState::Queued {
                records.push(record);
            } else if let Some(placed) = self.task_record(record.id).await? {
                records.push(placed);
            }
        }
        Ok(records)
    }

    /// The elements of a group a rerun starts again: those that failed, were cancelled
    /// or were lost.
    pub(crate) async fn rerun_elements(
        &self,
        group: GroupId,
    ) -> Result<Vec<TaskRecord>, ServerError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                group: Some(group),
                states: RERUN_STATES.to_vec(),
                ..Default::default()
            })
            .await?)
    }
}

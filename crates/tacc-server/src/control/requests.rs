//! What the scheduler is told of a task, from its spec and its record (plain
//! functions, used by handlers and the shell alike).

use tacc_core::Timestamp;
use tacc_scheduler::{Placement, TaskRequest};
use tacc_schema::TaskSpec;
use tacc_store::{StoredPlacement, TaskRecord};

use super::Submission;
use crate::ServerError;

pub(crate) fn spec_of(record: &TaskRecord) -> Result<TaskSpec, ServerError> {
    serde_json::from_value(record.spec.clone()).map_err(|e| {
        ServerError::Internal(format!(
            "stored spec of task {} is unreadable: {e}",
            record.id
        ))
    })
}

/// What the scheduler is told about a task. `group` is the owner's group from their
/// identity, used where the configuration file does not name one for them.
pub(crate) fn request_of(
    spec: &TaskSpec,
    record: &TaskRecord,
    at: Timestamp,
    group: Option<String>,
) -> TaskRequest {
    TaskRequest {
        wait_for_capacity: Submission::of(record).wait_for_capacity,
        ..request_for(spec, &record.user, at, group)
    }
}

/// What the scheduler is told about a task `user` submits (before it has a record).
pub(crate) fn request_for(
    spec: &TaskSpec,
    user: &str,
    at: Timestamp,
    group: Option<String>,
) -> TaskRequest {
    TaskRequest {
        group,
        user: tacc_core::UserName::new(user.to_string()),
        per_node: spec.resources.per_node(),
        gpu_share: spec.resources.gpu_share_percent(),
        nodes: spec.resources.nodes,
        gpu_type: spec.resources.gpu_type.clone(),
        priority: spec.priority,
        preemptible: spec.preemptible,
        time_limit_secs: spec.resources.time_limit.map(|t| t.as_secs()),
        submitted_at: at,
        node_selector: crate::node_selector::of(spec),
        ..TaskRequest::default()
    }
}

pub(crate) fn placements_of(stored: &[StoredPlacement]) -> Vec<Placement> {
    stored
        .iter()
        .map(|p| Placement {
            node: p.node,
            gpu_indices: p.gpu_indices.clone(),
        })
        .collect()
}

//! What a submission is told beyond "accepted", decided once at submit and kept with the
//! task (the store's `submission` column):
//!
//! - **refusal**: a request the cluster can never hold, or one above a hard limit of its
//!   user or group, is refused before anything is stored, with the scheduler's own reason
//!   (`Scheduler::refusal`, the decision its submit event makes) and the task file's field
//!   at fault. `--wait-for-capacity` accepts a request that no node holds yet, on purpose;
//!   it then waits aside until one registers.
//! - **overrides**: what the platform changes of what the task asked for (a priority above
//!   the user's maximum, a default time limit, and what the client translated of a legacy
//!   task file), each said at submit and shown by `tcloud show` beside the spec as asked.

use serde::{Deserialize, Serialize};
use tacc_compiler::Instruction;
use tacc_core::{HumanDuration, Priority};
use tacc_proto::Override;
use tacc_scheduler::{LimitKind, MisfitPart, PendingReason, Refusal, SchedulerConfig};
use tacc_schema::{SchemaError, TaskSpec};
use tacc_store::TaskRecord;

use crate::ServerError;

/// What a submission says beside its spec and snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Where the task file came from (informational, `tcloud show`).
    pub source: Option<String>,
    /// Accept a request no node can hold today, for a cluster that will grow.
    pub wait_for_capacity: bool,
    /// What the client changed translating the task file (legacy options), kept first
    /// among the overrides.
    pub translated: Vec<Override>,
}

/// How a task was submitted beyond its spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Submission {
    /// Accepted on purpose while no node could hold it (`--wait-for-capacity`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_capacity: bool,
    /// What the platform changed of what the task asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<Override>,
}

impl Submission {
    /// The submission kept with `record`; a record from before submissions were kept (or
    /// an unreadable one) reads as a plain submission.
    pub(crate) fn of(record: &TaskRecord) -> Submission {
        serde_json::from_value(record.submission.clone()).unwrap_or_default()
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|_| serde_json::json!({}))
    }

    /// The instruction compiled from the spec as asked, made to say what applies: the
    /// priority the task runs with (`TACC_PRIORITY`, `tcloud show --instruction`) is the
    /// lowered one, as the scheduler ranks it.
    pub(crate) fn apply_to(&self, instruction: &mut Instruction) {
        let lowered = self
            .overrides
            .iter()
            .filter(|o| o.field == "priority")
            .find_map(|o| o.applied.parse::<Priority>().ok());
        if let Some(priority) = lowered {
            instruction.priority = priority;
        }
    }
}

/// What the platform changes of `spec`, submitted by `user`, under `config`.
pub(crate) fn overrides(spec: &TaskSpec, user: &str, config: &SchedulerConfig) -> Vec<Override> {
    let mut overrides = Vec::new();
    let cap = config.priority_cap(user);
    if spec.priority > cap {
        overrides.push(Override {
            field: "priority".into(),
            asked: Some(spec.priority.to_string()),
            applied: cap.to_string(),
            why: format!(
                "{user} may use at most priority `{cap}` on this cluster (its scheduler \
                 configuration's max_priority); an administrator can raise it"
            ),
        });
    }
    if spec.resources.time_limit.is_none()
        && let Some(default) = config.default_time_limit_secs
    {
        overrides.push(Override {
            field: "resources.time_limit".into(),
            asked: None,
            applied: HumanDuration::from_secs(default).to_string(),
            why: "the cluster's default, which the scheduler plans with (backfill, start \
                  estimates); the task is not stopped at it. Set `resources.time_limit` to \
                  be planned and stopped at your own"
                .into(),
        });
    }
    overrides
}

/// The refusal of a submission as the error the API answers with: the scheduler's reason,
/// located at the task file's field when one is at fault (tcloud then points at its line),
/// with what the user can do.
pub(crate) fn refused(refusal: Refusal) -> ServerError {
    let reason = refusal.reason.to_string();
    let (field, help) = match (&refusal.reason, refusal.misfit) {
        (PendingReason::CannotFit { .. }, part) => (
            part.map(misfit_field),
            "ask for what a node of this cluster has (`tcloud nodes` lists them), or submit \
             with `--wait-for-capacity` if a node that can hold it will join"
                .to_string(),
        ),
        (
            PendingReason::OverUserQuota {
                limit: LimitKind::QueuedTasks,
                ..
            }
            | PendingReason::OverGroupQuota {
                limit: LimitKind::QueuedTasks,
                ..
            },
            _,
        ) => (
            None,
            "submit again once some of the queued tasks have started, or cancel some \
             (`tcloud ps`)"
                .to_string(),
        ),
        (
            PendingReason::OverUserQuota { limit, .. }
            | PendingReason::OverGroupQuota { limit, .. },
            _,
        ) => (
            limit_field(*limit),
            "ask for less, or ask an administrator to raise the limit (`tcloud why` shows \
             your limits)"
                .to_string(),
        ),
        _ => (None, String::new()),
    };
    let message = format!("refused at submit: {reason}");
    ServerError::InvalidTask(match field {
        Some(field) => SchemaError::Invalid {
            field: field.to_string(),
            message,
            help: (!help.is_empty()).then_some(help),
        }
        .to_string(),
        None if help.is_empty() => message,
        None => format!("{message}; {help}"),
    })
}

/// The task file's field that asks for `part`.
fn misfit_field(part: MisfitPart) -> &'static str {
    match part {
        MisfitPart::Nodes => "resources.nodes",
        MisfitPart::GpuType => "resources.gpu_type",
        MisfitPart::Gpus => "resources.gpus",
        MisfitPart::Cpus => "resources.cpus",
        MisfitPart::Memory => "resources.memory",
    }
}

/// The task file's field a hard limit of this kind weighs, if one does.
fn limit_field(limit: LimitKind) -> Option<&'static str> {
    match limit {
        LimitKind::Gpus => Some("resources.gpus"),
        LimitKind::Cpus => Some("resources.cpus"),
        LimitKind::RunningTasks | LimitKind::QueuedTasks => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> TaskSpec {
        tacc_schema::parse_task("t/task.yaml", text).unwrap().0
    }

    #[test]
    fn a_priority_above_the_cap_and_a_default_time_limit_are_overrides() {
        let config = SchedulerConfig {
            default_max_priority: Some(Priority::Normal),
            default_time_limit_secs: Some(86400),
            ..SchedulerConfig::default()
        };
        let asked = spec("priority: high\nrun: 'true'\n");
        assert_eq!(asked.priority, Priority::High);
        let found = overrides(&asked, "bob", &config);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].field, "priority");
        assert_eq!(found[0].asked.as_deref(), Some("high"));
        assert_eq!(found[0].applied, "normal");
        assert_eq!(found[1].field, "resources.time_limit");
        assert_eq!(found[1].asked, None);
        let within = spec("priority: normal\nresources: {time_limit: 1h}\nrun: 'true'\n");
        assert!(overrides(&within, "bob", &config).is_empty());
    }

    #[test]
    fn a_misfit_is_located_at_its_field() {
        let error = refused(Refusal {
            reason: PendingReason::CannotFit {
                detail: "largest node: 2 cpu".into(),
            },
            misfit: Some(MisfitPart::Cpus),
        });
        let text = error.to_string();
        let Some(SchemaError::Invalid { field, help, .. }) =
            SchemaError::invalid_from_rendered(&text)
        else {
            panic!("{text}");
        };
        assert_eq!(field, "resources.cpus");
        assert!(help.unwrap().contains("--wait-for-capacity"));
    }
}

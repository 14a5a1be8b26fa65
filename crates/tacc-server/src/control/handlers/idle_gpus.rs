//! With every liveness check, the running attempts that hold GPUs are checked against
//! the operator's idle-GPU policy (`rules::idle_gpus`). A warning goes into the task's
//! log, `tcloud top`'s flags and the owner's webhook; the action stops the attempt to
//! requeue it (its checkpoint signal first, as a preemption) or cancels it, with a reason
//! that says why.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{TaskState, Timestamp};
use tacc_proto::AttemptRef;
use tacc_store::{TaskChange, TaskRecord};

use super::ending::{End, on_attempt_end};
use super::plan::withdraw_to_requeue;
use crate::control::effects::Effects;
use crate::control::rules::idle_gpus::{self, GpuAttempt, IdleGpuAction, IdleVerdict};
use crate::control::{Core, IdleGpuPolicy, ServerConfig};

/// The attempts the policy looks at: running on nodes, holding GPUs, not being
/// preempted. Warnings of attempts that left are forgotten. The shell reads their records
/// and their ranks' last busy GPU samples for [`on_idle_gpu_check`].
pub(crate) fn watched(core: &mut Core) -> BTreeSet<AttemptRef> {
    let running: BTreeSet<AttemptRef> = core
        .nodes
        .values()
        .flat_map(|live| live.assignments.keys().copied())
        .collect();
    core.idle_warned
        .retain(|attempt, _| running.contains(attempt));
    running
        .into_iter()
        .filter(|attempt| {
            core.specs
                .get(&attempt.task)
                .is_some_and(|spec| spec.resources.per_node().gpus > 0)
                && !core.preempting.contains(&attempt.task)
        })
        .collect()
}

/// What the shell found of a watched attempt.
#[derive(Debug)]
pub(crate) struct Watched {
    pub attempt: AttemptRef,
    /// The task's record as the store holds it.
    pub record: TaskRecord,
    /// When each rank's GPUs were last sampled busy.
    pub busy_at: BTreeMap<u32, Timestamp>,
}

/// A change of an attempt's idle-GPU warning, for the usage book (`tcloud top`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IdleWarning {
    pub attempt: AttemptRef,
    /// The warning and when it was given; `None` lifts it.
    pub warning: Option<(Timestamp, String)>,
}

pub(crate) fn on_idle_gpu_check(
    core: &mut Core,
    fx: &mut Effects,
    config: &ServerConfig,
    policy: &IdleGpuPolicy,
    now: Timestamp,
    watched: Vec<Watched>,
) {
    let mut records = BTreeMap::new();
    let mut attempts = Vec::new();
    for Watched {
        attempt,
        record,
        busy_at,
    } in watched
    {
        if record.state != TaskState::Running || record.attempt != attempt.attempt {
            continue;
        }
        attempts.push(GpuAttempt {
            attempt,
            user: record.user.clone(),
            group: core.scheduler.config().group_of(&record.user, None),
            ranks: record.placements.len().max(1) as u32,
            busy_at,
            warned_at: core.idle_warned.get(&attempt).copied(),
        });
        records.insert(attempt, record);
    }
    for verdict in idle_gpus::decide(policy, &attempts, now) {
        match verdict {
            IdleVerdict::Warn { attempt, message } => {
                core.idle_warned.insert(attempt, now);
                fx.idle_warnings.push(IdleWarning {
                    attempt,
                    warning: Some((now, message.clone())),
                });
                note_in_log(fx, attempt, &message);
                // The owner's webhook hears of it too, before anything is done.
                if let Some(call) = records
                    .get(&attempt)
                    .and_then(|record| crate::notify::warning(record, "idle_gpu", &message, now))
                {
                    fx.change(call);
                }
            }
            IdleVerdict::Clear { attempt } => {
                core.idle_warned.remove(&attempt);
                fx.idle_warnings.push(IdleWarning {
                    attempt,
                    warning: None,
                });
                note_in_log(
                    fx,
                    attempt,
                    "its GPUs are used again: the warning is lifted",
                );
            }
            IdleVerdict::Act {
                attempt,
                action,
                reason,
            } => {
                core.idle_warned.remove(&attempt);
                fx.idle_warnings.push(IdleWarning {
                    attempt,
                    warning: None,
                });
                note_in_log(fx, attempt, &reason);
                let Some(record) = records.remove(&attempt) else {
                    continue;
                };
                match action {
                    IdleGpuAction::CheckpointAndRequeue => {
                        fx.change(TaskChange::Reason {
                            task: attempt.task,
                            reason: Some(format!("{reason}: stopping to requeue")),
                        });
                        core.requeue_reasons.insert(attempt.task, reason);
                        withdraw_to_requeue(core, fx, attempt.task);
                    }
                    IdleGpuAction::Cancel => on_attempt_end(
                        core,
                        fx,
                        End {
                            record,
                            state: TaskState::Cancelled,
                            reason: Some(reason),
                            exit_code: None,
                            at: now,
                            node_failure: false,
                            retry_as: None,
                            earlier_node_losses: 0,
                            config,
                        },
                    ),
                    IdleGpuAction::Warn => {}
                }
            }
        }
    }
}

/// A line of the platform's in the attempt's task log.
fn note_in_log(fx: &mut Effects, attempt: AttemptRef, text: &str) {
    fx.log_line(attempt.task, format!("tacc: {text}\n"));
}

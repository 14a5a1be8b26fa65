//! The shell around `rules::idle_gpus`: with every liveness check, the running attempts
//! that hold GPUs are checked against the operator's policy. A warning goes into the
//! task's log and `tcloud top`'s flags; the action stops the attempt to requeue it (its
//! checkpoint signal first, as a preemption) or cancels it, with a reason that says why.

use std::collections::BTreeSet;

use tacc_core::TaskState;
use tacc_proto::AttemptRef;
use tacc_store::TaskChange;

use super::rules::idle_gpus::{self, GpuAttempt, IdleGpuAction, IdleVerdict};
use super::{Control, Core};
use crate::ServerError;

impl Control {
    /// Apply the idle-GPU policy now (nothing without one).
    pub(super) async fn apply_idle_gpu_policy(&self, inner: &mut Core) -> Result<(), ServerError> {
        let Some(policy) = self.config.idle_gpu.clone() else {
            return Ok(());
        };
        let running: BTreeSet<AttemptRef> = inner
            .nodes
            .values()
            .flat_map(|live| live.assignments.keys().copied())
            .collect();
        inner
            .idle_warned
            .retain(|attempt, _| running.contains(attempt));
        let mut attempts = Vec::new();
        for attempt in running {
            let holds_gpus = inner
                .specs
                .get(&attempt.task)
                .is_some_and(|spec| spec.resources.per_node().gpus > 0);
            if !holds_gpus || inner.preempting.contains(&attempt.task) {
                continue;
            }
            let Some(record) = self.task_record(attempt.task).await? else {
                continue;
            };
            if record.state != TaskState::Running || record.attempt != attempt.attempt {
                continue;
            }
            let group = inner.scheduler.config().group_of(&record.user, None);
            attempts.push(GpuAttempt {
                attempt,
                user: record.user.clone(),
                group,
                ranks: record.placements.len().max(1) as u32,
                busy_at: self.usage.gpu_busy_ranks(attempt),
                warned_at: inner.idle_warned.get(&attempt).copied(),
            });
        }
        let now = self.clock.now();
        for verdict in idle_gpus::decide(&policy, &attempts, now) {
            match verdict {
                IdleVerdict::Warn { attempt, message } => {
                    inner.idle_warned.insert(attempt, now);
                    self.usage
                        .set_idle_warning(attempt, Some((now, message.clone())));
                    self.note_in_log(attempt, &message);
                    // The owner's webhook hears of it too, before anything is done.
                    if let Some(record) = self.task_record(attempt.task).await?
                        && let Some(call) =
                            crate::notify::warning(&record, "idle_gpu", &message, now)
                    {
                        self.commit(&[call]).await?;
                    }
                }
                IdleVerdict::Clear { attempt } => {
                    inner.idle_warned.remove(&attempt);
                    self.usage.set_idle_warning(attempt, None);
                    self.note_in_log(attempt, "its GPUs are used again: the warning is lifted");
                }
                IdleVerdict::Act {
                    attempt,
                    action,
                    reason,
                } => {
                    inner.idle_warned.remove(&attempt);
                    self.usage.set_idle_warning(attempt, None);
                    self.note_in_log(attempt, &reason);
                    let Some(record) = self.task_record(attempt.task).await? else {
                        continue;
                    };
                    match action {
                        IdleGpuAction::CheckpointAndRequeue => {
                            self.commit(&[TaskChange::Reason {
                                task: attempt.task,
                                reason: Some(format!("{reason}: stopping to requeue")),
                            }])
                            .await?;
                            inner.requeue_reasons.insert(attempt.task, reason);
                            let mut fx = super::effects::Effects::default();
                            super::handlers::plan::withdraw_to_requeue(
                                inner,
                                &mut fx,
                                attempt.task,
                            );
                            self.carry(inner, fx).await?;
                        }
                        IdleGpuAction::Cancel => {
                            self.end_attempt(
                                inner,
                                record,
                                TaskState::Cancelled,
                                Some(reason),
                                None,
                                now,
                                false,
                            )
                            .await?;
                        }
                        IdleGpuAction::Warn => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// A line of the platform's in `attempt`'s task log; a log that cannot be written
    /// costs the line only.
    fn note_in_log(&self, attempt: AttemptRef, text: &str) {
        if let Err(e) = self
            .logs
            .append_line(attempt.task, &format!("tacc: {text}\n"))
        {
            tracing::warn!("cannot write to the log of task {}: {e}", attempt.task);
        }
    }
}

//! How attempts end: agents' reports applied in order (each checked against the attempt
//! it claims), a node's part of a gang finishing, the first failure ending the attempt for
//! all its ranks and naming them, lost and fenced attempts, preempted attempts requeued,
//! and the retry policy.

use tacc_core::{NodeId, TaskState, Timestamp};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};
use tacc_scheduler::Event;
use tacc_store::{TaskChange, TaskRecord, Transition};

use super::rules::admission::Admission;
use super::rules::ending::AttemptEnd;
use super::{Control, Inner, LiveNode, request_of, retry, rules};
use crate::ServerError;

impl Control {
    /// Apply an agent's reports, in order.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let mut inner = self.inner.lock().await;
        match inner.nodes.get_mut(&node) {
            Some(live) => live.last_seen = self.clock.instant(),
            None => return Err(ServerError::NodeNotFound(node)),
        }
        // One scheduling decision for everything the batch ended, not one per attempt:
        // with a long queue each decision walks it, and a batch may end dozens.
        inner.deferred = Some(Vec::new());
        let inner = &mut *inner;
        self.staging_starts(async {
            let mut applied = self.apply_reports(inner, node, reports).await;
            if applied.is_ok()
                && let Err(e) = self.flush_staged().await
            {
                applied = Err(e.into());
            }
            let events = inner.deferred.take().unwrap_or_default();
            if !events.is_empty() {
                self.drive(inner, Event::Batch(events)).await;
            }
            applied
        })
        .await
    }

    async fn apply_reports(
        &self,
        inner: &mut Inner,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let mut ack = tacc_proto::ReportsAck::default();
        for report in reports {
            if let AgentReport::Usage(sample) = report {
                let attempt = sample.attempt;
                let kept = sample.clone();
                let record = self.task_record(sample.attempt.task).await?;
                let accepted = self.usage.accept(
                    &*self.store,
                    &self.metrics,
                    &*self.clock,
                    record.as_ref(),
                    node,
                    sample,
                );
                if accepted.await? {
                    self.adapt(inner, &kept).await;
                    ack.accepted += 1;
                } else {
                    ack.rejected += 1;
                    self.audit.record_as(
                        format!("node:{node}"),
                        "report.rejected",
                        format!("task:{}/{}", attempt.task, attempt.attempt),
                        false,
                        "usage report for a rank this node does not run".into(),
                    );
                }
                continue;
            }
            // Never trust the other side: a report counts only for an attempt of this
            // node's own, and an ending only while the attempt has not ended yet.
            let (attempt, ending) = match &report {
                AgentReport::Log { attempt, .. } | AgentReport::RuntimeChosen { attempt, .. } => {
                    (*attempt, false)
                }
                AgentReport::Started { attempt, .. } => (*attempt, false),
                AgentReport::Finished { attempt, .. } => (*attempt, true),
                AgentReport::Usage(sample) => (sample.attempt, false),
                AgentReport::Resized { attempt, .. } => (*attempt, false),
                AgentReport::Metrics { attempt, .. } => (*attempt, false),
            };
            let record = self.task_record(attempt.task).await?;
            let current =
                crate::agent_access::attempt_is_on_node(record.as_ref(), node, attempt, !ending);
            // The node's own end of an attempt it held, and its last lines, count even
            // when the task has moved on (another rank ended it, a retry, a preemption).
            // (Its output record is kept past the end: a resent batch that carried the end
            // also carries lines already appended.)
            let held = if ending {
                self.node_attempts.finish(node, attempt)
            } else {
                self.node_attempts.rank_of(node, attempt).is_some()
            };
            let admission = rules::admission::admit(current, held);
            if admission == Admission::LastWord {
                ack.accepted += 1;
                if let AgentReport::Log {
                    attempt,
                    text,
                    offset,
                } = &report
                {
                    self.append_output(node, *attempt, text, *offset)?;
                }
                continue;
            }
            if admission == Admission::Reject {
                ack.rejected += 1;
                self.audit.record_as(
                    format!("node:{node}"),
                    "report.rejected",
                    format!("task:{}/{}", attempt.task, attempt.attempt),
                    false,
                    format!(
                        "{} report for an attempt this node does not run{}",
                        report.kind(),
                        if ending {
                            " (or that already ended)"
                        } else {
                            ""
                        }
                    ),
                );
                continue;
            }
            ack.accepted += 1;
            match report {
                AgentReport::Log {
                    attempt,
                    text,
                    offset,
                } => {
                    self.append_output(node, attempt, &text, offset)?;
                }
                AgentReport::Started { attempt, at } => {
                    let Some(record) = self.task_record(attempt.task).await? else {
                        continue;
                    };
                    if record.attempt == attempt.attempt && record.state == TaskState::Starting {
                        self.stage(TaskChange::Transition(Transition::new(
                            attempt.task,
                            TaskState::Starting,
                            TaskState::Running,
                            attempt.attempt,
                            at,
                        )))
                        .await?;
                        self.metrics.started(
                            record.submitted_at,
                            attempt.attempt,
                            self.clock.now(),
                        );
                    }
                }
                AgentReport::Finished {
                    attempt,
                    at,
                    outcome,
                    rank,
                } => {
                    let record = self.task_record(attempt.task).await?;
                    self.usage
                        .end_rank(&*self.store, record.as_ref(), node, attempt, &outcome, at)
                        .await?;
                    self.adaptive.end(attempt);
                    self.rank_finished(inner, node, attempt, outcome, rank, at)
                        .await?;
                }
                AgentReport::Usage(_) => {}
                AgentReport::Metrics { attempt, points } => {
                    self.record_metrics(attempt, points).await?;
                }
                AgentReport::Resized {
                    attempt,
                    cpu_millis,
                    memory_bytes,
                    error,
                } => {
                    let applied = self.adaptive.allocation(attempt).map_or(
                        tacc_core::Resources::new(cpu_millis, memory_bytes, 0),
                        |r| tacc_core::Resources::new(cpu_millis, memory_bytes, r.gpus),
                    );
                    self.resized_on_node(inner, node, attempt, applied, error)
                        .await;
                }
                AgentReport::RuntimeChosen {
                    attempt,
                    runtime,
                    why,
                } => {
                    let Some(record) = self.task_record(attempt.task).await? else {
                        continue;
                    };
                    if record.attempt == attempt.attempt && !record.state.is_terminal() {
                        self.commit(&[TaskChange::Reason {
                            task: attempt.task,
                            reason: Some(format!("runtime {runtime}: {why}")),
                        }])
                        .await?;
                    }
                }
            }
        }
        Ok(ack)
    }

    /// Append a node's output of an attempt to the task's log, unless it is a repeat of a
    /// report already applied; marked applied only once it is in the log.
    fn append_output(
        &self,
        node: NodeId,
        attempt: AttemptRef,
        text: &str,
        offset: Option<u64>,
    ) -> Result<(), ServerError> {
        if !self.log_offsets.is_new(node, attempt, offset) {
            return Ok(());
        }
        self.logs.append(attempt.task, text).map_err(|e| {
            ServerError::io(format!("cannot write the log of task {}", attempt.task), e)
        })?;
        self.log_offsets.applied(node, attempt, offset);
        Ok(())
    }

    /// An attempt's node vanished: the attempt is lost (and maybe retried).
    pub(super) async fn lose_attempt(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
    ) -> Result<(), ServerError> {
        let Some(record) = self.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let (state, reason) = if record.cancel_requested {
            let reason = inner.cancel_reasons.remove(&record.id);
            (
                TaskState::Cancelled,
                reason.unwrap_or_else(|| super::CANCELLED_BY_USER.to_string()),
            )
        } else {
            let reason = match &outcome {
                AttemptOutcome::LaunchFailed { reason, message } => format!("{reason}: {message}"),
                other => format!("{other:?}"),
            };
            (TaskState::Lost, reason)
        };
        self.end_attempt(
            inner,
            record,
            state,
            Some(reason),
            None,
            self.clock.now(),
            true,
        )
        .await
    }

    /// One node's part of an attempt ended. A multi-node attempt succeeds when every node
    /// rank has; the first part that does not succeed ends it for all (the others are
    /// withdrawn, so their agents stop them), named in the reason.
    pub(super) async fn rank_finished(
        &self,
        inner: &mut Inner,
        node: NodeId,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        process_rank: Option<u32>,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        // A node that stopped an attempt because it lost contact with the server failed as
        // a node, not the task: the attempt is lost and follows the retry policy.
        if matches!(&outcome, AttemptOutcome::LaunchFailed { reason, .. } if reason == "node_fenced")
        {
            return self.lose_attempt(inner, attempt, outcome).await;
        }
        let Some(record) = self.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let nodes = record.placements.len() as u32;
        let node_rank = record
            .placements
            .iter()
            .position(|p| p.node == node)
            .map_or(0, |r| r as u32);
        if nodes > 1 {
            // Kept, so a restarted server knows this rank's part is done (or which failed).
            let failure = match &outcome {
                AttemptOutcome::Exited { code: 0 } => None,
                AttemptOutcome::Cancelled => Some("cancelled".to_string()),
                other => crate::usage::failure_of(other),
            };
            self.commit(&[self.rank_end(attempt, node_rank, node, at, failure)])
                .await?;
        }
        if nodes > 1
            && outcome == (AttemptOutcome::Exited { code: 0 })
            && !record.cancel_requested
            && !inner.preempting.contains(&record.id)
        {
            let done = inner.finished_ranks.entry(attempt).or_default();
            done.insert(node_rank, at);
            if (done.len() as u32) < nodes {
                return Ok(());
            }
        }
        let processes = inner
            .specs
            .get(&record.id)
            .map_or(1, |spec| spec.resources.processes_per_node());
        let blame = (nodes * processes > 1).then(|| {
            let rank = process_rank.unwrap_or(node_rank * processes);
            let name = inner
                .nodes
                .get(&node)
                .map_or_else(|| node.to_string(), |n| n.record.name.clone());
            if processes > 1 {
                format!(
                    "rank {rank} (node {name}, local rank {})",
                    rank.saturating_sub(node_rank * processes)
                )
            } else {
                format!("rank {rank} (node {name})")
            }
        });
        self.finish_attempt_blaming(inner, attempt, outcome, at, blame)
            .await
    }

    pub(super) async fn finish_attempt(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        self.finish_attempt_blaming(inner, attempt, outcome, at, None)
            .await
    }

    /// End an attempt as `outcome` says; `blame` names the rank whose end it was when the
    /// attempt had several, and goes into the reason of a failure.
    pub(super) async fn finish_attempt_blaming(
        &self,
        inner: &mut Inner,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        at: Timestamp,
        blame: Option<String>,
    ) -> Result<(), ServerError> {
        let Some(record) = self.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let was_preempted = inner.preempting.remove(&record.id);
        if was_preempted && outcome == AttemptOutcome::Cancelled && !record.cancel_requested {
            return self.requeue_preempted(inner, record, at).await;
        }
        let (state, mut reason, exit_code) = rules::ending::outcome_of(&outcome, &record, blame);
        if state == TaskState::Cancelled
            && record.cancel_requested
            && let Some(why) = inner.cancel_reasons.remove(&record.id)
        {
            reason = Some(why);
        }
        self.end_attempt(inner, record, state, reason, exit_code, at, false)
            .await
    }

    /// A preempted attempt has stopped: the task goes back to the queue as a new attempt.
    pub(super) async fn requeue_preempted(
        &self,
        inner: &mut Inner,
        record: TaskRecord,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        let task = record.id;
        let reason = match inner.requeue_reasons.remove(&task) {
            Some(why) => format!("{why} (attempt {})", record.attempt),
            None => format!("preempted during attempt {}", record.attempt),
        };
        self.commit(&[TaskChange::Transition(Transition {
            reason: Some(reason),
            ..Transition::new(
                task,
                record.state,
                TaskState::Queued,
                record.attempt.next(),
                at,
            )
        })])
        .await?;
        self.mark_attempt(task, record.attempt.next(), "preempted");
        let attempt = AttemptRef {
            task,
            attempt: record.attempt,
        };
        for (node, live) in inner.nodes.iter_mut() {
            // Wake the node's poll: its part of the attempt is withdrawn, so it stops it
            // now (a rank still running when another ended the attempt).
            if live.assignments.remove(&attempt).is_some() {
                self.comm.work_changed(*node);
            }
            live.cancelling.remove(&attempt);
        }
        self.drive(inner, Event::TaskPreempted(task)).await;
        self.logs.wake(task);
        Ok(())
    }

    /// Open attempt `next`'s section of the task log. A log that cannot be written costs
    /// the marker only, never the retry.
    fn mark_attempt(&self, task: tacc_core::TaskId, next: tacc_core::AttemptNo, cause: &str) {
        if let Err(e) = self
            .logs
            .append_line(task, &retry::attempt_marker(next, cause))
        {
            tracing::warn!("cannot mark attempt {next} in the log of task {task}: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn end_attempt(
        &self,
        inner: &mut Inner,
        record: TaskRecord,
        state: TaskState,
        reason: Option<String>,
        exit_code: Option<i32>,
        at: Timestamp,
        node_failure: bool,
    ) -> Result<(), ServerError> {
        self.end_attempt_retrying(
            inner,
            record,
            state,
            reason,
            exit_code,
            at,
            node_failure,
            None,
        )
        .await
    }

    /// [`Control::end_attempt`], retried as `retry_as` says instead of the task's own
    /// `retry:` (a hung attempt whose `on_hang.then` is `retry`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn end_attempt_retrying(
        &self,
        inner: &mut Inner,
        record: TaskRecord,
        state: TaskState,
        reason: Option<String>,
        exit_code: Option<i32>,
        at: Timestamp,
        node_failure: bool,
        retry_as: Option<tacc_schema::RetrySpec>,
    ) -> Result<(), ServerError> {
        let task = record.id;
        inner.preempting.remove(&task);
        inner.cancel_reasons.remove(&task);
        inner.finished_ranks.remove(&AttemptRef {
            task,
            attempt: record.attempt,
        });
        let spec = inner.specs.get(&task).cloned();
        let earlier_node_losses = if rules::ending::counts_node_losses(state, reason.as_deref()) {
            retry::node_losses(&self.store.task_events(task).await?)
        } else {
            0
        };
        let plan = rules::ending::plan_end(AttemptEnd {
            record: &record,
            policy: retry_as.as_ref().or(spec.as_ref().map(|s| &s.retry)),
            state,
            reason,
            exit_code,
            at,
            node_failure,
            earlier_node_losses,
            settings: &self.config.retry,
        });
        self.commit(&plan.changes).await?;
        let state = plan.state;
        if let Some(retry) = &plan.retry {
            self.mark_attempt(task, retry.next, &retry.cause);
        }
        let attempt = AttemptRef {
            task,
            attempt: record.attempt,
        };
        for (node, live) in inner.nodes.iter_mut() {
            // Wake the node's poll: its part of the attempt is withdrawn, so it stops it
            // now (a rank still running when another ended the attempt).
            if live.assignments.remove(&attempt).is_some() {
                self.comm.work_changed(*node);
            }
            live.cancelling.remove(&attempt);
        }
        if plan.retry.is_none() {
            inner.stage_deps.remove(&task);
            // Before the scheduler hears of the end: it would start dependents at once.
            self.stop_dependents(inner, &record, state).await?;
        }
        self.drive(inner, Event::TaskEnded(task)).await;
        match (plan.retry, spec) {
            (Some(retry), Some(spec)) => {
                // Queued at once, so what depends on it keeps waiting, but placed no
                // earlier than the backoff allows (`release_due_retries` wakes it).
                inner.retry_at.insert(task, retry.not_before);
                let group = inner.group_for(&self.config, &record.user);
                let request = request_of(&spec, &record, at, group);
                if inner.nodes.values().any(LiveNode::schedulable) {
                    self.drive(inner, Event::TaskSubmitted { task, request })
                        .await;
                } else {
                    inner.held.insert(task);
                }
            }
            _ => {
                inner.specs.remove(&task);
            }
        }
        self.logs.wake(task);
        Ok(())
    }
}

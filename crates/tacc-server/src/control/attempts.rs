//! How attempts end: agents' reports applied in order (each checked against the attempt
//! it claims), a node's part of a gang finishing, the first failure ending the attempt for
//! all its ranks and naming them, lost and fenced attempts, preempted attempts requeued,
//! and the retry policy.

use tacc_core::{NodeId, TaskState, Timestamp};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};
use tacc_store::TaskChange;

use super::effects::Effects;
use super::rules::admission::Admission;
use super::{Control, Core, handlers, retry, rules};
use crate::ServerError;

impl Control {
    /// Apply an agent's report batch, in order, as one turn (`shell.rs`): one
    /// scheduling decision for everything the batch ended, not one per attempt (with a
    /// long queue each decision walks it, and a batch may end dozens), and one transaction
    /// for the batch's changes and that decision's plan.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        self.turn(async |core: &mut Core| {
            match core.nodes.get_mut(&node) {
                Some(live) => live.last_seen = self.clock.instant(),
                None => return Err(ServerError::NodeNotFound(node)),
            }
            self.apply_reports(core, node, reports).await
        })
        .await
    }

    async fn apply_reports(
        &self,
        inner: &mut Core,
        node: NodeId,
        reports: Vec<AgentReport>,
    ) -> Result<tacc_proto::ReportsAck, ServerError> {
        let mut ack = tacc_proto::ReportsAck::default();
        for report in reports {
            if let AgentReport::Usage(sample) = report {
                let attempt = sample.attempt;
                let kept = sample.clone();
                let record = self.facts.task_record(sample.attempt.task).await?;
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
            let record = self.facts.task_record(attempt.task).await?;
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
                    let Some(record) = self.facts.task_record(attempt.task).await? else {
                        continue;
                    };
                    let mut fx = Effects::default();
                    handlers::started::on_started(inner, &mut fx, &record, attempt, at);
                    self.carry(inner, fx).await?;
                }
                AgentReport::Finished {
                    attempt,
                    at,
                    outcome,
                    rank,
                } => {
                    let record = self.facts.task_record(attempt.task).await?;
                    self.usage
                        .end_rank(&*self.store, record.as_ref(), node, attempt, &outcome, at)
                        .await?;
                    self.adaptive.end(attempt);
                    self.rank_finished(inner, node, attempt, outcome, rank, at)
                        .await?;
                }
                AgentReport::Usage(_) => {}
                AgentReport::Metrics { attempt, points } => {
                    let points = rules::sweeps::metric_points(attempt, points, self.clock.now());
                    self.store.append_metrics(points).await?;
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
                    let Some(record) = self.facts.task_record(attempt.task).await? else {
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

    /// An attempt's node vanished: the attempt is lost (and maybe retried; see
    /// `handlers::ending::on_attempt_lost`).
    pub(super) async fn lose_attempt(
        &self,
        inner: &mut Core,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
    ) -> Result<(), ServerError> {
        let Some(record) = self.facts.task_record(attempt.task).await? else {
            return Ok(());
        };
        if record.attempt != attempt.attempt || !record.state.is_active() {
            return Ok(());
        }
        let reason = handlers::ending::lost_reason(&outcome);
        let counts = !record.cancel_requested
            && rules::ending::counts_node_losses(TaskState::Lost, Some(&reason));
        let earlier_node_losses = if counts {
            retry::node_losses(&self.store.task_events(record.id).await?)
        } else {
            0
        };
        let mut fx = Effects::default();
        handlers::ending::on_attempt_lost(
            inner,
            &mut fx,
            &self.config,
            record,
            &outcome,
            earlier_node_losses,
            self.clock.now(),
        );
        self.carry(inner, fx).await
    }

    /// One node's part of an attempt ended (see `handlers::rank_end`). A node that
    /// stopped an attempt because it lost contact with the server failed as a node, not
    /// the task: the attempt is lost and follows the retry policy.
    pub(super) async fn rank_finished(
        &self,
        inner: &mut Core,
        node: NodeId,
        attempt: AttemptRef,
        outcome: AttemptOutcome,
        process_rank: Option<u32>,
        at: Timestamp,
    ) -> Result<(), ServerError> {
        if matches!(&outcome, AttemptOutcome::LaunchFailed { reason, .. } if reason == "node_fenced")
        {
            return self.lose_attempt(inner, attempt, outcome).await;
        }
        let Some(record) = self.facts.task_record(attempt.task).await? else {
            return Ok(());
        };
        let mut fx = Effects::default();
        handlers::rank_end::on_rank_finished(
            inner,
            &mut fx,
            handlers::rank_end::RankFinished {
                record,
                node,
                attempt,
                outcome,
                process_rank,
                at,
                config: &self.config,
            },
        );
        self.carry(inner, fx).await
    }
}

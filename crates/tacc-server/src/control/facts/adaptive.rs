//! What `tcloud why` / `top` / `show` say of a task's adaptive allocation: its bounds and
//! the allocation in force, the changes kept in its resize history, the verdict on its
//! running attempt's window and the signal points kept of it.

use tacc_core::{Resources, TaskId, TaskState};
use tacc_proto::{AdaptiveBounds, AdaptiveView, AttemptRef, ResizeView, SignalPoint, VerdictView};
use tacc_schema::TaskSpec;

use super::Facts;
use crate::ServerError;
use crate::control::adaptive::AdaptiveBook;

/// Signal points shown at most by `tcloud top` / `show` / `why`.
const POINTS_SHOWN: usize = 120;

impl Facts {
    /// The adaptive side of `task`, from the store and what `book` knows of its running
    /// attempt.
    pub(crate) async fn adaptive_view(
        &self,
        task: TaskId,
        book: &AdaptiveBook,
    ) -> Result<AdaptiveView, ServerError> {
        let record = self
            .store
            .get_task(task)
            .await?
            .ok_or(ServerError::TaskNotFound(task))?;
        let spec: TaskSpec = serde_json::from_value(record.spec.clone())
            .map_err(|e| ServerError::Internal(format!("stored spec of task {task}: {e}")))?;
        let requested = spec.resources.per_node();
        let resizes = self.store.list_resizes(task).await?;
        let running = matches!(record.state, TaskState::Starting | TaskState::Running);
        let allocation = resizes
            .iter()
            .rev()
            .find(|r| r.attempt == record.attempt)
            .map_or(requested, |r| {
                Resources::new(r.cpu_millis, r.memory_bytes, requested.gpus)
            });
        let verdict = running
            .then(|| {
                book.verdict(AttemptRef {
                    task,
                    attempt: record.attempt,
                })
            })
            .flatten()
            .map(|(at, verdict)| VerdictView {
                at,
                bottleneck: verdict.bottleneck.to_string(),
                cpu: fit(verdict.cpu),
                memory: fit(verdict.memory),
                evidence: verdict.evidence,
            });
        let bounds = book.bounds(&spec, allocation).map(|b| AdaptiveBounds {
            min_cpu_millis: b.min.cpu_millis,
            max_cpu_millis: b.max.cpu_millis,
            min_memory_bytes: b.min.memory_bytes,
            max_memory_bytes: b.max.memory_bytes,
        });
        let points = self.store.list_signal_points(task).await?;
        let skip = points.len().saturating_sub(POINTS_SHOWN);
        let series = points
            .into_iter()
            .skip(skip)
            .filter_map(|p| serde_json::from_value::<SignalPoint>(p.point).ok())
            .collect();
        let (mode, classifier, policy) = book.names();
        Ok(AdaptiveView {
            mode: mode.to_string(),
            classifier: classifier.into(),
            policy: policy.into(),
            requested,
            allocation,
            bounds,
            verdict,
            changes: resizes
                .into_iter()
                .map(|r| ResizeView {
                    at: r.at,
                    attempt: r.attempt,
                    cpu_millis: r.cpu_millis,
                    memory_bytes: r.memory_bytes,
                    reason: r.reason,
                })
                .collect(),
            series,
        })
    }
}

fn fit(fit: tacc_adaptive::Fit) -> String {
    match fit {
        tacc_adaptive::Fit::Unknown => "unknown",
        tacc_adaptive::Fit::Short => "short",
        tacc_adaptive::Fit::Fit => "fit",
        tacc_adaptive::Fit::Idle => "idle",
    }
    .into()
}

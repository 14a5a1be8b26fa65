//! The shell of the reactor: one turn of the control plane is **events in → handlers →
//! effects → one commit → wake and answer**. A turn holds the core's lock; the handlers
//! it runs (`handlers/`) change the core and collect [`Effects`]; the shell stages their
//! store changes for the turn's one transaction, decides the scheduler events of the
//! whole turn as one batch (whose plan commits in that same transaction), and only then
//! lets the turn's answer go — which the API holds until the store has synced
//! (`api/durable.rs`). A commit that fails fails the turn: nothing is acknowledged, the
//! copies of what it touched are dropped and the scheduler is rebuilt from the store.

use tacc_scheduler::Event;

use super::effects::{Effects, FollowUp, Metric};
use super::{Control, Core};
use crate::ServerError;

impl Control {
    /// Run one turn: `body` applies its events to the core through handlers and
    /// [`Control::carry`]; the scheduler then decides once for all of them, and what the
    /// turn staged is committed with that decision's plan, in one transaction.
    pub(crate) async fn turn<R>(
        &self,
        body: impl AsyncFnOnce(&mut Core) -> Result<R, ServerError>,
    ) -> Result<R, ServerError> {
        let mut guard = self.inner.lock().await;
        let core = &mut *guard;
        core.deferred = Some(Vec::new());
        let mut failed = false;
        let result = self
            .staging_starts(async {
                let failed = &mut failed;
                let mut result = body(core).await;
                let events = core.deferred.take().unwrap_or_default();
                if !events.is_empty() {
                    self.drive(core, Event::Batch(events)).await;
                }
                if result.is_ok()
                    && let Err(e) = self.flush_staged().await
                {
                    result = Err(e.into());
                }
                *failed = self.discard_if_failed();
                result
            })
            .await;
        if failed {
            self.rebuild(core).await;
        }
        result
    }

    /// After a turn whose commit failed, the handlers' changes to the core are not what
    /// the store holds: the open tasks' part of the core is read again from the store and
    /// the scheduler rebuilt from it (nodes keep their liveness; their work is rebuilt and
    /// every poll answered). Nothing of the turn was acknowledged: its request failed.
    pub(crate) async fn rebuild(&self, core: &mut Core) {
        tracing::error!(
            "a turn of the control plane could not be committed: rebuilding its state from the store"
        );
        core.clear_open_tasks();
        self.placed.clear();
        if let Err(e) = Box::pin(self.reload(core, false)).await {
            tracing::error!("rebuilding from the store failed: {e}; the next failed turn retries");
        }
        let nodes: Vec<_> = core.nodes.keys().copied().collect();
        for node in nodes {
            self.comm.work_changed(node);
        }
    }

    /// Carry out what a handler decided. Inside a turn its changes are staged for the
    /// turn's transaction (and seen at once by the placed tasks' copies); outside one
    /// they are committed now, together.
    pub(crate) async fn carry(&self, core: &mut Core, fx: Effects) -> Result<(), ServerError> {
        let Effects {
            changes,
            decide,
            woken,
            log_wakes,
            log_lines,
            metrics,
            warnings,
            news,
            idle_warnings,
            follow_ups,
        } = fx;
        for change in idle_warnings {
            self.usage.set_idle_warning(change.attempt, change.warning);
        }
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        for news in news {
            tracing::info!("{news}");
        }
        self.stage_all(changes).await?;
        for (task, line) in log_lines {
            // A log that cannot be written costs the line, never the decision.
            if let Err(e) = self.logs.append_line(task, &line) {
                tracing::warn!("cannot write to the log of task {task}: {e}");
            }
        }
        let now = self.clock.now();
        for metric in metrics {
            match metric {
                Metric::Started {
                    submitted_at,
                    attempt,
                } => self.metrics.started(submitted_at, attempt, now),
            }
        }
        for step in follow_ups {
            // The async paths read the store: what the turn staged is made durable first.
            self.flush_staged().await?;
            match step {
                FollowUp::StopDependents { record, state } => {
                    self.stop_dependents(core, &record, state).await?;
                }
            }
        }
        match decide.len() {
            0 => {}
            1 => {
                let event = decide.into_iter().next().expect("one event");
                self.drive(core, event).await;
            }
            _ => self.drive(core, Event::Batch(decide)).await,
        }
        for node in woken {
            self.comm.work_changed(node);
        }
        for task in log_wakes {
            self.logs.wake(task);
        }
        Ok(())
    }
}

//! What a handler decided must happen outside the core, collected as plain data: the
//! store changes of the turn, the nodes whose polls must be answered, the log lines and
//! followers to wake, the events the scheduler decides once after the handlers, the
//! metrics to count — and, while the port to handlers is under way, the steps that still
//! live in the control plane's async paths. The shell (`shell.rs`) carries them out:
//! changes into the turn's one transaction, then the rest. Nothing here does I/O.

use std::collections::BTreeSet;

use tacc_core::{AttemptNo, NodeId, TaskId, TaskState, Timestamp};
use tacc_scheduler::Event;
use tacc_store::{TaskChange, TaskRecord};

#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Store changes, in order, for the turn's transaction.
    pub(crate) changes: Vec<TaskChange>,
    /// Events for the scheduler, in order, decided as one batch when the turn ends.
    pub(crate) decide: Vec<Event>,
    /// Nodes whose work changed: a poll each holds open is answered.
    pub(crate) woken: BTreeSet<NodeId>,
    /// Tasks whose log followers (`tcloud logs -f`, `watch`) are woken.
    pub(crate) log_wakes: BTreeSet<TaskId>,
    /// Lines written into task logs (attempt markers), in order.
    pub(crate) log_lines: Vec<(TaskId, String)>,
    /// Metric increments.
    pub(crate) metrics: Vec<Metric>,
    /// Idle-GPU warnings given or lifted, for the usage book (`tcloud top`).
    pub(crate) idle_warnings: Vec<crate::control::handlers::idle_gpus::IdleWarning>,
    /// Warnings for the operator, written to the server's log.
    pub(crate) warnings: Vec<String>,
    /// News for the operator (the server's log, at info level).
    pub(crate) news: Vec<String>,
    /// What a restarted server would need that changed, for the shell to keep.
    pub(crate) keep_for_restart: Option<crate::control::handlers::liveness::RestartFacts>,
    /// Steps not yet ported into handlers, run by the shell after the changes before
    /// them are durable (they read the store).
    pub(crate) follow_ups: Vec<FollowUp>,
}

/// A metric a handler counts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Metric {
    /// An attempt started: the time from submission to its start is observed.
    Started {
        submitted_at: Timestamp,
        attempt: AttemptNo,
    },
}

/// A step of the control plane's async paths a handler asks for (see the module's doc).
#[derive(Debug, Clone)]
pub(crate) enum FollowUp {
    /// `record` ended for good as `state`: the queued tasks of pipeline stages that need
    /// it end too (`pipelines.rs`), before the scheduler hears of the end.
    StopDependents {
        record: Box<TaskRecord>,
        state: TaskState,
    },
}

impl Effects {
    pub(crate) fn change(&mut self, change: TaskChange) {
        self.changes.push(change);
    }

    pub(crate) fn wake(&mut self, node: NodeId) {
        self.woken.insert(node);
    }

    pub(crate) fn wake_logs(&mut self, task: TaskId) {
        self.log_wakes.insert(task);
    }

    pub(crate) fn decide(&mut self, event: Event) {
        self.decide.push(event);
    }

    pub(crate) fn log_line(&mut self, task: TaskId, line: String) {
        self.log_lines.push((task, line));
    }

    pub(crate) fn count(&mut self, metric: Metric) {
        self.metrics.push(metric);
    }

    pub(crate) fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    pub(crate) fn inform(&mut self, news: String) {
        self.news.push(news);
    }

    pub(crate) fn follow_up(&mut self, step: FollowUp) {
        self.follow_ups.push(step);
    }
}

#[cfg(test)]
impl Effects {
    /// Whether the handler decided nothing at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.decide.is_empty()
            && self.woken.is_empty()
            && self.log_wakes.is_empty()
            && self.log_lines.is_empty()
            && self.metrics.is_empty()
            && self.warnings.is_empty()
            && self.news.is_empty()
            && self.idle_warnings.is_empty()
            && self.keep_for_restart.is_none()
            && self.follow_ups.is_empty()
    }
}

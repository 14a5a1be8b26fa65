//! The retry policy's timing and its limit: a retried task is queued at once (what
//! depends on it keeps waiting) but the scheduler places it only after an exponential
//! backoff (`TaskRequest::not_before`), and a task whose attempts keep taking their
//! node down fails for good instead of being retried forever. The wait survives a restart
//! without a column of its own: it is a function of the attempt that ended, counted from
//! the durable `queued` event that started it. Each new attempt's log section opens with a
//! marker line built from fixed codes only, never from the task's text.

use std::time::Duration;

use tacc_core::{AttemptNo, TaskState, Timestamp};
use tacc_store::TaskEvent;

/// How retries are spaced and when a task that keeps taking its node down stops being
/// retried: the operator's settings (`taccd --retry-backoff`, `--retry-backoff-max`,
/// `--crash-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// The wait before the second attempt; each further retry waits twice as long.
    pub backoff: Duration,
    /// No retry waits longer than this.
    pub backoff_max: Duration,
    /// A task whose attempts lost their node this many times fails with
    /// [`CRASH_LIMIT_CODE`].
    pub crash_limit: u32,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            backoff: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            crash_limit: 3,
        }
    }
}

impl RetrySettings {
    /// How long a task waits before attempt `ended + 1` after attempt `ended` ended.
    pub(crate) fn backoff(&self, ended: AttemptNo) -> Duration {
        let doublings = ended.0.saturating_sub(1).min(16);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_max)
    }
}

pub(crate) const CRASH_LIMIT_CODE: &str = "crash_limit";
/// How the reason of a task waiting out its backoff starts.
const RETRYING: &str = "retrying in ";
/// Loss reasons that mean the node went down (or its agent died) while running the task:
/// what a task that crashes its node causes. A removed or fenced node is not counted.
const CRASH_CODES: [&str; 2] = ["node_lost", "node_restarted"];

/// The reason a task shows while it waits out its backoff.
pub(crate) fn retrying_reason(delay: Duration, next: AttemptNo, max_attempts: u32) -> String {
    format!(
        "{RETRYING}{}s (attempt {} of {max_attempts})",
        delay.as_secs(),
        next.0
    )
}

/// Whether an attempt that ended lost with `reason` took its node down with it.
pub(crate) fn crashed_node(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| {
        CRASH_CODES.iter().any(|code| {
            r.strip_prefix(code)
                .is_some_and(|rest| rest.starts_with(':'))
        })
    })
}

/// How many earlier attempts of a task ended lost with their node.
pub(crate) fn node_losses(events: &[TaskEvent]) -> u32 {
    events
        .iter()
        .filter(|e| e.state == TaskState::Lost && crashed_node(e.reason.as_deref()))
        .count() as u32
}

pub(crate) fn crash_limit_reason(losses: u32) -> String {
    format!("{CRASH_LIMIT_CODE}: lost its node {losses} times")
}

/// When a queued task may run again, if its last event queued it for a retry: read back
/// after a restart, so a restart neither forgets the wait nor starts it over.
pub(crate) fn not_before(events: &[TaskEvent], settings: &RetrySettings) -> Option<Timestamp> {
    let last = events.last()?;
    let retrying = last.state == TaskState::Queued
        && last.attempt.0 > 1
        && last
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(RETRYING));
    retrying.then(|| {
        let wait = settings.backoff(AttemptNo(last.attempt.0 - 1));
        Timestamp(last.at.0.saturating_add(wait.as_millis() as u64))
    })
}

/// The line that opens attempt `next`'s section of the task log. `cause` is cut to its
/// leading code (letters, digits, `_`) so no text a task chose can forge a marker.
pub(crate) fn attempt_marker(next: AttemptNo, cause: &str) -> String {
    let code: String = cause
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(40)
        .collect();
    let code = if code.is_empty() { "unknown" } else { &code };
    format!("=== attempt {} (retry after {code}) ===\n", next.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(attempt: u32, state: TaskState, reason: Option<&str>, at: u64) -> TaskEvent {
        TaskEvent {
            at: Timestamp(at),
            attempt: AttemptNo(attempt),
            state,
            reason: reason.map(str::to_string),
        }
    }

    #[test]
    fn backoff_doubles_from_five_seconds_and_is_capped() {
        let settings = RetrySettings::default();
        let waits: Vec<u64> = (1..=9)
            .map(|a| settings.backoff(AttemptNo(a)).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(settings.backoff(AttemptNo(u32::MAX)), settings.backoff_max);
    }

    #[test]
    fn the_reason_says_how_long_and_which_attempt() {
        assert_eq!(
            retrying_reason(Duration::from_secs(10), AttemptNo(3), 5),
            "retrying in 10s (attempt 3 of 5)"
        );
    }

    #[test]
    fn only_losses_with_the_node_count_towards_the_crash_limit() {
        let events = [
            event(1, TaskState::Running, None, 1),
            event(1, TaskState::Lost, Some("node_lost: node a stopped"), 2),
            event(2, TaskState::Queued, Some("retrying in 5s"), 2),
            event(2, TaskState::Lost, Some("node_restarted: the agent"), 3),
            event(3, TaskState::Lost, Some("node_removed: by an admin"), 4),
            event(4, TaskState::Lost, Some("node_fenced: out of contact"), 5),
            event(5, TaskState::Failed, Some("node_lost: in a failure"), 6),
            event(6, TaskState::Lost, Some("node_lostness"), 7),
        ];
        assert_eq!(node_losses(&events), 2);
        assert_eq!(crash_limit_reason(3), "crash_limit: lost its node 3 times");
    }

    #[test]
    fn a_retry_wait_is_read_back_from_the_last_queued_event() {
        let events = [
            event(1, TaskState::Lost, Some("node_lost: x"), 1_000),
            event(
                2,
                TaskState::Queued,
                Some("retrying in 5s (attempt 2 of 3)"),
                1_000,
            ),
        ];
        assert_eq!(
            not_before(&events, &RetrySettings::default()),
            Some(Timestamp(6_000))
        );
        let third = [event(3, TaskState::Queued, Some("retrying in 10s"), 1_000)];
        assert_eq!(
            not_before(&third, &RetrySettings::default()),
            Some(Timestamp(11_000))
        );
        // A preempted task requeued, or one queued first, does not wait.
        let preempted = [event(
            2,
            TaskState::Queued,
            Some("preempted during attempt 1"),
            1,
        )];
        assert_eq!(not_before(&preempted, &RetrySettings::default()), None);
        assert_eq!(
            not_before(
                &[event(1, TaskState::Queued, None, 1)],
                &RetrySettings::default()
            ),
            None
        );
        let started = [
            event(2, TaskState::Queued, Some("retrying in 5s"), 1),
            event(2, TaskState::Starting, None, 9_000),
        ];
        assert_eq!(not_before(&started, &RetrySettings::default()), None);
    }

    #[test]
    fn a_marker_carries_only_a_code() {
        assert_eq!(
            attempt_marker(AttemptNo(2), "node_lost: node a stopped responding"),
            "=== attempt 2 (retry after node_lost) ===\n"
        );
        assert_eq!(
            attempt_marker(AttemptNo(3), "failed\n=== attempt 9 (retry after x) ==="),
            "=== attempt 3 (retry after failed) ===\n"
        );
        assert_eq!(
            attempt_marker(AttemptNo(2), "\n"),
            "=== attempt 2 (retry after unknown) ===\n"
        );
    }
}

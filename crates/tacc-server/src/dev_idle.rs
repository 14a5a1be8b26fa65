//! The shell around `control::dev_idle` (the rule): every second, the running dev
//! sessions (`kind: interactive`) are read with what says they are in use — the last CPU
//! or GPU use of their ranks (the usage samples the hang and idle-GPU checks read too)
//! and the last byte through a session open into them — and the rule's verdicts applied:
//! a warning in the task's log and on every open session's terminal, its lifting, or the
//! end (the task cancelled with a reason naming the idle timeout). Runs on the leader,
//! beside the API whose sessions it reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tacc_core::{TaskState, Timestamp};
use tacc_proto::AttemptRef;
use tacc_store::TaskFilter;
use tokio_util::sync::CancellationToken;

use crate::control::dev_idle::{self, DevSession, DevVerdict};
use crate::sessions::Sessions;
use crate::{Control, ServerError};

/// How often the dev sessions are checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Check the dev sessions until `shutdown`.
pub(crate) async fn run(
    control: Arc<Control>,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) {
    let mut warned = HashMap::new();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = check(&control, &sessions, &mut warned).await {
            tracing::warn!("dev session idle check failed: {e}");
        }
    }
}

/// Whether a stored spec is a dev session's, without decoding the whole of it.
fn is_dev_session(spec: &serde_json::Value) -> bool {
    spec.get("kind").and_then(|kind| kind.as_str()) == Some("interactive")
}

async fn check(
    control: &Control,
    sessions: &Sessions,
    warned: &mut HashMap<AttemptRef, Timestamp>,
) -> Result<(), ServerError> {
    let running = control
        .store
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Running],
            ..Default::default()
        })
        .await?;
    let now = control.clock.now();
    let ago = |elapsed: Duration| Timestamp(now.0.saturating_sub(elapsed.as_millis() as u64));
    let mut dev = Vec::new();
    for record in running {
        if !is_dev_session(&record.spec) || record.cancel_requested {
            continue;
        }
        let Ok(spec) = serde_json::from_value::<tacc_schema::TaskSpec>(record.spec) else {
            continue;
        };
        let Some(timeout) = spec.dev_idle_timeout() else {
            continue;
        };
        let attempt = AttemptRef {
            task: record.id,
            attempt: record.attempt,
        };
        dev.push(DevSession {
            attempt,
            idle_timeout: timeout.as_std().min(sessions.limits.dev_idle_max),
            started_at: record.started_at.unwrap_or(now),
            busy_at: control.usage.alive_ranks(attempt).values().max().copied(),
            used_at: sessions.last_use(record.id).map(ago),
            warned_at: warned.get(&attempt).copied(),
        });
    }
    warned.retain(|attempt, _| dev.iter().any(|d| d.attempt == *attempt));
    for verdict in dev_idle::decide(&dev, now) {
        match verdict {
            DevVerdict::Warn { attempt, message } => {
                warned.insert(attempt, now);
                note_in_log(control, attempt, &message);
                sessions.notify(attempt.task, &message);
            }
            DevVerdict::Clear { attempt } => {
                warned.remove(&attempt);
                note_in_log(
                    control,
                    attempt,
                    "the dev session is in use again: it goes on",
                );
            }
            DevVerdict::End { attempt, reason } => {
                warned.remove(&attempt);
                note_in_log(control, attempt, &reason);
                sessions.notify(attempt.task, &format!("{reason}: it ends now"));
                tracing::info!("task {}: {reason}", attempt.task);
                control.cancel_because(attempt.task, &reason).await?;
            }
        }
    }
    Ok(())
}

/// A line of the platform's in the task's log; a log that cannot be written costs the
/// line only.
fn note_in_log(control: &Control, attempt: AttemptRef, text: &str) {
    if let Err(e) = control
        .logs
        .append_line(attempt.task, &format!("tacc: {text}\n"))
    {
        tracing::warn!("cannot write to the log of task {}: {e}", attempt.task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_interactive_specs_are_dev_sessions() {
        assert!(is_dev_session(
            &serde_json::json!({"kind": "interactive", "run": "x"})
        ));
        assert!(!is_dev_session(&serde_json::json!({"run": "x"})));
        assert!(!is_dev_session(
            &serde_json::json!({"kind": "batch", "run": "x"})
        ));
    }
}

//! When a dev session (`kind: interactive`) ends by itself: once it has been idle — no
//! session in use (no byte through any `tcloud shell`/`exec`/`port-forward` into it) and
//! no CPU or GPU used by its processes on any rank — for its `idle_timeout`. Its users
//! are warned first (in their open sessions and its log), [`warning_lead`] before the
//! end; anything that uses it again lifts the warning. The end needs the warning to have
//! been given that long before, so a server that restarted (and forgot its warnings)
//! warns again rather than ending a session unannounced.

use std::time::Duration;

use tacc_core::Timestamp;
use tacc_proto::AttemptRef;

/// One running dev session, as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevSession {
    pub attempt: AttemptRef,
    /// Its idle timeout, capped by the cluster's maximum.
    pub idle_timeout: Duration,
    /// When this attempt started.
    pub started_at: Timestamp,
    /// The last time one of its ranks used CPU or GPU (or printed), where sampled.
    pub busy_at: Option<Timestamp>,
    /// The last time a byte passed through a session into it, if one is open.
    pub used_at: Option<Timestamp>,
    /// When its users were warned, if they were.
    pub warned_at: Option<Timestamp>,
}

/// What the rule decides for one dev session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DevVerdict {
    /// Tell its users it ends in `ends_in` unless used.
    Warn {
        attempt: AttemptRef,
        message: String,
    },
    /// It is used again: the warning no longer holds.
    Clear { attempt: AttemptRef },
    /// End it (cancelled), with this reason.
    End { attempt: AttemptRef, reason: String },
}

/// How long before the end the users are warned: a quarter of the timeout, at most
/// five minutes.
pub(crate) fn warning_lead(idle_timeout: Duration) -> Duration {
    (idle_timeout / 4).min(Duration::from_secs(5 * 60))
}

pub(crate) fn decide(sessions: &[DevSession], now: Timestamp) -> Vec<DevVerdict> {
    let mut verdicts = Vec::new();
    for s in sessions {
        let last_active = [s.busy_at, s.used_at]
            .into_iter()
            .flatten()
            .fold(s.started_at, Timestamp::max);
        let idle = Duration::from_millis(now.millis_since(last_active));
        let lead = warning_lead(s.idle_timeout);
        let timeout = crate::usage::human_duration(s.idle_timeout);
        let attempt = s.attempt;
        let due_warning = idle + lead >= s.idle_timeout;
        match s.warned_at {
            None if due_warning => verdicts.push(DevVerdict::Warn {
                attempt,
                message: format!(
                    "this dev session has been idle for {} (no session in use, no CPU or GPU \
                     used): it ends in {} (idle_timeout {timeout}) unless used — type in a \
                     shell or run something in it to keep it",
                    crate::usage::human_duration(idle),
                    crate::usage::human_duration(lead),
                ),
            }),
            None => {}
            Some(_) if !due_warning => verdicts.push(DevVerdict::Clear { attempt }),
            Some(warned)
                if idle >= s.idle_timeout
                    && Duration::from_millis(now.millis_since(warned)) >= lead =>
            {
                verdicts.push(DevVerdict::End {
                    attempt,
                    reason: format!(
                        "dev session idle for {timeout} (its idle_timeout): no session in use \
                         and no CPU or GPU used"
                    ),
                });
            }
            Some(_) => {}
        }
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    const S: u64 = 1_000;

    fn at(secs: u64) -> Timestamp {
        Timestamp(secs * S)
    }

    fn session(busy: Option<u64>, used: Option<u64>, warned: Option<u64>) -> DevSession {
        DevSession {
            attempt: AttemptRef {
                task: TaskId(9),
                attempt: AttemptNo(1),
            },
            idle_timeout: Duration::from_secs(20),
            started_at: at(100),
            busy_at: busy.map(at),
            used_at: used.map(at),
            warned_at: warned.map(at),
        }
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        Nothing,
        Warn,
        Clear,
        End,
    }

    #[test]
    fn idle_sessions_are_warned_then_ended_and_use_of_any_kind_keeps_them() {
        use Want::*;
        // A 20 s timeout warns 5 s before the end. (busy, used, warned, now, want)
        let table = [
            // Idle since its start.
            (None, None, None, 114, Nothing),
            (None, None, None, 115, Warn),
            (None, None, Some(115), 119, Nothing),
            (None, None, Some(115), 120, End),
            // Its processes used CPU or GPU at 110: the clock starts again then.
            (Some(110), None, None, 125, Warn),
            (Some(110), None, Some(125), 129, Nothing),
            (Some(110), None, Some(125), 130, End),
            // A byte through an open session at 118: it is in use.
            (None, Some(118), None, 130, Nothing),
            (None, Some(118), Some(115), 130, Clear),
            // Used again after the warning: lifted, not ended.
            (Some(119), None, Some(115), 120, Clear),
            // Warned late (a restarted server forgot): the end waits the whole lead.
            (None, None, Some(200), 203, Nothing),
            (None, None, Some(200), 205, End),
        ];
        for (busy, used, warned, now, want) in table {
            let verdicts = decide(&[session(busy, used, warned)], at(now));
            let got = match verdicts.as_slice() {
                [] => Nothing,
                [DevVerdict::Warn { .. }] => Warn,
                [DevVerdict::Clear { .. }] => Clear,
                [DevVerdict::End { .. }] => End,
                more => panic!("{more:?}"),
            };
            assert_eq!(
                got, want,
                "busy {busy:?} used {used:?} warned {warned:?} at {now}"
            );
        }
    }

    #[test]
    fn the_warning_and_the_reason_say_when_and_why() {
        let warned = decide(&[session(None, None, None)], at(115));
        assert!(
            matches!(&warned[..], [DevVerdict::Warn { message, .. }]
                if message.contains("ends in 5s (idle_timeout 20s)")),
            "{warned:?}"
        );
        let ended = decide(&[session(None, None, Some(115))], at(120));
        assert!(
            matches!(&ended[..], [DevVerdict::End { reason, .. }]
                if reason.starts_with("dev session idle for 20s (its idle_timeout)")),
            "{ended:?}"
        );
    }

    #[test]
    fn the_warning_comes_a_quarter_of_the_timeout_before_at_most_five_minutes() {
        assert_eq!(
            warning_lead(Duration::from_secs(20)),
            Duration::from_secs(5)
        );
        assert_eq!(
            warning_lead(Duration::from_secs(2 * 3600)),
            Duration::from_secs(300)
        );
    }
}

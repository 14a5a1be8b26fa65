//! The operator's idle-GPU policy: a running attempt whose GPUs have all been used below
//! `below` percent for `for` is wasting them. Its owner is warned first (the task's log and
//! `tcloud top`); if the GPUs are still idle `grace` later, the policy's action runs —
//! checkpoint and requeue (the checkpoint signal, then back to the queue as a new attempt)
//! or cancel. A warning is all that `then: warn` does. Users and groups the policy exempts,
//! and attempts whose ranks are not all sampled yet, are left alone.

use std::collections::BTreeMap;
use std::time::Duration;

use tacc_core::Timestamp;
use tacc_proto::AttemptRef;

/// What the policy does to an attempt whose GPUs stayed idle past the warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleGpuAction {
    Warn,
    CheckpointAndRequeue,
    Cancel,
}

impl IdleGpuAction {
    pub fn parse(text: &str) -> Option<IdleGpuAction> {
        match text {
            "warn" => Some(IdleGpuAction::Warn),
            "checkpoint_and_requeue" => Some(IdleGpuAction::CheckpointAndRequeue),
            "cancel" => Some(IdleGpuAction::Cancel),
            _ => None,
        }
    }

    fn says(self) -> &'static str {
        match self {
            IdleGpuAction::Warn => "warn",
            IdleGpuAction::CheckpointAndRequeue => "checkpoint and requeue",
            IdleGpuAction::Cancel => "cancel",
        }
    }
}

/// The operator's policy (`taccd server --idle-gpu-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleGpuPolicy {
    /// GPU utilisation (percent) under which a GPU counts as idle.
    pub below_percent: u32,
    /// How long every GPU of an attempt must have been idle.
    pub idle_for: Duration,
    pub then: IdleGpuAction,
    /// Between the warning and the action.
    pub grace: Duration,
    /// Users and groups left alone.
    pub exempt: Vec<String>,
}

/// One running attempt that holds GPUs, as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::control) struct GpuAttempt {
    pub attempt: AttemptRef,
    pub user: String,
    pub group: String,
    pub ranks: u32,
    /// Per sampled rank: the last time one of its GPUs was used at or above the policy's
    /// threshold (its start when never).
    pub busy_at: BTreeMap<u32, Timestamp>,
    /// When its owner was warned, if they were.
    pub warned_at: Option<Timestamp>,
}

/// What the policy decides for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::control) enum IdleVerdict {
    /// Warn the owner with this message.
    Warn {
        attempt: AttemptRef,
        message: String,
    },
    /// The GPUs are used again: the warning no longer holds.
    Clear { attempt: AttemptRef },
    /// Carry out the action, with this reason.
    Act {
        attempt: AttemptRef,
        action: IdleGpuAction,
        reason: String,
    },
}

pub(in crate::control) fn decide(
    policy: &IdleGpuPolicy,
    attempts: &[GpuAttempt],
    now: Timestamp,
) -> Vec<IdleVerdict> {
    let mut verdicts = Vec::new();
    for a in attempts {
        if policy.exempt.iter().any(|e| *e == a.user || *e == a.group) {
            continue;
        }
        let all_sampled = (0..a.ranks).all(|rank| a.busy_at.contains_key(&rank));
        let idle_since = a.busy_at.values().max().copied();
        let idle = match idle_since {
            Some(since) if all_sampled => {
                now.millis_since(since) >= policy.idle_for.as_millis() as u64
            }
            _ => false,
        };
        let attempt = a.attempt;
        let idle_for = crate::usage::human_duration(policy.idle_for);
        match (idle, a.warned_at) {
            (false, Some(_)) => verdicts.push(IdleVerdict::Clear { attempt }),
            (true, None) => {
                let next = match policy.then {
                    IdleGpuAction::Warn => String::new(),
                    action => format!(
                        "; the cluster's policy will {} it in {} unless they are used",
                        action.says(),
                        crate::usage::human_duration(policy.grace)
                    ),
                };
                verdicts.push(IdleVerdict::Warn {
                    attempt,
                    message: format!(
                        "its GPUs have been idle (below {}%) for {idle_for}{next}",
                        policy.below_percent
                    ),
                });
            }
            (true, Some(warned))
                if policy.then != IdleGpuAction::Warn
                    && now.millis_since(warned) >= policy.grace.as_millis() as u64 =>
            {
                verdicts.push(IdleVerdict::Act {
                    attempt,
                    action: policy.then,
                    reason: format!(
                        "idle GPUs: used below {}% for {idle_for} and {} after a warning; the \
                         cluster's policy: {}",
                        policy.below_percent,
                        crate::usage::human_duration(policy.grace),
                        policy.then.says()
                    ),
                });
            }
            _ => {}
        }
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    const MIN: u64 = 60_000;

    fn policy(then: IdleGpuAction) -> IdleGpuPolicy {
        IdleGpuPolicy {
            below_percent: 5,
            idle_for: Duration::from_secs(30 * 60),
            then,
            grace: Duration::from_secs(10 * 60),
            exempt: vec!["vip".into()],
        }
    }

    fn attempt(busy_at: &[u64], warned_at: Option<u64>) -> GpuAttempt {
        GpuAttempt {
            attempt: AttemptRef {
                task: TaskId(4),
                attempt: AttemptNo(1),
            },
            user: "bob".into(),
            group: "nlp".into(),
            ranks: busy_at.len() as u32,
            busy_at: busy_at
                .iter()
                .enumerate()
                .map(|(rank, at)| (rank as u32, Timestamp(at * MIN)))
                .collect(),
            warned_at: warned_at.map(|m| Timestamp(m * MIN)),
        }
    }

    #[test]
    fn idle_gpus_are_warned_of_then_acted_on_after_the_grace() {
        let p = policy(IdleGpuAction::CheckpointAndRequeue);
        let at = |m: u64| Timestamp(m * MIN);
        assert_eq!(decide(&p, &[attempt(&[10, 12], None)], at(41)), []);
        let warned = decide(&p, &[attempt(&[10, 12], None)], at(42));
        assert_eq!(
            warned,
            [IdleVerdict::Warn {
                attempt: attempt(&[0], None).attempt,
                message: "its GPUs have been idle (below 5%) for 30 min; the cluster's policy \
                          will checkpoint and requeue it in 10 min unless they are used"
                    .into()
            }]
        );
        assert_eq!(decide(&p, &[attempt(&[10, 12], Some(42))], at(51)), []);
        let acted = decide(&p, &[attempt(&[10, 12], Some(42))], at(52));
        assert!(
            matches!(&acted[..], [IdleVerdict::Act { action: IdleGpuAction::CheckpointAndRequeue, reason, .. }]
                if reason.starts_with("idle GPUs: used below 5% for 30 min")),
            "{acted:?}"
        );
    }

    #[test]
    fn used_again_clears_the_warning_and_warn_only_never_acts() {
        let p = policy(IdleGpuAction::Cancel);
        let cleared = decide(&p, &[attempt(&[10, 50], Some(42))], Timestamp(55 * MIN));
        assert!(
            matches!(&cleared[..], [IdleVerdict::Clear { .. }]),
            "{cleared:?}"
        );
        let warn_only = policy(IdleGpuAction::Warn);
        assert_eq!(
            decide(&warn_only, &[attempt(&[0], Some(31))], Timestamp(500 * MIN)),
            []
        );
    }

    #[test]
    fn exempt_and_not_fully_sampled_attempts_are_left_alone() {
        let p = policy(IdleGpuAction::Cancel);
        let mut vip = attempt(&[0], None);
        vip.user = "vip".into();
        assert_eq!(decide(&p, &[vip], Timestamp(100 * MIN)), []);
        let mut half = attempt(&[0, 0], None);
        half.busy_at.remove(&1);
        assert_eq!(decide(&p, &[half], Timestamp(100 * MIN)), []);
    }
}

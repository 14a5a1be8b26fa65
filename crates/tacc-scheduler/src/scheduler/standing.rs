//! Fair-share standing, as Slurm's `sshare` shows it: for each group the configured share,
//! its normalised share, its decayed usage, its effective usage and the fair-share factor,
//! plus each user's and group's limits and what they hold now. [`fair_shares`] is the one
//! computation of the factor: ranking (`refresh_ranks`) and [`Scheduler::standing`] both
//! call it, so what the standing reports is what the `fairshare` policy ranks by.

use serde::{Deserialize, Serialize};
use tacc_core::{Resources, Timestamp};

use super::Scheduler;
use crate::config::Limits;
use crate::policy::Usage;

/// One group's shares as the factor sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Shares {
    /// The group's share weight over the sum of all known groups' weights.
    pub normalized_share: f64,
    /// The group's decayed usage over the sum of all known groups' decayed usage.
    pub effective_usage: f64,
    /// `2^(-effective_usage / normalized_share)`: 1 with no recent usage, 0.5 at usage
    /// equal to the share, towards 0 far above it.
    pub factor: f64,
}

/// Slurm's classic fair-share factor of every group, from each group's (decayed usage,
/// share weight), in the same order.
pub(super) fn fair_shares(groups: &[(f64, f64)]) -> Vec<Shares> {
    let total_usage: f64 = groups.iter().map(|(usage, _)| usage).sum();
    let total_share: f64 = groups.iter().map(|(_, share)| share).sum();
    groups
        .iter()
        .map(|(usage, share)| {
            let effective_usage = if total_usage > 0.0 {
                usage / total_usage
            } else {
                0.0
            };
            let normalized_share = if total_share > 0.0 {
                share / total_share
            } else {
                1.0
            };
            let factor = if normalized_share > 0.0 {
                (-effective_usage / normalized_share).exp2()
            } else {
                0.0
            };
            Shares {
                normalized_share,
                effective_usage,
                factor,
            }
        })
        .collect()
}

/// One group's standing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStanding {
    pub group: String,
    /// The configured share weight (`[groups.NAME] share`, else its guaranteed GPUs, else 1).
    pub share: f64,
    pub normalized_share: f64,
    /// Billing units × seconds (a GPU-second counts `fairshare.gpu_weight`, a CPU-second
    /// `fairshare.cpu_weight`), decayed with `fairshare.half_life_secs`, as of `at`.
    pub decayed_usage: f64,
    pub effective_usage: f64,
    /// The factor computed as of the standing's time.
    pub fairshare: f64,
    /// The factor queued tasks are ranked with now: computed at the last recalculation
    /// (at most `fairshare.recalc_period_secs` ago).
    pub fairshare_in_use: f64,
    pub guaranteed_gpus: u64,
    pub limits: Limits,
    /// What the group's running tasks hold, and how many run and wait.
    pub usage: Usage,
    pub allocated: Resources,
}

/// One user's limits and what their tasks hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserStanding {
    pub user: String,
    pub limits: Limits,
    pub usage: Usage,
}

/// The whole standing at one time. Users and groups appear once the scheduler has seen a
/// task of theirs (decayed usage is kept in memory: it starts afresh when the scheduler is
/// rebuilt, e.g. after a server restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FairShareStanding {
    pub at: Timestamp,
    pub policy: String,
    pub half_life_secs: u64,
    pub groups: Vec<GroupStanding>,
    pub users: Vec<UserStanding>,
}

impl Scheduler {
    /// The fair-share standing as of `now` (not before the last event): decayed usage is
    /// advanced to `now` on copies, so the scheduler itself does not change.
    pub fn standing(&self, now: Timestamp) -> FairShareStanding {
        let now = now.max(self.now);
        let half_life = self.config.fairshare.half_life_secs;
        let ledgers: Vec<f64> = self
            .groups
            .iter()
            .map(|g| {
                let mut ledger = g.ledger.clone();
                ledger.advance(now.as_millis(), half_life);
                ledger.value
            })
            .collect();
        let inputs: Vec<(f64, f64)> = ledgers
            .iter()
            .zip(&self.groups)
            .map(|(value, g)| (*value, g.share))
            .collect();
        let mut groups: Vec<GroupStanding> = self
            .groups
            .iter()
            .zip(fair_shares(&inputs))
            .zip(ledgers)
            .map(|((g, shares), decayed_usage)| GroupStanding {
                group: g.account.name.clone(),
                share: g.share,
                normalized_share: shares.normalized_share,
                decayed_usage,
                effective_usage: shares.effective_usage,
                fairshare: shares.factor,
                fairshare_in_use: g.fairshare,
                guaranteed_gpus: g.guaranteed_gpus,
                limits: g.account.limits.clone(),
                usage: g.account.usage,
                allocated: g.allocated,
            })
            .collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        let mut users: Vec<UserStanding> = self
            .users
            .iter()
            .map(|u| UserStanding {
                user: u.name.clone(),
                limits: u.limits.clone(),
                usage: u.usage,
            })
            .collect();
        users.sort_by(|a, b| a.user.cmp(&b.user));
        FairShareStanding {
            at: now,
            policy: self.policy.name.to_string(),
            half_life_secs: half_life,
            groups,
            users,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, GroupConfig, NodeSpec, SchedulerConfig, TaskRequest};
    use tacc_core::{NodeId, TaskId, UserName};

    #[test]
    fn the_factor_is_two_to_the_minus_usage_over_share() {
        let shares = fair_shares(&[(300.0, 1.0), (100.0, 3.0), (0.0, 0.0)]);
        assert_eq!(shares[0].normalized_share, 0.25);
        assert_eq!(shares[0].effective_usage, 0.75);
        assert_eq!(shares[0].factor, 2f64.powf(-3.0));
        assert_eq!(shares[1].factor, 2f64.powf(-0.25 / 0.75));
        // No share at all: the lowest factor.
        assert_eq!(shares[2].factor, 0.0);
        // Nobody used anything: every factor is 1.
        assert!(
            fair_shares(&[(0.0, 1.0), (0.0, 2.0)])
                .iter()
                .all(|s| s.factor == 1.0)
        );
    }

    fn request(user: &str, group: &str, gpus: u32, at: u64) -> TaskRequest {
        TaskRequest {
            user: UserName::new(user),
            group: Some(group.into()),
            per_node: Resources::new(1000, 1 << 30, gpus),
            nodes: 1,
            submitted_at: Timestamp(at),
            ..Default::default()
        }
    }

    #[test]
    fn the_standing_reports_what_the_policy_ranks_with() {
        let mut config = SchedulerConfig::default();
        config.fairshare.half_life_secs = 3600;
        config.fairshare.recalc_period_secs = 0;
        config.groups.insert(
            "vision".into(),
            GroupConfig {
                share: Some(3.0),
                ..Default::default()
            },
        );
        let mut s = Scheduler::with_config(config);
        s.handle(
            Timestamp(0),
            Event::NodeUp(NodeSpec {
                id: NodeId(1),
                capacity: Resources::new(16_000, 64 << 30, 8),
                gpu_type: None,
                labels: Default::default(),
            }),
        )
        .unwrap();
        for (id, user, group, gpus) in [
            (1, "alice", "vision", 4),
            (2, "bob", "nlp", 1),
            (3, "carol", "nlp", 2),
        ] {
            s.handle(
                Timestamp(1_000),
                Event::TaskSubmitted {
                    task: TaskId(id),
                    request: request(user, group, gpus, 1_000),
                },
            )
            .unwrap();
        }
        s.handle(Timestamp(1_800_000), Event::TaskEnded(TaskId(2)))
            .unwrap();
        // A tick recomputes the factors the policy ranks with (recalc period 0).
        let now = Timestamp(3_600_000);
        s.handle(now, Event::Tick).unwrap();
        let standing = s.standing(now);
        assert_eq!(standing.policy, "fairshare");
        let names: Vec<&str> = standing.groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, vec!["nlp", "vision"]);
        for group in &standing.groups {
            let index = s.group_index[&group.group];
            assert_eq!(group.fairshare, s.groups[index].fairshare, "{group:?}");
            assert_eq!(group.fairshare_in_use, s.groups[index].fairshare);
        }
        let vision = &standing.groups[1];
        assert_eq!((vision.share, vision.normalized_share), (3.0, 0.75));
        assert_eq!(vision.usage.gpu_hundredths, 400);
        assert_eq!(vision.usage.running, 1);
        // vision ran 4 GPUs for the whole hour, nlp 1 GPU for half of it and 2 GPUs for
        // all of it: 4 / (4 + 0.5 + 2) of the (decayed) usage, roughly.
        assert!(
            (vision.effective_usage - 4.0 / 6.5).abs() < 0.02,
            "{vision:?}"
        );
        assert!(vision.fairshare > standing.groups[0].fairshare);
        let users: Vec<(&str, u64)> = standing
            .users
            .iter()
            .map(|u| (u.user.as_str(), u.usage.gpu_hundredths / 100))
            .collect();
        assert_eq!(users, vec![("alice", 4), ("bob", 0), ("carol", 2)]);
        // Later, the standing decays further without changing the scheduler.
        let later = s.standing(Timestamp(7_200_000));
        assert!(later.groups[0].decayed_usage > standing.groups[0].decayed_usage);
        assert_eq!(s.standing(now), standing);
    }
}

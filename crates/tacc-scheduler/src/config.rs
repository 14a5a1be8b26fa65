//! Operator configuration: users → groups, hard limits, guaranteed shares, priority caps,
//! fair-share weights. Plain serde data, so the server can read it from TOML or YAML.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tacc_core::Priority;

/// Hard limits; `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_gpus: Option<u64>,
    /// Whole CPUs.
    pub max_cpus: Option<u64>,
    pub max_running_tasks: Option<u64>,
    pub max_queued_tasks: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserConfig {
    /// The group the user's tasks are charged to when a task names none.
    pub group: Option<String>,
    /// Highest priority class the user may ask for; higher requests are lowered to it.
    pub max_priority: Option<Priority>,
    #[serde(flatten)]
    pub limits: Limits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupConfig {
    /// GPUs the group is guaranteed (Kueue's nominal quota). Above it a group borrows
    /// idle capacity, which is reclaimed by preemption when an owner needs it back.
    pub guaranteed_gpus: u64,
    /// Fair-share weight; defaults to `guaranteed_gpus`, or 1 when that is 0.
    pub share: Option<f64>,
    #[serde(flatten)]
    pub limits: Limits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FairShareConfig {
    /// Half-life of recorded usage, seconds; 0 means usage never decays.
    pub half_life_secs: u64,
    pub weight_age: f64,
    pub weight_fairshare: f64,
    /// Age at which the age factor saturates at 1.
    pub max_age_secs: u64,
    /// Usage charged per GPU-second and per CPU-second.
    pub gpu_weight: f64,
    pub cpu_weight: f64,
    /// Priorities are recomputed at most this often (Slurm's PriorityCalcPeriod), so a
    /// decision stays cheap with a long queue. New tasks get a priority at once.
    pub recalc_period_secs: u64,
}

impl Default for FairShareConfig {
    fn default() -> Self {
        FairShareConfig {
            half_life_secs: 7 * 86_400,
            weight_age: 1_000.0,
            weight_fairshare: 10_000.0,
            max_age_secs: 7 * 86_400,
            gpu_weight: 1.0,
            cpu_weight: 0.0625,
            recalc_period_secs: 60,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreemptionConfig {
    /// Seconds between the grace signal and the kill.
    pub grace_secs: u64,
    /// Reclaim borrowed capacity for groups below their guarantee.
    pub reclaim: bool,
    /// Let higher-priority tasks preempt lower ones (if the policy preempts at all).
    pub by_priority: bool,
    /// How many blocked tasks per decision may look for victims.
    pub max_claimants_per_pass: usize,
    /// A task that (re)started less than this long ago is not a victim (Slurm's
    /// PreemptExemptTime): without it, the task that just resumed always "loses the least
    /// work" and is picked again and again.
    pub min_run_secs: u64,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            grace_secs: 30,
            reclaim: true,
            by_priority: true,
            max_claimants_per_pass: 8,
            min_run_secs: 600,
        }
    }
}

/// Everything an operator tunes. `SchedulerConfig::default()` is an open cluster: no
/// limits, equal shares, every user may ask for `high`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    pub users: BTreeMap<String, UserConfig>,
    pub groups: BTreeMap<String, GroupConfig>,
    /// Limits for users without their own entry (and defaults for missing fields).
    pub default_user_limits: Limits,
    /// Priority cap for users that set none.
    pub default_max_priority: Option<Priority>,
    /// Time limit assumed for backfill planning when a task gives none (Slurm's
    /// partition default); `None` plans such tasks as never ending.
    pub default_time_limit_secs: Option<u64>,
    pub fairshare: FairShareConfig,
    pub preemption: PreemptionConfig,
    /// Whose tasks may pack shares of one GPU (`gpus: 0.5`) onto the same GPU: `user`
    /// (the default) or `group`; never tasks of different tenants.
    pub share_gpus_within: crate::ShareGpusWithin,
}

impl SchedulerConfig {
    /// The group a user's task is charged to.
    pub fn group_of(&self, user: &str, requested: Option<&str>) -> String {
        if let Some(group) = requested {
            return group.to_string();
        }
        self.users
            .get(user)
            .and_then(|u| u.group.clone())
            .unwrap_or_else(|| user.to_string())
    }

    pub fn priority_cap(&self, user: &str) -> Priority {
        self.users
            .get(user)
            .and_then(|u| u.max_priority)
            .or(self.default_max_priority)
            .unwrap_or(Priority::High)
    }

    pub fn user_limits(&self, user: &str) -> Limits {
        let defaults = &self.default_user_limits;
        match self.users.get(user) {
            None => defaults.clone(),
            Some(cfg) => Limits {
                max_gpus: cfg.limits.max_gpus.or(defaults.max_gpus),
                max_cpus: cfg.limits.max_cpus.or(defaults.max_cpus),
                max_running_tasks: cfg.limits.max_running_tasks.or(defaults.max_running_tasks),
                max_queued_tasks: cfg.limits.max_queued_tasks.or(defaults.max_queued_tasks),
            },
        }
    }

    pub fn group_limits(&self, group: &str) -> Limits {
        self.groups
            .get(group)
            .map(|g| g.limits.clone())
            .unwrap_or_default()
    }

    pub fn guaranteed_gpus(&self, group: &str) -> u64 {
        self.groups.get(group).map_or(0, |g| g.guaranteed_gpus)
    }

    pub fn share_weight(&self, group: &str) -> f64 {
        match self.groups.get(group) {
            Some(GroupConfig {
                share: Some(share), ..
            }) => *share,
            Some(g) if g.guaranteed_gpus > 0 => g.guaranteed_gpus as f64,
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_from_toml() {
        let text = r#"
            default_time_limit_secs = 86400
            [default_user_limits]
            max_gpus = 16
            [users.alice]
            group = "vision"
            max_priority = "normal"
            max_running_tasks = 4
            [groups.vision]
            guaranteed_gpus = 32
            max_gpus = 64
            [fairshare]
            half_life_secs = 3600
            [preemption]
            grace_secs = 60
        "#;
        let config: SchedulerConfig = toml::from_str(text).unwrap();
        assert_eq!(config.group_of("alice", None), "vision");
        assert_eq!(config.priority_cap("alice"), Priority::Normal);
        assert_eq!(config.user_limits("alice").max_gpus, Some(16));
        assert_eq!(config.user_limits("alice").max_running_tasks, Some(4));
        assert_eq!(config.guaranteed_gpus("vision"), 32);
        assert_eq!(config.group_limits("vision").max_gpus, Some(64));
        assert_eq!(config.fairshare.half_life_secs, 3600);
        assert_eq!(config.preemption.grace_secs, 60);
        assert!(toml::from_str::<SchedulerConfig>("[users.bob]\ngroop = \"x\"").is_err());
    }
}

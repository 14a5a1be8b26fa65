//! Accounts: for each user and group, its limits and what its tasks hold and queue now
//! (the [`Usage`] admission checks); for each group also its guarantee, its fair-share
//! weight and a [`Ledger`] of decaying billed usage. All usage arithmetic is here: a task
//! counts as queued from submit until it leaves, as running while it holds resources
//! ([`Scheduler::charge`] and [`Scheduler::refund`]), and what-if questions ("would it
//! still be admitted once these tasks have started?") add started tasks the same way
//! ([`Extra`]). Limits that can never pass reject a task at submit
//! ([`Scheduler::over_limits_forever`]).

use std::collections::BTreeMap;

use tacc_core::{Resources, Timestamp};

use super::Scheduler;
use super::task::TaskEntry;
use crate::config::Limits;
use crate::policy::{AdmissionPolicy, HardLimits, QuotaView, TaskView, Usage};
use crate::{LimitKind, PendingReason, TaskRequest};

/// Decaying usage of one group, integrated exactly between rate changes.
#[derive(Debug, Clone, Default)]
pub(super) struct Ledger {
    pub value: f64,
    /// Billing units per second currently running.
    pub rate: f64,
    pub last_ms: u64,
}

impl Ledger {
    pub(super) fn advance(&mut self, now_ms: u64, half_life_secs: u64) {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = self.last_ms.max(now_ms);
        if dt <= 0.0 {
            return;
        }
        if half_life_secs == 0 {
            self.value += self.rate * dt;
            return;
        }
        let lambda = std::f64::consts::LN_2 / half_life_secs as f64;
        let keep = (-lambda * dt).exp();
        self.value = self.value * keep + self.rate * (1.0 - keep) / lambda;
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct Account {
    pub name: String,
    pub usage: Usage,
    pub limits: Limits,
}

#[derive(Debug, Clone, Default)]
pub(super) struct GroupAccount {
    pub account: Account,
    pub guaranteed_gpus: u64,
    pub share: f64,
    pub ledger: Ledger,
    pub fairshare: f64,
    pub allocated: Resources,
}

impl Usage {
    /// One running task holding `total`.
    fn one_task(request: &TaskRequest) -> Usage {
        let total = request.total();
        Usage {
            gpu_hundredths: request.gpu_hundredths(),
            cpu_millis: total.cpu_millis,
            running: 1,
            queued: 0,
        }
    }

    /// Count the queued tasks in `started` as running.
    fn add_started(&mut self, started: &Usage) {
        self.gpu_hundredths += started.gpu_hundredths;
        self.cpu_millis += started.cpu_millis;
        self.running += started.running;
        self.queued = self.queued.saturating_sub(started.running);
    }

    /// Count the running tasks in `stopped` as queued again.
    fn remove_started(&mut self, stopped: &Usage) {
        self.gpu_hundredths -= stopped.gpu_hundredths;
        self.cpu_millis -= stopped.cpu_millis;
        self.running -= stopped.running;
        self.queued += stopped.running;
    }
}

/// Usage by user and by group (account indices) of tasks counted as started in a what-if
/// question, on top of what the accounts hold.
#[derive(Debug, Default)]
pub(super) struct Extra {
    users: BTreeMap<usize, Usage>,
    groups: BTreeMap<usize, Usage>,
}

impl Extra {
    /// Count `entry` as started.
    pub(super) fn add(&mut self, entry: &TaskEntry) {
        let one = Usage::one_task(&entry.request);
        self.users.entry(entry.user).or_default().add_started(&one);
        self.groups
            .entry(entry.group)
            .or_default()
            .add_started(&one);
    }
}

impl Scheduler {
    pub(super) fn user_id(&mut self, name: &str) -> usize {
        if let Some(id) = self.user_index.get(name) {
            return *id;
        }
        self.users.push(Account {
            name: name.to_string(),
            usage: Usage::default(),
            limits: self.config.user_limits(name),
        });
        self.user_index
            .insert(name.to_string(), self.users.len() - 1);
        self.users.len() - 1
    }

    pub(super) fn group_id(&mut self, name: &str) -> usize {
        if let Some(id) = self.group_index.get(name) {
            return *id;
        }
        self.groups.push(GroupAccount {
            account: Account {
                name: name.to_string(),
                usage: Usage::default(),
                limits: self.config.group_limits(name),
            },
            guaranteed_gpus: self.config.guaranteed_gpus(name),
            share: self.config.share_weight(name),
            ledger: Ledger {
                last_ms: self.now.as_millis(),
                ..Ledger::default()
            },
            fairshare: 1.0,
            allocated: Resources::ZERO,
        });
        self.group_index
            .insert(name.to_string(), self.groups.len() - 1);
        // A new group changes everyone's normalised share.
        self.ranked_at = None;
        self.groups.len() - 1
    }

    /// The accounts (user, group) a request would be charged to, as they stand (fresh ones,
    /// with the configured limits, for a user or group not seen yet); opens nothing.
    pub(super) fn accounts_view(&self, request: &TaskRequest) -> (Account, Account) {
        let name = request.user.as_str();
        let user = match self.user_index.get(name) {
            Some(id) => self.users[*id].clone(),
            None => Account {
                name: name.to_string(),
                usage: Usage::default(),
                limits: self.config.user_limits(name),
            },
        };
        let group_name = self.config.group_of(name, request.group.as_deref());
        let group = match self.group_index.get(&group_name) {
            Some(id) => self.groups[*id].account.clone(),
            None => Account {
                limits: self.config.group_limits(&group_name),
                name: group_name,
                usage: Usage::default(),
            },
        };
        (user, group)
    }

    /// The accounts (user, group) a request is charged to, opened on first sight.
    pub(super) fn accounts_of(&mut self, request: &TaskRequest) -> (usize, usize) {
        let user = self.user_id(request.user.as_str());
        let group_name = self
            .config
            .group_of(request.user.as_str(), request.group.as_deref());
        (user, self.group_id(&group_name))
    }

    /// A task joins (`+1`) or leaves (`-1`) the queued count of its accounts.
    pub(super) fn count_queued(&mut self, user: usize, group: usize, joins: bool) {
        for usage in [
            &mut self.users[user].usage,
            &mut self.groups[group].account.usage,
        ] {
            if joins {
                usage.queued += 1;
            } else {
                usage.queued -= 1;
            }
        }
    }

    fn billing_rate(&self, request: &TaskRequest) -> f64 {
        let total = request.total();
        let weights = &self.config.fairshare;
        // Shares are billed as such: half a GPU accrues half a GPU's usage.
        request.gpu_hundredths() as f64 / f64::from(tacc_core::GPU_HUNDREDTHS) * weights.gpu_weight
            + total.cpu_millis as f64 / 1000.0 * weights.cpu_weight
    }

    /// A queued task of these accounts starts: its resources count as held, and its group
    /// is billed for them from `now`.
    pub(super) fn charge(
        &mut self,
        now: Timestamp,
        user: usize,
        group: usize,
        request: &TaskRequest,
    ) {
        self.bill(now, user, group, request, true);
    }

    /// The reverse of [`Scheduler::charge`]: the task stops holding resources (and is
    /// counted as queued again until the caller drops it).
    pub(super) fn refund(
        &mut self,
        now: Timestamp,
        user: usize,
        group: usize,
        request: &TaskRequest,
    ) {
        self.bill(now, user, group, request, false);
    }

    fn bill(
        &mut self,
        now: Timestamp,
        user: usize,
        group: usize,
        request: &TaskRequest,
        starts: bool,
    ) {
        let half_life = self.config.fairshare.half_life_secs;
        let total = request.total();
        let one = Usage::one_task(request);
        let rate = self.billing_rate(request);
        for usage in [
            &mut self.users[user].usage,
            &mut self.groups[group].account.usage,
        ] {
            if starts {
                usage.add_started(&one);
            } else {
                usage.remove_started(&one);
            }
        }
        let account = &mut self.groups[group];
        account.ledger.advance(now.as_millis(), half_life);
        if starts {
            account.allocated = account.allocated.add(&total);
            account.ledger.rate += rate;
        } else {
            account.allocated = account.allocated.saturating_sub(&total);
            account.ledger.rate = (account.ledger.rate - rate).max(0.0);
        }
    }

    pub(super) fn quota_view(&self, entry: &TaskEntry) -> QuotaView<'_> {
        let user = &self.users[entry.user];
        let group = &self.groups[entry.group].account;
        QuotaView {
            user_limits: &user.limits,
            user_usage: user.usage,
            group_limits: &group.limits,
            group_usage: group.usage,
        }
    }

    /// The quota view of `entry` as if the tasks counted in `extra` had started as well.
    pub(super) fn quota_with(&self, entry: &TaskEntry, extra: &Extra) -> QuotaView<'_> {
        let mut quota = self.quota_view(entry);
        if let Some(started) = extra.users.get(&entry.user) {
            quota.user_usage.add_started(started);
        }
        if let Some(started) = extra.groups.get(&entry.group) {
            quota.group_usage.add_started(started);
        }
        quota
    }

    /// Whether the task's group stays within its guarantee once the task has started.
    pub(super) fn within_guarantee(&self, entry: &TaskEntry) -> bool {
        let group = &self.groups[entry.group];
        group.account.usage.gpu_hundredths + entry.request.gpu_hundredths()
            <= group.guaranteed_gpus * u64::from(tacc_core::GPU_HUNDREDTHS)
    }

    /// Limits that reject at submit: a full queue, or a task bigger than a limit allows
    /// (what [`HardLimits`] says of the task alone, with nothing else running). The user's
    /// limits are checked before the group's.
    pub(super) fn over_limits_forever(
        &self,
        user_account: &Account,
        group_account: &Account,
        request: &TaskRequest,
    ) -> Option<PendingReason> {
        let task = TaskView {
            id: tacc_core::TaskId(0),
            request,
            group: &group_account.name,
            priority: request.priority,
            attempt: 1,
            attained_gpu_secs: 0.0,
            group_fairshare: 1.0,
            group_allocated: Resources::ZERO,
        };
        let unlimited = Limits::default();
        let alone = |user_limits: &Limits, group_limits: &Limits| {
            let quota = QuotaView {
                user_limits,
                user_usage: Usage::default(),
                group_limits,
                group_usage: Usage::default(),
            };
            HardLimits.admit(&task, &quota).err()
        };
        let queue_full = |account: &Account| {
            account
                .limits
                .max_queued_tasks
                .filter(|max| account.usage.queued >= *max)
        };
        if let Some(max) = queue_full(user_account) {
            let limit = LimitKind::QueuedTasks;
            return Some(PendingReason::OverUserQuota { limit, max });
        }
        if let Some(reason) = alone(&user_account.limits, &unlimited) {
            return Some(reason);
        }
        if let Some(max) = queue_full(group_account) {
            return Some(PendingReason::OverGroupQuota {
                group: group_account.name.clone(),
                limit: LimitKind::QueuedTasks,
                max,
            });
        }
        alone(&unlimited, &group_account.limits)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

    #[test]
    fn limits_hold_tasks_back_and_reject_what_can_never_pass() {
        let mut config = SchedulerConfig::default();
        config.default_user_limits.max_gpus = Some(2);
        config.default_user_limits.max_queued_tasks = Some(2);
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 8)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(1, 2, 1, 0))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, request(1, 1, 1, 1));
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::OverUserQuota {
                    limit: LimitKind::Gpus,
                    max: 2
                }
            }]
        );
        let plan = submit(&mut s, 3, request(1, 3, 1, 2));
        assert!(
            matches!(plan.actions[..], [Action::Reject { .. }]),
            "{plan:?}"
        );
    }

    #[test]
    fn a_full_queue_or_a_task_over_a_limit_is_rejected_user_before_group() {
        let mut config = SchedulerConfig::default();
        config.default_user_limits.max_queued_tasks = Some(1);
        config.default_user_limits.max_cpus = Some(4);
        config.groups.insert(
            "team".into(),
            GroupConfig {
                limits: crate::Limits {
                    max_gpus: Some(1),
                    max_running_tasks: Some(0),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        let mut s = Scheduler::by_name("fifo", config).unwrap();
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        let in_team = |cpus, gpus, at| TaskRequest {
            group: Some("team".into()),
            ..request(cpus, gpus, 1, at)
        };
        let rejected = |plan: &Plan| match &plan.actions[..] {
            [Action::Reject { reason, .. }] => reason.clone(),
            other => panic!("{other:?}"),
        };
        // Over the user's CPUs and the group's GPUs: the user's limit is named.
        assert_eq!(
            rejected(&submit(&mut s, 1, in_team(5, 2, 1))),
            PendingReason::OverUserQuota {
                limit: LimitKind::Cpus,
                max: 4
            }
        );
        // Within the user's limits, over the group's GPUs.
        assert_eq!(
            rejected(&submit(&mut s, 2, in_team(1, 2, 2))),
            PendingReason::OverGroupQuota {
                group: "team".into(),
                limit: LimitKind::Gpus,
                max: 1
            }
        );
        // The group runs nothing at all, so any task of it would wait forever.
        assert_eq!(
            rejected(&submit(&mut s, 3, in_team(1, 0, 3))),
            PendingReason::OverGroupQuota {
                group: "team".into(),
                limit: LimitKind::RunningTasks,
                max: 0
            }
        );
        // Outside the group: one task runs, one waits for the user's CPUs, and that one
        // fills the user's queue.
        assert_eq!(
            started(&submit(&mut s, 4, request(4, 0, 1, 4))),
            vec![TaskId(4)]
        );
        assert!(started(&submit(&mut s, 5, request(1, 0, 1, 5))).is_empty());
        assert_eq!(
            rejected(&submit(&mut s, 6, request(1, 0, 1, 6))),
            PendingReason::OverUserQuota {
                limit: LimitKind::QueuedTasks,
                max: 1
            }
        );
    }
}

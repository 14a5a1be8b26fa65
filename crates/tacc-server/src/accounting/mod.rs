//! Usage accounting and fair-share standing, for `tcloud usage` and the dashboard: what
//! each user and group was allocated over a window (like Slurm's `sreport`, computed from
//! the task events in the store by [`charge`]), and the scheduler's fair-share standing
//! (like `sshare`). Both are answered by [`Accounting`], a service of the API's state
//! that reads the store and the usage book, filtered by who asks: a user sees their own, a
//! group admin their group's, an admin everyone's.

pub mod charge;
pub mod window;

use std::collections::BTreeMap;
use std::sync::Arc;

use tacc_core::Role;
use tacc_proto::{
    AllocatedNow, FairShareReport, GroupShare, QuotaLimits, UsageBy, UsageQuery, UsageReport,
    UserShare,
};
use tacc_scheduler::{FairShareStanding, UserConfig};
use tacc_schema::TaskSpec;
use tacc_store::Store;

use crate::auth::{UserCaller, may_act_for};
use crate::clock::Clock;
use crate::usage::UsageBook;
use crate::{Control, ServerError};
use charge::{Allocation, Ledger, attempt_spans, bucket_secs_for};

/// Users' groups, looked up once per report.
#[derive(Debug, Default)]
struct Groups {
    /// The identity's group (`taccd admin user add --group`), which access follows.
    identity: BTreeMap<String, Option<String>>,
}

/// Usage reports and fair-share standing (`GET /v1/usage`, `/v1/usage/fairshare`).
#[derive(Debug, Clone)]
pub(crate) struct Accounting {
    store: Arc<dyn Store>,
    /// GPU time sampled so far of attempts still running.
    usage: Arc<UsageBook>,
    /// The configuration file's users (`[users.NAME] group`); shared, as the API's state
    /// is cloned for every request.
    configured: Arc<BTreeMap<String, UserConfig>>,
    clock: Arc<dyn Clock>,
}

impl Accounting {
    /// The accounting of `control`'s store, usage book, configuration and clock.
    pub(crate) fn of(control: &Control) -> Accounting {
        Accounting {
            store: control.store.clone(),
            usage: control.usage.clone(),
            configured: Arc::new(control.config.scheduler.users.clone()),
            clock: control.clock.clone(),
        }
    }

    async fn identity_groups(&self) -> Result<Groups, ServerError> {
        let identity = self
            .store
            .list_users()
            .await?
            .into_iter()
            .map(|u| (u.name, u.group))
            .collect();
        Ok(Groups { identity })
    }

    /// The group a user's usage is accounted to: the configuration file's
    /// `[users.NAME] group`, else their identity's group, else — as the scheduler charges
    /// such a user (`SchedulerConfig::group_of`) — a group of their own, named after them.
    fn accounting_group(&self, groups: &Groups, user: &str) -> Option<String> {
        let group = self
            .configured
            .get(user)
            .and_then(|u| u.group.clone())
            .or_else(|| groups.identity.get(user).cloned().flatten())
            .unwrap_or_else(|| user.to_string());
        Some(group)
    }

    /// `GET /v1/usage`: allocated CPU-, GPU- and memory-hours in the query's window, by
    /// user or group, over the users `caller` may see.
    pub(crate) async fn usage_report(
        &self,
        caller: &UserCaller,
        query: &UsageQuery,
    ) -> Result<UsageReport, ServerError> {
        let now = self.clock.now();
        let (since, until) = window::window(query.since.as_deref(), query.until.as_deref(), now)?;
        let groups = self.identity_groups().await?;
        let owner_group = |user: &str| groups.identity.get(user).cloned().flatten();
        if let Some(user) = &query.user
            && !may_act_for(caller, user, owner_group(user).as_deref())
        {
            return Err(ServerError::Forbidden(format!(
                "{} may see only their own usage{}; ask an admin for user {user}'s",
                caller.name,
                match caller.role {
                    Role::GroupAdmin => " and their group's",
                    _ => "",
                }
            )));
        }
        if let Some(group) = &query.group {
            let allowed = caller.role == Role::Admin
                || (caller.role == Role::GroupAdmin && caller.group.as_ref() == Some(group));
            if !allowed {
                return Err(ServerError::Forbidden(format!(
                    "only an admin or group {group}'s group admin may see its usage; \
                     leave out --group to see your own"
                )));
            }
        }
        let by = query.by.unwrap_or_default();
        let mut ledger = Ledger::new(since, until, bucket_secs_for(since, until));
        // A plain user sees only their own tasks: read no one else's.
        let only = match (&query.user, caller.role) {
            (Some(user), _) => Some(user.as_str()),
            (None, Role::User) => Some(caller.name.as_str()),
            (None, _) => None,
        };
        let histories = self.store.tasks_active_between(since, until, only).await?;
        for history in histories {
            let user = &history.task.user;
            if !may_act_for(caller, user, owner_group(user).as_deref()) {
                continue;
            }
            let group = self.accounting_group(&groups, user);
            if query.group.is_some() && query.group != group {
                continue;
            }
            let Ok(spec) = serde_json::from_value::<TaskSpec>(history.task.spec.clone()) else {
                tracing::warn!(
                    "task {}: stored spec unreadable, left out of usage",
                    history.task.id
                );
                continue;
            };
            let allocation = Allocation {
                per_node: spec.resources.per_node(),
                nodes: spec.resources.nodes,
                gpu_share: spec.resources.gpu_share_percent(),
            };
            let name = match by {
                UsageBy::User => user.clone(),
                UsageBy::Group => group.clone().unwrap_or_else(|| "-".into()),
            };
            let row_group = match by {
                UsageBy::User => group.as_deref(),
                UsageBy::Group => None,
            };
            let gpu_busy = if !spec.resources.gpus.is_zero() {
                self.gpu_busy_by_attempt(history.task.id).await?
            } else {
                BTreeMap::new()
            };
            for span in attempt_spans(&history.events, now) {
                ledger.charge(&name, row_group, history.task.id, &allocation, &span);
                if let Some(busy_ms) = gpu_busy.get(&span.attempt) {
                    ledger.charge_gpu_use(&name, &span, *busy_ms);
                }
            }
        }
        Ok(ledger.report(by, now))
    }

    /// The GPU time each attempt of `task` used (milliseconds of one GPU fully busy, over
    /// its ranks): as kept in the store, or as sampled so far for a running attempt.
    async fn gpu_busy_by_attempt(
        &self,
        task: tacc_core::TaskId,
    ) -> Result<BTreeMap<tacc_core::AttemptNo, u64>, ServerError> {
        let mut ranks: BTreeMap<(tacc_core::AttemptNo, u32), u64> = self
            .store
            .list_usage_peaks(task)
            .await?
            .into_iter()
            .map(|p| ((p.attempt, p.node_rank), p.gpu_busy_ms))
            .collect();
        for ((attempt, rank), busy) in self.usage.gpu_busy_live(task) {
            let kept = ranks.entry((attempt, rank)).or_default();
            *kept = (*kept).max(busy);
        }
        let mut attempts = BTreeMap::new();
        for ((attempt, _), busy) in ranks {
            *attempts.entry(attempt).or_default() += busy;
        }
        Ok(attempts)
    }

    /// `GET /v1/usage/fairshare`: the scheduler's fair-share standing, limits and what is
    /// held now. A user sees their own line and their group's; a group admin their
    /// group's users and the group; an admin everything. `standing` is the scheduler's,
    /// as of now (`Control::fairshare_standing`).
    pub(crate) async fn fairshare_report(
        &self,
        caller: &UserCaller,
        standing: FairShareStanding,
    ) -> Result<FairShareReport, ServerError> {
        let groups = self.identity_groups().await?;
        // The group the scheduler charges a user's tasks to (their own name when none).
        let charged_group = |user: &str| {
            self.accounting_group(&groups, user)
                .unwrap_or_else(|| user.to_string())
        };
        let factors: BTreeMap<&str, f64> = standing
            .groups
            .iter()
            .map(|g| (g.group.as_str(), g.fairshare))
            .collect();
        let users: Vec<UserShare> = standing
            .users
            .iter()
            .filter(|u| {
                may_act_for(
                    caller,
                    &u.user,
                    groups.identity.get(&u.user).cloned().flatten().as_deref(),
                )
            })
            .map(|u| {
                let group = charged_group(&u.user);
                UserShare {
                    user: u.user.clone(),
                    fairshare: factors.get(group.as_str()).copied(),
                    group: Some(group),
                    limits: quota(&u.limits),
                    allocated: allocated(&u.usage),
                }
            })
            .collect();
        let own_group = charged_group(&caller.name);
        let visible_group = |group: &str| match caller.role {
            Role::Admin => true,
            Role::GroupAdmin => caller.group.as_deref() == Some(group) || group == own_group,
            Role::User => group == own_group,
        };
        let groups: Vec<GroupShare> = standing
            .groups
            .iter()
            .filter(|g| visible_group(&g.group))
            .map(|g| GroupShare {
                group: g.group.clone(),
                share: g.share,
                normalized_share: g.normalized_share,
                decayed_usage: g.decayed_usage,
                effective_usage: g.effective_usage,
                fairshare: g.fairshare,
                fairshare_in_use: g.fairshare_in_use,
                guaranteed_gpus: g.guaranteed_gpus,
                limits: quota(&g.limits),
                allocated: allocated(&g.usage),
            })
            .collect();
        Ok(FairShareReport {
            at: standing.at,
            policy: standing.policy,
            half_life_secs: standing.half_life_secs,
            groups,
            users,
        })
    }
}

fn quota(limits: &tacc_scheduler::Limits) -> QuotaLimits {
    QuotaLimits {
        max_gpus: limits.max_gpus,
        max_cpus: limits.max_cpus,
        max_running_tasks: limits.max_running_tasks,
        max_queued_tasks: limits.max_queued_tasks,
    }
}

fn allocated(usage: &tacc_scheduler::policy::Usage) -> AllocatedNow {
    AllocatedNow {
        gpus: usage.gpu_hundredths as f64 / f64::from(tacc_core::GPU_HUNDREDTHS),
        cpu_millis: usage.cpu_millis,
        running: usage.running,
        queued: usage.queued,
    }
}

//! The users-and-groups page's data: what the operator configured for each user and
//! group (limits, guaranteed GPUs, fair-share weight) beside what each holds now (the
//! resources of their starting and running tasks, and how many are queued). A user sees
//! their own row and their group's; a group admin their group's members; an admin all.
//!
//! The page is built from [`AccountsPage`]; further sections (usage reports, fair-share
//! standing) are further fields of it and further blocks of `accounts.html`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use tacc_core::{Resources, Role, TaskState};
use tacc_scheduler::Limits;
use tacc_store::TaskFilter;

use super::render;
use crate::accounting::Accounting;
use crate::auth::{UserCaller, may_act_for};
use crate::{Control, ServerError};

/// What a user or a group holds now.
#[derive(Debug, Clone, Default)]
struct Holding {
    allocated: Resources,
    running: u64,
    queued: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct UserRow {
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) role: String,
    pub(crate) limits: String,
    pub(crate) max_priority: String,
    pub(crate) allocated: String,
    pub(crate) gpus: u32,
    pub(crate) running: u64,
    pub(crate) queued: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct GroupRow {
    pub(crate) name: String,
    pub(crate) guaranteed_gpus: u64,
    pub(crate) share: String,
    pub(crate) limits: String,
    pub(crate) allocated: String,
    pub(crate) gpus: u32,
    /// GPUs held as a percentage of the guarantee, for the bar; `None` without one.
    pub(crate) of_guarantee: Option<u64>,
    pub(crate) running: u64,
    pub(crate) queued: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccountsPage {
    pub(crate) users: Vec<UserRow>,
    pub(crate) groups: Vec<GroupRow>,
    pub(crate) policy: String,
    /// Allocated resource-hours of the last 7 days, by user and by group (`tcloud usage`).
    pub(crate) usage_by_user: tacc_proto::UsageReport,
    pub(crate) usage_by_group: tacc_proto::UsageReport,
    /// The fair-share standing (`tcloud usage --fairshare`).
    pub(crate) fairshare: tacc_proto::FairShareReport,
}

fn describe(limits: &Limits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.max_gpus {
        parts.push(format!("{n} GPU"));
    }
    if let Some(n) = limits.max_cpus {
        parts.push(format!("{n} CPU"));
    }
    if let Some(n) = limits.max_running_tasks {
        parts.push(format!("{n} running"));
    }
    if let Some(n) = limits.max_queued_tasks {
        parts.push(format!("{n} queued"));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// The group a user's tasks are charged to, as the scheduler decides it: the
/// configuration file's, else the identity's, else a group of their own.
async fn group_of(control: &Control, user: &str) -> Result<String, ServerError> {
    let config = &control.config.scheduler;
    if let Some(group) = config.users.get(user).and_then(|u| u.group.clone()) {
        return Ok(group);
    }
    let identity = control.auth.group_of(user).await?;
    Ok(config.group_of(user, identity.as_deref()))
}

pub(crate) async fn build(
    control: &Control,
    accounting: &Accounting,
    me: &UserCaller,
) -> Result<AccountsPage, ServerError> {
    let config = &control.config.scheduler;
    let active = control
        .query()
        .tasks(&TaskFilter {
            states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
            ..Default::default()
        })
        .await?;
    let mut by_user: BTreeMap<String, Holding> = BTreeMap::new();
    for record in &active {
        let holding = by_user.entry(record.user.clone()).or_default();
        if record.state == TaskState::Queued {
            holding.queued += 1;
            continue;
        }
        holding.running += 1;
        let spec: Option<tacc_schema::TaskSpec> = serde_json::from_value(record.spec.clone()).ok();
        if let Some(spec) = spec {
            holding.allocated = holding
                .allocated
                .add(&spec.resources.per_node().times(spec.resources.nodes));
        }
    }
    let mut names: BTreeSet<String> = by_user.keys().cloned().collect();
    names.extend(config.users.keys().cloned());
    names.extend(control.query().users().await?.into_iter().map(|u| u.name));
    let my_group = group_of(control, &me.name).await?;
    let mut users = Vec::new();
    let mut by_group: BTreeMap<String, Holding> = BTreeMap::new();
    for group in config.groups.keys() {
        by_group.entry(group.clone()).or_default();
    }
    for name in names {
        let group = group_of(control, &name).await?;
        let holding = by_user.get(&name).cloned().unwrap_or_default();
        let total = by_group.entry(group.clone()).or_default();
        total.allocated = total.allocated.add(&holding.allocated);
        total.running += holding.running;
        total.queued += holding.queued;
        let identity = control.query().user(&name).await?;
        let identity_group = identity.as_ref().and_then(|u| u.group.clone());
        if !may_act_for(me, &name, identity_group.as_deref()) {
            continue;
        }
        users.push(UserRow {
            role: identity.map_or("—".into(), |u| u.role.as_str().to_string()),
            limits: describe(&config.user_limits(&name)),
            max_priority: config.priority_cap(&name).to_string(),
            allocated: render::resources(&holding.allocated),
            gpus: holding.allocated.gpus,
            running: holding.running,
            queued: holding.queued,
            name,
            group,
        });
    }
    let groups = by_group
        .into_iter()
        .filter(|(name, _)| me.role == Role::Admin || *name == my_group)
        .map(|(name, holding)| {
            let guaranteed = config.guaranteed_gpus(&name);
            GroupRow {
                guaranteed_gpus: guaranteed,
                share: format!("{}", config.share_weight(&name)),
                limits: describe(&config.group_limits(&name)),
                allocated: render::resources(&holding.allocated),
                gpus: holding.allocated.gpus,
                of_guarantee: (guaranteed > 0)
                    .then(|| u64::from(holding.allocated.gpus) * 100 / guaranteed),
                running: holding.running,
                queued: holding.queued,
                name,
            }
        })
        .collect();
    let week = |by| tacc_proto::UsageQuery {
        since: Some("7d".into()),
        by: Some(by),
        ..Default::default()
    };
    Ok(AccountsPage {
        users,
        groups,
        policy: control.config.policy.clone(),
        usage_by_user: accounting
            .usage_report(me, &week(tacc_proto::UsageBy::User))
            .await?,
        usage_by_group: accounting
            .usage_report(me, &week(tacc_proto::UsageBy::Group))
            .await?,
        fairshare: accounting
            .fairshare_report(me, control.fairshare_standing(crate::now()).await)
            .await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_a_list_or_none() {
        assert_eq!(describe(&Limits::default()), "none");
        let limits = Limits {
            max_gpus: Some(8),
            max_running_tasks: Some(4),
            ..Limits::default()
        };
        assert_eq!(describe(&limits), "8 GPU, 4 running");
    }
}

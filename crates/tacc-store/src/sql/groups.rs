//! Reads of task groups, the history of ended tasks and the notification outbox in either
//! SQL store, and the outbox's one write that runs on its own (a delivery's outcome; it
//! touches no task state, so it is not fenced). Group creation stays with each store: it
//! runs inside the store's own transaction.

use std::collections::BTreeMap;

use tacc_core::{GroupId, TaskState, Timestamp};

use super::{DELIVERY_COLUMNS, GROUP_COLUMNS, TASK_COLUMNS, millis};
use crate::rows::{Columns, delivery_from_row, group_from_row, task_from_row};
use crate::statement::{Run, Statement};
use crate::{
    DeliveryOutcome, DeliveryRecord, GroupFilter, GroupRecord, HistoryFilter, Result, TaskRecord,
};

pub(crate) async fn get_group(pool: &impl Run, id: GroupId) -> Result<Option<GroupRecord>> {
    let select = Statement::new(format!(
        "SELECT {GROUP_COLUMNS} FROM task_groups WHERE id = ?"
    ))
    .bind(id.0 as i64);
    let row = pool.fetch_optional(select).await?;
    row.as_ref().map(group_from_row).transpose()
}

pub(crate) async fn list_groups(pool: &impl Run, filter: &GroupFilter) -> Result<Vec<GroupRecord>> {
    let mut sql = format!("SELECT {GROUP_COLUMNS} FROM task_groups g WHERE 1 = 1");
    if filter.user.is_some() {
        sql.push_str(" AND user_name = ?");
    }
    if filter.since.is_some() {
        sql.push_str(" AND created_at >= ?");
    }
    if !filter.with_states.is_empty() {
        let marks = vec!["?"; filter.with_states.len()].join(", ");
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM tasks t WHERE t.group_id = g.id AND t.state IN ({marks}))"
        ));
    }
    sql.push_str(" ORDER BY id DESC");
    if filter.limit.is_some() {
        sql.push_str(" LIMIT ?");
    }
    let mut select = Statement::new(sql);
    if let Some(user) = &filter.user {
        select = select.bind(user);
    }
    if let Some(since) = filter.since {
        select = select.bind(millis(since));
    }
    for state in &filter.with_states {
        select = select.bind(state.as_str());
    }
    if let Some(limit) = filter.limit {
        select = select.bind(i64::from(limit));
    }
    let rows = pool.fetch_all(select).await?;
    rows.iter().map(group_from_row).collect()
}

pub(crate) async fn group_counts(pool: &impl Run, id: GroupId) -> Result<BTreeMap<TaskState, u64>> {
    let select =
        Statement::new("SELECT state, COUNT(*) AS n FROM tasks WHERE group_id = ? GROUP BY state")
            .bind(id.0 as i64);
    let mut counts = BTreeMap::new();
    for row in &pool.fetch_all(select).await? {
        counts.insert(row.parsed::<TaskState>("state")?, row.int("n")? as u64);
    }
    Ok(counts)
}

/// Through `tasks_by_finished`: newest end first, stopping at the page's limit.
pub(crate) async fn task_history(
    pool: &impl Run,
    filter: &HistoryFilter,
) -> Result<Vec<TaskRecord>> {
    let states: Vec<TaskState> = if filter.states.is_empty() {
        TaskState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect()
    } else {
        filter.states.clone()
    };
    let marks = vec!["?"; states.len()].join(", ");
    let mut sql = format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE finished_at IS NOT NULL AND state IN ({marks})"
    );
    if filter.user.is_some() {
        sql.push_str(" AND user_name = ?");
    }
    if filter.name.is_some() {
        sql.push_str(" AND name = ?");
    }
    if filter.since.is_some() {
        sql.push_str(" AND finished_at >= ?");
    }
    if filter.before.is_some() {
        sql.push_str(" AND (finished_at, id) < (?, ?)");
    }
    sql.push_str(" ORDER BY finished_at DESC, id DESC LIMIT ?");
    let mut select = Statement::new(sql);
    for state in &states {
        select = select.bind(state.as_str());
    }
    if let Some(user) = &filter.user {
        select = select.bind(user);
    }
    if let Some(name) = &filter.name {
        select = select.bind(name);
    }
    if let Some(since) = filter.since {
        select = select.bind(millis(since));
    }
    if let Some((at, id)) = filter.before {
        select = select.bind(millis(at)).bind(id.0 as i64);
    }
    select = select.bind(i64::from(filter.limit));
    let rows = pool.fetch_all(select).await?;
    rows.iter().map(task_from_row).collect()
}

pub(crate) async fn due_deliveries(
    pool: &impl Run,
    now: Timestamp,
    limit: u32,
) -> Result<Vec<DeliveryRecord>> {
    let select = Statement::new(format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries \
         WHERE delivered_at IS NULL AND gave_up = 0 AND next_at <= ? ORDER BY next_at, id LIMIT ?"
    ))
    .bind(millis(now))
    .bind(i64::from(limit));
    let rows = pool.fetch_all(select).await?;
    rows.iter().map(delivery_from_row).collect()
}

pub(crate) async fn finish_delivery(
    pool: &impl Run,
    id: u64,
    outcome: DeliveryOutcome,
) -> Result<bool> {
    let (delivered_at, next_at, error, gave_up) = match outcome {
        DeliveryOutcome::Delivered { at } => (Some(millis(at)), None, None, false),
        DeliveryOutcome::Retry { next_at, error } => {
            (None, Some(millis(next_at)), Some(error), false)
        }
        DeliveryOutcome::GaveUp { error } => (None, None, Some(error), true),
    };
    let update = Statement::new(
        "UPDATE deliveries SET attempts = attempts + 1, delivered_at = ?, \
         next_at = COALESCE(?, next_at), last_error = COALESCE(?, last_error), gave_up = ? \
         WHERE id = ?",
    )
    .bind(delivered_at)
    .bind(next_at)
    .bind(error)
    .bind(i64::from(gave_up))
    .bind(id as i64);
    Ok(pool.execute(update).await? > 0)
}

pub(crate) async fn get_delivery(pool: &impl Run, key: &str) -> Result<Option<DeliveryRecord>> {
    let select = Statement::new(format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE event_key = ?"
    ))
    .bind(key);
    let row = pool.fetch_optional(select).await?;
    row.as_ref().map(delivery_from_row).transpose()
}

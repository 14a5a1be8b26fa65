//! Task groups, the history of ended tasks and the notification outbox in either SQL
//! store. Group creation and queued deliveries are written inside a transaction the store
//! has begun (and, on PostgreSQL, fenced); reads and a delivery's outcome (no task state,
//! so not fenced) run on a pool.

use std::collections::BTreeMap;

use tacc_core::{GroupId, TaskId, TaskState, Timestamp};

use super::{DELIVERY_COLUMNS, GROUP_COLUMNS, TASK_COLUMNS, millis};
use crate::rows::{Columns, delivery_from_row, group_from_row, task_from_row};
use crate::statement::{Run, Statement, Transact};
use crate::{
    DeliveryOutcome, DeliveryRecord, GroupFilter, GroupRecord, HistoryFilter, NewDelivery,
    NewGroup, NewTask, Result, StoreError, TaskRecord,
};

/// Rows per multi-row `INSERT` when creating a group's elements: a task row binds 11
/// values, and SQLite allows 32766 bound values a statement, PostgreSQL 65535.
const ROWS_PER_INSERT: usize = 500;

/// Insert a group and its elements. Elements are inserted many rows per statement: a
/// 10,000-element array is one quick commit, not 20,000 round trips.
pub(crate) async fn insert_group(
    tx: &mut impl Transact,
    group: NewGroup,
    elements: Vec<(u32, NewTask)>,
) -> Result<(GroupRecord, Vec<TaskRecord>)> {
    let insert = Statement::new(
        "INSERT INTO task_groups (kind, name, user_name, spec, size, created_at) \
         VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(group.kind.as_str())
    .bind(&group.name)
    .bind(&group.user)
    .bind(group.spec.to_string())
    .bind(elements.len() as i64)
    .bind(millis(group.created_at));
    let id = tx.fetch_one(insert).await?.int("id")?;
    let record = GroupRecord {
        id: GroupId(id as u64),
        kind: group.kind,
        name: group.name,
        user: group.user,
        spec: group.spec,
        size: elements.len() as u32,
        created_at: group.created_at,
    };
    let tasks = insert_elements(tx, record.id, &elements).await?;
    Ok((record, tasks))
}

/// Grow an existing group by `elements`; `GroupNotFound` when there is none.
pub(crate) async fn add_elements(
    tx: &mut impl Transact,
    group: GroupId,
    elements: Vec<(u32, NewTask)>,
) -> Result<Vec<TaskRecord>> {
    let updated = tx
        .execute(
            Statement::new("UPDATE task_groups SET size = size + ? WHERE id = ?")
                .bind(elements.len() as i64)
                .bind(group.0 as i64),
        )
        .await?;
    if updated == 0 {
        return Err(StoreError::GroupNotFound(group));
    }
    insert_elements(tx, group, &elements).await
}

/// Insert queued elements of `group`, many rows per statement.
async fn insert_elements(
    tx: &mut impl Transact,
    group: GroupId,
    elements: &[(u32, NewTask)],
) -> Result<Vec<TaskRecord>> {
    let mut tasks = Vec::with_capacity(elements.len());
    for batch in elements.chunks(ROWS_PER_INSERT) {
        let marks = vec!["(?, ?, ?, ?, ?, 'queued', 1, ?, ?, ?, ?)"; batch.len()].join(", ");
        let mut insert = Statement::new(format!(
            "INSERT INTO tasks (name, user_name, spec, snapshot, source, state, attempt, \
             submitted_at, group_id, group_index, submission) VALUES {marks} RETURNING id"
        ));
        for (index, task) in batch {
            insert = insert
                .bind(&task.name)
                .bind(&task.user)
                .bind(task.spec.to_string())
                .bind(task.snapshot.as_str())
                .bind(&task.source)
                .bind(millis(task.submitted_at))
                .bind(group.0 as i64)
                .bind(i64::from(*index))
                .bind(task.submission.to_string());
        }
        let mut ids: Vec<i64> = tx
            .fetch_all(insert)
            .await?
            .iter()
            .map(|row| row.int("id"))
            .collect::<Result<_>>()?;
        // Rows of one statement get increasing ids in the order of their VALUES, whatever
        // order `RETURNING` reports them in.
        ids.sort_unstable();
        let marks = vec!["(?, 1, ?, 1, 'queued')"; batch.len()].join(", ");
        let mut events = Statement::new(format!(
            "INSERT INTO task_events (task_id, seq, at, attempt, state) VALUES {marks}"
        ));
        for (task_id, (_, task)) in ids.iter().zip(batch) {
            events = events.bind(*task_id).bind(millis(task.submitted_at));
        }
        tx.execute(events).await?;
        for (task_id, (index, task)) in ids.iter().zip(batch) {
            let mut queued = task.clone().into_queued_record(TaskId(*task_id as u64));
            queued.group = Some(group);
            queued.group_index = Some(*index);
            tasks.push(queued);
        }
    }
    Ok(tasks)
}

/// Inside the caller's transaction (see `TaskChange::Notify`).
pub(crate) async fn queue_delivery(tx: &mut impl Transact, delivery: &NewDelivery) -> Result<()> {
    let insert = Statement::new(
        "INSERT INTO deliveries (event_key, user_name, url, secret_name, body, next_at, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(&delivery.key)
    .bind(&delivery.user)
    .bind(&delivery.url)
    .bind(&delivery.secret)
    .bind(&delivery.body)
    .bind(millis(delivery.created_at))
    .bind(millis(delivery.created_at));
    tx.execute(insert).await?;
    Ok(())
}

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

/// Through `tasks_by_group` (group, state): the first open element found ends the search.
pub(crate) async fn group_has_open(pool: &impl Run, id: GroupId) -> Result<bool> {
    let open: Vec<TaskState> = TaskState::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .collect();
    let marks = vec!["?"; open.len()].join(", ");
    let mut select = Statement::new(format!(
        "SELECT id FROM tasks WHERE group_id = ? AND state IN ({marks}) LIMIT 1"
    ))
    .bind(id.0 as i64);
    for state in &open {
        select = select.bind(state.as_str());
    }
    Ok(!pool.fetch_all(select).await?.is_empty())
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

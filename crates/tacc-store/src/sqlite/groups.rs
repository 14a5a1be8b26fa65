//! Task groups, the history of ended tasks and the notification outbox in SQLite. Writes
//! take the writer pool, reads the reader pool (see [`SqliteStore`](super::SqliteStore)).

use std::collections::BTreeMap;
use std::str::FromStr;

use sqlx::{Row, Sqlite, SqlitePool, Transaction};
use tacc_core::{GroupId, TaskState, Timestamp};

use crate::rows::{corrupt, delivery_from_row, group_from_row, task_from_row};
use crate::sql::{DELIVERY_COLUMNS, GROUP_COLUMNS, TASK_COLUMNS, millis};
use crate::{
    DeliveryOutcome, DeliveryRecord, GroupFilter, GroupRecord, HistoryFilter, NewDelivery,
    NewGroup, NewTask, Result, TaskRecord,
};

/// Rows per multi-row `INSERT` when creating a group's elements: SQLite allows 32766
/// bound values, and a task row binds 8.
const ROWS_PER_INSERT: usize = 500;

/// The group and its elements in one transaction. Elements are inserted many rows per
/// statement: a 10,000-element array is one quick commit, not 20,000 round trips.
pub(super) async fn create_group(
    pool: &SqlitePool,
    group: NewGroup,
    elements: Vec<(u32, NewTask)>,
) -> Result<(GroupRecord, Vec<TaskRecord>)> {
    let mut tx = pool.begin().await?;
    let made = insert_group(&mut tx, group, elements).await?;
    tx.commit().await?;
    Ok(made)
}

/// Insert a group and its elements inside the caller's transaction.
pub(super) async fn insert_group(
    tx: &mut Transaction<'_, Sqlite>,
    group: NewGroup,
    elements: Vec<(u32, NewTask)>,
) -> Result<(GroupRecord, Vec<TaskRecord>)> {
    let spec = group.spec.to_string();
    let id: i64 = sqlx::query(
        "INSERT INTO task_groups (kind, name, user_name, spec, size, created_at) \
         VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(group.kind.as_str())
    .bind(&group.name)
    .bind(&group.user)
    .bind(&spec)
    .bind(elements.len() as i64)
    .bind(millis(group.created_at))
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?;
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

/// Insert queued elements of `group`, many rows per statement.
async fn insert_elements(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    group: GroupId,
    elements: &[(u32, NewTask)],
) -> Result<Vec<TaskRecord>> {
    let mut tasks = Vec::with_capacity(elements.len());
    for batch in elements.chunks(ROWS_PER_INSERT) {
        let marks = vec!["(?, ?, ?, ?, ?, 'queued', 1, ?, ?, ?)"; batch.len()].join(", ");
        let insert_sql = format!(
            "INSERT INTO tasks (name, user_name, spec, snapshot, source, state, attempt, \
             submitted_at, group_id, group_index) VALUES {marks} RETURNING id"
        );
        let mut insert = sqlx::query(&insert_sql);
        let specs: Vec<String> = batch.iter().map(|(_, t)| t.spec.to_string()).collect();
        for ((index, task), spec) in batch.iter().zip(&specs) {
            insert = insert
                .bind(&task.name)
                .bind(&task.user)
                .bind(spec)
                .bind(task.snapshot.as_str())
                .bind(&task.source)
                .bind(millis(task.submitted_at))
                .bind(group.0 as i64)
                .bind(i64::from(*index));
        }
        let mut ids: Vec<i64> = insert
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        // Rows of one statement get increasing ids in the order of their VALUES, whatever
        // order `RETURNING` reports them in.
        ids.sort_unstable();
        let marks = vec!["(?, 1, ?, 1, 'queued')"; batch.len()].join(", ");
        let events_sql =
            format!("INSERT INTO task_events (task_id, seq, at, attempt, state) VALUES {marks}");
        let mut events = sqlx::query(&events_sql);
        for (task_id, (_, task)) in ids.iter().zip(batch) {
            events = events.bind(task_id).bind(millis(task.submitted_at));
        }
        events.execute(&mut **tx).await?;
        for (task_id, (index, task)) in ids.iter().zip(batch) {
            let mut queued = task
                .clone()
                .into_queued_record(tacc_core::TaskId(*task_id as u64));
            queued.group = Some(group);
            queued.group_index = Some(*index);
            tasks.push(queued);
        }
    }
    Ok(tasks)
}

pub(super) async fn add_group_elements(
    pool: &SqlitePool,
    group: GroupId,
    elements: Vec<(u32, NewTask)>,
) -> Result<Vec<TaskRecord>> {
    let mut tx = pool.begin().await?;
    let updated = sqlx::query("UPDATE task_groups SET size = size + ? WHERE id = ?")
        .bind(elements.len() as i64)
        .bind(group.0 as i64)
        .execute(&mut *tx)
        .await?;
    if updated.rows_affected() == 0 {
        return Err(crate::StoreError::GroupNotFound(group));
    }
    let tasks = insert_elements(&mut tx, group, &elements).await?;
    tx.commit().await?;
    Ok(tasks)
}

pub(super) async fn get_group(pool: &SqlitePool, id: GroupId) -> Result<Option<GroupRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {GROUP_COLUMNS} FROM task_groups WHERE id = ?"
    ))
    .bind(id.0 as i64)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(group_from_row).transpose()
}

pub(super) async fn list_groups(
    pool: &SqlitePool,
    filter: &GroupFilter,
) -> Result<Vec<GroupRecord>> {
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
    let mut query = sqlx::query(&sql);
    if let Some(user) = &filter.user {
        query = query.bind(user);
    }
    if let Some(since) = filter.since {
        query = query.bind(millis(since));
    }
    for state in &filter.with_states {
        query = query.bind(state.as_str());
    }
    if let Some(limit) = filter.limit {
        query = query.bind(i64::from(limit));
    }
    let rows = query.fetch_all(pool).await?;
    rows.iter().map(group_from_row).collect()
}

pub(super) async fn group_counts(
    pool: &SqlitePool,
    id: GroupId,
) -> Result<BTreeMap<TaskState, u64>> {
    let rows =
        sqlx::query("SELECT state, COUNT(*) AS n FROM tasks WHERE group_id = ? GROUP BY state")
            .bind(id.0 as i64)
            .fetch_all(pool)
            .await?;
    let mut counts = BTreeMap::new();
    for row in &rows {
        let state: String = row.try_get("state")?;
        let state = TaskState::from_str(&state).map_err(corrupt)?;
        counts.insert(state, row.try_get::<i64, _>("n")? as u64);
    }
    Ok(counts)
}

/// Through `tasks_by_finished`: newest end first, stopping at the page's limit.
pub(super) async fn task_history(
    pool: &SqlitePool,
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
    let mut query = sqlx::query(&sql);
    for state in &states {
        query = query.bind(state.as_str());
    }
    if let Some(user) = &filter.user {
        query = query.bind(user);
    }
    if let Some(name) = &filter.name {
        query = query.bind(name);
    }
    if let Some(since) = filter.since {
        query = query.bind(millis(since));
    }
    if let Some((at, id)) = filter.before {
        query = query.bind(millis(at)).bind(id.0 as i64);
    }
    query = query.bind(i64::from(filter.limit));
    let rows = query.fetch_all(pool).await?;
    rows.iter().map(task_from_row).collect()
}

/// Inside the caller's transaction (see `TaskChange::Notify`).
pub(super) async fn queue_delivery(
    tx: &mut Transaction<'_, Sqlite>,
    delivery: &NewDelivery,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO deliveries (event_key, user_name, url, secret_name, body, next_at, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(&delivery.key)
    .bind(&delivery.user)
    .bind(&delivery.url)
    .bind(&delivery.secret)
    .bind(&delivery.body)
    .bind(millis(delivery.created_at))
    .bind(millis(delivery.created_at))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn due_deliveries(
    pool: &SqlitePool,
    now: Timestamp,
    limit: u32,
) -> Result<Vec<DeliveryRecord>> {
    let rows = sqlx::query(&format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries \
         WHERE delivered_at IS NULL AND gave_up = 0 AND next_at <= ? ORDER BY next_at, id LIMIT ?"
    ))
    .bind(millis(now))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(delivery_from_row).collect()
}

pub(super) async fn finish_delivery(
    pool: &SqlitePool,
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
    let done = sqlx::query(
        "UPDATE deliveries SET attempts = attempts + 1, delivered_at = ?, \
         next_at = COALESCE(?, next_at), last_error = COALESCE(?, last_error), gave_up = ? \
         WHERE id = ?",
    )
    .bind(delivered_at)
    .bind(next_at)
    .bind(error)
    .bind(i64::from(gave_up))
    .bind(id as i64)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn get_delivery(pool: &SqlitePool, key: &str) -> Result<Option<DeliveryRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE event_key = ?"
    ))
    .bind(key)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(delivery_from_row).transpose()
}

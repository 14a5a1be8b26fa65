//! Task groups, the history of ended tasks and the notification outbox in SQLite. Writes
//! take the writer pool, reads the reader pool (see [`SqliteStore`](super::SqliteStore)).

use sqlx::{Row, Sqlite, SqlitePool, Transaction};
use tacc_core::GroupId;

pub(super) use crate::sql::groups::{
    due_deliveries, finish_delivery, get_delivery, get_group, group_counts, list_groups,
    task_history,
};
use crate::sql::millis;
use crate::{GroupRecord, NewDelivery, NewGroup, NewTask, Result, TaskRecord};

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

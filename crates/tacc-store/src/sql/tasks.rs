//! Reads of tasks, nodes, snapshots, outputs and per-task measurements in either SQL
//! store, and the writes among them that touch no task state (nodes, snapshots, outputs),
//! which neither store fences. Task-state writes stay with each store: they run in its own
//! transaction, behind the PostgreSQL store's lease fence.

use std::collections::BTreeMap;

use tacc_core::{NodeId, SnapshotId, TaskId, Timestamp};

use super::{ACTIVE_BETWEEN, NODE_COLUMNS, TASK_COLUMNS, filter_sql, millis};
use crate::rows::{
    Columns, corrupt, event_from_row, metric_from_row, node_from_row, output_from_row,
    resize_from_row, signal_from_row, task_from_row, usage_from_row,
};
use crate::statement::{Run, Statement, Transact};
use crate::{
    NewNode, NodeRecord, OutputRecord, Result, StoreError, TaskEvent, TaskFilter, TaskHistory,
    TaskRecord, UsagePeak,
};

/// A task filter's bound values, in the order [`filter_sql`] placed their marks.
fn bind_filter(mut statement: Statement, filter: &TaskFilter) -> Statement {
    for state in &filter.states {
        statement = statement.bind(state.as_str());
    }
    if let Some(user) = &filter.user {
        statement = statement.bind(user);
    }
    if let Some(group) = filter.group {
        statement = statement.bind(group.0 as i64);
    }
    statement
}

/// `TaskNotFound` for a foreign-key violation (a row naming a task that does not exist),
/// the database error otherwise.
pub(crate) fn unknown_task(error: sqlx::Error, task: TaskId) -> StoreError {
    match error {
        sqlx::Error::Database(e) if e.is_foreign_key_violation() => StoreError::TaskNotFound(task),
        other => other.into(),
    }
}

// ------------------------------------------------------------ tasks

pub(crate) async fn get_task(reader: &impl Run, id: TaskId) -> Result<Option<TaskRecord>> {
    let select =
        Statement::new(format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?")).bind(id.0 as i64);
    let row = reader.fetch_optional(select).await?;
    row.as_ref().map(task_from_row).transpose()
}

pub(crate) async fn list_tasks(reader: &impl Run, filter: &TaskFilter) -> Result<Vec<TaskRecord>> {
    let mut sql = format!("SELECT {TASK_COLUMNS} FROM tasks{}", filter_sql(filter));
    sql.push_str(" ORDER BY id DESC");
    if filter.limit.is_some() {
        sql.push_str(" LIMIT ?");
    }
    let mut select = bind_filter(Statement::new(sql), filter);
    if let Some(limit) = filter.limit {
        select = select.bind(limit as i64);
    }
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(task_from_row).collect()
}

pub(crate) async fn count_tasks(reader: &impl Run, filter: &TaskFilter) -> Result<u64> {
    let sql = format!("SELECT COUNT(*) AS n FROM tasks{}", filter_sql(filter));
    let row = reader
        .fetch_one(bind_filter(Statement::new(sql), filter))
        .await?;
    Ok(row.int("n")? as u64)
}

pub(crate) async fn task_events(reader: &impl Run, id: TaskId) -> Result<Vec<TaskEvent>> {
    let select = Statement::new(
        "SELECT at, attempt, state, reason FROM task_events WHERE task_id = ? ORDER BY seq",
    )
    .bind(id.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(event_from_row).collect()
}

// ------------------------------------------------------------ nodes

pub(crate) async fn register_node(writer: &impl Run, node: NewNode) -> Result<NodeRecord> {
    // An enrolment sets the enrolled capacity and the approval state; a restart with the
    // node's own credential keeps both.
    let enrols = i64::from(node.enrolment.is_some());
    let pending = i64::from(node.enrolment.is_some_and(|e| e.pending));
    let capacity = serde_json::to_string(&node.capacity).map_err(corrupt)?;
    let upsert = Statement::new(format!(
        "INSERT INTO nodes (name, capacity, gpu_type, labels, address, registered_at, enrolled_capacity, pending) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (name) DO UPDATE SET capacity = excluded.capacity, gpu_type = excluded.gpu_type, \
         labels = excluded.labels, address = excluded.address, registered_at = excluded.registered_at, \
         enrolled_capacity = CASE WHEN ? = 1 THEN excluded.enrolled_capacity ELSE nodes.enrolled_capacity END, \
         pending = CASE WHEN ? = 1 THEN excluded.pending ELSE nodes.pending END \
         RETURNING {NODE_COLUMNS}"
    ))
    .bind(&node.name)
    .bind(capacity.clone())
    .bind(&node.gpu_type)
    .bind(serde_json::to_string(&node.labels).map_err(corrupt)?)
    .bind(&node.address)
    .bind(millis(node.registered_at))
    .bind(capacity)
    .bind(pending)
    .bind(enrols)
    .bind(enrols);
    node_from_row(&writer.fetch_one(upsert).await?)
}

pub(crate) async fn list_nodes(reader: &impl Run) -> Result<Vec<NodeRecord>> {
    let rows = reader
        .fetch_all(Statement::new(format!(
            "SELECT {NODE_COLUMNS} FROM nodes ORDER BY id"
        )))
        .await?;
    rows.iter().map(node_from_row).collect()
}

pub(crate) async fn set_node_drained(
    writer: &impl Run,
    node: NodeId,
    drained: bool,
) -> Result<bool> {
    let update = Statement::new("UPDATE nodes SET drained = ? WHERE id = ?")
        .bind(i64::from(drained))
        .bind(node.0 as i64);
    Ok(writer.execute(update).await? > 0)
}

pub(crate) async fn approve_node(writer: &impl Run, node: NodeId) -> Result<bool> {
    let update = Statement::new("UPDATE nodes SET pending = 0 WHERE id = ?").bind(node.0 as i64);
    Ok(writer.execute(update).await? > 0)
}

pub(crate) async fn remove_node(writer: &impl Run, node: NodeId) -> Result<bool> {
    let delete = Statement::new("DELETE FROM nodes WHERE id = ?").bind(node.0 as i64);
    Ok(writer.execute(delete).await? > 0)
}

// ------------------------------------------------------------ snapshots

pub(crate) async fn put_snapshot(
    writer: &impl Run,
    id: &SnapshotId,
    manifest: &serde_json::Value,
    total_bytes: u64,
    at: Timestamp,
) -> Result<()> {
    let insert = Statement::new(
        "INSERT INTO snapshots (id, manifest, total_bytes, created_at) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    )
    .bind(id.as_str())
    .bind(manifest.to_string())
    .bind(total_bytes as i64)
    .bind(millis(at));
    writer.execute(insert).await?;
    Ok(())
}

pub(crate) async fn get_snapshot(
    reader: &impl Run,
    id: &SnapshotId,
) -> Result<Option<serde_json::Value>> {
    let select = Statement::new("SELECT manifest FROM snapshots WHERE id = ?").bind(id.as_str());
    let row = reader.fetch_optional(select).await?;
    row.map(|row| row.json("manifest")).transpose()
}

pub(crate) async fn list_snapshots(reader: &impl Run) -> Result<Vec<SnapshotId>> {
    let rows = reader
        .fetch_all(Statement::new("SELECT id FROM snapshots ORDER BY id"))
        .await?;
    rows.iter()
        .map(|row| row.parsed::<SnapshotId>("id"))
        .collect()
}

// ------------------------------------------------------------ outputs and measurements

pub(crate) async fn add_output(writer: &impl Run, output: OutputRecord) -> Result<()> {
    let upsert = Statement::new(
        "INSERT INTO outputs (task_id, attempt, node_rank, path, size) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (task_id, attempt, node_rank, path) DO UPDATE SET size = excluded.size",
    )
    .bind(output.task.0 as i64)
    .bind(output.attempt.0 as i64)
    .bind(i64::from(output.rank))
    .bind(&output.path)
    .bind(output.size as i64);
    writer
        .execute(upsert)
        .await
        .map_err(|e| unknown_task(e, output.task))?;
    Ok(())
}

pub(crate) async fn list_outputs(reader: &impl Run, task: TaskId) -> Result<Vec<OutputRecord>> {
    let select = Statement::new(
        "SELECT attempt, node_rank, path, size FROM outputs WHERE task_id = ? \
         ORDER BY attempt, node_rank, path",
    )
    .bind(task.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(|row| output_from_row(task, row)).collect()
}

pub(crate) async fn list_resizes(
    reader: &impl Run,
    task: TaskId,
) -> Result<Vec<crate::ResizeRecord>> {
    let select = Statement::new(
        "SELECT attempt, at, cpu_millis, memory_bytes, reason FROM task_resizes \
         WHERE task_id = ? ORDER BY seq",
    )
    .bind(task.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(|row| resize_from_row(task, row)).collect()
}

pub(crate) async fn list_signal_points(
    reader: &impl Run,
    task: TaskId,
) -> Result<Vec<crate::SignalRecord>> {
    let select = Statement::new(
        "SELECT attempt, at, point FROM signal_points WHERE task_id = ? ORDER BY attempt, at",
    )
    .bind(task.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(|row| signal_from_row(task, row)).collect()
}

/// Keep the larger of the stored and the reported value of every measure.
pub(crate) async fn record_usage_peak<R: Run>(writer: &R, peak: UsagePeak) -> Result<()> {
    let greatest = R::GREATEST;
    let upsert = Statement::new(format!(
        "INSERT INTO usage_peaks (task_id, attempt, node_rank, node, cpu_millis, memory_bytes, \
         gpu_utilization_percent, gpu_memory_bytes, at, gpu_busy_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (task_id, attempt, node_rank) DO UPDATE SET node = excluded.node, \
         cpu_millis = {greatest}(usage_peaks.cpu_millis, excluded.cpu_millis), \
         memory_bytes = {greatest}(usage_peaks.memory_bytes, excluded.memory_bytes), \
         gpu_utilization_percent = {greatest}(usage_peaks.gpu_utilization_percent, excluded.gpu_utilization_percent), \
         gpu_memory_bytes = {greatest}(usage_peaks.gpu_memory_bytes, excluded.gpu_memory_bytes), \
         at = {greatest}(usage_peaks.at, excluded.at), \
         gpu_busy_ms = {greatest}(usage_peaks.gpu_busy_ms, excluded.gpu_busy_ms)"
    ))
    .bind(peak.task.0 as i64)
    .bind(peak.attempt.0 as i64)
    .bind(i64::from(peak.node_rank))
    .bind(&peak.node)
    .bind(peak.cpu_millis as i64)
    .bind(peak.memory_bytes as i64)
    .bind(i64::from(peak.gpu_utilization_percent))
    .bind(peak.gpu_memory_bytes as i64)
    .bind(millis(peak.at))
    .bind(peak.gpu_busy_ms as i64);
    writer
        .execute(upsert)
        .await
        .map_err(|e| unknown_task(e, peak.task))?;
    Ok(())
}

pub(crate) async fn list_usage_peaks(reader: &impl Run, task: TaskId) -> Result<Vec<UsagePeak>> {
    let select = Statement::new(
        "SELECT attempt, node_rank, node, cpu_millis, memory_bytes, gpu_utilization_percent, \
         gpu_memory_bytes, at, gpu_busy_ms FROM usage_peaks WHERE task_id = ? \
         ORDER BY attempt, node_rank",
    )
    .bind(task.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(|row| usage_from_row(task, row)).collect()
}

pub(crate) async fn list_metrics(
    reader: &impl Run,
    task: TaskId,
) -> Result<Vec<crate::MetricPoint>> {
    let select = Statement::new(
        "SELECT attempt, seq, step, at, metrics FROM task_metrics WHERE task_id = ? \
         ORDER BY attempt, seq",
    )
    .bind(task.0 as i64);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(|row| metric_from_row(task, row)).collect()
}

/// The tasks [`Store::tasks_active_between`](crate::Store::tasks_active_between) returns,
/// with their events, read in the caller's transaction so both come from one snapshot.
pub(crate) async fn active_between(
    tx: &mut impl Transact,
    since: Timestamp,
    until: Timestamp,
    user: Option<&str>,
) -> Result<Vec<TaskHistory>> {
    let bind_window = |statement: Statement| {
        statement
            .bind(millis(until))
            .bind(millis(since))
            .bind(user)
            .bind(user)
    };
    let tasks = tx
        .fetch_all(bind_window(Statement::new(format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE id IN ({ACTIVE_BETWEEN}) ORDER BY id"
        ))))
        .await?;
    let events = tx
        .fetch_all(bind_window(Statement::new(format!(
            "SELECT task_id, at, attempt, state, reason FROM task_events \
             WHERE task_id IN ({ACTIVE_BETWEEN}) ORDER BY task_id, seq"
        ))))
        .await?;
    let mut by_task: BTreeMap<i64, Vec<TaskEvent>> = BTreeMap::new();
    for row in &events {
        by_task
            .entry(row.int("task_id")?)
            .or_default()
            .push(event_from_row(row)?);
    }
    tasks
        .iter()
        .map(|row| {
            let task = task_from_row(row)?;
            let events = by_task.remove(&(task.id.0 as i64)).unwrap_or_default();
            Ok(TaskHistory { task, events })
        })
        .collect()
}

//! Task-state writes of either SQL store, run inside a transaction the store has begun
//! (and, on PostgreSQL, fenced): inserting a task, applying a plan's changes, signal points
//! and metric points. The store commits.
//!
//! The per-task sequence numbers (`task_events.seq`, `task_resizes.seq`,
//! `task_metrics.seq`) are `MAX + 1` inside the transaction, which is race-free because
//! both stores write through a single connection.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use tacc_core::TaskId;

use super::groups::queue_delivery;
use super::tasks::unknown_task;
use super::{TASK_COLUMNS, millis};
use crate::memory::{apply_transition, change_task};
use crate::rows::{Columns, corrupt, task_from_row};
use crate::statement::{Statement, Transact};
use crate::{NewTask, Result, StoreError, TaskChange, TaskRecord};

/// Insert a queued task and its first event.
pub(crate) async fn insert_task(tx: &mut impl Transact, task: NewTask) -> Result<TaskRecord> {
    let insert = Statement::new(
        "INSERT INTO tasks (name, user_name, spec, snapshot, source, state, attempt, submitted_at, \
         submission) VALUES (?, ?, ?, ?, ?, 'queued', 1, ?, ?) RETURNING id",
    )
    .bind(&task.name)
    .bind(&task.user)
    .bind(task.spec.to_string())
    .bind(task.snapshot.as_str())
    .bind(&task.source)
    .bind(millis(task.submitted_at))
    .bind(task.submission.to_string());
    let id = tx.fetch_one(insert).await?.int("id")?;
    tx.execute(
        Statement::new(
            "INSERT INTO task_events (task_id, seq, at, attempt, state) VALUES (?, 1, ?, 1, 'queued')",
        )
        .bind(id)
        .bind(millis(task.submitted_at)),
    )
    .await?;
    Ok(task.into_queued_record(TaskId(id as u64)))
}

/// Every change of a plan, in order; the first that fails fails them all (the caller drops
/// the transaction).
///
/// A task's row is read once and written once per call, however many of the changes are
/// about it: a short task's start and end usually come in one report batch, and its row
/// (with the indexes on its state) was rewritten for each. Its events are inserted as
/// they happen, one per transition, as before.
pub(crate) async fn apply_changes(tx: &mut impl Transact, changes: &[TaskChange]) -> Result<()> {
    // Rows read and changed by this call, written back at its end.
    let mut changed: BTreeMap<TaskId, TaskRecord> = BTreeMap::new();
    for change in changes {
        let Some(id) = change_task(change) else {
            if let TaskChange::Notify(delivery) = change {
                queue_delivery(tx, delivery).await?;
            }
            continue;
        };
        if let TaskChange::RankEnded(end) = change {
            super::restart_facts::record_rank_end(tx, end)
                .await
                .map_err(|e| match e {
                    StoreError::Database(_) => StoreError::TaskNotFound(id),
                    other => other,
                })?;
            continue;
        }
        // A reason changes one column: no need to read and rewrite the whole row (a
        // large array gets one for every queued element).
        if let TaskChange::Reason { reason, .. } = change
            && !changed.contains_key(&id)
        {
            let done = tx
                .execute(
                    Statement::new("UPDATE tasks SET reason = ? WHERE id = ?")
                        .bind(reason)
                        .bind(id.0 as i64),
                )
                .await?;
            if done == 0 {
                return Err(StoreError::TaskNotFound(id));
            }
            continue;
        }
        let record = match changed.entry(id) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let row = tx
                    .fetch_optional(
                        Statement::new(format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?"))
                            .bind(id.0 as i64),
                    )
                    .await?
                    .ok_or(StoreError::TaskNotFound(id))?;
                entry.insert(task_from_row(&row)?)
            }
        };
        let event = apply_transition(record, change)?;
        if let TaskChange::Resized(resize) = change {
            let insert = Statement::new(
                "INSERT INTO task_resizes (task_id, seq, attempt, at, cpu_millis, memory_bytes, reason) \
                 SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ?, ? FROM task_resizes WHERE task_id = ?",
            )
            .bind(id.0 as i64)
            .bind(resize.attempt.0 as i64)
            .bind(millis(resize.at))
            .bind(resize.cpu_millis as i64)
            .bind(resize.memory_bytes as i64)
            .bind(&resize.reason)
            .bind(id.0 as i64);
            tx.execute(insert).await?;
        }
        if let Some(event) = event {
            let insert = Statement::new(
                "INSERT INTO task_events (task_id, seq, at, attempt, state, reason) \
                 SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ? FROM task_events WHERE task_id = ?",
            )
            .bind(id.0 as i64)
            .bind(millis(event.at))
            .bind(event.attempt.0 as i64)
            .bind(event.state.as_str())
            .bind(&event.reason)
            .bind(id.0 as i64);
            tx.execute(insert).await?;
        }
    }
    for (id, record) in changed {
        let update = Statement::new(
            "UPDATE tasks SET state = ?, reason = ?, exit_code = ?, attempt = ?, placements = ?, \
             cancel_requested = ?, started_at = ?, finished_at = ? WHERE id = ?",
        )
        .bind(record.state.as_str())
        .bind(&record.reason)
        .bind(record.exit_code)
        .bind(record.attempt.0 as i64)
        .bind(serde_json::to_string(&record.placements).map_err(corrupt)?)
        .bind(record.cancel_requested as i64)
        .bind(record.started_at.map(millis))
        .bind(record.finished_at.map(millis))
        .bind(id.0 as i64);
        tx.execute(update).await?;
    }
    Ok(())
}

/// Keep the point, then only the newest `keep` points of its attempt.
pub(crate) async fn record_signal_point(
    tx: &mut impl Transact,
    point: crate::SignalRecord,
    keep: u32,
) -> Result<()> {
    let upsert = Statement::new(
        "INSERT INTO signal_points (task_id, attempt, at, point) VALUES (?, ?, ?, ?) \
         ON CONFLICT (task_id, attempt, at) DO UPDATE SET point = excluded.point",
    )
    .bind(point.task.0 as i64)
    .bind(point.attempt.0 as i64)
    .bind(millis(point.at))
    .bind(serde_json::to_string(&point.point).map_err(corrupt)?);
    tx.execute(upsert)
        .await
        .map_err(|e| unknown_task(e, point.task))?;
    let prune = Statement::new(
        "DELETE FROM signal_points WHERE task_id = ?1 AND attempt = ?2 AND at NOT IN \
         (SELECT at FROM signal_points WHERE task_id = ?1 AND attempt = ?2 ORDER BY at DESC LIMIT ?3)",
    )
    .bind(point.task.0 as i64)
    .bind(point.attempt.0 as i64)
    .bind(i64::from(keep));
    tx.execute(prune).await?;
    Ok(())
}

pub(crate) async fn append_metrics(
    tx: &mut impl Transact,
    points: &[crate::MetricPoint],
) -> Result<()> {
    for point in points {
        let metrics = serde_json::to_string(&point.values).map_err(corrupt)?;
        // The next seq of the attempt, unless it is full (then the point is dropped).
        let insert = Statement::new(
            "INSERT INTO task_metrics (task_id, attempt, seq, step, at, metrics) \
             SELECT ?1, ?2, COALESCE(MAX(seq) + 1, 0), ?3, ?4, ?5 FROM task_metrics \
             WHERE task_id = ?1 AND attempt = ?2 HAVING COALESCE(MAX(seq) + 1, 0) < ?6",
        )
        .bind(point.task.0 as i64)
        .bind(i64::from(point.attempt.0))
        .bind(point.step as i64)
        .bind(millis(point.at))
        .bind(metrics)
        .bind(i64::from(crate::MAX_METRIC_POINTS_PER_ATTEMPT));
        tx.execute(insert)
            .await
            .map_err(|e| unknown_task(e, point.task))?;
    }
    Ok(())
}

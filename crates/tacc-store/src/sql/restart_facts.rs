//! The restart facts of either SQL store (see [`crate::restart_facts`]): rank ends are
//! written inside the transaction of the change that records them; ledgers and last-seen
//! times in a transaction of their own, which the store begins (and fences) and commits.

use tacc_core::{AttemptNo, NodeId, TaskId, Timestamp};

use super::millis;
use crate::rows::{Columns, corrupt};
use crate::statement::{Run, Statement, Transact};
use crate::{DashboardSession, FairShareLedger, RankEnd, Result};

pub(crate) async fn record_rank_end(tx: &mut impl Transact, end: &RankEnd) -> Result<()> {
    let upsert = Statement::new(
        "INSERT INTO attempt_ranks (task_id, attempt, node_rank, node_id, at, failure) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, attempt, node_rank) DO UPDATE SET \
         node_id = excluded.node_id, at = excluded.at, failure = excluded.failure",
    )
    .bind(end.task.0 as i64)
    .bind(i64::from(end.attempt.0))
    .bind(i64::from(end.rank))
    .bind(end.node.0 as i64)
    .bind(millis(end.at))
    .bind(end.failure.clone());
    tx.execute(upsert).await?;
    Ok(())
}

pub(crate) async fn rank_ends(
    reader: &impl Run,
    task: TaskId,
    attempt: AttemptNo,
) -> Result<Vec<RankEnd>> {
    let rows = reader
        .fetch_all(
            Statement::new(
                "SELECT node_rank, node_id, at, failure FROM attempt_ranks \
                 WHERE task_id = ? AND attempt = ? ORDER BY node_rank",
            )
            .bind(task.0 as i64)
            .bind(i64::from(attempt.0)),
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(RankEnd {
                task,
                attempt,
                rank: row.int("node_rank")? as u32,
                node: NodeId(row.int("node_id")? as u64),
                at: Timestamp(row.int("at")? as u64),
                failure: row.optional_text("failure")?,
            })
        })
        .collect()
}

pub(crate) async fn save_fairshare(
    tx: &mut impl Transact,
    ledgers: &[FairShareLedger],
) -> Result<()> {
    for ledger in ledgers {
        let upsert = Statement::new(
            "INSERT INTO fairshare_ledgers (group_name, ledger) VALUES (?, ?) \
             ON CONFLICT (group_name) DO UPDATE SET ledger = excluded.ledger",
        )
        .bind(&ledger.group)
        .bind(serde_json::to_string(ledger).map_err(corrupt)?);
        tx.execute(upsert).await?;
    }
    Ok(())
}

pub(crate) async fn load_fairshare(reader: &impl Run) -> Result<Vec<FairShareLedger>> {
    let rows = reader
        .fetch_all(Statement::new(
            "SELECT ledger FROM fairshare_ledgers ORDER BY group_name",
        ))
        .await?;
    rows.iter()
        .map(|row| serde_json::from_str(&row.text("ledger")?).map_err(corrupt))
        .collect()
}

pub(crate) async fn save_nodes_seen(
    tx: &mut impl Transact,
    seen: &[(NodeId, Timestamp)],
) -> Result<()> {
    for (node, at) in seen {
        let update = Statement::new("UPDATE nodes SET last_seen_at = ? WHERE id = ?")
            .bind(millis(*at))
            .bind(node.0 as i64);
        tx.execute(update).await?;
    }
    Ok(())
}

pub(crate) async fn recent_run_times(
    reader: &impl Run,
    user: &str,
    name: &str,
    limit: u32,
) -> Result<Vec<u64>> {
    let rows = reader
        .fetch_all(
            Statement::new(
                "SELECT started_at, finished_at FROM tasks WHERE user_name = ? AND name = ? \
                 AND state = 'succeeded' AND started_at IS NOT NULL AND finished_at IS NOT NULL \
                 ORDER BY id DESC LIMIT ?",
            )
            .bind(user)
            .bind(name)
            .bind(i64::from(limit)),
        )
        .await?;
    rows.iter()
        .map(|row| {
            let started = row.int("started_at")?;
            let finished = row.int("finished_at")?;
            Ok(finished.saturating_sub(started).max(0) as u64)
        })
        .collect()
}

pub(crate) async fn put_dashboard_session(
    writer: &impl Run,
    session: DashboardSession,
) -> Result<()> {
    let upsert = Statement::new(
        "INSERT INTO dashboard_sessions (session_key, user_name, nonce, sealed, opened_at) \
         VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_key) DO UPDATE SET \
         user_name = excluded.user_name, nonce = excluded.nonce, sealed = excluded.sealed, \
         opened_at = excluded.opened_at",
    )
    .bind(&session.key)
    .bind(&session.user)
    .bind(&session.nonce)
    .bind(&session.sealed)
    .bind(millis(session.opened_at));
    writer.execute(upsert).await?;
    Ok(())
}

pub(crate) async fn dashboard_session(
    reader: &impl Run,
    key: &str,
) -> Result<Option<DashboardSession>> {
    let row = reader
        .fetch_optional(
            Statement::new(
                "SELECT session_key, user_name, nonce, sealed, opened_at \
                 FROM dashboard_sessions WHERE session_key = ?",
            )
            .bind(key),
        )
        .await?;
    row.map(|row| {
        Ok(DashboardSession {
            key: row.text("session_key")?,
            user: row.text("user_name")?,
            nonce: row.bytes("nonce")?,
            sealed: row.bytes("sealed")?,
            opened_at: Timestamp(row.int("opened_at")? as u64),
        })
    })
    .transpose()
}

pub(crate) async fn delete_dashboard_session(writer: &impl Run, key: &str) -> Result<bool> {
    let done = writer
        .execute(Statement::new("DELETE FROM dashboard_sessions WHERE session_key = ?").bind(key))
        .await?;
    Ok(done > 0)
}

pub(crate) async fn prune_dashboard_sessions(writer: &impl Run, before: Timestamp) -> Result<u64> {
    Ok(writer
        .execute(
            Statement::new("DELETE FROM dashboard_sessions WHERE opened_at < ?")
                .bind(millis(before)),
        )
        .await?)
}

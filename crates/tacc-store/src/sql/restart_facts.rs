//! The restart facts of either SQL store (see [`crate::restart_facts`]): rank ends are
//! written inside the transaction of the change that records them; ledgers and last-seen
//! times in a transaction of their own, which the store begins (and fences) and commits.

use tacc_core::{AttemptNo, NodeId, TaskId, Timestamp};

use super::millis;
use crate::rows::{Columns, corrupt};
use crate::statement::{Run, Statement, Transact};
use crate::{FairShareLedger, RankEnd, Result};

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

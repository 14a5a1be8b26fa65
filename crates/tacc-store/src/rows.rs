//! Row decoding for both SQL stores: one `*_from_row` a record, generic over the row type,
//! so [`SqliteStore`](crate::SqliteStore) and [`PostgresStore`](crate::PostgresStore)
//! turn the same tables into the same records with one piece of code. The two migrations
//! declare the same columns; where SQLite says `INTEGER` PostgreSQL says `BIGINT`, except
//! `tasks.exit_code` and `idempotency_keys.status` (`INTEGER`, 32 bits on PostgreSQL), which
//! are read as `i32` (SQLite's 64-bit integers decode into it as well). Booleans are stored
//! as integers (0 or 1) in both.

use std::str::FromStr;

use serde::de::DeserializeOwned;
use sqlx::{ColumnIndex, Decode, Row, Type};
use tacc_core::{AttemptNo, GroupId, NodeId, Role, SnapshotId, TaskId, TaskState, Timestamp};

use crate::{
    AuditEntry, DeliveryRecord, GroupKind, GroupRecord, JoinScope, NodeRecord, OutputRecord,
    Result, SecretRecord, StageRecord, StageSource, StoreError, TaskEvent, TaskRecord, TokenKind,
    TokenRecord, UsagePeak, UserRecord,
};

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

/// A row of either store, read by column name as the types the stores keep.
///
/// Implemented for every sqlx row (the PostgreSQL store's; the decode bounds sqlx needs are
/// stated once, on the blanket implementation) and for the SQLite store's own fetched rows
/// (`sqlite::run::Row`), so the decoders below only ask for `R: Columns`.
pub(crate) trait Columns {
    fn int(&self, column: &str) -> Result<i64>;
    fn optional_int(&self, column: &str) -> Result<Option<i64>>;
    /// A 32-bit `INTEGER` column on PostgreSQL.
    fn int32(&self, column: &str) -> Result<i32>;
    fn optional_int32(&self, column: &str) -> Result<Option<i32>>;
    fn text(&self, column: &str) -> Result<String>;
    fn optional_text(&self, column: &str) -> Result<Option<String>>;
    fn bytes(&self, column: &str) -> Result<Vec<u8>>;

    /// Milliseconds since the epoch.
    fn timestamp(&self, column: &str) -> Result<Timestamp> {
        Ok(Timestamp(self.int(column)? as u64))
    }

    fn optional_timestamp(&self, column: &str) -> Result<Option<Timestamp>> {
        Ok(self.optional_int(column)?.map(|v| Timestamp(v as u64)))
    }

    /// A boolean kept as 0 or 1.
    fn flag(&self, column: &str) -> Result<bool> {
        Ok(self.int(column)? != 0)
    }

    /// A text column holding JSON; a value that does not parse is [`StoreError::Corrupt`].
    fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T> {
        serde_json::from_str(&self.text(column)?).map_err(corrupt)
    }

    /// A text column holding a value parsed with [`FromStr`].
    fn parsed<T>(&self, column: &str) -> Result<T>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        T::from_str(&self.text(column)?).map_err(corrupt)
    }
}

impl<R> Columns for R
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
{
    fn int(&self, column: &str) -> Result<i64> {
        Ok(self.try_get(column)?)
    }

    fn optional_int(&self, column: &str) -> Result<Option<i64>> {
        Ok(self.try_get(column)?)
    }

    fn int32(&self, column: &str) -> Result<i32> {
        Ok(self.try_get(column)?)
    }

    fn optional_int32(&self, column: &str) -> Result<Option<i32>> {
        Ok(self.try_get(column)?)
    }

    fn text(&self, column: &str) -> Result<String> {
        Ok(self.try_get(column)?)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>> {
        Ok(self.try_get(column)?)
    }

    fn bytes(&self, column: &str) -> Result<Vec<u8>> {
        Ok(self.try_get(column)?)
    }
}

// ------------------------------------------------------------ tasks and nodes

pub(crate) fn task_from_row(row: &impl Columns) -> Result<TaskRecord> {
    Ok(TaskRecord {
        id: TaskId(row.int("id")? as u64),
        name: row.text("name")?,
        user: row.text("user_name")?,
        spec: row.json("spec")?,
        snapshot: row.parsed::<SnapshotId>("snapshot")?,
        source: row.optional_text("source")?,
        state: row.parsed::<TaskState>("state")?,
        reason: row.optional_text("reason")?,
        exit_code: row.optional_int32("exit_code")?,
        attempt: AttemptNo(row.int("attempt")? as u32),
        placements: row.json("placements")?,
        cancel_requested: row.flag("cancel_requested")?,
        submitted_at: row.timestamp("submitted_at")?,
        started_at: row.optional_timestamp("started_at")?,
        finished_at: row.optional_timestamp("finished_at")?,
        group: row.optional_int("group_id")?.map(|g| GroupId(g as u64)),
        group_index: row.optional_int("group_index")?.map(|i| i as u32),
        submission: row.json("submission")?,
    })
}

pub(crate) fn event_from_row(row: &impl Columns) -> Result<TaskEvent> {
    Ok(TaskEvent {
        at: row.timestamp("at")?,
        attempt: AttemptNo(row.int("attempt")? as u32),
        state: row.parsed::<TaskState>("state")?,
        reason: row.optional_text("reason")?,
    })
}

pub(crate) fn node_from_row(row: &impl Columns) -> Result<NodeRecord> {
    Ok(NodeRecord {
        id: NodeId(row.int("id")? as u64),
        name: row.text("name")?,
        capacity: row.json("capacity")?,
        gpu_type: row.optional_text("gpu_type")?,
        labels: row.json("labels")?,
        address: row.text("address")?,
        registered_at: row.timestamp("registered_at")?,
        drained: row.flag("drained")?,
        // Rows from before enrolment was recorded enrolled with what they offer.
        enrolled_capacity: match row.optional_text("enrolled_capacity")? {
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| corrupt(format!("enrolled_capacity: {e}")))?,
            None => row.json("capacity")?,
        },
        pending: row.flag("pending")?,
        last_seen: row
            .optional_int("last_seen_at")?
            .map(|ms| Timestamp(ms as u64)),
    })
}

pub(crate) fn lease_from_row(row: &impl Columns) -> Result<crate::LeaderLease> {
    Ok(crate::LeaderLease {
        holder: row.text("holder")?,
        leader_url: row.text("leader_url")?,
        epoch: row.int("epoch")? as u64,
        expires_at: row.timestamp("expires_at")?,
    })
}

// ------------------------------------------------------------ per-task records

pub(crate) fn output_from_row(task: TaskId, row: &impl Columns) -> Result<OutputRecord> {
    Ok(OutputRecord {
        task,
        attempt: AttemptNo(row.int("attempt")? as u32),
        rank: row.int("node_rank")? as u32,
        path: row.text("path")?,
        size: row.int("size")? as u64,
    })
}

pub(crate) fn resize_from_row(task: TaskId, row: &impl Columns) -> Result<crate::ResizeRecord> {
    Ok(crate::ResizeRecord {
        task,
        attempt: AttemptNo(row.int("attempt")? as u32),
        at: row.timestamp("at")?,
        cpu_millis: row.int("cpu_millis")? as u64,
        memory_bytes: row.int("memory_bytes")? as u64,
        reason: row.text("reason")?,
    })
}

pub(crate) fn signal_from_row(task: TaskId, row: &impl Columns) -> Result<crate::SignalRecord> {
    Ok(crate::SignalRecord {
        task,
        attempt: AttemptNo(row.int("attempt")? as u32),
        at: row.timestamp("at")?,
        point: row.json("point")?,
    })
}

pub(crate) fn usage_from_row(task: TaskId, row: &impl Columns) -> Result<UsagePeak> {
    Ok(UsagePeak {
        task,
        attempt: AttemptNo(row.int("attempt")? as u32),
        node_rank: row.int("node_rank")? as u32,
        node: row.text("node")?,
        cpu_millis: row.int("cpu_millis")? as u64,
        memory_bytes: row.int("memory_bytes")? as u64,
        gpu_utilization_percent: row.int("gpu_utilization_percent")? as u32,
        gpu_memory_bytes: row.int("gpu_memory_bytes")? as u64,
        at: row.timestamp("at")?,
        gpu_busy_ms: row.int("gpu_busy_ms")? as u64,
    })
}

pub(crate) fn metric_from_row(task: TaskId, row: &impl Columns) -> Result<crate::MetricPoint> {
    Ok(crate::MetricPoint {
        task,
        attempt: AttemptNo(row.int("attempt")? as u32),
        seq: row.int("seq")? as u32,
        step: row.int("step")? as u64,
        at: row.timestamp("at")?,
        values: row.json("metrics")?,
    })
}

// ------------------------------------------------------------ groups and pipelines

pub(crate) fn group_from_row(row: &impl Columns) -> Result<GroupRecord> {
    let kind = row.text("kind")?;
    Ok(GroupRecord {
        id: GroupId(row.int("id")? as u64),
        kind: GroupKind::parse(&kind).ok_or_else(|| corrupt(format!("group kind `{kind}`")))?,
        name: row.text("name")?,
        user: row.text("user_name")?,
        spec: row.json("spec")?,
        size: row.int("size")? as u32,
        created_at: row.timestamp("created_at")?,
    })
}

pub(crate) fn delivery_from_row(row: &impl Columns) -> Result<DeliveryRecord> {
    Ok(DeliveryRecord {
        id: row.int("id")? as u64,
        key: row.text("event_key")?,
        user: row.text("user_name")?,
        url: row.text("url")?,
        secret: row.text("secret_name")?,
        body: row.text("body")?,
        attempts: row.int("attempts")? as u32,
        next_at: row.timestamp("next_at")?,
        last_error: row.optional_text("last_error")?,
        delivered_at: row.optional_timestamp("delivered_at")?,
        gave_up: row.flag("gave_up")?,
    })
}

pub(crate) fn stage_from_row(row: &impl Columns) -> Result<StageRecord> {
    let source = match (row.optional_int("task_id")?, row.optional_int("group_id")?) {
        (Some(task), _) => StageSource::Task(TaskId(task as u64)),
        (None, Some(group)) => StageSource::Group(GroupId(group as u64)),
        (None, None) => return Err(corrupt("a pipeline stage with neither task nor group")),
    };
    Ok(StageRecord {
        pipeline: GroupId(row.int("pipeline_id")? as u64),
        position: row.int("position")? as u32,
        name: row.text("name")?,
        needs: row.json("needs")?,
        cache_key: row.text("cache_key")?,
        source,
        cached: row.flag("cached")?,
        user: row.text("user_name")?,
        pipeline_name: row.text("pipeline_name")?,
    })
}

// ------------------------------------------------------------ access records

pub(crate) fn user_from_row(row: &impl Columns) -> Result<UserRecord> {
    Ok(UserRecord {
        name: row.text("name")?,
        group: row.optional_text("group_name")?,
        role: row.parsed::<Role>("role")?,
        created_at: row.timestamp("created_at")?,
    })
}

pub(crate) fn token_from_row(row: &impl Columns) -> Result<TokenRecord> {
    let kind = row.text("kind")?;
    Ok(TokenRecord {
        id: row.int("id")? as u64,
        kind: TokenKind::parse(&kind)
            .ok_or_else(|| corrupt(format!("unknown token kind `{kind}`")))?,
        hash: row.text("hash")?,
        user: row.optional_text("user_name")?,
        node: row.optional_int("node_id")?.map(|v| NodeId(v as u64)),
        created_at: row.timestamp("created_at")?,
        expires_at: row.optional_timestamp("expires_at")?,
        revoked_at: row.optional_timestamp("revoked_at")?,
        label: row.text("label")?,
        join: (kind == TokenKind::AgentJoin.as_str())
            .then(|| -> Result<JoinScope> {
                Ok(JoinScope {
                    bound_node: row.optional_text("bound_node")?,
                    // Join tokens from before enrolment limits are single-use.
                    max_nodes: row.optional_int("enrol_limit")?.unwrap_or(1) as u32,
                })
            })
            .transpose()?,
        enrolled: row.int("enrolled")? as u32,
    })
}

pub(crate) fn audit_from_row(row: &impl Columns) -> Result<AuditEntry> {
    Ok(AuditEntry {
        id: row.int("id")? as u64,
        at: row.timestamp("at")?,
        actor: row.text("actor")?,
        action: row.text("action")?,
        target: row.text("target")?,
        outcome: row.text("outcome")?,
        detail: row.text("detail")?,
    })
}

pub(crate) fn secret_from_row(row: &impl Columns) -> Result<SecretRecord> {
    Ok(SecretRecord {
        user: row.text("user_name")?,
        name: row.text("name")?,
        nonce: row.bytes("nonce")?,
        ciphertext: row.bytes("ciphertext")?,
        updated_at: row.timestamp("updated_at")?,
    })
}

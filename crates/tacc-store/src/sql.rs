//! SQL text both SQL stores run: the column lists the decoders in [`rows`](crate::rows)
//! read, the `WHERE` clauses built from filters, and the error mapping they share. It is
//! written with SQLite's `?` placeholders; the PostgreSQL store numbers them
//! (`postgres::numbered`) before running a statement.

use tacc_core::Timestamp;

use crate::{StoreError, TaskFilter};

pub(crate) mod access;
pub(crate) mod changes;
pub(crate) mod groups;
pub(crate) mod idempotency;
pub(crate) mod lease;
pub(crate) mod pipelines;
pub(crate) mod restart_facts;
pub(crate) mod task_uids;
pub(crate) mod tasks;

pub(crate) const TASK_COLUMNS: &str = "id, name, user_name, spec, snapshot, source, state, reason, exit_code, attempt, \
     placements, cancel_requested, submitted_at, started_at, finished_at, group_id, group_index, submission";

pub(crate) const NODE_COLUMNS: &str = "id, name, capacity, gpu_type, labels, address, registered_at, drained, enrolled_capacity, pending, last_seen_at";

pub(crate) const GROUP_COLUMNS: &str = "id, kind, name, user_name, spec, size, created_at";

pub(crate) const DELIVERY_COLUMNS: &str = "id, event_key, user_name, url, secret_name, body, attempts, \
     next_at, last_error, delivered_at, gave_up";

pub(crate) const STAGE_COLUMNS: &str = "pipeline_id, position, name, needs, cache_key, task_id, group_id, \
     cached, user_name, pipeline_name";

pub(crate) const USER_COLUMNS: &str = "name, group_name, role, created_at";

pub(crate) const TOKEN_COLUMNS: &str = "id, kind, hash, user_name, node_id, created_at, expires_at, revoked_at, label, bound_node, \
     enrol_limit, enrolled";

pub(crate) const AUDIT_COLUMNS: &str = "id, at, actor, action, target, outcome, detail";

pub(crate) const SECRET_COLUMNS: &str = "user_name, name, nonce, ciphertext, updated_at";

/// Chunk hashes per statement: well under the limit on bound parameters of SQLite (32766)
/// and PostgreSQL (65535).
pub(crate) const HASHES_PER_QUERY: usize = 500;

/// The tasks [`Store::tasks_active_between`](crate::Store::tasks_active_between) returns;
/// binds `until`, `since`, then the user twice. Events since `since` are found through
/// `task_events_by_at`.
pub(crate) const ACTIVE_BETWEEN: &str = "SELECT id FROM tasks \
     WHERE EXISTS (SELECT 1 FROM task_events e WHERE e.task_id = tasks.id \
                   AND e.state = 'starting' AND e.at < ?) \
       AND (state IN ('starting', 'running') \
            OR id IN (SELECT task_id FROM task_events WHERE at >= ?)) \
       AND (? IS NULL OR user_name = ?)";

/// The `WHERE` clause of a task filter; binds states, then the user.
pub(crate) fn filter_sql(filter: &TaskFilter) -> String {
    let mut sql = String::from(" WHERE 1 = 1");
    if !filter.states.is_empty() {
        let marks = vec!["?"; filter.states.len()].join(", ");
        sql.push_str(&format!(" AND state IN ({marks})"));
    }
    if filter.user.is_some() {
        sql.push_str(" AND user_name = ?");
    }
    if filter.group.is_some() {
        sql.push_str(" AND group_id = ?");
    }
    if filter.ungrouped {
        sql.push_str(" AND group_id IS NULL");
    }
    sql
}

/// A timestamp as the stores keep it: milliseconds since the epoch in a signed 64-bit
/// column.
pub(crate) fn millis(value: Timestamp) -> i64 {
    value.as_millis() as i64
}

/// `AlreadyExists` for a unique-key violation, the database error otherwise.
pub(crate) fn refuse_duplicate(error: sqlx::Error, what: &'static str, name: &str) -> StoreError {
    match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => StoreError::AlreadyExists {
            what,
            name: name.to_string(),
        },
        other => other.into(),
    }
}

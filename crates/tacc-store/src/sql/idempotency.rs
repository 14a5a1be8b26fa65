//! Idempotency keys in either SQL store: one row per user and key, written inside the
//! transaction of the work it acknowledges (begun, and on PostgreSQL fenced, by the
//! store); expired rows are removed when a new key is written.

use tacc_core::Timestamp;

use super::millis;
use crate::idempotency::key_taken;
use crate::rows::Columns;
use crate::statement::{Run, Statement, Transact};
use crate::{IdempotencyKey, KEY_LIFETIME_MS, KeptReply, Result, StoredReply};

pub(crate) async fn kept_reply(
    pool: &impl Run,
    user: &str,
    key: &str,
    now: Timestamp,
) -> Result<Option<KeptReply>> {
    let select = Statement::new(
        "SELECT route, request_hash, created_at, status, body FROM idempotency_keys \
         WHERE user_name = ? AND key = ?",
    )
    .bind(user)
    .bind(key);
    let Some(row) = pool.fetch_optional(select).await? else {
        return Ok(None);
    };
    let kept = KeptReply {
        key: IdempotencyKey {
            user: user.to_string(),
            key: key.to_string(),
            route: row.text("route")?,
            request_hash: row.text("request_hash")?,
            created_at: row.timestamp("created_at")?,
        },
        reply: StoredReply {
            status: row.int32("status")? as u16,
            body: row.json("body")?,
        },
    };
    Ok((!kept.key.expired(now)).then_some(kept))
}

/// Write the key and its reply; `AlreadyExists` when the user's key is kept and live (the
/// caller's transaction must then be dropped).
pub(crate) async fn insert_key(tx: &mut impl Transact, kept: &KeptReply) -> Result<()> {
    let expired_before = millis(kept.key.created_at) - KEY_LIFETIME_MS as i64;
    tx.execute(
        Statement::new("DELETE FROM idempotency_keys WHERE created_at <= ?").bind(expired_before),
    )
    .await?;
    // `status` is a 32-bit INTEGER on PostgreSQL; SQLite stores the same value.
    let insert = Statement::new(
        "INSERT INTO idempotency_keys \
         (user_name, key, route, request_hash, created_at, status, body) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&kept.key.user)
    .bind(&kept.key.key)
    .bind(&kept.key.route)
    .bind(&kept.key.request_hash)
    .bind(millis(kept.key.created_at))
    .bind(i32::from(kept.reply.status))
    .bind(kept.reply.body.to_string());
    match tx.execute(insert).await {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(key_taken(&kept.key)),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

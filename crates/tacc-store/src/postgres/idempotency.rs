//! Idempotency keys in PostgreSQL: one row per user and key, written inside the transaction of
//! the work it acknowledges; expired rows are removed when a new key is written.

use sqlx::{PgPool, Postgres, Transaction};
use tacc_core::Timestamp;

use super::numbered;
use crate::idempotency::key_taken;
use crate::rows::Columns;
use crate::sql::millis;
use crate::{IdempotencyKey, KEY_LIFETIME_MS, KeptReply, Result, StoredReply};

pub(super) async fn kept_reply(
    pool: &PgPool,
    user: &str,
    key: &str,
    now: Timestamp,
) -> Result<Option<KeptReply>> {
    let row = sqlx::query(&numbered(
        "SELECT route, request_hash, created_at, status, body FROM idempotency_keys \
         WHERE user_name = ? AND key = ?",
    ))
    .bind(user)
    .bind(key)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
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
            // A 32-bit INTEGER on PostgreSQL; SQLite's integer reads into it too.
            status: row.int32("status")? as u16,
            body: row.json("body")?,
        },
    };
    Ok((!kept.key.expired(now)).then_some(kept))
}

/// Write the key and its reply in the caller's transaction; `AlreadyExists` when the
/// user's key is kept and live (the caller's transaction must then be dropped).
pub(super) async fn insert_key(tx: &mut Transaction<'_, Postgres>, kept: &KeptReply) -> Result<()> {
    let expired_before = millis(kept.key.created_at) - KEY_LIFETIME_MS as i64;
    sqlx::query(&numbered(
        "DELETE FROM idempotency_keys WHERE created_at <= ?",
    ))
    .bind(expired_before)
    .execute(&mut **tx)
    .await?;
    let inserted = sqlx::query(&numbered(
        "INSERT INTO idempotency_keys \
         (user_name, key, route, request_hash, created_at, status, body) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    ))
    .bind(&kept.key.user)
    .bind(&kept.key.key)
    .bind(&kept.key.route)
    .bind(&kept.key.request_hash)
    .bind(millis(kept.key.created_at))
    .bind(i32::from(kept.reply.status))
    .bind(kept.reply.body.to_string())
    .execute(&mut **tx)
    .await;
    match inserted {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(key_taken(&kept.key)),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

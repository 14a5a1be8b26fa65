//! The access records in SQLite: users, tokens, the audit trail, sealed secrets and
//! snapshot owners. Writes take the writer pool, reads the reader pool (see
//! [`SqliteStore`](super::SqliteStore)).

use sqlx::{Row, SqlitePool};
use tacc_core::{SnapshotId, Timestamp};

use crate::rows::{audit_from_row, secret_from_row, token_from_row, user_from_row};
use crate::sql::{
    AUDIT_COLUMNS, HASHES_PER_QUERY, SECRET_COLUMNS, TOKEN_COLUMNS, USER_COLUMNS, millis,
    refuse_duplicate,
};
use crate::{
    AuditEntry, NewAuditEntry, NewToken, Result, SecretRecord, SnapshotOwner, TokenRecord,
    UserRecord,
};

// ------------------------------------------------------------ users

pub(super) async fn create_user(writer: &SqlitePool, user: UserRecord) -> Result<()> {
    sqlx::query("INSERT INTO users (name, group_name, role, created_at) VALUES (?, ?, ?, ?)")
        .bind(&user.name)
        .bind(&user.group)
        .bind(user.role.as_str())
        .bind(millis(user.created_at))
        .execute(writer)
        .await
        .map_err(|e| refuse_duplicate(e, "user", &user.name))?;
    Ok(())
}

pub(super) async fn get_user(reader: &SqlitePool, name: &str) -> Result<Option<UserRecord>> {
    let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE name = ?"))
        .bind(name)
        .fetch_optional(reader)
        .await?;
    row.as_ref().map(user_from_row).transpose()
}

pub(super) async fn list_users(reader: &SqlitePool) -> Result<Vec<UserRecord>> {
    let rows = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users ORDER BY name"))
        .fetch_all(reader)
        .await?;
    rows.iter().map(user_from_row).collect()
}

// ------------------------------------------------------------ tokens

pub(super) async fn create_token(writer: &SqlitePool, token: NewToken) -> Result<TokenRecord> {
    let row = sqlx::query(&format!(
        "INSERT INTO tokens (kind, hash, user_name, node_id, created_at, expires_at, label) \
         VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(token.kind.as_str())
    .bind(&token.hash)
    .bind(&token.user)
    .bind(token.node.map(|n| n.0 as i64))
    .bind(millis(token.created_at))
    .bind(token.expires_at.map(millis))
    .bind(&token.label)
    .fetch_one(writer)
    .await
    .map_err(|e| refuse_duplicate(e, "token", &token.hash))?;
    token_from_row(&row)
}

pub(super) async fn token_by_hash(reader: &SqlitePool, hash: &str) -> Result<Option<TokenRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?"
    ))
    .bind(hash)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(super) async fn get_token(reader: &SqlitePool, id: u64) -> Result<Option<TokenRecord>> {
    let row = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?"))
        .bind(id as i64)
        .fetch_optional(reader)
        .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(super) async fn list_tokens(
    reader: &SqlitePool,
    user: Option<&str>,
) -> Result<Vec<TokenRecord>> {
    let rows = match user {
        Some(user) => {
            sqlx::query(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE user_name = ? ORDER BY id"
            ))
            .bind(user)
            .fetch_all(reader)
            .await?
        }
        None => {
            sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id"))
                .fetch_all(reader)
                .await?
        }
    };
    rows.iter().map(token_from_row).collect()
}

pub(super) async fn revoke_token(writer: &SqlitePool, id: u64, at: Timestamp) -> Result<bool> {
    let result =
        sqlx::query("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
            .bind(millis(at))
            .bind(id as i64)
            .execute(writer)
            .await?;
    Ok(result.rows_affected() == 1)
}

// ------------------------------------------------------------ audit

pub(super) async fn append_audit(writer: &SqlitePool, entry: NewAuditEntry) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit (at, actor, action, target, outcome, detail) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(millis(entry.at))
    .bind(&entry.actor)
    .bind(&entry.action)
    .bind(&entry.target)
    .bind(&entry.outcome)
    .bind(&entry.detail)
    .execute(writer)
    .await?;
    Ok(())
}

pub(super) async fn list_audit(
    reader: &SqlitePool,
    since: Option<Timestamp>,
    limit: u32,
) -> Result<Vec<AuditEntry>> {
    // The newest `limit` matching entries, turned back into the order they were appended.
    let rows = sqlx::query(&format!(
        "SELECT {AUDIT_COLUMNS} FROM \
         (SELECT {AUDIT_COLUMNS} FROM audit WHERE at >= ? ORDER BY id DESC LIMIT ?) \
         ORDER BY id"
    ))
    .bind(since.map_or(0, millis))
    .bind(i64::from(limit))
    .fetch_all(reader)
    .await?;
    rows.iter().map(audit_from_row).collect()
}

// ------------------------------------------------------------ secrets

pub(super) async fn put_secret(writer: &SqlitePool, secret: SecretRecord) -> Result<()> {
    sqlx::query(
        "INSERT INTO secrets (user_name, name, nonce, ciphertext, updated_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (user_name, name) DO UPDATE SET nonce = excluded.nonce, \
         ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
    )
    .bind(&secret.user)
    .bind(&secret.name)
    .bind(&secret.nonce)
    .bind(&secret.ciphertext)
    .bind(millis(secret.updated_at))
    .execute(writer)
    .await?;
    Ok(())
}

pub(super) async fn get_secret(
    reader: &SqlitePool,
    user: &str,
    name: &str,
) -> Result<Option<SecretRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? AND name = ?"
    ))
    .bind(user)
    .bind(name)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(secret_from_row).transpose()
}

pub(super) async fn list_secrets(reader: &SqlitePool, user: &str) -> Result<Vec<SecretRecord>> {
    let rows = sqlx::query(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? ORDER BY name"
    ))
    .bind(user)
    .fetch_all(reader)
    .await?;
    rows.iter().map(secret_from_row).collect()
}

pub(super) async fn delete_secret(writer: &SqlitePool, user: &str, name: &str) -> Result<bool> {
    let result = sqlx::query("DELETE FROM secrets WHERE user_name = ? AND name = ?")
        .bind(user)
        .bind(name)
        .execute(writer)
        .await?;
    Ok(result.rows_affected() == 1)
}

// ------------------------------------------------------------ snapshot ownership

pub(super) async fn add_snapshot_owner(writer: &SqlitePool, owner: SnapshotOwner) -> Result<()> {
    sqlx::query(
        "INSERT INTO snapshot_owners (snapshot, user_name) VALUES (?, ?) \
         ON CONFLICT (snapshot, user_name) DO NOTHING",
    )
    .bind(owner.snapshot.as_str())
    .bind(&owner.user)
    .execute(writer)
    .await?;
    Ok(())
}

pub(super) async fn is_snapshot_owner(
    reader: &SqlitePool,
    snapshot: &SnapshotId,
    user: &str,
) -> Result<bool> {
    let row = sqlx::query("SELECT 1 FROM snapshot_owners WHERE snapshot = ? AND user_name = ?")
        .bind(snapshot.as_str())
        .bind(user)
        .fetch_optional(reader)
        .await?;
    Ok(row.is_some())
}

// ------------------------------------------------------------ chunk possession

pub(super) async fn add_chunk_owners(
    writer: &SqlitePool,
    user: &str,
    hashes: &[String],
) -> Result<()> {
    let mut tx = writer.begin().await?;
    for hash in hashes {
        sqlx::query(
            "INSERT INTO chunk_owners (user_name, hash) VALUES (?, ?) \
             ON CONFLICT (user_name, hash) DO NOTHING",
        )
        .bind(user)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn owned_chunks(
    reader: &SqlitePool,
    user: &str,
    hashes: &[String],
) -> Result<std::collections::BTreeSet<String>> {
    let mut owned = std::collections::BTreeSet::new();
    for batch in hashes.chunks(HASHES_PER_QUERY) {
        let marks = vec!["?"; batch.len()].join(", ");
        let sql =
            format!("SELECT hash FROM chunk_owners WHERE user_name = ? AND hash IN ({marks})");
        let mut query = sqlx::query(&sql).bind(user);
        for hash in batch {
            query = query.bind(hash);
        }
        for row in query.fetch_all(reader).await? {
            owned.insert(row.try_get::<String, _>("hash")?);
        }
    }
    Ok(owned)
}

//! The access records in PostgreSQL: users, tokens, the audit trail, sealed secrets and
//! snapshot owners. Writes take the writer pool, reads the reader pool (see
//! [`PostgresStore`](super::PostgresStore)).

use std::str::FromStr;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use tacc_core::{NodeId, Role, SnapshotId, Timestamp};

use super::numbered;
use super::{corrupt, millis};
use crate::{
    AuditEntry, NewAuditEntry, NewToken, Result, SecretRecord, SnapshotOwner, StoreError,
    TokenKind, TokenRecord, UserRecord,
};

const USER_COLUMNS: &str = "name, group_name, role, created_at";
const TOKEN_COLUMNS: &str =
    "id, kind, hash, user_name, node_id, created_at, expires_at, revoked_at, label";
const AUDIT_COLUMNS: &str = "id, at, actor, action, target, outcome, detail";
const SECRET_COLUMNS: &str = "user_name, name, nonce, ciphertext, updated_at";

fn timestamp(row: &PgRow, column: &str) -> Result<Timestamp> {
    Ok(Timestamp(row.try_get::<i64, _>(column)? as u64))
}

fn optional_timestamp(row: &PgRow, column: &str) -> Result<Option<Timestamp>> {
    Ok(row
        .try_get::<Option<i64>, _>(column)?
        .map(|v| Timestamp(v as u64)))
}

/// `AlreadyExists` for a unique-key violation, the database error otherwise.
fn refuse_duplicate(error: sqlx::Error, what: &'static str, name: &str) -> StoreError {
    match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => StoreError::AlreadyExists {
            what,
            name: name.to_string(),
        },
        other => other.into(),
    }
}

fn user_from_row(row: &PgRow) -> Result<UserRecord> {
    let role: String = row.try_get("role")?;
    Ok(UserRecord {
        name: row.try_get("name")?,
        group: row.try_get("group_name")?,
        role: Role::from_str(&role).map_err(corrupt)?,
        created_at: timestamp(row, "created_at")?,
    })
}

fn token_from_row(row: &PgRow) -> Result<TokenRecord> {
    let kind: String = row.try_get("kind")?;
    Ok(TokenRecord {
        id: row.try_get::<i64, _>("id")? as u64,
        kind: TokenKind::parse(&kind)
            .ok_or_else(|| corrupt(format!("unknown token kind `{kind}`")))?,
        hash: row.try_get("hash")?,
        user: row.try_get("user_name")?,
        node: row
            .try_get::<Option<i64>, _>("node_id")?
            .map(|v| NodeId(v as u64)),
        created_at: timestamp(row, "created_at")?,
        expires_at: optional_timestamp(row, "expires_at")?,
        revoked_at: optional_timestamp(row, "revoked_at")?,
        label: row.try_get("label")?,
    })
}

fn audit_from_row(row: &PgRow) -> Result<AuditEntry> {
    Ok(AuditEntry {
        id: row.try_get::<i64, _>("id")? as u64,
        at: timestamp(row, "at")?,
        actor: row.try_get("actor")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        outcome: row.try_get("outcome")?,
        detail: row.try_get("detail")?,
    })
}

fn secret_from_row(row: &PgRow) -> Result<SecretRecord> {
    Ok(SecretRecord {
        user: row.try_get("user_name")?,
        name: row.try_get("name")?,
        nonce: row.try_get("nonce")?,
        ciphertext: row.try_get("ciphertext")?,
        updated_at: timestamp(row, "updated_at")?,
    })
}

// ------------------------------------------------------------ users

pub(super) async fn create_user(writer: &PgPool, user: UserRecord) -> Result<()> {
    sqlx::query(&numbered(
        "INSERT INTO users (name, group_name, role, created_at) VALUES (?, ?, ?, ?)",
    ))
    .bind(&user.name)
    .bind(&user.group)
    .bind(user.role.as_str())
    .bind(millis(user.created_at))
    .execute(writer)
    .await
    .map_err(|e| refuse_duplicate(e, "user", &user.name))?;
    Ok(())
}

pub(super) async fn get_user(reader: &PgPool, name: &str) -> Result<Option<UserRecord>> {
    let row = sqlx::query(&numbered(&format!(
        "SELECT {USER_COLUMNS} FROM users WHERE name = ?"
    )))
    .bind(name)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(user_from_row).transpose()
}

pub(super) async fn list_users(reader: &PgPool) -> Result<Vec<UserRecord>> {
    let rows = sqlx::query(&numbered(&format!(
        "SELECT {USER_COLUMNS} FROM users ORDER BY name"
    )))
    .fetch_all(reader)
    .await?;
    rows.iter().map(user_from_row).collect()
}

// ------------------------------------------------------------ tokens

pub(super) async fn create_token(writer: &PgPool, token: NewToken) -> Result<TokenRecord> {
    let row = sqlx::query(&numbered(&format!(
        "INSERT INTO tokens (kind, hash, user_name, node_id, created_at, expires_at, label) \
         VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING {TOKEN_COLUMNS}"
    )))
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

pub(super) async fn token_by_hash(reader: &PgPool, hash: &str) -> Result<Option<TokenRecord>> {
    let row = sqlx::query(&numbered(&format!(
        "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?"
    )))
    .bind(hash)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(super) async fn get_token(reader: &PgPool, id: u64) -> Result<Option<TokenRecord>> {
    let row = sqlx::query(&numbered(&format!(
        "SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?"
    )))
    .bind(id as i64)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(super) async fn list_tokens(reader: &PgPool, user: Option<&str>) -> Result<Vec<TokenRecord>> {
    let rows = match user {
        Some(user) => {
            sqlx::query(&numbered(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE user_name = ? ORDER BY id"
            )))
            .bind(user)
            .fetch_all(reader)
            .await?
        }
        None => {
            sqlx::query(&numbered(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id"
            )))
            .fetch_all(reader)
            .await?
        }
    };
    rows.iter().map(token_from_row).collect()
}

pub(super) async fn revoke_token(writer: &PgPool, id: u64, at: Timestamp) -> Result<bool> {
    let result = sqlx::query(&numbered(
        "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
    ))
    .bind(millis(at))
    .bind(id as i64)
    .execute(writer)
    .await?;
    Ok(result.rows_affected() == 1)
}

// ------------------------------------------------------------ audit

pub(super) async fn append_audit(writer: &PgPool, entry: NewAuditEntry) -> Result<()> {
    sqlx::query(&numbered(
        "INSERT INTO audit (at, actor, action, target, outcome, detail) VALUES (?, ?, ?, ?, ?, ?)",
    ))
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
    reader: &PgPool,
    since: Option<Timestamp>,
    limit: u32,
) -> Result<Vec<AuditEntry>> {
    // The newest `limit` matching entries, turned back into the order they were appended.
    let rows = sqlx::query(&numbered(&format!(
        "SELECT {AUDIT_COLUMNS} FROM \
         (SELECT {AUDIT_COLUMNS} FROM audit WHERE at >= ? ORDER BY id DESC LIMIT ?) AS newest \
         ORDER BY id"
    )))
    .bind(since.map_or(0, millis))
    .bind(i64::from(limit))
    .fetch_all(reader)
    .await?;
    rows.iter().map(audit_from_row).collect()
}

// ------------------------------------------------------------ secrets

pub(super) async fn put_secret(writer: &PgPool, secret: SecretRecord) -> Result<()> {
    sqlx::query(&numbered(
        "INSERT INTO secrets (user_name, name, nonce, ciphertext, updated_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (user_name, name) DO UPDATE SET nonce = excluded.nonce, \
         ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
    ))
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
    reader: &PgPool,
    user: &str,
    name: &str,
) -> Result<Option<SecretRecord>> {
    let row = sqlx::query(&numbered(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? AND name = ?"
    )))
    .bind(user)
    .bind(name)
    .fetch_optional(reader)
    .await?;
    row.as_ref().map(secret_from_row).transpose()
}

pub(super) async fn list_secrets(reader: &PgPool, user: &str) -> Result<Vec<SecretRecord>> {
    let rows = sqlx::query(&numbered(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? ORDER BY name"
    )))
    .bind(user)
    .fetch_all(reader)
    .await?;
    rows.iter().map(secret_from_row).collect()
}

pub(super) async fn delete_secret(writer: &PgPool, user: &str, name: &str) -> Result<bool> {
    let result = sqlx::query(&numbered(
        "DELETE FROM secrets WHERE user_name = ? AND name = ?",
    ))
    .bind(user)
    .bind(name)
    .execute(writer)
    .await?;
    Ok(result.rows_affected() == 1)
}

// ------------------------------------------------------------ snapshot ownership

pub(super) async fn add_snapshot_owner(writer: &PgPool, owner: SnapshotOwner) -> Result<()> {
    sqlx::query(&numbered(
        "INSERT INTO snapshot_owners (snapshot, user_name) VALUES (?, ?) \
         ON CONFLICT (snapshot, user_name) DO NOTHING",
    ))
    .bind(owner.snapshot.as_str())
    .bind(&owner.user)
    .execute(writer)
    .await?;
    Ok(())
}

pub(super) async fn is_snapshot_owner(
    reader: &PgPool,
    snapshot: &SnapshotId,
    user: &str,
) -> Result<bool> {
    let row = sqlx::query(&numbered(
        "SELECT 1 FROM snapshot_owners WHERE snapshot = ? AND user_name = ?",
    ))
    .bind(snapshot.as_str())
    .bind(user)
    .fetch_optional(reader)
    .await?;
    Ok(row.is_some())
}

// ------------------------------------------------------------ chunk possession

/// Hashes per statement: well under PostgreSQL's limit on bound parameters.
const HASHES_PER_QUERY: usize = 500;

pub(super) async fn add_chunk_owners(writer: &PgPool, user: &str, hashes: &[String]) -> Result<()> {
    let mut tx = writer.begin().await?;
    for hash in hashes {
        sqlx::query(&numbered(
            "INSERT INTO chunk_owners (user_name, hash) VALUES (?, ?) \
             ON CONFLICT (user_name, hash) DO NOTHING",
        ))
        .bind(user)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn owned_chunks(
    reader: &PgPool,
    user: &str,
    hashes: &[String],
) -> Result<std::collections::BTreeSet<String>> {
    let mut owned = std::collections::BTreeSet::new();
    for batch in hashes.chunks(HASHES_PER_QUERY) {
        let marks = vec!["?"; batch.len()].join(", ");
        let sql =
            format!("SELECT hash FROM chunk_owners WHERE user_name = ? AND hash IN ({marks})");
        let sql = numbered(&sql);
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

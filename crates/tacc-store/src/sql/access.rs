//! The access records in either SQL store: users, tokens, the audit trail, sealed secrets,
//! snapshot owners and chunk uploaders. Each store passes its writer pool to writes and
//! its reader pool to reads; none of these writes touches task state, so none is fenced.

use std::collections::BTreeSet;

use tacc_core::{SnapshotId, Timestamp};

use super::{
    AUDIT_COLUMNS, HASHES_PER_QUERY, SECRET_COLUMNS, TOKEN_COLUMNS, USER_COLUMNS, millis,
    refuse_duplicate,
};
use crate::rows::{Columns, audit_from_row, secret_from_row, token_from_row, user_from_row};
use crate::statement::{Run, Statement, Transact};
use crate::{
    AuditEntry, Enrolment, NewAuditEntry, NewToken, Result, SecretRecord, SnapshotOwner, TokenKind,
    TokenRecord, UserRecord,
};

// ------------------------------------------------------------ users

pub(crate) async fn create_user(writer: &impl Run, user: UserRecord) -> Result<()> {
    let insert = Statement::new(
        "INSERT INTO users (name, group_name, role, created_at) VALUES (?, ?, ?, ?)",
    )
    .bind(&user.name)
    .bind(&user.group)
    .bind(user.role.as_str())
    .bind(millis(user.created_at));
    writer
        .execute(insert)
        .await
        .map_err(|e| refuse_duplicate(e, "user", &user.name))?;
    Ok(())
}

pub(crate) async fn get_user(reader: &impl Run, name: &str) -> Result<Option<UserRecord>> {
    let row = reader
        .fetch_optional(
            Statement::new(format!("SELECT {USER_COLUMNS} FROM users WHERE name = ?")).bind(name),
        )
        .await?;
    row.as_ref().map(user_from_row).transpose()
}

pub(crate) async fn list_users(reader: &impl Run) -> Result<Vec<UserRecord>> {
    let rows = reader
        .fetch_all(Statement::new(format!(
            "SELECT {USER_COLUMNS} FROM users ORDER BY name"
        )))
        .await?;
    rows.iter().map(user_from_row).collect()
}

// ------------------------------------------------------------ tokens

pub(crate) async fn create_token(writer: &impl Run, token: NewToken) -> Result<TokenRecord> {
    let insert = Statement::new(format!(
        "INSERT INTO tokens (kind, hash, user_name, node_id, created_at, expires_at, label, \
         bound_node, enrol_limit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(token.kind.as_str())
    .bind(&token.hash)
    .bind(&token.user)
    .bind(token.node.map(|n| n.0 as i64))
    .bind(millis(token.created_at))
    .bind(token.expires_at.map(millis))
    .bind(&token.label)
    .bind(token.join.as_ref().and_then(|j| j.bound_node.clone()))
    .bind(token.join.as_ref().map(|j| i64::from(j.max_nodes)));
    let row = writer
        .fetch_one(insert)
        .await
        .map_err(|e| refuse_duplicate(e, "token", &token.hash))?;
    token_from_row(&row)
}

pub(crate) async fn token_by_hash(reader: &impl Run, hash: &str) -> Result<Option<TokenRecord>> {
    let row = reader
        .fetch_optional(
            Statement::new(format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?")).bind(hash),
        )
        .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(crate) async fn get_token(reader: &impl Run, id: u64) -> Result<Option<TokenRecord>> {
    let row = reader
        .fetch_optional(
            Statement::new(format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?"))
                .bind(id as i64),
        )
        .await?;
    row.as_ref().map(token_from_row).transpose()
}

pub(crate) async fn list_tokens(reader: &impl Run, user: Option<&str>) -> Result<Vec<TokenRecord>> {
    let select = match user {
        Some(user) => Statement::new(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE user_name = ? ORDER BY id"
        ))
        .bind(user),
        None => Statement::new(format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id")),
    };
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(token_from_row).collect()
}

pub(crate) async fn revoke_token(writer: &impl Run, id: u64, at: Timestamp) -> Result<bool> {
    let revoked = writer
        .execute(
            Statement::new("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
                .bind(millis(at))
                .bind(id as i64),
        )
        .await?;
    Ok(revoked == 1)
}

/// [`Store::enrol_node`](crate::Store::enrol_node) inside the store's open transaction.
/// The use is counted by one conditional update of the token's row, which both stores
/// apply atomically (SQLite's single writer; PostgreSQL re-checks the condition on the
/// locked row), so two agents racing with one single-use token cannot both enrol.
pub(crate) async fn enrol_node(
    tx: &mut impl Transact,
    token: u64,
    node_name: &str,
    at: Timestamp,
) -> Result<Enrolment> {
    let counted = tx
        .execute(
            Statement::new(
                "UPDATE tokens SET enrolled = enrolled + 1 WHERE id = ? AND kind = ? \
                 AND enrolled < COALESCE(enrol_limit, 1) \
                 AND (bound_node IS NULL OR bound_node = ?) \
                 AND NOT EXISTS (SELECT 1 FROM enrolments WHERE token_id = ? AND node_name = ?)",
            )
            .bind(token as i64)
            .bind(TokenKind::AgentJoin.as_str())
            .bind(node_name)
            .bind(token as i64)
            .bind(node_name),
        )
        .await?;
    if counted == 1 {
        tx.execute(
            Statement::new("INSERT INTO enrolments (token_id, node_name, at) VALUES (?, ?, ?)")
                .bind(token as i64)
                .bind(node_name)
                .bind(millis(at)),
        )
        .await?;
        return Ok(Enrolment::Admitted);
    }
    // Refused: say why.
    let Some(row) = tx
        .fetch_optional(
            Statement::new(format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ? AND kind = ?"
            ))
            .bind(token as i64)
            .bind(TokenKind::AgentJoin.as_str()),
        )
        .await?
    else {
        return Ok(Enrolment::NotJoinToken);
    };
    let record = token_from_row(&row)?;
    let scope = record.join.unwrap_or_else(crate::JoinScope::single_use);
    if let Some(bound) = scope.bound_node
        && bound != node_name
    {
        return Ok(Enrolment::BoundToOther { bound });
    }
    let rows = tx
        .fetch_all(
            Statement::new(
                "SELECT node_name FROM enrolments WHERE token_id = ? ORDER BY at, node_name",
            )
            .bind(token as i64),
        )
        .await?;
    let enrolled = rows
        .iter()
        .map(|row| row.text("node_name"))
        .collect::<Result<Vec<_>>>()?;
    Ok(Enrolment::UsedUp {
        max_nodes: scope.max_nodes,
        enrolled,
    })
}

// ------------------------------------------------------------ audit

pub(crate) async fn append_audit(writer: &impl Run, entry: NewAuditEntry) -> Result<()> {
    let insert = Statement::new(
        "INSERT INTO audit (at, actor, action, target, outcome, detail) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(millis(entry.at))
    .bind(&entry.actor)
    .bind(&entry.action)
    .bind(&entry.target)
    .bind(&entry.outcome)
    .bind(&entry.detail);
    writer.execute(insert).await?;
    Ok(())
}

pub(crate) async fn prune_audit(writer: &impl Run, before: Timestamp) -> Result<u64> {
    let deleted = writer
        .execute(Statement::new("DELETE FROM audit WHERE at < ?").bind(millis(before)))
        .await?;
    Ok(deleted)
}

pub(crate) async fn list_audit(
    reader: &impl Run,
    since: Option<Timestamp>,
    limit: u32,
) -> Result<Vec<AuditEntry>> {
    // The newest `limit` matching entries, turned back into the order they were appended.
    // PostgreSQL wants the subquery named; SQLite accepts the name.
    let select = Statement::new(format!(
        "SELECT {AUDIT_COLUMNS} FROM \
         (SELECT {AUDIT_COLUMNS} FROM audit WHERE at >= ? ORDER BY id DESC LIMIT ?) AS newest \
         ORDER BY id"
    ))
    .bind(since.map_or(0, millis))
    .bind(i64::from(limit));
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(audit_from_row).collect()
}

// ------------------------------------------------------------ secrets

pub(crate) async fn put_secret(writer: &impl Run, secret: SecretRecord) -> Result<()> {
    let upsert = Statement::new(
        "INSERT INTO secrets (user_name, name, nonce, ciphertext, updated_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (user_name, name) DO UPDATE SET nonce = excluded.nonce, \
         ciphertext = excluded.ciphertext, updated_at = excluded.updated_at",
    )
    .bind(&secret.user)
    .bind(&secret.name)
    .bind(&secret.nonce)
    .bind(&secret.ciphertext)
    .bind(millis(secret.updated_at));
    writer.execute(upsert).await?;
    Ok(())
}

pub(crate) async fn get_secret(
    reader: &impl Run,
    user: &str,
    name: &str,
) -> Result<Option<SecretRecord>> {
    let select = Statement::new(format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? AND name = ?"
    ))
    .bind(user)
    .bind(name);
    let row = reader.fetch_optional(select).await?;
    row.as_ref().map(secret_from_row).transpose()
}

pub(crate) async fn list_secrets(reader: &impl Run, user: &str) -> Result<Vec<SecretRecord>> {
    let select = Statement::new(format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE user_name = ? ORDER BY name"
    ))
    .bind(user);
    let rows = reader.fetch_all(select).await?;
    rows.iter().map(secret_from_row).collect()
}

pub(crate) async fn delete_secret(writer: &impl Run, user: &str, name: &str) -> Result<bool> {
    let deleted = writer
        .execute(
            Statement::new("DELETE FROM secrets WHERE user_name = ? AND name = ?")
                .bind(user)
                .bind(name),
        )
        .await?;
    Ok(deleted == 1)
}

// ------------------------------------------------------------ snapshot ownership

pub(crate) async fn add_snapshot_owner(writer: &impl Run, owner: SnapshotOwner) -> Result<()> {
    let insert = Statement::new(
        "INSERT INTO snapshot_owners (snapshot, user_name) VALUES (?, ?) \
         ON CONFLICT (snapshot, user_name) DO NOTHING",
    )
    .bind(owner.snapshot.as_str())
    .bind(&owner.user);
    writer.execute(insert).await?;
    Ok(())
}

pub(crate) async fn is_snapshot_owner(
    reader: &impl Run,
    snapshot: &SnapshotId,
    user: &str,
) -> Result<bool> {
    let select =
        Statement::new("SELECT 1 FROM snapshot_owners WHERE snapshot = ? AND user_name = ?")
            .bind(snapshot.as_str())
            .bind(user);
    Ok(reader.fetch_optional(select).await?.is_some())
}

// ------------------------------------------------------------ chunk possession

pub(crate) async fn add_chunk_owners(
    writer: &impl Run,
    user: &str,
    hashes: &[String],
) -> Result<()> {
    let inserts = hashes
        .iter()
        .map(|hash| {
            Statement::new(
                "INSERT INTO chunk_owners (user_name, hash) VALUES (?, ?) \
                 ON CONFLICT (user_name, hash) DO NOTHING",
            )
            .bind(user)
            .bind(hash)
        })
        .collect();
    writer.execute_all(inserts).await?;
    Ok(())
}

pub(crate) async fn owned_chunks(
    reader: &impl Run,
    user: &str,
    hashes: &[String],
) -> Result<BTreeSet<String>> {
    let mut owned = BTreeSet::new();
    for batch in hashes.chunks(HASHES_PER_QUERY) {
        let marks = vec!["?"; batch.len()].join(", ");
        let select = batch.iter().fold(
            Statement::new(format!(
                "SELECT hash FROM chunk_owners WHERE user_name = ? AND hash IN ({marks})"
            ))
            .bind(user),
            Statement::bind,
        );
        for row in reader.fetch_all(select).await? {
            owned.insert(row.text("hash")?);
        }
    }
    Ok(owned)
}

//! Users and their tokens: creating users, issuing user tokens, agent join tokens and
//! node credentials, and the embedded cluster's own admin. Used by the admin API and by
//! `taccd admin …` against a data directory alike, so both follow the same rules.

use std::path::Path;

use tacc_core::{NodeId, Role, Timestamp};
use tacc_store::{JoinScope, NewToken, Store, StoreError, TokenKind, TokenRecord, UserRecord};

use crate::ServerError;
use crate::auth::tokens;

/// A token as issued: its record and the secret, to be shown once.
#[derive(Debug, Clone)]
pub struct Issued {
    pub record: TokenRecord,
    pub secret: String,
}

impl Issued {
    pub fn view(&self) -> tacc_proto::TokenIssued {
        tacc_proto::TokenIssued {
            id: self.record.id,
            token: self.secret.clone(),
            expires_at: self.record.expires_at,
        }
    }
}

/// A user name: 1–32 of `a-z 0-9 _ . -`, starting with a letter or `_` (what Unix
/// accounts allow, so an operator can map one to the other).
pub fn check_user_name(name: &str) -> Result<(), ServerError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c));
    if first_ok && rest_ok && name.len() <= 32 {
        Ok(())
    } else {
        Err(ServerError::BadRequest(format!(
            "`{name}` is not a valid user or group name: use 1-32 lower-case letters, digits, \
             `_`, `.` or `-`, starting with a letter"
        )))
    }
}

fn expiry(now: Timestamp, ttl_secs: Option<u64>) -> Option<Timestamp> {
    ttl_secs.map(|secs| Timestamp(now.0.saturating_add(secs.saturating_mul(1000))))
}

async fn issue(store: &dyn Store, token: NewToken) -> Result<Issued, ServerError> {
    let fresh = tokens::generate();
    let record = store
        .create_token(NewToken {
            hash: fresh.hash,
            ..token
        })
        .await?;
    Ok(Issued {
        record,
        secret: fresh.secret,
    })
}

/// Create a user and their first token.
pub async fn create_user(
    store: &dyn Store,
    name: &str,
    group: Option<&str>,
    role: Role,
    ttl_secs: Option<u64>,
    now: Timestamp,
) -> Result<(UserRecord, Issued), ServerError> {
    check_user_name(name)?;
    if let Some(group) = group {
        check_user_name(group)?;
    }
    let user = UserRecord {
        name: name.to_string(),
        group: group.map(str::to_string),
        role,
        created_at: now,
    };
    store.create_user(user.clone()).await.map_err(|e| match e {
        StoreError::AlreadyExists { .. } => ServerError::Conflict(format!(
            "user `{name}` already exists; issue them another token instead \
             (`taccd admin token create {name}`)"
        )),
        other => other.into(),
    })?;
    let token = issue_user_token(store, name, "first token", ttl_secs, now).await?;
    Ok((user, token))
}

/// A new API token for an existing user.
pub async fn issue_user_token(
    store: &dyn Store,
    user: &str,
    label: &str,
    ttl_secs: Option<u64>,
    now: Timestamp,
) -> Result<Issued, ServerError> {
    if store.get_user(user).await?.is_none() {
        return Err(ServerError::NotFound(format!(
            "user `{user}` does not exist (create it with `taccd admin user add {user}`)"
        )));
    }
    issue(
        store,
        NewToken {
            kind: TokenKind::User,
            hash: String::new(),
            user: Some(user.to_string()),
            node: None,
            created_at: now,
            expires_at: expiry(now, ttl_secs),
            label: label.to_string(),
            join: None,
        },
    )
    .await
}

/// How long a join token can be used when its issuer names no lifetime: short, since a
/// leaked token enrols a node that receives users' tasks and secrets.
pub const JOIN_TOKEN_DEFAULT_TTL_SECS: u64 = 3600;

/// A token with which new agents enrol nodes: at most `scope.max_nodes` of them (one by
/// default), only the name `scope.bound_node` when set; valid for `ttl_secs` (default
/// [`JOIN_TOKEN_DEFAULT_TTL_SECS`]).
pub async fn issue_join_token(
    store: &dyn Store,
    issuer: &str,
    ttl_secs: Option<u64>,
    scope: JoinScope,
    now: Timestamp,
) -> Result<Issued, ServerError> {
    if scope.max_nodes == 0 {
        return Err(ServerError::BadRequest(
            "a join token must be able to enrol at least one node (nodes: 1 or more)".into(),
        ));
    }
    if let Some(name) = &scope.bound_node
        && (name.is_empty() || name.chars().any(char::is_control))
    {
        return Err(ServerError::BadRequest(format!(
            "`{name}` is not a node name: give the name the agent registers under (`taccd agent --name`, default its host name)"
        )));
    }
    if scope.bound_node.is_some() && scope.max_nodes > 1 {
        return Err(ServerError::BadRequest(
            "a join token bound to one node name enrols that one node: drop --nodes, or drop --node to enrol several".into(),
        ));
    }
    let label = match &scope.bound_node {
        Some(name) => format!("agent join token for node {name}"),
        None if scope.max_nodes == 1 => "agent join token (one node)".to_string(),
        None => format!("agent join token (up to {} nodes)", scope.max_nodes),
    };
    issue(
        store,
        NewToken {
            kind: TokenKind::AgentJoin,
            hash: String::new(),
            user: Some(issuer.to_string()),
            node: None,
            created_at: now,
            expires_at: expiry(now, Some(ttl_secs.unwrap_or(JOIN_TOKEN_DEFAULT_TTL_SECS))),
            label,
            join: Some(scope),
        },
    )
    .await
}

/// A scrape token for the server's metrics (`GET /metrics`), e.g. for a Prometheus
/// server's `authorization.credentials_file`.
pub async fn issue_metrics_token(
    store: &dyn Store,
    issuer: &str,
    label: &str,
    ttl_secs: Option<u64>,
    now: Timestamp,
) -> Result<Issued, ServerError> {
    issue(
        store,
        NewToken {
            kind: TokenKind::Metrics,
            hash: String::new(),
            user: Some(issuer.to_string()),
            node: None,
            created_at: now,
            expires_at: expiry(now, ttl_secs),
            label: label.to_string(),
            join: None,
        },
    )
    .await
}

/// The credential of one node, bound to it.
pub async fn issue_node_token(
    store: &dyn Store,
    node: NodeId,
    name: &str,
    now: Timestamp,
) -> Result<Issued, ServerError> {
    issue(
        store,
        NewToken {
            kind: TokenKind::Node,
            hash: String::new(),
            user: None,
            node: Some(node),
            created_at: now,
            expires_at: None,
            label: format!("node {name}"),
            join: None,
        },
    )
    .await
}

/// The embedded cluster's own admin: create user `name` (an admin) if missing and make
/// sure `token_file` holds a valid token of theirs (mode 0600), so `tcloud up` can put it
/// in the local profile.
pub async fn ensure_local_admin(
    store: &dyn Store,
    name: &str,
    token_file: &Path,
    now: Timestamp,
) -> Result<(), ServerError> {
    if let Ok(text) = std::fs::read_to_string(token_file) {
        let secret = text.trim();
        if tokens::well_formed(secret)
            && let Some(token) = store.token_by_hash(&tokens::hash(secret)).await?
            && token.is_valid_at(now)
            && token.user.as_deref() == Some(name)
        {
            return Ok(());
        }
    }
    let issued = match store.get_user(name).await? {
        Some(user) if user.role == Role::Admin => {
            issue_user_token(store, name, "local admin (tcloud up)", None, now).await?
        }
        Some(_) => {
            return Err(ServerError::Config(format!(
                "user `{name}` exists but is not an admin; pick another --admin-user"
            )));
        }
        None => {
            create_user(store, name, None, Role::Admin, None, now)
                .await?
                .1
        }
    };
    write_secret_file(token_file, &issued.secret)
        .map_err(|e| ServerError::io(format!("cannot write {}", token_file.display()), e))
}

/// The embedded cluster's identities, in `control`'s store: its local admin (token in
/// `admin_token_file`) and a short-lived join token for its own agent, bound to the
/// agent's node name (so the agent also enrols again with it when started with more
/// capacity), returned.
pub async fn provision_local(
    control: &crate::Control,
    admin: &str,
    admin_token_file: &Path,
    node_name: &str,
) -> Result<String, ServerError> {
    let now = crate::now();
    let store = control.store.as_ref();
    ensure_local_admin(store, admin, admin_token_file, now).await?;
    let join = issue_join_token(
        store,
        admin,
        Some(JOIN_TOKEN_DEFAULT_TTL_SECS),
        JoinScope {
            bound_node: Some(node_name.to_string()),
            max_nodes: 1,
        },
        now,
    )
    .await?;
    Ok(join.secret)
}

/// Write `secret` to `path` readable by its owner only, replacing it atomically.
pub fn write_secret_file(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_store::MemoryStore;

    #[test]
    fn user_names_follow_unix_rules() {
        for good in ["alice", "_svc", "a.b-c_1"] {
            check_user_name(good).unwrap();
        }
        for bad in ["", "Alice", "1abc", "a b", "a/b", &"x".repeat(33)] {
            assert!(check_user_name(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_local_admin_is_created_once_and_its_token_kept() {
        let store = MemoryStore::new();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("admin.token");
        ensure_local_admin(&store, "admin", &file, Timestamp(1))
            .await
            .unwrap();
        let first = std::fs::read_to_string(&file).unwrap();
        ensure_local_admin(&store, "admin", &file, Timestamp(2))
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), first);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = store
            .token_by_hash(&tokens::hash(first.trim()))
            .await
            .unwrap()
            .unwrap();
        store.revoke_token(token.id, Timestamp(3)).await.unwrap();
        ensure_local_admin(&store, "admin", &file, Timestamp(4))
            .await
            .unwrap();
        assert_ne!(std::fs::read_to_string(&file).unwrap(), first);
        assert_eq!(store.list_users().await.unwrap().len(), 1);
    }
}

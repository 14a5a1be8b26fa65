//! `tcloud admin …`: users, tokens, agent join tokens and the audit log, through the API
//! with an admin token. (`taccd admin …` does the same against the data directory.)
//!
//! A new token is printed once, alone on stdout, so `TOKEN=$(tcloud admin user add bob)`
//! captures it; what it is and what to do with it goes to stderr.

use anyhow::Result;
use tacc_core::{HumanDuration, Role, Timestamp};
use tacc_proto::{CreateUser, TokenView};

use super::Ctx;
use crate::format::{ago, now, out, out_json, precise_duration, print_table, table};
use crate::sanitize::{field, opt_field};

fn expiry_text(expires_at: Option<Timestamp>, now: Timestamp) -> String {
    match expires_at {
        None => "never".to_string(),
        Some(at) if at > now => format!("in {}", precise_duration(at.millis_since(now))),
        Some(at) => format!("expired {}", ago(at, now)),
    }
}

pub async fn user_add(
    ctx: &Ctx,
    name: &str,
    group: Option<String>,
    role: Role,
    ttl: Option<HumanDuration>,
    as_json: bool,
) -> Result<()> {
    let client = ctx.client()?;
    let created = client
        .create_user(&CreateUser {
            name: name.to_string(),
            group,
            role,
            token_ttl_secs: ttl.map(HumanDuration::as_secs),
        })
        .await?;
    if as_json {
        return out_json(&created);
    }
    let user = &created.user;
    let group = user
        .group
        .as_deref()
        .map(|g| format!(", group {}", field(g)))
        .unwrap_or_default();
    eprintln!(
        "Created user {} ({}{group}). Their API token, shown only this once (expires {}):",
        field(&user.name),
        user.role,
        expiry_text(created.token.expires_at, now())
    );
    out(field(&created.token.token))?;
    eprintln!(
        "Give it to them privately; they log in with `tcloud login` (paste it) or `tcloud login --token-stdin < FILE`."
    );
    Ok(())
}

pub async fn user_ls(ctx: &Ctx, as_json: bool) -> Result<()> {
    let users = ctx.client()?.list_users().await?;
    if as_json {
        return out_json(&users);
    }
    if users.is_empty() {
        out("no users; add one with `tcloud admin user add NAME`")?;
        return Ok(());
    }
    let now = now();
    let mut t = table(["NAME", "ROLE", "GROUP", "CREATED"]);
    for user in &users {
        t.add_row([
            field(&user.name),
            user.role.to_string(),
            opt_field(user.group.as_deref()),
            ago(user.created_at, now),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

/// `active`, `revoked` or `expired`.
pub fn token_state(token: &TokenView, now: Timestamp) -> &'static str {
    if token.revoked_at.is_some() {
        "revoked"
    } else if token.expires_at.is_some_and(|at| at <= now) {
        "expired"
    } else {
        "active"
    }
}

pub async fn token_ls(ctx: &Ctx, as_json: bool) -> Result<()> {
    let tokens = ctx.client()?.list_tokens().await?;
    if as_json {
        return out_json(&tokens);
    }
    if tokens.is_empty() {
        out("no tokens")?;
        return Ok(());
    }
    let now = now();
    let mut t = table([
        "ID", "KIND", "OWNER", "LABEL", "STATE", "CREATED", "EXPIRES",
    ]);
    for token in &tokens {
        let owner = match (&token.user, &token.node) {
            (Some(user), _) => field(user),
            (None, Some(node)) => format!("node {node}"),
            (None, None) => "-".to_string(),
        };
        t.add_row([
            token.id.to_string(),
            field(&token.kind),
            owner,
            field(&token.label),
            token_state(token, now).to_string(),
            ago(token.created_at, now),
            expiry_text(token.expires_at, now),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

pub async fn token_revoke(ctx: &Ctx, id: u64) -> Result<()> {
    ctx.client()?.revoke_token(id).await?;
    out(format!(
        "Revoked token {id}: requests with it are refused from now on"
    ))?;
    Ok(())
}

pub async fn node_drain(ctx: &Ctx, name: &str, resume: bool) -> Result<()> {
    let view = ctx.client()?.drain_node(name, resume).await?;
    let name = field(&view.name);
    out(match (resume, view.state.as_str()) {
        (true, _) => format!("Resumed node {name}: it takes new tasks again"),
        (false, "draining") => format!(
            "Draining node {name}: its {} running task(s) finish, nothing new is placed there",
            view.running_tasks.len()
        ),
        (false, _) => format!("Drained node {name}: nothing new is placed there"),
    })?;
    Ok(())
}

pub async fn node_approve(ctx: &Ctx, name: &str) -> Result<()> {
    let view = ctx.client()?.approve_node(name).await?;
    out(format!(
        "Approved node {}: it is {} and takes tasks",
        field(&view.name),
        field(&view.state)
    ))?;
    Ok(())
}

pub async fn node_remove(ctx: &Ctx, name: &str) -> Result<()> {
    ctx.client()?.remove_node(name).await?;
    out(format!(
        "Removed node {}: its credential is revoked; to bring it back, start its agent with a new join token (`tcloud admin agent-token`)",
        field(name)
    ))?;
    Ok(())
}

pub async fn agent_token(
    ctx: &Ctx,
    ttl: Option<HumanDuration>,
    node: Option<&str>,
    nodes: Option<u32>,
    as_json: bool,
) -> Result<()> {
    let client = ctx.client()?;
    let issued = client
        .create_agent_token(ttl.map(HumanDuration::as_secs), node, nodes)
        .await?;
    if as_json {
        return out_json(&issued);
    }
    eprintln!(
        "Agent join token {} (expires {}), shown only this once:",
        issued.id,
        expiry_text(issued.expires_at, now())
    );
    out(field(&issued.token))?;
    eprintln!(
        "On the new node, put it in a file only root reads (never on a command line) and run `taccd agent --server {} --token-file FILE` (it enrols and gets its own node credential).",
        client.base_url()
    );
    Ok(())
}

pub async fn audit(ctx: &Ctx, limit: u32, as_json: bool) -> Result<()> {
    let entries = ctx.client()?.audit(limit).await?;
    if as_json {
        return out_json(&entries);
    }
    if entries.is_empty() {
        out("the audit log is empty")?;
        return Ok(());
    }
    let now = now();
    let mut t = table([
        "ID", "WHEN", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL",
    ]);
    for entry in &entries {
        t.add_row([
            entry.id.to_string(),
            ago(entry.at, now),
            field(&entry.actor),
            field(&entry.action),
            field(&entry.target),
            field(&entry.outcome),
            field(&entry.detail),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(revoked: Option<u64>, expires: Option<u64>) -> TokenView {
        TokenView {
            id: 1,
            kind: "user".into(),
            user: Some("alice".into()),
            node: None,
            label: String::new(),
            created_at: Timestamp::from_secs(0),
            expires_at: expires.map(Timestamp::from_secs),
            revoked_at: revoked.map(Timestamp::from_secs),
        }
    }

    #[test]
    fn token_states_and_expiry_texts() {
        let now = Timestamp::from_secs(1_000);
        assert_eq!(token_state(&token(None, None), now), "active");
        assert_eq!(token_state(&token(None, Some(2_000)), now), "active");
        assert_eq!(token_state(&token(None, Some(1_000)), now), "expired");
        assert_eq!(token_state(&token(Some(500), Some(2_000)), now), "revoked");
        assert_eq!(expiry_text(None, now), "never");
        assert_eq!(expiry_text(Some(Timestamp::from_secs(4_600)), now), "in 1h");
        assert_eq!(
            expiry_text(Some(Timestamp::from_secs(940)), now),
            "expired 1m ago"
        );
    }
}

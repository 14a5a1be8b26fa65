//! `taccd admin …`: users, tokens, agent join tokens and the audit trail, managed directly
//! in a server's data directory (the operator's way in before any admin token exists).
//! The same rules as the admin API apply (`tacc_server::accounts`); every change is
//! audited as `operator`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use tacc_core::{HumanDuration, Role};
use tacc_store::{NewAuditEntry, Store};

use crate::database::Database;

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Users: add (prints the first token, once) and list.
    #[command(subcommand)]
    User(UserCommand),
    /// API tokens: create another for a user, list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Issue a join token with which a new node's agent enrols (`taccd agent --token-file
    /// FILE`). It enrols one node, any name, unless --node binds it to one name or --nodes
    /// lets it enrol several (a Slurm agent's partition); once used, it enrols nothing.
    ///
    /// Example: taccd admin --data-dir /var/lib/tacc agent-token --node gpu-07 > /root/join.token
    AgentToken {
        /// How long the join token can be used (e.g. 30m, 1h, 1d).
        #[arg(long, default_value = "1h")]
        ttl: HumanDuration,
        /// Enrol only the node of this name (also one already registered: a re-enrolment
        /// after a change of capacity, or a replaced machine).
        #[arg(long, value_name = "NAME", conflicts_with = "nodes")]
        node: Option<String>,
        /// How many nodes the token may enrol (each name once), e.g. every node of a Slurm
        /// partition.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        nodes: u32,
    },
    /// Issue a scrape token for the server's metrics (`GET /metrics`): give it to your
    /// Prometheus server (`authorization: {credentials_file: FILE}` in its scrape config).
    /// It reads the metrics and nothing else; revoke it with `taccd admin token revoke ID`.
    ///
    /// Example: taccd admin --data-dir /var/lib/tacc metrics-token > /etc/prometheus/tacc.token
    MetricsToken {
        /// Shown in `taccd admin token ls`.
        #[arg(long, default_value = "prometheus")]
        label: String,
        /// How long the token can be used (e.g. 90d); default: until revoked.
        #[arg(long)]
        ttl: Option<HumanDuration>,
    },
    /// The audit trail: user, token, node and admin actions and refused requests.
    Audit {
        /// Newest entries shown.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user and print their first API token (shown once).
    ///
    /// Example: taccd admin --data-dir /var/lib/tacc user add alice --group vision
    Add {
        name: String,
        /// The user's group (quotas and fair share are per group; a group admin sees the
        /// group's tasks).
        #[arg(long)]
        group: Option<String>,
        /// user, group_admin or admin.
        #[arg(long, default_value = "user")]
        role: Role,
        /// Lifetime of the first token (e.g. 90d); default: until revoked.
        #[arg(long)]
        ttl: Option<HumanDuration>,
    },
    /// List users.
    Ls,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue another API token for a user (shown once).
    Create {
        user: String,
        #[arg(long, default_value = "")]
        label: String,
        #[arg(long)]
        ttl: Option<HumanDuration>,
    },
    /// List tokens (never their secrets).
    Ls,
    /// Revoke a token by id: it stops working within seconds, also for open log streams.
    Revoke { id: u64 },
}

/// The server's store: `--database` when given, else the SQLite file of the data
/// directory, which must exist (a typo in --data-dir must not create an empty one).
async fn open(data_dir: &Path, database: Option<&str>) -> Result<Arc<dyn Store>> {
    let database = Database::choose(database, data_dir).map_err(anyhow::Error::msg)?;
    if let Database::Sqlite(path) = &database {
        if !path.exists() {
            bail!(
                "{} holds no TACC database; point --data-dir at the server's data directory \
                 (or --database at the server's database)",
                data_dir.display()
            );
        }
    }
    database
        .open()
        .await
        .with_context(|| format!("cannot open {database}"))
}

fn audit(action: &str, target: String, detail: String) -> NewAuditEntry {
    NewAuditEntry {
        at: tacc_server::now(),
        actor: "operator".into(),
        action: action.into(),
        target,
        outcome: "ok".into(),
        detail,
    }
}

fn when(at: Option<tacc_core::Timestamp>) -> String {
    at.map_or_else(|| "-".to_string(), |t| t.to_string())
}

pub async fn run(data_dir: &Path, database: Option<&str>, command: AdminCommand) -> Result<()> {
    let opened = open(data_dir, database).await?;
    let store: &dyn Store = &*opened;
    let now = tacc_server::now();
    match command {
        AdminCommand::User(UserCommand::Add {
            name,
            group,
            role,
            ttl,
        }) => {
            let (user, token) = tacc_server::accounts::create_user(
                store,
                &name,
                group.as_deref(),
                role,
                ttl.map(|t| t.as_secs()),
                now,
            )
            .await?;
            store
                .append_audit(audit(
                    "user.add",
                    format!("user:{name}"),
                    format!("role {}", user.role),
                ))
                .await?;
            eprintln!("created user {} (role {})", user.name, user.role);
            eprintln!("their API token (shown once; they run `tcloud login` and paste it):");
            println!("{}", token.secret);
        }
        AdminCommand::User(UserCommand::Ls) => {
            for user in store.list_users().await? {
                println!(
                    "{:<20} {:<12} {}",
                    user.name,
                    user.role,
                    user.group.as_deref().unwrap_or("-")
                );
            }
        }
        AdminCommand::Token(TokenCommand::Create { user, label, ttl }) => {
            let token = tacc_server::accounts::issue_user_token(
                store,
                &user,
                &label,
                ttl.map(|t| t.as_secs()),
                now,
            )
            .await?;
            store
                .append_audit(audit(
                    "token.create",
                    format!("user:{user}"),
                    format!("token {}", token.record.id),
                ))
                .await?;
            eprintln!("token {} for {user} (shown once):", token.record.id);
            println!("{}", token.secret);
        }
        AdminCommand::Token(TokenCommand::Ls) => {
            println!(
                "{:>5} {:<11} {:<16} {:<24} {:<24} REVOKED",
                "ID", "KIND", "USER/NODE", "LABEL", "EXPIRES"
            );
            for token in store.list_tokens(None).await? {
                let owner = match (&token.user, token.node) {
                    (_, Some(node)) => format!("node {node}"),
                    (Some(user), None) => user.clone(),
                    (None, None) => "-".into(),
                };
                println!(
                    "{:>5} {:<11} {:<16} {:<24} {:<24} {}",
                    token.id,
                    token.kind.as_str(),
                    owner,
                    token.label,
                    when(token.expires_at),
                    when(token.revoked_at)
                );
            }
        }
        AdminCommand::Token(TokenCommand::Revoke { id }) => {
            let missing = || {
                anyhow::anyhow!(
                    "token {id} does not exist or was already revoked (see `taccd admin token ls`)"
                )
            };
            if store
                .get_token(id)
                .await?
                .is_none_or(|token| token.revoked_at.is_some())
            {
                return Err(missing());
            }
            // Recorded first: a revocation never takes effect without its row. (Issued
            // tokens are recorded before their secret is printed, for the same reason.)
            store
                .append_audit(audit("token.revoke", format!("token:{id}"), String::new()))
                .await?;
            if !store.revoke_token(id, now).await? {
                return Err(missing());
            }
            eprintln!(
                "revoked token {id}; servers stop accepting it within {} s",
                tacc_server::auth::authenticate::CACHE_TTL.as_secs()
            );
        }
        AdminCommand::AgentToken { ttl, node, nodes } => {
            let token = tacc_server::accounts::issue_join_token(
                store,
                "operator",
                Some(ttl.as_secs()),
                tacc_store::JoinScope {
                    bound_node: node,
                    max_nodes: nodes,
                },
                now,
            )
            .await?;
            store
                .append_audit(audit(
                    "agent_token.create",
                    format!("token:{}", token.record.id),
                    token.record.label.clone(),
                ))
                .await?;
            eprintln!(
                "{} {} (valid for {ttl}; shown once). Put it in a file only root can read on \
                 the node (never on a command line), then run:",
                token.record.label, token.record.id
            );
            eprintln!("  taccd agent --server URL --data-dir DIR --token-file FILE");
            println!("{}", token.secret);
        }
        AdminCommand::MetricsToken { label, ttl } => {
            let token = tacc_server::accounts::issue_metrics_token(
                store,
                "operator",
                &label,
                ttl.map(|t| t.as_secs()),
                now,
            )
            .await?;
            store
                .append_audit(audit(
                    "metrics_token.create",
                    format!("token:{}", token.record.id),
                    label,
                ))
                .await?;
            eprintln!(
                "metrics token {} (shown once): it reads GET /metrics and nothing else",
                token.record.id
            );
            println!("{}", token.secret);
        }
        AdminCommand::Audit { limit, json } => {
            for entry in store.list_audit(None, limit.max(1)).await? {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": entry.id, "at": entry.at, "actor": entry.actor,
                            "action": entry.action, "target": entry.target,
                            "outcome": entry.outcome, "detail": entry.detail,
                        })
                    );
                } else {
                    println!(
                        "{} {:<16} {:<20} {:<24} {:<7} {}",
                        entry.at,
                        entry.actor,
                        entry.action,
                        entry.target,
                        entry.outcome,
                        entry.detail.escape_debug()
                    );
                }
            }
        }
    }
    Ok(())
}

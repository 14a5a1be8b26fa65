//! `taccd admin node drain|resume|approve|remove NAME`: a drain must reach the running server's
//! memory, so these go through the admin API, at the URL the server wrote to
//! DATA_DIR/taccd.json and with the admin token in DATA_DIR/admin.token.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Let the node's running tasks finish and place nothing new on it (survives restarts).
    Drain { name: String },
    /// Let a drained node take new tasks again.
    Resume { name: String },
    /// Approve a node that enrolled while the server requires approval
    /// (`--require-node-approval`): it gets work from now on.
    Approve { name: String },
    /// Forget a node and revoke its credential; it must join again with a join token.
    /// Refused while the node is up and runs tasks (drain it first).
    Remove { name: String },
}

/// A client for the server running on `data_dir`, as its admin.
fn client(data_dir: &Path) -> Result<tacc_client::Client> {
    let endpoint = data_dir.join("taccd.json");
    let text = std::fs::read_to_string(&endpoint).map_err(|_| {
        anyhow::anyhow!(
            "no server is running on {} (no {}): start it with `taccd server --data-dir {}`; \
             a node's drain lives in the running server",
            data_dir.display(),
            endpoint.display(),
            data_dir.display()
        )
    })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is unreadable", endpoint.display()))?;
    let Some(url) = value["url"].as_str() else {
        bail!("{} names no url", endpoint.display());
    };
    let token_file = data_dir.join("admin.token");
    let token = std::fs::read_to_string(&token_file).unwrap_or_default();
    let token = token.trim();
    if token.is_empty() {
        bail!(
            "there is no admin token in {}: create an admin with `taccd admin --data-dir {} user add NAME --role admin > {}` (or use `tcloud admin node …` with an admin's token)",
            token_file.display(),
            data_dir.display(),
            token_file.display()
        );
    }
    let mut client = tacc_client::Client::new(url);
    let cert = data_dir.join("tls").join("cert.pem");
    if url.starts_with("https://")
        && let Ok(pem) = std::fs::read(&cert)
    {
        client = client.with_ca(&pem)?;
    }
    Ok(client.with_token(token.to_string()))
}

pub async fn run(data_dir: &Path, command: NodeCommand) -> Result<()> {
    let client = client(data_dir)?;
    let unreachable = |e: tacc_client::ClientError| -> anyhow::Error {
        if e.is_unreachable() {
            anyhow::anyhow!(
                "the server of {} is not running or does not answer ({e})",
                data_dir.display()
            )
        } else {
            e.into()
        }
    };
    match command {
        NodeCommand::Drain { name } => {
            let view = client.drain_node(&name, false).await.map_err(unreachable)?;
            println!("node {} is {}", view.name, view.state);
        }
        NodeCommand::Resume { name } => {
            let view = client.drain_node(&name, true).await.map_err(unreachable)?;
            println!("node {} is {}", view.name, view.state);
        }
        NodeCommand::Approve { name } => {
            let view = client.approve_node(&name).await.map_err(unreachable)?;
            println!("node {} is approved; it is {}", view.name, view.state);
        }
        NodeCommand::Remove { name } => {
            client.remove_node(&name).await.map_err(unreachable)?;
            println!("node {name} is removed; its credential is revoked");
        }
    }
    Ok(())
}

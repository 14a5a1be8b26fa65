//! `taccd admin …`: operator commands that work on a server's data directory directly,
//! without a running server or a token: TLS set-up, users, tokens, join tokens, audit.

use std::path::Path;

use anyhow::Result;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Admin {
    /// Make a self-signed TLS certificate and key for the server, and print the
    /// fingerprint clients and agents pin.
    ///
    /// Example: taccd admin tls-init --data-dir /var/lib/tacc --host head.lab.example
    TlsInit(crate::tls::TlsInitArgs),
    /// Nodes: drain, resume, approve, remove (through the running server's admin API, with
    /// DATA_DIR/admin.token).
    ///
    /// Example: taccd admin --data-dir /var/lib/tacc node drain gpu-01
    #[command(subcommand)]
    Node(crate::admin_nodes::NodeCommand),
    #[command(flatten)]
    Accounts(crate::admin_accounts::AdminCommand),
}

pub async fn run(data_dir: &Path, database: Option<&str>, command: Admin) -> Result<()> {
    match command {
        Admin::TlsInit(mut args) => {
            args.data_dir = data_dir.to_path_buf();
            crate::tls::init(args)
        }
        Admin::Node(command) => crate::admin_nodes::run(data_dir, command).await,
        Admin::Accounts(command) => crate::admin_accounts::run(data_dir, database, command).await,
    }
}

//! `taccd admin …`: operator commands that work on a server's data directory directly,
//! without a running server or a token.

use anyhow::Result;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Admin {
    /// Make a self-signed TLS certificate and key for the server, and print the
    /// fingerprint clients and agents pin.
    ///
    /// Example: taccd admin tls-init --data-dir /var/lib/tacc --host head.lab.example
    TlsInit(crate::tls::TlsInitArgs),
}

pub async fn run(command: Admin) -> Result<()> {
    match command {
        Admin::TlsInit(args) => crate::tls::init(args),
    }
}

//! `tcloud config …`: the grammar of the cluster-profile commands and their `--help` text.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Switch the current cluster
    #[command(after_help = "Examples:\n  tcloud config use lab")]
    Use { name: String },
    /// Add a cluster profile (or update its URL); then `tcloud login --profile NAME`
    #[command(
        after_help = "Examples:\n  tcloud config add lab https://tacc.lab.example:8383\n  tcloud config add lab https://head:8383 --fingerprint 3f9a…(from taccd admin tls-init)\n  tcloud login --profile lab"
    )]
    Add {
        name: String,
        url: String,
        /// SHA-256 fingerprint of the server's self-signed certificate (printed by
        /// `taccd admin tls-init`): trust exactly that certificate
        #[arg(long, value_name = "HEX")]
        fingerprint: Option<String>,
        /// Deprecated and ignored: the token says who you are
        #[arg(long, hide = true)]
        user: Option<String>,
    },
    /// List cluster profiles; the current one is marked with *
    #[command(after_help = "Examples:\n  tcloud config ls\n  tcloud config ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show the configuration file's path and the settings in effect
    #[command(after_help = "Examples:\n  tcloud config show")]
    Show,
}

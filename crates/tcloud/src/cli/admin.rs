//! `tcloud admin …`: the grammar of the administrators' commands (users, tokens, agent join
//! tokens, nodes, the audit log) and their `--help` text.

use clap::Subcommand;
use tacc_core::{HumanDuration, Role};

fn parse_role(text: &str) -> Result<Role, String> {
    text.trim().parse::<Role>().map_err(|e| e.to_string())
}

fn parse_duration(text: &str) -> Result<HumanDuration, String> {
    text.parse::<HumanDuration>().map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Users: add one (and get their token), list them
    #[command(
        after_help = "Examples:\n  tcloud admin user add alice --group vision\n  tcloud admin user ls"
    )]
    User {
        #[command(subcommand)]
        command: AdminUserCommand,
    },
    /// API tokens: list them, revoke one
    #[command(after_help = "Examples:\n  tcloud admin token ls\n  tcloud admin token revoke 7")]
    Token {
        #[command(subcommand)]
        command: AdminTokenCommand,
    },
    /// Issue a join token with which a new node's agent enrols
    #[command(
        long_about = "Issues a join token: on a new node, `taccd agent --server URL \
--token-file FILE` (the token in a file only root reads; `--token-file -` reads standard \
input) enrols the node with it, and the node receives a credential of its own, bound to it. \
A token enrols one node, any name, unless --node binds it to one name or --nodes lets it \
enrol several; once used it enrols nothing. The token is printed once, alone on stdout.",
        after_help = "Examples:\n  tcloud admin agent-token > join.token\n  tcloud admin agent-token --node gpu-07 --ttl 30m\n  tcloud admin agent-token --nodes 16   # a Slurm agent's partition"
    )]
    AgentToken {
        /// How long the join token stays valid (e.g. 30m, 1h, 2d); default 1h
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        ttl: Option<HumanDuration>,
        /// Enrol only the node of this name (also one already registered: a re-enrolment)
        #[arg(long, value_name = "NAME", conflicts_with = "nodes")]
        node: Option<String>,
        /// How many nodes the token may enrol, each name once; default 1
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        nodes: Option<u32>,
        /// Print {\"id\", \"token\", \"expires_at\"} as JSON
        #[arg(long)]
        json: bool,
    },
    /// Nodes: drain one, resume it, approve it, remove it
    #[command(
        after_help = "Examples:\n  tcloud admin node drain gpu-01\n  tcloud admin node resume gpu-01\n  tcloud admin node approve gpu-01\n  tcloud admin node remove gpu-01"
    )]
    Node {
        #[command(subcommand)]
        command: AdminNodeCommand,
    },
    /// The audit log: who did what, newest first
    #[command(
        long_about = "Lists the audit log: user, token, node and admin actions and \
authentication failures, with time, actor, target and outcome.",
        after_help = "Examples:\n  tcloud admin audit\n  tcloud admin audit --limit 200 --json"
    )]
    Audit {
        /// At most N entries
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminUserCommand {
    /// Create a user and print their first API token, once
    #[command(
        long_about = "Creates user NAME and prints their first API token, alone on stdout and \
only this once (the server keeps only a hash of it); pass it on privately. Roles: user (own \
tasks), group_admin (also the group's tasks), admin (everything).",
        after_help = "Examples:\n  tcloud admin user add alice\n  tcloud admin user add bob --group vision --role group_admin\n  TOKEN=$(tcloud admin user add carol --ttl 90d)"
    )]
    Add {
        name: String,
        /// The user's group (fair share and group admins work per group)
        #[arg(long, value_name = "G")]
        group: Option<String>,
        /// user, group_admin or admin
        #[arg(long, value_name = "R", default_value = "user", value_parser = parse_role)]
        role: Role,
        /// Lifetime of the token (e.g. 90d); default: until revoked
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        ttl: Option<HumanDuration>,
        /// Print the user and token as JSON
        #[arg(long)]
        json: bool,
    },
    /// List users
    #[command(after_help = "Examples:\n  tcloud admin user ls\n  tcloud admin user ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminNodeCommand {
    /// Let the node's running tasks finish and place nothing new on it (survives restarts)
    #[command(after_help = "Examples:\n  tcloud admin node drain gpu-01")]
    Drain { name: String },
    /// Let a drained node take new tasks again
    #[command(after_help = "Examples:\n  tcloud admin node resume gpu-01")]
    Resume { name: String },
    /// Approve a node that enrolled while the server requires approval
    #[command(
        long_about = "Approves a node that enrolled while the server requires approval \
(`taccd server --require-node-approval`): until then it is `pending` in `tcloud nodes` and \
gets no work. Check first that the node is the machine you expect.",
        after_help = "Examples:\n  tcloud admin node approve gpu-01"
    )]
    Approve { name: String },
    /// Forget a node and revoke its credential; it must join again with a join token
    #[command(
        long_about = "Forgets a node and revokes its credential; its agent must join again \
with a new join token (`tcloud admin agent-token`). Refused while the node is up and runs \
tasks: drain it first and wait, or remove it once it is down (its tasks are then lost).",
        after_help = "Examples:\n  tcloud admin node remove gpu-01"
    )]
    Remove { name: String },
}

#[derive(Debug, Subcommand)]
pub enum AdminTokenCommand {
    /// List API, agent join and node tokens (never their secrets)
    #[command(after_help = "Examples:\n  tcloud admin token ls\n  tcloud admin token ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: requests carrying it are refused from now on
    #[command(after_help = "Examples:\n  tcloud admin token revoke 7")]
    Revoke {
        /// The token's id (from `tcloud admin token ls`)
        id: u64,
    },
}

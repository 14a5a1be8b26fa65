//! How an operator configures the control plane (`taccd server` flags and the
//! configuration file), with the defaults a fresh cluster gets.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tacc_scheduler::SchedulerConfig;

use super::{AdaptiveConfig, IdleGpuPolicy, RetrySettings};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    /// An agent silent for longer than this is lost, and so are the attempts it ran.
    pub heartbeat_timeout: Duration,
    /// Name of the scheduling policy (see `tacc_scheduler::policy_names`).
    pub policy: String,
    /// Users, groups, limits, shares and priority caps.
    pub scheduler: SchedulerConfig,
    /// Datasets an administrator registered: name → absolute path or http(s) URL.
    pub datasets: BTreeMap<String, String>,
    /// A node lost [`FLAP_LOSSES`] times within [`FLAP_WINDOW`] that comes back gets no
    /// work until it has stayed up this long.
    pub node_stable_after: Duration,
    /// Chunks no committed snapshot references are deleted once unused for this long.
    pub chunk_retention: Duration,
    /// Per-user submission rate, queue and log limits.
    pub limits: crate::limits::UserLimits,
    /// Operator mapping of TACC users to Unix accounts on the nodes (`[users.NAME]
    /// unix_user` in the configuration file); unmapped users run as the agent's
    /// unprivileged task account.
    pub unix_users: BTreeMap<String, String>,
    /// The first task uid (and gid) the server allocates to users not in `unix_users`
    /// (`--task-uid-base`): one durable map in the store, the same on every node.
    pub task_uid_base: u32,
    /// A running rank with no output (and no CPU use, where measured) for this long is
    /// flagged silent in its task's usage (`tcloud top`).
    pub silent_after: Duration,
    /// A multi-node attempt whose ranks still running have all been silent this long is
    /// ended as hung (`--hang-after`; `None` is off); a task's `on_hang` overrides it.
    pub hang_after: Option<Duration>,
    /// The operator's idle-GPU policy (`--idle-gpu-*`); `None`: idle GPUs are only shown.
    pub idle_gpu: Option<IdleGpuPolicy>,
    /// The bounds on interactive sessions (`tcloud exec`, `shell`, `port-forward`).
    pub sessions: crate::SessionLimits,
    /// Adaptive allocation: which running tasks' allocations may move, and how fast.
    pub adaptive: AdaptiveConfig,
    /// One of several replicas (`--replicated`): agents are told so at registration.
    pub replicated: bool,
    /// How retries are spaced, and the crash limit.
    pub retry: RetrySettings,
    /// Which webhook destinations are allowed (internal addresses only when the operator
    /// says so).
    pub webhooks: crate::webhook_destination::WebhookPolicy,
    /// Header and idle timeouts and the most connections the listener keeps open.
    pub connections: crate::ConnectionLimits,
    /// Audit retention and the bounds on refused-request noise.
    pub audit: crate::auth::AuditSettings,
    /// Nodes that enrol wait, with no work, until an admin approves them
    /// (`--require-node-approval`).
    pub require_node_approval: bool,
}

impl ServerConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        ServerConfig {
            data_dir,
            heartbeat_timeout: Duration::from_secs(30),
            node_stable_after: Duration::from_secs(60),
            policy: DEFAULT_POLICY.to_string(),
            scheduler: SchedulerConfig::default(),
            datasets: BTreeMap::new(),
            chunk_retention: Duration::from_secs(7 * 24 * 3600),
            limits: crate::limits::UserLimits::default(),
            unix_users: BTreeMap::new(),
            task_uid_base: DEFAULT_TASK_UID_BASE,
            silent_after: Duration::from_secs(300),
            hang_after: Some(DEFAULT_HANG_AFTER),
            idle_gpu: None,
            sessions: crate::SessionLimits::default(),
            adaptive: AdaptiveConfig::default(),
            replicated: false,
            retry: RetrySettings::default(),
            webhooks: Default::default(),
            connections: crate::ConnectionLimits::default(),
            audit: crate::auth::AuditSettings::default(),
            require_node_approval: false,
        }
    }
}

/// How long every running rank of a multi-node attempt must have been silent for it to
/// count as hung, unless the operator or the task says otherwise.
pub const DEFAULT_HANG_AFTER: Duration = Duration::from_secs(30 * 60);

/// The default first uid of the accounts the server allocates for users' tasks: above the
/// ranges distributions give to local and directory accounts.
pub const DEFAULT_TASK_UID_BASE: u32 = 200_000;

/// The production default: multifactor fair share with EASY backfill.
pub const DEFAULT_POLICY: &str = "fairshare";

/// Policies that need knowledge a live cluster does not have.
pub(super) const SIMULATOR_ONLY_POLICIES: &[&str] = &["sjf"];

//! `tacc-server`: the control plane behind `taccd server` and `taccd dev`. It serves the
//! HTTP API v1 (tasks, logs, snapshots, nodes, and the agent protocol), keeps every
//! acknowledged submission durable in a [`tacc_store::Store`] before answering, drives
//! the pure `tacc-scheduler` with real time, and watches agents' heartbeats.
//!
//! It sits above all four layers and wires them together; it must not run user code
//! itself (agents do, through `tacc-exec`) and takes an already-bound listener and a
//! cancellation token so tests bind port 0 and stop it cleanly. [`serve`] speaks plain
//! HTTP, [`serve_tls`] HTTPS (rustls); both run the same API, the web dashboard (`/ui/`)
//! and the background tasks.

pub mod accounting;
pub mod accounts;
mod agent_access;
mod api;
mod artifacts;
mod asha;
pub mod auth;
pub mod clock;
pub mod cluster_stop;
mod connections;
mod control;
pub mod daemon_log;
mod dev_idle;
mod disk_errors;
mod enrolment;
mod group_ends;
mod limits;
mod log_offsets;
mod logs;
mod metrics;
mod node_attempts;
mod node_requests;
mod node_selector;
pub mod notify;
mod query;
mod replica;
pub mod secrets;
mod sessions;
mod tls;
mod usage;
pub mod webhook_destination;

use std::sync::Arc;

pub use api::{RouteRule, openapi_json, route_rules};
pub use auth::AuditSettings;
pub use connections::ConnectionLimits;
pub use control::{
    AdaptiveConfig, AdaptiveMode, Control, DEFAULT_POLICY, DEFAULT_TASK_UID_BASE, DefaultBounds,
    IdleGpuAction, IdleGpuPolicy, RetrySettings, ServerConfig, now,
};
pub use limits::UserLimits;
pub use replica::{ReplicaConfig, serve_replicated};
pub use sessions::SessionLimits;
use tacc_core::{NodeId, TaskId};
pub use tls::TlsConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
pub use webhook_destination::WebhookPolicy;

/// The crate's errors; each maps to one HTTP status and stable error code.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("task {0} does not exist (list tasks with `tcloud ps --all`)")]
    TaskNotFound(TaskId),
    #[error("task group {0} does not exist (list groups with `tcloud ps --all`)")]
    GroupNotFound(tacc_core::GroupId),
    #[error("node {0} is not registered with this server")]
    NodeNotFound(NodeId),
    #[error("node {0} is offline; its agent must register again")]
    NodeNotRegistered(NodeId),
    #[error("{0}")]
    InvalidTask(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("not allowed: {0}")]
    Forbidden(String),
    /// A node's credential registered with another name or more capacity than it
    /// enrolled with: it must enrol again with a new join token.
    #[error("{0}")]
    ReenrolRequired(String),
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_secs: u64,
    },
    #[error("{0}")]
    Unavailable(String),
    /// A node did not answer a question about its attempt in time.
    #[error("{0}")]
    NodeTimeout(String),
    /// The server's disk is full (database or chunk store): its fault, not the request's.
    #[error(
        "the server is out of disk space ({0}); this is the server's fault, not your \
         request's: its operator must free space in the server's data directory, then retry"
    )]
    StorageFull(String),
    #[error(transparent)]
    Store(#[from] tacc_store::StoreError),
    #[error("invalid server configuration: {0}")]
    Config(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Serve the API in plain HTTP on `listener` until `shutdown` is cancelled.
pub async fn serve(
    control: Arc<Control>,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_on(control, listener, None, shutdown, None).await
}

/// Serve the API in HTTPS on `listener`, with `tls`'s certificate, until `shutdown` is
/// cancelled.
pub async fn serve_tls(
    control: Arc<Control>,
    listener: TcpListener,
    tls: TlsConfig,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_on(control, listener, Some(tls), shutdown, None).await
}

/// Serve the API of the embedded cluster (`taccd dev`), in HTTPS when `tls` is given,
/// until `shutdown` is cancelled: an admin may ask it to stop (`tcloud down`), after
/// which `stop` says when no task is left (see [`cluster_stop`]).
pub async fn serve_embedded(
    control: Arc<Control>,
    listener: TcpListener,
    tls: Option<TlsConfig>,
    shutdown: CancellationToken,
    stop: Arc<cluster_stop::ClusterStop>,
) -> std::io::Result<()> {
    serve_on(control, listener, tls, shutdown, Some(stop)).await
}

/// Without TCP_NODELAY a streamed response (log follow, long poll) can wait out the peer's
/// delayed ACK: ~40 ms added to every small exchange.
fn set_nodelay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::warn!("cannot set TCP_NODELAY: {e}");
    }
}

/// The API, the dashboard and the background tasks (liveness, garbage collection) on the
/// listener, within the configured connection limits; TLS marks the dashboard's cookies
/// `Secure`.
async fn serve_on(
    control: Arc<Control>,
    listener: TcpListener,
    tls: Option<TlsConfig>,
    shutdown: CancellationToken,
    cluster_stop: Option<Arc<cluster_stop::ClusterStop>>,
) -> std::io::Result<()> {
    let background = spawn_background(control.clone(), shutdown.clone());
    let limits = control.config.connections;
    let app = api::leader_router(control, shutdown.clone(), tls.is_some(), cluster_stop);
    let result = connections::serve(listener, tls, app, limits, shutdown).await;
    for task in background {
        task.abort();
    }
    result
}

/// The leader's background work — node liveness, chunk garbage collection, notification
/// deliveries, sweeps — until `shutdown` is cancelled.
pub(crate) fn spawn_background(
    control: Arc<Control>,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let liveness = {
        let control = control.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(control::LIVENESS_CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {
                        if let Err(e) = control.check_liveness().await {
                            tracing::error!("liveness check failed: {e}");
                        }
                    }
                }
            }
        })
    };
    let gc = tokio::spawn(artifacts::run_gc(
        artifacts::Artifacts::of(&control),
        shutdown.clone(),
    ));
    let deliveries = tokio::spawn(notify::run_deliveries(
        notify::Notifier::of(&control),
        shutdown.clone(),
    ));
    let sweeps = tokio::spawn(control::run_sweeps(control::Sweeps::of(&control), shutdown));
    vec![liveness, gc, deliveries, sweeps]
}

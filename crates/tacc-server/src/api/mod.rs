//! HTTP routes of API v1, one file per resource. Every route is declared once, in
//! [`declare`], with the [`Access`] rule it requires; the [`guard`] enforces that rule
//! before any handler runs, so a route cannot exist without a check. Handlers translate
//! between wire types (`tacc-proto`) and the control plane and hold no state of their own.

mod accounting;
mod admin;
mod agents;
mod cluster;
mod cluster_stop;
mod dashboard;
mod drain;
mod durable;
mod files;
mod groups;
mod guard;
mod headers;
mod idempotency;
mod logs;
mod metrics;
mod openapi;
mod outputs;
mod pipelines;
mod secrets;
mod sessions;
mod snapshots;
mod tasks;
mod usage;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use tacc_proto::ApiError;
use tacc_store::StorageFault;
use tokio_util::sync::CancellationToken;

use crate::auth::Access;
pub use openapi::openapi_json;

use crate::{Control, ServerError};

/// What handler modules share.
mod prelude {
    pub(super) use std::path::{Component, Path as FsPath, PathBuf};
    pub(super) use std::time::Duration;

    pub(super) use axum::Extension;
    pub(super) use axum::Json;
    pub(super) use axum::body::{Body, Bytes};
    pub(super) use axum::extract::{Path, Query, State};
    pub(super) use axum::http::{HeaderMap, HeaderValue, StatusCode};
    pub(super) use axum::response::{IntoResponse, Response};
    pub(super) use serde::Deserialize;
    pub(super) use tacc_compiler::{ChunkHash, Manifest};
    pub(super) use tacc_core::{AttemptNo, NodeId, SnapshotId, TaskId, TaskState};
    pub(super) use tacc_proto::{
        AgentRegistered, AgentReports, CancelReply, Health, OutputFile, RegisterAgent,
        SnapshotCommitted, SnapshotOffer, SnapshotOfferReply, SubmitReply, SubmitTask,
        TaskEventView, TaskView, WorkPoll,
    };
    pub(super) use tacc_schema::TaskSpec;
    pub(super) use tacc_store::{OutputRecord, TaskFilter, TaskRecord};

    pub(super) use super::{ApiResult, AppState};
    pub(super) use crate::auth::{Caller, UserCaller};
    pub(super) use crate::{Control, ServerError};

    /// The authenticated user of a route the guard admitted only for users.
    pub(super) fn user_of(caller: &Caller) -> ApiResult<&UserCaller> {
        caller.user().ok_or_else(|| {
            ServerError::Forbidden("this route is for users, not for node credentials".into())
        })
    }
}

/// Longest a body of a JSON request may be (task specs, manifests of large projects).
pub(crate) const MAX_JSON_BYTES: usize = 32 << 20;
/// Largest chunk upload accepted (the chunker's maximum is 256 KiB; zstd can only shrink
/// it, and a compressed chunk that grows past this is refused before decompression).
pub(crate) const MAX_CHUNK_BYTES: usize = 1 << 20;
/// Largest secret value body.
pub(crate) const MAX_SECRET_BODY: usize = crate::secrets::MAX_SECRET_BYTES;

/// What every handler is given: one `Arc`, so that axum's clone of the state for each
/// request, middleware layer and extractor is one reference count, not one per service.
#[derive(Clone)]
pub(crate) struct AppState(Arc<AppParts>);

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// The services behind [`AppState`].
pub(crate) struct AppParts {
    pub(crate) control: Arc<Control>,
    pub(crate) shutdown: CancellationToken,
    /// The embedded cluster's stop (`tcloud down`); `None` for a plain server.
    pub(crate) cluster_stop: Option<Arc<crate::cluster_stop::ClusterStop>>,
    rules: Arc<HashMap<(Method, &'static str), Access>>,
    /// The dashboard's signed-in browsers.
    pub(crate) sessions: Arc<dashboard::Sessions>,
    /// Whether session cookies are marked `Secure` (the server speaks TLS).
    pub(crate) secure_cookies: bool,
    /// Open interactive sessions (`tcloud exec`, `shell`, `port-forward`).
    pub(crate) interactive: Arc<crate::sessions::Sessions>,
    /// Usage reports and fair-share standing.
    pub(crate) accounting: crate::accounting::Accounting,
    /// The Prometheus scrape.
    pub(crate) metrics: crate::metrics::MetricsExport,
    /// What tasks use (`tcloud top`, `show`, the dashboard).
    pub(crate) usage: crate::usage::UsageService,
    /// The per-user gate in front of every submission.
    pub(crate) submissions: crate::limits::SubmissionGate,
    /// Which chunks a node may read.
    pub(crate) chunk_access: crate::agent_access::ChunkAccess,
    /// Chunk garbage collection.
    pub(crate) artifacts: crate::artifacts::Artifacts,
    /// Who may register a node, and enrolled nodes' credentials.
    pub(crate) enrolments: crate::enrolment::Enrolments,
    /// Start estimates: the queue's projection, what-ifs of submissions.
    pub(crate) estimates: crate::control::Estimates,
    /// Pipelines submitted.
    pub(crate) pipelines: crate::control::Pipelines,
    /// Sweeps submitted.
    pub(crate) sweeps: crate::control::Sweeps,
    /// Arrays submitted, groups cancelled and rerun.
    pub(crate) arrays: crate::control::Arrays,
}

/// One route as declared: method, path pattern and the access rule the guard enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
}

type Declared = (RouteRule, MethodRouter<AppState>);

fn rule(
    method: Method,
    path: &'static str,
    access: Access,
    handler: MethodRouter<AppState>,
) -> Declared {
    (
        RouteRule {
            method,
            path,
            access,
        },
        handler,
    )
}

/// Every route of the API with its access rule: the single list the router is built from.
fn declare() -> Vec<Declared> {
    use Access::*;
    use Method as M;
    vec![
        rule(M::GET, "/v1/health", Public, get(cluster::health)),
        rule(M::GET, "/v1/openapi.json", Public, get(openapi::serve)),
        rule(M::GET, "/v1/whoami", User, get(cluster::whoami)),
        rule(M::GET, "/metrics", Metrics, get(metrics::scrape)),
        rule(M::POST, "/v1/tasks", User, post(tasks::submit)),
        rule(M::POST, "/v1/estimate", User, post(tasks::estimate)),
        rule(M::GET, "/v1/tasks", User, get(tasks::list_tasks)),
        rule(M::GET, "/v1/tasks/{id}", Task, get(tasks::get_task)),
        rule(
            M::GET,
            "/v1/tasks/{id}/events",
            Task,
            get(tasks::task_events),
        ),
        rule(
            M::POST,
            "/v1/tasks/{id}/cancel",
            Task,
            post(tasks::cancel_task),
        ),
        rule(M::GET, "/v1/tasks/{id}/logs", Task, get(logs::task_logs)),
        rule(
            M::GET,
            "/v1/tasks/{id}/instruction",
            Task,
            get(tasks::task_instruction),
        ),
        rule(M::GET, "/v1/tasks/{id}/why", Task, get(tasks::explain_task)),
        rule(M::GET, "/v1/tasks/{id}/usage", Task, get(usage::task_usage)),
        rule(
            M::POST,
            "/v1/tasks/{id}/rerun",
            Task,
            post(tasks::rerun_task),
        ),
        rule(
            M::GET,
            "/v1/tasks/{id}/outputs",
            Task,
            get(outputs::list_outputs),
        ),
        rule(
            M::GET,
            "/v1/tasks/{id}/outputs/{attempt}/{*path}",
            Task,
            get(outputs::get_output),
        ),
        rule(M::GET, "/v1/tasks/{id}/files", Task, get(files::list_files)),
        rule(
            M::GET,
            "/v1/tasks/{id}/files/content",
            Task,
            get(files::get_file),
        ),
        // Interactive sessions: the task's owner, their group admin and admins only; a
        // node credential is told the task does not exist.
        rule(
            M::GET,
            "/v1/tasks/{id}/session",
            TaskSession,
            get(sessions::open_session),
        ),
        rule(
            M::POST,
            "/v1/snapshots/offer",
            User,
            post(snapshots::offer_snapshot),
        ),
        rule(
            M::POST,
            "/v1/snapshots/commit",
            User,
            post(snapshots::commit_snapshot),
        ),
        rule(
            M::GET,
            "/v1/snapshots/{id}",
            Snapshot,
            get(snapshots::get_snapshot),
        ),
        rule(M::PUT, "/v1/chunks/{hash}", User, put(snapshots::put_chunk)),
        rule(
            M::GET,
            "/v1/chunks/{hash}",
            Chunk,
            get(snapshots::get_chunk),
        ),
        rule(M::GET, "/v1/groups", User, get(groups::list_groups)),
        rule(M::GET, "/v1/groups/{id}", Group, get(groups::get_group)),
        rule(
            M::GET,
            "/v1/groups/{id}/sweep",
            Group,
            get(groups::get_sweep),
        ),
        rule(
            M::POST,
            "/v1/groups/{id}/cancel",
            Group,
            post(groups::cancel_group),
        ),
        rule(
            M::POST,
            "/v1/groups/{id}/rerun",
            Group,
            post(groups::rerun_group),
        ),
        rule(
            M::POST,
            "/v1/pipelines",
            User,
            post(pipelines::submit_pipeline),
        ),
        rule(M::GET, "/v1/history", User, get(groups::history)),
        rule(M::GET, "/v1/usage", User, get(accounting::usage_report)),
        rule(
            M::GET,
            "/v1/usage/fairshare",
            User,
            get(accounting::fairshare_report),
        ),
        rule(M::GET, "/v1/datasets", User, get(cluster::list_datasets)),
        rule(M::GET, "/v1/nodes", User, get(cluster::list_nodes)),
        rule(M::GET, "/v1/secrets", User, get(secrets::list_secrets)),
        rule(M::PUT, "/v1/secrets/{name}", User, put(secrets::put_secret)),
        rule(
            M::DELETE,
            "/v1/secrets/{name}",
            User,
            delete(secrets::delete_secret),
        ),
        rule(
            M::POST,
            "/v1/admin/gc",
            Admin,
            post(cluster::collect_garbage),
        ),
        rule(M::GET, "/v1/admin/users", Admin, get(admin::list_users)),
        rule(M::POST, "/v1/admin/users", Admin, post(admin::create_user)),
        rule(M::GET, "/v1/admin/tokens", Admin, get(admin::list_tokens)),
        rule(
            M::POST,
            "/v1/admin/tokens",
            Admin,
            post(admin::create_token),
        ),
        rule(
            M::POST,
            "/v1/admin/tokens/{id}/revoke",
            Admin,
            post(admin::revoke_token),
        ),
        rule(
            M::POST,
            "/v1/admin/agent-tokens",
            Admin,
            post(admin::create_agent_token),
        ),
        rule(M::GET, "/v1/admin/audit", Admin, get(admin::audit)),
        rule(
            M::POST,
            "/v1/admin/cluster/stop",
            Admin,
            post(cluster_stop::stop),
        ),
        rule(
            M::GET,
            "/v1/admin/cluster/stop",
            Admin,
            get(cluster_stop::progress),
        ),
        rule(
            M::POST,
            "/v1/admin/nodes/{name}/drain",
            Admin,
            post(admin::drain_node),
        ),
        rule(
            M::POST,
            "/v1/admin/nodes/{name}/resume",
            Admin,
            post(admin::resume_node),
        ),
        rule(
            M::POST,
            "/v1/admin/nodes/{name}/approve",
            Admin,
            post(admin::approve_node),
        ),
        rule(
            M::DELETE,
            "/v1/admin/nodes/{name}",
            Admin,
            delete(admin::remove_node),
        ),
        rule(
            M::POST,
            "/v1/agents/register",
            Register,
            post(agents::register_agent),
        ),
        rule(
            M::POST,
            "/v1/agents/{node}/work",
            OwnNode,
            post(agents::agent_work),
        ),
        rule(
            M::POST,
            "/v1/agents/{node}/reports",
            OwnNode,
            post(agents::agent_reports),
        ),
        rule(
            M::GET,
            "/v1/agents/{node}/inputs/{task}/{attempt}/{index}",
            OwnNode,
            get(pipelines::get_input),
        ),
        rule(
            M::PUT,
            "/v1/agents/{node}/outputs/{task}/{attempt}/{*path}",
            OwnNode,
            put(outputs::put_output),
        ),
        rule(
            M::POST,
            "/v1/agents/{node}/answers/{request}",
            OwnNode,
            post(files::post_answer),
        ),
        rule(
            M::PUT,
            "/v1/agents/{node}/answers/{request}/file",
            OwnNode,
            put(files::put_answer_file),
        ),
        rule(
            M::GET,
            "/v1/agents/{node}/sessions/{session}",
            OwnNode,
            get(sessions::agent_session),
        ),
        // The web dashboard: the same rules, a session cookie instead of the bearer
        // header (see `dashboard`).
        rule(M::GET, "/", Public, get(dashboard::root)),
        rule(M::GET, "/ui", Public, get(dashboard::ui_root)),
        rule(M::GET, "/ui/login", Public, get(dashboard::login_form)),
        rule(M::POST, "/ui/login", Public, post(dashboard::login)),
        rule(M::POST, "/ui/logout", User, post(dashboard::logout)),
        rule(M::GET, "/ui/assets/{file}", Public, get(dashboard::asset)),
        rule(M::GET, "/ui/", User, get(dashboard::cluster)),
        rule(M::GET, "/ui/queue", User, get(dashboard::queue)),
        rule(M::GET, "/ui/accounts", User, get(dashboard::accounts_page)),
        rule(M::GET, "/ui/tasks/{id}", Task, get(dashboard::task)),
        rule(
            M::POST,
            "/ui/tasks/{id}/cancel",
            Task,
            post(dashboard::cancel),
        ),
    ]
}

/// The declared routes and their rules (what the authorisation tests enumerate).
pub fn route_rules() -> Vec<RouteRule> {
    declare().into_iter().map(|(rule, _)| rule).collect()
}

/// Request bodies past these sizes are refused with 413 before they are read: from the
/// `Content-Length` header at once, or as soon as a streamed body passes the limit.
pub(crate) fn body_limit(path: &str) -> Option<usize> {
    match path {
        "/v1/chunks/{hash}" => Some(MAX_CHUNK_BYTES),
        "/v1/secrets/{name}" => Some(MAX_SECRET_BODY),
        // Agents size their report batches below this (see the agent's reporter).
        "/v1/agents/{node}/reports" => Some(tacc_proto::MAX_REPORTS_BODY_BYTES),
        // Outputs stream to disk: bounded by the node's own disk, not by memory.
        "/v1/agents/{node}/outputs/{task}/{attempt}/{*path}" => None,
        "/v1/agents/{node}/answers/{request}/file" => {
            Some(tacc_proto::MAX_LIVE_FILE_BYTES as usize)
        }
        _ => Some(MAX_JSON_BYTES),
    }
}

/// [`router`] of the leading server, and beside it, until `shutdown`, the check that
/// ends idle dev sessions (it reads the sessions this API opens).
pub(crate) fn leader_router(
    control: Arc<Control>,
    shutdown: CancellationToken,
    secure_cookies: bool,
    cluster_stop: Option<Arc<crate::cluster_stop::ClusterStop>>,
) -> Router {
    let interactive = Arc::new(crate::sessions::Sessions::new(control.config.sessions));
    tokio::spawn(crate::dev_idle::run(
        control.clone(),
        interactive.clone(),
        shutdown.clone(),
    ));
    router_with(control, shutdown, secure_cookies, cluster_stop, interactive)
}

/// The API and the dashboard; `secure_cookies` when served over TLS; `cluster_stop` when
/// the server embeds its cluster (`taccd dev`).
pub fn router(
    control: Arc<Control>,
    shutdown: CancellationToken,
    secure_cookies: bool,
    cluster_stop: Option<Arc<crate::cluster_stop::ClusterStop>>,
) -> Router {
    let interactive = Arc::new(crate::sessions::Sessions::new(control.config.sessions));
    router_with(control, shutdown, secure_cookies, cluster_stop, interactive)
}

fn router_with(
    control: Arc<Control>,
    shutdown: CancellationToken,
    secure_cookies: bool,
    cluster_stop: Option<Arc<crate::cluster_stop::ClusterStop>>,
    interactive: Arc<crate::sessions::Sessions>,
) -> Router {
    let declared = declare();
    let rules = declared
        .iter()
        .map(|(rule, _)| ((rule.method.clone(), rule.path), rule.access))
        .collect();
    let state = AppState(Arc::new(AppParts {
        control: control.clone(),
        shutdown,
        cluster_stop,
        rules: Arc::new(rules),
        sessions: Arc::new(dashboard::Sessions::kept(dashboard::Keeping {
            store: control.store.clone(),
            seal: control.secret_box.clone(),
        })),
        secure_cookies,
        interactive,
        accounting: crate::accounting::Accounting::of(&control),
        metrics: crate::metrics::MetricsExport::of(&control),
        usage: crate::usage::UsageService::of(&control),
        submissions: crate::limits::SubmissionGate::of(&control),
        chunk_access: crate::agent_access::ChunkAccess::of(&control),
        artifacts: crate::artifacts::Artifacts::of(&control),
        enrolments: crate::enrolment::Enrolments::of(&control),
        estimates: crate::control::Estimates::of(&control),
        pipelines: crate::control::Pipelines::of(&control),
        sweeps: crate::control::Sweeps::of(&control),
        arrays: crate::control::Arrays::of(&control),
    }));
    // What every answer waits for: the control plane's store synced, the sync timed.
    let durable: Arc<dyn durable::Durable> = Arc::new(durable::StoreSync::new(
        control.store.clone(),
        control.metrics.clone(),
    ));
    let mut router = Router::new();
    for (rule, handler) in declared {
        // The guard refuses a declared length past the limit before reading anything;
        // this bounds bodies sent without a length while they are read.
        let handler = match body_limit(rule.path) {
            Some(limit) => handler.layer(axum::extract::DefaultBodyLimit::max(limit)),
            None => handler.layer(axum::extract::DefaultBodyLimit::disable()),
        };
        router = router.route(rule.path, handler);
    }
    router
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        // Answers wait for their changes to be durable, many requests per sync.
        .layer(axum::middleware::from_fn_with_state(
            durable,
            durable::durable_answers,
        ))
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            name_data_dir,
        ))
        // Outermost: refusals, 404s and disk-full replies carry the headers too.
        .layer(axum::middleware::from_fn(headers::security_headers))
        .with_state(state)
}

impl ServerError {
    /// The HTTP status of this error.
    pub(crate) fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    /// The HTTP status and the stable error code of this error.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ServerError::TaskNotFound(_)
            | ServerError::GroupNotFound(_)
            | ServerError::NodeNotFound(_)
            | ServerError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ServerError::NodeNotRegistered(_) => (StatusCode::CONFLICT, "node_not_registered"),
            ServerError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ServerError::InvalidTask(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_task"),
            ServerError::Unsupported(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unsupported"),
            ServerError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ServerError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            ServerError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ServerError::ReenrolRequired(_) => (StatusCode::FORBIDDEN, "reenrol_required"),
            ServerError::TooManyRequests { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_requests")
            }
            ServerError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ServerError::NodeTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, "node_timeout"),
            ServerError::StorageFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
            ServerError::Store(e) => match e.storage_fault() {
                Some(StorageFault::Full) => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
                Some(StorageFault::Unavailable) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                None => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            },
            ServerError::Internal(_) | ServerError::Config(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        }
    }
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        let retry_after = match &self {
            ServerError::TooManyRequests {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        };
        let message = match &self {
            ServerError::Store(e) => match e.storage_fault() {
                Some(StorageFault::Full) => ServerError::StorageFull(e.to_string()).to_string(),
                Some(StorageFault::Unavailable) => format!(
                    "the server's database is unavailable ({e}); this is the server's fault, \
                     not your request's: retry shortly (tcloud retries by itself)"
                ),
                None => self.to_string(),
            },
            _ => self.to_string(),
        };
        let full = status == StatusCode::INSUFFICIENT_STORAGE;
        let body = ApiError {
            code: code.into(),
            message: message.clone(),
        };
        let mut response = (status, Json(body)).into_response();
        if full {
            response.extensions_mut().insert(DataDirFault(message));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tacc\""),
            );
        }
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

pub(crate) type ApiResult<T> = Result<T, ServerError>;

/// Marks a reply about the server's data directory (disk full), with its message: the
/// error knows no paths, so [`name_data_dir`] adds which directory before it is sent.
#[derive(Debug, Clone)]
struct DataDirFault(String);

/// Name the server's data directory in a disk-full reply, for the operator to act on.
async fn name_data_dir(State(app): State<AppState>, response: Response) -> Response {
    let Some(DataDirFault(message)) = response.extensions().get::<DataDirFault>().cloned() else {
        return response;
    };
    let dir = app.control.config.data_dir.display().to_string();
    let body = ApiError {
        code: "storage_full".into(),
        message: message.replace(
            "the server's data directory",
            &format!("the server's data directory {dir}"),
        ),
    };
    (response.status(), Json(body)).into_response()
}

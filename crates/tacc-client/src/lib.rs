//! `tacc-client`: the Rust SDK of TACC's HTTP API v1, used by `tcloud` and by node agents.
//!
//! It speaks only the wire types of `tacc-proto` and knows nothing of the scheduler, the
//! store or how tasks run. Every error says which server it tried and what to do next.
//! `https://` servers are trusted by the web PKI, by a given CA, or by a pinned
//! certificate fingerprint (see [`tls`]).

pub mod tls;

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use tacc_core::{AttemptNo, NodeId, SnapshotId, TaskId, TaskState};
use tacc_proto::{
    AgentRegistered, AgentReport, ApiError, AttemptRef, CancelReply, DesiredWork, Health, NodeView,
    OutputFile, RegisterAgent, SnapshotCommitted, SnapshotOffer, SnapshotOfferReply, SubmitReply,
    SubmitTask, TaskEventView, TaskExplanation, TaskView, WorkPoll,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the TACC server at {url}: {reason}")]
    Unreachable {
        url: String,
        reason: String,
        /// The server's host answered that nothing listens there: the server is down,
        /// not cut off by the network.
        refused: bool,
    },
    /// The server accepted the connection (or not) but gave no answer in time: it is
    /// stopped, overloaded, or the network drops packets.
    #[error(
        "no answer from {url} within {secs} s{while_}; is taccd running there (not stopped or \
         overloaded)? Raise the limit with --timeout / --connect-timeout for a slow server",
        while_ = if *.connecting { " while connecting" } else { "" }
    )]
    TimedOut {
        url: String,
        secs: u64,
        connecting: bool,
    },
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected answer from {url}: {reason}")]
    Protocol { url: String, reason: String },
    /// TLS failed or is misconfigured: an untrusted or unpinned certificate, a bad pin.
    /// Retrying does not help; the trust settings must change.
    #[error("no secure connection to the TACC server at {url}: {reason}")]
    Tls { url: String, reason: String },
}

impl ClientError {
    /// True when the server could not be contacted at all, or gave no answer in time.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::TimedOut { .. }
        )
    }
    /// True when the server's host refused the connection (no server runs there now),
    /// as opposed to a network that does not carry the request.
    pub fn is_refused(&self) -> bool {
        matches!(self, ClientError::Unreachable { refused: true, .. })
    }
    /// Whether the same request may be sent again with the same idempotency key: the
    /// server was not reached, did not answer in time, or answered 502/503/504.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::TimedOut { .. } => true,
            ClientError::Api { status, .. } => matches!(status, 502..=504),
            ClientError::Protocol { .. } | ClientError::Tls { .. } => false,
        }
    }
    /// The API error code (`not_found`, `invalid_task`, …), when the server answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A connection to one TACC server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    /// The bearer token sent with every request; `None` only for anonymous calls
    /// (health, or a test proving that the server refuses them).
    /// Shared by clones, so an agent that receives its node credential switches every
    /// clone of its client at once.
    token: std::sync::Arc<std::sync::RwLock<Option<String>>>,
    http: reqwest::Client,
    /// The trust the HTTP client was built with, kept to rebuild it with other timeouts.
    tls: Option<rustls::ClientConfig>,
    timeouts: Timeouts,
}

/// How long a client waits for the server. Long polls and streams (log follow, agent
/// work) have their own limits and are never cut by `request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open a connection.
    pub connect: Duration,
    /// For a whole request and its answer; `None`: no limit.
    pub request: Option<Duration>,
    /// How many times a mutating request (submit, cancel, rerun) is sent at most, with
    /// the same idempotency key, while the server is unreachable, silent or answers
    /// 502/503/504.
    pub attempts: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            request: None,
            attempts: 5,
        }
    }
}

/// The pause before retry `attempt` (1-based) of a keyed request: doubling from 250 ms,
/// at most 4 s, so five attempts span about 7.5 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << attempt.min(5).saturating_sub(1)))
        .min(Duration::from_secs(4))
}

/// A fresh idempotency key: 128 random bits in hex.
fn fresh_key() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the innermost cause of `error` is a refused connection.
fn refused(error: &reqwest::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Filter of [`Client::list_tasks`].
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub states: Vec<TaskState>,
    pub user: Option<String>,
    pub limit: Option<u32>,
    /// Only tasks that are no group's element.
    pub ungrouped: bool,
}

/// Filter of [`Client::history`].
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    pub name: Option<String>,
    pub states: Vec<TaskState>,
    pub since: Option<tacc_core::Timestamp>,
    pub user: Option<String>,
    /// The `next` of the previous page.
    pub before: Option<String>,
    pub limit: Option<u32>,
}

impl Client {
    /// `base` is the server's URL, e.g. `http://127.0.0.1:8383`. Requests are anonymous
    /// until a token is given with [`Client::with_token`].
    pub fn new(base: &str) -> Self {
        let timeouts = Timeouts::default();
        Client {
            base: base.trim_end_matches('/').to_string(),
            token: Default::default(),
            http: http_client(None, timeouts.connect),
            tls: None,
            timeouts,
        }
    }

    /// The same server with other [`Timeouts`].
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.http = http_client(self.tls.clone(), timeouts.connect);
        self.timeouts = timeouts;
        self
    }

    /// The same server, trusted only if it presents exactly the certificate whose DER
    /// has this SHA-256 `fingerprint` (hex, `:` separators allowed): the way to trust a
    /// self-signed certificate made by `taccd admin tls-init`. Needs an `https://` URL.
    pub fn with_pinned_fingerprint(mut self, fingerprint: &str) -> Result<Self> {
        let config = tls::parse_fingerprint(fingerprint)
            .and_then(|pin| self.require_https().map(|()| pin))
            .and_then(tls::pinned_config)
            .map_err(|reason| self.tls_error(reason))?;
        self.http = http_client(Some(config.clone()), self.timeouts.connect);
        self.tls = Some(config);
        Ok(self)
    }

    /// The same server, trusted only if its certificate is signed by a CA in `pem` (PEM
    /// text, one or more certificates) instead of the web PKI. Needs an `https://` URL.
    pub fn with_ca(mut self, pem: &[u8]) -> Result<Self> {
        let config = self
            .require_https()
            .and_then(|()| tls::ca_config(pem))
            .map_err(|reason| self.tls_error(reason))?;
        self.http = http_client(Some(config.clone()), self.timeouts.connect);
        self.tls = Some(config);
        Ok(self)
    }

    /// A pin or CA on a plain-HTTP URL would protect nothing while seeming to.
    fn require_https(&self) -> std::result::Result<(), String> {
        if self.base.starts_with("https://") {
            Ok(())
        } else {
            Err(format!(
                "a pinned certificate or CA needs an https:// URL, not {}",
                self.base
            ))
        }
    }

    fn tls_error(&self, reason: String) -> ClientError {
        ClientError::Tls {
            url: self.base.clone(),
            reason,
        }
    }

    /// The same server, with `token` (`tacc_…`) sent as `Authorization: Bearer`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = std::sync::Arc::new(std::sync::RwLock::new(Some(token.into())));
        self
    }

    /// Replace the token of this client and of every clone of it.
    pub fn set_token(&self, token: impl Into<String>) {
        *self.token.write().unwrap() = Some(token.into());
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request cut after the request timeout, if one is set.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.untimed(method, path);
        match self.timeouts.request {
            Some(limit) => request.timeout(limit),
            None => request,
        }
    }

    /// A request without the request timeout: streams, long polls, large transfers.
    fn untimed(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match self.token.read().unwrap().as_deref() {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    fn unreachable(&self, error: reqwest::Error) -> ClientError {
        if let Some(reason) = tls::explain(&error) {
            return self.tls_error(reason);
        }
        let refused = refused(&error);
        if error.is_timeout() {
            let connecting = error.is_connect();
            let limit = if connecting {
                Some(self.timeouts.connect)
            } else {
                self.timeouts.request
            };
            if let Some(limit) = limit {
                return ClientError::TimedOut {
                    url: self.base.clone(),
                    secs: limit.as_secs_f64().ceil() as u64,
                    connecting,
                };
            }
        }
        let reason = if refused {
            "connection refused (is the server running?)".to_string()
        } else if error.is_connect() {
            "connection refused or host unreachable".to_string()
        } else if error.is_timeout() {
            "timed out".to_string()
        } else {
            // The innermost cause is the most telling (e.g. "Connection reset by peer").
            let mut source: &dyn std::error::Error = &error;
            while let Some(next) = source.source() {
                source = next;
            }
            source.to_string()
        };
        ClientError::Unreachable {
            url: self.base.clone(),
            reason,
            refused,
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<reqwest::Response> {
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        Err(match serde_json::from_slice::<ApiError>(&body) {
            Ok(error) => ClientError::Api {
                status: status.as_u16(),
                code: error.code,
                message: error.message,
            },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                code: status_code_name(status),
                message: format!(
                    "the server answered {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                ),
            },
        })
    }

    /// Send a mutating request with a fresh `Idempotency-Key`, again with the same key
    /// while the failure is transient: the server does the work once and answers every
    /// retry with the first reply.
    async fn keyed_json<T: DeserializeOwned>(
        &self,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<T> {
        let key = fresh_key();
        self.retried(|| self.json(build().header("Idempotency-Key", key.as_str())))
            .await
    }

    /// Run a request that is safe to repeat (idempotent by itself, or keyed) again while
    /// its failure is transient, up to `Timeouts::attempts` times with [`backoff`].
    async fn retried<T, Fut>(&self, mut once: impl FnMut() -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut attempt = 1;
        loop {
            match once().await {
                Err(error) if error.is_transient() && attempt < self.timeouts.attempts => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T> {
        let response = self.send(request).await?;
        let url = response.url().to_string();
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol {
            url,
            reason: e.to_string(),
        })
    }

    pub async fn health(&self) -> Result<Health> {
        self.json(self.request(Method::GET, "/v1/health")).await
    }

    // ------------------------------------------------------------ snapshots

    pub async fn offer_snapshot(&self, manifest: serde_json::Value) -> Result<SnapshotOfferReply> {
        // Only asks which chunks the server lacks: safe to repeat.
        let offer = SnapshotOffer { manifest };
        self.retried(|| {
            self.json(
                self.request(Method::POST, "/v1/snapshots/offer")
                    .json(&offer),
            )
        })
        .await
    }

    /// Upload one chunk, zstd-compressed on the wire. A chunk is named by its hash, so
    /// sending it again stores nothing twice: it is retried like a keyed request.
    pub async fn put_chunk(&self, hash: &str, compressed: Vec<u8>) -> Result<()> {
        let compressed = Bytes::from(compressed);
        self.retried(|| {
            self.send(
                self.request(Method::PUT, &format!("/v1/chunks/{hash}"))
                    .header(reqwest::header::CONTENT_ENCODING, "zstd")
                    .body(compressed.clone()),
            )
        })
        .await?;
        Ok(())
    }

    pub async fn commit_snapshot(&self, manifest: serde_json::Value) -> Result<SnapshotCommitted> {
        // Recording a snapshot's manifest again changes nothing: safe to repeat.
        let offer = SnapshotOffer { manifest };
        self.retried(|| {
            self.json(
                self.request(Method::POST, "/v1/snapshots/commit")
                    .json(&offer),
            )
        })
        .await
    }

    pub async fn get_snapshot(&self, id: &SnapshotId) -> Result<serde_json::Value> {
        self.json(self.request(Method::GET, &format!("/v1/snapshots/{id}")))
            .await
    }

    pub async fn get_chunk(&self, hash: &str) -> Result<Bytes> {
        let response = self
            .send(self.request(Method::GET, &format!("/v1/chunks/{hash}")))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    // ------------------------------------------------------------ tasks

    pub async fn submit(&self, task: &SubmitTask) -> Result<SubmitReply> {
        self.keyed_json(|| self.request(Method::POST, "/v1/tasks").json(task))
            .await
    }

    /// Submit a whole pipeline (every stage's code already uploaded).
    pub async fn submit_pipeline(
        &self,
        pipeline: &tacc_proto::SubmitPipeline,
    ) -> Result<tacc_proto::PipelineSubmitted> {
        self.keyed_json(|| self.request(Method::POST, "/v1/pipelines").json(pipeline))
            .await
    }

    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<Vec<TaskView>> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if !query.states.is_empty() {
            let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
            params.push(("state", states.join(",")));
        }
        if let Some(user) = &query.user {
            params.push(("user", user.clone()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        if query.ungrouped {
            params.push(("ungrouped", "true".into()));
        }
        self.json(self.request(Method::GET, "/v1/tasks").query(&params))
            .await
    }

    /// Task groups: those with unfinished elements and the latest ones, or every one.
    pub async fn list_groups(
        &self,
        all: bool,
        user: Option<&str>,
    ) -> Result<Vec<tacc_proto::GroupView>> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if all {
            params.push(("all", "true".into()));
        }
        if let Some(user) = user {
            params.push(("user", user.to_string()));
        }
        self.json(self.request(Method::GET, "/v1/groups").query(&params))
            .await
    }

    pub async fn get_group(&self, id: tacc_core::GroupId) -> Result<tacc_proto::GroupDetail> {
        self.json(self.request(Method::GET, &format!("/v1/groups/{id}")))
            .await
    }

    /// A group's counts without its elements (cheap to poll, whatever its size).
    pub async fn group_summary(&self, id: tacc_core::GroupId) -> Result<tacc_proto::GroupView> {
        let detail: tacc_proto::GroupDetail = self
            .json(
                self.request(Method::GET, &format!("/v1/groups/{id}"))
                    .query(&[("elements", "false")]),
            )
            .await?;
        Ok(detail.group)
    }

    /// A sweep's leaderboard, best trial first.
    pub async fn sweep(&self, id: tacc_core::GroupId) -> Result<tacc_proto::SweepBoard> {
        self.json(self.request(Method::GET, &format!("/v1/groups/{id}/sweep")))
            .await
    }

    pub async fn cancel_group(
        &self,
        id: tacc_core::GroupId,
    ) -> Result<tacc_proto::GroupCancelReply> {
        self.json(self.request(Method::POST, &format!("/v1/groups/{id}/cancel")))
            .await
    }

    /// Submit again the elements of a group that failed, were cancelled or were lost.
    pub async fn rerun_group_failed(&self, id: tacc_core::GroupId) -> Result<SubmitReply> {
        self.json(
            self.request(Method::POST, &format!("/v1/groups/{id}/rerun"))
                .json(&tacc_proto::GroupRerun { failed: true }),
        )
        .await
    }

    /// One page of ended tasks, newest end first.
    pub async fn history(&self, query: &HistoryQuery) -> Result<tacc_proto::HistoryPage> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(name) = &query.name {
            params.push(("name", name.clone()));
        }
        if !query.states.is_empty() {
            let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
            params.push(("state", states.join(",")));
        }
        if let Some(since) = query.since {
            params.push(("since", since.as_millis().to_string()));
        }
        if let Some(user) = &query.user {
            params.push(("user", user.clone()));
        }
        if let Some(before) = &query.before {
            params.push(("before", before.clone()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.json(self.request(Method::GET, "/v1/history").query(&params))
            .await
    }

    pub async fn get_task(&self, id: TaskId) -> Result<TaskView> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}")))
            .await
    }

    /// What the task's ranks use now, their peaks, and its flags (`tcloud top`).
    pub async fn task_usage(&self, id: TaskId) -> Result<tacc_proto::TaskUsage> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/usage")))
            .await
    }

    /// Allocated resource-hours by user or group over a window (`tcloud usage`).
    pub async fn usage_report(
        &self,
        query: &tacc_proto::UsageQuery,
    ) -> Result<tacc_proto::UsageReport> {
        self.json(self.request(Method::GET, "/v1/usage").query(query))
            .await
    }

    /// The scheduler's fair-share standing (`tcloud usage --fairshare`).
    pub async fn fairshare_report(&self) -> Result<tacc_proto::FairShareReport> {
        self.json(self.request(Method::GET, "/v1/usage/fairshare"))
            .await
    }

    pub async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEventView>> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/events")))
            .await
    }

    pub async fn explain(&self, id: TaskId) -> Result<TaskExplanation> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/why")))
            .await
    }

    pub async fn task_instruction(&self, id: TaskId) -> Result<serde_json::Value> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/instruction")))
            .await
    }

    /// Submit task `id` again (same snapshot, environment and datasets) as a new task.
    pub async fn rerun(&self, id: TaskId) -> Result<SubmitReply> {
        self.keyed_json(|| self.request(Method::POST, &format!("/v1/tasks/{id}/rerun")))
            .await
    }

    /// Datasets the administrator registered.
    pub async fn list_datasets(&self) -> Result<Vec<tacc_proto::DatasetView>> {
        self.json(self.request(Method::GET, "/v1/datasets")).await
    }

    /// Run one chunk garbage-collection pass on the server now.
    pub async fn collect_garbage(&self) -> Result<tacc_proto::GcReport> {
        self.json(self.request(Method::POST, "/v1/admin/gc")).await
    }

    pub async fn cancel(&self, id: TaskId) -> Result<CancelReply> {
        self.keyed_json(|| self.request(Method::POST, &format!("/v1/tasks/{id}/cancel")))
            .await
    }

    /// The log from `offset` to its current end, and the offset just past it.
    pub async fn logs(&self, id: TaskId, offset: u64) -> Result<(Bytes, u64)> {
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/tasks/{id}/logs"))
                    .query(&[("offset", offset.to_string())]),
            )
            .await?;
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        let end = offset + body.len() as u64;
        Ok((body, end))
    }

    /// Stream the log from `offset` until the task has ended and all output was sent.
    pub async fn follow_logs(
        &self,
        id: TaskId,
        offset: u64,
    ) -> Result<impl Stream<Item = Result<Bytes>> + use<>> {
        let response = self
            .send(
                self.untimed(Method::GET, &format!("/v1/tasks/{id}/logs"))
                    .query(&[
                        ("offset", offset.to_string()),
                        ("follow", "true".to_string()),
                    ]),
            )
            .await?;
        let base = self.base.clone();
        Ok(response.bytes_stream().map(move |item| {
            item.map_err(|e| ClientError::Unreachable {
                refused: false,
                url: base.clone(),
                reason: format!("the log stream broke: {e}"),
            })
        }))
    }

    pub async fn list_outputs(&self, id: TaskId) -> Result<Vec<OutputFile>> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/outputs")))
            .await
    }

    pub async fn get_output(&self, id: TaskId, attempt: AttemptNo, path: &str) -> Result<Bytes> {
        let response = self
            .send(self.untimed(
                Method::GET,
                &format!("/v1/tasks/{id}/outputs/{attempt}/{path}"),
            ))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// The outputs, and the `(attempt, rank)` pairs whose node has not yet reported the
    /// end of its share (their outputs may still be arriving).
    pub async fn list_outputs_pending(
        &self,
        id: TaskId,
    ) -> Result<(Vec<OutputFile>, Vec<(AttemptNo, u32)>)> {
        let response = self
            .send(self.request(Method::GET, &format!("/v1/tasks/{id}/outputs")))
            .await?;
        let pending = response
            .headers()
            .get(tacc_proto::OUTPUTS_PENDING_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(',')
                    .filter_map(|pair| {
                        let (attempt, rank) = pair.split_once(':')?;
                        Some((AttemptNo(attempt.parse().ok()?), rank.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let url = response.url().to_string();
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        let files = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol {
            url,
            reason: e.to_string(),
        })?;
        Ok((files, pending))
    }

    /// One kept output of one rank.
    pub async fn get_rank_output(
        &self,
        id: TaskId,
        attempt: AttemptNo,
        rank: u32,
        path: &str,
    ) -> Result<Bytes> {
        let response = self
            .send(
                self.untimed(
                    Method::GET,
                    &format!("/v1/tasks/{id}/outputs/{attempt}/{path}"),
                )
                .query(&[("rank", rank)]),
            )
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// A directory of a task: the running attempt's live working directory on the node
    /// of `rank` (0 by default), or the outputs it kept once it has ended (or of
    /// `attempt`).
    pub async fn list_files(
        &self,
        id: TaskId,
        path: &str,
        rank: Option<u32>,
        attempt: Option<AttemptNo>,
    ) -> Result<tacc_proto::FileListing> {
        let mut query = vec![("path", path.to_string())];
        if let Some(rank) = rank {
            query.push(("rank", rank.to_string()));
        }
        if let Some(attempt) = attempt {
            query.push(("attempt", attempt.to_string()));
        }
        self.json(
            self.request(Method::GET, &format!("/v1/tasks/{id}/files"))
                .query(&query),
        )
        .await
    }

    /// One file of a running task's live working directory (bounded in size by the
    /// server: [`tacc_proto::MAX_LIVE_FILE_BYTES`]).
    pub async fn get_live_file(&self, id: TaskId, path: &str, rank: Option<u32>) -> Result<Bytes> {
        let mut query = vec![("path", path.to_string())];
        if let Some(rank) = rank {
            query.push(("rank", rank.to_string()));
        }
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/tasks/{id}/files/content"))
                    .query(&query),
            )
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeView>> {
        self.json(self.request(Method::GET, "/v1/nodes")).await
    }

    // ------------------------------------------------------------ identities

    /// Who the server takes this client's token for.
    pub async fn whoami(&self) -> Result<tacc_proto::WhoAmI> {
        self.json(self.request(Method::GET, "/v1/whoami")).await
    }

    pub async fn create_user(
        &self,
        user: &tacc_proto::CreateUser,
    ) -> Result<tacc_proto::UserCreated> {
        self.json(self.request(Method::POST, "/v1/admin/users").json(user))
            .await
    }

    pub async fn list_users(&self) -> Result<Vec<tacc_proto::UserView>> {
        self.json(self.request(Method::GET, "/v1/admin/users"))
            .await
    }

    pub async fn create_token(
        &self,
        token: &tacc_proto::CreateToken,
    ) -> Result<tacc_proto::TokenIssued> {
        self.json(self.request(Method::POST, "/v1/admin/tokens").json(token))
            .await
    }

    pub async fn list_tokens(&self) -> Result<Vec<tacc_proto::TokenView>> {
        self.json(self.request(Method::GET, "/v1/admin/tokens"))
            .await
    }

    pub async fn revoke_token(&self, id: u64) -> Result<()> {
        self.send(self.request(Method::POST, &format!("/v1/admin/tokens/{id}/revoke")))
            .await?;
        Ok(())
    }

    /// Drain a node (`resume: false`) or let it take tasks again (`resume: true`).
    pub async fn drain_node(&self, name: &str, resume: bool) -> Result<NodeView> {
        let verb = if resume { "resume" } else { "drain" };
        self.json(self.request(Method::POST, &format!("/v1/admin/nodes/{name}/{verb}")))
            .await
    }

    /// Forget a node and revoke its credential.
    pub async fn remove_node(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &format!("/v1/admin/nodes/{name}")))
            .await?;
        Ok(())
    }

    /// A join token with which a new agent can register its node.
    pub async fn create_agent_token(
        &self,
        ttl_secs: Option<u64>,
    ) -> Result<tacc_proto::TokenIssued> {
        let request = self.request(Method::POST, "/v1/admin/agent-tokens");
        let request = match ttl_secs {
            Some(ttl) => request.query(&[("ttl_secs", ttl)]),
            None => request,
        };
        self.json(request).await
    }

    pub async fn audit(&self, limit: u32) -> Result<Vec<tacc_proto::AuditView>> {
        self.json(
            self.request(Method::GET, "/v1/admin/audit")
                .query(&[("limit", limit)]),
        )
        .await
    }

    /// Set (or replace) one of the caller's secrets; the value is never sent back.
    pub async fn put_secret(&self, name: &str, value: Vec<u8>) -> Result<()> {
        self.send(
            self.request(Method::PUT, &format!("/v1/secrets/{name}"))
                .body(value),
        )
        .await?;
        Ok(())
    }

    pub async fn list_secrets(&self) -> Result<Vec<tacc_proto::SecretView>> {
        self.json(self.request(Method::GET, "/v1/secrets")).await
    }

    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &format!("/v1/secrets/{name}")))
            .await?;
        Ok(())
    }

    // ------------------------------------------------------------ agent protocol

    pub async fn register_agent(&self, registration: &RegisterAgent) -> Result<AgentRegistered> {
        self.json(
            self.request(Method::POST, "/v1/agents/register")
                .json(registration),
        )
        .await
    }

    /// Long poll for the node's desired work; answers when it differs from `after`.
    pub async fn agent_work(
        &self,
        node: NodeId,
        after: Option<u64>,
        wait: Duration,
        running: Vec<AttemptRef>,
    ) -> Result<DesiredWork> {
        let poll = WorkPoll {
            after,
            wait_ms: wait.as_millis() as u64,
            running,
        };
        self.json(
            self.request(Method::POST, &format!("/v1/agents/{node}/work"))
                .json(&poll)
                .timeout(wait + Duration::from_secs(30)),
        )
        .await
    }

    /// Deliver reports in order; the answer counts those the server applied and those it
    /// rejected as not belonging to one of this node's current attempts.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: &[AgentReport],
    ) -> Result<tacc_proto::ReportsAck> {
        /// [`AgentReports`], borrowed: a batch is kept for a retry, not copied.
        #[derive(serde::Serialize)]
        struct Borrowed<'a> {
            reports: &'a [AgentReport],
        }
        self.json(
            self.request(Method::POST, &format!("/v1/agents/{node}/reports"))
                .json(&Borrowed { reports }),
        )
        .await
    }

    /// Answer one of the server's questions with a listing or a refusal.
    pub async fn answer_node_request(
        &self,
        node: NodeId,
        request: tacc_proto::NodeRequestId,
        answer: &tacc_proto::NodeAnswer,
    ) -> Result<()> {
        self.send(
            self.request(
                Method::POST,
                &format!("/v1/agents/{node}/answers/{request}"),
            )
            .json(answer),
        )
        .await?;
        Ok(())
    }

    /// Answer one of the server's questions with a file's bytes.
    pub async fn answer_node_file(
        &self,
        node: NodeId,
        request: tacc_proto::NodeRequestId,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/agents/{node}/answers/{request}/file"),
            )
            .body(bytes),
        )
        .await?;
        Ok(())
    }

    /// One input file of a pipeline stage's attempt this node runs (the `index`th of its
    /// assignment's inputs).
    pub async fn get_input(
        &self,
        node: NodeId,
        task: TaskId,
        attempt: AttemptNo,
        index: usize,
    ) -> Result<Bytes> {
        let response = self
            .send(self.untimed(
                Method::GET,
                &format!("/v1/agents/{node}/inputs/{task}/{attempt}/{index}"),
            ))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// Upload one output file, streamed from disk.
    pub async fn put_output(
        &self,
        node: NodeId,
        task: TaskId,
        attempt: AttemptNo,
        path: &str,
        file: tokio::fs::File,
    ) -> Result<()> {
        let length = file.metadata().await.map(|m| m.len()).ok();
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        let mut request = self
            .untimed(
                Method::PUT,
                &format!("/v1/agents/{node}/outputs/{task}/{attempt}/{path}"),
            )
            .body(body);
        if let Some(length) = length {
            request = request.header(reqwest::header::CONTENT_LENGTH, length);
        }
        self.send(request).await?;
        Ok(())
    }
}

/// The HTTP client: `tls` replaces the default trust (the web PKI roots) when given.
fn http_client(tls: Option<rustls::ClientConfig>, connect: Duration) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .connect_timeout(connect)
        .tcp_nodelay(true);
    let builder = match tls {
        Some(config) => builder.use_preconfigured_tls(config),
        None => builder,
    };
    builder
        .build()
        .expect("HTTP client configuration is static")
}

fn status_code_name(status: StatusCode) -> String {
    match status {
        StatusCode::NOT_FOUND => "not_found".into(),
        StatusCode::BAD_REQUEST => "bad_request".into(),
        _ => format!("http_{}", status.as_u16()),
    }
}

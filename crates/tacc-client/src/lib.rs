//! `tacc-client`: the Rust SDK of TACC's HTTP API v1, used by `tcloud` and by node agents.
//!
//! It speaks only the wire types of `tacc-proto` and knows nothing of the scheduler, the
//! store or how tasks run. Every error says which server it tried and what to do next.
//! `https://` servers are trusted by the web PKI, by a given CA, or by a pinned
//! certificate fingerprint (see [`tls`]).
//!
//! This file holds the [`Client`]: its construction and trust, timeouts, retries with an
//! idempotency key, and the error type. The API's calls are methods of `Client` in one
//! module per resource: `tasks`, `groups`, `logs`, `files`, `snapshots`, `usage`,
//! `cluster`, `account`, `admin`, and `agent` for the agent protocol.

mod account;
mod admin;
mod agent;
mod cluster;
mod files;
mod groups;
mod logs;
pub mod sessions;
mod snapshots;
mod tasks;
pub mod tls;
mod usage;

pub use tasks::{HistoryQuery, TaskQuery};

use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use tacc_proto::ApiError;

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
        Err(self.error_of(response).await)
    }

    /// The error a refused request's answer says.
    async fn error_of(&self, response: reqwest::Response) -> ClientError {
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        match serde_json::from_slice::<ApiError>(&body) {
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
        }
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

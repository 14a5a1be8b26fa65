//! Replicated servers on one PostgreSQL database: one leader, any number of followers.
//!
//! Every replica runs the lease loop: a follower tries to take the leadership lease
//! (`Store::try_acquire_lease`) every `renew_every`; the leader renews it as often and
//! believes itself leader only until `renewed at + lease × 4/5` on its own monotonic clock,
//! so a leader paused past its lease (SIGSTOP, a stall) knows it may have lost before it
//! answers anything. Winning the lease raises its fencing epoch: the term's store handle
//! (`Store::for_term`) then checks that epoch in every transaction that changes task
//! state, so a paused old leader that wakes up after a takeover cannot commit
//! (`StoreError::Fenced`), not even once it has won the lease back.
//!
//! Only the leader decides: it recovers the state from the store when it wins (a fresh
//! [`Control`]), runs the scheduler, dispatch, the agent protocol and the background loops,
//! and stops them all when it loses (becoming a follower again; a later win starts afresh).
//! A follower answers reads that the store alone can answer (tasks, groups, history, the
//! identity routes) itself, and **forwards** everything else — writes, the agent protocol,
//! logs and live views — to the leader's advertised URL, streaming both ways. Forwarding
//! rather than redirecting keeps clients and agents unchanged: an HTTP client drops the
//! `Authorization` header on a redirect to another host or port, and a streamed upload
//! cannot be replayed. A forward in flight when the leadership moves is answered 503 (the
//! client retries, with its idempotency key where it has one); with no leader known, 503
//! says a new one is elected within the lease.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use tacc_store::{LeaseClaim, Store};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::{Control, ServerConfig, ServerError};

/// The response header naming the answering replica's role (`leader` or `follower`).
pub const ROLE_HEADER: &str = "x-tacc-replica-role";
/// Marks a forwarded request, so that it is never forwarded again (no loops while the
/// leadership moves).
const FORWARDED_HEADER: &str = "x-tacc-forwarded-by";

/// One replica's part in the election.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// This replica's id in the lease (unique per process).
    pub holder: String,
    /// The URL other replicas forward to while this one leads.
    pub advertise_url: String,
    /// How long a lease lasts unless renewed: the bound on failover.
    pub lease: Duration,
    /// How often the leader renews and followers try to take over.
    pub renew_every: Duration,
}

enum Role {
    Follower {
        /// The current leader's URL, when one is known.
        leader: Option<String>,
    },
    Leader {
        epoch: u64,
        app: axum::Router,
        /// Past this instant the lease may have been taken over.
        valid_until: Instant,
        /// Stops the leader's loops and long polls.
        stop: CancellationToken,
    },
}

struct Replica {
    store: Arc<dyn Store>,
    config: ServerConfig,
    replica: ReplicaConfig,
    follower_app: axum::Router,
    role: RwLock<Role>,
    /// Bumped on every change of role, to end forwards to a leader that is gone.
    changes: watch::Sender<u64>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

/// Serve the API as one replica of several on `store` (PostgreSQL) until `shutdown` is
/// cancelled: follow, forward, and lead when the lease is won.
pub async fn serve_replicated(
    store: Arc<dyn Store>,
    config: ServerConfig,
    replica: ReplicaConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let follower = Control::open_follower(store.clone(), config.clone())?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ServerError::Internal(format!("cannot build the forwarding client: {e}")))?;
    let replica = Arc::new(Replica {
        follower_app: crate::api::router(follower, shutdown.clone(), false, None),
        store,
        config,
        replica,
        role: RwLock::new(Role::Follower { leader: None }),
        changes: watch::channel(0).0,
        http,
        shutdown: shutdown.clone(),
    });
    let elections = tokio::spawn(replica.clone().run_elections());
    let app = axum::Router::new()
        .fallback(front)
        .with_state(replica.clone());
    let limits = replica.config.connections;
    let served = crate::connections::serve(listener, None, app, limits, shutdown).await;
    elections.abort();
    replica.demote("the server is shutting down");
    served.map_err(|e| ServerError::Internal(format!("serving failed: {e}")))
}

/// Every request: to the leader's own API, to the follower's reads, or forwarded.
async fn front(State(replica): State<Arc<Replica>>, request: Request) -> Response {
    enum Route {
        Here(axum::Router, &'static str),
        Forward(String),
        NoLeader,
    }
    let route = {
        replica.demote_if_lapsed();
        let role = replica.role.read().expect("role lock poisoned");
        match &*role {
            Role::Leader { app, .. } => Route::Here(app.clone(), "leader"),
            Role::Follower { .. }
                if answered_by_follower(request.method(), request.uri().path()) =>
            {
                Route::Here(replica.follower_app.clone(), "follower")
            }
            Role::Follower { leader: Some(url) } => Route::Forward(url.clone()),
            Role::Follower { leader: None } => Route::NoLeader,
        }
    };
    let mut response = match route {
        Route::Here(app, role) => {
            let mut response = app.oneshot(request).await.into_response();
            response
                .headers_mut()
                .insert(ROLE_HEADER, HeaderValue::from_static(role));
            return response;
        }
        Route::Forward(_) if request.headers().contains_key(FORWARDED_HEADER) => {
            unavailable("the replica this request was forwarded to no longer leads".into())
        }
        Route::Forward(url) => replica.forward(&url, request).await,
        Route::NoLeader => unavailable(format!(
            "no server leads right now: one is elected within {} s; retry then",
            replica.replica.lease.as_secs_f64().ceil()
        )),
    };
    response
        .headers_mut()
        .insert(ROLE_HEADER, HeaderValue::from_static("follower"));
    response
}

fn unavailable(message: String) -> Response {
    ServerError::Unavailable(message).into_response()
}

/// Reads a follower answers from the store alone; the rest needs the leader's memory
/// (live nodes, the scheduler's reasons, running attempts' files and usage, logs being
/// written, which snapshots a node may fetch) or changes state.
fn answered_by_follower(method: &Method, path: &str) -> bool {
    const STORED: &[&str] = &[
        "/v1/health",
        "/v1/openapi.json",
        "/v1/whoami",
        "/v1/tasks",
        "/v1/groups",
        "/v1/history",
        "/v1/datasets",
        "/v1/secrets",
        "/v1/admin/users",
        "/v1/admin/tokens",
        "/v1/admin/audit",
    ];
    const LIVE: &[&str] = &["/logs", "/why", "/usage", "/files", "/files/content"];
    (method == Method::GET || method == Method::HEAD)
        && STORED.iter().any(|prefix| path.starts_with(prefix))
        && !LIVE.iter().any(|suffix| path.ends_with(suffix))
}

impl Replica {
    /// Try to take the lease (following) or renew it (leading), every `renew_every`.
    async fn run_elections(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.replica.renew_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = tick.tick() => self.elect_once().await,
            }
        }
    }

    async fn elect_once(&self) {
        let asked_at = Instant::now();
        let claim = LeaseClaim {
            holder: self.replica.holder.clone(),
            leader_url: self.replica.advertise_url.clone(),
            now: crate::now(),
            ttl_ms: self.replica.lease.as_millis() as u64,
        };
        self.demote_if_lapsed();
        let leading = match &*self.role.read().expect("role lock poisoned") {
            Role::Leader { epoch, .. } => Some(*epoch),
            Role::Follower { .. } => None,
        };
        match leading {
            Some(epoch) => match self.store.renew_lease(&claim, epoch).await {
                Ok(Some(_)) => {
                    if let Role::Leader { valid_until, .. } =
                        &mut *self.role.write().expect("role lock poisoned")
                    {
                        *valid_until = asked_at + self.trusted_for();
                    }
                }
                Ok(None) => self.demote("another replica took the leadership lease over"),
                Err(e) => tracing::warn!("cannot renew the leadership lease: {e}"),
            },
            None => match self.store.try_acquire_lease(&claim).await {
                Ok(Some(lease)) => self.promote(lease.epoch, asked_at).await,
                Ok(None) => self.learn_leader().await,
                Err(e) => tracing::warn!("cannot ask for the leadership lease: {e}"),
            },
        }
    }

    /// How long after asking for (or renewing) the lease this replica trusts it: less than
    /// the lease, so it stops before another replica may take over.
    fn trusted_for(&self) -> Duration {
        self.replica.lease * 4 / 5
    }

    async fn learn_leader(&self) {
        let leader = match self.store.current_lease().await {
            Ok(lease) => lease
                .filter(|l| !l.expired(crate::now()))
                .map(|l| l.leader_url),
            Err(e) => {
                tracing::warn!("cannot read the leadership lease: {e}");
                return;
            }
        };
        if let Role::Follower { leader: known } =
            &mut *self.role.write().expect("role lock poisoned")
            && *known != leader
        {
            tracing::info!("following the leader at {leader:?}");
            *known = leader;
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Won the lease under `epoch`: recover the state from the store and serve as leader.
    async fn promote(&self, epoch: u64, asked_at: Instant) {
        let started = Instant::now();
        // The term's own handle: once this term ends, nothing of it still under way can
        // commit, even in a later term this replica wins (the election's handle follows
        // every election; this one checks `epoch` alone).
        let store = self
            .store
            .for_term(epoch)
            .unwrap_or_else(|| self.store.clone());
        let control = match Control::open(store, self.config.clone()).await {
            Ok(control) => control,
            Err(e) => {
                // The lease lapses unrenewed and another replica may try.
                tracing::error!("won the leadership lease (epoch {epoch}) but cannot recover: {e}");
                return;
            }
        };
        let stop = self.shutdown.child_token();
        let app = crate::api::leader_router(control.clone(), stop.clone(), false, None);
        let background = crate::spawn_background(control, stop.clone());
        tokio::spawn({
            let stop = stop.clone();
            async move {
                stop.cancelled().await;
                for task in background {
                    task.abort();
                }
            }
        });
        tracing::info!(
            "leading under epoch {epoch} at {} (recovered in {} ms)",
            self.replica.advertise_url,
            started.elapsed().as_millis()
        );
        *self.role.write().expect("role lock poisoned") = Role::Leader {
            epoch,
            app,
            valid_until: asked_at + self.trusted_for(),
            stop,
        };
        self.changes.send_modify(|n| *n += 1);
    }

    /// A leader whose lease it could not renew in time no longer trusts it.
    fn demote_if_lapsed(&self) {
        let lapsed = matches!(
            &*self.role.read().expect("role lock poisoned"),
            Role::Leader { valid_until, .. } if Instant::now() >= *valid_until
        );
        if lapsed {
            self.demote("the leadership lease was not renewed in time");
        }
    }

    fn demote(&self, why: &str) {
        let mut role = self.role.write().expect("role lock poisoned");
        if let Role::Leader { epoch, stop, .. } = &*role {
            tracing::warn!("no longer leading (epoch {epoch}): {why}; following");
            stop.cancel();
            *role = Role::Follower { leader: None };
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Send `request` to the leader at `base` and stream its answer back; 503 when it
    /// does not answer or the leadership moves meanwhile.
    async fn forward(&self, base: &str, request: Request) -> Response {
        let mut changes = self.changes.subscribe();
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut outgoing = self
            .http
            .request(parts.method.clone(), format!("{base}{path}"));
        for (name, value) in &parts.headers {
            if !hop_by_hop(name) {
                outgoing = outgoing.header(name, value);
            }
        }
        let outgoing = outgoing
            .header(FORWARDED_HEADER, self.replica.holder.as_str())
            .body(reqwest::Body::wrap_stream(body.into_data_stream()));
        let answer = tokio::select! {
            answer = outgoing.send() => answer,
            _ = changes.changed() => {
                return unavailable(format!(
                    "the leader at {base} changed while this request was forwarded to it; retry"
                ));
            }
        };
        match answer {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status());
                for (name, value) in answer.headers() {
                    if !hop_by_hop(name) {
                        response = response.header(name, value);
                    }
                }
                response
                    .body(Body::from_stream(answer.bytes_stream()))
                    .unwrap_or_else(|e| unavailable(format!("bad answer from the leader: {e}")))
            }
            Err(e) => unavailable(format!(
                "the leader at {base} did not answer ({e}); if it is gone, another server \
                 takes over within {} s: retry then",
                self.replica.lease.as_secs_f64().ceil()
            )),
        }
    }
}

/// Headers of one connection, not of the request: never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "proxy-connection"
            | "content-length"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_answer_stored_reads_and_forward_the_rest() {
        assert!(answered_by_follower(&Method::GET, "/v1/tasks/3"));
        assert!(answered_by_follower(&Method::GET, "/v1/tasks"));
        assert!(answered_by_follower(&Method::GET, "/v1/health"));
        assert!(!answered_by_follower(&Method::POST, "/v1/tasks"));
        assert!(!answered_by_follower(&Method::GET, "/v1/tasks/3/logs"));
        assert!(!answered_by_follower(&Method::GET, "/v1/tasks/3/why"));
        assert!(!answered_by_follower(&Method::GET, "/v1/agents/1/work"));
        assert!(!answered_by_follower(&Method::GET, "/v1/nodes"));
        // An agent may fetch a snapshot its node runs: only the leader knows which.
        assert!(!answered_by_follower(&Method::GET, "/v1/snapshots/ab"));
        assert!(!answered_by_follower(&Method::GET, "/v1/chunks/ab"));
    }
}

//! `GET /v1/tasks/{id}/session` (the user's half of `tcloud exec`, `shell`,
//! `port-forward`) and `GET /v1/agents/{node}/sessions/{session}` (the node's half): two
//! HTTP/1.1 upgrades spliced by [`crate::sessions`]. The guard admits the user's half for
//! the task's owner, their group admin and admins only (another user is told the task
//! does not exist), and the node's half for the node the session was asked of only.

use axum::extract::Request;
use axum::http::header::{CONNECTION, UPGRADE};
use tacc_proto::{NodeRequestId, NodeRequestKind, SESSION_PROTOCOL, SessionKind, SessionQuery};

use super::prelude::*;
use crate::sessions::{Ended, Traffic};

/// How long the node has to connect back once asked.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// How often an open session checks that its task still runs and its token still holds.
const CHECK_EVERY: Duration = Duration::from_secs(1);

fn wants_upgrade(headers: &HeaderMap) -> bool {
    let has = |name, value: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(value))
            })
    };
    has(CONNECTION, "upgrade") && has(UPGRADE, SESSION_PROTOCOL)
}

fn switching() -> Response {
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static(SESSION_PROTOCOL));
    response
}

/// What the user asked for, checked.
fn session_kind(query: &SessionQuery) -> ApiResult<SessionKind> {
    let kind: SessionKind = serde_json::from_str(&query.request)
        .map_err(|e| ServerError::BadRequest(format!("`request` is not a session request: {e}")))?;
    match &kind {
        SessionKind::Exec { command, tty: None } if command.is_empty() => Err(
            ServerError::BadRequest("exec needs a command: tcloud exec ID -- CMD [ARGS…]".into()),
        ),
        SessionKind::Exec {
            tty: Some(size), ..
        } if size.rows == 0 || size.cols == 0 => Err(ServerError::BadRequest(
            "a terminal needs at least one row and one column".into(),
        )),
        SessionKind::Forward { port: 0 } => Err(ServerError::BadRequest(
            "port 0 cannot be forwarded: name the port the task listens on".into(),
        )),
        _ => Ok(kind),
    }
}

/// The user's half: checks, asks the node, waits for it to connect back, then answers
/// 101 and splices the two connections until one closes or the session is cut.
pub(super) async fn open_session(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
    Query(query): Query<SessionQuery>,
    mut request: Request,
) -> ApiResult<Response> {
    let user = user_of(&caller)?.clone();
    if !wants_upgrade(request.headers()) {
        return Err(ServerError::BadRequest(format!(
            "this route opens an interactive session: send `Connection: upgrade` and \
             `Upgrade: {SESSION_PROTOCOL}` (tcloud exec, shell and port-forward do)"
        )));
    }
    let kind = session_kind(&query)?;
    let control = app.control.clone();
    let record = super::tasks::load(&control, TaskId(id)).await?;
    if record.state != TaskState::Running || record.placements.is_empty() {
        return Err(ServerError::Conflict(format!(
            "task {id} is {}: sessions open only into a running task (`tcloud status {id}`)",
            record.state
        )));
    }
    let rank = query.rank;
    let count = record.placements.len();
    let Some(placement) = record.placements.get(rank as usize) else {
        return Err(ServerError::BadRequest(format!(
            "task {id} runs on {count} node(s): --rank must be 0{}",
            if count > 1 {
                format!(" to {}", count - 1)
            } else {
                String::new()
            }
        )));
    };
    let node = placement.node;
    let attempt = tacc_proto::AttemptRef {
        task: record.id,
        attempt: record.attempt,
    };
    let sessions = app.interactive.clone();
    let ticket = sessions.admit(&user.name, node)?;
    let target = format!("task {id} rank {rank}");
    let what = kind.describe();
    // Recorded before the node hears of it: no session opens without its record.
    control
        .audit
        .commit(
            &caller,
            "session.open",
            target.clone(),
            format!("{what} (attempt {})", record.attempt),
        )
        .await?;
    let on_upgrade = hyper::upgrade::on(&mut request);
    let request_kind = NodeRequestKind::Session {
        rank,
        session: kind,
    };
    // Awaited before the node is told, so its connection never comes too early.
    let session = control.node_requests.next_id();
    let mut expected = sessions.expect(session, node);
    control
        .node_requests
        .deliver(node, session, attempt, request_kind);
    let node_stream = tokio::time::timeout(CONNECT_DEADLINE, &mut expected.stream).await;
    control.node_requests.withdraw(node, session);
    drop(expected);
    let node_stream = match node_stream {
        Ok(Ok(stream)) => stream,
        _ => {
            let name = control
                .node_names()
                .await
                .remove(&node)
                .unwrap_or_else(|| format!("node-{node}"));
            let error = ServerError::NodeTimeout(format!(
                "node {name} did not open the session within {} s (it may be overloaded or \
                 unreachable; `tcloud nodes` shows when it was last seen)",
                CONNECT_DEADLINE.as_secs()
            ));
            control
                .audit
                .failed(&caller, "session.open", target, &error);
            return Err(error);
        }
    };
    let shutdown = app.shutdown.clone();
    // A session into a dev session is not cut when silent: the dev session's own
    // idle timeout governs it, its users warned first (`crate::dev_idle`).
    let dev_session = serde_json::from_value::<tacc_schema::TaskSpec>(record.spec.clone())
        .is_ok_and(|spec| spec.is_interactive());
    let idle = (!dev_session).then_some(sessions.limits.idle);
    let task = record.id;
    tokio::spawn(async move {
        let user_stream = match on_upgrade.await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!("session {session}: the user's upgrade failed: {e}");
                // Its opening was recorded: so is its end.
                let detail = format!("{what}: the user went away before it opened");
                let actor = format!("user:{}", user.name);
                let _ = control
                    .audit
                    .commit_as(actor, "session.close", target, detail)
                    .await;
                return;
            }
        };
        let traffic = std::sync::Arc::new(Traffic::new());
        let (attachment, notices) = sessions.attach(task, traffic.clone());
        let cut = watch(&control, &user, attempt, &traffic, idle, &shutdown);
        let ended = crate::sessions::splice(user_stream, node_stream, &traffic, notices, cut).await;
        drop(attachment);
        // Its place is free as soon as both sides are closed.
        drop(ticket);
        let detail = format!(
            "{what}: {} after {} s; {} bytes from the user, {} bytes to the user",
            ended.describe(),
            traffic.lasted().as_secs(),
            traffic.from_user.load(std::sync::atomic::Ordering::Relaxed),
            traffic.to_user.load(std::sync::atomic::Ordering::Relaxed),
        );
        if let Ended::Cut(why) = &ended {
            tracing::info!("session {session} into {target} cut: {why}");
        }
        if let Err(e) = control
            .audit
            .commit_as(
                format!("user:{}", user.name),
                "session.close",
                target,
                detail,
            )
            .await
        {
            tracing::error!("session {session}: its end was not recorded: {e}");
        }
    });
    Ok(switching())
}

/// Resolves, with the reason, once the session must end: its attempt no longer runs,
/// the token it was opened with was revoked or expired, nothing passed for `idle` (when
/// given), or the server stops.
async fn watch(
    control: &Control,
    user: &UserCaller,
    attempt: tacc_proto::AttemptRef,
    traffic: &Traffic,
    idle: Option<Duration>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> String {
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return "the server is stopping".into(),
            _ = ticks.tick() => {}
        }
        if let Some(idle) = idle
            && traffic.idle() >= idle
        {
            return format!("the session was idle for {} s", idle.as_secs());
        }
        match control.query().task(attempt.task).await {
            Ok(Some(task))
                if task.attempt == attempt.attempt && task.state == TaskState::Running => {}
            Ok(Some(task)) if task.attempt != attempt.attempt => {
                return format!("task {} moved on to attempt {}", task.id, task.attempt);
            }
            Ok(Some(task)) => return format!("task {} is {}", task.id, task.state),
            Ok(None) => return format!("task {} no longer exists", attempt.task),
            Err(e) => tracing::warn!("session check of task {}: {e}", attempt.task),
        }
        match control.query().token(user.token).await {
            Ok(Some(token)) if token.revoked_at.is_some() => {
                return format!("token {} was revoked", token.id);
            }
            Ok(Some(token)) if !token.is_valid_at(control.clock.now()) => {
                return format!("token {} expired", token.id);
            }
            Ok(Some(_)) => {}
            Ok(None) => return format!("token {} no longer exists", user.token),
            Err(e) => tracing::warn!("session check of token {}: {e}", user.token),
        }
    }
}

/// The node's half: hands its upgraded connection to the user's waiting half.
pub(super) async fn agent_session(
    State(app): State<AppState>,
    Path((node, session)): Path<(u64, u64)>,
    mut request: Request,
) -> ApiResult<Response> {
    if !wants_upgrade(request.headers()) {
        return Err(ServerError::BadRequest(format!(
            "send `Connection: upgrade` and `Upgrade: {SESSION_PROTOCOL}`"
        )));
    }
    let Some(waiting) = app.interactive.claim(NodeId(node), NodeRequestId(session)) else {
        return Err(ServerError::NotFound(format!(
            "no session {session} waits for node {node} (it timed out or was closed)"
        )));
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(stream) => {
                let _ = waiting.send(stream);
            }
            Err(e) => tracing::debug!("session {session}: the node's upgrade failed: {e}"),
        }
    });
    Ok(switching())
}

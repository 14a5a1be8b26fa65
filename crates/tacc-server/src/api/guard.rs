//! The guard every request passes before its handler: authenticate the bearer token,
//! look up the matched route's [`Access`] rule, and decide — including whether the task,
//! snapshot or chunk the path names belongs to the caller. A refusal is audited; the
//! admitted [`Caller`] travels to the handler as a request extension.
//!
//! A browser signed in to the dashboard carries a session cookie instead of the bearer
//! header: the guard exchanges it for the token the session was opened with, so it is
//! authenticated and authorised exactly as that token is. The cookie counts on the
//! dashboard's routes and on reading (`GET`) API routes — the live log stream, output
//! downloads — never for an API route that changes anything (the dashboard's own forms
//! carry a CSRF token, and a browser that says a dashboard form came from another site is
//! refused first, see `dashboard::csrf`). A dashboard route that refuses answers with a
//! page (or the way to the sign-in form), not JSON.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tacc_core::{NodeId, SnapshotId, TaskId};

use super::AppState;
use super::dashboard;
use crate::ServerError;
use crate::auth::{Access, Caller, Refusal, decide, may_act_for};

fn refusal_error(refusal: Refusal) -> ServerError {
    match refusal {
        Refusal::Unauthenticated(why) => ServerError::Unauthenticated(why),
        Refusal::Forbidden(why) => ServerError::Forbidden(why),
        Refusal::Unavailable => ServerError::Unavailable(
            "the server cannot check credentials right now (its database is unavailable); \
             try again shortly"
                .into(),
        ),
    }
}

/// The address the request came from (set by the listener; absent in in-process tests).
pub(super) fn peer<B>(request: &axum::http::Request<B>) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip())
}

/// Whom a refusal is aggregated under: the identity that was refused, or, for a request
/// without a credential, its address.
fn source_of<B>(caller: &Caller, request: &axum::http::Request<B>) -> String {
    match caller {
        Caller::Anonymous => {
            peer(request).map_or_else(|| "an unknown address".to_string(), |ip| ip.to_string())
        }
        known => known.audit_name(),
    }
}

/// 429 for an address past its limit on failed authentications.
pub(super) fn too_many_failures(wait: std::time::Duration) -> ServerError {
    ServerError::TooManyRequests {
        message: "too many failed authentications from your address; wait before trying \
                  again, and check the token you send (`tcloud login`, or ask an admin for a \
                  new one)"
            .into(),
        retry_after_secs: wait.as_secs().max(1),
    }
}

pub(super) async fn guard(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let params = RawPathParams::from_request_parts(&mut parts, &())
        .await
        .ok();
    let matched = parts.extensions.get::<MatchedPath>().cloned();
    let mut request = Request::from_parts(parts, body);
    let Some(matched) = matched else {
        return ServerError::NotFound("no such route".into()).into_response();
    };
    let path: &str = matched.as_str();
    let ui = dashboard::is_dashboard(path);
    let target_uri = request
        .uri()
        .path_and_query()
        .map_or_else(|| path.to_string(), |p| p.as_str().to_string());
    let answer = |error: ServerError| {
        if ui {
            dashboard::refused(error, &target_uri)
        } else {
            error.into_response()
        }
    };
    let Some(access) = app
        .rules
        .get(&(request.method().clone(), path))
        .copied()
        .or_else(|| {
            // HEAD is answered by the GET handler.
            (request.method() == axum::http::Method::HEAD)
                .then(|| app.rules.get(&(axum::http::Method::GET, path)).copied())
                .flatten()
        })
    else {
        // Every route is built from its declared rule, so only a method the path does not
        // serve gets here.
        return (
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            axum::Json(tacc_proto::ApiError {
                code: "method_not_allowed".into(),
                message: format!("{} is not served at {path}", request.method()),
            }),
        )
            .into_response();
    };
    if let Some(limit) = super::body_limit(path) {
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit as u64) {
            return (
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(tacc_proto::ApiError {
                    code: "payload_too_large".into(),
                    message: format!(
                        "the request body is larger than this route accepts ({limit} bytes)"
                    ),
                }),
            )
                .into_response();
        }
    }
    let params: HashMap<String, String> = params
        .map(|p| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let control = &app.control;
    let reading = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    // A dashboard form another site made the browser send (a forged sign-in included)
    // is refused before anything else looks at it.
    if ui
        && !reading
        && let Some(why) = dashboard::csrf::cross_site(request.headers())
    {
        control.audit.record_as(
            "anonymous".into(),
            "ui.cross_site_refused",
            format!("{} {path}", request.method()),
            false,
            why.clone(),
        );
        super::drain::drain(request.into_body()).await;
        return answer(ServerError::Forbidden(format!(
            "{why}; use the dashboard's own pages"
        )));
    }
    if access == Access::Public {
        // Health checks must answer whatever credential a probe happens to carry.
        request.extensions_mut().insert(Caller::Anonymous);
        return next.run(request).await;
    }
    let mut header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .cloned();
    if header.is_none() && (ui || reading) {
        let session = match dashboard::session::session_id(request.headers()) {
            Some(id) => app.sessions.get(&id, crate::clock::wall_now()).await,
            None => None,
        };
        if let Some(session) = session {
            if let Ok(value) =
                axum::http::HeaderValue::from_str(&format!("Bearer {}", session.token))
            {
                // Handlers that re-check the credential (a followed log) see the token.
                request
                    .headers_mut()
                    .insert(axum::http::header::AUTHORIZATION, value.clone());
                header = Some(value);
                request.extensions_mut().insert(session);
            }
        }
    }
    let caller = match control
        .auth
        .authenticate(header.as_ref(), crate::now())
        .await
    {
        Ok(caller) => caller,
        Err(refusal) => {
            let target = format!("{} {path}", request.method());
            let limited = match &refusal {
                Refusal::Unauthenticated(why) => {
                    control
                        .audit
                        .failed_authentication(peer(&request), target, why.clone())
                }
                // The database could not be asked: not the client's failure.
                other => {
                    control.audit.record_as(
                        "anonymous".into(),
                        "auth.unchecked",
                        target,
                        false,
                        format!("{other:?}"),
                    );
                    Ok(())
                }
            };
            super::drain::drain(request.into_body()).await;
            if let Err(wait) = limited {
                return answer(too_many_failures(wait));
            }
            return answer(refusal_error(refusal));
        }
    };
    let method = request.method().clone();
    let target = || format!("{method} {path}");
    if let Err(refusal) = decide(&caller, access) {
        let action = match refusal {
            Refusal::Unauthenticated(_) => "auth.failed",
            _ => "access.denied",
        };
        control.audit.refused(
            &source_of(&caller, &request),
            caller.audit_name(),
            action,
            target(),
            format!("{refusal:?}"),
        );
        super::drain::drain(request.into_body()).await;
        return answer(refusal_error(refusal));
    }
    if let Err(error) = check_object(&app, &caller, access, &params).await {
        if !matches!(
            error,
            ServerError::NotFound(_) | ServerError::TaskNotFound(_) | ServerError::GroupNotFound(_)
        ) {
            control.audit.refused(
                &source_of(&caller, &request),
                caller.audit_name(),
                "access.denied",
                target(),
                error.to_string(),
            );
        }
        super::drain::drain(request.into_body()).await;
        return answer(error);
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn param<'a>(params: &'a HashMap<String, String>, name: &str) -> Result<&'a str, ServerError> {
    params
        .get(name)
        .map(String::as_str)
        .ok_or_else(|| ServerError::Internal(format!("route has no `{name}` parameter")))
}

/// The object-level half of the decision: is the named task, snapshot, chunk or node the
/// caller's? A user is told an object that is not theirs does not exist.
async fn check_object(
    app: &AppState,
    caller: &Caller,
    access: Access,
    params: &HashMap<String, String>,
) -> Result<(), ServerError> {
    let control = &app.control;
    match access {
        // Only a user may own a task: any other credential that got this far (a node's,
        // on a session route) is told it does not exist.
        Access::Task | Access::TaskSession => {
            let text = param(params, "id")?;
            let id: u64 = text
                .parse()
                .map_err(|_| ServerError::BadRequest(format!("`{text}` is not a task id")))?;
            let hidden = || ServerError::TaskNotFound(TaskId(id));
            let Caller::User(user) = caller else {
                return Err(hidden());
            };
            let record = control.query().task(TaskId(id)).await?.ok_or_else(hidden)?;
            let group = control.auth.group_of(&record.user).await?;
            if may_act_for(user, &record.user, group.as_deref()) {
                Ok(())
            } else {
                Err(hidden())
            }
        }
        Access::Group => {
            let text = param(params, "id")?;
            let id: tacc_core::GroupId = text
                .parse()
                .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))?;
            let hidden = || ServerError::GroupNotFound(id);
            let Caller::User(user) = caller else {
                return Err(hidden());
            };
            let record = control.query().group(id).await?.ok_or_else(hidden)?;
            let group = control.auth.group_of(&record.user).await?;
            if may_act_for(user, &record.user, group.as_deref()) {
                Ok(())
            } else {
                Err(hidden())
            }
        }
        Access::Snapshot => {
            let text = param(params, "id")?;
            let id: SnapshotId = text
                .parse()
                .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))?;
            let hidden = || ServerError::NotFound(format!("snapshot {id} does not exist"));
            let allowed = match caller {
                Caller::User(user) if user.role == tacc_core::Role::Admin => true,
                Caller::User(user) => control.query().is_snapshot_owner(&id, &user.name).await?,
                Caller::Node { node, .. } => control.snapshots_of_node(*node).await.contains(&id),
                _ => false,
            };
            if allowed { Ok(()) } else { Err(hidden()) }
        }
        Access::Chunk => {
            let text = param(params, "hash")?;
            let hash: tacc_compiler::ChunkHash = text
                .parse()
                .map_err(|e| ServerError::BadRequest(format!("{e}")))?;
            let allowed = match caller {
                Caller::User(_) => true, // admins only, by the route rule
                Caller::Node { node, .. } => {
                    let snapshots = control.snapshots_of_node(*node).await;
                    app.chunk_access.may_read_chunk(snapshots, &hash).await?
                }
                _ => false,
            };
            if allowed {
                Ok(())
            } else {
                Err(ServerError::NotFound(format!(
                    "chunk {hash} does not exist"
                )))
            }
        }
        Access::OwnNode => {
            let text = param(params, "node")?;
            let Caller::Node { node, .. } = caller else {
                return Err(ServerError::Forbidden(
                    "agent routes need a node credential".into(),
                ));
            };
            if text.parse::<u64>().ok().map(NodeId) == Some(*node) {
                Ok(())
            } else {
                Err(ServerError::Forbidden(format!(
                    "this credential belongs to node {node}, not to node {text}"
                )))
            }
        }
        Access::Public | Access::User | Access::Admin | Access::Register | Access::Metrics => {
            Ok(())
        }
    }
}

//! Admin routes: users, API tokens, agent join tokens and the audit trail. Every change
//! is audited with the admin who made it.

use tacc_proto::{
    AuditView, CreateToken, CreateUser, TokenIssued, TokenView, UserCreated, UserView,
};
use tacc_store::{TokenRecord, UserRecord};

use super::prelude::*;
use crate::accounts;

fn user_view(user: UserRecord) -> UserView {
    UserView {
        name: user.name,
        group: user.group,
        role: user.role,
        created_at: user.created_at,
    }
}

pub(crate) fn token_view(token: TokenRecord) -> TokenView {
    TokenView {
        id: token.id,
        kind: token.kind.as_str().to_string(),
        user: token.user,
        node: token.node,
        label: token.label,
        created_at: token.created_at,
        expires_at: token.expires_at,
        revoked_at: token.revoked_at,
    }
}

pub(super) async fn list_users(State(app): State<AppState>) -> ApiResult<Json<Vec<UserView>>> {
    let users = app.control.query().users().await?;
    Ok(Json(users.into_iter().map(user_view).collect()))
}

pub(super) async fn create_user(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<CreateUser>,
) -> ApiResult<(StatusCode, Json<UserCreated>)> {
    let (user, token) = app
        .control
        .audit
        .audited(
            &caller,
            "user.add",
            format!("user:{}", body.name),
            format!(
                "role {}, group {}",
                body.role,
                body.group.as_deref().unwrap_or("-")
            ),
            accounts::create_user(
                app.control.store.as_ref(),
                &body.name,
                body.group.as_deref(),
                body.role,
                body.token_ttl_secs,
                crate::now(),
            ),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(UserCreated {
            user: user_view(user),
            token: token.view(),
        }),
    ))
}

pub(super) async fn list_tokens(State(app): State<AppState>) -> ApiResult<Json<Vec<TokenView>>> {
    let tokens = app.control.query().tokens(None).await?;
    Ok(Json(tokens.into_iter().map(token_view).collect()))
}

pub(super) async fn create_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<CreateToken>,
) -> ApiResult<(StatusCode, Json<TokenIssued>)> {
    let issued = accounts::issue_user_token(
        app.control.store.as_ref(),
        &body.user,
        &body.label,
        body.ttl_secs,
        crate::now(),
    )
    .await?;
    // Recorded after, to name the token: if the record cannot be written, the token is
    // revoked and its secret never leaves the server.
    committed(
        &app,
        &caller,
        "token.create",
        format!("user:{}", body.user),
        issued.record.id,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(issued.view())))
}

pub(super) async fn revoke_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> ApiResult<StatusCode> {
    let missing = || {
        ServerError::NotFound(format!(
            "token {id} does not exist or was already revoked (list them with `tcloud admin token ls`)"
        ))
    };
    let store = &app.control.store;
    if app
        .control
        .query()
        .token(id)
        .await?
        .is_none_or(|token| token.revoked_at.is_some())
    {
        return Err(missing());
    }
    app.control
        .audit
        .audited(
            &caller,
            "token.revoke",
            format!("token:{id}"),
            String::new(),
            async {
                if store.revoke_token(id, crate::now()).await? {
                    Ok(())
                } else {
                    Err(missing())
                }
            },
        )
        .await?;
    app.control.auth.forget();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub(super) struct AgentTokenQuery {
    ttl_secs: Option<u64>,
    /// Bind the token to this node name.
    node: Option<String>,
    /// How many nodes it may enrol (one when absent).
    nodes: Option<u32>,
}

pub(super) async fn create_agent_token(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<AgentTokenQuery>,
) -> ApiResult<(StatusCode, Json<TokenIssued>)> {
    let issuer = user_of(&caller)?.name.clone();
    let issued = accounts::issue_join_token(
        app.control.store.as_ref(),
        &issuer,
        query.ttl_secs,
        tacc_store::JoinScope {
            bound_node: query.node.clone(),
            max_nodes: query.nodes.unwrap_or(1),
        },
        crate::now(),
    )
    .await?;
    committed(
        &app,
        &caller,
        "agent_token.create",
        format!("token:{}", issued.record.id),
        issued.record.id,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(issued.view())))
}

/// Write the record of a token just issued; when it cannot be written, revoke the token
/// (its secret is only in the answer, which then is an error) and fail.
async fn committed(
    app: &AppState,
    caller: &Caller,
    action: &str,
    target: String,
    token: u64,
) -> ApiResult<()> {
    let recorded = app
        .control
        .audit
        .commit(caller, action, target, format!("token {token}"))
        .await;
    if recorded.is_err() {
        if let Err(e) = app.control.store.revoke_token(token, crate::now()).await {
            tracing::error!("cannot revoke token {token}, whose issue was not audited: {e}");
        }
    }
    recorded
}

#[derive(Debug, Deserialize)]
pub(super) struct AuditQuery {
    limit: Option<u32>,
    since: Option<u64>,
}

pub(super) async fn audit(
    State(app): State<AppState>,
    Query(query): Query<AuditQuery>,
) -> ApiResult<Json<Vec<AuditView>>> {
    let entries = app
        .control
        .store
        .list_audit(
            query.since.map(tacc_core::Timestamp),
            query.limit.unwrap_or(100).clamp(1, 10_000),
        )
        .await?;
    Ok(Json(
        entries
            .into_iter()
            .map(|e| AuditView {
                id: e.id,
                at: e.at,
                actor: e.actor,
                action: e.action,
                target: e.target,
                outcome: e.outcome,
                detail: e.detail,
            })
            .collect(),
    ))
}

/// A node's state changed by an admin (drain, resume, approve): audited before it takes
/// effect, like every admin action.
async fn audited_node_change<F>(
    app: &AppState,
    caller: &Caller,
    action: &str,
    name: &str,
    change: F,
) -> ApiResult<Json<tacc_proto::NodeView>>
where
    F: std::future::Future<Output = Result<tacc_proto::NodeView, ServerError>>,
{
    let view = app
        .control
        .audit
        .audited(
            caller,
            action,
            format!("node:{name}"),
            String::new(),
            change,
        )
        .await?;
    Ok(Json(view))
}

pub(super) async fn drain_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<Json<tacc_proto::NodeView>> {
    let change = app.control.drain_node(&name);
    audited_node_change(&app, &caller, "node.drain", &name, change).await
}

pub(super) async fn resume_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<Json<tacc_proto::NodeView>> {
    let change = app.control.resume_node(&name);
    audited_node_change(&app, &caller, "node.resume", &name, change).await
}

pub(super) async fn approve_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<Json<tacc_proto::NodeView>> {
    let change = app.control.approve_node(&name);
    audited_node_change(&app, &caller, "node.approve", &name, change).await
}

pub(super) async fn remove_node(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    app.control
        .audit
        .audited(
            &caller,
            "node.remove",
            format!("node:{name}"),
            "its node credential is revoked".into(),
            app.control.remove_node(&name),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

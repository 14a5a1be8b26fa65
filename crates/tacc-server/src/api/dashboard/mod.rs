//! The web dashboard that `taccd server` and `taccd dev` serve at `/ui/`: server-rendered
//! pages (templates and assets compiled into the binary, no JavaScript build step) that
//! read the same control plane as the API, behind the same guard and the same rules — its
//! routes are declared in the API's route table with their [`Access`](crate::auth::Access)
//! rule. A browser signs in with the user's API token and then carries a session cookie
//! ([`session`]); the guard turns the cookie back into that token. Every page reads
//! without JavaScript; a few lines of it (`assets/dashboard.js`) follow a task's log live
//! through the API's own resumable log stream.

mod accounts;
pub(crate) mod csrf;
mod estimate;
mod pages;
mod plot;
mod render;
pub(crate) mod session;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::http::header;
use axum::response::Redirect;
use serde::Serialize;

use super::prelude::*;
use crate::auth::Refusal;
pub(crate) use pages::{accounts as accounts_page, cancel, cluster, queue, task};
pub(crate) use session::{Keeping, Session, Sessions};

/// A dashboard handler's answer: a page, or an error shown as a page.
pub(crate) type UiResult = Result<Response, UiError>;

/// An error of a dashboard route, answered as HTML rather than JSON.
#[derive(Debug)]
pub(crate) struct UiError(pub(crate) ServerError);

impl From<ServerError> for UiError {
    fn from(error: ServerError) -> Self {
        UiError(error)
    }
}

impl From<tacc_store::StoreError> for UiError {
    fn from(error: tacc_store::StoreError) -> Self {
        UiError(ServerError::Store(error))
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        if self.0.status().is_server_error() {
            tracing::error!("{}", self.0);
        }
        render::error_page(&self.0, true)
    }
}

/// Whether `path` (a route pattern) belongs to the dashboard.
pub(crate) fn is_dashboard(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}

/// What the guard answers on a dashboard route it refuses: a person without a usable
/// credential is sent to the sign-in page (and back here afterwards), anything else is
/// an error page.
pub(crate) fn refused(error: ServerError, target: &str) -> Response {
    match error {
        ServerError::Unauthenticated(_) => {
            let next = if target.starts_with("/ui/") && !target.starts_with("/ui/login") {
                format!("?next={}", pages::url_path(target))
            } else {
                String::new()
            };
            Redirect::to(&format!("/ui/login{next}")).into_response()
        }
        other => render::error_page(&other, false),
    }
}

/// What every page's frame shows: who is signed in, the navigation, the form token.
#[derive(Debug, Serialize)]
pub(crate) struct Chrome {
    user: String,
    role: &'static str,
    group: Option<String>,
    nav: &'static str,
    /// Empty for a caller that came with a bearer token rather than a session: such a
    /// caller reads pages but has no forms to post.
    csrf: String,
}

impl Chrome {
    pub(crate) fn new(user: &UserCaller, session: Option<&Session>, nav: &'static str) -> Self {
        Chrome {
            user: user.name.clone(),
            role: user.role.as_str(),
            group: user.group.clone(),
            nav,
            csrf: session.map(|s| s.csrf.clone()).unwrap_or_default(),
        }
    }
}

/// `GET /`: the dashboard.
pub(crate) async fn root() -> Redirect {
    Redirect::to("/ui/")
}

/// `GET /ui`: the dashboard's front page.
pub(crate) async fn ui_root() -> Redirect {
    Redirect::to("/ui/")
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginQuery {
    next: Option<String>,
}

/// Where to go after signing in: only a dashboard page of this server (never another
/// site: `//host` and `/\host` are refused).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(next)
            if next.starts_with("/ui/")
                && !next.starts_with("/ui/login")
                && !next.contains("//")
                && !next.contains('\\') =>
        {
            next.to_string()
        }
        _ => "/ui/".to_string(),
    }
}

/// The sign-in form, bound to this browser by `token` (see [`csrf`]): the page, with the
/// pre-session cookie that holds the token.
fn login_page(
    status: StatusCode,
    next: &str,
    error: Option<String>,
    token: &str,
    secure: bool,
) -> Response {
    let context = minijinja::context! { next => next, error => error, csrf => token };
    let mut response = render::page(status, "login.html", context)
        .unwrap_or_else(|e| render::error_page(&e, false));
    if let Ok(cookie) = HeaderValue::from_str(&csrf::login_cookie(Some(token), secure)) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// `GET /ui/login`: the sign-in form.
pub(crate) async fn login_form(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    login_page(
        StatusCode::OK,
        &safe_next(query.next.as_deref()),
        None,
        &csrf::login_token(&headers),
        app.secure_cookies,
    )
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
    /// The sign-in form's token, which must match the browser's pre-session cookie.
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/login`: check the token as the API would; a user's token opens a session.
/// Only a form this server gave this browser is accepted (the guard has already refused
/// one a browser says came from another site).
pub(crate) async fn login(
    State(app): State<AppState>,
    headers: HeaderMap,
    connected: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let form_token = csrf::login_token(&headers);
    let secure = app.secure_cookies;
    let peer = connected.map(|info| info.0.0.ip());
    let Ok(Form(form)) = form else {
        return login_page(
            StatusCode::BAD_REQUEST,
            "/ui/",
            Some("the sign-in form was not sent as a form; use the form below".into()),
            &form_token,
            secure,
        );
    };
    let next = safe_next(form.next.as_deref());
    let token = form.token.trim();
    let control = &app.control;
    let refuse = |status: StatusCode, why: String| match control.audit.failed_authentication(
        peer,
        "POST /ui/login".into(),
        why.clone(),
    ) {
        Ok(()) => login_page(status, &next, Some(why), &form_token, secure),
        Err(wait) => {
            let mut page = login_page(
                StatusCode::TOO_MANY_REQUESTS,
                &next,
                Some(super::guard::too_many_failures(wait).to_string()),
                &form_token,
                secure,
            );
            if let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
                page.headers_mut().insert(header::RETRY_AFTER, value);
            }
            page
        }
    };
    if !csrf::login_token_matches(&headers, &form.csrf) {
        return refuse(
            StatusCode::FORBIDDEN,
            "this sign-in form did not come from this dashboard, or it is stale (cookies \
             must be allowed for this site); sign in with the form below"
                .into(),
        );
    }
    if token.is_empty() {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "paste your API token (`tcloud login` uses the same one; an admin creates it \
             with `tcloud admin user add` or `taccd admin token create`)"
                .into(),
        );
    }
    let Ok(header) = HeaderValue::from_str(&format!("Bearer {token}")) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "the token contains characters no TACC token has; copy it again".into(),
        );
    };
    match control.auth.authenticate(Some(&header), crate::now()).await {
        Ok(Caller::User(user)) => {
            let name = user.name.clone();
            let recorded = control
                .audit
                .commit(
                    &Caller::User(user),
                    "ui.sign_in",
                    "dashboard".into(),
                    String::new(),
                )
                .await;
            if let Err(error) = recorded {
                return render::error_page(&error, true);
            }
            let (id, _) = app
                .sessions
                .open(&name, token, crate::clock::wall_now())
                .await;
            let mut response = Redirect::to(&next).into_response();
            for cookie in [
                session::set_cookie(Some(&id), secure),
                // The form has served: the next sign-in gets a fresh token.
                csrf::login_cookie(None, secure),
            ] {
                if let Ok(cookie) = HeaderValue::from_str(&cookie) {
                    response.headers_mut().append(header::SET_COOKIE, cookie);
                }
            }
            response
        }
        Ok(_) => refuse(
            StatusCode::UNAUTHORIZED,
            "this is a node or join token; sign in with a user's API token".into(),
        ),
        Err(Refusal::Unauthenticated(why)) => refuse(StatusCode::UNAUTHORIZED, why),
        Err(Refusal::Forbidden(why)) => refuse(StatusCode::FORBIDDEN, why),
        Err(Refusal::Unavailable) => login_page(
            StatusCode::SERVICE_UNAVAILABLE,
            &next,
            Some("the server cannot check credentials right now; try again shortly".into()),
            &form_token,
            secure,
        ),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /ui/logout`: close this browser's session and forget the cookie.
pub(crate) async fn logout(
    State(app): State<AppState>,
    headers: HeaderMap,
    session: Option<Extension<Session>>,
    form: Result<Form<LogoutForm>, FormRejection>,
) -> UiResult {
    let valid = matches!(
        (&session, &form),
        (Some(Extension(s)), Ok(Form(f))) if s.csrf_matches(&f.csrf)
    );
    if !valid {
        return Err(UiError(ServerError::BadRequest(
            "this sign-out form is stale or did not come from this dashboard; reload the \
             page and try again"
                .into(),
        )));
    }
    if let Some(id) = session::session_id(&headers) {
        app.sessions.close(&id).await;
    }
    let mut response = Redirect::to("/ui/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&session::set_cookie(None, app.secure_cookies)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

/// The dashboard's style sheet and script, compiled in.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "dashboard.css",
        "text/css; charset=utf-8",
        include_str!("assets/dashboard.css"),
    ),
    (
        "dashboard.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/dashboard.js"),
    ),
];

/// `GET /ui/assets/{file}`.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=300"),
            ],
            *body,
        )
            .into_response(),
        None => render::error_page(
            &ServerError::NotFound(format!("the dashboard has no asset `{file}`")),
            false,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_only_sends_people_back_into_the_dashboard() {
        assert_eq!(safe_next(Some("/ui/tasks/3")), "/ui/tasks/3");
        assert_eq!(safe_next(Some("/ui/queue?x=1")), "/ui/queue?x=1");
        for hostile in [
            "https://evil.example/",
            "//evil.example/ui/",
            "/ui//evil.example",
            "/ui/\\evil",
            "/v1/tasks",
            "/ui/login",
        ] {
            assert_eq!(safe_next(Some(hostile)), "/ui/", "{hostile}");
        }
        assert_eq!(safe_next(None), "/ui/");
    }

    #[test]
    fn a_refused_person_is_sent_to_sign_in_and_back() {
        let response = refused(
            ServerError::Unauthenticated("no token".into()),
            "/ui/tasks/7",
        );
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert_eq!(
            response.headers()[header::LOCATION],
            "/ui/login?next=/ui/tasks/7"
        );
        let response = refused(ServerError::TaskNotFound(TaskId(7)), "/ui/tasks/7");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
}

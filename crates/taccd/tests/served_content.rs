//! What a browser makes of the server's answers, against a real `taccd dev` over real
//! HTTP: bytes a task wrote (an `.html` output, a log full of markup) come as downloads or
//! plain text with `nosniff`, never as a page of the dashboard's origin — even to a
//! browser signed in to the dashboard; the dashboard's pages carry a strict
//! Content-Security-Policy that forbids framing; and a sign-in another site forges (or one
//! without the form's token) is refused and opens no session.

mod common;

use common::*;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use tacc_core::TaskState;

/// A plain HTTP client that does not follow redirects (to see them).
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no `{name}` header in {headers:?}"))
}

/// The headers no response may lack: no sniffing, no framing, no referrer.
fn assert_never_sniffed_or_framed(headers: &HeaderMap, what: &str) {
    assert_eq!(
        header(headers, "x-content-type-options"),
        "nosniff",
        "{what}"
    );
    assert_eq!(header(headers, "x-frame-options"), "DENY", "{what}");
    // Nothing for other sites (`no-referrer` would make browsers send `Origin: null` with
    // the dashboard's own forms, which the cross-site check must be able to refuse).
    assert_eq!(header(headers, "referrer-policy"), "same-origin", "{what}");
    let csp = header(headers, "content-security-policy");
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
}

/// `name=value` of cookie `name` among a response's `Set-Cookie` headers.
fn set_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .find(|pair| pair.starts_with(&format!("{name}=")))
        .map(str::to_string)
}

/// The sign-in form as a browser gets it: its pre-session cookie and its hidden token.
async fn sign_in_form(url: &str) -> (String, String) {
    let reply = http().get(format!("{url}/ui/login")).send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let cookie = set_cookie(reply.headers(), "tacc_login").expect("the form sets its cookie");
    let html = reply.text().await.unwrap();
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("the form carries its token") + marker.len();
    let token = html[start..][..html[start..].find('"').unwrap()].to_string();
    (cookie, token)
}

/// POST the sign-in form with `api_token`, the form's `csrf` and `cookie` (if any) and
/// extra headers; the reply's status and the session cookie it set, if any.
async fn post_sign_in(
    url: &str,
    api_token: &str,
    csrf: Option<&str>,
    cookie: Option<&str>,
    extra: &[(&str, &str)],
) -> (StatusCode, Option<String>) {
    let mut form = vec![("token", api_token), ("next", "/ui/")];
    if let Some(csrf) = csrf {
        form.push(("csrf", csrf));
    }
    let mut request = http().post(format!("{url}/ui/login")).form(&form);
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let reply = request.send().await.unwrap();
    let session = set_cookie(reply.headers(), "tacc_session").filter(|c| c != "tacc_session=");
    (reply.status(), session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_bytes_come_as_downloads_and_plain_text_never_as_pages() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let client = daemon.client();
    let task = submit(
        &client,
        dir.path(),
        "planted",
        "name: planted\noutputs: [out/]\nrun: |\n  mkdir -p out\n  \
         echo '<html><script>fetch(\"/v1/admin/users\")</script></html>' > out/x.html\n  \
         echo '<html><body onload=alert(document.cookie)><script>alert(1)</script>'\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&client, task).await.state,
        TaskState::Succeeded
    );
    let outputs = client.list_outputs(task).await.unwrap();
    let output = outputs.iter().find(|o| o.path.ends_with("x.html")).unwrap();

    // The way an admin would open the link: signed in to the dashboard, with its cookie.
    let (login_cookie, csrf) = sign_in_form(&daemon.url).await;
    let origin = daemon.url.clone();
    let (status, session) = post_sign_in(
        &daemon.url,
        &daemon.token,
        Some(&csrf),
        Some(&login_cookie),
        &[("origin", &origin), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let session = session.expect("a proper sign-in opens a session");

    let output_url = format!(
        "{}/v1/tasks/{}/outputs/{}/{}",
        daemon.url, task.0, output.attempt.0, output.path
    );
    for (credential, value) in [
        ("authorization", format!("Bearer {}", daemon.token)),
        ("cookie", session.clone()),
    ] {
        let reply = http()
            .get(&output_url)
            .header(credential, &value)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "{credential}");
        let headers = reply.headers().clone();
        assert_never_sniffed_or_framed(&headers, "an output");
        assert_eq!(header(&headers, "content-type"), "application/octet-stream");
        let disposition = header(&headers, "content-disposition");
        assert!(
            disposition.starts_with("attachment;") && disposition.contains("filename=\"x.html\""),
            "{disposition}"
        );
        assert!(
            header(&headers, "content-security-policy").contains("sandbox"),
            "a rendered download still runs nothing"
        );
        assert!(
            reply.text().await.unwrap().contains("<script>"),
            "the bytes are intact"
        );
    }

    // The log, read once and followed, as the dashboard's script follows it.
    for query in ["offset=0", "offset=0&follow=true"] {
        let reply = http()
            .get(format!("{}/v1/tasks/{}/logs?{query}", daemon.url, task.0))
            .header("cookie", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "{query}");
        let headers = reply.headers().clone();
        assert_never_sniffed_or_framed(&headers, "a log");
        assert_eq!(
            header(&headers, "content-type"),
            "text/plain; charset=utf-8",
            "{query}"
        );
        assert!(reply.text().await.unwrap().contains("onload=alert"));
    }

    // JSON answers, refusals and unknown routes carry the same headers.
    for (path, status) in [
        (format!("/v1/tasks/{}", task.0), StatusCode::OK),
        ("/v1/tasks/999999/logs".to_string(), StatusCode::NOT_FOUND),
        ("/v1/no-such-route".to_string(), StatusCode::NOT_FOUND),
    ] {
        let reply = http()
            .get(format!("{}{path}", daemon.url))
            .header("authorization", format!("Bearer {}", daemon.token))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), status, "{path}");
        assert_never_sniffed_or_framed(reply.headers(), &path);
    }

    // The dashboard's pages: a strict policy, no inline script or style to need a hole.
    for path in [
        "/ui/login".to_string(),
        "/ui/".to_string(),
        "/ui/queue".to_string(),
        "/ui/accounts".to_string(),
        format!("/ui/tasks/{}", task.0),
    ] {
        let reply = http()
            .get(format!("{}{path}", daemon.url))
            .header("cookie", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "{path}");
        let headers = reply.headers().clone();
        assert_never_sniffed_or_framed(&headers, &path);
        let csp = header(&headers, "content-security-policy");
        for part in [
            "script-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(part), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        let html = reply.text().await.unwrap();
        assert!(!html.contains("style=\""), "{path} has inline style");
        for script in html.split("<script").skip(1) {
            assert!(
                script.split('>').next().unwrap().contains(" src="),
                "{path} has an inline script"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sign_in_is_refused_and_opens_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "1"]).await;
    let url = daemon.url.as_str();
    let token = daemon.token.as_str();
    let (cookie, csrf) = sign_in_form(url).await;

    // Another site's page posting the form, with everything else right (the browser
    // would even send the cookie, were it not SameSite=Strict).
    for extra in [
        vec![("origin", "http://evil.example")],
        vec![("origin", "null")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("origin", url), ("sec-fetch-site", "same-site")],
    ] {
        let (status, session) = post_sign_in(url, token, Some(&csrf), Some(&cookie), &extra).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{extra:?}");
        assert_eq!(session, None, "{extra:?} opened a session");
    }
    // A sign-in without the form's token, or without the cookie it is bound to.
    for (sent, held) in [
        (None, Some(cookie.as_str())),
        (Some("forged-token"), Some(cookie.as_str())),
        (Some(csrf.as_str()), None),
    ] {
        let (status, session) = post_sign_in(url, token, sent, held, &[]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{sent:?} {held:?}");
        assert_eq!(session, None, "{sent:?} {held:?} opened a session");
    }
    let audit = daemon.client().audit(200).await.unwrap();
    assert!(
        audit.iter().any(
            |e| e.action == "ui.cross_site_refused" && e.detail.contains("http://evil.example")
        ),
        "{audit:?}"
    );

    // The dashboard's own form, from its own page, signs in; its session works.
    let (status, session) = post_sign_in(
        url,
        token,
        Some(&csrf),
        Some(&cookie),
        &[("origin", url), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let session = session.unwrap();
    let page = http()
        .get(format!("{url}/ui/queue"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).unwrap() + marker.len();
    let session_csrf = &html[start..][..html[start..].find('"').unwrap()];

    // Signing out from another site is refused too: the session lives on.
    let reply = http()
        .post(format!("{url}/ui/logout"))
        .header("cookie", &session)
        .header("origin", "http://evil.example")
        .form(&[("csrf", session_csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::FORBIDDEN);
    let page = http()
        .get(format!("{url}/ui/queue"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK, "the session survived");
}

/// A dashboard session survives a crash of the server (it is kept, sealed, in the store):
/// the browser's cookie still opens the dashboard from the restarted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_session_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut daemon = start("dev", &data, &["--cpus", "1"]).await;
    let url = daemon.url.clone();
    let (cookie, csrf) = sign_in_form(&url).await;
    let (status, session) = post_sign_in(
        &url,
        &daemon.token,
        Some(&csrf),
        Some(&cookie),
        &[("origin", &url), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let session = session.expect("a session");
    let open_dashboard = |url: String, session: String| async move {
        http()
            .get(format!("{url}/ui/"))
            .header("cookie", session)
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(
        open_dashboard(url.clone(), session.clone()).await,
        StatusCode::OK
    );
    daemon.kill9();
    let restarted = restart_on("dev", &data, &url, &["--cpus", "1"]).await;
    assert_eq!(
        open_dashboard(url.clone(), session.clone()).await,
        StatusCode::OK,
        "the restarted server knows the session"
    );
    // The database holds neither the session id nor the token in the clear.
    let mut database = std::fs::read(data.join("tacc.db")).unwrap();
    database.extend(std::fs::read(data.join("tacc.db-wal")).unwrap_or_default());
    let text = String::from_utf8_lossy(&database);
    assert!(
        text.contains("dashboard_sessions"),
        "the file read is the database"
    );
    let id = session.trim_start_matches("tacc_session=");
    assert!(!text.contains(id), "the session id is in the database");
    assert!(
        !text.contains(&restarted.token),
        "the token is in the database"
    );
    drop(restarted);
}

//! The web dashboard in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by scripts/ci/setup-chromium.sh), driven through
//! chromedriver (WebDriver) against a real `taccd dev` (server and agent): sign in with a
//! user's token, submit from the CLI, watch the task on the queue and its log stream in
//! on the task page, cancel it with the page's button, and find another user's task
//! invisible; then read the same pages without JavaScript (plain HTTP with the session
//! cookie). Screenshots are kept in `target/ui-screenshots/` (or `$TACC_UI_SCREENSHOTS`)
//! for CI to keep as artifacts.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

/// The Chromium binary and chromedriver, or why they cannot be used.
fn browser_binaries() -> Result<(PathBuf, PathBuf), String> {
    let find = |variable: &str, names: &[&str]| -> Option<PathBuf> {
        if let Ok(path) = std::env::var(variable) {
            return Some(PathBuf::from(path));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    };
    let chromium = find("TACC_CHROMIUM", &["chromium", "chromium-browser"])
        .ok_or("no `chromium` on PATH (and TACC_CHROMIUM is not set)")?;
    let driver = find("TACC_CHROMEDRIVER", &["chromedriver"])
        .ok_or("no `chromedriver` on PATH (and TACC_CHROMEDRIVER is not set)")?;
    Ok((chromium, driver))
}

/// The binaries, or `None` after saying loudly that the test is skipped (a failure in CI).
fn chromium_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    match browser_binaries() {
        Ok(found) => Some(found),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: {why}; scripts/ci/setup-chromium.sh installs them")
        }
        Err(why) => {
            eprintln!(
                "\n######## SKIPPED {test}: {why}. Install Debian's chromium and \
                 chromium-driver (scripts/ci/setup-chromium.sh, as root) to run it.\n"
            );
            None
        }
    }
}

/// A chromedriver process, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver(binary: &Path, log: &Path) -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary)
        .arg(format!("--port={port}"))
        .arg(format!("--log-path={}", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let url = format!("http://127.0.0.1:{port}");
    let status = format!("{url}/status");
    eventually("chromedriver to answer", DEADLINE, || {
        let status = status.clone();
        async move {
            let reply = reqwest::get(&status).await.ok()?;
            let body: serde_json::Value = reply.json().await.ok()?;
            body["value"]["ready"].as_bool().filter(|ready| *ready)
        }
    })
    .await;
    Driver { child, url }
}

async fn open_browser(driver: &Driver, chromium: &Path) -> Browser {
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,1000",
                "--hide-scrollbars",
            ],
        },
    });
    let serde_json::Value::Object(capabilities) = capabilities else {
        unreachable!()
    };
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

/// Where screenshots are kept: `$TACC_UI_SCREENSHOTS`, else `target/ui-screenshots/` of
/// the workspace.
fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("TACC_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-screenshots")
        });
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(browser: &Browser, name: &str) {
    // The whole page, not only the window.
    let height = browser
        .execute("return document.documentElement.scrollHeight", vec![])
        .await
        .ok()
        .and_then(|h| h.as_u64())
        .unwrap_or(1000)
        .clamp(600, 3000) as u32;
    browser.set_window_size(1280, height + 120).await.unwrap();
    let png = browser.screenshot().await.expect("a screenshot");
    browser.set_window_size(1280, 1000).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// The text of the element `css` on the current page, once `ready` accepts it (the page
/// may be reloading meanwhile).
async fn wait_text(
    browser: &Browser,
    css: &str,
    what: &str,
    ready: impl Fn(&str) -> bool,
) -> String {
    eventually(what, DEADLINE, || {
        let browser = browser.clone();
        let ready = &ready;
        async move {
            let text = browser
                .find(Locator::Css(css))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            ready(&text).then_some(text)
        }
    })
    .await
}

fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build every binary first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// `tcloud submit DIR --json` as the holder of `token`; the new task's id.
fn tcloud_submit(url: &str, token: &str, home: &Path, dir: &Path) -> TaskId {
    let output = Command::new(tcloud_binary())
        .arg("submit")
        .arg(dir)
        .arg("--json")
        .env("TACC_HOME", home)
        .env("TACC_SERVER", url)
        .env("TACC_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tcloud submit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    TaskId(reply["task_id"].as_u64().expect("a task id"))
}

fn task_dir(root: &Path, name: &str, yaml: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), yaml).unwrap();
    dir
}

/// A plain HTTP client that does not follow redirects (to see them).
fn plain_http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn read_page(url: &str, cookie: &str) -> (reqwest::StatusCode, String) {
    let reply = plain_http()
        .get(url)
        .header("cookie", format!("tacc_session={cookie}"))
        .send()
        .await
        .unwrap();
    let status = reply.status();
    (status, reply.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_signs_in_watches_a_task_stream_and_cancels_it_in_a_real_browser() {
    let test = "a_user_signs_in_watches_a_task_stream_and_cancels_it_in_a_real_browser";
    let Some((chromium, chromedriver)) = chromium_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--gpus", "2", "--gpu-type", "A100"],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let alice_token = daemon.admin(&["user", "add", "alice"]).trim().to_string();
    let bob_token = daemon.admin(&["user", "add", "bob"]).trim().to_string();
    let alice = Client::new(&daemon.url).with_token(alice_token.clone());
    let bob = Client::new(&daemon.url).with_token(bob_token.clone());
    let home = dir.path().join("home");

    // Bob's task, which Alice must not see; a task of Alice's that waits for a node.
    let bobs = tcloud_submit(
        &daemon.url,
        &bob_token,
        &home,
        &task_dir(
            dir.path(),
            "bobs",
            "name: bobs-private-run\nrun: echo bob-only\n",
        ),
    );
    wait_terminal(&bob, bobs).await;
    let waiting = tcloud_submit(
        &daemon.url,
        &alice_token,
        &home,
        &task_dir(
            dir.path(),
            "waits",
            "name: waits-for-pool\nplacement: {labels: {pool: nowhere}}\nrun: echo never\n",
        ),
    );

    let driver = start_driver(&chromedriver, &dir.path().join("chromedriver.log")).await;
    let browser = open_browser(&driver, &chromium).await;

    // Signing in: the dashboard sends a stranger to the sign-in form, and back after.
    browser
        .goto(&format!("{}/ui/queue", daemon.url))
        .await
        .unwrap();
    let url = browser.current_url().await.unwrap();
    assert_eq!(url.path(), "/ui/login", "{url}");
    screenshot(&browser, "sign-in").await;
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("tacc_not-a-token")
        .await
        .unwrap();
    browser
        .find(Locator::Css("#sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let refusal = wait_text(&browser, "#login-error", "a refused sign-in", |t| {
        !t.is_empty()
    })
    .await;
    assert!(refusal.contains("malformed"), "{refusal}");
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(&alice_token)
        .await
        .unwrap();
    browser
        .find(Locator::Css("#sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&browser, "#signed-in-as", "alice to be signed in", |t| {
        t == "alice"
    })
    .await;
    assert_eq!(browser.current_url().await.unwrap().path(), "/ui/queue");
    let cookie = browser.get_named_cookie("tacc_session").await.unwrap();
    assert_eq!(
        cookie.http_only(),
        Some(true),
        "the session cookie is HttpOnly"
    );
    assert_eq!(
        format!("{:?}", cookie.same_site()),
        "Some(Strict)",
        "the session cookie is SameSite=Strict"
    );
    let session = cookie.value().to_string();

    // Submit from the CLI; the task shows on the queue page.
    let task = tcloud_submit(
        &daemon.url,
        &alice_token,
        &home,
        &task_dir(
            dir.path(),
            "web",
            "name: streams-lines\nresources: {gpus: 1}\nrun: |\n  for i in $(seq 1 100000); do echo \"line $i <b>not bold</b>\"; sleep 0.2; done\n",
        ),
    );
    wait_state(&alice, task, &[TaskState::Running]).await;
    browser
        .goto(&format!("{}/ui/queue", daemon.url))
        .await
        .unwrap();
    let row = format!("#running tr[data-task=\"{}\"]", task.0);
    let text = wait_text(&browser, &row, "the task on the queue page", |t| {
        t.contains("streams-lines")
    })
    .await;
    assert!(text.contains("running"), "{text}");
    let pending = wait_text(
        &browser,
        &format!("#queued tr[data-task=\"{}\"] .reason", waiting.0),
        "the waiting task's pending reason",
        |t| t != "—" && !t.is_empty(),
    )
    .await;
    assert!(pending.contains("pool"), "{pending}");
    assert!(
        browser
            .find_all(Locator::Css(&format!("tr[data-task=\"{}\"]", bobs.0)))
            .await
            .unwrap()
            .is_empty(),
        "bob's task is listed to alice"
    );
    screenshot(&browser, "queue").await;

    // The cluster page: the node, its GPUs allocated.
    browser.goto(&format!("{}/ui/", daemon.url)).await.unwrap();
    let node = wait_text(&browser, "tr.node", "the node on the cluster page", |t| {
        t.contains("1/2 allocated")
    })
    .await;
    assert!(node.contains("up"), "{node}");
    screenshot(&browser, "cluster").await;
    browser
        .goto(&format!("{}/ui/accounts", daemon.url))
        .await
        .unwrap();
    let me = wait_text(
        &browser,
        "#users tr[data-user=\"alice\"]",
        "alice's row",
        |t| t.contains("GPU"),
    )
    .await;
    assert!(me.contains("1 GPU"), "alice holds one GPU: {me}");
    assert!(
        browser
            .find_all(Locator::Css("#users tr[data-user=\"bob\"]"))
            .await
            .unwrap()
            .is_empty(),
        "bob's account is shown to alice"
    );
    // The usage of the last week and the fair-share standing, as `tcloud usage` gives
    // them: alice's own row (her running task counts), nobody else's.
    let usage = wait_text(&browser, "#usage-by-user", "the usage table", |t| {
        t.contains("alice")
    })
    .await;
    assert!(
        !usage.contains("bob"),
        "bob's usage is shown to alice: {usage}"
    );
    // A user in no group is charged to a group of their own, as the scheduler does.
    let by_group = wait_text(&browser, "#usage-by-group", "usage by group", |t| {
        t.contains("alice")
    })
    .await;
    assert!(!by_group.contains("bob"), "{by_group}");
    let page = browser.source().await.unwrap();
    assert!(page.contains("Fair-share standing"), "{page}");
    screenshot(&browser, "accounts").await;

    // The task page: its log streams in (the page's script follows the API's stream).
    browser
        .goto(&format!("{}/ui/tasks/{}", daemon.url, task.0))
        .await
        .unwrap();
    let loaded_at: u64 = browser
        .find(Locator::Css("#log"))
        .await
        .unwrap()
        .attr("data-offset")
        .await
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    let log = wait_text(&browser, "#log", "log lines to stream in", |t| {
        let last = t
            .lines()
            .filter_map(|l| {
                l.strip_prefix("line ")?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .unwrap_or(0);
        last >= 10
    })
    .await;
    assert!(
        log.contains("line 3 <b>not bold</b>"),
        "the task's markup is shown as text: {log}"
    );
    let log_element = browser.find(Locator::Css("#log")).await.unwrap();
    assert_eq!(
        log_element.attr("data-following").await.unwrap().as_deref(),
        Some("true"),
        "the script follows the live stream"
    );
    let now_at: u64 = log_element
        .attr("data-offset")
        .await
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    assert!(now_at > loaded_at, "lines arrived after the page loaded");
    assert!(
        browser
            .find_all(Locator::Css("#log b"))
            .await
            .unwrap()
            .is_empty(),
        "the log's markup became elements"
    );
    // A few samples later (the agent samples every 2 s) the page draws them as a curve.
    let page = format!("{}/ui/tasks/{}", daemon.url, task.0);
    eventually(
        "the page to plot the task's samples as curves",
        DEADLINE,
        || {
            let browser = browser.clone();
            let page = page.clone();
            async move {
                browser.goto(&page).await.ok()?;
                let cpu = browser
                    .find(Locator::Css(".charts svg polyline"))
                    .await
                    .ok()?
                    .attr("points")
                    .await
                    .ok()??;
                (cpu.split(' ').count() >= 4).then_some(())
            }
        },
    )
    .await;
    wait_text(
        &browser,
        "#log-status",
        "the script to follow the log",
        |t| t.contains("live"),
    )
    .await;
    screenshot(&browser, "task-running").await;

    // Cancel with the button; the page ends up showing the task cancelled.
    browser
        .find(Locator::Css("#cancel"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(
        &browser,
        "#task-state",
        "the page to show the task cancelled",
        |t| t == "cancelled",
    )
    .await;
    assert_eq!(
        alice.get_task(task).await.unwrap().state,
        TaskState::Cancelled
    );
    assert!(
        browser
            .find_all(Locator::Css("#cancel"))
            .await
            .unwrap()
            .is_empty(),
        "an ended task has no cancel button"
    );
    screenshot(&browser, "task-cancelled").await;

    // Another user's task is not there for alice.
    browser
        .goto(&format!("{}/ui/tasks/{}", daemon.url, bobs.0))
        .await
        .unwrap();
    let message = wait_text(&browser, "#error-message", "a not-found page", |t| {
        !t.is_empty()
    })
    .await;
    assert!(message.contains("does not exist"), "{message}");
    let source = browser.source().await.unwrap();
    assert!(!source.contains("bob-only") && !source.contains("bobs-private-run"));
    screenshot(&browser, "not-found").await;

    // Reading needs no JavaScript: the same pages over plain HTTP with the cookie.
    let (status, html) = read_page(&format!("{}/ui/tasks/{}", daemon.url, task.0), &session).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert!(
        html.contains("line 1 &lt;b&gt;not bold&lt;"),
        "the log is escaped"
    );
    assert!(!html.contains("<b>not bold"), "the log is escaped");
    assert!(html.contains("cancelled"));
    let (status, html) = read_page(&format!("{}/ui/queue", daemon.url), &session).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert!(html.contains("streams-lines") && html.contains("waits-for-pool"));
    assert!(!html.contains("bobs-private-run"));
    let (status, _) = read_page(&format!("{}/ui/tasks/{}", daemon.url, bobs.0), &session).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    // The session cookie reads the API's log stream, as the page's script does.
    let (status, log) = read_page(
        &format!("{}/v1/tasks/{}/logs?offset=0", daemon.url, task.0),
        &session,
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert!(log.starts_with("line 1 <b>not bold</b>\n"), "{log}");
    // ...but changes nothing through the API, and a form without the session's CSRF
    // token is refused.
    let cancel_api = plain_http()
        .post(format!("{}/v1/tasks/{}/cancel", daemon.url, waiting.0))
        .header("cookie", format!("tacc_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel_api.status(), reqwest::StatusCode::UNAUTHORIZED);
    let forged = plain_http()
        .post(format!("{}/ui/tasks/{}/cancel", daemon.url, waiting.0))
        .header("cookie", format!("tacc_session={session}"))
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), reqwest::StatusCode::BAD_REQUEST);
    assert_eq!(
        alice.get_task(waiting).await.unwrap().state,
        TaskState::Queued
    );

    // Signing out ends the session.
    browser
        .goto(&format!("{}/ui/queue", daemon.url))
        .await
        .unwrap();
    browser
        .find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    eventually("the sign-in page after signing out", DEADLINE, || {
        let browser = browser.clone();
        async move { (browser.current_url().await.ok()?.path() == "/ui/login").then_some(()) }
    })
    .await;
    let (status, _) = read_page(&format!("{}/ui/queue", daemon.url), &session).await;
    assert_eq!(
        status,
        reqwest::StatusCode::SEE_OTHER,
        "the old cookie is dead"
    );
    browser.close().await.unwrap();
    drop(driver);
}

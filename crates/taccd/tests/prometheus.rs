//! `GET /metrics` against real `taccd` processes: who may read it (a scrape token, an
//! admin; nobody else), and a real Prometheus server (Debian's `prometheus`, installed by
//! `scripts/ci/setup-prometheus.sh`) scraping a server with an agent that ran tasks —
//! some succeeded, one failed, one runs, one is queued — whose query API then returns
//! the expected values.
//!
//! Without a `prometheus` binary the scrape test says SKIPPED, except in CI (`CI=true`),
//! where it fails.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use reqwest::StatusCode;
use tacc_core::TaskState;

/// GET `path` of `url` with an optional bearer token.
async fn get(url: &str, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("{url}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// The value of the series `series` (name and labels as the text format writes them).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_read_with_a_scrape_token_or_as_an_admin_and_by_nobody_else() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let admin = daemon.client();
    wait_nodes(&admin, 1).await;
    let alice = submit(
        &daemon.user_client("alice", None, "user").await,
        dir.path(),
        "hello",
        "name: hello\nrun: echo hello\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&admin, alice).await.state,
        TaskState::Succeeded
    );

    let nobody = get(&daemon.url, "/metrics", None).await;
    assert_eq!(nobody.status(), StatusCode::UNAUTHORIZED);
    let user_token = daemon
        .admin(&["token", "create", "alice"])
        .trim()
        .to_string();
    let user = get(&daemon.url, "/metrics", Some(&user_token)).await;
    assert_eq!(user.status(), StatusCode::FORBIDDEN);
    let why = user.text().await.unwrap();
    assert!(why.contains("taccd admin metrics-token"), "{why}");

    let scrape_token = daemon.admin(&["metrics-token"]).trim().to_string();
    let scraped = get(&daemon.url, "/metrics", Some(&scrape_token)).await;
    assert_eq!(scraped.status(), StatusCode::OK);
    let content_type = scraped.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = scraped.text().await.unwrap();
    assert_eq!(
        sample(&text, "tacc_tasks{state=\"succeeded\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "tacc_submissions_total"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "tacc_nodes{state=\"up\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(sample(&text, "tacc_log_bytes_total").unwrap() >= "hello\n".len() as f64);
    assert!(sample(&text, "process_resident_memory_bytes").unwrap() > 0.0);
    // No task ids (or other unbounded values) as labels.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains("task=") && !line.contains("id="), "{line}");
    }
    let admin_read = get(&daemon.url, "/metrics", Some(&daemon.token)).await;
    assert_eq!(admin_read.status(), StatusCode::OK);

    // The scrape token reads nothing else, and stops working once revoked.
    let elsewhere = get(&daemon.url, "/v1/tasks", Some(&scrape_token)).await;
    assert_eq!(elsewhere.status(), StatusCode::FORBIDDEN);
    let id = admin
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.kind == "metrics")
        .expect("the metrics token is listed")
        .id;
    admin.revoke_token(id).await.unwrap();
    let revoked = get(&daemon.url, "/metrics", Some(&scrape_token)).await;
    assert_eq!(revoked.status(), StatusCode::UNAUTHORIZED);
}

/// Whether a `prometheus` binary runs here; in CI its absence is a failure.
fn prometheus_ready(test: &str) -> bool {
    let why = match Command::new("prometheus").arg("--version").output() {
        Ok(out) if out.status.success() => return true,
        Ok(out) => format!(
            "`prometheus --version` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!("`prometheus` cannot run: {e}"),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: Prometheus is required in CI but {why}; run scripts/ci/setup-prometheus.sh"
        );
    }
    // Straight to the terminal: the test harness swallows eprintln! of passing tests.
    use std::io::Write;
    let _ = write!(
        std::io::stderr(),
        "\n######## SKIPPED {test}: {why}.\n######## Run `sudo scripts/ci/setup-prometheus.sh` (or scripts/test.sh as root) to test with a real Prometheus.\n"
    );
    false
}

/// A `prometheus` process of the test's own, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start Prometheus in `dir` scraping `target` (host:port) every second with the scrape
/// token in `token_file`, and wait until its API answers.
async fn start_prometheus(dir: &Path, target: &str, token_file: &Path) -> Prometheus {
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: tacc\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
         metrics_path: /metrics\n    authorization:\n      type: Bearer\n      credentials_file: {}\n    \
         static_configs:\n      - targets: ['{target}']\n",
        token_file.display()
    );
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config).unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config_file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={address}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let prometheus = Prometheus {
        child,
        url: format!("http://{address}"),
    };
    let ready = format!("{}/-/ready", prometheus.url);
    eventually("Prometheus to be ready", DEADLINE, || {
        let ready = ready.clone();
        async move {
            let response = reqwest::get(&ready).await.ok()?;
            response.status().is_success().then_some(())
        }
    })
    .await;
    prometheus
}

/// The value of the single series `query` returns now, if it returns one.
async fn query(prometheus: &Prometheus, query: &str) -> Option<f64> {
    let response = reqwest::Client::new()
        .get(format!("{}/api/v1/query", prometheus.url))
        .query(&[("query", query)])
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = response.json().await.ok()?;
    assert_eq!(body["status"], "success", "{query}: {body}");
    let result = body["data"]["result"].as_array()?;
    assert!(result.len() <= 1, "{query} returned several series: {body}");
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// Wait until `query` returns exactly `expected`.
async fn expect(prometheus: &Prometheus, text: &str, expected: f64) {
    let seen = eventually(
        &format!("{text} to be {expected}"),
        DEADLINE,
        || async move {
            let value = query(prometheus, text).await?;
            (value == expected).then_some(value)
        },
    )
    .await;
    assert_eq!(seen, expected, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_server_and_its_queries_return_what_happened() {
    if !prometheus_ready(
        "a_real_prometheus_scrapes_the_server_and_its_queries_return_what_happened",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let _agent = start_agent(
        &server,
        &dir.path().join("a"),
        &["--name", "metrics-node", "--gpus", "2"],
    );
    let admin = server.client();
    wait_nodes(&admin, 1).await;

    let marker = format!("prometheus-{}", std::process::id());
    let task = |name: &str, gpus: u32, run: &str| {
        format!(
            "name: {name}\nresources: {{cpus: 0.1, gpus: {gpus}}}\n\
             environment: {{vars: {{MARKER: {marker}}}}}\nrun: {run}\n"
        )
    };
    let mut ended = Vec::new();
    for name in ["ok-1", "ok-2"] {
        ended.push(submit(&admin, dir.path(), name, &task(name, 0, "echo fine"), &[]).await);
    }
    ended.push(submit(&admin, dir.path(), "bad", &task("bad", 0, "exit 3"), &[]).await);
    for id in &ended {
        wait_terminal(&admin, *id).await;
    }
    let states: Vec<TaskState> = {
        let mut states = Vec::new();
        for id in &ended {
            states.push(admin.get_task(*id).await.unwrap().state);
        }
        states
    };
    assert_eq!(
        states,
        [
            TaskState::Succeeded,
            TaskState::Succeeded,
            TaskState::Failed
        ]
    );
    // One holds both GPUs; the next waits for them.
    let holding = submit(
        &admin,
        dir.path(),
        "hold",
        &task("hold", 2, "sleep 600"),
        &[],
    )
    .await;
    wait_state(&admin, holding, &[TaskState::Running]).await;
    let waiting = submit(
        &admin,
        dir.path(),
        "wait",
        &task("wait", 2, "echo never"),
        &[],
    )
    .await;
    eventually(
        "the second GPU task to wait for resources",
        DEADLINE,
        || {
            let admin = admin.clone();
            async move {
                let view = admin.get_task(waiting).await.ok()?;
                (view.state == TaskState::Queued
                    && view.reason.as_deref() == Some("waiting for resources"))
                .then_some(())
            }
        },
    )
    .await;

    let token_file = dir.path().join("scrape.token");
    std::fs::write(&token_file, server.admin(&["metrics-token"]).trim()).unwrap();
    let target = server.url.trim_start_matches("http://").to_string();
    let prometheus_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prometheus_dir).unwrap();
    let prometheus = &start_prometheus(&prometheus_dir, &target, &token_file).await;

    // Scraped (with the token: a refused scrape leaves `up` at 0).
    expect(prometheus, "up{job=\"tacc\"}", 1.0).await;
    expect(prometheus, "tacc_tasks{state=\"succeeded\"}", 2.0).await;
    expect(prometheus, "tacc_tasks{state=\"failed\"}", 1.0).await;
    expect(prometheus, "tacc_tasks{state=\"running\"}", 1.0).await;
    expect(prometheus, "tacc_tasks{state=\"queued\"}", 1.0).await;
    expect(prometheus, "sum(tacc_tasks)", 5.0).await;
    expect(prometheus, "tacc_submissions_total", 5.0).await;
    expect(prometheus, "tacc_queued_tasks{reason=\"resources\"}", 1.0).await;
    expect(prometheus, "sum(tacc_queued_tasks)", 1.0).await;
    expect(prometheus, "tacc_nodes{state=\"up\"}", 1.0).await;
    expect(prometheus, "tacc_nodes{state=\"down\"}", 0.0).await;
    expect(prometheus, "tacc_node_gpus{node=\"metrics-node\"}", 2.0).await;
    expect(
        prometheus,
        "tacc_node_gpus_allocated{node=\"metrics-node\"}",
        2.0,
    )
    .await;
    // Fake GPUs report no utilisation.
    expect(
        prometheus,
        "tacc_node_gpus_utilized{node=\"metrics-node\"}",
        0.0,
    )
    .await;
    // Four tasks started: two succeeded, one failed, one runs.
    expect(prometheus, "tacc_task_submit_to_start_seconds_count", 4.0).await;
    for positive in [
        "tacc_scheduler_decision_seconds_count",
        "tacc_store_commit_seconds_count{op=\"apply\"}",
        "tacc_store_commit_seconds_count{op=\"create_task\"}",
        "tacc_log_bytes_total",
        "process_resident_memory_bytes",
    ] {
        let value = eventually(&format!("{positive} > 0"), DEADLINE, || async move {
            query(prometheus, positive).await.filter(|v| *v > 0.0)
        })
        .await;
        assert!(value > 0.0, "{positive}");
    }
    // A histogram's quantile is computable from the scraped buckets.
    let p99 = eventually("a p99 of commit latency", DEADLINE, || async move {
        query(
            prometheus,
            "histogram_quantile(0.99, sum by (le) (tacc_store_commit_seconds_bucket))",
        )
        .await
        .filter(|v| v.is_finite())
    })
    .await;
    assert!(p99 > 0.0 && p99 < 10.0, "p99 commit latency {p99} s");

    admin.cancel(holding).await.unwrap();
    wait_terminal(&admin, holding).await;
    wait_no_processes(&marker).await;
}

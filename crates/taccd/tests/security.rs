//! The attack suite of the multi-tenant security issue, against real `taccd` processes
//! over real HTTP: every route × every kind of credential, one user against another,
//! forged agent traffic, secrets, oversized and hostile bodies, and floods.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use tacc_client::Client;
use tacc_core::{AttemptNo, NodeId, TaskState, Timestamp};
use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};

/// What the test expects of each route; a route the server declares that is missing here
/// (or the other way round) fails the suite, so a new route cannot skip these checks.
fn expected_routes() -> BTreeMap<(String, &'static str), &'static str> {
    [
        ("GET", "/v1/health", "public"),
        ("GET", "/v1/openapi.json", "public"),
        ("GET", "/v1/whoami", "user"),
        ("GET", "/metrics", "metrics"),
        ("POST", "/v1/tasks", "user"),
        ("POST", "/v1/estimate", "user"),
        ("GET", "/v1/tasks", "user"),
        ("GET", "/v1/tasks/{id}", "task"),
        ("GET", "/v1/tasks/{id}/events", "task"),
        ("POST", "/v1/tasks/{id}/cancel", "task"),
        ("GET", "/v1/tasks/{id}/logs", "task"),
        ("GET", "/v1/tasks/{id}/instruction", "task"),
        ("GET", "/v1/tasks/{id}/why", "task"),
        ("GET", "/v1/tasks/{id}/usage", "task"),
        ("POST", "/v1/tasks/{id}/rerun", "task"),
        ("GET", "/v1/tasks/{id}/outputs", "task"),
        ("GET", "/v1/tasks/{id}/outputs/{attempt}/{*path}", "task"),
        ("GET", "/v1/tasks/{id}/files", "task"),
        ("GET", "/v1/tasks/{id}/session", "task_session"),
        ("GET", "/v1/tasks/{id}/files/content", "task"),
        ("POST", "/v1/snapshots/offer", "user"),
        ("POST", "/v1/snapshots/commit", "user"),
        ("GET", "/v1/snapshots/{id}", "snapshot"),
        ("PUT", "/v1/chunks/{hash}", "user"),
        ("GET", "/v1/chunks/{hash}", "chunk"),
        ("GET", "/v1/groups", "user"),
        ("GET", "/v1/groups/{id}", "group"),
        ("POST", "/v1/groups/{id}/cancel", "group"),
        ("POST", "/v1/groups/{id}/rerun", "group"),
        ("GET", "/v1/groups/{id}/sweep", "group"),
        ("POST", "/v1/pipelines", "user"),
        ("GET", "/v1/history", "user"),
        ("GET", "/v1/usage", "user"),
        ("GET", "/v1/usage/fairshare", "user"),
        ("GET", "/v1/datasets", "user"),
        ("GET", "/v1/nodes", "user"),
        ("GET", "/v1/secrets", "user"),
        ("PUT", "/v1/secrets/{name}", "user"),
        ("DELETE", "/v1/secrets/{name}", "user"),
        ("POST", "/v1/admin/gc", "admin"),
        ("GET", "/v1/admin/users", "admin"),
        ("POST", "/v1/admin/users", "admin"),
        ("GET", "/v1/admin/tokens", "admin"),
        ("POST", "/v1/admin/tokens", "admin"),
        ("POST", "/v1/admin/tokens/{id}/revoke", "admin"),
        ("POST", "/v1/admin/agent-tokens", "admin"),
        ("GET", "/v1/admin/audit", "admin"),
        ("POST", "/v1/admin/cluster/stop", "admin"),
        ("GET", "/v1/admin/cluster/stop", "admin"),
        ("POST", "/v1/admin/nodes/{name}/drain", "admin"),
        ("POST", "/v1/admin/nodes/{name}/resume", "admin"),
        ("POST", "/v1/admin/nodes/{name}/approve", "admin"),
        ("DELETE", "/v1/admin/nodes/{name}", "admin"),
        ("POST", "/v1/agents/register", "register"),
        ("POST", "/v1/agents/{node}/work", "own_node"),
        ("POST", "/v1/agents/{node}/reports", "own_node"),
        (
            "GET",
            "/v1/agents/{node}/inputs/{task}/{attempt}/{index}",
            "own_node",
        ),
        (
            "PUT",
            "/v1/agents/{node}/outputs/{task}/{attempt}/{*path}",
            "own_node",
        ),
        ("POST", "/v1/agents/{node}/answers/{request}", "own_node"),
        ("GET", "/v1/agents/{node}/sessions/{session}", "own_node"),
        (
            "PUT",
            "/v1/agents/{node}/answers/{request}/file",
            "own_node",
        ),
        ("GET", "/", "public"),
        ("GET", "/ui", "public"),
        ("GET", "/ui/login", "public"),
        ("POST", "/ui/login", "public"),
        ("POST", "/ui/logout", "user"),
        ("GET", "/ui/assets/{file}", "public"),
        ("GET", "/ui/", "user"),
        ("GET", "/ui/queue", "user"),
        ("GET", "/ui/accounts", "user"),
        ("GET", "/ui/tasks/{id}", "task"),
        ("POST", "/ui/tasks/{id}/cancel", "task"),
    ]
    .into_iter()
    .map(|(method, path, class)| ((method.to_string(), path), class))
    .collect()
}

/// The credentials every route is tried with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    Malformed,
    Expired,
    Revoked,
    Owner,
    OtherUser,
    Node,
    Admin,
    /// A scrape token (`taccd admin metrics-token`).
    Scraper,
}

const EVERYONE: [Who; 9] = [
    Who::Nobody,
    Who::Malformed,
    Who::Expired,
    Who::Revoked,
    Who::Owner,
    Who::OtherUser,
    Who::Node,
    Who::Admin,
    Who::Scraper,
];

/// Whether `status` is what `who` must get from a route of `class`. "Admitted" means the
/// guard let the request through: whatever the handler then says about the (dummy) body,
/// it is not 401 or 403, nor a 404 that hides someone else's object.
///
/// The dashboard's routes (`/`, `/ui…`) answer a missing or unusable credential by sending
/// the browser to the sign-in page (303) rather than with 401, and its forms refuse a body
/// that is not theirs with 400.
fn acceptable(path: &str, class: &str, who: Who, status: StatusCode) -> bool {
    let admitted = status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN;
    let dashboard = path == "/" || path.starts_with("/ui");
    match (who, class) {
        (_, "public") if path == "/" || path == "/ui" => status == StatusCode::SEE_OTHER,
        // The probe's JSON body is not the sign-in form.
        (_, "public") if path == "/ui/login" && status.is_client_error() => {
            status == StatusCode::BAD_REQUEST
        }
        (Who::Nobody | Who::Malformed | Who::Expired | Who::Revoked, _)
            if dashboard && class != "public" =>
        {
            status == StatusCode::SEE_OTHER
        }
        // The node ran the (ended) attempt: outputs for it are no longer taken.
        (Who::Node, "own_node") if path.contains("/outputs/") => status == StatusCode::FORBIDDEN,
        (_, "public") => status.is_success(),
        (Who::Nobody | Who::Malformed | Who::Expired | Who::Revoked, _) => {
            status == StatusCode::UNAUTHORIZED
        }
        (Who::Owner, "user" | "task" | "task_session" | "group" | "snapshot") => admitted,
        (Who::Owner | Who::OtherUser, "admin" | "chunk" | "register" | "own_node" | "metrics") => {
            status == StatusCode::FORBIDDEN
        }
        (Who::Scraper, "metrics") => status.is_success(),
        (Who::Scraper, _) => status == StatusCode::FORBIDDEN,
        (Who::OtherUser, "user") => admitted,
        (Who::OtherUser, "task" | "task_session" | "group" | "snapshot") => {
            status == StatusCode::NOT_FOUND
        }
        // Entering a task: a node is told it does not exist, as another user is.
        (Who::Node, "task_session") => status == StatusCode::NOT_FOUND,
        (Who::Node, "register" | "own_node") => admitted,
        // The node runs none of the owner's attempts (the task has ended).
        (Who::Node, "snapshot" | "chunk") => status == StatusCode::NOT_FOUND,
        (Who::Node, _) => status == StatusCode::FORBIDDEN,
        (Who::Admin, "register" | "own_node") => status == StatusCode::FORBIDDEN,
        (Who::Admin, _) => admitted,
        _ => false,
    }
}

async fn http(
    url: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> reqwest::Response {
    // Redirects are answers to check (the dashboard's way to its sign-in page).
    let mut request = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .request(method, format!("{url}{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    request.send().await.unwrap()
}

fn token_of(output: &str) -> String {
    output.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_kind_of_credential_as_its_rule_says() {
    let declared: BTreeMap<(String, &'static str), String> = tacc_server::route_rules()
        .into_iter()
        .map(|rule| {
            let class = format!("{:?}", rule.access);
            let class = match class.as_str() {
                "OwnNode" => "own_node".to_string(),
                "TaskSession" => "task_session".to_string(),
                other => other.to_lowercase(),
            };
            ((rule.method.to_string(), rule.path), class)
        })
        .collect();
    let expected: BTreeMap<(String, &'static str), String> = expected_routes()
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    assert_eq!(
        declared, expected,
        "the server's routes and this suite's expectations differ: add the new route here"
    );

    let dir = tempfile::tempdir().unwrap();
    // Every route is tried with three bad credentials: far more failed authentications
    // from this address than the default limit lets through before answering 429.
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--auth-failure-limit", "100000"],
    )
    .await;
    let admin = daemon.client();
    let owner = daemon.user_client("owner", None, "user").await;
    let other_token = token_of(&daemon.admin(&["user", "add", "other"]));
    let expired = token_of(&daemon.admin(&["user", "add", "shortlived", "--ttl", "1s"]));
    let revoked_user = admin
        .create_user(&tacc_proto::CreateUser {
            name: "gone".into(),
            group: None,
            role: tacc_core::Role::User,
            token_ttl_secs: None,
        })
        .await
        .unwrap();
    admin.revoke_token(revoked_user.token.id).await.unwrap();
    let task = submit(
        &owner,
        dir.path(),
        "t",
        "name: t\nrun: echo hi > out.txt\noutputs: [out.txt]\n",
        &[],
    )
    .await;
    let view = wait_terminal(&owner, task).await;
    assert_eq!(view.state, TaskState::Succeeded);
    // An array of the owner's, for the group routes.
    let array = owner
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::json!({"name": "arr", "run": "true", "array": "0-1"}),
            snapshot: view.snapshot.clone(),
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap()
        .group
        .expect("an array makes a group")
        .group;
    let manifest = admin.get_snapshot(&view.snapshot).await.unwrap();
    let manifest: tacc_compiler::Manifest = serde_json::from_value(manifest).unwrap();
    let chunk = manifest
        .chunk_set()
        .iter()
        .next()
        .expect("a chunk in the snapshot")
        .to_string();
    let node_token = std::fs::read_to_string(daemon.data_dir.join("agent/node.token")).unwrap();
    let node = admin.list_nodes().await.unwrap()[0].id;
    let scrape_token = token_of(&daemon.admin(&["metrics-token"]));
    // Let the short-lived token expire.
    eventually("the 1 s token to expire", DEADLINE, || {
        let url = daemon.url.clone();
        let expired = expired.clone();
        async move {
            let status = http(&url, Method::GET, "/v1/whoami", Some(&expired), None)
                .await
                .status();
            (status == StatusCode::UNAUTHORIZED).then_some(())
        }
    })
    .await;

    let credential = |who: Who| -> Option<String> {
        match who {
            Who::Nobody => None,
            Who::Malformed => Some("tacc_not-a-token".into()),
            Who::Expired => Some(expired.clone()),
            Who::Revoked => Some(revoked_user.token.token.clone()),
            Who::Owner => Some(owner_token(&daemon, &owner)),
            Who::OtherUser => Some(other_token.clone()),
            Who::Node => Some(node_token.trim().to_string()),
            Who::Admin => Some(daemon.token.clone()),
            Who::Scraper => Some(scrape_token.clone()),
        }
    };
    let mut failures = Vec::new();
    for ((method, path), class) in &expected {
        let concrete = path
            .replace(
                "{id}",
                &match *path {
                    "/v1/snapshots/{id}" => view.snapshot.to_string(),
                    "/v1/admin/tokens/{id}/revoke" => "999999".to_string(),
                    p if p.starts_with("/v1/groups/") => array.to_string(),
                    _ => task.0.to_string(),
                },
            )
            .replace("{attempt}", "1")
            .replace("{*path}", "out.txt")
            .replace("{hash}", &chunk)
            .replace("{node}", &node.0.to_string())
            .replace("{task}", &task.0.to_string())
            .replace("{request}", "1")
            .replace("{name}", "PROBE_SECRET")
            .replace("{file}", "dashboard.css");
        let method: Method = method.parse().unwrap();
        let body = (method == Method::POST || method == Method::PUT).then(|| b"{}".to_vec());
        for who in EVERYONE {
            let token = credential(who);
            let status = http(
                &daemon.url,
                method.clone(),
                &concrete,
                token.as_deref(),
                body.clone(),
            )
            .await
            .status();
            if !acceptable(path, class, who, status) {
                failures.push(format!(
                    "{method} {concrete} ({class}) as {who:?}: {status}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "wrong answers:\n{}",
        failures.join("\n")
    );
    // A method a path does not serve is 405, whoever asks.
    let status = http(
        &daemon.url,
        Method::DELETE,
        "/v1/tasks",
        Some(&daemon.token),
        None,
    )
    .await
    .status();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

/// The bearer token a [`Client`] made by `user_client` carries (tests need it raw).
fn owner_token(daemon: &Daemon, _owner: &Client) -> String {
    let path = daemon.data_dir.join("owner.token");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return text;
    }
    let token = token_of(&daemon.admin(&["token", "create", "owner", "--label", "suite"]));
    std::fs::write(&path, &token).unwrap();
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_see_or_touch_what_is_another_users() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let alice = daemon.user_client("alice", Some("vision"), "user").await;
    let bob = daemon.user_client("bob", Some("nlp"), "user").await;
    let lead = daemon
        .user_client("lead", Some("vision"), "group_admin")
        .await;
    alice
        .put_secret("ALICE_KEY", b"alice-only-value".to_vec())
        .await
        .unwrap();
    let task = submit(
        &alice,
        dir.path(),
        "mine",
        "name: mine\nrun: |\n  echo secret-work > result.txt\n  sleep 30\noutputs: [result.txt]\n",
        &[],
    )
    .await;
    wait_state(&alice, task, &[TaskState::Running]).await;
    let view = alice.get_task(task).await.unwrap();

    let not_found = |result: Result<_, tacc_client::ClientError>, what: &str| {
        let error = result.err().unwrap_or_else(|| panic!("bob could {what}"));
        assert_eq!(error.code(), Some("not_found"), "{what}: {error}");
    };
    not_found(bob.get_task(task).await.map(|_| ()), "read alice's task");
    not_found(bob.task_events(task).await.map(|_| ()), "read its events");
    not_found(bob.explain(task).await.map(|_| ()), "ask why");
    not_found(bob.logs(task, 0).await.map(|_| ()), "read its log");
    not_found(bob.list_outputs(task).await.map(|_| ()), "list its outputs");
    not_found(
        bob.get_output(task, AttemptNo(1), "result.txt")
            .await
            .map(|_| ()),
        "download its output",
    );
    not_found(
        bob.task_instruction(task).await.map(|_| ()),
        "read its instruction",
    );
    not_found(
        bob.get_snapshot(&view.snapshot).await.map(|_| ()),
        "read its code",
    );
    not_found(bob.rerun(task).await.map(|_| ()), "rerun it");
    not_found(bob.cancel(task).await.map(|_| ()), "cancel it");
    let chunk = bob.get_chunk(&"0".repeat(64)).await.unwrap_err();
    assert_eq!(chunk.code(), Some("forbidden"), "{chunk}");
    assert!(
        bob.list_tasks(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(bob.list_secrets().await.unwrap().is_empty());
    assert_eq!(alice.list_secrets().await.unwrap().len(), 1);

    // Knowing the snapshot's id (or its manifest) is not the code: bob can neither run it
    // nor commit it as his own without uploading every chunk himself.
    let stolen = bob
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(
                &tacc_schema::parse_task("t", "name: steal\nrun: cat *\n")
                    .unwrap()
                    .0,
            )
            .unwrap(),
            snapshot: view.snapshot.clone(),
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err();
    assert_eq!(stolen.code(), Some("invalid_task"), "{stolen}");
    let manifest = alice.get_snapshot(&view.snapshot).await.unwrap();
    let offer = bob.offer_snapshot(manifest.clone()).await.unwrap();
    assert_eq!(
        offer.missing.len() as u64,
        offer.chunks_total,
        "bob must upload everything"
    );
    let commit = bob.commit_snapshot(manifest).await.unwrap_err();
    assert_eq!(commit.code(), Some("bad_request"), "{commit}");

    // The group admin of alice's group sees and may cancel her task; bob's list stays empty.
    assert_eq!(lead.get_task(task).await.unwrap().id, task);
    assert_eq!(lead.list_tasks(&Default::default()).await.unwrap().len(), 1);
    assert_eq!(
        alice.get_task(task).await.unwrap().state,
        TaskState::Running,
        "bob changed nothing"
    );
    lead.cancel(task).await.unwrap();
    assert_eq!(
        wait_terminal(&alice, task).await.state,
        TaskState::Cancelled
    );
    // An admin sees everything.
    assert_eq!(daemon.client().get_task(task).await.unwrap().user, "alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_agent_traffic_is_rejected_audited_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let _agent = start_agent(&server, &dir.path().join("a"), &["--name", "real"]);
    let admin = server.client();
    wait_nodes(&admin, 1).await;
    let alice = server.user_client("alice", None, "user").await;
    let task = submit(
        &alice,
        dir.path(),
        "long",
        "name: long\nrun: sleep 3 && echo done\n",
        &[],
    )
    .await;
    wait_state(&alice, task, &[TaskState::Running]).await;
    let real = admin.list_nodes().await.unwrap()[0].id;
    let attempt = AttemptRef {
        task,
        attempt: AttemptNo(1),
    };
    let registration = |name: &str| tacc_proto::RegisterAgent {
        name: name.into(),
        capacity: tacc_core::Resources::new(8000, 1 << 34, 8),
        gpu_type: Some("H100".into()),
        labels: Default::default(),
        running: vec![],
        address: "10.9.9.9".into(),
        gpus: vec![],
        life: 1,
    };

    // Without a join token nobody registers a node; a user token is not one either.
    let anonymous = Client::new(&server.url)
        .register_agent(&registration("fake"))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Some("unauthenticated"), "{anonymous}");
    let as_user = alice
        .register_agent(&registration("fake"))
        .await
        .unwrap_err();
    assert_eq!(as_user.code(), Some("forbidden"), "{as_user}");

    // An attacker with a join token gets a node of its own — and nothing more.
    let join = token_of(&server.admin(&["agent-token", "--ttl", "10m"]));
    let joiner = Client::new(&server.url).with_token(join);
    let taken = joiner
        .register_agent(&registration("real"))
        .await
        .unwrap_err();
    assert_eq!(
        taken.code(),
        Some("conflict"),
        "a registered node's name cannot be taken over: {taken}"
    );
    let evil = joiner.register_agent(&registration("evil")).await.unwrap();
    let evil_client = Client::new(&server.url).with_token(evil.node_token.clone().unwrap());
    let as_other = evil_client
        .register_agent(&registration("real"))
        .await
        .unwrap_err();
    assert_eq!(as_other.code(), Some("reenrol_required"), "{as_other}");

    let forged_finish = AgentReport::Finished {
        attempt,
        at: Timestamp(1),
        outcome: AttemptOutcome::Exited { code: 0 },
        rank: None,
    };
    let ack = evil_client
        .agent_reports(
            evil.node_id,
            &[
                forged_finish.clone(),
                AgentReport::Log {
                    attempt,
                    text: "forged line\n".into(),
                    offset: None,
                },
                AgentReport::Usage(tacc_proto::UsageSample {
                    attempt,
                    node_rank: 0,
                    at: Timestamp(1),
                    started_at: Timestamp(1),
                    last_output_at: None,
                    cpu_millis_used: Some(64_000),
                    cpu_throttled_ms: None,
                    memory_bytes: Some(1 << 40),
                    memory_peak_bytes: Some(1 << 40),
                    gpus: vec![],
                    cpu_quota_millis: None,
                    cpu_throttled_fraction: None,
                    memory_limit_bytes: None,
                    memory_pressure_percent: None,
                    memory_failcnt: None,
                    io_wait_percent: None,
                }),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        (ack.accepted, ack.rejected),
        (0, 3),
        "reports for another node's attempt"
    );
    let other_node = evil_client
        .agent_reports(real, std::slice::from_ref(&forged_finish))
        .await
        .unwrap_err();
    assert_eq!(other_node.code(), Some("forbidden"), "{other_node}");
    let upload = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(upload.path(), "attacker's file").unwrap();
    let forged_output = evil_client
        .put_output(
            evil.node_id,
            task,
            AttemptNo(1),
            "result.txt",
            tokio::fs::File::open(upload.path()).await.unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(forged_output.code(), Some("forbidden"), "{forged_output}");
    let missing_node = evil_client
        .put_output(
            NodeId(4242),
            task,
            AttemptNo(1),
            "result.txt",
            tokio::fs::File::open(upload.path()).await.unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(missing_node.code(), Some("forbidden"), "{missing_node}");

    // The real task is untouched and finishes on its own.
    assert_eq!(
        alice.get_task(task).await.unwrap().state,
        TaskState::Running
    );
    let view = wait_terminal(&alice, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert!(!log_text(&alice, task).await.contains("forged"));
    assert!(alice.list_outputs(task).await.unwrap().is_empty());
    // The forged sample left no peak behind.
    let usage = alice.task_usage(task).await.unwrap();
    assert!(
        usage.peaks.iter().all(|p| p.memory_bytes < 1 << 40),
        "{usage:?}"
    );
    // The real node replaying an ending after the fact changes nothing either.
    let real_token = std::fs::read_to_string(dir.path().join("a/node.token")).unwrap();
    let real_client = Client::new(&server.url).with_token(real_token.trim());
    let replay = AgentReport::Finished {
        attempt,
        at: Timestamp(2),
        outcome: AttemptOutcome::Exited { code: 1 },
        rank: None,
    };
    let ack = real_client.agent_reports(real, &[replay]).await.unwrap();
    assert_eq!(ack.rejected, 1, "a replayed ending is rejected");
    assert_eq!(
        alice.get_task(task).await.unwrap().state,
        TaskState::Succeeded
    );
    let nodes = admin.list_nodes().await.unwrap();
    let real_view = nodes.iter().find(|n| n.id == real).unwrap();
    assert_ne!(
        real_view.capacity.gpus, 8,
        "the real node's capacity was not overwritten"
    );
    assert_eq!(real_view.name, "real");

    let audit = admin.audit(500).await.unwrap();
    for action in [
        "report.rejected",
        "output.rejected",
        "node.register",
        "auth.failed",
        "access.denied",
    ] {
        assert!(
            audit
                .iter()
                .any(|e| e.action == action && e.outcome == "denied"),
            "no denied {action} in the audit trail: {audit:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_its_task_and_nowhere_else() {
    const VALUE: &str = "sk-live-4f9a1c2e7b3d";
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let alice = daemon.user_client("alice", None, "user").await;
    alice
        .put_secret("API_KEY", VALUE.as_bytes().to_vec())
        .await
        .unwrap();
    let missing = submit_raw(
        &alice,
        dir.path(),
        "nosuch",
        "name: nosuch\nrun: 'true'\nenvironment:\n  secrets: [NO_SUCH]\n",
    )
    .await;
    assert!(missing.contains("tcloud secret set NO_SUCH"), "{missing}");
    let task = submit(
        &alice,
        dir.path(),
        "uses",
        "name: uses\nenvironment:\n  secrets: [API_KEY]\nrun: |\n  echo \"reversed $(printf %s \"$API_KEY\" | rev), ${#API_KEY} chars\"\n  echo \"leaking $API_KEY\"\n",
        &[],
    )
    .await;
    let view = wait_terminal(&alice, task).await;
    let log = log_text(&alice, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{log}");
    let reversed: String = VALUE.chars().rev().collect();
    assert!(
        log.contains(&format!("reversed {reversed}, 20 chars")),
        "the task sees the value: {log}"
    );
    assert!(
        !log.contains(VALUE),
        "the value is masked in the log: {log}"
    );
    let shown = serde_json::to_string(&view).unwrap();
    let instruction = alice.task_instruction(task).await.unwrap().to_string();
    let listed = serde_json::to_string(&alice.list_secrets().await.unwrap()).unwrap();
    for (what, text) in [
        ("task", &shown),
        ("instruction", &instruction),
        ("secret list", &listed),
    ] {
        assert!(!text.contains(VALUE), "{what} shows the value: {text}");
    }
    assert!(
        shown.contains("API_KEY"),
        "the spec names the secret: {shown}"
    );
    // Nothing on disk holds it in clear: the database (and its WAL), logs, anything.
    let mut found = Vec::new();
    scan_for(&daemon.data_dir, VALUE.as_bytes(), &mut found);
    assert!(
        found.is_empty(),
        "the value is stored in clear in {found:?}"
    );
}

async fn submit_raw(client: &Client, root: &std::path::Path, name: &str, yaml: &str) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), yaml).unwrap();
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    client
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err()
        .to_string()
}

fn scan_for(dir: &std::path::Path, needle: &[u8], found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            scan_for(&path, needle, found);
        } else if kind.is_file()
            && let Ok(bytes) = std::fs::read(&path)
            && bytes.windows(needle.len()).any(|w| w == needle)
        {
            found.push(path);
        }
    }
}

/// Send a request declaring a `length`-byte body, write its first MiB, and return the
/// start of the answer.
fn announce_huge_body(server: &Daemon, path: &str, length: usize) -> String {
    use std::io::{Read, Write};
    let address = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n",
        server.token
    );
    stream.write_all(head.as_bytes()).unwrap();
    // The server may answer and close before taking all of this: that is the point.
    let _ = stream.write_all(&vec![b' '; 1 << 20]);
    let mut answer = vec![0u8; 512];
    let read = stream.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..read]).into_owned()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_and_a_zstd_bomb_are_refused_fast() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let before = rss_kib(server.pid());
    // Announce 100 MB and start sending: the answer must not wait for the body.
    let started = Instant::now();
    let answer = announce_huge_body(&server, "/v1/tasks", 100 << 20);
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(took < Duration::from_secs(1), "413 took {took:?}");
    eprintln!("figure: 100 MB announced -> 413 in {took:?}");
    let grown = rss_kib(server.pid()).saturating_sub(before);
    eprintln!("figure: taccd RSS grew {grown} KiB on the 100 MB request");
    assert!(
        grown < 50 * 1024,
        "taccd grew by {grown} KiB on a 100 MB request"
    );

    // 64 MiB of zeros compress to a few KiB: refused before it is inflated past a chunk.
    let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
    assert!(bomb.len() < 64 * 1024);
    let hash = blake3::hash(&vec![0u8; 64 << 20]).to_hex().to_string();
    let bomb_bytes = bomb.len();
    let started = Instant::now();
    let refused = server.client().put_chunk(&hash, bomb).await.unwrap_err();
    assert_eq!(refused.code(), Some("bad_request"), "{refused}");
    let took = started.elapsed();
    eprintln!("figure: zstd bomb ({bomb_bytes} bytes -> 64 MiB) refused in {took:?}");
    assert!(took < Duration::from_secs(1));
    let grown = rss_kib(server.pid()).saturating_sub(before);
    eprintln!("figure: taccd RSS grew {grown} KiB in all after the zstd bomb");
    assert!(
        grown < 50 * 1024,
        "taccd grew by {grown} KiB on a zstd bomb"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_user_gets_429_while_another_users_submissions_stay_fast() {
    let dir = tempfile::tempdir().unwrap();
    // No agent: tasks stay queued, so the test measures the API alone.
    let server = start(
        "server",
        &dir.path().join("s"),
        &["--submit-rate", "20", "--submit-burst", "20"],
    )
    .await;
    let flooder = server.user_client("flooder", None, "user").await;
    let bystander = server.user_client("bystander", None, "user").await;
    let spec = |name: &str| {
        serde_json::to_value(
            &tacc_schema::parse_task("t", &format!("name: {name}\nrun: 'true'\n"))
                .unwrap()
                .0,
        )
        .unwrap()
    };
    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("a.txt"), "x").unwrap();
    let flood_snapshot = upload(&flooder, &code).await;
    let calm_snapshot = upload(&bystander, &code).await;
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut flood = Vec::new();
    for _ in 0..4 {
        let flooder = flooder.clone();
        let snapshot = flood_snapshot.clone();
        let spec = spec("flood");
        flood.push(tokio::spawn(async move {
            let (mut ok, mut limited) = (0u32, 0u32);
            while Instant::now() < deadline {
                let reply = flooder
                    .submit(&tacc_proto::SubmitTask {
                        translated: Vec::new(),
                        spec: spec.clone(),
                        snapshot: snapshot.clone(),
                        source: None,
                        wait_for_capacity: false,
                    })
                    .await;
                match reply {
                    Ok(_) => ok += 1,
                    Err(e) if e.code() == Some("too_many_requests") => limited += 1,
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            (ok, limited)
        }));
    }
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        bystander
            .submit(&tacc_proto::SubmitTask {
                translated: Vec::new(),
                spec: spec("calm"),
                snapshot: calm_snapshot.clone(),
                source: None,
                wait_for_capacity: false,
            })
            .await
            .unwrap();
        latencies.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut ok, mut limited) = (0, 0);
    for handle in flood {
        let (o, l) = handle.await.unwrap();
        ok += o;
        limited += l;
    }
    assert!(limited > 0, "the flood was never limited ({ok} accepted)");
    assert!(
        ok <= 20 + 20 * 5,
        "accepted {ok}: more than burst + rate × time"
    );
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100 - 1];
    eprintln!(
        "figure: flood {ok} accepted, {limited} refused with 429; bystander median {:?}, p99 {p99:?}",
        latencies[latencies.len() / 2]
    );
    assert!(
        p99 < Duration::from_secs(1),
        "bystander p99 {p99:?} ({latencies:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_follower_is_cut_off_when_its_token_is_revoked() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let admin = daemon.client();
    let created = admin
        .create_user(&tacc_proto::CreateUser {
            name: "carol".into(),
            group: None,
            role: tacc_core::Role::User,
            token_ttl_secs: None,
        })
        .await
        .unwrap();
    let carol = Client::new(&daemon.url).with_token(created.token.token.clone());
    let task = submit(
        &carol,
        dir.path(),
        "chatty",
        "name: chatty\nrun: |\n  for i in $(seq 1 600); do echo line $i; sleep 0.1; done\n",
        &[],
    )
    .await;
    wait_state(&carol, task, &[TaskState::Running]).await;
    let mut stream = carol.follow_logs(task, 0).await.unwrap();
    assert!(stream.next().await.is_some());
    admin.revoke_token(created.token.id).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream went on after the token was revoked"
    );
    assert_eq!(
        carol.get_task(task).await.unwrap_err().code(),
        Some("unauthenticated")
    );
    admin.cancel(task).await.unwrap();
}

#[test]
fn taccd_admin_audits_operator_actions() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(start("server", &data, &[]));
    let token = token_of(&server.admin(&["user", "add", "dave", "--group", "ops"]));
    assert!(token.starts_with("tacc_"), "{token}");
    let users = server.admin(&["user", "ls"]);
    assert!(users.contains("dave") && users.contains("ops"), "{users}");
    let tokens = server.admin(&["token", "ls"]);
    assert!(
        !tokens.contains(&token),
        "a token listing never shows a secret: {tokens}"
    );
    let audit = server.admin(&["audit", "--json"]);
    assert!(
        audit.contains("\"user.add\"") && audit.contains("user:dave"),
        "{audit}"
    );
}

/// A refused upload answers with its refusal, not a reset connection: the server reads
/// (a bounded amount of) the body it refuses before answering, so a client still sending
/// sees the 401/403 and its reason. 20 streamed uploads of 768 KiB each, without a
/// credential and with a user's credential on an agent route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_gets_its_refusal_not_a_reset_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", dir.path(), &[]).await;
    let url = format!("{}/v1/agents/1/outputs/1/1/result.bin", server.url);
    let http = reqwest::Client::new();
    for n in 0..20 {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            (0..12).map(|_| Ok(vec![n as u8; 64 << 10])).collect();
        let mut request = http
            .put(&url)
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)));
        if n % 2 == 1 {
            request = request.bearer_auth(&server.token);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("upload {n}: the refusal was lost: {e}"));
        let status = response.status();
        let expected = if n % 2 == 1 {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(status, expected, "upload {n}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
}

//! What a submission is told, through the real `tcloud` against a real `taccd dev`:
//! a request the cluster can never hold, or one above a hard limit, is refused at submit
//! with the reason and a non-zero exit (pointing at the task file's line), unless
//! `--wait-for-capacity` accepts it on purpose; and what the platform changes of what was
//! asked (a lowered priority) is said at submit and shown as asked and applied, for a
//! pipeline's stages as for a task.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use tacc_core::TaskState;

/// `tcloud ARGS` against `daemon` with `token`, whatever its exit.
fn tcloud_with(daemon: &Daemon, home: &Path, token: &str, args: &[&str]) -> Output {
    Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", token)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A directory holding `file` with `yaml`.
fn task_dir(root: &Path, name: &str, file: &str, yaml: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), yaml).unwrap();
    dir
}

/// A user created through the admin API, and their token.
async fn user_token(daemon: &Daemon, name: &str, group: Option<&str>) -> String {
    daemon
        .client()
        .create_user(&tacc_proto::CreateUser {
            name: name.into(),
            group: group.map(Into::into),
            role: "user".parse().unwrap(),
            token_ttl_secs: None,
        })
        .await
        .unwrap()
        .token
        .token
}

/// A request no node can hold is refused before anything is queued: exit 2, the
/// scheduler's reason (largest node, GPU types that exist), the task file's line; the
/// same for an array and for a pipeline's stage. `--wait-for-capacity` accepts it, and
/// it waits, holding up nothing, with a reason that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_requests_are_refused_at_submit_unless_asked_to_wait_for_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    let client = daemon.client();
    wait_nodes(&client, 1).await;
    let home = dir.path().join("home");
    let admin = |args: &[&str]| tcloud_with(&daemon, &home, &daemon.token, args);

    let huge = task_dir(
        dir.path(),
        "huge",
        "task.yaml",
        "name: huge\nresources:\n  cpus: 1000\nrun: 'true'\n",
    );
    let out = admin(&["submit", huge.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refused at submit"), "{err}");
    assert!(err.contains("can never fit this cluster"), "{err}");
    assert!(err.contains("largest node: 2 cpu"), "{err}");
    assert!(err.contains("task.yaml:3:9"), "not at `cpus: 1000`: {err}");
    assert!(err.contains("--wait-for-capacity"), "{err}");

    let h100 = task_dir(
        dir.path(),
        "h100",
        "task.yaml",
        "name: h100\nresources:\n  gpus: 1\n  gpu_type: H100\nrun: 'true'\n",
    );
    let out = admin(&["submit", h100.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("GPU types: none"), "{err}");
    assert!(
        err.contains("task.yaml:4:13"),
        "not at `gpu_type: H100`: {err}"
    );

    // Arrays and pipelines submit through the same check.
    let array = task_dir(
        dir.path(),
        "array",
        "task.yaml",
        "name: wide\narray: 0-2\nresources: {cpus: 64}\nrun: 'true'\n",
    );
    let out = admin(&["submit", array.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("largest node"));
    let pipeline = task_dir(
        dir.path(),
        "pipeline",
        "pipeline.yaml",
        "name: pipe\nstages:\n  small:\n    resources: {cpus: 0.5}\n    run: 'true'\n  big:\n    needs: [small]\n    resources: {cpus: 64}\n    run: 'true'\n",
    );
    let out = admin(&["submit", pipeline.join("pipeline.yaml").to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("largest node"),
        "{}",
        text(&out.stderr)
    );
    let tasks = client.list_tasks(&Default::default()).await.unwrap();
    assert!(tasks.is_empty(), "refused, yet queued: {tasks:?}");

    // On purpose, for a cluster that will grow.
    let out = admin(&[
        "submit",
        "--json",
        "--wait-for-capacity",
        huge.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let waiting = tacc_core::TaskId(reply["task_id"].as_u64().unwrap());
    let view = eventually("the waiting task's reason", DEADLINE, || {
        let client = client.clone();
        async move {
            let view = client.get_task(waiting).await.ok()?;
            view.reason
                .as_deref()
                .is_some_and(|r| r.contains("waiting for the cluster to grow"))
                .then_some(view)
        }
    })
    .await;
    assert_eq!(view.state, TaskState::Queued);
    assert!(view.wait_for_capacity);
    let why = client.explain(waiting).await.unwrap();
    assert_eq!(why.estimated_start, None, "{why:?}");
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("--wait-for-capacity")),
        "{why:?}"
    );
    // It holds up nothing behind it.
    let small = task_dir(
        dir.path(),
        "small",
        "task.yaml",
        "name: small\nresources: {cpus: 0.5}\nrun: echo fits\n",
    );
    let out = admin(&["submit", "--json", small.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let small = tacc_core::TaskId(reply["task_id"].as_u64().unwrap());
    assert_eq!(
        wait_terminal(&client, small).await.state,
        TaskState::Succeeded
    );
    client.cancel(waiting).await.unwrap();
    wait_terminal(&client, waiting).await;
}

/// A request above the submitting user's hard limit, or their group's, can never start:
/// it is refused at submit with the limit, at the line that asks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_above_a_hard_limit_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(
        &config,
        "[users.bob]\nmax_cpus = 1\n\n[groups.vision]\nmax_cpus = 1\n",
    )
    .unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "4", "--config", config.to_str().unwrap()],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let home = dir.path().join("home");
    let bob = user_token(&daemon, "bob", None).await;
    let carol = user_token(&daemon, "carol", Some("vision")).await;
    let task = task_dir(
        dir.path(),
        "two",
        "task.yaml",
        "name: two\nresources:\n  cpus: 2\nrun: 'true'\n",
    );
    for (token, says) in [(&bob, "over user quota"), (&carol, "group vision")] {
        let out = tcloud_with(&daemon, &home, token, &["submit", task.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("refused at submit") && err.contains(says),
            "{err}"
        );
        assert!(err.contains("at most 1 CPUs"), "{err}");
        assert!(err.contains("task.yaml:3:9"), "{err}");
    }
    // Within the limit, accepted.
    let one = task_dir(
        dir.path(),
        "one",
        "task.yaml",
        "name: one\nresources: {cpus: 1}\nrun: 'true'\n",
    );
    let out = tcloud_with(&daemon, &home, &bob, &["submit", one.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Bob may use at most `normal`: his `priority: high` is lowered, and he is told so at
/// submit; `show --json` carries what he asked and what applies, and the instruction the
/// task runs with says `normal`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_priority_is_said_at_submit_and_shown_as_asked_and_applied() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(&config, "[users.bob]\nmax_priority = \"normal\"\n").unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "2", "--config", config.to_str().unwrap()],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let home = dir.path().join("home");
    let bob = user_token(&daemon, "bob", None).await;
    let task = task_dir(
        dir.path(),
        "urgent",
        "task.yaml",
        "name: urgent\npriority: high\nresources: {cpus: 0.5}\nrun: echo done\n",
    );
    let out = tcloud_with(&daemon, &home, &bob, &["submit", task.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning: `priority: high` was changed to `normal`"),
        "{err}"
    );
    assert!(
        err.contains("bob may use at most priority `normal`"),
        "{err}"
    );
    let id = text(&out.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();

    let out = tcloud_with(&daemon, &home, &bob, &["show", "--json", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        shown["spec"]["priority"], "high",
        "the spec is what was asked"
    );
    assert_eq!(shown["overrides"][0]["field"], "priority", "{shown}");
    assert_eq!(shown["overrides"][0]["asked"], "high");
    assert_eq!(shown["overrides"][0]["applied"], "normal");

    let out = tcloud_with(&daemon, &home, &bob, &["show", &id]);
    assert!(
        text(&out.stdout).contains("priority: high → normal"),
        "{}",
        text(&out.stdout)
    );
    let out = tcloud_with(&daemon, &home, &bob, &["show", "--instruction", &id]);
    let instruction: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(instruction["priority"], "normal", "{instruction}");
}

/// A pipeline's submit reply says what the platform changed of each stage as a single
/// submit does: bob's stages ask for `priority: high` (a task and an array), each is
/// warned of at submit and listed by stage in `--json`; a stage that asks for nothing
/// above bob's limits is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_reply_says_what_was_changed_of_each_stage() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tacc.toml");
    std::fs::write(&config, "[users.bob]\nmax_priority = \"normal\"\n").unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--cpus", "2", "--config", config.to_str().unwrap()],
    )
    .await;
    wait_nodes(&daemon.client(), 1).await;
    let home = dir.path().join("home");
    let bob = user_token(&daemon, "bob", None).await;
    let root = task_dir(
        dir.path(),
        "flow",
        "pipeline.yaml",
        "name: flow\nstages:\n  \
           prep:\n    priority: high\n    resources: {cpus: 0.5}\n    run: echo prep\n  \
           many:\n    needs: [prep]\n    array: 0-1\n    priority: high\n    resources: {cpus: 0.5}\n    run: echo many\n  \
           last:\n    needs: [many]\n    resources: {cpus: 0.5}\n    run: echo last\n",
    );
    let file = root.join("pipeline.yaml");
    let out = tcloud_with(
        &daemon,
        &home,
        &bob,
        &["submit", "--json", file.to_str().unwrap()],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for stage in ["prep", "many"] {
        assert!(
            err.contains(&format!(
                "warning: stage `{stage}`: `priority: high` was changed to `normal`"
            )),
            "{err}"
        );
    }
    assert!(!err.contains("stage `last`"), "{err}");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let overrides = reply["overrides"].as_object().expect("overrides by stage");
    assert_eq!(
        overrides.keys().collect::<Vec<_>>(),
        ["many", "prep"],
        "{reply}"
    );
    assert_eq!(overrides["prep"][0]["field"], "priority", "{reply}");
    assert_eq!(overrides["prep"][0]["asked"], "high");
    assert_eq!(overrides["many"][0]["applied"], "normal");
}

/// A legacy `tuxiv.conf` option the translation cannot honour as written (a node range, an
/// unlimited time) is warned of at submit, once, with its line, and kept with the task as
/// an override: `tcloud show --json` carries what was asked and what applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_legacy_option_is_kept_as_an_override() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--cpus", "2"]).await;
    wait_nodes(&daemon.client(), 1).await;
    let home = dir.path().join("home");
    let token = daemon.token.clone();
    let task = task_dir(
        dir.path(),
        "old-project",
        "tuxiv.conf",
        "entrypoint: echo legacy\njob:\n  general: [nodes=1-2, cpus-per-task=1, time=unlimited]\n",
    );
    let out = tcloud_with(&daemon, &home, &token, &["submit", task.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("node range `1-2` is not supported").count(),
        1,
        "said once: {err}"
    );
    let id = text(&out.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();
    let out = tcloud_with(&daemon, &home, &token, &["show", "--json", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let overrides = shown["overrides"].as_array().expect("overrides");
    let asked: Vec<(&str, &str)> = overrides
        .iter()
        .map(|o| (o["asked"].as_str().unwrap(), o["applied"].as_str().unwrap()))
        .collect();
    assert_eq!(
        asked,
        [
            ("nodes=1-2", "resources.nodes: 1"),
            ("time=unlimited", "no time limit")
        ],
        "{shown}"
    );
    assert_eq!(overrides[0]["field"], "job.general", "{shown}");
    assert!(
        overrides[0]["why"]
            .as_str()
            .unwrap()
            .contains("tuxiv.conf:3:"),
        "{shown}"
    );
}

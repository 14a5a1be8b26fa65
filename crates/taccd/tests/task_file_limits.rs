//! Task-file sizes a node could not launch (an environment over the kernel's limits:
//! "Argument list too long") are refused before anything is uploaded: by `tcloud check`
//! and `tcloud submit` at the file, line and column, and by the server for a spec sent
//! to the API directly.

mod common;

use std::process::Command;

use common::*;

/// `tcloud ARGS` against `daemon`: (success, stderr).
fn tcloud_failing(daemon: &Daemon, home: &std::path::Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_var_or_run_line_is_refused_at_check_and_submit_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("d"), &[]).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();

    // 1 MiB in one variable (the finding submitted 20 MiB; anything past 128 KiB fails
    // at launch, and parsing megabytes of YAML in a debug build is slow).
    let blob = "b".repeat(1 << 20);
    let task = dir.path().join("vars");
    std::fs::create_dir_all(&task).unwrap();
    let file = task.join("task.yaml");
    std::fs::write(
        &file,
        format!("name: vars\nrun: echo hi\nenvironment:\n  vars:\n    BLOB: {blob}\n"),
    )
    .unwrap();
    let located = format!("{}:5:5", file.display());
    for command in ["check", "submit"] {
        let (ok, stderr) = tcloud_failing(&server, &home, &[command, task.to_str().unwrap()]);
        let shown: String = stderr.chars().take(2000).collect();
        assert!(!ok, "tcloud {command} accepted a 1 MiB variable");
        assert!(
            shown.contains(&located) && shown.contains("at most 64 KiB"),
            "tcloud {command}: {shown}"
        );
    }

    let long_run = dir.path().join("run");
    std::fs::create_dir_all(&long_run).unwrap();
    std::fs::write(
        long_run.join("task.yaml"),
        format!("name: run\nrun: echo {}\n", "r".repeat(200 << 10)),
    )
    .unwrap();
    let (ok, stderr) = tcloud_failing(&server, &home, &["submit", long_run.to_str().unwrap()]);
    let shown: String = stderr.chars().take(2000).collect();
    assert!(
        !ok && shown.contains("task.yaml:2:6") && shown.contains("`run` is"),
        "{shown}"
    );

    // A spec sent to the API directly is refused by the server, naming the field.
    let snapshot = upload(&server.client(), &task).await;
    let refused = server
        .client()
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::json!({
                "name": "api",
                "run": "echo hi",
                "environment": {"vars": {"BLOB": blob}},
            }),
            snapshot,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err()
        .to_string();
    let shown: String = refused.chars().take(2000).collect();
    assert!(
        shown.contains("environment.vars.BLOB") && shown.contains("at most 64 KiB"),
        "{shown}"
    );
}

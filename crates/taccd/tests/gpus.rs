//! Fake typed GPUs (`taccd dev --gpus N --gpu-type T`) on machines without any: the node
//! offers N GPUs of type T, tasks are placed by `gpu_type`, and each sees its own
//! `CUDA_VISIBLE_DEVICES`.

mod common;

use common::*;
use tacc_core::TaskState;

fn task(name: &str, gpu_type: &str, marker: &str, run: &str) -> String {
    format!(
        "name: {name}\nresources: {{cpus: 0.5, gpus: 1, gpu_type: {gpu_type}, time_limit: 5m}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: {run}\n"
    )
}

/// The `CUDA_VISIBLE_DEVICES` a task printed as `gpus=…`, once it has.
async fn visible_devices(client: &tacc_client::Client, id: tacc_core::TaskId) -> String {
    eventually("the task to print its GPUs", DEADLINE, || {
        let client = client.clone();
        async move {
            let (bytes, _) = client.logs(id, 0).await.ok()?;
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let line = text.lines().find_map(|l| l.strip_prefix("gpus="))?;
            Some(line.trim().to_string())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_placed_by_gpu_type_on_fake_gpus_and_see_their_own_devices() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        "dev",
        &dir.path().join("d"),
        &["--gpus", "2", "--gpu-type", "A100"],
    )
    .await;
    let admin = daemon.client();
    wait_nodes(&admin, 1).await;
    let nodes = admin.list_nodes().await.unwrap();
    assert_eq!(nodes[0].capacity.gpus, 2, "{nodes:?}");
    assert_eq!(nodes[0].gpu_type.as_deref(), Some("A100"), "{nodes:?}");

    let marker = format!("gpus-{}", std::process::id());
    let holding = "echo gpus=$CUDA_VISIBLE_DEVICES; sleep 300";
    let first = submit(
        &admin,
        dir.path(),
        "first",
        &task("first", "A100", &marker, holding),
        &[],
    )
    .await;
    wait_state(&admin, first, &[TaskState::Running]).await;
    let first_gpu = visible_devices(&admin, first).await;

    let second = submit(
        &admin,
        dir.path(),
        "second",
        &task("second", "A100", &marker, "echo gpus=$CUDA_VISIBLE_DEVICES"),
        &[],
    )
    .await;
    let done = wait_terminal(&admin, second).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    let second_gpu = visible_devices(&admin, second).await;
    let mut seen = [first_gpu.clone(), second_gpu.clone()];
    seen.sort();
    assert_eq!(
        seen,
        ["0", "1"],
        "first {first_gpu:?}, second {second_gpu:?}"
    );

    // No node has an H100: refused at submit, with a reason that names the type and the
    // types there are.
    let h100_dir = dir.path().join("h100");
    std::fs::create_dir_all(&h100_dir).unwrap();
    std::fs::write(
        h100_dir.join("task.yaml"),
        task("h100", "H100", &marker, "echo never"),
    )
    .unwrap();
    let loaded = tacc_schema::load_task(&h100_dir).unwrap();
    let refused = admin
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot: upload(&admin, &loaded.code_root).await,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("H100") && refused.contains("GPU types: A100"),
        "{refused}"
    );

    admin.cancel(first).await.unwrap();
    wait_terminal(&admin, first).await;
    wait_no_processes(&marker).await;
}

#[test]
fn a_gpu_type_without_gpus_on_a_machine_without_any_is_refused() {
    // What the agent finds through NVML.
    let has_gpus = tacc_agent::detect_gpus().0 > 0;
    if has_gpus {
        eprintln!("skipped: this machine has GPUs, so --gpu-type alone describes them");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--gpu-type",
            "A100",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--gpu-type A100") && stderr.contains("--gpus N"),
        "{stderr}"
    );
}

/// The idle-GPU policy through a real agent: its fake GPU plays a utilisation series from
/// a file (`--fake-gpu-readings`). While the GPU reads busy the task is left alone; once
/// it reads idle the owner is warned in the task log, then the task gets its checkpoint
/// signal, saves its state and is queued again; attempt 2 finds the checkpoint through
/// `$TACC_RESUME_FROM`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gpu_task_is_warned_then_checkpointed_and_requeued_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &[
            "--idle-gpu-for",
            "6s",
            "--idle-gpu-grace",
            "4s",
            "--idle-gpu-then",
            "checkpoint_and_requeue",
        ],
    )
    .await;
    let client = server.client();
    let readings = dir.path().join("gpu-readings");
    std::fs::write(&readings, "0 93\n").unwrap();
    let _agent = start_agent(
        &server,
        &dir.path().join("a"),
        &[
            "--gpus",
            "1",
            "--fake-gpu-readings",
            readings.to_str().unwrap(),
        ],
    );
    wait_nodes(&client, 1).await;
    let yaml = r#"name: idler
resources: {cpus: 0.5, gpus: 1, time_limit: 5m}
checkpoint: {signal: SIGUSR1, grace: 10s}
run: |
  echo "attempt $TACC_ATTEMPT resumes from ${TACC_RESUME_FROM:-nothing}"
  if [ -n "$TACC_RESUME_FROM" ]; then echo "found step $(cat "$TACC_RESUME_FROM/step")"; exit 0; fi
  trap 'echo 41 > "$TACC_CHECKPOINT_DIR/step"; echo "checkpointed"; exit 1' USR1
  sleep 300 & wait
"#;
    let task = submit(&client, dir.path(), "idler", yaml, &[]).await;
    let running = wait_state(&client, task, &[TaskState::Running]).await;
    assert_eq!(running.attempt.0, 1);
    // Busy for longer than the policy's window: nothing is said.
    let busy_until = std::time::Instant::now() + std::time::Duration::from_secs(9);
    eventually("the busy GPU to be sampled", DEADLINE, || {
        let client = client.clone();
        async move {
            let usage = client.task_usage(task).await.ok()?;
            let busy = usage
                .ranks
                .iter()
                .flat_map(|r| &r.gpus)
                .any(|g| g.utilization_percent == 93);
            (busy && std::time::Instant::now() >= busy_until).then_some(())
        }
    })
    .await;
    let log = log_text(&client, task).await;
    assert!(!log.contains("idle"), "a busy GPU was called idle:\n{log}");
    // Now it reads idle: a warning first, then the checkpoint and the requeue.
    std::fs::write(&readings, "0 1\n").unwrap();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2, "{view:?}");
    let log = log_text(&client, task).await;
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("no `{needle}` in the log:\n{log}"))
    };
    let warned = at(
        "tacc: its GPUs have been idle (below 5%) for 6s; the cluster's policy will checkpoint and requeue it in 4s unless they are used",
    );
    let saved = at("checkpointed\n");
    let resumed = at("found step 41\n");
    assert!(warned < saved && saved < resumed, "{log}");
    let events = client.task_events(task).await.unwrap();
    assert!(
        events.iter().any(|e| e.attempt.0 == 2
            && e.state == TaskState::Queued
            && e.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("idle GPUs: used below 5% for 6s"))),
        "{events:?}"
    );
}

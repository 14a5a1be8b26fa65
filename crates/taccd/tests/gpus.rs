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

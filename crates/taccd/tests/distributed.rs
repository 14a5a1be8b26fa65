//! The distributed-training environment on real agents (loopback): RANK, LOCAL_RANK,
//! WORLD_SIZE counting processes, one process per GPU, a MASTER_PORT per attempt, and the
//! first failing rank named with the others stopped. The same over separate network
//! namespaces is in `netns.rs`.

mod common;

use common::*;
use tacc_core::TaskState;

/// `processes: per_gpu` on two nodes of two fake GPUs each: four processes, each with its
/// own RANK and LOCAL_RANK, all agreeing on WORLD_SIZE and the rendezvous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_per_gpu_on_every_node_gets_its_rank() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let gpus = ["--gpus", "2", "--cpus", "2"];
    let _a = start_agent(
        &server,
        &dir.path().join("a"),
        &[&["--name", "gpu-a"][..], &gpus].concat(),
    );
    let _b = start_agent(
        &server,
        &dir.path().join("b"),
        &[&["--name", "gpu-b"][..], &gpus].concat(),
    );
    wait_nodes(&client, 2).await;
    let task = submit(
        &client,
        dir.path(),
        "ddp",
        "name: ddp\nresources: {nodes: 2, gpus: 2, cpus: 1, processes: per_gpu}\nrun: echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE localworld=$LOCAL_WORLD_SIZE node=$NODE_RANK tacc=$TACC_RANK/$TACC_WORLD_SIZE gpus=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT\"\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let log = log_text(&client, task).await;
    let mut masters = Vec::new();
    for rank in 0..4u32 {
        let (node, local) = (rank / 2, rank % 2);
        let expected = format!(
            "[{rank}] rank={rank} local={local} world=4 localworld=2 node={node} tacc={rank}/4 gpus="
        );
        let line = log
            .lines()
            .find(|line| line.starts_with(&expected))
            .unwrap_or_else(|| panic!("no line `{expected}…` in\n{log}"));
        masters.push(line.rsplit_once("master=").unwrap().1.to_string());
    }
    masters.dedup();
    assert_eq!(
        masters.len(),
        1,
        "every rank agrees on the rendezvous: {log}"
    );
}

/// Two attempts whose rank 0 runs on the same node at once get different ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attempts_on_one_node_get_different_master_ports() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start("dev", &dir.path().join("dev"), &["--cpus", "4"]).await;
    let client = cluster.client();
    wait_nodes(&client, 1).await;
    let marker = dir.path().join("go");
    let yaml = format!(
        "name: port\nresources: {{cpus: 1}}\nrun: |\n  echo \"port=$MASTER_PORT\"\n  until [ -e {} ]; do sleep 0.05; done\n",
        marker.display()
    );
    let first = submit(&client, dir.path(), "p1", &yaml, &[]).await;
    let second = submit(&client, dir.path(), "p2", &yaml, &[]).await;
    for task in [first, second] {
        wait_state(&client, task, &[TaskState::Running]).await;
    }
    let port_of = |log: String| {
        log.lines()
            .find_map(|l| l.strip_prefix("port="))
            .map(str::to_string)
    };
    let ports = eventually("both tasks to print their port", DEADLINE, || {
        let client = client.clone();
        async move {
            let a = port_of(log_text(&client, first).await)?;
            let b = port_of(log_text(&client, second).await)?;
            Some((a, b))
        }
    })
    .await;
    std::fs::write(&marker, "").unwrap();
    assert_ne!(ports.0, ports.1);
    for task in [first, second] {
        assert_eq!(
            wait_terminal(&client, task).await.state,
            TaskState::Succeeded
        );
    }
}

/// The first process to fail ends the attempt: it is named in the reason (rank, node,
/// local rank) and the other processes, on every node, are stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_failing_rank_is_named_and_the_others_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let _a = start_agent(
        &server,
        &dir.path().join("a"),
        &["--name", "fail-a", "--cpus", "4"],
    );
    let _b = start_agent(
        &server,
        &dir.path().join("b"),
        &["--name", "fail-b", "--cpus", "4"],
    );
    wait_nodes(&client, 2).await;
    let marker = format!("tacc-rank-marker-{}", std::process::id());
    // Rank 3 fails once every other rank is up (the tasks run as unprivileged users).
    let barrier = dir.path().join("barrier");
    std::fs::create_dir(&barrier).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        &barrier,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let task = submit(
        &client,
        dir.path(),
        "failing",
        &format!(
            "name: failing\nresources: {{nodes: 2, cpus: 2, processes: 2}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  if [ \"$RANK\" = 3 ]; then\n    until [ \"$(ls {barrier} | wc -l)\" -ge 3 ]; do sleep 0.05; done\n    echo giving up; exit 7\n  fi\n  touch {barrier}/$RANK\n  exec sleep 300\n",
            barrier = barrier.display()
        ),
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert_eq!(view.exit_code, Some(7), "{view:?}");
    let reason = view.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("rank 3 (node fail-b, local rank 1)") && reason.contains("exit code 7"),
        "{reason}"
    );
    assert!(reason.contains("other ranks were stopped"), "{reason}");
    wait_no_processes(&marker).await;
    let log = log_text(&client, task).await;
    assert!(log.contains("[3] giving up"), "{log}");
}

/// A multi-node attempt succeeds only when every rank has: a rank that finishes early
/// does not end the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_succeeds_only_when_every_rank_has() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let _a = start_agent(&server, &dir.path().join("a"), &["--name", "early-a"]);
    let _b = start_agent(&server, &dir.path().join("b"), &["--name", "early-b"]);
    wait_nodes(&client, 2).await;
    let task = submit(
        &client,
        dir.path(),
        "uneven",
        "name: uneven\nresources: {nodes: 2, cpus: 1}\nrun: |\n  if [ \"$RANK\" = 1 ]; then sleep 2; echo rank 1 done late; fi\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let log = log_text(&client, task).await;
    assert!(log.contains("[1] rank 1 done late"), "{log}");
}

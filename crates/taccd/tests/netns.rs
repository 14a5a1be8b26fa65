//! A real multi-machine cluster: the server listens on a bridge, every agent runs in a
//! network namespace of its own (its own address, reaching the server over the bridge and
//! advertising the address it reaches it from), over TLS with a pinned certificate, as
//! on separate machines. The network comes from scripts/ci/setup-netns.sh.
//!
//! Without those namespaces these tests say SKIPPED loudly and pass — except in CI
//! (`CI=true`), where a missing network is a failure.

mod common;

use std::time::{Duration, Instant};

use common::netns::*;
use common::*;
use tacc_core::TaskState;

/// Ranks meet at MASTER_ADDR:MASTER_PORT over TCP: every other rank sends 10 × its rank to
/// rank 0, which answers with the sum.
const RENDEZVOUS: &str = r#"import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
mine = [a for a in os.popen("hostname -I").read().split() if a.startswith("10.250.78.")]
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen()
    total, peers = 0, []
    for _ in range(world - 1):
        conn, _ = server.accept()
        total += int(conn.recv(64))
        peers.append(conn)
    for conn in peers:
        conn.sendall(str(total).encode())
        conn.close()
    print(f"rank 0 at {mine} served {addr}:{port} sum {total}", flush=True)
else:
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(str(10 * rank).encode())
    print(f"rank {rank} at {mine} got {conn.recv(64).decode()} from {addr}:{port}", flush=True)
"#;

fn gang_yaml(name: &str) -> String {
    let script = RENDEZVOUS
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect::<String>();
    format!(
        "name: {name}\nresources: {{nodes: 3, cpus: 1, memory: 256MiB}}\nrun: |\n  python3 - <<'EOF'\n{script}  EOF\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_meets_at_rank_zeros_address_across_hosts() {
    if !network_ready("a_gang_meets_at_rank_zeros_address_across_hosts") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=3)
        .map(|h| cluster.agent(h, &format!("gang-h{h}"), &["--cpus", "2"]))
        .collect();
    wait_nodes(&cluster.client, 3).await;
    let task = cluster.submit("gang", &gang_yaml("gang")).await;
    let view = wait_terminal(&cluster.client, task).await;
    let log = log_text(&cluster.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    // Rank 0's address is its host's address on the bridge, never loopback.
    let master_host: u32 = view.nodes[0].trim_start_matches("gang-h").parse().unwrap();
    let master = format!("{}:", host_address(master_host));
    assert!(
        log.contains(&format!("[0] rank 0 at ['{}']", host_address(master_host))),
        "{log}"
    );
    for rank in 1..3 {
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("[{rank}] rank {rank} at ")))
            .unwrap_or_else(|| panic!("no line of rank {rank}:\n{log}"));
        assert!(
            line.contains(" got 30 from ") && line.contains(&master),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gangs_with_rank_zero_on_one_host_run_at_once() {
    if !network_ready("two_gangs_with_rank_zero_on_one_host_run_at_once") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=3)
        .map(|h| cluster.agent(h, &format!("two-h{h}"), &["--cpus", "2"]))
        .collect();
    wait_nodes(&cluster.client, 3).await;
    let first = cluster.submit("gang-a", &gang_yaml("gang-a")).await;
    let second = cluster.submit("gang-b", &gang_yaml("gang-b")).await;
    let a = wait_terminal(&cluster.client, first).await;
    let b = wait_terminal(&cluster.client, second).await;
    assert_eq!(a.state, TaskState::Succeeded, "{a:?}");
    assert_eq!(b.state, TaskState::Succeeded, "{b:?}");
    // Both ran at once (each needs every host), with rank 0 on the same host.
    assert!(a.started_at.unwrap() < b.finished_at.unwrap());
    assert!(b.started_at.unwrap() < a.finished_at.unwrap());
    assert_eq!(a.nodes[0], b.nodes[0], "{a:?} {b:?}");
    let port = |log: String| {
        let line = log
            .lines()
            .find(|l| l.starts_with("[0] rank 0"))
            .unwrap()
            .to_string();
        line.rsplit_once(':')
            .unwrap()
            .1
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let (port_a, port_b) = (
        port(log_text(&cluster.client, first).await),
        port(log_text(&cluster.client, second).await),
    );
    assert_ne!(port_a, port_b, "two rendezvous on one host need two ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_every_rank_arrive_while_the_task_runs() {
    if !network_ready("logs_of_every_rank_arrive_while_the_task_runs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=3)
        .map(|h| cluster.agent(h, &format!("logs-h{h}"), &[]))
        .collect();
    wait_nodes(&cluster.client, 3).await;
    let release = dir.path().join("release");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let task = cluster
        .submit(
            "chatty",
            &format!(
                "name: chatty\nresources: {{nodes: 3, cpus: 0.5}}\nrun: |\n  i=0\n  until [ -e {} ]; do echo \"tick $i from rank $RANK\"; i=$((i+1)); sleep 0.1; done\n",
                release.display()
            ),
        )
        .await;
    eventually("a line of every rank while the task runs", DEADLINE, || {
        let client = cluster.client.clone();
        async move {
            let log = log_text(&client, task).await;
            (0..3)
                .all(|r| log.contains(&format!("[{r}] tick 2 from rank {r}")))
                .then_some(())
        }
    })
    .await;
    let view = cluster.client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Running);
    std::fs::write(&release, "").unwrap();
    assert_eq!(
        wait_terminal(&cluster.client, task).await.state,
        TaskState::Succeeded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_every_rank_on_every_host_with_setsid_children() {
    if !network_ready("cancel_stops_every_rank_on_every_host_with_setsid_children") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=3)
        .map(|h| cluster.agent(h, &format!("cancel-h{h}"), &[]))
        .collect();
    wait_nodes(&cluster.client, 3).await;
    let marker = format!("netns-cancel-{}", std::process::id());
    let task = cluster
        .submit(
            "escape",
            &format!(
                "name: escape\nresources: {{nodes: 3, cpus: 0.5}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  setsid sleep 600 &\n  echo \"rank $RANK started its escapee\"\n  sleep 600\n"
            ),
        )
        .await;
    eventually("every rank and its escapee running", DEADLINE, || {
        let marker = marker.clone();
        async move { (task_processes(&marker).len() >= 6).then_some(()) }
    })
    .await;
    cluster.client.cancel(task).await.unwrap();
    let view = wait_terminal(&cluster.client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    wait_no_processes(&marker).await;
}

on_both_stores!(
    a_killed_agents_task_is_retried_on_another_host,
    threads = 2,
    needs = network_ready,
    run = killed_agent
);

/// R5, an agent killed: its watchdog kills its task at once, before the server loses the
/// node, and the task is retried on another host.
async fn killed_agent(backend: Backend) {
    // The hosts' agents are named per test: both stores' variants may run at once.
    let (h2, h3) = match backend {
        Backend::Sqlite => ("kill-h2", "kill-h3"),
        Backend::Postgres(_) => ("kill-pg-h2", "kill-pg-h3"),
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &backend.with(&["--heartbeat-timeout", "3"])).await;
    let mut first = cluster.agent(2, h2, &[]);
    wait_nodes(&cluster.client, 1).await;
    let marker = format!("netns-kill-{}-{}", backend.name(), std::process::id());
    let task = cluster
        .submit(
            "survivor",
            &format!(
                "name: survivor\nresources: {{cpus: 0.5}}\nretry: {{max_attempts: 2, on: [node_failure]}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  echo \"attempt $TACC_ATTEMPT on $(hostname -I)\"\n  if [ \"$TACC_ATTEMPT\" = 1 ]; then sleep 600; fi\n"
            ),
        )
        .await;
    wait_state(&cluster.client, task, &[TaskState::Running]).await;
    let _second = cluster.agent(3, h3, &[]);
    wait_nodes(&cluster.client, 2).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // Its watchdog kills the attempt at once: gone before the server even loses the node.
    wait_no_processes(&marker).await;
    let view = cluster.client.get_task(task).await.unwrap();
    assert_eq!(view.attempt.0, 1, "retried while attempt 1 ran: {view:?}");
    let view = wait_terminal(&cluster.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2);
    assert_eq!(view.nodes, vec![h3.to_string()]);
    let log = log_text(&cluster.client, task).await;
    assert!(
        log.contains(&format!("attempt 2 on {}", host_address(3))),
        "{log}"
    );
    // The killed agent, started again, finds nothing of its previous life running.
    let _again = cluster.agent(2, h2, &[]);
    wait_no_processes(&marker).await;
}

/// Host 4's link goes down in the cut-off scenario: one variant at a time has it.
static HOST_4: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

on_both_stores!(
    a_cut_off_host_stops_its_attempt_before_the_retry_and_rejoins,
    threads = 2,
    needs = network_ready,
    run = cut_off_host
);

/// R5, a host partitioned (its namespace's link taken down): its agent stops the attempt
/// itself before the server may retry it elsewhere, and the healed host rejoins with
/// nothing of the old attempt left.
async fn cut_off_host(backend: Backend) {
    let _host_4 = HOST_4.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let timeout = 6;
    let timeout_arg = timeout.to_string();
    let cluster = Cluster::start(
        dir.path(),
        &backend.with(&["--heartbeat-timeout", &timeout_arg]),
    )
    .await;
    // Host 4 is this test's alone: its link goes down.
    let _cut = cluster.agent(4, "cut-h4", &[]);
    wait_nodes(&cluster.client, 1).await;
    let marker = format!("netns-cut-{}-{}", backend.name(), std::process::id());
    let task = cluster
        .submit(
            "fenced",
            &format!(
                "name: fenced\nresources: {{cpus: 0.5}}\nretry: {{max_attempts: 2, on: [node_failure]}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  if [ \"$TACC_ATTEMPT\" = 1 ]; then exec sleep 7001; fi\n  echo \"attempt 2 sees $(ps -eo args | grep -c '^sleep 7001') sleeper(s)\"\n"
            ),
        )
        .await;
    wait_state(&cluster.client, task, &[TaskState::Running]).await;
    eventually("attempt 1 running on the cut-off host", DEADLINE, || {
        let marker = marker.clone();
        async move { (!task_processes(&marker).is_empty()).then_some(()) }
    })
    .await;
    let _other = cluster.agent(1, "cut-h1", &[]);
    wait_nodes(&cluster.client, 2).await;

    let guard = LinkGuard(4);
    set_link(4, false);
    let cut_at = Instant::now();
    // The cut-off agent stops its attempt by itself, before the server may retry it.
    wait_no_processes(&marker).await;
    let fenced_after = cut_at.elapsed();
    assert!(
        fenced_after < Duration::from_secs(timeout),
        "self-fencing took {fenced_after:?}, longer than the {timeout}s heartbeat timeout"
    );
    let view = wait_terminal(&cluster.client, task).await;
    let log = log_text(&cluster.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert_eq!(view.attempt.0, 2);
    assert_eq!(view.nodes, vec!["cut-h1".to_string()]);
    assert!(log.contains("attempt 2 sees 0 sleeper(s)"), "{log}");
    let events = cluster.client.task_events(task).await.unwrap();
    assert!(
        events.iter().any(|e| e.state == TaskState::Lost),
        "{events:?}"
    );

    // Healed, the host joins again and takes work; nothing of the old attempt returns.
    drop(guard);
    eventually("the healed host back up", DEADLINE, || {
        let client = cluster.client.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            nodes
                .iter()
                .any(|n| n.name == "cut-h4" && n.state == "up")
                .then_some(())
        }
    })
    .await;
    assert!(task_processes(&marker).is_empty());
    let after = cluster.client.get_task(task).await.unwrap();
    assert_eq!(after.state, TaskState::Succeeded);
    assert_eq!(after.attempt.0, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_fake_gpus_place_tasks_on_the_host_with_that_model() {
    if !network_ready("typed_fake_gpus_place_tasks_on_the_host_with_that_model") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _a100 = cluster.agent(1, "gpu-h1", &["--gpus", "2", "--gpu-type", "A100"]);
    let _h100 = cluster.agent(2, "gpu-h2", &["--gpus", "2", "--gpu-type", "H100"]);
    wait_nodes(&cluster.client, 2).await;
    let task = cluster
        .submit(
            "typed",
            "name: typed\nresources: {gpus: 1, gpu_type: H100, cpus: 0.5}\nrun: echo \"gpus $CUDA_VISIBLE_DEVICES on $(hostname -I)\"\n",
        )
        .await;
    let view = wait_terminal(&cluster.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.nodes, vec!["gpu-h2".to_string()]);
    let log = log_text(&cluster.client, task).await;
    assert!(log.contains(&host_address(2)), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_host_finishes_its_task_and_a_removed_one_is_gone() {
    if !network_ready("a_drained_host_finishes_its_task_and_a_removed_one_is_gone") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &["--heartbeat-timeout", "3"]).await;
    let _first = cluster.agent(1, "drain-h1", &["--cpus", "1"]);
    wait_nodes(&cluster.client, 1).await;
    let release = dir.path().join("release");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let running = cluster
        .submit(
            "long",
            &format!(
                "name: long\nresources: {{cpus: 1}}\nrun: until [ -e {} ]; do sleep 0.05; done\n",
                release.display()
            ),
        )
        .await;
    wait_state(&cluster.client, running, &[TaskState::Running]).await;
    let mut second = cluster.agent(2, "drain-h2", &["--cpus", "1"]);
    wait_nodes(&cluster.client, 2).await;

    // Draining h1 lets its task run on; the next task goes to h2.
    cluster.client.drain_node("drain-h1", false).await.unwrap();
    let next = cluster
        .submit(
            "next",
            "name: next\nresources: {cpus: 1}\nrun: hostname -I\n",
        )
        .await;
    let view = wait_terminal(&cluster.client, next).await;
    assert_eq!(view.nodes, vec!["drain-h2".to_string()], "{view:?}");
    assert!(
        log_text(&cluster.client, next)
            .await
            .contains(&host_address(2))
    );
    assert_eq!(
        cluster.client.get_task(running).await.unwrap().state,
        TaskState::Running
    );
    std::fs::write(&release, "").unwrap();
    assert_eq!(
        wait_terminal(&cluster.client, running).await.state,
        TaskState::Succeeded
    );
    cluster.client.drain_node("drain-h1", true).await.unwrap();

    // h2's machine goes away for good: down, then removed.
    second.child.kill().unwrap();
    second.child.wait().unwrap();
    eventually("h2 down", DEADLINE, || {
        let client = cluster.client.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            nodes
                .iter()
                .any(|n| n.name == "drain-h2" && n.state == "down")
                .then_some(())
        }
    })
    .await;
    cluster.client.remove_node("drain-h2").await.unwrap();
    let names: Vec<String> = cluster
        .client
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["drain-h1".to_string()]);
}

/// The hang that burns GPUs: rank 2 of a 3-host gang exits 0 at once while ranks 0–1 sit
/// silent (no output, no CPU). With `on_hang: {after: 5s, then: retry}` the attempt is
/// ended within the silence and a sample interval or two, the reason naming rank 2, its
/// processes stopped on every host, and the task runs again as attempt 2; a gang whose
/// ranks keep printing is never ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_gang_is_ended_and_retried_and_a_busy_one_is_not() {
    if !network_ready("a_hung_gang_is_ended_and_retried_and_a_busy_one_is_not") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=3)
        .map(|h| cluster.agent(h, &format!("hang-h{h}"), &["--cpus", "2"]))
        .collect();
    wait_nodes(&cluster.client, 3).await;
    let marker = format!("netns-hang-{}", std::process::id());
    let hung = cluster
        .submit(
            "hung",
            &format!(
                "name: hung\nresources: {{nodes: 3, cpus: 0.5}}\n\
                 on_hang: {{after: 5s, then: retry}}\n\
                 environment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  \
                 echo \"rank $NODE_RANK attempt $TACC_ATTEMPT\"\n  \
                 if [ \"$NODE_RANK\" = 2 ] || [ \"$TACC_ATTEMPT\" = 2 ]; then exit 0; fi\n  \
                 sleep 600\n"
            ),
        )
        .await;
    let busy = cluster
        .submit(
            "busy",
            "name: busy\nresources: {nodes: 3, cpus: 0.5}\non_hang: {after: 5s}\nrun: |\n  \
             for i in $(seq 1 40); do echo \"step $i\"; sleep 0.5; done\n",
        )
        .await;
    let started = Instant::now();
    let view = wait_terminal(&cluster.client, hung).await;
    let events = cluster.client.task_events(hung).await.unwrap();
    let failed = events
        .iter()
        .find(|e| e.state == TaskState::Failed)
        .unwrap_or_else(|| panic!("the hung attempt ended failed: {events:?}"));
    let reason = failed.reason.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with("hung: rank 2 exited 0 at ") && reason.contains("ranks 0–1 silent"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "ended within the silence and a few samples: {:?}",
        started.elapsed()
    );
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2, "retried once: {view:?}");
    wait_no_processes(&marker).await;
    let busy = wait_terminal(&cluster.client, busy).await;
    assert_eq!(busy.state, TaskState::Succeeded, "{busy:?}");
    assert_eq!(busy.attempt.0, 1, "{busy:?}");
}

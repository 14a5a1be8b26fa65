//! TACC on a real Slurm cluster: `taccd server` plus `taccd agent --backend slurm`, real
//! `sbatch`/`squeue`/`scancel`, and real `slurmd` hosts (scripts/ci/setup-slurm.sh starts
//! two, each in its own network namespace with its own host name).
//!
//! Without Slurm these tests say SKIPPED loudly and pass — except in CI (`CI=true`),
//! where a missing Slurm is a failure.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use tacc_core::{TaskId, TaskState};
use tokio::sync::Mutex;

/// The tests share one small cluster; one at a time keeps them deterministic.
static CLUSTER: Mutex<()> = Mutex::const_new(());

/// `sinfo`'s line per node: `NAME STATE` (short state names: `idle`, `mix`, `comp`, …).
fn node_states() -> std::io::Result<std::process::Output> {
    Command::new("sinfo")
        .args(["-h", "-N", "-o", "%N %t"])
        .output()
}

/// Whether Slurm answers with at least two usable nodes; panics in CI when it does not.
/// Nodes an earlier test left `completing` (or otherwise busy) are waited for, up to a
/// deadline: that state passes, it does not mean Slurm is missing.
async fn slurm_ready(test: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (output, usable) = loop {
        let output = node_states();
        let (listed, usable) = match &output {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let usable = text
                    .lines()
                    .filter(|l| l.contains("idle") || l.contains("mix") || l.contains("alloc"))
                    .count();
                (text.lines().count(), usable)
            }
            _ => (0, 0),
        };
        if usable >= 2 || listed < 2 || Instant::now() > deadline {
            break (output, usable);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if usable >= 2 {
        return true;
    }
    let why = match output {
        Err(e) => format!("sinfo cannot run: {e}"),
        Ok(out) => format!(
            "sinfo lists {usable} usable node(s): {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: Slurm is required in CI but is not usable ({why}); run scripts/ci/setup-slurm.sh"
        );
    }
    // Straight to the terminal: the test harness swallows eprintln! of passing tests.
    use std::io::Write;
    let _ = write!(
        std::io::stderr(),
        "\n######## SKIPPED {test}: no Slurm cluster here ({why}).\n######## Run `sudo scripts/ci/setup-slurm.sh` (or scripts/test.sh as root) to test against real Slurm.\n"
    );
    false
}

/// Wait until every Slurm node is idle: a benchmark phase starts on a cluster no earlier
/// phase still occupies (Slurm cleans up after a job for a while after it ended).
async fn wait_all_nodes_idle() {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = node_states().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().count() > 0
            && text
                .lines()
                .all(|line| line.split_whitespace().nth(1) == Some("idle"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Slurm's nodes are not idle: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct SlurmCluster {
    _server: Daemon,
    agent: Daemon,
    agent_dir: std::path::PathBuf,
    tag: String,
    client: tacc_client::Client,
}

async fn cluster(dir: &std::path::Path, name: &str) -> SlurmCluster {
    let server = start("server", &dir.join("server"), &[]).await;
    let tag = format!("t{}-{name}", std::process::id());
    let agent_dir = dir.join("agent");
    let agent = start_slurm_agent(&server, &agent_dir, &tag);
    let client = server.client();
    wait_nodes(&client, 2).await;
    SlurmCluster {
        agent,
        agent_dir,
        tag,
        client,
        _server: server,
    }
}

fn start_slurm_agent(server: &Daemon, dir: &std::path::Path, tag: &str) -> Daemon {
    // One join token enrols every node of the partition.
    start_agent_enrolling(
        server,
        dir,
        &["--nodes", "16"],
        &[
            "--backend",
            "slurm",
            "--slurm-tag",
            tag,
            "--slurm-poll-ms",
            "100",
        ],
    )
}

/// Slurm jobs of this test: (job id, state) for comments `tacc:<tag>/…`.
fn jobs_of(tag: &str) -> Vec<(u64, String)> {
    let out = Command::new("squeue")
        .args(["-h", "-t", "all", "-o", "%i|%T|%k"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, '|');
            let id = f.next()?.parse().ok()?;
            let state = f.next()?.to_string();
            let comment = f.next()?;
            comment
                .starts_with(&format!("tacc:{tag}/"))
                .then_some((id, state))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_single_node_task_streams_logs_live() {
    if !slurm_ready("slurm_single_node_task_streams_logs_live").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), "single").await;
    let task = submit(
        &c.client,
        dir.path(),
        "single",
        "name: single\nrun: |\n  echo \"first line from $(hostname) job $SLURM_JOB_ID rank $TACC_NODE_RANK of $WORLD_SIZE\"\n  echo to-stderr >&2\n  sleep 3\n  echo last line\n",
        &[],
    )
    .await;
    // Live: the first line arrives while the job still runs.
    let early = wait_log(&c.client, task, "first line from tacc-n").await;
    assert!(!early.contains("last line"), "{early}");
    let view = c.client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Running, "{view:?}");
    let mut follow = c.client.follow_logs(task, 0).await.unwrap();
    let mut followed = Vec::new();
    while let Some(chunk) = follow.next().await {
        followed.extend_from_slice(&chunk.unwrap());
    }
    let followed = String::from_utf8(followed).unwrap();
    let view = wait_terminal(&c.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{followed}");
    assert!(
        followed.contains("rank 0 of 1")
            && followed.contains("to-stderr")
            && followed.contains("last line"),
        "{followed}"
    );
    let jobs = jobs_of(&c.tag);
    assert_eq!(jobs.len(), 1, "one Slurm job per attempt: {jobs:?}");
    // The attempt ends on the ranks' exit files; Slurm may still be COMPLETING the job.
    eventually("Slurm to complete the job", DEADLINE, || async {
        let jobs = jobs_of(&c.tag);
        (jobs.len() == 1 && jobs[0].1 == "COMPLETED").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_multi_node_task_has_every_rank_in_the_log() {
    if !slurm_ready("slurm_multi_node_task_has_every_rank_in_the_log").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), "multi").await;
    let task = submit(
        &c.client,
        dir.path(),
        "multi",
        "name: multi\nresources: {nodes: 2}\nrun: |\n  echo \"rank $NODE_RANK/$TACC_NODE_RANK of $WORLD_SIZE on $(hostname) master $MASTER_ADDR:$MASTER_PORT task $TACC_TASK_ID\"\n",
        &[],
    )
    .await;
    let view = wait_terminal(&c.client, task).await;
    let log = log_text(&c.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert!(log.contains("[0] rank 0/0 of 2 on tacc-n"), "{log}");
    assert!(log.contains("[1] rank 1/1 of 2 on tacc-n"), "{log}");
    assert!(
        log.contains("on tacc-n1") && log.contains("on tacc-n2"),
        "{log}"
    );
    // Every rank sees rank 0's address as the master.
    assert_eq!(log.matches("master 10.250.77.").count(), 2, "{log}");
    assert_eq!(jobs_of(&c.tag).len(), 1, "one job for the whole gang");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcloud_exec_into_a_slurm_task_runs_a_step_of_its_job_on_the_rank_s_node() {
    if !slurm_ready("tcloud_exec_into_a_slurm_task_runs_a_step_of_its_job_on_the_rank_s_node").await
    {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), "exec").await;
    let task = submit(
        &c.client,
        dir.path(),
        "exec",
        "name: exec\nresources: {nodes: 2}\nenvironment:\n  vars: {GREETING: hello-slurm}\nrun: |\n  echo ready on $(hostname)\n  sleep 300\n",
        &[],
    )
    .await;
    eventually("both ranks to run", DEADLINE, || {
        let client = c.client.clone();
        async move {
            let log = log_text(&client, task).await;
            (log.matches("ready on tacc-n").count() == 2).then_some(())
        }
    })
    .await;
    let view = c.client.get_task(task).await.unwrap();
    let jobs = jobs_of(&c.tag);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let home = dir.path().join("home");
    let script = "echo job=$SLURM_JOB_ID; echo host=$(hostname); echo rank=$TACC_NODE_RANK; \
                  echo greeting=$GREETING; echo pwd-is-workdir=$(test \"$(pwd)\" = \"$TACC_WORKDIR\" && echo yes)";
    let out = tcloud(
        &c._server,
        &home,
        &[
            "exec",
            &task.to_string(),
            "--rank",
            "1",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    };
    assert_eq!(field("job"), Some(jobs[0].0.to_string()), "{out}");
    assert_eq!(
        field("host").as_deref(),
        Some(view.nodes[1].as_str()),
        "{out}"
    );
    assert_eq!(field("rank").as_deref(), Some("1"), "{out}");
    assert_eq!(field("greeting").as_deref(), Some("hello-slurm"), "{out}");
    assert_eq!(field("pwd-is-workdir").as_deref(), Some("yes"), "{out}");
    c.client.cancel(task).await.unwrap();
    wait_terminal(&c.client, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_cancel_of_a_running_and_of_a_pending_job() {
    if !slurm_ready("slurm_cancel_of_a_running_and_of_a_pending_job").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), "cancel").await;

    let running = submit(
        &c.client,
        dir.path(),
        "running",
        "name: running\nrun: |\n  echo started\n  sleep 300\n",
        &[],
    )
    .await;
    wait_log(&c.client, running, "started").await;
    c.client.cancel(running).await.unwrap();
    let view = wait_terminal(&c.client, running).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    // The task gets its stop signal (SIGTERM here) first and ends by it within its grace,
    // so Slurm records the job by the task's own end (FAILED, exit 143), not CANCELLED.
    eventually("the running job ended in Slurm", DEADLINE, || async {
        jobs_of(&c.tag)
            .iter()
            .all(|(_, s)| s == "FAILED" || s == "CANCELLED")
            .then_some(())
    })
    .await;

    // Fill the cluster outside TACC, so TACC's next job has to wait in Slurm's queue.
    let blocker = Command::new("sbatch")
        .args([
            "--parsable",
            "--nodes=2",
            "--exclusive",
            "--job-name=tacc-test-blocker",
            "--output=/dev/null",
            "--wrap",
            "sleep 300",
        ])
        .output()
        .unwrap();
    let blocker = String::from_utf8_lossy(&blocker.stdout).trim().to_string();
    let pending = submit(
        &c.client,
        dir.path(),
        "pending",
        "name: pending\nrun: echo should never run\n",
        &[],
    )
    .await;
    let log = wait_log(&c.client, pending, "is pending").await;
    assert!(!log.contains("should never run"), "{log}");
    c.client.cancel(pending).await.unwrap();
    let view = wait_terminal(&c.client, pending).await;
    // Only now may the cluster free up: the cancelled job must not start meanwhile.
    let _ = Command::new("scancel").arg(&blocker).status();
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    let log = log_text(&c.client, pending).await;
    assert!(!log.contains("should never run"), "{log}");
    eventually("both jobs ended in Slurm", DEADLINE, || async {
        let jobs = jobs_of(&c.tag);
        let ended = jobs.iter().all(|(_, s)| s == "FAILED" || s == "CANCELLED");
        // A pending job has no process to signal: it is cancelled at once.
        let cancelled = jobs.iter().filter(|(_, s)| s == "CANCELLED").count();
        (jobs.len() == 2 && ended && cancelled >= 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_time_limit_stops_the_job() {
    if !slurm_ready("slurm_time_limit_stops_the_job").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), "limit").await;
    let started = Instant::now();
    let task = submit(
        &c.client,
        dir.path(),
        "limit",
        "name: limit\nresources: {time_limit: 2s}\nrun: |\n  echo working\n  sleep 300\n",
        &[],
    )
    .await;
    let view = wait_terminal(&c.client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert_eq!(
        view.reason.as_deref(),
        Some("time limit reached"),
        "{view:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(log_text(&c.client, task).await.contains("working"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_agent_restart_refinds_the_running_job() {
    if !slurm_ready("slurm_agent_restart_refinds_the_running_job").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(dir.path(), "restart").await;
    let task = submit(
        &c.client,
        dir.path(),
        "restart",
        "name: restart\nrun: |\n  echo before restart\n  sleep 5\n  echo after restart\n",
        &[],
    )
    .await;
    wait_log(&c.client, task, "before restart").await;
    c.agent.kill9();
    c.agent = start_slurm_agent(&c._server, &c.agent_dir, &c.tag);
    let view = wait_terminal(&c.client, task).await;
    let log = log_text(&c.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert_eq!(view.attempt.0, 1, "not retried: {view:?}");
    assert_eq!(log.matches("before restart").count(), 1, "{log}");
    assert_eq!(log.matches("after restart").count(), 1, "{log}");
    let jobs = jobs_of(&c.tag);
    assert_eq!(jobs.len(), 1, "re-found, not resubmitted: {jobs:?}");
}

/// A job re-found after an agent restart is stopped as its launch asked: the gang
/// manifest keeps the checkpoint signal and grace, so a cancel after the restart still
/// reaches the task as SIGUSR1 (a plain `scancel`'s SIGTERM would kill it unsaved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_a_refound_job_still_gets_its_checkpoint_signal() {
    if !slurm_ready("slurm_a_refound_job_still_gets_its_checkpoint_signal").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(dir.path(), "refound-signal").await;
    let task = submit(
        &c.client,
        dir.path(),
        "refound-signal",
        "name: refound-signal\n\
         checkpoint: {signal: SIGUSR1, grace: 5s}\n\
         run: |\n\
         \x20 trap 'echo \"saved on USR1 at tick $i\"; exit 0' USR1\n\
         \x20 i=0\n\
         \x20 while :; do i=$((i+1)); echo \"tick $i\"; sleep 0.3 & wait $!; done\n",
        &[],
    )
    .await;
    wait_log(&c.client, task, "tick 2\n").await;
    c.agent.kill9();
    c.agent = start_slurm_agent(&c._server, &c.agent_dir, &c.tag);
    // The re-found job's output flowing again means its new supervisor has it.
    let before = log_text(&c.client, task).await;
    let last_tick = before
        .lines()
        .filter_map(|l| l.strip_prefix("tick ")?.trim().parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    wait_log(&c.client, task, &format!("tick {}\n", last_tick + 3)).await;
    c.client.cancel(task).await.unwrap();
    let view = wait_terminal(&c.client, task).await;
    let log = log_text(&c.client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}\n{log}");
    assert_eq!(log.matches("saved on USR1").count(), 1, "{log}");
    let jobs = jobs_of(&c.tag);
    assert_eq!(jobs.len(), 1, "re-found, not resubmitted: {jobs:?}");
}

/// One server, a process agent and a Slurm agent: agents say what they run as labels,
/// `runtime: slurm` waits (explained) until a Slurm agent registers and then runs there
/// as a Slurm job, `placement.labels` picks the process agent, and a task whose labels
/// no node carries stays queued with a reason that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_agents_beside_process_agents_are_chosen_by_runtime_and_labels() {
    if !slurm_ready("slurm_agents_beside_process_agents_are_chosen_by_runtime_and_labels").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("server"), &[]).await;
    let client = server.client();
    let _local = start_agent(
        &server,
        &dir.path().join("local"),
        &["--name", "local-1", "--label", "pool=local"],
    );
    wait_nodes(&client, 1).await;

    // No Slurm node yet: accepted, and it waits with a reason and advice.
    let script = "  echo \"job=${SLURM_JOB_ID:-none} host=$(hostname)\"\n";
    let on_slurm = submit(
        &client,
        dir.path(),
        "on-slurm",
        &format!(
            "name: on-slurm\nruntime: slurm\nplacement: {{partition: debug}}\nrun: |\n{script}"
        ),
        &[],
    )
    .await;
    let why = wait_reason(&client, on_slurm, "no node can run it yet").await;
    let reason = why.reason.clone().unwrap();
    assert!(
        reason.contains("tacc.io/runtime.slurm=true")
            && reason.contains("tacc.io/slurm-partition=debug"),
        "{why:?}"
    );
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("taccd agent --backend slurm")),
        "{why:?}"
    );
    assert_eq!(why.estimated_start, None, "{why:?}");

    let tag = format!("t{}-beside", std::process::id());
    let _slurm = start_agent_enrolling(
        &server,
        &dir.path().join("slurm-agent"),
        &["--nodes", "16"],
        &[
            "--backend",
            "slurm",
            "--slurm-tag",
            &tag,
            "--slurm-poll-ms",
            "100",
            "--label",
            "pool=hpc",
        ],
    );
    wait_nodes(&client, 3).await;
    let nodes = client.list_nodes().await.unwrap();
    let label = |name: &str, key: &str| {
        nodes
            .iter()
            .find(|n| n.name == name)
            .and_then(|n| n.labels.get(key).cloned())
    };
    assert_eq!(
        label("local-1", "tacc.io/runtime.process").as_deref(),
        Some("true"),
        "{nodes:?}"
    );
    assert_eq!(
        label("local-1", "pool").as_deref(),
        Some("local"),
        "{nodes:?}"
    );
    assert_eq!(label("local-1", "tacc.io/runtime.slurm"), None, "{nodes:?}");
    for slurm_node in ["tacc-n1", "tacc-n2"] {
        assert_eq!(
            label(slurm_node, "tacc.io/runtime.slurm").as_deref(),
            Some("true"),
            "{nodes:?}"
        );
        assert_eq!(
            label(slurm_node, "tacc.io/slurm-partition").as_deref(),
            Some("debug"),
            "{nodes:?}"
        );
        assert_eq!(
            label(slurm_node, "pool").as_deref(),
            Some("hpc"),
            "{nodes:?}"
        );
        assert_eq!(
            label(slurm_node, "tacc.io/runtime.process"),
            None,
            "{nodes:?}"
        );
    }

    // The Slurm node registered: the waiting task runs there, as a Slurm job.
    let view = wait_terminal(&client, on_slurm).await;
    let log = log_text(&client, on_slurm).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert!(view.nodes[0].starts_with("tacc-n"), "{view:?}");
    let job = log
        .split("job=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default();
    assert!(
        job.parse::<u64>().is_ok(),
        "a Slurm job id in the log: {log}"
    );
    assert!(log.contains(&format!("host={}", view.nodes[0])), "{log}");
    assert_eq!(jobs_of(&tag).len(), 1, "one Slurm job: {:?}", jobs_of(&tag));

    // `auto` with the process agent's label runs there, not in Slurm.
    let local = submit(
        &client,
        dir.path(),
        "on-local",
        &format!("name: on-local\nplacement: {{labels: {{pool: local}}}}\nrun: |\n{script}"),
        &[],
    )
    .await;
    let view = wait_terminal(&client, local).await;
    let log = log_text(&client, local).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    assert_eq!(view.nodes, vec!["local-1".to_string()], "{view:?}");
    assert!(log.contains("job=none"), "not a Slurm job: {log}");
    assert_eq!(
        jobs_of(&tag).len(),
        1,
        "no new Slurm job: {:?}",
        jobs_of(&tag)
    );

    // Labels no node carries: queued, explained, never rejected while others run.
    let nowhere = submit(
        &client,
        dir.path(),
        "nowhere",
        "name: nowhere\nplacement: {labels: {pool: gpu-farm}}\nrun: echo should never run\n",
        &[],
    )
    .await;
    let why = wait_reason(&client, nowhere, "no node can run it yet").await;
    let reason = why.reason.clone().unwrap();
    assert!(
        reason.contains("pool=gpu-farm") && reason.contains("none of the 3 node(s) up"),
        "{why:?}"
    );
    assert!(
        why.details
            .iter()
            .any(|d| d.contains("--label pool=gpu-farm")),
        "{why:?}"
    );
    let after = submit(
        &client,
        dir.path(),
        "after",
        "name: after\nplacement: {labels: {pool: hpc}}\nrun: echo after\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, after).await;
    assert_eq!(
        view.state,
        TaskState::Succeeded,
        "not held up behind it: {view:?}"
    );
    let view = client.get_task(nowhere).await.unwrap();
    assert_eq!(view.state, TaskState::Queued, "{view:?}");
    client.cancel(nowhere).await.unwrap();
    let view = wait_terminal(&client, nowhere).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert!(
        !log_text(&client, nowhere)
            .await
            .contains("should never run")
    );
}

/// Wait until `tcloud why` gives a reason containing `needle`.
async fn wait_reason(
    client: &tacc_client::Client,
    task: TaskId,
    needle: &str,
) -> tacc_proto::TaskExplanation {
    eventually(&format!("reason `{needle}`"), DEADLINE, || {
        let client = client.clone();
        async move {
            let why = client.explain(task).await.ok()?;
            why.reason
                .as_deref()
                .is_some_and(|r| r.contains(needle))
                .then_some(why)
        }
    })
    .await
}

/// The executor contract, run directly against the Slurm executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_executor_meets_the_contract() {
    if !slurm_ready("slurm_executor_meets_the_contract").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let executor = slurm_executor(dir.path(), "contract").await;
    tacc_exec::contract::run_all(&executor, dir.path()).await;
    tacc_exec::contract::stop_signal_comes_first_with_its_grace(&executor, dir.path()).await;
}

/// The Slurm executor on node `tacc-n1` of the test cluster, with its state in `dir`.
async fn slurm_executor(dir: &std::path::Path, name: &str) -> tacc_exec::SlurmExecutor {
    let mut config =
        tacc_exec::SlurmConfig::new(dir.join("state"), format!("t{}-{name}", std::process::id()));
    config.poll_interval = Duration::from_millis(100);
    let backend = tacc_exec::SlurmBackend::start(config).await.unwrap();
    backend.executor_for("tacc-n1")
}

/// Seconds since the epoch that a task's `date +%s.%N` wrote into `path`.
fn stamp(path: &std::path::Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// On cancel the task's checkpoint signal arrives first and the job is killed only once
/// the grace has run out: a task that saves and then keeps running lives through the
/// whole grace. Prints the figures docs/RELIABILITY.md quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_stop_signal_comes_first_and_the_kill_only_after_the_grace() {
    if !slurm_ready("slurm_stop_signal_comes_first_and_the_kill_only_after_the_grace").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let executor = slurm_executor(work, "grace").await;
    let grace = Duration::from_secs(3);
    let script = "trap 'date +%s.%N > signalled; sleep 0.5; echo saved > checkpoint.tmp; \
                  mv checkpoint.tmp checkpoint.txt; \
                  while :; do date +%s.%N > alive; sleep 0.1; done' USR1\n\
                  echo ready\nsleep 60 & wait\n";
    let mut spec = tacc_exec::contract::spec(work, script);
    spec.stop_signal = nix::sys::signal::Signal::SIGUSR1;
    spec.kill_grace = grace;
    let (tx, mut rx) = tacc_exec::output_channel();
    let handle = tacc_exec::Executor::launch(&executor, spec, tx)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the task's first line in time");
    assert_eq!(first.map(|l| l.text), Some("ready".to_string()));

    let epoch = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let cancelled_at = epoch();
    let cancelled = Instant::now();
    handle.cancel();
    let checkpoint = work.join("checkpoint.txt");
    let saved_after = eventually("the checkpoint", Duration::from_secs(10), || {
        let found = checkpoint.exists().then(|| cancelled.elapsed());
        async move { found }
    })
    .await;
    assert_eq!(
        handle.wait().await,
        tacc_exec::ExitOutcome::Cancelled,
        "a cancelled job ends as cancelled"
    );
    let ended_after = cancelled.elapsed();
    let signalled = stamp(&work.join("signalled")).expect("the task got the signal");
    let last_alive = stamp(&work.join("alive")).expect("the task ran on after saving");
    assert_eq!(std::fs::read_to_string(&checkpoint).unwrap(), "saved\n");
    let signal_after = signalled - cancelled_at;
    let lived = last_alive - signalled;
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "slurm stop: signal {signal_after:.3} s after cancel, checkpoint {:.3} s, \
         task alive until {lived:.3} s after the signal, ended {:.3} s after cancel (grace {grace:?})",
        saved_after.as_secs_f64(),
        ended_after.as_secs_f64()
    );
    assert!(
        signal_after < 2.0,
        "the signal came {signal_after:.3} s after cancel"
    );
    // The task saved 0.5 s into the grace and then kept running: it was killed only when
    // the grace was over (its heartbeat every 0.1 s), not by the signal nor before.
    assert!(
        lived >= grace.as_secs_f64() - 0.3,
        "the task was killed {lived:.3} s after the signal, within its {grace:?} grace"
    );
    assert!(ended_after >= grace, "ended {ended_after:?} after cancel");
}

/// Benchmark (run on purpose, not in CI):
/// `cargo test -p taccd --test slurm -- --ignored --nocapture slurm_benchmark`.
/// 200 trivial tasks through TACC's Slurm backend vs. 200 plain `sbatch --wrap true`,
/// and submit→finished latency of one trivial task on the process and Slurm runtimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly"]
async fn slurm_benchmark() {
    if !slurm_ready("slurm_benchmark").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let count: usize = std::env::var("TACC_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();

    // Plain Slurm.
    let started = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..count {
        let out = Command::new("sbatch")
            .args([
                "--parsable",
                "--job-name=bench-plain",
                "--output=/dev/null",
                "--wrap",
                "true",
            ])
            .output()
            .unwrap();
        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let id_list = ids.join(",");
    eventually("plain jobs to finish", Duration::from_secs(1200), || {
        let id_list = id_list.clone();
        async move {
            let out = Command::new("squeue")
                .args(["-h", "-t", "all", "-o", "%T", "-j", &id_list])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let done = text.lines().filter(|l| *l == "COMPLETED").count();
            (done == count).then_some(())
        }
    })
    .await;
    let plain = started.elapsed();

    // The same through TACC.
    let c = cluster(dir.path(), "bench").await;
    let yaml = "name: trivial\nresources: {cpus: 1, memory: 64MiB}\nrun: \"true\"\n";
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..count {
        tasks.push(submit(&c.client, dir.path(), &format!("t{i}"), yaml, &[]).await);
    }
    eventually("TACC tasks to finish", Duration::from_secs(1200), || {
        let client = c.client.clone();
        async move {
            let query = tacc_client::TaskQuery {
                limit: Some(100_000),
                ..Default::default()
            };
            let list = client.list_tasks(&query).await.ok()?;
            let done = list
                .iter()
                .filter(|t| t.state == TaskState::Succeeded)
                .count();
            assert!(!list.iter().any(|t| t.state == TaskState::Failed));
            (done == count).then_some(())
        }
    })
    .await;
    let tacc = started.elapsed();

    // Latency of one trivial task: Slurm runtime, then process runtime.
    let t0 = Instant::now();
    let one = submit(&c.client, dir.path(), "one-slurm", yaml, &[]).await;
    wait_terminal(&c.client, one).await;
    let slurm_latency = t0.elapsed();
    let dev = start("dev", &dir.path().join("dev"), &[]).await;
    let dev_client = dev.client();
    wait_nodes(&dev_client, 1).await;
    let t0 = Instant::now();
    let one = submit(&dev_client, dir.path(), "one-process", yaml, &[]).await;
    wait_terminal(&dev_client, one).await;
    let process_latency = t0.elapsed();

    let overhead = tacc.as_secs_f64() - plain.as_secs_f64();
    println!("\n| measurement | value |\n|---|---|");
    println!(
        "| {count} × `sbatch --wrap true`, total | {:.1} s |",
        plain.as_secs_f64()
    );
    println!(
        "| {count} trivial tasks via TACC Slurm backend, total | {:.1} s |",
        tacc.as_secs_f64()
    );
    println!(
        "| overhead TACC adds, per task | {:.1} ms ({:+.1} %) |",
        overhead * 1000.0 / count as f64,
        100.0 * overhead / plain.as_secs_f64()
    );
    println!(
        "| one trivial task, submit→finished, process runtime | {:.0} ms |",
        process_latency.as_secs_f64() * 1000.0
    );
    println!(
        "| one trivial task, submit→finished, Slurm runtime | {:.0} ms |",
        slurm_latency.as_secs_f64() * 1000.0
    );
}

// ------------------------------------------------------------------ pilot allocations

/// Where the test cluster's compute nodes reach this machine (scripts/ci/setup-slurm.sh).
const SLURM_BRIDGE_ADDRESS: &str = "10.250.77.1";

/// A server on the Slurm bridge (pilots run inside the nodes' network namespaces) and a
/// Slurm agent that requests pilot allocations for short tasks.
async fn pilot_cluster(dir: &std::path::Path, name: &str, idle: &str) -> SlurmCluster {
    let server = launch(
        "server",
        &dir.join("server"),
        // Plain HTTP on the private bridge nothing routes beyond this machine.
        &[
            "--listen",
            &format!("{SLURM_BRIDGE_ADDRESS}:0"),
            "--insecure",
        ],
    )
    .await;
    let client = server.client();
    eventually("the server to answer on the bridge", DEADLINE, || {
        let client = client.clone();
        async move { client.health().await.ok() }
    })
    .await;
    let token_file = dir.join("pilot-admin.token");
    std::fs::write(&token_file, &server.token).unwrap();
    let tag = format!("t{}-{name}", std::process::id());
    let agent_dir = dir.join("agent");
    let agent = start_agent_enrolling(
        &server,
        &agent_dir,
        &["--nodes", "16"],
        &[
            "--backend",
            "slurm",
            "--slurm-tag",
            &tag,
            "--slurm-poll-ms",
            "100",
            "--pilot-token-file",
            &token_file.display().to_string(),
            "--pilot-min-queue",
            "8",
            "--pilot-time",
            "10m",
            "--pilot-idle",
            idle,
            "--pilot-max",
            "2",
        ],
    );
    wait_nodes(&client, 2).await;
    SlurmCluster {
        agent,
        agent_dir,
        tag,
        client,
        _server: server,
    }
}

/// This test's pilot jobs: (job id, state), from `squeue -t all`.
fn pilots_of(tag: &str) -> Vec<(u64, String)> {
    let out = Command::new("squeue")
        .args(["-h", "-t", "all", "-o", "%i|%T|%k"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, '|');
            let id = f.next()?.parse().ok()?;
            let state = f.next()?.to_string();
            (f.next()? == format!("tacc-pilot:{tag}")).then_some((id, state))
        })
        .collect()
}

/// Cancels a test's pilot jobs when it ends, however it ends: a failed test kills its
/// Slurm agent before the pilots are given back, and a pilot would hold its node for its
/// whole `--time`.
struct PilotCleanup(String);

impl Drop for PilotCleanup {
    fn drop(&mut self) {
        for (job, state) in pilots_of(&self.0) {
            if matches!(state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING") {
                let _ = Command::new("scancel").arg(job.to_string()).status();
            }
        }
    }
}

/// Submit an array of `count` trivial short tasks; each logs and keeps an output.
async fn submit_short_array(
    client: &tacc_client::Client,
    root: &std::path::Path,
    count: u32,
) -> tacc_core::GroupId {
    let dir = root.join("many");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        format!(
            "name: many\nresources: {{cpus: 0.25, memory: 64MiB, time_limit: 1m}}\narray: 0-{}\noutputs: [out/]\nrun: |\n  echo \"element $TACC_ARRAY_INDEX on $(hostname)\"\n  mkdir -p out\n  echo \"$TACC_ARRAY_INDEX\" > out/index.txt\n",
            count - 1
        ),
    )
    .unwrap();
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    let reply = client
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: Some(dir.display().to_string()),
            wait_for_capacity: false,
        })
        .await
        .unwrap();
    reply.group.expect("an array makes a group").group
}

async fn wait_group(
    client: &tacc_client::Client,
    group: tacc_core::GroupId,
    deadline: Duration,
) -> tacc_proto::GroupDetail {
    eventually(&format!("group {group} to finish"), deadline, || {
        let client = client.clone();
        async move {
            let detail = client.get_group(group).await.ok()?;
            // The counts and the element list are read separately: wait for both.
            let ended = detail.elements.iter().all(|e| e.state.is_terminal());

            (detail.group.is_finished() && ended).then_some(detail)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_short_array_runs_inside_pilot_allocations() {
    if !slurm_ready("slurm_short_array_runs_inside_pilot_allocations").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = pilot_cluster(dir.path(), "pilot", "3s").await;
    let _cleanup = PilotCleanup(c.tag.clone());
    let group = submit_short_array(&c.client, dir.path(), 200).await;
    // Longer than any pilot has left (10m allocations): never started in one, so it gets
    // an `sbatch` job of its own (which waits for the pilots to give their nodes back).
    let long = submit(
        &c.client,
        dir.path(),
        "long",
        "name: long\nresources: {cpus: 1, memory: 64MiB, time_limit: 11m}\nrun: echo long on $(hostname)\n",
        &[],
    )
    .await;
    let detail = wait_group(&c.client, group, Duration::from_secs(90)).await;
    assert_eq!(detail.elements.len(), 200);
    for element in &detail.elements {
        assert_eq!(element.state, TaskState::Succeeded, "{element:?}");
        let view = c.client.get_task(element.task_id).await.unwrap();
        assert!(
            view.nodes.len() == 1 && view.nodes[0].starts_with("pilot-"),
            "element {} ran on {:?}, not in a pilot",
            element.index,
            view.nodes
        );
        let log = log_text(&c.client, element.task_id).await;
        assert!(
            log.contains(&format!("element {} on tacc-n", element.index)),
            "element {} logged: {log}",
            element.index
        );
        let output = eventually("the element's output", DEADLINE, || {
            let client = c.client.clone();
            async move {
                let bytes = client
                    .get_output(element.task_id, element.attempt, "out/index.txt")
                    .await
                    .ok()?;
                Some(String::from_utf8(bytes.to_vec()).unwrap())
            }
        })
        .await;
        assert_eq!(output.trim(), element.index.to_string());
    }
    // Far fewer Slurm jobs than tasks: a pilot or two, and no `sbatch` per short task
    // (the one job is the long task's).
    let pilots = pilots_of(&c.tag);
    assert!((1..=4).contains(&pilots.len()), "pilot jobs: {pilots:?}");
    assert!(
        jobs_of(&c.tag).len() <= 1,
        "per-task jobs: {:?}",
        jobs_of(&c.tag)
    );
    // Idle allocations go back: the pilots end in Slurm and their nodes deregister.
    eventually("the idle pilots to be given back", DEADLINE, || async {
        let ended = pilots_of(&c.tag)
            .iter()
            .all(|(_, state)| !matches!(state.as_str(), "PENDING" | "RUNNING" | "CONFIGURING"));
        let nodes = c.client.list_nodes().await.ok()?;
        let pilot_nodes = nodes
            .iter()
            .filter(|n| n.name.starts_with("pilot-"))
            .count();
        (ended && pilot_nodes == 0).then_some(())
    })
    .await;
    let view = wait_terminal(&c.client, long).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert!(
        view.nodes.len() == 1 && view.nodes[0].starts_with("tacc-n"),
        "the long task ran on {:?}, not through its own sbatch job",
        view.nodes
    );
    assert_eq!(
        jobs_of(&c.tag).len(),
        1,
        "per-task jobs: {:?}",
        jobs_of(&c.tag)
    );
    drop(c.agent);
}

/// Benchmark (run on purpose, not in CI):
/// `cargo test --release -p taccd --test slurm -- --ignored --nocapture slurm_pilot_benchmark`.
/// The same array of 200 short tasks (`TACC_BENCH_TASKS`) through one `sbatch` job per
/// task, then through pilot allocations, in one run; submit → every element finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly"]
async fn slurm_pilot_benchmark() {
    if !slurm_ready("slurm_pilot_benchmark").await {
        return;
    }
    let _one = CLUSTER.lock().await;
    let count: u32 = std::env::var("TACC_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let long = Duration::from_secs(1200);

    let dir = tempfile::tempdir().unwrap();
    let per_task = cluster(dir.path(), "bench-sbatch").await;
    wait_all_nodes_idle().await;
    let started = Instant::now();
    let group = submit_short_array(&per_task.client, dir.path(), count).await;
    let detail = wait_group(&per_task.client, group, long).await;
    let sbatch_each = started.elapsed();
    assert!(
        detail
            .elements
            .iter()
            .all(|e| e.state == TaskState::Succeeded)
    );
    let sbatch_jobs = jobs_of(&per_task.tag).len();
    drop(per_task);

    let dir = tempfile::tempdir().unwrap();
    let pilots = pilot_cluster(dir.path(), "bench-pilot", "5s").await;
    let _cleanup = PilotCleanup(pilots.tag.clone());
    wait_all_nodes_idle().await;
    let started = Instant::now();
    let group = submit_short_array(&pilots.client, dir.path(), count).await;
    let detail = wait_group(&pilots.client, group, long).await;
    let through_pilots = started.elapsed();
    assert!(
        detail
            .elements
            .iter()
            .all(|e| e.state == TaskState::Succeeded)
    );
    let pilot_jobs = pilots_of(&pilots.tag).len();
    // Where the time went: until the first element started (the allocation's start), and
    // from then until the last one finished.
    let first_start = detail
        .elements
        .iter()
        .filter_map(|e| e.started_at)
        .min()
        .unwrap();
    let last_end = detail
        .elements
        .iter()
        .filter_map(|e| e.finished_at)
        .max()
        .unwrap();
    let running = Duration::from_millis(last_end.millis_since(first_start));

    println!("\n| measurement | value |\n|---|---|");
    println!(
        "| {count} short tasks, one `sbatch` job each ({sbatch_jobs} Slurm jobs) | {:.1} s ({:.1} tasks/s) |",
        sbatch_each.as_secs_f64(),
        count as f64 / sbatch_each.as_secs_f64()
    );
    println!(
        "| {count} short tasks through pilot allocations ({pilot_jobs} Slurm jobs), allocation start included | {:.1} s ({:.1} tasks/s) |",
        through_pilots.as_secs_f64(),
        count as f64 / through_pilots.as_secs_f64()
    );
    println!(
        "| of which: first element started after | {:.1} s |",
        through_pilots.as_secs_f64() - running.as_secs_f64()
    );
    println!(
        "| of which: first start → last finish | {:.1} s ({:.1} tasks/s) |",
        running.as_secs_f64(),
        count as f64 / running.as_secs_f64()
    );
    println!(
        "| speed-up | {:.0}× |",
        sbatch_each.as_secs_f64() / through_pilots.as_secs_f64()
    );
}

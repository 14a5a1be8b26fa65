//! High availability (fault scenario R8): two `taccd server --replicated` processes on one
//! PostgreSQL database and one shared data directory, one agent. The leader is paused
//! (SIGSTOP) past its lease: the follower takes over within bounded time (the failover is
//! measured), tasks submitted before and after finish, each exactly once, and the agent
//! follows. Resumed (SIGCONT), the old leader finds its lease gone, stops leading (its
//! writes are fenced by the lease epoch) and serves as a follower. Runs against a new
//! database on the server named by `TACC_TEST_POSTGRES_URL` (scripts/ci/setup-postgres.sh);
//! without one it says SKIPPED, except in CI where that is a failure.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};
use tacc_store::test_database::TestDatabase;

const LEASE_MS: u64 = 3_000;

/// `taccd server --replicated` on the shared `data` directory, its stderr in
/// `logs/NAME.log`; waits for its endpoint (replicas start one at a time: they share the
/// endpoint file).
async fn launch_replica(name: &str, data: &Path, logs: &Path, database: &str) -> Daemon {
    let endpoint = data.join("taccd.json");
    let _ = std::fs::remove_file(&endpoint);
    let log = std::fs::File::create(logs.join(format!("{name}.log"))).unwrap();
    let lease = LEASE_MS.to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["server", "--replicated", "--listen", "127.0.0.1:0"])
        .args(["--lease-ms", &lease, "--database", database, "--data-dir"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let url = eventually(&format!("{name} to write its endpoint"), DEADLINE, || {
        let endpoint = endpoint.clone();
        async move {
            let text = std::fs::read_to_string(&endpoint).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            Some(value["url"].as_str()?.to_string())
        }
    })
    .await;
    Daemon {
        child,
        url,
        data_dir: data.to_path_buf(),
        token: String::new(),
    }
}

/// `taccd admin --data-dir DATA --database URL ARGS…`, once the schema exists.
async fn admin_on(data: &Path, database: &str, args: &[&str]) -> String {
    eventually(&format!("taccd admin {args:?}"), DEADLINE, || async move {
        let out = Command::new(env!("CARGO_BIN_EXE_taccd"))
            .arg("admin")
            .arg("--data-dir")
            .arg(data)
            .args(["--database", database])
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    })
    .await
}

/// The role a replica says it has (`leader`, `follower`), or `None` when it does not
/// answer within a second (paused).
async fn role(url: &str) -> Option<String> {
    let answer = reqwest::Client::new()
        .get(format!("{url}/v1/health"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    Some(
        answer
            .headers()
            .get("x-tacc-replica-role")?
            .to_str()
            .ok()?
            .to_string(),
    )
}

async fn wait_role(url: &str, wanted: &str, deadline: Duration) {
    eventually(&format!("{url} to be {wanted}"), deadline, || async move {
        (role(url).await.as_deref() == Some(wanted)).then_some(())
    })
    .await
}

fn task_yaml(name: &str, seconds: u32) -> String {
    format!(
        "name: {name}\nrun: |\n  echo \"run-marker $TACC_TASK_ID attempt $TACC_ATTEMPT\"\n  \
         sleep {seconds}\n  echo finished\n"
    )
}

/// Upload `name`'s project and submit it through `client`.
async fn submit_named(client: &Client, root: &Path, name: &str, seconds: u32) -> TaskId {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), task_yaml(name, seconds)).unwrap();
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    let submission = tacc_proto::SubmitTask {
        translated: Vec::new(),
        spec: serde_json::to_value(&loaded.spec).unwrap(),
        snapshot,
        source: Some(dir.display().to_string()),
        wait_for_capacity: false,
    };
    client.submit(&submission).await.unwrap().task_id
}

/// On a failure, the replicas' and the agent's logs go to the test's output (CI keeps
/// nothing else of a failed run: a failover is a sequence of events across three
/// processes, and the assertion alone does not say which went wrong).
struct LogsOnFailure(std::path::PathBuf);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for name in ["first", "second", "agent"] {
            let path = self.0.join(format!("{name}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(200)..];
            eprintln!("---- {} (last {} lines)", path.display(), tail.len());
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_takes_over_a_paused_leader_which_is_fenced_and_nothing_runs_twice() {
    let test = "follower_takes_over_a_paused_leader_which_is_fenced_and_nothing_runs_twice";
    let Some(database) = TestDatabase::create(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared");
    let logs = dir.path().join("logs");
    let projects = dir.path().join("projects");
    for d in [&data, &logs, &projects] {
        std::fs::create_dir_all(d).unwrap();
    }
    let _logs = LogsOnFailure(logs.clone());
    let url = database.url.as_str();

    let mut first = launch_replica("first", &data, &logs, url).await;
    let token = admin_on(&data, url, &["user", "add", "tester", "--role", "admin"]).await;
    wait_role(&first.url, "leader", DEADLINE).await;
    let mut second = launch_replica("second", &data, &logs, url).await;
    wait_role(&second.url, "follower", DEADLINE).await;
    first.token = token.clone();
    second.token = token.clone();

    // The agent and the client talk to the follower, which forwards to the leader.
    let join = admin_on(&data, url, &["agent-token", "--ttl", "1h"]).await;
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let token_file = common::write_token_file(&dir.path().join("join.token"), &join);
    let agent_log = std::fs::File::create(logs.join("agent.log")).unwrap();
    let agent = Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["agent", "--server", &second.url, "--data-dir"])
        .arg(&agent_dir)
        .arg("--token-file")
        .arg(&token_file)
        .stdout(Stdio::null())
        .stderr(agent_log)
        .spawn()
        .unwrap();
    let _agent = Daemon {
        child: agent,
        url: second.url.clone(),
        data_dir: agent_dir.clone(),
        token: String::new(),
    };
    let client = second.client();
    wait_nodes(&client, 1).await;

    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(submit_named(&client, &projects, &format!("before-{i}"), 6).await);
    }
    for task in &tasks {
        wait_state(&client, *task, &[TaskState::Running]).await;
    }

    // Pause the leader past its lease: the follower takes over.
    kill(Pid::from_raw(first.pid() as i32), Signal::SIGSTOP).unwrap();
    let paused = Instant::now();
    wait_role(&second.url, "leader", Duration::from_secs(30)).await;
    let failover = paused.elapsed();
    eprintln!(
        "FAILOVER: the follower led {:.2} s after the leader was paused (lease {LEASE_MS} ms)",
        failover.as_secs_f64()
    );
    assert!(
        failover < Duration::from_millis(3 * LEASE_MS),
        "failover took {failover:?} with a {LEASE_MS} ms lease"
    );

    for i in 0..2 {
        tasks.push(submit_named(&client, &projects, &format!("after-{i}"), 1).await);
    }
    for task in &tasks {
        let ended = wait_terminal(&client, *task).await;
        assert_eq!(ended.state, TaskState::Succeeded, "{ended:?}");
    }

    // The old leader resumes: its lease is gone, so it follows and commits nothing.
    kill(Pid::from_raw(first.pid() as i32), Signal::SIGCONT).unwrap();
    wait_role(&first.url, "follower", DEADLINE).await;
    let old_log = std::fs::read_to_string(logs.join("first.log")).unwrap();
    assert!(old_log.contains("no longer leading (epoch 1)"), "{old_log}");
    // Through it (forwarded), a submission still runs once, on the new leader.
    let through_old = submit_named(&first.client(), &projects, "via-old", 1).await;
    tasks.push(through_old);
    let ended = wait_terminal(&client, through_old).await;
    assert_eq!(ended.state, TaskState::Succeeded, "{ended:?}");
    // Reads the old leader answers itself, from the database.
    let listed = tcloud(&first, dir.path(), &["ps", "--all"]);
    assert!(listed.contains("via-old"), "{listed}");

    // Every acknowledged task exists once; each ran one attempt, once.
    let all = client
        .list_tasks(&tacc_client::TaskQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), tasks.len(), "{all:?}");
    for task in &tasks {
        let view = client.get_task(*task).await.unwrap();
        assert_eq!(view.attempt.0, 1, "{view:?}");
        let starts = client
            .task_events(*task)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.state == TaskState::Starting)
            .count();
        assert_eq!(starts, 1, "task {task} started {starts} times");
        let log = log_text(&client, *task).await;
        assert_eq!(log.matches("run-marker").count(), 1, "task {task}: {log}");
        assert!(
            log.contains(&format!("run-marker {task} attempt 1")),
            "{log}"
        );
    }
}

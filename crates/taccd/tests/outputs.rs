//! Outputs of every rank and every attempt, and a running task's live files, against real
//! `taccd` processes (a server with two agents where ranks matter) driven through the
//! real `tcloud` binary: what each rank wrote is kept and downloadable, a cancelled,
//! failed or timed-out attempt keeps what it wrote, and `tcloud ls` / `tcloud download`
//! reach into a running task's working directory on any node, confined to it and to the
//! task's owner.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::hand_node::HandNode;
use common::*;
use tacc_client::Client;
use tacc_core::{AttemptNo, TaskId, TaskState};

fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build -p taccd -p tcloud --bins`)",
        path.display()
    );
    path
}

/// One user of a cluster: their token, a client, and `tcloud` acting as them.
struct User {
    url: String,
    token: String,
    client: Client,
    home: tempfile::TempDir,
}

impl User {
    fn new(server: &Daemon, name: &str) -> User {
        let token = server.admin(&["user", "add", name]).trim().to_string();
        User {
            url: server.url.clone(),
            client: Client::new(&server.url).with_token(token.clone()),
            token,
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn tcloud(&self, args: &[&str]) -> Output {
        Command::new(tcloud_binary())
            .args(args)
            .current_dir(self.home.path())
            .env("TACC_HOME", self.home.path())
            .env("TACC_SERVER", &self.url)
            .env("TACC_TOKEN", &self.token)
            .output()
            .unwrap()
    }

    /// `tcloud ARGS`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.tcloud(args);
        assert!(
            out.status.success(),
            "tcloud {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `tcloud ARGS`, which must fail with `code`; its stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.tcloud(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(code),
            "tcloud {args:?}: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}

/// A server with two agents, `node-a` and `node-b`, both up.
async fn two_node_cluster(dir: &Path) -> (Daemon, Daemon, Daemon) {
    let server = start("server", &dir.join("s"), &[]).await;
    let a = start_agent(&server, &dir.join("a"), &["--name", "node-a"]);
    let b = start_agent(&server, &dir.join("b"), &["--name", "node-b"]);
    wait_nodes(&server.client(), 2).await;
    (server, a, b)
}

/// The task's outputs once no node is still uploading any.
async fn settled_outputs(client: &Client, task: TaskId) -> Vec<tacc_proto::OutputFile> {
    eventually("every rank to finish uploading", DEADLINE, || {
        let client = client.clone();
        async move {
            let (files, pending) = client.list_outputs_pending(task).await.ok()?;
            pending.is_empty().then_some(files)
        }
    })
    .await
}

async fn wait_log(client: &Client, task: TaskId, needles: &[&str]) {
    eventually(&format!("the log to show {needles:?}"), DEADLINE, || {
        let client = client.clone();
        async move {
            let log = log_text(&client, task).await;
            needles.iter().all(|n| log.contains(n)).then_some(())
        }
    })
    .await
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn names(listing: &serde_json::Value) -> Vec<String> {
    listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rank_keeps_its_outputs_and_paths_they_share_are_rank_qualified() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _a, _b) = two_node_cluster(dir.path()).await;
    let alice = User::new(&server, "alice");
    let task = submit(
        &alice.client,
        dir.path(),
        "gang",
        "name: gang\nresources: {nodes: 2, cpus: 1}\noutputs: [out/]\nrun: |\n  mkdir -p out\n  echo \"from rank $NODE_RANK\" > out/same.txt\n  if [ \"$NODE_RANK\" = 1 ]; then echo only > out/only1.txt; fi\n",
        &[],
    )
    .await;
    let view = wait_terminal(&alice.client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");

    let outputs = settled_outputs(&alice.client, task).await;
    let listed: Vec<(&str, u32, &str)> = outputs
        .iter()
        .map(|o| (o.name.as_str(), o.rank, o.path.as_str()))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("rank-0/out/same.txt", 0, "out/same.txt"),
            ("out/only1.txt", 1, "out/only1.txt"),
            ("rank-1/out/same.txt", 1, "out/same.txt"),
        ]
    );
    let rank1 = alice
        .client
        .get_rank_output(task, AttemptNo(1), 1, "out/same.txt")
        .await
        .unwrap();
    assert_eq!(&rank1[..], b"from rank 1\n");

    // Everything, under the names it is listed by.
    let id = task.to_string();
    let all = alice.home.path().join("all");
    alice.ok(&["download", &id, "--dest", all.to_str().unwrap()]);
    assert_eq!(read(all.join("rank-0/out/same.txt")), "from rank 0\n");
    assert_eq!(read(all.join("rank-1/out/same.txt")), "from rank 1\n");
    assert_eq!(read(all.join("out/only1.txt")), "only\n");
    // One rank's file under its own path.
    let one = alice.home.path().join("one");
    alice.ok(&[
        "download",
        &id,
        "out/same.txt",
        "--rank",
        "1",
        "--dest",
        one.to_str().unwrap(),
    ]);
    assert_eq!(read(one.join("out/same.txt")), "from rank 1\n");
    // A qualified name selects that rank's copy.
    let qualified = alice.home.path().join("qualified");
    alice.ok(&[
        "download",
        &id,
        "rank-0/out/same.txt",
        "-o",
        qualified.to_str().unwrap(),
    ]);
    assert_eq!(read(qualified.join("rank-0/out/same.txt")), "from rank 0\n");
    assert!(!qualified.join("rank-1").exists());
    let missing = alice.fails(&["download", &id, "out/nothing"], 4);
    assert!(missing.contains("tcloud ls"), "{missing}");

    // The kept outputs, listed.
    let root = alice.json(&["ls", &id, "--json"]);
    assert_eq!(root["live"], false, "{root}");
    assert_eq!(names(&root), vec!["out", "rank-0", "rank-1"]);
    let rank1 = alice.json(&["ls", &id, "out", "--rank", "1", "--json"]);
    assert_eq!(names(&rank1), vec!["only1.txt", "same.txt"]);
    let table = alice.ok(&["ls", &id, "rank-1/out"]);
    assert!(
        table.contains("same.txt") && table.contains("file"),
        "{table}"
    );
    let shown = alice.ok(&["show", &id]);
    assert!(
        shown.contains("rank-1/out/same.txt") && shown.contains("RANK"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_keeps_the_checkpoint_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("dev", &dir.path().join("d"), &[]).await;
    let alice = User::new(&server, "alice");
    let task = submit(
        &alice.client,
        dir.path(),
        "ckpt",
        "name: ckpt\noutputs: [ckpt/]\nrun: |\n  mkdir -p ckpt\n  echo step-41 > ckpt/state.txt\n  echo saved\n  sleep 300\n",
        &[],
    )
    .await;
    wait_log(&alice.client, task, &["saved"]).await;
    let asked = Instant::now();
    alice.ok(&["cancel", &task.to_string()]);
    let view = wait_terminal(&alice.client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "the cancel completed in {:?}",
        asked.elapsed()
    );
    let outputs = alice.client.list_outputs(task).await.unwrap();
    let kept: Vec<&str> = outputs.iter().map(|o| o.path.as_str()).collect();
    assert_eq!(
        kept,
        vec!["ckpt/state.txt"],
        "kept before it was reported cancelled"
    );
    let dest = alice.home.path().join("got");
    alice.ok(&["download", &task.to_string(), "-o", dest.to_str().unwrap()]);
    assert_eq!(read(dest.join("ckpt/state.txt")), "step-41\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_timed_out_tasks_keep_their_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("dev", &dir.path().join("d"), &[]).await;
    let alice = User::new(&server, "alice");
    let failed = submit(
        &alice.client,
        dir.path(),
        "fails",
        "name: fails\noutputs: [out/]\nrun: |\n  mkdir -p out\n  echo partial > out/result.txt\n  exit 1\n",
        &[],
    )
    .await;
    let timed_out = submit(
        &alice.client,
        dir.path(),
        "slow",
        "name: slow\nresources: {time_limit: 2s}\noutputs: [ckpt/]\nrun: |\n  mkdir -p ckpt\n  echo epoch-1 > ckpt/last.txt\n  sleep 300\n",
        &[],
    )
    .await;
    let view = wait_terminal(&alice.client, failed).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert_eq!(view.exit_code, Some(1));
    let bytes = alice
        .client
        .get_rank_output(failed, AttemptNo(1), 0, "out/result.txt")
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"partial\n");

    let view = wait_terminal(&alice.client, timed_out).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert_eq!(view.reason.as_deref(), Some("time limit reached"));
    let bytes = alice
        .client
        .get_rank_output(timed_out, AttemptNo(1), 0, "ckpt/last.txt")
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"epoch-1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_and_download_reach_a_running_tasks_files_on_every_node_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (server, a, b) = two_node_cluster(dir.path()).await;
    let alice = User::new(&server, "alice");
    let bob = User::new(&server, "bob");
    let task = submit(
        &alice.client,
        dir.path(),
        "live",
        "name: live\nresources: {nodes: 2, cpus: 1}\nrun: |\n  mkdir -p work\n  echo \"hello from $NODE_RANK\" > work/live.txt\n  ln -s / work/root\n  echo ready\n  sleep 300\n",
        &[("train.py", "print('hi')\n")],
    )
    .await;
    wait_log(&alice.client, task, &["[0] ready", "[1] ready"]).await;
    let view = alice.client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Running);
    let id = task.to_string();

    let root = alice.json(&["ls", &id, "--json"]);
    assert_eq!(root["live"], true, "{root}");
    assert_eq!(root["rank"], 0);
    assert_eq!(root["node"], view.nodes[0].as_str());
    let root_names = names(&root);
    assert!(
        root_names.contains(&"work".to_string()) && root_names.contains(&"train.py".to_string()),
        "{root}"
    );
    let other = alice.json(&["ls", &id, "work", "--rank", "1", "--json"]);
    assert_eq!(other["node"], view.nodes[1].as_str(), "{other}");
    let entries = other["entries"].as_array().unwrap();
    let live = entries.iter().find(|e| e["name"] == "live.txt").unwrap();
    assert_eq!(live["kind"], "file");
    assert_eq!(live["size"], "hello from 1\n".len());
    assert!(live["mtime"].is_u64(), "{live}");
    let link = entries.iter().find(|e| e["name"] == "root").unwrap();
    assert_eq!(link["kind"], "link", "links are listed, not followed");
    let table = alice.ok(&["ls", &id, "work/", "--rank", "1"]);
    assert!(
        table.contains("live.txt") && table.contains("13B"),
        "{table}"
    );

    let dest = alice.home.path().join("live");
    alice.ok(&[
        "download",
        &id,
        "work/live.txt",
        "--rank",
        "1",
        "-o",
        dest.to_str().unwrap(),
    ]);
    assert_eq!(read(dest.join("work/live.txt")), "hello from 1\n");

    // Confined to the working directory.
    for path in ["..", "../..", "work/../../etc", "/etc"] {
        let refused = alice.fails(&["ls", &id, path], 2);
        assert!(refused.contains("`..`"), "{path}: {refused}");
    }
    let refused = alice.fails(&["ls", &id, "work/root/etc"], 2);
    assert!(refused.contains("leads outside"), "{refused}");
    let refused = alice.fails(&["download", &id, "work/root/etc/passwd"], 2);
    assert!(refused.contains("leads outside"), "{refused}");
    let refused = alice.fails(&["ls", &id, "--rank", "2"], 2);
    assert!(refused.contains("runs on 2 node(s)"), "{refused}");
    let missing = alice.fails(&["ls", &id, "nothing-here"], 4);
    assert!(missing.contains("does not exist"), "{missing}");

    // Nobody else's.
    for args in [
        vec!["ls", &id],
        vec!["ls", &id, "work", "--rank", "1"],
        vec!["download", &id, "work/live.txt"],
    ] {
        let hidden = bob.fails(&args, 4);
        assert!(hidden.contains("does not exist"), "{args:?}: {hidden}");
    }

    // A node that cannot answer: the user hears so within the deadline.
    let agent = if view.nodes[1] == "node-a" { &a } else { &b };
    let stopped = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let asked = Instant::now();
    let silent = alice.fails(&["ls", &id, "--rank", "1"], 1);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        silent.contains(&format!(
            "node {} did not answer within 10 s",
            view.nodes[1]
        )),
        "{silent}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );

    alice.ok(&["cancel", &id]);
    let view = wait_terminal(&alice.client, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
}

impl HandNode {
    async fn poll(&self, running: Vec<tacc_proto::AttemptRef>) -> tacc_proto::DesiredWork {
        self.client
            .agent_work(self.id, None, Duration::from_millis(50), running)
            .await
            .unwrap()
    }

    async fn upload(&self, task: TaskId, path: &str, text: &str) -> Result<(), String> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let opened = tokio::fs::File::open(file.path()).await.unwrap();
        self.client
            .put_output(self.id, task, AttemptNo(1), path, opened)
            .await
            .map_err(|e| e.code().unwrap_or("?").to_string())
    }

    async fn report(&self, report: tacc_proto::AgentReport) -> (u32, u32) {
        let ack = self.client.agent_reports(self.id, &[report]).await.unwrap();
        (ack.accepted, ack.rejected)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_uploading_for_the_attempt_it_held_until_it_reports_its_end() {
    use tacc_proto::{AgentReport, AttemptOutcome, AttemptRef};
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let first = HandNode::register(&server, "hand-1").await;
    let second = HandNode::register(&server, "hand-2").await;
    let alice = User::new(&server, "alice");
    let task = submit(
        &alice.client,
        dir.path(),
        "gang",
        "name: gang\nresources: {nodes: 2, cpus: 1}\noutputs: [out/]\nrun: sleep 300\n",
        &[],
    )
    .await;
    let attempt = AttemptRef {
        task,
        attempt: AttemptNo(1),
    };
    let rank_of = |work: &tacc_proto::DesiredWork| {
        work.assignments
            .iter()
            .find(|a| a.attempt == attempt)
            .map(|a| a.node_rank)
    };
    let mut ranks = Vec::new();
    for node in [&first, &second] {
        let rank = eventually("the attempt to reach the node", DEADLINE, || async move {
            rank_of(&node.poll(vec![]).await)
        })
        .await;
        ranks.push(rank);
    }
    let (rank0, rank1) = if ranks[0] == 0 {
        (&first, &second)
    } else {
        (&second, &first)
    };
    let started = |at| AgentReport::Started {
        attempt,
        at: tacc_core::Timestamp(at),
    };
    assert_eq!(rank0.report(started(1)).await, (1, 0));
    wait_state(&alice.client, task, &[TaskState::Running]).await;

    // A question about rank 1's files reaches rank 1's node only, and only it answers.
    let asking = {
        let client = alice.client.clone();
        tokio::spawn(async move { client.list_files(task, "out/", Some(1), None).await })
    };
    let request = eventually("the question to reach rank 1", DEADLINE, || async move {
        rank1.poll(vec![attempt]).await.requests.into_iter().next()
    })
    .await;
    assert_eq!(request.attempt, attempt);
    assert_eq!(
        request.kind,
        tacc_proto::NodeRequestKind::List { path: "out".into() }
    );
    let listing = |name: &str| tacc_proto::NodeAnswer::Listing {
        entries: vec![tacc_proto::FileEntry {
            name: name.into(),
            kind: tacc_proto::FileKind::File,
            size: 3,
            mtime: None,
        }],
        truncated: false,
    };
    let forged = rank0
        .client
        .answer_node_request(rank0.id, request.id, &listing("forged"))
        .await
        .unwrap_err();
    assert_eq!(forged.code(), Some("not_found"), "{forged}");
    let as_other = rank0
        .client
        .answer_node_request(rank1.id, request.id, &listing("forged"))
        .await
        .unwrap_err();
    assert_eq!(as_other.code(), Some("forbidden"), "{as_other}");
    rank1
        .client
        .answer_node_request(rank1.id, request.id, &listing("x.txt"))
        .await
        .unwrap();
    let answered = asking.await.unwrap().unwrap();
    assert!(answered.live && answered.rank == Some(1), "{answered:?}");
    let names: Vec<&str> = answered.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, vec!["x.txt"]);

    // Rank 0 fails, which ends the attempt: the task is over, rank 1 is still stopping.
    let ended = |code| AgentReport::Finished {
        attempt,
        at: tacc_core::Timestamp(2),
        outcome: AttemptOutcome::Exited { code },
        rank: None,
    };
    rank0.upload(task, "out/same.txt", "zero").await.unwrap();
    assert_eq!(rank0.report(ended(3)).await, (1, 0));
    let view = wait_terminal(&alice.client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let work = rank1.poll(vec![attempt]).await;
    assert_eq!(rank_of(&work), None, "withdrawn from rank 1");
    let (_, pending) = alice.client.list_outputs_pending(task).await.unwrap();
    assert_eq!(
        pending,
        vec![(AttemptNo(1), 1)],
        "rank 1 has not reported its end"
    );

    // Rank 1 still uploads what it wrote, and its last lines count; rank 0, done, not.
    rank1.upload(task, "out/same.txt", "one").await.unwrap();
    let line = AgentReport::Log {
        attempt,
        text: "[1] tacc: stopped\n".into(),
        offset: None,
    };
    assert_eq!(rank1.report(line).await, (1, 0));
    assert_eq!(
        rank0.upload(task, "out/late.txt", "x").await,
        Err("forbidden".to_string())
    );
    // Its own end is taken (and changes nothing); after it, nothing more.
    let stopped = AgentReport::Finished {
        attempt,
        at: tacc_core::Timestamp(3),
        outcome: AttemptOutcome::Cancelled,
        rank: None,
    };
    assert_eq!(rank1.report(stopped.clone()).await, (1, 0));
    assert_eq!(
        rank1.upload(task, "out/later.txt", "x").await,
        Err("forbidden".to_string())
    );
    assert_eq!(rank1.report(stopped).await, (0, 1), "a replayed end");
    let view = alice.client.get_task(task).await.unwrap();
    assert_eq!(view.state, TaskState::Failed);
    assert!(
        log_text(&alice.client, task)
            .await
            .contains("[1] tacc: stopped")
    );

    let (outputs, pending) = alice.client.list_outputs_pending(task).await.unwrap();
    assert!(pending.is_empty());
    let listed: Vec<(&str, u32)> = outputs.iter().map(|o| (o.name.as_str(), o.rank)).collect();
    assert_eq!(
        listed,
        vec![("rank-0/out/same.txt", 0), ("rank-1/out/same.txt", 1)]
    );
    let audit = server.client().audit(100).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action == "output.rejected" && e.outcome == "denied"),
        "{audit:#?}"
    );
}

//! Enrolment under attack (issue 22, item 1), against real `taccd` processes: a task
//! looking for join tokens in every process's command line and environment finds none;
//! a used join token, or one bound to another name, enrols no rogue node; with approval
//! required a new node gets no task until an admin approves it; and a node that grows
//! must enrol again.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::*;
use tacc_client::Client;
use tacc_core::{Resources, TaskState};
use tacc_proto::{NodeView, RegisterAgent};

/// Tasks run as another uid than the agent only under a root agent: elsewhere the test
/// that depends on it says SKIPPED loudly and passes, except in CI.
fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: must run as root in CI: tasks run as other uids only under a root agent");
    }
    eprintln!(
        "\n######## SKIPPED {test}: not root, so tasks run as the agent's own user.\n######## Run the tests as root (scripts/test.sh in CI does).\n"
    );
    false
}

fn registration(name: &str, cpus: u64) -> RegisterAgent {
    RegisterAgent {
        name: name.into(),
        capacity: Resources::new(cpus * 1000, 64 << 30, 0),
        gpu_type: None,
        labels: Default::default(),
        running: vec![],
        address: "127.0.0.1".into(),
        gpus: vec![],
        life: 1,
    }
}

async fn node(client: &Client, name: &str) -> Option<NodeView> {
    client
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.name == name)
}

async fn wait_node_state(client: &Client, name: &str, state: &str) -> NodeView {
    eventually(&format!("node {name} to be {state}"), DEADLINE, || {
        let client = client.clone();
        async move { node(&client, name).await.filter(|n| n.state == state) }
    })
    .await
}

/// Wait until the file at `path` contains `needle`; its text. A timeout shows the text.
async fn wait_file(path: &Path, needle: &str) -> String {
    let end = std::time::Instant::now() + DEADLINE;
    loop {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).to_string();
        if text.contains(needle) {
            return text;
        }
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for `{needle}` in {}:\n{text}",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `taccd agent` for `server` on `data_dir` with `args` (no join token unless they give
/// one), its log in `data_dir/agent.log`.
fn agent_process(server: &Daemon, data_dir: &Path, args: &[&str]) -> Daemon {
    std::fs::create_dir_all(data_dir).unwrap();
    // A new file, not the old one truncated: a previous agent's watchdog may still write
    // into that one.
    let _ = std::fs::remove_file(data_dir.join("agent.log"));
    let log = std::fs::File::create(data_dir.join("agent.log")).unwrap();
    let child = taccd()
        .args(["agent", "--server", &server.url, "--data-dir"])
        .arg(data_dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon {
        child,
        url: server.url.clone(),
        data_dir: data_dir.to_path_buf(),
        token: String::new(),
    }
}

/// A task's view of every process on the host: `CMD pid args` for each command line it
/// can read, `ENV pid vars` for each environment it can read (`NOENV pid` where it
/// cannot), and `ps -eo pid=,args=` as `PS pid args`.
const SNOOP: &str = r#"name: snoop
run: |
  echo "uid=$(id -u)"
  ps -eo pid=,args= | sed 's/^ */PS /'
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
    echo "CMD $pid $cmd"
    if env=$(tr '\0' ' ' < "$p/environ" 2>/dev/null); then
      echo "ENV $pid $env"
    else
      echo "NOENV $pid"
    fi
  done
"#;

/// Whether `text` holds something shaped like a TACC token (`tacc_` and 43 URL-safe
/// base64 characters).
fn holds_a_token(text: &str) -> bool {
    text.match_indices("tacc_").any(|(at, _)| {
        text[at + 5..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .count()
            >= 40
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_finds_no_join_token_in_any_agent_s_command_line_or_environment() {
    if !root_or_skip("a_task_finds_no_join_token_in_any_agent_s_command_line_or_environment") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    // The embedded cluster: its agent's join token comes from the server that starts it.
    let dev = start("dev", &dir.path().join("dev"), &[]).await;
    let dev_client = dev.client();
    wait_nodes(&dev_client, 1).await;
    // A server of its own with two agents, started as docs/OPERATIONS.md says: one with
    // its join token in a file, one with it in its environment.
    let server = start("server", &dir.path().join("server"), &[]).await;
    let client = server.client();
    let from_file = server.admin(&["agent-token"]).trim().to_string();
    let token_file = write_token_file(&dir.path().join("join.token"), &from_file);
    let _by_file = agent_process(
        &server,
        &dir.path().join("agent-file"),
        &[
            "--name",
            "by-file",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let from_env = server.admin(&["agent-token"]).trim().to_string();
    let env_dir = dir.path().join("agent-env");
    std::fs::create_dir_all(&env_dir).unwrap();
    let env_log = std::fs::File::create(env_dir.join("agent.log")).unwrap();
    let _by_env = Daemon {
        child: taccd()
            .args(["agent", "--server", &server.url, "--data-dir"])
            .arg(&env_dir)
            .args(["--name", "by-env"])
            .env("TACC_JOIN_TOKEN", &from_env)
            .stdout(Stdio::null())
            .stderr(env_log)
            .spawn()
            .unwrap(),
        url: server.url.clone(),
        data_dir: env_dir.clone(),
        token: String::new(),
    };
    wait_node_state(&client, "by-file", "up").await;
    wait_node_state(&client, "by-env", "up").await;

    // An unprivileged task on the embedded cluster's node looks at every process.
    let task = submit(&dev_client, dir.path(), "snoop", SNOOP, &[]).await;
    let view = wait_terminal(&dev_client, task).await;
    let log = log_text(&dev_client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}\n{log}");
    let uid: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("uid="))
        .and_then(|u| u.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uid in {log}"));
    assert_ne!(uid, 0, "the task must run unprivileged");

    // The processes of this test: every one whose command line names its directory.
    let ours: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("CMD "))
        .filter(|l| l.contains(&root))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let agents = log
        .lines()
        .filter(|l| l.starts_with("CMD ") && l.contains(&root))
        .filter(|l| l.contains(" agent ") || l.contains("--embedded-agent"))
        .count();
    assert!(
        agents >= 3,
        "the task must see the embedded agent and both agents: {agents} seen\n{log}"
    );
    for line in log.lines() {
        let mut words = line.splitn(3, ' ');
        let (kind, pid) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if !matches!(kind, "CMD" | "ENV" | "PS") || !ours.contains(&pid) {
            continue;
        }
        assert!(
            !line.contains(&from_file) && !line.contains(&from_env) && !holds_a_token(line),
            "a task read a join token: {line}"
        );
    }
    // The agents' environments (where TACC_JOIN_TOKEN may be) are closed to tasks.
    let env_agent = log
        .lines()
        .filter_map(|l| l.strip_prefix("CMD "))
        .find(|l| l.contains(env_dir.to_str().unwrap()) && l.contains(" agent "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the task saw the agent started with TACC_JOIN_TOKEN");
    assert!(
        log.lines().any(|l| l == format!("NOENV {env_agent}")),
        "a task read the environment of agent {env_agent}\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_on_the_command_line_is_refused_with_the_way_to_pass_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let join = server.admin(&["agent-token"]).trim().to_string();
    let out = taccd()
        .args(["agent", "--server", &server.url, "--data-dir"])
        .arg(dir.path().join("a"))
        .args(["--name", "argv", "--token", &join])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--token-file") && stderr.contains("TACC_JOIN_TOKEN"),
        "{stderr}"
    );
    assert!(node(&server.client(), "argv").await.is_none());

    // The same token from standard input enrols the node.
    let mut child = taccd()
        .args(["agent", "--server", &server.url, "--data-dir"])
        .arg(dir.path().join("a"))
        .args(["--name", "stdin", "--token-file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stdin-agent.log")).unwrap())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(join.as_bytes()).unwrap();
    }
    let _agent = Daemon {
        child,
        url: server.url.clone(),
        data_dir: dir.path().join("a"),
        token: String::new(),
    };
    wait_node_state(&server.client(), "stdin", "up").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_join_token_enrols_no_rogue_node() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let join = server
        .admin(&["agent-token", "--ttl", "1h"])
        .trim()
        .to_string();
    let token_file = write_token_file(&dir.path().join("join.token"), &join);
    let _real = agent_process(
        &server,
        &dir.path().join("real"),
        &[
            "--name",
            "real",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    wait_node_state(&client, "real", "up").await;

    // The token, stolen after its use, enrols nothing: not through the API…
    let refused = Client::new(&server.url)
        .with_token(join.clone())
        .register_agent(&registration("rogue", 16))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("forbidden"), "{refused}");
    let said = refused.to_string();
    assert!(
        said.contains("already used") && said.contains("real") && said.contains("agent-token"),
        "{said}"
    );
    // …nor as a rogue agent offering a big machine.
    let rogue_dir = dir.path().join("rogue");
    let _rogue = agent_process(
        &server,
        &rogue_dir,
        &[
            "--name",
            "rogue",
            "--cpus",
            "16",
            "--memory",
            "64GiB",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    wait_file(&rogue_dir.join("agent.log"), "already used").await;
    let nodes = client.list_nodes().await.unwrap();
    assert!(nodes.iter().all(|n| n.name != "rogue"), "{nodes:?}");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    eventually("the refusal in the audit trail", DEADLINE, || {
        let client = client.clone();
        async move {
            let audit = client.audit(200).await.ok()?;
            audit
                .iter()
                .any(|a| {
                    a.action == "node.register" && a.target == "node:rogue" && a.outcome != "ok"
                })
                .then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_bound_to_a_name_refuses_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let join = server
        .admin(&["agent-token", "--node", "gpu-07"])
        .trim()
        .to_string();
    let joiner = Client::new(&server.url).with_token(join.clone());
    let refused = joiner
        .register_agent(&registration("rogue", 4))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("forbidden"), "{refused}");
    assert!(
        refused.to_string().contains("enrols node `gpu-07` only"),
        "{refused}"
    );
    assert!(node(&client, "rogue").await.is_none());
    // The refusal did not use it up: the node it names enrols.
    let token_file = write_token_file(&dir.path().join("join.token"), &join);
    let _agent = agent_process(
        &server,
        &dir.path().join("gpu-07"),
        &[
            "--name",
            "gpu-07",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    wait_node_state(&client, "gpu-07", "up").await;
    assert_eq!(client.list_nodes().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_approval_required_a_new_node_gets_no_task_until_approved() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("s"),
        &["--require-node-approval"],
    )
    .await;
    let client = server.client();
    let alice = server.user_client("alice", None, "user").await;
    alice
        .put_secret("VSECRET", b"the-value-of-vsecret".to_vec())
        .await
        .unwrap();
    let _agent = start_agent(&server, &dir.path().join("a"), &["--name", "fresh"]);
    let pending = wait_node_state(&client, "fresh", "pending").await;
    assert!(pending.running_tasks.is_empty());

    // A task that fits waits, with its secret, until the node is approved.
    let task = submit(
        &alice,
        dir.path(),
        "waits",
        "name: waits\nenvironment:\n  secrets: [VSECRET]\nrun: echo ran-with-${#VSECRET}-bytes\n",
        &[],
    )
    .await;
    let why = eventually("the task's pending reason", DEADLINE, || {
        let alice = alice.clone();
        async move {
            alice
                .explain(task)
                .await
                .ok()
                .filter(|w| w.reason.is_some())
        }
    })
    .await;
    assert_eq!(
        alice.get_task(task).await.unwrap().state,
        TaskState::Queued,
        "{why:?}"
    );
    let still = node(&client, "fresh").await.unwrap();
    assert_eq!(still.state, "pending");
    assert!(still.running_tasks.is_empty(), "{still:?}");

    let said = server.admin(&["node", "approve", "fresh"]);
    assert!(said.contains("approved"), "{said}");
    let view = wait_terminal(&alice, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert!(log_text(&alice, task).await.contains("ran-with-20-bytes"));
    assert_eq!(node(&client, "fresh").await.unwrap().state, "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_grows_must_enrol_again_and_a_plain_restart_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &[]).await;
    let client = server.client();
    let data = dir.path().join("a");
    let mut agent = start_agent(&server, &data, &["--name", "grow", "--cpus", "2"]);
    // Its credential is kept before it says it registered.
    wait_file(&data.join("agent.log"), "registered as node").await;
    agent.kill9();

    // The same name and capacity with its stored credential: registers as before.
    let mut agent = agent_process(&server, &data, &["--name", "grow", "--cpus", "2"]);
    wait_file(&data.join("agent.log"), "registered as node").await;
    agent.kill9();

    // More CPUs without a new token: refused, with what to do.
    let _grown = agent_process(&server, &data, &["--name", "grow", "--cpus", "8"]);
    let said = wait_file(&data.join("agent.log"), "enrol it again").await;
    assert!(said.contains("agent-token --node grow"), "{said}");
    let credential = std::fs::read_to_string(data.join("node.token")).unwrap();
    let refused = Client::new(&server.url)
        .with_token(credential.trim())
        .register_agent(&registration("grow", 8))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("reenrol_required"), "{refused}");
    // Nor under another name.
    let renamed = Client::new(&server.url)
        .with_token(credential.trim())
        .register_agent(&registration("renamed", 2))
        .await
        .unwrap_err();
    assert_eq!(renamed.code(), Some("reenrol_required"), "{renamed}");
    assert!(node(&client, "renamed").await.is_none());
    assert_eq!(
        node(&client, "grow").await.unwrap().capacity.cpu_millis,
        2000
    );
    drop(_grown);

    // With a new token bound to its name, it enrols again with what it offers now, and
    // its old credential stops working.
    let join = server.admin(&["agent-token", "--node", "grow"]);
    let token_file = write_token_file(&dir.path().join("rejoin.token"), &join);
    let _again = agent_process(
        &server,
        &data,
        &[
            "--name",
            "grow",
            "--cpus",
            "8",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    eventually("the node to offer 8 CPUs", DEADLINE, || {
        let client = client.clone();
        async move {
            node(&client, "grow")
                .await
                .filter(|n| n.capacity.cpu_millis == 8000 && n.state == "up")
        }
    })
    .await;
    // Once the agent kept its new credential (after the server answered), the old one
    // is refused.
    eventually("the agent to keep its new credential", DEADLINE, || {
        let now = std::fs::read_to_string(data.join("node.token")).unwrap_or_default();
        let changed = !now.trim().is_empty() && now.trim() != credential.trim();
        async move { changed.then_some(()) }
    })
    .await;
    let old = Client::new(&server.url)
        .with_token(credential.trim())
        .register_agent(&registration("grow", 8))
        .await
        .unwrap_err();
    assert_eq!(old.code(), Some("unauthenticated"), "{old}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_cluster_started_again_with_more_cpus_enrols_its_agent_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    let first = start("dev", &data, &["--cpus", "1"]).await;
    let client = first.client();
    let name = eventually("the embedded node", DEADLINE, || {
        let client = client.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            nodes.into_iter().find(|n| n.state == "up").map(|n| n.name)
        }
    })
    .await;
    drop(first);
    // Its server hands the agent a join token bound to the node's name: the agent, refused
    // with its old credential, enrols again with what it offers now.
    let again = start("dev", &data, &["--cpus", "2"]).await;
    let client = again.client();
    eventually("the node to offer 2 CPUs", DEADLINE, || {
        let client = client.clone();
        let name = name.clone();
        async move {
            node(&client, &name)
                .await
                .filter(|n| n.capacity.cpu_millis == 2000 && n.state == "up")
        }
    })
    .await;
}

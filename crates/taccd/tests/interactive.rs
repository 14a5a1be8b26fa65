//! Interactive sessions into running tasks against real daemons: `tcloud exec`, `tcloud
//! shell` (driven through a real terminal, tmux) and `tcloud port-forward`, who may open
//! them, how they end (the task ends, the token is revoked) and what the audit says.
//!
//! Needs root (the agent switches to the task's uid, its cgroup and its private /tmp):
//! elsewhere the tests say SKIPPED loudly and pass, except in CI (`CI=true`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

const UID_BASE: u32 = 3_300_000;

fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: must run as root in CI: sessions enter tasks under a root agent");
    }
    eprintln!(
        "\n######## SKIPPED {test}: not root, so the agent cannot run tasks as their own uid.\n"
    );
    false
}

/// A dev cluster in `root/d` whose task uids start at `uid_base` (each test takes a range
/// of its own), with `extra` flags, and a `tcloud` home beside it.
async fn dev_cluster(root: &Path, uid_base: u32, extra: &[&str]) -> (Daemon, PathBuf) {
    let base = uid_base.to_string();
    let mut args = vec!["--task-uid-base", base.as_str()];
    args.extend_from_slice(extra);
    let daemon = start("dev", &root.join("d"), &args).await;
    (daemon, root.join("home"))
}

/// A user and their token.
async fn user(daemon: &Daemon, name: &str) -> (Client, String, u64) {
    let created = daemon
        .client()
        .create_user(&tacc_proto::CreateUser {
            name: name.into(),
            group: None,
            role: tacc_core::Role::User,
            token_ttl_secs: None,
        })
        .await
        .unwrap();
    let token = created.token.token.clone();
    (
        Client::new(&daemon.url).with_token(token.clone()),
        token,
        created.token.id,
    )
}

/// `tcloud ARGS` as the holder of `token`, with `stdin`: (exit code, stdout, stderr).
fn tcloud_as(
    daemon: &Daemon,
    token: &str,
    home: &Path,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The value of `KEY=value` on a line of `log` (a gang's lines start with `[RANK] `).
fn field<'a>(log: &'a str, key: &str) -> Option<&'a str> {
    log.lines().find_map(|line| {
        let line = match line.strip_prefix('[') {
            Some(rest) => rest.split_once("] ").map_or(line, |(_, text)| text),
            None => line,
        };
        line.strip_prefix(&format!("{key}="))
    })
}

/// Submit a task that prints `ready=1` once set up, then sleeps; wait until it has.
async fn running_task(client: &Client, root: &Path, name: &str, yaml: &str) -> (TaskId, String) {
    running_task_with(client, root, name, yaml, &[]).await
}

async fn running_task_with(
    client: &Client,
    root: &Path,
    name: &str,
    yaml: &str,
    files: &[(&str, &str)],
) -> (TaskId, String) {
    let task = submit(client, root, name, yaml, files).await;
    wait_state(client, task, &[TaskState::Running]).await;
    let log = eventually(&format!("task {task} to be ready"), DEADLINE, || {
        let client = client.clone();
        async move {
            let log = log_text(&client, task).await;
            field(&log, "ready").is_some().then_some(log)
        }
    })
    .await;
    (task, log)
}

/// Kills the child (and waits) when dropped, however the test ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_as_the_task_in_its_cgroup_tmp_and_environment_and_returns_its_code() {
    if !root_or_skip("exec_runs_as_the_task_in_its_cgroup_tmp_and_environment_and_returns_its_code")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE, &[]).await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    alice
        .put_secret("API_KEY", b"s3cret-value".to_vec())
        .await
        .unwrap();
    let yaml = "name: busy\nenvironment:\n  secrets: [API_KEY]\n  vars:\n    GREETING: hello-from-task\n    TZ: UTC+5\nrun: |\n  echo in-private-tmp > /tmp/task-marker\n  echo cgroup=$(cat /proc/self/cgroup | tr '\\n' ' ')\n  echo ready=1\n  sleep 300\n";
    let (task, log) = running_task(&alice, dir.path(), "busy", yaml).await;
    let id = task.to_string();

    let script = "echo uid=$(id -u); echo greeting=$GREETING; echo key=$API_KEY; echo tz=$TZ; \
                  echo pwd=$(pwd); echo workdir=$TACC_WORKDIR; echo tmp=$(cat /tmp/task-marker); \
                  echo cgroup=$(cat /proc/self/cgroup | tr '\\n' ' '); echo to-stderr >&2; exit 7";
    let (code, out, err) = tcloud_as(
        &daemon,
        &alice_token,
        &home,
        &["exec", &id, "--", "sh", "-c", script],
        "",
    );
    assert_eq!(code, 7, "stdout: {out}\nstderr: {err}");
    assert_eq!(
        field(&out, "uid"),
        Some(UID_BASE.to_string().as_str()),
        "{out}"
    );
    assert_eq!(field(&out, "greeting"), Some("hello-from-task"), "{out}");
    assert_eq!(field(&out, "key"), Some("s3cret-value"), "{out}");
    // A loader/shell variable held back from the root steps is the task's again.
    assert_eq!(field(&out, "tz"), Some("UTC+5"), "{out}");
    assert_eq!(field(&out, "pwd"), field(&out, "workdir"), "{out}");
    assert_eq!(field(&out, "tmp"), Some("in-private-tmp"), "{out}");
    assert_eq!(field(&out, "cgroup"), field(&log, "cgroup"), "{out}\n{log}");
    assert!(err.contains("to-stderr"), "{err}");

    // stdin is forwarded, and its end reaches the command.
    let (code, out, err) = tcloud_as(
        &daemon,
        &alice_token,
        &home,
        &["exec", &id, "--", "sh", "-c", "tr a-z A-Z; echo done"],
        "forwarded text\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "FORWARDED TEXT\ndone\n");

    // Every session is in the audit: who, which task and rank, what, and how it ended
    // (the end is written once the server has seen both sides close).
    let target = format!("task {task} rank 0");
    let audit = eventually("both sessions' ends in the audit", DEADLINE, || {
        let admin = daemon.client();
        let target = target.clone();
        async move {
            let audit = admin.audit(200).await.ok()?;
            let ends = audit
                .iter()
                .filter(|e| e.action == "session.close" && e.target == target)
                .count();
            (ends == 2).then_some(audit)
        }
    })
    .await;
    let opened: Vec<_> = audit
        .iter()
        .filter(|e| e.action == "session.open" && e.target == target)
        .collect();
    let closed: Vec<_> = audit
        .iter()
        .filter(|e| e.action == "session.close" && e.target == target)
        .collect();
    assert_eq!(opened.len(), 2, "{audit:#?}");
    assert_eq!(closed.len(), 2, "{audit:#?}");
    assert!(
        opened.iter().all(|e| e.actor == "user:alice"),
        "{opened:#?}"
    );
    assert!(
        opened
            .iter()
            .any(|e| e.detail.starts_with("exec sh -c tr a-z A-Z")),
        "{opened:#?}"
    );
    assert!(
        closed
            .iter()
            .all(|e| e.detail.contains("bytes from the user")),
        "{closed:#?}"
    );

    // The task's page on the dashboard offers the command lines to copy.
    let page = dashboard_page(&daemon, &alice_token, &format!("/ui/tasks/{task}")).await;
    for line in [
        format!("tcloud exec {task} -- nvidia-smi"),
        format!("tcloud shell {task}"),
        format!("tcloud port-forward {task} 6006"),
    ] {
        assert!(page.contains(&line), "{line} missing from the task's page");
    }

    daemon.client().cancel(task).await.unwrap();
}

/// The value of cookie `name` among a reply's `Set-Cookie` headers.
fn set_cookie(reply: &reqwest::Response, name: &str) -> Option<String> {
    reply
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or("").to_string())
}

/// A dashboard page as the holder of `token` sees it, signed in through the form.
async fn dashboard_page(daemon: &Daemon, token: &str, path: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let form = http
        .get(format!("{}/ui/login", daemon.url))
        .send()
        .await
        .unwrap();
    let login = set_cookie(&form, "tacc_login").expect("a sign-in cookie");
    let html = form.text().await.unwrap();
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the sign-in form's csrf field")
        .to_string();
    let signed_in = http
        .post(format!("{}/ui/login", daemon.url))
        .header("cookie", format!("tacc_login={login}"))
        .form(&[("token", token), ("csrf", csrf.as_str()), ("next", "")])
        .send()
        .await
        .unwrap();
    let session = set_cookie(&signed_in, "tacc_session").expect("a session cookie");
    http.get(format!("{}{path}", daemon.url))
        .header("cookie", format!("tacc_session={session}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_and_admins_enter_and_exec_cannot_escape_the_task() {
    if !root_or_skip("only_the_owner_and_admins_enter_and_exec_cannot_escape_the_task") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 100, &[]).await;
    let data = dir.path().join("d");
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    let (bob, bob_token, _) = user(&daemon, "bob").await;
    let bob_yaml = "name: private\nrun: |\n  echo bob-model-weights > model.txt\n  echo workdir=$TACC_WORKDIR\n  echo ready=1\n  sleep 300\n";
    let (bobs, bob_log) = running_task(&bob, dir.path(), "bob", bob_yaml).await;
    let bob_workdir = field(&bob_log, "workdir").unwrap().to_string();
    let alice_yaml = "name: mine\nrun: |\n  echo ready=1\n  sleep 300\n";
    let (alices, _) = running_task(&alice, dir.path(), "alice", alice_yaml).await;
    let id = alices.to_string();

    // Bob is told Alice's task does not exist, for exec, shell and port-forward alike.
    let (code, _, err) = tcloud_as(&daemon, &bob_token, &home, &["exec", &id, "--", "true"], "");
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&format!("task {id} does not exist")), "{err}");
    let url = format!("{}/v1/tasks/{id}/session", daemon.url);
    let raw = reqwest::Client::new();
    let ask = |token: String| {
        raw.get(&url)
            .query(&[("request", r#"{"kind":"forward","port":80}"#)])
            .header("connection", "upgrade")
            .header("upgrade", tacc_proto::SESSION_PROTOCOL)
            .bearer_auth(token)
            .send()
    };
    assert_eq!(ask(bob_token.clone()).await.unwrap().status(), 404);
    // Nor can a node credential open one: it too is told the task does not exist.
    let node_token = std::fs::read_to_string(data.join("agent/node.token")).unwrap();
    assert_eq!(
        ask(node_token.trim().to_string()).await.unwrap().status(),
        404
    );

    // The admin may.
    let (code, out, err) = tcloud_as(
        &daemon,
        &daemon.token,
        &home,
        &["exec", &id, "--", "id", "-u"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    // Alice's uid, the second allocated (Bob's task ran first): the task's, not the admin's.
    assert_eq!(out.trim(), (UID_BASE + 101).to_string());

    // The isolation probes, run through exec as Alice: her own directory works, the
    // agent's credential, the server's database and Bob's files do not.
    let d = data.display();
    let probes = format!(
        r#"try() {{ if sh -c "$2" >/dev/null 2>&1; then echo "ALLOWED $1"; else echo "DENIED $1"; fi; }}
try own-workdir "echo x > mine.txt && cat mine.txt"
try read-node-credential "cat {d}/agent/node.token"
try read-database "cat {d}/tacc.db"
try read-bob-file "cat {bob_workdir}/model.txt"
try list-bob-workdir "ls {bob_workdir}"
try write-bob-workdir "touch {bob_workdir}/x"
"#
    );
    let (code, out, err) = tcloud_as(
        &daemon,
        &alice_token,
        &home,
        &["exec", &id, "--", "bash", "-c", &probes],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ALLOWED own-workdir"), "{out}");
    for probe in [
        "read-node-credential",
        "read-database",
        "read-bob-file",
        "list-bob-workdir",
        "write-bob-workdir",
    ] {
        assert!(out.contains(&format!("DENIED {probe}")), "{probe}: {out}");
    }
    let _ = alice;
    daemon.client().cancel(alices).await.unwrap();
    daemon.client().cancel(bobs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_its_token_is_revoked_or_its_task_ends() {
    if !root_or_skip("a_session_ends_when_its_token_is_revoked_or_its_task_ends") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 200, &[]).await;
    let (alice, alice_token, alice_token_id) = user(&daemon, "alice").await;
    let yaml = "name: long\nrun: |\n  echo ready=1\n  sleep 300\n";
    let (task, _) = running_task(&alice, dir.path(), "long", yaml).await;
    let id = task.to_string();
    let spawn_exec = |token: &str| {
        Reaped(
            Command::new(tcloud_binary())
                .args([
                    "exec",
                    &id,
                    "--",
                    "sh",
                    "-c",
                    "echo started; exec sleep 100",
                ])
                .env("TACC_HOME", &home)
                .env("TACC_SERVER", &daemon.url)
                .env("TACC_TOKEN", token)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let wait_started = |child: &mut Reaped| {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
    };
    let ended_within = |child: &mut Reaped, limit: Duration| -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(status) = child.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    };

    // The task is cancelled: the session ends with it.
    let admin = daemon.client();
    let (other, _) = running_task(&alice, dir.path(), "other", yaml).await;
    let mut session = {
        let token = alice_token.clone();
        let id = other.to_string();
        Reaped(
            Command::new(tcloud_binary())
                .args([
                    "exec",
                    &id,
                    "--",
                    "sh",
                    "-c",
                    "echo started; exec sleep 100",
                ])
                .env("TACC_HOME", &home)
                .env("TACC_SERVER", &daemon.url)
                .env("TACC_TOKEN", token)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    wait_started(&mut session);
    admin.cancel(other).await.unwrap();
    let status =
        ended_within(&mut session, Duration::from_secs(20)).expect("the session outlived its task");
    assert!(!status.success());
    // A task that no longer runs cannot be entered, and says why.
    wait_terminal(&admin, other).await;
    let (code, _, err) = tcloud_as(
        &daemon,
        &alice_token,
        &home,
        &["exec", &other.to_string(), "--", "true"],
        "",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("is cancelled: sessions open only into a running task"),
        "{err}"
    );

    // The owner's token is revoked: the open session ends within 10 s.
    let mut session = spawn_exec(&alice_token);
    wait_started(&mut session);
    admin.revoke_token(alice_token_id).await.unwrap();
    let status = ended_within(&mut session, Duration::from_secs(10))
        .expect("the session outlived its token");
    assert!(!status.success());
    let mut stderr = String::new();
    use std::io::Read;
    session
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("revoked"), "{stderr}");
    eventually("the revoked session's end in the audit", DEADLINE, || {
        let admin = admin.clone();
        async move {
            let audit = admin.audit(200).await.ok()?;
            audit
                .iter()
                .any(|e| e.action == "session.close" && e.detail.contains("was revoked"))
                .then_some(())
        }
    })
    .await;
    admin.cancel(task).await.unwrap();
}

/// `tmux` on a private socket, killed when dropped.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "s"])
    }

    async fn wait_for(&self, needle: &str) -> String {
        eventually(
            &format!("`{needle}` on the terminal"),
            DEADLINE,
            || async move {
                let screen = self.screen();
                screen.contains(needle).then_some(screen)
            },
        )
        .await
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_on_a_real_terminal_follows_resizes_takes_ctrl_c_and_exits_with_its_code() {
    if !root_or_skip(
        "a_shell_on_a_real_terminal_follows_resizes_takes_ctrl_c_and_exits_with_its_code",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 300, &[]).await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    let yaml = "name: interactive\nrun: |\n  echo ready=1\n  sleep 300\n";
    let (task, _) = running_task(&alice, dir.path(), "sh", yaml).await;
    let code_file = dir.path().join("code");
    let stty_file = dir.path().join("stty-after");
    let command = format!(
        "TACC_HOME={home} TACC_SERVER={url} TACC_TOKEN={token} {tcloud} shell {task}; echo $? > {code}; stty -a > {stty}; sleep 300",
        home = home.display(),
        url = daemon.url,
        token = alice_token,
        tcloud = tcloud_binary().display(),
        code = code_file.display(),
        stty = stty_file.display(),
    );
    let tmux = Tmux {
        socket: dir.path().join("tmux.sock"),
    };
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "s",
        "-x",
        "120",
        "-y",
        "40",
        "sh",
        "-c",
        &command,
    ]);

    tmux.run(&["send-keys", "-t", "s", "echo uid-is-$(id -u)", "Enter"]);
    let screen = tmux.wait_for(&format!("uid-is-{}", UID_BASE + 300)).await;
    // Nothing of the agent's own handshake shows on the user's terminal.
    assert!(!screen.lines().any(|line| line.trim() == "go"), "{screen}");
    tmux.run(&["send-keys", "-t", "s", "stty size", "Enter"]);
    tmux.wait_for("40 120").await;
    tmux.run(&["resize-window", "-t", "s", "-x", "100", "-y", "30"]);
    // The resize travels as its own frame: wait until the remote terminal has it.
    eventually(
        "the remote terminal to take the new size",
        DEADLINE,
        || async {
            tmux.run(&["send-keys", "-t", "s", "clear; stty size", "Enter"]);
            tokio::time::sleep(Duration::from_millis(300)).await;
            tmux.screen().contains("30 100").then_some(())
        },
    )
    .await;

    // Ctrl-C stops the foreground command, not the shell.
    tmux.run(&[
        "send-keys",
        "-t",
        "s",
        "sleep 100; echo slept-$((1+1))-through",
        "Enter",
    ]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    tmux.run(&["send-keys", "-t", "s", "C-c", ""]);
    tmux.run(&["send-keys", "-t", "s", "echo still-$((40+2))", "Enter"]);
    let screen = tmux.wait_for("still-42").await;
    assert!(!screen.contains("slept-2-through"), "{screen}");

    // Ctrl-Z stops it (job control on the remote terminal); the shell goes on.
    tmux.run(&["send-keys", "-t", "s", "sleep 200", "Enter"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    tmux.run(&["send-keys", "-t", "s", "C-z", ""]);
    tmux.wait_for("Stopped").await;
    tmux.run(&[
        "send-keys",
        "-t",
        "s",
        // SIGKILL ends the stopped job at once and `wait` reaps it: a job still in the
        // shell's table would make the `exit` below warn of stopped jobs instead of exiting.
        "kill -9 %1; wait %1; echo killed-$((2+3))",
        "Enter",
    ]);
    tmux.wait_for("killed-5").await;

    tmux.run(&["send-keys", "-t", "s", "exit 3", "Enter"]);
    let code = eventually("tcloud shell to end", DEADLINE, || async {
        std::fs::read_to_string(&code_file)
            .ok()
            .filter(|c| c.ends_with('\n'))
    })
    .await;
    assert_eq!(code.trim(), "3");
    // The local terminal is back in cooked mode with echo.
    let stty = eventually("stty's report", DEADLINE, || async {
        std::fs::read_to_string(&stty_file)
            .ok()
            .filter(|s| s.contains("icanon"))
    })
    .await;
    assert!(
        stty.contains(" icanon") && !stty.contains("-icanon"),
        "{stty}"
    );
    assert!(
        stty.contains(" echo ") && !stty.contains("-echo "),
        "{stty}"
    );
    daemon.client().cancel(task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_carries_twenty_parallel_connections_to_a_server_in_the_task() {
    if !root_or_skip("port_forward_carries_twenty_parallel_connections_to_a_server_in_the_task") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 400, &[]).await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    // The task serves its working directory on a port the kernel picks, and says which.
    let yaml = "name: web\nrun: |\n  echo served-content > page.txt\n  python3 -u serve.py\n";
    let serve = "import http.server\n\
                 s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\n\
                 print('port=%d' % s.server_address[1])\n\
                 print('ready=1')\n\
                 s.serve_forever()\n";
    let (task, log) =
        running_task_with(&alice, dir.path(), "web", yaml, &[("serve.py", serve)]).await;
    let remote = field(&log, "port").unwrap().to_string();
    let mut forward = Reaped(
        Command::new(tcloud_binary())
            .args(["port-forward", &task.to_string(), &format!("0:{remote}")])
            .env("TACC_HOME", &home)
            .env("TACC_SERVER", &daemon.url)
            .env("TACC_TOKEN", &alice_token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    {
        use std::io::BufRead;
        std::io::BufReader::new(forward.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
    }
    // "Forwarding 127.0.0.1:PORT -> task …"
    let local: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {line:?}"));
    let http = reqwest::Client::new();
    let fetches = (0..20).map(|_| {
        let http = http.clone();
        async move {
            let response = http
                .get(format!("http://127.0.0.1:{local}/page.txt"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        }
    });
    let pages = futures::future::join_all(fetches).await;
    assert_eq!(pages.len(), 20);
    assert!(pages.iter().all(|p| p == "served-content\n"), "{pages:?}");

    // Ctrl-C ends it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(forward.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while forward.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "port-forward outlived Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.client().cancel(task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reaches_each_rank_of_a_two_node_gang_on_its_own_host() {
    if !root_or_skip("exec_reaches_each_rank_of_a_two_node_gang_on_its_own_host")
        || !common::netns::network_ready(
            "exec_reaches_each_rank_of_a_two_node_gang_on_its_own_host",
        )
    {
        return;
    }
    use common::netns::{Cluster, host_address};
    let dir = tempfile::tempdir().unwrap();
    // The server on the bridge over TLS, each agent in a network namespace of its own:
    // two machines, as far as the session's way back to each node goes.
    let cluster = Cluster::start(dir.path(), &[]).await;
    let _agents: Vec<Daemon> = (1..=2)
        .map(|h| cluster.agent(h, &format!("exec-h{h}"), &["--cpus", "2"]))
        .collect();
    wait_nodes(&cluster.client, 2).await;
    let created = cluster
        .client
        .create_user(&tacc_proto::CreateUser {
            name: "alice".into(),
            group: None,
            role: tacc_core::Role::User,
            token_ttl_secs: None,
        })
        .await
        .unwrap();
    let alice_token = created.token.token.clone();
    let alice = Client::new(&cluster.server.url)
        .with_pinned_fingerprint(&cluster.fingerprint)
        .unwrap()
        .with_token(alice_token.clone());
    // tcloud trusts the server's certificate through its profile's pinned fingerprint.
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "current = \"lab\"\n\n[clusters.lab]\nurl = \"{}\"\ntoken = \"{alice_token}\"\nfingerprint = \"{}\"\n",
            cluster.server.url, cluster.fingerprint
        ),
    )
    .unwrap();
    let tcloud_lab = |args: &[&str]| {
        let output = Command::new(tcloud_binary())
            .args(args)
            .env("TACC_HOME", &home)
            .env_remove("TACC_SERVER")
            .env_remove("TACC_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let yaml = "name: gang\nresources: {nodes: 2, cpus: 1}\nrun: |\n  echo ready=1\n  sleep 300\n";
    let (task, _) = running_task(&alice, dir.path(), "gang", yaml).await;
    let id = task.to_string();
    let view = alice.get_task(task).await.unwrap();
    let script = "echo node-rank=$NODE_RANK; echo workdir=$(pwd); echo addresses=$(hostname -I)";
    for rank in 0..2usize {
        let rank_text = rank.to_string();
        let (code, out, err) =
            tcloud_lab(&["exec", &id, "--rank", &rank_text, "--", "sh", "-c", script]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(field(&out, "node-rank"), Some(rank_text.as_str()), "{out}");
        // It ran on that rank's host: in its network namespace, in its agent's directory.
        let host: u32 = view.nodes[rank]
            .trim_start_matches("exec-h")
            .parse()
            .unwrap();
        let addresses = field(&out, "addresses").unwrap_or_default();
        assert!(
            addresses
                .split_whitespace()
                .any(|a| a == host_address(host)),
            "rank {rank} on {}: {out}",
            view.nodes[rank]
        );
        let expected = dir.path().join(&view.nodes[rank]).display().to_string();
        assert!(
            field(&out, "workdir").is_some_and(|w| w.starts_with(&expected)),
            "rank {rank} on {}: {out}",
            view.nodes[rank]
        );
    }
    let (code, _, err) = tcloud_lab(&["exec", &id, "--rank", "2", "--", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("--rank must be 0 to 1"), "{err}");
    cluster.client.cancel(task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_per_user_and_cut_when_idle() {
    if !root_or_skip("sessions_are_bounded_per_user_and_cut_when_idle") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(
        dir.path(),
        UID_BASE + 500,
        &["--session-idle", "3s", "--sessions-per-user", "1"],
    )
    .await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    let yaml = "name: quiet\nrun: |\n  echo ready=1\n  sleep 300\n";
    let (task, _) = running_task(&alice, dir.path(), "quiet", yaml).await;
    let id = task.to_string();
    let mut first = Reaped(
        Command::new(tcloud_binary())
            .args([
                "exec",
                &id,
                "--",
                "sh",
                "-c",
                "echo started; exec sleep 100",
            ])
            .env("TACC_HOME", &home)
            .env("TACC_SERVER", &daemon.url)
            .env("TACC_TOKEN", &alice_token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(first.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
    }
    // A second session of the same user is refused while the first is open.
    let (code, _, err) = tcloud_as(
        &daemon,
        &alice_token,
        &home,
        &["exec", &id, "--", "true"],
        "",
    );
    assert_ne!(code, 0);
    assert!(err.contains("you already have 1 sessions open"), "{err}");
    // The first falls silent and is cut after the idle limit, saying so.
    let status = loop {
        if let Some(status) = first.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "an idle session was not cut"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    assert!(started.elapsed() >= Duration::from_secs(2), "cut too early");
    let mut stderr = String::new();
    use std::io::Read;
    first
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("idle for 3 s"), "{stderr}");
    // Its place is free again (once the server has seen both sides close).
    eventually("a new session after the idle one", DEADLINE, || {
        let (code, out, _) = tcloud_as(
            &daemon,
            &alice_token,
            &home,
            &["exec", &id, "--", "echo", "again"],
            "",
        );
        std::future::ready((code == 0 && out == "again\n").then_some(()))
    })
    .await;
    daemon.client().cancel(task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_dev_session_warns_its_silent_shell_then_ends_naming_its_idle_timeout() {
    if !root_or_skip("an_idle_dev_session_warns_its_silent_shell_then_ends_naming_its_idle_timeout")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 600, &[]).await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    // No `run`: a dev session holds its allocation with a process that uses nothing.
    let yaml = "name: dev\nkind: interactive\nidle_timeout: 20s\n";
    let task = submit(&alice, dir.path(), "dev", yaml, &[]).await;
    wait_state(&alice, task, &[TaskState::Running]).await;
    let running_seen = Instant::now();
    // A session left open and silent does not keep it: its user is warned in it first.
    let mut silent = Reaped(
        Command::new(tcloud_binary())
            .args([
                "exec",
                &task.to_string(),
                "--",
                "sh",
                "-c",
                "echo started; exec sleep 100",
            ])
            .env("TACC_HOME", &home)
            .env("TACC_SERVER", &daemon.url)
            .env("TACC_TOKEN", &alice_token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(silent.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
    }
    let view = wait_terminal(&alice, task).await;
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    let reason = view.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("idle for 20s (its idle_timeout)"),
        "{reason}"
    );
    assert!(
        running_seen.elapsed() >= Duration::from_secs(10),
        "ended after {:?}, before its idle timeout",
        running_seen.elapsed()
    );
    // The silent session heard the warning, then ended with its task.
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = silent.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < end, "the session outlived its dev session");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    use std::io::Read;
    silent
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("tacc: this dev session has been idle for")
            && stderr.contains("it ends in 5s (idle_timeout 20s)"),
        "{stderr}"
    );
    // So did its log.
    let log = log_text(&alice, task).await;
    assert!(log.contains("dev session ready"), "{log}");
    assert!(log.contains("it ends in 5s"), "{log}");
    // It was accounted like any task: its allocation, for as long as it held it.
    let usage = alice
        .usage_report(&tacc_proto::UsageQuery::default())
        .await
        .unwrap();
    let mine = usage
        .rows
        .iter()
        .find(|row| row.name == "alice")
        .unwrap_or_else(|| panic!("alice's row: {usage:?}"));
    assert_eq!((mine.tasks, mine.attempts), (1, 1), "{mine:?}");
    // One CPU held for at least the 20 s it sat idle.
    assert!(mine.cpu_hours >= 20.0 / 3600.0, "{mine:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcloud_dev_opens_a_shell_that_keeps_the_session_while_in_use_and_it_ends_when_left() {
    if !root_or_skip(
        "tcloud_dev_opens_a_shell_that_keeps_the_session_while_in_use_and_it_ends_when_left",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (daemon, home) = dev_cluster(dir.path(), UID_BASE + 700, &[]).await;
    let (alice, alice_token, _) = user(&daemon, "alice").await;
    let project = dir.path().join("proj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "project-file\n").unwrap();
    let command = format!(
        "cd {project} && TACC_HOME={home} TACC_SERVER={url} TACC_TOKEN={token} {tcloud} dev --idle-timeout 20s; sleep 300",
        project = project.display(),
        home = home.display(),
        url = daemon.url,
        token = alice_token,
        tcloud = tcloud_binary().display(),
    );
    let tmux = Tmux {
        socket: dir.path().join("tmux.sock"),
    };
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "s",
        "-x",
        "150",
        "-y",
        "40",
        "sh",
        "-c",
        &command,
    ]);
    // It queues, waits for the start and drops the user into a shell in the task, in
    // the project's code, as the task's uid.
    let screen = tmux.wait_for("Submitted dev session").await;
    let task: u64 = screen
        .split("Submitted dev session ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no task id on {screen}"));
    let task = TaskId(task);
    tmux.run(&[
        "send-keys",
        "-t",
        "s",
        "echo uid-$(id -u) $(cat notes.txt)",
        "Enter",
    ]);
    tmux.wait_for(&format!("uid-{} project-file", UID_BASE + 700))
        .await;
    // In use (a command printing into the shell): it outlives its idle timeout by far.
    tmux.run(&[
        "send-keys",
        "-t",
        "s",
        "while sleep 1; do echo tick; done",
        "Enter",
    ]);
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(35) {
        let view = alice.get_task(task).await.unwrap();
        assert_eq!(
            view.state,
            TaskState::Running,
            "ended while in use: {:?}",
            view.reason
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Left (Ctrl-C, exit): tcloud says how to return, and it ends by itself.
    tmux.run(&["send-keys", "-t", "s", "C-c", ""]);
    tmux.run(&["send-keys", "-t", "s", "exit", "Enter"]);
    let left = Instant::now();
    tmux.wait_for(&format!("`tcloud shell {task}` to return"))
        .await;
    let view = wait_terminal(&alice, task).await;
    // Its idle time counts from the shell's last byte, not from long before it.
    assert!(
        left.elapsed() >= Duration::from_secs(12),
        "ended {:?} after the shell was left",
        left.elapsed()
    );
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert!(
        view.reason
            .as_deref()
            .is_some_and(|r| r.contains("idle for 20s (its idle_timeout)")),
        "{view:?}"
    );
}

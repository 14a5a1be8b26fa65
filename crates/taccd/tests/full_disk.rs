//! A full disk (issue 22, finding 3) against real daemons: a dev cluster whose data
//! directory — database, chunks, task logs, the agent's spool and working directories,
//! and the daemons' own log files, as `taccd dev` and `tcloud up` write them — lies on a
//! small tmpfs the test mounts (and unmounts) itself. A task fills it; the server answers
//! 507 and no daemon dies or stalls; once space returns, reports resume within seconds
//! and nothing the task printed since is lost; an attempt that ended while the agent
//! could not report it is reported as ended after the cluster stops and starts again,
//! never lost and run a second time.
//!
//! Mounting needs root: elsewhere the tests say SKIPPED loudly, except in CI
//! (`CI=true`), where they fail. Build the binaries first: `cargo build -p taccd -p
//! tcloud --bins`.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use tacc_client::ClientError;
use tacc_core::TaskState;

/// How soon after space returns the cluster must have caught up.
const CATCH_UP: Duration = Duration::from_secs(15);

/// A size-limited tmpfs mounted for one test, unmounted when dropped (after the daemons
/// on it, which the test drops first).
struct Volume {
    dir: tempfile::TempDir,
}

impl Volume {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fill what is left of the volume with a file of its own (root's writes are
    /// limited like anyone's on tmpfs); returns the file.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 256 << 10];
        while (&file).write_all(&chunk).is_ok() {}
        let small = [0u8; 512];
        while (&file).write_all(&small).is_ok() {}
        path
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // Lazily: a process the test could not stop must not keep it mounted for ever.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A tmpfs of `size` (e.g. `64m`), or `None` (SKIPPED loudly; a failure in CI).
fn volume_or_skip(test: &str, size: &str) -> Option<Volume> {
    let dir = tempfile::tempdir().unwrap();
    let mounted = nix::unistd::geteuid().is_root()
        && std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
    if mounted {
        return Some(Volume { dir });
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root to mount a small tmpfs in CI");
    }
    eprintln!(
        "\n######## SKIPPED {test}: cannot mount a tmpfs (not root?).\n######## Run the tests as root on Linux (scripts/test.sh in CI does).\n"
    );
    None
}

/// The pid of the dev cluster's agent on `data` (`DATA/embedded-agent.json`).
fn embedded_agent_pid(data: &Path) -> u32 {
    let text = std::fs::read_to_string(data.join("embedded-agent.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["process"]["pid"].as_u64().unwrap() as u32
}

/// What `GET /metrics` says of `series`, as the server's admin.
async fn metric(server: &Daemon, series: &str) -> Option<f64> {
    let text = reqwest::Client::new()
        .get(format!("{}/metrics", server.url))
        .bearer_auth(&server.token)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A chunk the server does not have yet, as `tcloud submit` uploads one.
fn fresh_chunk(n: usize) -> (String, Vec<u8>) {
    // 200 KB: more than a few pages another process may free meanwhile.
    let bytes = format!("full-disk chunk {n} {}\n", std::process::id()).repeat(8000);
    let hash = blake3::hash(bytes.as_bytes()).to_hex().to_string();
    (hash, zstd::bulk::compress(bytes.as_bytes(), 3).unwrap())
}

/// Whether `error` is the server's answer that its disk is full (a reply, not a closed
/// connection), naming what to do.
fn is_storage_full(error: &ClientError) -> bool {
    matches!(error, ClientError::Api { status: 507, code, message }
        if code == "storage_full" && message.contains("free space"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_filling_the_disk_takes_no_daemon_down_and_loses_no_report() {
    let test = "a_task_filling_the_disk_takes_no_daemon_down_and_loses_no_report";
    let Some(volume) = volume_or_skip(test, "64m") else {
        return;
    };
    // Beside the volume, not in /tmp: each task has a /tmp of its own, where only the
    // directory holding the agent's data (the volume here) stays visible.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let markers = markers_dir(outside.path());
    let data = volume.path().join("data");
    let mut server = start("dev", &data, &[]).await;
    let client = server.client();
    wait_nodes(&client, 1).await;
    let agent_pid = embedded_agent_pid(&data);
    let m = markers.display();
    let yaml = format!(
        "name: filler\nresources: {{cpus: 0.2, memory: 128MiB}}\nrun: |\n  echo before the fill\n  \
         head -c 200000000 /dev/zero > fill 2>/dev/null || true\n  \
         touch {m}/full\n  \
         while [ ! -e {m}/free ]; do sleep 0.05; done\n  \
         rm -f fill\n  \
         touch {m}/freed\n  \
         for i in $(seq 1 120); do echo \"after $i\"; done\n"
    );
    // A task whose output is uploaded while the server's disk is full: the agent keeps
    // it until there is room (a 500 would lose it).
    let keeper_marker = format!("full-disk-keeper-{}", std::process::id());
    let keeper_yaml = format!(
        "name: keeper\nresources: {{cpus: 0.2, memory: 128MiB}}\noutputs: [result.txt]\nenvironment: {{vars: {{MARKER: {keeper_marker}}}}}\n\
         run: |\n  echo kept > result.txt\n  \
         touch {m}/written\n  \
         while [ ! -e {m}/full ]; do sleep 0.05; done\n  \
         echo keeper done\n"
    );
    let keeper = submit(&client, outside.path(), "keeper", &keeper_yaml, &[]).await;
    eventually("the keeper to write its output", DEADLINE, || {
        let written = markers.join("written");
        async move { written.exists().then_some(()) }
    })
    .await;
    // A task that prints 10 MB while the disk is full (more than the agent's spool holds
    // in memory), then once space is back a last line.
    let chatty_yaml = format!(
        "name: chatty\nresources: {{cpus: 0.2, memory: 128MiB}}\nrun: |\n  \
         while [ ! -e {m}/full ]; do sleep 0.05; done\n  \
         head -c 10000000 /dev/zero | tr '\\0' x | fold -w 1000\n  \
         touch {m}/printed\n  \
         while [ ! -e {m}/freed ]; do sleep 0.05; done\n  \
         echo chatty after\n"
    );
    let chatty = submit(&client, outside.path(), "chatty", &chatty_yaml, &[]).await;
    wait_state(&client, chatty, &[TaskState::Running]).await;
    let filler = submit(&client, outside.path(), "filler", &yaml, &[]).await;
    eventually("the task to fill the volume", DEADLINE, || {
        let full = markers.join("full");
        async move { full.exists().then_some(()) }
    })
    .await;

    // The disk is full. Uploads of a submission and secret sets are answered 507 with
    // what to do, never with a closed connection; the server's own log lines that cannot
    // be written are dropped and counted, and it goes on answering.
    let mut n = 0;
    eventually("a dropped line of the server's log", DEADLINE, || {
        n += 1;
        let (hash, bytes) = fresh_chunk(n);
        let (client, server) = (client.clone(), &server);
        async move {
            let error = client.put_chunk(&hash, bytes).await.unwrap_err();
            assert!(
                is_storage_full(&error),
                "a chunk upload on a full disk: {error:?}"
            );
            (metric(server, "tacc_log_lines_dropped_total").await? > 0.0).then_some(())
        }
    })
    .await;
    // `tcloud submit` as a user runs it: it says the server is out of space and exits 8
    // (a server fault), never "connection closed before message completed".
    let code_dir = outside.path().join("late");
    std::fs::create_dir_all(&code_dir).unwrap();
    std::fs::write(code_dir.join("task.yaml"), "name: late\nrun: echo late\n").unwrap();
    std::fs::write(code_dir.join("data.txt"), "fresh code ".repeat(5000)).unwrap();
    let submitted = std::process::Command::new(tcloud_binary())
        .arg("submit")
        .arg(&code_dir)
        .env("TACC_HOME", outside.path().join("home"))
        .env("TACC_SERVER", &server.url)
        .env("TACC_TOKEN", &server.token)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&submitted.stderr);
    assert_eq!(submitted.status.code(), Some(8), "{said}");
    assert!(said.contains("out of disk space"), "{said}");
    let secret = client.put_secret("FULL_DISK", b"value".to_vec()).await;
    if let Err(error) = &secret {
        assert!(
            is_storage_full(error),
            "a secret set on a full disk: {error:?}"
        );
    }
    assert!(
        matches!(server.child.try_wait(), Ok(None)),
        "the server died on a full disk: {}",
        std::fs::read_to_string(data.join("dev.log")).unwrap_or_default()
    );
    assert!(process_alive(agent_pid), "the agent died on a full disk");

    // The keeper has ended: its output is being uploaded to a full disk.
    wait_no_processes(&keeper_marker).await;

    eventually("the chatty task to have printed", DEADLINE, || {
        let printed = markers.join("printed");
        async move { printed.exists().then_some(()) }
    })
    .await;

    // Space returns: within seconds the task's end and every line it printed since are in.
    std::fs::write(markers.join("free"), "").unwrap();
    let view = eventually(
        "the filler's end, soon after space returned",
        CATCH_UP,
        || {
            let client = client.clone();
            async move {
                let view = client.get_task(filler).await.ok()?;
                view.state.is_terminal().then_some(view)
            }
        },
    )
    .await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let log = log_text(&client, filler).await;
    assert!(log.contains("before the fill\n"), "{log}");
    for i in 1..=120 {
        assert!(
            log.contains(&format!("after {i}\n")),
            "line {i} is missing: {log}"
        );
    }
    let chatted = eventually("the chatty task's end", CATCH_UP, || {
        let client = client.clone();
        async move {
            let view = client.get_task(chatty).await.ok()?;
            view.state.is_terminal().then_some(view)
        }
    })
    .await;
    assert_eq!(chatted.state, TaskState::Succeeded, "{chatted:?}");
    // What it printed while the disk was full is dropped past the spool's memory, and
    // said so in its place; what it printed after is there, after that.
    let chatty_log = log_text(&client, chatty).await;
    assert!(
        chatty_log.contains("bytes of this task's output were dropped"),
        "{}",
        &chatty_log[chatty_log.len().saturating_sub(500)..]
    );
    assert!(
        chatty_log.ends_with("chatty after\n"),
        "{}",
        &chatty_log[chatty_log.len().saturating_sub(500)..]
    );
    let kept = eventually("the keeper's end", CATCH_UP, || {
        let client = client.clone();
        async move {
            let view = client.get_task(keeper).await.ok()?;
            view.state.is_terminal().then_some(view)
        }
    })
    .await;
    assert_eq!(kept.state, TaskState::Succeeded, "{kept:?}");
    let keeper_log = log_text(&client, keeper).await;
    assert!(!keeper_log.contains("could not keep"), "{keeper_log}");
    let listed = client.list_outputs(keeper).await.unwrap();
    assert!(
        listed.iter().any(|o| o.path == "result.txt" && o.size == 5),
        "{listed:?}"
    );
    let output = client
        .get_output(keeper, kept.attempt, "result.txt")
        .await
        .unwrap();
    assert_eq!(&output[..], b"kept\n");
    // The same agent, never restarted: it did not die on the way.
    assert_eq!(embedded_agent_pid(&data), agent_pid);
    let after = submit(
        &client,
        outside.path(),
        "after",
        "name: after\nrun: echo fine\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&client, after).await.state,
        TaskState::Succeeded
    );

    // The cluster stops and starts again (`tcloud down`, `tcloud up`): nothing that
    // finished runs again, nothing ends `lost`.
    let url = server.url.clone();
    let stopping = server
        .client()
        .stop_cluster(tacc_proto::StopMode::IfIdle)
        .await
        .unwrap();
    assert_eq!(
        stopping.stopping,
        Some(tacc_proto::StopMode::IfIdle),
        "{stopping:?}"
    );
    eventually("the cluster to stop", DEADLINE, || {
        let exited = matches!(server.child.try_wait(), Ok(Some(_)));
        async move { (exited && !process_alive(agent_pid)).then_some(()) }
    })
    .await;
    drop(server);
    let server = restart_on("dev", &data, &url, &[]).await;
    let client = server.client();
    wait_nodes(&client, 1).await;
    for task in [filler, keeper, chatty, after] {
        let view = client.get_task(task).await.unwrap();
        assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
        let states = attempt_states(&client, task).await;
        assert!(
            states
                .iter()
                .all(|(attempt, state)| *attempt == 1 && *state != TaskState::Lost),
            "task {task}: {states:?}"
        );
    }
    drop(server);
    drop(volume);
}

/// The finding's last step: an attempt ends while its agent cannot report it (the server
/// is gone, the disk full), the agent stops, and the cluster starts again once space is
/// back. The end is reported: the task succeeded, in its first and only attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_ended_on_a_full_disk_is_not_run_again_after_a_restart() {
    let test = "an_attempt_that_ended_on_a_full_disk_is_not_run_again_after_a_restart";
    let Some(volume) = volume_or_skip(test, "64m") else {
        return;
    };
    // Beside the volume, not in /tmp: each task has a /tmp of its own, where only the
    // directory holding the agent's data (the volume here) stays visible.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let markers = markers_dir(outside.path());
    let data = volume.path().join("data");
    let mut server = start("dev", &data, &[]).await;
    let client = server.client();
    wait_nodes(&client, 1).await;
    let m = markers.display();
    let marker = format!("full-disk-end-{}", std::process::id());
    let yaml = format!(
        "name: ends-while-away\nenvironment: {{vars: {{MARKER: {marker}}}}}\nrun: |\n  \
         touch {m}/started\n  \
         while [ ! -e {m}/go ]; do sleep 0.05; done\n  \
         echo done\n"
    );
    let task = submit(&client, outside.path(), "ends", &yaml, &[]).await;
    wait_state(&client, task, &[TaskState::Running]).await;
    eventually("the attempt to start", DEADLINE, || {
        let started = markers.join("started");
        async move { started.exists().then_some(()) }
    })
    .await;

    // The server goes away (its agent lives on), the disk fills up, the attempt ends.
    let url = server.url.clone();
    server.kill9();
    let agent_pid = embedded_agent_pid(&data);
    let filler = volume.fill();
    std::fs::write(markers.join("go"), "").unwrap();
    wait_no_processes(&marker).await;
    // The agent recorded the end (in room it reserved when the attempt started).
    let ends = data.join("agent").join("ends");
    eventually("the agent to record the attempt's end", DEADLINE, || {
        let ends = ends.clone();
        async move {
            let recorded = std::fs::read_dir(&ends).ok()?.flatten().any(|entry| {
                std::fs::read_to_string(entry.path()).is_ok_and(|t| t.contains("finished"))
            });
            recorded.then_some(())
        }
    })
    .await;
    // The agent stops (`tcloud down`) before it could report anything.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    eventually("the agent to stop", DEADLINE, || async move {
        (!process_alive(agent_pid)).then_some(())
    })
    .await;

    // Space is freed and the cluster starts again (`tcloud up`).
    std::fs::remove_file(filler).unwrap();
    let server = restart_on("dev", &data, &url, &[]).await;
    let client = server.client();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(
        view.attempt.0, 1,
        "the finished attempt ran again: {view:?}"
    );
    let states = attempt_states(&client, task).await;
    assert!(
        states
            .iter()
            .all(|(attempt, state)| *attempt == 1 && *state != TaskState::Lost),
        "{states:?}"
    );
    assert!(task_processes(&marker).is_empty());
    drop(server);
    drop(volume);
}

/// `resources.disk` and `--work-dir`: working directories go where the operator says, and
/// a task that writes more into its own than its task file allows is stopped, ending
/// failed with the reason `disk_limit` and a message naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_writing_past_its_disk_limit_ends_with_disk_limit() {
    let dir = tempfile::tempdir().unwrap();
    let markers = markers_dir(dir.path());
    let work = dir.path().join("work-volume");
    let work_arg = work.display().to_string();
    let server = start("dev", &dir.path().join("data"), &["--work-dir", &work_arg]).await;
    let client = server.client();
    wait_nodes(&client, 1).await;
    let m = markers.display();
    let marker = format!("disk-limit-{}", std::process::id());
    let yaml = format!(
        "name: grows\nresources: {{disk: 2MiB}}\nenvironment: {{vars: {{MARKER: {marker}}}}}\n\
         run: |\n  pwd > {m}/pwd\n  \
         for i in $(seq 1 600); do head -c 1048576 /dev/zero > f$i; sleep 0.1; done\n  \
         echo never stopped\n"
    );
    let task = submit(&client, dir.path(), "grows", &yaml, &[]).await;
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let reason = view.reason.clone().unwrap_or_default();
    assert!(reason.starts_with("disk_limit: "), "{reason}");
    assert!(reason.contains("`resources.disk: 2MiB`"), "{reason}");
    let log = log_text(&client, task).await;
    assert!(!log.contains("never stopped"), "{log}");
    assert!(log.contains("resources.disk"), "{log}");
    wait_no_processes(&marker).await;
    // Its working directory was on the operator's volume, and is gone.
    let pwd = std::fs::read_to_string(markers.join("pwd")).unwrap();
    assert!(Path::new(pwd.trim()).starts_with(&work), "{pwd}");
    assert!(!Path::new(pwd.trim()).exists(), "{pwd}");
    // A task within its limit is not disturbed.
    let small = submit(
        &client,
        dir.path(),
        "small",
        "name: small\nresources: {disk: 64MiB}\nrun: |\n  head -c 1048576 /dev/zero > f\n  sleep 2\n  echo fine\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, small).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
}

/// Item 1 of the finding without a volume to fill: a dev cluster whose standard error
/// (its log) is `/dev/full`, where every write fails with ENOSPC. It serves, runs a task,
/// and counts the lines it could not write; before, the first log line panicked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_log_cannot_be_written_keeps_serving_and_counts_what_it_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = taccd()
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(full)
        .spawn()
        .unwrap();
    let endpoint = data.join("taccd.json");
    let token_file = data.join("admin.token");
    let (url, token) = eventually("the server to start", DEADLINE, || {
        let exited = child.try_wait().ok().flatten();
        assert!(exited.is_none(), "taccd exited: {exited:?}");
        let (endpoint, token_file) = (endpoint.clone(), token_file.clone());
        async move {
            let text = std::fs::read_to_string(&endpoint).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let token = std::fs::read_to_string(&token_file).ok()?;
            let complete = token.ends_with('\n') || token.trim().len() >= 48;
            complete.then(|| (value["url"].as_str().unwrap().to_string(), token))
        }
    })
    .await;
    let server = Daemon {
        child,
        url,
        data_dir: data.clone(),
        token: token.trim().to_string(),
    };
    let client = server.client();
    wait_nodes(&client, 1).await;
    let task = submit(
        &client,
        dir.path(),
        "hello",
        "name: hello\nrun: echo hello\n",
        &[],
    )
    .await;
    assert_eq!(
        wait_terminal(&client, task).await.state,
        TaskState::Succeeded
    );
    assert_eq!(log_text(&client, task).await, "hello\n");
    let dropped = metric(&server, "tacc_log_lines_dropped_total").await;
    assert!(dropped.is_some_and(|n| n > 0.0), "{dropped:?}");
}

//! Exactly-once requests and honest server faults against a real `taccd server`:
//! `Idempotency-Key` on submit, cancel and rerun; `tcloud` retrying through a proxy that
//! drops a third of the submit replies; `tcloud` against a stopped server; a full disk.
//! The tests of what the store keeps (keyed replies, acknowledged submits) run on SQLite
//! (`…::on_sqlite`) and on PostgreSQL (`…::on_postgres`).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Backend, Daemon, start, tcloud_binary, upload};
use tacc_core::TaskId;
use tacc_proto::SubmitTask;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A task directory named `name` (a shell command that never runs: no node joins).
fn task_dir(root: &Path, name: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("task.yaml"),
        format!("name: {name}\nrun: echo {name}\n"),
    )
    .unwrap();
    dir
}

/// The body of `POST /v1/tasks` for the task in `dir`, its code uploaded.
async fn submit_body(server: &Daemon, dir: &Path) -> serde_json::Value {
    let loaded = tacc_schema::load_task(dir).unwrap();
    let snapshot = upload(&server.client(), &loaded.code_root).await;
    serde_json::to_value(SubmitTask {
        translated: Vec::new(),
        spec: serde_json::to_value(&loaded.spec).unwrap(),
        snapshot,
        source: None,
        wait_for_capacity: false,
    })
    .unwrap()
}

/// `POST path` as the admin with `key` (when given): status, body, and whether the
/// server says it replayed a kept reply.
async fn post(
    server: &Daemon,
    path: &str,
    key: Option<&str>,
    body: &serde_json::Value,
) -> (u16, serde_json::Value, bool) {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", server.url))
        .bearer_auth(&server.token)
        .json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replay");
    (status, response.json().await.unwrap(), replayed)
}

async fn tasks_named(server: &Daemon, name: &str) -> Vec<TaskId> {
    server
        .client()
        .list_tasks(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.name == name)
        .map(|t| t.id)
        .collect()
}

on_both_stores!(
    same_key_and_body_answer_the_first_reply_once,
    threads = 2,
    run = same_key_and_body
);

async fn same_key_and_body(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("d"), &backend.args()).await;
    let body = submit_body(&server, &task_dir(dir.path(), "keyed")).await;
    let first_body = body.clone();

    let (status, first, replayed) = post(&server, "/v1/tasks", Some("k-1"), &body).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    for _ in 0..3 {
        let again = post(&server, "/v1/tasks", Some("k-1"), &body).await;
        assert_eq!(again, (201, first.clone(), true));
    }
    assert_eq!(tasks_named(&server, "keyed").await.len(), 1);

    // The same key for another request is refused, and names the key.
    let other = submit_body(&server, &task_dir(dir.path(), "other")).await;
    let (status, error, _) = post(&server, "/v1/tasks", Some("k-1"), &other).await;
    assert_eq!(status, 409, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("k-1") && message.contains("new key"),
        "{message}"
    );
    assert!(tasks_named(&server, "other").await.is_empty());

    // Without a key every request is new work.
    post(&server, "/v1/tasks", None, &other).await;
    post(&server, "/v1/tasks", None, &other).await;
    assert_eq!(tasks_named(&server, "other").await.len(), 2);

    // A key that is too long, or not printable ASCII, is a client error with a fix.
    let long = "x".repeat(256);
    let (status, error, _) = post(&server, "/v1/tasks", Some(&long), &body).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("255"),
        "{error}"
    );

    // Rerun and cancel: the same key, the same reply, no second task.
    let id = first["task_id"].as_u64().unwrap();
    let rerun = format!("/v1/tasks/{id}/rerun");
    let (status, rerun_reply, _) = post(&server, &rerun, Some("r-1"), &serde_json::json!({})).await;
    assert_eq!(status, 201, "{rerun_reply}");
    let again = post(&server, &rerun, Some("r-1"), &serde_json::json!({})).await;
    assert_eq!(again, (201, rerun_reply.clone(), true));
    assert_eq!(tasks_named(&server, "keyed").await.len(), 2);
    let cancel = format!("/v1/tasks/{id}/cancel");
    let (status, cancelled, _) = post(&server, &cancel, Some("c-1"), &serde_json::json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["changed"], true);
    let again = post(&server, &cancel, Some("c-1"), &serde_json::json!({})).await;
    assert_eq!(again, (200, cancelled, true));
    // A key of the cancel reused for a rerun is another request.
    let (status, _, _) = post(&server, &rerun, Some("c-1"), &serde_json::json!({})).await;
    assert_eq!(status, 409);

    // An array: the same group and elements again.
    let array = task_dir(dir.path(), "arr");
    std::fs::write(
        array.join("task.yaml"),
        "name: arr\nrun: echo $TACC_ARRAY_INDEX\narray: 0-4\n",
    )
    .unwrap();
    let body = submit_body(&server, &array).await;
    let (status, group, _) = post(&server, "/v1/tasks", Some("a-1"), &body).await;
    assert_eq!(status, 201, "{group}");
    let again = post(&server, "/v1/tasks", Some("a-1"), &body).await;
    assert_eq!(again, (201, group, true));
    assert_eq!(tasks_named(&server, "arr").await.len(), 5);

    // A pipeline: the same pipeline group and stages again, its tasks made once.
    let before = server
        .client()
        .list_tasks(&Default::default())
        .await
        .unwrap()
        .len();
    let stage = |name: &str, needs: &[&str]| {
        serde_json::json!({
            "name": name,
            "needs": needs,
            "spec": first_body["spec"],
            "snapshot": first_body["snapshot"],
        })
    };
    let pipeline = serde_json::json!({
        "name": "pipe",
        "stages": [stage("prep", &[]), stage("train", &["prep"])],
        "source": null,
    });
    let (status, made, _) = post(&server, "/v1/pipelines", Some("p-1"), &pipeline).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["stages"].as_array().unwrap().len(), 2, "{made}");
    let again = post(&server, "/v1/pipelines", Some("p-1"), &pipeline).await;
    assert_eq!(again, (201, made, true));
    let after = server
        .client()
        .list_tasks(&Default::default())
        .await
        .unwrap()
        .len();
    assert_eq!(after, before + 2, "one task per stage, once");
}

/// A TCP proxy to `upstream` that forwards every request, and for three of every ten
/// `POST /v1/tasks` (and, counted apart, of every ten snapshot offers and commits) closes
/// the connection instead of forwarding the reply (after the server sent it, so the work
/// is done and only the answer is lost). Counts the drops.
async fn lossy_proxy(upstream: String, dropped: Arc<AtomicU64>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let submits = Arc::new(AtomicU64::new(0));
    let uploads = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let submits = submits.clone();
            let uploads = uploads.clone();
            let dropped = dropped.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let lose_reply = Arc::new(AtomicBool::new(false));
                let lose = lose_reply.clone();
                let up = async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = from_client.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let chunk = &buf[..n];
                        let counter = if chunk.starts_with(b"POST /v1/tasks HTTP/") {
                            Some(&submits)
                        } else if chunk.starts_with(b"POST /v1/snapshots/") {
                            Some(&uploads)
                        } else {
                            None
                        };
                        if let Some(counter) = counter {
                            let nth = counter.fetch_add(1, Ordering::SeqCst);
                            // 0, 3, 6 of every ten: 30 %, never two in a row.
                            lose.store(matches!(nth % 10, 0 | 3 | 6), Ordering::SeqCst);
                        }
                        if to_server.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = from_server.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        if lose_reply.swap(false, Ordering::SeqCst) {
                            dropped.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if to_client.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                // Either side ending drops both connections.
                tokio::select! {
                    () = up => {}
                    () = down => {}
                }
            });
        }
    });
    format!("http://{address}")
}

on_both_stores!(
    lost_submit_replies_are_retried_into_one_task_each,
    threads = 2,
    run = lost_submit_replies
);

/// R9: with 30 % of submit replies lost, `tcloud submit` retries with its key and every
/// logical submit makes exactly one task.
async fn lost_submit_replies(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("d"), &backend.args()).await;
    let dropped = Arc::new(AtomicU64::new(0));
    let proxy = lossy_proxy(
        server.url.trim_start_matches("http://").to_string(),
        dropped.clone(),
    )
    .await;
    let home = dir.path().join("home");
    let code = task_dir(dir.path(), "r9");
    const SUBMITS: usize = 30;
    let mut acknowledged = BTreeSet::new();
    let started = Instant::now();
    for n in 0..SUBMITS {
        let name = format!("r9-{n}");
        let proxy = proxy.clone();
        let (home, code, token) = (home.clone(), code.clone(), server.token.clone());
        let output = tokio::task::spawn_blocking(move || {
            Command::new(tcloud_binary())
                .args(["submit", "--json", "--name", &name])
                .arg(&code)
                .env("TACC_HOME", &home)
                .env("TACC_SERVER", &proxy)
                .env("TACC_TOKEN", &token)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            output.status.success(),
            "submit {n} exited {:?}: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        );
        let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        acknowledged.insert(reply["task_id"].as_u64().unwrap());
    }
    let all = server
        .client()
        .list_tasks(&Default::default())
        .await
        .unwrap();
    let stored: BTreeSet<u64> = all.iter().map(|t| t.id.0).collect();
    let lost = dropped.load(Ordering::SeqCst);
    eprintln!(
        "R9 on {}: {SUBMITS} submits, {lost} replies dropped, {} tasks stored, {:.1} s",
        backend.name(),
        stored.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(lost >= 6, "the proxy dropped only {lost} replies");
    assert_eq!(acknowledged.len(), SUBMITS, "an id was acknowledged twice");
    assert_eq!(stored, acknowledged, "one task per logical submit");
    for n in 0..SUBMITS {
        let name = format!("r9-{n}");
        assert_eq!(
            all.iter().filter(|t| t.name == name).count(),
            1,
            "{name} stored other than once"
        );
    }
}

/// Resumes a stopped process when dropped, so a failing test leaves no stopped server.
struct Resume(nix::unistd::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// SQLite only: what is tested is `tcloud`'s timeout against a server that does not answer;
/// the request never reaches the store.
#[tokio::test]
async fn tcloud_gives_up_on_a_stopped_server_within_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("d"), &[]).await;
    let pid = nix::unistd::Pid::from_raw(server.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let _resume = Resume(pid);
    let started = Instant::now();
    let output = Command::new(tcloud_binary())
        .args(["ps", "--timeout", "2"])
        .env("TACC_HOME", dir.path().join("home"))
        .env("TACC_SERVER", &server.url)
        .env("TACC_TOKEN", &server.token)
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("tcloud ps against a stopped server: {took:?}: {stderr}");
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(
        stderr.contains(&format!("no answer from {} within 2 s", server.url))
            && stderr.contains("is taccd running"),
        "{stderr}"
    );
}

/// A small tmpfs mounted for the test's data directory, unmounted when dropped.
/// After a `kill -9`, a server started again on `data` (and `args`) holds exactly the
/// acknowledged tasks, and the next submit gets an id higher than all of them.
async fn acknowledged_survive_a_restart(
    data: &Path,
    args: &[&str],
    body: &serde_json::Value,
    acknowledged: &BTreeSet<u64>,
) {
    let server = start("server", data, args).await;
    let stored: BTreeSet<u64> = server
        .client()
        .list_tasks(&Default::default())
        .await
        .unwrap()
        .iter()
        .map(|t| t.id.0)
        .collect();
    assert_eq!(&stored, acknowledged, "acknowledged tasks after a restart");
    let (status, reply, _) = post(&server, "/v1/tasks", None, body).await;
    assert_eq!(status, 201, "{reply}");
    let next = reply["task_id"].as_u64().unwrap();
    assert!(
        acknowledged.iter().all(|id| *id < next),
        "id {next} given out again (acknowledged {acknowledged:?})"
    );
}

struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mount `size` of tmpfs at `dir`; `None` (SKIPPED, or a failure in CI) when this
    /// machine does not let the test mount.
    fn mount(dir: &Path, size: &str, test: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Tmpfs(dir.to_path_buf())),
            other => {
                let why = match other {
                    Ok(output) => String::from_utf8_lossy(&output.stderr).into_owned(),
                    Err(e) => e.to_string(),
                };
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("{test}: cannot mount a tmpfs in CI (needs root): {why}");
                }
                eprintln!(
                    "\n######## SKIPPED {test}: cannot mount a tmpfs ({why}).\n######## Run \
                     the tests as root (scripts/test.sh in CI does).\n"
                );
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fill the file system holding `dir` until a write fails for space.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0xa5u8; 64 << 10];
    loop {
        if let Err(e) = file.write_all(&block).and_then(|()| file.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(28), "filling failed otherwise: {e}");
            break;
        }
    }
    // Whatever is left is smaller than a block: fill it byte-wise.
    while file.write_all(&[0]).and_then(|()| file.sync_all()).is_ok() {}
    path
}

/// R3: a full data directory answers 507 naming it, acknowledges nothing it did not keep,
/// serves again once space returns, and after a restart every acknowledged task is there
/// and no id was given out twice. The fault is the full file system under SQLite's
/// database in the data directory; beside PostgreSQL the data directory holds code, logs
/// and outputs only (the test after this one). Filling the PostgreSQL server's own disk
/// would take the shared test server down for every other test.
#[tokio::test]
async fn a_full_disk_is_the_server_s_fault_and_loses_nothing() {
    let test = "a_full_disk_is_the_server_s_fault_and_loses_nothing";
    let dir = tempfile::tempdir().unwrap();
    let Some(_tmpfs) = Tmpfs::mount(&dir.path().join("vol"), "8m", test) else {
        return;
    };
    let data = dir.path().join("vol/d");
    let mut server = start("server", &data, &[]).await;
    let body = submit_body(&server, &task_dir(dir.path(), "full")).await;
    let mut acknowledged = BTreeSet::new();
    let (status, reply, _) = post(&server, "/v1/tasks", None, &body).await;
    assert_eq!(status, 201, "{reply}");
    acknowledged.insert(reply["task_id"].as_u64().unwrap());

    let filler = fill(&dir.path().join("vol"));
    let mut faults = Vec::new();
    for n in 0..200 {
        let key = format!("full-{n}");
        let (status, reply, _) = post(&server, "/v1/tasks", Some(&key), &body).await;
        match status {
            201 => {
                acknowledged.insert(reply["task_id"].as_u64().unwrap());
            }
            _ => {
                faults.push((status, reply));
                if faults.len() == 3 {
                    break;
                }
            }
        }
    }
    eprintln!(
        "R3: {} acknowledged, faults: {faults:?}",
        acknowledged.len()
    );
    assert!(!faults.is_empty(), "no submit failed on a full disk");
    for (status, reply) in &faults {
        assert_eq!(*status, 507, "{reply}");
        let message = reply["message"].as_str().unwrap();
        assert!(
            message.contains(&data.display().to_string())
                && message.contains("server's fault")
                && reply["code"] == "storage_full",
            "{reply}"
        );
    }
    // An upload that needs space is the server's fault too, not invalid input.
    let chunk: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let hash = tacc_compiler::ChunkHash::of(&chunk).to_string();
    let upload = server
        .client()
        .put_chunk(&hash, zstd::bulk::compress(&chunk, 1).unwrap())
        .await;
    match upload {
        Err(tacc_client::ClientError::Api {
            status, message, ..
        }) => {
            assert_eq!(status, 507, "{message}");
            assert!(message.contains("server's fault"), "{message}");
        }
        other => panic!("a chunk upload on a full disk: {other:?}"),
    }
    // Nothing acknowledged is missing while the disk is full.
    for id in &acknowledged {
        server.client().get_task(TaskId(*id)).await.unwrap();
    }

    std::fs::remove_file(filler).unwrap();
    let (status, reply, _) = post(&server, "/v1/tasks", Some("after"), &body).await;
    assert_eq!(
        status, 201,
        "the first submit after space returned: {reply}"
    );
    acknowledged.insert(reply["task_id"].as_u64().unwrap());

    server.kill9();
    acknowledged_survive_a_restart(&data, &[], &body, &acknowledged).await;
}

/// R3 beside PostgreSQL: the data directory (code chunks, logs, outputs) fills up while
/// the database has room. Submits of uploaded code are still acknowledged and kept; an
/// upload that needs space is the server's fault (507 naming the directory), not the
/// user's; once space returns uploads work again; after a `kill -9` every acknowledged
/// task is there and no id is given out twice.
#[tokio::test]
async fn a_full_data_directory_beside_postgres_fails_uploads_only_and_loses_nothing() {
    let test = "a_full_data_directory_beside_postgres_fails_uploads_only_and_loses_nothing";
    let Some(backend) = Backend::postgres(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(_tmpfs) = Tmpfs::mount(&dir.path().join("vol"), "8m", test) else {
        return;
    };
    let data = dir.path().join("vol/d");
    let mut server = start("server", &data, &backend.args()).await;
    let body = submit_body(&server, &task_dir(dir.path(), "beside")).await;
    let filler = fill(&dir.path().join("vol"));

    let mut acknowledged = BTreeSet::new();
    for n in 0..20 {
        let key = format!("beside-{n}");
        let (status, reply, _) = post(&server, "/v1/tasks", Some(&key), &body).await;
        assert_eq!(
            status, 201,
            "a submit with the data directory full: {reply}"
        );
        acknowledged.insert(reply["task_id"].as_u64().unwrap());
    }
    let chunk: Vec<u8> = (0..200_000u32).map(|i| (i * 11 + 5) as u8).collect();
    let hash = tacc_compiler::ChunkHash::of(&chunk).to_string();
    let compressed = zstd::bulk::compress(&chunk, 1).unwrap();
    match server.client().put_chunk(&hash, compressed.clone()).await {
        Err(tacc_client::ClientError::Api {
            status, message, ..
        }) => {
            assert_eq!(status, 507, "{message}");
            assert!(
                message.contains("server's fault") && message.contains(&data.display().to_string()),
                "{message}"
            );
        }
        other => panic!("a chunk upload on a full data directory: {other:?}"),
    }

    std::fs::remove_file(filler).unwrap();
    server
        .client()
        .put_chunk(&hash, compressed)
        .await
        .expect("the upload once space returned");
    server.kill9();
    acknowledged_survive_a_restart(&data, &backend.args(), &body, &acknowledged).await;
}

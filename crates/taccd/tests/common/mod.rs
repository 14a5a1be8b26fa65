//! Helpers for end-to-end tests against real `taccd` processes on loopback.

#![allow(dead_code)]

pub mod hand_node;
pub mod netns;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tacc_client::Client;
use tacc_core::{TaskId, TaskState};
use tacc_proto::{SubmitTask, TaskView};
use tacc_store::test_database::TestDatabase;

pub const DEADLINE: Duration = Duration::from_secs(60);

/// A `taccd` process that is killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    pub data_dir: PathBuf,
    /// An admin's API token (servers and dev clusters; empty for agents).
    pub token: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A dev cluster's agent outlives its server; unless another server took it over,
        // it goes too.
        if !embedded_server_alive(&self.data_dir) {
            kill_embedded_agent(&self.data_dir);
        }
        // A killed daemon leaves its tasks' cgroups (and any process still in them) for
        // nobody to clean, unless another daemon runs on the same data directory (a test's
        // restart, which sweeps them itself and whose tasks must live on): sweep them, so
        // no test leaves processes or cgroups behind for the next run on this machine.
        if !data_dir_in_use(&self.data_dir) {
            for agent_dir in [self.data_dir.clone(), self.data_dir.join("agent")] {
                sweep_task_cgroups(&agent_dir);
                sweep_private_tmps(&agent_dir);
            }
        }
    }
}

/// A record `taccd dev` keeps of a process in its data directory, if it names one alive.
fn live_record(path: &Path) -> Option<tacc_agent::ProcessMark> {
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let mark: tacc_agent::ProcessMark =
        serde_json::from_value(value.get("process").unwrap_or(&value).clone()).ok()?;
    mark.is_alive().then_some(mark)
}

/// Whether a dev cluster's server runs on `data_dir` (`DATA/dev.json`).
fn embedded_server_alive(data_dir: &Path) -> bool {
    live_record(&data_dir.join("dev.json")).is_some()
}

/// `kill -9` of the dev cluster's agent on `data_dir` (`DATA/embedded-agent.json`), and
/// wait until it is gone.
fn kill_embedded_agent(data_dir: &Path) {
    let Some(agent) = live_record(&data_dir.join("embedded-agent.json")) else {
        return;
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let end = Instant::now() + Duration::from_secs(10);
    while agent.is_alive() && Instant::now() < end {
        std::thread::yield_now();
    }
}

/// Leave nothing of a dev cluster on `data_dir` that a test started some other way (with
/// `tcloud up`): `kill -9` of its server and agent, then its tasks' cgroups and private
/// /tmp mounts swept. For a test's guard, after it asked the cluster to stop.
pub fn clean_up_dev_cluster(data_dir: &Path) {
    if let Some(server) = live_record(&data_dir.join("dev.json")) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(server.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let end = Instant::now() + Duration::from_secs(10);
        while server.is_alive() && Instant::now() < end {
            std::thread::yield_now();
        }
    }
    kill_embedded_agent(data_dir);
    if !data_dir_in_use(data_dir) {
        for agent_dir in [data_dir.to_path_buf(), data_dir.join("agent")] {
            sweep_task_cgroups(&agent_dir);
            sweep_private_tmps(&agent_dir);
        }
    }
}

/// Whether a live `taccd` process names `data_dir` on its command line.
fn data_dir_in_use(data_dir: &Path) -> bool {
    let wanted = data_dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            return false;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let mut args = cmdline.split(|b| *b == 0);
        let is_taccd = args
            .next()
            .is_some_and(|program| program.ends_with(b"taccd"));
        is_taccd && process_alive(pid) && args.any(|arg| arg == wanted)
    })
}

/// Unmount and remove the attempts' private /tmp mounts a killed agent left in its data
/// directory (`AGENT_DATA/scratch/*`, see `tacc_agent`'s `private_tmp`), so the test's
/// temporary directory can go.
fn sweep_private_tmps(agent_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(agent_dir.join("scratch")) else {
        return;
    };
    for entry in entries.flatten() {
        let _ = nix::mount::umount2(&entry.path(), nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// Kill every process in the task cgroups of the agent whose data directory is
/// `agent_dir` (`tacc/agent-<H(canonical dir)>`, as `taccd` names them) and remove them.
fn sweep_task_cgroups(agent_dir: &Path) {
    let canonical = agent_dir
        .canonicalize()
        .unwrap_or_else(|_| agent_dir.to_path_buf());
    let hash = blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex();
    let name = format!("agent-{}", &hash[..12]);
    let mount = Path::new("/sys/fs/cgroup");
    let mut roots = vec![mount.join("tacc").join(&name)];
    if let Ok(controllers) = std::fs::read_dir(mount) {
        roots.extend(
            controllers
                .flatten()
                .map(|c| c.path().join("tacc").join(&name)),
        );
    }
    for root in roots.into_iter().filter(|r| r.is_dir()) {
        let attempts: Vec<PathBuf> = std::fs::read_dir(&root)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        for dir in attempts.iter().chain(std::iter::once(&root)) {
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > end {
                    break;
                }
                std::thread::yield_now();
            }
        }
    }
}

impl Daemon {
    /// A client acting as this cluster's admin.
    pub fn client(&self) -> Client {
        Client::new(&self.url).with_token(self.token.clone())
    }

    /// Create user `name` (role `role`, group `group`) through the admin API and return a
    /// client acting as them.
    pub async fn user_client(&self, name: &str, group: Option<&str>, role: &str) -> Client {
        let created = self
            .client()
            .create_user(&tacc_proto::CreateUser {
                name: name.into(),
                group: group.map(Into::into),
                role: role.parse().unwrap(),
                token_ttl_secs: None,
            })
            .await
            .unwrap();
        Client::new(&self.url).with_token(created.token.token)
    }

    /// Run `taccd admin --data-dir DATA ARGS…` against this server's data directory and
    /// return what it printed on stdout.
    pub fn admin(&self, args: &[&str]) -> String {
        admin(&self.data_dir, args)
    }

    /// `kill -9` of this process. A dev cluster's agent is a process of its own and lives
    /// on with its tasks (see [`Daemon::crash`]).
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// The machine goes down: `kill -9` of this process and of a dev cluster's agent
    /// (whose tasks are left as orphans, as a crash leaves them).
    pub fn crash(&mut self) {
        self.kill9();
        kill_embedded_agent(&self.data_dir);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

pub fn taccd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_taccd"))
}

/// Where [`launch`] notes the `--database` a server was started with, so that
/// `taccd admin` reaches the same store (users and join tokens live there), as an
/// operator passes the server's `--database` to it.
const DATABASE_NOTE: &str = "test-database.url";

/// `taccd admin --data-dir DATA [--database URL] ARGS…`; panics with its stderr when it
/// fails.
pub fn admin(data_dir: &Path, args: &[&str]) -> String {
    let mut command = taccd();
    command.arg("admin").arg("--data-dir").arg(data_dir);
    if let Ok(url) = std::fs::read_to_string(data_dir.join(DATABASE_NOTE)) {
        command.args(["--database", url.trim()]);
    }
    let out = command.args(args).output().unwrap();
    assert!(
        out.status.success(),
        "taccd admin {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Poll `check` every 20 ms until it returns `Some`, or fail after `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Start `taccd ARGS --data-dir DIR --listen 127.0.0.1:0` and wait until it answers.
pub async fn start(mode: &str, data_dir: &Path, extra: &[&str]) -> Daemon {
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let daemon = launch(mode, data_dir, &args).await;
    let client = daemon.client();
    eventually("the server to answer", DEADLINE, || {
        let client = client.clone();
        async move { client.health().await.ok() }
    })
    .await;
    daemon
}

/// Start `taccd MODE --data-dir DIR ARGS` and wait for its endpoint and an admin token
/// (a dev cluster writes its own; a plain server gets one from `taccd admin`), without
/// asking it anything (a TLS server is not trusted by the default client).
pub async fn launch(mode: &str, data_dir: &Path, args: &[&str]) -> Daemon {
    let _ = std::fs::remove_file(data_dir.join("taccd.json"));
    std::fs::create_dir_all(data_dir).unwrap();
    let _ = std::fs::remove_file(data_dir.join(DATABASE_NOTE));
    if let Some(at) = args.iter().position(|a| *a == "--database") {
        std::fs::write(data_dir.join(DATABASE_NOTE), args[at + 1]).unwrap();
    }
    let log_path = data_dir.join(format!("{mode}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = taccd()
        .arg(mode)
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let endpoint = data_dir.join("taccd.json");
    let url = eventually("taccd to write its endpoint", DEADLINE, || {
        let endpoint = endpoint.clone();
        // A daemon that exited will never write it: say why at once, not after the deadline.
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "taccd {mode} {args:?} exited ({status}) before writing its endpoint: {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        async move {
            let text = std::fs::read_to_string(&endpoint).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            Some(value["url"].as_str()?.to_string())
        }
    })
    .await;
    // A dev cluster provisions its own admin; a plain server is given one by the operator.
    let token_file = data_dir.join("admin.token");
    if mode != "dev" && !token_file.exists() {
        let token = admin(data_dir, &["user", "add", "tester", "--role", "admin"]);
        std::fs::write(&token_file, token.trim()).unwrap();
    }
    let token = eventually("the admin token", DEADLINE, || {
        let token_file = token_file.clone();
        async move {
            let text = std::fs::read_to_string(&token_file).ok()?;
            (!text.trim().is_empty()).then(|| text.trim().to_string())
        }
    })
    .await;
    Daemon {
        child,
        url,
        data_dir: data_dir.to_path_buf(),
        token,
    }
}

/// Start `taccd MODE` again on the address it had (its agents and clients know no other),
/// on the same data directory, and wait until it answers.
pub async fn restart_on(mode: &str, data: &Path, url: &str, extra: &[&str]) -> Daemon {
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let mut args = vec!["--listen", address];
    args.extend_from_slice(extra);
    let daemon = launch(mode, data, &args).await;
    let client = daemon.client();
    eventually("the restarted server to answer", DEADLINE, || {
        let client = client.clone();
        async move { client.health().await.ok() }
    })
    .await;
    daemon
}

/// Write `token` to a file only its owner reads, as an operator hands a join token to an
/// agent (`--token-file`): never on a command line.
pub fn write_token_file(path: &Path, token: &str) -> std::path::PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    file.write_all(token.trim().as_bytes()).unwrap();
    path.to_path_buf()
}

/// Start a separate agent process for `server`, with a join token the operator issued
/// (one node, any name), handed over in a file.
pub fn start_agent(server: &Daemon, data_dir: &Path, extra: &[&str]) -> Daemon {
    start_agent_enrolling(server, data_dir, &[], extra)
}

/// [`start_agent`] with a join token issued with `token_args` (e.g. `--nodes 8` for a
/// Slurm agent that enrols every node of its partition).
pub fn start_agent_enrolling(
    server: &Daemon,
    data_dir: &Path,
    token_args: &[&str],
    extra: &[&str],
) -> Daemon {
    std::fs::create_dir_all(data_dir).unwrap();
    let url = server.url.as_str();
    let mut args = vec!["agent-token", "--ttl", "1h"];
    args.extend_from_slice(token_args);
    let join = server.admin(&args);
    let token_file = write_token_file(&data_dir.join("join.token"), &join);
    let log = std::fs::File::create(data_dir.join("agent.log")).unwrap();
    let child = taccd()
        .args(["agent", "--server", url, "--data-dir"])
        .arg(data_dir)
        .arg("--token-file")
        .arg(&token_file)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon {
        child,
        url: url.to_string(),
        data_dir: data_dir.to_path_buf(),
        token: String::new(),
    }
}

/// Wait until the server lists at least `count` nodes that are up.
pub async fn wait_nodes(client: &Client, count: usize) {
    eventually("nodes to register", DEADLINE, || {
        let client = client.clone();
        async move {
            let nodes = client.list_nodes().await.ok()?;
            (nodes.iter().filter(|n| n.state == "up").count() >= count).then_some(())
        }
    })
    .await;
}

/// Upload `dir` as a snapshot the way `tcloud submit` does.
pub async fn upload(client: &Client, dir: &Path) -> tacc_core::SnapshotId {
    let tree = tacc_compiler::scan(dir, &[]).unwrap();
    let manifest = serde_json::to_value(&tree.manifest).unwrap();
    let offer = client.offer_snapshot(manifest.clone()).await.unwrap();
    for hash in &offer.missing {
        let bytes = tree.read_chunk(&hash.parse().unwrap()).unwrap();
        let compressed = zstd::bulk::compress(&bytes, 3).unwrap();
        client.put_chunk(hash, compressed).await.unwrap();
    }
    client.commit_snapshot(manifest).await.unwrap().snapshot
}

/// Write `task.yaml` (and any extra files) into a new directory and submit it.
pub async fn submit(
    client: &Client,
    root: &Path,
    name: &str,
    yaml: &str,
    files: &[(&str, &str)],
) -> TaskId {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("task.yaml"), yaml).unwrap();
    for (path, text) in files {
        std::fs::write(dir.join(path), text).unwrap();
    }
    let loaded = tacc_schema::load_task(&dir).unwrap();
    let snapshot = upload(client, &loaded.code_root).await;
    let reply = client
        .submit(&SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: Some(dir.display().to_string()),
            wait_for_capacity: false,
        })
        .await
        .unwrap();
    reply.task_id
}

pub async fn wait_state(client: &Client, task: TaskId, wanted: &[TaskState]) -> TaskView {
    eventually(
        &format!("task {task} to reach {wanted:?}"),
        DEADLINE,
        || {
            let client = client.clone();
            async move {
                let view = client.get_task(task).await.ok()?;
                wanted.contains(&view.state).then_some(view)
            }
        },
    )
    .await
}

pub async fn wait_terminal(client: &Client, task: TaskId) -> TaskView {
    wait_state(
        client,
        task,
        &[
            TaskState::Succeeded,
            TaskState::Failed,
            TaskState::Cancelled,
            TaskState::Lost,
        ],
    )
    .await
}

pub async fn log_text(client: &Client, task: TaskId) -> String {
    String::from_utf8(client.logs(task, 0).await.unwrap().0.to_vec()).unwrap()
}

pub use tacc_exec::contract::process_alive;

/// Every live process whose environment carries `MARKER=<marker>` (tests put a unique
/// marker in each task's `environment.vars`, since task ids repeat across test servers).
pub fn task_processes(marker: &str) -> Vec<u32> {
    let needle = format!("MARKER={marker}\0");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if String::from_utf8_lossy(&env).contains(&needle) && process_alive(pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

pub async fn wait_no_processes(marker: &str) {
    eventually(
        &format!("no process marked {marker}"),
        DEADLINE,
        || async move { task_processes(marker).is_empty().then_some(()) },
    )
    .await
}

/// The `tcloud` binary built beside `taccd`.
pub fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build -p taccd -p tcloud --bins`",
        path.display()
    );
    path
}

/// `tcloud ARGS` against `daemon` as its admin; stdout, asserting success.
pub fn tcloud(daemon: &Daemon, home: &Path, args: &[&str]) -> String {
    let output = Command::new(tcloud_binary())
        .args(args)
        .env("TACC_HOME", home)
        .env("TACC_SERVER", &daemon.url)
        .env("TACC_TOKEN", &daemon.token)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tcloud {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Whether tasks get cgroups here (root and a mounted hierarchy); in CI a missing one
/// fails the test, elsewhere it says SKIPPED loudly.
pub fn cgroups_or_skip(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let mount = Path::new("/sys/fs/cgroup");
    let hierarchy =
        mount.join("cgroup.controllers").is_file() || mount.join("memory/cgroup.procs").is_file();
    if root && hierarchy {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root and a cgroup hierarchy in CI (root: {root})");
    }
    eprintln!(
        "\n######## SKIPPED {test}: not root or no cgroup hierarchy, so tasks get no cgroups.\n######## Run the tests as root on Linux (scripts/test.sh in CI does).\n"
    );
    false
}

/// The store a scenario's server keeps its state in, so that one scenario runs on each:
/// `Sqlite` (the default file in the data directory) or `Postgres` (a database of its own,
/// dropped when this is, so hold it for the whole scenario; every restart of the server
/// passes the same `--database`).
pub enum Backend {
    Sqlite,
    Postgres(TestDatabase),
}

impl Backend {
    /// A new PostgreSQL database for `test`, or `None` (SKIPPED loudly outside CI when
    /// `TACC_TEST_POSTGRES_URL` is unset; a failure in CI).
    pub async fn postgres(test: &str) -> Option<Backend> {
        TestDatabase::create(test).await.map(Backend::Postgres)
    }

    /// The daemon arguments that select this store.
    pub fn args(&self) -> Vec<&str> {
        match self {
            Backend::Sqlite => vec![],
            Backend::Postgres(database) => vec!["--database", database.url.as_str()],
        }
    }

    /// `extra` followed by [`Backend::args`].
    pub fn with<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = extra.to_vec();
        args.extend(self.args());
        args
    }

    /// For the figures a scenario prints.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres(_) => "PostgreSQL",
        }
    }
}

/// One scenario as two tests, `$name::on_sqlite` and `$name::on_postgres` (each on a new
/// database of the server `TACC_TEST_POSTGRES_URL` names; SKIPPED loudly without one,
/// except in CI). `$scenario` is called with the [`Backend`]; with `needs`, each test first
/// asks that check (`cgroups_or_skip`, `network_ready`) whether this machine can run it.
#[macro_export]
macro_rules! on_both_stores {
    ($name:ident, threads = $threads:literal, $(needs = $check:path,)? run = $scenario:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn on_sqlite() {
                #[allow(unused_variables)]
                let test = concat!(stringify!($name), "::on_sqlite");
                $(if !$check(test) {
                    return;
                })?
                ($scenario)($crate::common::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn on_postgres() {
                let test = concat!(stringify!($name), "::on_postgres");
                $(if !$check(test) {
                    return;
                })?
                if let Some(backend) = $crate::common::Backend::postgres(test).await {
                    ($scenario)(backend).await;
                }
            }
        }
    };
}

/// Where the tasks write their markers: tasks run as another user, so the directory
/// (and the way to it) is open to all.
pub fn markers_dir(root: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let markers = root.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o1777)).unwrap();
    markers
}

/// Wait until the task's log holds `needle`; the log then.
pub async fn wait_log(client: &Client, task: TaskId, needle: &str) -> String {
    eventually(&format!("`{needle}` in the log"), DEADLINE, || {
        let client = client.clone();
        async move {
            let text = String::from_utf8(client.logs(task, 0).await.ok()?.0.to_vec()).ok()?;
            text.contains(needle).then_some(text)
        }
    })
    .await
}

/// A task's events as (attempt, state), oldest first.
pub async fn attempt_states(client: &Client, task: TaskId) -> Vec<(u32, TaskState)> {
    client
        .task_events(task)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.attempt.0, e.state))
        .collect()
}

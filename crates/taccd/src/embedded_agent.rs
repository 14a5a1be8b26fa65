//! The embedded cluster's agent (`taccd dev`) runs as a process of its own, started and
//! watched by the server's process: a crash of the server (`kill -9`) leaves the agent
//! and its tasks running, as a separate agent would, and the server started again adopts
//! it instead of starting another. Nothing that ran through the crash is run twice.
//!
//! Both sides keep a record in the server's data directory: the server its process
//! ([`SERVER_RECORD`]), the agent its process, the URL it reports to and the settings it
//! was started with ([`AGENT_RECORD`]); a server adopts only an agent that reports to its
//! URL with its settings. An agent whose server stays gone for one heartbeat timeout
//! stops its tasks and exits: nobody is left to report to, and a server started later
//! starts an agent of its own, which kills what a previous one left behind.
//!
//! A signal to the server (SIGTERM, SIGINT) stops the server alone, as a crash would but
//! cleanly: an upgrade restarts the server within the heartbeat timeout and loses no
//! task. Only an explicit stop of the cluster (`tcloud down`, see
//! `tacc_server::cluster_stop`) stops the agent.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tacc_agent::ProcessMark;
use tokio_util::sync::CancellationToken;

/// The server's record of itself: `DATA_DIR/dev.json`.
const SERVER_RECORD: &str = "dev.json";
/// The agent's record: `DATA_DIR/embedded-agent.json`.
const AGENT_RECORD: &str = "embedded-agent.json";
/// Where the agent's log goes (the server's own log carries it on while both run).
const AGENT_LOG: &str = "agent.log";
/// The hidden flag that makes `taccd dev` the agent of the embedded cluster at this URL.
pub const AGENT_FLAG: &str = "--embedded-agent";
/// The longest join token the agent reads from its standard input.
const MAX_TOKEN_BYTES: u64 = 4096;
/// How often each side looks at the other.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// How long a started agent is given before a crashed one is started again.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct AgentRecord {
    process: ProcessMark,
    url: String,
    /// The node settings it runs with (`NodeArgs` and TLS, as the server would give them).
    settings: String,
}

/// What the server starts its agent with.
pub struct AgentLaunch {
    pub data_dir: PathBuf,
    pub url: String,
    pub join_token: String,
    /// The settings the agent must run with to be adopted (see [`AgentRecord::settings`]).
    pub settings: String,
    /// How long a stopping agent is given to stop its tasks before it is killed.
    pub stop_wait: Duration,
}

/// Write a record atomically (a crash leaves the old one or the new one, never half).
fn write_record(path: &Path, value: &impl Serialize) -> Result<()> {
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, serde_json::to_vec(value)?)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("cannot write {}", path.display()))
}

fn read_record<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The agent the server watches: its own child, or one a previous server left running.
enum Watched {
    Child(Child),
    Adopted(ProcessMark),
}

impl Watched {
    fn pid(&self) -> u32 {
        match self {
            Watched::Child(child) => child.id(),
            Watched::Adopted(mark) => mark.pid,
        }
    }

    /// Whether it still runs (a child that ended is reaped here).
    fn is_running(&mut self) -> bool {
        match self {
            Watched::Child(child) => matches!(child.try_wait(), Ok(None)),
            Watched::Adopted(mark) => mark.is_alive(),
        }
    }

    /// SIGTERM (the agent stops its tasks with their grace), SIGKILL after `wait`.
    async fn stop(&mut self, wait: Duration) {
        let pid = Pid::from_raw(self.pid() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + wait;
        while self.is_running() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "the embedded agent (pid {}) did not stop within {wait:?}: killing it",
                    self.pid()
                );
                let _ = kill(pid, Signal::SIGKILL);
                let hard = Instant::now() + Duration::from_secs(10);
                while self.is_running() && Instant::now() < hard {
                    tokio::time::sleep(WATCH_EVERY).await;
                }
                return;
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }
}

/// Copies what the agent writes to its log file onto the server's standard error, so a
/// terminal running `taccd dev` (or the log `tcloud up` keeps) shows both.
struct LogRelay {
    path: PathBuf,
    offset: u64,
}

impl LogRelay {
    /// From the log's current end.
    fn from_end(path: PathBuf) -> LogRelay {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        LogRelay { path, offset }
    }

    fn relay(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut fresh = Vec::new();
        // At most 1 MiB a look: a chatty agent never holds the server up.
        if let Ok(read) = file.take(1 << 20).read_to_end(&mut fresh) {
            self.offset += read as u64;
            let _ = std::io::stderr().write_all(&fresh);
        }
    }
}

/// Record this process as the embedded cluster's server, before it starts serving: an
/// agent that outlived the previous one sees it is back.
/// Refused while another embedded cluster's server runs on the same data directory.
pub fn record_server(data_dir: &Path) -> Result<()> {
    let path = data_dir.join(SERVER_RECORD);
    if let Some(other) = read_record::<ProcessMark>(&path)
        && other.is_alive()
        && other.pid != std::process::id()
    {
        anyhow::bail!(
            "another taccd dev (pid {}) runs on {}: stop it first (`tcloud down`, or kill {})",
            other.pid,
            data_dir.display(),
            other.pid
        );
    }
    write_record(&path, &ProcessMark::current())
}

/// Start the embedded agent (or adopt the one a previous server left), start it again
/// should it end, and stop it when `stop_agent` is cancelled (the cluster stops:
/// `tcloud down`). When only `shutdown` is (a signal to the server: an upgrade, a restart)
/// the agent and its tasks are left running, and its record with them, for the next
/// server to adopt; unadopted, it stops itself after the heartbeat timeout.
pub async fn supervise(
    launch: AgentLaunch,
    shutdown: CancellationToken,
    stop_agent: CancellationToken,
) -> Result<()> {
    let record_path = launch.data_dir.join(AGENT_RECORD);
    let mut relay = LogRelay::from_end(launch.data_dir.join(AGENT_LOG));
    loop {
        let mut agent = match read_record::<AgentRecord>(&record_path) {
            Some(record) if record.process.is_alive() => {
                let mut previous = Watched::Adopted(record.process);
                if record.url == launch.url && record.settings == launch.settings {
                    tracing::info!(
                        "adopting the embedded agent (pid {}) that outlived the previous server, with its tasks",
                        record.process.pid
                    );
                    previous
                } else {
                    tracing::info!(
                        "stopping the embedded agent (pid {}) of a previous server: it reports to {} with other settings",
                        record.process.pid,
                        record.url
                    );
                    previous.stop(launch.stop_wait).await;
                    start(&launch, &record_path)?
                }
            }
            _ => start(&launch, &record_path)?,
        };
        loop {
            tokio::select! {
                _ = stop_agent.cancelled() => {
                    agent.stop(launch.stop_wait).await;
                    relay.relay();
                    let _ = std::fs::remove_file(&record_path);
                    return Ok(());
                }
                _ = shutdown.cancelled() => {
                    relay.relay();
                    tracing::info!(
                        "the embedded agent (pid {}) and its tasks carry on without this server; the next `taccd dev` on {} adopts them",
                        agent.pid(),
                        launch.data_dir.display()
                    );
                    return Ok(());
                }
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
            relay.relay();
            if !agent.is_running() {
                tracing::warn!(
                    "the embedded agent (pid {}) ended; starting it again (its log: {})",
                    agent.pid(),
                    launch.data_dir.join(AGENT_LOG).display()
                );
                break;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = stop_agent.cancelled() => return Ok(()),
            _ = tokio::time::sleep(RESTART_PAUSE) => {}
        }
    }
}

/// Start `taccd` again as the agent: this server's own command line plus [`AGENT_FLAG`].
fn start(launch: &AgentLaunch, record_path: &Path) -> Result<Watched> {
    let log_path = launch.data_dir.join(AGENT_LOG);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let program = std::env::current_exe().context("cannot find the taccd binary")?;
    let args = without_database(std::env::args_os().skip(1));
    // The join token goes through a pipe on the agent's standard input: neither its
    // command line (every process reads it) nor its environment (kept in
    // /proc/PID/environ for the agent's life) ever holds it.
    let mut child = Command::new(&program)
        .args(&args)
        .arg(AGENT_FLAG)
        .arg(&launch.url)
        .env_remove(crate::join_token::JOIN_TOKEN_ENV)
        .env_remove(crate::join_token::OLD_JOIN_TOKEN_ENV)
        .env_remove(crate::database::DATABASE_ENV)
        .stdin(Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start the embedded agent ({})", program.display()))?;
    if let Some(mut pipe) = child.stdin.take() {
        // The agent reads to the end: dropping the pipe closes it. A failed write (the
        // agent died at once) shows as the agent's end, which the supervisor handles.
        if let Err(e) = pipe.write_all(launch.join_token.as_bytes()) {
            tracing::warn!("cannot hand the embedded agent its join token: {e}");
        }
    }
    let process = ProcessMark::of(child.id()).unwrap_or(ProcessMark {
        pid: child.id(),
        started: 0,
    });
    write_record(
        record_path,
        &AgentRecord {
            process,
            url: launch.url.clone(),
            settings: launch.settings.clone(),
        },
    )?;
    tracing::info!(
        "embedded agent started (pid {}, log {})",
        child.id(),
        log_path.display()
    );
    Ok(Watched::Child(child))
}

/// The server's arguments without `--database URL` (or `--database=URL`): the agent needs
/// no database, and a PostgreSQL URL may carry a password, which its command line would
/// show to every process on the machine.
fn without_database(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        if arg == "--database" {
            skip_value = true;
        } else if !arg.as_encoded_bytes().starts_with(b"--database=") {
            kept.push(arg);
        }
    }
    kept
}

/// The agent's side: its join token, written on its standard input by the server that
/// started it (`None` when it gave none).
pub fn read_join_token() -> Result<Option<String>> {
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_TOKEN_BYTES)
        .read_to_string(&mut text)
        .context(
            "cannot read the join token the server writes on the embedded agent's standard input",
        )?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// The agent's side: cancel `shutdown` once the server of `data_dir` has been gone for
/// `grace` (its record names no live process).
pub fn watch_server(data_dir: PathBuf, grace: Duration, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let record = data_dir.join(SERVER_RECORD);
        let mut gone_since: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
            let alive = read_record::<ProcessMark>(&record).is_some_and(|m| m.is_alive());
            if alive {
                gone_since = None;
                continue;
            }
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= grace {
                tracing::warn!(
                    "the embedded cluster's server has been gone for {grace:?}: stopping this agent and its tasks"
                );
                shutdown.cancel();
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_started_without_the_server_s_database() {
        let args = [
            "dev",
            "--database",
            "postgres://u:pw@h/db",
            "--cpus",
            "2",
            "--database=x",
        ]
        .map(OsString::from);
        assert_eq!(
            without_database(args.into_iter()),
            ["dev", "--cpus", "2"].map(OsString::from).to_vec()
        );
    }

    #[test]
    fn records_round_trip_and_a_missing_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AGENT_RECORD);
        assert_eq!(read_record::<AgentRecord>(&path), None);
        let record = AgentRecord {
            process: ProcessMark::current(),
            url: "http://127.0.0.1:1".into(),
            settings: "NodeArgs { cpus: Some(2.0) }".into(),
        };
        write_record(&path, &record).unwrap();
        assert_eq!(read_record::<AgentRecord>(&path), Some(record));
        assert!(!path.with_extension("json.partial").exists());
    }

    #[test]
    fn a_second_server_on_the_same_data_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        record_server(dir.path()).unwrap();
        // This process again (a restart in the same process) is no other server.
        record_server(dir.path()).unwrap();
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        let mark = ProcessMark::of(other.id()).unwrap();
        write_record(&dir.path().join(SERVER_RECORD), &mark).unwrap();
        let refused = record_server(dir.path()).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("another taccd dev (pid {})", other.id())),
            "{refused}"
        );
        other.kill().unwrap();
        other.wait().unwrap();
        // Once it is gone, the data directory is free.
        record_server(dir.path()).unwrap();
    }

    #[tokio::test]
    async fn an_agent_stops_once_its_server_has_been_gone_for_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let shutdown = CancellationToken::new();
        // A server that is alive (this process) keeps the agent up.
        write_record(&dir.path().join(SERVER_RECORD), &ProcessMark::current()).unwrap();
        watch_server(
            dir.path().to_path_buf(),
            Duration::from_millis(500),
            shutdown.clone(),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!shutdown.is_cancelled(), "stopped while its server runs");
        // One that ended stops it after the grace.
        let mut ended = Command::new("true").spawn().unwrap();
        let mark = ProcessMark::of(ended.id()).unwrap_or(ProcessMark {
            pid: ended.id(),
            started: 1,
        });
        ended.wait().unwrap();
        write_record(&dir.path().join(SERVER_RECORD), &mark).unwrap();
        let gone = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), shutdown.cancelled())
            .await
            .expect("the agent never stopped");
        assert!(gone.elapsed() >= Duration::from_millis(500));
    }
}

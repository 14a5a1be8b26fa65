//! `tcloud up` and `tcloud down`: the embedded single-machine cluster (`taccd dev`).
//!
//! `taccd dev` provisions a local admin identity and writes its token to
//! `DATA_DIR/admin.token` (mode 0600). `tcloud up` waits for that file and stores the token
//! in the `local` profile, so every command works right after `tcloud up`.

use std::fs::{self, DirBuilder, OpenOptions};
use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_client::{Client, ClientError};
use tacc_proto::{ClusterStopView, StopMode};

use crate::config::{self, Config, DEFAULT_PROFILE, UpOptions};
use crate::errors::CliError;
use crate::format::out;

const START_DEADLINE: Duration = Duration::from_secs(20);
const STOP_DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);
/// How often `tcloud down` asks how many tasks are left.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

fn pid_file(dir: &Path) -> PathBuf {
    dir.join("taccd.pid")
}
fn url_file(dir: &Path) -> PathBuf {
    dir.join("taccd.url")
}
/// The options the running cluster was started with (JSON; none when missing).
fn options_file(dir: &Path) -> PathBuf {
    dir.join("up-options.json")
}

/// `tcloud up`'s options for the cluster, passed on to `taccd dev`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct UpArgs {
    /// Scheduler configuration file (TOML, see docs/SCHEDULING.md); a relative path is
    /// taken from the current directory
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// GPUs the local node offers; on a machine without GPUs, N fake ones (tasks see
    /// CUDA_VISIBLE_DEVICES all the same)
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// The model of those GPUs, as task files name it in `gpu_type` (e.g. A100); needs
    /// --gpus on a machine without GPUs
    #[arg(long, value_name = "TYPE")]
    pub gpu_type: Option<String>,
    /// Register a dataset tasks can name as `source: NAME` (repeatable)
    #[arg(long = "dataset", value_name = "NAME=SOURCE")]
    pub datasets: Vec<String>,
    /// Scheduling policy (overrides the configuration file's)
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// Store these options in the `local` profile, so that a plain `tcloud up` repeats them
    #[arg(long)]
    pub save: bool,
}

impl UpArgs {
    /// The options given on the command line, a relative `--config` made absolute.
    fn options(&self) -> Result<UpOptions> {
        let config = match &self.config {
            None => None,
            Some(path) => Some(std::path::absolute(path).with_context(|| {
                format!("cannot make --config {} an absolute path", path.display())
            })?),
        };
        Ok(UpOptions {
            config,
            gpus: self.gpus,
            gpu_type: self.gpu_type.clone(),
            datasets: self.datasets.clone(),
            policy: self.policy.clone(),
        })
    }
}

/// The options as `tcloud up` flags, for messages.
fn flags(options: &UpOptions) -> String {
    let args = options.args();
    if args.is_empty() {
        return "no options".to_string();
    }
    args.iter()
        .map(|arg| {
            if !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+".contains(c))
            {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_running_options(dir: &Path) -> UpOptions {
    fs::read_to_string(options_file(dir))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

/// Checks what the daemon would only report in its log: the configuration file exists,
/// datasets are NAME=SOURCE.
fn check_options(options: &UpOptions, from_profile: bool) -> Result<()> {
    let origin = |flag: &str, key: &str| {
        if from_profile {
            format!("`{key}` of the `{DEFAULT_PROFILE}` profile")
        } else {
            flag.to_string()
        }
    };
    if let Some(path) = &options.config
        && !path.is_file()
    {
        bail!(CliError::invalid(format!(
            "the scheduler configuration file {} ({}) does not exist",
            path.display(),
            origin("--config", "up_config")
        )));
    }
    for dataset in &options.datasets {
        if !dataset.contains('=') {
            bail!(CliError::invalid(format!(
                "dataset `{dataset}` ({}) is not NAME=SOURCE, e.g. mnist=/shared/datasets/mnist",
                origin("--dataset", "up_datasets")
            )));
        }
    }
    Ok(())
}

/// Stores `options` in the `local` profile (`tcloud up --save`).
fn save_options(options: &UpOptions) -> Result<()> {
    let mut config = Config::load()?;
    config.set_up_options(DEFAULT_PROFILE, options)?;
    eprintln!(
        "Saved {} in the `{DEFAULT_PROFILE}` profile of {}; a plain `tcloud up` repeats them",
        flags(options),
        config.path.display()
    );
    Ok(())
}
/// Where `taccd dev` writes the local admin's token.
pub fn admin_token_file(dir: &Path) -> PathBuf {
    dir.join("admin.token")
}

/// The token in `admin.token`, once the file holds a whole one: a line that ends in a
/// newline, or a full-length `tacc_` token (43 characters of base64 after the prefix).
pub fn read_admin_token(dir: &Path) -> Option<String> {
    let text = fs::read_to_string(admin_token_file(dir)).ok()?;
    let token = text.trim();
    let complete = text.ends_with('\n') || token.len() >= "tacc_".len() + 43;
    (complete && !token.is_empty()).then(|| token.to_string())
}

/// Waits until `taccd` at `url` has written an admin token that it accepts (a file left
/// by an earlier run may be about to be replaced).
async fn wait_for_admin_token(dir: &Path, url: &str, deadline: Instant) -> Result<String> {
    let path = admin_token_file(dir);
    loop {
        let refused = match read_admin_token(dir) {
            Some(token) => match Client::new(url).with_token(token.clone()).whoami().await {
                Err(ClientError::Api { status: 401, .. }) => true,
                // Accepted, or a failure that the next command will report better.
                _ => return Ok(token),
            },
            None => false,
        };
        if Instant::now() >= deadline {
            if refused {
                bail!(
                    "the local cluster refuses the admin token in {}; see {}, or restart it with `tcloud down && tcloud up`",
                    path.display(),
                    dir.join("taccd.log").display()
                );
            }
            bail!(
                "the local cluster answers but has not written its admin token to {}; is this taccd older than tcloud? See {}",
                path.display(),
                dir.join("taccd.log").display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn read_pid(dir: &Path) -> Option<i32> {
    fs::read_to_string(pid_file(dir))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|pid| *pid > 0)
}

/// Is `pid` a live process (and, where /proc tells, a taccd)?
fn is_alive(pid: i32) -> bool {
    let alive = match kill(Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(Errno::EPERM) => true,
        Err(_) => false,
    };
    if !alive {
        return false;
    }
    // Guard against a recycled pid: on Linux check the process is really taccd.
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => {
            let text = String::from_utf8_lossy(&cmdline);
            // A zombie has an empty command line and is as good as gone.
            !text.is_empty() && text.contains("taccd")
        }
        Err(_) => true,
    }
}

async fn healthy(url: &str) -> bool {
    Client::new(url).health().await.is_ok()
}

/// `$TACC_TACCD`, else next to this executable, else on PATH.
pub fn find_taccd() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("TACC_TACCD").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!(
            "TACC_TACCD points at {}, which is not a file; build taccd with `cargo build --release -p taccd` or fix the variable",
            path.display()
        );
    }
    if let Some(beside) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("taccd")))
        .filter(|p| p.is_file())
    {
        return Ok(beside);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("taccd");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "cannot find the `taccd` binary (looked at $TACC_TACCD, next to tcloud, and on PATH); build it with `cargo build --release -p taccd`, then put it on PATH or set TACC_TACCD"
    )
}

/// The last lines of taccd's log, safe to print (it may quote what tasks wrote).
fn log_tail(path: &Path, lines: usize) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    crate::sanitize::text(&all[all.len().saturating_sub(lines)..].join("\n")).into_owned()
}

/// Points the `local` profile at `url` and stores the local admin's `token` in it, when
/// it says otherwise.
fn sync_local_profile(url: &str, token: &str) -> Result<()> {
    let mut config = Config::load()?;
    let configured = config.file.clusters.get(DEFAULT_PROFILE).cloned();
    let configured_url = match &configured {
        Some(cluster) => cluster.url.clone(),
        None if config.text.is_none() => config::default_url(),
        None => String::new(),
    };
    if configured_url.trim_end_matches('/') != url {
        config.set_cluster(DEFAULT_PROFILE, url)?;
        eprintln!(
            "Updated the `{DEFAULT_PROFILE}` profile in {} to {url}",
            config.path.display()
        );
    }
    if configured.as_ref().and_then(|c| c.token()) != Some(token) {
        config.set_token(DEFAULT_PROFILE, url, token)?;
        eprintln!(
            "Logged in to the local cluster as its admin (token stored in {})",
            config.path.display()
        );
    }
    if config::env_token().is_some() {
        eprintln!(
            "note: {} is set and overrides the local admin token; unset it to use the local cluster",
            config::TOKEN_ENV
        );
    }
    if config.current_name() != DEFAULT_PROFILE {
        eprintln!(
            "note: the current cluster is `{}`; run `tcloud config use {DEFAULT_PROFILE}` to use this one",
            config.current_name()
        );
    }
    Ok(())
}

pub async fn up(port: u16, args: UpArgs) -> Result<()> {
    let given = args.options()?;
    let saved = Config::load()?
        .file
        .clusters
        .get(DEFAULT_PROFILE)
        .map(|cluster| cluster.up.clone())
        .unwrap_or_default();
    let options = given.clone().or(&saved);
    check_options(&given, false)?;
    check_options(&options, true)?;
    let dir = config::local_data_dir()?;
    DirBuilder::new()
        .recursive(true)
        .mode(config::DIR_MODE)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let url = format!("http://127.0.0.1:{port}");

    if let Some(pid) = read_pid(&dir) {
        if is_alive(pid) {
            let running_url = fs::read_to_string(url_file(&dir))
                .map(|u| u.trim().to_string())
                .unwrap_or_else(|_| url.clone());
            if healthy(&running_url).await {
                let deadline = Instant::now() + START_DEADLINE;
                let token = wait_for_admin_token(&dir, &running_url, deadline).await?;
                out(format!(
                    "A local cluster is already running at {running_url} (pid {pid})"
                ))?;
                sync_local_profile(&running_url, &token)?;
                if args.save {
                    save_options(&options)?;
                }
                let running = read_running_options(&dir);
                if running != options {
                    let message = format!(
                        "the local cluster runs with {}, not with {}; restart it to change them: `tcloud down && tcloud up {}`",
                        flags(&running),
                        flags(&options),
                        flags(&options)
                    );
                    // Asked for on the command line: not done, so not a success.
                    if given.is_empty() {
                        eprintln!("note: {message}");
                    } else {
                        bail!(CliError::new(crate::errors::FAILURE, message));
                    }
                }
                return Ok(());
            }
            bail!(
                "taccd (pid {pid}) is running but does not answer at {running_url}; see {} or stop it with `tcloud down`",
                dir.join("taccd.log").display()
            );
        }
        // Stale: the process is gone.
        let _ = fs::remove_file(pid_file(&dir));
    }

    if let Err(error) = TcpListener::bind(("127.0.0.1", port)) {
        if healthy(&url).await {
            bail!(
                "a TACC server already answers at {url}, but it was not started by `tcloud up` (no pid in {}); use it as is, or start another with `tcloud up --port {}`",
                dir.display(),
                port.wrapping_add(1)
            );
        }
        bail!(
            "port {port} is already in use by another program ({error}); pick another with `tcloud up --port {}`",
            port.wrapping_add(1)
        );
    }

    let taccd = find_taccd()?;
    let log_path = dir.join("taccd.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .context("cannot duplicate the log file handle")?;
    let mut child = Command::new(&taccd)
        .arg("dev")
        .arg("--data-dir")
        .arg(&dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(options.args())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", taccd.display()))?;
    let pid = child.id();
    fs::write(pid_file(&dir), format!("{pid}\n"))
        .with_context(|| format!("cannot write {}", pid_file(&dir).display()))?;
    fs::write(url_file(&dir), format!("{url}\n"))
        .with_context(|| format!("cannot write {}", url_file(&dir).display()))?;
    fs::write(options_file(&dir), serde_json::to_string(&options)? + "\n")
        .with_context(|| format!("cannot write {}", options_file(&dir).display()))?;

    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if healthy(&url).await {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let _ = fs::remove_file(pid_file(&dir));
            bail!(
                "taccd exited during start-up ({status}); the end of {}:\n{}",
                log_path.display(),
                log_tail(&log_path, 15)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "taccd (pid {pid}) did not answer at {url} within {} s; see {} (stop it with `tcloud down`)",
                START_DEADLINE.as_secs(),
                log_path.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let token = wait_for_admin_token(&dir, &url, deadline).await?;
    out(format!("Local cluster running at {url} (pid {pid})"))?;
    eprintln!("  data and log: {}", dir.display());
    eprintln!(
        "  dashboard: {url}/ (sign in with the token in {})",
        dir.join("admin.token").display()
    );
    if !options.is_empty() {
        eprintln!("  options: {}", flags(&options));
    }
    sync_local_profile(&url, &token)?;
    if args.save {
        save_options(&options)?;
    }
    eprintln!("Next: `tcloud submit DIR -f` to run a task, `tcloud down` to stop the cluster.");
    Ok(())
}

/// `tcloud down`'s choice for the tasks still queued or running.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct DownArgs {
    /// Stop the queued and running tasks now: they end `cancelled`, with the reason
    /// `cluster stopped by tcloud down`
    #[arg(long, conflicts_with = "drain")]
    pub force: bool,
    /// Take no new tasks, let the queued and running ones finish (showing how many are
    /// left), then stop
    #[arg(long)]
    pub drain: bool,
}

impl DownArgs {
    fn mode(self) -> StopMode {
        match (self.force, self.drain) {
            (true, _) => StopMode::Force,
            (_, true) => StopMode::Drain,
            _ => StopMode::IfIdle,
        }
    }
}

/// How many of the active tasks a message names.
const NAMED: usize = 5;

/// `12 train (running), 13 eval (queued) and 4 more`.
fn name_tasks(view: &ClusterStopView) -> String {
    let mut named: Vec<String> = view
        .active
        .iter()
        .take(NAMED)
        .map(|task| {
            format!(
                "{} {} ({}, {})",
                task.id,
                crate::sanitize::text(&task.name),
                task.state,
                crate::sanitize::text(&task.user)
            )
        })
        .collect();
    let more = view.active_count.saturating_sub(named.len() as u64);
    if more > 0 {
        named.push(format!("{more} more"));
    }
    match named.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

fn tasks_word(count: u64) -> &'static str {
    if count == 1 { "task" } else { "tasks" }
}

/// Why a plain `tcloud down` stopped nothing, and what to run instead (exit 9).
fn busy(view: &ClusterStopView) -> CliError {
    let count = view.active_count;
    let words = tasks_word(count);
    let already = match view.stopping {
        Some(StopMode::Drain) => " It is draining already (`tcloud down --drain` waits for it).",
        _ => "",
    };
    CliError::new(
        crate::errors::CLUSTER_BUSY,
        format!(
            "the local cluster has {count} {words} queued or running: {}; nothing was stopped.{already}\n  \
             `tcloud down --drain` takes no new tasks, lets these finish, then stops;\n  \
             `tcloud down --force` stops them now (they end `cancelled`).",
            name_tasks(view)
        ),
    )
}

pub async fn down(args: DownArgs) -> Result<()> {
    let dir = config::local_data_dir()?;
    let Some(pid) = read_pid(&dir) else {
        out("no local cluster is running")?;
        return Ok(());
    };
    if !is_alive(pid) {
        forget(&dir);
        out("no local cluster is running (removed a stale pid file)")?;
        return Ok(());
    }
    let url = fs::read_to_string(url_file(&dir)).map(|u| u.trim().to_string());
    let token = read_admin_token(&dir);
    let client = match (url, token) {
        (Ok(url), Some(token)) if healthy(&url).await => Client::new(&url).with_token(token),
        _ => {
            // No answer (or no token to ask with): only a signal is left, which stops the
            // server alone; its agent stops its tasks when it finds the server gone.
            eprintln!(
                "note: the local cluster does not answer at its address; stopping its server with a signal (its agent stops its tasks within the heartbeat timeout, 30 s)"
            );
            return signal_stop(&dir, pid).await;
        }
    };
    let mode = args.mode();
    let view = match client.stop_cluster(mode).await {
        Ok(view) => view,
        // A taccd older than this tcloud knows no stop on request.
        Err(ClientError::Api { status: 404, .. }) => return signal_stop(&dir, pid).await,
        Err(e) => return Err(e).context("cannot ask the local cluster to stop"),
    };
    match (mode, view.stopping) {
        (_, None) => bail!(busy(&view)),
        // A plain `tcloud down` during a drain: it is not this command's to wait for.
        (StopMode::IfIdle, Some(StopMode::Drain)) if view.active_count > 0 => bail!(busy(&view)),
        _ => {}
    }
    if view.active_count > 0 {
        let count = view.active_count;
        let words = tasks_word(count);
        match view.stopping {
            Some(StopMode::Force) => eprintln!(
                "Stopping {count} {words} ({}); they end `cancelled`",
                name_tasks(&view)
            ),
            _ => eprintln!(
                "Draining: new tasks are refused; waiting for {count} {words} to finish ({}). Ctrl-C leaves the drain going; `tcloud down --force` stops them now",
                name_tasks(&view)
            ),
        }
    }
    wait_stopped(&client, &dir, pid, view.active_count).await
}

/// Wait for the cluster to stop on its own (it does once no task is left), saying how
/// many tasks are left as that changes.
async fn wait_stopped(client: &Client, dir: &Path, pid: i32, mut left: u64) -> Result<()> {
    let mut silent_since: Option<Instant> = None;
    let mut last_look = Instant::now();
    while is_alive(pid) {
        tokio::time::sleep(POLL).await;
        if last_look.elapsed() < PROGRESS_EVERY {
            continue;
        }
        last_look = Instant::now();
        match client.cluster_stop().await {
            Ok(view) => {
                silent_since = None;
                if view.active_count != left && view.active_count > 0 {
                    eprintln!(
                        "  {} {} left: {}",
                        view.active_count,
                        tasks_word(view.active_count),
                        name_tasks(&view)
                    );
                }
                left = view.active_count;
            }
            // Stopping: it answers no more. Should its process hang on, it is killed.
            Err(_) => {
                let since = *silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STOP_DEADLINE {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    forget(dir);
                    out(format!(
                        "taccd (pid {pid}) stopped answering but did not exit within {} s; killed it",
                        STOP_DEADLINE.as_secs()
                    ))?;
                    return Ok(());
                }
            }
        }
    }
    forget(dir);
    out(format!("Stopped the local cluster (pid {pid})"))?;
    Ok(())
}

/// The files `tcloud up` keeps about a running cluster.
fn forget(dir: &Path) {
    let _ = fs::remove_file(pid_file(dir));
    let _ = fs::remove_file(url_file(dir));
    let _ = fs::remove_file(options_file(dir));
}

/// SIGTERM, then SIGKILL after [`STOP_DEADLINE`]: for a server that cannot be asked.
async fn signal_stop(dir: &Path, pid: i32) -> Result<()> {
    let target = Pid::from_raw(pid);
    kill(target, Signal::SIGTERM).map_err(|e| {
        CliError::new(
            crate::errors::FAILURE,
            format!("cannot signal taccd (pid {pid}): {e}"),
        )
    })?;
    let deadline = Instant::now() + STOP_DEADLINE;
    while is_alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
    let message = if is_alive(pid) {
        let _ = kill(target, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_alive(pid) && Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        format!(
            "taccd (pid {pid}) did not stop within {} s of SIGTERM; killed it",
            STOP_DEADLINE.as_secs()
        )
    } else {
        format!("Stopped the local cluster (pid {pid})")
    };
    forget(dir);
    out(message)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_token_is_read_only_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_admin_token(dir.path()), None, "missing");
        let file = admin_token_file(dir.path());
        fs::write(&file, "tacc_abc").unwrap();
        assert_eq!(
            read_admin_token(dir.path()),
            None,
            "a short line without its newline"
        );
        fs::write(&file, "tacc_abc\n").unwrap();
        assert_eq!(read_admin_token(dir.path()).as_deref(), Some("tacc_abc"));
        let full = format!("tacc_{}", "A".repeat(43));
        fs::write(&file, &full).unwrap();
        assert_eq!(read_admin_token(dir.path()), Some(full));
        fs::write(&file, "\n").unwrap();
        assert_eq!(read_admin_token(dir.path()), None, "empty");
    }
}

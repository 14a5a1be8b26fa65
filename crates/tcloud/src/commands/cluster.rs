//! `tcloud up` and `tcloud down`: the embedded single-machine cluster (`taccd dev`).

use std::fs::{self, OpenOptions};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_client::Client;

use crate::config::{self, Config, DEFAULT_PROFILE};
use crate::errors::CliError;
use crate::format::out;

const START_DEADLINE: Duration = Duration::from_secs(20);
const STOP_DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);

fn pid_file(dir: &Path) -> PathBuf {
    dir.join("taccd.pid")
}
fn url_file(dir: &Path) -> PathBuf {
    dir.join("taccd.url")
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

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Points the `local` profile at `url` when it says otherwise.
fn sync_local_profile(url: &str) -> Result<()> {
    let mut config = Config::load()?;
    let configured = match config.file.clusters.get(DEFAULT_PROFILE) {
        Some(cluster) => cluster.url.clone(),
        None if config.text.is_none() => config::default_url(),
        None => String::new(),
    };
    if configured.trim_end_matches('/') != url {
        config.set_cluster(DEFAULT_PROFILE, url, None)?;
        eprintln!(
            "Updated the `{DEFAULT_PROFILE}` profile in {} to {url}",
            config.path.display()
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

pub async fn up(port: u16) -> Result<()> {
    let dir = config::local_data_dir()?;
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let url = format!("http://127.0.0.1:{port}");

    if let Some(pid) = read_pid(&dir) {
        if is_alive(pid) {
            let running_url = fs::read_to_string(url_file(&dir))
                .map(|u| u.trim().to_string())
                .unwrap_or_else(|_| url.clone());
            if healthy(&running_url).await {
                out(format!(
                    "A local cluster is already running at {running_url} (pid {pid})"
                ))?;
                sync_local_profile(&running_url)?;
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
    out(format!("Local cluster running at {url} (pid {pid})"))?;
    eprintln!("  data and log: {}", dir.display());
    sync_local_profile(&url)?;
    eprintln!("Next: `tcloud submit DIR -f` to run a task, `tcloud down` to stop the cluster.");
    Ok(())
}

pub async fn down() -> Result<()> {
    let dir = config::local_data_dir()?;
    let Some(pid) = read_pid(&dir) else {
        out("no local cluster is running")?;
        return Ok(());
    };
    if !is_alive(pid) {
        let _ = fs::remove_file(pid_file(&dir));
        out("no local cluster is running (removed a stale pid file)")?;
        return Ok(());
    }
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
    let _ = fs::remove_file(pid_file(&dir));
    let _ = fs::remove_file(url_file(&dir));
    out(message)?;
    Ok(())
}

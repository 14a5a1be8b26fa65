use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::cgroups::{
    Cgroup, Cgroups, DEFAULT_PIDS_MAX, KILL_DEADLINE, KillReport, Limits, NoCgroups, UsageReader,
};
use crate::lines::LineSplitter;
use crate::{
    ExecError, ExecutionHandle, Executor, ExitOutcome, LaunchSpec, OutputLine, OutputSender,
    Stream, handle_parts,
};

/// How long a pipe may stay silent after the process group is gone before it is given up.
/// A process that escaped the group (with `setsid`) may hold a pipe open forever; we stop
/// reading rather than hang. Time spent waiting for the output's reader does not count:
/// what the pipe held is delivered however slow the reader.
const PIPE_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// How a process joins its cgroup before the task's code runs, without `unsafe`
/// (`pre_exec`): the child starts as this tiny `sh` script, which blocks reading its
/// stdin. The parent (the agent, privileged) writes the child's pid into the cgroup's
/// `cgroup.procs` file(s), then writes `go`; only then does the script `exec` the task's
/// `bash` (same pid, so the process group and the cgroup carry over), with stdin from
/// `/dev/null`. Nothing of the task runs before it is in its cgroup; if the parent fails
/// or dies first, the script reads something else or end of file and exits 125 without
/// running the task. The parent moves the pid, so the task's identity ([`crate::RunAs`],
/// taken by `setpriv` only after the join) never needs to write the cgroup's files.
const JOIN_SCRIPT: &str = r#"IFS= read -r go && [ "$go" = go ] && exec "$@" </dev/null; exit 125"#;

/// The task's shell, by absolute path: with a program found through `PATH`, or with an
/// identity switch (`uid`/`gid`) or a `pre_exec` in the parent, std falls back from
/// `posix_spawn` to `fork`, which copies the page tables of the whole agent per task —
/// the largest cost of a short task when the agent holds a big queue.
const BASH: &str = "/bin/bash";

/// Switches to the task's identity (util-linux, in every Debian install): gid first, the
/// supplementary groups dropped, then uid, and only then `exec`s the task's shell — so
/// nothing of the task runs as the agent, and the agent never forks itself to switch.
const SETPRIV: &str = "/usr/bin/setpriv";

/// Enters the working directory as the task's identity (coreutils `env --chdir`).
const ENV: &str = "/usr/bin/env";

/// Tells executions' cgroups apart (with the agent's pid) under one agent root.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Runs each execution as a `bash -c` process in its own process group, so cancel, the
/// time limit and the end of the main process reach every process the task started.
/// With a cgroup hierarchy ([`ProcessExecutor::with_cgroups`]) each execution also gets
/// a cgroup of its own: the placement's CPU and memory limits and a pids limit apply,
/// and the kill reaches processes that left the process group (`setsid`).
#[derive(Debug, Clone)]
pub struct ProcessExecutor {
    cgroups: Arc<dyn Cgroups>,
    pids_max: u64,
    /// The program that readies an execution and becomes it (see `launcher.rs`); without
    /// one, the steps are a chain of `sh`, the private /tmp helper, `setpriv`, `env` and
    /// `bash` (for embedders that have no launcher binary).
    launcher: Option<PathBuf>,
}

impl Default for ProcessExecutor {
    fn default() -> Self {
        ProcessExecutor::new()
    }
}

impl ProcessExecutor {
    /// Process groups only, no cgroups.
    pub fn new() -> Self {
        ProcessExecutor {
            cgroups: Arc::new(NoCgroups),
            pids_max: DEFAULT_PIDS_MAX,
            launcher: None,
        }
    }

    /// Each execution in a cgroup of its own under `cgroups`.
    pub fn with_cgroups(cgroups: Arc<dyn Cgroups>) -> Self {
        ProcessExecutor {
            cgroups,
            pids_max: DEFAULT_PIDS_MAX,
            launcher: None,
        }
    }

    /// Start executions that have steps to take as root (cgroup join, private /tmp,
    /// identity switch) through `launcher`, a program that runs
    /// [`crate::launcher::main`] as its [`crate::launcher::LAUNCH_SUBCOMMAND`] (the
    /// agent's own binary, `taccd`): one `exec` before the task's instead of four, and a
    /// run line that is a plain command runs without `bash`.
    pub fn with_launcher(mut self, launcher: impl Into<PathBuf>) -> Self {
        self.launcher = Some(launcher.into());
        self
    }

    /// The pids limit of each execution's cgroup (default [`DEFAULT_PIDS_MAX`]).
    pub fn with_pids_max(mut self, pids_max: u64) -> Self {
        self.pids_max = pids_max;
        self
    }

    /// The cgroup hierarchy executions run under (`none` when they get no cgroup).
    pub fn cgroups(&self) -> &Arc<dyn Cgroups> {
        &self.cgroups
    }
}

/// A cgroup name from an execution's label: letters, digits, `-`, `_` and `.` only.
fn cgroup_name(label: &str) -> String {
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let clean = clean.trim_start_matches('.');
    format!(
        "{clean}-{}-{}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    )
}

#[async_trait::async_trait]
impl Executor for ProcessExecutor {
    fn kind(&self) -> crate::RuntimeKind {
        crate::RuntimeKind::Process
    }

    fn honours_run_as(&self) -> bool {
        true
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError> {
        spec.require_workdir()?;
        let cgroup = self.cgroups.create(
            &cgroup_name(&spec.label),
            &Limits {
                cpu_millis: spec.placement.cpu_millis,
                memory_bytes: spec.placement.memory_bytes,
                pids_max: self.pids_max,
            },
        )?;
        // Checked here to fail the launch cleanly; entering the directory as the task's
        // identity (after the switch) is what enforces it.
        if let Some(run_as) = spec.placement.run_as {
            if let Err(source) = crate::enterable::identity_can_enter(&spec.workdir, run_as) {
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.remove();
                }
                return Err(ExecError::Spawn {
                    program: BASH.into(),
                    workdir: spec.workdir.display().to_string(),
                    source,
                });
            }
        }
        let joins = cgroup.is_some();
        let starts_as_root =
            joins || spec.placement.private_tmp.is_some() || spec.placement.run_as.is_some();
        let (program, mut command) = match &self.launcher {
            Some(launcher) if starts_as_root => launched(launcher, &spec, joins),
            _ => chained(&spec, joins, starts_as_root),
        };
        command
            .stdin(if joins { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(source) => {
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.remove();
                }
                return Err(ExecError::Spawn {
                    program,
                    workdir: spec.workdir.display().to_string(),
                    source,
                });
            }
        };
        let pid = child.id();
        if let Some(cgroup) = &cgroup {
            if let Err(error) = join(&mut child, cgroup.as_ref()).await {
                let _ = child.kill().await;
                let _ = cgroup.remove();
                return Err(error);
            }
        }
        let readers = [
            child
                .stdout
                .take()
                .map(|out| spawn_reader(out, Stream::Stdout, &output)),
            child
                .stderr
                .take()
                .map(|err| spawn_reader(err, Stream::Stderr, &output)),
        ];
        let (cancel, exit_tx, exit_rx) = handle_parts();
        let token = cancel.clone();
        let memory_bytes = spec.placement.memory_bytes;
        let cgroup: Option<Arc<dyn Cgroup>> = cgroup.map(Arc::from);
        let usage = cgroup.clone().map(UsageReader::new);
        let resizer = cgroup.clone().map(|cgroup| {
            Arc::new(crate::resize::CgroupResizer(cgroup)) as Arc<dyn crate::resize::Resizer>
        });
        let entry = pid.map(|pid| crate::enter::Entry {
            pid,
            cgroup: cgroup.clone(),
            workdir: spec.workdir.clone(),
            env: spec.env.clone(),
            run_as: spec.placement.run_as,
            private_mounts: spec.placement.private_tmp.is_some(),
            via: crate::enter::Via::Host,
        });
        tokio::spawn(async move {
            let group = pid.map(|p| Pid::from_raw(p as i32));
            let time_limit = async {
                match spec.time_limit {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let mut hard = KillReport::default();
            let mut outcome = tokio::select! {
                status = child.wait() => status.map(outcome_of).unwrap_or(ExitOutcome::Signalled(9)),
                _ = token.cancelled() => {
                    hard = terminate(&mut child, group, cgroup.as_ref(), spec.stop_signal, spec.kill_grace).await;
                    ExitOutcome::Cancelled
                }
                _ = time_limit => {
                    hard = terminate(&mut child, group, cgroup.as_ref(), spec.stop_signal, spec.kill_grace).await;
                    ExitOutcome::TimeLimit
                }
            };
            // The main process is gone; whatever it left behind in its group (and its
            // cgroup, where it has one: `setsid` does not leave that) goes too.
            if let Some(group) = group {
                let _ = killpg(group, Signal::SIGKILL);
            }
            if let Some(cgroup) = &cgroup {
                let last = kill_cgroup(cgroup).await;
                hard.killed.extend(last.killed);
                hard.empty = last.empty;
                if matches!(outcome, ExitOutcome::Exited(code) if code != 0)
                    || matches!(outcome, ExitOutcome::Signalled(_))
                {
                    let kills = cgroup.oom_kills();
                    if kills > 0 {
                        outcome = out_of_memory(kills, memory_bytes);
                    }
                }
            }
            for (reader, waiting) in readers.into_iter().flatten() {
                drain(reader, &waiting).await;
            }
            if let Some(cgroup) = &cgroup {
                // Checked: the cgroup is empty after the kill, else it is said.
                let mut notes = Vec::new();
                if !hard.killed.is_empty() {
                    notes.push(format!("tacc: killed {}", hard.describe()));
                }
                if !hard.empty {
                    notes.push(format!(
                        "tacc: processes remain in {} after the kill: {:?}",
                        cgroup.path().display(),
                        cgroup.procs()
                    ));
                }
                for text in notes {
                    tracing::info!("{}: {text}", spec.label);
                    let _ = output
                        .send(OutputLine {
                            stream: Stream::Stderr,
                            text,
                            partial: false,
                        })
                        .await;
                }
                if hard.empty {
                    if let Err(error) = cgroup.remove() {
                        tracing::warn!("{}: {error}", spec.label);
                    }
                }
            }
            drop(output);
            let _ = exit_tx.send(outcome);
        });
        Ok(ExecutionHandle::new(pid, cancel, exit_rx)
            .with_usage(usage)
            .with_resizer(resizer)
            .with_entry(entry))
    }
}

/// The execution through the launcher (see `launcher.rs`): the launcher's steps, then
/// the run line itself where it is a plain command (`run_line.rs`), else `bash -c`. The
/// launcher runs as root with what the task chose for the loader and the shell renamed
/// (`held_env`); it puts them back itself, after the identity switch.
fn launched(launcher: &Path, spec: &LaunchSpec, joins: bool) -> (String, Command) {
    let direct = crate::run_line::direct_words(&spec.script);
    let steps = crate::launcher::Steps {
        join: joins,
        private_tmp: spec
            .placement
            .private_tmp
            .as_ref()
            .map(|p| crate::launcher::TmpDirs {
                tmp: p.tmp.clone(),
                shm: p.shm.clone(),
                keep: p.keep.clone(),
            }),
        run_as: spec.placement.run_as,
        workdir: spec.workdir.clone(),
        direct: direct.is_some(),
        command: match direct {
            Some(words) => words.into_iter().map(Into::into).collect(),
            None => [BASH, "-c", &spec.script, &spec.label]
                .map(Into::into)
                .into(),
        },
    };
    let (env, _) = crate::held_env::hold_back(&spec.env);
    let mut command = Command::new(launcher);
    command
        .arg(crate::launcher::LAUNCH_SUBCOMMAND)
        .args(steps.args())
        .current_dir("/")
        .env_clear()
        .envs(&env);
    (launcher.display().to_string(), command)
}

/// The execution as a chain of programs, each `exec`ing the next: the join script where
/// it has a cgroup, the private /tmp helper, `setpriv` and `env --chdir` where it has an
/// identity, then `bash -c`. For an executor without a launcher.
fn chained(spec: &LaunchSpec, joins: bool, starts_as_root: bool) -> (String, Command) {
    let mut argv: Vec<String> = Vec::new();
    if joins {
        argv.extend(["/bin/sh", "-c", JOIN_SCRIPT, "tacc-join"].map(String::from));
    }
    // After the join (the namespace steps run in the cgroup), before the switch
    // (mounting needs root).
    if let Some(private) = &spec.placement.private_tmp {
        argv.extend(private.argv());
    }
    if let Some(run_as) = spec.placement.run_as {
        argv.extend([
            SETPRIV.to_string(),
            format!("--reuid={}", run_as.uid),
            format!("--regid={}", run_as.gid),
            "--clear-groups".to_string(),
            "--".to_string(),
            ENV.to_string(),
            format!("--chdir={}", spec.workdir.display()),
            "--".to_string(),
        ]);
    }
    argv.push(BASH.to_string());
    // Steps before the switch run as root: what the task chose for the loader or the
    // shell travels renamed and is put back by its own shell (see `held_env`).
    let (env, script) = match crate::held_env::hold_back(&spec.env) {
        (env, true) if starts_as_root => {
            (env, format!("{}{}", crate::held_env::RESTORE, spec.script))
        }
        _ => (spec.env.clone(), spec.script.clone()),
    };
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .arg("-c")
        .arg(&script)
        .arg(&spec.label)
        .current_dir(if spec.placement.run_as.is_some() {
            Path::new("/")
        } else {
            spec.workdir.as_path()
        })
        .env_clear()
        .envs(&env);
    (argv[0].clone(), command)
}

/// Put the freshly spawned wrapper (see [`JOIN_SCRIPT`]) into its cgroup, then let it
/// `exec` the task.
async fn join(child: &mut Child, cgroup: &dyn Cgroup) -> Result<(), ExecError> {
    let pid = child.id().ok_or_else(|| ExecError::Cgroup {
        action: "join",
        path: cgroup.path().display().to_string(),
        detail: "the process ended before it joined".into(),
    })?;
    cgroup.join(pid)?;
    let mut stdin = child.stdin.take().ok_or_else(|| ExecError::Cgroup {
        action: "join",
        path: cgroup.path().display().to_string(),
        detail: "no pipe to the process".into(),
    })?;
    // A failed write means the wrapper already died; its exit status tells the rest.
    let _ = stdin.write_all(b"go\n").await;
    drop(stdin);
    Ok(())
}

/// The outcome of an execution the kernel's OOM killer hit.
fn out_of_memory(kills: u64, memory_bytes: u64) -> ExitOutcome {
    let limit = if memory_bytes > 0 {
        format!("its memory limit of {} MiB", memory_bytes.div_ceil(1 << 20))
    } else {
        "the memory it could get".to_string()
    };
    let noun = if kills == 1 { "process" } else { "processes" };
    ExitOutcome::Infrastructure {
        reason: "out_of_memory".into(),
        message: format!(
            "the kernel killed {kills} {noun} of the task for using more than {limit}"
        ),
    }
}

/// Kill what is left in a cgroup. The first look (`kill_all` with no time to wait: its
/// process lists read once) is taken here: found empty — every short task's end — that is
/// the whole kill, and a job on a blocking thread (a thread hand-off each way) is spared.
/// Only where something is left does the kill loop, with its short sleeps, run off the
/// runtime.
async fn kill_cgroup(cgroup: &Arc<dyn Cgroup>) -> KillReport {
    let first = cgroup.kill_all(Duration::ZERO);
    if first.empty {
        return first;
    }
    let cgroup = cgroup.clone();
    let mut report = tokio::task::spawn_blocking(move || cgroup.kill_all(KILL_DEADLINE))
        .await
        .unwrap_or_default();
    for killed in first.killed {
        if !report.killed.iter().any(|(pid, _)| *pid == killed.0) {
            report.killed.push(killed);
        }
    }
    report
}

fn outcome_of(status: ExitStatus) -> ExitOutcome {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitOutcome::Exited(code),
        (None, Some(signal)) => ExitOutcome::Signalled(signal),
        (None, None) => ExitOutcome::Signalled(0),
    }
}

/// The stop signal (SIGTERM or the task's checkpoint signal) to the whole group (and
/// every process of the cgroup), then SIGKILL once the grace period is over; says what
/// it had to kill hard.
async fn terminate(
    child: &mut Child,
    group: Option<Pid>,
    cgroup: Option<&Arc<dyn Cgroup>>,
    signal: Signal,
    grace: Duration,
) -> KillReport {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
    if let Some(cgroup) = cgroup {
        cgroup.signal_all(signal);
    }
    let mut report = KillReport {
        empty: true,
        ..KillReport::default()
    };
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        match cgroup {
            Some(cgroup) => report = kill_cgroup(cgroup).await,
            None => {
                if let Some(group) = group {
                    let _ = killpg(group, Signal::SIGKILL);
                }
            }
        }
        let _ = child.wait().await;
    }
    report
}

/// Since when a reader has been waiting for its pipe (not for the output's reader).
#[derive(Debug, Clone)]
struct PipeWait {
    origin: Instant,
    /// Milliseconds after `origin` plus one when the current wait began; 0 when not waiting.
    since: Arc<AtomicU64>,
}

impl PipeWait {
    fn new() -> PipeWait {
        PipeWait {
            origin: Instant::now(),
            since: Arc::new(AtomicU64::new(0)),
        }
    }

    fn begin(&self) {
        let at = self.origin.elapsed().as_millis() as u64 + 1;
        self.since.store(at, Ordering::Relaxed);
    }

    fn end(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// How long the current wait for the pipe has lasted.
    fn waited(&self) -> Duration {
        match self.since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            at => self
                .origin
                .elapsed()
                .saturating_sub(Duration::from_millis(at - 1)),
        }
    }
}

/// Forward one pipe in a task of its own; with what tells how long it waited for the pipe.
fn spawn_reader(
    pipe: impl AsyncRead + Unpin + Send + 'static,
    stream: Stream,
    output: &OutputSender,
) -> (tokio::task::JoinHandle<()>, PipeWait) {
    let waiting = PipeWait::new();
    let reader = tokio::spawn(forward_lines(pipe, stream, output.clone(), waiting.clone()));
    (reader, waiting)
}

/// Let a reader deliver what its pipe holds; give it up once the pipe has been silent for
/// [`PIPE_DRAIN_LIMIT`].
async fn drain(mut reader: tokio::task::JoinHandle<()>, waiting: &PipeWait) {
    const LOOK_EVERY: Duration = Duration::from_millis(100);
    loop {
        if tokio::time::timeout(LOOK_EVERY, &mut reader).await.is_ok() {
            return;
        }
        if waiting.waited() >= PIPE_DRAIN_LIMIT {
            reader.abort();
            return;
        }
    }
}

/// Forward a pipe's output as lines, in pieces of at most [`crate::MAX_LINE_BYTES`]; while
/// `output` is full the pipe is not read, so the task's writes wait.
async fn forward_lines(
    mut pipe: impl AsyncRead + Unpin,
    stream: Stream,
    output: OutputSender,
    waiting: PipeWait,
) {
    let mut splitter = LineSplitter::new(stream);
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        waiting.begin();
        let read = pipe.read(&mut buffer).await;
        waiting.end();
        match read {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if !splitter.push(&buffer[..read], &output).await {
                    return;
                }
            }
        }
    }
    splitter.finish(&output).await;
}

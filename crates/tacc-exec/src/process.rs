use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::{
    ExecError, ExecutionHandle, Executor, ExitOutcome, LaunchSpec, OutputLine, Stream, handle_parts,
};

/// How long to wait for output pipes to drain after the process group is gone. A process
/// that escaped the group (with `setsid`) may hold a pipe open forever; we stop reading
/// rather than hang.
const PIPE_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Runs each execution as a `bash -c` process in its own process group, so cancel, the
/// time limit and the end of the main process reach every process the task started.
#[derive(Debug, Default, Clone)]
pub struct ProcessExecutor;

impl ProcessExecutor {
    pub fn new() -> Self {
        ProcessExecutor
    }
}

#[async_trait::async_trait]
impl Executor for ProcessExecutor {
    fn name(&self) -> &'static str {
        "process"
    }

    fn honours_run_as(&self) -> bool {
        true
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        output: mpsc::UnboundedSender<OutputLine>,
    ) -> Result<ExecutionHandle, ExecError> {
        if !spec.workdir.is_dir() {
            return Err(ExecError::MissingWorkdir(
                spec.workdir.display().to_string(),
            ));
        }
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(&spec.script)
            .arg(&spec.label)
            .current_dir(&spec.workdir)
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(run_as) = spec.placement.run_as {
            // std drops the supplementary groups (setgroups(0, NULL)) when a uid is set,
            // then calls setgid before setuid; the working directory is entered after
            // the switch, so it must be reachable by that identity.
            command.uid(run_as.uid).gid(run_as.gid);
        }
        let mut child = command.spawn().map_err(|source| ExecError::Spawn {
            program: "bash".into(),
            workdir: spec.workdir.display().to_string(),
            source,
        })?;
        let pid = child.id();
        let readers = [
            child
                .stdout
                .take()
                .map(|out| tokio::spawn(forward_lines(out, Stream::Stdout, output.clone()))),
            child
                .stderr
                .take()
                .map(|err| tokio::spawn(forward_lines(err, Stream::Stderr, output))),
        ];
        let (cancel, exit_tx, exit_rx) = handle_parts();
        let token = cancel.clone();
        tokio::spawn(async move {
            let group = pid.map(|p| Pid::from_raw(p as i32));
            let time_limit = async {
                match spec.time_limit {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                status = child.wait() => status.map(outcome_of).unwrap_or(ExitOutcome::Signalled(9)),
                _ = token.cancelled() => {
                    terminate(&mut child, group, spec.kill_grace).await;
                    ExitOutcome::Cancelled
                }
                _ = time_limit => {
                    terminate(&mut child, group, spec.kill_grace).await;
                    ExitOutcome::TimeLimit
                }
            };
            // The main process is gone; whatever it left behind in its group goes too.
            if let Some(group) = group {
                let _ = killpg(group, Signal::SIGKILL);
            }
            for reader in readers.into_iter().flatten() {
                let abort = reader.abort_handle();
                if tokio::time::timeout(PIPE_DRAIN_LIMIT, reader)
                    .await
                    .is_err()
                {
                    abort.abort();
                }
            }
            let _ = exit_tx.send(outcome);
        });
        Ok(ExecutionHandle::new(pid, cancel, exit_rx))
    }
}

fn outcome_of(status: ExitStatus) -> ExitOutcome {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitOutcome::Exited(code),
        (None, Some(signal)) => ExitOutcome::Signalled(signal),
        (None, None) => ExitOutcome::Signalled(0),
    }
}

/// SIGTERM to the whole group, then SIGKILL once the grace period is over.
async fn terminate(child: &mut Child, group: Option<Pid>, grace: Duration) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        if let Some(group) = group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = child.wait().await;
    }
}

async fn forward_lines(
    pipe: impl AsyncRead + Unpin,
    stream: Stream,
    output: mpsc::UnboundedSender<OutputLine>,
) {
    let mut reader = BufReader::new(pipe);
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        match reader.read_until(b'\n', &mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if buffer.last() == Some(&b'\n') {
                    buffer.pop();
                }
                let text = String::from_utf8_lossy(&buffer).into_owned();
                if output.send(OutputLine { stream, text }).is_err() {
                    break;
                }
            }
        }
    }
}

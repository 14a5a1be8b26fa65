use std::collections::BTreeMap;
use std::time::Duration;

use crate::{
    ExecError, ExecutionHandle, Executor, ExitOutcome, LaunchSpec, OutputLine, OutputSender,
    Stream, handle_parts,
};

/// A scripted stand-in for a real runtime, for tests of the layers above. It understands a
/// tiny subset of shell, one command per line: `echo WORDS` (with `$VAR` expansion and an
/// optional trailing `>&2`), `sleep SECONDS`, `exit CODE`, `true`, `false`. Anything else
/// fails like a missing command (exit 127). Cancel and time limits behave as for real
/// processes, without any process.
#[derive(Debug, Default, Clone)]
pub struct FakeExecutor;

impl FakeExecutor {
    pub fn new() -> Self {
        FakeExecutor
    }
}

#[async_trait::async_trait]
impl Executor for FakeExecutor {
    /// It stands in for the node's own process runtime; a fake is not a kind a task
    /// file may ask for.
    fn kind(&self) -> crate::RuntimeKind {
        crate::RuntimeKind::Process
    }

    /// Nothing runs, so any identity is "honoured".
    fn honours_run_as(&self) -> bool {
        true
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError> {
        spec.require_workdir()?;
        let (cancel, exit_tx, exit_rx) = handle_parts();
        let token = cancel.clone();
        tokio::spawn(async move {
            let time_limit = async {
                match spec.time_limit {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                code = interpret(&spec.script, &spec.env, &output) => ExitOutcome::Exited(code),
                _ = token.cancelled() => ExitOutcome::Cancelled,
                _ = time_limit => ExitOutcome::TimeLimit,
            };
            let _ = exit_tx.send(outcome);
        });
        Ok(ExecutionHandle::new(None, cancel, exit_rx))
    }
}

async fn interpret(script: &str, env: &BTreeMap<String, String>, output: &OutputSender) -> i32 {
    let mut last = 0;
    for line in script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        last = match command {
            "echo" => {
                let (text, stream) = match rest.strip_suffix(">&2") {
                    Some(text) => (text.trim_end(), Stream::Stderr),
                    None => (rest, Stream::Stdout),
                };
                let _ = output
                    .send(OutputLine {
                        stream,
                        text: expand(text, env),
                        partial: false,
                    })
                    .await;
                0
            }
            "sleep" => match rest.trim().parse::<f64>() {
                Ok(secs) if secs >= 0.0 => {
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    0
                }
                _ => 1,
            },
            "exit" => return rest.trim().parse().unwrap_or(2),
            "true" => 0,
            "false" => 1,
            other => {
                let _ = output
                    .send(OutputLine {
                        stream: Stream::Stderr,
                        text: format!("fake: {other}: command not found"),
                        partial: false,
                    })
                    .await;
                127
            }
        };
    }
    last
}

fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut result = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        result.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        result.push_str(env.get(&after[..end]).map(String::as_str).unwrap_or(""));
        rest = &after[end..];
    }
    result.push_str(rest);
    result
}

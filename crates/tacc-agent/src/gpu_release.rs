//! After an attempt's processes are stopped, make sure none of them still holds one of its
//! GPUs: the next task placed on the GPU must find it free. A holder is the attempt's when
//! its environment names the attempt (`TACC_TASK_ID`, `TACC_ATTEMPT`, which the platform
//! sets and a task cannot replace); such a process is killed and named in the task's log.
//! Holders that are not the attempt's are only named: they are someone else's business.

use std::collections::BTreeMap;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tacc_proto::AttemptRef;

use crate::gpus::GpuProbe;

/// Kill what of `attempt` still holds one of `gpus`; the lines to add to the task's log.
pub(crate) fn release(probe: &dyn GpuProbe, attempt: AttemptRef, gpus: &[u32]) -> Vec<String> {
    if gpus.is_empty() {
        return Vec::new();
    }
    let mut lines = Vec::new();
    for (gpu, pid) in probe.holders(gpus) {
        let Some(env) = environment_of(pid) else {
            continue; // gone meanwhile
        };
        let ours = env.get("TACC_TASK_ID") == Some(&attempt.task.to_string())
            && env.get("TACC_ATTEMPT") == Some(&attempt.attempt.to_string());
        let name = command_of(pid);
        if ours {
            let killed = kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok();
            lines.push(format!(
                "tacc: process {pid} ({name}) still held GPU {gpu} after the attempt ended; {}\n",
                if killed {
                    "killed it"
                } else {
                    "could not kill it"
                }
            ));
        } else {
            tracing::warn!(
                "GPU {gpu} of task {} attempt {} is held by process {pid} ({name}), which is not \
                 the attempt's",
                attempt.task,
                attempt.attempt
            );
        }
    }
    lines
}

/// The environment of process `pid`, `None` when it is gone or unreadable.
fn environment_of(pid: u32) -> Option<BTreeMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter_map(|pair| {
                let text = String::from_utf8_lossy(pair);
                let (key, value) = text.split_once('=')?;
                Some((key.to_string(), value.to_string()))
            })
            .collect(),
    )
}

fn command_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use tacc_core::{AttemptNo, TaskId};

    use super::*;
    use crate::gpus::FakeGpus;

    fn holder(task: &str, attempt: &str) -> std::process::Child {
        Command::new("sleep")
            .arg("300")
            .env_clear()
            .env("TACC_TASK_ID", task)
            .env("TACC_ATTEMPT", attempt)
            .spawn()
            .unwrap()
    }

    fn ended(child: &mut std::process::Child) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    #[test]
    fn a_process_of_the_attempt_still_holding_its_gpu_is_killed_and_named() {
        let attempt = AttemptRef {
            task: TaskId(41),
            attempt: AttemptNo(2),
        };
        let mut ours = holder("41", "2");
        let mut earlier_attempt = holder("41", "1");
        let probe = FakeGpus::new(2, Some("A100".into()));
        probe.set_holder(1, ours.id());
        probe.set_holder(1, earlier_attempt.id());
        // A GPU the attempt was not given is not looked at.
        probe.set_holder(0, earlier_attempt.id());

        let lines = release(&probe, attempt, &[1]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains(&format!("process {} (sleep) still held GPU 1", ours.id()))
                && lines[0].contains("killed it"),
            "{lines:?}"
        );
        assert!(ended(&mut ours));
        assert!(
            earlier_attempt.try_wait().unwrap().is_none(),
            "not ours: left alone"
        );
        earlier_attempt.kill().unwrap();
        earlier_attempt.wait().unwrap();
    }

    #[test]
    fn an_attempt_without_gpus_or_holders_has_nothing_to_release() {
        let attempt = AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        };
        let probe = FakeGpus::new(2, None);
        assert!(release(&probe, attempt, &[]).is_empty());
        assert!(release(&probe, attempt, &[0, 1]).is_empty());
    }
}

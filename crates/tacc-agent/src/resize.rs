//! Live re-allocation on the node: the server's desired work carries the per-node CPU
//! and memory in force for each running attempt (`Assignment::allocation`, level-
//! triggered like the rest of it); where that differs from what the agent last applied,
//! every execution of the attempt gets its share (split as at start: each of a node's
//! processes an equal part) through the runtime's [`Resizer`] — the process runtime
//! rewrites its cgroups, the container runtime calls Docker's update API — and the
//! outcome is reported once (`AgentReport::Resized`). A failed change is reported, not
//! retried: the same allocation is never asked of the runtime twice.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tacc_core::Resources;
use tacc_exec::resize::Resizer;
use tacc_proto::{AgentReport, AttemptRef};

use crate::Shared;
use crate::attempt::share_of;

#[derive(Debug, Default)]
pub(crate) struct Resizing {
    attempts: Mutex<BTreeMap<AttemptRef, Live>>,
}

#[derive(Debug)]
struct Live {
    processes: u32,
    /// The running executions' resizers, by launch name.
    resizers: BTreeMap<String, Arc<dyn Resizer>>,
    /// The allocation the server wants, once it differs from the start.
    target: Option<Resources>,
    /// The last allocation asked of the runtime (applied or refused).
    asked: Option<Resources>,
}

impl Resizing {
    /// An attempt started with `processes` processes per node.
    pub fn begin(&self, attempt: AttemptRef, processes: u32) {
        self.attempts.lock().unwrap().insert(
            attempt,
            Live {
                processes,
                resizers: BTreeMap::new(),
                target: None,
                asked: None,
            },
        );
    }

    pub fn end(&self, attempt: AttemptRef) {
        self.attempts.lock().unwrap().remove(&attempt);
    }

    /// Execution `name` of the attempt started. One that starts after a change (the run
    /// after a setup, a process started late) gets the allocation in force at once.
    pub fn attach(self: &Arc<Self>, attempt: AttemptRef, name: &str, resizer: Arc<dyn Resizer>) {
        let mut attempts = self.attempts.lock().unwrap();
        let Some(live) = attempts.get_mut(&attempt) else {
            return;
        };
        live.resizers.insert(name.to_string(), resizer.clone());
        if let Some(target) = live.asked {
            let processes = live.processes;
            tokio::spawn(async move {
                let _ = resizer
                    .resize(
                        share_of(target.cpu_millis, processes),
                        share_of(target.memory_bytes, processes),
                    )
                    .await;
            });
        }
    }

    pub fn detach(&self, attempt: AttemptRef, name: &str) {
        if let Some(live) = self.attempts.lock().unwrap().get_mut(&attempt) {
            live.resizers.remove(name);
        }
    }

    /// The desired allocation of a running attempt, from a work poll: applied (in the
    /// background) when it is new and the attempt has executions to apply it to.
    pub fn want(shared: &Arc<Shared>, attempt: AttemptRef, target: Resources) {
        let (resizers, processes) = {
            let mut attempts = shared.resizing.attempts.lock().unwrap();
            let Some(live) = attempts.get_mut(&attempt) else {
                return;
            };
            live.target = Some(target);
            if live.asked == Some(target) || live.resizers.is_empty() {
                // Nothing to run it on yet: asked again at the next poll.
                return;
            }
            live.asked = Some(target);
            let resizers: Vec<Arc<dyn Resizer>> = live.resizers.values().cloned().collect();
            (resizers, live.processes)
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let cpu = share_of(target.cpu_millis, processes);
            let memory = share_of(target.memory_bytes, processes);
            let mut errors = Vec::new();
            for resizer in resizers {
                if let Err(error) = resizer.resize(cpu, memory).await {
                    errors.push(error.to_string());
                }
            }
            let error = (!errors.is_empty()).then(|| errors.join("; "));
            match &error {
                Some(error) => tracing::warn!(
                    "task {} attempt {}: cannot apply the new allocation: {error}",
                    attempt.task,
                    attempt.attempt
                ),
                None => tracing::info!(
                    "task {} attempt {}: now {} CPUs (thousandths), {} bytes",
                    attempt.task,
                    attempt.attempt,
                    target.cpu_millis,
                    target.memory_bytes
                ),
            }
            crate::attempt::report(
                &shared,
                AgentReport::Resized {
                    attempt,
                    cpu_millis: target.cpu_millis,
                    memory_bytes: target.memory_bytes,
                    error,
                },
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};
    use tacc_exec::ExecError;

    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(u64, u64)>>);

    #[async_trait::async_trait]
    impl Resizer for Recorder {
        async fn resize(&self, cpu: u64, memory: u64) -> Result<(), ExecError> {
            self.0.lock().unwrap().push((cpu, memory));
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_late_execution_gets_the_allocation_in_force_split_by_processes() {
        let resizing = Arc::new(Resizing::default());
        let attempt = AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        };
        resizing.begin(attempt, 2);
        resizing
            .attempts
            .lock()
            .unwrap()
            .get_mut(&attempt)
            .unwrap()
            .asked = Some(Resources::new(4000, 8 << 30, 0));
        let recorder = Arc::new(Recorder::default());
        resizing.attach(attempt, "p0", recorder.clone());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while recorder.0.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never applied");
            tokio::task::yield_now().await;
        }
        assert_eq!(recorder.0.lock().unwrap()[0], (2000, 4 << 30));
    }
}

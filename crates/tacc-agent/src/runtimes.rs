//! The runtimes this node offers and the choice among them for one attempt: the node's
//! primary executor (process, or Slurm on a login node) always, the container runtime
//! when the agent was given a Docker engine. The decision itself is
//! [`tacc_exec::runtime::choose_runtime`]; this module only gathers what it looks at.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tacc_compiler::Instruction;
use tacc_exec::runtime::{RuntimeChoice, RuntimeKind, RuntimeQuestion, choose_runtime};
use tacc_exec::{DockerExecutor, Executor, ExitOutcome, LaunchSpec};
use tacc_proto::{AgentReport, AttemptRef};
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::attempt::{AttemptError, LogLines, report};

/// The labels a node registers with: the configured ones, and one
/// `tacc.io/runtime.<kind>=true` for each runtime it offers (its primary executor, and
/// the container runtime when it has a Docker engine). The server selects on them for
/// tasks that ask for a runtime, so they say only what this agent can really start.
pub(crate) fn registration_labels(shared: &Shared) -> BTreeMap<String, String> {
    let mut labels = shared.config.labels.clone();
    let mut offered = BTreeSet::from([shared.executor.kind()]);
    if shared.container.is_some() {
        offered.insert(RuntimeKind::Container);
    }
    for kind in offered {
        labels.insert(
            kind.label().to_string(),
            tacc_core::labels::OFFERED.to_string(),
        );
    }
    labels
}

/// The executor that runs `runtime` on this node.
pub(crate) fn executor(shared: &Shared, runtime: RuntimeKind) -> Arc<dyn Executor> {
    match (&shared.container, runtime) {
        (Some(docker), RuntimeKind::Container)
            if shared.executor.kind() != RuntimeKind::Container =>
        {
            docker.clone() as Arc<dyn Executor>
        }
        _ => shared.executor.clone(),
    }
}

/// Choose the runtime for an attempt; `failed` holds runtimes that already failed to
/// launch it for an infrastructure reason. `Err` says why no runtime here can run it.
pub(crate) async fn choose(
    shared: &Shared,
    instruction: &Instruction,
    failed: &BTreeMap<RuntimeKind, String>,
) -> Result<RuntimeChoice, String> {
    let mut offered = BTreeSet::from([shared.executor.kind()]);
    let mut unavailable = BTreeMap::new();
    let container: Option<&Arc<DockerExecutor>> = shared.container.as_ref();
    let preference = instruction.runtime;
    if let Some(docker) = container {
        offered.insert(RuntimeKind::Container);
        // Only asked when a container could be chosen: a plain process task never waits
        // on the engine.
        let could_use_container = instruction.image.is_some()
            || docker.default_image().is_some()
            || preference == Some(RuntimeKind::Container);
        if could_use_container && let Err(why) = docker.ping().await {
            unavailable.insert(RuntimeKind::Container, why.to_string());
        }
    }
    let question = RuntimeQuestion {
        preference,
        has_image: instruction.image.is_some(),
        isolate_by_default: container.is_some_and(|d| d.default_image().is_some()),
        num_nodes: instruction.num_nodes,
        // The scheduler already placed the attempt on this node's cluster: Slurm versus
        // local is decided there (a Slurm agent offers Slurm alone), so every gang fits.
        local_machines: instruction.num_nodes,
        expected_duration: instruction
            .time_limit_secs
            .map(std::time::Duration::from_secs),
        offered,
        unavailable,
        failed: failed.clone(),
    };
    choose_runtime(&question)
}

/// Tell the user which runtime runs the attempt: a log line when it is a switch, and the
/// task's reason (`tcloud show`) when it is not simply the node's default runtime. The
/// default case says nothing: it would cost a store write for every task.
pub(crate) fn announce(shared: &Shared, attempt: AttemptRef, choice: &RuntimeChoice) {
    if !choice.switched && choice.runtime == shared.executor.kind() {
        return;
    }
    if choice.switched {
        report(
            shared,
            AgentReport::Log {
                attempt,
                text: format!("tacc: {}\n", choice.why),
                offset: None,
            },
        );
    }
    report(
        shared,
        AgentReport::RuntimeChosen {
            attempt,
            runtime: choice.runtime.as_str().to_string(),
            why: choice.why.clone(),
        },
    );
}

/// The runtime an attempt's scripts run on: [`crate::attempt::launch`] on the chosen
/// runtime, and when that runtime fails for an infrastructure reason (not the task's),
/// the next eligible one, said to the user (fail-safe switching).
pub(crate) struct Failover<'a> {
    shared: &'a Arc<Shared>,
    instruction: &'a Instruction,
    attempt: AttemptRef,
    cancel: &'a CancellationToken,
    /// The runtime chosen now.
    pub choice: RuntimeChoice,
    /// Runtimes that failed to launch this attempt for an infrastructure reason, with why.
    failed: BTreeMap<RuntimeKind, String>,
}

impl<'a> Failover<'a> {
    /// The first choice; `Err` says why no runtime here can run the attempt.
    pub async fn choose(
        shared: &'a Arc<Shared>,
        instruction: &'a Instruction,
        attempt: AttemptRef,
        cancel: &'a CancellationToken,
    ) -> Result<Failover<'a>, String> {
        let failed = BTreeMap::new();
        let choice = choose(shared, instruction, &failed).await?;
        Ok(Failover {
            shared,
            instruction,
            attempt,
            cancel,
            choice,
            failed,
        })
    }

    /// Run one script to its end on the chosen runtime, switching runtimes as needed.
    pub async fn launch(
        &mut self,
        spec: LaunchSpec,
        lines: LogLines,
        record_name: &str,
    ) -> Result<ExitOutcome, AttemptError> {
        let shared = self.shared;
        loop {
            let executor = executor(shared, self.choice.runtime);
            let launched = crate::attempt::launch(
                shared,
                executor.as_ref(),
                spec.clone(),
                self.attempt,
                lines.clone(),
                self.cancel,
                record_name,
            )
            .await;
            let error = match launched {
                Ok(outcome) => return Ok(outcome),
                Err(error) if !error.is_infrastructure() => {
                    return Err(AttemptError::Launch(error));
                }
                Err(error) => error,
            };
            self.failed.insert(self.choice.runtime, error.to_string());
            match choose(shared, self.instruction, &self.failed).await {
                Ok(next) => {
                    self.choice = next;
                    announce(shared, self.attempt, &self.choice);
                }
                Err(message) => {
                    return Err(AttemptError::NoRuntimeLeft {
                        cause: error,
                        message,
                    });
                }
            }
        }
    }
}

//! `tacc-exec`: layer 4 of TACC, the execution layer. An [`Executor`] takes a
//! [`LaunchSpec`] (a script, its working directory, environment, GPUs and time limit, and
//! typed: whose it is — [`Owner`] — and which [`Phase`]) and runs it, streaming output
//! lines back and reporting how it ended. Backends read the typed fields, never the
//! platform variables of the environment, which are the task's.
//!
//! Backends: [`ProcessExecutor`] (a local process group: the embedded default),
//! [`DockerExecutor`] (a Docker container per execution, through the Engine API),
//! [`SlurmExecutor`] (one Slurm batch job per attempt, from an agent on a login node; see
//! [`slurm`]) and [`FakeExecutor`] (scripted, for tests of the agent above).
//! Each says its [`RuntimeKind`] ([`Executor::kind`]);
//! [`runtime::choose_runtime`] decides which runtime a task gets. One contract suite
//! ([`contract`]) runs against every backend. This crate knows nothing of the server,
//! the store or the wire protocol; it depends on `tacc-core` only.

mod docker;
mod enterable;
mod fake;
mod held_env;
mod lines;
mod private_tmp;
mod process;
mod run_line;

pub mod cgroups;
pub mod contract;
pub mod enter;
pub mod launcher;
pub mod resize;
pub mod runtime;
pub mod slurm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use docker::{DockerExecutor, LABEL_OWNER};
pub use fake::FakeExecutor;
pub use lines::MAX_LINE_BYTES;
pub use private_tmp::{PRIVATE_TMP_SUBCOMMAND, PrivateTmp, enter_private_tmp, probe_private_tmp};
pub use process::ProcessExecutor;
pub use slurm::{SlurmBackend, SlurmConfig, SlurmExecutor};
pub use tacc_core::RuntimeKind;
use tacc_core::{AttemptNo, Priority, TaskId, UserName};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Everything needed to start one node's share of a task attempt.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Human-readable label for logs, e.g. `tacc-12-1-r0`.
    pub label: String,
    /// Whose execution this is, and its place in the attempt.
    pub owner: Owner,
    pub phase: Phase,
    pub workdir: PathBuf,
    /// A bash script; it runs with `set -e` semantics left to the script itself.
    pub script: String,
    /// The complete environment of the process (nothing is inherited implicitly).
    pub env: BTreeMap<String, String>,
    pub time_limit: Option<Duration>,
    /// How long to wait after `stop_signal` before SIGKILL on cancel (preemption is a
    /// cancel) or time limit.
    pub kill_grace: Duration,
    /// The signal that asks the execution to stop: SIGTERM, or the task's
    /// `checkpoint.signal`, so it can write a checkpoint within `kill_grace`.
    pub stop_signal: nix::sys::signal::Signal,
    /// What a runtime that isolates the execution (a container) needs to know, and the
    /// identity every runtime that [honours it](Executor::honours_run_as) runs it as.
    pub placement: Placement,
}

impl LaunchSpec {
    /// Every runtime refuses a missing working directory: the task must never run in
    /// another (or, as Docker would make of a missing bind source, an empty) directory
    /// instead of its code.
    pub(crate) fn require_workdir(&self) -> Result<(), ExecError> {
        if self.workdir.is_dir() {
            Ok(())
        } else {
            Err(ExecError::MissingWorkdir(
                self.workdir.display().to_string(),
            ))
        }
    }
}

/// The attempt an execution belongs to, its place in the attempt's gang, and the user it
/// runs for: what a backend that schedules work itself (Slurm: one job per gang, an
/// account per user, a QoS per priority) or labels it (containers) needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub task: TaskId,
    /// The task's name, as the task file gave it.
    pub task_name: String,
    pub attempt: AttemptNo,
    /// This node's rank among the attempt's `num_nodes`.
    pub node_rank: u32,
    pub num_nodes: u32,
    /// Which of this node's processes (0 when the node starts one).
    pub local_rank: u32,
    /// The process's rank among all processes of the attempt (`RANK`).
    pub rank: u32,
    pub user: UserName,
    pub priority: Priority,
}

/// Which of a task's scripts an execution runs: `setup` once per node, then `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Setup,
    Run,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Run => "run",
        }
    }
}

/// The Unix identity an execution runs as (defined beside the launcher, which switches
/// to it).
pub use tacc_launch::RunAs;

/// The image, resource limits and GPUs of one execution, for runtimes that enforce them
/// themselves (a container gets exactly these; a Slurm job asks for them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Container image; `None` takes the runtime's default image, if it has one.
    pub image: Option<String>,
    /// CPU limit in thousandths of a CPU; 0 is no limit.
    pub cpu_millis: u64,
    /// Memory limit; 0 is no limit.
    pub memory_bytes: u64,
    /// Indices of the GPUs the task was given on this node.
    pub gpu_indices: Vec<u32>,
    /// Paths outside the working directory the task must see at the same path (its user
    /// directory, dataset and environment caches), and whether it may write to them.
    pub extra_mounts: Vec<(PathBuf, bool)>,
    /// Who the execution runs as; `None` is the agent's own identity.
    pub run_as: Option<RunAs>,
    /// What the process runtime mounts on `/tmp` and `/dev/shm` in a mount namespace of
    /// the execution's own; `None` leaves the host's. A container has its own anyway.
    pub private_tmp: Option<PrivateTmp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of output (without its trailing newline), or one piece of a line longer
/// than [`MAX_LINE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLine {
    pub stream: Stream,
    pub text: String,
    /// The line goes on in the next `OutputLine` of the same stream: `text` is a piece
    /// of a line longer than [`MAX_LINE_BYTES`].
    pub partial: bool,
}

/// Lines of output in flight from an execution to its reader at most: a reader that
/// falls behind holds the execution back (its pipe fills and its writes wait) instead of
/// buffering without bound. With pieces of at most [`MAX_LINE_BYTES`] that is 16 MiB.
pub const OUTPUT_BUFFER_LINES: usize = 256;

/// Where an execution sends its output lines (bounded: see [`OUTPUT_BUFFER_LINES`]).
pub type OutputSender = mpsc::Sender<OutputLine>;
/// Where the reader of an execution's output takes them from.
pub type OutputReceiver = mpsc::Receiver<OutputLine>;

/// A channel for one execution's output.
pub fn output_channel() -> (OutputSender, OutputReceiver) {
    mpsc::channel(OUTPUT_BUFFER_LINES)
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    Exited(i32),
    Signalled(i32),
    TimeLimit,
    Cancelled,
    /// Ended for a reason outside the task (a node failed, the job was preempted, ran
    /// out of memory, or could not be started): a snake_case reason and a message.
    Infrastructure {
        reason: String,
        message: String,
    },
}

/// A running execution. Dropping it does not stop the process; call [`cancel`].
///
/// [`cancel`]: ExecutionHandle::cancel
#[derive(Debug)]
pub struct ExecutionHandle {
    /// Process id of the group leader (the group id too), when the backend has one.
    pub pid: Option<u32>,
    cancel: CancellationToken,
    exit: oneshot::Receiver<ExitOutcome>,
    /// Reads the execution's cgroup, where it has one (the process runtime with cgroups).
    usage: Option<cgroups::UsageReader>,
    /// Changes its limits while it runs, where the runtime can.
    resizer: Option<Arc<dyn resize::Resizer>>,
    /// How a session enters it, where the runtime allows (the process runtime).
    entry: Option<Arc<enter::Entry>>,
}

impl ExecutionHandle {
    /// Ask the execution to stop: SIGTERM, then SIGKILL after the grace period.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A token that cancels this execution when cancelled.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Reads what the execution uses (CPU, memory) while it runs; `None` where the
    /// runtime does not account it per execution.
    pub fn usage_reader(&self) -> Option<cgroups::UsageReader> {
        self.usage.clone()
    }

    /// Changes the execution's CPU quota and memory limit while it runs; `None` where
    /// the runtime cannot (no cgroup, Slurm).
    pub fn resizer(&self) -> Option<Arc<dyn resize::Resizer>> {
        self.resizer.clone()
    }

    /// How an interactive session enters the execution while it runs; `None` where the
    /// runtime offers no way in.
    pub fn entry(&self) -> Option<Arc<enter::Entry>> {
        self.entry.clone()
    }

    /// This handle, enterable through `entry`.
    pub(crate) fn with_entry(mut self, entry: Option<enter::Entry>) -> Self {
        self.entry = entry.map(Arc::new);
        self
    }

    /// Wait for the end. All output lines have been sent before this returns, so the
    /// output's reader must be reading meanwhile (its channel is bounded).
    pub async fn wait(self) -> ExitOutcome {
        // The sender lives until the execution ends; a dropped sender means the
        // supervising task panicked, which we report as a kill.
        self.exit.await.unwrap_or(ExitOutcome::Signalled(9))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start `{program}` in {workdir}: {source}")]
    Spawn {
        program: String,
        workdir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("working directory {0} does not exist")]
    MissingWorkdir(String),
    #[error("slurm: {0}")]
    Slurm(String),
    #[error(
        "image `{image}` is neither on this node nor could it be pulled ({detail}); check the name in `environment.image`, or load the image on the node"
    )]
    ImageNotFound { image: String, detail: String },
    /// The runtime itself does not answer (an infrastructure problem, never the task's):
    /// the attempt may move to another runtime.
    #[error("the {runtime} runtime is unavailable: {detail}")]
    RuntimeUnavailable {
        runtime: &'static str,
        detail: String,
    },
    #[error("the container runtime refused the task: {0}")]
    Container(String),
    /// A cgroup of the process runtime could not be found, created, limited or joined.
    #[error("cgroup: cannot {action} {path}: {detail}")]
    Cgroup {
        action: &'static str,
        path: String,
        detail: String,
    },
}

impl ExecError {
    /// The snake_case reason an attempt that could not start this way ends with.
    pub fn reason(&self) -> &'static str {
        match self {
            ExecError::ImageNotFound { .. } => "image_not_found",
            ExecError::RuntimeUnavailable { .. } => "runtime_unavailable",
            ExecError::Cgroup { .. } => "cgroup_failed",
            _ => "launch_failed",
        }
    }

    /// Whether the failure is the runtime's, not the task's: only then may the attempt
    /// move to the next eligible runtime.
    pub fn is_infrastructure(&self) -> bool {
        matches!(self, ExecError::RuntimeUnavailable { .. })
    }
}

/// An execution a previous life of the agent started and the backend found again.
#[derive(Debug)]
pub struct RecoveredExecution {
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub node_rank: u32,
    pub num_nodes: u32,
    pub handle: ExecutionHandle,
    /// Output from where the previous life stopped forwarding.
    pub output: OutputReceiver,
}

/// A runtime that can run launch specs.
#[async_trait::async_trait]
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// Which runtime this is: the agent offers, chooses and labels runtimes by kind.
    fn kind(&self) -> RuntimeKind;

    /// Start the execution. Output lines go to `output` in order, each stream's lines in
    /// the order written; while `output` is full the execution's output waits.
    async fn launch(
        &self,
        spec: LaunchSpec,
        output: OutputSender,
    ) -> Result<ExecutionHandle, ExecError>;

    /// Whether executions run as [`Placement::run_as`]. A runtime that cannot switch
    /// identities (Slurm jobs are submitted as the agent's user) says `false`, and the
    /// agent then runs every task as itself.
    fn honours_run_as(&self) -> bool {
        false
    }

    /// Executions that outlived a previous agent (a backend whose work runs outside the
    /// agent's process tree, like Slurm, finds them again). Taken once, at start.
    async fn recover(&self) -> Vec<RecoveredExecution> {
        Vec::new()
    }
}

pub(crate) fn handle_parts() -> (
    CancellationToken,
    oneshot::Sender<ExitOutcome>,
    oneshot::Receiver<ExitOutcome>,
) {
    let (tx, rx) = oneshot::channel();
    (CancellationToken::new(), tx, rx)
}

impl ExecutionHandle {
    pub(crate) fn new(
        pid: Option<u32>,
        cancel: CancellationToken,
        exit: oneshot::Receiver<ExitOutcome>,
    ) -> Self {
        ExecutionHandle {
            pid,
            cancel,
            exit,
            usage: None,
            resizer: None,
            entry: None,
        }
    }

    pub(crate) fn with_resizer(mut self, resizer: Option<Arc<dyn resize::Resizer>>) -> Self {
        self.resizer = resizer;
        self
    }

    pub(crate) fn with_usage(mut self, usage: Option<cgroups::UsageReader>) -> Self {
        self.usage = usage;
        self
    }
}

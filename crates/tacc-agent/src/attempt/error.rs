//! Why a node's share of an attempt ended before its task could run to its own end: one
//! variant per thing that can go wrong in a stage (prepare, launch), each with the
//! message the user reads and, through [`AttemptError::reason`], the snake_case reason
//! code the server records, retries on and shows (`launch_failed`, `setup_failed`, …).

use tacc_compiler::INSTRUCTION_FORMAT;
use tacc_exec::ExecError;
use tacc_proto::AttemptOutcome;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AttemptError {
    /// Stopped while it was being prepared: nothing of the task ran.
    #[error("cancelled before the task started")]
    Cancelled,
    #[error("this agent cannot read the instruction: {0}")]
    UnreadableInstruction(serde_json::Error),
    #[error(
        "instruction format {found} is not the agent's {INSTRUCTION_FORMAT}; upgrade the agent"
    )]
    NewerInstruction { found: u32 },
    /// The attempt's secrets, its identity or the directories it runs in cannot be set
    /// up on this node; the message says which.
    #[error("{0}")]
    Refused(String),
    #[error("cannot hand the working directory {workdir} to uid {uid}: {source}")]
    HandOver {
        workdir: String,
        uid: u32,
        source: std::io::Error,
    },
    #[error("{0}")]
    SnapshotFetch(String),
    #[error("{0}")]
    DatasetFetch(String),
    /// A pipeline stage's inputs (the outputs of the stages it needs) could not be placed.
    #[error("{0}")]
    InputFetch(String),
    #[error("{0}")]
    EnvironmentBuild(String),
    /// No runtime of this node can run the task (none eligible, or all unavailable).
    #[error("{0}")]
    NoRuntime(String),
    #[error("setup exited with code {0}")]
    SetupExited(i32),
    #[error("setup was killed by signal {0}")]
    SetupSignalled(i32),
    /// The runtime could not start the script.
    #[error(transparent)]
    Launch(ExecError),
    /// The runtime failed for an infrastructure reason and no other runtime can take the
    /// attempt; the message says why none can.
    #[error("{message}")]
    NoRuntimeLeft { cause: ExecError, message: String },
    #[error("rank {rank} could not start: {source}")]
    RankLaunch { rank: u32, source: ExecError },
    #[error("a process supervisor of this attempt failed: {0}")]
    Supervisor(tokio::task::JoinError),
    #[error(
        "node {0} lost contact with the server and stopped the attempt itself, so that it never runs twice"
    )]
    Fenced(String),
    /// The working directory grew past `resources.disk`.
    #[error(
        "the working directory grew past its limit `resources.disk: {limit}` ({used} counted), \
         so the task was stopped; write less there, or raise `resources.disk`"
    )]
    DiskLimit {
        used: tacc_core::ByteSize,
        limit: tacc_core::ByteSize,
    },
}

impl AttemptError {
    /// The snake_case reason the attempt ends with (what `tcloud show` and retry rules see).
    pub fn reason(&self) -> &'static str {
        match self {
            AttemptError::Cancelled => "cancelled",
            AttemptError::UnreadableInstruction(_) | AttemptError::NewerInstruction { .. } => {
                "bad_instruction"
            }
            AttemptError::Refused(_)
            | AttemptError::HandOver { .. }
            | AttemptError::Supervisor(_) => "launch_failed",
            AttemptError::SnapshotFetch(_) => "snapshot_fetch_failed",
            AttemptError::DatasetFetch(_) => "dataset_fetch_failed",
            AttemptError::InputFetch(_) => "input_fetch_failed",
            AttemptError::EnvironmentBuild(_) => "env_build_failed",
            AttemptError::NoRuntime(_) => "runtime_unavailable",
            AttemptError::SetupExited(_) | AttemptError::SetupSignalled(_) => "setup_failed",
            AttemptError::Launch(cause)
            | AttemptError::NoRuntimeLeft { cause, .. }
            | AttemptError::RankLaunch { source: cause, .. } => cause.reason(),
            AttemptError::Fenced(_) => "node_fenced",
            AttemptError::DiskLimit { .. } => "disk_limit",
        }
    }

    /// How the attempt is reported to have ended.
    pub fn into_outcome(self) -> AttemptOutcome {
        match self {
            AttemptError::Cancelled => AttemptOutcome::Cancelled,
            error => AttemptOutcome::LaunchFailed {
                reason: error.reason().to_string(),
                message: error.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(error: AttemptError) -> (String, String) {
        match error.into_outcome() {
            AttemptOutcome::LaunchFailed { reason, message } => (reason, message),
            other => panic!("expected a launch failure, got {other:?}"),
        }
    }

    #[test]
    fn each_failure_keeps_the_reason_and_message_users_saw() {
        assert_eq!(
            reported(AttemptError::SetupExited(3)),
            ("setup_failed".into(), "setup exited with code 3".into())
        );
        assert_eq!(
            reported(AttemptError::SetupSignalled(9)),
            ("setup_failed".into(), "setup was killed by signal 9".into())
        );
        assert_eq!(
            reported(AttemptError::NewerInstruction { found: 99 }),
            (
                "bad_instruction".into(),
                format!(
                    "instruction format 99 is not the agent's {INSTRUCTION_FORMAT}; upgrade the agent"
                )
            )
        );
        let unavailable = || ExecError::RuntimeUnavailable {
            runtime: "container",
            detail: "engine down".into(),
        };
        assert_eq!(
            reported(AttemptError::NoRuntimeLeft {
                cause: unavailable(),
                message: "no runtime can run this task".into()
            }),
            (
                "runtime_unavailable".into(),
                "no runtime can run this task".into()
            )
        );
        let (reason, message) = reported(AttemptError::RankLaunch {
            rank: 2,
            source: unavailable(),
        });
        assert_eq!(reason, "runtime_unavailable");
        assert!(
            message.starts_with("rank 2 could not start: the container runtime"),
            "{message}"
        );
        assert_eq!(reported(AttemptError::Fenced("n1".into())).0, "node_fenced");
        let (reason, message) = reported(AttemptError::DiskLimit {
            used: tacc_core::ByteSize::mib(1100),
            limit: tacc_core::ByteSize::gib(1),
        });
        assert_eq!(reason, "disk_limit");
        assert!(message.contains("`resources.disk: 1GiB`"), "{message}");
        assert_eq!(
            AttemptError::Cancelled.into_outcome(),
            AttemptOutcome::Cancelled
        );
    }
}

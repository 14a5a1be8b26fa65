use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// Where a task is in its life. Names follow Slurm's job states, in lower case.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Accepted and durable, waiting for the scheduler to place it.
    Queued,
    /// Placed on nodes; the agent is preparing the working directory.
    Starting,
    /// The user's command is running.
    Running,
    /// Exited with status 0.
    Succeeded,
    /// Exited non-zero, was killed by its time limit, or could not be started.
    Failed,
    /// Cancelled by a user before it finished.
    Cancelled,
    /// The platform lost track of it (its node or agent died); the reason says how.
    Lost,
}

impl TaskState {
    pub const ALL: [TaskState; 7] = [
        TaskState::Queued,
        TaskState::Starting,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Starting => "starting",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Lost => "lost",
        }
    }

    /// A terminal state never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Lost
        )
    }

    /// Holding resources on a node.
    pub fn is_active(self) -> bool {
        matches!(self, TaskState::Starting | TaskState::Running)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| CoreError::UnknownName {
                kind: "task state",
                input: s.to_string(),
                expected: "queued, starting, running, succeeded, failed, cancelled, lost",
            })
    }
}

/// The priority class a user asks for; an administrator may cap it per user.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "low" => Ok(Priority::Low),
            "normal" => Ok(Priority::Normal),
            "high" => Ok(Priority::High),
            _ => Err(CoreError::UnknownName {
                kind: "priority",
                input: s.to_string(),
                expected: "low, normal, high",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_lower_case() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>().unwrap(), state);
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{}\"", state.as_str())
            );
        }
        assert!(TaskState::Lost.is_terminal());
        assert!(!TaskState::Running.is_terminal());
        assert!(
            "done"
                .parse::<TaskState>()
                .unwrap_err()
                .to_string()
                .contains("succeeded")
        );
    }

    #[test]
    fn priorities_order_low_to_high() {
        assert!(Priority::Low < Priority::Normal && Priority::Normal < Priority::High);
        assert_eq!("high".parse::<Priority>().unwrap(), Priority::High);
    }
}

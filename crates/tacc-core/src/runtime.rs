//! The kinds of runtime that can run a task — one vocabulary for every layer: the task
//! file's `runtime:` (where `auto` is the absence of a kind), the compiler's instruction,
//! the node labels an agent registers, and `Executor::kind` in the execution layer
//! (`tacc-exec`). Its text form (`process`, `container`, `slurm`) is the wire and file
//! form, so instructions and task specs read the same as when these were strings.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CoreError;
use crate::labels;

/// How a task's processes are started on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A process group (and cgroup) on the node itself.
    Process,
    /// A container of a Docker engine.
    Container,
    /// A Slurm job, submitted from a login node.
    Slurm,
}

impl RuntimeKind {
    pub const ALL: [RuntimeKind; 3] = [
        RuntimeKind::Process,
        RuntimeKind::Container,
        RuntimeKind::Slurm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Process => "process",
            RuntimeKind::Container => "container",
            RuntimeKind::Slurm => "slurm",
        }
    }

    /// The `tacc.io/runtime.*` label a node that offers this runtime registers with.
    pub fn label(self) -> &'static str {
        match self {
            RuntimeKind::Process => labels::RUNTIME_PROCESS,
            RuntimeKind::Container => labels::RUNTIME_CONTAINER,
            RuntimeKind::Slurm => labels::RUNTIME_SLURM,
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RuntimeKind {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RuntimeKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| CoreError::UnknownName {
                kind: "runtime",
                input: s.to_string(),
                expected: "process, container, slurm",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_serde_and_labels_agree() {
        for kind in RuntimeKind::ALL {
            assert_eq!(kind.as_str().parse::<RuntimeKind>().unwrap(), kind);
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().into())
            );
            assert_eq!(kind.label(), format!("tacc.io/runtime.{kind}"));
        }
        assert!("auto".parse::<RuntimeKind>().is_err());
    }
}

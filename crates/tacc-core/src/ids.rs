use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// A task's id: a small positive integer assigned by the server, like a Slurm job id.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub u64);

/// A group of tasks submitted together (an array; later sweeps and pipelines), shown as
/// `g12`; its JSON form is the bare number.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GroupId(pub u64);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}

impl FromStr for GroupId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        let digits = trimmed
            .strip_prefix('g')
            .or_else(|| trimmed.strip_prefix('G'))
            .unwrap_or(trimmed);
        match digits.parse::<u64>() {
            Ok(n) if n > 0 => Ok(GroupId(n)),
            _ => Err(CoreError::InvalidId {
                kind: "group id",
                input: s.to_string(),
                why: "a group id is `g` and a positive number (e.g. `g12`), as printed by \
                      `tcloud submit` or `tcloud ps`"
                    .into(),
            }),
        }
    }
}

/// Which attempt of a task this is, starting at 1; a retry or a preemption makes a new one.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptNo(pub u32);

/// A machine that runs tasks, as registered by its agent; assigned by the server.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u64);

/// The user a task belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserName(pub String);

/// The content hash (BLAKE3, lower-case hex) that names an immutable code snapshot.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotId(String);

impl SnapshotId {
    /// Length of a BLAKE3 digest written as hex.
    pub const HEX_LEN: usize = 64;

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, enough for humans to tell snapshots apart.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl TryFrom<String> for SnapshotId {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        if value.len() != Self::HEX_LEN
            || !value
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(CoreError::InvalidId {
                kind: "snapshot id",
                input: value,
                why: "expected 64 lower-case hex digits (a BLAKE3 hash)".into(),
            });
        }
        Ok(SnapshotId(value))
    }
}

impl From<SnapshotId> for String {
    fn from(value: SnapshotId) -> Self {
        value.0
    }
}

impl FromStr for SnapshotId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SnapshotId::try_from(s.to_string())
    }
}

impl FromStr for TaskId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.trim().trim_start_matches('#');
        match digits.parse::<u64>() {
            Ok(n) if n > 0 => Ok(TaskId(n)),
            _ => Err(CoreError::InvalidId {
                kind: "task id",
                input: s.to_string(),
                why: "a task id is a positive number as printed by `tcloud submit` or `tcloud ps`"
                    .into(),
            }),
        }
    }
}

macro_rules! display_inner {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    )*};
}
display_inner!(TaskId, AttemptNo, NodeId, UserName, SnapshotId);

impl AttemptNo {
    pub const FIRST: AttemptNo = AttemptNo(1);
    pub fn next(self) -> AttemptNo {
        AttemptNo(self.0 + 1)
    }
}

impl UserName {
    pub fn new(name: impl Into<String>) -> Self {
        UserName(name.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_id_parses_plain_and_hash_prefixed() {
        assert_eq!("42".parse::<TaskId>().unwrap(), TaskId(42));
        assert_eq!("#7".parse::<TaskId>().unwrap(), TaskId(7));
        assert!("0".parse::<TaskId>().is_err());
        let err = "abc".parse::<TaskId>().unwrap_err().to_string();
        assert!(err.contains("positive number"), "{err}");
    }

    #[test]
    fn group_id_shows_and_parses_with_its_prefix() {
        assert_eq!(GroupId(12).to_string(), "g12");
        assert_eq!("g12".parse::<GroupId>().unwrap(), GroupId(12));
        assert_eq!("12".parse::<GroupId>().unwrap(), GroupId(12));
        assert!("g0".parse::<GroupId>().is_err());
        let err = "gx".parse::<GroupId>().unwrap_err().to_string();
        assert!(err.contains("g12"), "{err}");
        assert_eq!(serde_json::to_string(&GroupId(3)).unwrap(), "3");
    }

    #[test]
    fn snapshot_id_requires_hex_digest() {
        let good = "a".repeat(64);
        assert_eq!(good.parse::<SnapshotId>().unwrap().short(), "aaaaaaaaaaaa");
        assert!("A".repeat(64).parse::<SnapshotId>().is_err());
        assert!("abc".parse::<SnapshotId>().is_err());
        let json = serde_json::to_string(&good.parse::<SnapshotId>().unwrap()).unwrap();
        assert_eq!(json, format!("\"{good}\""));
        assert!(serde_json::from_str::<SnapshotId>("\"zz\"").is_err());
    }
}

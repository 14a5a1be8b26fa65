//! `resources.processes`: how many copies of `run` each node starts — one per node (the
//! default), one per GPU (as `torchrun --nproc_per_node=gpu` does), or a fixed count — and
//! so what `WORLD_SIZE`, `RANK` and `LOCAL_RANK` mean for the task.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most processes one node may start for a task.
pub const MAX_PROCESSES_PER_NODE: u32 = 1024;

/// Processes started on each node of a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Processes {
    /// One process per node; `LOCAL_RANK` is 0.
    #[default]
    PerNode,
    /// One process per GPU the node was given, each with its `LOCAL_RANK`.
    PerGpu,
    /// This many processes per node.
    Count(u32),
}

impl Processes {
    /// Processes per node for a task given `gpus` GPUs on each node.
    pub fn per_node(self, gpus: u32) -> u32 {
        match self {
            Processes::PerNode => 1,
            Processes::PerGpu => gpus.max(1),
            Processes::Count(n) => n.max(1),
        }
    }
}

impl fmt::Display for Processes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Processes::PerNode => f.write_str("per_node"),
            Processes::PerGpu => f.write_str("per_gpu"),
            Processes::Count(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Processes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Processes::Count(n) => serializer.serialize_u32(*n),
            other => serializer.serialize_str(&other.to_string()),
        }
    }
}

struct ProcessesVisitor;

const EXPECTED: &str = "`per_node`, `per_gpu` or a number of processes such as `4`";

impl Visitor<'_> for ProcessesVisitor {
    type Value = Processes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Processes, E> {
        u32::try_from(value)
            .ok()
            .filter(|n| (1..=MAX_PROCESSES_PER_NODE).contains(n))
            .map(Processes::Count)
            .ok_or_else(|| {
                E::custom(format!(
                    "`processes` must be between 1 and {MAX_PROCESSES_PER_NODE}, found {value}"
                ))
            })
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Processes, E> {
        match u64::try_from(value) {
            Ok(value) => self.visit_u64(value),
            Err(_) => Err(E::custom(format!(
                "`processes` must be between 1 and {MAX_PROCESSES_PER_NODE}, found {value}"
            ))),
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Processes, E> {
        match value.trim() {
            "per_node" => Ok(Processes::PerNode),
            "per_gpu" => Ok(Processes::PerGpu),
            // YAML readers that keep scalars as text hand numbers over as strings.
            number if number.parse::<u64>().is_ok() => {
                self.visit_u64(number.parse().expect("checked"))
            }
            other => Err(E::custom(format!("`processes: {other}` is not {EXPECTED}"))),
        }
    }
}

impl<'de> Deserialize<'de> for Processes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Processes, D::Error> {
        deserializer.deserialize_any(ProcessesVisitor)
    }
}

// Mirrors `Processes` for the JSON Schema only.
/// `per_node` (default), `per_gpu`, or a number of processes per node.
#[derive(JsonSchema)]
#[schemars(rename = "Processes")]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ProcessesSchema {
    Named(ProcessesName),
    Count(#[schemars(range(min = 1, max = 1024))] u32),
}

#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum ProcessesName {
    PerNode,
    PerGpu,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_their_text_forms_decode() {
        let decode = |json: &str| serde_json::from_str::<Processes>(json);
        assert_eq!(decode("\"per_node\"").unwrap(), Processes::PerNode);
        assert_eq!(decode("\"per_gpu\"").unwrap(), Processes::PerGpu);
        assert_eq!(decode("4").unwrap(), Processes::Count(4));
        assert_eq!(decode("\"8\"").unwrap(), Processes::Count(8));
        let zero = decode("0").unwrap_err().to_string();
        assert!(zero.contains("between 1 and 1024"), "{zero}");
        let word = decode("\"per_cpu\"").unwrap_err().to_string();
        assert!(word.contains("per_gpu"), "{word}");
        assert!(decode("-1").is_err());
    }

    #[test]
    fn processes_per_node_follow_the_gpus() {
        assert_eq!(Processes::PerNode.per_node(8), 1);
        assert_eq!(Processes::PerGpu.per_node(4), 4);
        assert_eq!(Processes::Count(3).per_node(0), 3);
        for p in [Processes::PerNode, Processes::PerGpu, Processes::Count(5)] {
            let back: Processes = serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap();
            assert_eq!(back, p);
        }
    }
}

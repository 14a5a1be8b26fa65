//! `adaptive:` — the range a running task's CPU and memory per node may move in when the
//! cluster re-allocates live (`adaptive: {cpus: 2..8, memory: 8GiB..32GiB}`): grown when
//! CPU or memory holds it back, shrunk when it uses far less than it holds. Each range
//! must contain what `resources` asks for, which is where the task starts.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tacc_core::ByteSize;

use crate::spec::{MAX_CPUS_PER_NODE, MAX_MEMORY_PER_NODE, Problem, ResourceSpec, problem};

/// Bounds of live re-allocation, per node. A resource left out does not move.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveSpec {
    /// CPUs per node as `MIN..MAX`, e.g. `2..8`; must contain `resources.cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", example = "2..8")]
    pub cpus: Option<Range<f64>>,
    /// Memory per node as `MIN..MAX`, e.g. `8GiB..32GiB`; must contain `resources.memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", example = "8GiB..32GiB")]
    pub memory: Option<Range<ByteSize>>,
}

/// `MIN..MAX`, both inclusive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range<T> {
    pub min: T,
    pub max: T,
}

impl<T: fmt::Display> fmt::Display for Range<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.min, self.max)
    }
}

impl<T: FromStr> FromStr for Range<T>
where
    T::Err: fmt::Display,
{
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (min, max) = text
            .split_once("..")
            .ok_or_else(|| format!("`{text}` is not a range"))?;
        let parse = |part: &str| {
            part.trim()
                .parse::<T>()
                .map_err(|e| format!("`{}` in `{text}`: {e}", part.trim()))
        };
        Ok(Range {
            min: parse(min)?,
            max: parse(max)?,
        })
    }
}

impl<T: fmt::Display> Serialize for Range<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de, T: FromStr> Deserialize<'de> for Range<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl AdaptiveSpec {
    /// The CPU bounds in thousandths of a CPU, or the request when left out.
    pub fn cpu_millis(&self, resources: &ResourceSpec) -> (u64, u64) {
        let millis = |cpus: f64| (cpus * 1000.0).round() as u64;
        match self.cpus {
            Some(range) => (millis(range.min), millis(range.max)),
            None => (millis(resources.cpus), millis(resources.cpus)),
        }
    }

    /// The memory bounds in bytes, or the request when left out.
    pub fn memory_bytes(&self, resources: &ResourceSpec) -> (u64, u64) {
        match self.memory {
            Some(range) => (range.min.as_bytes(), range.max.as_bytes()),
            None => (resources.memory.as_bytes(), resources.memory.as_bytes()),
        }
    }
}

/// The first thing wrong with the bounds, given what `resources` asks for.
pub(crate) fn check_adaptive(adaptive: &AdaptiveSpec, resources: &ResourceSpec) -> Option<Problem> {
    if let Some(Range { min, max }) = adaptive.cpus {
        let asked = resources.cpus;
        let finite = min.is_finite() && max.is_finite();
        if !finite || min <= 0.0 || max > MAX_CPUS_PER_NODE {
            return Some(problem(
                "adaptive.cpus",
                format!("`cpus: {min}..{max}` must lie above 0 and at most {MAX_CPUS_PER_NODE}"),
                "write the range as `MIN..MAX` CPUs per node, e.g. `cpus: 2..8`",
            ));
        }
        if min > max {
            return Some(problem(
                "adaptive.cpus",
                format!("the minimum {min} is above the maximum {max}"),
                format!("write the smaller number first: `cpus: {max}..{min}`"),
            ));
        }
        if max < asked {
            return Some(problem(
                "adaptive.cpus",
                format!("the maximum {max} is below the {asked} CPUs `resources.cpus` asks for"),
                format!(
                    "the task starts with `resources.cpus`: raise the maximum to at least {asked} (e.g. `cpus: {min}..{asked}`) or lower `resources.cpus`"
                ),
            ));
        }
        if min > asked {
            return Some(problem(
                "adaptive.cpus",
                format!("the minimum {min} is above the {asked} CPUs `resources.cpus` asks for"),
                format!(
                    "the task starts with `resources.cpus`: lower the minimum to at most {asked} (e.g. `cpus: {asked}..{max}`) or raise `resources.cpus`"
                ),
            ));
        }
    }
    if let Some(Range { min, max }) = adaptive.memory {
        let asked = resources.memory;
        if min.as_bytes() == 0 || max > MAX_MEMORY_PER_NODE {
            return Some(problem(
                "adaptive.memory",
                format!(
                    "`memory: {min}..{max}` must lie above 0 and at most {MAX_MEMORY_PER_NODE}"
                ),
                "write the range as `MIN..MAX` per node, e.g. `memory: 8GiB..32GiB`",
            ));
        }
        if min > max {
            return Some(problem(
                "adaptive.memory",
                format!("the minimum {min} is above the maximum {max}"),
                format!("write the smaller size first: `memory: {max}..{min}`"),
            ));
        }
        if max < asked {
            return Some(problem(
                "adaptive.memory",
                format!("the maximum {max} is below the {asked} `resources.memory` asks for"),
                format!(
                    "the task starts with `resources.memory`: raise the maximum to at least {asked} (e.g. `memory: {min}..{asked}`) or lower `resources.memory`"
                ),
            ));
        }
        if min > asked {
            return Some(problem(
                "adaptive.memory",
                format!("the minimum {min} is above the {asked} `resources.memory` asks for"),
                format!(
                    "the task starts with `resources.memory`: lower the minimum to at most {asked} (e.g. `memory: {asked}..{max}`) or raise `resources.memory`"
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_print_back() {
        let cpus: Range<f64> = "2..8".parse().unwrap();
        assert_eq!(cpus, Range { min: 2.0, max: 8.0 });
        let memory: Range<ByteSize> = "8GiB..32GiB".parse().unwrap();
        assert_eq!(memory.to_string(), "8GiB..32GiB");
        assert!(
            "8".parse::<Range<f64>>()
                .unwrap_err()
                .contains("not a range")
        );
        assert!("2..x".parse::<Range<f64>>().is_err());
    }

    #[test]
    fn bounds_default_to_the_request() {
        let resources = ResourceSpec::default();
        let spec = AdaptiveSpec {
            cpus: Some(Range { min: 0.5, max: 4.0 }),
            memory: None,
        };
        assert_eq!(spec.cpu_millis(&resources), (500, 4000));
        assert_eq!(spec.memory_bytes(&resources), (1 << 30, 1 << 30));
    }
}

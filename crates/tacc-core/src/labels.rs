//! Node labels: the pairs an agent registers its node with and a task's placement selects
//! on. Keys under [`RESERVED_PREFIX`] are the platform's own vocabulary — what a node can
//! run — set by agents and never by operators or task files, so a task that asks for
//! `runtime: slurm` can trust that a node saying so really submits to Slurm.

/// Keys the platform owns. Operators' `--label` and task files' `placement.labels` may not
/// use it.
pub const RESERVED_PREFIX: &str = "tacc.io/";

/// The node runs tasks as processes on its own machine (`runtime: process`).
pub const RUNTIME_PROCESS: &str = "tacc.io/runtime.process";
/// The node runs tasks in containers of a Docker engine (`runtime: container`, or any
/// task with `environment.image`).
pub const RUNTIME_CONTAINER: &str = "tacc.io/runtime.container";
/// The node is a Slurm node, reached through a Slurm agent (`runtime: slurm`).
pub const RUNTIME_SLURM: &str = "tacc.io/runtime.slurm";
/// The Slurm partition the node's jobs are submitted to (`placement.partition`).
pub const SLURM_PARTITION: &str = "tacc.io/slurm-partition";
/// The node is a pilot: a `taccd agent` inside the Slurm allocation (job id) a Slurm
/// agent requested for short tasks.
pub const PILOT: &str = "tacc.io/pilot";
/// When the pilot's allocation ends (Unix seconds): a task whose time limit reaches past
/// it is not started there.
pub const PILOT_ENDS: &str = "tacc.io/pilot-ends";
/// On the Slurm nodes of an agent that requests pilots: tasks whose time limit is at most
/// this many seconds are left to pilots instead of getting an `sbatch` job each.
pub const PILOT_SHORT_SECS: &str = "tacc.io/pilot-short-secs";
/// The value of the `tacc.io/runtime.*` labels.
pub const OFFERED: &str = "true";

/// Longest key or value accepted.
pub const MAX_LABEL_LEN: usize = 128;

/// Why `key` is not a label key, if it is not: 1–128 characters of `a-z A-Z 0-9 . _ - /`,
/// starting with a letter or digit (e.g. `gpu-gen`, `example.org/rack`).
pub fn key_error(key: &str) -> Option<String> {
    if key.is_empty() {
        return Some("the label key is empty".to_string());
    }
    if key.chars().count() > MAX_LABEL_LEN {
        return Some(format!(
            "the label key `{key}` is longer than {MAX_LABEL_LEN} characters"
        ));
    }
    if !key.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some(format!(
            "the label key `{key}` must start with a letter or digit"
        ));
    }
    if let Some(bad) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Some(format!(
            "the label key `{key}` contains `{bad}`; only letters, digits, `.`, `_`, `-` and `/` are allowed"
        ));
    }
    None
}

/// Why `value` is not a label value, if it is not: 1–128 characters, none of them
/// white space, a control character or `=`.
pub fn value_error(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("the label value is empty".to_string());
    }
    if value.chars().count() > MAX_LABEL_LEN {
        return Some(format!(
            "the label value `{value}` is longer than {MAX_LABEL_LEN} characters"
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '=')
    {
        return Some(format!(
            "the label value `{value}` contains {}; write it without spaces, control characters or `=`",
            if bad.is_whitespace() || bad.is_control() {
                "white space or a control character".to_string()
            } else {
                format!("`{bad}`")
            }
        ));
    }
    None
}

/// Whether `key` belongs to the platform's own vocabulary.
pub fn is_reserved(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_checked() {
        assert_eq!(key_error("gpu-gen"), None);
        assert_eq!(key_error("example.org/rack_2"), None);
        assert_eq!(key_error(RUNTIME_SLURM), None);
        assert!(key_error("").unwrap().contains("empty"));
        assert!(key_error("-x").unwrap().contains("start with"));
        assert!(key_error("a b").unwrap().contains("` `"));
        assert!(key_error(&"k".repeat(129)).unwrap().contains("longer"));
        assert_eq!(value_error("hopper"), None);
        assert_eq!(value_error("debug,batch"), None);
        assert!(value_error("").unwrap().contains("empty"));
        assert!(value_error("a b").unwrap().contains("white space"));
        assert!(value_error("a=b").unwrap().contains("`=`"));
    }

    #[test]
    fn the_platform_owns_its_prefix() {
        for key in [
            RUNTIME_PROCESS,
            RUNTIME_CONTAINER,
            RUNTIME_SLURM,
            SLURM_PARTITION,
        ] {
            assert!(is_reserved(key), "{key}");
        }
        assert!(!is_reserved("gpu-gen"));
        assert!(!is_reserved("tacc.iox/a"));
    }
}

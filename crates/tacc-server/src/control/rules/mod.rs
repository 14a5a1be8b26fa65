//! The lifecycle rules of the control plane as plain functions over state: an event and
//! the state it meets go in, with the time passed in; a decision comes out (store changes,
//! nodes lost, attempts to stop, a retry and when). No lock, store, clock or network is
//! reached from here — `crates/taccd/tests/architecture.rs` checks — so every rule is
//! unit-tested on its own, and the async shell around it (`control/*.rs`) only reads what
//! a rule needs, applies what it decides, and wakes who must hear of it.

pub(super) mod admission;
pub(super) mod arrays;
pub(super) mod cancel;
pub(super) mod claims;
pub(crate) mod dev_idle;
pub(super) mod ending;
pub(super) mod hangs;
pub(crate) mod idle_gpus;
pub(super) mod liveness;
pub(super) mod pipelines;
pub(super) mod polls;
pub(super) mod sweeps;

/// A node record for the rules' unit tests: `n<id>`, one CPU, up since `at`.
#[cfg(test)]
pub(super) fn test_node(id: u64, at: std::time::Instant) -> super::LiveNode {
    let mut live = super::LiveNode::new(
        tacc_store::NodeRecord {
            id: tacc_core::NodeId(id),
            name: format!("n{id}"),
            capacity: tacc_core::Resources::new(1000, 1 << 30, 0),
            gpu_type: None,
            labels: Default::default(),
            address: String::new(),
            registered_at: tacc_core::Timestamp(0),
            drained: false,
            enrolled_capacity: tacc_core::Resources::new(1000, 1 << 30, 0),
            pending: false,
            last_seen: None,
        },
        at,
    );
    live.online = true;
    live
}

/// A task record for the control plane's unit tests: task `task` of `ann`, in `state`,
/// attempt `attempt`, placed on `nodes` (one rank each).
#[cfg(test)]
pub(super) fn test_record(
    task: u64,
    state: tacc_core::TaskState,
    attempt: u32,
    nodes: &[u64],
) -> tacc_store::TaskRecord {
    tacc_store::TaskRecord {
        id: tacc_core::TaskId(task),
        name: "t".into(),
        user: "ann".into(),
        spec: serde_json::json!({}),
        snapshot: "ab".repeat(32).parse().expect("a snapshot id"),
        source: None,
        state,
        reason: None,
        exit_code: None,
        attempt: tacc_core::AttemptNo(attempt),
        placements: nodes
            .iter()
            .map(|node| tacc_store::StoredPlacement {
                node: tacc_core::NodeId(*node),
                gpu_indices: vec![],
            })
            .collect(),
        cancel_requested: false,
        submitted_at: tacc_core::Timestamp(0),
        started_at: None,
        finished_at: None,
        group: None,
        group_index: None,
        submission: serde_json::json!({}),
    }
}

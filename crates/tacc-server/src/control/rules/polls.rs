//! What a node's poll for its work decides. The poll says what the agent runs now: a
//! cancelled attempt it no longer runs has stopped (no report of it will come), and the
//! attempts it claimed that are no longer its own must be gone before it gets new work —
//! until then it is handed only what it already runs and may keep.

use tacc_proto::{Assignment, AttemptRef};

use crate::control::LiveNode;

/// The node's cancelled attempts that it no longer runs: they end as cancelled.
pub(in crate::control) fn settled_cancels(
    live: &mut LiveNode,
    running: &[AttemptRef],
) -> Vec<AttemptRef> {
    let settled: Vec<AttemptRef> = live
        .cancelling
        .iter()
        .filter(|a| !running.contains(a))
        .copied()
        .collect();
    for attempt in &settled {
        live.cancelling.remove(attempt);
    }
    settled
}

/// The node's desired work now.
#[derive(Debug, PartialEq)]
pub(in crate::control) struct Desired {
    pub assignments: Vec<Assignment>,
    /// The last stale attempt is gone with this poll: the work held back is due, so the
    /// node's next poll is answered at once.
    pub released: bool,
}

pub(in crate::control) fn desired(live: &mut LiveNode, running: &[AttemptRef]) -> Desired {
    let mut released = false;
    if !live.stale_claims.is_empty() {
        live.stale_claims
            .retain(|attempt| running.contains(attempt));
        released = live.stale_claims.is_empty();
    }
    let assignments = live
        .assignments
        .values()
        .filter(|a| live.stale_claims.is_empty() || running.contains(&a.attempt))
        .cloned()
        .collect();
    Desired {
        assignments,
        released,
    }
}

#[cfg(test)]
pub(in crate::control) mod tests {
    use std::time::Instant;

    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    pub(in crate::control) fn assignment(task: u64) -> Assignment {
        serde_json::from_value(serde_json::json!({
            "attempt": attempt(task),
            "instruction": {},
            "node_rank": 0,
            "gpu_indices": [],
            "master_addr": "",
            "master_port": 0,
        }))
        .expect("an assignment")
    }

    fn node() -> LiveNode {
        crate::control::rules::test_node(1, Instant::now())
    }

    #[test]
    fn a_cancel_settles_once_the_agent_no_longer_runs_it() {
        let mut live = node();
        live.cancelling.extend([attempt(1), attempt(2)]);
        assert_eq!(settled_cancels(&mut live, &[attempt(1)]), [attempt(2)]);
        assert_eq!(settled_cancels(&mut live, &[attempt(1)]), []);
        assert_eq!(settled_cancels(&mut live, &[]), [attempt(1)]);
        assert!(live.cancelling.is_empty());
    }

    #[test]
    fn new_work_waits_until_the_stale_attempts_are_gone() {
        let mut live = node();
        live.assignments.insert(attempt(1), assignment(1));
        live.assignments.insert(attempt(2), assignment(2));
        live.stale_claims.insert(attempt(9));
        let held = desired(&mut live, &[attempt(1), attempt(9)]);
        assert_eq!(
            held.assignments,
            [assignment(1)],
            "only what it runs already"
        );
        assert!(!held.released);
        let released = desired(&mut live, &[attempt(1)]);
        assert_eq!(released.assignments, [assignment(1), assignment(2)]);
        assert!(released.released);
        assert!(!desired(&mut live, &[attempt(1)]).released, "released once");
    }
}

//! What one version of the node's desired work asks of the attempts here, decided as a
//! plain function (`Agent::reconcile` carries it out): stop what runs and is no longer
//! assigned, re-limit what runs and carries a new allocation, start what is assigned and
//! neither runs nor finished here. An attempt that finished here is never started again,
//! whatever a server lists — also after a desired set that did not list it (work can come
//! from a server that has not taken in the end: `finished_attempts.rs`).

use std::collections::BTreeSet;

use tacc_core::Resources;
use tacc_proto::{Assignment, AttemptRef};

use crate::finished_attempts::FinishedAttempts;

/// What reconciling with one desired set does.
#[derive(Debug, Default)]
pub(crate) struct WorkPlan {
    /// Running here and no longer assigned.
    pub stop: Vec<AttemptRef>,
    /// Running here, with the allocation now in force.
    pub resize: Vec<(AttemptRef, Resources)>,
    /// Assigned, not running here and never finished here.
    pub start: Vec<Assignment>,
}

/// The plan for `desired`, given the attempts running here and those finished here.
pub(crate) fn plan(
    running: &BTreeSet<AttemptRef>,
    finished: &FinishedAttempts,
    desired: Vec<Assignment>,
) -> WorkPlan {
    let wanted: BTreeSet<AttemptRef> = desired.iter().map(|a| a.attempt).collect();
    let mut plan = WorkPlan {
        stop: running.difference(&wanted).copied().collect(),
        ..WorkPlan::default()
    };
    for assignment in desired {
        let key = assignment.attempt;
        if running.contains(&key) {
            if let Some(allocation) = assignment.allocation {
                plan.resize.push((key, allocation));
            }
        } else if !finished.contains(&key) {
            plan.start.push(assignment);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    fn assigned(task: u64) -> Assignment {
        Assignment {
            attempt: attempt(task),
            instruction: serde_json::Value::Null,
            node_rank: 0,
            gpu_indices: Vec::new(),
            master_addr: String::new(),
            master_port: 0,
            secrets: Default::default(),
            allocation: None,
            inputs: Vec::new(),
            task_uid: None,
        }
    }

    fn started(plan: &WorkPlan) -> Vec<u64> {
        plan.start.iter().map(|a| a.attempt.task.0).collect()
    }

    #[test]
    fn what_is_new_starts_and_what_is_gone_stops() {
        let running: BTreeSet<_> = [attempt(1), attempt(2)].into();
        let plan = plan(
            &running,
            &FinishedAttempts::default(),
            vec![assigned(2), assigned(3)],
        );
        assert_eq!(plan.stop, [attempt(1)]);
        assert_eq!(started(&plan), [3]);
        assert!(plan.resize.is_empty());
    }

    #[test]
    fn a_running_attempt_with_a_new_allocation_is_resized_not_started() {
        let running: BTreeSet<_> = [attempt(1)].into();
        let allocation = Resources {
            cpu_millis: 500,
            ..Resources::default()
        };
        let mut again = assigned(1);
        again.allocation = Some(allocation);
        let plan = plan(&running, &FinishedAttempts::default(), vec![again]);
        assert_eq!(plan.resize, [(attempt(1), allocation)]);
        assert!(plan.start.is_empty() && plan.stop.is_empty());
    }

    /// The CI failure of 2026-11-28: task 3 finished here, a desired set no longer listed
    /// it, then a stale one listed it again — it ran a second time under attempt 1.
    #[test]
    fn a_finished_attempt_listed_again_after_a_set_without_it_never_starts() {
        let mut finished = FinishedAttempts::default();
        let running = BTreeSet::new();
        finished.insert(attempt(3));
        let still_listed = plan(&running, &finished, vec![assigned(3)]);
        assert!(still_listed.start.is_empty(), "its end not yet taken in");
        let without = plan(&running, &finished, vec![assigned(4)]);
        assert_eq!(started(&without), [4]);
        let stale = plan(&running, &finished, vec![assigned(3), assigned(4)]);
        assert_eq!(started(&stale), [4], "3 finished here: never again");
    }
}

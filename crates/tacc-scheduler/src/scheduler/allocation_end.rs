//! Slurm pilot allocations in placement. A pilot node (a `taccd agent` inside a Slurm
//! allocation) advertises when its allocation ends (`tacc.io/pilot-ends`, Unix seconds):
//! a task is started there only when its time limit ends before that, so Slurm never
//! kills a task with its allocation; a task without a time limit never runs in a pilot.
//! The Slurm nodes of an agent that requests pilots advertise `tacc.io/pilot-short-secs`:
//! tasks at most that long are left to the pilots rather than each costing an `sbatch`.
//! The allocation's end is a wall-clock instant; the check compares it with the time of
//! the event being handled ([`set_now`], called by `Scheduler::handle`), so the scheduler
//! still reads no clock of its own. Nodes without these labels are unaffected.

use tacc_core::labels::{PILOT_ENDS, PILOT_SHORT_SECS};

use crate::{NodeSpec, TaskRequest};

thread_local! {
    /// The time of the event the scheduler on this thread handles (Unix seconds): the
    /// placement search below `Cluster` has no clock parameter, and handling an event is
    /// synchronous on one thread.
    static NOW_SECS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Record the time of the event being handled.
pub(crate) fn set_now(now: tacc_core::Timestamp) {
    NOW_SECS.with(|cell| cell.set(now.as_millis() / 1000));
}

/// Whether `request` may be started on `node` as far as pilot allocations go.
pub(crate) fn fits(node: &NodeSpec, request: &TaskRequest) -> bool {
    fits_at(node, request, NOW_SECS.with(|cell| cell.get()))
}

/// [`fits`] at `now_secs` (Unix seconds).
fn fits_at(node: &NodeSpec, request: &TaskRequest, now_secs: u64) -> bool {
    if let Some(ends) = node.labels.get(PILOT_ENDS) {
        let Ok(ends) = ends.parse::<u64>() else {
            return false;
        };
        return request
            .time_limit_secs
            .is_some_and(|limit| now_secs.saturating_add(limit) <= ends);
    }
    if let Some(short) = node.labels.get(PILOT_SHORT_SECS)
        && let Ok(short) = short.parse::<u64>()
    {
        return request.time_limit_secs.is_none_or(|limit| limit > short);
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tacc_core::NodeId;

    use super::*;

    fn node(labels: &[(&str, &str)]) -> NodeSpec {
        NodeSpec {
            id: NodeId(1),
            capacity: tacc_core::Resources::ZERO,
            gpu_type: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn limited(secs: Option<u64>) -> TaskRequest {
        TaskRequest {
            time_limit_secs: secs,
            ..Default::default()
        }
    }

    #[test]
    fn a_pilot_takes_only_tasks_that_end_before_its_allocation() {
        let pilot = node(&[(PILOT_ENDS, "1000")]);
        assert!(fits_at(&pilot, &limited(Some(100)), 900));
        assert!(!fits_at(&pilot, &limited(Some(101)), 900));
        assert!(!fits_at(&pilot, &limited(None), 900), "unknown length");
        assert!(!fits_at(
            &node(&[(PILOT_ENDS, "soon")]),
            &limited(Some(1)),
            0
        ));
    }

    #[test]
    fn slurm_nodes_of_a_pilot_agent_leave_short_tasks_to_pilots() {
        let slurm = node(&[(PILOT_SHORT_SECS, "600")]);
        assert!(!fits_at(&slurm, &limited(Some(600)), 0));
        assert!(fits_at(&slurm, &limited(Some(601)), 0));
        assert!(fits_at(&slurm, &limited(None), 0));
        assert!(fits_at(&node(&[]), &limited(None), 0));
    }
}

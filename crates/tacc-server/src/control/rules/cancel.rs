//! What a user's cancel does, by where the task is: a queued task ends at once; a
//! starting or running one is withdrawn from its nodes and ends when their agents confirm
//! it stopped — at once when no node of it is up to confirm; anything else (already
//! ended, or a cancel already under way) is left as it is, so a repeated cancel is a no-op.

use tacc_core::TaskState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::control) enum CancelPlan {
    /// Queued: it ends `cancelled` now and leaves the queue.
    EndQueued,
    /// Placed: the cancel is recorded and the attempt withdrawn from its nodes; with
    /// `end_now`, no node of it is up, so it ends now.
    Withdraw { end_now: bool },
    /// Ended, or already being cancelled.
    Nothing,
}

pub(in crate::control) fn plan_cancel(
    state: TaskState,
    cancel_requested: bool,
    placed_on_a_live_node: bool,
) -> CancelPlan {
    match state {
        TaskState::Queued => CancelPlan::EndQueued,
        TaskState::Starting | TaskState::Running if !cancel_requested => CancelPlan::Withdraw {
            end_now: !placed_on_a_live_node,
        },
        _ => CancelPlan::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    #[test]
    fn a_queued_task_ends_at_once() {
        assert_eq!(plan_cancel(Queued, false, false), CancelPlan::EndQueued);
    }

    #[test]
    fn a_placed_task_waits_for_its_agents_unless_none_is_up() {
        for state in [Starting, Running] {
            assert_eq!(
                plan_cancel(state, false, true),
                CancelPlan::Withdraw { end_now: false }
            );
            assert_eq!(
                plan_cancel(state, false, false),
                CancelPlan::Withdraw { end_now: true }
            );
            assert_eq!(
                plan_cancel(state, true, true),
                CancelPlan::Nothing,
                "repeated"
            );
        }
    }

    #[test]
    fn an_ended_task_is_left_as_it_is() {
        for state in [Succeeded, Failed, Cancelled, Lost] {
            assert_eq!(plan_cancel(state, false, true), CancelPlan::Nothing);
        }
    }
}

//! Where each node's output of each attempt has been applied up to, so that a log report
//! delivered twice (the server applied it, its answer was lost, the agent sent the batch
//! again) is appended once. Agents tag each output report with the byte offset it starts
//! at in that node's output of the attempt; offsets only grow, so a report at or below
//! the last one applied is a repeat. The record lives in memory: after a server restart
//! the first report of each attempt is taken as new.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tacc_core::NodeId;
use tacc_proto::AttemptRef;

/// More attempts than a server holds at once: past it the record starts afresh (a repeat
/// may then be appended twice, never a new report dropped). Ended attempts stay in the
/// record (a batch resent after its answer was lost may carry an end and the lines before
/// it) until their node registers again or this bound clears it.
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Default)]
pub(crate) struct LogOffsets {
    applied: Mutex<BTreeMap<(NodeId, AttemptRef), u64>>,
}

impl LogOffsets {
    /// Whether a log report of `node` for `attempt` starting at `offset` is new (and, if
    /// so, note it as applied). Reports without an offset (the agent's own notes) are
    /// always new.
    pub fn fresh(&self, node: NodeId, attempt: AttemptRef, offset: Option<u64>) -> bool {
        let Some(offset) = offset else {
            return true;
        };
        let mut applied = self.applied.lock().unwrap();
        if let Some(last) = applied.get(&(node, attempt))
            && offset <= *last
        {
            return false;
        }
        if applied.len() >= MAX_TRACKED {
            applied.clear();
        }
        applied.insert((node, attempt), offset);
        true
    }

    /// The node registered (again): an agent that restarted counts its output from zero.
    pub fn forget_node(&self, node: NodeId) {
        self.applied.lock().unwrap().retain(|(n, _), _| *n != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    #[test]
    fn a_repeated_report_is_dropped_and_a_new_one_kept() {
        let offsets = LogOffsets::default();
        let attempt = AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        };
        let (a, b) = (NodeId(1), NodeId(2));
        assert!(offsets.fresh(a, attempt, Some(0)));
        assert!(!offsets.fresh(a, attempt, Some(0)), "the same report again");
        assert!(offsets.fresh(a, attempt, Some(120)));
        assert!(!offsets.fresh(a, attempt, Some(0)), "an older one, late");
        assert!(offsets.fresh(b, attempt, Some(0)), "another node's output");
        assert!(offsets.fresh(a, attempt, None), "the agent's own notes");
        assert!(offsets.fresh(a, attempt, None));
        offsets.forget_node(a);
        assert!(
            offsets.fresh(a, attempt, Some(0)),
            "a restarted agent counts from zero"
        );
        assert!(
            !offsets.fresh(b, attempt, Some(0)),
            "another node's record is kept"
        );
    }
}

//! Which attempts each node still holds, and as which rank, from the moment its work poll
//! delivered them until the node reports their end (or stops listing them as running).
//!
//! An attempt's task may move on before every node is done with it: rank 0 finishing ends
//! a multi-node attempt, a preemption or a retry starts the next one, a cancel ends it
//! the moment the node confirms. A node that held the attempt still stops its processes
//! and then uploads what the attempt wrote (checkpoints included) before it reports
//! `finished`; those uploads, log lines and that report are accepted from that node, for
//! that attempt, until then — never from another node, never for another task. The set
//! lives in memory: after a server restart only attempts delivered again are held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use tacc_core::{AttemptNo, NodeId, TaskId};
use tacc_proto::{Assignment, AttemptRef};

#[derive(Debug, Default)]
pub(crate) struct NodeAttempts {
    held: Mutex<BTreeMap<NodeId, BTreeMap<AttemptRef, u32>>>,
    /// The newest version of each node's desired work handed to it, by a poll's answer
    /// or a report batch's: what the agent lists as running means something only once it
    /// has applied that version (see [`NodeAttempts::knows_its_work`]).
    delivered: Mutex<BTreeMap<NodeId, u64>>,
}

impl NodeAttempts {
    /// Whether a list of what `node` runs, taken when its agent had applied version
    /// `after` of its work, tells what it runs: only when no newer version was handed to
    /// it since. (Work travels on two paths, the poll's answer and a report batch's, so a
    /// poll held open carries a list from before attempts that reached the node later;
    /// their absence from it says nothing.)
    pub fn knows_its_work(&self, node: NodeId, after: Option<u64>) -> bool {
        match (self.delivered.lock().unwrap().get(&node), after) {
            (None, _) => true,
            (Some(delivered), Some(after)) => after >= *delivered,
            (Some(_), None) => false,
        }
    }

    /// Whether version `version` of `node`'s work (or a newer one) was handed to it.
    pub fn has_delivered(&self, node: NodeId, version: u64) -> bool {
        self.delivered
            .lock()
            .unwrap()
            .get(&node)
            .is_some_and(|delivered| *delivered >= version)
    }

    /// Version `version` of the node's desired work (`delivered`) is handed to it: those
    /// attempts are held from now on. When `running` tells what it runs (see
    /// [`NodeAttempts::knows_its_work`]), an attempt the node neither runs nor is told to
    /// run is done with — its runner, uploads included, has ended.
    pub fn sync(
        &self,
        node: NodeId,
        running: Option<&[AttemptRef]>,
        version: u64,
        delivered: &[Assignment],
    ) {
        {
            let mut versions = self.delivered.lock().unwrap();
            let newest = versions.entry(node).or_insert(version);
            *newest = (*newest).max(version);
        }
        let mut held = self.held.lock().unwrap();
        let attempts = held.entry(node).or_default();
        if let Some(running) = running {
            let running: BTreeSet<&AttemptRef> = running.iter().collect();
            attempts.retain(|attempt, _| {
                running.contains(attempt) || delivered.iter().any(|a| a.attempt == *attempt)
            });
        }
        for assignment in delivered {
            attempts.insert(assignment.attempt, assignment.node_rank);
        }
        if attempts.is_empty() {
            held.remove(&node);
        }
    }

    /// The rank `node` holds `attempt` as, if it holds it.
    pub fn rank_of(&self, node: NodeId, attempt: AttemptRef) -> Option<u32> {
        self.held
            .lock()
            .unwrap()
            .get(&node)
            .and_then(|attempts| attempts.get(&attempt))
            .copied()
    }

    /// The node reported the attempt's end: true when it held it (and no longer does).
    pub fn finish(&self, node: NodeId, attempt: AttemptRef) -> bool {
        let mut held = self.held.lock().unwrap();
        let Some(attempts) = held.get_mut(&node) else {
            return false;
        };
        let was_held = attempts.remove(&attempt).is_some();
        if attempts.is_empty() {
            held.remove(&node);
        }
        was_held
    }

    /// The node is gone (lost, removed, or registered afresh without these attempts):
    /// nothing it held is accepted any more.
    pub fn forget_node(&self, node: NodeId, keep: &[AttemptRef]) {
        self.delivered.lock().unwrap().remove(&node);
        let mut held = self.held.lock().unwrap();
        if let Some(attempts) = held.get_mut(&node) {
            attempts.retain(|attempt, _| keep.contains(attempt));
            if attempts.is_empty() {
                held.remove(&node);
            }
        }
    }

    /// Ranks of `task`'s attempts that some node still holds: their outputs may still be
    /// on their way.
    pub fn unfinished_ranks(&self, task: TaskId) -> BTreeSet<(AttemptNo, u32)> {
        self.held
            .lock()
            .unwrap()
            .values()
            .flat_map(|attempts| attempts.iter())
            .filter(|(attempt, _)| attempt.task == task)
            .map(|(attempt, rank)| (attempt.attempt, *rank))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(task: u64, attempt: u32) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(attempt),
        }
    }

    fn assignment(of: AttemptRef, rank: u32) -> Assignment {
        Assignment {
            attempt: of,
            instruction: serde_json::Value::Null,
            node_rank: rank,
            gpu_indices: vec![],
            master_addr: String::new(),
            master_port: 0,
            secrets: Default::default(),
            allocation: None,
            inputs: Vec::new(),
            task_uid: None,
        }
    }

    #[test]
    fn an_attempt_is_held_by_its_node_only_until_it_is_done() {
        let held = NodeAttempts::default();
        let (n1, n2) = (NodeId(1), NodeId(2));
        let a = attempt(7, 1);
        held.sync(n1, Some(&[]), 1, &[assignment(a, 0)]);
        held.sync(n2, Some(&[]), 1, &[assignment(a, 1)]);
        assert_eq!(held.rank_of(n1, a), Some(0));
        assert_eq!(held.rank_of(n2, a), Some(1));
        assert_eq!(held.rank_of(n1, attempt(8, 1)), None, "another task");
        assert_eq!(held.rank_of(n1, attempt(7, 2)), None, "another attempt");
        assert_eq!(held.rank_of(NodeId(3), a), None, "another node");

        // Withdrawn (the task ended) while n2 still runs it: still held.
        held.sync(n2, Some(&[a]), 2, &[]);
        assert_eq!(held.rank_of(n2, a), Some(1));
        assert_eq!(
            held.unfinished_ranks(TaskId(7)),
            [(AttemptNo(1), 0), (AttemptNo(1), 1)].into()
        );
        // n1 reports its end; n2 stops listing it.
        assert!(held.finish(n1, a));
        assert!(!held.finish(n1, a), "a second ending is not the node's own");
        held.sync(n2, Some(&[]), 2, &[]);
        assert_eq!(held.rank_of(n2, a), None);
        assert!(held.unfinished_ranks(TaskId(7)).is_empty());
    }

    #[test]
    fn a_node_that_comes_back_holds_only_what_it_claims() {
        let held = NodeAttempts::default();
        let (a, b) = (attempt(1, 1), attempt(2, 1));
        held.sync(
            NodeId(1),
            Some(&[]),
            4,
            &[assignment(a, 0), assignment(b, 0)],
        );
        held.forget_node(NodeId(1), &[b]);
        assert_eq!(held.rank_of(NodeId(1), a), None);
        assert_eq!(held.rank_of(NodeId(1), b), Some(0));
        assert!(
            held.knows_its_work(NodeId(1), None),
            "registered afresh: nothing was handed to this life of the agent yet"
        );
    }

    #[test]
    fn a_list_from_before_the_newest_delivery_is_no_proof_that_an_attempt_stopped() {
        let held = NodeAttempts::default();
        let n = NodeId(1);
        let (a, b) = (attempt(1, 1), attempt(2, 1));
        assert!(held.knows_its_work(n, None), "nothing handed yet");
        // Version 3 hands `a` (a poll's answer); then version 4 hands `b` (a report
        // batch's answer) while the poll the agent sent with version 3 is still held.
        held.sync(n, Some(&[]), 3, &[assignment(a, 0)]);
        held.sync(n, Some(&[a]), 4, &[assignment(a, 0), assignment(b, 0)]);
        assert!(held.has_delivered(n, 4) && held.has_delivered(n, 3));
        assert!(!held.has_delivered(n, 5));
        assert!(
            !held.knows_its_work(n, Some(3)),
            "listed before `b` arrived"
        );
        assert!(!held.knows_its_work(n, None));
        assert!(held.knows_its_work(n, Some(4)));
        // `b` is withdrawn (cancelled); the list from version 3 lacks it, yet the node
        // runs it: it stays held.
        held.sync(n, None, 5, &[assignment(a, 0)]);
        assert_eq!(held.rank_of(n, b), Some(0));
        // An older version handed late never lowers what the node has.
        held.sync(n, None, 4, &[assignment(a, 0)]);
        assert!(held.has_delivered(n, 5));
        // A list from version 5 without `b`: it stopped.
        held.sync(n, Some(&[a]), 5, &[assignment(a, 0)]);
        assert_eq!(held.rank_of(n, b), None);
    }
}

//! The control plane's outbound side, as HyperQueue's `tako` has its `Comm`: a decision
//! that changes a node's work reaches the node only through [`Comm`]. Agents long-poll
//! for their work, so "telling" a node is waking the poll it holds open; the server's
//! [`WatchComm`] does that with one watch channel per node, and the lifecycle tests'
//! `TestEnv` records every wake-up beside it, so a missed wake-up (a cancel or placement
//! the agent would hear of only at its next poll, up to 30 s later) fails a test.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tacc_core::NodeId;
use tokio::sync::watch;

/// How the control plane tells nodes that their work changed.
pub trait Comm: Send + Sync + std::fmt::Debug {
    /// `node`'s work changed: a poll it holds open is answered now.
    fn work_changed(&self, node: NodeId);
    /// What a poll of `node` waits on: a version of its work that changes with every
    /// [`Comm::work_changed`], and ends when the node is removed.
    fn work_version(&self, node: NodeId) -> watch::Receiver<u64>;
    /// `node` was removed: a poll it holds open is answered now, and it has no version.
    fn node_removed(&self, node: NodeId);
}

/// The server's [`Comm`]: one watch channel per node, its value the node's work version.
#[derive(Debug, Default)]
pub struct WatchComm {
    nodes: Mutex<BTreeMap<NodeId, watch::Sender<u64>>>,
}

impl WatchComm {
    fn with_node<T>(&self, node: NodeId, act: impl FnOnce(&watch::Sender<u64>) -> T) -> T {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        act(nodes.entry(node).or_insert_with(|| watch::channel(0).0))
    }
}

impl Comm for WatchComm {
    fn work_changed(&self, node: NodeId) {
        self.with_node(node, |version| version.send_modify(|v| *v += 1));
    }

    fn work_version(&self, node: NodeId) -> watch::Receiver<u64> {
        self.with_node(node, watch::Sender::subscribe)
    }

    fn node_removed(&self, node: NodeId) {
        let removed = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&node);
        // Dropping the sender answers every receiver's `changed()` (with an error).
        drop(removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiting_poll_hears_a_change_of_its_own_node_only() {
        let comm = WatchComm::default();
        let mut first = comm.work_version(NodeId(1));
        let second = comm.work_version(NodeId(2));
        comm.work_changed(NodeId(1));
        assert!(first.has_changed().unwrap());
        assert!(!second.has_changed().unwrap());
        first.changed().await.unwrap();
        assert_eq!(*first.borrow(), 1);
        assert_eq!(*second.borrow(), 0);
    }

    #[tokio::test]
    async fn a_poll_that_subscribes_after_a_change_waits_for_the_next() {
        let comm = WatchComm::default();
        comm.work_changed(NodeId(1));
        let later = comm.work_version(NodeId(1));
        assert_eq!(*later.borrow(), 1);
        assert!(!later.has_changed().unwrap());
    }

    #[tokio::test]
    async fn removing_a_node_answers_its_waiting_poll() {
        let comm = WatchComm::default();
        let mut waiting = comm.work_version(NodeId(1));
        comm.node_removed(NodeId(1));
        assert!(waiting.changed().await.is_err());
    }
}

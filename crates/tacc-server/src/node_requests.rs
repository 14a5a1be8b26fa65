//! Questions the server puts to a node about one of its running attempts (list a
//! directory of the live working directory, fetch one file of it). Agents only ever call
//! the server, so a question waits in the node's queue until its next work poll carries
//! it out (the poll is woken at once), and the agent answers with a POST; the asking
//! handler waits for that answer with a deadline. Each question is delivered once; one
//! whose answer does not come in time is forgotten, and a late answer finds nobody.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tacc_core::NodeId;
use tacc_proto::{AttemptRef, FileEntry, NodeRequest, NodeRequestId, NodeRequestKind};
use tokio::sync::{oneshot, watch};

/// Questions one node may have outstanding at once; more are refused (429) rather than
/// queued, so a flood of `tcloud ls` cannot pile up in front of a node.
const MAX_PENDING_PER_NODE: usize = 64;

/// What a node answered.
#[derive(Debug)]
pub(crate) enum Answer {
    Listing {
        entries: Vec<FileEntry>,
        truncated: bool,
    },
    File(Bytes),
    Failed {
        code: String,
        message: String,
    },
}

/// Why no answer came.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// The node did not answer within the deadline.
    Timeout,
    /// The node already has [`MAX_PENDING_PER_NODE`] questions outstanding.
    Busy,
}

#[derive(Debug)]
struct Waiter {
    node: NodeId,
    answer: oneshot::Sender<Answer>,
}

#[derive(Debug, Default)]
struct Queues {
    /// Asked, not yet carried out by a poll.
    undelivered: HashMap<NodeId, Vec<NodeRequest>>,
    /// Asked and not answered yet (delivered or not).
    waiting: HashMap<NodeRequestId, Waiter>,
    /// Wakes the node's waiting work poll.
    wake: HashMap<NodeId, watch::Sender<u64>>,
}

#[derive(Debug, Default)]
pub(crate) struct NodeRequests {
    next: AtomicU64,
    queues: Mutex<Queues>,
}

/// Forgets a question whose asker went away (answered, timed out, or disconnected).
struct Forget<'a> {
    requests: &'a NodeRequests,
    node: NodeId,
    id: NodeRequestId,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut queues = self.requests.queues.lock().unwrap();
        queues.waiting.remove(&self.id);
        if let Some(undelivered) = queues.undelivered.get_mut(&self.node) {
            undelivered.retain(|r| r.id != self.id);
        }
    }
}

impl NodeRequests {
    /// Put a question to `node` and wait up to `deadline` for its answer.
    pub async fn ask(
        &self,
        node: NodeId,
        attempt: AttemptRef,
        kind: NodeRequestKind,
        deadline: Duration,
    ) -> Result<Answer, Unanswered> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        {
            let mut queues = self.queues.lock().unwrap();
            let pending = queues.waiting.values().filter(|w| w.node == node).count();
            if pending >= MAX_PENDING_PER_NODE {
                return Err(Unanswered::Busy);
            }
            queues.waiting.insert(id, Waiter { node, answer: tx });
            queues
                .undelivered
                .entry(node)
                .or_default()
                .push(NodeRequest { id, attempt, kind });
            queues
                .wake
                .entry(node)
                .or_insert_with(|| watch::channel(0).0)
                .send_modify(|v| *v += 1);
        }
        let _forget = Forget {
            requests: self,
            node,
            id,
        };
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            // The sender is only dropped unanswered when the question is forgotten.
            Ok(Err(_)) | Err(_) => Err(Unanswered::Timeout),
        }
    }

    /// Put a request to `node` that is not answered here (a session: the node connects
    /// back instead, see [`crate::sessions`]); its id.
    pub fn deliver(
        &self,
        node: NodeId,
        id: NodeRequestId,
        attempt: AttemptRef,
        kind: NodeRequestKind,
    ) {
        let mut queues = self.queues.lock().unwrap();
        queues
            .undelivered
            .entry(node)
            .or_default()
            .push(NodeRequest { id, attempt, kind });
        queues
            .wake
            .entry(node)
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|v| *v += 1);
    }

    /// A fresh request id, for [`NodeRequests::deliver`].
    pub fn next_id(&self) -> NodeRequestId {
        NodeRequestId(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Forget request `id` to `node` if its poll has not carried it out yet.
    pub fn withdraw(&self, node: NodeId, id: NodeRequestId) {
        if let Some(undelivered) = self.queues.lock().unwrap().undelivered.get_mut(&node) {
            undelivered.retain(|r| r.id != id);
        }
    }

    /// Subscribe before [`NodeRequests::take`]: a question asked after it wakes the poll.
    pub fn subscribe(&self, node: NodeId) -> watch::Receiver<u64> {
        self.queues
            .lock()
            .unwrap()
            .wake
            .entry(node)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// The questions for `node` not yet carried out, now handed to its poll.
    pub fn take(&self, node: NodeId) -> Vec<NodeRequest> {
        self.queues
            .lock()
            .unwrap()
            .undelivered
            .remove(&node)
            .unwrap_or_default()
    }

    /// `node` answers question `id`: false when it was not asked of that node or is no
    /// longer waited for.
    pub fn answer(&self, node: NodeId, id: NodeRequestId, answer: Answer) -> bool {
        let mut queues = self.queues.lock().unwrap();
        match queues.waiting.get(&id) {
            Some(waiter) if waiter.node == node => {}
            _ => return false,
        }
        let waiter = queues.waiting.remove(&id).expect("checked above");
        waiter.answer.send(answer).is_ok()
    }

    /// Whether question `id` is waiting for an answer from `node` (checked before its
    /// answer's body is read).
    pub fn is_waiting(&self, node: NodeId, id: NodeRequestId) -> bool {
        self.queues
            .lock()
            .unwrap()
            .waiting
            .get(&id)
            .is_some_and(|w| w.node == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    fn attempt() -> AttemptRef {
        AttemptRef {
            task: TaskId(1),
            attempt: AttemptNo(1),
        }
    }

    fn list() -> NodeRequestKind {
        NodeRequestKind::List {
            path: String::new(),
        }
    }

    #[tokio::test]
    async fn a_question_reaches_its_node_once_and_only_that_node_answers_it() {
        let requests = std::sync::Arc::new(NodeRequests::default());
        let mut woken = requests.subscribe(NodeId(2));
        let asker = {
            let requests = requests.clone();
            tokio::spawn(async move {
                requests
                    .ask(NodeId(2), attempt(), list(), Duration::from_secs(10))
                    .await
            })
        };
        woken.changed().await.unwrap();
        assert!(requests.take(NodeId(1)).is_empty());
        let taken = requests.take(NodeId(2));
        assert_eq!(taken.len(), 1);
        assert!(requests.take(NodeId(2)).is_empty(), "delivered once");
        let id = taken[0].id;
        let wrong = Answer::File(Bytes::from_static(b"forged"));
        assert!(!requests.answer(NodeId(1), id, wrong), "another node");
        assert!(requests.is_waiting(NodeId(2), id));
        let file = Answer::File(Bytes::from_static(b"real"));
        assert!(requests.answer(NodeId(2), id, file));
        match asker.await.unwrap() {
            Ok(Answer::File(bytes)) => assert_eq!(&bytes[..], b"real"),
            other => panic!("{other:?}"),
        }
        assert!(!requests.is_waiting(NodeId(2), id), "answered once");
    }

    #[tokio::test]
    async fn an_unanswered_question_times_out_and_is_forgotten() {
        let requests = NodeRequests::default();
        let asked = requests
            .ask(NodeId(3), attempt(), list(), Duration::from_millis(20))
            .await;
        assert_eq!(asked.unwrap_err(), Unanswered::Timeout);
        assert!(requests.take(NodeId(3)).is_empty(), "not delivered late");
        assert!(requests.queues.lock().unwrap().waiting.is_empty());
    }
}

//! Interactive sessions (`tcloud exec`, `shell`, `port-forward`): the user's upgraded
//! connection waits while the node, told over its work poll, connects back with its own;
//! then the two are spliced. Here: the bounds (sessions per user and per node, an idle
//! cut-off, one frame of buffer per direction), the agents' connections awaited by id,
//! and the splice itself with the reasons a session ends (its task ended, its owner's
//! token was revoked, it fell idle, the server stops). The sessions open into each task
//! are known by task too, with their traffic, so that a dev session counts as in use
//! while bytes pass through one (`crate::dev_idle`) and its users can be warned in them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tacc_core::{NodeId, TaskId};
use tacc_proto::{Frame, NodeRequestId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::ServerError;

/// The bounds on sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions one user may have open at once (a port-forward's connections each count).
    pub per_user: usize,
    /// Sessions open into one node at once, all users together.
    pub per_node: usize,
    /// A session through which no byte passed for this long is closed (unless it goes
    /// into a dev session, whose own idle timeout governs it).
    pub idle: Duration,
    /// The longest idle timeout a dev session gets (`taccd --dev-idle-max`).
    pub dev_idle_max: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            per_user: 64,
            per_node: 256,
            idle: Duration::from_secs(30 * 60),
            dev_idle_max: Duration::from_secs(24 * 3600),
        }
    }
}

/// Why a new session is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crowded {
    User(usize),
    Node(usize),
}

/// May one more session open, with `user_open` of the user's and `node_open` into the
/// node already open?
pub(crate) fn admit(
    user_open: usize,
    node_open: usize,
    limits: &SessionLimits,
) -> Result<(), Crowded> {
    if user_open >= limits.per_user {
        return Err(Crowded::User(limits.per_user));
    }
    if node_open >= limits.per_node {
        return Err(Crowded::Node(limits.per_node));
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Open {
    per_user: HashMap<String, usize>,
    per_node: HashMap<NodeId, usize>,
    /// Sessions whose node has not connected back yet, and who waits for it.
    waiting: HashMap<NodeRequestId, (NodeId, oneshot::Sender<Upgraded>)>,
    /// The spliced sessions of each task: their traffic, and where to send them a notice.
    attached: HashMap<TaskId, HashMap<u64, Attached>>,
    next_attached: u64,
    /// When a byte last passed through a closed session of each task (a dev session's
    /// idle time counts from then, not from when its shell exited); kept as long as the
    /// longest idle timeout.
    closed_use: HashMap<TaskId, Instant>,
}

#[derive(Debug)]
struct Attached {
    traffic: Arc<Traffic>,
    notices: mpsc::UnboundedSender<String>,
}

/// A session spliced into a task: known by its task until dropped.
#[derive(Debug)]
pub(crate) struct Attachment {
    sessions: Arc<Sessions>,
    task: TaskId,
    id: u64,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let kept_for = self.sessions.limits.dev_idle_max;
        let mut open = self.sessions.open.lock().unwrap();
        let Some(of_task) = open.attached.get_mut(&self.task) else {
            return;
        };
        let Some(attached) = of_task.remove(&self.id) else {
            return;
        };
        if of_task.is_empty() {
            open.attached.remove(&self.task);
        }
        let used = attached.traffic.last_at();
        open.closed_use.retain(|_, at| at.elapsed() < kept_for);
        let latest = open.closed_use.entry(self.task).or_insert(used);
        *latest = (*latest).max(used);
    }
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    pub(crate) limits: SessionLimits,
    open: Mutex<Open>,
}

/// One admitted session: counted against its user and node until dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    sessions: Arc<Sessions>,
    user: String,
    node: NodeId,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.sessions.open.lock().unwrap();
        if let Some(n) = open.per_user.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                open.per_user.remove(&self.user);
            }
        }
        if let Some(n) = open.per_node.get_mut(&self.node) {
            *n -= 1;
            if *n == 0 {
                open.per_node.remove(&self.node);
            }
        }
    }
}

/// Forgets a session the node never connected back for.
pub(crate) struct Expected<'a> {
    sessions: &'a Sessions,
    id: NodeRequestId,
    pub(crate) stream: oneshot::Receiver<Upgraded>,
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        self.sessions.open.lock().unwrap().waiting.remove(&self.id);
    }
}

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Sessions {
            limits,
            open: Mutex::default(),
        }
    }

    /// Count a new session of `user` into `node`, or say which bound it would break.
    pub(crate) fn admit(self: &Arc<Self>, user: &str, node: NodeId) -> Result<Ticket, ServerError> {
        let mut open = self.open.lock().unwrap();
        let user_open = open.per_user.get(user).copied().unwrap_or(0);
        let node_open = open.per_node.get(&node).copied().unwrap_or(0);
        admit(user_open, node_open, &self.limits).map_err(|crowded| {
            let message = match crowded {
                Crowded::User(n) => format!(
                    "you already have {n} sessions open (the most one user may); close one \
                     (exit a shell, stop a port-forward) and try again"
                ),
                Crowded::Node(n) => format!(
                    "the task's node already serves {n} sessions (the most it takes); try \
                     again in a moment"
                ),
            };
            ServerError::TooManyRequests {
                message,
                retry_after_secs: 5,
            }
        })?;
        *open.per_user.entry(user.to_string()).or_default() += 1;
        *open.per_node.entry(node).or_default() += 1;
        Ok(Ticket {
            sessions: self.clone(),
            user: user.to_string(),
            node,
        })
    }

    /// Wait for `node` to connect back for session `id` (register before asking it).
    pub(crate) fn expect(&self, id: NodeRequestId, node: NodeId) -> Expected<'_> {
        let (tx, rx) = oneshot::channel();
        self.open.lock().unwrap().waiting.insert(id, (node, tx));
        Expected {
            sessions: self,
            id,
            stream: rx,
        }
    }

    /// A session into `task` is spliced, with this traffic: the notices for it come out
    /// of the receiver (see [`splice`]).
    pub(crate) fn attach(
        self: &Arc<Self>,
        task: TaskId,
        traffic: Arc<Traffic>,
    ) -> (Attachment, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut open = self.open.lock().unwrap();
        open.next_attached += 1;
        let id = open.next_attached;
        open.attached.entry(task).or_default().insert(
            id,
            Attached {
                traffic,
                notices: tx,
            },
        );
        let attachment = Attachment {
            sessions: self.clone(),
            task,
            id,
        };
        (attachment, rx)
    }

    /// How long ago a byte last passed through a session into `task`, open or closed
    /// (the most recent); `None` when none was ever opened (or too long ago to matter).
    pub(crate) fn last_use(&self, task: TaskId) -> Option<Duration> {
        let open = self.open.lock().unwrap();
        let of_open = open
            .attached
            .get(&task)
            .into_iter()
            .flat_map(|of_task| of_task.values())
            .map(|attached| attached.traffic.idle());
        let of_closed = open.closed_use.get(&task).map(|at| at.elapsed());
        of_open.chain(of_closed).min()
    }

    /// Say `text` to the user of every session open into `task` (on their terminal or
    /// stderr); how many were told.
    pub(crate) fn notify(&self, task: TaskId, text: &str) -> usize {
        let open = self.open.lock().unwrap();
        open.attached.get(&task).map_or(0, |of_task| {
            of_task
                .values()
                .filter(|attached| attached.notices.send(text.to_string()).is_ok())
                .count()
        })
    }

    /// `node` connects back for session `id`: where its connection goes, if the session
    /// waits for that node.
    pub(crate) fn claim(
        &self,
        node: NodeId,
        id: NodeRequestId,
    ) -> Option<oneshot::Sender<Upgraded>> {
        let mut open = self.open.lock().unwrap();
        match open.waiting.get(&id) {
            Some((waiting_for, _)) if *waiting_for == node => {}
            _ => return None,
        }
        open.waiting.remove(&id).map(|(_, tx)| tx)
    }
}

/// Why a spliced session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// One side closed (the command ended, the user left).
    Closed,
    /// The server says why, to the user too.
    Cut(String),
}

impl Ended {
    pub(crate) fn describe(&self) -> String {
        match self {
            Ended::Closed => "closed".into(),
            Ended::Cut(why) => why.clone(),
        }
    }
}

/// Bytes through a session, and when the last one passed.
#[derive(Debug)]
pub(crate) struct Traffic {
    started: Instant,
    pub(crate) from_user: AtomicU64,
    pub(crate) to_user: AtomicU64,
    last_ms: AtomicU64,
}

impl Traffic {
    pub(crate) fn new() -> Self {
        Traffic {
            started: Instant::now(),
            from_user: AtomicU64::new(0),
            to_user: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    fn passed(&self, counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
        self.last_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// When the last byte passed (the start when none did).
    fn last_at(&self) -> Instant {
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// How long no byte has passed.
    pub(crate) fn idle(&self) -> Duration {
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    pub(crate) fn lasted(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic::new()
    }
}

/// Copy between the user's and the node's connections until either closes or `cut`
/// gives a reason to stop; the user is then sent an [`Frame::Error`] saying it. Bytes
/// from the user go to the node as they come; the node's go to the user a whole frame at
/// a time (so a reason or a notice can be put between two frames), one read buffer each
/// way. Each of `notices` reaches the user as a line on stderr once the session is open
/// (after the node's first frame); it is the server's, not traffic.
pub(crate) async fn splice(
    user: Upgraded,
    node: Upgraded,
    traffic: &Traffic,
    mut notices: mpsc::UnboundedReceiver<String>,
    cut: impl std::future::Future<Output = String>,
) -> Ended {
    let (mut user_read, mut user_write) = tokio::io::split(TokioIo::new(user));
    let (mut node_read, mut node_write) = tokio::io::split(TokioIo::new(node));
    let upward = async {
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            match user_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if node_write.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                    traffic.passed(&traffic.from_user, n);
                }
            }
        }
    };
    let mut pending = Vec::new();
    let mut downward_broken = false;
    let ended = {
        let downward = async {
            let mut buffer = vec![0u8; 16 << 10];
            let mut opened = false;
            let mut notices_open = true;
            loop {
                // Whole frames only: the buffer never holds more than one frame and a read.
                loop {
                    match Frame::decode(&mut pending) {
                        Ok(Some(frame)) => {
                            let bytes = frame.encode();
                            if user_write.write_all(&bytes).await.is_err() {
                                return;
                            }
                            traffic.passed(&traffic.to_user, bytes.len());
                            opened = true;
                        }
                        Ok(None) => break,
                        Err(_) => {
                            downward_broken = true;
                            return;
                        }
                    }
                }
                let _ = user_write.flush().await;
                tokio::select! {
                    read = node_read.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buffer[..n]),
                    },
                    // Before the node's go-ahead the user's side waits for that frame
                    // first: a notice then waits too.
                    notice = notices.recv(), if opened && notices_open => match notice {
                        Some(text) => {
                            // A terminal in raw mode needs the carriage returns.
                            let line = format!("\r\ntacc: {text}\r\n");
                            let bytes = Frame::Stderr(line.into_bytes()).encode();
                            if user_write.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                        None => notices_open = false,
                    },
                }
            }
        };
        tokio::select! {
            _ = upward => Ended::Closed,
            _ = downward => Ended::Closed,
            why = cut => Ended::Cut(why),
        }
    };
    if downward_broken {
        let why = "the node sent a malformed session frame".to_string();
        tracing::warn!("{why}");
        let _ = user_write
            .write_all(&Frame::Error(why.clone()).encode())
            .await;
        let _ = user_write.shutdown().await;
        return Ended::Cut(why);
    }
    if let Ended::Cut(why) = &ended {
        let _ = user_write
            .write_all(&Frame::Error(format!("tacc: {why}")).encode())
            .await;
    }
    let _ = user_write.shutdown().await;
    let _ = node_write.shutdown().await;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_per_user_then_per_node() {
        let limits = SessionLimits {
            per_user: 2,
            per_node: 3,
            idle: Duration::from_secs(60),
            ..SessionLimits::default()
        };
        let table = [
            (0, 0, Ok(())),
            (1, 2, Ok(())),
            (2, 0, Err(Crowded::User(2))),
            (0, 3, Err(Crowded::Node(3))),
            (5, 5, Err(Crowded::User(2))),
        ];
        for (user, node, want) in table {
            assert_eq!(admit(user, node, &limits), want, "user {user}, node {node}");
        }
    }

    #[test]
    fn a_ticket_counts_until_dropped_and_a_node_claims_only_its_own_session() {
        let sessions = Arc::new(Sessions::new(SessionLimits {
            per_user: 1,
            per_node: 10,
            idle: Duration::from_secs(60),
            ..SessionLimits::default()
        }));
        let first = sessions.admit("alice", NodeId(1)).unwrap();
        assert!(sessions.admit("alice", NodeId(2)).is_err());
        assert!(sessions.admit("bob", NodeId(1)).is_ok());
        drop(first);
        assert!(sessions.admit("alice", NodeId(2)).is_ok());

        let expected = sessions.expect(NodeRequestId(7), NodeId(1));
        assert!(
            sessions.claim(NodeId(2), NodeRequestId(7)).is_none(),
            "another node"
        );
        assert!(
            sessions.claim(NodeId(1), NodeRequestId(8)).is_none(),
            "no such session"
        );
        drop(expected);
        assert!(
            sessions.claim(NodeId(1), NodeRequestId(7)).is_none(),
            "forgotten"
        );
        let _expected = sessions.expect(NodeRequestId(9), NodeId(1));
        // (The attached sessions are below.)
        assert!(sessions.claim(NodeId(1), NodeRequestId(9)).is_some());
        assert!(
            sessions.claim(NodeId(1), NodeRequestId(9)).is_none(),
            "claimed once"
        );
    }

    #[test]
    fn a_task_knows_its_spliced_sessions_their_last_use_and_hears_notices() {
        let sessions = Arc::new(Sessions::new(SessionLimits::default()));
        let task = TaskId(3);
        assert_eq!(sessions.last_use(task), None);
        assert_eq!(sessions.notify(task, "hello"), 0);
        let traffic = Arc::new(Traffic::new());
        let (first, mut heard) = sessions.attach(task, traffic.clone());
        let (second, _other) = sessions.attach(task, Arc::new(Traffic::new()));
        assert!(sessions.last_use(task).is_some());
        assert_eq!(sessions.last_use(TaskId(4)), None);
        assert_eq!(sessions.notify(task, "ends in 5 min"), 2);
        assert_eq!(heard.try_recv().unwrap(), "ends in 5 min");
        drop(first);
        drop(second);
        // Closed, its last use still counts (a dev session's idle time starts there).
        assert!(
            sessions
                .last_use(task)
                .is_some_and(|ago| ago < Duration::from_secs(60))
        );
        assert_eq!(sessions.notify(task, "nobody"), 0);
    }
}

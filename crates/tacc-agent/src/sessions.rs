//! Interactive sessions into running attempts (`tcloud exec`, `shell`, `port-forward`).
//! The server asks over the work poll ([`NodeRequestKind::Session`]); the agent connects
//! back with its node credential (it never listens) and speaks [`Frame`]s there: a
//! command started inside the attempt's first process of this node (its uid, cgroup,
//! mount namespace, directory and environment: see `tacc_exec::enter`), on pipes or on a
//! terminal, or one TCP connection to a port on the node's loopback. The command is
//! killed (its whole process group) when the user goes away; it dies with the attempt's
//! cgroup when the attempt ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tacc_client::sessions::{FrameReader, SessionStream, write_frame};
use tacc_core::NodeId;
use tacc_exec::enter::{Entry, Pty};
use tacc_proto::{AttemptRef, Frame, MAX_FRAME_PAYLOAD, NodeRequest, SessionKind, TtySize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;

use crate::Shared;

/// How long output still drains once the command has ended (a background process may
/// hold its pipes open forever).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// The running executions a session can enter, per attempt and by launch name.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    attempts: Mutex<BTreeMap<AttemptRef, BTreeMap<String, Arc<Entry>>>>,
}

impl Entries {
    pub fn attach(&self, attempt: AttemptRef, name: &str, entry: Arc<Entry>) {
        self.attempts
            .lock()
            .unwrap()
            .entry(attempt)
            .or_default()
            .insert(name.to_string(), entry);
    }

    pub fn detach(&self, attempt: AttemptRef, name: &str) {
        let mut attempts = self.attempts.lock().unwrap();
        if let Some(entries) = attempts.get_mut(&attempt) {
            entries.remove(name);
            if entries.is_empty() {
                attempts.remove(&attempt);
            }
        }
    }

    /// The attempt's first process here (local rank 0; names sort `NAME` < `NAME-p0`).
    fn first(&self, attempt: AttemptRef) -> Option<Arc<Entry>> {
        self.attempts
            .lock()
            .unwrap()
            .get(&attempt)
            .and_then(|entries| entries.values().next().cloned())
    }
}

type Writer = WriteHalf<SessionStream>;
type Frames = FrameReader<ReadHalf<SessionStream>>;

/// Open session `request` (into this node's rank `rank`): connect back, then serve it.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    node: NodeId,
    request: NodeRequest,
    rank: u32,
    kind: SessionKind,
    runs_here: bool,
) {
    let stream = match shared.client.agent_session(node, request.id).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!("cannot open session {}: {e}", request.id);
            return;
        }
    };
    let attempt = request.attempt;
    let (read, write) = tokio::io::split(stream);
    let frames = FrameReader::new(read);
    let entry = shared.entries.first(attempt);
    tracing::info!(
        "session {} into task {} attempt {} rank {rank}: {}",
        request.id,
        attempt.task,
        attempt.attempt,
        kind.describe()
    );
    let node_name = shared.config.name.clone();
    match (entry, kind) {
        (None, _) if runs_here => {
            let message = format!(
                "task {} runs on node {node_name} in a runtime that offers no way in yet \
                 (process and container tasks do), or its run has not started",
                attempt.task
            );
            refuse(write, message).await
        }
        (None, _) => {
            let message = format!(
                "task {} attempt {} does not run on node {node_name} (any more)",
                attempt.task, attempt.attempt
            );
            refuse(write, message).await
        }
        (Some(entry), SessionKind::Exec { command, tty: None }) => {
            exec_on_pipes(&entry, &command, frames, write).await
        }
        (
            Some(entry),
            SessionKind::Exec {
                command,
                tty: Some(size),
            },
        ) => exec_on_terminal(&entry, &command, size, frames, write).await,
        (Some(_), SessionKind::Forward { port }) => forward(port, &node_name, frames, write).await,
    }
}

/// Tell the user why the session cannot open, and close it.
async fn refuse(mut write: Writer, message: String) {
    tracing::info!("session refused: {message}");
    let _ = write_frame(&mut write, &Frame::Error(message)).await;
    let _ = write.shutdown().await;
}

/// Frames from a channel to the session, in order, until the channel closes.
fn writer(mut write: Writer) -> (mpsc::Sender<Frame>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Frame>(8);
    let task = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if write_frame(&mut write, &frame).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    (tx, task)
}

/// Send what `from` yields as frames made by `make`, until its end.
async fn pump<R: AsyncRead + Unpin>(
    mut from: R,
    tx: mpsc::Sender<Frame>,
    make: fn(Vec<u8>) -> Frame,
) {
    let mut buffer = vec![0u8; MAX_FRAME_PAYLOAD];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(make(buffer[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

/// End everything the session started.
fn kill_group(group: u32) {
    if group > 0 {
        let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
    }
}

async fn exec_on_pipes(entry: &Entry, command: &[String], mut frames: Frames, write: Writer) {
    let entered = match entry.spawn(command, None).await {
        Ok(entered) => entered,
        Err(e) => return refuse(write, e.to_string()).await,
    };
    let group = entered.group;
    let mut child = entered.child;
    let (tx, writer) = writer(write);
    let _ = tx.send(Frame::Ready).await;
    let stdout = child
        .stdout
        .take()
        .map(|out| tokio::spawn(pump(out, tx.clone(), Frame::Stdout)));
    let stderr = child
        .stderr
        .take()
        .map(|err| tokio::spawn(pump(err, tx.clone(), Frame::Stderr)));
    let mut stdin = child.stdin.take();
    let user = async {
        loop {
            match frames.next().await {
                Ok(Some(Frame::Stdin(data))) => {
                    if let Some(pipe) = stdin.as_mut() {
                        if pipe.write_all(&data).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Ok(Some(Frame::StdinEnd)) => stdin = None,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    tokio::select! {
        status = child.wait() => {
            let code = status.map(exit_code).unwrap_or(255);
            for pump in [stdout, stderr].into_iter().flatten() {
                let _ = tokio::time::timeout(DRAIN_LIMIT, pump).await;
            }
            kill_group(group);
            let _ = tx.send(Frame::Exit(code)).await;
        }
        _ = user => {
            // The user went away: nothing the session started outlives it.
            kill_group(group);
            let _ = child.wait().await;
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn exec_on_terminal(
    entry: &Entry,
    command: &[String],
    size: TtySize,
    mut frames: Frames,
    write: Writer,
) {
    let pty = match Pty::open(size.rows, size.cols) {
        Ok(pty) => pty,
        Err(e) => return refuse(write, format!("cannot open a terminal: {e}")).await,
    };
    let entered = match entry.spawn(command, Some(&pty)).await {
        Ok(entered) => entered,
        Err(e) => return refuse(write, e.to_string()).await,
    };
    let group = entered.group;
    let mut child = entered.child;
    // Only the command holds the terminal now: its end ends the reads below.
    let controller = pty.into_controller();
    let clone = |file: &std::fs::File| {
        file.try_clone()
            .map(tokio::fs::File::from_std)
            .map_err(|e| format!("cannot share the terminal: {e}"))
    };
    let (reader, mut input) = match (clone(&controller), clone(&controller)) {
        (Ok(reader), Ok(input)) => (reader, input),
        (Err(e), _) | (_, Err(e)) => {
            kill_group(group);
            return refuse(write, e).await;
        }
    };
    let (tx, writer) = writer(write);
    let _ = tx.send(Frame::Ready).await;
    let output = tokio::spawn(pump(reader, tx.clone(), Frame::Stdout));
    let user = async {
        loop {
            match frames.next().await {
                Ok(Some(Frame::Stdin(data))) => {
                    if input.write_all(&data).await.is_err() || input.flush().await.is_err() {
                        return;
                    }
                }
                Ok(Some(Frame::Resize(size))) => {
                    let _ = tacc_exec::enter::resize(&controller, size.rows, size.cols);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    tokio::select! {
        status = child.wait() => {
            let code = status.map(exit_code).unwrap_or(255);
            let _ = tokio::time::timeout(DRAIN_LIMIT, output).await;
            kill_group(group);
            let _ = tx.send(Frame::Exit(code)).await;
        }
        _ = user => {
            kill_group(group);
            let _ = child.wait().await;
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn forward(port: u16, node: &str, mut frames: Frames, write: Writer) {
    let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
        Ok(tcp) => tcp,
        Err(e) => {
            let message = format!(
                "nothing accepts connections on port {port} of node {node} ({e}); the task \
                 must listen on 127.0.0.1:{port} or 0.0.0.0:{port}"
            );
            return refuse(write, message).await;
        }
    };
    let (from_port, mut to_port) = tcp.into_split();
    let (tx, writer) = writer(write);
    let _ = tx.send(Frame::Ready).await;
    let output = pump(from_port, tx.clone(), Frame::Stdout);
    let user = async {
        loop {
            match frames.next().await {
                Ok(Some(Frame::Stdin(data))) => {
                    if to_port.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Ok(Some(Frame::StdinEnd)) => {
                    let _ = to_port.shutdown().await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    tokio::select! {
        _ = output => {
            let _ = tx.send(Frame::Exit(0)).await;
        }
        _ = user => {}
    }
    drop(tx);
    let _ = writer.await;
}

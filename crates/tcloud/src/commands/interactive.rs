//! `tcloud exec`, `tcloud shell` and `tcloud port-forward`: sessions into a running task,
//! through the server (which splices them to the task's node; see
//! `tacc_client::sessions`).

use std::io::{IsTerminal, Write};

use anyhow::Result;
use tacc_client::sessions::{FrameReader, SessionStream, write_frame};
use tacc_core::TaskId;
use tacc_proto::{Frame, MAX_FRAME_PAYLOAD, SessionKind, TtySize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;

use super::Ctx;
use crate::errors::{CliError, FAILURE};

type Frames = FrameReader<ReadHalf<SessionStream>>;

/// The exit status tcloud ends with for a command that ended with `code`.
fn status_of(code: i32) -> Result<()> {
    match code {
        0 => Ok(()),
        code => {
            let byte = (code & 0xff) as u8;
            Err(CliError::silent(if byte == 0 { FAILURE } else { byte }).into())
        }
    }
}

/// Wait for the node's `Ready`, or say why the session did not open.
async fn opened(frames: &mut Frames) -> Result<()> {
    match frames.next().await {
        Ok(Some(Frame::Ready)) => Ok(()),
        Ok(Some(Frame::Error(message))) => Err(CliError::new(FAILURE, message).into()),
        Ok(Some(other)) => Err(CliError::new(
            FAILURE,
            format!("the session began with {other:?} instead of the node's go-ahead"),
        )
        .into()),
        Ok(None) | Err(_) => Err(CliError::new(
            FAILURE,
            "the session closed before the task's node opened it (the node or the server \
             went away)",
        )
        .into()),
    }
}

/// Frames from a channel to the session, in order. The connection is never half-closed
/// (the server takes that as the user leaving): the end of input is a `StdinEnd` frame.
fn writer(mut write: WriteHalf<SessionStream>) -> mpsc::Sender<Frame> {
    let (tx, mut rx) = mpsc::channel::<Frame>(8);
    tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if write_frame(&mut write, &frame).await.is_err() {
                break;
            }
        }
    });
    tx
}

/// Send what `from` yields as `Stdin` frames, then `StdinEnd`.
async fn forward_input<R: AsyncRead + Unpin>(mut from: R, tx: mpsc::Sender<Frame>) {
    let mut buffer = vec![0u8; MAX_FRAME_PAYLOAD];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send(Frame::Stdin(buffer[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = tx.send(Frame::StdinEnd).await;
}

/// How the session ended, as far as the user is concerned.
enum Outcome {
    Exit(i32),
    Error(String),
    Closed,
}

/// Write the node's output to ours until the command's end.
async fn print_output(frames: &mut Frames) -> Outcome {
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        match frames.next().await {
            Ok(Some(Frame::Stdout(data))) => {
                let _ = stdout.write_all(&data);
                let _ = stdout.flush();
            }
            Ok(Some(Frame::Stderr(data))) => {
                let _ = stderr.write_all(&data);
                let _ = stderr.flush();
            }
            Ok(Some(Frame::Exit(code))) => return Outcome::Exit(code),
            Ok(Some(Frame::Error(message))) => return Outcome::Error(message),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return Outcome::Closed,
        }
    }
}

fn finish(outcome: Outcome) -> Result<()> {
    match outcome {
        Outcome::Exit(code) => status_of(code),
        Outcome::Error(message) => Err(CliError::new(FAILURE, message).into()),
        Outcome::Closed => Err(CliError::new(
            FAILURE,
            "the session closed without the command's exit status (the node or the server \
             went away)",
        )
        .into()),
    }
}

/// `tcloud exec ID [--rank R] -- CMD…`
pub async fn exec(ctx: &Ctx, id: TaskId, rank: u32, command: Vec<String>) -> Result<()> {
    let client = ctx.client()?;
    let kind = SessionKind::Exec { command, tty: None };
    let stream = client.open_session(id, rank, &kind).await?;
    let (read, write) = tokio::io::split(stream);
    let mut frames = FrameReader::new(read);
    opened(&mut frames).await?;
    let tx = writer(write);
    tokio::spawn(forward_input(tokio::io::stdin(), tx));
    finish(print_output(&mut frames).await)
}

/// The local terminal in raw mode until dropped (restored on every way out, panics
/// included; SIGTERM and SIGHUP end the session through the same path).
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<RawMode> {
        use rustix::termios::{OptionalActions, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

fn terminal_size() -> TtySize {
    match rustix::termios::tcgetwinsize(std::io::stdin()) {
        Ok(size) if size.ws_row > 0 && size.ws_col > 0 => TtySize {
            rows: size.ws_row,
            cols: size.ws_col,
        },
        _ => TtySize { rows: 24, cols: 80 },
    }
}

/// `tcloud shell ID [--rank R]`
pub async fn shell(ctx: &Ctx, id: TaskId, rank: u32) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    if !std::io::stdin().is_terminal() {
        return Err(CliError::invalid(format!(
            "tcloud shell needs a terminal on its stdin; to run one command without one: \
             tcloud exec {id} -- CMD"
        ))
        .into());
    }
    let client = ctx.client()?;
    let kind = SessionKind::Exec {
        command: Vec::new(),
        tty: Some(terminal_size()),
    };
    let stream = client.open_session(id, rank, &kind).await?;
    let (read, write) = tokio::io::split(stream);
    let mut frames = FrameReader::new(read);
    opened(&mut frames).await?;
    let mut resized = signal(SignalKind::window_change())?;
    let mut terminated = signal(SignalKind::terminate())?;
    let mut hung_up = signal(SignalKind::hangup())?;
    let outcome = {
        let _raw = RawMode::enter()?;
        let tx = writer(write);
        tokio::spawn(forward_input(tokio::io::stdin(), tx.clone()));
        let output = print_output(&mut frames);
        tokio::pin!(output);
        loop {
            tokio::select! {
                outcome = &mut output => break outcome,
                _ = resized.recv() => {
                    let _ = tx.send(Frame::Resize(terminal_size())).await;
                }
                _ = terminated.recv() => break Outcome::Error("tcloud was terminated".into()),
                _ = hung_up.recv() => break Outcome::Error("the terminal hung up".into()),
            }
        }
    };
    if let Outcome::Error(_) | Outcome::Closed = &outcome {
        // The remote side may have left the cursor mid-line.
        eprintln!();
    }
    finish(outcome)
}

/// `LOCAL:REMOTE` or `PORT` (the same on both sides); LOCAL may be 0 (any free port).
pub fn parse_ports(text: &str) -> Result<(u16, u16), String> {
    let port = |part: &str, which: &str| {
        part.parse::<u16>()
            .map_err(|_| format!("`{part}` is not a {which} port number (0–65535)"))
    };
    let (local, remote) = match text.split_once(':') {
        Some((local, remote)) => (port(local, "local")?, port(remote, "remote")?),
        None => {
            let both = port(text, "port")?;
            (both, both)
        }
    };
    if remote == 0 {
        return Err("the remote port must not be 0: name the port the task listens on".into());
    }
    Ok((local, remote))
}

/// `tcloud port-forward ID [--rank R] LOCAL:REMOTE`: until Ctrl-C.
pub async fn port_forward(ctx: &Ctx, id: TaskId, rank: u32, local: u16, remote: u16) -> Result<()> {
    let client = ctx.client()?;
    // Refuse at once when the task cannot be entered, rather than at the first connection.
    let task = client.get_task(id).await?;
    if task.state != tacc_core::TaskState::Running {
        return Err(CliError::new(
            FAILURE,
            format!(
                "task {id} is {}: ports are forwarded only into a running task",
                task.state
            ),
        )
        .into());
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", local))
        .await
        .map_err(|e| {
            CliError::new(
                FAILURE,
                format!("cannot listen on 127.0.0.1:{local} ({e}); pick another local port"),
            )
        })?;
    let bound = listener.local_addr()?.port();
    println!(
        "Forwarding 127.0.0.1:{bound} -> task {id} rank {rank} port {remote} (Ctrl-C to stop)"
    );
    let _ = std::io::stdout().flush();
    loop {
        let (connection, peer) = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        let client = client.clone();
        tokio::spawn(async move {
            if let Err(e) = forward_one(&client, id, rank, remote, connection).await {
                eprintln!("connection from {peer}: {e}");
            }
        });
    }
}

/// One local connection, carried through its own session.
async fn forward_one(
    client: &tacc_client::Client,
    id: TaskId,
    rank: u32,
    remote: u16,
    connection: tokio::net::TcpStream,
) -> Result<()> {
    let _ = connection.set_nodelay(true);
    let kind = SessionKind::Forward { port: remote };
    let stream = client.open_session(id, rank, &kind).await?;
    let (read, write) = tokio::io::split(stream);
    let mut frames = FrameReader::new(read);
    opened(&mut frames).await?;
    let (from_local, mut to_local) = connection.into_split();
    let tx = writer(write);
    let input = tokio::spawn(forward_input(from_local, tx));
    loop {
        match frames.next().await {
            Ok(Some(Frame::Stdout(data))) => {
                if to_local.write_all(&data).await.is_err() {
                    break;
                }
            }
            Ok(Some(Frame::Error(message))) => {
                input.abort();
                return Err(CliError::new(FAILURE, message).into());
            }
            Ok(Some(Frame::Exit(_))) | Ok(None) | Err(_) => break,
            Ok(Some(_)) => {}
        }
    }
    let _ = to_local.shutdown().await;
    input.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_local_colon_remote_or_one_for_both() {
        assert_eq!(parse_ports("8080:80"), Ok((8080, 80)));
        assert_eq!(parse_ports("6006"), Ok((6006, 6006)));
        assert_eq!(parse_ports("0:8888"), Ok((0, 8888)));
        assert!(parse_ports("8080:0").is_err());
        assert!(parse_ports("x:80").is_err());
        assert!(parse_ports("70000").is_err());
    }

    #[test]
    fn the_remote_exit_code_is_tclouds() {
        assert!(status_of(0).is_ok());
        let code = |c| {
            let error = status_of(c).unwrap_err();
            crate::errors::render(&error).1
        };
        assert_eq!(code(3), 3);
        assert_eq!(code(130), 130);
        assert_eq!(code(256), FAILURE);
    }
}

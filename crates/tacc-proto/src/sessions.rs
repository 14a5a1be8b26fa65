//! Wire types of interactive sessions (`tcloud exec`, `tcloud shell`, `tcloud port-forward`):
//! what the user asks for, how the server asks the node to open it, and the frames both
//! ends exchange once the connection is upgraded.
//!
//! Agents dial out, so a session is two HTTP/1.1 upgrades the server splices together: the
//! user's `GET /v1/tasks/{id}/session` and, once the node hears of it in its work poll
//! ([`crate::NodeRequestKind::Session`]), the agent's `GET /v1/agents/{node}/sessions/{id}`.
//! The server copies bytes between the two without reading them; both ends speak
//! [`Frame`]s.

use serde::{Deserialize, Serialize};

/// The `Upgrade` protocol name of both halves of a session.
pub const SESSION_PROTOCOL: &str = "tacc-session";
/// Largest payload of one frame; longer data is sent as several frames.
pub const MAX_FRAME_PAYLOAD: usize = 64 << 10;

/// A terminal's size in characters.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    pub rows: u16,
    pub cols: u16,
}

/// What a session does inside the task.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionKind {
    /// Run `command` (argv; empty: the task's shell) in the task, with a terminal of
    /// `tty`'s size when given (`tcloud shell`), else with pipes (`tcloud exec`).
    Exec {
        command: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tty: Option<TtySize>,
    },
    /// One TCP connection to `port` on the task's loopback (`tcloud port-forward`).
    Forward { port: u16 },
}

impl SessionKind {
    /// How the audit trail and messages name it.
    pub fn describe(&self) -> String {
        match self {
            SessionKind::Exec { command, tty } => {
                let what = if tty.is_some() { "shell" } else { "exec" };
                if command.is_empty() {
                    what.to_string()
                } else {
                    format!("{what} {}", command.join(" "))
                }
            }
            SessionKind::Forward { port } => format!("port-forward {port}"),
        }
    }
}

/// `GET /v1/tasks/{id}/session` query: `rank` and `request`, the JSON of a
/// [`SessionKind`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionQuery {
    #[serde(default)]
    pub rank: u32,
    pub request: String,
}

/// One message of a session, either way. Encoded as one tag byte, a big-endian `u32`
/// payload length and the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Agent → user: the command runs (or the port is connected); data may flow.
    Ready,
    /// User → agent: bytes for the command's stdin (or the forwarded connection).
    Stdin(Vec<u8>),
    /// User → agent: the command's stdin ends (or the forwarded connection's write half).
    StdinEnd,
    /// Agent → user: bytes the command wrote to stdout (or the forwarded port sent).
    Stdout(Vec<u8>),
    /// Agent → user: bytes the command wrote to stderr.
    Stderr(Vec<u8>),
    /// User → agent: the terminal's new size.
    Resize(TtySize),
    /// Agent → user: the command ended with this exit code (128 + N for signal N); the
    /// forwarded connection closed (0). The last frame.
    Exit(i32),
    /// Either way: the session cannot go on, and why. The last frame.
    Error(String),
}

/// A frame that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub String);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed session frame: {}", self.0)
    }
}

impl std::error::Error for FrameError {}

const HEADER: usize = 5;

impl Frame {
    fn tag(&self) -> u8 {
        match self {
            Frame::Ready => 0,
            Frame::Stdin(_) => 1,
            Frame::StdinEnd => 2,
            Frame::Stdout(_) => 3,
            Frame::Stderr(_) => 4,
            Frame::Resize(_) => 5,
            Frame::Exit(_) => 6,
            Frame::Error(_) => 7,
        }
    }

    /// The frame's bytes. Data longer than [`MAX_FRAME_PAYLOAD`] must be split first.
    pub fn encode(&self) -> Vec<u8> {
        let payload: Vec<u8> = match self {
            Frame::Ready | Frame::StdinEnd => Vec::new(),
            Frame::Stdin(data) | Frame::Stdout(data) | Frame::Stderr(data) => data.clone(),
            Frame::Resize(size) => {
                let mut p = size.rows.to_be_bytes().to_vec();
                p.extend_from_slice(&size.cols.to_be_bytes());
                p
            }
            Frame::Exit(code) => code.to_be_bytes().to_vec(),
            Frame::Error(message) => {
                let mut text = message.as_bytes().to_vec();
                text.truncate(MAX_FRAME_PAYLOAD);
                text
            }
        };
        debug_assert!(payload.len() <= MAX_FRAME_PAYLOAD);
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.push(self.tag());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Take one whole frame from the front of `buffer`; `None` until one is complete.
    pub fn decode(buffer: &mut Vec<u8>) -> Result<Option<Frame>, FrameError> {
        if buffer.len() < HEADER {
            return Ok(None);
        }
        let tag = buffer[0];
        let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(FrameError(format!(
                "a payload of {len} bytes (at most {MAX_FRAME_PAYLOAD})"
            )));
        }
        if buffer.len() < HEADER + len {
            return Ok(None);
        }
        let payload: Vec<u8> = buffer[HEADER..HEADER + len].to_vec();
        buffer.drain(..HEADER + len);
        let fixed = |want: usize| {
            if payload.len() == want {
                Ok(())
            } else {
                Err(FrameError(format!(
                    "tag {tag} with {} payload bytes, not {want}",
                    payload.len()
                )))
            }
        };
        Ok(Some(match tag {
            0 => fixed(0).map(|_| Frame::Ready)?,
            1 => Frame::Stdin(payload),
            2 => fixed(0).map(|_| Frame::StdinEnd)?,
            3 => Frame::Stdout(payload),
            4 => Frame::Stderr(payload),
            5 => {
                fixed(4)?;
                Frame::Resize(TtySize {
                    rows: u16::from_be_bytes([payload[0], payload[1]]),
                    cols: u16::from_be_bytes([payload[2], payload[3]]),
                })
            }
            6 => {
                fixed(4)?;
                Frame::Exit(i32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]))
            }
            7 => Frame::Error(String::from_utf8_lossy(&payload).into_owned()),
            other => return Err(FrameError(format!("unknown tag {other}"))),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_survives_a_round_trip_even_when_it_arrives_in_pieces() {
        let frames = vec![
            Frame::Ready,
            Frame::Stdin(b"ls\n".to_vec()),
            Frame::StdinEnd,
            Frame::Stdout(vec![0; MAX_FRAME_PAYLOAD]),
            Frame::Stderr(b"oops".to_vec()),
            Frame::Resize(TtySize {
                rows: 40,
                cols: 120,
            }),
            Frame::Exit(-3),
            Frame::Error("gone".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut buffer = Vec::new();
        let mut decoded = Vec::new();
        for piece in bytes.chunks(7) {
            buffer.extend_from_slice(piece);
            while let Some(frame) = Frame::decode(&mut buffer).unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
        assert!(buffer.is_empty());
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut big = vec![3u8];
        big.extend_from_slice(&((MAX_FRAME_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(Frame::decode(&mut big).is_err());
        let mut unknown = vec![99u8, 0, 0, 0, 0];
        assert!(Frame::decode(&mut unknown).is_err());
        let mut short_exit = vec![6u8, 0, 0, 0, 1, 0];
        assert!(Frame::decode(&mut short_exit).is_err());
    }
}

//! Interactive sessions: the user's half (`tcloud exec`, `shell`, `port-forward`) and the
//! agent's half, each an HTTP/1.1 upgrade the server splices to the other, and the
//! [`Frame`]s both speak over it (see `tacc_proto::sessions`).

use reqwest::Method;
use reqwest::header::{CONNECTION, UPGRADE};
use tacc_core::{NodeId, TaskId};
use tacc_proto::{Frame, NodeRequestId, SESSION_PROTOCOL, SessionKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Client, ClientError, Result};

/// The byte stream of an open session (either half).
pub type SessionStream = reqwest::Upgraded;

impl Client {
    /// Open a session into node rank `rank` of task `id`'s running attempt.
    pub async fn open_session(
        &self,
        id: TaskId,
        rank: u32,
        kind: &SessionKind,
    ) -> Result<SessionStream> {
        let request = serde_json::to_string(kind).expect("a session kind is plain data");
        let query = [("rank", rank.to_string()), ("request", request)];
        self.upgrade(
            self.untimed(Method::GET, &format!("/v1/tasks/{id}/session"))
                .query(&query),
        )
        .await
    }

    /// The agent's half of session `id`, which the server asked this node to open.
    pub async fn agent_session(&self, node: NodeId, id: NodeRequestId) -> Result<SessionStream> {
        self.upgrade(self.untimed(Method::GET, &format!("/v1/agents/{node}/sessions/{id}")))
            .await
    }

    async fn upgrade(&self, request: reqwest::RequestBuilder) -> Result<SessionStream> {
        let request = request
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, SESSION_PROTOCOL);
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            if response.status().is_success() {
                return Err(ClientError::Protocol {
                    url: response.url().to_string(),
                    reason: format!(
                        "the server answered {} instead of opening the session (is it an \
                         older version?)",
                        response.status()
                    ),
                });
            }
            return Err(self.error_of(response).await);
        }
        response.upgrade().await.map_err(|e| self.unreachable(e))
    }
}

/// Reads whole frames from a session's stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            buffer: Vec::new(),
        }
    }

    /// The next frame; `None` at the end of the stream.
    pub async fn next(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.buffer)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
            {
                return Ok(Some(frame));
            }
            let mut chunk = [0u8; 16 << 10];
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                return if self.buffer.is_empty() {
                    Ok(None)
                } else {
                    Err(std::io::ErrorKind::UnexpectedEof.into())
                };
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Write one frame and flush it.
pub async fn write_frame<W: AsyncWrite + Unpin>(out: &mut W, frame: &Frame) -> std::io::Result<()> {
    out.write_all(&frame.encode()).await?;
    out.flush().await
}

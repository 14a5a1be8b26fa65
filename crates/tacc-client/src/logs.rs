//! A task's log: one read from an offset to its current end, or a stream that follows it
//! until the task has ended (never cut by the request timeout).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::Method;
use tacc_core::TaskId;

use crate::{Client, ClientError, Result};

impl Client {
    /// The log from `offset` to its current end, and the offset just past it.
    pub async fn logs(&self, id: TaskId, offset: u64) -> Result<(Bytes, u64)> {
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/tasks/{id}/logs"))
                    .query(&[("offset", offset.to_string())]),
            )
            .await?;
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        let end = offset + body.len() as u64;
        Ok((body, end))
    }

    /// Stream the log from `offset` until the task has ended and all output was sent.
    pub async fn follow_logs(
        &self,
        id: TaskId,
        offset: u64,
    ) -> Result<impl Stream<Item = Result<Bytes>> + use<>> {
        let response = self
            .send(
                self.untimed(Method::GET, &format!("/v1/tasks/{id}/logs"))
                    .query(&[
                        ("offset", offset.to_string()),
                        ("follow", "true".to_string()),
                    ]),
            )
            .await?;
        let base = self.base.clone();
        Ok(response.bytes_stream().map(move |item| {
            item.map_err(|e| ClientError::Unreachable {
                refused: false,
                url: base.clone(),
                reason: format!("the log stream broke: {e}"),
            })
        }))
    }
}

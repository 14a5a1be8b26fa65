//! A task's files: the outputs its attempts kept (per rank, and which ranks are still
//! uploading theirs), and a running task's live working directory (listings and single
//! files, fetched from its node through the server).

use bytes::Bytes;
use reqwest::Method;
use tacc_core::{AttemptNo, TaskId};
use tacc_proto::OutputFile;

use crate::{Client, ClientError, Result};

impl Client {
    pub async fn list_outputs(&self, id: TaskId) -> Result<Vec<OutputFile>> {
        self.json(self.request(Method::GET, &format!("/v1/tasks/{id}/outputs")))
            .await
    }

    pub async fn get_output(&self, id: TaskId, attempt: AttemptNo, path: &str) -> Result<Bytes> {
        let response = self
            .send(self.untimed(
                Method::GET,
                &format!("/v1/tasks/{id}/outputs/{attempt}/{path}"),
            ))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// The outputs, and the `(attempt, rank)` pairs whose node has not yet reported the
    /// end of its share (their outputs may still be arriving).
    pub async fn list_outputs_pending(
        &self,
        id: TaskId,
    ) -> Result<(Vec<OutputFile>, Vec<(AttemptNo, u32)>)> {
        let response = self
            .send(self.request(Method::GET, &format!("/v1/tasks/{id}/outputs")))
            .await?;
        let pending = response
            .headers()
            .get(tacc_proto::OUTPUTS_PENDING_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(',')
                    .filter_map(|pair| {
                        let (attempt, rank) = pair.split_once(':')?;
                        Some((AttemptNo(attempt.parse().ok()?), rank.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let url = response.url().to_string();
        let body = response.bytes().await.map_err(|e| self.unreachable(e))?;
        let files = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol {
            url,
            reason: e.to_string(),
        })?;
        Ok((files, pending))
    }

    /// One kept output of one rank.
    pub async fn get_rank_output(
        &self,
        id: TaskId,
        attempt: AttemptNo,
        rank: u32,
        path: &str,
    ) -> Result<Bytes> {
        let response = self
            .send(
                self.untimed(
                    Method::GET,
                    &format!("/v1/tasks/{id}/outputs/{attempt}/{path}"),
                )
                .query(&[("rank", rank)]),
            )
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// A directory of a task: the running attempt's live working directory on the node
    /// of `rank` (0 by default), or the outputs it kept once it has ended (or of
    /// `attempt`).
    pub async fn list_files(
        &self,
        id: TaskId,
        path: &str,
        rank: Option<u32>,
        attempt: Option<AttemptNo>,
    ) -> Result<tacc_proto::FileListing> {
        let mut query = vec![("path", path.to_string())];
        if let Some(rank) = rank {
            query.push(("rank", rank.to_string()));
        }
        if let Some(attempt) = attempt {
            query.push(("attempt", attempt.to_string()));
        }
        self.json(
            self.request(Method::GET, &format!("/v1/tasks/{id}/files"))
                .query(&query),
        )
        .await
    }

    /// One file of a running task's live working directory (bounded in size by the
    /// server: [`tacc_proto::MAX_LIVE_FILE_BYTES`]).
    pub async fn get_live_file(&self, id: TaskId, path: &str, rank: Option<u32>) -> Result<Bytes> {
        let mut query = vec![("path", path.to_string())];
        if let Some(rank) = rank {
            query.push(("rank", rank.to_string()));
        }
        let response = self
            .send(
                self.request(Method::GET, &format!("/v1/tasks/{id}/files/content"))
                    .query(&query),
            )
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }
}

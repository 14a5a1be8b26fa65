//! The agent protocol, spoken by `taccd agent` with its node credential: registration,
//! the long poll for the node's desired work, ordered reports, answers to the server's
//! questions, and a pipeline stage's inputs and the outputs of an attempt.

use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;
use tacc_core::{AttemptNo, NodeId, TaskId};
use tacc_proto::{
    AgentRegistered, AgentReport, AttemptRef, DesiredWork, RegisterAgent, WorkPoll, WorkSince,
};

use crate::{Client, Result};

impl Client {
    pub async fn register_agent(&self, registration: &RegisterAgent) -> Result<AgentRegistered> {
        self.json(
            self.request(Method::POST, "/v1/agents/register")
                .json(registration),
        )
        .await
    }

    /// Long poll for the node's desired work; answers when it differs from `after`.
    pub async fn agent_work(
        &self,
        node: NodeId,
        after: Option<u64>,
        wait: Duration,
        running: Vec<AttemptRef>,
    ) -> Result<DesiredWork> {
        let poll = WorkPoll {
            after,
            wait_ms: wait.as_millis() as u64,
            running,
        };
        self.json(
            self.request(Method::POST, &format!("/v1/agents/{node}/work"))
                .json(&poll)
                .timeout(wait + Duration::from_secs(30)),
        )
        .await
    }

    /// Deliver reports in order; the answer counts those the server applied and those it
    /// rejected as not belonging to one of this node's current attempts.
    pub async fn agent_reports(
        &self,
        node: NodeId,
        reports: &[AgentReport],
    ) -> Result<tacc_proto::ReportsAck> {
        self.agent_reports_asking_work(node, reports, None).await
    }

    /// Deliver reports in order, and with `since` ask for the node's desired work in the
    /// answer when it is not that version any more (`ReportsAck::work`).
    pub async fn agent_reports_asking_work(
        &self,
        node: NodeId,
        reports: &[AgentReport],
        since: Option<&WorkSince>,
    ) -> Result<tacc_proto::ReportsAck> {
        /// [`AgentReports`], borrowed: a batch is kept for a retry, not copied.
        #[derive(serde::Serialize)]
        struct Borrowed<'a> {
            reports: &'a [AgentReport],
            #[serde(skip_serializing_if = "Option::is_none")]
            work: Option<&'a WorkSince>,
        }
        self.json(
            self.request(Method::POST, &format!("/v1/agents/{node}/reports"))
                .json(&Borrowed {
                    reports,
                    work: since,
                }),
        )
        .await
    }

    /// Answer one of the server's questions with a listing or a refusal.
    pub async fn answer_node_request(
        &self,
        node: NodeId,
        request: tacc_proto::NodeRequestId,
        answer: &tacc_proto::NodeAnswer,
    ) -> Result<()> {
        self.send(
            self.request(
                Method::POST,
                &format!("/v1/agents/{node}/answers/{request}"),
            )
            .json(answer),
        )
        .await?;
        Ok(())
    }

    /// Answer one of the server's questions with a file's bytes.
    pub async fn answer_node_file(
        &self,
        node: NodeId,
        request: tacc_proto::NodeRequestId,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.send(
            self.request(
                Method::PUT,
                &format!("/v1/agents/{node}/answers/{request}/file"),
            )
            .body(bytes),
        )
        .await?;
        Ok(())
    }

    /// One input file of a pipeline stage's attempt this node runs (the `index`th of its
    /// assignment's inputs).
    pub async fn get_input(
        &self,
        node: NodeId,
        task: TaskId,
        attempt: AttemptNo,
        index: usize,
    ) -> Result<Bytes> {
        let response = self
            .send(self.untimed(
                Method::GET,
                &format!("/v1/agents/{node}/inputs/{task}/{attempt}/{index}"),
            ))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }

    /// Upload one output file, streamed from disk.
    pub async fn put_output(
        &self,
        node: NodeId,
        task: TaskId,
        attempt: AttemptNo,
        path: &str,
        file: tokio::fs::File,
    ) -> Result<()> {
        let length = file.metadata().await.map(|m| m.len()).ok();
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        let mut request = self
            .untimed(
                Method::PUT,
                &format!("/v1/agents/{node}/outputs/{task}/{attempt}/{path}"),
            )
            .body(body);
        if let Some(length) = length {
            request = request.header(reqwest::header::CONTENT_LENGTH, length);
        }
        self.send(request).await?;
        Ok(())
    }
}

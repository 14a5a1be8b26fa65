//! Task groups (arrays, sweeps, pipelines): submit a pipeline, list groups, read one with
//! or without its elements, a sweep's leaderboard, cancel a group or rerun its failed
//! elements.

use reqwest::Method;
use tacc_proto::SubmitReply;

use crate::{Client, Result};

impl Client {
    /// Submit a whole pipeline (every stage's code already uploaded).
    pub async fn submit_pipeline(
        &self,
        pipeline: &tacc_proto::SubmitPipeline,
    ) -> Result<tacc_proto::PipelineSubmitted> {
        self.keyed_json(|| self.request(Method::POST, "/v1/pipelines").json(pipeline))
            .await
    }

    /// Task groups: those with unfinished elements and the latest ones, or every one.
    pub async fn list_groups(
        &self,
        all: bool,
        user: Option<&str>,
    ) -> Result<Vec<tacc_proto::GroupView>> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if all {
            params.push(("all", "true".into()));
        }
        if let Some(user) = user {
            params.push(("user", user.to_string()));
        }
        self.json(self.request(Method::GET, "/v1/groups").query(&params))
            .await
    }

    pub async fn get_group(&self, id: tacc_core::GroupId) -> Result<tacc_proto::GroupDetail> {
        self.json(self.request(Method::GET, &format!("/v1/groups/{id}")))
            .await
    }

    /// A group's counts without its elements (cheap to poll, whatever its size).
    pub async fn group_summary(&self, id: tacc_core::GroupId) -> Result<tacc_proto::GroupView> {
        let detail: tacc_proto::GroupDetail = self
            .json(
                self.request(Method::GET, &format!("/v1/groups/{id}"))
                    .query(&[("elements", "false")]),
            )
            .await?;
        Ok(detail.group)
    }

    /// A group's counts without its elements, answered once no element is open (queued,
    /// starting, running) or after `wait` (the server waits 30 s at most).
    pub async fn group_summary_when_ended(
        &self,
        id: tacc_core::GroupId,
        wait: std::time::Duration,
    ) -> Result<tacc_proto::GroupView> {
        let wait_ms = wait.as_millis().to_string();
        let detail: tacc_proto::GroupDetail = self
            .json(
                self.request(Method::GET, &format!("/v1/groups/{id}"))
                    .query(&[("elements", "false"), ("wait_ms", wait_ms.as_str())])
                    .timeout(wait + std::time::Duration::from_secs(30)),
            )
            .await?;
        Ok(detail.group)
    }

    /// A sweep's leaderboard, best trial first.
    pub async fn sweep(&self, id: tacc_core::GroupId) -> Result<tacc_proto::SweepBoard> {
        self.json(self.request(Method::GET, &format!("/v1/groups/{id}/sweep")))
            .await
    }

    pub async fn cancel_group(
        &self,
        id: tacc_core::GroupId,
    ) -> Result<tacc_proto::GroupCancelReply> {
        self.json(self.request(Method::POST, &format!("/v1/groups/{id}/cancel")))
            .await
    }

    /// Submit again the elements of a group that failed, were cancelled or were lost.
    pub async fn rerun_group_failed(&self, id: tacc_core::GroupId) -> Result<SubmitReply> {
        self.json(
            self.request(Method::POST, &format!("/v1/groups/{id}/rerun"))
                .json(&tacc_proto::GroupRerun { failed: true }),
        )
        .await
    }
}
